"""Qwen3 chat rendering with thinking disabled, as character spans a loss mask can be built from.

What Qwen3's own chat template produces (enable_thinking=False, no tools), and so what the served
model sees at inference:

    <|im_start|>system\\n{system}<|im_end|>\\n
    <|im_start|>user\\n{user}<|im_end|>\\n
    <|im_start|>assistant\\n{earlier reply}<|im_end|>\\n      <- history: no think block (the template drops it)
    <|im_start|>user\\n{user}<|im_end|>\\n
    <|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n{reply}<|im_end|>\\n   <- the turn being answered

The generation prompt ends with ``<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n``. So one training
example is one assistant turn: the history rendered as above, then that turn with its empty think
block. The trained span is everything after ``<|im_start|>assistant\\n`` up to and including
``<|im_end|>``; the newline after it and everything before are context.

src/hearth/train/data/qwen3_nothink.jinja renders the same text as a Jinja chat template; the tests
check this module against it through ``tokenizer.apply_chat_template``.
"""

from __future__ import annotations

from dataclasses import dataclass

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
EMPTY_THINK = "<think>\n\n</think>\n\n"
# Strings that would tokenize as control tokens if they appeared inside a message.
RESERVED = (IM_START, IM_END, "<think>", "</think>", "<|endoftext|>")


@dataclass(frozen=True)
class Rendered:
    """One rendered training example.

    text:  the whole sequence, ready to tokenize (no BOS: Qwen3 has none).
    spans: [start, end) character ranges of ``text`` that are trained (the assistant reply with its
           empty think block and closing <|im_end|>); everything else is context.
    """

    text: str
    spans: tuple[tuple[int, int], ...]

    @property
    def prompt(self) -> str:
        """The text up to the trained reply, i.e. what a server sends with add_generation_prompt."""
        return self.text[: self.spans[-1][0]] + EMPTY_THINK


def _block(role: str, content: str) -> str:
    return f"{IM_START}{role}\n{content}{IM_END}\n"


def render(system: str, messages: list[dict[str, str]]) -> Rendered:
    """Render ``system`` + ``messages`` (roles user/assistant alternating, starting with user, ending
    with assistant) and mark the LAST assistant turn as trained.

    messages: [{"role": "user"|"assistant", "content": str}, ...]; contents are used verbatim.
    ValueError when the roles do not alternate or a content holds a reserved control string.
    """
    if not messages or messages[-1].get("role") != "assistant":
        raise ValueError("messages must end with an assistant turn")
    for i, message in enumerate(messages):
        expected = "user" if i % 2 == 0 else "assistant"
        if message.get("role") != expected:
            raise ValueError(f"messages[{i}].role must be {expected!r}, got {message.get('role')!r}")
        content = message.get("content")
        if not isinstance(content, str):
            raise TypeError(f"messages[{i}].content must be str")
        for token in RESERVED:
            if token in content:
                raise ValueError(f"messages[{i}].content contains the control string {token!r}")
    if not isinstance(system, str) or not system.strip():
        raise ValueError("system must be a non-empty str")
    for token in RESERVED:
        if token in system:
            raise ValueError(f"system contains the control string {token!r}")
    parts = [_block("system", system)]
    for message in messages[:-1]:
        parts.append(_block(message["role"], message["content"]))
    head = "".join(parts) + f"{IM_START}assistant\n"
    reply = EMPTY_THINK + messages[-1]["content"] + IM_END
    return Rendered(text=head + reply + "\n", spans=((len(head), len(head) + len(reply)),))
