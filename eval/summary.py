"""Markdown summary of a results file in the style of the paper's Table 1 (via plots.tables)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from eval.results import json_object
from eval.truncation import truncation_markdown
from plots.io import load_results
from plots.paired import reference_notes
from plots.peers import peer_systems, peers_table
from plots.tables import lossless_markdown, markdown_table, render_markdown, stage_table

SUMMARY_VALUES = ("tau", "speedup", "tokens_per_s")


def summary_text(path: str | Path | Sequence[str | Path], values: tuple[str, ...] = SUMMARY_VALUES,
                 lossless_path: str | Path | None = None, only: Sequence[str] | None = None) -> str:
    """One table per metric (rows benchmark [x setting], columns system, best per row in bold),
    then the greedy-output check against AR, the rows with truncated prompts and the stage
    decomposition when the file has stage rows. lossless_path: take the greedy-output check
    from that results file instead (a separate fp32 run, when the timed run is bf16 and CPU bf16
    verification rounds differently). Several files are pooled: their rows side by side, as
    if one run had measured every batch of each (a run's speedups stay paired with its own AR
    references), which is how repeated runs of a noisy cell narrow its interval. only: keep
    these systems' rows. ValueError naming the file for a value it cannot read."""
    try:
        return _summary(path, values, lossless_path, only)
    except ValueError as exc:  # a value of the file that the tables cannot read: name the file
        names = [str(p) for p in _paths(path)]
        if any(name in str(exc) for name in names):
            raise
        raise ValueError(f"results file {', '.join(names)}: {exc}") from exc


def pooled_results(paths: str | Path | Sequence[str | Path], only: Sequence[str] | None = None) -> pd.DataFrame:
    """The rows of one or more results files (pooled runs), of the `only` systems if given."""
    results = pd.concat([load_results(p) for p in _paths(paths)], ignore_index=True)
    if only:
        unknown = sorted(set(only) - set(results["system"]))
        if unknown:
            raise ValueError(f"--only names {', '.join(unknown)}, which no file has; the files "
                             f"have {', '.join(sorted(set(results['system'])))}")
        results = results[results["system"].isin(list(only))].reset_index(drop=True)
    return results


def _paths(paths: str | Path | Sequence[str | Path]) -> list[str | Path]:
    return [paths] if isinstance(paths, (str, Path)) else list(paths)


def _summary(path, values, lossless_path, only) -> str:
    results = pooled_results(path, only)
    parts = []
    if (results["kind"] == "run").any():
        for value in values:
            parts.append(f"### {value}\n\n{markdown_table(results, value=value)}")
        parts.extend(_peers_part(results))
        notes = reference_notes(results)
        if notes:
            parts.append("### paired AR references\n\n" + "\n".join(f"- {n}" for n in notes) + "\n")
    checked = results if lossless_path is None else pooled_results(lossless_path, only)
    lossless = lossless_markdown(checked)
    if lossless:
        parts.append(f"### greedy output identical to AR (prompts{_dtype_note(checked)})\n\n{lossless}")
    truncated = truncation_markdown(results)
    if truncated:
        parts.append(truncated)
    if (results["kind"] == "stage").any():
        parts.append(f"### stages (ms per step)\n\n{render_markdown(stage_table(results))}")
    # Files written before the column existed have none.
    machines = sorted({m for m in results.get("machine", []) if isinstance(m, str) and m})
    if machines:
        parts.append("machine: " + "; ".join(_machine_line(m) for m in machines))
    return "\n".join(parts)


def _peers_part(results) -> list[str]:
    """The best-of-ours vs best-peer table when the file has both kinds of system."""
    if not peer_systems(results):
        return []
    try:
        table = peers_table(results)
    except ValueError:  # peers alone (or ours alone): nothing to set side by side
        return []
    return ["### this package against the peers a user would pick instead\n\n" + render_markdown(table)]


def _machine_line(record: str) -> str:
    """'<cpu>, <n> cores, <isa>' from the machine column (eval/machine.py)."""
    machine = json_object(record, "machine")
    if not {"cpu", "cores", "isa"} <= set(machine):
        raise ValueError(f"column 'machine' holds {record[:60]!r}; expected eval's record with cpu, "
                         "cores and isa")
    isa = "AMX" if "amx_bf16" in machine["isa"] else "no AMX (" + ", ".join(machine["isa"]) + ")"
    # Rows written before the measured ratio was recorded lack it.
    speed = f"bf16 {machine['bf16_speedup']:g}x fp32" if machine.get("bf16_speedup") else ""
    return ", ".join(x for x in (machine["cpu"], f"{machine['cores']} cores", isa, speed, machine.get("gpu")) if x)


def _dtype_note(results) -> str:
    """", dtype X" when every run row of the file shares one engine dtype."""
    dtypes = {str(json_object(flags, "engine_flags").get("dtype", "auto"))
              for flags in results["engine_flags"].fillna("")}
    return f", {dtypes.pop()}" if len(dtypes) == 1 else ""
