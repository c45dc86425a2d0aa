"""Drop training conversations that share a long word n-gram with any evaluation prompt.

A conversation is contaminated when one of its user turns shares an n-gram (13 words by
default, as in the GPT-3 and Llama decontamination reports) with a turn of any benchmark file in
the evaluation data folder. Words are lowercased alphanumeric runs, so punctuation and spacing
differences do not hide a copy. Kept conversations go to the output JSONL; the report (returned
and printed) has the counts and the ids dropped.

    python -m training.decontaminate --input prompts.jsonl --eval-dir .cache/benchmarks \\
        --output prompts.clean.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

WORD = re.compile(r"[a-z0-9]+")


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = WORD.findall(text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def eval_ngrams(eval_dir: str | Path, n: int) -> tuple[set[tuple[str, ...]], list[str]]:
    """Every n-gram of every turn of every .jsonl benchmark file under `eval_dir` (recursive)."""
    grams: set[tuple[str, ...]] = set()
    files = sorted(Path(eval_dir).rglob("*.jsonl"))
    if not files:
        raise ValueError(f"no benchmark .jsonl files under {eval_dir}; fetch them first "
                         "(python -m eval fetch-data --data-dir DIR)")
    for path in files:
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    for turn in json.loads(line).get("turns", []):
                        grams |= ngrams(turn, n)
    return grams, [str(p) for p in files]


def decontaminate(records: Iterable[dict], grams: set, n: int) -> tuple[list[dict], list[str]]:
    kept, dropped = [], []
    for record in records:
        users = [m["content"] for m in record["messages"] if m["role"] == "user"]
        if any(ngrams(u, n) & grams for u in users):
            dropped.append(str(record["id"]))
        else:
            kept.append(record)
    return kept, dropped


def decontaminate_file(input_path: str | Path, eval_dir: str | Path, output_path: str | Path,
                       n: int = 13) -> dict:
    grams, files = eval_ngrams(eval_dir, n)
    with open(input_path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    kept, dropped = decontaminate(records, grams, n)
    output_path = Path(output_path)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = output_path.with_name(output_path.name + ".part")
    with tmp.open("w", encoding="utf-8") as f:
        for record in kept:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    tmp.replace(output_path)
    return {"ngram": n, "eval_files": files, "eval_ngrams": len(grams), "input": len(records),
            "kept": len(kept), "dropped": len(dropped), "dropped_ids": dropped}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.decontaminate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="conversations .jsonl ({id, messages})")
    parser.add_argument("--eval-dir", required=True, help="folder of benchmark .jsonl files")
    parser.add_argument("--output", required=True, help="kept conversations .jsonl")
    parser.add_argument("--ngram", type=int, default=13)
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    report = decontaminate_file(args.input, args.eval_dir, args.output, args.ngram)
    print(json.dumps({k: v for k, v in report.items() if k != "dropped_ids"}, indent=2))


if __name__ == "__main__":
    main()
