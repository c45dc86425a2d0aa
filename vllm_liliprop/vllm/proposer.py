"""`LiliPropProposer`: vLLM's V1 DFlash proposer with the draft choice handed to a draft rule.

Only these things differ from `DFlashProposer`:
- `__init__` refuses a heterogeneous vocabulary (`use_heterogeneous_vocab`) when a rule runs;
- `load_model` first reads the draft's weight headers, so that a damaged file is refused naming
  it, and explains vLLM's shape errors by the checkpoint tensors (draft_files.py); it also
  builds the draft rule named by the options (lattice head, DeLS head, DSpark's
  Markov head read from the checkpoint's `markov_head.*` tensors, ...);
- `set_inputs_first_pass` also remembers each request's anchor token and, when the rule needs it,
  the target state at the last verified position (the LiLiCorr anchor). For a DSpark draft with
  `sample_from_anchor` (upstream's default) it builds upstream's anchor layout instead of
  DFlash's fill-in block: N queries [anchor, mask x (N-1)], all N of them sampled;
- `_sample_draft_tokens` asks the rule for the block instead of taking each slot's argmax.
  Rows the rule could not score get the drafter's argmax on the device (rules/fallback.py):
  the step reads nothing back to the host;
- with the `prompt_lookup` option (the hybrid rule), a step that drafts also looks each
  request's last tokens up in its own history (prompt_lookup.py; one host read of the verified
  tokens a step, from what `prepare_next_token_ids_padded` was given), and
  `_sample_draft_tokens` puts the continuation it found in place of the rule's block for those
  requests; with `rule_draft_length`, the rule's block is cut to
  that many slots (the lookup's continuation keeps all k) and vLLM verifies only those
  (draft_length.py); with `draft_confidence_floor`, each greedy request's block is cut further
  where the drafter's probability that it is right so far falls below the floor
  (draft_length.confident_cut);
- `propose` at k = 0 (a speculation schedule's plain step), and in a hybrid step where every
  request drafts its lookup continuation, skips the drafter's pass over the queries, whose block
  would be discarded, and keeps the step's context for the next pass that writes context, which
  writes its K/V first (deferred_context.py); at a k below the configured one (a
  schedule's pick), a rule's drafter still queries its trained block and keeps the first k slots
  (draft_length.queried_masks: a shorter block drafts worse);
- `_greedy_sample` (vLLM's per-slot argmax) takes the argmax over the draft's own vocabulary
  in fp32, then maps it to target ids: the same tokens as vLLM's scatter-then-argmax, without
  materialising and scanning full-vocabulary bf16 logits (draft_greedy.py).
With no options (a plain DFlash checkpoint, no environment override) the rule is None and every
other method is the parent's, so drafts are exactly vLLM's. An engine started with this plugin
left out of `VLLM_PLUGINS` gets vLLM's own proposer instead (`VllmDFlashProposer`,
stock_dflash.py), even in a process where another engine registered the plugin.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from typing_extensions import override
from vllm.logger import init_logger
from vllm.v1.spec_decode.dflash import DFlashProposer

from vllm_liliprop.draft_files import explain_load_error, tensor_shapes
from vllm_liliprop.draft_length import (NO_DRAFT, confident_cut, cut_drafts, kept_length, pad_drafts,
                                        queried_masks, rule_slots, short_block_advice)
from vllm_liliprop.heads.candidate_vocab import read_candidate_vocab
from vllm_liliprop.heads.dels_io import tokenizer_fingerprint
from vllm_liliprop.heads.dspark import MARKOV_PREFIX
from vllm_liliprop.options import DSPARK_ARCH, resolve_options
from vllm_liliprop.prompt_lookup import lookup_drafts
from vllm_liliprop.rules import DraftInputs, argmax_drafts
from vllm_liliprop.rules.factory import RuleResources, build_rule
from vllm_liliprop.rules.fallback import FaultCounter, apply_fallback, replace_rows
from vllm_liliprop.sampled_drafts import cut_sampled_rows, sampled_k_at, sampled_never_draft
from vllm_liliprop.vllm import rule_health
from vllm_liliprop.vllm.acceptance_tracker import AcceptanceTracker
from vllm_liliprop.vllm.block_events import block_events, departed_requests
from vllm_liliprop.vllm.deferred_context import DeferredContext, context_slots, request_rows
from vllm_liliprop.vllm.draft_greedy import (DraftVocabArgmax, candidate_vocab_logits, draft_vocab_ids,
                                              draft_vocab_logits)
from vllm_liliprop.vllm.stock_dflash import liliprop_allowed, vllm_dflash_class

logger = init_logger("vllm.liliprop.proposer")


def read_head_weights(draft_dir: Path, prefix: str) -> dict[str, torch.Tensor]:
    """The tensors of one head (`lilicorr.`: the LiLiCorr head, `markov_head.`: DSpark's) from
    the checkpoint files, named without `model.` and `prefix`. vLLM's loader has checked their
    coverage; its in-memory copies may already be repacked for the CPU GEMM kernels."""
    state: dict[str, torch.Tensor] = {}
    for path in sorted(draft_dir.glob("*.safetensors")):
        for name, value in load_file(str(path)).items():
            name = name.removeprefix("model.")
            if name.startswith(prefix):
                state[name.removeprefix(prefix)] = value
    return state


def samples_from_anchor(hf_config) -> bool:
    """Whether a DSpark draft uses upstream's anchor layout: N queries [anchor, mask x (N-1)],
    every one predicting the next token (`sample_from_anchor`, True when absent, as upstream).
    False, and any other draft: DFlash's 1 + N fill-in layout."""
    if DSPARK_ARCH not in (getattr(hf_config, "architectures", None) or []):
        return False
    return bool(getattr(hf_config, "sample_from_anchor", True))


def refuse_heterogeneous_vocab(speculative_config) -> None:
    """A draft rule needs the draft's logits in target ids. A draft with its own tokenizer
    (`use_heterogeneous_vocab`) gets them mapped only inside vLLM's `_greedy_sample` /
    `_sample_draft_tokens`, which a rule replaces, so its drafts would be ids of the wrong
    vocabulary: refuse at engine start. vLLM 0.32 itself accepts the flag only with
    method='draft_model' (never for DFlash); this holds if a later vLLM allows it. A reduced
    vocabulary of the target's own tokenizer (`draft_vocab_size` + `d2t`) is mapped by the
    draft's `compute_logits` and is served."""
    if getattr(speculative_config, "use_heterogeneous_vocab", False):
        raise ValueError(
            "speculative_config.use_heterogeneous_vocab = True (a draft with its own tokenizer) "
            "cannot run a vllm-liliprop draft rule, whose drafts must be target token ids; "
            "use a draft trained with the target's tokenizer (a reduced vocabulary via "
            "draft_vocab_size + d2t is fine), or serve this draft without a rule (no "
            "dflash_config.liliprop block, VLLM_LILIPROP_OPTIONS unset, not a LiLiCorrDraftModel)."
        )


def check_rule_draft_length(length: int | None, speculative_config, scheduler_config) -> None:
    """`rule_draft_length` cuts drafts through the host lists vLLM hands its scheduler
    (draft_length.py): refuse it, at engine start, where those lists are not used or where it
    cuts nothing."""
    if length is None:
        return
    _refuse_async_scheduling(f"liliprop.rule_draft_length = {length}", scheduler_config)
    k = int(speculative_config.num_speculative_tokens)
    if length >= k:
        raise ValueError(
            f"liliprop.rule_draft_length = {length} keeps every one of the "
            f"num_speculative_tokens = {k} slots: use a length below k (k long for the prompt "
            "lookup, e.g. k = 7 with rule_draft_length = 3), or leave it out.")


def check_sampled_k_for_engine(ranges, speculative_config, scheduler_config) -> None:
    """`sampled_k` cuts drafts as rule_draft_length does: refuse it at engine start where the
    host lists are not used or where no range cuts anything."""
    if ranges is None:
        return
    option = f"liliprop.sampled_k = {[list(r) for r in ranges]}"
    _refuse_async_scheduling(option, scheduler_config)
    k = int(speculative_config.num_speculative_tokens)
    if all(r[2] >= k for r in ranges):
        raise ValueError(f"{option} lets sampled requests draft every one of the "
                         f"num_speculative_tokens = {k} slots at every batch size it names: give "
                         "some batch sizes a k below it (0: no draft), or leave sampled_k out.")


def _refuse_async_scheduling(option: str, scheduler_config) -> None:
    if getattr(scheduler_config, "async_scheduling", False):
        raise ValueError(
            f"{option} shortens drafts through the scheduler's host copy, which async scheduling "
            "skips; start the engine with async_scheduling=False (vLLM's CPU platform always "
            "does), or leave the option out.")


def _target_language_model(target_model: torch.nn.Module) -> torch.nn.Module:
    if hasattr(target_model, "get_language_model"):
        return target_model.get_language_model()
    return target_model


def cached_block_size(vllm_config) -> int | None:
    """The KV block size where vLLM's prefix cache may keep and share blocks, else None."""
    cache = getattr(vllm_config, "cache_config", None)
    return int(cache.block_size) if cache is not None and cache.enable_prefix_caching else None


def plain_step_next_tokens(sampled_token_ids: torch.Tensor, discard_request_mask: torch.Tensor,
                           vocab_size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(next_token_ids, valid_sampled_tokens_count) of a CPU step that verified no draft and
    discarded no request: each row's one sampled token, and 1. That is exactly what vLLM's
    prepare_next_token_ids_padded returns there, without its per-request host loop over every
    request's backup token, which only a discarded row reads. (With context_slots: 0.08 ms of a
    plain step's 1.1 ms of proposer work at batch 32 on 2 cores; docs/measurements-smollm2.md.)
    None elsewhere, and on a GPU, where checking for discarded rows would cost a host sync the
    parent avoids."""
    if sampled_token_ids.device.type != "cpu" or sampled_token_ids.shape[1] != 1:
        return None
    tokens = sampled_token_ids[:, 0]
    if bool(discard_request_mask[: tokens.shape[0]].any()) or not bool(
            ((tokens >= 0) & (tokens < vocab_size)).all()):
        return None
    return tokens.to(torch.int32), torch.ones_like(tokens, dtype=torch.int32)


class LiliPropProposer(DFlashProposer):
    # Steps without a drafter block (k = 0, or every request drafting its lookup) write the
    # context K/V only (False: vLLM's full query pass; tests and tools/step_cost.py compare).
    skip_plain_step_queries = True
    # Those steps' context K/V written by the next pass that writes context, in one projection
    # (deferred_context.py; False: at once, every step).
    defer_plain_step_context = True
    # Those steps handed over by the runner without vLLM's path to `propose` (keep_plain_step;
    # False: vLLM's path, as tests compare).
    plain_steps_from_runner = True

    def __new__(cls, *args, **kwargs):
        if cls is LiliPropProposer and not liliprop_allowed():
            logger.info("VLLM_PLUGINS leaves out vllm-liliprop: this engine runs vLLM's own "
                        "DFlashProposer")
            cls = VllmDFlashProposer
        return super().__new__(cls)

    def __init__(self, vllm_config, device: torch.device, runner=None):
        super().__init__(vllm_config, device, runner)
        spec = vllm_config.speculative_config
        hf_config = self.draft_model_config.hf_config
        self.liliprop_options = resolve_options(
            getattr(hf_config, "architectures", None),
            self.dflash_config,
            getattr(spec, "draft_sample_method", None),
        )
        self.draft_rule = None
        self.num_rule_faults_raised = 0  # rows of the steps in which the rule raised
        self.num_rule_raises = 0  # those steps
        self.num_draft_rows = 0  # rows the rule was asked to draft (vLLM's metrics: rule_health)
        self._faulty_rows = FaultCounter(
            lambda count: self._warn_fault(f"produced non-finite scores for {count} request(s)")
        )
        # Each rule's drafts against the drafter's argmax on the verified tokens (rule_health).
        self._acceptance: AcceptanceTracker | None = None
        self._acceptance_on = True
        self._anchor_ids: torch.Tensor | None = None
        self._anchor_hidden: torch.Tensor | None = None
        self._anchor_valid: torch.Tensor | None = None
        self._draft_argmax: DraftVocabArgmax | None = None
        self._draft_vocab_logits = None
        self.anchor_layout = samples_from_anchor(hf_config)
        # The hybrid rule: (min_n, max_n) of the prompt lookup, this step's (ids, found) rows.
        self._lookup_lengths = getattr(self.liliprop_options, "prompt_lookup", None)
        self._lookup: tuple[torch.Tensor, torch.Tensor] | None = None
        self._lookup_inputs: tuple | None = None  # prepare_next_token_ids_padded's, for the lookup
        self.num_lookup_rows = 0  # rows whose draft came from the lookup
        self.num_context_only_steps = 0  # steps that skipped the drafter's query pass
        self.num_lookup_only_steps = 0  # of those, steps whose every row drafted its lookup
        self._max_k = int(self.num_speculative_tokens)  # the configured k (a schedule's maximum)
        self._verified_k = self._max_k  # the k this step verifies (a schedule's pick)
        self._deferred = DeferredContext(kv_block_size=cached_block_size(vllm_config))
        self.num_schedule_faults = 0  # steps whose KV blocks observe_schedule could not follow
        self._step_req_ids: list[str] | None = None  # this step's batch, in order
        self._decode_rows = torch.empty(0, dtype=torch.int64)  # _rows_of_decode_step's arange
        self._rule_draft_length = getattr(self.liliprop_options, "rule_draft_length", None)
        self._sampled_k = getattr(self.liliprop_options, "sampled_k", None)
        self._confidence_floor = getattr(self.liliprop_options, "draft_confidence_floor", None)
        self._warned_no_confidence = False
        self.num_sampled_plain_steps = 0  # steps whose every request was sampled at k = 0
        # Sampled requests never draft at any batch size: their context pass can go too.
        self._sampled_skip_context = self._sampled_k is not None and sampled_never_draft(
            self._sampled_k, int(vllm_config.scheduler_config.max_num_seqs))
        self.num_sampled_context_skips = 0  # of those steps, ones without the context pass
        if self.liliprop_options is not None:
            refuse_heterogeneous_vocab(spec)
            check_rule_draft_length(self._rule_draft_length, spec, vllm_config.scheduler_config)
            check_sampled_k_for_engine(self._sampled_k, spec, vllm_config.scheduler_config)
            if self._confidence_floor is not None:
                _refuse_async_scheduling(f"liliprop.draft_confidence_floor = {self._confidence_floor}",
                                         vllm_config.scheduler_config)
            logger.info(
                "vllm-liliprop serves this draft: %s (sources: %s)",
                self.liliprop_options.to_dict(),
                self.liliprop_options.sources or "defaults",
            )

    @override
    def load_model(self, target_model: torch.nn.Module) -> None:
        draft_path = Path(self.draft_model_config.model)
        local = draft_path.is_dir()
        if local:
            tensor_shapes(draft_path)  # a damaged weight file names itself before vLLM reads it
        try:
            super().load_model(target_model)
        except (AssertionError, ValueError, RuntimeError) as error:
            explained = explain_load_error(draft_path, error) if local else None
            if explained is None:
                raise
            raise ValueError(explained) from error
        self._draft_argmax = DraftVocabArgmax.for_model(
            self.model, vllm_paths=self.use_local_argmax_reduction or self.use_heterogeneous_vocab
        )
        self._advise_trained_block()
        if self.liliprop_options is None:
            return
        language_model = _target_language_model(target_model)
        inner = getattr(language_model, "model", language_model)
        embedding = getattr(inner, "embed_tokens", None)
        hf_config = self.draft_model_config.hf_config
        has_head = getattr(getattr(self.model, "model", None), "lilicorr", None) is not None
        resources = RuleResources(
            draft_dir=draft_path if local else None,
            vocab_size=int(hf_config.vocab_size),
            device=self.device,
            dtype=self.dtype,
            embed_weight=None if embedding is None else embedding.weight,
            dflash_config=dict(self.dflash_config),
            block_size=int(
                self.dflash_config.get("block_size", getattr(hf_config, "block_size", 0)) or 0
            ),
            num_slots=int(self.num_speculative_tokens),
            draft_hidden_size=int(hf_config.hidden_size),
            rms_norm_eps=float(getattr(hf_config, "rms_norm_eps", 1e-6)),
            lattice_state_dict=read_head_weights(draft_path, "lilicorr.") if has_head else None,
            tokenizer_fingerprint=(
                self._tokenizer_fingerprint() if self.liliprop_options.uses_dels else None
            ),
            draft_vocab_ids=None,
            markov_state_dict=(
                self._markov_weights(draft_path) if self.liliprop_options.rule == "dspark" else None
            ),
            draft_hf_config=hf_config.to_dict(),
        )
        resources.draft_vocab_ids, self._draft_vocab_logits = self._scored_vocabulary(
            resources.draft_dir, has_head
        )
        self.draft_rule = build_rule(self.liliprop_options, resources)
        self._embedding = embedding
        self._needs_anchor_hidden = bool(getattr(self.draft_rule, "needs_anchor_hidden", False))
        self._acceptance = AcceptanceTracker()
        rule_health.register_source(self)
        logger.info("vllm-liliprop draft rule ready: %s", self.draft_rule.name)

    def _scored_vocabulary(self, draft_dir: Path | None, has_head: bool):
        """(target ids [n], [N, H] -> [N, n] logits) of the vocabulary the rules score: a
        reduced draft vocabulary (d2t), a LiLiCorr draft's candidate_vocab/ (liliprop
        extension), or (None, None) for the full vocabulary."""
        ids = draft_vocab_ids(self.model)
        if ids is not None:
            return ids, draft_vocab_logits(self.model)
        if not has_head:
            return None, None
        topk = int(self.dflash_config.get("lilicorr_candidate_topk", 1))
        vocab_size = int(self.draft_model_config.hf_config.vocab_size)
        ids = read_candidate_vocab(draft_dir, vocab_size, topk)
        if ids is None:
            return None, None
        logger.info("vllm-liliprop: LiLiCorr candidates from %d of %d ids (%s/candidate_vocab)",
                    ids.numel(), vocab_size, draft_dir)
        ids = ids.to(self.device)
        return ids, candidate_vocab_logits(self.model, ids)

    def _markov_weights(self, draft_path: Path) -> dict[str, torch.Tensor] | None:
        """DSpark's Markov head as the checkpoint stores it; for a draft that is not a local
        folder (a hub id), the copies vLLM loaded (markov_w2 without ParallelLMHead's padding
        rows). None when the draft has no head: the rule then says what is missing."""
        if draft_path.is_dir():
            return read_head_weights(draft_path, MARKOV_PREFIX)
        head = getattr(getattr(self.model, "model", None), "markov_head", None)
        if head is None:
            return None
        rows = int(getattr(self.draft_model_config.hf_config, "draft_vocab_size", None)
                   or self.draft_model_config.hf_config.vocab_size)
        return {
            "markov_w1.weight": head.markov_w1.weight.detach(),
            "markov_w2.weight": head.markov_w2.weight.detach()[:rows],
        }

    def _tokenizer_fingerprint(self) -> str | None:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            return None
        try:
            tokenizer = AutoTokenizer.from_pretrained(self.vllm_config.model_config.tokenizer)
        except (OSError, ValueError):
            return None
        return tokenizer_fingerprint(tokenizer)

    @override
    def set_inputs_first_pass(
        self,
        target_token_ids,
        next_token_ids,
        target_positions,
        target_hidden_states,
        token_indices_to_sample,
        cad,
        num_rejected_tokens_gpu,
    ):
        if self.draft_rule is not None:
            self._anchor_ids = next_token_ids
            if self._needs_anchor_hidden:
                self._remember_anchor_state(target_hidden_states, cad, num_rejected_tokens_gpu)
        inputs = (target_token_ids, next_token_ids, target_positions, target_hidden_states,
                  token_indices_to_sample, cad, num_rejected_tokens_gpu)
        if not self.anchor_layout or self.num_speculative_tokens == 0:
            # k = 0 (a speculation schedule's plain step): nothing is sampled, the pass only
            # writes the context KV; DFlash's layout of one query does that for both layouts.
            return super().set_inputs_first_pass(*inputs)
        # DSpark's anchor layout is DFlash's 1 + N fill-in layout with one mask fewer: the
        # parent with N - 1 speculative tokens writes exactly the queries [anchor, mask x (N-1)]
        # at positions last + 1 .. last + N (its kernel takes the count as a run-time scalar),
        # with their slots, the context KV and the attention metadata for N queries a request.
        # Only the sampled rows differ: every query predicts the next token, so all N query
        # offsets 0..N-1 are sampled, not the N - 1 masks. The block is one query shorter than
        # the 1 + N that vLLM sized the buffers, dummy_run and the KV lookahead for (method
        # "dflash"), so those bounds stay valid.
        num_spec = self.num_speculative_tokens
        self.num_speculative_tokens = num_spec - 1
        try:
            num_query_total, _, new_cad = super().set_inputs_first_pass(*inputs)
        finally:
            self.num_speculative_tokens = num_spec
        # Request b's queries are rows b * N .. b * N + N - 1: all of them, in order.
        return num_query_total, self.arange[:num_query_total], new_cad

    @override
    def propose(self, num_speculative_tokens, target_token_ids, target_positions,
                target_hidden_states, next_token_ids, token_indices_to_sample,
                common_attn_metadata, sampling_metadata, mm_embed_inputs=None,
                num_rejected_tokens_gpu=None, slot_mappings=None):
        batch = common_attn_metadata.batch_size()
        sampled_k = None if sampling_metadata.all_greedy else sampled_k_at(self._sampled_k, batch)
        none_drafts = self._none_drafts(sampling_metadata, batch)
        self._lookup = self._look_up_if_drafting(0 if none_drafts else num_speculative_tokens)
        looked_up = self._lookup_for_every_row(batch, num_speculative_tokens)
        needs_queries = num_speculative_tokens > 0 and looked_up is None and not none_drafts
        if needs_queries or not self.skip_plain_step_queries:
            self._verified_k = num_speculative_tokens
            drafts = super().propose(
                self._queried_k(num_speculative_tokens), target_token_ids, target_positions,
                target_hidden_states, next_token_ids, token_indices_to_sample,
                common_attn_metadata, sampling_metadata, mm_embed_inputs=mm_embed_inputs,
                num_rejected_tokens_gpu=num_rejected_tokens_gpu, slot_mappings=slot_mappings)
            drafts = self._verified_part(drafts, num_speculative_tokens)
            return cut_sampled_rows(drafts, sampling_metadata.temperature, sampled_k)
        if none_drafts and self._sampled_skip_context:  # no request here ever reads its context
            self._last_draft_probs = None  # the runner must not verify against an older step's
            self.num_sampled_context_skips += 1
        else:
            plain = self._store_context_only(target_token_ids, target_positions,
                                             target_hidden_states, next_token_ids,
                                             common_attn_metadata, num_rejected_tokens_gpu)
            if num_speculative_tokens == 0:
                return plain
            self.num_speculative_tokens = num_speculative_tokens
        if none_drafts:  # the target verifies nothing: a plain decoding step (patch 11)
            self.num_sampled_plain_steps += 1
            return torch.full((batch, num_speculative_tokens), NO_DRAFT, dtype=torch.int64,
                              device=self.device)
        # Every request drafts its lookup continuation: the drafter's block would be discarded.
        self._lookup = None
        self.num_lookup_rows += looked_up.shape[0]
        self.num_lookup_only_steps += 1
        return cut_sampled_rows(looked_up.to(self.device), sampling_metadata.temperature, sampled_k)

    def _none_drafts(self, sampling_metadata, batch: int) -> bool:
        """Every request sampled and none allowed a draft at this batch size (sampled_drafts.py)."""
        return sampling_metadata.all_random and sampled_k_at(self._sampled_k, batch) == 0

    def _queried_k(self, k: int) -> int:
        """The masks to query for a step that verifies k drafts: with a rule, the drafter's
        trained block (queried_masks) whatever k a speculation schedule picked at this batch
        size; without one, vLLM's k (drafts exactly vLLM's)."""
        if self.draft_rule is None or self.anchor_layout:
            return k
        return queried_masks(k, self._max_k, int(self.dflash_config.get("block_size", 0) or 0))

    def _verified_part(self, drafts: torch.Tensor, k: int) -> torch.Tensor:
        """The first k slots of a block queried longer than k (and of its distributions, which
        the runner reads next), so the runner sees the [B, k] drafts it scheduled."""
        self.num_speculative_tokens = k
        if drafts.shape[1] == k:
            return drafts
        if self._last_draft_probs is not None:
            self._last_draft_probs = self._last_draft_probs[:, :k].contiguous()
        return drafts[:, :k].contiguous()

    def _lookup_for_every_row(self, batch: int, k: int) -> torch.Tensor | None:
        """This step's lookup drafts [batch, k] when the lookup found one for every request
        (the hybrid rule then needs nothing of the drafter's pass but the context K/V); else
        None. Host tensors: the lookup ran on the host."""
        if self._lookup is None or k == 0:
            return None
        ids, found = self._lookup
        if found.shape[0] != batch or ids.shape[1] < k or not bool(found.all()):
            return None
        return ids[:, :k]

    def _store_context_only(self, target_token_ids, target_positions, target_hidden_states,
                            next_token_ids, cad, num_rejected_tokens_gpu) -> torch.Tensor:
        """A step that needs no drafter block (k = 0, a speculation schedule's plain step; or
        every request drafting its lookup continuation): only the step's context is kept, its
        K/V written by the next pass that writes context (deferred_context.py; at once where it
        cannot be kept), so that later drafts see it. vLLM's parent would also run the drafter
        over the queries; their K/V sit at positions the next step's context overwrites, so
        skipping them changes no later draft. Returns the empty k = 0 draft."""
        self.num_speculative_tokens = 0
        self._last_draft_probs = None
        batch = cad.batch_size()
        defer = (self.defer_plain_step_context and self._step_req_ids is not None
                 and len(self._step_req_ids) == batch)
        if defer:
            # The parent's input kernel would also lay out queries nobody reads; the context's
            # positions and slots are all a deferred write needs.
            positions = target_positions[: target_token_ids.shape[0]]
            rows = request_rows(cad.query_start_loc[: batch + 1], positions.shape[0], positions.device)
            defer = rows is not None and self._defer_context(
                target_hidden_states, positions,
                context_slots(positions, rows, cad.block_table_tensor, self.block_size), rows)
        if not defer:
            self._write_context_now(target_token_ids, target_positions, target_hidden_states,
                                    next_token_ids, cad, num_rejected_tokens_gpu)
        self.num_context_only_steps += 1
        return torch.empty(batch, 0, device=self.device, dtype=torch.int64)

    def keep_plain_step(self, taps: list[torch.Tensor], positions: torch.Tensor, cad,
                        sampling_metadata, sampled_token_ids: torch.Tensor,
                        discard_request_mask: torch.Tensor, input_batch) -> torch.Tensor | None:
        """A step that verified no draft and schedules none (a speculation schedule's k = 0),
        handed over by the runner (patching.py, patch 14) with the target's taps as they are.
        Does what prepare_next_token_ids_padded and propose do at such a step (the batch and
        acceptance bookkeeping, the deferred context) without vLLM's path between them: next
        tokens, the drafter's input layout and a second copy of the taps, none of which a
        deferred context reads. The empty draft; None, having changed nothing, where the
        context cannot be deferred (the runner then takes vLLM's path)."""
        batch, num_tokens = cad.batch_size(), positions.shape[0]
        # A request scheduled in a step has a token or more: as many tokens as requests is
        # one each, in batch order.
        rows = (self._rows_of_decode_step(batch, positions.device) if num_tokens == batch else
                request_rows(cad.query_start_loc[: batch + 1], num_tokens, positions.device))
        if (rows is None or input_batch.num_reqs != batch or not self.plain_steps_from_runner
                or not self.defer_plain_step_context or not self.skip_plain_step_queries):
            return None
        self._begin_step(sampled_token_ids, discard_request_mask, input_batch)
        self.num_speculative_tokens = 0
        self._lookup = self._last_draft_probs = None
        if self._none_drafts(sampling_metadata, batch) and self._sampled_skip_context:
            self.num_sampled_context_skips += 1  # no request here ever reads its context
            self.num_sampled_plain_steps += 1
        else:
            states = torch.cat([tap[:num_tokens] for tap in taps], dim=-1)
            # The runner's slots of the step's tokens in the drafter's KV group (its metadata is
            # that group's): what context_slots computes from the same block table.
            self._defer_context(states, positions, cad.slot_mapping[:num_tokens], rows,
                                states_owned=True)
            self.num_context_only_steps += 1
        return torch.empty(batch, 0, device=self.device, dtype=torch.int64)

    def _defer_context(self, states, positions, slots, rows, states_owned: bool = False) -> bool:
        """Keep a plain step's context for a later write (deferred_context.py), writing all that
        is pending now if it must be; False, keeping nothing, where it cannot be kept."""
        if not self._deferred.add(states, positions, slots, rows, self._step_req_ids,
                                  states_owned=states_owned):
            return False
        if self._deferred.must_write():
            self._write_deferred_context()
        return True

    def _rows_of_decode_step(self, batch: int, device) -> torch.Tensor:
        """Row b of a decode step's token b: a slice of one kept arange, never written, so the
        deferred context keeps slices of it."""
        if self._decode_rows.shape[0] < batch or self._decode_rows.device != device:
            self._decode_rows = torch.arange(max(batch, 256), dtype=torch.int64, device=device)
        return self._decode_rows[:batch]

    def _write_context_now(self, target_token_ids, target_positions, target_hidden_states,
                           next_token_ids, cad, num_rejected_tokens_gpu) -> None:
        """The step's context K/V written in this step, through the parent's layout of one query
        a request (its kernel fills the context's positions and KV slots). Nothing is drafted,
        so no anchor is remembered."""
        num_tokens, _, _ = DFlashProposer.set_inputs_first_pass(
            self,
            target_token_ids=target_token_ids,
            next_token_ids=next_token_ids,
            target_positions=target_positions,
            target_hidden_states=target_hidden_states,
            token_indices_to_sample=None,
            cad=cad,
            num_rejected_tokens_gpu=num_rejected_tokens_gpu,
        )
        self._dflash_hidden_states = self.model.combine_hidden_states(target_hidden_states)
        self.build_model_inputs_first_pass(num_tokens, num_tokens, None)  # stores the context K/V

    @override
    def build_model_inputs_first_pass(self, num_tokens, num_input_tokens, mm_embed_inputs):
        self._write_deferred_context()  # older positions first, as they would have been written
        return super().build_model_inputs_first_pass(num_tokens, num_input_tokens, mm_embed_inputs)

    def _write_deferred_context(self) -> None:
        pending = self._deferred.take()
        if pending is not None:
            self._write_context(*pending)

    def _write_context(self, states, positions, slots) -> None:
        self.model.precompute_and_store_context_kv(self.model.combine_hidden_states(states),
                                                   positions, slots)

    def observe_schedule(self, scheduler_output) -> None:
        """Every step's scheduler output, before its forward (patching.py, patch 15), for the
        deferred context: requests that left park or drop their tokens, parked blocks handed
        to a request are dropped, parked blocks hit in the prefix cache are written now and
        the step writes what is pending (deferred_context.py). Where this fails, every parked
        token is dropped: later drafts over those blocks are worse, the output is unchanged."""
        deferred = self._deferred
        try:
            gone = departed_requests(scheduler_output)
            if gone:
                deferred.depart(gone)
            if deferred.kv_block_size is None:
                return
            allocated, hit = block_events(scheduler_output, max(int(self.kv_cache_gid), 0),
                                          deferred.kv_block_size, running=deferred.num_parked > 0)
            deferred.forget_blocks(allocated)
            revived = deferred.hit_blocks(hit) if hit else None
            if revived is not None:
                self._write_context(*revived)
        except Exception:  # noqa: BLE001 - a rule's fault must never stop the engine
            deferred.drop_parked()
            self.num_schedule_faults += 1
            if self.num_schedule_faults == 1:
                logger.warning("vllm-liliprop could not follow the scheduler's KV blocks; parked "
                               "context dropped (drafts over it will be worse; logged once)",
                               exc_info=True)

    def _advise_trained_block(self) -> None:
        if self.anchor_layout:  # DSpark's anchor layout queries k tokens by design
            return
        advice = short_block_advice(int(self.dflash_config.get("block_size", 0) or 0),
                                    self._max_k, self._rule_draft_length)
        if advice is not None:
            logger.warning("vllm-liliprop: %s (docs/serving.md).", advice)

    def _remember_anchor_state(self, context_states, cad, num_rejected) -> None:
        # In padded mode the context still holds the rejected slots: the last verified token of
        # request b sits at query_start_loc[b+1] - 1 - num_rejected[b].
        num_reqs = cad.batch_size()
        starts = cad.query_start_loc[:num_reqs]
        ends = cad.query_start_loc[1 : num_reqs + 1]
        if num_rejected is not None:
            ends = ends - num_rejected[:num_reqs]
        valid = ends > starts
        index = (ends - 1).clamp_min(0).long()
        anchor = self.model.model.hidden_norm(context_states[index])
        self._anchor_hidden = anchor * valid[:, None].to(anchor.dtype)
        self._anchor_valid = valid

    @override
    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch,
                                      discard_request_mask):
        # vLLM's runner calls this right before `propose`, with the tokens it just verified
        # (DFlash always drafts with a padded batch: vLLM refuses disable_padded_drafter_batch
        # for parallel drafting, so prepare_next_token_ids_cpu never runs).
        result = plain_step_next_tokens(sampled_token_ids, discard_request_mask,
                                        gpu_input_batch.vocab_size)
        if result is None:
            result = super().prepare_next_token_ids_padded(
                sampled_token_ids, requests, gpu_input_batch, discard_request_mask)
        self._begin_step(sampled_token_ids, discard_request_mask, gpu_input_batch)
        if self._lookup_lengths is not None:  # looked up in propose(), where the step drafts
            self._lookup_inputs = (sampled_token_ids, gpu_input_batch, discard_request_mask)
        return result

    def _begin_step(self, sampled_token_ids, discard_request_mask, input_batch) -> None:
        """A step's batch bookkeeping, before its context is kept or written: the acceptance of
        the last step's drafts, this step's requests, and the pending context of the ones gone."""
        batch = sampled_token_ids.shape[0]
        self._track_acceptance("verify", sampled_token_ids, ~discard_request_mask[:batch],
                               input_batch.req_ids)
        self._step_req_ids = list(input_batch.req_ids[:input_batch.num_reqs])
        self._deferred.keep_requests(self._step_req_ids)  # before any write: see the module

    def _look_up_if_drafting(self, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """This step's prompt lookup, run only where the step drafts (k > 0): a plain step of a
        speculation schedule would throw it away, and it reads every request's history on the
        host (at batch 16-32 the lookup systems' plain steps had run 1-3% dearer than the
        others')."""
        inputs, self._lookup_inputs = self._lookup_inputs, None
        if inputs is None or k == 0:  # None: no lookup option, or no step since the last
            return None
        return self._look_up(*inputs)

    def _look_up(self, sampled_token_ids, gpu_input_batch, discard_request_mask):
        """The prompt lookup's (ids, found) for this step's requests, from each one's tokens so
        far: the input batch's (through the last step) and the ones just verified (vLLM drafts
        before it books them; rejected slots are -1). None, logged once, if it fails."""
        try:
            num_reqs = gpu_input_batch.num_reqs
            sampled = sampled_token_ids[:num_reqs].cpu().numpy()
            discard = discard_request_mask[:num_reqs].cpu().numpy()
            histories = []
            for row in range(num_reqs):
                known = int(gpu_input_batch.num_tokens_no_spec[row])
                verified = sampled[row][sampled[row] >= 0]
                histories.append(None if discard[row] else np.concatenate(
                    [gpu_input_batch.token_ids_cpu[row, :known], verified]))
            return lookup_drafts(histories, *self._lookup_lengths, self._max_k)
        except Exception:
            self._lookup_lengths = None
            logger.warning("vllm-liliprop's prompt lookup failed and is off for this engine; the "
                           "draft rule drafts every request.", exc_info=True)
            return None

    def _with_lookup(self, token_ids: torch.Tensor, probs):
        """The block vLLM verifies: the lookup's continuation where it found one (the hybrid
        rule), the rule's block elsewhere, cut to `rule_draft_length` slots if set."""
        lookup, self._lookup = self._lookup, None
        batch, slots = token_ids.shape
        found = None
        # A speculation schedule may draft fewer slots than the configured k at this batch size.
        if lookup is not None and lookup[1].shape[0] == batch and lookup[0].shape[1] >= slots:
            ids, found = lookup[0][:, :slots], lookup[1]
            self.num_lookup_rows += int(found.sum())
            token_ids, probs = replace_rows(token_ids, probs, found, ids)
        length = self._kept_length(slots)
        if length is not None:  # the rule drafted rule_slots(); length 0 cuts its one
            token_ids = cut_drafts(token_ids, length, found)
        return token_ids, probs

    def _kept_length(self, slots: int) -> int | None:
        """How many of the rule's `slots` slots this step keeps: rule_draft_length, and no more
        than the k verified where the block was queried longer (_queried_k); None: all."""
        return kept_length(self._rule_draft_length, min(self._verified_k, slots), slots)

    def _track_acceptance(self, method: str, *args) -> None:
        """Health bookkeeping must never take the engine down: a fault turns it off, logged once."""
        if self._acceptance is None or not self._acceptance_on:
            return
        try:
            getattr(self._acceptance, method)(*args)
        except Exception:
            self._acceptance_on = False  # its counts so far stay exported
            logger.warning("vllm-liliprop stopped comparing the rule's drafts with the drafter's "
                           "argmax after an error (its acceptance counters stop here).", exc_info=True)

    @override
    def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self._draft_argmax is None:
            return super()._greedy_sample(hidden_states)
        return self._draft_argmax(hidden_states)

    def _cut_by_confidence(self, token_ids: torch.Tensor, output, temperature) -> torch.Tensor:
        """`draft_confidence_floor`'s cut; a custom rule that reports no confidence keeps its
        drafts whole, and the log says so once (every built-in rule reports it)."""
        if output.confidence is None:
            if not self._warned_no_confidence:
                self._warned_no_confidence = True
                logger.warning("liliprop.draft_confidence_floor is set but rule %r reports no "
                               "DraftOutput.confidence: its drafts are not cut",
                               getattr(self.draft_rule, "name", self.draft_rule))
            return token_ids
        return confident_cut(token_ids, output.confidence, self._confidence_floor, temperature)

    @override
    def _sample_draft_tokens(self, hidden_states, sampling_metadata):
        if self.draft_rule is None:
            return super()._sample_draft_tokens(hidden_states, sampling_metadata)
        batch = self._anchor_ids.shape[0]
        self.num_draft_rows += batch
        hidden = hidden_states.view(batch, -1, hidden_states.shape[-1])
        slots = hidden.shape[1]
        inputs = DraftInputs(
            hidden=hidden[:, :rule_slots(slots, self._kept_length(slots))],
            anchor_ids=self._anchor_ids.long(),
            compute_logits=self.model.compute_logits,
            embed=self._embedding,
            anchor_hidden=self._anchor_hidden,
            anchor_valid=self._anchor_valid,
            temperature=None if sampling_metadata.all_greedy else sampling_metadata.temperature,
            draft_vocab_logits=self._draft_vocab_logits,
        )
        try:
            output = self.draft_rule.propose(inputs)
            token_ids, probs = apply_fallback(inputs, output)
            if self._confidence_floor is not None:
                token_ids = self._cut_by_confidence(token_ids, output, inputs.temperature)
        except Exception:  # a head must never take the engine down or change the output
            if self.num_rule_faults_raised == 0:
                self._warn_fault("raised", exc_info=True)
            self.num_rule_faults_raised += batch
            self.num_rule_raises += 1
            token_ids, _ = self._with_lookup(pad_drafts(argmax_drafts(inputs), None, slots)[0], None)
            return token_ids.reshape(-1), None
        token_ids, probs = self._with_lookup(*pad_drafts(token_ids, probs, slots))
        if output.faulty_rows is not None:
            self._faulty_rows.add(output.faulty_rows)
        if output.fallback_ids is not None:  # every built-in rule hands over the argmax
            verified = min(self._verified_k, slots)  # what the runner keeps (_verified_part)
            self._track_acceptance("remember", token_ids[:, :verified],
                                   pad_drafts(output.fallback_ids, None, slots)[0][:, :verified])
        if probs is not None:
            probs = probs.reshape(-1, probs.shape[-1])
        return token_ids.reshape(-1), probs

    @property
    def num_rule_faults(self) -> int:
        """Rows drafted by the fallback so far. Reads a device counter: not for the hot path."""
        return self.num_rule_faults_raised + self._faulty_rows.total

    def rule_health(self) -> tuple[str, int, int, int, int, int, int]:
        """(rule, draft rows, fallback rows, faulty steps, verified rows, the rule's accepted
        tokens, the argmax's accepted tokens on those rows) so far, for vLLM's metrics
        (rule_health.py). Never waits for the device: on CUDA the counts of the last step or
        two may not be in yet."""
        rows, steps = self._faulty_rows.settled()
        acceptance = (0, 0, 0) if self._acceptance is None else self._acceptance.tally.settled()
        return (self.draft_rule.name, self.num_draft_rows, self.num_rule_faults_raised + rows,
                self.num_rule_raises + steps, *acceptance)

    def _warn_fault(self, what: str, exc_info: bool = False) -> None:
        logger.warning(
            "vllm-liliprop draft rule %s %s; falling back to the drafter's argmax for the "
            "affected requests (logged once per kind; see LiliPropProposer.num_rule_faults).",
            self.draft_rule.name,
            what,
            exc_info=exc_info,
        )


VllmDFlashProposer = vllm_dflash_class(LiliPropProposer)
