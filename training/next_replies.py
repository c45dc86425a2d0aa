"""The target's replies to a round's clean prompts that have none yet, through vLLM on this host.

A device round (training.device_round) generates more prompts than its call has time to answer;
the rest wait in the round's prompt file. This command answers them here, in the background,
with the same protocol (the prompt filter of `clean_prompts`, greedy, 256 tokens) through a vLLM
engine instead of transformers, appending to a resumable JSONL (`training.regenerate`), and
writes a record of the counts, the time and the generator beside it.

    python -m training.next_replies --target DIR --round testbed/smollm2/data/round3 \\
        --snapshot testbed/smollm2/data --eval-dir .cache/benchmarks --out .cache/next_replies

`--deadline-s` stops starting new chunks after that many seconds (a rerun resumes); `--gzip DEST`
then compresses what is done (a deterministic gzip, for the data snapshot in git), and a later
session whose `.cache` is gone resumes from DEST.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from training.build_stages.jsonl import read_jsonl
from training.data import read_jsonl_conversations
from training.device_round import REPLY_TOKENS, clean_prompts
from training.regenerate import completed_ids, regenerate_conversations, vllm_chat_generator
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

__all__ = ["waiting_prompts", "main"]


def waiting_prompts(round_dir: Path, snapshot: Path, eval_dir: Path) -> tuple[list[dict], dict]:
    """The round's clean prompts, in the round's order, without those its replies file answers;
    with the filter's report. The filter is the round's own, so the order and the ids agree."""
    prompts = list(read_jsonl_conversations(round_dir / "magpie.jsonl.gz"))
    known = list(read_jsonl_conversations(snapshot / "train_regenerated.jsonl.gz"))
    heldout = list(read_jsonl_conversations(snapshot / "heldout_regenerated.jsonl.gz"))
    clean, report = clean_prompts(prompts, eval_dir, heldout, known)
    answered = {row["id"] for row in read_jsonl_conversations(round_dir / "replies.jsonl.gz")}
    waiting = [row for row in clean if str(row["id"]) not in answered]
    return waiting, {**report, "answered_by_round": len(answered), "waiting": len(waiting)}


def gzip_deterministic(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as f, gzip.GzipFile(dest, "wb", mtime=0) as out:
        shutil.copyfileobj(f, out)


def parse(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(prog="python -m training.next_replies", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="the target folder (vLLM serves it)")
    p.add_argument("--round", type=Path, required=True, help="a round's data folder (magpie + replies .jsonl.gz)")
    p.add_argument("--snapshot", type=Path, required=True, help="the build's data snapshot folder")
    p.add_argument("--eval-dir", type=Path, required=True, help="benchmark .jsonl files (decontamination)")
    p.add_argument("--out", type=Path, required=True, help="replies.jsonl and record.json go here")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--chunk-size", type=int, default=128, help="conversations per vLLM batch")
    p.add_argument("--deadline-s", type=float, default=None, help="no new chunk after this many seconds")
    p.add_argument("--gzip", type=Path, default=None, help="then write the replies here, gzipped")
    add_verbose_flag(p)
    args = p.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    start = time.time()
    waiting, report = waiting_prompts(args.round, args.snapshot, args.eval_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    replies = args.out / "replies.jsonl"
    if args.gzip and args.gzip.is_file() and not replies.exists():
        with gzip.open(args.gzip, "rb") as src, open(replies, "wb") as dst:  # a new machine: resume
            shutil.copyfileobj(src, dst)
    before = len(completed_ids(replies))
    print(f"[next_replies] {report['waiting']} prompts wait, {before} answered here before", flush=True)
    generate = vllm_chat_generator(args.target, max_tokens=REPLY_TOKENS, max_model_len=1024, dtype=args.dtype,
                                   enforce_eager=True, seed=0)
    deadline = None if args.deadline_s is None else start + args.deadline_s
    regenerate_conversations(waiting, generate, replies, chunk_size=args.chunk_size, deadline=deadline)
    rows = len(read_jsonl(replies))
    path = args.out / "record.json"
    record = json.loads(path.read_text()) if path.is_file() else {"calls": []}
    record.update(filter=report, rows=rows,
                  generator=f"vLLM (CPU) greedy, {REPLY_TOKENS} tokens, {args.dtype}, max_model_len 1024")
    record["calls"].append({"began": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start)),
                            "added": rows - before, "seconds": round(time.time() - start, 1)})
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"[next_replies] {json.dumps(record)}", flush=True)
    if args.gzip:
        gzip_deterministic(replies, args.gzip)


if __name__ == "__main__":
    main()
