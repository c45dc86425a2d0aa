"""Draft-rule options: where they come from, what they may be, and how bad values are reported.

Sources, later ones win:
1. defaults (below);
2. the draft checkpoint: `config.json` -> `dflash_config.liliprop` (an object);
3. the run: the environment variable `VLLM_LILIPROP_OPTIONS`, a JSON object with the same keys
   (it reaches vLLM's worker processes, which inherit the environment).

A draft is served by this package when its architecture is `LiLiCorrDraftModel` (rule "lattice")
or `Qwen3DSparkModel` (rule "dspark"), when its
`dflash_config` has a `liliprop` block, or when `VLLM_LILIPROP_OPTIONS` is set. Otherwise the
proposer behaves exactly like vLLM's own DFlash proposer.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from vllm_liliprop.draft_length import check_confidence_floor, check_draft_length
from vllm_liliprop.heads.dels import check_fusion_weight
from vllm_liliprop.heads.lattice import read_dflash_fields
from vllm_liliprop.prompt_lookup import check_lookup_lengths
from vllm_liliprop.sampled_drafts import check_sampled_k

ENV_VAR = "VLLM_LILIPROP_OPTIONS"
CONFIG_BLOCK = "liliprop"
LILICORR_ARCH = "LiLiCorrDraftModel"
DSPARK_ARCH = "Qwen3DSparkModel"

RULES = ("argmax", "lattice", "dels", "lattice+dels", "dspark", "domino")
WALKS = ("greedy", "viterbi")
SAMPLINGS = ("deterministic", "probabilistic")


class OptionError(ValueError):
    """A bad draft-rule option; the message names the field and how to fix it."""


@dataclass(frozen=True)
class LiliPropOptions:
    # "argmax" | "lattice" | "dels" | "lattice+dels" | "dspark" | "domino"
    # | "package.module:factory" (a custom rule)
    rule: str = "argmax"
    walk: str = "greedy"
    sampling: str = "deterministic"
    # DeLS head folder, relative to the draft directory unless absolute.
    dels_path: str = "dels"
    # Domino head folder (heads/domino.py), relative to the draft directory unless absolute.
    domino_path: str = "domino"
    # None: take the DeLS head's own (its config's, else heads.dels_io.DEFAULT_FUSION_WEIGHT).
    dels_alpha: float | tuple[float, ...] | None = None
    dels_beta: float | tuple[float, ...] | None = None
    # [min_n, max_n]: the hybrid rule. Where a request's last min_n..max_n tokens occurred earlier
    # in it, the tokens that followed them are its draft instead of the rule's (prompt_lookup.py).
    prompt_lookup: tuple[int, int] | None = None
    # How many of the rule's slots a request's draft keeps (None: all k); a lookup continuation
    # keeps all k. With prompt_lookup, k can then be long for the lookup only (draft_length.py).
    rule_draft_length: int | None = None
    # ((start, end, k), ...): requests sampled at T > 0 draft at most k tokens at batch sizes
    # start..end (0: none); greedy requests keep the engine's k (sampled_drafts.py).
    sampled_k: tuple[tuple[int, int, int], ...] | None = None
    # A greedy request's draft ends at the first slot where the drafter's probability that the
    # draft so far is right falls below this (draft_length.confident_cut); None: no cut.
    draft_confidence_floor: float | None = None
    # Where each value came from, for the startup log line.
    sources: dict[str, str] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("sources")
        return out

    @property
    def reports_confidence(self) -> bool:
        """Whether rules must report DraftOutput.confidence: only for `draft_confidence_floor`
        (it costs a logsumexp over every slot's logits in most rules)."""
        return self.draft_confidence_floor is not None

    @property
    def uses_lattice(self) -> bool:
        return self.rule in ("lattice", "lattice+dels")

    @property
    def uses_dels(self) -> bool:
        return self.rule in ("dels", "lattice+dels")


_KEYS = {f for f in LiliPropOptions.__dataclass_fields__ if f != "sources"}


def _check_choice(where: str, key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise OptionError(
            f"{where}.{key} = {value!r} is not valid; use one of {', '.join(choices)}."
        )
    return value


def _check_schedule(where: str, key: str, value: Any):
    if value is None:
        return None
    try:
        weights = check_fusion_weight(value, f"{where}.{key}")
    except ValueError as exc:
        raise OptionError(f"{exc}.") from None
    return tuple(weights) if isinstance(weights, list) else weights


def _validate_block(where: str, block: Any) -> dict[str, Any]:
    if not isinstance(block, dict):
        raise OptionError(f"{where} must be a JSON object, got {type(block).__name__}.")
    unknown = set(block) - _KEYS
    if unknown:
        raise OptionError(
            f"{where} has unknown field(s) {sorted(unknown)}; known fields: {sorted(_KEYS)}."
        )
    out = dict(block)
    if "rule" in out:
        rule = out["rule"]
        if not isinstance(rule, str) or (rule not in RULES and ":" not in rule):
            raise OptionError(
                f"{where}.rule = {rule!r} is not valid; use one of {', '.join(RULES)} "
                "or 'package.module:factory' for a custom rule."
            )
    if "walk" in out:
        _check_choice(where, "walk", out["walk"], WALKS)
    if "sampling" in out:
        _check_choice(where, "sampling", out["sampling"], SAMPLINGS)
    for key in ("dels_path", "domino_path"):
        if key in out and not isinstance(out[key], str):
            raise OptionError(
                f"{where}.{key} = {out[key]!r} must be a string path (a folder with "
                "config.json + model.safetensors, relative to the draft folder or absolute)."
            )
    for key in ("dels_alpha", "dels_beta"):
        if key in out:
            out[key] = _check_schedule(where, key, out[key])
    if out.get("prompt_lookup") is not None:
        try:
            out["prompt_lookup"] = check_lookup_lengths(out["prompt_lookup"], f"{where}.prompt_lookup")
        except ValueError as exc:
            raise OptionError(f"{exc}.") from None
    if out.get("rule_draft_length") is not None:
        try:
            check_draft_length(out["rule_draft_length"], f"{where}.rule_draft_length")
        except ValueError as exc:
            raise OptionError(f"{exc}.") from None
    if out.get("draft_confidence_floor") is not None:
        try:
            out["draft_confidence_floor"] = check_confidence_floor(
                out["draft_confidence_floor"], f"{where}.draft_confidence_floor")
        except ValueError as exc:
            raise OptionError(f"{exc}.") from None
    if out.get("sampled_k") is not None:
        try:
            out["sampled_k"] = check_sampled_k(out["sampled_k"], f"{where}.sampled_k")
        except ValueError as exc:
            raise OptionError(f"{exc}.") from None
    return out


def env_options(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    raw = (environ if environ is not None else os.environ).get(ENV_VAR)
    if raw is None or not raw.strip():
        return None
    try:
        block = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(
            f"{ENV_VAR} is not valid JSON ({exc}); set it to an object such as "
            '\'{"rule": "lattice", "walk": "viterbi"}\'.'
        ) from None
    return _validate_block(ENV_VAR, block)


def check_lilicorr_fields(dflash_config: dict) -> None:
    """The LiLiCorr head fields (`dflash_config.lilicorr_*`), checked before vLLM's own LiLiCorr
    model reads them: it would report a missing field as a bare KeyError and a wrong type as a
    TypeError from inside its constructor. ValueError naming the field and the fix."""
    read_dflash_fields(dflash_config)


def resolve_options(
    architectures: list[str] | None,
    dflash_config: dict | None,
    draft_sample_method: str | None = None,
    environ: dict[str, str] | None = None,
) -> LiliPropOptions | None:
    """The options a draft runs with, or None when this package should not change anything."""
    dflash_config = dflash_config or {}
    from_env = env_options(environ)
    block = dflash_config.get(CONFIG_BLOCK)
    is_lilicorr = LILICORR_ARCH in (architectures or [])
    is_dspark = DSPARK_ARCH in (architectures or [])
    if not is_lilicorr and not is_dspark and block is None and from_env is None:
        return None
    if is_lilicorr:
        check_lilicorr_fields(dict(dflash_config))

    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if is_lilicorr or is_dspark:
        values["rule"] = "lattice" if is_lilicorr else "dspark"
        sources["rule"] = "architecture"
    if draft_sample_method == "probabilistic":
        values["sampling"] = "probabilistic"
        sources["sampling"] = "speculative_config.draft_sample_method"
    if block is not None:
        for key, value in _validate_block(f"dflash_config.{CONFIG_BLOCK}", block).items():
            values[key] = value
            sources[key] = "checkpoint"
    for key, value in (from_env or {}).items():
        values[key] = value
        sources[key] = ENV_VAR

    options = LiliPropOptions(**values, sources=sources)
    where = sources.get("rule", "defaults")
    if options.uses_lattice and not is_lilicorr:
        raise OptionError(
            f"rule {options.rule!r} (from {where}) needs a LiLiCorr head, but the draft's "
            f"architecture is {architectures}; use a {LILICORR_ARCH} checkpoint or rule 'dels'/'argmax'."
        )
    if (options.rule == "dspark") != is_dspark and options.rule in RULES:
        raise OptionError(
            f"rule {options.rule!r} (from {where}) does not fit the draft's architecture "
            f"{architectures}: rule 'dspark' serves {DSPARK_ARCH} checkpoints (their Markov head), "
            f"and a {DSPARK_ARCH} checkpoint is served by rule 'dspark' only (without its head "
            "its drafter is not a DFlash drafter); fix the rule or the checkpoint."
        )
    return options
