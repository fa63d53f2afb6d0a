"""Pull the ``"message"`` string out of a chat envelope while its JSON is still streaming in.

The model streams the whole envelope (``{"message": "Hi...", "mood": ...}``); the user should see
the message grow, not raw JSON. :class:`MessageStream` is fed the text deltas and returns the newly
decoded characters of the top-level ``message`` value (escapes decoded; an escape split across two
deltas waits for the rest). What it shows is only a preview: the saved reply is always the envelope
the gateway validated at the end.

Half of a UTF-16 surrogate pair (JSON allows a lone ``\ud83d`` escape: a model cut inside an emoji) is shown as
U+FFFD: no UTF-8 event can carry it, and the envelope check at the end refuses the reply anyway.
"""

from __future__ import annotations

import re

_KEY = re.compile(r'"message"\s*:\s*"')
_SIMPLE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_HIGH = re.compile(r"[\ud800-\udbff]")
_HEX4 = re.compile(r"[0-9a-fA-F]{4}")


def _whole(text: str) -> str:
    """``text`` with each surrogate pair made one character and each lone half U+FFFD."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


class MessageStream:
    def __init__(self) -> None:
        self._buf = ""
        self._pos: int | None = None  # index in _buf of the next undecoded character of the value
        self._held = ""  # a decoded high surrogate at the end of the last output: its low half may come next
        self.done = False

    def feed(self, delta: str) -> str:
        """Add ``delta``; return the message characters it completed ("" when none)."""
        if self.done:
            return ""
        self._buf += delta
        if self._pos is None:
            m = _KEY.search(self._buf)
            if m is None:
                return ""
            self._pos = m.end()
        out = []
        buf, i = self._buf, self._pos
        while i < len(buf):
            ch = buf[i]
            if ch == '"':
                self.done = True
                i += 1
                break
            if ch != "\\":
                out.append(ch)
                i += 1
                continue
            if i + 1 >= len(buf):
                break  # escape split across deltas
            esc = buf[i + 1]
            if esc in _SIMPLE:
                out.append(_SIMPLE[esc])
                i += 2
            elif esc == "u":
                if i + 6 > len(buf):
                    break
                if not _HEX4.fullmatch(buf[i + 2:i + 6]):  # not four hex digits: shown raw, as another invalid escape
                    out.append(esc)
                    i += 2
                    continue
                code = int(buf[i + 2:i + 6], 16)
                # a high half waits for what follows it while that may still be its low half's escape; the pair
                # (or a lone half) is made whole, or U+FFFD, below
                if 0xD800 <= code <= 0xDBFF and i + 12 > len(buf) and "\\u".startswith(buf[i + 6:i + 8]):
                    break
                out.append(chr(code))
                i += 6
            else:  # invalid escape: show it raw; the envelope check at the end decides
                out.append(esc)
                i += 2
        self._pos = i
        text = self._held + "".join(out)
        self._held = ""
        if not self.done and text and _HIGH.fullmatch(text[-1]):  # its low half may come with the next delta
            text, self._held = text[:-1], text[-1]
        return _whole(text)
