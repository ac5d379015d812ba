"""Every client connection made on the running event loop inside `closing_connections()` is closed when it exits.

    async with closing_connections():
        ...                     # kopf's watches, `Kube` requests: whatever connects on this loop

aiohttp closes a connection it will not reuse (a watch or a request cancelled before its answer ended) when it
releases it. Over TLS that close is a handshake (our close_notify, then the server's) that needs further turns of
the event loop, and `ClientSession.close()` waits only for the connections the session still holds. A run stopped
in the middle of its watches and requests therefore returns with such handshakes in flight; a caller that closes its
loop at once (`asyncio.run` does) leaves those sockets open until the garbage collector finds them. On exit, every
connection made inside that is not closed yet is aborted, as aiohttp's connector aborts the TLS connections it still
holds when it is closed.

Connections are noted by wrapping the running loop's `create_connection`, through which aiohttp (kopf's client and
`kubernetes_asyncio` alike) opens each one; a loop that does not let that method be replaced is not tracked.
Every connection made on the loop while inside is closed on exit, so the caller owns the loop for that time.

Why this is product code and not a test fixture: it is part of `controller.main.run()`'s contract, that it
leaves no connection to the API server open when it returns. The operator's own process exits right after, so
there it changes nothing; any caller that goes on running in the same process (the tests run the operator
in-process many times; a program embedding `run()`) would otherwise keep sockets to the API server open, with
their TLS sessions, until the garbage collector finds them. Only `run()` knows where its connections begin and
end (kopf opens its watches inside it), so the wrapping stays with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import AsyncIterator
from typing import Any

# The ledgers open on each loop: each notes the transports made while it is entered.
_LEDGERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[weakref.WeakSet[asyncio.Transport]]] = (
    weakref.WeakKeyDictionary()
)


def _track(loop: asyncio.AbstractEventLoop) -> bool:
    """Wrap the loop's `create_connection` (once per loop); False when the loop refuses."""
    create = loop.create_connection

    async def create_connection(*args: Any, **kwargs: Any) -> Any:
        transport, protocol = await create(*args, **kwargs)
        for ledger in _LEDGERS.get(loop, ()):
            ledger.add(transport)
        return transport, protocol

    try:
        loop.create_connection = create_connection  # type: ignore[method-assign]
    except AttributeError:
        return False
    return True


@contextlib.asynccontextmanager
async def closing_connections() -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    ledger: weakref.WeakSet[asyncio.Transport] = weakref.WeakSet()
    ledgers = _LEDGERS.get(loop)
    if ledgers is None:
        if not _track(loop):
            yield
            return
        ledgers = _LEDGERS[loop] = []
    ledgers.append(ledger)
    try:
        yield
    finally:
        ledgers.remove(ledger)
        if not ledgers:
            del _LEDGERS[loop]
            del loop.create_connection  # the loop's own method again
        for transport in list(ledger):
            transport.abort()  # nothing for a connection already closed
        await asyncio.sleep(0)  # an aborted transport closes its socket on the loop's next turn
