"""Pull the ``"message"`` string out of a chat envelope while its JSON is still streaming in.

The model streams the whole envelope (``{"message": "Hi...", "mood": ...}``); the user should see
the message grow, not raw JSON. :class:`MessageStream` is fed the text deltas and returns the newly
decoded characters of the top-level ``message`` value (escapes decoded; an escape split across two
deltas waits for the rest). What it shows is only a preview: the saved reply is always the envelope
the gateway validated at the end.
"""

from __future__ import annotations

import json
import re

_KEY = re.compile(r'"message"\s*:\s*"')
_SIMPLE = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class MessageStream:
    def __init__(self) -> None:
        self._buf = ""
        self._pos: int | None = None  # index in _buf of the next undecoded character of the value
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
                # surrogate pairs arrive as two \\u escapes; json decodes the pair when both are present
                if 0xD800 <= int(buf[i + 2:i + 6], 16) <= 0xDBFF:
                    if i + 12 > len(buf):
                        break
                    out.append(json.loads(f'"{buf[i:i + 12]}"'))
                    i += 12
                else:
                    out.append(chr(int(buf[i + 2:i + 6], 16)))
                    i += 6
            else:  # invalid escape: show it raw; the envelope check at the end decides
                out.append(esc)
                i += 2
        self._pos = i
        return "".join(out)
