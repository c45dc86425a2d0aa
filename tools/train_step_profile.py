"""Where a DFlash training step's time goes (issue 32): the frozen target's forward (features),
the drafter's forward with the loss (LM head, distillation and CE inside), the backward pass and
the optimizer step, each timed over a few steps of a real recipe on this machine.

    python -m tools.train_step_profile --recipe smollm2/dflash_round2 \\
        --draft testbed/smollm2/round3/drafts/dflash --data testbed/smollm2/data/train_regenerated.jsonl.gz \\
        [--set train.batch_size=8] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence

import torch

from training.data import load_examples
from training.pipeline import prepare_draft_training
from training.recipe import apply_overrides, load_recipe


def _timed(fn):
    began = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - began


def profile(run, dataset, steps: int) -> dict[str, float]:
    """Mean seconds per phase over `steps` steps after one warm-up step."""
    trainer, objective = run.trainer, run.objective
    totals: dict[str, float] = {}
    bs = trainer.config.batch_size
    for step in range(steps + 1):
        indices = list(range(step * bs, (step + 1) * bs))
        inputs, t_inputs = _timed(lambda: trainer.make_inputs(indices, 0))
        with trainer._autocast():
            terms, t_forward = _timed(lambda: objective(**inputs))
        _, t_backward = _timed(lambda: terms["loss"].backward())
        _, t_optim = _timed(lambda: (trainer.optimizer.step(), trainer.optimizer.zero_grad(set_to_none=True)))
        if step:
            for key, value in (("target_forward", t_inputs), ("drafter_forward_and_loss", t_forward),
                               ("backward", t_backward), ("optimizer", t_optim)):
                totals[key] = totals.get(key, 0.0) + value / steps
    totals["step"] = sum(totals.values())
    return {key: round(value, 3) for key, value in totals.items()}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.train_step_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="smollm2/dflash_round2")
    parser.add_argument("--draft", required=True, help="drafter to start from (drafter.init_from)")
    parser.add_argument("--data", required=True, help="tokenized .jsonl or conversations .jsonl[.gz]")
    parser.add_argument("--target", default=".cache/targets/smollm2-135m-instruct")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    recipe = apply_overrides(load_recipe(args.recipe), [*args.set, f"drafter.init_from={args.draft}",
                                                        f"target={args.target}", "train.output_dir=/tmp/step_profile"])
    dataset = load_examples(args.data, args.target, 1024)
    run = prepare_draft_training(recipe, dataset=dataset, progress=False)
    result = {"device": str(run.trainer.device), "threads": torch.get_num_threads(),
              "batch_size": recipe["train"]["batch_size"], "num_anchors": recipe.get("num_anchors"),
              **profile(run, dataset, args.steps)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
