"""The ablation summary table (plots/ablations.py) from a REAL results file, read back.

tests/data/plots/smollm2_ablations.csv is the unedited output of the served ablations on the
real target (testbed/smollm2/README.md gives the command); the spec is the shipped one,
testbed/smollm2/ablations.json. Expected values are recomputed here from the raw counters.
"""

import json
from pathlib import Path

import pandas as pd
import pytest

from plots.__main__ import main as plots_main
from plots.ablations import ablation_table, direction, load_ablation_spec
from plots.io import load_results
from plots.tables import render_latex, render_markdown

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / "tests" / "data" / "plots" / "smollm2_ablations.csv"
SPEC = REPO / "testbed" / "smollm2" / "ablations.json"


def _tau(raw: pd.DataFrame, system) -> float:
    if isinstance(system, str):
        rows = raw[raw["system"] == system]
    else:
        rows = raw[(raw["system"] == system["system"]) & (raw["dels_alpha"] == system["dels_alpha"])
                   & (raw["dels_beta"] == system["dels_beta"])]
    assert len(rows) >= 1
    return 1.0 + rows["num_accepted_tokens"].sum() / rows["num_drafts"].sum()


def _md_rows(text: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("|")][2:]


def test_every_comparison_is_recomputed_from_the_counters():
    raw = pd.read_csv(REAL)
    spec = load_ablation_spec(SPEC)
    table = ablation_table(load_results(REAL), spec)
    rows = _md_rows(render_markdown(table))
    assert len(rows) == len(spec["comparisons"])
    for entry, row in zip(spec["comparisons"], rows):
        base, variant = _tau(raw, entry["baseline"]), _tau(raw, entry["variant"])
        assert row[0] == entry["ablation"]
        assert float(row[3]) == pytest.approx(base, abs=5e-4)
        assert float(row[4]) == pytest.approx(variant, abs=5e-4)
        change = variant / base - 1
        assert row[5] == f"{100 * change:+.2f}%"
        ours = "=" if abs(change) <= 0.01 else ("+" if change > 0 else "-")
        assert row[7] == ours
        assert row[8] == ("—" if entry["paper"] == "n/a" else ("yes" if entry["paper"] == ours else "no"))
    assert "\\begin{tabular}" in render_latex(table)


def test_direction_tolerance():
    assert direction(0.009) == "=" and direction(-0.01) == "="
    assert direction(0.0101) == "+" and direction(-0.02) == "-"
    assert direction(0.003, tolerance=0.001) == "+"


def test_cli_prints_the_table_and_bad_specs_fail_clearly(tmp_path, capsys):
    assert plots_main(["table", "--kind", "ablations", "--results", str(REAL), "--ablations", str(SPEC)]) == 0
    assert "Viterbi" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        plots_main(["table", "--kind", "ablations", "--results", str(REAL)])
    assert "--ablations SPEC" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"comparisons": [{"ablation": "x", "baseline": "DFlash", "variant": "nope",
                                                "paper": "+"}]}))
    with pytest.raises(SystemExit):
        plots_main(["table", "--kind", "ablations", "--results", str(REAL), "--ablations", str(bad)])
    assert "no rows of system 'nope'" in capsys.readouterr().err
    bad.write_text(json.dumps({"comparisons": [{"ablation": "x", "baseline": "DFlash",
                                                "variant": "DeLS-Markov-P1-grid", "paper": "+"}]}))
    with pytest.raises(SystemExit):
        plots_main(["table", "--kind", "ablations", "--results", str(REAL), "--ablations", str(bad)])
    assert "was run over a DeLS grid" in capsys.readouterr().err
    bad.write_text(json.dumps({"comparisons": [{"ablation": "x", "baseline": "DFlash", "variant": "DFlash",
                                                "paper": "up"}]}))
    with pytest.raises(ValueError, match="paper = 'up'"):
        load_ablation_spec(bad)
