"""The campaign: every system x benchmark (x category) x temperature x seed x concurrency.

Engines: one per (concurrency, system), reused across benchmarks, temperatures and seeds (the
concurrency is the engine's max_num_seqs, so a new c needs a new engine). For each concurrency AR
runs first, so every other system's rows find their speedup baseline; with `Protocol.paired` an
AR engine stays open beside each system's and AR runs again on each run row's prompts just
before it, its speedup's reference (columns paired_ar_*). An engine is only built when it has
unfinished rows (resume).

Each measurement: a warm-up batch (the first `warmup_requests` conversations, first turn,
`warmup_tokens` tokens, same sampling), then the timed batch on an emptied prefix cache; counters
and wall time cover the timed batch only. A run row at c = 1 runs its timed batch one prompt at a
time, with `Protocol.paired` AR's reference interleaved prompt by prompt, and writes one row per
prompt to the per-prompt file beside the results (eval.by_prompt, eval.prompt_results): the
intervals resample those prompts. T = 0 runs once (seed column = the first seed), T > 0
once per seed (each request derives its own sampling seed from it).

Stage rows (kind == "stage"): for the systems named in `stage_systems`, at c = 1, on
`stage_benchmarks`, at the first temperature and seed; a separate batch with the stage timer of
vllm_liliprop.vllm.offline installed (see StageTimes.per_step_ms for what each stage covers).
"""

from __future__ import annotations

import json
import math
import os
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from tqdm import tqdm

from eval.benchmarks import Benchmark, Example, measurement_groups
from eval.by_prompt import REFERENCE, measure_side_by_side
from eval.machine import machine_record
from eval.metrics import run_metrics, speedup
from eval.paired import CheckedReference, checked_reference
from eval.prompt_results import PromptResultsFile
from eval.prompts import RAW, PromptRenderer
from eval.results import ResultsFile, git_revision, new_run_id, now
from eval.side_by_side import run_side_by_side
from eval.systems import BASELINE, System, checkpoint_hash

# Environment variables that change engine speed, recorded with the engine flags.
RECORDED_ENV = ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND",
                "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "VLLM_USE_V2_MODEL_RUNNER",
                "VLLM_ATTENTION_BACKEND")
# offline.STEP_WALL (not imported: that module imports vLLM). Written last, its row marks a
# finished stage measurement.
STEP_WALL = "step wall"


@dataclass(frozen=True)
class Protocol:
    temperatures: tuple[float, ...] = (0.0, 1.0)
    seeds: tuple[int, ...] = (42, 43, 44)
    concurrency: tuple[int, ...] = (1,)
    max_tokens: int = 1024  # generation cap per turn
    ignore_eos: bool = False
    warmup_requests: int | None = None  # None: as many as the concurrency
    warmup_tokens: int = 16
    prompt_format: str = "chat"
    source: str = "local"
    limit: int | None = None  # prompts per benchmark (per category where split)
    # Measure AR again on the same prompts just before each other system's run row, with an AR
    # engine kept open beside the system's, and take the speedup over that run: side by side,
    # so a machine whose speed drifts during a campaign still gives each ratio in one moment.
    paired: bool = False
    # At c = 1: timed runs of each prompt (arms interleaved), each arm's fastest kept (eval.by_prompt).
    repeats: int = 1
    # With paired, at c = 1: every system's engine open at once, one AR run per prompt the
    # reference of every system's run of it (eval.side_by_side).
    side_by_side: bool = False

    def seeds_for(self, temperature: float) -> tuple[int, ...]:
        return self.seeds if temperature > 0 else self.seeds[:1]

    def record(self, chat_kwargs: dict) -> str:
        """JSON for the protocol column: what every arm shares besides the key columns."""
        fields = asdict(self)
        for key in ("temperatures", "seeds", "concurrency"):
            fields.pop(key)
        for name, default in (("paired", False), ("repeats", 1), ("side_by_side", False)):
            if fields[name] == default:
                fields.pop(name)  # the record of runs from before the option existed
        fields.update(chat_template_kwargs=chat_kwargs, top_p=1.0, top_k=0)
        return json.dumps(fields, sort_keys=True)


@dataclass
class Measurement:
    kind: str  # "run" | "stage"
    system: System
    benchmark: Benchmark
    category: str
    examples: list[Example]
    temperature: float
    concurrency: int
    seed: int
    template: dict = field(default_factory=dict)  # key + provenance columns


@dataclass
class Campaign:
    target: str
    systems: list[System]
    benchmarks: list[tuple[Benchmark, list[Example]]]
    protocol: Protocol
    engine_flags: dict
    results: ResultsFile
    stage_systems: tuple[str, ...] = ()
    stage_benchmarks: tuple[str, ...] = ()
    data_provenance: dict[str, str] = field(default_factory=dict)  # benchmark -> column value
    log: Callable[[str], None] = print
    run_id: str = field(default_factory=new_run_id)
    _tokenizer: object = field(default=None, repr=False)

    def plan(self, chat_kwargs: dict, vllm_version: str) -> list[Measurement]:
        """Every measurement of the campaign in run order, finished ones included."""
        unknown = [s for s in self.stage_systems if s not in {x.name for x in self.systems}]
        if unknown:
            raise ValueError(f"--stages names system(s) {unknown} that are not in the run")
        self._check_single_turn()
        shared = {
            "run_id": self.run_id,
            "git_rev": git_revision(),
            "vllm_version": vllm_version,
            "target": self.target,
            "engine_flags": self.engine_flags_record(),
            "protocol": self.protocol.record(chat_kwargs),
            "machine": machine_record(),
        }
        levels = sorted(set(self.protocol.concurrency) | ({1} if self.stage_systems else set()))
        out = []
        for c in levels:
            for system in self.systems:
                if c in self.protocol.concurrency:
                    out += self._measurements("run", system, c, self.benchmarks,
                                              self.protocol.temperatures, self.protocol.seeds_for)
                if c == 1 and system.name in self.stage_systems:
                    chosen = [b for b in self.benchmarks if b[0].name in self.stage_benchmarks]
                    first_t = self.protocol.temperatures[:1]
                    out += self._measurements("stage", system, c, chosen, first_t,
                                              lambda t: self.protocol.seeds[:1])
        for m in out:
            m.template = self._template(m, shared)
        return out

    def _check_single_turn(self) -> None:
        """Raw prompts have no template to carry a conversation: refuse a multi-turn one before
        any engine starts, rather than after its first turn was generated."""
        if self.protocol.prompt_format != RAW:
            return
        for spec, examples in self.benchmarks:
            multi = [e.id for e in examples if len(e.turns) > 1]
            if multi:
                raise ValueError(f"--prompt-format raw takes single-turn prompts only, but {spec.name} "
                                 f"has {len(multi)} multi-turn conversation(s) (first: id {multi[0]!r}); "
                                 "use --prompt-format chat or leave that benchmark out")

    def _measurements(self, kind, system, c, benchmarks, temperatures, seeds_for):
        out = []
        for spec, examples in benchmarks:
            for category, group in measurement_groups(examples, spec).items():
                for t in temperatures:
                    for seed in seeds_for(t):
                        out.append(Measurement(kind, system, spec, category, group, t, c, seed))
        return out

    def _template(self, m: Measurement, shared: dict) -> dict:
        alpha, beta = m.system.dels_weights()
        return {
            "kind": m.kind, "system": m.system.name, "benchmark": m.benchmark.name,
            "category": m.category, "temperature": float(m.temperature),
            "concurrency": m.concurrency, "input_len": m.benchmark.input_len, "seed": m.seed,
            "dels_alpha": alpha, "dels_beta": beta, "stage": STEP_WALL if m.kind == "stage" else "",
            **shared,
            "draft": m.system.draft,
            "checkpoint_hash": checkpoint_hash(m.system),
            "system_config": m.system.config_json(),
            "data_provenance": self.data_provenance.get(m.benchmark.name, ""),
        }

    @property
    def prompt_results(self) -> PromptResultsFile:
        """The per-prompt rows beside the results file (eval.prompt_results)."""
        return PromptResultsFile(self.results.path)

    def renderer(self, max_prompt_tokens: int | None = None) -> PromptRenderer:
        """A prompt renderer over the target's tokenizer (loaded once)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.target)
        return PromptRenderer(self._tokenizer, self.protocol.prompt_format, max_prompt_tokens)

    def engine_flags_record(self) -> str:
        env = {k: os.environ[k] for k in RECORDED_ENV if k in os.environ}
        return json.dumps({**self.engine_flags, "env": env}, sort_keys=True)

    def run(self, progress: bool = True) -> int:
        """Run every unfinished measurement; returns the number of rows written."""
        plan = self.plan(self.renderer().chat_kwargs, vllm_version="")
        todo = [m for m in plan if not self.results.has(m.template)]
        self.log(f"eval run {self.run_id}: {len(plan)} measurements, {len(plan) - len(todo)} "
                 f"already in {self.results.path}, {len(todo)} to run")
        if not todo:
            return 0
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1").lower() in ("0", "false")
        if any(m.kind == "stage" for m in todo) and not in_process:
            raise ValueError("--stages times the in-process engine: set "
                             "VLLM_ENABLE_V1_MULTIPROCESSING=0 for the whole run (every arm alike)")
        from vllm_liliprop.vllm import offline  # imports vLLM: only when there is work

        for m in todo:
            m.template["vllm_version"] = offline.vllm_version()

        bar = tqdm(total=len(todo), disable=not progress, dynamic_ncols=True, desc="eval")
        written = 0
        paired = _PairedBaseline(self, offline) if self.protocol.paired else None
        try:
            if self.protocol.side_by_side:
                written += run_side_by_side(self, [m for m in todo if m.concurrency == 1], offline, paired, bar)
                todo = [m for m in todo if m.concurrency != 1]
            for (c, system), items in _by_engine(todo):
                if paired is not None and not system.is_baseline and any(m.kind == "run" for m in items):
                    # AR's engine opens once per concurrency, kept beside each system's (each
                    # engine counts its own drafts: vllm_liliprop/vllm/engine_counters.py).
                    paired.open(c)
                with self.engine(offline, system, c) as engine:
                    render = self.renderer(self.prompt_limit(engine))
                    self.log(f"{system.name} c={c}: {engine.serving()}")
                    for m in items:
                        bar.set_description(f"{system.name} c={c} {m.benchmark.name}"
                                            f"{'/' + m.category if m.category else ''} "
                                            f"T={m.temperature:g} s={m.seed}")
                        rows, prompt_rows = self.measure(engine, render, m, offline, paired)
                        self.log_truncated(m, rows[-1]["num_truncated"], render.max_prompt_tokens)
                        written += self.write(rows, prompt_rows)
                        bar.update(1)
        finally:
            bar.close()
            if paired is not None:
                paired.close()
        return written

    def engine(self, offline, system: System, c: int):
        """The engine that serves `system` at concurrency c (a context manager)."""
        return offline.OfflineEngine(self.target, self.engine_flags, system.speculative_config,
                                     system.options(), max_num_seqs=c,
                                     without_liliprop=system.without_liliprop)

    def write(self, rows: list[dict], prompt_rows: list[dict]) -> int:
        """One measurement's rows into the results file (its per-prompt rows beside them);
        the number written."""
        self.prompt_results.append(rows[-1], prompt_rows)
        for row in rows:
            self.results.append(row)
        return len(rows)

    def log_truncated(self, m: Measurement, count: int, limit: int | None) -> None:
        if count:
            self.log(f"{m.system.name} {m.benchmark.name}{'/' + m.category if m.category else ''}: "
                     f"{count} prompt(s) right-truncated to {limit} tokens (max_model_len "
                     f"{limit + self.protocol.max_tokens} - max_tokens {self.protocol.max_tokens})")

    def prompt_limit(self, engine) -> int:
        limit = engine.max_model_len - self.protocol.max_tokens
        if limit <= 0:
            raise ValueError(f"max_tokens = {self.protocol.max_tokens} leaves no room for "
                             f"a prompt in max_model_len = {engine.max_model_len}")
        return limit

    def _warm(self, engine, render, m: Measurement, offline) -> None:
        """The measurement's warm-up batch (its first conversations, first turn)."""
        p = self.protocol
        conversations = [list(e.turns) for e in m.examples]
        warmup = min(p.warmup_requests or m.concurrency, len(conversations))
        if warmup > 0 and p.warmup_tokens > 0:
            engine.run_batch(conversations[:warmup], render,
                             offline.Sampling(m.temperature, p.warmup_tokens, self._seed(m), p.ignore_eos),
                             max_turns=1)

    def _seed(self, m: Measurement) -> int | None:
        return m.seed if m.temperature > 0 else None

    def _warm_and_run(self, engine, render, m: Measurement, offline, stages: bool = False):
        """The measurement's warm-up batch, then its timed batch: its BatchResult, with
        `stages` the StageTimes of that batch (else None), and how many of the timed batch's
        prompts (every turn counted) were right-truncated."""
        p = self.protocol
        conversations = [list(e.turns) for e in m.examples]
        self._warm(engine, render, m, offline)
        sampling = offline.Sampling(m.temperature, p.max_tokens, self._seed(m), p.ignore_eos)
        # The renderer counts every prompt it cut; the warm-up's cuts are not the row's.
        before = render.num_truncated
        if not stages:
            return engine.run_batch(conversations, render, sampling), None, render.num_truncated - before
        with engine.stage_timer() as times:
            result = engine.run_batch(conversations, render, sampling)
        return result, times, render.num_truncated - before

    def _run_row(self, engine, render, m: Measurement, offline, paired: "_PairedBaseline | None"):
        """A run row's BatchResult (or Totals), truncated prompts, AR reference (--paired, checked
        by eval.paired; None without) and per-prompt rows: at c = 1 prompt by prompt
        (eval.by_prompt), else one batch beside its reference batch (system_goes_first)."""
        wanted = paired is not None and not m.system.is_baseline
        job_rates = self.results.job_rates(m.template, BASELINE) if wanted else []
        if m.concurrency != 1:
            reference = None
            if wanted and not system_goes_first(m):
                reference = paired.measure(m, job_rates)
            result, _, truncated = self._warm_and_run(engine, render, m, offline)
            if wanted and reference is None:
                reference = paired.measure(m, job_rates)
            return result, truncated, reference, []
        name = m.system.name
        [(_, measured, truncated)] = self.measure_prompt_set(
            [m], {name: engine}, {name: render}, offline, paired if wanted else None)
        return measured.result, truncated, measured.reference, measured.prompt_rows

    def measure_prompt_set(self, group: list[Measurement], engines: dict, renders: dict, offline,
                           paired: "_PairedBaseline | None" = None):
        """[(measurement, eval.by_prompt.ByPrompt, truncated prompts)] for run measurements at
        c = 1 that share prompts and sampling, prompt by prompt, each on its system's engine and
        render (by name). With `paired`, AR runs once per prompt as every system's reference and
        AR's own measurement, if in the group, is made of those runs (--side-by-side)."""
        first, p = group[0], self.protocol
        conversations = [list(e.turns) for e in first.examples]
        sampling = offline.Sampling(first.temperature, p.max_tokens, self._seed(first), p.ignore_eos)
        arms = [m for m in group if paired is None or not m.system.is_baseline]
        for m in arms:
            self._warm(engines[m.system.name], renders[m.system.name], m, offline)
        run_reference = paired.prompt_runner(first, sampling) if paired is not None else None
        renders = renders if paired is None else {**renders, REFERENCE: paired.render}
        before = {name: render.num_truncated for name, render in renders.items()}

        def runner(name):
            return lambda i: engines[name].run_batch(conversations[i:i + 1], renders[name], sampling,
                                                     first_index=i)

        job_rates = self.results.job_rates(first.template, BASELINE) if paired is not None else []
        measured = measure_side_by_side(conversations, [e.id for e in first.examples],
                                        {m.system.name: runner(m.system.name) for m in arms},
                                        run_reference, job_rates, p.repeats)
        for checked in measured[REFERENCE].references if paired is not None else ():
            paired.log_retries(first, checked, job_rates)
        answer = []
        for m in group:
            name = REFERENCE if paired is not None and m.system.is_baseline else m.system.name
            # Each repeat renders the prompts again: count each cut prompt once.
            answer.append((m, measured[name], (renders[name].num_truncated - before[name]) // p.repeats))
        return answer

    def measure(self, engine, render, m: Measurement, offline,
                 paired: "_PairedBaseline | None" = None) -> tuple[list[dict], list[dict]]:
        """The rows of one measurement and, for a run row measured prompt by prompt, its
        per-prompt rows. With `paired`, a run row's reference is AR's run on the same prompts
        beside it (the speedup's reference); otherwise AR's row in the results file."""
        base = {**m.template, "num_prompts": len(m.examples), "timestamp": now()}
        if m.kind == "run":
            result, truncated, paired_ar, prompt_rows = self._run_row(engine, render, m, offline, paired)
            return [self.run_row_dict(m, result, truncated, paired_ar)], prompt_rows
        result, times, truncated = self._warm_and_run(engine, render, m, offline, stages=True)
        metrics = {"num_truncated": truncated,
                   **run_metrics(result.counters, result.output_tokens, result.wall_s)}
        stages = times.per_step_ms()
        # "step wall" last: its row marks the measurement as finished for resume.
        names = [s for s in stages if s != STEP_WALL] + [STEP_WALL]
        return [{**base, **metrics, "stage": s, "stage_ms": stages.get(s, math.nan),
                 "speedup": math.nan, "output_hashes": "[]"} for s in names], []

    def run_row_dict(self, m: Measurement, result, truncated: int,
                      paired_ar: CheckedReference | None) -> dict:
        """A run row of the results file: m's columns, the run's metrics, its speedup over its
        paired AR reference (else over AR's row in the results file)."""
        row = {**m.template, "num_prompts": len(m.examples), "timestamp": now(), "num_truncated": truncated,
               **run_metrics(result.counters, result.output_tokens, result.wall_s),
               "stage_ms": math.nan, "output_hashes": json.dumps(result.output_hashes),
               "paired_ar_output_tokens": math.nan, "paired_ar_wall_s": math.nan,
               "paired_ar_retries": math.nan, "paired_ar_outlier": math.nan}
        if m.system.name == BASELINE:
            baseline = row["tokens_per_s"]
        elif paired_ar is not None:
            row.update(paired_ar_output_tokens=paired_ar.result.output_tokens,
                       paired_ar_wall_s=paired_ar.result.wall_s, paired_ar_retries=paired_ar.retries,
                       paired_ar_outlier=int(paired_ar.outlier))
            # An outlier reference's ratio says more about the stall than the system: unused.
            baseline = None if paired_ar.outlier else paired_ar.tokens_per_s
        else:
            baseline = self.results.baseline_tokens_per_s(row, BASELINE)
        row["speedup"] = speedup(row["tokens_per_s"], baseline)
        return row


def system_goes_first(m: Measurement) -> bool:
    """Whether a paired batch (c > 1) runs the system before its AR reference. Why alternate:
    with AR always first, any order effect lands on the system's side of every c > 1 ratio, and
    one step-level comparison on this 2-core host saw engines run later in a fixed order up to
    15% slower (docs/measurements-smollm2.md, 2026-12-05 17:37). The two seeds of a sampled row
    (consecutive integers) take opposite orders; at T = 0 the order varies by benchmark.
    Deterministic, so a resumed job keeps it."""
    return (zlib.crc32(f"{m.benchmark.name}/{m.category}".encode()) + m.seed) % 2 == 1


class _PairedBaseline:
    """--paired: an AR engine per concurrency, kept open beside the systems' engines, that runs
    AR on a measurement's prompts (same protocol) when asked; its runs are not written."""

    def __init__(self, campaign: Campaign, offline):
        self.campaign, self.offline = campaign, offline
        self.baseline = next((s for s in campaign.systems if s.is_baseline), None)
        if self.baseline is None:
            raise ValueError(f"--paired measures every system against {BASELINE!r}: add it to the run")
        self.engine = None
        self.render = None
        self.concurrency = None

    def open(self, concurrency: int) -> None:
        """AR's engine at this concurrency (kept when it is already open)."""
        if self.concurrency == concurrency:
            return
        self.close()
        self.engine = self.offline.OfflineEngine(self.campaign.target, self.campaign.engine_flags,
                                                 max_num_seqs=concurrency).__enter__()
        self.render = self.campaign.renderer(self.campaign.prompt_limit(self.engine))
        self.concurrency = concurrency

    def measure(self, m: Measurement, job_rates: list[float]) -> CheckedReference:
        """AR on m's prompts, measured again (eval.paired) while an outlier against job_rates."""
        self.open(m.concurrency)

        def once():
            return self.campaign._warm_and_run(self.engine, self.render, m, self.offline)[0]

        checked = checked_reference(once, job_rates)
        self.log_retries(m, checked, job_rates)
        return checked

    def prompt_runner(self, m: Measurement, sampling) -> Callable[[int], object]:
        """Warm AR's engine for m; then run(i) is AR on m's i-th conversation alone (eval.by_prompt)."""
        self.open(m.concurrency)
        self.campaign._warm(self.engine, self.render, m, self.offline)
        conversations = [list(e.turns) for e in m.examples]
        return lambda i: self.engine.run_batch(conversations[i:i + 1], self.render, sampling, first_index=i)

    def log_retries(self, m: Measurement, checked: CheckedReference, job_rates: list[float]) -> None:
        if checked.retries:
            median = sorted(job_rates)[len(job_rates) // 2]
            self.campaign.log(f"paired AR reference for {m.system.name} on {m.benchmark.name}: measured "
                              f"{checked.retries + 1} times (job's AR median about {median:.0f} tok/s, last "
                              f"{checked.tokens_per_s:.0f})" + ("; still an outlier, speedup not used"
                                                                 if checked.outlier else ""))

    def close(self) -> None:
        if self.engine is not None:
            self.engine.__exit__(None, None, None)
        self.engine = self.concurrency = None


def _by_engine(todo: list[Measurement]):
    """Consecutive measurements sharing (concurrency, system): one engine each."""
    groups: list[tuple[tuple[int, System], list[Measurement]]] = []
    for m in todo:
        key = (m.concurrency, m.system)
        if groups and groups[-1][0] == key:
            groups[-1][1].append(m)
        else:
            groups.append((key, [m]))
    return groups
