"""vLLM's own DFlash proposer, for an engine started with this package left out of `VLLM_PLUGINS`.

vLLM reads `VLLM_PLUGINS` (an allow-list of plugin names; unset = every plugin) when an engine
starts, but once one engine of a process has registered this plugin its patches stay, and the
runner builds its DFlash proposer by the rebound name (`LiliPropProposer`). So an engine started
with `VLLM_PLUGINS` set to a list without `liliprop` gets `VllmDFlashProposer`: a subclass of
`LiliPropProposer` only so that the runner's isinstance checks against that name hold, whose
every method that vLLM's `DFlashProposer` also has is vLLM's own. It loads, drafts and samples
exactly as vLLM does without this package (the peer "DFlash, vLLM's own proposer").

What stays process-wide: the CPU fixes of vLLM's rejection sampler and seeded generators
(patching.py 4-5; without them vLLM 0.32's CPU speculative sampling at T > 0 is wrong for every
method, stock ones included), and the rule-health metrics, which count nothing without a rule.
"""

from __future__ import annotations

import inspect
import os
from importlib.metadata import entry_points
from typing import Mapping

from vllm.v1.spec_decode.dflash import DFlashProposer

PLUGIN_NAME = "liliprop"  # the entry point's name (pyproject.toml, vllm.general_plugins)


def liliprop_allowed(environ: Mapping[str, str] = os.environ) -> bool:
    """vLLM's rule for `VLLM_PLUGINS`: unset loads every plugin, a comma list only those named.
    Read from the environment directly: vLLM may have cached its own `envs` values."""
    plugins = environ.get("VLLM_PLUGINS")
    return plugins is None or PLUGIN_NAME in [name.strip() for name in plugins.split(",")]


def plugins_without_liliprop(environ: Mapping[str, str] = os.environ) -> str:
    """The `VLLM_PLUGINS` value that starts an engine as if this package were not installed:
    the plugins allowed now (unset: every installed one), less this one."""
    allowed = environ.get("VLLM_PLUGINS")
    names = ([name.strip() for name in allowed.split(",")] if allowed is not None
             else [entry.name for entry in entry_points(group="vllm.general_plugins")])
    return ",".join(name for name in names if name and name != PLUGIN_NAME)


def vllm_dflash_class(liliprop_class: type) -> type:
    """A subclass of `liliprop_class` that resolves every method vLLM's `DFlashProposer` has to
    vLLM's own (`__new__` stays inherited; it only picks this class)."""
    own = {
        name: inspect.getattr_static(DFlashProposer, name)
        for name in vars(liliprop_class)
        if name not in ("__module__", "__doc__", "__new__", "__qualname__")
        and hasattr(DFlashProposer, name)
    }
    # The runner's plain-step hand-over (patching.py, patch 14) looks for this hook: without
    # it, vLLM's own proposer gets vLLM's path at every step.
    own["keep_plain_step"] = None
    own["observe_schedule"] = None  # and the scheduler-output hook (patch 15) none
    doc = "vLLM's DFlashProposer under the runner's rebound name (vllm_liliprop/vllm/stock_dflash.py)."
    return type("VllmDFlashProposer", (liliprop_class,), {**own, "__doc__": doc,
                                                          "__module__": __name__})
