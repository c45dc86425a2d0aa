"""One DFlash training round on a lent accelerator, data included, inside a fixed time budget.

A lent GPU (issue 32) has no vLLM and no network, and is held for minutes: everything a round
needs happens here in one resumable command, on transformers and the package's own trainer:

  prompts      Magpie-style user turns by the target (training.magpie, topic mix `mix2`), sampled
  clean        decontaminated: no 13-word n-gram shared with any benchmark prompt or any
               held-out prompt of the snapshot, no exact duplicate of a snapshot prompt
  replies      the target's greedy replies (training.regenerate's protocol, 256 tokens)
  tokenize     the snapshot's train conversations + the new ones; the snapshot's held-out set
  train        the DFlash recipe from the shipped drafter (fresh warm-up), sized to the time left:
               the first steps measure the step time, the cosine schedule is then fitted to the
               deadline; held-out tau (the measure stage's protocol: fp32 target, same anchors)
               at the start and at every checkpoint, for the tau-vs-steps / tau-vs-data curve
  export       the drafter (DFlashDraftModel, reduced vocabulary) and the generated data, packed
               into parts small enough to come back from the device (`--pack`)

    python -m training.device_round --target DIR --snapshot testbed/smollm2/data \\
        --eval-dir .cache/benchmarks --init-draft testbed/smollm2/round3/drafts/dflash \\
        --out .cache/device_round --budget-s 540 --pack $OUT

On a CPU between device rounds, `--conversations FILE --total-steps N` trains from conversations
already generated (no prompts or replies stages) for a fixed number of steps (recipe
smollm2/dflash_cpu).

Every stage resumes: prompts and replies are appended JSONL (ids already written are skipped),
training resumes from its last checkpoint, and `OUT/round.json` records what each call did.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import shutil
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from training.build_stages.jsonl import read_jsonl, write_jsonl
from training.build_stages.measure import acceptance
from training.data import TokenizedDataset, read_jsonl_conversations
from training.decontaminate import eval_ngrams, ngrams
from training.hf_generation import hf_chat_generator, hf_completer
from training.magpie import end_markers, generate_prompts, user_header
from training.pipeline import prepare_draft_training
from training.recipe import apply_overrides, load_recipe
from training.regenerate import regenerate_conversations
from training.trainer import epoch_order
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

__all__ = ["clean_prompts", "tokenize_parallel", "pack", "main"]

NGRAM = 13
MAX_LENGTH = 1024
REPLY_TOKENS = 256
WARMUP_STEPS = 5


def _snapshot_rows(snapshot: Path, name: str) -> list[dict]:
    return list(read_jsonl_conversations(snapshot / f"{name}.jsonl.gz"))


def _user_turns(row: dict) -> list[str]:
    return [m["content"] for m in row["messages"] if m["role"] == "user"]


def clean_prompts(prompts: list[dict], eval_dir: Path, heldout: list[dict], known: list[dict]) -> tuple[list[dict], dict]:
    """Prompts sharing no NGRAM-word n-gram with a benchmark or held-out prompt, and no exact
    copy of a known (snapshot) prompt; with the counts dropped for each reason."""
    bench, files = eval_ngrams(eval_dir, NGRAM)
    held = set().union(*(ngrams(t, NGRAM) for row in heldout for t in _user_turns(row)))
    seen = {t for row in known + heldout for t in _user_turns(row)}
    kept, dropped = [], {"benchmark": 0, "heldout": 0, "duplicate": 0}
    for row in prompts:
        turns = _user_turns(row)
        grams = set().union(*(ngrams(t, NGRAM) for t in turns))
        reason = ("benchmark" if grams & bench else "heldout" if grams & held
                  else "duplicate" if any(t in seen for t in turns) else None)
        if reason:
            dropped[reason] += 1
            continue
        seen.update(turns)
        kept.append(row)
    return kept, {"prompts": len(prompts), "kept": len(kept), "dropped": dropped, "ngram": NGRAM,
                  "eval_files": [Path(f).name for f in files], "heldout_prompts": len(heldout)}


def _tokenize_chunk(args: tuple[str, list[dict]]) -> tuple[list, list]:
    from transformers import AutoTokenizer

    tokenizer_dir, rows = args
    data = TokenizedDataset.from_conversations(AutoTokenizer.from_pretrained(tokenizer_dir), rows, MAX_LENGTH,
                                               progress=False)
    return data.input_ids, data.loss_masks


def tokenize_parallel(tokenizer_dir: str, rows: list[dict], workers: int = 8) -> TokenizedDataset:
    """training.data's tokenization in `workers` spawned processes (order kept)."""
    chunks = [(tokenizer_dir, rows[i:i + 2000]) for i in range(0, len(rows), 2000)]
    with multiprocessing.get_context("spawn").Pool(min(workers, len(chunks))) as pool:
        parts = pool.map(_tokenize_chunk, chunks)
    return TokenizedDataset([ids for p in parts for ids in p[0]], [m for p in parts for m in p[1]])


def pack(files: dict[str, Path], dest: Path, part_mib: int = 15) -> list[str]:
    """One gzipped tar of `files` (archive name -> path), cut into parts of at most `part_mib`
    MiB (a device call returns files of at most 16 MiB). Reassemble: cat parts | tar xz."""
    dest.mkdir(parents=True, exist_ok=True)
    bundle = dest / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as tar:
        for name, path in files.items():
            tar.add(path, arcname=name)
    data, size, names = bundle.read_bytes(), part_mib * 2 ** 20, []
    bundle.unlink()
    for i in range(0, len(data), size):
        name = f"bundle.part{i // size:02d}"
        (dest / name).write_bytes(data[i:i + size])
        names.append(name)
    return names


class Round:
    """The round's record (OUT/round.json): appended to by every call, written after each stage."""

    def __init__(self, out: Path) -> None:
        self.path = out / "round.json"
        self.record: dict[str, Any] = json.loads(self.path.read_text()) if self.path.is_file() else {"calls": []}
        self.call: dict[str, Any] = {"began": time.strftime("%Y-%m-%d %H:%M:%S"), "stages": {}}
        self.record["calls"].append(self.call)

    def note(self, stage: str, **values) -> None:
        self.call["stages"][stage] = {**self.call["stages"].get(stage, {}), **values}
        self.path.write_text(json.dumps(self.record, indent=2) + "\n")
        print(f"[device_round] {stage}: {json.dumps(values)}", flush=True)


def _load_target(target: str, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval().requires_grad_(False)


def heldout_set(rows: list[dict], tokenizer) -> TokenizedDataset:
    """The snapshot's held-out conversations, tokenized: every round's held-out tau is on them."""
    return TokenizedDataset.from_conversations(tokenizer, rows, MAX_LENGTH, progress=False)


def make_data(args, out: Path, record: Round, target_bf16, tokenizer) -> tuple[TokenizedDataset, TokenizedDataset]:
    if args.conversations:
        return given_data(args, record, tokenizer)
    start = time.time()
    prompts_file, replies_file = out / "magpie.jsonl", out / "replies.jsonl"
    stops = [tokenizer.convert_tokens_to_ids(m) for m in end_markers(tokenizer)]
    complete = hf_completer(target_bf16, tokenizer, max_tokens=96, temperature=1.0, seed=args.seed,
                            stop_ids=stops, batch_size=args.gen_batch)
    generate_prompts(args.target, prompts_file, args.prompts, seed=args.seed, batch_size=args.gen_batch * 4,
                     topics="mix2", complete=complete, deadline=args.t0 + args.prompts_s)
    prompts = read_jsonl(prompts_file)
    record.note("prompts", rows=len(prompts), requested=args.prompts, seconds=round(time.time() - start, 1),
                generator="transformers generate, T=1, topics mix2", header=user_header(tokenizer))
    known, heldout = _snapshot_rows(args.snapshot, "train_regenerated"), _snapshot_rows(args.snapshot, "heldout_regenerated")
    clean, report = clean_prompts(prompts, args.eval_dir, heldout, known)
    record.note("clean", **report)
    start = time.time()
    generate = hf_chat_generator(target_bf16, tokenizer, max_tokens=REPLY_TOKENS, batch_size=args.gen_batch)
    regenerate_conversations(clean, generate, replies_file, chunk_size=args.gen_batch * 2,
                             deadline=args.t0 + args.data_s)
    replies = read_jsonl(replies_file)
    record.note("replies", rows=len(replies), seconds=round(time.time() - start, 1),
                generator=f"transformers generate, greedy, {REPLY_TOKENS} tokens, bf16")
    start = time.time()
    train = tokenize_parallel(args.target, known + replies)
    held = heldout_set(heldout, tokenizer)
    record.note("tokenize", train_examples=len(train), snapshot_conversations=len(known),
                new_conversations=len(replies), heldout_examples=len(held),
                train_tokens=sum(map(len, train.input_ids)), seconds=round(time.time() - start, 1))
    return train, held


def given_data(args, record: Round, tokenizer) -> tuple[TokenizedDataset, TokenizedDataset]:
    """A CPU round's data: conversations already generated and decontaminated (`--conversations`,
    e.g. `replies_cpu.jsonl.gz`, whose record states its filter), alone: a CPU round sees far fewer
    sequences than there are new conversations, so the snapshot's are left out."""
    start = time.time()
    rows = [row for path in args.conversations for row in read_jsonl_conversations(path)]
    for previous in args.after_round:  # in the order the rounds ran: each drew from what was left
        rows = unseen_rows(rows, json.loads(previous.read_text()))
    train = tokenize_parallel(args.target, rows, workers=2)
    held = heldout_set(_snapshot_rows(args.snapshot, "heldout_regenerated"), tokenizer)
    record.note("tokenize", train_examples=len(train), new_conversations=len(rows), heldout_examples=len(held),
                sources=[str(p) for p in args.conversations], after_round=",".join(map(str, args.after_round)),
                train_tokens=sum(map(len, train.input_ids)), seconds=round(time.time() - start, 1))
    return train, held


def unseen_rows(rows: list[dict], previous: dict) -> list[dict]:
    """`rows` less those an earlier CPU round over the same rows drew: its trainer's first-epoch
    order (training.trainer's) up to the sequences it saw, so a next round trains on new
    conversations only and the campaign's distinct count stays exact."""
    call = previous["calls"][-1]["stages"]
    if call["tokenize"]["train_examples"] != len(rows):
        raise ValueError(f"--after-round: that round trained on {call['tokenize']['train_examples']} "
                         f"conversations, these are {len(rows)}; pass the same --conversations files")
    seen = call["train"]["steps"] * call["train"]["global_batch"]
    if seen >= len(rows):
        raise ValueError(f"--after-round: that round saw all {len(rows)} conversations; none are new")
    drawn = set(epoch_order(len(rows), call["train"]["recipe"]["train"]["seed"], 0)[:seen])
    return [row for i, row in enumerate(rows) if i not in drawn]


def train(args, out: Path, record: Round, target_bf16, train_data, heldout) -> Path:
    recipe = apply_overrides(load_recipe(args.recipe), args.set)
    recipe["target"] = args.target
    recipe["train"]["output_dir"] = str(out / "run")
    recipe["drafter"] = {**recipe.get("drafter", {}), "init_from": str(args.init_draft)}
    run = prepare_draft_training(recipe, target_model=target_bf16, dataset=train_data)
    trainer = run.trainer
    target_fp32 = _load_target(args.target, torch.float32, trainer.device)
    curve: list[dict] = []

    def measure(step: int, _path=None) -> None:
        tau = acceptance(run.drafter, None, run.vocab_ids, target_fp32, heldout, args.anchors, 0)
        curve.append({"step": step, "sequences_seen": step * trainer.global_batch,
                      "heldout_tau": round(1 + tau["accept_argmax"], 4), "elapsed_s": round(time.time() - args.t0, 1)})
        record.note("train", curve=curve)

    latest = trainer.latest_checkpoint()
    if latest is None:
        began = time.time()
        measure(0)
        measure_s = time.time() - began
        trainer.config.save_every = 10 ** 9
        # The first steps pay CUDA's start-up (kernel selection, allocator growth): on an H200
        # they took 1.05 s against 0.12 s later, and a plan sized on them ran 128 steps of the
        # ~2,000 its budget allowed. They are run but not timed.
        trainer.total_steps = WARMUP_STEPS
        trainer.fit()
        trainer.total_steps = WARMUP_STEPS + args.calibration_steps
        began = time.time()
        trainer.fit()
        step_s = (time.time() - began) / args.calibration_steps
        left = args.t0 + args.budget_s - args.reserve_s - time.time() - args.points * measure_s
        total = args.total_steps or max(trainer.step + 1, int(left / step_s))
        trainer.retarget(total)
        trainer.config.save_every = max(1, total // args.points)
        record.note("train", step_s=round(step_s, 4), measure_s=round(measure_s, 1), total_steps=total, global_batch=trainer.global_batch,
                    recipe=recipe)
    else:
        total = json.loads(record.path.read_text())["calls"][0]["stages"]["train"]["total_steps"]
        trainer.load_checkpoint(latest)
        trainer.retarget(total)
        trainer.config.save_every = max(1, total // args.points)
    trainer.on_save = measure
    trainer.fit(deadline=args.t0 + args.budget_s - args.reserve_s)
    export_dir = out / "dflash"
    run.export(export_dir)
    shutil.copy(Path(args.target) / "tokenizer.json", export_dir / "tokenizer.json")
    record.note("train", steps=trainer.step, finished=trainer.step >= trainer.total_steps,
                examples=len(train_data), seconds=round(time.time() - args.t0, 1))
    return export_dir


def parse(argv: Sequence[str] | None):
    p = argparse.ArgumentParser(prog="python -m training.device_round", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="the converted target folder")
    p.add_argument("--snapshot", type=Path, required=True, help="the build's data snapshot folder")
    p.add_argument("--eval-dir", type=Path, required=True, help="benchmark .jsonl files (decontamination)")
    p.add_argument("--init-draft", type=Path, required=True, help="the DFlash draft to train on from")
    p.add_argument("--recipe", default="smollm2/dflash_device")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--prompts", type=int, default=48000, help="Magpie requests")
    p.add_argument("--seed", type=int, default=3, help="Magpie seed (ids magpie-<seed>-<i>)")
    p.add_argument("--gen-batch", type=int, default=2048)
    p.add_argument("--budget-s", type=float, default=540, help="the whole call, from start to packed output")
    p.add_argument("--prompts-s", type=float, default=100, help="prompts stop by then (from start)")
    p.add_argument("--data-s", type=float, default=280, help="replies stop by then (from start)")
    p.add_argument("--reserve-s", type=float, default=45, help="left after training for export and packing")
    p.add_argument("--calibration-steps", type=int, default=20, help="timed steps after the warm-up ones")
    p.add_argument("--points", type=int, default=6, help="held-out measurements along the run")
    p.add_argument("--anchors", type=int, default=64, help="held-out anchors per example (measure stage)")
    p.add_argument("--conversations", type=Path, action="append", default=[],
                   help="train on these generated, decontaminated conversations (skips prompts and replies)")
    p.add_argument("--after-round", type=Path, action="append", default=[], metavar="ROUND_JSON",
                   help="leave out the conversations the CPU round of this record (OUT/round.json) drew; "
                        "repeat it for a chain of rounds, in the order they ran")
    p.add_argument("--total-steps", type=int, default=0,
                   help="the run's length in steps instead of one fitted to the budget (a shared CPU's step time varies)")
    p.add_argument("--pack", type=Path, default=None, help="write the bundle parts here")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe override")
    add_verbose_flag(p)
    args = p.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    args.t0 = time.time()
    from transformers import AutoTokenizer

    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.out.mkdir(parents=True, exist_ok=True)
    record = Round(args.out)
    record.note("device", name=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                torch=torch.__version__)
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target_bf16 = _load_target(args.target, torch.bfloat16, device)
    train_data, heldout = make_data(args, args.out, record, target_bf16, tokenizer)
    export_dir = train(args, args.out, record, target_bf16, train_data, heldout)
    if args.pack:
        gz = {}
        for name in ("magpie", "replies"):
            gz[name] = args.out / f"{name}.jsonl.gz"
            with open(args.out / f"{name}.jsonl", "rb") as src, gzip.GzipFile(gz[name], "wb", mtime=0) as dst:
                shutil.copyfileobj(src, dst)
        files = {f"data/{n}.jsonl.gz": p for n, p in gz.items()}
        files.update({f"dflash/{p.name}": p for p in export_dir.iterdir()})
        files["run/metrics.jsonl"] = args.out / "run" / "metrics.jsonl"
        names = pack(files, args.pack)
        shutil.copy(record.path, args.pack / "round.json")
        record.note("pack", parts=names, seconds=round(time.time() - args.t0, 1))


if __name__ == "__main__":
    main()
