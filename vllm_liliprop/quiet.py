"""Quiet by default: our commands show their own progress bars and tables; vLLM and the other
libraries speak at WARNING and above (a tiny `python -m eval run` printed 71 lines, 45 of them
vLLM's INFO lines, before any table). `--verbose` or LILIPROP_VERBOSE=1 shows everything.

With LILIPROP_LOG=FILE (the main job sets it) the libraries' logs go to FILE instead: vLLM's from
INFO up, the other libraries' and Python's warnings from WARNING up, and only ERROR and above
still reach the console. On CPU vLLM warns about a dozen things at every engine start (no
Triton, no tcmalloc, thread binding, kernels registered again: about 20 lines an engine) that
are not problems of the run; they stay readable in FILE.

The libraries read their settings from the environment when they are imported, so `quiet` runs
before they are: at the top of `python -m eval` and in each training command's main. A setting
already in the environment wins (VLLM_LOGGING_LEVEL=DEBUG still works). Standard library only,
so any layer may call it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import logging.config
import os
import sys
import tempfile
import warnings

VERBOSE_ENV = "LILIPROP_VERBOSE"
LOG_ENV = "LILIPROP_LOG"
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d]: %(message)s"
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
    log = os.environ.get(LOG_ENV, "")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING if log else logging.ERROR)
    if log:
        log_to_file(log)


def log_to_file(path: str) -> None:
    """The libraries' logs to `path` (appended), ERROR and above also to stderr. vLLM configures
    its own logger when imported, from the JSON file named by VLLM_LOGGING_CONFIG_PATH (child
    processes read it too); everything else reaches the root logger."""
    path = os.path.abspath(path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    handlers = {
        "file": {"class": "logging.FileHandler", "filename": path, "formatter": "file", "level": "INFO"},
        "console": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "file",
                    "level": "ERROR"},
    }
    config = {"version": 1, "disable_existing_loggers": False,
              "formatters": {"file": {"format": FILE_FORMAT}}, "handlers": handlers,
              "loggers": {"vllm": {"handlers": ["file", "console"], "level": "INFO", "propagate": False}}}
    vllm_config = os.path.join(tempfile.gettempdir(), f"liliprop-logging-{os.getuid()}-"
                               f"{hashlib.sha256(path.encode()).hexdigest()[:12]}.json")
    with open(vllm_config, "w", encoding="utf-8") as out:
        json.dump(config, out)
    os.environ.setdefault("VLLM_LOGGING_CONFIG_PATH", vllm_config)
    root = dict(config, loggers={}, root={"handlers": ["file", "console"], "level": "WARNING"})
    logging.config.dictConfig(root)
    logging.captureWarnings(True)  # Python warnings (those not ignored above) to the file too


def add_verbose_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(FLAG, action="store_true",
                        help=f"show vLLM's and other libraries' logs (INFO) and warnings; also {VERBOSE_ENV}=1")


def quiet_after_parse(args: argparse.Namespace) -> None:
    """For commands that import the libraries after parsing their arguments (training's mains)."""
    quiet(getattr(args, "verbose", False) or verbose_requested([]))


def load_progress() -> bool:
    """Whether vLLM may draw its checkpoint-loading bars (use_tqdm_on_load): only when verbose."""
    return verbose_requested([])
