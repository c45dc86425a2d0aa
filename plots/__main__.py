"""Command line: `python -m plots all --results FILE --out DIR`, `python -m plots table ...`."""

import argparse
import sys

import matplotlib

from plots import ablations, paper_tables
from plots.campaign import write_campaign_figure
from plots.io import load_results
from plots.records import load_dels_weights, load_training_cost
from plots.report import write_all
from plots.select import main_setting, run_rows
from plots.tables import latex_table, markdown_table, render_latex, render_markdown

matplotlib.use("Agg")  # files only; never open a window


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m plots",
        description="Figures and tables from eval's results table (parquet or CSV).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    every = commands.add_parser(
        "all", help="write every figure (PNG + SVG), every table (.md + .tex) and DIR/index.md",
        description="Write every figure the results support (PNG + SVG), the tables (markdown + LaTeX) "
                    "and DIR/index.md listing them, with the figures skipped and why.",
    )
    every.add_argument("--results", required=True, help="results file written by `python -m eval run` (.parquet or .csv)")
    every.add_argument("--out", required=True, help="output folder (created if missing)")
    every.add_argument("--lossless", metavar="FILE",
                       help="results file of a separate greedy run (e.g. fp32 beside a timed bf16 run) "
                            "whose outputs are compared with AR's for the identity table; default: --results")
    every.add_argument("--decode-pair", action="append", default=[], metavar="GREEDY=EXACT",
                       help="pair two systems for the decode-rule ablation when their names do not follow "
                            "the X-greedy / X-viterbi rule (repeatable)")
    every.add_argument("--kv-cache-tokens", type=int, metavar="N",
                       help="the engine's KV-cache size in tokens (vLLM logs it at start-up), for the "
                            "memory-bound (†) row flags of the concurrency tables")
    every.add_argument("--dels-weights", metavar="FILE",
                       help="CSV of `python -m eval heads-table` for the DeLS α/β per-position table")
    every.add_argument("--training-cost", metavar="FILE",
                       help="CSV of `python -m eval training-cost` for the training-cost table")
    table = commands.add_parser("table", help="print one Table-1-style table to stdout",
                                description="Print one Table-1-style table (rows benchmark [x temperature], "
                                            "columns system, best per row in bold).")
    table.add_argument("--results", required=True, help="results file (.parquet or .csv)")
    table.add_argument("--value", default="tau", help="metric column: tau, speedup, tokens_per_s (default tau)")
    table.add_argument("--format", choices=["md", "tex"], default="md", help="markdown or LaTeX (default md)")
    table.add_argument("--kind", choices=list(TABLE_KINDS), default="table1",
                       help="table1 (default; --value picks the metric), concurrency (Table 2 style; --value "
                            "speedup or tau), concurrency-detail (Tables 13/14), categories (Tables 7/8), "
                            "seeds (Tables 9/10), ablations (paper direction vs ours; --ablations SPEC)")
    table.add_argument("--kv-cache-tokens", type=int, metavar="N",
                       help="KV-cache size in tokens, for the memory-bound (†) flags of concurrency tables")
    table.add_argument("--ablations", metavar="SPEC",
                       help="ablation spec (JSON, plots/ablations.py) for --kind ablations, e.g. "
                            "testbed/smollm2/ablations.json")
    campaign = commands.add_parser("campaign", help="the DFlash campaign's learning curve from its table",
                                   description="Held-out tau against sequences trained on and against "
                                               "distinct conversations (campaign.csv of a build).")
    campaign.add_argument("--csv", required=True, help="campaign table (training.build_stages.campaign_table)")
    campaign.add_argument("--out", required=True, help="output folder")
    args = parser.parse_args(argv)

    try:
        if args.command == "campaign":
            print("wrote " + ", ".join(map(str, write_campaign_figure(args.csv, args.out))))
            return 0
        df = load_results(args.results)
        if args.command == "all":
            pairs = _parse_pairs(args.decode_pair)
            lossless = None if args.lossless is None else load_results(args.lossless)
            weights = None if args.dels_weights is None else load_dels_weights(args.dels_weights)
            cost = None if args.training_cost is None else load_training_cost(args.training_cost)
            report = write_all(df, args.out, decode_pairs=pairs, source=args.results, lossless=lossless,
                               lossless_source=args.lossless, kv_cache_tokens=args.kv_cache_tokens,
                               dels_weights=weights, training_cost=cost)
            print(f"wrote {len(report.figures)} figures, {len(report.tables)} tables, "
                  f"skipped {len(report.skipped)}; index: {report.index}")
        else:
            if args.kind == "table1":
                rows = main_setting(run_rows(df), keep_sweeps=True).rows
                render = markdown_table if args.format == "md" else latex_table
                sys.stdout.write(render(rows, value=args.value))
            else:
                value = args.value if args.value in ("speedup", "tau") else "speedup"
                if args.kind == "concurrency":  # one table per set of tiers, as `plots all` writes them
                    built = [paper_tables.concurrency_table(df, value, args.kv_cache_tokens, group)
                             for group in paper_tables.tier_groups(df)] or [paper_tables.concurrency_table(df)]
                elif args.kind == "concurrency-detail":
                    built = [paper_tables.concurrency_detail_table(df, args.kv_cache_tokens)]
                elif args.kind == "ablations":
                    if args.ablations is None:
                        raise ValueError("--kind ablations needs --ablations SPEC (the comparisons to make)")
                    built = [ablations.ablation_table(df, ablations.load_ablation_spec(args.ablations))]
                else:
                    built = [{"categories": paper_tables.category_table, "seeds": paper_tables.seed_table}[args.kind](df)]
                render = render_markdown if args.format == "md" else render_latex
                sys.stdout.write("\n".join(render(t) for t in built))
    except ValueError as error:
        parser.error(str(error))
    return 0


TABLE_KINDS = ("table1", "concurrency", "concurrency-detail", "categories", "seeds", "ablations")


def _parse_pairs(specs: list[str]) -> dict[str, str]:
    pairs = {}
    for spec in specs:
        greedy, sep, exact = spec.partition("=")
        if not sep or not greedy or not exact:
            raise ValueError(f"--decode-pair {spec!r} must read GREEDY_SYSTEM=EXACT_SYSTEM")
        pairs[greedy] = exact
    return pairs


if __name__ == "__main__":
    sys.exit(main())
