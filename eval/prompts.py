"""Conversation -> prompt token ids: the chat template (thinking off) and right truncation.

Truncation rule (SPEED-Bench throughput split, any benchmark alike): a prompt longer than
`max_prompt_tokens` (= the engine's max_model_len minus the generation cap, so the whole generation
budget fits) loses tokens from the right end of its last user message; the template around it
(earlier turns, the assistant header that opens the answer) is kept. Shorter prompts are left
unchanged. If the kept template alone is too long (a later turn of a conversation whose history
fills the limit), the prompt keeps its newest `max_prompt_tokens` tokens instead: the last user
turn and the assistant header stay, so the model still answers that turn.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHAT = "chat"
RAW = "raw"
PROMPT_FORMATS = (CHAT, RAW)
NO_THINKING = {"enable_thinking": False}


def template_kwargs(tokenizer) -> dict:
    """`enable_thinking=False` where the chat template reads it, nothing otherwise."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates
        template = " ".join(template.values())
    return dict(NO_THINKING) if "enable_thinking" in template else {}


@dataclass
class PromptRenderer:
    """Callable: messages [{"role", "content"}, ...] ending with a user turn -> prompt ids.

    tokenizer: a Hugging Face tokenizer of the target. prompt_format: "chat" (the tokenizer's chat
    template, generation prompt added) or "raw" (the single user turn as plain text, for base
    models; multi-turn conversations are refused). max_prompt_tokens: the truncation limit.
    """

    tokenizer: object
    prompt_format: str = CHAT
    max_prompt_tokens: int | None = None
    chat_kwargs: dict = field(default_factory=dict)
    num_truncated: int = 0

    def __post_init__(self):
        if self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"prompt_format = {self.prompt_format!r}; use one of {PROMPT_FORMATS}")
        if self.prompt_format == CHAT:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("the target's tokenizer has no chat template; pass "
                                 "--prompt-format raw for a base model")
            self.chat_kwargs = template_kwargs(self.tokenizer)

    def __call__(self, messages: list[dict[str, str]]) -> list[int]:
        if self.prompt_format == RAW:
            if len(messages) != 1:
                raise ValueError("--prompt-format raw takes single-turn prompts only; use the chat "
                                 "format for multi-turn benchmarks")
            ids = self.tokenizer.encode(messages[0]["content"], add_special_tokens=True)
            return self._cut(ids)
        text = self.template(messages)
        ids = self._encode(text)
        limit = self.max_prompt_tokens
        if limit is None or len(ids) <= limit:
            return ids
        self.num_truncated += 1
        content = messages[-1]["content"]
        at = text.rfind(content)
        if at < 0:  # the template rewrote the message: no clean place to cut
            return ids[:limit]
        head = self._encode(text[:at])
        tail = self._encode(text[at + len(content):])
        keep = limit - len(head) - len(tail)
        if keep <= 0:  # the history alone is too long: drop its oldest tokens instead
            return ids[-limit:]
        return head + self._encode(content)[:keep] + tail

    def template(self, messages: list[dict[str, str]]) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.chat_kwargs
        )

    def _encode(self, text: str) -> list[int]:
        # The template writes any special tokens itself (as vLLM's chat path does).
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _cut(self, ids: list[int]) -> list[int]:
        limit = self.max_prompt_tokens
        if limit is not None and len(ids) > limit:
            self.num_truncated += 1
            return ids[:limit]
        return ids
