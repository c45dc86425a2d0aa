"""DeLS-Spec short-context heads, unigram prior and logit fusion (pure torch, no vLLM).

DeLS-Spec (paper: /work/shared/papers/dels-spec.txt; public code: github dt-3t/DeLS-Spec) keeps a
trained DFlash drafter as the *long-context* expert and adds a small, independently trained
*short-context* head that sees only the local block prefix (the anchor and the tokens already
drafted in this block). For draft slot s and vocabulary item v the two experts are fused as

    fused_s(v) = long_s(v) + alpha_s * log_softmax(short_s)(v) - beta_s * log_prior(v)

  long_s   [.., V]  raw DFlash logits of slot s (any float dtype),
  short_s  [.., V]  raw logits of the short head given the committed prefix of slot s,
  log_prior [V]     log of the smoothed unigram prior of the target's training tokens,
  alpha_s, beta_s   calibration weights; the paper's default is alpha = beta = 0.3, and
                    alpha = beta = 0 is plain DFlash.

Why log_softmax on the short logits: the paper and the public runtime add the *raw* short
logits. The two differ only by logsumexp(short_s), which is constant over v, so argmax, softmax
and every DeLS draft rule are unchanged. The normalized form is what makes a path
score well defined when the short term is summed over slots (Viterbi over a lattice), so this
project uses it everywhere and the formula above is exact for all rules.

The prior is subtracted because both experts already carry the token-frequency bias (the
product of experts would count it twice; the paper's Appendix B).

Heads share one incremental protocol, used by the draft rules:

    state = head.init_state(batch)              # nothing consumed yet
    state = head.advance(token_ids[B], state)   # consume one committed token
    head.logits_from_state(state) -> [B, V]     # next-token short logits
    head.logits_at(state, ids[B, K]) -> [B, K]  # the same logits, only at the given ids
    head.step(token_ids, state) -> (logits, state)  # advance, then logits
    head.forward(prefix_ids[B, L]) -> [B, L, V] # teacher forcing: row t predicts token t+1
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

RANK_ACTIVATIONS = ("silu", "identity")

# Largest [rows, V] fp32 block materialized when building the Markov log-normalizer table.
_NORMALIZER_BLOCK_ELEMENTS = 1 << 26


def _check_token_ids(token_ids: torch.Tensor, name: str, dim: int | None = None) -> None:
    if not isinstance(token_ids, torch.Tensor) or token_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be an int32/int64 tensor of token ids, got {token_ids!r:.80}")
    if dim is not None and token_ids.dim() != dim:
        raise ValueError(f"{name} must have {dim} dims, got shape {tuple(token_ids.shape)}")


class GRUShortHead(nn.Module):
    """Short head of the paper's RNN variant.

    token ids -> frozen target embedding [V, D] -> one-layer bias-free GRU (hidden H)
    -> bias-free projection to rank r -> SiLU -> bias-free up-projection to V logits.

    The embedding table is registered as a non-persistent buffer: it is not trained, not in
    `state_dict()` (so checkpoints do not duplicate the target's table) and, when the caller
    passes the target's weight, it shares the target's storage. Looked-up rows are cast to
    the GRU's dtype, so a bf16 target table can feed an fp32 head without a copy of the table.

    State: float [B, H] (the GRU hidden state; zeros before any token is consumed).

    `rank_activation="identity"` exists only to run checkpoints of the public DeLS-Spec
    runtime that were trained without the SiLU.
    """

    kind = "gru"

    def __init__(
        self,
        embed_weight: torch.Tensor | nn.Embedding,
        hidden_size: int,
        rank: int,
        rank_activation: str = "silu",
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        if isinstance(embed_weight, nn.Embedding):
            embed_weight = embed_weight.weight
        if not isinstance(embed_weight, torch.Tensor) or embed_weight.dim() != 2:
            raise ValueError("embed_weight must be a [vocab_size, embed_dim] tensor or an nn.Embedding")
        if hidden_size <= 0 or rank <= 0:
            raise ValueError(f"hidden_size and rank must be positive, got {hidden_size} and {rank}")
        if rank_activation not in RANK_ACTIVATIONS:
            raise ValueError(f"rank_activation={rank_activation!r}; choose one of {RANK_ACTIVATIONS}")
        self.vocab_size, self.embed_dim = (int(n) for n in embed_weight.shape)
        self.hidden_size = int(hidden_size)
        self.rank = int(rank)
        self.rank_activation = rank_activation
        factory = {"device": device, "dtype": dtype}
        self.register_buffer("embed_weight", embed_weight.detach(), persistent=False)
        self.gru = nn.GRU(self.embed_dim, self.hidden_size, num_layers=1, bias=False,
                          batch_first=True, **factory)
        self.to_rank = nn.Linear(self.hidden_size, self.rank, bias=False, **factory)
        self.rank_to_vocab = nn.Linear(self.rank, self.vocab_size, bias=False, **factory)

    def _embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.embed_weight).to(self.gru.weight_ih_l0.dtype)

    def _rank_state(self, hidden: torch.Tensor) -> torch.Tensor:
        rank_state = self.to_rank(hidden)
        return F.silu(rank_state) if self.rank_activation == "silu" else rank_state

    def forward(self, prefix_ids: torch.Tensor) -> torch.Tensor:
        """Teacher forcing. prefix_ids [B, L] int -> logits [B, L, V] (head dtype);
        logits[:, t] are the short logits after consuming prefix_ids[:, : t + 1]."""
        _check_token_ids(prefix_ids, "prefix_ids", dim=2)
        hidden, _ = self.gru(self._embed(prefix_ids))
        return self.rank_to_vocab(self._rank_state(hidden))

    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> torch.Tensor:
        weight = self.gru.weight_hh_l0
        return torch.zeros(batch_size, self.hidden_size, dtype=weight.dtype,
                           device=weight.device if device is None else device)

    def advance(self, token_ids: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """token_ids [B] int, state [B, H] -> new state [B, H]."""
        _check_token_ids(token_ids, "token_ids", dim=1)
        _, hidden = self.gru(self._embed(token_ids)[:, None, :], state[None].contiguous())
        return hidden[0]

    def logits_from_state(self, state: torch.Tensor) -> torch.Tensor:
        """state [B, H] -> logits [B, V] (head dtype)."""
        return self.rank_to_vocab(self._rank_state(state))

    def rank_features(self, state: torch.Tensor) -> torch.Tensor:
        """state [B, H] -> [B, r]: what `rank_to_vocab` projects to the logits."""
        return self._rank_state(state)

    def logits_at(self, state: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """state [B, H], token_ids [B, K] -> fp32 logits [B, K] at those ids only (no V-wide work)."""
        _check_token_ids(token_ids, "token_ids", dim=2)
        rank_state = self._rank_state(state).float()
        rows = F.embedding(token_ids, self.rank_to_vocab.weight).float()  # [B, K, r]
        return torch.matmul(rows, rank_state[:, :, None])[..., 0]

    def step(self, token_ids: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Consume token_ids [B]; return (logits [B, V], new state [B, H])."""
        state = self.advance(token_ids, state)
        return self.logits_from_state(state), state


class MarkovShortHead(nn.Module):
    """Short head of the paper's Markov variant: short_logits(x | prev) = E_M[prev] @ W_M^T,
    with E_M, W_M in R^{V x r} (`state_embed.weight` and `rank_to_vocab.weight`).

    State: int64 [B], the last consumed token (-1 before any token; asking for logits then is
    a caller error).

    Because the logits depend on the previous token alone, its log-normalizer
    logsumexp_v(E_M[prev] @ W_M[v]) is a fixed [V] table. `log_normalizer_table()` builds it
    once (V x V x r work, chunked) and caches it; the cache is keyed on the weights' storage
    and version counters, so optimizer steps and `load_state_dict` invalidate it.
    """

    kind = "markov"

    def __init__(self, vocab_size: int, rank: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if vocab_size <= 0 or rank <= 0:
            raise ValueError(f"vocab_size and rank must be positive, got {vocab_size} and {rank}")
        self.vocab_size = int(vocab_size)
        self.rank = int(rank)
        factory = {"device": device, "dtype": dtype}
        self.state_embed = nn.Embedding(self.vocab_size, self.rank, **factory)
        self.rank_to_vocab = nn.Linear(self.rank, self.vocab_size, bias=False, **factory)
        self._normalizer_cache: tuple[tuple, torch.Tensor] | None = None

    def pair_logits(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """prev_ids [...] int -> logits [..., V] (head dtype) of the token after each prev id."""
        _check_token_ids(prev_ids, "prev_ids")
        return self.rank_to_vocab(self.state_embed(prev_ids))

    def transition_logits(self, prev_ids: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """prev_ids [..., I], next_ids [..., J] -> fp32 [..., I, J]: short logit of next_ids[..., j]
        after prev_ids[..., i]. Only I*J*r work; leading dims must match."""
        _check_token_ids(prev_ids, "prev_ids")
        _check_token_ids(next_ids, "next_ids")
        prev_states = self.state_embed(prev_ids).float()  # [..., I, r]
        next_rows = F.embedding(next_ids, self.rank_to_vocab.weight).float()  # [..., J, r]
        return torch.matmul(prev_states, next_rows.transpose(-1, -2))

    def forward(self, prefix_ids: torch.Tensor) -> torch.Tensor:
        """Teacher forcing. prefix_ids [B, L] -> logits [B, L, V]; row t depends on prefix_ids[:, t]."""
        _check_token_ids(prefix_ids, "prefix_ids", dim=2)
        return self.pair_logits(prefix_ids)

    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> torch.Tensor:
        device = self.state_embed.weight.device if device is None else device
        return torch.full((batch_size,), -1, dtype=torch.long, device=device)

    def advance(self, token_ids: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        _check_token_ids(token_ids, "token_ids", dim=1)
        return token_ids.long()

    def logits_from_state(self, state: torch.Tensor) -> torch.Tensor:
        return self.pair_logits(state)

    def rank_features(self, state: torch.Tensor) -> torch.Tensor:
        """state [B] -> [B, r]: what `rank_to_vocab` projects to the logits."""
        return self.state_embed(state)

    def logits_at(self, state: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """state [B], token_ids [B, K] -> fp32 [B, K]."""
        _check_token_ids(token_ids, "token_ids", dim=2)
        return self.transition_logits(state[:, None], token_ids)[:, 0, :]

    def step(self, token_ids: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        state = self.advance(token_ids, state)
        return self.logits_from_state(state), state

    def _weights_key(self) -> tuple:
        key = []
        for weight in (self.state_embed.weight, self.rank_to_vocab.weight):
            try:
                version = weight._version
            except RuntimeError:  # inference tensors carry no version counter
                version = -1
            key.append((weight.data_ptr(), version, weight.device, weight.dtype))
        return tuple(key)

    @torch.no_grad()
    def log_normalizer_table(self) -> torch.Tensor:
        """fp32 [V]: logsumexp over v of pair_logits(prev)[v], for every prev token (cached)."""
        key = self._weights_key()
        if self._normalizer_cache is not None and self._normalizer_cache[0] == key:
            return self._normalizer_cache[1]
        states = self.state_embed.weight.float()
        vocab_rows = self.rank_to_vocab.weight.float()
        table = torch.empty(self.vocab_size, dtype=torch.float32, device=states.device)
        rows_per_block = max(1, _NORMALIZER_BLOCK_ELEMENTS // self.vocab_size)
        for start in range(0, self.vocab_size, rows_per_block):
            block = states[start:start + rows_per_block] @ vocab_rows.T
            table[start:start + rows_per_block] = torch.logsumexp(block, dim=-1)
        self._normalizer_cache = (key, table)
        return table

    def log_normalizer(self, prev_ids: torch.Tensor) -> torch.Tensor:
        """prev_ids [...] -> fp32 [...]: logsumexp of the short logits after each prev id."""
        _check_token_ids(prev_ids, "prev_ids")
        return self.log_normalizer_table()[prev_ids]


class SubVocabShortHead:
    """A short head whose logits cover only `vocab_ids` [N] (ascending target ids): the draft
    vocabulary of a DFlash draft with a reduced vocabulary, outside which the drafter's logits
    are -inf and no token can be drafted.

    Over those ids the DeLS rules are unchanged: log_softmax over N instead of V differs by a
    constant per slot, which changes no argmax, no softmax and no path comparison (each path has
    one token per slot). What changes is the cost: the V-wide projection, log-softmax, fusion and
    argmax of every slot run over N. States are the wrapped head's; `advance` takes target ids.
    """

    def __init__(self, head, vocab_ids: torch.Tensor):
        if vocab_ids.dim() != 1 or vocab_ids.numel() == 0:
            raise ValueError("vocab_ids must be a non-empty 1-D tensor of target ids")
        self.head, self.vocab_ids = head, vocab_ids.long()
        self.kind, self.vocab_size = head.kind, int(vocab_ids.numel())
        # Gathered once at load: the rows of the projection the draft can use.
        self.weight = head.rank_to_vocab.weight.detach()[self.vocab_ids].contiguous()

    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> torch.Tensor:
        return self.head.init_state(batch_size, device)

    def advance(self, token_ids: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.head.advance(token_ids, state)

    def logits_from_state(self, state: torch.Tensor) -> torch.Tensor:
        """state -> logits [B, N] (head dtype) at vocab_ids."""
        return F.linear(self.head.rank_features(state), self.weight)


def count_tokens(token_ids: torch.Tensor, loss_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """int64 [V] counts of token_ids where loss_mask is nonzero (same shape, any layout).

    Sum these over a corpus and pass the total to `UnigramPrior.from_counts`."""
    _check_token_ids(token_ids, "token_ids")
    if loss_mask.shape != token_ids.shape:
        raise ValueError(f"loss_mask shape {tuple(loss_mask.shape)} must equal token_ids shape "
                         f"{tuple(token_ids.shape)}")
    kept = token_ids[loss_mask.bool()].long()
    if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= vocab_size):
        raise ValueError(f"token_ids under the loss mask must lie in [0, vocab_size={vocab_size}); "
                         f"got range [{int(kept.min())}, {int(kept.max())}]")
    return torch.bincount(kept, minlength=vocab_size)


class UnigramPrior:
    """Log unigram prior over the vocabulary (the paper's Appendix A).

    With c(v) the count of v among loss-masked (supervised) training tokens, N = sum c and
    additive smoothing lambda:  log p(v) = log((c(v) + lambda) / (N + lambda * V)).

    `log_probs`: fp32 [V]. `smoothing`: the lambda used, or None when built from log-probs.
    """

    def __init__(self, log_probs: torch.Tensor, smoothing: float | None = None):
        if not isinstance(log_probs, torch.Tensor) or log_probs.dim() != 1 or log_probs.numel() == 0:
            raise ValueError("log_probs must be a non-empty 1-D tensor [vocab_size]")
        if not bool(torch.isfinite(log_probs).all()):
            raise ValueError("log_probs must be finite; build the prior with smoothing > 0")
        self.log_probs = log_probs.float()
        self.smoothing = smoothing

    @property
    def vocab_size(self) -> int:
        return self.log_probs.numel()

    @classmethod
    def from_counts(cls, counts: torch.Tensor, smoothing: float = 1.0) -> "UnigramPrior":
        """counts [V] (non-negative) -> prior with additive smoothing `smoothing`."""
        counts = torch.as_tensor(counts)
        if counts.dim() != 1 or counts.numel() == 0:
            raise ValueError(f"counts must be a non-empty 1-D tensor [vocab_size], got shape {tuple(counts.shape)}")
        if smoothing < 0:
            raise ValueError(f"smoothing={smoothing} must be >= 0 (1.0 is the paper's default)")
        counts = counts.to(torch.float64)
        if bool((counts < 0).any()):
            raise ValueError("counts must be non-negative")
        smoothed = counts + float(smoothing)
        if bool((smoothed <= 0).any()):
            raise ValueError("smoothing=0 leaves zero-count tokens at log p = -inf; use smoothing > 0")
        log_probs = torch.log(smoothed) - torch.log(smoothed.sum())
        return cls(log_probs.float(), smoothing=float(smoothing))

    @classmethod
    def from_token_ids(cls, token_ids: torch.Tensor, loss_mask: torch.Tensor, vocab_size: int,
                       smoothing: float = 1.0) -> "UnigramPrior":
        return cls.from_counts(count_tokens(token_ids, loss_mask, vocab_size), smoothing)

    def to(self, device: torch.device | str) -> "UnigramPrior":
        return UnigramPrior(self.log_probs.to(device), self.smoothing)


# alpha or beta: one weight for every slot, or one per slot (a list, or a device tensor [S]).
Schedule = float | Sequence[float] | torch.Tensor


def check_fusion_weight(value, name: str) -> float | list[float]:
    """alpha or beta as a head's config.json or a draft option gives it: a number, or a
    non-empty list of numbers (one per draft slot), all finite -> float or list of floats.
    ValueError naming `name` otherwise; JSON readers accept NaN and Infinity, and either would
    turn every fused score non-finite."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    is_list = isinstance(value, (list, tuple)) and bool(value) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if not (is_number or is_list):
        raise ValueError(f"{name} = {value!r} must be a number or a non-empty list of numbers "
                         "(one per draft slot)")
    try:
        weights = [float(v) for v in value] if is_list else [float(value)]
    except OverflowError:  # an int past float's range, e.g. 1 followed by 400 zeros
        weights = [math.inf]
    if not all(math.isfinite(v) for v in weights):
        raise ValueError(f"{name} = {value!r} must be finite; use e.g. 0.3")
    return weights if is_list else weights[0]


def slot_weights(value: float | Sequence[float], num_slots: int, name: str,
                 proposer: str = "the drafter") -> list[float]:
    """A checked weight (`check_fusion_weight`) as `num_slots` per-slot weights: a number for
    every slot; a longer list (trained for a larger block) cut to its first num_slots entries;
    a shorter one is a ValueError."""
    if isinstance(value, (int, float)):
        return [float(value)] * num_slots
    if len(value) < num_slots:
        raise ValueError(f"{name} has {len(value)} per-slot weights but {proposer} proposes "
                         f"{num_slots} tokens; give one number or >= {num_slots} entries")
    return [float(v) for v in value[:num_slots]]


def check_prefix_len(pure_draft_prefix_len: int) -> None:
    if pure_draft_prefix_len not in (0, 1):
        raise ValueError(f"pure_draft_prefix_len={pure_draft_prefix_len!r} must be 0 (correct every "
                         "slot, short head reads the anchor) or 1 (public DeLS-Spec layout)")


def slot_schedule(value: Schedule, num_slots: int, name: str, device: torch.device | str,
                  pure_draft_prefix_len: int = 0) -> torch.Tensor:
    """The weights a draft step applies: a weight or a per-slot list/tensor -> fresh fp32 [S],
    with the pure-draft slots < P set to 0."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number or a per-slot schedule, got a bool")
    if isinstance(value, (int, float)):
        weights = torch.full((num_slots,), float(value), dtype=torch.float32, device=device)
    else:
        weights = torch.as_tensor(value, dtype=torch.float32).to(device).reshape(-1).clone()
        if torch.as_tensor(value).dim() > 1 or weights.numel() not in (1, num_slots):
            raise ValueError(f"{name} must be a number or a schedule of {num_slots} per-slot "
                             f"weights (one per speculative token), got {weights.numel()} entries")
        weights = weights.expand(num_slots).clone()
    weights[:pure_draft_prefix_len] = 0.0
    return weights


def _fusion_weight(value, name: str, long_logits: torch.Tensor, dtype: torch.dtype):
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number or a per-slot schedule, got a bool")
    if isinstance(value, (int, float)):
        return float(value)
    weight = torch.as_tensor(value, dtype=dtype, device=long_logits.device)
    if weight.dim() == 0:
        return weight
    if weight.dim() != 1:
        raise ValueError(f"{name} must be a number, a 0-dim tensor or a 1-D per-slot schedule [S], "
                         f"got shape {tuple(weight.shape)}")
    if long_logits.dim() < 2 or long_logits.shape[-2] != weight.shape[0]:
        raise ValueError(f"{name} has {weight.shape[0]} per-slot entries but long_logits has shape "
                         f"{tuple(long_logits.shape)}; a per-slot schedule needs long_logits laid out "
                         f"[..., S, V] with S == len({name}); pass {name}[s] to fuse a single slot")
    return weight[:, None]


def dels_fuse(long_logits: torch.Tensor, short_logits: torch.Tensor, log_prior: torch.Tensor,
              alpha: float | Sequence[float] | torch.Tensor,
              beta: float | Sequence[float] | torch.Tensor) -> torch.Tensor:
    """fused = long + alpha * log_softmax(short, -1) - beta * log_prior.

    long_logits  [..., V] any float dtype; with a per-slot schedule it must be [..., S, V].
    short_logits raw short-head logits broadcastable to long_logits (finite).
    log_prior    [V].
    alpha, beta  each one of:
      - a Python number or a 0-dim tensor: the same weight for every element;
      - a 1-D schedule (list, tuple or tensor) of length S: weight s applies to slot s, i.e.
        the schedule is viewed as [S, 1] and broadcast against [..., S, V] -- it indexes
        dim -2 of long_logits, for every leading batch index. A 1-D schedule is rejected
        unless long_logits.dim() >= 2 and long_logits.shape[-2] == S (a [B, V] single slot
        takes the 0-dim alpha[s] instead).
    Returns fp32 (fp64 if long_logits is fp64), shape = broadcast of long and short.
    With alpha = beta = 0 the result equals long_logits exactly (upcast).
    """
    vocab_size = long_logits.shape[-1]
    if short_logits.shape[-1] != vocab_size:
        raise ValueError(f"short_logits has {short_logits.shape[-1]} vocabulary entries, long_logits "
                         f"{vocab_size}; the short head must be built for the drafter's vocabulary")
    if log_prior.dim() != 1 or log_prior.shape[0] != vocab_size:
        raise ValueError(f"log_prior must be [V={vocab_size}], got shape {tuple(log_prior.shape)}; "
                         "rebuild the prior for this vocabulary")
    dtype = torch.promote_types(long_logits.dtype, torch.float32)
    alpha = _fusion_weight(alpha, "alpha", long_logits, dtype)
    beta = _fusion_weight(beta, "beta", long_logits, dtype)
    short_log_probs = torch.log_softmax(short_logits.to(dtype), dim=-1)
    return long_logits.to(dtype) + alpha * short_log_probs - beta * log_prior.to(dtype)
