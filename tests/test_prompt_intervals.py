"""Intervals over prompts (issue 35): a run row at c = 1 measured prompt by prompt with its AR
reference interleaved (eval.by_prompt), the per-prompt file beside the results, and the tables'
benchmark-stratified bootstrap over those prompts (plots.table_intervals.prompt_interval)."""

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest

from eval.by_prompt import measure_by_prompt
from eval.prompt_results import COLUMNS, PromptResultsFile, prompt_results_path
from eval.results import ResultsFile
from eval.schema import ALL_COLUMNS
from plots import prompt_rows
from plots.intervals import mean_interval, stratified_bootstrap
from plots.io import load_results
from plots.table_intervals import PROMPT_NOTE, NOTE
from plots.tables import markdown_table
from vllm_liliprop.vllm.metrics import SpecDecodeCounters

BENCHMARKS = ["humaneval", "mtbench", "aime2024", "math500", "aime2025", "gsm8k", "alpacaeval"]
# DFlash's per-benchmark speedups in the last main job: real differences between benchmarks.
TRUE_SPEEDUP = [1.24, 1.18, 1.44, 1.40, 1.17, 1.42, 1.07]


@dataclass
class Batch:  # what eval.by_prompt reads of vLLM's BatchResult
    output_tokens: int
    wall_s: float
    counters: SpecDecodeCounters = field(default_factory=SpecDecodeCounters)
    output_hashes: list = field(default_factory=list)


def test_prompts_alternate_which_arm_runs_first_and_the_row_is_their_sum():
    calls = []

    def system(i):
        calls.append(("system", i))
        return Batch(48, 0.5 + i, SpecDecodeCounters(10, 30, 5 + i, (3, 2)), [f"h{i}"])

    def reference(i):
        calls.append(("AR", i))
        return Batch(48, 1.0 + i / 10)

    measured = measure_by_prompt([["a"], ["b"], ["c"]], ["x", "y", "z"], system, reference, [48.0])
    assert calls == [("AR", 0), ("system", 0), ("system", 1), ("AR", 1), ("AR", 2), ("system", 2)]
    assert (measured.result.output_tokens, measured.result.wall_s) == (144, pytest.approx(4.5))
    assert measured.result.counters == SpecDecodeCounters(30, 90, 18, (9, 6))
    assert measured.result.output_hashes == ["h0", "h1", "h2"]
    assert measured.reference.result.wall_s == pytest.approx(3.3) and not measured.reference.outlier
    assert [r["example_id"] for r in measured.prompt_rows] == ["x", "y", "z"]
    assert [r["num_accepted_tokens"] for r in measured.prompt_rows] == [5, 6, 7]
    assert [r["paired_ar_wall_s"] for r in measured.prompt_rows] == [1.0, 1.1, 1.2]


def test_a_stalled_prompt_reference_is_measured_again_and_marks_the_row():
    stalls = {1: iter([48 / 5.0, 48 / 5.0, 48 / 5.0])}  # prompt 1's AR stalls every time

    def reference(i):
        return Batch(48, next(stalls[i]) if i in stalls else 1.0)

    measured = measure_by_prompt([["a"], ["b"]], ["x", "y"], lambda i: Batch(48, 0.8), reference, [48.0, 47.0])
    assert [r["paired_ar_retries"] for r in measured.prompt_rows] == [0, 2]
    assert [r["paired_ar_outlier"] for r in measured.prompt_rows] == [0, 1]
    # The row's reference, 96 tokens in 10.6 s (9 tok/s against 47-48), is an outlier too.
    assert measured.reference.retries == 2 and measured.reference.outlier
    without = measure_by_prompt([["a"]], ["x"], lambda i: Batch(48, 0.8))
    assert without.reference is None and math.isnan(without.prompt_rows[0]["paired_ar_wall_s"])


def _speedups(n_prompts, noise, seed=0):
    rng = np.random.default_rng(seed)
    return [s * (1 + noise * rng.standard_normal(n_prompts)) for s in TRUE_SPEEDUP]


def test_stratified_interval_leaves_out_the_differences_between_benchmarks():
    """Prompts vary by 3% around each benchmark's speedup, benchmarks by 1.07x-1.44x: resampling
    the 7 benchmark rows gives an interval about +-0.1 wide (the last main job's), resampling
    prompts within each benchmark one a few times narrower; both contain the mean."""
    cells = _speedups(10, 0.03)
    point = float(np.mean([c.mean() for c in cells]))
    by_row = mean_interval([c.mean() for c in cells])
    by_prompt = stratified_bootstrap([10] * 7, lambda idx: np.mean(
        [c[i].mean(axis=1) for c, i in zip(cells, idx)], axis=0), point)
    assert by_row.low < point < by_row.high and by_prompt.low < point < by_prompt.high
    assert (by_row.high - by_row.low) > 3 * (by_prompt.high - by_prompt.low)
    # The normal approximation of a stratified mean, 1.96 * sqrt(sum var_b / n_b) / 7, with the
    # small-stratum widening sqrt(10 / 9).
    se = math.sqrt(sum(np.var(c, ddof=1) / 10 for c in cells)) / 7
    assert (by_prompt.high - by_prompt.low) / 2 == pytest.approx(1.96 * se, rel=0.2)
    assert math.isnan(stratified_bootstrap([10, 1], lambda idx: np.zeros(2000), 1.0).low)


def _job(n_prompts, noise):
    """Result rows and per-prompt rows of AR and DFlash, as eval writes them."""
    results, prompts = [], []
    for benchmark, speedups in zip(BENCHMARKS, _speedups(n_prompts, noise)):
        ref_wall = np.full(n_prompts, 48 / 40.0)
        for system, wall in (("AR", ref_wall), ("DFlash", ref_wall / speedups)):
            row = {c: "" for c in ALL_COLUMNS}
            paired = system != "AR"
            row.update(kind="run", system=system, benchmark=benchmark, category="", temperature=0.0,
                       concurrency=1, input_len=0, seed=42, dels_alpha=math.nan, dels_beta=math.nan,
                       stage_ms=math.nan, accept_per_pos="[]", num_prompts=n_prompts, run_id="job",
                       num_drafts=20 * n_prompts * paired, num_accepted_tokens=12 * n_prompts * paired,
                       tau=1.6 if paired else 1.0, output_tokens=48 * n_prompts, wall_s=wall.sum(),
                       tokens_per_s=48 * n_prompts / wall.sum(),
                       speedup=ref_wall.sum() / wall.sum() if paired else 1.0,
                       paired_ar_output_tokens=48 * n_prompts if paired else math.nan,
                       paired_ar_wall_s=ref_wall.sum() if paired else math.nan, target="t",
                       engine_flags=json.dumps({"dtype": "bfloat16"}), protocol="{}", output_hashes="[]")
            results.append(row)
            prompts.append((row, [{"prompt": i, "example_id": str(i), "output_tokens": 48, "wall_s": wall[i],
                                   "num_drafts": 20 * paired, "num_accepted_tokens": 12 * paired,
                                   "paired_ar_output_tokens": 48 if paired else math.nan,
                                   "paired_ar_wall_s": ref_wall[i] if paired else math.nan,
                                   "paired_ar_retries": 0 if paired else math.nan,
                                   "paired_ar_outlier": 0 if paired else math.nan} for i in range(n_prompts)]))
    return results, prompts


def _write(tmp_path, results, prompts):
    path = tmp_path / "results.csv"
    file, per_prompt = ResultsFile(path), PromptResultsFile(path)
    for row, rows in prompts:
        per_prompt.append(row, rows)
    for row in results:
        file.append(row)
    return path


def _average(table: str) -> str:
    return next(line for line in table.splitlines() if line.startswith("| Average"))


def test_tables_resample_prompts_when_the_per_prompt_file_is_there(tmp_path):
    path = _write(tmp_path, *_job(10, 0.03))
    assert prompt_results_path(path).name == "results.prompts.csv"
    assert list(pd.read_csv(prompt_results_path(path)).columns) == COLUMNS
    table = markdown_table(load_results(path), value="speedup")
    low, high = (float(x) for x in _average(table).split("[")[-1].split("]")[0].split(","))
    assert high - low < 0.05 and PROMPT_NOTE in table
    # The same rows without the file: the old interval over benchmark rows, wider, and said so.
    prompt_results_path(path).unlink()
    table = markdown_table(load_results(path), value="speedup")
    low, high = (float(x) for x in _average(table).split("[")[-1].split("]")[0].split(","))
    assert high - low > 0.1 and NOTE in table and PROMPT_NOTE not in table


def test_a_row_missing_prompts_falls_back_and_an_unknown_file_is_refused(tmp_path):
    results, prompts = _job(4, 0.03)
    prompts[1] = (prompts[1][0], prompts[1][1][:3])  # interrupted: 3 of 4 prompts written
    path = _write(tmp_path, results, prompts)
    loaded = load_results(path)
    assert loaded[prompt_rows.COLUMN].isna().sum() == 1
    assert PROMPT_NOTE not in markdown_table(loaded, value="speedup")
    prompt_results_path(path).write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="lacks column"):
        load_results(path)


def test_plots_and_eval_agree_on_the_per_prompt_file():
    from eval import prompt_results

    assert prompt_rows.SUFFIX == prompt_results.SUFFIX
    assert set(prompt_rows.KEY + ["prompt"] + list(prompt_rows.ARRAYS.values())) <= set(prompt_results.COLUMNS)


def test_repeats_interleave_abba_and_keep_each_arms_fastest_run():
    calls = []
    walls = {"system": iter([0.9, 0.6, 0.7, 0.8]), "AR": iter([1.0, 1.9, 1.5, 1.2])}

    def arm(name):
        def run(i):
            calls.append((name, i))
            return Batch(48, next(walls[name]), SpecDecodeCounters(10, 30, 5, (3,)))
        return run

    measured = measure_by_prompt([["a"], ["b"]], ["x", "y"], arm("system"), arm("AR"), [40.0], repeats=2)
    assert calls == [("AR", 0), ("system", 0), ("system", 0), ("AR", 0),
                     ("system", 1), ("AR", 1), ("AR", 1), ("system", 1)]
    assert [r["wall_s"] for r in measured.prompt_rows] == [0.6, 0.7]
    assert [r["paired_ar_wall_s"] for r in measured.prompt_rows] == [1.0, 1.2]
    assert measured.result.counters.num_drafts == 20  # the fastest runs' counters, not all four


def test_figure_error_bars_use_the_prompts_of_a_one_row_cell(tmp_path):
    from plots.select import interval_errors, seed_mean

    rows = load_results(_write(tmp_path, *_job(6, 0.05)))
    dflash = rows[rows["system"] == "DFlash"]
    by = ["system", "benchmark"]
    cells = seed_mean(dflash, by, "speedup")
    errors = interval_errors(dflash, by, "speedup", cells)
    assert (errors > 0).all()  # one row per cell, yet a bar: its six prompts
    assert (errors < 0.2).all()


def test_one_prompt_a_benchmark_keeps_the_interval_over_benchmarks(tmp_path):
    table = markdown_table(load_results(_write(tmp_path, *_job(1, 0.03))), value="speedup")
    assert "n=7, no interval" not in _average(table) and "[" in _average(table)
    assert "| humaneval | 1.00× | **1.24× (n=1, no interval)** |" in table and PROMPT_NOTE not in table


def test_one_stalled_prompt_of_ten_leaves_the_row_its_speedup():
    def reference(i):
        return Batch(48, 48 / 5.0 if i == 3 else 1.0)  # prompt 3 stalls on every try

    measured = measure_by_prompt([["p"]] * 10, [str(i) for i in range(10)], lambda i: Batch(48, 0.8),
                                 reference, [48.0, 47.0])
    assert [r["paired_ar_outlier"] for r in measured.prompt_rows].count(1) == 1
    assert not measured.reference.outlier  # 480 tokens in 18.6 s: 26 tok/s, within [24, 96]


def test_side_by_side_shares_one_reference_and_rotates_the_order():
    from eval.by_prompt import REFERENCE, arm_order, measure_side_by_side

    calls = []

    def arm(name, wall):
        def run(i):
            calls.append((i, name))
            return Batch(10, wall, SpecDecodeCounters(2, 6, 3, (2, 1)))
        return run

    measured = measure_side_by_side([["a"], ["b"], ["c"]], ["x", "y", "z"],
                                    {"A": arm("A", 1.0), "B": arm("B", 2.0)}, arm(REFERENCE, 4.0))
    assert [name for i, name in calls] == ["reference", "A", "B", "A", "B", "reference", "B", "reference", "A"]
    assert arm_order(["r", "s"], 0) == ["r", "s"] and arm_order(["r", "s"], 1) == ["s", "r"]
    assert measured["A"].result.wall_s == 3.0 and measured["B"].result.wall_s == 6.0
    assert measured[REFERENCE].result.wall_s == 12.0 and measured["A"].reference.result.wall_s == 12.0
    assert [r["paired_ar_wall_s"] for r in measured["B"].prompt_rows] == [4.0, 4.0, 4.0]
    assert all(math.isnan(r["paired_ar_wall_s"]) for r in measured[REFERENCE].prompt_rows)


def test_paired_batches_alternate_which_arm_runs_first():
    # c > 1: with AR always first, an order effect would land on the system's side of every
    # ratio. The two seeds of a sampled row take opposite orders, for every benchmark.
    from types import SimpleNamespace

    from eval.runner import system_goes_first

    def measurement(benchmark, seed, category=""):
        return SimpleNamespace(benchmark=SimpleNamespace(name=benchmark), category=category, seed=seed)

    names = ["mtbench", "gsm8k", "humaneval", "math500", "aime2024", "alpaca", "mbpp"]
    for name in names:
        assert system_goes_first(measurement(name, 42)) != system_goes_first(measurement(name, 43))
    at_t0 = {system_goes_first(measurement(name, 42)) for name in names}
    assert at_t0 == {True, False}  # a single seed still varies the order by benchmark
