"""The README's main job: every system on tiny local models, through real vLLM engines.

Builds (once, cached in .cache/tiny) a tiny Qwen3 target with its own tokenizer, a DFlash draft,
a LiLiCorr draft and DeLS heads, then generates the same prompts with each system and prints
acceptance length and throughput. The models are random, so acceptance is near 1: this shows
the machinery end to end, not the methods' gains (the trained testbed does that).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

PROMPTS = [
    "def parse(path):\n    with open(path) as f:",
    "import os\nimport sys\n\n",
    "class Cache:\n    def __init__(self, size):",
    "for index, value in enumerate(",
]

SYSTEMS = {
    "AR": (None, None),
    "DFlash": ("dflash", None),
    "DeLS-Markov": ("dflash", {"rule": "dels"}),
    "LiLiCorr-greedy": ("lilicorr", {"walk": "greedy"}),
    "LiLiCorr-viterbi": ("lilicorr", {"walk": "viterbi"}),
    "LiLiCorr+DeLS": ("lilicorr", {"rule": "lattice+dels"}),
}


def build_models(root: Path) -> dict[str, str]:
    import torch

    from vllm_liliprop.fixtures import (
        build_tiny_dflash_draft,
        build_tiny_lilicorr_draft,
        build_tiny_target,
    )
    from vllm_liliprop.heads.dels import MarkovShortHead, UnigramPrior
    from vllm_liliprop.heads.dels_io import DelsConfig, save_dels_head

    done = root / "done"
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        target = build_tiny_target(root / "target")
        for name, builder in (("dflash", build_tiny_dflash_draft), ("lilicorr", build_tiny_lilicorr_draft)):
            draft = builder(root / name, target)
            torch.manual_seed(0)
            head = MarkovShortHead(1024, rank=16)
            prior = UnigramPrior.from_counts(torch.ones(1024))
            save_dels_head(draft / "dels", head, prior, DelsConfig.for_head(head, prior))
        done.write_text("ok")
    return {name: str(root / name) for name in ("target", "dflash", "lilicorr")}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=".cache/tiny", help="where the tiny models are built")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--num-spec", type=int, default=7)
    args = parser.parse_args(argv)

    import pandas as pd
    from vllm import LLM, SamplingParams

    from vllm_liliprop.vllm.metrics import SpecDecodeCounters

    models = build_models(Path(args.cache))
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    rows, reference = [], None
    for name, (draft, options) in SYSTEMS.items():
        spec = None
        if draft:
            spec = {"method": "dflash", "model": models[draft],
                    "num_speculative_tokens": args.num_spec}
        os.environ.pop("VLLM_LILIPROP_OPTIONS", None)
        if options:
            os.environ["VLLM_LILIPROP_OPTIONS"] = json.dumps(options)
        llm = LLM(model=models["target"], speculative_config=spec, dtype="float32",
                  max_model_len=512, enforce_eager=True, disable_log_stats=False)
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
        before = SpecDecodeCounters.read(llm)
        start = time.perf_counter()
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
        wall = time.perf_counter() - start
        run = SpecDecodeCounters.read(llm) - before
        ids = [list(o.outputs[0].token_ids) for o in outputs]
        reference = reference or ids
        tokens = sum(len(x) for x in ids)
        rows.append({"system": name, "tau": round(run.tau, 3), "drafts": run.num_drafts,
                     "accepted": run.num_accepted_tokens, "tokens_per_s": round(tokens / wall, 1),
                     "same_output_as_AR": ids == reference})
        del llm
    os.environ.pop("VLLM_LILIPROP_OPTIONS", None)
    table = pd.DataFrame(rows)
    table["speedup"] = (table["tokens_per_s"] / table["tokens_per_s"].iloc[0]).round(2)
    print("\n" + table.to_markdown(index=False))


if __name__ == "__main__":
    main()
