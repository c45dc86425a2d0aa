"""Batched generation with a transformers model, for machines without vLLM (a lent GPU has no
vLLM and no network): the same two generators the data stages take from vLLM.

    completer = hf_completer(model, tokenizer, max_tokens=96, temperature=1.0, seed=0,
                             stop_ids=[im_end, im_start])       # Magpie user turns
    generate = hf_chat_generator(model, tokenizer, max_tokens=256)  # greedy replies

Prompts are sorted by length and cut into batches of `batch_size`, left-padded (the decoder
reads its last position), so a batch wastes little on padding. Sampling draws from one torch
generator seeded once, so a run is reproducible on the same device and library versions; it is
not the same stream as vLLM's, and neither is greedy decoding bit for bit (kernels differ), so
provenance records which generator made the data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from tqdm import tqdm

__all__ = ["Completion", "hf_completer", "hf_chat_generator"]

Completion = tuple[str, bool]  # (generated text, ended by a stop token rather than the cap)


def _length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (longest first: memory peaks early)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def _left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, width - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[r, width - len(row):] = 1
    return ids.to(device), mask.to(device)


def _cut_at_stop(tokens: list[int], stop_ids: set[int], pad_id: int) -> tuple[list[int], bool]:
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[:i], True
    return tokens, False  # no stop token: the cap cut it, and a running row is never padded


@torch.no_grad()
def _generate_ids(model, rows: list[list[int]], *, max_tokens: int, temperature: float,
                  stop_ids: set[int], pad_id: int, batch_size: int, generator: torch.Generator | None,
                  desc: str, progress: bool) -> list[tuple[list[int], bool]]:
    device = next(model.parameters()).device
    out: list[tuple[list[int], bool]] = [([], False)] * len(rows)
    batches = _length_batches([len(r) for r in rows], batch_size)
    bar = tqdm(total=len(rows), desc=desc, unit="seq", disable=not progress)
    for batch in batches:
        ids, mask = _left_pad([rows[i] for i in batch], pad_id, device)
        sampled = temperature > 0
        if sampled and generator is not None:
            # transformers samples with torch's global generator; seed it per batch from ours
            # so that the stream is reproducible and independent of batch composition elsewhere.
            torch.manual_seed(int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator)))
        generated = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens, do_sample=sampled,
            temperature=temperature if sampled else None, top_p=None, top_k=None,
            eos_token_id=sorted(stop_ids), pad_token_id=pad_id,
        )[:, ids.shape[1]:].tolist()
        for i, tokens in zip(batch, generated):
            out[i] = _cut_at_stop(tokens, stop_ids, pad_id)
        bar.update(len(batch))
    bar.close()
    return out


def hf_completer(model, tokenizer, *, max_tokens: int, temperature: float, seed: int,
                 stop_ids: Sequence[int], batch_size: int = 1024,
                 progress: bool = True) -> Callable[[list[str]], list[Completion]]:
    """Raw-text completions (no chat template applied): prompt strings -> (text, stopped)."""
    generator = torch.Generator().manual_seed(seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]

    def complete(prompts: list[str]) -> list[Completion]:
        rows = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        results = _generate_ids(model, rows, max_tokens=max_tokens, temperature=temperature,
                                stop_ids=set(stop_ids), pad_id=pad_id, batch_size=batch_size,
                                generator=generator, desc="complete", progress=progress)
        return [(tokenizer.decode(tokens, skip_special_tokens=True), stopped) for tokens, stopped in results]

    return complete


def hf_chat_generator(model, tokenizer, *, max_tokens: int, batch_size: int = 1024,
                      progress: bool = True) -> Callable[[list[list[dict]]], list[str]]:
    """The `generate` callable of `training.regenerate`: greedy replies to chat histories,
    capped at `max_tokens`, ended at the template's end-of-turn token."""
    stop_ids = {tokenizer.eos_token_id}
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def generate(batch: list[list[dict]]) -> list[str]:
        rows = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in batch]
        rows = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in rows]
        results = _generate_ids(model, rows, max_tokens=max_tokens, temperature=0.0, stop_ids=stop_ids,
                                pad_id=pad_id, batch_size=batch_size, generator=None,
                                desc="reply", progress=progress)
        return [tokenizer.decode(tokens, skip_special_tokens=True) for tokens, _ in results]

    return generate
