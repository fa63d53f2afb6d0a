"""What a streaming client receives: the text of the reply's JSON object, cut out on the fly.

Models wrap the envelope: Qwen3 opens with a ``<think>...</think>`` block (empty when thinking is
off), others put it in a ```` ```json ```` fence or add a sentence before or after. The non-streaming
path removes that wrapping with hearth.envelope.repair; EnvelopeFilter does the same to a stream,
delta by delta, so the client never sees the wrapping:

    * leading whitespace and ONE leading ``<think>...</think>`` block are dropped (held back while the
      text could still be the start of ``<think>``);
    * everything before the first ``{`` that starts like a JSON object (``{`` then JSON whitespace then
      ``"``, as repair() tells an object from chatter) is dropped (fences, "Here you go:", "in the format
      {message, mood}:");
    * from that ``{`` the text passes through as it arrives, until the brace that closes it (braces
      inside JSON strings do not count);
    * everything after it is dropped (the closing fence, remarks).

So the concatenated deltas are the envelope's JSON text exactly as the model wrote it. The chain
checks at the end that this text is what repair() makes of the whole reply, and that it validates
(the final chunk carries the validated envelope); when not, the stream ends with an error event.

That comparison is the streamed envelope rule, made in one place (stream_matches_repair): by the gateway's
check_streamed (hearth.gateway.streamfilter, which raises its InvalidResponse), i.e. by Chain.stream on what it
showed, by Chain.complete for STREAMED_KINDS (a reply the stream would fail is invalid there too, so the chain
falls back and counts it against the provider) and by the app for a backend other than the chain; and by the
eval's scoring. It lives here, beside hearth.envelope and importing nothing else of hearth, so the evals (a layer
below the gateway) use the same code without importing the gateway.
"""

from __future__ import annotations

from hearth.envelope import repair, scan_object

__all__ = ["EnvelopeFilter", "STREAMED_KINDS", "stream_matches_repair", "streamed_cut"]

# The kinds the app asks for streamed (app/routes/_util.reply_events: chat turns and rehearsals). Feed comments
# and analyst readings come in one piece: repair's reading alone, a broken draft before their envelope is chatter.
STREAMED_KINDS = frozenset({"chat"})

_OPEN, _CLOSE = "<think>", "</think>"
_JSON_SPACE = " \t\n\r"


class EnvelopeFilter:
    __slots__ = ("_state", "_held", "_depth", "_in_string", "_escaped", "emitted")

    def __init__(self) -> None:
        self._state = "start"      # start | think | before | object | after
        self._held = ""
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self.emitted: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self.emitted)

    @property
    def complete(self) -> bool:
        """The object's closing brace has passed."""
        return self._state == "after"

    def feed(self, delta: str) -> str:
        """Add a delta of the raw reply; return the part of it the client may see ("" when none)."""
        text = self._held + delta
        self._held = ""
        if self._state == "start":
            text = text.lstrip()
            if not text:
                return ""
            if len(text) < len(_OPEN) and _OPEN.startswith(text):
                self._held = text        # could still become "<think>"
                return ""
            if text.startswith(_OPEN):
                self._state, text = "think", text[len(_OPEN):]
            else:
                self._state = "before"
        if self._state == "think":
            end = text.find(_CLOSE)
            if end < 0:
                self._held = text[-(len(_CLOSE) - 1):]   # a closing tag split across deltas
                return ""
            self._state, text = "before", text[end + len(_CLOSE):]
        if self._state == "before":
            # the object starts at a "{" followed (after JSON whitespace) by '"', as repair() tells a JSON object
            # from chatter such as "in the format {message, mood}:": a brace of chatter is dropped, not shown
            while True:
                start = text.find("{")
                if start < 0:
                    return ""
                after = text[start + 1:].lstrip(_JSON_SPACE)
                if not after:
                    self._held = text[start:]   # the next delta says which it is
                    return ""
                if after[0] == '"':
                    break
                text = text[start + 1:]
            self._state, text = "object", text[start:]
        if self._state != "object":
            return ""
        out = self._scan(text)
        if out:
            self.emitted.append(out)
        return out

    def _scan(self, text: str) -> str:
        end, self._depth, self._in_string, self._escaped = scan_object(
            text, 0, self._depth, self._in_string, self._escaped)
        if end < 0:
            return text
        self._state = "after"
        return text[:end]


def streamed_cut(text: str) -> str:
    """What a stream of the reply `text` shows: its envelope's text as EnvelopeFilter cuts it out ("" when none).
    TypeError when `text` is not a str."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    cut = EnvelopeFilter()
    cut.feed(text)
    return cut.text


def stream_matches_repair(text: str, *, shown: str | None = None) -> bool:
    """Whether a stream of the reply `text` holds: what it shows (`shown`, as a stream showed it; None:
    streamed_cut(text)) is what repair() makes of the whole reply. False for a broken object-like span (a draft, an
    echoed format) before the envelope, which repair skips as chatter: a stream shows that span, then fails.

    For a reply whose envelope parsed (repair raises EnvelopeError on one it would have to guess at). TypeError
    when `text` is not a str."""
    cut = streamed_cut(text) if shown is None else shown
    return cut == repair(text)
