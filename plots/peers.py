"""This package's systems against the peers a user would pick instead (issue 36).

A peer is a speculating system this package does not serve: a vLLM method of its own (n-gram
prompt lookup, suffix decoding, EAGLE, ...) or a DFlash draft run on vLLM's own proposer with this
package left out (`without_liliprop`). Read from each row's `system_config`, so result files
need no extra column. The table gives, per benchmark and for the benchmark average, the best of
ours and the best peer by paired speedup (each with its 95% interval, as in the results table),
and whether ours is at or above the peer.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from plots.select import is_baseline
from plots.tables import POOLED, Table, results_table

OUR_METHODS = ("dflash", "dspark")  # served through this package's proposer


def is_peer(system_config) -> bool:
    """A speculating system not served by this package (see the module docstring). ValueError
    naming the column for a value that is JSON but not an object (`true`, `5`): a damaged file."""
    try:
        config = json.loads(system_config) if isinstance(system_config, str) else None
    except json.JSONDecodeError:
        return False
    if config is not None and not isinstance(config, dict):
        raise ValueError(f"column 'system_config' holds {system_config[:60]!r}, which is not a JSON object")
    spec = (config or {}).get("speculative_config") or {}
    if not isinstance(spec, dict):
        raise ValueError(f"column 'system_config' holds a speculative_config that is not a JSON object: "
                         f"{system_config[:60]!r}")
    if not spec:
        return False
    return bool(config.get("without_liliprop")) or spec.get("method") not in OUR_METHODS


def peer_systems(df: pd.DataFrame) -> set[str]:
    if "system_config" not in df.columns:
        return set()
    return {s for s, c in zip(df["system"], df["system_config"]) if is_peer(c)}


def peers_table(df: pd.DataFrame) -> Table:
    """Best of ours vs best peer per benchmark row of the speedup table; ValueError without both."""
    speedups = results_table(df, "speedup")
    peers = peer_systems(df)
    columns = list(speedups.value_header)
    ours = [i for i, s in enumerate(columns) if s not in peers and not is_baseline(s)]
    theirs = [i for i, s in enumerate(columns) if s in peers]
    if not ours or not theirs:
        raise ValueError("needs a system of this package and a peer (vLLM's own method, or "
                         "without_liliprop) in the same setting")
    rows = [row for row in speedups.rows if POOLED not in row.labels]
    for row in rows:
        mine, peer = _best(row, ours), _best(row, theirs)
        cell = (lambda i: "—" if i is None else (row.cells or [""] * len(columns))[i]
                or speedups.cell_text(row.values[i]))
        met = "—" if mine is None or peer is None else (
            "yes" if round(row.values[mine], 2) >= round(row.values[peer], 2) else "**no**")
        row.extras = [columns[mine] if mine is not None else "—", cell(mine),
                      columns[peer] if peer is not None else "—", cell(peer), met]
        row.values, row.cells = [], []
    return Table(speedups.label_header, [], rows, speedups.digits, extra_header=[
        "best of ours", "speedup", "best peer", "speedup", "ours >= peer"],
        caption="paired speedup over AR: this package's best system against the best peer "
                "(vLLM's own proposers, no trained draft of ours served by this package)",
        notes=[n for n in speedups.notes if not n.startswith(POOLED)]
        + [f"peers: {', '.join(sorted(peers))}"])


def _best(row, indices: list[int]) -> int | None:
    shown = [i for i in indices if not math.isnan(row.values[i])]
    return max(shown, key=lambda i: row.values[i]) if shown else None
