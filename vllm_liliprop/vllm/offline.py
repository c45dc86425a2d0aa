"""Offline batches on a real vLLM engine, for eval: one engine per system, timed batches, counters.

`OfflineEngine` builds one `vllm.LLM` for one system (speculative config + draft-rule options) and
runs batches of conversations on it. A batch drives the engine step by step so that multi-turn
conversations continue as soon as their previous turn finishes: with `max_num_seqs = c` and every
request queued up front, c requests stay resident until the queue runs dry. Each batch returns the
generated texts, the number of output tokens, the wall time of the generation loop, and the
speculative-decoding counters of that batch alone (two cumulative reads subtracted).

`StageTimer` splits engine steps into stages (paper Table 3) by wrapping methods of the in-process
model runner and drafter (see its docstring); it needs `VLLM_ENABLE_V1_MULTIPROCESSING=0`.

Engine flags are plain `vllm.LLM` keyword arguments, plus two keys of this module:
`yarn = {"factor": F, "original_max_position_embeddings": N (optional)}`, the YaRN positional
extension, and `draft_yarn`, the draft's own (same form; null: none). Without `draft_yarn` the
draft gets `yarn` too. They become one callable `hf_overrides`, which vLLM applies to the target
and the draft configs alike (a dict `hf_overrides` would reach the target only); it tells the two
apart by the draft architectures' names.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import json
import os
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from vllm import LLM, SamplingParams
from vllm.sampling_params import RequestOutputKind

from vllm_liliprop.k_ranges import describe_k
from vllm_liliprop.options import ENV_VAR
from vllm_liliprop.quiet import load_progress
from vllm_liliprop.vllm.engine_counters import attach_tally
from vllm_liliprop.vllm.metrics import SpecDecodeCounters
from vllm_liliprop.vllm.stock_dflash import plugins_without_liliprop

# Conversation so far, as chat messages: [{"role": "user" | "assistant", "content": str}, ...].
Messages = list[dict[str, str]]
# Turns the conversation so far (ending with a user turn) into prompt token ids.
RenderFn = Callable[[Messages], list[int]]

YARN_KEY = "yarn"
DRAFT_YARN_KEY = "draft_yarn"
# Architecture names of draft configs (DFlash, LiLiCorr, DSpark, and vLLM's other drafters): the
# YaRN override tells a draft's config from the target's by them.
DRAFT_ARCHITECTURE_MARKERS = ("DFlash", "LiLiCorr", "DSpark", "Eagle", "EAGLE", "Medusa", "MTP", "Draft")
# Set by the engine for every system: counters must be on, the batch size comes from concurrency,
# the speculative config from the system.
RESERVED_FLAGS = ("model", "speculative_config", "max_num_seqs", "disable_log_stats")


def vllm_version() -> str:
    import vllm

    return vllm.__version__


def apply_yarn(hf_config, factor: float, original_max_position_embeddings: int | None = None):
    """YaRN on a transformers config (target or draft): rope_type yarn, positions scaled by factor.

    vLLM, like transformers, expects `max_position_embeddings` to be the extended length already.
    A config without positions is returned unchanged (vLLM also calls overrides on a bare config
    to read its model type).
    """
    original = original_max_position_embeddings or getattr(hf_config, "max_position_embeddings", None)
    if original is None:
        return hf_config
    original = int(original)
    rope = dict(getattr(hf_config, "rope_parameters", None) or {"rope_type": "default"})
    rope.update(rope_type="yarn", factor=float(factor), original_max_position_embeddings=original)
    hf_config.rope_parameters = rope
    hf_config.max_position_embeddings = int(original * factor)
    return hf_config


def is_draft_config(hf_config) -> bool:
    return any(marker in name for name in (getattr(hf_config, "architectures", None) or [])
               for marker in DRAFT_ARCHITECTURE_MARKERS)


def apply_yarn_by_role(hf_config, target: dict | None, draft: dict | None):
    """`apply_yarn` with the target's setting or the draft's, whichever config this is (None:
    leave it unchanged)."""
    setting = draft if is_draft_config(hf_config) else target
    if not setting:
        return hf_config
    return apply_yarn(hf_config, float(setting["factor"]), setting.get("original_max_position_embeddings"))


def _yarn_setting(engine_flags: dict, key: str) -> dict | None:
    yarn = engine_flags.get(key)
    if yarn is not None and (not isinstance(yarn, dict) or not isinstance(yarn.get("factor"), (int, float))
                             or yarn["factor"] <= 0):
        raise ValueError(f"engine flag {key} = {yarn!r} must be an object with a number 'factor' > 0"
                         + (" (or null: no YaRN on the draft)" if key == DRAFT_YARN_KEY else "") + ".")
    return yarn


def llm_kwargs(engine_flags: dict) -> dict:
    """`vllm.LLM` keyword arguments for the shared engine flags (the `yarn` and `draft_yarn`
    keys translated)."""
    reserved = sorted(set(engine_flags) & set(RESERVED_FLAGS))
    if reserved:
        raise ValueError(
            f"engine flags {reserved} are set per system or per concurrency by OfflineEngine; "
            "remove them from the engine flags."
        )
    kwargs = {k: v for k, v in engine_flags.items() if k not in (YARN_KEY, DRAFT_YARN_KEY)}
    target = _yarn_setting(engine_flags, YARN_KEY)
    draft = _yarn_setting(engine_flags, DRAFT_YARN_KEY) if DRAFT_YARN_KEY in engine_flags else target
    if target or draft:
        if "hf_overrides" in kwargs:
            raise ValueError("engine flags set both 'yarn'/'draft_yarn' and 'hf_overrides'; fold "
                             "the YaRN rope parameters into one of them.")
        kwargs["hf_overrides"] = functools.partial(apply_yarn_by_role, target=target, draft=draft)
    return kwargs


@dataclass(frozen=True)
class Sampling:
    temperature: float
    max_tokens: int
    seed: int | None = None  # base seed; each request derives its own (see `request_seed`)
    ignore_eos: bool = False


def request_seed(seed: int | None, index: int, turn: int) -> int | None:
    """A stable per-request seed from the run seed, the conversation and the turn."""
    if seed is None:
        return None
    return random.Random(f"{seed}:{index}:{turn}").getrandbits(31)


def output_hash(turn_token_ids: list[list[int]]) -> str:
    """A short fingerprint of one conversation's generated token ids (every turn): equal
    fingerprints at T = 0 show a system reproduced plain decoding exactly."""
    return hashlib.sha256(json.dumps(turn_token_ids).encode()).hexdigest()[:16]


@dataclass
class BatchResult:
    answers: list[list[str]]  # per conversation, the generated text of each turn
    output_tokens: int  # generated tokens over every turn of every conversation
    prompt_tokens: int
    wall_s: float  # first request added -> last request finished
    counters: SpecDecodeCounters  # this batch only
    num_steps: int = 0  # engine steps taken
    token_ids: list[list[list[int]]] = field(default_factory=list)  # per conversation, per turn
    output_hashes: list[str] = field(default_factory=list)  # per conversation, over its token ids


class OfflineEngine:
    """One in-process or multiprocess vLLM engine for one system.

    target: model path or hub id. speculative_config: None for plain decoding (AR).
    liliprop_options: the draft-rule options (`VLLM_LILIPROP_OPTIONS`), None to leave it unset.
    engine_flags: `vllm.LLM` kwargs shared by every system of a comparison (see `llm_kwargs`).
    max_num_seqs: the concurrency c.
    without_liliprop: start the engine with this package left out of `VLLM_PLUGINS`, so that a
    DFlash draft runs on vLLM's own proposer (stock_dflash.py): the peer a user without it has.
    """

    def __init__(self, target: str, engine_flags: dict, speculative_config: dict | None = None,
                 liliprop_options: dict | None = None, max_num_seqs: int = 1,
                 without_liliprop: bool = False):
        self.target = target
        self.without_liliprop = without_liliprop
        self.engine_flags = dict(engine_flags)
        self.speculative_config = speculative_config
        self.liliprop_options = liliprop_options
        self.max_num_seqs = max_num_seqs
        self.llm: LLM | None = None
        self._batches = 0

    def __enter__(self) -> "OfflineEngine":
        kwargs = llm_kwargs(self.engine_flags)
        kwargs.setdefault("use_tqdm_on_load", load_progress())  # checkpoint-shard bars: --verbose only
        # The options are read when the proposer is built (in this process or a spawned one that
        # inherits the environment), so they only need to be set while the engine starts.
        # vLLM reads VLLM_PLUGINS, and the proposer its absence of liliprop, while the engine starts.
        plugins = (_env("VLLM_PLUGINS", plugins_without_liliprop()) if self.without_liliprop
                   else nullcontext())
        with liliprop_options_env(self.liliprop_options), plugins:
            self.llm = LLM(
                model=self.target,
                speculative_config=self.speculative_config,
                max_num_seqs=self.max_num_seqs,
                disable_log_stats=False,
                **kwargs,
            )
        self._tally = attach_tally(self.llm)
        return self

    def __exit__(self, *exc) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            core = getattr(llm.llm_engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            del llm
        gc.collect()

    @property
    def max_model_len(self) -> int:
        return int(self._engine().model_config.max_model_len)

    def serving(self) -> str:
        """What this engine serves, read back from vLLM's config: the dtype and the k drafted at
        each batch size up to max_num_seqs (k = 0: plain decoding steps), and how many tokens of
        the rule's block vLLM verifies where `rule_draft_length` cuts it, e.g.
        "dtype bfloat16, k 3 at batch 1-4, 0 at batch 5-16" or "dtype bfloat16, k 7 at batch 1, at
        most 3 verified (rule_draft_length)", and the confidence floor where one cuts greedy drafts."""
        config = self._engine().vllm_config
        dtype = str(config.model_config.dtype).removeprefix("torch.")
        served = f"dtype {dtype}, k {describe_k(k_by_batch_size(config.speculative_config, self.max_num_seqs))}"
        options = self.liliprop_options or {}
        cut, floor = options.get("rule_draft_length"), options.get("draft_confidence_floor")
        if cut is not None:
            served = f"{served}, at most {cut} verified (rule_draft_length)"
        return served if floor is None else f"{served}, greedy drafts cut below confidence {floor}"

    def counters(self) -> SpecDecodeCounters:
        """This engine's counters since it started (engine_counters.py: several engines may be open)."""
        self._llm()
        return self._tally.counters()

    def pin_k(self, k: int) -> None:
        """Draft exactly k tokens at every batch size from the next step on, in a running engine:
        one engine then measures every k in turn (eval schedule), so host drift between engines
        does not enter the comparison. Needs an in-process engine (scripts/env.sh sets
        VLLM_ENABLE_V1_MULTIPROCESSING=0) started with `num_speculative_tokens_per_batch_size`,
        whose dense batch-size -> k table vLLM's scheduler reads each step."""
        scheduler = getattr(getattr(self._engine().engine_core, "engine_core", None), "scheduler", None)
        table = getattr(scheduler, "dynamic_sd_lookup", None)
        if table is None:
            raise RuntimeError(
                "pin_k needs an in-process engine (VLLM_ENABLE_V1_MULTIPROCESSING=0) whose "
                "speculative_config has num_speculative_tokens_per_batch_size")
        if not 0 <= k <= scheduler.num_spec_tokens:
            raise ValueError(f"pin_k({k}): k must be 0..num_speculative_tokens = {scheduler.num_spec_tokens}")
        table[:] = [k] * len(table)

    def reset_prefix_cache(self) -> None:
        self._llm().reset_prefix_cache()

    def run_batch(self, conversations: Sequence[Sequence[str]], render: RenderFn,
                  sampling: Sampling, fresh_cache: bool = True, max_turns: int | None = None,
                  first_index: int = 0, concurrency: int | None = None) -> BatchResult:
        """Generate every turn of every conversation; later turns follow the engine's own answers.

        conversations: per conversation, its user turns (>= 1). render: messages -> prompt ids
        (the chat template, truncation). fresh_cache: empty the prefix cache first, so that a
        batch never reuses prefixes cached by an earlier batch (the warm-up, another seed).
        max_turns: stop each conversation after this many turns (warm-up uses 1).
        first_index: the position of the first conversation in a larger batch run a part at a
        time (eval's prompt-by-prompt rows), so each request keeps the seed it would have there.
        concurrency: hand the engine at most this many requests at a time, the rest queued first
        come first served (a later turn joins the back), as vLLM's scheduler admits them at
        `max_num_seqs = concurrency`: one engine built for a larger batch then serves c = 4 as an
        engine of c = 4 would (eval schedule's served batches). None: every request at once.
        """
        if concurrency is not None and concurrency < 1:
            raise ValueError(f"run_batch(concurrency={concurrency}): a concurrency is >= 1, or None")
        engine = self._engine()
        if engine.has_unfinished_requests():
            raise RuntimeError("the engine still has requests from an earlier batch")
        if fresh_cache:
            self.reset_prefix_cache()
        self._batches += 1
        tag = f"eval{self._batches}"
        turns = [list(c)[: max_turns or None] for c in conversations]
        if any(not t for t in turns):
            raise ValueError("every conversation needs at least one user turn")
        messages: list[Messages] = [[{"role": "user", "content": t[0]}] for t in turns]
        first_prompts = [render(m) for m in messages]
        answers: list[list[str]] = [[] for _ in turns]
        token_ids: list[list[list[int]]] = [[] for _ in turns]
        output_tokens = prompt_tokens = steps = 0

        def add(index: int, prompt_ids: list[int]) -> None:
            nonlocal prompt_tokens
            turn = len(answers[index])
            params = SamplingParams(
                temperature=sampling.temperature,
                max_tokens=sampling.max_tokens,
                seed=request_seed(sampling.seed, first_index + index, turn),
                ignore_eos=sampling.ignore_eos,
                output_kind=RequestOutputKind.FINAL_ONLY,
            )
            prompt_tokens += len(prompt_ids)
            waiting.append((f"{tag}-{index}-{turn}", {"prompt_token_ids": prompt_ids}, params))

        def admit() -> None:
            nonlocal in_flight
            while waiting and (concurrency is None or in_flight < concurrency):
                engine.add_request(*waiting.popleft())
                in_flight += 1

        waiting: deque = deque()
        in_flight = 0
        before = self.counters()
        start = time.perf_counter()
        for index, prompt_ids in enumerate(first_prompts):
            add(index, prompt_ids)
        admit()
        while engine.has_unfinished_requests():
            steps += 1
            for output in engine.step():
                if not output.finished:
                    continue
                in_flight -= 1
                _, index, _ = output.request_id.rsplit("-", 2)
                index = int(index)
                completion = output.outputs[0]
                output_tokens += len(completion.token_ids)
                token_ids[index].append(list(completion.token_ids))
                answers[index].append(completion.text)
                messages[index].append({"role": "assistant", "content": completion.text})
                done = len(answers[index])
                if done < len(turns[index]):
                    messages[index].append({"role": "user", "content": turns[index][done]})
                    add(index, render(messages[index]))
            admit()
        wall_s = time.perf_counter() - start
        counters = self.counters() - before
        return BatchResult(answers, output_tokens, prompt_tokens, wall_s, counters, steps,
                           token_ids, [output_hash(ids) for ids in token_ids])

    def stage_timer(self) -> "StageTimer":
        return StageTimer(self._llm())

    def _llm(self) -> LLM:
        if self.llm is None:
            raise RuntimeError("OfflineEngine is used outside its `with` block")
        return self.llm

    def _engine(self):
        return self._llm().llm_engine


def k_by_batch_size(speculative_config, max_batch: int) -> list[int]:
    """[k at batch 1, ..., k at batch max_batch] as vLLM's scheduler picks it: 0 without
    speculation, the schedule where one is set (vLLM's own lookup), else the fixed k."""
    if speculative_config is None:
        return [0] * max_batch
    top = int(speculative_config.num_speculative_tokens or 0)
    ranges = getattr(speculative_config, "num_speculative_tokens_per_batch_size", None)
    if not ranges:
        return [top] * max_batch
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    return build_dynamic_sd_schedule_lookup(ranges, max_batch, top)[1:]


def in_process_drafter(llm: LLM):
    """The proposer of an in-process engine's model runner (None in multiprocess mode, where it
    lives in the engine-core process)."""
    try:
        return llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
    except AttributeError:
        return None


def liliprop_options_env(options: dict | None):
    """VLLM_LILIPROP_OPTIONS = options while the block runs (None: unset), then as it was."""
    return _env(ENV_VAR, None if options is None else json.dumps(options))


@contextmanager
def _env(name: str, value: str | None):
    """os.environ[name] = value while the block runs (None: unset), the old value restored."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


# Stage names, in the order of a step. "step wall" is the whole step (plots draws it as a total).
TARGET_VERIFY = "target verify"
DRAFT_BACKBONE = "draft backbone"
LM_HEAD = "LM head"
SPECULATIVE_HEAD = "speculative head"
ACCEPT = "accept"
STEP_WALL = "step wall"
STAGES = (TARGET_VERIFY, DRAFT_BACKBONE, LM_HEAD, SPECULATIVE_HEAD, ACCEPT, STEP_WALL)


@dataclass
class StageTimes:
    seconds: dict[str, float] = field(default_factory=dict)  # raw per-method totals
    steps: int = 0  # model-runner steps (execute_model calls) timed

    def per_step_ms(self) -> dict[str, float]:
        """Milliseconds per step of each stage that ran (drafting stages only with a drafter).

        target verify    runner.execute_model: input preparation, target forward over the verified
                         tokens, target logits;
        accept           runner._sample: sampling / rejection sampling of the drafts;
        draft backbone   drafter.propose minus drafter._sample_draft_tokens: draft inputs and the
                         draft model forward;
        LM head          drafter.model.logits_processor: the draft's vocabulary projection, wherever
                         it is called (compute_logits, the rule, the greedy draft);
        speculative head drafter._sample_draft_tokens minus LM head: turning draft states into
                         tokens (argmax for DFlash, the lattice / DeLS rule otherwise);
        step wall        runner.execute_model + runner.sample_tokens: the whole step.
        """
        s = self.seconds
        if not self.steps:
            return {}
        stages = {TARGET_VERIFY: s.get("execute_model", 0.0), ACCEPT: s.get("_sample", 0.0)}
        if s.get("propose", 0.0) > 0.0:
            head_and_lm = s.get("_sample_draft_tokens", 0.0)
            stages[DRAFT_BACKBONE] = s["propose"] - head_and_lm
            stages[LM_HEAD] = s.get("compute_logits", 0.0)
            stages[SPECULATIVE_HEAD] = max(head_and_lm - stages[LM_HEAD], 0.0)
        stages[STEP_WALL] = s.get("execute_model", 0.0) + s.get("sample_tokens", 0.0)
        return {name: 1000.0 * stages[name] / self.steps for name in STAGES if name in stages}


_ABSENT = object()


class StageTimer:
    """Time stages of each step by wrapping methods of the in-process runner and drafter.

    Use as a context manager around one batch; the wrappers are removed on exit. On a GPU each
    wrapper synchronizes before and after its call, so timed steps lose their CPU/GPU overlap:
    take stage rows from their own batch, never throughput. Needs the in-process engine.
    """

    def __init__(self, llm: LLM):
        try:
            self.runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
        except AttributeError:
            raise RuntimeError(
                "stage timing needs the in-process engine: set VLLM_ENABLE_V1_MULTIPROCESSING=0"
            ) from None
        self.drafter = getattr(self.runner, "drafter", None)
        device = getattr(self.runner, "device", torch.device("cpu"))
        self._sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else None
        self.times = StageTimes()
        self._installed: list[tuple[object, str, object]] = []

    def __enter__(self) -> StageTimes:
        for name in ("execute_model", "sample_tokens", "_sample"):
            self._wrap(self.runner, name, count_steps=name == "execute_model")
        if self.drafter is not None:
            for name in ("propose", "_sample_draft_tokens"):  # n-gram drafters lack the second
                if hasattr(self.drafter, name):
                    self._wrap(self.drafter, name)
            model = getattr(self.drafter, "model", None)
            processor = getattr(model, "logits_processor", None)
            if processor is not None:
                # The projection itself, reached through compute_logits or directly by the
                # proposer's greedy draft (vllm_liliprop/vllm/draft_greedy.py).
                self._wrap(processor, "forward", key="compute_logits")
            elif model is not None and hasattr(model, "compute_logits"):
                self._wrap(model, "compute_logits")
        return self.times

    def __exit__(self, *exc) -> None:
        for owner, name, previous in reversed(self._installed):
            if previous is _ABSENT:
                owner.__dict__.pop(name, None)  # the class method shows through again
            else:
                owner.__dict__[name] = previous
        self._installed.clear()

    def _wrap(self, owner: object, name: str, count_steps: bool = False, key: str | None = None) -> None:
        original = getattr(owner, name)
        times, sync = self.times, self._sync
        key = key or name

        @functools.wraps(original)
        def timed(*args, **kwargs):
            if sync is not None:
                sync()
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if sync is not None:
                    sync()
                times.seconds[key] = times.seconds.get(key, 0.0) + time.perf_counter() - start
                if count_steps:
                    times.steps += 1

        self._installed.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        owner.__dict__[name] = timed
