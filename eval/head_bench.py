"""Per-block cost of the draft rules' pieces, as ratios to the drafter forward.

    python -m eval.head_bench                     # preset from the device (gpu / cpu)
    python -m eval.head_bench --preset cpu --csv head.csv
    python -m eval.head_bench --quick             # tiny shapes, seconds on a CPU

One draft block of B requests: block size 16 (anchor + S = 15 drafted slots), K = 8 lattice
candidates per slot, vocabulary V, drafter width H. Every piece runs on the outputs of one real
forward of a stand-in DFlash drafter (`training.drafter.DFlashDrafter`, random weights):

    drafter_forward   the draft step: the 16 newest verified positions go through fc +
                      hidden_norm and their K/V enter each layer's context cache (the older
                      context K/V is cached, as in vLLM), the query block [anchor, mask x 15]
                      runs through the layers, then the LM head projects the 15 slots to V.
                      Every ratio is relative to this row at the same batch size.
    lm_head           the LM-head projection alone, [B*S, H] -> [B*S, V].
    topk_candidates   heads.candidates.topk_candidates on the [B*S, V] logits.
    lattice_head      candidate embedding lookup + LatticeHead.score (paper Table 4, scaled).
    greedy_walk, viterbi_walk, sampled_walk    vllm_liliprop.walks on the head's lattice.
    */kernels         the same call through vllm_liliprop.kernels (Triton on CUDA, else torch).
    dels_draft/markov, dels_draft/gru          DeLS over the full vocabulary, slot by slot.
    lattice_dels_terms_markov                  the Markov DeLS bonus on the lattice.
    greedy_walk_with_short_head/markov|gru     the step-by-step lattice + DeLS walk.
    domino_head       Domino's sequential correction (heads/domino.py through
                      heads/sequential.sequential_draft): per slot, a GRU cell at the drafter's
                      width on the previous token's embedding, a rank-64 residual over V added
                      to the drafter's logits, and the argmax; what rule "domino" runs.
    dspark_markov_head  DSpark's Markov head (heads/dspark.MarkovBiasHead, rank 64) through the
                      same sequential drafting; what rule "dspark" runs.
    LiLiCorr's head per block (paper Table 3) is topk_candidates + lattice_head + greedy_walk
    (or viterbi_walk); the two sequential rows include their per-slot picks over V.

The machine may be shared and noisy, so all pieces of one batch size are measured side by side:
after an interleaved warm-up, each round times every piece once (rotating the order between
rounds), and a piece's time is the median over rounds. Pieces faster than ~5 ms are timed as
a run of back-to-back calls (at most 64) divided by its length. CUDA times come from CUDA
events, CPU times from time.perf_counter.

The Table-4 LiLiCorr head (width 1024, 8 heads, 2 layers, feed-forward 2048, d_e 1024) sits on
Qwen3-8B's H = 4096, so the head width and d_e are scaled to H / 4, as is the GRU short head's
hidden size (1024 in training/recipes/dels_gru_qwen3_8b.json). The drafter follows Qwen3-8B's
proportions: head_dim 128 (H / 4 below H = 1024), H / head_dim query heads, a quarter as many
KV heads, MLP width 3 H, five fused target layers.

Plain torch: nothing here imports vllm. It lives in eval/ (not the runtime package) because
its stand-in drafter is training's.
"""

from __future__ import annotations

import argparse
import gc
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm import tqdm

from training.drafter import (
    DFlashDrafter,
    DrafterConfig,
    block_attention_mask,
    default_target_layer_ids,
    rope_cos_sin,
)
from vllm_liliprop import kernels, walks
from vllm_liliprop.heads.candidates import topk_candidates
from vllm_liliprop.heads.dels import GRUShortHead, MarkovShortHead
from vllm_liliprop.heads.domino import DominoConfig, DominoHead
from vllm_liliprop.heads.dspark import MarkovBiasHead
from vllm_liliprop.heads.dels_lattice import greedy_walk_with_short_head, lattice_dels_terms_markov
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead
from vllm_liliprop.heads.sequential import sequential_draft
from vllm_liliprop.rules.dels_draft import dels_draft

BLOCK_SIZE = 16
NUM_SLOTS = BLOCK_SIZE - 1
TOPK = 8
QWEN3_VOCAB = 151_936
NUM_TARGET_TAPS = 5  # DFlash fuses 5 target layers
NUM_TARGET_LAYERS = 36  # only names the tapped layers; Qwen3-8B's depth
DELS_WEIGHT = 0.3  # alpha = beta, the DeLS paper's default
SEQUENTIAL_RANK = 64  # Domino's and DSpark's residual rank (training/recipes/smollm2/*.json)
MIN_SAMPLE_MS = 5.0  # shorter pieces are timed as back-to-back runs of about this length
MAX_CALLS_PER_SAMPLE = 64

COLUMNS = ["piece", "batch", "device", "median_ms", "ratio_to_drafter"]
DRAFTER_PIECE = "drafter_forward"
PIECES = (
    DRAFTER_PIECE,
    "lm_head",
    "topk_candidates",
    "topk_candidates/kernels",
    "lattice_head",
    "greedy_walk",
    "greedy_walk/kernels",
    "viterbi_walk",
    "viterbi_walk/kernels",
    "sampled_walk",
    "dels_draft/markov",
    "dels_draft/gru",
    "lattice_dels_terms_markov",
    "greedy_walk_with_short_head/markov",
    "greedy_walk_with_short_head/gru",
    "domino_head",
    "dspark_markov_head",
)


@dataclass(frozen=True)
class BenchConfig:
    """Shapes and measurement settings of one benchmark run."""

    vocab_size: int
    hidden_size: int
    drafter_layers: int
    context_len: int  # verified positions in each request's context cache
    batches: tuple[int, ...]
    dtype: str  # drafter, LM head and lattice head dtype; DeLS heads stay fp32 as in serving
    warmup: int
    repeats: int
    dels_rank: int = 256

    def __post_init__(self) -> None:
        def positive_int(name: str, minimum: int = 1) -> None:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"{name} = {value!r} must be an int >= {minimum}.")

        positive_int("vocab_size", TOPK)
        positive_int("drafter_layers")
        positive_int("context_len", BLOCK_SIZE)
        positive_int("warmup")
        positive_int("repeats")
        positive_int("dels_rank")
        if not isinstance(self.hidden_size, int) or self.hidden_size < 64 or self.hidden_size % 64:
            raise ValueError(
                f"hidden_size = {self.hidden_size!r} must be a multiple of 64 (>= 64), so the "
                "drafter heads and the H/4-wide lattice head with 8 heads divide it evenly."
            )
        if not self.batches or any(not isinstance(b, int) or b < 1 for b in self.batches):
            raise ValueError(f"batches = {self.batches!r} must be one or more ints >= 1.")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype = {self.dtype!r} must be float32, bfloat16 or float16.")

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def head_dim(self) -> int:
        if self.hidden_size >= 1024 and self.hidden_size % 128 == 0:
            return 128
        return self.hidden_size // 4

    @property
    def num_heads(self) -> int:
        return self.hidden_size // self.head_dim

    @property
    def num_kv_heads(self) -> int:
        return max(1, self.num_heads // 4)

    @property
    def side_width(self) -> int:
        """Width of the lattice head, its d_e and the GRU short head: H / 4."""
        return self.hidden_size // 4


PRESETS = {
    "gpu": BenchConfig(vocab_size=QWEN3_VOCAB, hidden_size=4096, drafter_layers=5, context_len=512,
                       batches=(1, 8, 32, 64), dtype="bfloat16", warmup=5, repeats=30),
    "cpu": BenchConfig(vocab_size=32_000, hidden_size=1024, drafter_layers=5, context_len=512,
                       batches=(1, 8, 32), dtype="float32", warmup=1, repeats=5),
    "quick": BenchConfig(vocab_size=2048, hidden_size=128, drafter_layers=1, context_len=64,
                         batches=(1, 2), dtype="float32", warmup=2, repeats=5, dels_rank=32),
}


def lattice_config(cfg: BenchConfig) -> LatticeConfig:
    """The paper's Table-4 head (2 layers, 8 heads, MLP 2x, sigma 8) at width and d_e = H / 4."""
    return LatticeConfig.from_dflash_config(
        {
            "lilicorr_candidate_topk": TOPK,
            "lilicorr_hidden_size": cfg.side_width,
            "lilicorr_num_layers": 2,
            "lilicorr_num_heads": 8,
            "lilicorr_mlp_ratio": 2.0,
            "lilicorr_factor_dim": cfg.side_width,
            "lilicorr_vector_eps": 1e-6,
            "lilicorr_logit_scale": 8.0,
        },
        model_hidden_size=cfg.hidden_size,
        block_size=BLOCK_SIZE,
        rms_norm_eps=1e-6,
    )


def drafter_config(cfg: BenchConfig) -> DrafterConfig:
    return DrafterConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=3 * cfg.hidden_size,
        num_hidden_layers=cfg.drafter_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        target_layer_ids=default_target_layer_ids(NUM_TARGET_LAYERS, NUM_TARGET_TAPS),
        mask_token_id=cfg.vocab_size - 1,
        block_size=BLOCK_SIZE,
    )


@dataclass
class Models:
    """Random-weight stand-ins for everything one draft step touches."""

    drafter: DFlashDrafter
    embed_weight: torch.Tensor  # [V, H], the target's input embeddings (shared, frozen)
    lm_head_weight: torch.Tensor  # [V, H]
    lattice: LatticeHead
    markov: MarkovShortHead
    gru: GRUShortHead
    log_prior: torch.Tensor  # [V] fp32
    domino: DominoHead
    dspark: MarkovBiasHead
    normalizer_build_s: float  # one-time cost of the Markov head's log-normalizer table


def build_models(cfg: BenchConfig, device: torch.device) -> Models:
    torch.manual_seed(0)
    dtype = cfg.torch_dtype
    with torch.device(device):  # initialize on the device: the GPU drafter is ~1B parameters
        drafter = DFlashDrafter(drafter_config(cfg)).to(dtype).eval().requires_grad_(False)
        lattice = LatticeHead(lattice_config(cfg)).to(dtype).eval().requires_grad_(False)
        embed_weight = (0.02 * torch.randn(cfg.vocab_size, cfg.hidden_size)).to(dtype)
        lm_head_weight = (0.02 * torch.randn(cfg.vocab_size, cfg.hidden_size)).to(dtype)
        log_prior = torch.log_softmax(torch.randn(cfg.vocab_size), dim=0)
        # fp32 sequential heads over the full vocabulary, as rules/domino.py loads them.
        domino = DominoHead(DominoConfig(cfg.vocab_size, cfg.hidden_size, cfg.hidden_size,
                                         SEQUENTIAL_RANK), embed_weight,
                            torch.arange(cfg.vocab_size))
        dspark = MarkovBiasHead(cfg.vocab_size, cfg.vocab_size, SEQUENTIAL_RANK)
        for param in (domino.up.weight, dspark.markov_w2.weight):  # zero-initialised
            torch.nn.init.normal_(param, std=0.02)
    domino = domino.eval().requires_grad_(False)
    dspark = dspark.eval().requires_grad_(False)
    # fp32 short heads reading the target's table, as vllm_liliprop.rules.dels loads them.
    markov = MarkovShortHead(cfg.vocab_size, cfg.dels_rank, device=device)
    markov = markov.eval().requires_grad_(False)
    gru = GRUShortHead(embed_weight, cfg.side_width, cfg.dels_rank, device=device)
    gru = gru.eval().requires_grad_(False)

    began = time.perf_counter()
    with torch.inference_mode():
        markov.log_normalizer_table()
    _synchronize(device)
    normalizer_build_s = time.perf_counter() - began
    return Models(drafter, embed_weight, lm_head_weight, lattice, markov, gru, log_prior,
                  domino, dspark, normalizer_build_s)


class DraftStep:
    """One DFlash draft step for `batch` requests, with each layer's context K/V cached.

    Positions: the cache holds `context_len` verified positions, the newest BLOCK_SIZE of which
    arrive with this step (their target taps are new); the anchor sits right after them. The
    cached K/V are random: attention cost does not depend on their values.
    """

    def __init__(self, models: Models, cfg: BenchConfig, batch: int, device: torch.device):
        dcfg = models.drafter.config
        dtype, length = cfg.torch_dtype, cfg.context_len
        self.models = models
        self.context_len = length
        self.num_new = BLOCK_SIZE
        self.new_taps = torch.randn(batch, self.num_new, cfg.hidden_size * dcfg.num_taps,
                                    device=device, dtype=dtype)
        self.anchor_ids = torch.randint(0, cfg.vocab_size, (batch,), device=device)
        self.block_ids = torch.full((batch, BLOCK_SIZE), dcfg.mask_token_id, device=device)
        self.block_ids[:, 0] = self.anchor_ids
        cache_shape = (batch, length, dcfg.num_key_value_heads, dcfg.head_dim)
        self.caches = [
            (torch.randn(cache_shape, device=device, dtype=dtype),
             torch.randn(cache_shape, device=device, dtype=dtype))
            for _ in range(dcfg.num_hidden_layers)
        ]
        new_pos = torch.arange(length - self.num_new, length, device=device).expand(batch, -1)
        block_pos = torch.arange(length, length + BLOCK_SIZE, device=device).expand(batch, -1)
        self.new_cos, self.new_sin = rope_cos_sin(new_pos, dcfg.head_dim, dcfg.rope_theta)
        self.block_cos, self.block_sin = rope_cos_sin(block_pos, dcfg.head_dim, dcfg.rope_theta)
        anchors = torch.full((batch, 1), length, device=device)
        self.mask = block_attention_mask(anchors, length, BLOCK_SIZE)

    def backbone(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> hidden [B, 16, H] (final-normed block states) and anchor_hidden [B, H], the context
        state of the newest verified position (what the lattice head reads as the anchor)."""
        drafter, length = self.models.drafter, self.context_len
        context = drafter.context_states(self.new_taps)
        x = F.embedding(self.block_ids, self.models.embed_weight)
        for layer, (k_cache, v_cache) in zip(drafter.layers, self.caches):
            new_k, new_v = layer.self_attn.key_value(context, self.new_cos, self.new_sin)
            k_cache[:, length - self.num_new:] = new_k
            v_cache[:, length - self.num_new:] = new_v
            x = layer(x, self.block_cos, self.block_sin, k_cache, v_cache, self.mask)
        return drafter.norm(x), context[:, -1]

    def lm_head(self, slot_hidden: torch.Tensor) -> torch.Tensor:
        """slot_hidden [..., H] -> logits [..., V] in the drafter dtype."""
        return F.linear(slot_hidden, self.models.lm_head_weight)

    def forward(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> hidden [B, 16, H], anchor_hidden [B, H], logits [B, S, V] of the drafted slots."""
        hidden, anchor_hidden = self.backbone()
        return hidden, anchor_hidden, self.lm_head(hidden[:, 1:])


def make_pieces(models: Models, step: DraftStep) -> dict[str, Callable[[], object]]:
    """Closures over one batch's real draft outputs, keyed and ordered as PIECES."""
    hidden, anchor_hidden, logits = step.forward()
    batch, vocab = logits.shape[0], logits.shape[-1]
    flat_logits = logits.reshape(batch * NUM_SLOTS, vocab)
    slot_hidden = hidden[:, 1:].reshape(batch * NUM_SLOTS, -1)
    ids, log_probs = topk_candidates(flat_logits, TOPK)
    candidate_ids = ids.view(batch, NUM_SLOTS, TOPK)
    candidate_log_probs = log_probs.view(batch, NUM_SLOTS, TOPK)
    pass_hidden = hidden[:, 1:]
    anchor_valid = torch.ones(batch, dtype=torch.bool, device=logits.device)
    anchor_ids, log_prior = step.anchor_ids, models.log_prior

    def lattice_head():
        embeddings = F.embedding(candidate_ids, models.embed_weight)
        return models.lattice.score(embeddings, candidate_log_probs, pass_hidden, anchor_hidden,
                                    anchor_valid)

    start, pairs = lattice_head()
    temperature = torch.ones(batch, device=logits.device)
    generator = torch.Generator(device=logits.device).manual_seed(0)
    weight = DELS_WEIGHT
    pieces = {
        DRAFTER_PIECE: step.forward,
        "lm_head": lambda: step.lm_head(slot_hidden),
        "topk_candidates": lambda: topk_candidates(flat_logits, TOPK),
        "topk_candidates/kernels": lambda: kernels.topk_candidates(flat_logits, TOPK),
        "lattice_head": lattice_head,
        "greedy_walk": lambda: walks.greedy_walk(start, pairs),
        "greedy_walk/kernels": lambda: kernels.greedy_walk(start, pairs),
        "viterbi_walk": lambda: walks.viterbi_walk(start, pairs),
        "viterbi_walk/kernels": lambda: kernels.viterbi_walk(start, pairs),
        "sampled_walk": lambda: walks.sampled_walk(start, pairs, temperature, generator),
        "dels_draft/markov": lambda: dels_draft(logits, anchor_ids, models.markov, log_prior,
                                                weight, weight),
        "dels_draft/gru": lambda: dels_draft(logits, anchor_ids, models.gru, log_prior,
                                             weight, weight),
        "lattice_dels_terms_markov": lambda: lattice_dels_terms_markov(
            candidate_ids, anchor_ids, models.markov, log_prior, weight, weight),
        "greedy_walk_with_short_head/markov": lambda: greedy_walk_with_short_head(
            start, pairs, candidate_ids, anchor_ids, models.markov, log_prior, weight, weight),
        "greedy_walk_with_short_head/gru": lambda: greedy_walk_with_short_head(
            start, pairs, candidate_ids, anchor_ids, models.gru, log_prior, weight, weight),
        "domino_head": lambda: sequential_draft(logits, anchor_ids, pass_hidden, models.domino),
        "dspark_markov_head": lambda: sequential_draft(logits, anchor_ids, pass_hidden,
                                                       models.dspark),
    }
    if tuple(pieces) != PIECES:
        raise RuntimeError(f"make_pieces built {tuple(pieces)}; update PIECES to match.")
    return pieces


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sample_ms(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    """Milliseconds per call, over `calls` back-to-back calls."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        begin = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) / calls
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - began) * 1e3 / calls


def measure(pieces: dict[str, Callable[[], object]], device: torch.device, warmup: int,
            repeats: int, progress: tqdm | None = None) -> dict[str, float]:
    """Median ms per call of every piece, measured interleaved (see the module docstring)."""
    names = list(pieces)
    fastest = {name: math.inf for name in names}
    for _ in range(warmup):
        for name in names:
            fastest[name] = min(fastest[name], _sample_ms(pieces[name], 1, device))
    # Fixed per piece after warm-up, so every round of a piece measures the same thing.
    calls = {
        name: max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(MIN_SAMPLE_MS / max(ms, 1e-6))))
        for name, ms in fastest.items()
    }
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()  # a collection inside one sample would land on whichever piece is running
    try:
        for round_index in range(repeats):
            for offset in range(len(names)):
                name = names[(round_index + offset) % len(names)]
                samples[name].append(_sample_ms(pieces[name], calls[name], device))
                if progress is not None:
                    progress.update()
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe(cfg: BenchConfig, preset: str, device: torch.device, models: Models) -> list[str]:
    """The header lines: everything needed to reproduce and read the table."""
    lat = models.lattice.config
    use_triton = device.type == "cuda" and kernels.triton_available()
    kernel_backend = "Triton" if use_triton else "torch reference"
    lines = [
        f"preset={preset} device={device.type} ({device_name(device)}) torch={torch.__version__} "
        f"dtype={cfg.dtype} threads={torch.get_num_threads()}",
        f"V={cfg.vocab_size} H={cfg.hidden_size} K={TOPK} S={NUM_SLOTS} (block {BLOCK_SIZE}) "
        f"batches={list(cfg.batches)}",
        f"drafter: {cfg.drafter_layers} layers, {cfg.num_heads} heads x {cfg.head_dim}, "
        f"{cfg.num_kv_heads} KV heads, MLP {3 * cfg.hidden_size}, {NUM_TARGET_TAPS} taps, "
        f"context {cfg.context_len} cached positions ({BLOCK_SIZE} new per step)",
        f"lattice head: width {lat.width}, {lat.num_layers} layers, {lat.num_heads} heads, "
        f"MLP {lat.mlp_hidden_size}, d_e {lat.factor_dim}, sigma {lat.logit_scale} "
        "(paper Table 4 scaled to H/4)",
        f"DeLS: markov rank {cfg.dels_rank}; gru hidden {cfg.side_width}, rank {cfg.dels_rank}; "
        f"alpha=beta={DELS_WEIGHT}; fp32 heads; one-time Markov log-normalizer table "
        f"{models.normalizer_build_s:.2f} s (not in the table)",
        f"sequential heads (fp32, over V, picks included): domino GRU cell {cfg.hidden_size} "
        f"wide, rank {SEQUENTIAL_RANK}; dspark Markov rank {SEQUENTIAL_RANK}; LiLiCorr's per block "
        "is topk_candidates + lattice_head + greedy_walk",
        f"kernels dispatcher (*/kernels rows): {kernel_backend}",
        f"timing: warmup {cfg.warmup}, median of {cfg.repeats} interleaved rounds; "
        + ("CUDA events" if device.type == "cuda" else "time.perf_counter"),
    ]
    if device.type == "cpu" and cfg.vocab_size != QWEN3_VOCAB:
        lines.append(
            f"NOTE: V = {cfg.vocab_size} on CPU, not Qwen3's {QWEN3_VOCAB}: lm_head, "
            "topk_candidates, dels_draft and the sequential heads scale with V, so their ratios "
            "are lower than at full vocabulary."
        )
    return lines


def run(cfg: BenchConfig, preset: str, device: torch.device) -> pd.DataFrame:
    """Measure every piece at every batch size; returns the tidy table (COLUMNS)."""
    models = build_models(cfg, device)
    for line in describe(cfg, preset, device, models):
        print(line)
    sys.stdout.flush()

    rows = []
    with torch.inference_mode():
        with tqdm(total=len(cfg.batches) * cfg.repeats * len(PIECES), desc="measuring",
                  unit="sample") as progress:
            for batch in cfg.batches:
                progress.set_postfix(batch=batch)
                pieces = make_pieces(models, DraftStep(models, cfg, batch, device))
                medians = measure(pieces, device, cfg.warmup, cfg.repeats, progress)
                drafter_ms = medians[DRAFTER_PIECE]
                for name, ms in medians.items():
                    rows.append((name, batch, device.type, ms, ms / drafter_ms))
                del pieces
    return pd.DataFrame(rows, columns=COLUMNS)


def format_table(table: pd.DataFrame) -> str:
    return table.to_string(
        index=False,
        formatters={"median_ms": "{:.4f}".format, "ratio_to_drafter": "{:.4f}".format},
    )


def parse_args(argv=None) -> tuple[BenchConfig, str, torch.device, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=["cpu", "gpu"], default=None,
                        help="shape preset (default: gpu on a CUDA device, else cpu)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes, batches 1 and 2, few repeats (overrides --preset)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--vocab", type=int, default=None, help="vocabulary size V")
    parser.add_argument("--hidden", type=int, default=None, help="drafter width H (multiple of 64)")
    parser.add_argument("--layers", type=int, default=None, help="drafter layers")
    parser.add_argument("--context", type=int, default=None, help="cached context positions")
    parser.add_argument("--batches", type=int, nargs="+", default=None)
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--warmup", type=int, default=None, help="interleaved warm-up rounds")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (median over them)")
    parser.add_argument("--csv", default=None, help="also write the table to this CSV file")
    args = parser.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available; use --device cpu.")
    preset = "quick" if args.quick else args.preset or ("gpu" if device.type == "cuda" else "cpu")
    overrides = {
        "vocab_size": args.vocab, "hidden_size": args.hidden, "drafter_layers": args.layers,
        "context_len": args.context, "batches": tuple(args.batches) if args.batches else None,
        "dtype": args.dtype, "warmup": args.warmup, "repeats": args.repeats,
    }
    try:
        cfg = replace(PRESETS[preset], **{k: v for k, v in overrides.items() if v is not None})
    except ValueError as error:
        parser.error(str(error))
    return cfg, preset, device, args


def main(argv=None) -> int:
    cfg, preset, device, args = parse_args(argv)
    table = run(cfg, preset, device)
    print(format_table(table))
    if args.csv:
        table.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
