"""`python -m eval grid`: the "never slower" grid of a systems file, pooled over every run.

Each cell is one system at one (temperature, concurrency): its paired speedup over plain
decoding pooled over every results row of that cell (all runs, all benchmarks: output tokens /
wall time over the rows' own paired AR references, as `summarize` pools), with the 95%
bootstrap interval `summarize` gives. Only rows measured with the system's current
configuration count: a row whose speculative config (the draft's path aside) or package
options differ from the systems file's entry ran an older plan, and a row whose draft weights
(`checkpoint_hash`) differ from the draft the entry names now ran a retrained draft (a plan can
outlive its draft); both are left out and counted.
A row given twice (a pooled file beside its sources) counts once.
A cell below `--floor` (default 0.97, issue 34's bar) is marked.

    python -m eval grid testbed/smollm2/schedule/avx2/results_*/results.csv \\
        --systems testbed/smollm2/schedule/avx2/systems.json --only-suffix=-scheduled \\
        --var drafts=testbed/smollm2/round3/drafts
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from eval.results import json_object
from eval.summary import pooled_results
from eval.systems import checkpoint_hash, load_systems, parse_vars
from plots.table_intervals import pooled_interval
from plots.tables import pooled_value

FLOOR = 0.97
ROW_KEY = ["run_id", "system", "benchmark", "temperature", "concurrency", "input_len", "seed"]


def config_key(speculative_config: dict | None, liliprop: dict | None) -> str:
    """What a run served: the speculative config without the draft's path, and the package's
    options with any path cut to its last two parts (a clone's folders differ, and a systems
    file names them through variables such as ${drafts})."""
    spec = {k: v for k, v in (speculative_config or {}).items() if k != "model"}
    options = {k: _path_tail(v) for k, v in (liliprop or {}).items()} or None
    return json.dumps({"speculative_config": spec, "liliprop": options}, sort_keys=True)


def _path_tail(value):
    return "/".join(value.split("/")[-2:]) if isinstance(value, str) and "/" in value else value


def current_configs(systems_file: str | Path) -> dict[str, str]:
    """{system: config_key} of every entry of a systems file (as written, before variables)."""
    entries = json.loads(Path(systems_file).read_text())
    return {name: config_key(entry.get("speculative_config"), entry.get("liliprop"))
            for name, entry in entries.items() if isinstance(entry, dict)}


def current_weights(systems_file: str | Path, variables: dict[str, str], names) -> dict[str, str]:
    """{system: checkpoint_hash} of the draft each named entry serves now ("" without a draft)."""
    catalog = load_systems(systems_file, variables)
    return {name: checkpoint_hash(catalog.get(name)[0]) for name in names}


def absolute_paths(variables: dict[str, str]) -> dict[str, str]:
    """The variables with every existing path made absolute, as runs pass them: a draft's hash
    takes in an outside DeLS folder only when its path is absolute (eval.systems.checkpoint_hash)."""
    return {k: str(Path(v).resolve()) if v and Path(v).exists() else v for k, v in variables.items()}


def _row_config(system_config: str) -> str:
    served = json_object(system_config, "system_config")
    return config_key(served.get("speculative_config"), served.get("liliprop"))


def grid_cells(results: pd.DataFrame, configs: dict[str, str],
               weights: dict[str, str] | None = None) -> tuple[pd.DataFrame, int]:
    """(one row per system x temperature x concurrency with runs, speedup, low, high;
    the number of rows left out as another configuration's or, given `weights`
    ({system: checkpoint_hash}), other draft weights')."""
    runs = results[(results["kind"] == "run") & results["system"].isin(configs)
                   & (results["system"] != "AR")]
    # A row reached twice (a file pooled from others, passed beside them) counts once.
    runs = runs.drop_duplicates(subset=[c for c in ROW_KEY if c in runs.columns]).copy()
    current = runs.apply(lambda r: _row_config(r["system_config"]) == configs[r["system"]], axis=1)
    if weights is not None:
        current &= runs["checkpoint_hash"].astype(str) == runs["system"].map(weights)
    cells = []
    for (system, t, c), rows in runs[current].groupby(["system", "temperature", "concurrency"]):
        point = pooled_value(rows, "speedup", None)
        interval = pooled_interval(rows, "speedup", None, point=point)
        cells.append({"system": system, "temperature": t, "concurrency": c,
                      "runs": rows["run_id"].nunique(), "speedup": point,
                      "low": interval.low, "high": interval.high})
    return pd.DataFrame(cells), int((~current).sum())


def grid_markdown(cells: pd.DataFrame, floor: float = FLOOR) -> str:
    """System x (T, c) matrix: 'speedup [low, high] (runs)', cells under `floor` in bold."""
    def text(cell) -> str:
        body = f"{cell.speedup:.2f}x [{cell.low:.2f}, {cell.high:.2f}] ({cell.runs})"
        return f"**{body}**" if cell.speedup < floor else body

    columns = sorted({(t, c) for t, c in zip(cells["temperature"], cells["concurrency"])})
    lookup = {(r.system, r.temperature, r.concurrency): text(r) for r in cells.itertuples()}
    header = "| system | " + " | ".join(f"T = {t:g}, c = {c}" for t, c in columns) + " |"
    lines = [header, "| --- |" + " ---: |" * len(columns)]
    for system in sorted(set(cells["system"])):
        lines.append(f"| {system} | " + " | ".join(lookup.get((system, t, c), "—") for t, c in columns) + " |")
    met = int((cells["speedup"] >= floor).sum())
    lines += ["", f"{met} of {len(cells)} measured cells at {floor:.2f}x or more (bold: below); "
                  "[95% interval] (runs pooled); — not measured with the current configuration."]
    return "\n".join(lines)


def add_parser(sub) -> None:
    grid = sub.add_parser("grid", help="each system's pooled paired speedup per (T, c) cell, over "
                                       "every run of its current configuration (issue 34's grid)")
    grid.add_argument("results", nargs="+", help="results files (.csv or .parquet), pooled")
    grid.add_argument("--systems", required=True, help="the systems file whose current entries count")
    grid.add_argument("--only-suffix", default="", help="only systems whose name ends so (e.g. -scheduled)")
    grid.add_argument("--floor", type=float, default=FLOOR, help="mark cells below this speedup")
    grid.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                      help="the systems file's variables (e.g. drafts=DIR): with them, rows whose draft "
                           "weights differ from the drafts named now are left out too")


def command(args) -> int:
    configs = {name: key for name, key in current_configs(args.systems).items()
               if name.endswith(args.only_suffix)}
    weights = current_weights(args.systems, absolute_paths(parse_vars(args.var)), configs) if args.var else None
    cells, stale = grid_cells(pooled_results(args.results), configs, weights)
    if cells.empty:
        raise ValueError(f"no row of {', '.join(args.results)} ran a current entry of {args.systems}")
    print(grid_markdown(cells, args.floor))
    what = "configuration or draft weights" if weights is not None else "configuration"
    print(f"\n{stale} row(s) left out: they ran another {what} than {args.systems} names now.")
    return 0
