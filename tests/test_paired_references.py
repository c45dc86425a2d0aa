"""Paired AR references: the outlier rule, the runner's re-measurement, the tables' exclusion and
the speedup / tokens/s consistency check, on the shape of the main job (issue 35: DSpark "1.81x"
at 64 tok/s against AR's 86, its references having run at 10-29 tok/s)."""

import json
import math
from dataclasses import dataclass

import pandas as pd
import pytest

from eval.paired import checked_reference
from eval.results import ResultsFile
from eval.schema import ALL_COLUMNS
from eval.summary import summary_text
from plots.paired import inconsistent_speedups, is_outlier, outlier_references, reference_notes
from plots.tables import markdown_table

BENCHMARKS = ["humaneval", "mtbench", "aime2024", "math500", "aime2025", "gsm8k", "alpacaeval"]
AR_RATE = 86.0
# tokens/s of each system's run and of its paired AR reference, per benchmark.
DFLASH = ([100, 98, 104, 99, 101, 97, 103], [85, 84, 88, 86, 87, 83, 86])
DSPARK = ([64, 63, 66, 65, 62, 64, 65], [29, 25, 86, 10, 84, 28, 22])


@dataclass
class Batch:  # what eval.paired reads of vLLM's BatchResult
    output_tokens: int
    wall_s: float


def test_the_rule_is_a_factor_of_two_around_the_median():
    job = [80.0, 86.0, 90.0]
    assert is_outlier(29.0, job) and is_outlier(200.0, job)
    assert not is_outlier(60.0, job) and not is_outlier(150.0, job)
    assert not is_outlier(10.0, [])  # nothing to judge against


def _measurements(rates):
    """measure() of eval.paired: one AR run per call, at these tokens/s in turn (48 tokens)."""
    runs = iter(rates)
    calls = []

    def measure():
        calls.append(1)
        return Batch(48, 48 / next(runs))

    return measure, calls


@pytest.mark.parametrize("rates, retries, outlier, calls", [
    ([85.0], 0, False, 1),               # fine at once: measured once
    ([20.0, 84.0], 1, False, 2),         # a stall, then the job's speed: one retry
    ([20.0, 15.0, 12.0], 2, True, 3),    # stalled three times: marked, speedup not used
])
def test_an_outlier_reference_is_measured_again_and_marked_if_it_stays_one(rates, retries, outlier, calls):
    measure, made = _measurements(rates)
    checked = checked_reference(measure, [86.0, 88.0, 84.0])
    assert (checked.retries, checked.outlier, len(made)) == (retries, outlier, calls)
    assert checked.tokens_per_s == pytest.approx(rates[-1])


def _row(system, benchmark, rate, ref=None, **extra):
    row = {c: "" for c in ALL_COLUMNS}
    drafts = 0 if system == "AR" else 20
    row.update(kind="run", system=system, benchmark=benchmark, category="", temperature=0.0, concurrency=1,
               input_len=0, seed=42, dels_alpha=math.nan, dels_beta=math.nan, stage_ms=math.nan,
               accept_per_pos="[]", num_prompts=1, num_drafts=drafts, num_draft_tokens=3 * drafts,
               num_accepted_tokens=drafts // 2, tau=1.0 + (0.5 if drafts else 0.0), output_tokens=48,
               wall_s=48 / rate, tokens_per_s=rate, speedup=1.0 if ref is None else rate / ref,
               paired_ar_output_tokens=math.nan if ref is None else 48,
               paired_ar_wall_s=math.nan if ref is None else 48 / ref,
               target="smollm2", engine_flags=json.dumps({"dtype": "bfloat16", "env": {}}), protocol="{}",
               output_hashes="[]")
    row.update(extra)
    return row


def _main_job(**dspark_extra) -> pd.DataFrame:
    rows = [_row("AR", b, AR_RATE + i) for i, b in enumerate(BENCHMARKS)]
    for system, (rates, refs) in (("DFlash", DFLASH), ("DSpark", DSPARK)):
        rows += [_row(system, b, r, ref, **(dspark_extra if system == "DSpark" else {}))
                 for b, r, ref in zip(BENCHMARKS, rates, refs)]
    return pd.DataFrame(rows, columns=ALL_COLUMNS)


def test_the_observed_bug_is_flagged_and_its_outlier_rows_lose_their_speedup(tmp_path):
    job = _main_job()
    dspark = job["system"] == "DSpark"
    assert job.loc[dspark, "speedup"].mean() > 1.8  # the bug: 64 tok/s "faster" than AR's 86
    flagged = outlier_references(job)
    assert list(job.loc[flagged, "benchmark"]) == ["humaneval", "mtbench", "math500", "gsm8k", "alpacaeval"]
    assert inconsistent_speedups(job) and inconsistent_speedups(job)[0].startswith("DSpark: speedup")
    assert not any(line.startswith("DFlash") for line in inconsistent_speedups(job))
    # The table keeps DSpark's two trustworthy rows (aime2024, aime2025: 0.77x, 0.74x) only, so
    # DSpark has no average over the seven benchmarks; DFlash's carries its interval.
    lines = {line.split("|")[1].strip(): line for line in markdown_table(job, value="speedup").splitlines()
             if line.startswith("| ")}
    assert lines["aime2024"].endswith("| 0.77× (n=1, no interval) |")
    assert lines["humaneval"].endswith("| — |") and lines["Average"].endswith("| — |")
    assert "**1.17× [1.16, 1.18]**" in lines["Average"]
    path = tmp_path / "results.csv"
    job.to_csv(path, index=False)
    text = summary_text(path)
    assert "5 row(s) whose reference stayed an outlier" in text and "inconsistent: DSpark" in text


def test_rows_the_runner_marked_are_counted_and_excluded():
    job = _main_job(paired_ar_retries=2, paired_ar_outlier=0)
    job.loc[job["system"] == "DSpark", "paired_ar_wall_s"] = 48 / 85.0  # re-measured at the job's speed
    job.loc[job["system"] == "DSpark", "speedup"] = job["tokens_per_s"] / 85.0
    job.loc[(job["system"] == "DSpark") & (job["benchmark"] == "gsm8k"), "paired_ar_outlier"] = 1
    notes = reference_notes(job)
    assert notes[0].startswith("7 paired AR reference(s) measured again") and "1 row(s)" in notes[0]
    assert not any(n.startswith("inconsistent") for n in notes)


def test_the_runner_judges_a_reference_against_the_jobs_ar_runs(tmp_path):
    results = ResultsFile(tmp_path / "results.csv")
    for row in _main_job().to_dict(orient="records"):
        if row["system"] == "DSpark" and row["benchmark"] == "gsm8k":
            row["paired_ar_outlier"] = 1  # a marked reference is no longer part of the job's speed
        results.append(row)
    other_c = dict(_row("AR", "gsm8k", 300.0), concurrency=8)
    results.append(other_c)
    rates = results.job_rates(_row("DSpark", "gsm8k", 64.0), "AR")
    assert len(rates) == 7 + 7 + 6 and 300.0 not in rates and 28.0 not in [round(r) for r in rates]
    # Other engine flags (fp32) are another job; `env` alone is not.
    fp32 = _row("DSpark", "gsm8k", 64.0, engine_flags=json.dumps({"dtype": "float32"}))
    assert results.job_rates(fp32, "AR") == []
    same = _row("DSpark", "gsm8k", 64.0, engine_flags=json.dumps({"dtype": "bfloat16", "env": {"X": "1"}}))
    assert len(results.job_rates(same, "AR")) == 20
