"""Conversation tokenization with loss masks, readers, collation and resumable regeneration."""

import json

import pytest

from training.data import (
    TokenizedDataset,
    collate,
    normalize_messages,
    read_conversations,
    tokenize_conversation,
)
from training.regenerate import completed_ids, regenerate_conversations

# Qwen3-like behaviour: the last assistant turn carries an (empty) thinking block, history
# turns do not, and the generation prompt opens an empty block when thinking is disabled.
THINKING_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}{% if loop.last %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% if enable_thinking is defined and not enable_thinking %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
    "{% endif %}"
)

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "def add(a, b):"},
    {"role": "assistant", "content": "return a + b"},
    {"role": "user", "content": "and subtract?"},
    {"role": "assistant", "content": "return a - b"},
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from vllm_liliprop.fixtures.tiny_models import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=512, num_files=4)


def supervised_runs(tokenizer, ids, mask):
    runs, current = [], []
    for token, supervised in zip(ids, mask):
        if supervised:
            current.append(token)
        elif current:
            runs.append(tokenizer.decode(current))
            current = []
    if current:
        runs.append(tokenizer.decode(current))
    return runs


def test_loss_mask_covers_assistant_turns_and_their_end_of_turn(tokenizer):
    ids, mask = tokenize_conversation(tokenizer, CONVERSATION)
    assert supervised_runs(tokenizer, ids, mask) == ["return a + b<|im_end|>\n", "return a - b<|im_end|>\n"]
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(CONVERSATION, tokenize=False)


def test_thinking_blocks_of_qwen3_style_templates_stay_prompt(tokenizer):
    original = tokenizer.chat_template
    tokenizer.chat_template = THINKING_TEMPLATE
    try:
        ids, mask = tokenize_conversation(tokenizer, CONVERSATION)
    finally:
        tokenizer.chat_template = original
    text = tokenizer.decode(ids)
    assert "<think>\n\n</think>\n\nreturn a - b" in text  # the last turn carries the block
    assert supervised_runs(tokenizer, ids, mask) == ["return a + b<|im_end|>\n", "return a - b<|im_end|>\n"]


def test_truncation_and_dataset_round_trip(tokenizer, tmp_path):
    ids, mask = tokenize_conversation(tokenizer, CONVERSATION, max_length=10)
    assert len(ids) == len(mask) == 10
    dataset = TokenizedDataset.from_conversations(tokenizer, [{"messages": CONVERSATION}] * 2, max_length=64)
    dataset.save(tmp_path / "d.jsonl")
    loaded = TokenizedDataset.load(tmp_path / "d.jsonl")
    assert loaded.input_ids == dataset.input_ids and loaded.loss_masks == dataset.loss_masks
    counts = loaded.supervised_token_counts(len(tokenizer))
    assert counts.sum() == sum(sum(m) for m in loaded.loss_masks)


def test_readers_normalize_openai_and_sharegpt_records(tmp_path):
    path = tmp_path / "c.jsonl"
    records = [
        {"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
        {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hey"}]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    read = list(read_conversations(str(path)))
    assert [r["id"] for r in read] == ["a", "1"]
    assert read[1]["messages"] == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey"}]
    with pytest.raises(ValueError, match="speaker"):
        normalize_messages({"conversations": [{"from": "narrator", "value": "x"}]})
    with pytest.raises(ValueError, match="neither"):
        list(read_conversations(str(tmp_path / "missing.jsonl")))


def test_collate_right_pads():
    dataset = TokenizedDataset([[1, 2, 3], [4]], [[False, True, True], [True]])
    batch = collate([dataset[0], dataset[1]], pad_id=9)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["loss_mask"].tolist() == [[False, True, True], [True, False, False]]
    assert batch["example_index"].tolist() == [0, 1]


class FakeTarget:
    """Greedy 'target': replies with a digest of the history; can fail after N calls."""

    def __init__(self, fail_after=None):
        self.calls = []
        self.fail_after = fail_after

    def __call__(self, batch):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise RuntimeError("engine died")
        self.calls.append(batch)
        return [f"re[{m[-1]['content']}|{len(m)}]" for m in batch]


def conversations(n):
    return [
        {"id": f"c{i}", "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": f"q{i}"},
            {"role": "assistant", "content": "old"},
            {"role": "user", "content": f"q{i}b"},
            {"role": "assistant", "content": "old"},
        ]} for i in range(n)
    ] + [{"id": "trailing", "messages": [{"role": "user", "content": "last"}]}]


def test_regeneration_replaces_assistant_turns_round_by_round(tmp_path):
    out = tmp_path / "regen.jsonl"
    target = FakeTarget()
    written = regenerate_conversations(conversations(3), target, out, chunk_size=10, progress=False)
    assert written == 4
    rows = {json.loads(line)["id"]: json.loads(line)["messages"] for line in out.read_text().splitlines()}
    assert rows["c1"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "re[q1|2]"},
        {"role": "user", "content": "q1b"},
        {"role": "assistant", "content": "re[q1b|4]"},
    ]
    # Round 2 was prompted with the regenerated first reply, not the original one.
    assert target.calls[1][0][2] == {"role": "assistant", "content": "re[q0|2]"}
    assert [len(batch) for batch in target.calls] == [4, 3]  # one batch per turn round
    assert rows["trailing"][-1] == {"role": "assistant", "content": "re[last|1]"}


def test_regeneration_resumes_after_an_interruption(tmp_path):
    out = tmp_path / "regen.jsonl"
    with pytest.raises(RuntimeError):
        regenerate_conversations(conversations(5), FakeTarget(fail_after=2), out, chunk_size=2, progress=False)
    assert completed_ids(out) == {"c0", "c1"}
    with open(out, "a") as f:
        f.write('{"id": "c2", "mess')  # a torn last line from a crash mid-write
    resumed = FakeTarget()
    written = regenerate_conversations(conversations(5), resumed, out, chunk_size=2, progress=False)
    assert written == 4  # c2, c3, c4, trailing
    assert completed_ids(out) == {"c0", "c1", "c2", "c3", "c4", "trailing"}
    prompted = {m[1]["content"] for batch in resumed.calls for m in batch if len(m) > 1}
    assert "q0" not in prompted and "q1" not in prompted
