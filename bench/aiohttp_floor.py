"""The floor for any router built on aiohttp: the same HTTP calls as an EPD router, no logic.

Forwards the client's body unchanged to the encoder, then the prefill (E/P/D), then the
decode, relaying a stream chunk by chunk. It parses nothing, rewrites nothing, picks
nothing, so the gap between it and a real aiohttp router is that router's own logic, and
the gap between it and the direct contender is what aiohttp itself costs.

    python -m bench.aiohttp_floor --port P --encoder URL [--prefill URL] --decode URL
"""

from __future__ import annotations

import sys

import aiohttp
from aiohttp import web

from .contenders import parse_floor_args

CHAT = "/v1/chat/completions"
JSON = {"Content-Type": "application/json"}


def build_app(encoder: str, prefill: str | None, decode: str) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        session: aiohttp.ClientSession = request.app["session"]
        for upstream in (encoder, prefill):
            if upstream:
                async with session.post(upstream + CHAT, data=body, headers=JSON) as r:
                    await r.read()
        async with session.post(decode + CHAT, data=body, headers=JSON) as r:
            if r.content_type != "text/event-stream":
                return web.Response(body=await r.read(), status=r.status, content_type=r.content_type)
            out = web.StreamResponse(status=r.status, headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            async for chunk in r.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def open_session(app: web.Application) -> None:
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def close_session(app: web.Application) -> None:
        await app["session"].close()

    app = web.Application()
    app.router.add_post(CHAT, chat)
    app.router.add_get("/health", health)
    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    return app


def main(argv: list[str] | None = None) -> None:
    args = parse_floor_args(__doc__.splitlines()[0], argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    web.run_app(
        build_app(args.encoder, args.prefill, args.decode), host=args.host, port=args.port, access_log=None, print=None
    )


if __name__ == "__main__":
    sys.exit(main())
