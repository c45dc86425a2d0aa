"""Joint DFlash + LiLiCorr training (LiLiCorr paper, Section 3.4, Eq. 7 / Appendix G).

    python -m training.train_lilicorr --recipe lilicorr_qwen3_8b --set train.output_dir=runs/x
    torchrun --nproc-per-node 8 -m training.train_lilicorr --recipe lilicorr_qwen3_8b

Exports an upstream-format LiLiCorrDraftModel directory to <train.output_dir>/final.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from training.pipeline import run_draft_training
from training.recipe import add_recipe_arguments, recipe_from_args
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

METHOD = "lilicorr"


def main(argv: Sequence[str] | None = None, method: str = METHOD, description: str = __doc__) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m training.train_{method}",
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_recipe_arguments(parser)
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    recipe = recipe_from_args(args)
    if recipe.get("method", method) != method:
        raise ValueError(f"recipe method is {recipe['method']!r}; use training.train_{recipe['method']}")
    recipe["method"] = method
    if args.print_recipe:
        print(json.dumps(recipe, indent=2))
        return
    result = run_draft_training(recipe, resume=args.resume)
    print(f"exported {result['export_dir']}")


if __name__ == "__main__":
    main()
