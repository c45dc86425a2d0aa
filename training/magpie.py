"""Training prompts written by the target itself (Magpie-style): no benchmark, no license question.

An instruct model given its chat template only up to the user header (`<|im_start|>user\\n`)
writes a plausible user turn. Sampled at temperature 1 with a seed per request, the turns vary;
a few steering words after the header (one topic per request, round robin) spread them over
code, math, writing and everyday questions. Output: {"id", "topic", "messages": [user turn]}
JSONL, appended and resumable (ids already written are skipped), exact duplicates dropped.

    python -m training.magpie --target DIR --output prompts.jsonl --count 8000 --seed 0
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from tqdm import tqdm

from training.regenerate import _drop_torn_tail, completed_ids
from vllm_liliprop.quiet import add_verbose_flag, quiet_after_parse

# (topic, words the user turn starts with). "" lets the model choose freely.
TOPICS_V1: tuple[tuple[str, str], ...] = (
    ("free", ""),
    ("code", "Write a Python function that"),
    ("code", "How do I"),
    ("code-fix", "Can you explain what this code does"),
    ("math", "Solve the following math problem:"),
    ("math", "What is"),
    ("math", "A store sells"),
    ("writing", "Write a short story about"),
    ("writing", "Write an email"),
    ("explain", "Explain"),
    ("explain", "What are the main differences between"),
    ("advice", "I need help with"),
    ("list", "Give me a list of"),
    ("summarize", "Summarize"),
)

# The second build's mix (issue 32): v1's steers plus reasoning, chat, more code, math and writing
# openings, so that code / math / reasoning / chat / writing get 7 / 7 / 6 / 6 / 6 of 40 requests
# (v1's explain, advice, list and summarize count as chat here; "free" as chat too).
TOPICS_MIX2: tuple[tuple[str, str], ...] = TOPICS_V1 + (
    ("code", "Write a SQL query that"),
    ("code", "Write a JavaScript function that"),
    ("code-fix", "Fix the bug in this Python code:"),
    ("code", "Implement a Python class"),
    ("math", "Calculate"),
    ("math", "Find the value of x"),
    ("math", "How many ways"),
    ("math", "Prove that"),
    ("reasoning", "If all"),
    ("reasoning", "Explain step by step why"),
    ("reasoning", "A train leaves"),
    ("reasoning", "Which is more likely"),
    ("reasoning", "Here is a logic puzzle:"),
    ("reasoning", "What would happen if"),
    ("chat", "Hi! Can you"),
    ("chat", "What do you think about"),
    ("chat", "Can you recommend"),
    ("writing", "Write a poem about"),
    ("writing", "Write a blog post about"),
    ("writing", "Rewrite the following paragraph"),
    ("writing", "Write a product description for"),
    ("chat", "Tell me about"),
    ("writing", "Write a cover letter"),
    ("chat", "How can I improve"),
    ("math", "A rectangle has"),
    ("code", "What is the time complexity of"),
)

TOPIC_SETS = {"v1": TOPICS_V1, "mix2": TOPICS_MIX2}
TOPICS = TOPICS_V1

Completer = Callable[[list[str]], list[tuple[str, bool]]]  # prompts -> (text, ended by a stop)


def user_header(tokenizer) -> str:
    """The chat template rendered up to where a user turn's text begins."""
    marker = "\x00MAGPIE\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    at = text.find(marker)
    if at <= 0:
        raise ValueError("the target's chat template does not render a user turn's content verbatim; "
                         "Magpie prompts need a template such as ChatML")
    return text[:at]


def clean_turn(start: str, generated: str, min_chars: int) -> str | None:
    text = (start + (" " if start and not generated.startswith((" ", "\n")) else "") + generated).strip()
    return text if len(text) >= min_chars else None


def vllm_completer(target: str, *, seed: int, max_tokens: int, stop: list[str],
                   **llm_kwargs) -> Completer:
    """Raw-text completions from a vLLM offline engine, sampled at temperature 1."""
    from vllm import LLM, SamplingParams

    # One engine seed, no per-request seeds: vLLM 0.32's CPU runner cannot rewind a request's
    # own generator after a chunked prefill ("CPU Generator does not use offset"). Each request
    # still draws its own samples from the engine's stream, so the turns differ.
    llm = LLM(model=target, seed=seed, **llm_kwargs)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=max_tokens, stop=stop)

    def complete(prompts: list[str]) -> list[tuple[str, bool]]:
        outputs = llm.generate(prompts, params, use_tqdm=False)
        return [(out.outputs[0].text, out.outputs[0].finish_reason == "stop") for out in outputs]

    return complete


def end_markers(tokenizer) -> list[str]:
    """Where a Magpie user turn ends: the template's end of turn, or a new turn's header."""
    return [tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id), "<|im_start|>"]


def generate_prompts(target: str, output: str | Path, count: int, *, seed: int = 0,
                     max_tokens: int = 96, min_chars: int = 24, batch_size: int = 512,
                     progress: bool = True, topics: str = "v1", complete: Completer | None = None,
                     deadline: float | None = None, **llm_kwargs) -> int:
    """Append Magpie user turns for request indices 0..count-1 not yet in `output`, from
    `complete` (default: a vLLM engine on `target`). `deadline` (a time.time()) stops between
    batches; a rerun goes on from there."""
    from transformers import AutoTokenizer

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    _drop_torn_tail(output)
    done = completed_ids(output)
    seen = set()
    if output.exists():
        with output.open(encoding="utf-8") as f:
            seen = {json.loads(line)["messages"][0]["content"] for line in f if line.strip()}
    todo = [i for i in range(count) if f"magpie-{seed}-{i}" not in done]
    if not todo:
        return 0
    tokenizer = AutoTokenizer.from_pretrained(target)
    header = user_header(tokenizer)
    if complete is None:
        complete = vllm_completer(target, seed=seed, max_tokens=max_tokens, stop=end_markers(tokenizer),
                                  **llm_kwargs)
    steers = TOPIC_SETS[topics]
    written = 0
    bar = tqdm(total=len(todo), disable=not progress, desc="magpie", unit="prompt")
    for at in range(0, len(todo), batch_size):
        if deadline is not None and time.time() >= deadline:
            break
        chunk = todo[at:at + batch_size]
        chunk_topics = [steers[i % len(steers)] for i in chunk]
        outputs = complete([header + start for _, start in chunk_topics])
        with output.open("a", encoding="utf-8") as f:
            for i, (topic, start), (text, stopped) in zip(chunk, chunk_topics, outputs):
                # A turn cut by the token cap is unfinished; the model ended the others itself.
                if not stopped:
                    continue
                turn = clean_turn(start, text, min_chars)
                if turn is None or turn in seen:
                    continue
                seen.add(turn)
                record = {"id": f"magpie-{seed}-{i}", "topic": topic,
                          "messages": [{"role": "user", "content": turn}]}
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
        bar.update(len(chunk))
    bar.close()
    return written


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.magpie", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="target model folder (an instruct model)")
    parser.add_argument("--output", required=True, help="prompts .jsonl (appended; reruns resume)")
    parser.add_argument("--count", type=int, required=True, help="number of requests (some are dropped)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-model-len", type=int, default=1024)
    add_verbose_flag(parser)
    args = parser.parse_args(argv)
    quiet_after_parse(args)  # libraries at WARNING unless --verbose
    n = generate_prompts(args.target, args.output, args.count, seed=args.seed,
                         max_tokens=args.max_tokens, max_model_len=args.max_model_len,
                         enforce_eager=True)
    print(f"wrote {n} prompts to {args.output}")


if __name__ == "__main__":
    main()
