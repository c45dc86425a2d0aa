"""The offline testbed's tokenizer and tiny target, trained from scratch.

Stage "tokenizer": byte-level BPE on the train files with the fixtures' special tokens and ChatML
template, saved into the target folder.
Stage "target": a Qwen3ForCausalLM from scratch, next-token LM (training.lm through the shared
Trainer) on raw code windows of the train files plus chat-formatted examples of the two prompt
kinds, so that it answers through the chat template; saved in fp16; held-out losses measured on
the saved (fp16-rounded) weights, which every later stage and vLLM see.

Recipe fields `target_train` and what they mean on the Trainer:
  steps          optimizer steps (TrainConfig.max_steps; the Trainer's seeded epoch permutations
                 run over the sequences as often as needed);
  batch_size     sequences per step (TrainConfig.batch_size; grad_accum 1);
  seq_len        tokens per raw window / cap of a chat example;
  lr, weight_decay  AdamW (betas 0.9, 0.95; no decay on norm gains), one group "model";
  warmup_steps   linear warmup steps (OptimConfig.warmup_steps), then cosine to 0.1 x lr;
  max_heldout_windows  held-out raw windows (and chat examples) measured.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from training.build_stages.corpus import code_windows, conversation, function_requests
from training.build_stages.drafts import run_tail
from training.lm import next_token_loss, pad_sequences, run_lm_training
from training.trainer import OptimConfig, TrainConfig
from vllm_liliprop.fixtures.tiny_models import train_chatml_tokenizer

__all__ = ["load_tokenizer", "lm_windows", "chat_sequences", "heldout_loss",
           "target_train_config", "tokenizer_stage", "target_stage", "load_target"]


def load_tokenizer(target_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target_dir)


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
        text = tokenizer.apply_chat_template(conversation(user, assistant), tokenize=False)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"][:seq_len])
    return out


@torch.no_grad()
def heldout_loss(model, sequences: list[list[int]], pad_id: int, batch_size: int = 16) -> float:
    """Mean next-token CE (nats per token) over `sequences`."""
    total, count = 0.0, 0
    for i in range(0, len(sequences), batch_size):
        ce, n = next_token_loss(model, *pad_sequences(sequences[i:i + batch_size], pad_id))
        total, count = total + float(ce), count + int(n)
    return total / max(1, count)


def target_train_config(spec: dict[str, Any], output_dir: Path, seed: int) -> TrainConfig:
    """The recipe's target_train fields as the Trainer's config (see the module docstring)."""
    steps = int(spec["steps"])
    return TrainConfig(
        output_dir=str(output_dir), max_steps=steps, batch_size=int(spec["batch_size"]), grad_accum=1,
        precision="fp32", seed=seed, save_every=max(1, steps // 10), keep_checkpoints=1, log_every=1,
        optim=OptimConfig(lr={"model": float(spec["lr"])}, weight_decay={"model": float(spec["weight_decay"])},
                          betas=(0.9, 0.95), warmup_steps=int(spec["warmup_steps"]), min_lr_ratio=0.1,
                          clip_grad_norm=1.0))


def tokenizer_stage(train_texts: list[str], vocab_size: int, target_dir: Path) -> dict[str, Any]:
    """The BPE tokenizer into target_dir; returns {"vocab_size"}."""
    return {"vocab_size": len(train_chatml_tokenizer(train_texts, vocab_size, target_dir))}


def load_target(target_dir: Path):
    """The saved target in fp32, eval mode, frozen (what the later stages measure and train against)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval().requires_grad_(False)


def target_stage(train_texts: list[str], heldout_texts: list[str], corpus: dict, architecture: dict,
                 spec: dict, seed: int, target_dir: Path, run_dir: Path, log=print) -> dict[str, Any]:
    """Train the target (resuming from the latest checkpoint in run_dir) and save it to
    target_dir next to its tokenizer (from stage "tokenizer").

    Returns {"parameters", "train_sequences", "steps", "tokens_seen", "train_loss" (mean of the
    last 50 steps), "heldout_windows", "heldout_loss", "heldout_chat_loss" (nats/token),
    "heldout_perplexity", "train_config"}.
    """
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = load_tokenizer(target_dir)
    pad_id = tokenizer.eos_token_id
    windows = (corpus["prefix_lines"], corpus["continuation_lines"], corpus["window_stride_lines"])
    pairs = [pair for text in train_texts for pair in code_windows(text, *windows)]
    pairs += [pair for text in train_texts for pair in function_requests(text)]
    sequences = lm_windows(tokenizer, train_texts, spec["seq_len"]) + chat_sequences(tokenizer, pairs, spec["seq_len"])
    config = Qwen3Config(vocab_size=len(tokenizer), tie_word_embeddings=False, eos_token_id=pad_id,
                         bos_token_id=pad_id, rope_theta=10000.0, **architecture)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).float()
    train_config = target_train_config(spec, run_dir, seed)
    # A progress bar with the loss; every step's logs also in run_dir/metrics.jsonl.
    result = run_lm_training(model, sequences, pad_id, train_config, device="cpu", resume=True, progress=True)
    train_loss = run_tail(result, ("loss",), 50).get("loss")
    log(f"target trained {result['trainer'].step} steps, last-50-step train loss {train_loss}")
    # The end of an assistant turn ends generation (vLLM reads generation_config.json), as
    # Qwen3's own generation config does; <|endoftext|> stays the tokenizer's EOS.
    end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config = GenerationConfig(eos_token_id=[end_of_turn, pad_id], bos_token_id=pad_id,
                                               pad_token_id=pad_id)
    model.to(torch.float16).save_pretrained(target_dir, safe_serialization=True)
    tokenizer.save_pretrained(target_dir)
    # Every later stage (and vLLM) sees the fp16-rounded weights, so measure those.
    target = load_target(target_dir)
    heldout_windows = lm_windows(tokenizer, heldout_texts, spec["seq_len"])[: spec["max_heldout_windows"]]
    heldout_pairs = [p for text in heldout_texts for p in function_requests(text)][: spec["max_heldout_windows"]]
    heldout = round(heldout_loss(target, heldout_windows, pad_id), 4)
    return {
        "parameters": sum(p.numel() for p in target.parameters()),
        "train_sequences": len(sequences),
        "steps": result["trainer"].step,
        "tokens_seen": int(spec["steps"]) * int(spec["batch_size"]) * int(spec["seq_len"]),
        "train_loss": train_loss,
        "heldout_windows": len(heldout_windows),
        "heldout_loss": heldout,
        "heldout_chat_loss": round(heldout_loss(
            target, chat_sequences(tokenizer, heldout_pairs, spec["seq_len"]), pad_id), 4),
        "heldout_perplexity": round(math.exp(heldout), 3),
        "train_config": train_config.to_dict(),
    }
