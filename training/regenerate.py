"""Regenerate every assistant turn of a conversation set with the target (LiLiCorr Section 4.1).

The system and user messages are kept; each assistant turn is replaced by the target's own
greedy reply to the regenerated history before it (reasoning disabled, capped completion).
Turns are generated round by round across a chunk of conversations, so one vLLM batch holds
the r-th assistant turn of every conversation in the chunk.

Resumable: finished conversations are appended to the output JSONL as {"id", "messages"};
a restart skips ids already present. vLLM is imported only inside `vllm_chat_generator`.

    python -m training.regenerate --target Qwen/Qwen3-8B --input conversations.jsonl \\
        --output regenerated.jsonl --max-tokens 4096
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from training.data import read_conversations
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

__all__ = ["completed_ids", "regenerate_conversations", "vllm_chat_generator"]

Messages = list[dict[str, str]]
Generator = Callable[[list[Messages]], list[str]]


def completed_ids(output_path: str | Path) -> set[str]:
    """Ids already written to the output file (a truncated last line is ignored)."""
    path = Path(output_path)
    done: set[str] = set()
    if not path.exists():
        return done
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                done.add(str(json.loads(line)["id"]))
            except (json.JSONDecodeError, KeyError):
                continue  # an interrupted write; that conversation is regenerated
    return done


def _drop_torn_tail(path: Path) -> None:
    """Cut a partial last line left by a crash mid-write, so appends start on a fresh line."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return
        f.truncate(data.rfind(b"\n") + 1)


def _skeleton(messages: Messages, answer_trailing_user: bool) -> Messages:
    """The conversation with assistant contents blanked (to be generated) and, optionally, an
    assistant turn appended after a trailing user message."""
    out = [dict(m) for m in messages]
    for message in out:
        if message["role"] == "assistant":
            message["content"] = None
    if answer_trailing_user and out and out[-1]["role"] == "user":
        out.append({"role": "assistant", "content": None})
    return out


def regenerate_conversations(
    conversations: Iterable[dict],
    generate: Generator,
    output_path: str | Path,
    *,
    chunk_size: int = 256,
    answer_trailing_user: bool = True,
    progress: bool = True,
    deadline: float | None = None,
) -> int:
    """Regenerate assistant turns; append finished conversations to `output_path`.

    conversations: {"id", "messages"} records (training.data readers).
    generate(list of message lists) -> one reply per list (greedy, no reasoning).
    deadline: a time.time() after which no new chunk starts (a rerun resumes).
    Returns the number of conversations written by this call.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    output_path = Path(output_path)
    output_path.parent.mkdir(parents=True, exist_ok=True)
    _drop_torn_tail(output_path)
    done = completed_ids(output_path)
    written = 0
    bar = tqdm(disable=not progress, desc="regenerate", unit="conv")

    def flush(chunk: list[dict]) -> int:
        skeletons = [_skeleton(c["messages"], answer_trailing_user) for c in chunk]
        turn = 0
        while True:
            # (conversation, message index) of every turn-th assistant slot in the chunk.
            slots = []
            for ci, messages in enumerate(skeletons):
                assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
                if turn < len(assistant):
                    slots.append((ci, assistant[turn]))
            if not slots:
                break
            prompts = [skeletons[ci][:mi] for ci, mi in slots]
            replies = generate(prompts)
            if len(replies) != len(prompts):
                raise ValueError(f"generate returned {len(replies)} replies for {len(prompts)} prompts")
            for (ci, mi), reply in zip(slots, replies):
                skeletons[ci][mi]["content"] = reply
            turn += 1
        with open(output_path, "a", encoding="utf-8") as f:
            for conversation, messages in zip(chunk, skeletons):
                if any(m["role"] == "assistant" for m in messages):
                    f.write(json.dumps({"id": conversation["id"], "messages": messages}, ensure_ascii=False) + "\n")
            f.flush()
        bar.update(len(chunk))
        return len(chunk)

    chunk: list[dict] = []
    for conversation in conversations:
        if str(conversation["id"]) in done:
            continue
        if deadline is not None and time.time() >= deadline:
            chunk = []
            break
        chunk.append(conversation)
        if len(chunk) == chunk_size:
            written += flush(chunk)
            chunk = []
    if chunk:
        written += flush(chunk)
    bar.close()
    return written


def vllm_chat_generator(
    model: str,
    *,
    max_tokens: int = 4096,
    enable_thinking: bool = False,
    **llm_kwargs: Any,
) -> Generator:
    """A `generate` callable backed by a vLLM offline engine: greedy, capped at `max_tokens`."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, **llm_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)

    def generate(batch: list[Messages]) -> list[str]:
        outputs = llm.chat(batch, params, use_tqdm=False,
                           chat_template_kwargs={"enable_thinking": enable_thinking})
        return [output.outputs[0].text for output in outputs]

    return generate


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.regenerate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="target model served by vLLM (HF id or local dir)")
    parser.add_argument("--input", required=True, help="conversations: .jsonl or hf:<dataset>[:<config>]")
    parser.add_argument("--split", default="train")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--output", required=True, help="output .jsonl (appended; reruns resume)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="completion cap per assistant turn")
    parser.add_argument("--chunk-size", type=int, default=256, help="conversations per vLLM batch round")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--no-trailing-user", action="store_true", help="do not answer a trailing user turn")
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose

    llm_kwargs = {"tensor_parallel_size": args.tensor_parallel_size}
    if args.max_model_len:
        llm_kwargs["max_model_len"] = args.max_model_len
    generate = vllm_chat_generator(args.target, max_tokens=args.max_tokens, **llm_kwargs)
    count = regenerate_conversations(
        read_conversations(args.input, args.split, args.limit), generate, args.output,
        chunk_size=args.chunk_size, answer_trailing_user=not args.no_trailing_user,
    )
    print(f"regenerated {count} conversations into {args.output}")


if __name__ == "__main__":
    main()
