"""Standalone DFlash drafter training (block CE with per-slot decay, Eq. 6).

    python -m training.train_dflash --recipe dflash_qwen3_8b --set train.output_dir=runs/x
    torchrun --nproc-per-node 8 -m training.train_dflash --recipe dflash_qwen3_8b

Exports a DFlashDraftModel directory to <train.output_dir>/final.
"""

from __future__ import annotations

from collections.abc import Sequence

from training import train_lilicorr


def main(argv: Sequence[str] | None = None) -> None:
    train_lilicorr.main(argv, method="dflash", description=__doc__)


if __name__ == "__main__":
    main()
