"""The ablation summary table (plots/ablations.py) from a REAL results file, read back.

tests/data/plots/smollm2_ablations.csv is the unedited output of the served ablations on the
real target (docs/measurements-smollm2.md gives the command); the spec is the shipped one,
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


def _tau(raw: pd.DataFrame, system) -> float | None:
    """Pooled tau from the raw counters; None for a system the results have no rows of."""
    if isinstance(system, str):
        rows = raw[raw["system"] == system]
    else:
        rows = raw[(raw["system"] == system["system"]) & (raw["dels_alpha"] == system["dels_alpha"])
                   & (raw["dels_beta"] == system["dels_beta"])]
    if rows.empty:
        return None
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
    measured = 0
    for entry, row in zip(spec["comparisons"], rows):
        base, variant = _tau(raw, entry["baseline"]), _tau(raw, entry["variant"])
        assert row[0] == entry["ablation"]
        if base is None or variant is None:  # a system not run yet (e.g. a newly added one)
            assert row[3] == ("—" if base is None else f"{base:.3f}")
            assert row[4] == ("—" if variant is None else f"{variant:.3f}")
            assert row[5:] == ["not measured", row[6], "n/a", "—"]
            continue
        measured += 1
        assert float(row[3]) == pytest.approx(base, abs=5e-4)
        assert float(row[4]) == pytest.approx(variant, abs=5e-4)
        change = variant / base - 1
        assert row[5] == f"{100 * change:+.2f}%"
        ours = "=" if abs(change) <= 0.01 else ("+" if change > 0 else "-")
        assert row[7] == ours
        assert row[8] == ("—" if entry["paper"] == "n/a" else ("yes" if entry["paper"] == ours else "no"))
    assert measured >= 12  # every comparison the real results file covers
    assert "\\begin{tabular}" in render_latex(table)


def test_a_comparison_without_results_rows_reads_not_measured():
    """A system not run yet: its τ is "—", the change "not measured", no direction and no
    agreement; the other side keeps its τ and the notes name the missing system."""
    raw = pd.read_csv(REAL)
    spec = {"comparisons": [
        {"ablation": "learned", "source": "DeLS-Spec Table 4", "baseline": "DeLS-Markov-P1",
         "variant": "DeLS-Markov-unrun", "paper": "-", "paper_effect": "6.65 to 6.55"},
        {"ablation": "measured", "baseline": "DFlash", "variant": "LiLiCorr-greedy", "paper": "+"},
        {"ablation": "both", "baseline": "nope", "variant": "DeLS-Markov-unrun", "paper": "n/a"}]}
    table = ablation_table(load_results(REAL), spec)
    text = render_markdown(table)
    learned, measured, both = _md_rows(text)
    base = _tau(raw, "DeLS-Markov-P1")
    assert learned == ["learned", "DeLS-Spec Table 4", "DeLS-Markov-unrun vs DeLS-Markov-P1", f"{base:.3f}", "—",
                       "not measured", "- (6.65 to 6.55)", "n/a", "—"]
    assert measured[5] != "not measured" and measured[7] in ("+", "-", "=") and measured[8] in ("yes", "no")
    assert both[3:] == ["—", "—", "not measured", "n/a", "n/a", "—"]
    assert "not measured (no rows in the results): DeLS-Markov-unrun, nope" in text
    assert "not measured" in render_latex(table)
    # The shipped spec's learned-vs-fixed row is shown, measured or not.
    shipped = _md_rows(render_markdown(ablation_table(load_results(REAL), load_ablation_spec(SPEC))))
    assert any(row[0] == "learned vs fixed alpha/beta" for row in shipped)


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
    # A system with no rows (not run yet, or misspelt) is a "not measured" row, named in the notes.
    bad.write_text(json.dumps({"comparisons": [{"ablation": "x", "baseline": "DFlash", "variant": "nope",
                                                "paper": "+"}]}))
    assert plots_main(["table", "--kind", "ablations", "--results", str(REAL), "--ablations", str(bad)]) == 0
    out = capsys.readouterr().out
    assert "not measured" in out and "no rows in the results): nope" in out
    bad.write_text(json.dumps({"comparisons": [{"ablation": "x", "baseline": "DFlash",
                                                "variant": "DeLS-Markov-P1-grid", "paper": "+"}]}))
    with pytest.raises(SystemExit):
        plots_main(["table", "--kind", "ablations", "--results", str(REAL), "--ablations", str(bad)])
    assert "was run over a DeLS grid" in capsys.readouterr().err
    bad.write_text(json.dumps({"comparisons": [{"ablation": "x", "baseline": "DFlash", "variant": "DFlash",
                                                "paper": "up"}]}))
    with pytest.raises(ValueError, match="paper = 'up'"):
        load_ablation_spec(bad)


def test_the_trained_ablation_table_reads_the_committed_build_back():
    """testbed/smollm2/ablation_build/heldout_tau.csv is the ablation build's own table (its
    manifest beside it): every comparison of the trained spec is measured, and each tau is the
    manifest's stage record."""
    build = REPO / "testbed" / "smollm2" / "ablation_build"
    stages = json.loads((build / "manifest.json").read_text())["stages"]
    spec = load_ablation_spec(REPO / "testbed" / "smollm2" / "trained_ablations.json")
    rows = _md_rows(render_markdown(ablation_table(load_results(build / "heldout_tau.csv"), spec)))
    assert len(rows) == len(spec["comparisons"]) and all(row[5] != "not measured" for row in rows)
    walk = stages["measure"]["heldout_tau"]["lilicorr_greedy_walk"]
    for entry, row in zip(spec["comparisons"], rows):
        if entry["variant"].startswith("LiLiCorr-greedy ["):
            name = entry["variant"].removeprefix("LiLiCorr-greedy [").removesuffix("]")
            variant = stages[f"ablation_{name}"]["heldout_tau"]["lilicorr_greedy_walk"]
            assert (float(row[3]), float(row[4])) == (round(walk, 3), round(variant, 3))
            assert row[5] == f"{100 * (variant / walk - 1):+.2f}%"


def test_the_second_ablation_table_reads_its_committed_build_back():
    """testbed/smollm2/ablation_build2: block 8 and block 16 LiLiCorr, a faster head and a
    frozen drafter from one build (issue 18); every comparison is measured and the block-16 stage trained at 16 with the
    paper's decay."""
    build = REPO / "testbed" / "smollm2" / "ablation_build2"
    manifest = json.loads((build / "manifest.json").read_text())
    stages = manifest["stages"]
    assert stages["ablation_block16"]["overrides"] == {"drafter.block_size": 16, "loss.dflash_decay": 7.0}
    spec = load_ablation_spec(REPO / "testbed" / "smollm2" / "trained_ablations2.json")
    rows = _md_rows(render_markdown(ablation_table(load_results(build / "heldout_tau.csv"), spec)))
    assert len(rows) == len(spec["comparisons"]) and all(row[5] != "not measured" for row in rows)
    block8 = stages["measure"]["heldout_tau"]["lilicorr_greedy_walk"]
    block16 = stages["ablation_block16"]["heldout_tau"]["lilicorr_greedy_walk"]
    assert (float(rows[0][3]), float(rows[0][4])) == (round(block8, 3), round(block16, 3))
