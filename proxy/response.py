"""The response the tap writes downstream: the upstream's head, and nothing aiohttp would add.

aiohttp's ``StreamResponse`` fills in ``Date``, ``Server`` and a default ``Content-Type`` when a response
has none. A direct connection to an upstream that sends none of them would not show them, so a tap
that added them would alter what passes through it. :class:`RelayedResponse` lets aiohttp prepare
the head as usual (framing, keep-alive) and then takes back exactly the defaults it added.
"""

from __future__ import annotations

from aiohttp import hdrs, web

_AIOHTTP_DEFAULTS = (hdrs.DATE, hdrs.SERVER, hdrs.CONTENT_TYPE)


class RelayedResponse(web.StreamResponse):
    async def _prepare_headers(self) -> None:
        sent_by_upstream = {name for name in _AIOHTTP_DEFAULTS if name in self.headers}
        await super()._prepare_headers()
        for name in _AIOHTTP_DEFAULTS:
            if name not in sent_by_upstream:
                self.headers.popall(name, None)
