"""Fuzzing (Hypothesis) where user data enters eval: prompts, benchmark and testbed files, the
systems file and its --var values, VLLM_LILIPROP_OPTIONS, and results files. Each input is
either taken (and then well formed) or refused with the package's own error naming the file,
row or field (tests/fuzz.py, `check_refusal`)."""

import json
import math
from pathlib import Path
from tempfile import TemporaryDirectory

import pandas as pd
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from eval.benchmarks import BENCHMARKS, DataError, load_benchmark
from eval.prompts import PromptRenderer
from eval.results import ResultsFile, identity
from eval.schema import ALL_COLUMNS
from eval.summary import summary_text
from eval.systems import SystemsError, load_systems, select_systems, substitute
from tests.fuzz import FUZZ, check_refusal, dumps, json_values, keys, text
from tests.test_eval_metrics import _row
from vllm_liliprop.options import ENV_VAR, OptionError, _KEYS, env_options, resolve_options

TINY_TARGET = Path(__file__).resolve().parents[1] / "testbed" / "tiny" / "target"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_TARGET)


# --- the prompt renderer -------------------------------------------------------------------------

turn_text = st.one_of(text, st.text(min_size=50, max_size=400))


@FUZZ
@given(turns=st.lists(turn_text, min_size=1, max_size=5).filter(lambda t: len(t) % 2 == 1),
       limit=st.integers(min_value=1, max_value=120), raw=st.booleans())
def test_any_conversation_renders_within_the_limit(tokenizer, turns, limit, raw):
    messages = [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns)]
    if raw:
        messages = messages[:1]
    render = PromptRenderer(tokenizer, "raw" if raw else "chat", max_prompt_tokens=limit)
    full = PromptRenderer(tokenizer, "raw" if raw else "chat")(messages)
    ids = render(messages)
    assert all(isinstance(i, int) for i in ids) and len(ids) == min(len(full), limit)
    assert render.num_truncated == (len(full) > limit)
    if len(full) <= limit:
        assert ids == full
    elif not raw:  # the assistant header that opens the answer survives the cut
        header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
        assert limit < len(header) + 1 or ids[-len(header):] == header


# --- benchmark and testbed files -----------------------------------------------------------------

FUZZED_BENCHMARKS = ["testbed-suite", "gsm8k", "math500", "aime2024", "aime2025", "humaneval", "mbpp",
                     "livecodebench", "alpacaeval", "mtbench", "speed-qualitative", "speed-throughput_1k"]


@st.composite
def benchmark_rows(draw):
    """A file's rows: hub-schema or common-schema objects with fuzzed values, or any JSON."""
    name = draw(st.sampled_from(FUZZED_BENCHMARKS))
    fields = ("id", "turns", "category", "reference", "benchmark") if name.startswith("testbed") \
        else BENCHMARKS[name].hub_fields
    row = st.dictionaries(st.sampled_from(fields), json_values, max_size=len(fields))
    return name, draw(st.lists(st.one_of(row, json_values), min_size=1, max_size=4))


def _data_file(root: Path, name: str) -> Path:
    if name.startswith("testbed-"):
        (root / "testbed").mkdir(exist_ok=True)
        return root / "testbed" / f"{name.removeprefix('testbed-')}.jsonl"
    return root / f"{name}.jsonl"


def _check_examples(examples) -> None:
    assert examples and len({e.id for e in examples}) == len(examples)
    for e in examples:
        assert isinstance(e.id, str) and e.id and isinstance(e.category, str)
        assert e.turns and all(isinstance(t, str) and t.strip() for t in e.turns)


# The failures the hunt found (LILIPROP_FUZZ_EXAMPLES=1500), kept as fixed examples.
@FUZZ
@given(case=benchmark_rows(), garbage=st.one_of(st.none(), st.binary(max_size=20)))
@example(case=("testbed-suite", [{}]), garbage=b"\x80")  # UnicodeDecodeError, no file named
@example(case=("livecodebench", [{"question_id": 1, "question_content": "q", "starter_code": 1}]),
         garbage=None)  # AttributeError: 'int' object has no attribute 'strip'
def test_any_benchmark_file_loads_or_names_the_file(case, garbage):
    name, rows = case
    with TemporaryDirectory() as root:
        path = _data_file(Path(root), name)
        body = "".join(dumps(r) + "\n" for r in rows).encode()
        path.write_bytes(body + (garbage or b""))
        try:
            examples = load_benchmark(name, "local", root)
        except Exception as error:
            check_refusal(error, (DataError,), str(path))
            return
    _check_examples(examples)


# --- the systems file and --var ------------------------------------------------------------------

entry_fields = st.sampled_from(["speculative_config", "liliprop", "dels_grid", "description", "dtype",
                                "whatever"])
spec_config = st.fixed_dictionaries({"method": st.sampled_from(["dflash", "ngram", "${m}"])},
                                    optional={"model": st.sampled_from(["${draft}", "/nowhere"]),
                                              "num_speculative_tokens": st.one_of(json_values, st.just("${n}"))})
liliprop_block = st.dictionaries(st.sampled_from(sorted(_KEYS) + ["bogus"]), json_values, max_size=3)
entry = st.one_of(json_values, st.fixed_dictionaries({}, optional={
    "speculative_config": st.one_of(spec_config, json_values), "liliprop": liliprop_block,
    "dels_grid": json_values, "description": json_values}),
    st.dictionaries(entry_fields, json_values, max_size=3))


@FUZZ
@given(systems=st.one_of(json_values, st.dictionaries(st.sampled_from(["AR", "DFlash", "X", ""]), entry,
                                                      max_size=3)),
       variables=st.dictionaries(st.sampled_from(["draft", "n", "m"]), text, max_size=3),
       inline=st.lists(st.tuples(keys, text), max_size=1))
def test_any_systems_file_and_vars_load_or_name_the_system(systems, variables, inline):
    with TemporaryDirectory() as root:
        path = Path(root) / "systems.json"
        path.write_text(dumps(systems))
        try:
            catalog = load_systems(path, variables, [f"{n}={t}" for n, t in inline])
            chosen = select_systems(catalog, None)
        except Exception as error:
            check_refusal(error, (SystemsError,), str(path), "--system", "unknown system")
            return
    for system in chosen:
        assert system.speculative_config is None or "method" in system.speculative_config
        json.loads(system.config_json())


@FUZZ
@given(value=st.one_of(text, st.builds(str, st.floats()), st.builds(str, st.integers())))
@example(value="NaN")  # became float nan (and "1e999" inf, "true" True)
@example(value="true")
def test_a_whole_placeholder_becomes_a_number_only_when_its_value_is_a_finite_number(value):
    out = substitute({"n": "${n}", "s": "x${n}"}, {"n": value}, "systems.json: X")
    assert out["s"] == "x" + value
    n = out["n"]
    assert n == value or (type(n) in (int, float) and math.isfinite(n))


# --- VLLM_LILIPROP_OPTIONS and a checkpoint's liliprop block ------------------------------------

@FUZZ
@given(raw=st.one_of(text, st.builds(dumps, liliprop_block), st.builds(dumps, json_values)),
       architecture=st.sampled_from(["DFlashDraftModel", "LiLiCorrDraftModel", "Qwen3DSparkModel"]),
       block=st.one_of(st.none(), liliprop_block))
@example(raw='{"dels_alpha": 1' + "0" * 400 + "}", architecture="DFlashDraftModel", block=None)  # OverflowError
def test_any_options_parse_or_name_the_field(raw, architecture, block):
    try:
        env_options({ENV_VAR: raw})
    except Exception as error:
        check_refusal(error, (OptionError,), ENV_VAR)
    fields = {"liliprop": block} if block is not None else {}
    if architecture == "LiLiCorrDraftModel":
        fields.update(lilicorr_enabled=True)  # the head's fields are fuzzed by test_bad_checkpoints
    try:
        options = resolve_options([architecture], fields, None, {ENV_VAR: raw})
    except Exception as error:
        check_refusal(error, (ValueError,), ENV_VAR, "dflash_config", "rule")
        return
    if options is not None:
        assert isinstance(options.rule, str) and options.walk in ("greedy", "viterbi")


# --- results files -------------------------------------------------------------------------------

@FUZZ
@given(column=st.sampled_from(ALL_COLUMNS), value=st.one_of(text, st.builds(dumps, json_values)),
       drop=st.booleans(), tail=st.one_of(st.just(""), text), suffix=st.sampled_from([".csv", ".parquet"]))
@example(column="seed", value="inf", drop=False, tail="", suffix=".csv")  # OverflowError
@example(column="num_truncated", value="1E310", drop=False, tail="", suffix=".csv")  # OverflowError
@example(column="engine_flags", value="5", drop=False, tail="", suffix=".csv")  # AttributeError
@example(column="output_hashes", value="{", drop=False, tail="", suffix=".csv")  # JSONDecodeError
@example(column="machine", value="{}", drop=False, tail="", suffix=".csv")  # KeyError 'isa'
@example(column="system_config", value="true", drop=False, tail="", suffix=".parquet")  # AttributeError
@example(column="system_config", value='{"speculative_config": 5}', drop=False, tail="", suffix=".csv")
def test_any_results_file_reads_or_names_the_file(column, value, drop, tail, suffix):
    with TemporaryDirectory() as root:
        path = Path(root) / f"r{suffix}"
        results = ResultsFile(path)
        results.append(_row("AR", 80.0))
        results.append(_row("DFlash", 120.0))
        frame = pd.read_csv(path, dtype=str, keep_default_na=False) if suffix == ".csv" \
            else pd.read_parquet(path).astype(str)
        frame = frame.drop(columns=[column]) if drop else frame.assign(**{column: value})
        if suffix == ".csv":
            frame.to_csv(path, index=False)
            path.write_text(path.read_text() + tail)
        else:
            frame.to_parquet(path)
        for read in (lambda: [identity(r) for r in ResultsFile(path).rows], lambda: summary_text(path)):
            try:
                read()
            except Exception as error:
                check_refusal(error, (ValueError,), str(path))
