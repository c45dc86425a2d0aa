"""The DFlash campaign table (issue 32): one row per held-out tau measurement of the drafter,
from the CPU rounds' build manifest and the device rounds' records (`training.device_round`'s
round.json), with cumulative sequences trained on and the distinct conversations of each phase.

    python -m training.build_stages.campaign_table --manifest testbed/smollm2/round2/manifest.json \\
        --device-call testbed/smollm2/round3/device_calls/call6.json \\
        --device-call testbed/smollm2/round3/device_calls/call7.json --out testbed/smollm2/round3/campaign.csv
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

CPU_ROUNDS = (("round 1", "dflash", "dflash_round1"), ("round 2", "dflash_round2", "dflash"))


def cpu_rows(manifest: dict) -> list[dict]:
    """The two CPU rounds: steps and batch from their recipes, tau from the measure stage."""
    rows, seen = [], 0
    taus = manifest["stages"]["measure"]["heldout_tau"]
    conversations = manifest["stages"]["tokenize"]["train"]["examples"]
    for phase, stage, tau_key in CPU_ROUNDS:
        fragment = manifest["stages"][stage]
        recipe = fragment.get("parent_build", fragment).get("recipe") or fragment["recipe"]
        batch = recipe["train"]["batch_size"] * recipe["train"].get("grad_accum", 1)
        steps = fragment.get("parent_build", fragment).get("steps") or fragment["steps"]
        seen += steps * batch
        rows.append({"phase": phase, "device": "CPU", "step": steps, "batch": batch, "sequences_seen": seen,
                     "distinct_conversations": conversations, "heldout_tau": taus[tau_key]})
    return rows


def distinct_conversations(stages: dict, before: int) -> int:
    """The conversations the drafter has had by the end of a round: a round on conversations
    given to it (`--conversations`, generated after the earlier rounds' and disjoint from them)
    adds those it reached (one sequence each, at most all of them) to the earlier rounds' count;
    a device round's own data already holds those."""
    tokenize = stages.get("tokenize", {})
    if "sources" in tokenize:
        reached = stages["train"]["curve"][-1]["sequences_seen"]
        return before + min(tokenize["new_conversations"], reached)
    return tokenize.get("train_examples") or stages["train"]["examples"]


def device_rows(record: dict, phase: str, seen_before: int, conversations_before: int) -> list[dict]:
    stages = record["calls"][-1]["stages"]
    train = stages["train"]
    conversations = distinct_conversations(stages, conversations_before)
    return [{"phase": phase, "device": stages["device"]["name"], "step": point["step"],
             "batch": train["global_batch"], "sequences_seen": seen_before + point["sequences_seen"],
             "distinct_conversations": conversations,
             "heldout_tau": point["heldout_tau"]} for point in train["curve"]]


def campaign_table(manifest: dict, device_calls: list[dict]) -> pd.DataFrame:
    """Rows of the CPU build's two rounds, then of each `training.device_round` record in order
    (phases "device N" on a GPU, "CPU N" for a round run on the CPU)."""
    rows, counts = cpu_rows(manifest), {"device": 0, "CPU": 0}
    for record in device_calls:
        kind = "CPU" if record["calls"][-1]["stages"]["device"]["name"] == "cpu" else "device"
        counts[kind] += 1
        rows += device_rows(record, f"{kind} {counts[kind]}", rows[-1]["sequences_seen"],
                            rows[-1]["distinct_conversations"])
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.build_stages.campaign_table", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", required=True, help="the CPU rounds' build manifest")
    parser.add_argument("--device-call", action="append", default=[], help="a device round's round.json, in order")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    table = campaign_table(json.loads(Path(args.manifest).read_text()),
                           [json.loads(Path(p).read_text()) for p in args.device_call])
    table.to_csv(args.out, index=False)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
