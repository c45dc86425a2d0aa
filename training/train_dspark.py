"""DFlash + DSpark's Markov head trained jointly (the DSpark baseline of the LiLiCorr paper): the
DFlash loss of the corrected logits, previous tokens teacher-forced.

    python -m training.train_dspark --recipe smollm2/dspark --set train.output_dir=runs/x
    torchrun --nproc-per-node 8 -m training.train_dspark --recipe smollm2/dspark

Exports an upstream-format Qwen3DSparkModel directory to <train.output_dir>/final.
"""

from __future__ import annotations

from collections.abc import Sequence

from training import train_lilicorr


def main(argv: Sequence[str] | None = None) -> None:
    train_lilicorr.main(argv, method="dspark", description=__doc__)


if __name__ == "__main__":
    main()
