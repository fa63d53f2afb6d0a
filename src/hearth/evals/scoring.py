"""Score one eval reply: does the app get an envelope it can use?

Checks, each True/False (None when an earlier failure made it meaningless):

    response       the server answered 2xx with a message
    json           after hearth.envelope.repair (wrapping only), the reply is one JSON object (parse_envelope's
                   reading and its reason); for a kind the app streams (chat), also the one the gateway's stream
                   cuts out (the first object-like span)
    schema         it validates against the kind's model, ignoring emptiness errors
    non_empty      no required string is empty or whitespace
    not_truncated  finish_reason != "length" (a reply cut by max_tokens fails even if it parses)
    expected       case-specific facts hold (the analyst answers as the analyst it was asked to be)

A case passes when every check is True. ``repaired`` records whether repair had to strip wrapping
(fences, think block, chatter): the envelope still counts, but the report shows how often. ``thinking`` records
whether the reply carried a non-empty think block (thinking left on: Qwen3's default, which spends the token
budget before the envelope); a reply cut by max_tokens after or inside one says so in its reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hearth.envelope import EnvelopeError, parse_envelope, repair
from hearth.envelope_stream import STREAMED_KINDS, stream_matches_repair, streamed_cut
from hearth.evals.client import ChatResult
from hearth.evals.suites import Case

CHECKS = ("response", "json", "schema", "non_empty", "not_truncated", "expected")


@dataclass
class CaseScore:
    suite: str
    id: str
    kind: str
    passed: bool
    checks: dict[str, bool | None]
    reason: str | None  # the first failure, in words (None when passed)
    latency_s: float
    status: int | None
    finish_reason: str | None
    repaired: bool
    content: str = field(repr=False, default="")
    sample: int = 0  # which of the --samples replies to this case
    seed: int | None = None  # the seed sent with it
    ttft_s: float | None = None
    usage: dict | None = None
    request: dict | None = None  # the parameters its request was sent with (runner.sent_parameters)
    provider: str | None = None  # hearth's gateway: the provider that answered
    attempts: list | None = None  # hearth's gateway: [provider, outcome] per provider tried or skipped
    thinking: bool = False  # the reply carried a non-empty think block (think_block)
    prompt_chars: int = 0  # characters of every message its request carried (system prompt, history, user turn)

    def to_json(self) -> dict:
        out = asdict(self)
        out["content"] = self.content[:2000]
        out["latency_s"] = round(self.latency_s, 4)
        out["ttft_s"] = round(self.ttft_s, 4) if self.ttft_s is not None else None
        return out


_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
# how a reply that opens with its envelope starts (the object, or a code fence around it)
_ENVELOPE_FIRST = ("{", "```")


def think_block(content: str, reasoning: str | None = None) -> tuple[int, bool] | None:
    """(characters of reasoning, whether the block was closed) when a reply carried a non-empty think block, else
    None. The block is a leading ``<think>...</think>`` (unterminated: cut off while thinking), reasoning ended by
    ``</think>`` with no opening tag (a chat template that opens the block in the prompt), or ``reasoning``: what
    the server sent apart from the content (vLLM's reasoning parser); closed there when content followed it.
    The empty block Qwen3 emits with thinking off is not one."""
    text = content.strip()
    inner, closed = "", True
    if text.startswith(_THINK_OPEN):
        end = text.find(_THINK_CLOSE)
        inner, closed = (text[len(_THINK_OPEN):end], True) if end >= 0 else (text[len(_THINK_OPEN):], False)
    elif (end := text.find(_THINK_CLOSE)) >= 0 and _THINK_OPEN not in text[:end] \
            and not text.startswith(_ENVELOPE_FIRST):  # opening with its envelope: "</think>" is text inside it
        inner = text[:end]
    inner = inner.strip()
    if not inner and reasoning is not None and reasoning.strip():
        inner, closed = reasoning.strip(), bool(text)
    return (len(inner), closed) if inner else None


def score(case: Case, result: ChatResult) -> CaseScore:
    """Score ``result`` as the reply to ``case``. Pure: no I/O."""
    checks: dict[str, bool | None] = dict.fromkeys(CHECKS)
    reasons: list[str] = []
    repaired = False
    checks["response"] = result.error is None and bool(result.content.strip())
    if result.error is not None:
        reasons.append(result.error)
    elif not result.content.strip():
        reasons.append("empty reply")
    checks["not_truncated"] = result.finish_reason != "length" if result.error is None else None
    thought = think_block(result.content, result.reasoning) if result.error is None else None
    if checks["not_truncated"] is False:
        if thought is None:
            reasons.append("truncated (finish_reason=length)")
        else:  # the cause, ahead of what it caused ("empty reply", "unterminated <think> block")
            chars, closed = thought
            reasons.insert(0, f"truncated (finish_reason=length) {'after' if closed else 'inside'} a <think> block "
                              f"of {chars} characters: thinking is on and spent the token budget")

    if checks["response"]:
        # parse_envelope's own verdict, so the eval reads a reply by the rules the app acts on it by: a failure with
        # no field errors is the reply as a whole (not one JSON object), with them the object's fields
        try:
            envelope, failure = parse_envelope(result.content, case.kind), None
        except EnvelopeError as exc:
            envelope, failure = None, exc
        checks["json"] = failure is None or bool(failure.errors)
        if checks["json"]:
            body = repair(result.content)  # cannot fail: parse_envelope got past it
            repaired = body != result.content.strip()  # whitespace around the object is not wrapping
            if envelope is not None and case.kind in STREAMED_KINDS:
                # the gateway's rule for the kinds the app streams (envelope_stream.stream_matches_repair, which the
                # gateway's check_streamed applies): the stream shows the first object-like span and fails when it
                # is not this envelope (a broken draft before it)
                if not stream_matches_repair(result.content):
                    checks["json"], envelope, failure = False, None, None
                    reasons.append(f"the first object-like span ({streamed_cut(result.content)[:80]!r}) is not the "
                                   f"envelope: the app streams {case.kind} replies and would show that span, then "
                                   f"fail the turn")
        else:
            reasons.append(failure.reason)

    if checks["json"]:
        if failure is not None:
            kinds = {e["type"] for e in failure.errors}
            checks["non_empty"] = "string_too_short" not in kinds
            checks["schema"] = kinds <= {"string_too_short"}
            reasons.append(str(failure))
            checks["expected"] = None
        else:
            checks["schema"] = checks["non_empty"] = True
            wrong = {k: v for k, v in case.expect.items() if getattr(envelope, k, None) != v}
            checks["expected"] = not wrong
            if wrong:
                reasons.append("; ".join(f"{k}: expected {v!r}, got {getattr(envelope, k)!r}" for k, v in wrong.items()))
    passed = all(v is True for v in checks.values())
    return CaseScore(suite=case.suite, id=case.id, kind=case.kind, passed=passed, checks=checks,
                     reason=None if passed else (reasons[0] if reasons else "failed"), latency_s=result.latency_s,
                     status=result.status, finish_reason=result.finish_reason, repaired=repaired,
                     content=result.content, ttft_s=result.ttft_s, usage=result.usage, provider=result.provider,
                     attempts=result.attempts, thinking=thought is not None)
