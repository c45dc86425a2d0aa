"""Hand-built drafts whose drafts are known in advance, for exact counter predictions."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vllm_liliprop.fixtures import build_tiny_dflash_draft, build_tiny_lilicorr_draft
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead


def _mask_state(target_dir: Path, draft_config: dict) -> torch.Tensor:
    """The drafter's final hidden state at every mask slot once its layers add nothing:
    RMSNorm(embedding[mask]) with unit gain."""
    weights = load_file(str(Path(target_dir) / "model.safetensors"))
    e = weights["model.embed_tokens.weight"][draft_config["dflash_config"]["mask_token_id"]].float()
    return e * torch.rsqrt(e.pow(2).mean() + draft_config["rms_norm_eps"])


def make_constant_drafter(draft_dir: Path, target_dir: Path, ranked_tokens: list[int]) -> None:
    """Rewrite a tiny draft so that every slot's logits are the same: ranked_tokens[0] first,
    ranked_tokens[1] second, ..., every other token 0 (ties: lowest id first).

    The layers' output projections are zeroed, so the residual stream at a mask slot is the mask
    embedding, and the draft gets its own LM head aimed at that state."""
    draft_dir = Path(draft_dir)
    config = json.loads((draft_dir / "config.json").read_text())
    weights = load_file(str(draft_dir / "model.safetensors"))
    for name in weights:
        if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            weights[name] = torch.zeros_like(weights[name])
    m = _mask_state(target_dir, config)
    lm_head = torch.zeros(config["vocab_size"], config["hidden_size"])
    for rank, token in enumerate(ranked_tokens):
        lm_head[token] = (len(ranked_tokens) - rank + 1) * m / m.dot(m)
    weights["lm_head.weight"] = lm_head
    save_file(weights, str(draft_dir / "model.safetensors"))
    config["has_own_lm_head"] = True
    (draft_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def rank_preferring_head_weights(config: LatticeConfig, rank: int) -> dict[str, torch.Tensor]:
    """LiLiCorr head weights whose start and pair scores are logit_scale at candidate `rank` and 0
    elsewhere, whatever the tokens: every walk then picks rank `rank` in every slot.

    Needs num_layers = 0 and a head width (lilicorr_hidden_size) different from the draft's, so
    that the token projection exists and can be zeroed. Only the rank embedding reaches the
    candidate's in-vector (one axis per rank); the out-vectors and the anchor's are the axis of
    `rank`."""
    assert config.num_layers == 0 and config.width != config.model_hidden_size
    k, width = config.candidate_topk, config.width
    assert k <= width and k <= config.factor_dim
    head = LatticeHead(config)
    state = {name: torch.zeros_like(value) for name, value in head.state_dict().items()}
    for name in state:
        if name.endswith("norm.weight"):
            state[name] = torch.ones_like(state[name])
    state["rank_embedding"][0, 0, 0, :, :k] = torch.eye(k)
    state["factor_input_proj.weight"][:, :width] = torch.eye(width)
    state["in_head.weight"][:k, :k] = torch.eye(k)
    state["out_head.bias"][rank] = 1.0
    state["anchor_out_head.bias"][rank] = 1.0
    return state


def build_rank_preferring_lilicorr(out_dir, target_dir, ranked_tokens, rank, topk=4):
    """A LiLiCorr draft over the constant drafter whose head always walks candidate `rank`."""
    build_tiny_lilicorr_draft(out_dir, target_dir, topk=topk, num_layers=0, head_width=64)
    config = json.loads((Path(out_dir) / "config.json").read_text())
    lattice_config = LatticeConfig.from_dflash_config(
        config["dflash_config"], config["hidden_size"], config["dflash_config"]["block_size"],
        config["rms_norm_eps"],
    )
    weights = load_file(str(Path(out_dir) / "model.safetensors"))
    for name, value in rank_preferring_head_weights(lattice_config, rank).items():
        weights[f"lilicorr.{name}"] = value.contiguous()
    save_file(weights, str(Path(out_dir) / "model.safetensors"))
    make_constant_drafter(Path(out_dir), Path(target_dir), ranked_tokens)
    return Path(out_dir)


def build_constant_dflash(out_dir, target_dir, ranked_tokens):
    build_tiny_dflash_draft(out_dir, target_dir)
    make_constant_drafter(Path(out_dir), Path(target_dir), ranked_tokens)
    return out_dir


def attach_markov_head(draft_dir, target_dir, predicted_token, vocab_size=1024, strength=50.0,
                       **config_fields):
    """A Markov DeLS head (in `<draft_dir>/dels`) whose short logits put `strength` on
    `predicted_token` after any token, with a uniform prior."""
    from transformers import AutoTokenizer

    from vllm_liliprop.heads.dels import MarkovShortHead, UnigramPrior
    from vllm_liliprop.heads.dels_io import DelsConfig, save_dels_head, tokenizer_fingerprint

    head = MarkovShortHead(vocab_size, rank=4)
    with torch.no_grad():
        head.state_embed.weight.zero_()
        head.state_embed.weight[:, 0] = 1.0
        head.rank_to_vocab.weight.zero_()
        head.rank_to_vocab.weight[predicted_token, 0] = strength
    prior = UnigramPrior.from_counts(torch.zeros(vocab_size))
    fingerprint = tokenizer_fingerprint(AutoTokenizer.from_pretrained(target_dir))
    config = DelsConfig.for_head(head, prior, tokenizer_fingerprint=fingerprint, **config_fields)
    return save_dels_head(Path(draft_dir) / "dels", head, prior, config)


def attach_random_gru_head(draft_dir, target_dir, seed=0, vocab_size=1024):
    """A randomly initialised GRU DeLS head sharing the target's embeddings."""
    from transformers import AutoTokenizer

    from vllm_liliprop.heads.dels import GRUShortHead, UnigramPrior
    from vllm_liliprop.heads.dels_io import DelsConfig, save_dels_head, tokenizer_fingerprint

    torch.manual_seed(seed)
    embed = load_file(str(Path(target_dir) / "model.safetensors"))["model.embed_tokens.weight"]
    head = GRUShortHead(embed.float(), hidden_size=32, rank=16)
    prior = UnigramPrior.from_counts(torch.arange(vocab_size).float() % 7)
    fingerprint = tokenizer_fingerprint(AutoTokenizer.from_pretrained(target_dir))
    config = DelsConfig.for_head(head, prior, tokenizer_fingerprint=fingerprint)
    return save_dels_head(Path(draft_dir) / "dels", head, prior, config)


def build_tiny_dspark(out_dir, target_dir, *, sample_from_anchor=True, rank=8, strength=4.0,
                      seed=3, draft_ids=None, favourites=None, flat_drafter=False,
                      confidence_head=False, **config_fields):
    """An upstream-format `Qwen3DSparkModel` draft: the tiny random DFlash drafter plus a random
    Markov head whose bias (std about `strength` logits) moves many drafts off the drafter's
    argmax. draft_ids: a reduced draft vocabulary (ascending target ids; lm_head + d2t from the
    target's LM head). favourites: instead of a random head, one that adds `strength` to
    favourites[0] and strength - 1 to favourites[1] after any token. flat_drafter: the draft gets
    its own all-zero LM head, so every base logit is 0 and the head alone shapes the drafts.
    confidence_head: also ship upstream's acceptance-confidence head (with the Markov input).
    config_fields go to config.json (logit_scale, dspark_draft_topk, ...)."""
    from training.export import draft_vocab_tensors

    out_dir = Path(out_dir)
    build_tiny_dflash_draft(out_dir, target_dir, seed=seed)
    config = json.loads((out_dir / "config.json").read_text())
    vocab = config["vocab_size"]
    rows = vocab if draft_ids is None else len(draft_ids)
    generator = torch.Generator().manual_seed(seed + 100)
    weights = load_file(str(out_dir / "model.safetensors"))
    if favourites is None:
        w1 = torch.randn(vocab, rank, generator=generator)
        w2 = torch.randn(rows, rank, generator=generator) * (strength / rank ** 0.5)
    else:
        w1, w2 = torch.zeros(vocab, rank), torch.zeros(rows, rank)
        w1[:, 0] = 1.0
        index = list(range(vocab)) if draft_ids is None else list(draft_ids)
        w2[index.index(favourites[0]), 0] = strength
        w2[index.index(favourites[1]), 0] = strength - 1.0
    weights["markov_head.markov_w1.weight"] = w1.contiguous()
    weights["markov_head.markov_w2.weight"] = w2.contiguous()
    if draft_ids is not None:
        target = load_file(str(Path(target_dir) / "model.safetensors"))
        lm_head = target.get("lm_head.weight", target["model.embed_tokens.weight"])
        weights.update(draft_vocab_tensors(torch.tensor(sorted(draft_ids)), lm_head))
        config["draft_vocab_size"] = rows
    if confidence_head:
        weights["confidence_head.proj.weight"] = torch.randn(1, config["hidden_size"] + rank,
                                                             generator=generator)
        weights["confidence_head.proj.bias"] = torch.zeros(1)
        config.update({"enable_confidence_head": True, "confidence_head_with_markov": True})
    if flat_drafter:
        weights["lm_head.weight"] = torch.zeros(rows, config["hidden_size"])
        config["has_own_lm_head"] = True
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out_dir / "model.safetensors"))
    config.update({"architectures": ["Qwen3DSparkModel"], "markov_rank": rank,
                   "sample_from_anchor": sample_from_anchor, **config_fields})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return out_dir
