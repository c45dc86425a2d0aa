"""Quiet by default: our commands show their own progress bars and tables; vLLM and the other
libraries speak at WARNING and above (a tiny `python -m eval run` printed 71 lines, 45 of them
vLLM's INFO lines, before any table). `--verbose` or LILIPROP_VERBOSE=1 shows everything.

The libraries read their settings from the environment when they are imported, so `quiet` runs
before they are: at the top of `python -m eval` and in each training command's main. A setting
already in the environment wins (VLLM_LOGGING_LEVEL=DEBUG still works). Standard library only,
so any layer may call it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

VERBOSE_ENV = "LILIPROP_VERBOSE"
FLAG = "--verbose"
# variable -> its quiet value, and what it silences.
QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "WARNING",  # vLLM's INFO: engine config, load times, KV cache size, ...
    "TRANSFORMERS_VERBOSITY": "error",  # transformers' notices on loading and generation
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # download bars of the hub client
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # torch's C++ warnings (NUMA binding), read when torch loads
    "TOKENIZERS_PARALLELISM": "false",  # the tokenizers fork warning
}
# Python warnings of libraries about their own future (deprecations), not about our results.
QUIET_WARNINGS = (FutureWarning, DeprecationWarning, PendingDeprecationWarning)
QUIET_LOGGERS = ("transformers", "datasets", "huggingface_hub", "filelock", "urllib3")


def verbose_requested(argv: list[str] | None = None) -> bool:
    """--verbose among the arguments, or LILIPROP_VERBOSE set to anything but 0 / false / ''."""
    argv = sys.argv[1:] if argv is None else argv
    return FLAG in argv or os.environ.get(VERBOSE_ENV, "").lower() not in ("", "0", "false", "no")


def quiet(verbose: bool = False) -> None:
    """Libraries at WARNING unless verbose; also tells child processes (LILIPROP_VERBOSE)."""
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
        return
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    for category in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", category=category)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(FLAG, action="store_true",
                        help=f"show vLLM's and other libraries' logs (INFO) and warnings; also {VERBOSE_ENV}=1")


def quiet_after_parse(args: argparse.Namespace) -> None:
    """For commands that import the libraries after parsing their arguments (training's mains)."""
    quiet(getattr(args, "verbose", False) or verbose_requested([]))


def load_progress() -> bool:
    """Whether vLLM may draw its checkpoint-loading bars (use_tqdm_on_load): only when verbose."""
    return verbose_requested([])
