"""Held-out prompts as an eval testbed suite: conversations JSONL ({id, messages}, as
`training.magpie` and `training.decontaminate` write them) -> {id, turns} rows, the user turns
of each conversation, which `python -m eval run --benchmarks testbed-<name>` reads from
DATA_DIR/testbed/<name>.jsonl.

    python -m tools.heldout_suite --input clean.jsonl --output DATA_DIR/testbed/heldout.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path


def suite_rows(lines) -> list[dict]:
    rows = []
    for line in lines:
        if line.strip():
            record = json.loads(line)
            turns = [m["content"] for m in record["messages"] if m["role"] == "user"]
            if turns:
                rows.append({"id": record["id"], "turns": turns})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.heldout_suite", description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    rows = suite_rows(Path(args.input).read_text().split("\n"))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} prompts -> {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
