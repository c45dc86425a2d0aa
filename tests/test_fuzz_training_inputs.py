"""Fuzzing (Hypothesis) where user data enters training: recipe files and `--set` overrides,
conversation files (OpenAI messages / ShareGPT), tokenized datasets, `--text-field` files and
the chat-template tokenization of any conversation text. Each input is either taken (and then
well formed) or refused with a ValueError naming the file and line, or the override
(tests/fuzz.py, `check_refusal`)."""

from pathlib import Path
from tempfile import TemporaryDirectory

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from tests.fuzz import FUZZ, check_refusal, dumps, json_values, keys, text
from training.data import (
    DataFormatError,
    TokenizedDataset,
    read_jsonl_conversations,
    read_texts,
    tokenize_conversation,
)
from training.recipe import apply_overrides, load_recipe

TINY_TARGET = Path(__file__).resolve().parents[1] / "testbed" / "tiny" / "target"
ROLES = st.sampled_from(["user", "assistant", "system", "tool", "human", "gpt", "robot", None, 3])


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TINY_TARGET)


def _lines_file(root: str, lines: list, garbage: bytes | None) -> Path:
    path = Path(root) / "data.jsonl"
    path.write_bytes("".join(dumps(v) + "\n" for v in lines).encode() + (garbage or b""))
    return path


# --- recipes and overrides -----------------------------------------------------------------------

@FUZZ
@given(content=st.one_of(st.builds(dumps, json_values), st.binary(max_size=30).map(repr), text))
@example(content="[]")  # TypeError from dict.pop on a list
@example(content="{")  # JSONDecodeError naming no file
def test_any_recipe_file_loads_as_an_object_or_names_the_file(content):
    with TemporaryDirectory() as root:
        path = Path(root) / "recipe.json"
        path.write_text(content)
        try:
            recipe = load_recipe(path)
        except Exception as error:
            check_refusal(error, (ValueError,), str(path))
            return
    assert isinstance(recipe, dict) and "_comment" not in recipe


@FUZZ
@given(name=st.sampled_from(["lilicorr_qwen3_8b", "dels_gru_qwen3_8b", "smollm2/build"]),
       overrides=st.lists(st.tuples(keys, st.one_of(text, st.builds(dumps, json_values))), max_size=3))
@example(name="lilicorr_qwen3_8b", overrides=[("train", "5")])  # a section became 5
@example(name="lilicorr_qwen3_8b", overrides=[("train..max_steps", "5")])  # an empty name
def test_any_override_applies_or_names_itself(name, overrides):
    recipe = load_recipe(name)
    items = [f"{k}={v}" for k, v in overrides]
    try:
        out = apply_overrides(recipe, items)
    except Exception as error:
        check_refusal(error, (ValueError,), *[repr(i) for i in items])
        return
    assert out is not recipe and load_recipe(name) == recipe  # the recipe itself is untouched
    for section, value in recipe.items():  # sections stay sections
        assert not isinstance(value, dict) or isinstance(out[section], dict)


# --- conversation, text and tokenized files ------------------------------------------------------

message = st.fixed_dictionaries({}, optional={"role": ROLES, "content": st.one_of(text, json_values)})
sharegpt = st.fixed_dictionaries({}, optional={"from": ROLES, "value": st.one_of(text, json_values)})
record = st.one_of(
    json_values,
    st.fixed_dictionaries({"messages": st.one_of(st.lists(message, max_size=3), json_values)},
                          optional={"id": json_values}),
    st.fixed_dictionaries({"conversations": st.one_of(st.lists(sharegpt, max_size=3), json_values)}))


@FUZZ
@given(lines=st.lists(record, max_size=4), garbage=st.one_of(st.none(), st.binary(max_size=12)))
@example(lines=[[1]], garbage=None)  # AttributeError
@example(lines=[{"messages": "hi"}], garbage=None)  # TypeError
@example(lines=[{"messages": [{"content": "hi"}]}], garbage=None)  # KeyError 'role'
@example(lines=[{"messages": [{"role": "user", "content": 5}]}], garbage=None)  # taken, then AttributeError
@example(lines=[{"conversations": ["hi"]}], garbage=b"\xff")  # AttributeError / UnicodeDecodeError
def test_any_conversation_file_reads_or_names_the_line(lines, garbage):
    with TemporaryDirectory() as root:
        path = _lines_file(root, lines, garbage)
        try:
            conversations = list(read_jsonl_conversations(path))
        except Exception as error:
            check_refusal(error, (DataFormatError,), f"{path} line ")
            return
    for conversation in conversations:
        assert isinstance(conversation["id"], str)
        for m in conversation["messages"]:
            assert m["role"] in ("system", "user", "assistant", "tool") and isinstance(m["content"], str)


tokenized = st.fixed_dictionaries({}, optional={"input_ids": st.one_of(st.lists(st.integers(-2, 70), max_size=5),
                                                                        json_values),
                                                "loss_mask": st.one_of(st.lists(st.sampled_from([0, 1, True, 2, "1"]),
                                                                                max_size=5), json_values)})


@FUZZ
@given(lines=st.lists(st.one_of(tokenized, json_values), max_size=4),
       garbage=st.one_of(st.none(), st.binary(max_size=12)))
@example(lines=[{"input_ids": [1]}], garbage=None)  # KeyError 'loss_mask'
@example(lines=[{"input_ids": [-1], "loss_mask": [1]}], garbage=None)  # RuntimeError from bincount
@example(lines=[[1]], garbage=None)  # TypeError
def test_any_tokenized_dataset_loads_or_names_the_line(lines, garbage):
    with TemporaryDirectory() as root:
        path = _lines_file(root, lines, garbage)
        try:
            dataset = TokenizedDataset.load(path)
            counts = dataset.supervised_token_counts(64)
        except Exception as error:
            check_refusal(error, (ValueError,), str(path), "vocab_size")
            return
    assert all(len(dataset[i].input_ids) == len(dataset[i].loss_mask) for i in range(len(dataset)))
    assert int(counts.sum()) == sum(sum(m) for m in dataset.loss_masks)


@FUZZ
@given(lines=st.lists(st.one_of(st.fixed_dictionaries({"text": st.one_of(text, json_values)}), json_values),
                      max_size=4))
@example(lines=[{"title": "no text"}])  # KeyError 'text'
def test_any_text_field_file_reads_or_names_the_line(lines):
    with TemporaryDirectory() as root:
        path = _lines_file(root, lines, None)
        try:
            texts = read_texts(path, "text")
        except Exception as error:
            check_refusal(error, (DataFormatError,), f"{path} line ")
            return
    assert all(isinstance(t, str) for t in texts)


@FUZZ
@given(turns=st.lists(st.one_of(text, st.text(max_size=200)), min_size=1, max_size=4),
       system=st.booleans(), max_length=st.one_of(st.none(), st.integers(1, 64)))
def test_any_conversation_text_tokenizes_with_a_mask_per_token(tokenizer, turns, system, max_length):
    messages = ([{"role": "system", "content": "be brief"}] if system else []) + \
        [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns)]
    ids, mask = tokenize_conversation(tokenizer, messages, max_length)
    assert len(ids) == len(mask) and (max_length is None or len(ids) <= max_length)
    assert all(isinstance(i, int) for i in ids)
    if len(turns) == 1 or max_length is not None:
        return
    # The first assistant turn's text is supervised when it holds a token of its own.
    answer = turns[1].strip()
    if answer:
        assert any(mask)
