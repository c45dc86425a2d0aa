"""Conversations -> token ids + loss mask, through the target tokenizer's chat template.

A conversation is a list of {"role": ..., "content": ...} messages. The loss mask covers the
tokens of every assistant turn (its content and the template's end-of-turn tokens), found by
rendering the conversation up to each assistant turn and locating the rendered characters in
the full text through the tokenizer's offsets. Thinking is disabled where the template
supports it (`enable_thinking=False`, e.g. Qwen3), as in the papers' training data.

Readers accept JSONL files and Hugging Face datasets with either OpenAI-style `messages`
(role/content) or ShareGPT-style `conversations` (from/value) records.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

__all__ = [
    "DataFormatError",
    "normalize_messages",
    "read_jsonl_conversations",
    "read_hf_conversations",
    "read_conversations",
    "tokenize_conversation",
    "TokenizedDataset",
    "training_vocabulary",
    "collate",
]

_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                   "system": "system", "chatgpt": "assistant", "bing": "assistant", "bard": "assistant"}


class DataFormatError(ValueError):
    """A malformed training-data file or record; the message names the file and line (or the
    dataset row) and the expected format."""


_RECORD_FORMAT = ('expected {"messages": [{"role": ..., "content": "..."}, ...]} or ShareGPT\'s '
                  '{"conversations": [{"from": ..., "value": "..."}, ...]}')


def _turn_text(value, where: str) -> str:
    """A turn's content: text (missing or null: "")."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise DataFormatError(f"{where}: content = {value!r} must be a string")
    return value


def _turns(record: dict, key: str, where: str) -> list[dict]:
    turns = record[key]
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise DataFormatError(f"{where}: {key!r} must be a list of objects; {_RECORD_FORMAT}")
    return turns


def normalize_messages(record: dict, where: str = "record") -> list[dict[str, str]]:
    """A record's conversation as [{"role", "content"}], from `messages` or `conversations`;
    DataFormatError naming `where` (file and line, or dataset row) for a malformed one."""
    if not isinstance(record, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(record).__name__}; {_RECORD_FORMAT}")
    if "messages" in record:
        messages = [{"role": m.get("role"), "content": _turn_text(m.get("content"), f"{where} message {i}")}
                    for i, m in enumerate(_turns(record, "messages", where))]
    elif "conversations" in record:
        messages = []
        for i, turn in enumerate(_turns(record, "conversations", where)):
            role = _SHAREGPT_ROLES.get(str(turn.get("from", turn.get("role"))).lower())
            if role is None:
                raise DataFormatError(f"{where}: unknown ShareGPT speaker {turn.get('from')!r}; expected one of "
                                      f"{sorted(_SHAREGPT_ROLES)}")
            content = turn.get("value", turn.get("content"))
            messages.append({"role": role, "content": _turn_text(content, f"{where} turn {i}")})
    else:
        raise DataFormatError(f"{where}: record has neither 'messages' nor 'conversations' "
                              f"(keys: {sorted(map(str, record))}); {_RECORD_FORMAT}")
    for message in messages:
        if message["role"] not in ("system", "user", "assistant", "tool"):
            raise DataFormatError(f"{where}: message role {message['role']!r} must be system/user/assistant/tool")
    return messages


def _json_lines(path: str | Path) -> Iterator[tuple[str, int, object]]:
    """("<path> line N", N, parsed JSON) for every non-blank line; DataFormatError naming the
    line for text that is not UTF-8 or not JSON."""
    with (gzip.open if str(path).endswith(".gz") else open)(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            where = f"{path} line {number}"
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                yield where, number, json.loads(line)
            except UnicodeDecodeError:
                raise DataFormatError(f"{where}: not UTF-8 text; save the file as UTF-8") from None
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{where}: not valid JSON ({exc.msg}); each line must be one "
                                      "JSON object") from None


def read_jsonl_conversations(path: str | Path) -> Iterator[dict]:
    """Yield {"id", "messages"} for every line of a JSONL file (id defaults to the line number,
    counted from 0 over every line)."""
    for where, number, record in _json_lines(path):
        messages = normalize_messages(record, where)
        yield {"id": str(record.get("id", number - 1)), "messages": messages}


def read_hf_conversations(name: str, split: str = "train", config: str | None = None,
                          limit: int | None = None) -> Iterator[dict]:
    """Yield {"id", "messages"} from a Hugging Face dataset (streamed, so huge sets are fine)."""
    from datasets import load_dataset

    dataset = load_dataset(name, config, split=split, streaming=True)
    for index, record in enumerate(dataset):
        if limit is not None and index >= limit:
            return
        key = record.get("id", record.get("uuid", index))
        yield {"id": str(key), "messages": normalize_messages(record, f"{name} ({split}) row {index}")}


def read_conversations(source: str, split: str = "train", limit: int | None = None) -> Iterator[dict]:
    """A local .jsonl file, or `hf:<dataset>[:<config>]` for a Hugging Face dataset."""
    if source.startswith("hf:"):
        name, _, config = source[3:].partition(":")
        yield from read_hf_conversations(name, split, config or None, limit)
        return
    if not Path(source).exists():
        raise ValueError(f"conversation source {source!r} is neither a file nor 'hf:<dataset>'")
    for index, record in enumerate(read_jsonl_conversations(source)):
        if limit is not None and index >= limit:
            return
        yield record


def _render(tokenizer, messages: list[dict], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, enable_thinking=False
    )


def _common_prefix_length(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _assistant_span(tokenizer, messages: list[dict], index: int, full: str) -> tuple[int, int]:
    """Character span [start, end) of assistant turn `index` inside the full rendering:
    its content plus the end-of-turn text the template appends (e.g. "<|im_end|>")."""
    before = _render(tokenizer, messages[:index], add_generation_prompt=True) if index else ""
    through = _render(tokenizer, messages[: index + 1], add_generation_prompt=False)
    earliest = _common_prefix_length(before, full)
    content = messages[index]["content"]
    for needle in (content, content.strip()):
        if not needle:
            continue
        pos = full.find(needle, earliest)
        if pos >= 0:
            content_end = pos + len(needle)
            at = through.rfind(needle)
            suffix = through[at + len(needle):] if at >= 0 else ""
            return pos, content_end + _common_prefix_length(full[content_end:], suffix)
    # Content not found verbatim (a template that rewrites it): use where the renderings agree.
    return earliest, max(earliest, _common_prefix_length(through, full))


def tokenize_conversation(
    tokenizer, messages: list[dict[str, str]], max_length: int | None = None
) -> tuple[list[int], list[bool]]:
    """Token ids of the rendered conversation and a per-token loss mask (assistant turns).

    A token is supervised when its characters lie inside an assistant turn: the turn's content
    as it appears in the full rendering plus the end-of-turn text the template puts after it.
    Template text before the content (role headers, an empty thinking block) stays prompt, as
    it is at serving time. Templates that render history differently from the last turn (Qwen3
    strips thinking from earlier turns) are handled because the content is located in the full
    rendering itself.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("tokenizer has no chat_template; use the target model's tokenizer")
    full = _render(tokenizer, messages, add_generation_prompt=False)
    spans = [
        _assistant_span(tokenizer, messages, i, full)
        for i, message in enumerate(messages)
        if message["role"] == "assistant"
    ]
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    mask = [
        any(begin >= s and finish <= e and finish > begin for s, e in spans)
        for begin, finish in encoded["offset_mapping"]
    ]
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return ids, mask


@dataclass
class TokenizedExample:
    input_ids: list[int]
    loss_mask: list[bool]
    example_index: int


class TokenizedDataset:
    """Tokenized examples kept in memory; saved as JSONL of {"input_ids", "loss_mask"}."""

    def __init__(self, input_ids: list[list[int]], loss_masks: list[list[bool]]) -> None:
        if len(input_ids) != len(loss_masks):
            raise ValueError(f"{len(input_ids)} id lists but {len(loss_masks)} loss masks")
        for i, (ids, mask) in enumerate(zip(input_ids, loss_masks)):
            if len(ids) != len(mask):
                raise ValueError(f"example {i}: {len(ids)} ids but {len(mask)} loss-mask entries")
        self.input_ids = input_ids
        self.loss_masks = loss_masks

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> TokenizedExample:
        return TokenizedExample(self.input_ids[index], self.loss_masks[index], index)

    @classmethod
    def from_conversations(
        cls, tokenizer, conversations: Iterable[dict], max_length: int, min_supervised: int = 2,
        progress: bool = False,
    ) -> "TokenizedDataset":
        """Tokenize; drop examples with fewer than `min_supervised` loss-masked tokens."""
        all_ids, all_masks = [], []
        for conversation in tqdm(conversations, disable=not progress, desc="tokenize"):
            messages = conversation["messages"] if isinstance(conversation, dict) else conversation
            ids, mask = tokenize_conversation(tokenizer, messages, max_length)
            if sum(mask) >= min_supervised:
                all_ids.append(ids)
                all_masks.append(mask)
        return cls(all_ids, all_masks)

    @classmethod
    def from_texts(cls, tokenizer, texts: Iterable[str], max_length: int, min_tokens: int = 2) -> "TokenizedDataset":
        """Plain text (e.g. for the DeLS short head): every token supervised."""
        all_ids, all_masks = [], []
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_length]
            if len(ids) >= min_tokens:
                all_ids.append(list(ids))
                all_masks.append([True] * len(ids))
        return cls(all_ids, all_masks)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            for ids, mask in zip(self.input_ids, self.loss_masks):
                f.write(json.dumps({"input_ids": ids, "loss_mask": [int(m) for m in mask]}) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "TokenizedDataset":
        if not Path(path).exists():
            raise ValueError(f"tokenized dataset {path} does not exist; build it with `python -m training.data`")
        ids, masks = [], []
        for where, _, record in _json_lines(path):
            example_ids, mask = _tokenized_record(record, where)
            ids.append(example_ids)
            masks.append(mask)
        try:
            return cls(ids, masks)
        except ValueError as exc:
            raise DataFormatError(f"{path}: {exc}; rebuild it with `python -m training.data`") from None

    def supervised_token_counts(self, vocab_size: int) -> torch.Tensor:
        """int64 [V]: how often each token id appears under the loss mask (DeLS prior)."""
        counts = torch.zeros(vocab_size, dtype=torch.int64)
        for ids, mask in zip(self.input_ids, self.loss_masks):
            kept = torch.tensor([t for t, m in zip(ids, mask) if m], dtype=torch.int64)
            if kept.numel():
                if int(kept.max()) >= vocab_size:
                    raise ValueError(f"token id {int(kept.max())} >= vocab_size {vocab_size}")
                counts += torch.bincount(kept, minlength=vocab_size)
        return counts


def read_texts(path: str | Path, field: str) -> list[str]:
    """The `field` text of every line of a JSONL file (`--text-field`)."""
    texts = []
    for where, _, record in _json_lines(path):
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            raise DataFormatError(f"{where}: expected an object with a text field {field!r} (--text-field)")
        texts.append(record[field])
    return texts


def _tokenized_record(record, where: str) -> tuple[list[int], list[bool]]:
    """One line of a tokenized dataset: {"input_ids": [int >= 0], "loss_mask": [0/1 or bool]}."""
    ok = (isinstance(record, dict) and isinstance(record.get("input_ids"), list)
          and isinstance(record.get("loss_mask"), list)
          and all(type(t) is int and t >= 0 for t in record["input_ids"])
          and all(m in (0, 1) and type(m) in (int, bool) for m in record["loss_mask"]))
    if not ok:
        raise DataFormatError(f"{where}: expected {{\"input_ids\": [token ids >= 0], \"loss_mask\": "
                              "[0 or 1 per id]}; rebuild the file with `python -m training.data`")
    return record["input_ids"], [bool(m) for m in record["loss_mask"]]


def load_examples(path: str | Path, tokenizer_dir: str | Path, max_length: int) -> "TokenizedDataset":
    """A tokenized dataset (.jsonl of `python -m training.data`) as it is, or conversations
    ({"id", "messages"} JSONL, gzipped or not) tokenized with the target's chat template: what
    the measurement and head-store commands take as --data."""
    first = next(iter(_json_lines(path)), (None, None, {}))[2]
    if isinstance(first, dict) and "input_ids" in first:
        return TokenizedDataset.load(path)
    from transformers import AutoTokenizer

    return TokenizedDataset.from_conversations(AutoTokenizer.from_pretrained(tokenizer_dir),
                                               read_jsonl_conversations(path), max_length)


def training_vocabulary(dataset: "TokenizedDataset", vocab_size: int, size: int) -> tuple[torch.Tensor, float]:
    """The `size` token ids most often supervised in `dataset` (ties: lower id first) and the
    share of supervised tokens they cover."""
    if not 0 < size <= vocab_size:
        raise ValueError(f"train_vocab.size = {size} must be in [1, vocab_size = {vocab_size}]")
    counts = dataset.supervised_token_counts(vocab_size)
    order = sorted(range(vocab_size), key=lambda t: (-int(counts[t]), t))[:size]
    ids = torch.tensor(sorted(order), dtype=torch.int64)
    total = int(counts.sum())
    return ids, (float(counts[ids].sum()) / total if total else 1.0)


def collate(examples: Sequence[TokenizedExample], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad a list of examples: input_ids, attention_mask, loss_mask [B, T]; example_index [B]."""
    length = max(len(e.input_ids) for e in examples)
    batch = len(examples)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.int64)
    attention_mask = torch.zeros(batch, length, dtype=torch.int64)
    loss_mask = torch.zeros(batch, length, dtype=torch.bool)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids, dtype=torch.int64)
        attention_mask[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(example.loss_mask, dtype=torch.bool)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        "example_index": torch.tensor([e.example_index for e in examples], dtype=torch.int64),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m training.data",
        description="Tokenize conversations with the target's chat template into ids + loss mask (JSONL).",
    )
    parser.add_argument("--tokenizer", required=True, help="target tokenizer (HF id or local dir)")
    parser.add_argument("--input", required=True, help="conversations: a .jsonl file or hf:<dataset>[:<config>]")
    parser.add_argument("--split", default="train", help="split of a Hugging Face dataset")
    parser.add_argument("--output", required=True, help="output .jsonl of {input_ids, loss_mask}")
    parser.add_argument("--max-length", type=int, default=3072)
    parser.add_argument("--limit", type=int, default=None, help="read at most this many conversations")
    parser.add_argument("--text-field", default=None,
                        help="treat the .jsonl input as plain text records with this field (all tokens supervised)")
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    if args.text_field:
        texts = read_texts(args.input, args.text_field)[: args.limit]
        dataset = TokenizedDataset.from_texts(tokenizer, texts, args.max_length)
    else:
        dataset = TokenizedDataset.from_conversations(
            tokenizer, read_conversations(args.input, args.split, args.limit), args.max_length, progress=True
        )
    dataset.save(args.output)
    print(f"wrote {len(dataset)} examples to {args.output}")


if __name__ == "__main__":
    main()
