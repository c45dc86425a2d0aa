"""Tables from the training-artefact files eval writes beside the results (eval/records.py):

- `dels_weights_table` (DeLS-Spec Table 7): rows head x weight (α, β), columns draft position,
  from `python -m eval heads-table`'s CSV; heads whose weights are one number are labelled fixed.
- `training_cost_table` (DeLS-Spec Table 5): rows training stage, columns steps, wall time and
  peak memory, from `python -m eval training-cost`'s CSV; "not recorded" where the run predates
  the trainer's peak-memory record.

Plots reads these files only (their columns are checked here, by name).
"""

import math
from pathlib import Path

import pandas as pd

from plots.select import ordered_unique
from plots.tables import Table, TableRow

DELS_WEIGHT_COLUMNS = ["head", "kind", "position", "alpha", "beta", "weights"]
TRAINING_COST_COLUMNS = ["stage", "method", "head_kind", "steps", "wall_s", "peak_rss_mib", "peak_cuda_mib"]
NOT_RECORDED = "not recorded"


def load_record(path: str | Path, columns: list[str], writer: str) -> pd.DataFrame:
    """Read one of eval's record CSVs, checking the columns the tables read."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        raise ValueError(f"{path} does not exist or is empty; write it with `python -m eval {writer}`")
    frame = pd.read_csv(path, keep_default_na=False, na_values={c: [""] for c in columns
                                                                 if c not in ("head", "kind", "weights",
                                                                              "stage", "method", "head_kind")})
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{path} lacks column(s) {', '.join(missing)}; write it with `python -m eval {writer}`")
    if frame.empty:
        raise ValueError(f"{path} has no rows; write it with `python -m eval {writer}`")
    return frame


def load_dels_weights(path: str | Path) -> pd.DataFrame:
    return load_record(path, DELS_WEIGHT_COLUMNS, "heads-table")


def load_training_cost(path: str | Path) -> pd.DataFrame:
    return load_record(path, TRAINING_COST_COLUMNS, "training-cost")


def dels_weights_table(frame: pd.DataFrame) -> Table:
    """Rows: each head's α and β; columns: draft positions 1..k; cells the weight at that position."""
    missing = [c for c in DELS_WEIGHT_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"DeLS weights lack column(s) {', '.join(missing)}; write them with `python -m eval heads-table`")
    positions = sorted(int(p) for p in set(frame["position"]))
    rows = []
    for head in ordered_unique(frame["head"]):
        mine = frame[frame["head"] == head]
        by_position = {int(r["position"]): r for _, r in mine.iterrows()}
        kind = str(mine["kind"].iloc[0])
        weights = str(mine["weights"].iloc[0])
        for i, (column, name) in enumerate((("alpha", "α"), ("beta", "β"))):
            values = [float(by_position[p][column]) if p in by_position else math.nan for p in positions]
            rows.append(TableRow([head if i == 0 else "", kind if i == 0 else "", name, weights], values,
                                 rule_above=i == 0 and bool(rows), bold=False))
    table = Table(["Head", "Kind", "Weight", "Weights"], [str(p) for p in positions], rows, 3)
    table.caption = ("DeLS fusion weights per draft position: fused = long + α · short − β · log prior; "
                     "fixed = one number in the head's config for every position, learned = a per-position "
                     "schedule (training.train_dels, stage fusion)")
    return table


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _mib(value, other=None) -> str:
    """MiB, or why not: not recorded (old run), or n/a where the run recorded RSS but had no CUDA."""
    if _missing(value):
        return NOT_RECORDED if _missing(other) else "n/a (no CUDA)"
    return f"{float(value):,.0f}"


def training_cost_table(frame: pd.DataFrame) -> Table:
    """Rows: training stages; columns: steps, wall time (s and h), peak RSS and peak CUDA memory (MiB)."""
    missing = [c for c in TRAINING_COST_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"training cost lacks column(s) {', '.join(missing)}; write it with "
                         "`python -m eval training-cost`")
    rows = []
    for _, r in frame.iterrows():
        wall = float(r["wall_s"]) if pd.notna(r["wall_s"]) else math.nan
        steps = "" if pd.isna(r["steps"]) else f"{int(r['steps'])}"
        method = r["method"] + (f" ({r['head_kind']})" if r["head_kind"] else "")
        texts = [steps or "—", "—" if math.isnan(wall) else f"{wall:,.1f}",
                 "—" if math.isnan(wall) else f"{wall / 3600:.3f}", _mib(r["peak_rss_mib"]),
                 _mib(r["peak_cuda_mib"], r["peak_rss_mib"])]
        rows.append(TableRow([str(r["stage"]), method], [math.nan] * 5, cells=texts, bold=False))
    table = Table(["Stage", "Method"], ["Steps", "Wall (s)", "Wall (h)", "Peak RSS (MiB)", "Peak CUDA (MiB)"],
                  rows, 1)
    table.caption = ("training cost per run: wall time of the stage, peak resident memory of the training "
                     "process (ru_maxrss) and peak CUDA memory allocated; not recorded = the run predates the "
                     "trainer's run record (training.trainer, run.json); a stage that resumed from its checkpoints "
                     "records only the time of its last run")
    return table
