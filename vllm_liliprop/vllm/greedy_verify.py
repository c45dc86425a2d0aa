"""Greedy verification on CPU without vLLM's general path's full-vocabulary copies.

For an all-greedy batch, vLLM 0.32's rejection sampler gathers the bonus rows and the draft rows
of the target's logits into two new tensors, casts the draft rows to a new fp32 tensor, clones
it, and takes torch's argmax over it; the bonus rows go through the plain sampler (another fp32
copy, then vLLM's `greedy_argmax`). Each fresh full-vocabulary tensor pays its page faults: at
batch 16 and k = 3 that was ~11 ms a step on one CPU core (profile, issue 34) and 4.8 ms on two,
where a plain step's sampling costs ~0.5 ms. Here every row is reduced once by `cpu_argmax.row_argmax`
(vLLM's `greedy_argmax`, the op plain decoding itself samples with, over a reused fp32 buffer),
and vLLM's own greedy acceptance kernel writes the output.

It applies only where the general path's answer is those argmaxes: every request greedy, no
logprobs, no penalties, bad words or allowed-token masks, no thinking budget, and every
processor that can move an argmax idle (`IDLE_WHEN`); any other batch takes vLLM's path.
"""

from __future__ import annotations

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.logits_processor.builtin import LogitBiasLogitsProcessor, MinTokensLogitsProcessor
from vllm.v1.sample.rejection_sampler import PLACEHOLDER_TOKEN_ID, _rejection_greedy_sample

from vllm_liliprop.vllm.cpu_argmax import row_argmax

__all__ = ["IDLE_WHEN", "applies", "greedy_verify"]

# The argmax-moving processors vLLM builds for every engine, and when one changes nothing. A
# processor not listed here (a user's) sends the batch down vLLM's path.
IDLE_WHEN = {
    LogitBiasLogitsProcessor: lambda p: not p.biases,
    MinTokensLogitsProcessor: lambda p: not p.min_toks,
}


def _idle(processor) -> bool:
    test = IDLE_WHEN.get(type(processor))
    return test is not None and test(processor)


def applies(sampling_metadata, synthetic_mode: bool) -> bool:
    """Whether vLLM's rejection sampler would answer this batch with plain argmaxes."""
    m = sampling_metadata
    holder = m.thinking_budget_state_holder
    return (m.all_greedy and not synthetic_mode and m.max_num_logprobs is None
            and not m.logprob_token_ids and m.no_penalties and not m.bad_words_token_ids
            and m.allowed_token_ids_mask is None
            and (holder is None or not holder.has_tracked_requests())
            and all(_idle(p) for p in m.logitsprocs.non_argmax_invariant))


def greedy_verify(metadata, logits: torch.Tensor) -> SamplerOutput:
    """The rejection sampler's output for an all-greedy batch (`applies`): [batch, k + 1] int32."""
    ids = row_argmax(logits)
    batch = len(metadata.num_draft_tokens)
    output = torch.full((batch, metadata.max_spec_len + 1), PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
    bonus = ids[metadata.bonus_logits_indices].to(torch.int32).view(batch, 1)
    _rejection_greedy_sample(output, metadata.cu_num_draft_tokens, metadata.draft_token_ids,
                             ids[metadata.target_logits_indices], bonus, None, metadata.max_spec_len,
                             None, None)
    return SamplerOutput(sampled_token_ids=output, logprobs_tensors=None)
