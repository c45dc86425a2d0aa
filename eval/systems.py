"""Systems: named configurations of speculative decoding compared in one run.

A systems file is a JSON object mapping each system name to an entry:

    {
      "AR":     {},
      "DFlash": {"speculative_config": {"method": "dflash", "model": "${draft}",
                                        "num_speculative_tokens": 15}},
      "LiLiCorr-viterbi": {"speculative_config": {...}, "liliprop": {"rule": "lattice",
                                                                    "walk": "viterbi"}},
      "DeLS-GRU": {"speculative_config": {...}, "liliprop": {"rule": "dels", "dels_path": "${dels_gru}"},
                   "dels_grid": {"alpha": [0.1, 0.3, 0.5], "beta": [0.1, 0.3]}},
      "ngram":  {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4,
                                        "prompt_lookup_max": 4}}
    }

Entry fields: `speculative_config` (passed to vLLM as is; absent or null = plain decoding),
`liliprop` (draft-rule options, `VLLM_LILIPROP_OPTIONS`; see vllm_liliprop/options.py),
`without_liliprop` (true: the engine starts with this package left out of `VLLM_PLUGINS`, so a
DFlash draft runs on vLLM's own proposer: the peer a user without this package has),
`dels_grid` (expand the system over alpha x beta), `description`. Nothing else: engine flags that
change speed are shared by every system and set once on the command line, so an entry that tries
to set one is refused. "AR" is the baseline that speedups are measured against; it must not
speculate. `${name}` in any string is replaced by `--var name=value` (a whole-string placeholder
whose value is a finite JSON number takes that number; anything else stays text).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vllm_liliprop.heads.dels_io import CONFIG_NAME, DelsConfig, find_dels_dir, read_dels_config
from vllm_liliprop.options import ENV_VAR, OptionError, env_options

BASELINE = "AR"
ENTRY_KEYS = ("speculative_config", "liliprop", "dels_grid", "description", "without_liliprop")
# Speed-relevant engine flags: shared by all arms of a comparison, never set per system.
ENGINE_FLAG_KEYS = (
    "dtype", "max_model_len", "enable_prefix_caching", "enforce_eager", "max_num_seqs",
    "max_num_batched_tokens", "gpu_memory_utilization", "hf_overrides", "yarn", "draft_yarn", "kv_cache_dtype",
    "enable_chunked_prefill", "tensor_parallel_size", "quantization", "block_size",
    "async_scheduling", "compilation_config", "engine_flags", "engine",
)
# speculative_config fields that would give the draft its own value of a shared engine flag.
SPEC_SHARED_KEYS = ("enforce_eager", "max_model_len")
DELS_RULES = ("dels", "lattice+dels")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class SystemsError(ValueError):
    """A bad systems file or system selection; the message names the system and field."""


@dataclass(frozen=True)
class System:
    name: str
    speculative_config: dict | None = None
    liliprop: dict | None = None
    description: str = ""
    # The (alpha, beta) grid point this copy runs at; None outside a grid.
    grid_alpha: float | None = None
    grid_beta: float | None = None
    without_liliprop: bool = False  # vLLM's own proposer (vllm_liliprop/vllm/stock_dflash.py)

    @property
    def is_baseline(self) -> bool:
        return self.name == BASELINE

    @property
    def uses_dels(self) -> bool:
        return (self.liliprop or {}).get("rule") in DELS_RULES

    @property
    def draft(self) -> str:
        return str((self.speculative_config or {}).get("model") or "")

    def options(self) -> dict | None:
        """The draft-rule options the engine runs with (grid point folded in)."""
        if self.liliprop is None:
            return None
        options = dict(self.liliprop)
        if self.grid_alpha is not None:
            options["dels_alpha"] = self.grid_alpha
        if self.grid_beta is not None:
            options["dels_beta"] = self.grid_beta
        return options

    def config(self) -> dict:
        config = {"speculative_config": self.speculative_config, "liliprop": self.options()}
        if self.without_liliprop:  # only then, so that earlier rows' configs still match
            config["without_liliprop"] = True
        return config

    def config_json(self) -> str:
        return json.dumps(self.config(), sort_keys=True)

    def dels_weights(self) -> tuple[float, float]:
        """(dels_alpha, dels_beta) for the results: NaN without a DeLS head or for per-slot lists."""
        if not self.uses_dels:
            return math.nan, math.nan
        options = self.options() or {}
        head = None
        out = []
        for key, head_key in (("dels_alpha", "alpha"), ("dels_beta", "beta")):
            value = options.get(key)
            if value is None:  # the head's own weight (its config's, or the default)
                head = head or self._dels_config(options.get("dels_path", "dels"))
                value = getattr(head, head_key)
            out.append(float(value) if isinstance(value, (int, float)) else math.nan)
        return out[0], out[1]

    def _dels_config(self, dels_path: str) -> DelsConfig:
        """The config of the DeLS head this system serves, found as the rule finds it (a
        relative dels_path is inside the draft folder); ValueError if there is none."""
        path = Path(dels_path)
        folder = find_dels_dir(path if path.is_absolute() else Path(self.draft) / path)
        return read_dels_config(folder / CONFIG_NAME)


def parse_vars(items: list[str]) -> dict[str, str]:
    """{NAME: VALUE} of `--var NAME=VALUE` flags (the systems file's ${NAME} placeholders)."""
    bad = [item for item in items if "=" not in item]
    if bad:
        raise ValueError(f"--var {bad[0]!r} must look like NAME=VALUE")
    return dict(item.split("=", 1) for item in items)


def substitute(value: Any, variables: dict[str, str], where: str) -> Any:
    """Replace ${name} placeholders in every string of a JSON value."""
    if isinstance(value, dict):
        return {k: substitute(v, variables, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, variables, f"{where}[{i}]") for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value

    def lookup(match: re.Match) -> str:
        name = match.group(1)
        if name not in variables:
            raise SystemsError(f"{where} = {value!r} uses ${{{name}}}, which is not set; pass "
                               f"--var {name}=VALUE")
        return variables[name]

    whole = _VAR.fullmatch(value)
    if whole:
        text = lookup(whole)
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            return text
        # A number only when it is one a user means: not true/false (bools are ints to Python)
        # nor NaN / Infinity / 1e999, which JSON readers accept and no setting wants.
        is_number = type(parsed) in (int, float) and math.isfinite(parsed)
        return parsed if is_number else text
    return _VAR.sub(lookup, value)


def parse_entry(name: str, entry: Any, where: str) -> tuple[System, dict | None]:
    """One systems-file entry -> (System, its dels_grid or None)."""
    if not isinstance(entry, dict):
        raise SystemsError(f"{where}: system {name!r} must be a JSON object, got {type(entry).__name__}")
    engine_keys = sorted(set(entry) & set(ENGINE_FLAG_KEYS))
    if engine_keys:
        raise SystemsError(
            f"{where}: system {name!r} sets engine flag(s) {engine_keys}; engine flags are shared by "
            "every system of a comparison: set them once with --engine-flags / --yarn-factor"
        )
    unknown = sorted(set(entry) - set(ENTRY_KEYS))
    if unknown:
        raise SystemsError(f"{where}: system {name!r} has unknown field(s) {unknown}; known fields: "
                           f"{', '.join(ENTRY_KEYS)}")
    spec = entry.get("speculative_config")
    if spec is not None:
        if not isinstance(spec, dict) or "method" not in spec:
            raise SystemsError(f"{where}: {name}.speculative_config must be an object with a "
                               "'method' (vLLM's speculative_config), or null for plain decoding")
        shared = sorted(set(spec) & set(SPEC_SHARED_KEYS))
        if shared:
            raise SystemsError(
                f"{where}: {name}.speculative_config sets {shared}, which must follow the shared "
                "engine flags; remove them (the draft then inherits the engine's values)"
            )
    liliprop = entry.get("liliprop")
    if liliprop is not None:
        try:
            env_options({ENV_VAR: json.dumps(liliprop)})
        except OptionError as exc:
            raise SystemsError(f"{where}: {name}.liliprop: {exc}".replace(ENV_VAR, "liliprop")) from None
        if spec is None:
            raise SystemsError(f"{where}: {name}.liliprop needs a speculative_config with a draft")
    if name == BASELINE and (spec is not None or liliprop is not None):
        raise SystemsError(f"{where}: {BASELINE!r} is the autoregressive baseline of every speedup; "
                           "it cannot speculate. Give the speculating system another name")
    without = _check_without_liliprop(entry.get("without_liliprop", False), liliprop,
                                      f"{where}: {name}")
    grid = entry.get("dels_grid")
    system = System(name, spec, liliprop, str(entry.get("description", "")),
                    without_liliprop=without)
    if grid is not None:
        grid = _check_grid(grid, f"{where}: {name}.dels_grid")
        if not system.uses_dels:
            raise SystemsError(f"{where}: {name}.dels_grid needs liliprop.rule 'dels' or 'lattice+dels'")
    return system, grid


def _check_without_liliprop(value: Any, liliprop: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise SystemsError(f"{where}.without_liliprop = {value!r} must be true or false")
    if value and liliprop is not None:
        raise SystemsError(f"{where} sets both liliprop (this package's rule options) and "
                           "without_liliprop = true (this package off); keep one")
    return value


def _check_grid(grid: Any, where: str) -> dict:
    if not isinstance(grid, dict) or set(grid) - {"alpha", "beta"} or not grid:
        raise SystemsError(f"{where} must be an object with 'alpha' and/or 'beta' lists of numbers")
    out = {}
    for key, values in grid.items():
        if (not isinstance(values, list) or not values
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)):
            raise SystemsError(f"{where}.{key} = {values!r} must be a non-empty list of numbers")
        out[key] = [float(v) for v in values]
    return out


@dataclass
class Catalog:
    """Systems as defined (raw entries); an entry is substituted and checked when selected, so
    placeholders of systems that are not run need no --var."""

    entries: dict[str, tuple[Any, str]]  # name -> (raw entry, where it was defined)
    variables: dict[str, str]

    def get(self, name: str) -> tuple[System, dict | None]:
        if name not in self.entries:
            raise SystemsError(f"unknown system {name!r}; defined: {', '.join(self.entries)}")
        entry, where = self.entries[name]
        return parse_entry(name, substitute(entry, self.variables, f"{where}: {name}"), where)


def load_systems(path: str | Path | None, variables: dict[str, str] | None = None,
                 inline: list[str] | None = None) -> Catalog:
    """The systems of a systems file plus `NAME=JSON` inline definitions (which win)."""
    entries: dict[str, tuple[Any, str]] = {}
    if path is not None:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise SystemsError(f"systems file {path} cannot be read ({exc.strerror})") from None
        except json.JSONDecodeError as exc:
            raise SystemsError(f"systems file {path} is not valid JSON ({exc})") from None
        if not isinstance(data, dict) or not data:
            raise SystemsError(f"systems file {path} must be a non-empty JSON object: name -> entry")
        entries.update({name: (entry, str(path)) for name, entry in data.items()})
    for item in inline or []:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise SystemsError(f"--system {item!r} must look like NAME='{{\"speculative_config\": ...}}'")
        try:
            entries[name] = (json.loads(text), f"--system {name}")
        except json.JSONDecodeError as exc:
            raise SystemsError(f"--system {name}: not valid JSON ({exc})") from None
    return Catalog(entries, dict(variables or {}))


SCHEDULED = "-scheduled"  # `eval schedule` writes a system's measured plan under this suffix


def with_plans(catalog: Catalog, path: str | Path) -> Catalog:
    """`catalog` with each system that has a plan in the plan file `path` (an `eval schedule`
    output: NAME-scheduled entries, a k per batch size measured on a host) served by that plan
    under its own name, so that a table keeps its names and shows the tuned configuration.
    Systems without a plan there keep their entry."""
    path = Path(path)
    try:
        plans = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemsError(f"plan file {path} cannot be read as JSON ({exc}); give a file that "
                           "`python -m eval schedule --out` wrote, or leave --plans out") from None
    if not isinstance(plans, dict):
        raise SystemsError(f"plan file {path} must be a JSON object: name -> entry")
    entries = dict(catalog.entries)
    for name in catalog.entries:
        if name + SCHEDULED in plans:
            entries[name] = (plans[name + SCHEDULED], f"{path}: {name}{SCHEDULED}")
    return Catalog(entries, catalog.variables)


def select_systems(catalog: Catalog, names: list[str] | None, alphas: list[float] | None = None,
                   betas: list[float] | None = None) -> list[System]:
    """The systems to run, AR first, DeLS grids expanded (command-line grids override the file's)."""
    names = names or list(catalog.entries)
    missing = [n for n in names if n not in catalog.entries]
    if missing:
        raise SystemsError(f"unknown system(s) {missing}; defined: {', '.join(catalog.entries)}")
    ordered = sorted(dict.fromkeys(names), key=lambda n: n != BASELINE)
    out: list[System] = []
    for name in ordered:
        system, grid = catalog.get(name)
        grid = dict(grid or {})
        if system.uses_dels:
            if alphas:
                grid["alpha"] = alphas
            if betas:
                grid["beta"] = betas
        if not grid:
            out.append(system)
            continue
        for alpha in grid.get("alpha", [None]):
            for beta in grid.get("beta", [None]):
                out.append(replace(system, grid_alpha=alpha, grid_beta=beta))
    return out


_HASHES: dict[str, str] = {}  # folders -> hash, so a run reads each checkpoint once


def checkpoint_hash(system: System) -> str:
    """sha256 prefix over the draft's files (and an outside DeLS folder); "" without a local draft."""
    if not system.draft or not Path(system.draft).exists():
        return ""
    folders = [Path(system.draft)]
    dels_path = (system.options() or {}).get("dels_path")
    if system.uses_dels and dels_path and Path(dels_path).is_absolute():
        folders.append(Path(dels_path))
    key = "|".join(str(f.resolve()) for f in folders)
    if key not in _HASHES:
        digest = hashlib.sha256()
        for folder in folders:
            files = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*") if p.is_file())
            for file in files:
                digest.update(str(file.relative_to(folder) if file != folder else file.name).encode())
                with file.open("rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        digest.update(chunk)
        _HASHES[key] = digest.hexdigest()[:16]
    return _HASHES[key]
