"""A LiLiCorr head trained alone over a frozen drafter, from a head store (issue 33).

The store (`training.head_store`) holds each block's candidates, log-probs and states, so a
step is the head alone: thousands of steps cost what a few dozen joint steps do. Held-out walk
tau, argmax tau, oracle-prefix tau and the walk's share of the headroom are measured on a
held-out store along the run (the learning curve); the head is exported with the drafter as an
upstream LiLiCorrDraftModel folder.

    python -m training.train_head --store .cache/head_store/train --heldout .cache/head_store/heldout \\
        --draft testbed/smollm2/round3/drafts/dflash --target .cache/targets/smollm2-135m-instruct \\
        --recipe smollm2/lilicorr_head --out .cache/heads/base [--set train.steps=4000 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm import tqdm

from training.export import export_lilicorr, load_dflash, load_lilicorr
from training.head_store import first_slots, load_store
from training.losses import distractor_penalty, ground_truth_index, margin_hinge, oracle_prefix_mask, reranker_ce
from training.headroom_metrics import headroom_metrics
from training.pipeline import build_lattice
from training.recipe import apply_overrides, load_recipe
from training.trainer import cosine_with_warmup, cpu_autocast
from vllm_liliprop.heads.lattice_prior import with_logprob_prior
from vllm_liliprop.walks import greedy_walk
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

__all__ = ["head_loss", "store_ranks", "walk_hits", "lattice_metrics", "train_head", "main"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def _inputs(store: dict, rows: torch.Tensor, k: int, embed: torch.Tensor, dropout: float = 0.0,
            generator: torch.Generator | None = None):
    ids = store["candidate_ids"][rows, :, :k].long()
    log_probs = store["candidate_log_probs"][rows, :, :k]
    if dropout > 0:
        # Blocks whose confidence features are hidden: the head must rank from the tokens and
        # states alone there (a head that only copies log p cannot lower its loss on them).
        hide = torch.rand(rows.shape[0], generator=generator) < dropout
        log_probs = torch.where(hide[:, None, None], torch.full_like(log_probs, -math.log(k)), log_probs)
    return (embed[ids], log_probs, store["slot_hidden"][rows], store["anchor_hidden"][rows],
            torch.ones(rows.shape[0], dtype=torch.bool)), ids


def walk_scores(head, prior: torch.Tensor | None, store: dict, rows: torch.Tensor, k: int, embed: torch.Tensor,
                dropout: float = 0.0, generator: torch.Generator | None = None):
    """(start, pairs, candidate ids) of the store's blocks `rows`: the head's scores plus the
    drafter's log-prob prior (heads.lattice_prior), weighted by `prior` where the recipe trains
    one, else by the head's own config (0: none). The prior reads the true log-probs even where
    feature dropout hid them from the head."""
    inputs, ids = _inputs(store, rows, k, embed, dropout, generator)
    with cpu_autocast():
        start, pairs = head.score(*inputs)
    weight = head.config.prior_weight if prior is None else prior
    start, pairs = with_logprob_prior(start, pairs, store["candidate_log_probs"][rows, :, :k], weight)
    return start, pairs, ids


def head_loss(start, pairs, ids, targets, target_logq, loss: dict) -> dict[str, torch.Tensor]:
    """Eq. 7's reranker terms: (1 - mu) CE + lambda distractor + mu margin, on oracle prefixes;
    each a slot mean, weighted by `loss.slot_weights` (one per slot, e.g. more on the slots a
    k = 3 engine verifies) where the recipe gives them."""
    oracle, gt = oracle_prefix_mask(ids, targets), ground_truth_index(ids, targets)
    weights = loss.get("slot_weights")
    weights = None if weights is None else torch.tensor(weights, dtype=torch.float32)[: ids.shape[1]]
    terms = {"ce": reranker_ce(start, pairs, gt, oracle, weights)}
    mu, lam = loss.get("margin_blend", 0.0), loss.get("distractor", 1.0)
    total = (1 - mu) * terms["ce"]
    if lam > 0:
        terms["distractor"] = distractor_penalty(start, pairs, gt, target_logq, oracle, weights)
        total = total + lam * terms["distractor"]
    if mu > 0:
        terms["margin"] = margin_hinge(start, pairs, gt, oracle, loss.get("margin", 2.0), weights)
        total = total + mu * terms["margin"]
    terms["loss"] = total
    return terms


def store_ranks(store: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(true_rank, slot_valid) [M, S] of a store's blocks: where the true token sits among the
    stored candidates (STORE_K where it is not among them), for `headroom_metrics`."""
    ids, targets = store["candidate_ids"].long(), store["targets"].long()
    hit = ids == targets.unsqueeze(-1)
    rank = torch.where(hit.any(dim=-1), hit.float().argmax(dim=-1), torch.full_like(targets, ids.shape[-1]))
    return rank, targets >= 0


@torch.no_grad()
def walk_hits(head, store: dict, embed: torch.Tensor, batch: int = 1024,
              prior: torch.Tensor | None = None) -> torch.Tensor:
    """bool [M, S]: where the head's greedy walk over each stored block picks the true token."""
    head.eval()
    n, walks = store["targets"].shape[0], []
    for at in range(0, n, batch):
        start, pairs, ids = walk_scores(head, prior, store, torch.arange(at, min(at + batch, n)),
                                        head.config.candidate_topk, embed)
        walks.append(ids.gather(-1, greedy_walk(start, pairs).unsqueeze(-1)).squeeze(-1))
    head.train()
    return torch.cat(walks) == store["targets"].long()


@torch.no_grad()
def lattice_metrics(head, store: dict, embed: torch.Tensor, batch: int = 1024,
                    prior: torch.Tensor | None = None, scored_slots: int | None = None) -> dict[str, float]:
    """Held-out taus of the greedy walk, the drafter's argmax and the oracle prefix at the
    head's K (training.headroom_metrics), and the walk's share of that headroom. With
    `scored_slots`, the walk runs over the whole lattice and only its first `scored_slots`
    picks count, as an engine that builds a longer lattice than it verifies would draft."""
    k = head.config.candidate_topk
    rank, valid = store_ranks(store)
    hits = walk_hits(head, store, embed, batch, prior)
    scored = slice(None, scored_slots)
    m = headroom_metrics(rank[:, scored], valid[:, scored], hits[:, scored], ks=(k,))
    return {"walk_tau": round(m["walk_tau"], 4), "argmax_tau": round(m["argmax_tau"], 4),
            f"oracle{k}_tau": round(m["oracle_tau"][str(k)], 4),
            "headroom_share": round(m["walk_share"][str(k)] or 0.0, 4)}


def train_head(recipe: dict, store: dict, heldout: dict, embed: torch.Tensor, drafter_config, out: Path,
               progress: bool = True) -> tuple[torch.nn.Module, list[dict]]:
    spec = recipe["train"]
    torch.manual_seed(spec.get("seed", 0))
    generator = torch.Generator().manual_seed(spec.get("seed", 0))
    head = build_lattice(recipe.get("lattice", {}), drafter_config)
    if spec.get("init"):  # a warm start: an exported LiLiCorr draft's head, same geometry
        head.load_state_dict(load_lilicorr(spec["init"])[1].state_dict(), strict=True)
    k, steps, n = head.config.candidate_topk, int(spec["steps"]), store["targets"].shape[0]
    decay = [p for name, p in head.named_parameters() if p.dim() >= 2 and "embedding" not in name]
    rest = [p for name, p in head.named_parameters() if not (p.dim() >= 2 and "embedding" not in name)]
    # The drafter's log-prob prior (heads.lattice_prior): its weight starts at prior_weight and
    # is learned with the head; absent, the walk is upstream's (cosines alone).
    prior = None
    if spec.get("prior_weight") is not None:
        prior = torch.nn.Parameter(torch.tensor(float(spec["prior_weight"])))
        rest.append(prior)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": spec.get("weight_decay", 0.01)},
                                   {"params": rest, "weight_decay": 0.0}], lr=spec["lr"])
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_with_warmup(steps, spec.get("warmup_ratio", 0.05)))
    # The first eval_train_blocks training blocks measured as the held-out ones are: a train /
    # held-out gap says overfitting, no gap with a low share says the head cannot fit its data.
    seen = {key: t[:spec.get("eval_train_blocks", 0)] for key, t in store.items()}

    def measure() -> dict:
        row = lattice_metrics(head, heldout, embed, prior=prior)
        if seen["targets"].shape[0]:
            fit = lattice_metrics(head, seen, embed, prior=prior)
            row |= {"train_walk_tau": fit["walk_tau"], "train_argmax_tau": fit["argmax_tau"],
                    "train_headroom_share": fit["headroom_share"]}
        return row | ({"prior_weight": round(float(prior), 4)} if prior is not None else {})

    curve = [{"step": 0, **measure()}]
    log = open(out / "metrics.jsonl", "w", encoding="utf-8")
    began = time.time()
    for step in tqdm(range(1, steps + 1), desc="head", disable=not progress):
        rows = torch.randint(0, n, (spec["batch_blocks"],), generator=generator)
        start, pairs, ids = walk_scores(head, prior, store, rows, k, embed, spec.get("feature_dropout", 0.0), generator)
        terms = head_loss(start, pairs, ids, store["targets"][rows].long(), store["target_logq"][rows, :, :k],
                          recipe.get("loss", {}))
        terms["loss"].backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), spec.get("clip_grad_norm", 1.0))
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % spec.get("log_every", 25) == 0:
            log.write(json.dumps({"step": step, **{key: round(float(v.detach()), 5) for key, v in terms.items()}}) + "\n")
            log.flush()
        if step % spec.get("eval_every", 250) == 0 or step == steps:
            curve.append({"step": step, "seconds": round(time.time() - began, 1), **measure()})
            (out / "curve.json").write_text(json.dumps(curve, indent=2) + "\n")
    log.close()
    if prior is not None:  # exported with the head (dflash_config.liliprop_lattice_prior_weight)
        head.config = dataclasses.replace(head.config, prior_weight=round(max(float(prior), 0.0), 6))
    return head, curve


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.train_head", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", required=True, help="training head store")
    parser.add_argument("--heldout", required=True, help="held-out head store (the learning curve)")
    parser.add_argument("--draft", required=True, help="the frozen drafter's folder (the store's)")
    parser.add_argument("--target", required=True, help="the target's folder (its embedding table)")
    parser.add_argument("--recipe", default="smollm2/lilicorr_head")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", required=True)
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    recipe = apply_overrides(load_recipe(args.recipe), args.set)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    embed = load_file(str(Path(args.target) / "model.safetensors"))["model.embed_tokens.weight"]
    drafter = load_dflash(args.draft)
    # train.slots: the served k, where the head is trained and measured on lattices of that many slots.
    slots = recipe["train"].get("slots")
    head, curve = train_head(recipe, first_slots(load_store(args.store), slots),
                             first_slots(load_store(args.heldout), slots), embed, drafter.config, out)
    export_lilicorr(out / "lilicorr", drafter, head, torch.bfloat16)
    for name in TOKENIZER_FILES:
        if (Path(args.draft) / name).is_file():
            shutil.copy(Path(args.draft) / name, out / "lilicorr" / name)
    (out / "run.json").write_text(json.dumps({"recipe": recipe, "store": args.store, "heldout": args.heldout,
                                              "draft": args.draft, "curve": curve}, indent=2) + "\n")
    print(json.dumps(curve[-1]))


if __name__ == "__main__":
    main()
