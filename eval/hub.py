"""Benchmark rows from the Hugging Face hub with `datasets` (only with `--source hf`; needs network).

Gated datasets (SPEED-Bench) need an accepted license and a token (`huggingface-cli login` or
HF_TOKEN). SPEED-Bench rows whose prompts are placeholders for text from licensed sources must be
materialized with SPEED-Bench's own preparation step first; rows with empty turns are refused.
"""

from __future__ import annotations

from eval.benchmarks import DataError, HubSource


def load_hub_rows(source: HubSource) -> list[dict]:
    try:
        import datasets
    except ImportError:
        raise DataError("--source hf needs the `datasets` package: pip install datasets") from None
    try:
        if source.data_files:
            dataset = datasets.load_dataset(
                "json", data_files=f"hf://datasets/{source.repo}/{source.data_files}",
                split=source.split,
            )
        else:
            dataset = datasets.load_dataset(source.repo, source.config, split=source.split)
    except Exception as exc:  # network, auth and format errors all surface here
        raise DataError(
            f"could not load {source.repo} (config {source.config or source.data_files or 'default'}, "
            f"split {source.split}) from the hub: {exc}. Check the network and your HF token, or "
            "use --source local with --data-dir (see eval/README.md)"
        ) from None
    return [dict(row) for row in dataset]
