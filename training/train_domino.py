"""DFlash + Domino's correction head trained jointly (the Domino baseline of the LiLiCorr paper):
the DFlash loss of the corrected logits, previous tokens teacher-forced.

    python -m training.train_domino --recipe smollm2/domino --set train.output_dir=runs/x
    torchrun --nproc-per-node 8 -m training.train_domino --recipe smollm2/domino

Exports a DFlash directory with its head in domino/ (vllm_liliprop/heads/domino.py) to
<train.output_dir>/final.
"""

from __future__ import annotations

from collections.abc import Sequence

from training import train_lilicorr


def main(argv: Sequence[str] | None = None) -> None:
    train_lilicorr.main(argv, method="domino", description=__doc__)


if __name__ == "__main__":
    main()
