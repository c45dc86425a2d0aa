"""The training loop shared by every command: AdamW with per-module groups, cosine schedule
with linear warmup, gradient clipping, bf16 autocast, exact resume and torchrun DDP.

Determinism contract (what makes resume and DDP checks exact):
  * the example order of epoch e is a permutation drawn from (seed, e);
  * a global step consumes the next `global_batch = batch_size * world_size * grad_accum`
    examples of that order (an incomplete tail batch is dropped); rank r takes the r-th
    contiguous slice, micro-batch j the j-th slice of that;
  * everything random inside a step (anchors) is seeded per example (blocks.example_seed);
  * a checkpoint stores model, optimizer, scheduler, RNG states and (epoch, batch) position.

Models plug in through a small protocol:
  model(**inputs) -> dict of tensors with "loss" (and any scalar metrics);
  model.loss_for_ranks(terms, mean_over_ranks) -> the loss rescaled so that averaging the
      ranks' gradients equals the gradient of the global (all-rank) mean (used when world > 1).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import resource
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from tqdm import tqdm

from training.blocks import example_seed
from vllm_liliprop.host import BF16_MIN_SPEEDUP, cpu_bf16_matmul_speedup

__all__ = ["OptimConfig", "TrainConfig", "DistEnv", "Trainer", "param_groups", "cosine_with_warmup",
           "auto_precision", "cpu_autocast"]


@dataclass
class OptimConfig:
    """Table 4: AdamW, lr 6e-4 / 1.5e-4 and weight decay 0 / 0.01 (drafter / head),
    cosine schedule with 4% warmup, gradient-norm clip 1.0."""

    lr: dict[str, float] = field(default_factory=lambda: {"drafter": 6e-4, "head": 1.5e-4})
    weight_decay: dict[str, float] = field(default_factory=lambda: {"drafter": 0.0, "head": 0.01})
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup_ratio: float = 0.04
    warmup_steps: int | None = None  # when set, the warmup length in steps (warmup_ratio unused)
    min_lr_ratio: float = 0.0
    clip_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        if set(self.lr) != set(self.weight_decay):
            raise ValueError(f"optim.lr keys {sorted(self.lr)} and optim.weight_decay keys "
                             f"{sorted(self.weight_decay)} must name the same module groups")
        if not 0 <= self.warmup_ratio < 1:
            raise ValueError(f"optim.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ValueError(f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")


@dataclass
class TrainConfig:
    output_dir: str
    epochs: float = 6.0
    max_steps: int | None = None
    batch_size: int = 1  # sequences per rank per micro-batch
    grad_accum: int = 1
    precision: str = "auto"  # "auto" (bf16 where measured fast: auto_precision), "bf16", "fp32"
    seed: int = 0
    save_every: int = 1000
    keep_checkpoints: int = 2
    log_every: int = 10
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        if isinstance(self.optim, dict):
            self.optim = OptimConfig(**self.optim)
        if self.precision not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision must be auto, bf16 or fp32, got {self.precision!r}")
        for name in ("batch_size", "grad_accum", "save_every", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environment(cls, device: str | None = None) -> "DistEnv":
        """Join the torchrun process group when WORLD_SIZE > 1 (gloo on CPU, nccl on CUDA)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if not dist.is_initialized():
            backend = "nccl" if (device or "").startswith("cuda") else "gloo"
            dist.init_process_group(backend=backend)
        return cls(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def param_groups(modules: dict[str, nn.Module], optim: OptimConfig) -> list[dict[str, Any]]:
    """One AdamW group per named module (lr and weight decay from `optim`).

    Weight decay applies to matrices and embedding tables only; norm gains and biases (1-D)
    are never decayed.
    """
    groups = []
    for name, module in modules.items():
        if name not in optim.lr:
            raise ValueError(f"optim.lr has no entry for module group {name!r} (has {sorted(optim.lr)})")
        params = [p for p in module.parameters() if p.requires_grad]
        decayed = [p for p in params if p.dim() >= 2]
        plain = [p for p in params if p.dim() < 2]
        for suffix, members, wd in (("", decayed, optim.weight_decay[name]), (".no_decay", plain, 0.0)):
            if members:
                groups.append({"name": name + suffix, "params": members, "lr": optim.lr[name], "weight_decay": wd})
    return groups


def cosine_with_warmup(total_steps: int, warmup_ratio: float, min_lr_ratio: float = 0.0,
                       warmup_steps: int | None = None) -> Callable[[int], float]:
    """LR multiplier: linear warmup over ceil(warmup_ratio * total) steps (or exactly
    `warmup_steps` when given), then cosine decay to min_lr_ratio."""
    warmup = math.ceil(warmup_ratio * total_steps) if warmup_steps is None else int(warmup_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def auto_precision(device: torch.device) -> str:
    """What precision "auto" trains in: bf16 autocast where the hardware runs it fast (CUDA; a
    CPU whose bf16 matmul is at least BF16_MIN_SPEEDUP times fp32, measured: 4.3x with AMX,
    2.3x on an AMD EPYC with AVX512-BF16), else fp32."""
    if device.type == "cuda":
        return "bf16"
    return "bf16" if device.type == "cpu" and cpu_bf16_matmul_speedup() >= BF16_MIN_SPEEDUP else "fp32"


def cpu_autocast() -> torch.autocast:
    """bf16 autocast on a CPU that runs bf16 fast (auto_precision), else off: on an AVX2-only
    host bf16 is emulated at ~0.01x fp32, and a head store or head training took hours there."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=auto_precision(torch.device("cpu")) == "bf16")


def epoch_order(num_examples: int, seed: int, epoch: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(num_examples, generator=generator).tolist()


class Trainer:
    """Runs `model` over `num_examples` examples fed by `make_inputs(indices, epoch)`.

    model: an nn.Module following the protocol in the module docstring.
    trainable: named modules whose parameters are optimized (names index optim.lr), e.g.
        {"drafter": objective.drafter, "head": objective.lattice}; their state dicts form the
        checkpoint.
    make_inputs(example_indices, epoch) -> kwargs for model(...), already on the device.
    on_save(step, checkpoint_dir) is called (main rank) after every checkpoint, e.g. to
        export a servable model directory.
    checkpoint_extras: stored in every checkpoint next to the weights (configs an exporter
        needs to rebuild the modules).
    """

    def __init__(
        self,
        model: nn.Module,
        trainable: dict[str, nn.Module],
        make_inputs: Callable[[list[int], int], dict[str, Any]],
        num_examples: int,
        config: TrainConfig,
        *,
        device: torch.device | str = "cpu",
        dist_env: DistEnv | None = None,
        on_save: Callable[[int, Path], None] | None = None,
        checkpoint_extras: dict[str, Any] | None = None,
        progress: bool = True,
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.env = dist_env or DistEnv()
        self.model = model
        self.trainable = trainable
        self.make_inputs = make_inputs
        self.num_examples = num_examples
        self.on_save = on_save
        self.checkpoint_extras = checkpoint_extras or {}
        self.progress = progress
        self.output_dir = Path(config.output_dir)

        self.global_batch = config.batch_size * self.env.world_size * config.grad_accum
        self.steps_per_epoch = num_examples // self.global_batch
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"{num_examples} examples do not fill one global batch of {self.global_batch} "
                "(batch_size * world_size * grad_accum); lower batch_size or add data"
            )
        self.total_steps = (
            config.max_steps if config.max_steps is not None else math.ceil(config.epochs * self.steps_per_epoch)
        )

        self.optimizer = torch.optim.AdamW(
            param_groups(trainable, config.optim), betas=config.optim.betas, eps=config.optim.eps
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            cosine_with_warmup(self.total_steps, config.optim.warmup_ratio, config.optim.min_lr_ratio,
                               config.optim.warmup_steps),
        )
        self.step = 0
        self.wrapped = model
        if self.env.world_size > 1:
            with warnings.catch_warnings():
                # The frozen target weights are buffers that never change: no per-step sync.
                warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
                self.wrapped = nn.parallel.DistributedDataParallel(
                    model,
                    device_ids=[self.device.index] if self.device.type == "cuda" else None,
                    broadcast_buffers=False,
                )

    # -- precision -------------------------------------------------------------------------
    def _autocast(self):
        precision = self.config.precision
        if precision == "auto":
            precision = auto_precision(self.device)
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    # -- data position ---------------------------------------------------------------------
    def _step_examples(self, step: int) -> tuple[int, list[list[int]]]:
        """(epoch, this rank's micro-batches of example indices) for a global step."""
        epoch, batch_in_epoch = divmod(step, self.steps_per_epoch)
        order = epoch_order(self.num_examples, self.config.seed, epoch)
        start = batch_in_epoch * self.global_batch
        per_rank = self.config.batch_size * self.config.grad_accum
        mine = order[start + self.env.rank * per_rank: start + (self.env.rank + 1) * per_rank]
        bs = self.config.batch_size
        return epoch, [mine[i:i + bs] for i in range(0, per_rank, bs)]

    # -- one optimizer step ----------------------------------------------------------------
    def _mean_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        value = value.detach().clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value / self.env.world_size

    def train_step(self) -> dict[str, float]:
        self.model.train()
        epoch, micro_batches = self._step_examples(self.step)
        logs: dict[str, float] = {}
        for j, indices in enumerate(micro_batches):
            inputs = self.make_inputs(indices, epoch)
            last = j == len(micro_batches) - 1
            sync = self.wrapped.no_sync() if (self.env.world_size > 1 and not last) else contextlib.nullcontext()
            with sync:
                with self._autocast():
                    terms = self.wrapped(**inputs)
                loss = terms["loss"]
                if self.env.world_size > 1:
                    loss = self.model.loss_for_ranks(terms, self._mean_over_ranks)
                (loss / len(micro_batches)).backward()
            for key, value in terms.items():
                if torch.is_tensor(value) and value.numel() == 1:
                    logs[key] = logs.get(key, 0.0) + float(value.detach()) / len(micro_batches)
        params = [p for module in self.trainable.values() for p in module.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.config.optim.clip_grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        logs["grad_norm"] = float(grad_norm)
        for group in self.optimizer.param_groups:
            if not group["name"].endswith(".no_decay"):
                logs[f"lr/{group['name']}"] = group["lr"]
        return logs

    @torch.no_grad()
    def evaluate(self, example_indices: Sequence[int], epoch: int = 0) -> dict[str, float]:
        """Mean of every scalar term over `example_indices` (batches of batch_size), without
        gradients or updates. Runs on this process only (no cross-rank reduction)."""
        self.model.eval()
        sums: dict[str, float] = {}
        batches = [list(example_indices[i:i + self.config.batch_size])
                   for i in range(0, len(example_indices), self.config.batch_size)]
        for indices in batches:
            with self._autocast():
                terms = self.model(**self.make_inputs(indices, epoch))
            for key, value in terms.items():
                if torch.is_tensor(value) and value.numel() == 1:
                    sums[key] = sums.get(key, 0.0) + float(value) / len(batches)
        self.model.train()
        return sums

    # -- checkpoints -----------------------------------------------------------------------
    def checkpoint_dir(self, step: int) -> Path:
        return self.output_dir / "checkpoints" / f"step_{step:08d}"

    def save_checkpoint(self) -> Path:
        path = self.checkpoint_dir(self.step)
        if self.env.is_main:
            path.mkdir(parents=True, exist_ok=True)
            state = {
                "step": self.step,
                "modules": {name: m.state_dict() for name, m in self.trainable.items()},
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "rng": {
                    "torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                    "python": random.getstate(),
                },
                "config": self.config.to_dict(),
                "world_size": self.env.world_size,
                **self.checkpoint_extras,
            }
            tmp = path / "state.pt.tmp"
            torch.save(state, tmp)
            tmp.replace(path / "state.pt")
            self._prune_checkpoints()
            if self.on_save is not None:
                self.on_save(self.step, path)
        if self.env.world_size > 1:
            dist.barrier()
        return path

    def _prune_checkpoints(self) -> None:
        root = self.output_dir / "checkpoints"
        done = sorted(p for p in root.glob("step_*") if (p / "state.pt").exists())
        for old in done[: max(0, len(done) - self.config.keep_checkpoints)]:
            shutil.rmtree(old, ignore_errors=True)

    def latest_checkpoint(self) -> Path | None:
        root = self.output_dir / "checkpoints"
        done = sorted(p for p in root.glob("step_*") if (p / "state.pt").exists())
        return done[-1] if done else None

    def load_checkpoint(self, path: str | Path) -> None:
        path = Path(path)
        file = path / "state.pt" if path.is_dir() else path
        if not file.exists():
            raise ValueError(f"no checkpoint at {file}")
        state = torch.load(file, map_location="cpu", weights_only=False)
        saved = state["config"]
        saved_global = saved["batch_size"] * saved["grad_accum"] * state.get("world_size", 1)
        if saved_global != self.global_batch:
            raise ValueError(
                f"checkpoint global batch {saved_global} differs from this run's {self.global_batch} "
                "(batch_size * world_size * grad_accum); resume with the same global batch so the "
                "data position stays exact"
            )
        for name, module in self.trainable.items():
            module.load_state_dict(state["modules"][name])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        torch.set_rng_state(state["rng"]["torch"])
        if state["rng"]["cuda"] is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
        random.setstate(state["rng"]["python"])

    def retarget(self, total_steps: int) -> None:
        """Make the run `total_steps` long from where it stands: the cosine schedule is rebuilt
        for the new length and resumes at the current step (a run sized by a time budget learns
        its step time first, during warm-up)."""
        if total_steps < self.step:
            raise ValueError(f"total_steps {total_steps} is below the current step {self.step}")
        optim = self.config.optim
        self.total_steps = total_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, cosine_with_warmup(total_steps, optim.warmup_ratio, optim.min_lr_ratio, optim.warmup_steps),
            last_epoch=self.step - 1)

    # -- the loop --------------------------------------------------------------------------
    def fit(self, resume: str | Path | bool | None = None, deadline: float | None = None) -> list[dict[str, float]]:
        """Train to `total_steps`. resume: a checkpoint path, True (latest in output_dir), or None.
        deadline: a time.time() after which the loop saves a checkpoint and returns early (a rerun
        resumes there). Returns the per-step logs of this process (also appended to
        output_dir/metrics.jsonl)."""
        if resume is True:
            resume = self.latest_checkpoint()
        if resume:
            self.load_checkpoint(resume)
        history = []
        metrics_file = None
        if self.env.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            metrics_file = open(self.output_dir / "metrics.jsonl", "a", encoding="utf-8")
        bar = tqdm(total=self.total_steps, initial=self.step, disable=not (self.progress and self.env.is_main),
                   desc="train")
        began, first_step = time.time(), self.step
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        try:
            while self.step < self.total_steps:
                logs = self.train_step()
                logs["step"] = self.step
                history.append(logs)
                bar.update(1)
                if metrics_file is not None and (self.step % self.config.log_every == 0 or self.step == self.total_steps):
                    logs["elapsed_s"] = round(time.time() - began, 3)
                    metrics_file.write(json.dumps(logs) + "\n")
                    metrics_file.flush()
                    bar.set_postfix(loss=f"{logs['loss']:.4f}")
                if self.step % self.config.save_every == 0 or self.step == self.total_steps:
                    self.save_checkpoint()
                elif deadline is not None and time.time() >= deadline:
                    self.save_checkpoint()
                    break
        finally:
            bar.close()
            if metrics_file is not None:
                metrics_file.close()
        if self.env.is_main:
            self.write_run_record(time.time() - began, first_step)
        return history

    def write_run_record(self, wall_s: float, first_step: int) -> Path:
        """output_dir/run.json: steps, wall time and peak memory of the fit() call that just ended
        (training cost, DeLS-Spec Table 5; `python -m eval training-cost` reads it).
        peak_rss_mib: the process's peak resident set (getrusage ru_maxrss); it is process-wide, so
        where one process runs several stages it is the peak so far, an upper bound for this run.
        peak_cuda_mib: peak CUDA memory allocated during this call (None off CUDA)."""
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        rss_mib = rss / (2 ** 20 if sys.platform == "darwin" else 2 ** 10)
        cuda = (torch.cuda.max_memory_allocated(self.device) / 2 ** 20 if self.device.type == "cuda" else None)
        record = {"steps": self.step, "first_step": first_step, "wall_s": round(wall_s, 3),
                  "device": str(self.device), "world_size": self.env.world_size,
                  "peak_rss_mib": round(rss_mib, 1), "peak_cuda_mib": None if cuda is None else round(cuda, 1)}
        path = self.output_dir / "run.json"
        self.output_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        return path


def seeds_for(indices: Sequence[int], base_seed: int, epoch: int) -> list[int]:
    """Per-example anchor seeds (see training.blocks.example_seed)."""
    return [example_seed(base_seed, epoch, i) for i in indices]
