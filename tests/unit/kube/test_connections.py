"""`closing_connections()` bookkeeping without a connection (kube/connections.py): nested use keeps the loop's
wrapper until the outermost exits, and a loop that refuses the wrapper is left alone. Connections really
closed: tests/loopback/kube/test_connections.py."""

from __future__ import annotations

import asyncio

from epd_operator.kube import closing_connections, connections


async def test_nested_ledgers_keep_the_wrapper_until_the_outermost_exits():
    loop = asyncio.get_running_loop()
    async with closing_connections():
        wrapper = vars(loop)["create_connection"]
        assert len(connections._LEDGERS[loop]) == 1
        async with closing_connections():
            assert vars(loop)["create_connection"] is wrapper  # wrapped once
            assert len(connections._LEDGERS[loop]) == 2
        assert vars(loop)["create_connection"] is wrapper
        assert len(connections._LEDGERS[loop]) == 1
    assert "create_connection" not in vars(loop)
    assert loop not in connections._LEDGERS


def test_a_loop_that_refuses_the_wrapper_is_not_tracked():
    async def inside() -> bool:
        async with closing_connections():
            return asyncio.get_running_loop() in connections._LEDGERS

    class Sealed(asyncio.SelectorEventLoop):
        """A loop whose methods cannot be replaced (as in loops implemented in C)."""

        def __setattr__(self, name: str, value: object) -> None:
            if name == "create_connection":
                raise AttributeError(name)
            super().__setattr__(name, value)

    with asyncio.Runner(loop_factory=Sealed) as runner:
        assert runner.run(inside()) is False


async def test_a_connection_completing_after_every_ledger_closed_is_handed_over():
    class Loop:
        async def create_connection(self, *args, **kwargs):
            return "transport", "protocol"

    loop = Loop()
    assert connections._track(loop)  # type: ignore[arg-type]
    # began inside a ledger, finished after it closed: nobody tracks it, and the caller gets it
    assert await loop.create_connection() == ("transport", "protocol")
