"""eval benchmarks: every benchmark's schema from fixture files, errors naming the file, truncation."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from eval.benchmarks import (
    BENCHMARKS,
    DataError,
    benchmark_spec,
    expand_names,
    load_benchmark,
    measurement_groups,
)
from eval.prompts import NO_THINKING, PromptRenderer, template_kwargs

DATA = Path(__file__).parent / "data" / "eval"
FIXTURE_BENCHMARKS = ["gsm8k", "math500", "aime2024", "aime2025", "humaneval", "mbpp",
                      "livecodebench", "alpacaeval", "mtbench", "speed-qualitative",
                      "speed-throughput_1k"]
BOXED = "\nPlease reason step by step, and put your final answer within \\boxed{}."


def test_every_named_benchmark_has_a_fixture_or_shares_one_schema():
    # The other throughput blocks share speed-throughput_1k's schema and converter, the
    # LiveCodeBench releases livecodebench's.
    others = set(BENCHMARKS) - set(FIXTURE_BENCHMARKS)
    throughput = {"speed-throughput_2k", "speed-throughput_8k", "speed-throughput_16k",
                  "speed-throughput_32k"}
    releases = {f"livecodebench-v{n}" for n in range(1, 7)}
    assert others == throughput | releases
    assert {BENCHMARKS[n].convert for n in throughput} == {BENCHMARKS["speed-throughput_1k"].convert}
    assert {BENCHMARKS[n].convert for n in releases} == {BENCHMARKS["livecodebench"].convert}


@pytest.mark.parametrize("name", FIXTURE_BENCHMARKS)
def test_fixture_of_each_hub_schema_loads(name):
    examples = load_benchmark(name, "local", DATA)
    raw = [json.loads(line) for line in (DATA / f"{name}.jsonl").read_text().splitlines()]
    assert len(examples) == len(raw)
    assert all(e.benchmark == name for e in examples)
    assert len({e.id for e in examples}) == len(examples)
    assert all(e.turns and all(t.strip() for t in e.turns) for e in examples)


def test_converted_fields():
    gsm8k = load_benchmark("gsm8k", "local", DATA)
    # DFlash's templates are part of the prompt text, whichever source the rows come from.
    assert gsm8k[0].turns == ("Tom has 3 apples and buys 5 more. How many apples does he have?"
                              + BOXED,)
    assert gsm8k[0].reference.endswith("#### 8")
    humaneval = load_benchmark("humaneval", "local", DATA)[0]
    assert humaneval.turns[0] == (
        "Write a solution to the following problem and make sure that it passes the tests:\n"
        "```python\ndef add(a: int, b: int) -> int:\n    \"\"\"Return the sum of a and b.\"\"\"\n\n```")
    assert humaneval.id == "humaneval-HumanEval/0"
    math500 = load_benchmark("math500", "local", DATA)[0]
    assert math500.turns == ("Compute $2^{10}$." + BOXED,) and math500.category == "Algebra"
    aime2024 = load_benchmark("aime2024", "local", DATA)
    assert [e.id for e in aime2024] == ["aime2024-60", "aime2024-61"]
    assert aime2024[1].turns[0].endswith(BOXED) and aime2024[1].reference == "49"
    assert load_benchmark("aime2025", "local", DATA)[0].turns[0].endswith("$n^2 < 50$." + BOXED)
    mbpp = load_benchmark("mbpp", "local", DATA)[0]
    assert 'assert remove_Occ("hello","l") == "heo"' in mbpp.turns[0]
    lcb = load_benchmark("livecodebench", "local", DATA)
    assert "Start from this code" not in lcb[0].turns[0]  # empty starter code
    assert "class Solution" in lcb[1].turns[0]
    assert load_benchmark("aime2025", "local", DATA)[1].reference == "9"


def test_multi_turn_mtbench_keeps_both_turns_in_order():
    examples = load_benchmark("mtbench", "local", DATA)
    assert [len(e.turns) for e in examples] == [2, 2]
    assert examples[0].turns[1].startswith("Rewrite your previous response")
    assert examples[1].category == "coding"
    # MT-Bench is one benchmark in the tables: not split by category.
    assert list(measurement_groups(examples, benchmark_spec("mtbench"))) == [""]


def test_speed_qualitative_is_measured_per_category():
    spec = benchmark_spec("speed-qualitative")
    examples = load_benchmark("speed-qualitative", "local", DATA)
    groups = measurement_groups(examples, spec)
    assert list(groups) == ["coding", "math", "roleplay", "multilingual"]
    assert [len(e.turns) for e in groups["coding"]] == [1, 2]
    limited = load_benchmark("speed-qualitative", "local", DATA, limit=1)
    assert [e.id for e in limited] == ["qual-0", "qual-2", "qual-3", "qual-4"]


def test_speed_throughput_blocks_have_fixed_input_length_and_entropy_tiers():
    spec = benchmark_spec("speed-throughput_1k")
    assert spec.input_len == 1024 and benchmark_spec("speed-throughput_32k").input_len == 32768
    groups = measurement_groups(load_benchmark("speed-throughput_1k", "local", DATA), spec)
    assert {k: len(v) for k, v in groups.items()} == {"low_entropy": 2, "mixed": 1, "high_entropy": 1}


def test_testbed_folder_expands_to_one_benchmark_per_file():
    names = expand_names(["testbed", "gsm8k", "table1"], DATA)
    assert names[:2] == ["testbed-chat", "testbed-code"] and names[2] == "gsm8k"
    assert len(names) == 2 + 9  # gsm8k is part of table1 and kept once
    chat = load_benchmark("testbed-chat", "local", DATA)
    assert chat[0].turns == ("Say hello.", "Now say goodbye.")
    assert list(measurement_groups(chat, benchmark_spec("testbed-chat"))) == ["low", "high"]


def test_parquet_and_folder_layouts_read_like_jsonl(tmp_path):
    rows = [json.loads(line) for line in (DATA / "gsm8k.jsonl").read_text().splitlines()]
    pd.DataFrame(rows).to_parquet(tmp_path / "gsm8k.parquet")
    (tmp_path / "mtbench").mkdir()
    mt = [json.loads(line) for line in (DATA / "mtbench.jsonl").read_text().splitlines()]
    pd.DataFrame(mt).to_parquet(tmp_path / "mtbench" / "part-0.parquet")  # list columns
    assert load_benchmark("gsm8k", "local", tmp_path) == load_benchmark("gsm8k", "local", DATA)
    assert ([e.turns for e in load_benchmark("mtbench", "local", tmp_path)]
            == [e.turns for e in load_benchmark("mtbench", "local", DATA)])


LCB_RELEASE_FILES = ["test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl",
                     "test6.jsonl"]


def _write_lcb_releases(folder: Path, ids_by_file: dict[str, list[str]]) -> None:
    """Release files as downloaded from livecodebench/code_generation_lite (hub schema)."""
    folder.mkdir()
    for name, ids in ids_by_file.items():
        rows = [{"question_id": q, "question_content": f"Solve {q}.", "starter_code": "",
                 "platform": "atcoder"} for q in ids]
        (folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_livecodebench_is_the_full_release_read_from_a_folder_of_release_files(tmp_path):
    # Written newest first: the order read must be the release order, not the folder's.
    ids_by_file = {name: [f"p{n}a", f"p{n}b"] for n, name in enumerate(LCB_RELEASE_FILES, start=1)}
    _write_lcb_releases(tmp_path / "livecodebench", dict(reversed(ids_by_file.items())))
    examples = load_benchmark("livecodebench", "local", tmp_path)
    assert [e.id for e in examples] == [f"livecodebench-p{n}{x}" for n in range(1, 7) for x in "ab"]
    assert examples[0].turns == ("Solve p1a.",) and {e.benchmark for e in examples} == {"livecodebench"}


def test_a_livecodebench_release_reads_only_its_own_file(tmp_path):
    ids_by_file = {name: [f"p{n}"] for n, name in enumerate(LCB_RELEASE_FILES, start=1)}
    _write_lcb_releases(tmp_path / "livecodebench", ids_by_file)
    v2 = load_benchmark("livecodebench-v2", "local", tmp_path)
    assert [(e.id, e.benchmark) for e in v2] == [("livecodebench-p2", "livecodebench-v2")]
    assert [e.id for e in load_benchmark("livecodebench-v1", "local", tmp_path)] == ["livecodebench-p1"]
    # A release's own file or folder, when there is one, is read instead.
    (tmp_path / "livecodebench-v2.jsonl").write_text(json.dumps({"id": "own", "turns": ["x"]}) + "\n")
    assert [e.id for e in load_benchmark("livecodebench-v2", "local", tmp_path)] == ["own"]
    with pytest.raises(DataError, match=r"livecodebench-v3\.jsonl.*livecodebench/test3\.jsonl"):
        load_benchmark("livecodebench-v3", "local", tmp_path / "livecodebench")


def test_a_folder_with_some_livecodebench_releases_is_not_the_full_release(tmp_path):
    _write_lcb_releases(tmp_path / "livecodebench", {"test6.jsonl": ["p6"]})
    with pytest.raises(DataError, match=r"holds test6\.jsonl but not test\.jsonl, test2\.jsonl.*"
                                        r"\(livecodebench-v6\)"):
        load_benchmark("livecodebench", "local", tmp_path)
    assert [e.id for e in load_benchmark("livecodebench-v6", "local", tmp_path)] == ["livecodebench-p6"]


def test_a_problem_in_two_release_files_names_both_files(tmp_path):
    ids_by_file = {name: [f"p{n}"] for n, name in enumerate(LCB_RELEASE_FILES, start=1)}
    ids_by_file["test3.jsonl"].append("p1")
    _write_lcb_releases(tmp_path / "livecodebench", ids_by_file)
    with pytest.raises(DataError, match=r"id 'livecodebench-p1' appears twice \(.*livecodebench/"
                                        r"test\.jsonl row 1 and .*livecodebench/test3\.jsonl row 2\)"):
        load_benchmark("livecodebench", "local", tmp_path)


@pytest.fixture
def fake_hub(monkeypatch):
    """`datasets.load_dataset` without the network: records its calls, returns one row per file."""
    calls = []

    def load_dataset(path, name=None, *, data_files=None, split=None):
        calls.append({"path": path, "data_files": data_files, "split": split})
        return [{"question_id": f.rsplit("/", 1)[-1], "question_content": f"From {f}.",
                 "starter_code": ""} for f in data_files]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return calls


def test_hub_livecodebench_reads_every_release_file_and_a_release_its_own(fake_hub):
    hub = "hf://datasets/livecodebench/code_generation_lite/"
    full = load_benchmark("livecodebench", "hf")
    assert fake_hub == [{"path": "json", "data_files": [hub + f for f in LCB_RELEASE_FILES],
                         "split": "train"}]
    assert [e.id for e in full] == [f"livecodebench-{f}" for f in LCB_RELEASE_FILES]
    fake_hub.clear()
    [v6] = load_benchmark("livecodebench-v6", "hf")
    assert fake_hub[0]["data_files"] == [hub + "test6.jsonl"] and v6.benchmark == "livecodebench-v6"


def test_common_schema_rows_are_accepted_for_named_benchmarks(tmp_path):
    (tmp_path / "gsm8k.jsonl").write_text(json.dumps({"id": "q1", "turns": ["1+1?"], "reference": "2"}) + "\n")
    [example] = load_benchmark("gsm8k", "local", tmp_path)
    assert (example.id, example.turns, example.reference) == ("q1", ("1+1?",), "2")


def test_missing_file_names_the_expected_paths(tmp_path):
    with pytest.raises(DataError, match=r"gsm8k\.jsonl.*gsm8k\.parquet.*--source hf"):
        load_benchmark("gsm8k", "local", tmp_path)
    with pytest.raises(DataError, match="testbed"):
        expand_names(["testbed"], tmp_path)
    with pytest.raises(DataError, match="unknown benchmark 'gsm9k'"):
        load_benchmark("gsm9k", "local", tmp_path)
    with pytest.raises(DataError, match="--data-dir"):
        load_benchmark("gsm8k", "local", None)


@pytest.mark.parametrize("content, message", [
    ('{"question": "q", "answer": "a"}\n{"question": \n', r"gsm8k\.jsonl line 2: not valid JSON"),
    ('["q", "a"]\n', r"gsm8k\.jsonl line 1: expected a JSON object"),
    ('{"query": "q"}\n', r"gsm8k\.jsonl row 1: field 'question' missing.*question, answer"),
    ('{"id": "a", "turns": []}\n', r"gsm8k\.jsonl row 1: turns = \[\] must be a non-empty list"),
    ('{"id": "a", "turns": ["x", 3]}\n', r"gsm8k\.jsonl row 1: turns"),
    ('{"id": "a", "turns": ["x"], "benchmark": "mbpp"}\n', r"benchmark = 'mbpp' but the file is read as 'gsm8k'"),
    ('{"id": "a", "turns": ["x"]}\n{"id": "a", "turns": ["y"]}\n', r"id 'a' appears twice"),
    ('\n', r"benchmark 'gsm8k' has no rows"),
])
def test_malformed_rows_fail_naming_the_file(tmp_path, content, message):
    (tmp_path / "gsm8k.jsonl").write_text(content)
    with pytest.raises(DataError, match=message):
        load_benchmark("gsm8k", "local", tmp_path)


def test_corrupt_parquet_names_the_file(tmp_path):
    (tmp_path / "gsm8k.parquet").write_bytes(b"not parquet")
    with pytest.raises(DataError, match=r"gsm8k\.parquet: not a readable parquet file"):
        load_benchmark("gsm8k", "local", tmp_path)


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models["target"])


def test_chat_prompts_and_thinking_switch(tokenizer):
    render = PromptRenderer(tokenizer)
    assert render.chat_kwargs == {}  # the tiny template has no thinking switch
    messages = [{"role": "user", "content": "hello"}]
    text = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert render(messages) == tokenizer.encode(text, add_special_tokens=False)
    history = messages + [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "bye"}]
    assert tokenizer.decode(render(history)).endswith(
        "assistant\nhi<|im_end|>\n<|im_start|>user\nbye<|im_end|>\n<|im_start|>assistant\n")

    class Qwen3Like:
        chat_template = "{% if enable_thinking is defined and enable_thinking is false %}{% endif %}"

    assert template_kwargs(Qwen3Like()) == NO_THINKING == {"enable_thinking": False}


def test_truncation_cuts_the_last_user_turn_from_the_right_and_keeps_the_template(tokenizer):
    [example] = [e for e in load_benchmark("speed-throughput_1k", "local", DATA) if e.category == "mixed"]
    messages = [{"role": "user", "content": example.turns[0]}]
    full = PromptRenderer(tokenizer)(messages)
    limit = 64
    assert len(full) > limit
    render = PromptRenderer(tokenizer, max_prompt_tokens=limit)
    ids = render(messages)
    assert len(ids) == limit and render.num_truncated == 1
    head = tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
    tail = tokenizer.encode("<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[: len(head)] == head and ids[-len(tail):] == tail
    body = ids[len(head): -len(tail)]
    assert body == tokenizer.encode(example.turns[0], add_special_tokens=False)[: len(body)]
    # A prompt that fits is left exactly as it was.
    short = [{"role": "user", "content": "Summarize the document."}]
    assert render(short) == PromptRenderer(tokenizer)(short) and render.num_truncated == 1


def test_raw_prompts_are_single_turn_and_cut_at_the_limit(tokenizer):
    render = PromptRenderer(tokenizer, "raw", max_prompt_tokens=5)
    ids = render([{"role": "user", "content": "def foo(x):\n    return x + 1\n" * 4}])
    assert len(ids) == 5
    with pytest.raises(ValueError, match="single-turn"):
        render([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}])


def test_hub_source_reports_an_unreachable_hub_naming_the_dataset():
    """The real `datasets` call, with the hub switched off (this machine has no network)."""
    code = ("from eval.benchmarks import load_benchmark, DataError\n"
            "try:\n    load_benchmark('gsm8k', 'hf')\n"
            "except DataError as e:\n    print('DataError:', e)\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert "DataError: could not load openai/gsm8k (config main, split test)" in proc.stdout


@pytest.mark.skipif(not os.environ.get("EVAL_TEST_HF"), reason="needs the network: set EVAL_TEST_HF=1")
@pytest.mark.parametrize("name", ["gsm8k", "math500", "aime2024", "humaneval", "mbpp", "mtbench",
                                  "alpacaeval"])
def test_hub_datasets_load_into_the_common_schema(name):
    examples = load_benchmark(name, "hf", limit=2)
    assert len(examples) == 2 and all(e.turns for e in examples)
