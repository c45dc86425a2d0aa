"""A build's held-out acceptance as a tidy results table (one row per draft and decode rule).

The measure, measure_baselines and ablation_<name> stages record teacher-forced tau on the
build's held-out conversations in their manifest fragments. This puts them in the columns of
eval's results files (system, benchmark, tau, ...), so that `python -m plots table --kind
ablations` compares trained ablations the same way it compares served ones; each row keeps the
stage it came from, the recipe overrides of an ablation, the anchors and the build's command.

System names are the served systems' (testbed/smollm2/systems.json); an ablation's drafts carry
its name in brackets: "LiLiCorr-greedy [no_distractor]".
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

__all__ = ["heldout_tau_table", "write_heldout_tau_table", "SYSTEMS"]

# A measured key of a stage's "heldout_tau" -> the served system it stands for.
SYSTEMS = {"dflash": "DFlash", "dflash_round1": "DFlash-round1", "lilicorr_argmax": "LiLiCorr-drafter-argmax",
           "lilicorr_greedy_walk": "LiLiCorr-greedy", "dspark": "DSpark", "domino": "Domino"}
BENCHMARK = "build-heldout"  # the build's held-out conversations, teacher-forced


def heldout_tau_table(manifest: dict) -> pd.DataFrame:
    """Every held-out tau of `manifest` (a realbed manifest.json, parsed) as results rows; no
    rows before a measure or ablation stage has finished."""
    rows = []
    for stage, fragment in manifest["stages"].items():
        if not isinstance(fragment, dict) or not isinstance(fragment.get("heldout_tau"), dict):
            continue
        ablation = stage.removeprefix("ablation_") if stage.startswith("ablation_") else None
        anchors = fragment.get("anchors_per_example") or manifest["recipe"].get("measure", {}).get("num_anchors")
        examples = fragment.get("heldout_examples")
        for key, tau in fragment["heldout_tau"].items():
            if key not in SYSTEMS:
                raise ValueError(f"stage {stage}: held-out tau {key!r} has no system name (training/build_stages/"
                                 f"heldout_table.py SYSTEMS: {sorted(SYSTEMS)})")
            system = SYSTEMS[key] + (f" [{ablation}]" if ablation else "")
            # eval's columns ("stage" there is a speculative step's stage: empty in run rows)
            rows.append({"kind": "run", "system": system, "benchmark": BENCHMARK, "category": "",
                         "temperature": 0.0, "concurrency": 1, "input_len": 0, "seed": manifest.get("seed"),
                         "dels_alpha": "", "dels_beta": "", "stage": "", "tau": float(tau),
                         "accept_per_pos": "", "tokens_per_s": "", "speedup": "", "stage_ms": "",
                         "num_drafts": "", "num_accepted_tokens": "",  # the fragments keep tau only
                         "target": manifest.get("target_weights_sha256", ""), "build_stage": stage,
                         "overrides": json.dumps(fragment.get("overrides", {}), sort_keys=True),
                         "heldout_examples": examples, "anchors_per_example": anchors,
                         "measurement": "teacher-forced held-out acceptance (training.build_stages.measure)",
                         "build_command": manifest.get("command", "")})
    return pd.DataFrame(rows)


def write_heldout_tau_table(manifest_file: str | Path, out: str | Path) -> Path | None:
    """Write the table as CSV to `out`; None (nothing written) if no stage measured tau yet."""
    table = heldout_tau_table(json.loads(Path(manifest_file).read_text()))
    if table.empty:
        return None
    table.to_csv(out, index=False)
    return Path(out)
