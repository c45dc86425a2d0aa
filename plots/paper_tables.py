"""The papers' appendix tables from a results file (LiLiCorr Tables 2, 7-10, 13, 14, 16, 17).

- `concurrency_table`: Table 2 style, rows benchmark x concurrency, columns system x tier, one
  metric (speedup, or tau); a pooled "all" tier per system where a benchmark has tiers.
- `concurrency_detail_table`: Table 13/14 style, rows benchmark x tier x concurrency, columns
  system, cells tau / tokens/s / speedup.
- `category_table`: Table 7/8 style, rows temperature x benchmark x category (SPEED categories,
  or the entropy tiers of a throughput block) at each benchmark's main setting, cells tau / tokens/s,
  closed per benchmark by the unweighted mean over categories and by the pooled
  (block-weighted) value over every prompt of them.
- `seed_table`: Table 9/10 style, T > 0 runs over several seeds: mean and sample standard
  deviation over seeds of tau and tokens/s per benchmark and system.

Aggregation (one rule for every cell here): a cell is the mean over seeds of a per-seed value
pooled over the rows it covers (its categories or tiers): tau = 1 + accepted / drafts
(block-weighted), tokens/s = output tokens / wall time, speedup = that over AR's pooled tokens/s
on the same rows and seed (plots.tables.pooled_value). On one row this is the row's own value.

Memory-bound flags (concurrency tables), from the columns a results file has:
- "‡" offered, not resident: the measurement had fewer prompts (num_prompts, per category) than
  its concurrency c, so the engine never held c sequences at once;
- "†" memory-bound: c sequences of the block's fixed input length plus the generation cap
  (protocol max_tokens) need more KV-cache tokens than the engine had, c x (input_len +
  max_tokens) > KV-cache tokens; the KV-cache size is not a results column, so it is given
  (`python -m plots all --kv-cache-tokens N`, the number vLLM logs at start-up as its KV cache
  size in tokens); natural-length benchmarks (input_len 0) are never marked †.
"""

import json
import math

import numpy as np
import pandas as pd

from plots.select import main_setting, ordered_unique, system_order
from plots.table_intervals import INTERVAL_VALUES, NOTE, pooled_interval
from plots.tables import LABEL_HEADERS, Table, TableRow, fixed_setting_runs, format_label, pooled_value

NEEDED = ["kind", "system", "benchmark", "category", "temperature", "concurrency", "input_len", "seed",
          "target", "dels_alpha", "dels_beta", "tau", "tokens_per_s", "speedup"]
COUNTERS = ["num_drafts", "num_accepted_tokens", "output_tokens", "wall_s"]
BASELINE = "AR"
ALL_TIERS = "all (pooled)"
UNWEIGHTED = "Mean over categories (unweighted)"
POOLED = "All categories (pooled)"
OFFERED, MEMORY = "‡", "†"
POOLING_NOTE = ("Each cell is the mean over seeds of a per-seed value pooled over its rows: tau = 1 + "
                "accepted / drafts (block-weighted), tokens/s = tokens / wall time, speedup = that "
                "over AR's on the same rows.")


def _fixed_runs(df: pd.DataFrame, where: str) -> pd.DataFrame:
    return fixed_setting_runs(df, NEEDED + COUNTERS, where).rows


def _is_baseline(system: str) -> bool:
    return system.upper() == BASELINE


def seed_values(rows: pd.DataFrame, system: str, value: str) -> list[float]:
    """Per seed (first-appearance order), `value` of `system` pooled over its rows in `rows`;
    the baseline's rows on the same categories and seed are the speedup's reference."""
    mine = rows[rows["system"] == system]
    base = rows[[_is_baseline(s) for s in rows["system"]]]
    out = []
    for seed in ordered_unique(mine["seed"]):
        group = mine[mine["seed"] == seed]
        reference = base[(base["seed"] == seed) & base["category"].isin(set(group["category"]))]
        pooled = pooled_value(group, value, reference if len(reference) else None)
        if math.isnan(pooled) and len(group) == 1:  # no counters: the row's own number
            pooled = float(group[value].iloc[0])
        out.append(pooled)
    return out


def cell(rows: pd.DataFrame, system: str, value: str) -> float:
    """Mean over seeds of the pooled per-seed value (NaN without data)."""
    values = [v for v in seed_values(rows, system, value) if not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


def _shown(rows: pd.DataFrame, system: str, metric: str, value: float) -> str:
    """A cell's text: tau and speedup with their 95% interval over the cell's rows (pooled, as
    the cell; plots.table_intervals), tokens/s as it is."""
    if metric not in INTERVAL_VALUES or math.isnan(value) or _is_baseline(system):  # AR: 1 by definition
        return _fmt(value, metric)
    mine = rows[rows["system"] == system]
    base = rows[[_is_baseline(s) for s in rows["system"]]]
    iv = pooled_interval(mine, metric, base if len(base) else None, point=value)
    return iv.text(2, "×" if metric == "speedup" else "")


def _fmt(value: float, metric: str) -> str:
    if math.isnan(value):
        return "—"
    if metric == "tau":
        return f"{value:.2f}"
    if metric == "tokens_per_s":
        return f"{value:.1f}" if value < 100 else f"{value:.0f}"
    return f"{value:.2f}×"


def _row_keys(rows: pd.DataFrame, labels: list[str]) -> list[tuple]:
    """Distinct label tuples, grouped by every label but concurrency in first-appearance order,
    concurrency ascending inside a group (a benchmark's rows stay together)."""
    keys = ordered_unique(tuple(r) for r in rows[labels].itertuples(index=False))
    if "concurrency" not in labels:
        return keys
    at = labels.index("concurrency")
    order = ordered_unique(k[:at] + k[at + 1:] for k in keys)
    return sorted(keys, key=lambda k: (order.index(k[:at] + k[at + 1:]), k[at]))


def _label_cells(labels: list[str], key: tuple, flags: str = "") -> list[str]:
    shown = [format_label(c, v) for c, v in zip(labels, key)]
    if flags:
        shown[-1] += " " + flags
    return shown


def _labels(rows: pd.DataFrame, always: list[str]) -> list[str]:
    """target and temperature when they vary, then `always`."""
    return [c for c in ("target", "temperature") if rows[c].nunique() > 1] + always


def _swept(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of benchmarks run at more than one concurrency (same target, T, input length)."""
    keys = ["target", "temperature", "benchmark", "input_len"]
    many = rows.groupby(keys, sort=False)["concurrency"].transform("nunique") > 1
    return rows[many.astype(bool)]


def _max_tokens(protocol) -> float:
    try:
        return float(json.loads(protocol)["max_tokens"])
    except (TypeError, ValueError, KeyError):
        return math.nan


def row_flags(rows: pd.DataFrame, kv_cache_tokens: int | None) -> str:
    """The memory-bound marks of one table row's measurements (module docstring)."""
    flags = ""
    if "num_prompts" in rows.columns:
        prompts = pd.to_numeric(rows["num_prompts"], errors="coerce")
        if bool((rows["concurrency"] > prompts).any()):
            flags += OFFERED
    if kv_cache_tokens and "protocol" in rows.columns:
        caps = rows["protocol"].map(_max_tokens)
        need = rows["concurrency"] * (rows["input_len"] + caps)
        if bool(((rows["input_len"] > 0) & (need > kv_cache_tokens)).any()):
            flags += MEMORY
    return flags


def flag_note(kv_cache_tokens: int | None) -> str:
    memory = (f"{MEMORY} memory-bound: c × (input length + max_tokens) > {kv_cache_tokens} KV-cache tokens "
              "(the KV cache cannot hold c such sequences; fixed-length blocks only)"
              if kv_cache_tokens else
              f"{MEMORY} (memory-bound, c × (input length + max_tokens) > KV-cache tokens) not evaluated: "
              "no KV-cache size given (plots all --kv-cache-tokens N)")
    return (f"{OFFERED} offered, not resident: a measurement of the row had fewer prompts than c, so the "
            f"engine never held c sequences; {memory}.")


def _tiers(rows: pd.DataFrame) -> list[str]:
    return ordered_unique(rows["category"])


def tier_groups(df: pd.DataFrame) -> list[list[str]]:
    """Benchmarks run at several concurrencies, grouped by their list of tiers (categories):
    one Table 2 style table per group, so that e.g. the 1K and 2K throughput blocks (low / mixed
    / high) share a table and SPEED's qualitative categories get their own."""
    rows = _swept(_fixed_runs(df, "tier_groups"))
    groups: dict[tuple, list[str]] = {}
    for benchmark in ordered_unique(rows["benchmark"]):
        tiers = tuple(ordered_unique(rows.loc[rows["benchmark"] == benchmark, "category"]))
        groups.setdefault(tiers, []).append(benchmark)
    return list(groups.values())


def concurrency_table(df: pd.DataFrame, value: str = "speedup", kv_cache_tokens: int | None = None,
                      benchmarks: list[str] | None = None) -> Table:
    """Table 2 style: rows [target, T,] benchmark, c; columns system x tier (plus a pooled "all"
    tier per system where a benchmark has several); AR's tokens/s first when value is speedup
    (tau leaves AR out: it does not speculate). Best per tier and row in bold.
    benchmarks: only these (default: all run at several concurrencies; see tier_groups)."""
    rows = _swept(_fixed_runs(df, "concurrency_table"))
    if benchmarks is not None:
        rows = rows[rows["benchmark"].isin(benchmarks)]
    if rows.empty:
        raise ValueError("no benchmark was run at more than one concurrency (eval run --concurrency 1,2,...)")
    systems = system_order(rows)
    tiers = _tiers(rows)
    pooled_tier = len([t for t in tiers if t]) > 1
    shown_tiers = tiers + ([ALL_TIERS] if pooled_tier else [])
    columns: list[tuple[str, str, str]] = []  # (system, tier, metric)
    if value == "speedup" and any(_is_baseline(s) for s in systems):
        columns += [(s, t, "tokens_per_s") for s in systems if _is_baseline(s) for t in shown_tiers]
    columns += [(s, t, value) for s in systems if not _is_baseline(s) for t in shown_tiers]
    labels = _labels(rows, ["benchmark", "concurrency"])
    out = []
    for key in _row_keys(rows, labels):
        group = rows[np.logical_and.reduce([rows[c] == v for c, v in zip(labels, key)])]
        values = []
        for system, tier, metric in columns:
            part = group if tier == ALL_TIERS else group[group["category"] == tier]
            values.append(cell(part, system, metric) if len(part) else math.nan)
        texts = [_shown(group if t == ALL_TIERS else group[group["category"] == t], sy, m, v)
                 for v, (sy, t, m) in zip(values, columns)]
        out.append(TableRow(_label_cells(labels, key, row_flags(group, kv_cache_tokens)), values, cells=texts))
    header = [_column_name(s, t, m) for s, t, m in columns]
    groups = [None if m == "tokens_per_s" else t for _, t, m in columns]
    table = Table([LABEL_HEADERS.get(c, c) for c in labels], header, out, 2, best="max", best_groups=groups)
    what = {"speedup": "speedup over AR (at the same c)", "tau": "acceptance length τ"}.get(value, value)
    table.caption = (f"{what} per system and tier as concurrency c grows; best per tier and row in bold"
                     + ("; AR in tokens/s" if value == "speedup" else ""))
    table.notes = [POOLING_NOTE, NOTE]
    if pooled_tier:
        table.notes.append(f"{ALL_TIERS}: every prompt of the tiers at once (block-weighted), not the "
                           "mean of the tier columns.")
    table.notes.append(flag_note(kv_cache_tokens))
    return table


def _column_name(system: str, tier: str, metric: str) -> str:
    name = f"{system} (tok/s)" if metric == "tokens_per_s" else system
    return f"{name} · {tier}" if tier else name


def concurrency_detail_table(df: pd.DataFrame, kv_cache_tokens: int | None = None) -> Table:
    """Table 13/14 style: rows [target, T,] benchmark, tier, c; columns system; cells
    tau / tokens/s / speedup (AR: tokens/s / speedup); highest speedup per row in bold."""
    rows = _swept(_fixed_runs(df, "concurrency_detail_table"))
    if rows.empty:
        raise ValueError("no benchmark was run at more than one concurrency (eval run --concurrency 1,2,...)")
    systems = system_order(rows)
    labels = _labels(rows, ["benchmark", "category", "concurrency"])
    if rows["category"].eq("").all():
        labels.remove("category")
    out = []
    for key in _row_keys(rows, labels):
        group = rows[np.logical_and.reduce([rows[c] == v for c, v in zip(labels, key)])]
        values, texts = [], []
        for system in systems:
            tau, tps, speedup = (cell(group, system, m) for m in ("tau", "tokens_per_s", "speedup"))
            values.append(speedup)
            parts = [_fmt(tps, "tokens_per_s"), _shown(group, system, "speedup", speedup)]
            texts.append(" / ".join(parts if _is_baseline(system) else [_shown(group, system, "tau", tau)] + parts))
        out.append(TableRow(_label_cells(labels, key, row_flags(group, kv_cache_tokens)), values, cells=texts))
    header = [f"{s} (tok/s / Sp.)" if _is_baseline(s) else f"{s} (τ / tok/s / Sp.)" for s in systems]
    table = Table([{"category": "Tier"}.get(c, LABEL_HEADERS.get(c, c)) for c in labels], header, out, 2)
    table.caption = ("acceptance length τ / output tokens/s / speedup over AR at the same concurrency; "
                     "highest speedup per row in bold")
    table.notes = [POOLING_NOTE, NOTE, flag_note(kv_cache_tokens)]
    return table


def category_table(df: pd.DataFrame) -> Table:
    """Table 7/8 style: rows [target,] T, benchmark, category at each benchmark's main setting
    (lowest concurrency and input length); columns system; cells tau / tokens/s; per benchmark an
    unweighted mean over its categories and a pooled (block-weighted) row. Highest tau in bold."""
    rows = main_setting(_fixed_runs(df, "category_table"), keep_sweeps=True).rows
    counts = rows.groupby(["target", "temperature", "benchmark"], sort=False)["category"].transform("nunique")
    rows = rows[(counts > 1).astype(bool) & (rows["category"] != "")]
    if rows.empty:
        raise ValueError("no benchmark has more than one category (SPEED or a testbed suite with tiers)")
    systems = system_order(rows)
    group_labels = [c for c in ("target",) if rows[c].nunique() > 1] + ["temperature", "benchmark"]
    out = []
    for key in ordered_unique(tuple(r) for r in rows[group_labels].itertuples(index=False)):
        group = rows[np.logical_and.reduce([rows[c] == v for c, v in zip(group_labels, key)])]
        shown = [format_label(c, v) for c, v in zip(group_labels, key)]
        per_category = []
        for category in ordered_unique(group["category"]):
            part = group[group["category"] == category]
            taus = [cell(part, s, "tau") for s in systems]
            rates = [cell(part, s, "tokens_per_s") for s in systems]
            per_category.append((taus, rates))
            out.append(_tau_rate_row(shown + [category], systems, taus, rates, part))
        with np.errstate(all="ignore"):
            mean_tau = [float(np.mean(col)) for col in np.array([t for t, _ in per_category]).T]
            mean_rate = [float(np.mean(col)) for col in np.array([r for _, r in per_category]).T]
        out.append(_tau_rate_row(shown + [UNWEIGHTED], systems, mean_tau, mean_rate, rule_above=True))
        # (its tau has no interval of its own: the categories above carry theirs)
        out.append(_tau_rate_row(shown + [POOLED], systems, [cell(group, s, "tau") for s in systems],
                                 [cell(group, s, "tokens_per_s") for s in systems], group))
    header = [LABEL_HEADERS.get(c, c) for c in group_labels] + ["Category"]
    table = Table(header, [f"{s} (tok/s)" if _is_baseline(s) else f"{s} (τ / tok/s)" for s in systems],
                  out, 2)
    table.caption = ("per-category acceptance length τ / output tokens/s at each benchmark's main setting "
                     "(lowest concurrency and input length); highest τ per row in bold")
    table.notes = [POOLING_NOTE, NOTE,
                   f"{UNWEIGHTED}: the plain mean of the category rows above it, each category weighing "
                   "the same.",
                   f"{POOLED}: every prompt of the benchmark's categories at once (block-weighted τ, "
                   "tokens / wall time), as the papers aggregate."]
    return table


def _tau_rate_row(labels: list[str], systems: list[str], taus: list[float], rates: list[float],
                  rows: pd.DataFrame | None = None, rule_above: bool = False) -> TableRow:
    """τ / tokens/s per system; AR does not speculate, so its τ is a dash and never bold. rows:
    the cell's rows, for τ's interval (none on the unweighted mean over categories)."""
    taus = [math.nan if _is_baseline(s) else t for s, t in zip(systems, taus)]
    tau_text = [_fmt(t, "tau") if rows is None else _shown(rows, s, "tau", t) for s, t in zip(systems, taus)]
    texts = [_fmt(r, "tokens_per_s") if _is_baseline(s) else f"{tt} / {_fmt(r, 'tokens_per_s')}"
             for s, tt, r in zip(systems, tau_text, rates)]
    return TableRow(labels, taus, cells=texts, rule_above=rule_above)


def seed_table(df: pd.DataFrame) -> Table:
    """Table 9/10 style: T > 0 runs measured over two or more seeds, at each benchmark's main
    setting: rows metric (tau, tokens/s) x benchmark, columns system, cells "mean (std)" over
    seeds, std the sample standard deviation (ddof = 1) of the per-seed pooled values."""
    rows = main_setting(_fixed_runs(df, "seed_table"), keep_sweeps=True).rows
    rows = rows[rows["temperature"] > 0]
    seeds = rows.groupby(["target", "temperature", "benchmark"], sort=False)["seed"].transform("nunique")
    rows = rows[(seeds > 1).astype(bool)]
    if rows.empty:
        raise ValueError("no T > 0 benchmark was run over more than one seed (eval run --seeds 42,43,44)")
    systems = system_order(rows)
    labels = _labels(rows, ["benchmark"])
    out = []
    for metric, name in (("tau", "Acceptance τ"), ("tokens_per_s", "Throughput (tok/s)")):
        first = True
        for key in ordered_unique(tuple(r) for r in rows[labels].itertuples(index=False)):
            group = rows[np.logical_and.reduce([rows[c] == v for c, v in zip(labels, key)])]
            means, texts = [], []
            for system in systems:
                values = [v for v in seed_values(group, system, metric) if not math.isnan(v)]
                mean = float(np.mean(values)) if values else math.nan
                std = float(np.std(values, ddof=1)) if len(values) > 1 else math.nan
                means.append(mean)
                if not values or (metric == "tau" and _is_baseline(system)):
                    texts.append("—")
                elif math.isnan(std):
                    texts.append(_fmt(mean, metric))
                else:
                    texts.append(f"{_fmt(mean, metric)} ({std:.{2 if metric == 'tau' else 1}f})")
            if metric == "tau":  # AR does not speculate: no tau, never bold
                means = [math.nan if _is_baseline(s) else m for s, m in zip(systems, means)]
            shown = [name if first else ""] + [format_label(c, v) for c, v in zip(labels, key)]
            out.append(TableRow(shown, means, cells=texts, rule_above=first and metric != "tau"))
            first = False
    seed_list = ", ".join(str(s) for s in sorted(set(rows["seed"])))
    header = ["Metric"] + [LABEL_HEADERS.get(c, c) for c in labels]
    table = Table(header, list(systems), out, 2)
    table.caption = (f"seed variability at T > 0: mean over seeds {seed_list}, sample standard deviation "
                     "in parentheses; best mean per row in bold")
    table.notes = [POOLING_NOTE + " The standard deviation is over the per-seed pooled values."]
    return table
