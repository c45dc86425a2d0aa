"""Every change this package makes to vLLM, in one place.

Fifteen patches, each logged once and safe to apply twice:
1. the V1 model runner builds `LiliPropProposer` wherever it would build `DFlashProposer`
   (a subclass, so vLLM's isinstance checks still hold);
2. a LiLiCorr checkpoint served by this package is no longer refused on the V1 runner
   ("DFlash candidate-head drafts");
3. a draft served by this package makes vLLM pick the V1 runner; if the user forces V2
   (VLLM_USE_V2_MODEL_RUNNER=1) the engine stops with a message saying how to fix it. A plain
   LiLiCorr or DSpark checkpoint with V2 forced is left to upstream's V2 speculator;
4. CPU only: vLLM 0.32's C++ stand-in for the rejection sampler's `expand_kernel` casts its
   float output to an int64 copy and writes there, so the per-token temperatures that scale the
   target logits during verification stay uninitialised memory (and 0.7 becomes 0). Speculative
   sampling at T > 0 then drifts far from the target distribution (tests/test_sampling_vllm.py
   shows it with stock DFlash). The replacement expands in torch, in the output's dtype;
5. CPU only: after a step whose sampled tokens are discarded (a chunked prefill), vLLM 0.32
   rewinds each such request's seeded generator by its Philox offset, which CPU generators do
   not have ("CPU Generator does not use offset"): any seeded request at T > 0 whose prompt is
   prefilled in chunks crashes the engine. On CPU the rewind is skipped; the request's seeded
   stream simply goes on, so its samples stay exact draws from the distribution and a rerun with
   the same batches repeats them;
6. an upstream DSpark draft (`Qwen3DSparkModel`) asked for with method "dspark" (or no method,
   which vLLM detects as "dspark") has its method rewritten to "dflash" once vLLM has finished
   its DSpark-specific config handling (default num_speculative_tokens = block_size,
   dspark_draft_topk copied into the draft config), so the V1 runner builds `LiliPropProposer`
   for it (vLLM's V1 refuses "dspark"; the checkpoint's model class subclasses vLLM's DFlash
   one, so the DFlash proposer loads and runs it, Markov head included). Its target layers are
   also copied into `dflash_config.target_layer_ids` when the checkpoint names them only at the
   top level (`target_layer_ids` / `dspark_target_layer_ids`, read by vLLM's V2 only). A user
   forcing VLLM_USE_V2_MODEL_RUNNER=1 keeps upstream's V2 DSpark speculator; no other DSpark
   architecture is touched;
7. with method "dflash", vLLM's draft config wrapper (`EAGLEConfig`) renames an architecture X to
   "DFlashX", a model vLLM does not have for X = Qwen3DSparkModel: the DSpark architecture keeps
   its name (as vLLM does for LiLiCorrDraftModel), so `method: "dflash"` with a DSpark
   checkpoint loads the same model and is served as in 6. Not with V2 forced;
8. rule health in vLLM's metrics (rule_health.py): the scheduler's `make_stats` adds the draft
   rules' counts to the step's `SpecDecodingStats` (a subclass with a `rule_health` field, and
   `SchedulerStats.spec_decoding_stats` annotated with it, so that vLLM's msgpack decoder keeps
   the field across the engine-core/frontend boundary), and `SpecDecodingProm` registers and
   increments the `vllm:liliprop_rule_*` counters beside vLLM's spec-decode counters;
9. CPU only: every engine start re-registers the CPU kernel overrides, and vLLM's
   `_rebind_kernels` scans every module global with `vars(value).get("kernel")`. Once numba has
   been imported (vLLM's n-gram proposer, method "ngram"), llvmlite's duck-typed CDLL
   (`llvmlite.binding.ffi.lib`) answers `__dict__` with a wrapped function, so the next engine
   of the process stops with "'_lib_fn_wrapper' object has no attribute 'get'". Its lookup of
   dunder names now raises AttributeError, as ctypes' own CDLL does;
10. the runner's host copy of the drafts (what the scheduler schedules and the target verifies)
   is cut at each row's first NO_DRAFT slot (draft_length.py), so a draft rule can draft fewer
   than k tokens for a request (`rule_draft_length`). Rows without one pass unchanged;
11. a step in which no request has a draft (k = 0 in a speculation schedule, or drafts all cut)
   samples with the runner's plain sampler, as plain decoding does, instead of running vLLM's
   rejection sampler over zero drafts (on 2 CPU cores ~0.9 ms a step at batch 16: a schedule's
   plain step should cost what a plain engine's does). Its output has the shape the rejection
   sampler's would ([batch, 1]), which is all the runner reads of it;
12. CPU only: an all-greedy verification step whose answer is plain argmaxes (no logprobs,
   penalties or active argmax-moving processors) is verified by greedy_verify.py: one fp32 copy
   into a reused buffer and vLLM's `greedy_argmax`, instead of the rejection sampler's four fresh
   full-vocabulary tensors (at batch 16, k = 3, on 2 cores: 1.4 ms of sampling a step instead of
   4.8, tools/step_cost.py --vllm-verify). Same tokens:
   each is the argmax plain decoding would take of the same logits;
13. CPU only: at T > 0 the rejection sampler's recovered tokens take their Exp(1) noise from
   float64 uniforms (-log(1 - U)) instead of `exponential_`, and a seeded request's row is drawn
   once, from its own generator (vLLM draws every row twice in a seeded batch): ~6 ms of noise a
   step instead of ~37 at batch 16, seeded, on 2 cores (recovered_tokens.py). Same distribution
   and kernel;
14. a step that verified no draft and schedules none (k = 0 in a speculation schedule) hands
   `LiliPropProposer.keep_plain_step` the target's taps, positions and batch, which is all its
   deferred context keeps, instead of vLLM's path to `propose` (next tokens, the drafter's
   padded input layout, a concatenation of the taps that the deferred context copied again).
   At batch 16 on 2 cores that path cost ~0.7 ms of a ~50 ms plain step
   (docs/measurements-smollm2.md); a schedule's plain step should cost what a plain engine's
   does. Any other drafter, or a step the proposer cannot defer, takes vLLM's path;
15. the runner shows `LiliPropProposer.observe_schedule` every step's scheduler output once it
   has applied it (`_update_states`), before the forward: the requests that left, the KV blocks
   handed out and the blocks hit in the prefix cache. That lets the deferred context keep a
   departed request's full blocks until a later request hits them, instead of writing every
   completed block in case one does (deferred_context.py). Other drafters have no such hook.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
from vllm.logger import init_logger

from vllm_liliprop.draft_length import trim_rows
from vllm_liliprop.options import DSPARK_ARCH, LILICORR_ARCH, env_options
from vllm_liliprop.vllm import rule_health

logger = init_logger("vllm.liliprop.patching")

_MARK = "__liliprop_original__"
V2_REASON = (
    "vllm-liliprop draft rules (they run on the V1 model runner: unset "
    "VLLM_USE_V2_MODEL_RUNNER or set it to 0)"
)


def _replace(owner: Any, name: str, new: Any) -> bool:
    """Set owner.name = new once, remembering the original; False if already done."""
    current = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name)
    if getattr(current, _MARK, None) is not None or current is new:
        return False
    try:
        setattr(new, _MARK, current)
    except (AttributeError, TypeError):
        pass
    setattr(owner, name, new)
    logger.info("vllm-liliprop patched %s.%s", getattr(owner, "__name__", owner), name)
    return True


def draft_request(vllm_config) -> tuple[list[str], dict] | None:
    """(architectures, dflash_config) of a DFlash draft, or None for anything else."""
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or spec.method != "dflash" or spec.draft_model_config is None:
        return None
    draft = spec.draft_model_config
    dflash_config = getattr(draft.hf_config, "dflash_config", None) or {}
    return list(draft.architectures or []), dict(dflash_config)


def asks_for_liliprop_rules(vllm_config) -> bool:
    """A `liliprop` block or the environment override: only this package can serve that."""
    request = draft_request(vllm_config)
    return request is not None and ("liliprop" in request[1] or env_options() is not None)


def v2_forced() -> bool:
    return os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").lower() in ("1", "true")


def served_on_v1(vllm_config) -> bool:
    request = draft_request(vllm_config)
    if request is None:
        return False
    has_head = LILICORR_ARCH in request[0] or DSPARK_ARCH in request[0]
    return asks_for_liliprop_rules(vllm_config) or (has_head and not v2_forced())


def _is_dspark_draft(speculative_config) -> bool:
    draft = getattr(speculative_config, "draft_model_config", None)
    return draft is not None and DSPARK_ARCH in (draft.architectures or [])


def _copy_dspark_target_layers(hf_config) -> None:
    dflash_config = dict(getattr(hf_config, "dflash_config", None) or {})
    if dflash_config.get("target_layer_ids"):
        return
    for name in ("dspark_target_layer_ids", "target_layer_ids"):
        layer_ids = getattr(hf_config, name, None)
        if layer_ids:
            dflash_config["target_layer_ids"] = list(layer_ids)
            hf_config.dflash_config = dflash_config
            return


def _wrap_speculative_post_init(original: Callable) -> Callable:
    def __post_init__(self) -> None:
        original(self)
        if self.method not in ("dspark", "dflash") or not _is_dspark_draft(self) or v2_forced():
            return
        _copy_dspark_target_layers(self.draft_model_config.hf_config)
        if self.method == "dspark":
            self.method = "dflash"
            logger.info_once(
                "vllm-liliprop serves the %s draft on the V1 model runner (speculative method "
                "'dspark' runs as 'dflash' through LiliPropProposer and its DSpark rule; set "
                "VLLM_USE_V2_MODEL_RUNNER=1 for upstream's V2 DSpark speculator).",
                DSPARK_ARCH,
            )

    return __post_init__


def _wrap_eagle_config_init(original: Callable) -> Callable:
    renamed = "DFlash" + DSPARK_ARCH

    def __init__(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        architectures = list(getattr(self, "architectures", None) or [])
        if renamed in architectures and not v2_forced():
            self.architectures = [DSPARK_ARCH if a == renamed else a for a in architectures]

    return __init__


def _wrap_v2_unsupported(original: Callable) -> Callable:
    def _get_v2_model_runner_unsupported_features(self) -> list[str]:
        unsupported = original(self)
        if served_on_v1(self) or asks_for_liliprop_rules(self):
            unsupported.append(V2_REASON)
        return unsupported

    return _get_v2_model_runner_unsupported_features


def _wrap_candidate_draft(original: Callable) -> Callable:
    def _is_dflash_candidate_draft(self) -> bool:
        if served_on_v1(self):
            return False
        return original(self)

    return _is_dflash_candidate_draft


def expand_kernel_cpu(output, input_val, cu_num_tokens, replace_from, replace_to,
                      MAX_NUM_TOKENS=None):
    """output[cu[i-1]:cu[i]] = input[i], with replace_from mapped to replace_to (vLLM's
    `expand_kernel` contract), for any dtype."""
    values = torch.where(input_val == replace_from,
                         torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.shape[0]].copy_(expanded.to(output.dtype))


class _NoOffsetGenerator:
    """What the discard path of `_bookkeeping_sync` sees for a CPU generator: nothing to rewind."""

    def get_offset(self) -> int:
        return 0

    def set_offset(self, offset: int) -> None:
        pass


def _wrap_bookkeeping_cpu(original: Callable) -> Callable:
    def _bookkeeping_sync(self, *args, **kwargs):
        batch = self.input_batch
        generators = batch.generators
        # The rewind loop is this method's only reader of the generators.
        if generators and self.discard_request_mask.np[:batch.num_reqs].any():
            batch.generators = dict.fromkeys(generators, _NoOffsetGenerator())
            try:
                return original(self, *args, **kwargs)
            finally:
                batch.generators = generators
        return original(self, *args, **kwargs)

    return _bookkeeping_sync


def _wrap_host_drafts(original: Callable) -> Callable:
    def _get_draft_token_ids_cpu(self):
        draft_token_ids, req_ids = original(self)
        return trim_rows(draft_token_ids), req_ids

    return _get_draft_token_ids_cpu


def _wrap_sample(original: Callable) -> Callable:
    def _sample(self, logits, spec_decode_metadata):
        if spec_decode_metadata is not None and spec_decode_metadata.max_spec_len == 0:
            spec_decode_metadata = None  # nothing to verify: the plain sampler's step
        return original(self, logits, spec_decode_metadata)

    return _sample


def _wrap_plain_step_proposal(original: Callable) -> Callable:
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata,
                                hidden_states, sample_hidden_states, aux_hidden_states,
                                spec_decode_metadata, common_attn_metadata, slot_mappings):
        keep = getattr(self.drafter, "keep_plain_step", None)
        plain = (keep is not None and aux_hidden_states is not None
                 and scheduler_output.num_spec_tokens_to_schedule == 0
                 and (spec_decode_metadata is None or spec_decode_metadata.max_spec_len == 0))
        if plain:
            positions = self._get_positions(scheduler_output.total_num_scheduled_tokens)
            drafts = keep(aux_hidden_states, positions, common_attn_metadata, sampling_metadata,
                          sampled_token_ids, self.discard_request_mask.gpu, self.input_batch)
            if drafts is not None:
                return drafts
        return original(self, scheduler_output, sampled_token_ids, sampling_metadata,
                        hidden_states, sample_hidden_states, aux_hidden_states,
                        spec_decode_metadata, common_attn_metadata, slot_mappings)

    return propose_draft_token_ids


def _wrap_update_states(original: Callable) -> Callable:
    def _update_states(self, scheduler_output):
        result = original(self, scheduler_output)
        observe = getattr(getattr(self, "drafter", None), "observe_schedule", None)
        if observe is not None:
            observe(scheduler_output)
        return result

    return _update_states


def _wrap_rejection_forward(original: Callable) -> Callable:
    from vllm_liliprop.vllm import greedy_verify

    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        if greedy_verify.applies(sampling_metadata, self.synthetic_mode):
            return greedy_verify.greedy_verify(metadata, logits)
        return original(self, metadata, draft_probs, logits, sampling_metadata)

    return forward


def _patch_cpu_recovered_tokens() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.sample import rejection_sampler

    from vllm_liliprop.vllm.recovered_tokens import sample_recovered_tokens

    _replace(rejection_sampler, "sample_recovered_tokens", sample_recovered_tokens)


def _patch_cpu_greedy_verify() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    current = RejectionSampler.__dict__["forward"]
    if getattr(current, _MARK, None) is None:
        _replace(RejectionSampler, "forward", _wrap_rejection_forward(current))


def _wrap_make_stats(original: Callable) -> Callable:
    def make_stats(self, spec_decoding_stats=None, *args, **kwargs):
        if self.log_stats:
            spec_decoding_stats = rule_health.with_rule_health(spec_decoding_stats, self.num_spec_tokens)
        return original(self, spec_decoding_stats, *args, **kwargs)

    return make_stats


def _wrap_spec_prom_init(original: Callable) -> Callable:
    def __init__(self, speculative_config, labelnames, per_engine_labelvalues, *args, **kwargs):
        original(self, speculative_config, labelnames, per_engine_labelvalues, *args, **kwargs)
        # Registered with vLLM's own counters, so vLLM's unregister_vllm_metrics ("vllm:"
        # names) clears them too when the next engine builds its loggers.
        wanted = self.spec_decoding_enabled and not self.is_diffusion
        self.liliprop_rule_health = (
            rule_health.RuleHealthProm(labelnames, per_engine_labelvalues) if wanted else None)

    return __init__


def _wrap_spec_prom_observe(original: Callable) -> Callable:
    def observe(self, spec_decoding_stats, engine_idx: int = 0):
        original(self, spec_decoding_stats, engine_idx)
        health = getattr(self, "liliprop_rule_health", None)
        if health is not None:
            health.observe(spec_decoding_stats, engine_idx)

    return observe


def _annotate_rule_stats() -> None:
    """SchedulerStats.spec_decoding_stats as the subclass: vLLM's msgpack decoder builds the
    type the annotation names, and would drop `rule_health` from the base class."""
    from vllm.v1.metrics.stats import SchedulerStats

    wanted = rule_health.RuleSpecDecodingStats | None
    if SchedulerStats.__annotations__.get("spec_decoding_stats") == wanted:
        return
    SchedulerStats.__annotations__["spec_decoding_stats"] = wanted
    SchedulerStats.__dataclass_fields__["spec_decoding_stats"].type = wanted
    logger.info("vllm-liliprop patched SchedulerStats.spec_decoding_stats (rule health)")


def apply_patches() -> None:
    from vllm.config import VllmConfig
    from vllm.v1.worker import gpu_model_runner

    from vllm_liliprop.vllm.proposer import LiliPropProposer

    from vllm.config import SpeculativeConfig
    from vllm.transformers_utils.configs.eagle import EAGLEConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.spec_decode.metrics import SpecDecodingProm

    _replace(gpu_model_runner, "DFlashProposer", LiliPropProposer)
    _patch_cpu_expand_kernel()
    _patch_cpu_generator_rewind(gpu_model_runner.GPUModelRunner)
    _patch_cpu_llvmlite_dunders()
    _patch_cpu_greedy_verify()
    _patch_cpu_recovered_tokens()
    for owner, name, wrap in (
        (VllmConfig, "_get_v2_model_runner_unsupported_features", _wrap_v2_unsupported),
        (VllmConfig, "_is_dflash_candidate_draft", _wrap_candidate_draft),
        # pydantic calls a dataclass's __post_init__ by name, so the wrapper is what runs.
        (SpeculativeConfig, "__post_init__", _wrap_speculative_post_init),
        (EAGLEConfig, "__init__", _wrap_eagle_config_init),
        (Scheduler, "make_stats", _wrap_make_stats),
        (gpu_model_runner.GPUModelRunner, "_get_draft_token_ids_cpu", _wrap_host_drafts),
        (gpu_model_runner.GPUModelRunner, "_sample", _wrap_sample),
        (gpu_model_runner.GPUModelRunner, "propose_draft_token_ids", _wrap_plain_step_proposal),
        (gpu_model_runner.GPUModelRunner, "_update_states", _wrap_update_states),
        (SpecDecodingProm, "__init__", _wrap_spec_prom_init),
        (SpecDecodingProm, "observe", _wrap_spec_prom_observe),
    ):
        current = owner.__dict__[name]
        if getattr(current, _MARK, None) is None:
            _replace(owner, name, wrap(current))
    _annotate_rule_stats()


def _patch_cpu_expand_kernel() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.triton_utils.dispatcher import _registry, register_kernels
    from vllm.utils import cpu_triton_utils

    # The platform reads this attribute whenever it (re)registers its kernel overrides...
    _replace(cpu_triton_utils, "_expand_kernel_impl", expand_kernel_cpu)
    # ...and may already have registered the broken one in this process.
    name = "vllm.v1.sample.rejection_sampler.expand_kernel"
    if name in _registry and _registry[name][1] is not expand_kernel_cpu:
        register_kernels({name: expand_kernel_cpu})


def _patch_cpu_generator_rewind(runner_class) -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    current = runner_class.__dict__["_bookkeeping_sync"]
    if getattr(current, _MARK, None) is None:
        _replace(runner_class, "_bookkeeping_sync", _wrap_bookkeeping_cpu(current))


def _wrap_llvmlite_getattr(original: Callable) -> Callable:
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return original(self, name)

    return __getattr__


def _patch_cpu_llvmlite_dunders() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    try:
        from llvmlite.binding import ffi
    except ImportError:  # no numba stack: nothing to guard
        return
    wrapper_class = getattr(ffi, "_lib_wrapper", None)
    current = getattr(wrapper_class, "__dict__", {}).get("__getattr__")
    if current is None:
        logger.warning("vllm-liliprop: llvmlite's _lib_wrapper.__getattr__ not found; an engine "
                       "started after an n-gram engine in this process may fail (patching.py 9)")
        return
    if getattr(current, _MARK, None) is None:
        _replace(wrapper_class, "__getattr__", _wrap_llvmlite_getattr(current))
