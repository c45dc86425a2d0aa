"""plots: loading and validation, every figure builder, tables, the `all` report and CLI."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.image import imread

from eval.schema import ALL_COLUMNS
from plots.figures.ablation import DecodePair, decode_ablation, find_decode_pairs
from plots.figures.acceptance import accept_per_position
from plots.figures.common import NotPlottable
from plots.figures.concurrency import metric_vs_concurrency
from plots.figures.dels import dels_heatmap, sweep_grid
from plots.figures.speedup import speedup_bars
from plots.figures.stages import stage_bars
from plots.__main__ import main as plots_main
from plots.io import REQUIRED_COLUMNS, load_results, validate_results
from plots.report import write_all
from plots.select import main_setting, run_rows, split_sweeps, stage_rows
from plots.tables import decode_ablation_table, latex_table, markdown_table, render_markdown, stage_table

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
Q8, Q4 = "/models/Qwen3-8B", "/models/Qwen3-4B"
SYSTEM_TAU = {"AR": 1.0, "DFlash": 3.0, "LiLiCorr-greedy": 3.5, "LiLiCorr-viterbi": 3.4, "DeLS": 3.3}
BENCH_TAU = {"gsm8k": 1.0, "mbpp": 0.5, "speed": 0.0}
STAGES_MS = {"target verify": 7.5, "draft backbone": 1.3, "accept": 0.57}  # + "speculative head" per system


def _row(**fields) -> dict:
    row = {c: "" for c in ALL_COLUMNS}
    row.update(dels_alpha=math.nan, dels_beta=math.nan, stage_ms=math.nan, accept_per_pos="[]",
               num_prompts=8, num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, output_tokens=1024,
               wall_s=1.0, run_id="r1", git_rev="abc", vllm_version="0.32.0", engine_flags="{}",
               system_config="{}", timestamp="2025-01-01T00:00:00")
    row.update(fields)
    return row


def _accept(tau: float, k: int = 6) -> str:
    p = 1.0 - 1.0 / tau
    return json.dumps([round(p ** (i + 1) + 0.05, 4) for i in range(k)])


def _run(target, system, benchmark, category, temperature, seed, tau, speedup, concurrency=1, input_len=0,
         alpha=math.nan, beta=math.nan) -> dict:
    tps_ar = (100.0 if target == Q8 else 150.0) * concurrency ** 0.8
    # Counters and wall time that the per-row tau and tokens/s come from (pooled rows read them).
    drafts = 0 if system == "AR" else 100
    counters = dict(num_drafts=drafts, num_accepted_tokens=round((tau - 1.0) * drafts),
                    wall_s=1024 / (tps_ar * speedup))
    return _row(kind="run", system=system, benchmark=benchmark, category=category, temperature=temperature,
                concurrency=concurrency, input_len=input_len, seed=seed, dels_alpha=alpha, dels_beta=beta,
                tau=tau, speedup=speedup, tokens_per_s=tps_ar * speedup, target=target, **counters,
                accept_per_pos="[]" if system == "AR" else _accept(tau),
                draft="" if system == "AR" else "/ckpt/" + system)


def make_results() -> pd.DataFrame:
    """Two targets, two temperatures (two seeds at T=1), a concurrency sweep (8B, T=0),
    a DeLS (alpha, beta) sweep (8B, T=0; full grid on gsm8k, partial on mbpp), stage rows."""
    rows = []
    for target in (Q8, Q4):
        for temperature, seeds in ((0.0, [0]), (1.0, [0, 1])):
            for seed in seeds:
                for benchmark, offset in BENCH_TAU.items():
                    for category in (["math", "code"] if benchmark == "speed" else [""]):
                        for system, base in SYSTEM_TAU.items():
                            if system == "AR":
                                tau, speedup = 1.0, 1.0
                            else:
                                tau = base + offset - 0.5 * temperature - 0.2 * (target == Q4) + 0.01 * seed
                                tau += 0.4 * (system == "DeLS" and benchmark == "mbpp")  # DeLS wins mbpp
                                tau += 0.1 * (category == "code")
                                speedup = 0.8 * tau - 0.3
                            extra = {}
                            if system == "DeLS":
                                extra = {"alpha": 0.3, "beta": 0.3}
                            if system == "DeLS" and target == Q8 and temperature == 0.0 and benchmark != "speed":
                                continue  # written by the sweep below (same key)
                            rows.append(_run(target, system, benchmark, category, temperature, seed, tau, speedup,
                                             **extra))
    for category, tier in (("low", 0.4), ("mixed", 0.2), ("high", -0.6)):
        for concurrency in (1, 2, 4, 8):
            for system in ("AR", "DFlash", "LiLiCorr-greedy"):
                tau = 1.0 if system == "AR" else SYSTEM_TAU[system] + tier
                speedup = 1.0 if system == "AR" else (0.8 * tau - 0.3) / (1 + 0.1 * math.log2(concurrency))
                rows.append(_run(Q8, system, "speed-throughput_1k", category, 0.0, 0, tau, speedup,
                                 concurrency=concurrency, input_len=1024))
    grid = [0.0, 0.3, 0.6]
    for benchmark, points in (("gsm8k", [(a, b) for a in grid for b in grid]), ("mbpp", [(0.0, 0.0), (0.3, 0.3)])):
        for alpha, beta in points:
            tau = 4.3 + BENCH_TAU[benchmark] - (alpha - 0.3) ** 2 - (beta - 0.3) ** 2 + 0.2 * beta
            rows.append(_run(Q8, "DeLS", benchmark, "", 0.0, 0, tau, 0.8 * tau - 0.3, alpha=alpha, beta=beta))
    for system, head in (("DFlash", 0.05), ("LiLiCorr-greedy", 0.28)):
        total = sum(STAGES_MS.values()) + head + 0.1
        for stage, ms in list(STAGES_MS.items()) + [("speculative head", head), ("per-step wall", total)]:
            rows.append(_row(kind="stage", system=system, benchmark="mt-bench", temperature=0.0, concurrency=1,
                             input_len=0, seed=0, stage=stage, stage_ms=ms, tau=math.nan, speedup=math.nan,
                             tokens_per_s=math.nan, target=Q8, accept_per_pos=""))
    return pd.DataFrame(rows, columns=ALL_COLUMNS)


@pytest.fixture(scope="module")
def results() -> pd.DataFrame:
    return validate_results(make_results(), "fixture")


@pytest.fixture(scope="module")
def results_csv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("results") / "results.csv"
    make_results().to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def report_csv(tmp_path_factory) -> Path:
    """The fixture's 8B, T=0 slice: still every kind of figure, fewer files to render."""
    df = make_results()
    path = tmp_path_factory.mktemp("report") / "results.csv"
    df[(df["target"] == Q8) & (df["temperature"] == 0.0)].to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def written(report_csv, tmp_path_factory):
    """`write_all` over report_csv, once for the report and determinism tests."""
    out_dir = tmp_path_factory.mktemp("plots")
    return write_all(load_results(report_csv), out_dir, source=str(report_csv)), out_dir


def _split(rows: pd.DataFrame, target: str, temperature: float) -> pd.DataFrame:
    return rows[(rows["target"] == target) & (rows["temperature"] == temperature)]


def _legend(fig: Figure) -> list[str]:
    assert len(fig.legends) == 1, "each figure carries one figure-level legend"
    return [t.get_text() for t in fig.legends[0].get_texts()]


def _visible_axes(fig: Figure) -> list:
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]


# ---- loading and validation ------------------------------------------------------------------


def test_csv_and_parquet_load_the_same(results_csv, tmp_path):
    from_csv = load_results(results_csv)
    parquet = tmp_path / "results.parquet"
    make_results().to_parquet(parquet, index=False)
    from_parquet = load_results(parquet)
    assert len(from_csv) == len(from_parquet) == len(make_results())
    for df in (from_csv, from_parquet):
        assert set(df["kind"]) == {"run", "stage"}
        assert df["concurrency"].dtype == np.int64 and df["tau"].dtype == np.float64
        assert (df.loc[df["system"] == "AR", "accept_per_pos"].map(len) == 0).all()
        assert (df.loc[(df["kind"] == "run") & (df["system"] != "AR"), "accept_per_pos"].map(len) == 6).all()
        assert "" in set(df["category"]) and "" in set(df["stage"])
    pd.testing.assert_series_equal(from_csv["tau"], from_parquet["tau"])


def test_missing_columns_are_named(tmp_path):
    path = tmp_path / "results.csv"
    make_results().drop(columns=["tau", "speedup"]).to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"lacks column\(s\) tau, speedup"):
        load_results(path)


def test_empty_file_and_no_rows_fail_clearly(tmp_path):
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        load_results(empty)
    header_only = tmp_path / "header.csv"
    pd.DataFrame(columns=ALL_COLUMNS).to_csv(header_only, index=False)
    with pytest.raises(ValueError, match="has no rows"):
        load_results(header_only)
    with pytest.raises(ValueError, match="does not exist"):
        load_results(tmp_path / "missing.parquet")
    with pytest.raises(ValueError, match="expected .parquet or .csv"):
        (tmp_path / "r.json").write_text("{}")
        load_results(tmp_path / "r.json")


def test_bad_values_name_the_column():
    df = make_results()
    df["concurrency"] = df["concurrency"].astype(object)
    df.loc[3, "concurrency"] = "many"
    with pytest.raises(ValueError, match="'concurrency' needs numbers; row 3"):
        validate_results(df)
    df = make_results()
    df.loc[0, "kind"] = "runs"
    with pytest.raises(ValueError, match=r"'kind' holds \['runs'\]"):
        validate_results(df)
    df = make_results()
    df.loc[1, "accept_per_pos"] = "[0.5, 0.3"
    with pytest.raises(ValueError, match="accept_per_pos"):
        validate_results(df)


# ---- selection -------------------------------------------------------------------------------


def test_sweep_rows_leave_the_fixed_views(results):
    fixed, sweep = split_sweeps(run_rows(results))
    assert set(sweep["system"]) == {"DeLS"} and set(sweep["benchmark"]) == {"gsm8k", "mbpp"}
    assert len(sweep) == 9 + 2
    assert any("DeLS on gsm8k" in note and "9 (dels_alpha, dels_beta)" in note for note in fixed.notes)
    main = main_setting(run_rows(results)).rows
    assert set(main["concurrency"]) == {1}
    assert not ((main["system"] == "DeLS") & (main["target"] == Q8) & (main["temperature"] == 0.0)
                & (main["benchmark"] == "gsm8k")).any()


# ---- figures ---------------------------------------------------------------------------------


def test_speedup_bars(results):
    fig = speedup_bars(main_setting(run_rows(results)).rows)
    assert isinstance(fig, Figure)
    assert fig.get_suptitle().startswith("Speedup over autoregressive decoding")
    axes = _visible_axes(fig)
    assert [ax.get_title() for ax in axes] == ["Qwen3-8B, T=0", "Qwen3-8B, T=1", "Qwen3-4B, T=0", "Qwen3-4B, T=1"]
    assert all(ax.get_ylabel() == "speedup over AR (×)" and ax.get_xlabel() == "benchmark" for ax in axes)
    assert _legend(fig) == ["DFlash", "LiLiCorr-greedy", "LiLiCorr-viterbi", "DeLS", "AR (1×)"]
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["gsm8k", "mbpp", "speed", "speed-throughput_1k"]
    # Bar heights: 4B, T=1, LiLiCorr-greedy on gsm8k is the mean over two seeds.
    expected = np.mean([0.8 * (3.5 + 1.0 - 0.5 - 0.2 + 0.01 * s) - 0.3 for s in (0, 1)])
    bars = [p for p in axes[3].patches if p.get_facecolor()[:3] != (1, 1, 1)]
    heights = sorted(round(p.get_height(), 6) for p in bars)
    assert round(expected, 6) in heights


@pytest.mark.parametrize("metric,label", [("tokens_per_s", "output tokens/s"), ("speedup", "speedup over AR (×)"),
                                          ("tau", "acceptance length τ")])
def test_metric_vs_concurrency(results, metric, label):
    fixed, _ = split_sweeps(run_rows(results))
    fig = metric_vs_concurrency(_split(fixed.rows, Q8, 0.0), metric)
    assert "vs concurrency" in fig.get_suptitle() and "Qwen3-8B, T=0" in fig.get_suptitle()
    axes = _visible_axes(fig)
    assert [ax.get_title() for ax in axes] == [f"speed-throughput_1k, input 1024, {tier}"
                                              for tier in ("low", "mixed", "high")]
    assert all(ax.get_ylabel() == label and ax.get_xlabel() == "concurrency (max_num_seqs)" for ax in axes)
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["1", "2", "4", "8"]
    legend = _legend(fig)
    assert ("AR" in legend) == (metric == "tokens_per_s")  # AR's tau and speedup are 1 by definition
    assert {"DFlash", "LiLiCorr-greedy"} <= set(legend)
    assert ("AR (1×)" in legend) == (metric == "speedup")
    with pytest.raises(NotPlottable, match="more than one concurrency"):
        metric_vs_concurrency(_split(fixed.rows, Q4, 0.0), metric)


def test_accept_per_position(results):
    rows = _split(main_setting(run_rows(results)).rows, Q4, 1.0)
    fig = accept_per_position(rows)
    assert fig.get_suptitle() == "Acceptance rate per draft position — Qwen3-4B, T=1"
    axes = _visible_axes(fig)
    assert [ax.get_title() for ax in axes] == ["gsm8k", "mbpp", "speed", "speed-throughput_1k"][:len(axes)]
    assert axes[0].get_xlabel() == "draft position" and axes[0].get_ylabel() == "acceptance rate"
    assert "AR" not in _legend(fig) and "DFlash" in _legend(fig)
    line = next(l for l in axes[0].get_lines() if l.get_label() == "DFlash")
    seeds = [json.loads(_accept(3.0 + 1.0 - 0.5 - 0.2 + 0.01 * s)) for s in (0, 1)]
    np.testing.assert_allclose(line.get_ydata(), np.mean(seeds, axis=0))
    np.testing.assert_array_equal(line.get_xdata(), np.arange(1, 7))


def test_decode_pairs_by_name_and_mapping():
    systems = ["AR", "LiLiCorr-greedy", "LiLiCorr-viterbi", "DFlash", "X_exact", "X_greedy", "Lone-greedy"]
    pairs = find_decode_pairs(systems)
    assert pairs == [DecodePair("LiLiCorr", "LiLiCorr-greedy", "LiLiCorr-viterbi"),
                     DecodePair("X", "X_greedy", "X_exact")]
    mapped = find_decode_pairs(["AR", "walk", "dp"], {"walk": "dp"})
    assert mapped == [DecodePair("walk", "walk", "dp")]
    with pytest.raises(ValueError, match="no system named dp"):
        find_decode_pairs(["walk"], {"walk": "dp"})


def test_decode_ablation(results):
    rows = _split(main_setting(run_rows(results)).rows, Q8, 0.0)
    pairs = find_decode_pairs(sorted(set(rows["system"])))
    fig = decode_ablation(rows, pairs)
    assert fig.get_suptitle() == "Decode-rule ablation (Δ = exact vs greedy) — Qwen3-8B, T=0"
    ax = _visible_axes(fig)[0]
    assert ax.get_title() == "LiLiCorr: LiLiCorr-greedy vs LiLiCorr-viterbi"
    assert ax.get_ylabel() == "acceptance length τ"
    assert _legend(fig) == ["greedy walk", "exact path (Viterbi)"]
    greedy, exact = 3.5 + 1.0, 3.4 + 1.0  # gsm8k
    assert ax.patches[0].get_height() == pytest.approx(greedy)
    assert ax.texts[0].get_text() == f"{(exact - greedy) / greedy * 100:+.1f}%"
    with pytest.raises(NotPlottable, match="no greedy/exact system pair"):
        decode_ablation(rows, [])


def test_dels_heatmap(results):
    _, sweep = split_sweeps(run_rows(results))
    grid = sweep_grid(sweep)
    assert grid.benchmarks == ["gsm8k"]
    assert grid.notes == ["mbpp left out of the heatmap: measured at 2 of the 9 grid points"]
    assert grid.values.loc[0.3, 0.6] == pytest.approx(4.3 + 1.0 - 0.09 + 0.12)
    fig = dels_heatmap(sweep)
    assert fig.get_suptitle() == "DeLS fusion-weight sweep, mean over gsm8k — Qwen3-8B, DeLS, T=0, c=1, natural input"
    axes = _visible_axes(fig)
    assert [ax.get_title() for ax in axes] == ["acceptance length τ over (α, β)", "row minus its β = 0 value",
                                              "gain of the best β over β = 0"]
    assert axes[0].get_xlabel() == "β (unigram-prior weight)" and axes[0].get_ylabel() == "α (local-head weight)"
    image = axes[0].get_images()[0].get_array()
    np.testing.assert_allclose(np.asarray(image), grid.values.to_numpy())
    gains = [p.get_height() for p in axes[2].patches]
    expected = (grid.values[[0.3, 0.6]].max(axis=1) - grid.values[0.0]).to_numpy()
    np.testing.assert_allclose(gains, expected)
    one_point = sweep[(sweep["dels_alpha"] == 0.3) & (sweep["dels_beta"] == 0.3)]
    with pytest.raises(NotPlottable, match="no \\(dels_alpha, dels_beta\\) sweep"):
        dels_heatmap(one_point)


def test_stage_bars(results):
    fig = stage_bars(stage_rows(results))
    assert fig.get_suptitle() == "Per-step stage decomposition — Qwen3-8B, T=0, c=1, natural input"
    ax = _visible_axes(fig)[0]
    assert ax.get_title() == "mt-bench" and ax.get_ylabel() == "ms per step" and ax.get_xlabel() == "system"
    assert _legend(fig) == list(STAGES_MS) + ["speculative head", "per-step wall (measured total)"]
    tops = {}
    for patch in ax.patches:  # stacked: the top of the highest segment is the sum of the parts
        x = round(patch.get_x() + patch.get_width() / 2, 6)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    assert sorted(tops.values()) == pytest.approx(sorted(sum(STAGES_MS.values()) + h for h in (0.05, 0.28)))
    with pytest.raises(NotPlottable):
        stage_bars(stage_rows(results).iloc[0:0])


def test_builders_refuse_mixed_targets(results):
    with pytest.raises(ValueError, match="split them first"):
        accept_per_position(main_setting(run_rows(results)).rows)


# ---- tables ----------------------------------------------------------------------------------


def _md_rows(text: str) -> list[list[str]]:
    lines = [l for l in text.splitlines() if l.startswith("|")]
    return [[c.strip() for c in l.strip("|").split("|")] for l in lines]


def test_markdown_table_bolds_the_best_per_row(results):
    rows = main_setting(run_rows(results)).rows
    text = markdown_table(rows, value="tau")
    table = _md_rows(text)
    header = table[0]
    assert header[:3] == ["Target", "Benchmark", "T"]
    assert header[3:] == ["AR", "DFlash", "LiLiCorr-greedy", "LiLiCorr-viterbi", "DeLS"]
    body = table[2:]
    # (benchmarks + Average + pooled) per target and T; throughput only 8B, T=0
    assert len(body) == (4 + 2) + 3 * (3 + 2)
    for cells in body:
        values = cells[3:]
        bold = [i for i, v in enumerate(values) if v.startswith("**")]
        numbers = [_leading_number(v) if v.strip("*") not in ("—",) else -1 for v in values]
        assert bold == [i for i, v in enumerate(numbers) if v == max(numbers)], cells
    mbpp_4b = next(c for c in body if c[:3] == ["Qwen3-4B", "mbpp", "0"])
    assert mbpp_4b[3 + 4].startswith("**") and not mbpp_4b[3 + 2].startswith("**")
    gsm_8b = next(c for c in body if c[:3] == ["Qwen3-8B", "gsm8k", "0"])
    assert gsm_8b[3 + 4] == "—"  # DeLS on gsm8k (8B, T=0) is a sweep, not a cell
    average_8b = next(c for c in body if c[:3] == ["Qwen3-8B", "Average", "0"])
    assert average_8b[3 + 4] == "—" and average_8b[3 + 2].startswith("**")
    assert "Average: unweighted mean" in text
    # The pooled row weighs every prompt's blocks: 1 + all accepted / all drafts, here the mean of
    # the benchmarks' taus because every cell drafted 100 blocks.
    pooled_4b = next(c for c in body if c[:3] == ["Qwen3-4B", "All prompts (pooled)", "0"])
    cells = rows[(rows.target == Q4) & (rows.temperature == 0) & (rows.system == "DFlash")]
    expected = 1 + cells.num_accepted_tokens.sum() / cells.num_drafts.sum()
    assert _leading_number(pooled_4b[3 + 1]) == pytest.approx(expected, abs=0.006)
    assert pooled_4b[3] == "1.00" and "block-weighted" in text  # AR: 1 by definition, no interval
    # Every tau carries its 95% interval, the point inside it (one row: said, not invented).
    low, high = (float(x) for x in pooled_4b[3 + 1].strip("*").split("[")[1].rstrip("]").split(","))
    assert low <= expected <= high and low < high
    assert gsm_8b[3 + 1].endswith("(n=1, no interval)")
    # The throughput benchmark's input length is a property of the benchmark, named in a note.
    assert "speed-throughput_1k (input 1024)" in text and "gsm8k (natural input)" in text


def _leading_number(cell: str) -> float:
    """'**1.18× [1.09, 1.27]**' -> 1.18."""
    return float(cell.strip("*").split()[0].rstrip("×"))


def test_speedup_table_and_latex(results):
    rows = main_setting(run_rows(results)).rows
    md = markdown_table(rows, value="speedup")
    assert "**3.30× (n=1, no interval)**" in md  # LiLiCorr-greedy, 8B, gsm8k, T=0: 0.8 * 4.5 - 0.3
    tex = latex_table(rows, value="speedup")
    assert r"\textbf{3.30$\times$ (n=1, no interval)}" in tex and r"\begin{tabular}{lll" in tex and r"\bottomrule" in tex
    assert tex.count(r"\textbf{") == md.count("**") // 2
    assert r"speed-throughput\_1k" in tex


def test_stage_and_ablation_tables(results):
    stage_text = render_markdown(stage_table(results))
    stages = _md_rows(stage_text)
    assert stages[0] == ["Stage", "DFlash", "LiLiCorr-greedy"]
    head = next(r for r in stages if r[0] == "speculative head")
    assert head[1:] == ["**0.05**", "0.28"]  # lowest is best for time
    assert "lowest per row in bold" in stage_text
    rows = main_setting(run_rows(results)).rows
    table = decode_ablation_table(_split(rows, Q8, 0.0), "LiLiCorr-greedy", "LiLiCorr-viterbi")
    body = _md_rows(render_markdown(table))
    gsm = next(r for r in body if r[0] == "gsm8k")
    assert gsm == ["gsm8k", "**4.500**", "4.400", f"{(4.4 - 4.5) / 4.5 * 100:+.2f}%"]
    deltas = [(b - a) / a * 100 for a, b in ((4.5, 4.4), (4.0, 3.9), (3.55, 3.45))]
    assert body[-1] == ["Mean Δ", "—", "—", f"{np.mean(deltas):+.2f}%"]
    assert [r[0] for r in body[2:]] == ["gsm8k", "mbpp", "speed", "Mean Δ"]  # viterbi lacks throughput
    assert "measured under one rule only: speed-throughput_1k" in render_markdown(table)


def test_table_errors_name_the_problem(results):
    with pytest.raises(ValueError, match="lack column\\(s\\) tau"):
        markdown_table(results.drop(columns=["tau"]))
    with pytest.raises(ValueError, match="no rows with kind == 'run'"):
        markdown_table(stage_rows(results))


# ---- the `all` report and the CLI --------------------------------------------------------------


def _figure_stems(index: str) -> list[str]:
    return re.findall(r"^!\[([^\]]+)\]\(", index, flags=re.MULTILINE)


def test_write_all_renders_every_figure(written):
    report, out_dir = written
    stems = [w.stem for w in report.figures]
    for kind in ("speedup_bars", "throughput_vs_concurrency", "speedup_vs_concurrency", "tau_vs_concurrency",
                 "accept_per_position", "decode_ablation", "dels_heatmap", "stage_bars"):
        assert any(s.startswith(kind) for s in stems), kind
    index = (out_dir / "index.md").read_text()
    assert _figure_stems(index) == stems
    for written in report.figures:
        png, svg = written.files
        assert png.read_bytes()[:8] == PNG_SIGNATURE
        image = imread(png)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
        assert svg.read_text().startswith("<?xml") and "<svg" in svg.read_text()[:600]
    for written in report.tables:
        assert all(p.is_file() and p.stat().st_size > 0 for p in written.files)
        assert f"[Markdown]({written.stem}.md)" in index
    assert {w.stem for w in report.tables} >= {"table_tau", "table_speedup", "table_decode_ablation__LiLiCorr",
                                               "table_stages"}
    assert {w.stem for w in report.tables} >= {"table_concurrency_speedup", "table_concurrency_tau",
                                               "table_concurrency_detail", "table_categories"}
    # This slice has one seed at T = 0 only, no peer system, and no DeLS head or training-cost
    # file was given.
    assert [name for name, _ in report.skipped] == ["table_peers", "table_seeds", "table_dels_weights",
                                                    "table_training_cost"]
    assert "- **table_dels_weights**: no DeLS head file given" in index
    assert "mbpp left out of the heatmap" in index and "DeLS on gsm8k (Qwen3-8B) has 9" in index


def test_write_all_skips_what_the_results_cannot_support(results, tmp_path):
    plain = results[(results["kind"] == "run") & (results["target"] == Q4) & (results["benchmark"] == "gsm8k")
                    & results["system"].isin(["AR", "DFlash", "DeLS"])]
    report = write_all(plain, tmp_path)
    skipped = dict(report.skipped)
    assert "no sweep to map" in skipped["dels_heatmap"]
    assert "no kind == 'stage' rows" in skipped["stage_bars"] and "table_stages" in skipped
    for figure in ("throughput_vs_concurrency", "speedup_vs_concurrency", "tau_vs_concurrency"):
        assert "more than one concurrency (levels present: [1])" in skipped[f"{figure}__T=0"]
    assert "no greedy/exact system pair" in skipped["decode_ablation__T=1"]
    assert not list(tmp_path.glob("dels_heatmap*")) and not list(tmp_path.glob("stage_bars*"))
    index = (tmp_path / "index.md").read_text()
    for name, reason in report.skipped:
        assert f"- **{name}**: {reason}" in index
    assert {w.stem for w in report.figures} == {"speedup_bars", "accept_per_position__T=0",
                                                "accept_per_position__T=1"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    return subprocess.run([sys.executable, "-m", "plots", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
def test_cli_output_is_deterministic(written, report_csv, tmp_path):
    _, first = written  # rendered in this process
    second = tmp_path / "second"
    done = _cli("all", "--results", str(report_csv), "--out", str(second))  # another process, other hash seed
    assert done.returncode == 0, done.stderr
    assert "figures" in done.stdout and "index.md" in done.stdout
    svgs = sorted(p.name for p in first.glob("*.svg"))
    assert svgs and svgs == sorted(p.name for p in second.glob("*.svg"))
    for name in svgs:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
        assert "<dc:date>" not in (first / name).read_text()
    for name in sorted(p.name for p in first.glob("*.png")) + ["index.md", "table_tau.tex"]:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def _main(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = plots_main(list(args))
    except SystemExit as exit:
        code = exit.code
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_help_and_errors(capsys, tmp_path, results_csv):
    code, out, _ = _main(capsys, "--help")
    assert code == 0 and "all" in out and "table" in out
    code, out, _ = _main(capsys, "all", "--help")
    assert code == 0 and "--results" in out and "--decode-pair" in out
    broken = tmp_path / "broken.csv"
    make_results().drop(columns=["stage_ms"]).to_csv(broken, index=False)
    code, _, err = _main(capsys, "all", "--results", str(broken), "--out", str(tmp_path / "out"))
    assert code == 2 and "lacks column(s) stage_ms" in err
    code, _, err = _main(capsys, "all", "--results", str(results_csv), "--out", str(tmp_path / "o"),
                         "--decode-pair", "LiLiCorr-greedy")
    assert code == 2 and "GREEDY_SYSTEM=EXACT_SYSTEM" in err
    code, out, _ = _main(capsys, "table", "--results", str(results_csv), "--value", "speedup", "--format", "tex")
    assert code == 0 and r"\textbf{3.30$\times$ (n=1, no interval)}" in out


def test_required_columns_are_in_the_schema():
    assert set(REQUIRED_COLUMNS) <= set(ALL_COLUMNS)


def test_plots_imports_neither_vllm_nor_torch():
    code = ("import sys, plots.report, plots.tables, plots.__main__; "
            "bad = [m for m in ('vllm', 'torch') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def _greedy_rows(dtype: str, dflash_hashes: list[str]) -> pd.DataFrame:
    flags = json.dumps({"dtype": dtype})
    rows = [_row(kind="run", system=system, benchmark="gsm8k", temperature=0.0, concurrency=1, seed=42, input_len=0,
                 tau=tau, speedup=1.0, tokens_per_s=100.0, target=Q8, engine_flags=flags,
                 output_hashes=json.dumps(hashes))
            for system, tau, hashes in (("AR", 1.0, ["a", "b"]), ("DFlash", 2.0, dflash_hashes))]
    return pd.DataFrame(rows)


def test_identity_table_can_come_from_a_separate_greedy_run(tmp_path):
    """The timed run (bf16) parts from AR on one prompt; the fp32 run given as `lossless` does
    not: the summary and the index report the fp32 run's check, with its dtype and file."""
    from eval.summary import summary_text

    timed, checked = tmp_path / "results.csv", tmp_path / "lossless.csv"
    _greedy_rows("bfloat16", ["a", "x"]).to_csv(timed, index=False)
    _greedy_rows("float32", ["a", "b"]).to_csv(checked, index=False)
    assert "1/2 **≠**" in summary_text(timed)
    text = summary_text(timed, lossless_path=checked)
    assert "identical to AR (prompts, float32)" in text and "2/2" in text and "≠" not in text
    write_all(load_results(timed), tmp_path / "plots", source=str(timed),
              lossless=load_results(checked), lossless_source=str(checked))
    index = (tmp_path / "plots" / "index.md").read_text()
    assert "in `lossless.csv`" in index and "2 of 2" in index
