"""Table-1-style results tables as markdown or LaTeX, best value per row in bold.

Rows are benchmarks (with target, temperature, concurrency and input length as
extra row labels when they vary), columns are systems, a cell is the mean over
seeds of one metric (see plots.select for how cells are averaged). eval reuses
`markdown_table` for its printed summary. A benchmark measured on part of its set (the
`data_provenance` column says partial) is labelled with its size, e.g. "gsm8k (100/1319)".
"""

import json
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from plots.intervals import mean_interval
from plots.paired import without_outlier_speedups
from plots.select import (
    Selection,
    ordered_unique,
    run_rows,
    seed_mean,
    split_sweeps,
    stage_rows,
    system_order,
    target_label,
)
from plots.table_intervals import (INTERVAL_VALUES, NOTE, PROMPT_NOTE, cell_interval, pooled_interval,
                                   prompt_interval, resamples_prompts)

# metric -> (caption name, decimals, unit suffix, direction of "best")
METRICS = {
    "tau": ("acceptance length τ", 2, "", "max"),
    "speedup": ("speedup over AR", 2, "×", "max"),
    "tokens_per_s": ("output tokens/s", 0, "", "max"),
    "stage_ms": ("per-step ms", 2, "", "min"),
}
LABEL_HEADERS = {
    "target": "Target",
    "benchmark": "Benchmark",
    "category": "Category",
    "temperature": "T",
    "concurrency": "c",
    "input_len": "Input",
    "stage": "Stage",
}
# Row-label columns that appear only when they take more than one value.
OPTIONAL_LABELS = ["target", "benchmark", "temperature", "concurrency", "input_len"]
NEEDED_COLUMNS = ["kind", "system", "benchmark", "temperature", "concurrency", "input_len", "seed",
                  "target", "dels_alpha", "dels_beta"]


@dataclass
class TableRow:
    labels: list[str]
    values: list[float]  # one per value column; NaN = no data
    extras: list[str] = field(default_factory=list)
    rule_above: bool = False  # a summary row (Average) gets a separator above it
    bold: bool = True  # mark this row's best value
    # Shown instead of the formatted values when set (one text per value column, e.g.
    # "2.31 / 148 / 1.40×" or "6.45 (0.03)"); `values` still decide which cell is bold.
    cells: list[str] | None = None


@dataclass
class Table:
    label_header: list[str]
    value_header: list[str]
    rows: list[TableRow]
    digits: int
    unit: str = ""
    best: str = "max"  # "max" | "min"
    extra_header: list[str] = field(default_factory=list)
    caption: str = ""
    notes: list[str] = field(default_factory=list)
    # Per value column, the group its best is picked in (e.g. the tier of a system x tier
    # column); None = one group. A column whose group is None is never bold.
    best_groups: list | None = None

    def cell_text(self, value: float) -> str:
        return f"{value:.{self.digits}f}"

    def best_columns(self, row: TableRow) -> set[int]:
        """Indices of the best value in the row (all ties, compared as displayed), per column group."""
        if not row.bold:
            return set()
        groups = self.best_groups or [0] * len(row.values)
        best = set()
        for group in dict.fromkeys(g for g in groups if g is not None):
            members = [i for i, g in enumerate(groups) if g == group]
            shown = {i: round(row.values[i], self.digits) for i in members if not math.isnan(row.values[i])}
            if len(shown) < 2:
                continue
            target = max(shown.values()) if self.best == "max" else min(shown.values())
            best |= {i for i, v in shown.items() if v == target}
        return best


def markdown_table(df: pd.DataFrame, value: str = "tau", rows: list[str] | None = None,
                   best: str | None = None, digits: int | None = None) -> str:
    """Results -> markdown table: rows benchmark [x temperature ...], columns system.

    df: a results table (eval.schema columns; kind == "run" rows are used).
    value: metric column, e.g. "tau", "speedup", "tokens_per_s".
    rows: row-label columns; default: benchmark plus whichever of target,
        temperature, concurrency, input_len take more than one value.
    best: "max" or "min" (default from the metric); digits: decimals shown.
    Cells are means over seeds; the best per row is **bold**. Notes on rows left
    out (DeLS sweeps) and on the Average row follow the table.
    """
    return render_markdown(results_table(df, value, rows, best, digits))


def latex_table(df: pd.DataFrame, value: str = "tau", rows: list[str] | None = None,
                best: str | None = None, digits: int | None = None) -> str:
    """Same table as markdown_table, as a booktabs LaTeX tabular with \\textbf{} for the best."""
    return render_latex(results_table(df, value, rows, best, digits))


def fixed_setting_runs(df: pd.DataFrame, columns: list[str], where: str) -> Selection:
    """The run rows outside any (dels_alpha, dels_beta) sweep, partial benchmarks labelled; a
    ValueError naming `where` when the columns are missing or no such row exists."""
    require_columns(df, columns, where)
    runs = run_rows(without_outlier_speedups(label_partial_benchmarks(df)))
    if runs.empty:
        raise ValueError("results have no rows with kind == 'run' to tabulate; run `python -m eval run` first")
    fixed, _ = split_sweeps(runs)
    if fixed.rows.empty:
        raise ValueError("every run row belongs to a (dels_alpha, dels_beta) sweep; no fixed setting to tabulate")
    return fixed


def results_table(df: pd.DataFrame, value: str = "tau", rows: list[str] | None = None,
                  best: str | None = None, digits: int | None = None) -> Table:
    """Build the Table-1-style Table that markdown_table and latex_table render."""
    fixed = fixed_setting_runs(df, NEEDED_COLUMNS + [value] + list(rows or []), "markdown_table")
    labels = rows if rows is not None else _auto_labels(fixed.rows)
    name, default_digits, unit, default_best = METRICS.get(value, (value, 2, "", "max"))
    table = pivot(fixed.rows, value, labels, best or default_best, default_digits if digits is None else digits, unit)
    table.caption = f"{name}, mean over seeds; best per row in bold"
    table.notes = fixed.notes + _setting_note(fixed.rows, labels) + table.notes
    if "benchmark" in labels:
        add_average_rows(table, labels.index("benchmark"))
        add_pooled_rows(table, fixed.rows, value, labels, labels.index("benchmark"))
    if value in INTERVAL_VALUES:
        add_intervals(table, fixed.rows, value, labels)
    return table


def add_intervals(table: Table, rows: pd.DataFrame, value: str, labels: list[str]) -> None:
    """Every cell's text with its 95% interval (plots.table_intervals): a cell over its rows, an
    Average over the benchmark cells above it, a pooled row over every row of its group."""
    bench = labels.index("benchmark") if "benchmark" in labels else None
    above: dict[tuple, list[TableRow]] = {}  # other labels -> the benchmark rows of that group
    for row in table.rows:
        kind = row.labels[bench] if bench is not None else ""
        other = tuple(v for i, v in enumerate(row.labels) if i != bench)
        if kind == "Average":
            cells = [_matching(rows, labels, m.labels) for m in above.get(other, [])]
            ivs = [prompt_interval([c[c["system"] == s] for c in cells], value, v)
                   or mean_interval([m.values[i] for m in above.get(other, [])], point=v)
                   for i, (s, v) in enumerate(zip(table.value_header, row.values))]
        elif kind == POOLED:
            group = _matching(rows, [c for i, c in enumerate(labels) if i != bench], list(other))
            ar = group[group["system"] == "AR"]
            ivs = [prompt_interval([group[group["system"] == s]], value, v, pooled=True)
                   or pooled_interval(group[group["system"] == s], value, ar if len(ar) else None, point=v)
                   for s, v in zip(table.value_header, row.values)]
        else:
            above.setdefault(other, []).append(row)
            data = _matching(rows, labels, row.labels)
            ivs = [prompt_interval([data[data["system"] == s]], value, v)
                   or cell_interval(data[data["system"] == s], value, v) for s, v in zip(table.value_header, row.values)]
        # AR's tau and speedup are 1 by definition: no interval to show.
        row.cells = [table.cell_text(iv.point) + table.unit if s == "AR" and not math.isnan(iv.point)
                     else iv.text(table.digits, table.unit) for s, iv in zip(table.value_header, ivs)]
    table.notes.append(PROMPT_NOTE if resamples_prompts(rows[rows["system"] != "AR"]) else NOTE)


def _matching(rows: pd.DataFrame, columns: list[str], shown: list[str]) -> pd.DataFrame:
    """The rows whose labels, as a table shows them, are `shown`."""
    keep = np.ones(len(rows), dtype=bool)
    for column, text in zip(columns, shown):
        keep &= np.array([format_label(column, v) == text for v in rows[column]], dtype=bool)
    return rows[keep]


def stage_table(df: pd.DataFrame, digits: int = 2) -> Table:
    """Stage decomposition (paper Table 3 style): rows stage, columns system, ms per step; lowest in bold."""
    require_columns(df, NEEDED_COLUMNS + ["stage", "stage_ms"], "stage_table")
    stages = stage_rows(label_partial_benchmarks(df))
    if stages.empty:
        raise ValueError("results have no rows with kind == 'stage'; eval writes them with the stage-timing run")
    labels = [c for c in OPTIONAL_LABELS if stages[c].nunique() > 1] + ["stage"]
    table = pivot(stages, "stage_ms", labels, "min", digits, "")
    table.caption = "per-step stage time in ms, mean over seeds; lowest per row in bold"
    return table


def decode_ablation_table(df: pd.DataFrame, greedy: str, exact: str, value: str = "tau",
                          digits: int = 3) -> Table:
    """Decode-rule ablation (paper Table 12 style) for one greedy/exact system pair.

    Columns: greedy, exact, Δ = (exact - greedy) / greedy in percent, so negative
    favors greedy. Rows: benchmarks measured under both rules; a Mean Δ row closes
    each group (target, temperature, ...) of two or more benchmarks.
    """
    require_columns(df, NEEDED_COLUMNS + [value], "decode_ablation_table")
    runs = run_rows(label_partial_benchmarks(df))
    runs = runs[runs["system"].isin([greedy, exact])]
    if runs.empty:
        raise ValueError(f"decode_ablation_table: no run rows for system {greedy!r} or {exact!r}")
    labels = _auto_labels(runs)
    table = pivot(runs, value, labels, METRICS.get(value, (value, 2, "", "max"))[3], digits, "",
                  systems=[greedy, exact])
    one_sided = [row for row in table.rows if any(math.isnan(v) for v in row.values)]
    if one_sided:
        table.notes.append("Left out, measured under one rule only: "
                           + "; ".join(", ".join(l for l in row.labels if l) for row in one_sided) + ".")
    bench = labels.index("benchmark")
    groups: dict[tuple, list[TableRow]] = {}
    for row in table.rows:
        if row not in one_sided:
            groups.setdefault(tuple(v for i, v in enumerate(row.labels) if i != bench), []).append(row)
    table.rows = []
    for other, members in groups.items():
        deltas = [(e - g) / g * 100.0 for g, e in (row.values for row in members)]
        for row, delta in zip(members, deltas):
            row.extras = [_percent(delta)]
        table.rows.extend(members)
        if len(members) > 1:
            labels_mean = list(other)
            labels_mean.insert(bench, "Mean Δ")
            table.rows.append(TableRow(labels_mean, [math.nan, math.nan], [_percent(float(np.mean(deltas)))],
                                       rule_above=True, bold=False))
    if not table.rows:
        raise ValueError(f"decode_ablation_table: no benchmark has both {greedy!r} and {exact!r}")
    name = METRICS.get(value, (value,))[0]
    table.caption = f"decode-rule ablation, {name}; Δ is greedy → exact, negative favors greedy"
    return table


def pivot(rows: pd.DataFrame, value: str, labels: list[str], best: str, digits: int, unit: str,
          systems: list[str] | None = None) -> Table:
    """Seed-mean `value` per (labels, system) and lay it out as label rows x system columns."""
    cells = seed_mean(rows, labels + ["system"], value)
    systems = systems or system_order(rows)
    lookup = {tuple(r[labels + ["system"]]): r[value] for _, r in cells.iterrows()}
    keys = ordered_unique(tuple(r) for r in rows[labels].itertuples(index=False))
    table_rows = [
        TableRow([format_label(c, v) for c, v in zip(labels, key)],
                 [float(lookup.get(key + (s,), math.nan)) for s in systems])
        for key in keys
    ]
    return Table([LABEL_HEADERS.get(c, c) for c in labels], list(systems), table_rows, digits, unit, best)


def add_average_rows(table: Table, benchmark_index: int) -> None:
    """Append an Average row (unweighted mean over benchmarks) per group of the other labels.

    A system missing any benchmark of the group gets no average (shown as a dash).
    """
    groups: dict[tuple, list[TableRow]] = {}
    for row in table.rows:
        other = tuple(v for i, v in enumerate(row.labels) if i != benchmark_index)
        groups.setdefault(other, []).append(row)
    if all(len(members) < 2 for members in groups.values()):
        return
    out = []
    for other, members in groups.items():
        out.extend(members)
        if len(members) < 2:
            continue
        matrix = np.array([m.values for m in members])
        with np.errstate(all="ignore"):
            means = [float(np.mean(col)) if not np.isnan(col).any() else math.nan for col in matrix.T]
        labels = list(other)
        labels.insert(benchmark_index, "Average")
        out.append(TableRow(labels, means, rule_above=True))
    table.rows = out
    table.notes.append("Average: unweighted mean over the benchmarks above it; a dash where a system lacks one.")


POOLED = "All prompts (pooled)"


def _total(rows: pd.DataFrame, column: str) -> float:
    """Sum of a numeric column; NaN when no row has a number there (hand-made or old files)."""
    return float(pd.to_numeric(rows[column], errors="coerce").sum(min_count=1))


def pooled_value(rows: pd.DataFrame, value: str, baseline: pd.DataFrame | None) -> float:
    """`value` over every prompt of `rows` at once, as the papers aggregate: tau = 1 + all
    accepted drafts / all drafts (block-weighted), tokens/s = all output tokens / all wall time,
    speedup = that over the baseline's pooled tokens/s on the same rows (over the rows' own
    paired AR runs where `eval run --paired` measured them); NaN for other metrics and where the
    counters are missing."""
    if value == "tau" and not rows.empty:
        drafts = _total(rows, "num_drafts")
        if drafts > 0:
            return 1.0 + _total(rows, "num_accepted_tokens") / drafts
        return 1.0 if bool((rows["tau"] == 1.0).all()) else math.nan  # AR; else no counters
    if value == "speedup" and "speedup_excluded" in rows.columns:
        rows = rows[~rows["speedup_excluded"].astype(bool)]  # outlier references (plots.paired)
    if value in ("tokens_per_s", "speedup") and _total(rows, "wall_s") > 0:
        rate = _total(rows, "output_tokens") / _total(rows, "wall_s")
        if value == "tokens_per_s":
            return rate
        paired = _total(rows, "paired_ar_wall_s") if "paired_ar_wall_s" in rows.columns else math.nan
        if paired > 0 and pd.to_numeric(rows["paired_ar_wall_s"], errors="coerce").notna().all():
            # `eval run --paired`: each row's own AR run, measured just before it.
            return rate / (_total(rows, "paired_ar_output_tokens") / paired)
        if baseline is not None and _total(baseline, "wall_s") > 0:
            return rate / (_total(baseline, "output_tokens") / _total(baseline, "wall_s"))
    return math.nan


def add_pooled_rows(table: Table, rows: pd.DataFrame, value: str, labels: list[str],
                    benchmark_index: int) -> None:
    """After each group's Average, a row pooling every prompt of its benchmarks (pooled_value):
    a benchmark with more prompts or longer blocks weighs more, as in the papers' tau. Only for
    tau, tokens/s and speedup, and only where every system has the same benchmarks."""
    needed = {"num_drafts", "num_accepted_tokens", "output_tokens", "wall_s"}
    if value not in ("tau", "tokens_per_s", "speedup") or not needed <= set(rows.columns):
        return
    other_labels = [c for i, c in enumerate(labels) if i != benchmark_index]
    out, added = [], False
    for row in table.rows:
        out.append(row)
        if row.labels[benchmark_index] != "Average":
            continue
        other = [v for i, v in enumerate(row.labels) if i != benchmark_index]
        group = rows
        for column, shown in zip(other_labels, other):
            group = group[[format_label(column, v) == shown for v in group[column]]]
        baseline = group[group["system"] == "AR"] if (group["system"] == "AR").any() else None
        values = [pooled_value(group[group["system"] == s], value, baseline)
                  if not math.isnan(avg) else math.nan
                  for s, avg in zip(table.value_header, row.values)]
        if all(math.isnan(v) for v in values):
            continue
        pooled_labels = list(other)
        pooled_labels.insert(benchmark_index, POOLED)
        out.append(TableRow(pooled_labels, values))
        added = True
    table.rows = out
    if added:
        table.notes.append(f"{POOLED}: every prompt of the benchmarks above at once (tau = 1 + "
                           "accepted / drafts, block-weighted as in the papers; tokens/s = tokens / "
                           "wall time; speedup = that over AR's).")


def render_markdown(table: Table) -> str:
    header = table.label_header + table.value_header + table.extra_header
    align = ["---"] * len(table.label_header) + ["---:"] * (len(table.value_header) + len(table.extra_header))
    lines = [_md_row(header), _md_row(align)]
    for row in table.rows:
        best = table.best_columns(row)
        values = []
        for i, v in enumerate(row.values):
            if row.cells is not None:
                text = row.cells[i]
            else:
                text = "—" if math.isnan(v) else table.cell_text(v) + table.unit
            values.append(f"**{text}**" if i in best else text)
        lines.append(_md_row(row.labels + values + row.extras))
    text = "\n".join(lines) + "\n"
    footer = ([f"*{table.caption}*"] if table.caption else []) + [f"- {n}" for n in table.notes]
    return text + ("\n" + "\n".join(footer) + "\n" if footer else "")


def render_latex(table: Table) -> str:
    n_labels = len(table.label_header)
    spec = "l" * n_labels + "r" * (len(table.value_header) + len(table.extra_header))
    header = [latex_escape(h) for h in table.label_header + table.value_header + table.extra_header]
    unit = {"×": r"$\times$"}.get(table.unit, latex_escape(table.unit))
    lines = [f"\\begin{{tabular}}{{{spec}}}", r"\toprule", " & ".join(header) + r" \\", r"\midrule"]
    for row in table.rows:
        if row.rule_above:
            lines.append(r"\midrule")
        best = table.best_columns(row)
        values = []
        for i, v in enumerate(row.values):
            if row.cells is not None:
                text = latex_escape(row.cells[i].replace("—", "--"))
            else:
                text = "--" if math.isnan(v) else table.cell_text(v) + unit
            values.append(f"\\textbf{{{text}}}" if i in best else text)
        cells = [latex_escape(x) for x in row.labels] + values + [latex_escape(x) for x in row.extras]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    comments = [f"% {latex_escape(table.caption)}"] if table.caption else []
    comments += [f"% {latex_escape(n)}" for n in table.notes]
    return "\n".join(comments + lines) + "\n"


def label_partial_benchmarks(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose data_provenance says partial get benchmark "name (rows/full size)", so a subset
    is never shown as the whole benchmark (nor averaged with rows on the full set)."""
    if "data_provenance" not in df.columns:  # optional column: older files lack it
        return df
    out = df.copy()
    out["benchmark"] = [partial_label(b, p) for b, p in zip(df["benchmark"], df["data_provenance"])]
    return out


def partial_label(benchmark: str, provenance) -> str:
    if not isinstance(provenance, str) or not provenance.strip():
        return benchmark
    try:
        record = json.loads(provenance)
        if not record.get("partial"):
            return benchmark
        return f"{benchmark} ({int(record['rows'])}/{int(record['full_size'])})"
    except (ValueError, TypeError, KeyError, AttributeError):
        raise ValueError(f"results column 'data_provenance' holds {provenance[:60]!r} for {benchmark}; "
                         "expected eval's JSON record with partial, rows and full_size") from None


def format_label(column: str, value) -> str:
    if column == "target":
        return target_label(value)
    if column == "temperature":
        return f"{value:g}"
    if column == "input_len":
        return str(value) if value else "natural"
    return str(value)


def latex_escape(text: str) -> str:
    replace = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
               "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
               "τ": r"$\tau$", "Δ": r"$\Delta$", "→": r"$\to$", "×": r"$\times$", "−": "-",
               "†": r"$\dagger$", "‡": r"$\ddagger$", "·": r"$\cdot$", "α": r"$\alpha$", "β": r"$\beta$"}
    return "".join(replace.get(ch, ch) for ch in str(text))


def require_columns(df: pd.DataFrame, columns: list[str], where: str) -> None:
    missing = [c for c in dict.fromkeys(columns) if c not in df.columns]
    if missing:
        raise ValueError(f"{where}: results lack column(s) {', '.join(missing)}; pass a table with the eval.schema columns")


def _auto_labels(runs: pd.DataFrame) -> list[str]:
    """benchmark, plus target and temperature when they vary, plus concurrency and input
    length when one benchmark was run at several (else they are a property of the benchmark)."""
    labels = []
    for column in OPTIONAL_LABELS:
        if column in ("concurrency", "input_len"):
            varies = runs.groupby(["target", "benchmark", "temperature"])[column].nunique().gt(1).any()
        else:
            varies = column == "benchmark" or runs[column].nunique() > 1
        if varies:
            labels.append(column)
    return labels


def _setting_note(runs: pd.DataFrame, labels: list[str]) -> list[str]:
    """When benchmarks differ in concurrency or input length but those are not row labels, say which is which."""
    hidden = [c for c in ("concurrency", "input_len") if c not in labels and runs[c].nunique() > 1]
    if not hidden:
        return []
    settings = runs[["benchmark"] + hidden].drop_duplicates()
    parts = []
    for _, row in settings.iterrows():
        words = [f"c={row['concurrency']}" if c == "concurrency" else
                 (f"input {row['input_len']}" if row["input_len"] else "natural input") for c in hidden]
        parts.append(f"{row['benchmark']} ({', '.join(words)})")
    return ["Setting per benchmark: " + "; ".join(parts) + "."]


def _percent(delta: float) -> str:
    return "—" if math.isnan(delta) else f"{delta:+.2f}%"


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(str(c).replace("|", r"\|") for c in cells) + " |"



# Columns that must agree for a T = 0 run to be compared with AR's (the same prompts, settings
# and engine); optional ones only when the results file has them.
LOSSLESS_MATCH = ["benchmark", "category", "concurrency", "input_len", "seed", "target"]
LOSSLESS_OPTIONAL = ["engine_flags", "protocol", "data_provenance"]


def lossless_counts(df: pd.DataFrame, baseline: str = "AR") -> pd.DataFrame:
    """Per T = 0 run row of every other system: how many prompts' generated token ids equal
    the baseline's on the same prompts and settings (columns system, benchmark, concurrency,
    identical, prompts). Rows without fingerprints or without a baseline run are left out."""
    if "output_hashes" not in df.columns:
        return pd.DataFrame(columns=["system", "benchmark", "concurrency", "identical", "prompts"])
    keys = LOSSLESS_MATCH + [c for c in LOSSLESS_OPTIONAL if c in df.columns]
    runs = run_rows(label_partial_benchmarks(df))
    runs = runs[runs["temperature"] == 0]
    hashes = [_hash_list(h) for h in runs["output_hashes"]]
    runs = runs.assign(_hashes=hashes)
    base = {tuple(r[k] for k in keys): r["_hashes"] for _, r in runs[runs["system"] == baseline].iterrows()}
    out = []
    for _, r in runs[runs["system"] != baseline].iterrows():
        ref = base.get(tuple(r[k] for k in keys))
        if not ref or len(ref) != len(r["_hashes"]):
            continue
        out.append({"system": r["system"], "benchmark": r["benchmark"], "concurrency": int(r["concurrency"]),
                    "identical": sum(a == b for a, b in zip(ref, r["_hashes"])), "prompts": len(ref)})
    return pd.DataFrame(out, columns=["system", "benchmark", "concurrency", "identical", "prompts"])


def _hash_list(cell) -> list:
    """One output_hashes cell (a JSON list; empty or missing: none) -> list."""
    if not isinstance(cell, str) or not cell.strip():
        return []
    try:
        hashes = json.loads(cell)
    except ValueError:
        hashes = None
    if not isinstance(hashes, list):
        raise ValueError(f"results column 'output_hashes' holds {cell[:60]!r}; expected a JSON list "
                         "of fingerprints")
    return hashes


def lossless_markdown(df: pd.DataFrame, baseline: str = "AR") -> str:
    """Markdown: rows benchmark (x concurrency), columns system, cells "identical/prompts" at
    T = 0 against the baseline (summed over categories); "" when nothing can be compared."""
    counts = lossless_counts(df, baseline)
    if counts.empty:
        return ""
    grouped = counts.groupby(["benchmark", "concurrency", "system"], sort=False)[["identical", "prompts"]].sum()
    systems = list(dict.fromkeys(counts["system"]))
    lines = [_md_row(["Benchmark", "c"] + systems), _md_row(["---", "---:"] + ["---:"] * len(systems))]
    for bench, c in dict.fromkeys(zip(counts["benchmark"], counts["concurrency"])):
        cells = []
        for s in systems:
            if (bench, c, s) in grouped.index:
                same, n = grouped.loc[(bench, c, s)]
                cells.append(f"{int(same)}/{int(n)}" + ("" if same == n else " **≠**"))
            else:
                cells.append("—")
        lines.append(_md_row([bench, str(c)] + cells))
    total = counts[["identical", "prompts"]].sum()
    return ("\n".join(lines) + f"\n\n*Greedy (T = 0) outputs token-identical to {baseline} on the same "
            f"prompts: {int(total['identical'])} of {int(total['prompts'])}.*\n")
