"""The project's import graph, read from the source with `ast`: `python -m tools.import_graph`.

Prints every module's module-level imports of other project modules, then the import circles
(strongly connected components), then the imports that sit inside functions. A circle means
that the order in which a user imports two modules decides whether one of them sees the other
half-initialised; tests/test_layering.py asserts there are none, and that every import inside a
function is one of the deliberate lazy ones in LAZY_IMPORTS.

Edges: `import a.b.c` and `from a.b import c` point at the deepest project module they name
(`a.b.c` when it is a module, else `a.b`); a package's `__init__` is not added as an edge of each
of its submodules, as Python runs it once, before any of them.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("vllm_liliprop", "training", "eval", "plots", "tools")

# Imports allowed inside functions, by name prefix, each for a reason:
LAZY_IMPORTS = (
    # vLLM is heavy and absent where only training or plots run; the runtime outside
    # vllm_liliprop/vllm/ never imports it, and training only where it drives generation.
    "vllm",
    "vllm_liliprop.vllm",
    # The Triton kernels import triton, which a CPU machine may lack: the dispatchers in
    # kernels/__init__.py import them only on the CUDA branch, and so does the upstream walk.
    "triton",
    "vllm_liliprop.kernels.triton_",
    # Heavy optional third-party libraries, imported where a command needs them, so that the
    # plugin, `--help` and the tests that do not need them start in a second: `datasets`
    # (Hub downloads), `transformers` (model and tokenizer loading), `huggingface_hub`,
    # `scipy` (one statistical test), `pandas` (one benchmark reader).
    "datasets",
    "transformers",
    "huggingface_hub",
    "scipy",
    "pandas",
    # numba's LLVM binding, present only with vLLM's n-gram stack: patching.py 9 guards it
    # where it is installed, without making the plugin import it elsewhere.
    "llvmlite",
)


def module_name(path: Path, root: Path = REPO_ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path = REPO_ROOT, packages=PACKAGES) -> dict[str, Path]:
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            modules[module_name(path, root)] = path
    return modules


def _named_modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    """What an absolute import may name: `import a.b` names a.b; `from a import b` names a.b
    or a (the graph keeps the deepest that is a project module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level or not node.module:
        return []
    return [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]


def _deepest_known(name: str, modules) -> str | None:
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_nodes(path: Path):
    """(ast.Import | ast.ImportFrom, inside a function) for every import statement of a file."""
    tree = ast.parse(path.read_text(), filename=str(path))

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_function
            yield from visit(child, in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    yield from visit(tree, False)


def build_graph(root: Path = REPO_ROOT, packages=PACKAGES, with_lazy: bool = False):
    """({module: {project modules it imports at module level (with_lazy: anywhere)}},
    [(module, line, name) for each import inside a function]); `name` is the deepest project
    module the import names, or the imported name for a third-party one."""
    modules = project_modules(root, packages)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    lazy = []
    for name, path in modules.items():
        for node, in_function in import_nodes(path):
            named, line = _named_modules(node), node.lineno
            targets = {_deepest_known(n, modules) for n in named} - {None}
            if in_function:
                lazy.append((name, line, max(targets, key=len) if targets else named[-1]))
                if not with_lazy:
                    continue
            graph[name] |= targets - {name}
    return graph, lazy


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with each subpackage's modules folded into one node (the modules at a
    top-level package's root stay nodes of their own): the layers, e.g. heads -> kernels."""
    packages = {name for name in graph if any(other.startswith(name + ".") for other in graph)}

    def fold(name):
        parent = name.rpartition(".")[0]
        return parent if parent in packages and "." in parent else name

    folded: dict[str, set[str]] = {}
    for name, targets in graph.items():
        folded.setdefault(fold(name), set()).update(fold(t) for t in targets)
    for name in folded:
        folded[name].discard(name)
    return folded


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle for each strongly connected component of more than one module (or a module
    importing itself): a shortest one through the component's first module, then, after a
    "|", the component's other members, if any; sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(node):  # Tarjan's algorithm; the graphs here are a few hundred nodes.
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                circle = _circle(sorted(component), graph)
                rest = sorted(set(component) - set(circle))
                found.append(circle + (["|"] + rest if rest else []))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)


def _circle(component: list[str], graph) -> list[str]:
    """A shortest path from the component's first module back to itself, inside it."""
    members, start = set(component), component[0]
    paths, seen = [[start]], {start}
    while paths:
        next_paths = []
        for path in paths:
            for target in sorted(graph[path[-1]] & members):
                if target == start:
                    return path + [start]
                if target not in seen:
                    seen.add(target)
                    next_paths.append(path + [target])
        paths = next_paths
    return component


def show(circle: list[str]) -> str:
    path, _, rest = " -> ".join(circle).partition(" -> | -> ")
    return path + (f"   (also in the circle: {rest.replace(' -> ', ', ')})" if rest else "")


def unexpected_lazy_imports(lazy) -> list[str]:
    return [f"{module}:{line} imports {name} inside a function" for module, line, name in lazy
            if not any(name == p or name.startswith(p + ".") or
                       (p.endswith("_") and name.startswith(p)) for p in LAZY_IMPORTS)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", action="store_true", help="print the circles only")
    args = parser.parse_args(argv)
    graph, lazy = build_graph()
    if not args.cycles:
        for module in sorted(graph):
            print(f"{module} -> {', '.join(sorted(graph[module])) or '-'}")
        print()
    found = cycles(graph)
    print(f"{len(found)} import circle(s) at module level")
    for circle in found:
        print("  " + show(circle))
    # Imports inside functions hide a circle from Python, not from the reader.
    everything = build_graph(with_lazy=True)[0]
    for title, more in (("with the imports inside functions", cycles(everything)),
                        ("between subpackages (imports inside functions too)",
                         cycles(package_graph(everything)))):
        more = [c for c in more if c not in found]
        print(f"{len(more)} more {title}")
        for circle in more:
            print("  " + show(circle))
        found += more
    if not args.cycles:
        unexpected = unexpected_lazy_imports(lazy)
        print(f"\n{len(lazy)} import(s) inside functions, {len(unexpected)} not among LAZY_IMPORTS")
        for line in unexpected:
            print("  " + line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
