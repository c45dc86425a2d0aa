"""Render every figure and table the results support, and index them.

Each figure is built per split (target, temperature, ...) where its rows vary;
a figure the rows cannot support is recorded as skipped with the reason, never
drawn from made-up data.
"""

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import pandas as pd
from matplotlib.figure import Figure

from plots.figures.ablation import decode_ablation, find_decode_pairs
from plots.figures.acceptance import accept_per_position
from plots.figures.common import NotPlottable
from plots.figures.concurrency import metric_vs_concurrency
from plots.figures.dels import SWEEP_KEYS, dels_heatmap, sweep_grid
from plots.figures.speedup import speedup_bars
from plots.figures.stages import stage_bars
from plots.io import validate_results
from plots.paired import reference_notes, without_outlier_speedups
from plots.peers import peers_table
from plots.select import describe, main_setting, run_rows, split_by, split_sweeps, stage_rows, system_order
from plots.style import save_figure, system_colors
from plots.paper_tables import (category_table, concurrency_detail_table, concurrency_table, seed_table,
                                 tier_groups)
from plots.records import dels_weights_table, training_cost_table
from plots.tables import (decode_ablation_table, lossless_markdown, render_latex, render_markdown,
                          results_table, stage_table)

CONCURRENCY_FIGURES = {
    "throughput_vs_concurrency": "tokens_per_s",
    "speedup_vs_concurrency": "speedup",
    "tau_vs_concurrency": "tau",
}
TABLE_VALUES = {"tau": "acceptance length τ", "speedup": "speedup over AR", "tokens_per_s": "output tokens/s"}


@dataclass
class Written:
    stem: str
    title: str
    files: list[Path]


@dataclass
class Report:
    figures: list[Written] = field(default_factory=list)
    tables: list[Written] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (name, reason)
    notes: list[str] = field(default_factory=list)
    index: Path | None = None


def write_all(df: pd.DataFrame, out_dir: str | Path, decode_pairs: dict[str, str] | None = None,
              source: str = "results", lossless: pd.DataFrame | None = None,
              lossless_source: str | None = None, kv_cache_tokens: int | None = None,
              dels_weights: pd.DataFrame | None = None, training_cost: pd.DataFrame | None = None) -> Report:
    """Write every supported figure (PNG + SVG) and table (.md + .tex) plus out_dir/index.md.

    df: results table (validated here). decode_pairs: extra {greedy system: exact system}
    pairs for the decode-rule ablation beyond the X-greedy / X-viterbi naming rule.
    lossless (from lossless_source): a separate greedy run's results for the identity table, e.g.
    fp32 beside a timed bf16 run (default: df itself).
    kv_cache_tokens: the engine's KV-cache size in tokens, for the memory-bound (†) row flags of
    the concurrency tables (plots.paper_tables). dels_weights / training_cost: the tidy files of
    `python -m eval heads-table` / `python -m eval training-cost` (plots.records), for the DeLS
    alpha/beta and training-cost tables; skipped (and said so) when not given.
    """
    df = validate_results(df, source)
    checked = df if lossless is None else validate_results(lossless, lossless_source or "lossless results")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = Report()
    report.notes += reference_notes(df)
    df = without_outlier_speedups(df)  # figures too: a row with an outlier reference has no speedup
    runs, stages = run_rows(df), stage_rows(df)
    fixed, sweep = split_sweeps(runs)
    main = main_setting(runs)
    report.notes += main.notes
    colors = system_colors(system_order(df))
    pairs = find_decode_pairs(system_order(runs), decode_pairs)

    def figure(stem: str, build: Callable[[], Figure]) -> None:
        try:
            fig = build()
        except NotPlottable as why:
            report.skipped.append((stem, str(why)))
            return
        report.figures.append(Written(stem, fig.get_suptitle(), save_figure(fig, out_dir, stem)))

    figure("speedup_bars", partial(speedup_bars, main.rows, colors))
    for stem, metric in CONCURRENCY_FIGURES.items():
        for values, rows in split_by(fixed.rows, ["target", "temperature"]):
            figure(stem + describe(values)[0], partial(metric_vs_concurrency, rows, metric, colors))
    for values, rows in split_by(main.rows, ["target", "temperature"]):
        figure("accept_per_position" + describe(values)[0], partial(accept_per_position, rows, colors))
    for values, rows in split_by(main.rows, ["target", "temperature"]):
        figure("decode_ablation" + describe(values)[0], partial(decode_ablation, rows, pairs))
    if sweep.empty:
        report.skipped.append(("dels_heatmap", "no system was run at more than one (dels_alpha, dels_beta) "
                                               "setting on a benchmark, so there is no sweep to map"))
    for values, rows in ([] if sweep.empty else split_by(sweep, SWEEP_KEYS)):
        report.notes += sweep_grid(rows).notes
        figure("dels_heatmap" + describe(values)[0], partial(dels_heatmap, rows))
    if stages.empty:
        report.skipped.append(("stage_bars", "no kind == 'stage' rows (eval's stage-timing run writes them)"))
    for values, rows in ([] if stages.empty else split_by(stages, ["target", "temperature", "concurrency",
                                                                    "input_len"])):
        figure("stage_bars" + describe(values)[0], partial(stage_bars, rows))

    _write_tables(report, out_dir, main_setting(runs, keep_sweeps=True).rows, stages, pairs)
    _write_paper_tables(report, out_dir, df, kv_cache_tokens, dels_weights, training_cost)
    report.index = _write_index(report, out_dir, df, source, checked, lossless_source)
    return report


def _table_writer(report: Report, out_dir: Path):
    """table(stem, title, build): render build()'s Table as stem.md + stem.tex, or record why not."""
    def table(stem: str, title: str, build) -> None:
        try:
            built = build()
        except ValueError as why:
            report.skipped.append((stem, str(why)))
            return
        md, tex = out_dir / f"{stem}.md", out_dir / f"{stem}.tex"
        md.write_text(render_markdown(built), encoding="utf-8")
        tex.write_text(render_latex(built), encoding="utf-8")
        report.tables.append(Written(stem, title, [md, tex]))

    return table


def _write_paper_tables(report: Report, out_dir: Path, df: pd.DataFrame, kv_cache_tokens: int | None,
                        dels_weights: pd.DataFrame | None, training_cost: pd.DataFrame | None) -> None:
    table = _table_writer(report, out_dir)
    try:
        groups = tier_groups(df)
    except ValueError:
        groups = []
    if not groups:
        for stem in ("table_concurrency_speedup", "table_concurrency_tau"):
            report.skipped.append((stem, "no benchmark was run at more than one concurrency "
                                         "(eval run --concurrency 1,2,...)"))
    for benchmarks in groups:
        slug = describe({"benchmark": benchmarks[0]})[0] if len(groups) > 1 else ""
        names = ", ".join(benchmarks)
        table(f"table_concurrency_speedup{slug}", f"speedup per concurrency and tier, {names} "
                                                   "(LiLiCorr Table 2 / 16 style)",
              partial(concurrency_table, df, "speedup", kv_cache_tokens, benchmarks))
        table(f"table_concurrency_tau{slug}", f"acceptance length per concurrency and tier, {names} "
                                               "(LiLiCorr Table 2 style, τ)",
              partial(concurrency_table, df, "tau", kv_cache_tokens, benchmarks))
    table("table_concurrency_detail", "τ / tokens/s / speedup per tier and concurrency "
                                      "(LiLiCorr Tables 13, 14, 17 style)",
          partial(concurrency_detail_table, df, kv_cache_tokens))
    table("table_categories", "per-category (and per-tier) τ / tokens/s with unweighted and pooled "
                              "aggregates (LiLiCorr Tables 7, 8 style)", partial(category_table, df))
    table("table_seeds", "seed mean and standard deviation at T > 0 (LiLiCorr Tables 9, 10 style)",
          partial(seed_table, df))
    if dels_weights is None:
        report.skipped.append(("table_dels_weights", "no DeLS head file given (python -m eval heads-table "
                                                     "HEAD_DIR... --out F, then plots all --dels-weights F)"))
    else:
        table("table_dels_weights", "DeLS fusion weights α / β per draft position (DeLS-Spec Table 7 style)",
              partial(dels_weights_table, dels_weights))
    if training_cost is None:
        report.skipped.append(("table_training_cost", "no training-cost file given (python -m eval "
                                                      "training-cost --manifest M --out F, then plots all "
                                                      "--training-cost F)"))
    else:
        table("table_training_cost", "training wall time and peak memory per run (DeLS-Spec Table 5 style)",
              partial(training_cost_table, training_cost))


def _write_tables(report: Report, out_dir: Path, main_rows: pd.DataFrame, stages: pd.DataFrame, pairs) -> None:
    table = _table_writer(report, out_dir)

    for value, name in TABLE_VALUES.items():
        table(f"table_{value}", f"{name} per benchmark and system (Table 1 style)",
              partial(results_table, main_rows, value))
    for pair in pairs:
        slug = describe({"base": pair.base})[0]
        table(f"table_decode_ablation{slug}", f"decode-rule ablation, {pair.greedy} vs {pair.exact} (Table 12 style)",
              partial(decode_ablation_table, main_rows, pair.greedy, pair.exact))
    table("table_peers", "this package's best system against the best peer (vLLM's own proposers)",
          partial(peers_table, main_rows))
    if stages.empty:
        report.skipped.append(("table_stages", "no kind == 'stage' rows"))
    else:
        table("table_stages", "per-step stage decomposition in ms (Table 3 style)", partial(stage_table, stages))


def _write_index(report: Report, out_dir: Path, df: pd.DataFrame, source: str, checked: pd.DataFrame,
                 checked_source: str | None) -> Path:
    runs, stages = run_rows(df), stage_rows(df)
    lines = [
        "# Results figures and tables",
        "",
        f"Source: `{Path(source).name}`: {len(runs)} run rows, {len(stages)} stage rows; "
        f"systems {', '.join(system_order(df))}.",
        "Cells are means over seeds of per-seed means (over categories where a benchmark has them). "
        "Tables and bars use each benchmark's lowest concurrency and input length, except the concurrency "
        "tables and figures, which show every level.",
        "",
        "## Figures",
        "",
    ]
    for written in report.figures:
        png, svg = (p.name for p in written.files)
        lines += [f"### {written.stem}", "", f"{written.title}. [PNG]({png}) · [SVG]({svg})", "",
                  f"![{written.stem}]({png})", ""]
    if not report.figures:
        lines += ["None: the results support no figure (see Skipped).", ""]
    lines += ["## Tables", ""]
    for written in report.tables:
        md, tex = written.files
        lines += [f"### {written.stem}", "", f"{written.title}. [Markdown]({md.name}) · [LaTeX]({tex.name})", "",
                  md.read_text(encoding="utf-8"), ""]
    lossless = lossless_markdown(checked)
    if lossless:
        (out_dir / "lossless.md").write_text(lossless, encoding="utf-8")
        origin = f" in `{Path(checked_source).name}`" if checked_source else ""
        lines += ["## Greedy output identical to AR", "", "Prompts whose generated token ids equal "
                  f"plain decoding's{origin} ([lossless.md](lossless.md)).", "", lossless, ""]
    lines += ["## Skipped", ""]
    lines += [f"- **{name}**: {reason}" for name, reason in report.skipped] or ["Nothing was skipped."]
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in report.notes]
    index = out_dir / "index.md"
    index.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return index
