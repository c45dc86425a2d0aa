"""The per-prompt results file beside the results file: one row per prompt of each run row
measured prompt by prompt (eval.by_prompt), so intervals can resample prompts, not rows.

`results.csv` -> `results.prompts.csv`. A row names its result row by run_id and the key
columns (one invocation measures a key once); rows of a measurement interrupted before its
result row was written name no result row and are ignored by readers (plots.prompt_rows).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from eval.schema import KEY_COLUMNS

SUFFIX = ".prompts.csv"
PROMPT_COLUMNS = [
    "prompt",                # 0-based position of the prompt in its result row's batch
    "example_id",
    "output_tokens",
    "wall_s",                # this prompt's generation (every turn), warm-up excluded
    "num_drafts",
    "num_accepted_tokens",
    "paired_ar_output_tokens",  # --paired: AR on this prompt, measured beside it (NaN otherwise)
    "paired_ar_wall_s",
    "paired_ar_retries",
    "paired_ar_outlier",
]
COLUMNS = ["run_id"] + KEY_COLUMNS + PROMPT_COLUMNS


def prompt_results_path(results_path: str | Path) -> Path:
    """results.csv (or .parquet) -> results.prompts.csv beside it."""
    path = Path(results_path)
    return path.with_name(path.stem + SUFFIX)


class PromptResultsFile:
    def __init__(self, results_path: str | Path):
        self.path = prompt_results_path(results_path)

    def append(self, result_row: dict, prompt_rows: list[dict]) -> None:
        """The prompt rows of one result row (written just before it)."""
        if not prompt_rows:
            return
        shared = {c: result_row.get(c) for c in ["run_id"] + KEY_COLUMNS}
        frame = pd.DataFrame([{**shared, **r} for r in prompt_rows], columns=COLUMNS)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        frame.to_csv(self.path, mode="a", header=new, index=False)
