"""What a LiLiCorr head sees of each block, computed once for a frozen drafter (issue 33).

With the drafter frozen, the head's inputs depend only on the data and the drafter: per block,
the top-K candidate ids of every slot (over the drafter's full vocabulary, as a LiLiCorr draft
is served), their log-probs, the slot hidden states, the anchor's context state, the true next
tokens and the target's log-probs at the candidates (the distractor term). A store holds them
for many blocks (bf16 states, in shards), so the head trains for thousands of steps without a
target or drafter forward (`training.train_head`).

    python -m training.head_store --draft testbed/smollm2/round3/drafts/dflash \\
        --target .cache/targets/smollm2-135m-instruct --data train.jsonl --out .cache/head_store/train \\
        --anchors 128 --seed 7 --limit 2000

`--data` is a tokenized dataset (.jsonl of training.data) or conversations (.jsonl[.gz]).
Shards are written as they fill (`shard_00000.safetensors`, ...) and a rerun skips the
examples already stored, so the command resumes.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from training.data import TokenizedDataset, collate, load_examples
from training.export import load_dflash, read_draft_vocab
from training.features import OnlineFeatures, frozen_target_weights
from training.losses import LossWeights
from training.objective import DraftObjective
from training.startup import target_dtype
from training.trainer import cpu_autocast, seeds_for
from vllm_liliprop.heads.candidates import topk_candidates
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

__all__ = ["STORE_K", "block_inputs", "build_store", "first_slots", "load_store"]

STORE_K = 16  # candidates kept per slot: the K = 4 / 8 / 16 heads all read a prefix of them
KEYS = ("candidate_ids", "candidate_log_probs", "slot_hidden", "anchor_hidden", "targets", "target_logq")


def within_vocab(logits: torch.Tensor, vocab_ids: torch.Tensor | None) -> torch.Tensor:
    """Logits [..., V] with every id outside `vocab_ids` (None: keep all) at -inf: the candidates
    and log-probs of a lattice drawn from a reduced candidate vocabulary, as served."""
    if vocab_ids is None:
        return logits
    kept = torch.full_like(logits, float("-inf"))
    return kept.index_copy_(-1, vocab_ids, logits.index_select(-1, vocab_ids))


@torch.no_grad()
def block_inputs(objective: DraftObjective, target, batch: dict, seeds: list[int], k: int = STORE_K,
                 vocab_ids: torch.Tensor | None = None) -> dict:
    """The head's inputs for every anchor block of a batch (drafter and target frozen); with
    `vocab_ids`, candidates come from that reduced vocabulary only."""
    feats = OnlineFeatures(target, objective.drafter.config.target_layer_ids, final_hidden=True)(batch)
    draft = objective.draft_blocks(batch["input_ids"], batch["loss_mask"], feats["target_taps"], seeds)
    blocks, slots = draft["targets"].shape
    ids, log_probs = topk_candidates(within_vocab(draft["draft_logits"].flatten(0, 1), vocab_ids), k)
    ids, log_probs = ids.view(blocks, slots, k), log_probs.view(blocks, slots, k)
    final = objective._slot_states(feats["target_final_hidden"], draft["anchors"], draft["valid"], slots)
    return {"candidate_ids": ids.to(torch.int32), "candidate_log_probs": log_probs.float(),
            "slot_hidden": draft["slot_hidden"].to(torch.bfloat16),
            "anchor_hidden": draft["anchor_hidden"].to(torch.bfloat16),
            "targets": torch.where(draft["slot_mask"], draft["targets"], -1).to(torch.int32),
            "target_logq": objective.target_log_probs(final, ids).float()}


def build_store(draft_dir: str | Path, target, dataset: TokenizedDataset, out: str | Path, *, anchors: int,
                seed: int, limit: int | None = None, shard_blocks: int = 8192, progress: bool = True,
                candidate_vocab: str | Path | None = None) -> dict:
    """Write the store for the first `limit` examples; returns its record (also out/store.json).
    `candidate_vocab`: a draft folder whose reduced vocabulary (d2t) the candidates come from."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    drafter = load_dflash(draft_dir).eval()
    vocab_ids = None if candidate_vocab is None else read_draft_vocab(candidate_vocab)
    if candidate_vocab is not None and vocab_ids is None:
        raise ValueError(f"--candidate-vocab {candidate_vocab}: that draft has no reduced vocabulary (d2t); "
                         "give a DFlash draft exported with draft_vocab_size")
    embed, lm_head = frozen_target_weights(target)
    objective = DraftObjective(drafter, embed.float(), lm_head.float(), weights=LossWeights(distractor=0.0),
                               num_anchors=anchors)
    shards = sorted(out.glob("shard_*.safetensors"))
    done = sum(int(load_file(str(s))["example_count"][0]) for s in shards)
    pending: dict[str, list[torch.Tensor]] = {key: [] for key in KEYS}
    examples_in_shard, total = 0, min(len(dataset), limit or len(dataset))

    def flush() -> None:
        nonlocal examples_in_shard, shards
        if not pending["targets"]:
            return
        tensors = {key: torch.cat(values) for key, values in pending.items()}
        tensors["example_count"] = torch.tensor([examples_in_shard])
        save_file(tensors, str(out / f"shard_{len(shards):05d}.safetensors"))
        shards = sorted(out.glob("shard_*.safetensors"))
        for values in pending.values():
            values.clear()
        examples_in_shard = 0

    for i in tqdm(range(done, total), desc="head store", disable=not progress):
        with cpu_autocast():
            block = block_inputs(objective, target, collate([dataset[i]]), seeds_for([i], seed, 0),
                                 vocab_ids=vocab_ids)
        for key in KEYS:
            pending[key].append(block[key])
        examples_in_shard += 1
        if sum(t.shape[0] for t in pending["targets"]) >= shard_blocks:
            flush()
    flush()
    record = {"draft": str(draft_dir), "examples": total, "anchors_per_example": anchors, "seed": seed,
              "k": STORE_K, "candidate_vocab": None if candidate_vocab is None else str(candidate_vocab),
              "candidate_vocab_size": None if vocab_ids is None else int(vocab_ids.numel()),
              "blocks": sum(int(load_file(str(s))["targets"].shape[0]) for s in shards)}
    (out / "store.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def load_store(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every shard of a store, concatenated (block-major)."""
    shards = sorted(Path(folder).glob("shard_*.safetensors"))
    if not shards:
        raise ValueError(f"no head store in {folder}: build one with python -m training.head_store")
    parts = [load_file(str(s)) for s in shards]
    return {key: torch.cat([p[key] for p in parts]) for key in KEYS}


def first_slots(store: dict[str, torch.Tensor], slots: int | None) -> dict[str, torch.Tensor]:
    """The store's blocks cut to their first `slots` draft slots (None: all of them), as a vLLM
    engine serving k = `slots` speculative tokens builds its lattice: a head trained on those
    spends its capacity where serving reads it (the anchor state is per block, not per slot)."""
    have = store["targets"].shape[1]
    if slots is None or slots == have:
        return store
    if not 1 <= slots <= have:
        raise ValueError(f"train.slots / --slots = {slots}: the store's blocks have {have} slots; give "
                         f"1..{have} (the served num_speculative_tokens) or leave it unset for all")
    return {key: t if key == "anchor_hidden" else t[:, :slots].contiguous() for key, t in store.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.head_store", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", required=True, help="DFlash (or LiLiCorr) draft folder: the frozen drafter")
    parser.add_argument("--target", required=True, help="the target's folder")
    parser.add_argument("--data", required=True, help="tokenized .jsonl or conversations .jsonl[.gz]")
    parser.add_argument("--out", required=True)
    parser.add_argument("--anchors", type=int, default=64, help="anchor blocks per example")
    parser.add_argument("--seed", type=int, default=0, help="anchor seed (0: the measure stage's)")
    parser.add_argument("--limit", type=int, default=None, help="first N examples")
    parser.add_argument("--candidate-vocab", default=None,
                        help="a draft folder with a reduced vocabulary (d2t): candidates from it only")
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    from transformers import AutoModelForCausalLM

    dataset = load_examples(args.data, args.target, 1024)
    # bf16 only where this host runs it fast (the stored states are bf16 either way).
    target = AutoModelForCausalLM.from_pretrained(args.target, dtype=target_dtype("auto", torch.device("cpu"))).eval()
    print(json.dumps(build_store(args.draft, target, dataset, args.out, anchors=args.anchors, seed=args.seed,
                                 limit=args.limit, candidate_vocab=args.candidate_vocab)))


if __name__ == "__main__":
    main()
