"""The one-way layers, checked on the source: runtime < training < eval, plots reads files.

- vllm_liliprop/ (outside vllm_liliprop/vllm/) imports neither vllm nor training/eval/plots;
- training/ imports vllm (or the plugin's vllm layer) only inside functions, where it drives
  generation, and never eval or plots;
- the import graph has no circles, and imports inside functions are the deliberate lazy ones
  (tools/import_graph.py, which also reads the imports for the checks here);
- plots/ imports none of vllm, vllm_liliprop, training or eval: it reads result files;
- every vllm import of the runtime sits in vllm_liliprop/vllm/.
"""

import ast
from pathlib import Path

import pytest

from tools import import_graph

REPO_ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path):
    """(module name, line, inside a function) for every absolute import in a file."""
    for node, in_function in import_graph.import_nodes(path):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            names = [node.module] if node.level == 0 and node.module else []
        for name in names:
            yield name, node.lineno, in_function


def _root(name: str) -> str:
    if name == "vllm_liliprop.vllm" or name.startswith("vllm_liliprop.vllm."):
        return "vllm"  # the plugin's vLLM layer counts as vLLM
    return name.split(".")[0]


def _violations(folder: str, forbidden: set[str], allow_in_functions: set[str] = frozenset(),
                skip: str | None = None) -> list[str]:
    found = []
    for path in sorted((REPO_ROOT / folder).rglob("*.py")):
        relative = path.relative_to(REPO_ROOT)
        if skip and str(relative).startswith(skip):
            continue
        for name, line, in_function in _imports(path):
            root = _root(name)
            if root in forbidden and not (root in allow_in_functions and in_function):
                found.append(f"{relative}:{line} imports {name}")
    return found


def test_runtime_imports_no_vllm_outside_its_vllm_layer_and_no_upper_layer():
    assert _violations("vllm_liliprop", {"vllm", "training", "eval", "plots"},
                       skip="vllm_liliprop/vllm/") == []


def test_training_imports_vllm_only_where_it_drives_generation():
    assert _violations("training", {"vllm", "eval", "plots"}, allow_in_functions={"vllm"}) == []


def test_plots_read_result_files_only():
    assert _violations("plots", {"vllm", "vllm_liliprop", "training", "eval"}) == []


def test_the_checker_sees_a_forbidden_import(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("import os\n\ndef f():\n    from vllm.config import X\n")
    (package / "b.py").write_text("from vllm_liliprop.vllm.metrics import SpecDecodeCounters\n")
    monkeypatch.setattr(f"{__name__}.REPO_ROOT", tmp_path)
    assert _violations("pkg", {"vllm"}) == ["pkg/a.py:4 imports vllm.config",
                                            "pkg/b.py:1 imports vllm_liliprop.vllm.metrics"]
    assert _violations("pkg", {"vllm"}, allow_in_functions={"vllm"}) == [
        "pkg/b.py:1 imports vllm_liliprop.vllm.metrics"]


def test_plots_columns_are_columns_eval_writes():
    from eval.schema import ALL_COLUMNS, KEY_COLUMNS
    from plots.io import REQUIRED_COLUMNS

    assert set(KEY_COLUMNS) <= set(REQUIRED_COLUMNS)
    assert set(REQUIRED_COLUMNS) <= set(ALL_COLUMNS)


@pytest.mark.parametrize("module", ["vllm_liliprop.heads.lattice", "vllm_liliprop.walks",
                                    "vllm_liliprop.rules.lattice_dels", "tools.kernels.bench"])
def test_runtime_modules_import_without_vllm_at_run_time(module):
    """The source check above, confirmed by importing in a clean interpreter."""
    import subprocess
    import sys

    code = f"import sys, {module}; assert 'vllm' not in sys.modules, 'vllm was imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_import_graph_has_no_circles():
    """Module level, with the imports inside functions too, and between subpackages (heads ->
    kernels -> heads is a circle of layers even when no single module closes it)."""
    graph = import_graph.build_graph(with_lazy=True)[0]
    assert import_graph.cycles(import_graph.build_graph()[0]) == []
    assert import_graph.cycles(graph) == []
    assert import_graph.cycles(import_graph.package_graph(graph)) == []


def test_imports_inside_functions_are_the_deliberate_lazy_ones():
    assert import_graph.unexpected_lazy_imports(import_graph.build_graph()[1]) == []


def test_the_import_graph_sees_a_planted_circle(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    for name in ("pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/leaf.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg import b\n")
    (tmp_path / "pkg" / "b.py").write_text("import os\n\ndef f():\n    from pkg.a import g\n")
    (tmp_path / "pkg" / "c.py").write_text("from pkg.sub import leaf\n")
    (tmp_path / "pkg" / "sub" / "d.py").write_text("import pkg.c\n")
    graph, lazy = import_graph.build_graph(tmp_path, ("pkg",))
    assert import_graph.cycles(graph) == []  # the circle closes inside a function only
    assert lazy == [("pkg.b", 4, "pkg.a")]
    assert import_graph.unexpected_lazy_imports(lazy) == ["pkg.b:4 imports pkg.a inside a function"]
    everything = import_graph.build_graph(tmp_path, ("pkg",), with_lazy=True)[0]
    assert import_graph.cycles(everything) == [["pkg.a", "pkg.b", "pkg.a"]]
    # pkg.c -> pkg.sub.leaf and pkg.sub.d -> pkg.c: no module circle, a circle of layers.
    assert import_graph.cycles(import_graph.package_graph(graph)) == [["pkg.c", "pkg.sub", "pkg.c"]]


def test_heads_walks_and_faults_are_pure_torch():
    """The bottom layer imports only itself: a head that reached for a kernel dispatcher or a
    rule would put drafting logic among the heads (ARCHITECTURE.md)."""
    pure = ("vllm_liliprop.heads", "vllm_liliprop.walks", "vllm_liliprop.faults")
    graph = import_graph.build_graph(with_lazy=True)[0]
    found = [f"{module} imports {target}" for module, targets in sorted(graph.items())
             if module.startswith(pure) for target in sorted(targets) if not target.startswith(pure)]
    assert found == []
