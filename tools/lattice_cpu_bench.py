"""The LiLiCorr rule's CPU cost at the served size, reference path vs serving path, side by side.

Builds the lattice head from the shipped LiLiCorr weights (testbed/smollm2/round3/drafts/lilicorr,
tensors `lilicorr.*`) in bf16 as the proposer does, and a rule twice: `LatticeRule(...,
reference=True)` (the path as first written) and the served `LatticeRule`. Each repeat times
both, interleaved, on the same inputs (drafter hidden states, anchor, full-vocabulary bf16
logits handed over precomputed: the LM head is its own stage), and checks the drafts are equal.
Prints the median ms per call of the whole rule (top-K candidates + head + walk + fault test)
and of its parts, and the ratio.

    source scripts/env.sh && OMP_NUM_THREADS=1 .venv/bin/python -m tools.lattice_cpu_bench \
        --batch 1 8 --repeats 200

Timings on a shared machine are noisy: only the side-by-side ratios are meant to be read.
`--compile` also times `torch.compile` of the reference head's score (compile time stated).
`--floor` sets the served head against the least time its work can take here: its FLOPs at the
bf16 GEMM rate these threads reach on a large square product, plus its weight bytes at the
streaming rate (the sum of the two is the floor; weights come out of cache in a decode step).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.utils.flop_counter import FlopCounterMode

from vllm_liliprop.heads.candidates import topk_candidates, topk_candidates_reference
from vllm_liliprop.heads.lattice import LatticeConfig, LatticeHead
from vllm_liliprop.kernels import greedy_walk
from vllm_liliprop.rules.base import DraftInputs
from vllm_liliprop.rules.lattice import LatticeRule, walk_faults, walk_faults_reference

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
DRAFT = Path(__file__).resolve().parents[1] / "testbed" / "smollm2" / "round3" / "drafts" / "lilicorr"


def load_head(draft: Path = DRAFT, dtype: torch.dtype = torch.bfloat16) -> LatticeHead:
    """The shipped head, read as `vllm.proposer.read_head_weights` and `load_lattice_head` do."""

    config_json = json.loads((draft / "config.json").read_text())
    state = {}
    for path in sorted(draft.glob("*.safetensors")):
        for name, value in load_file(str(path)).items():
            name = name.removeprefix("model.")
            if name.startswith("lilicorr."):
                state[name.removeprefix("lilicorr.")] = value
    block = config_json["dflash_config"].get("block_size", config_json.get("block_size"))
    config = LatticeConfig.from_dflash_config(
        config_json["dflash_config"], config_json["hidden_size"], block, config_json["rms_norm_eps"]
    )
    head = LatticeHead(config)
    head.load_state_dict(state, strict=True)
    return head.to(dtype=dtype).eval()


def make_inputs(head: LatticeHead, batch: int, slots: int, vocab: int, seed: int = 0) -> DraftInputs:
    g = torch.Generator().manual_seed(seed)
    hm = head.config.model_hidden_size
    dtype = head.slot_embedding.dtype
    embed = torch.nn.Embedding(vocab, hm).to(dtype)
    with torch.no_grad():
        embed.weight.normal_(0.0, 0.05, generator=g)
    # bf16 logits as the LM head returns them (full of exact ties), handed over precomputed.
    logits = (torch.randn(batch * slots, vocab, generator=g) * 3).to(dtype)
    return DraftInputs(
        hidden=torch.randn(batch, slots, hm, generator=g).to(dtype),
        anchor_ids=torch.zeros(batch, dtype=torch.long),
        compute_logits=lambda h: logits,
        embed=embed,
        anchor_hidden=torch.randn(batch, hm, generator=g).to(dtype),
        anchor_valid=torch.arange(batch) % 4 != 3,
    )


def head_args(head: LatticeHead, inputs: DraftInputs) -> tuple:
    """The lattice head's score() arguments for one step: the top-K candidates of every slot."""
    batch, slots, _ = inputs.hidden.shape
    k = head.config.candidate_topk
    ids, log_probs = topk_candidates(inputs.long_logits().view(batch * slots, -1), k)
    ids, log_probs = ids.view(batch, slots, k), log_probs.view(batch, slots, k)
    return inputs.embed(ids), log_probs, inputs.hidden, inputs.anchor_hidden, inputs.anchor_valid


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def side_by_side(cases: dict[str, tuple], repeats: int, warmup: int = 5) -> dict[str, tuple[float, float]]:
    """{name: (ref_fn, new_fn)} -> {name: (median ref ms, median new ms)}, interleaved."""
    times = {name: ([], []) for name in cases}
    for i in range(warmup + repeats):
        for name, fns in cases.items():
            order = (0, 1) if i % 2 == 0 else (1, 0)
            for j in order:
                ms = _time(fns[j])
                if i >= warmup:
                    times[name][j].append(ms)
    return {name: (statistics.median(r), statistics.median(n)) for name, (r, n) in times.items()}


def bench_batch(head: LatticeHead, batch: int, slots: int, vocab: int, repeats: int) -> None:
    inputs = make_inputs(head, batch, slots, vocab)
    ref_rule = LatticeRule(head, vocab, reference=True)
    new_rule = LatticeRule(head, vocab)
    k = head.config.candidate_topk
    with torch.inference_mode():
        a, b = ref_rule.propose(inputs), new_rule.propose(inputs)
        assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.faulty_rows, b.faulty_rows)
        logits = inputs.long_logits().view(batch * slots, -1)
        args = head_args(head, inputs)
        start, pairs = head.score(*args)
        cases = {
            "rule.propose (all)": (lambda: ref_rule.propose(inputs), lambda: new_rule.propose(inputs)),
            "top-K candidates": (lambda: topk_candidates_reference(logits, k),
                                 lambda: topk_candidates(logits, k)),
            "lattice head": (lambda: head.score(*args), lambda: new_rule.scorer.score(*args)),
            "walk + fault test": (lambda: walk_faults_reference(start, pairs, greedy_walk(start, pairs)),
                                  lambda: walk_faults(start, pairs, greedy_walk(start, pairs))),
        }
        result = side_by_side(cases, repeats)
    print(f"batch {batch} x {slots} slots, K = {k}, V = {vocab}, threads = {torch.get_num_threads()}, "
          f"packed GEMMs = {new_rule.scorer.packed}, {repeats} interleaved repeats (median ms)")
    print(f"  {'stage':<20} {'reference':>10} {'serving':>10} {'ratio':>7}")
    for name, (ref_ms, new_ms) in result.items():
        print(f"  {name:<20} {ref_ms:>10.3f} {new_ms:>10.3f} {ref_ms / new_ms:>6.2f}x")


def bench_compile(head: LatticeHead, batch: int, slots: int, vocab: int, repeats: int) -> None:
    inputs = make_inputs(head, batch, slots, vocab)
    new_rule = LatticeRule(head, vocab)
    with torch.inference_mode():
        args = head_args(head, inputs)
        compiled = torch.compile(head.score, dynamic=False)
        t0 = time.perf_counter()
        got = compiled(*args)
        compile_s = time.perf_counter() - t0
        ref = head.score(*args)
        same = all(torch.equal(x, y) for x, y in zip(got, ref))
        max_diff = max(float((x - y).abs().max()) for x, y in zip(got, ref))
        result = side_by_side({"compiled vs serving": (lambda: compiled(*args),
                                                       lambda: new_rule.scorer.score(*args)),
                               "eager ref vs compiled": (lambda: head.score(*args), lambda: compiled(*args))},
                              repeats)
    print(f"torch.compile(LatticeHead.score), batch {batch}: first call (compile) {compile_s:.1f} s, "
          f"scores bit-identical to eager: {same} (max |diff| {max_diff:.3g})")
    for name, (a, b) in result.items():
        print(f"  {name:<24} {a:>8.3f} {b:>8.3f} ms  ratio {a / b:.2f}x")


def _best_ms(fn, repeats: int) -> float:
    fn()  # warm: first-touch pages, oneDNN primitive caches
    return min(_time(fn) for _ in range(repeats))


def machine_rates(gemm_size: int = 2048, stream_mib: int = 256, repeats: int = 5,
                  dtype: torch.dtype = torch.bfloat16) -> tuple[float, float]:
    """(GEMM FLOP/s in `dtype`, weight-streaming bytes/s) this process reaches at its thread count:
    the best of `repeats` square products, and of a sum over a tensor far larger than the caches."""
    n = gemm_size
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    gemm_ms = _best_ms(lambda: a @ b, repeats)
    big = torch.ones(stream_mib * 2**20 // dtype.itemsize, dtype=dtype)  # stream_mib MiB
    stream_ms = _best_ms(lambda: big.sum(), repeats)
    return 2 * n**3 / (gemm_ms / 1e3), big.numel() * big.element_size() / (stream_ms / 1e3)


def head_floor(head: LatticeHead, args: tuple, rates: tuple[float, float]) -> dict[str, float]:
    """The head's work per call and the least time it can take on this machine: its FLOPs (counted
    on the reference path, which the serving path matches op for op) at the GEMM rate, and its
    weight bytes at the streaming rate (a decode step finds them out of cache)."""
    counter = FlopCounterMode(display=False)
    with counter:
        head.score(*args)
    flops = counter.get_total_flops()
    weight_bytes = sum(p.numel() * p.element_size() for p in head.parameters())
    gemm_rate, stream_rate = rates
    return {"gflop": flops / 1e9, "weights_mib": weight_bytes / 2**20,
            "compute_ms": flops / gemm_rate * 1e3, "read_ms": weight_bytes / stream_rate * 1e3}


def print_floor(head: LatticeHead, batch: int, slots: int, vocab: int, repeats: int,
                rates: tuple[float, float]) -> dict[str, float]:
    inputs = make_inputs(head, batch, slots, vocab)
    scorer = LatticeRule(head, vocab).scorer
    with torch.inference_mode():
        args = head_args(head, inputs)
        floor = head_floor(head, args, rates)
        scorer.score(*args)  # the first call checks its packed GEMMs against the reference: untimed
        served_ms = statistics.median(_time(lambda: scorer.score(*args)) for _ in range(repeats))
    floor["served_ms"] = served_ms
    floor["served_over_floor"] = served_ms / (floor["compute_ms"] + floor["read_ms"])
    print(f"floor, batch {batch} x {slots} slots, threads = {torch.get_num_threads()}: "
          f"{head.slot_embedding.dtype} GEMM {rates[0] / 1e9:.0f} GFLOP/s, streaming {rates[1] / 1e9:.1f} GB/s")
    print(f"  head {floor['gflop']:.3f} GFLOP, {floor['weights_mib']:.1f} MiB of weights: compute floor "
          f"{floor['compute_ms']:.3f} ms + weight-read floor {floor['read_ms']:.3f} ms; served head "
          f"{served_ms:.3f} ms (warm, median) = {floor['served_over_floor']:.2f}x the sum of the floors")
    return floor


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--slots", type=int, default=3, help="speculative tokens (served: 3)")
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16",
                        help="the head's serving dtype (the host probe picks float32 where bf16 is slow)")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile of the head")
    parser.add_argument("--floor", action="store_true",
                        help="also set the served head against its compute and weight-read floors")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    head = load_head(dtype=DTYPES[args.dtype])
    for batch in args.batch:
        bench_batch(head, batch, args.slots, args.vocab, args.repeats)
    if args.compile:
        bench_compile(head, args.batch[0], args.slots, args.vocab, args.repeats)
    if args.floor:
        rates = machine_rates(dtype=DTYPES[args.dtype])  # once: every batch priced at the same rates
        for batch in args.batch:
            print_floor(head, batch, args.slots, args.vocab, args.repeats, rates)


if __name__ == "__main__":
    main()
