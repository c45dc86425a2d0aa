"""Markdown summary of a results file in the style of the paper's Table 1 (via plots.tables)."""

from __future__ import annotations

from pathlib import Path

from plots.io import load_results
from plots.tables import lossless_markdown, markdown_table, render_markdown, stage_table

SUMMARY_VALUES = ("tau", "speedup", "tokens_per_s")


def summary_text(path: str | Path, values: tuple[str, ...] = SUMMARY_VALUES) -> str:
    """One table per metric (rows benchmark [x setting], columns system, best per row in bold),
    then the greedy-output check against AR and the stage decomposition when the file has
    stage rows."""
    results = load_results(path)
    parts = []
    if (results["kind"] == "run").any():
        for value in values:
            parts.append(f"### {value}\n\n{markdown_table(results, value=value)}")
        lossless = lossless_markdown(results)
        if lossless:
            parts.append(f"### greedy output identical to AR (prompts)\n\n{lossless}")
    if (results["kind"] == "stage").any():
        parts.append(f"### stages (ms per step)\n\n{render_markdown(stage_table(results))}")
    return "\n".join(parts)
