"""The papers' appendix tables from REAL files, read back and checked against those files.

Sources (nothing here is a hand-made results table):
- tests/data/plots/smollm2_speed.csv: a real `python -m eval run` of the SmolLM2 testbed on the
  SPEED fixture files (categories, entropy tiers), c = 1, 2 at T = 0 and seeds 42 / 43 / 44 at
  T = 1 (how it was made: tests/data/plots/README.md);
- the shipped DeLS heads (testbed/smollm2/round3/drafts/dflash/dels, dels_markov) through
  `python -m eval heads-table`;
- testbed/smollm2/manifest.json through `python -m eval training-cost`, and a run record written
  by a real `Trainer.fit`.
Every expected number is recomputed from the raw CSV's counters with pandas here, not with plots'
helpers.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from eval.cli import main as eval_main
from plots.__main__ import main as plots_main
from plots.io import load_results
from plots.records import load_dels_weights, load_training_cost
from plots.report import write_all

REPO = Path(__file__).resolve().parents[1]
REAL = REPO / "tests" / "data" / "plots" / "smollm2_speed.csv"
HEADS = REPO / "testbed" / "smollm2" / "round3" / "drafts" / "dflash"
MANIFEST = REPO / "testbed" / "smollm2" / "manifest.json"
KV_TOKENS = 1500  # one 1024-token block + 24 generated tokens fits, two do not


def _md_rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines]


def _table(path: Path) -> list[dict[str, str]]:
    """A rendered markdown table as dicts header -> cell (bold marks removed)."""
    rows = _md_rows(path.read_text(encoding="utf-8"))
    header = rows[0]
    return [dict(zip(header, [c.replace("**", "") for c in row])) for row in rows[2:]]


def _number(text: str) -> float:
    """"1.18× [1.09, 1.27]" or "1.18× (n=1, no interval)" -> 1.18."""
    return float(text.strip().split(" ")[0].rstrip("×"))


@pytest.fixture(scope="module")
def raw() -> pd.DataFrame:
    frame = pd.read_csv(REAL, keep_default_na=False, na_values={"tau": [""], "speedup": [""]})
    return frame[frame["kind"] == "run"]


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> tuple[Path, Path]:
    """The two record files, written by eval's own commands."""
    folder = tmp_path_factory.mktemp("records")
    heads, cost = folder / "heads.csv", folder / "cost.csv"
    assert eval_main(["heads-table", str(HEADS / "dels"), str(HEADS / "dels_markov"), "--name", "DeLS-GRU",
                      "--name", "DeLS-Markov", "--out", str(heads)]) == 0
    assert eval_main(["training-cost", "--manifest", str(MANIFEST), "--out", str(cost)]) == 0
    return heads, cost


@pytest.fixture(scope="module")
def report(records, tmp_path_factory):
    heads, cost = records
    out = tmp_path_factory.mktemp("plots")
    written = write_all(load_results(REAL), out, source=str(REAL), kv_cache_tokens=KV_TOKENS,
                        dels_weights=load_dels_weights(heads), training_cost=load_training_cost(cost))
    return written, out


def _select(raw, **where) -> pd.DataFrame:
    rows = raw
    for column, value in where.items():
        rows = rows[rows[column].isin(value if isinstance(value, (list, tuple, set)) else [value])]
    return rows


def _pooled(rows: pd.DataFrame, metric: str, base: pd.DataFrame | None = None) -> float:
    """Recomputed from the counters: block-weighted tau, tokens / wall time, speedup over base."""
    if metric == "tau":
        return 1 + rows["num_accepted_tokens"].sum() / rows["num_drafts"].sum()
    rate = rows["output_tokens"].sum() / rows["wall_s"].sum()
    if metric == "tokens_per_s":
        return rate
    return rate / (base["output_tokens"].sum() / base["wall_s"].sum())


def _seed_mean(raw, metric, system, **where) -> float:
    rows = _select(raw, system=system, **where)
    base = _select(raw, system="AR", **where)
    values = [_pooled(rows[rows.seed == s], metric, base[base.seed == s]) for s in sorted(set(rows.seed))]
    return float(np.mean(values))


def test_the_real_file_is_what_the_tables_need(raw):
    """The committed run covers every table: categories, tiers, two concurrencies, three seeds."""
    assert set(raw["system"]) == {"AR", "DFlash", "DeLS-GRU"}
    assert set(raw["benchmark"]) == {"speed-qualitative", "speed-throughput_1k"}
    assert set(raw.loc[raw.temperature == 0, "concurrency"]) == {1, 2}
    assert set(raw.loc[raw.temperature == 1, "seed"]) == {42, 43, 44}
    assert set(raw.loc[raw.benchmark == "speed-throughput_1k", "category"]) == {"low_entropy", "mixed",
                                                                                 "high_entropy"}
    assert (raw.loc[raw.system != "AR", "num_drafts"] > 0).all()
    assert raw["git_rev"].str.len().gt(0).all() and raw["vllm_version"].astype(str).str.startswith("0.").all()


def test_every_new_table_is_written_in_both_forms_and_indexed(report):
    written, out = report
    stems = {w.stem for w in written.tables}
    expected = {"table_concurrency_speedup__speed-qualitative", "table_concurrency_tau__speed-qualitative",
                "table_concurrency_speedup__speed-throughput-1k", "table_concurrency_tau__speed-throughput-1k",
                "table_concurrency_detail", "table_categories", "table_seeds", "table_dels_weights",
                "table_training_cost"}
    assert expected <= stems
    index = (out / "index.md").read_text()
    for stem in expected:
        assert (out / f"{stem}.md").stat().st_size > 0
        tex = (out / f"{stem}.tex").read_text()
        assert tex.count(r"\begin{tabular}") == 1 and r"\bottomrule" in tex
        assert f"[Markdown]({stem}.md) · [LaTeX]({stem}.tex)" in index
    assert not {name for name, _ in written.skipped} & expected


def test_concurrency_table_speedup_and_flags(report, raw):
    _, out = report
    rows = _table(out / "table_concurrency_speedup__speed-throughput-1k.md")
    t0 = _select(raw, temperature=0.0, benchmark="speed-throughput_1k")
    assert [(r["Benchmark"], r["c"]) for r in rows] == [("speed-throughput_1k", "1"),
                                                       ("speed-throughput_1k", "2 ‡†")]
    for row, c in zip(rows, (1, 2)):
        for tier in ("low_entropy", "mixed", "high_entropy"):
            cells = _select(t0, concurrency=c, category=tier)
            base = cells[cells.system == "AR"]
            assert _number(row[f"AR (tok/s) · {tier}"]) == pytest.approx(_pooled(base, "tokens_per_s"), rel=0.01)
            for system in ("DFlash", "DeLS-GRU"):
                expected = _pooled(cells[cells.system == system], "speedup", base)
                assert _number(row[f"{system} · {tier}"]) == pytest.approx(expected, abs=0.006)
                # one row per cell at T = 0: the file's own speedup column
                assert expected == pytest.approx(cells.loc[cells.system == system, "speedup"].item(), rel=1e-6)
        pooled = _select(t0, concurrency=c)
        for system in ("DFlash", "DeLS-GRU"):
            expected = _pooled(pooled[pooled.system == system], "speedup", pooled[pooled.system == "AR"])
            assert _number(row[f"{system} · all (pooled)"]) == pytest.approx(expected, abs=0.006)
    # ‡: a tier had fewer prompts than c = 2; †: 2 x (1024 + 24) > 1500 KV-cache tokens.
    assert (t0.loc[t0.concurrency == 2, "num_prompts"] < 2).any()
    text = (out / "table_concurrency_speedup__speed-throughput-1k.md").read_text()
    assert "‡ offered, not resident" in text and f"> {KV_TOKENS} KV-cache tokens" in text
    assert r"2 $\ddagger$$\dagger$" in (out / "table_concurrency_speedup__speed-throughput-1k.tex").read_text()
    # natural-length prompts are never memory-bound by the rule
    qualitative = _table(out / "table_concurrency_speedup__speed-qualitative.md")
    assert all("†" not in r["c"] for r in qualitative)


def test_concurrency_table_tau_is_block_weighted(report, raw):
    _, out = report
    rows = _table(out / "table_concurrency_tau__speed-qualitative.md")
    assert "AR · coding" not in rows[0]  # AR does not speculate
    t0 = _select(raw, temperature=0.0, benchmark="speed-qualitative")
    for row in rows:
        c = int(row["c"].split()[0])
        for system in ("DFlash", "DeLS-GRU"):
            mine = _select(t0, concurrency=c, system=system)
            assert _number(row[f"{system} · all (pooled)"]) == pytest.approx(_pooled(mine, "tau"), abs=0.006)
            for category in set(mine["category"]):
                cell = mine[mine.category == category]
                assert _number(row[f"{system} · {category}"]) == pytest.approx(cell["tau"].item(), abs=0.006)


def test_concurrency_detail_cells(report, raw):
    _, out = report
    rows = _table(out / "table_concurrency_detail.md")
    t0 = _select(raw, temperature=0.0)
    assert len(rows) == len(t0[["benchmark", "category", "concurrency"]].drop_duplicates())
    for row in rows:
        c = int(row["c"].split()[0])
        cells = _select(t0, benchmark=row["Benchmark"], category=row["Tier"], concurrency=c)
        flagged = "‡" in row["c"]
        assert flagged == bool((cells["num_prompts"] < c).any())
        assert ("†" in row["c"]) == (row["Benchmark"] == "speed-throughput_1k" and c == 2)
        tau, rate, speedup = (_number(x) for x in row["DFlash (τ / tok/s / Sp.)"].split(" / "))
        dflash = cells[cells.system == "DFlash"]
        assert tau == pytest.approx(dflash["tau"].item(), abs=0.006)
        assert rate == pytest.approx(dflash["tokens_per_s"].item(), rel=0.01)
        assert speedup == pytest.approx(dflash["speedup"].item(), abs=0.006)
        assert row["AR (tok/s / Sp.)"].endswith("/ 1.00×")


def test_category_table_unweighted_and_pooled_rows(report, raw):
    _, out = report
    rows = _table(out / "table_categories.md")
    text = (out / "table_categories.md").read_text()
    assert "Mean over categories (unweighted)" in text and "All categories (pooled)" in text
    for temperature in (0.0, 1.0):
        for benchmark in ("speed-qualitative", "speed-throughput_1k"):
            main = _select(raw, temperature=temperature, benchmark=benchmark, concurrency=1)
            mine = [r for r in rows if r["T"] == f"{temperature:g}" and r["Benchmark"] == benchmark]
            categories = list(dict.fromkeys(main["category"]))
            assert [r["Category"] for r in mine] == categories + ["Mean over categories (unweighted)",
                                                                 "All categories (pooled)"]
            for system in ("DFlash", "DeLS-GRU"):
                column = f"{system} (τ / tok/s)"
                per_category = [_seed_mean(main, "tau", system, category=c) for c in categories]
                for r, expected in zip(mine, per_category):
                    assert _number(r[column].split(" / ")[0]) == pytest.approx(expected, abs=0.006)
                unweighted = _number(mine[-2][column].split(" / ")[0])
                assert unweighted == pytest.approx(np.mean(per_category), abs=0.006)
                pooled = _number(mine[-1][column].split(" / ")[0])
                assert pooled == pytest.approx(_seed_mean(main, "tau", system), abs=0.006)
                rate = _number(mine[-1][column].split(" / ")[1])
                assert rate == pytest.approx(_seed_mean(main, "tokens_per_s", system), rel=0.01)


def test_seed_table_mean_and_sample_std(report, raw):
    _, out = report
    rows = _table(out / "table_seeds.md")
    text = (out / "table_seeds.md").read_text()
    assert "mean over seeds 42, 43, 44" in text
    t1 = _select(raw, temperature=1.0, concurrency=1)
    metric = None
    checked = 0
    for row in rows:
        metric = {"Acceptance τ": "tau", "Throughput (tok/s)": "tokens_per_s"}.get(row["Metric"], metric)
        for system in ("DFlash", "DeLS-GRU"):
            mine = _select(t1, benchmark=row["Benchmark"], system=system)
            base = _select(t1, benchmark=row["Benchmark"], system="AR")
            per_seed = [_pooled(mine[mine.seed == s], metric, base[base.seed == s]) for s in (42, 43, 44)]
            mean, std = row[system].replace("(", "").replace(")", "").split()
            assert float(mean) == pytest.approx(np.mean(per_seed), abs=0.006 if metric == "tau" else 0.06)
            assert float(std) == pytest.approx(np.std(per_seed, ddof=1), abs=0.006 if metric == "tau" else 0.06)
            checked += 1
        assert row["AR"] == "—" if metric == "tau" else row["AR"] != "—"
    assert checked == 2 * 2 * 2  # metrics x benchmarks x systems


def test_dels_weights_table_from_the_shipped_heads(report, records):
    _, out = report
    heads, _ = records
    frame = pd.read_csv(heads)
    configs = {name: json.loads((HEADS / folder / "config.json").read_text())
               for name, folder in (("DeLS-GRU", "dels"), ("DeLS-Markov", "dels_markov"))}
    block = json.loads((HEADS / "config.json").read_text())["block_size"]
    assert len(frame) == 2 * (block - 1) and set(frame["weights"]) == {"fixed"}
    assert frame["config_sha256"].str.len().eq(64).all() and frame["git_rev"].str.len().gt(0).all()
    rows = _md_rows((out / "table_dels_weights.md").read_text())
    assert rows[0][:4] == ["Head", "Kind", "Weight", "Weights"]
    assert rows[0][4:] == [str(p) for p in range(1, block)]
    body = rows[2:]
    for i, (name, config) in enumerate(configs.items()):
        alpha, beta = body[2 * i], body[2 * i + 1]
        assert alpha[:4] == [name, config["kind"], "α", "fixed"] and beta[2] == "β"
        assert [float(v) for v in alpha[4:]] == [config["alpha"]] * (block - 1)
        assert [float(v) for v in beta[4:]] == [config["beta"]] * (block - 1)
    assert r"$\alpha$" in (out / "table_dels_weights.tex").read_text()


def test_heads_table_reads_a_learned_schedule(tmp_path):
    """A head whose config holds per-slot lists (what training.train_dels' fusion stage writes)."""
    folder = tmp_path / "draft" / "dels"
    folder.mkdir(parents=True)
    config = json.loads((HEADS / "dels" / "config.json").read_text())
    config.update(alpha=[0.31, 0.35, 0.4], beta=[0.2, 0.25, 0.3])
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "heads.csv"
    assert eval_main(["heads-table", str(tmp_path / "draft"), "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert list(frame["position"]) == [1, 2, 3] and set(frame["weights"]) == {"learned"}
    assert list(frame["alpha"]) == [0.31, 0.35, 0.4] and list(frame["beta"]) == [0.2, 0.25, 0.3]


def test_training_cost_table_from_the_manifest(report, records):
    _, out = report
    _, cost = records
    stages = json.loads(MANIFEST.read_text())["stages"]
    trained = [name for name, stage in stages.items() if "train" in (stage.get("recipe") or {})]
    rows = _table(out / "table_training_cost.md")
    assert [r["Stage"] for r in rows] == trained
    for row in rows:
        stage = stages[row["Stage"]]
        assert float(row["Wall (s)"].replace(",", "")) == pytest.approx(stage["seconds"])
        assert row["Steps"] == (str(stage["steps"]) if "steps" in stage else "—")
        assert row["Peak RSS (MiB)"] == "not recorded" == row["Peak CUDA (MiB)"]  # shipped before run.json
    assert pd.read_csv(cost)["manifest_sha256"].nunique() == 1


def test_trainer_run_record_reaches_the_training_cost_table(tmp_path):
    """A real Trainer.fit writes run.json with its peak RSS; training-cost picks it up."""
    from _training_helpers import toy_trainer
    from plots.records import training_cost_table
    from plots.tables import render_markdown

    run_dir = tmp_path / "runs" / "toy"
    toy_trainer(run_dir, 8, max_steps=3, batch_size=2, save_every=10, log_every=1).fit()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["steps"] == 3 and record["peak_rss_mib"] > 10 and record["peak_cuda_mib"] is None
    manifest = tmp_path / "manifest.json"
    manifest.write_text(json.dumps({"stages": {"toy": {"recipe": {"method": "toy", "train": {
        "output_dir": "runs/toy", "batch_size": 2}}, "steps": 3, "seconds": 0.5}}}))
    out = tmp_path / "cost.csv"
    assert eval_main(["training-cost", "--manifest", str(manifest), "--runs-root", str(tmp_path),
                      "--out", str(out)]) == 0
    row = _table_text(render_markdown(training_cost_table(load_training_cost(out))))[0]
    assert float(row["Peak RSS (MiB)"].replace(",", "")) == pytest.approx(record["peak_rss_mib"], abs=1)
    assert row["Peak CUDA (MiB)"] == "n/a (no CUDA)"


def _table_text(text: str) -> list[dict[str, str]]:
    rows = _md_rows(text)
    return [dict(zip(rows[0], row)) for row in rows[2:]]


def test_plots_cli_takes_the_record_files(capsys):
    try:
        plots_main(["all", "--help"])
    except SystemExit:
        pass
    out = capsys.readouterr().out
    assert "--kv-cache-tokens" in out and "--dels-weights" in out and "--training-cost" in out


def test_record_files_with_missing_columns_fail_clearly(tmp_path):
    bad = tmp_path / "heads.csv"
    pd.DataFrame({"head": ["x"], "position": [1]}).to_csv(bad, index=False)
    with pytest.raises(ValueError, match=r"lacks column\(s\) kind, alpha, beta, weights"):
        load_dels_weights(bad)
    with pytest.raises(ValueError, match="eval training-cost"):
        load_training_cost(tmp_path / "missing.csv")


def test_plots_table_prints_each_new_kind(capsys, report):
    """`python -m plots table --kind K` prints the same tables `plots all` writes."""
    _, out = report
    for kind, stem in (("categories", "table_categories"), ("seeds", "table_seeds"),
                       ("concurrency-detail", "table_concurrency_detail")):
        code = plots_main(["table", "--results", str(REAL), "--kind", kind, "--kv-cache-tokens", str(KV_TOKENS)])
        printed = capsys.readouterr().out
        assert code == 0 and printed == (out / f"{stem}.md").read_text(encoding="utf-8"), kind
    assert plots_main(["table", "--results", str(REAL), "--kind", "concurrency", "--value", "speedup",
                       "--format", "tex", "--kv-cache-tokens", str(KV_TOKENS)]) == 0
    printed = capsys.readouterr().out
    for stem in ("table_concurrency_speedup__speed-qualitative", "table_concurrency_speedup__speed-throughput-1k"):
        assert (out / f"{stem}.tex").read_text(encoding="utf-8") in printed
