"""The gateway's form of the streamed envelope rule: check_streamed raises the gateway's InvalidResponse.

The cut itself (EnvelopeFilter, streamed_cut, STREAMED_KINDS) and the comparison (stream_matches_repair) live in
hearth.envelope_stream, below the gateway, so the evals use the same code; they are imported here under their
names. check_streamed is called by Chain.stream on what it showed, by Chain.complete for STREAMED_KINDS (a reply
the stream would fail is invalid there too, so the chain falls back and counts it against the provider), and by
the app for a backend other than the chain.
"""

from __future__ import annotations

from hearth.envelope_stream import STREAMED_KINDS, EnvelopeFilter, stream_matches_repair, streamed_cut
from hearth.gateway.errors import InvalidResponse

__all__ = ["EnvelopeFilter", "STREAMED_KINDS", "check_streamed", "streamed_cut"]


def check_streamed(text: str, provider: str, *, shown: str | None = None) -> None:
    """Raise InvalidResponse(provider) when the reply `text` is one a stream fails: what the stream shows of it
    (`shown`, as a stream showed it; None: streamed_cut(text)) is not what repair() makes of the whole reply, i.e.
    a broken object-like span (a draft, an echoed format) before the envelope, which repair skips as chatter.

    For a reply whose envelope parsed (repair raises EnvelopeError on one it would have to guess at). TypeError
    when `text` is not a str."""
    if not stream_matches_repair(text, shown=shown):
        raise InvalidResponse(provider, "the reply's first object-like span is not its envelope (a broken draft "
                                        "before it): a stream shows that span, then fails")
