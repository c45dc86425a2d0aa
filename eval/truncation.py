"""The summary's truncation report: which run rows had prompts cut to fit the engine.

A prompt longer than max_model_len - max_tokens is right-truncated (eval/prompts.py) and the row
counts it in `num_truncated`; a table over such a row measures shorter prompts than the
benchmark's, so the summary says where that happened instead of leaving it to the run's log.
"""

from __future__ import annotations

import pandas as pd

COLUMN = "num_truncated"


def truncation_markdown(results: pd.DataFrame) -> str:
    """A markdown section listing every run row with truncated prompts; "" when the file has no
    such column (written before it existed) or no run rows."""
    if COLUMN not in results.columns:
        return ""
    runs = results[results["kind"] == "run"]
    counts = pd.to_numeric(runs[COLUMN], errors="coerce")
    if counts.notna().sum() == 0:
        return ""
    bad = counts.notna() & ~counts.between(0, 2**31)  # inf, 1E310, negatives: not a count
    if bad.any():
        raise ValueError(f"column {COLUMN} holds {runs.loc[bad, COLUMN].iloc[0]!r}, not a count of "
                         "prompts; rewrite the row with `python -m eval run`")
    cut = runs[counts > 0]
    if cut.empty:
        return "truncated prompts: none (every prompt fit in max_model_len - max_tokens)"
    lines = ["### truncated prompts (right-truncated to max_model_len - max_tokens)", "",
             "| System | Benchmark | T | seed | c | truncated / prompts |", "|---|---|---:|---:|---:|---:|"]
    for _, row in cut.iterrows():
        bench = row["benchmark"] + (f"/{row['category']}" if row["category"] else "")
        lines.append(f"| {row['system']} | {bench} | {float(row['temperature']):g} | {int(row['seed'])} "
                     f"| {int(row['concurrency'])} | {int(float(row[COLUMN]))} / {row['num_prompts']} |")
    total = int(counts[counts > 0].sum())
    return "\n".join(lines) + f"\n\n{total} prompt(s) truncated in {len(cut)} row(s); every turn counts.\n"
