"""The ASGI middleware around every request: its start time (for the request timeout), the body
size limit (declared and streamed), API keys, refusing new predictions while shutting down, a JSON
500 for anything unexpected (one line; the traceback goes to the log), and the request metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from xtransformer.serve.auth import authorized
from xtransformer.serve.errors import json_error
from xtransformer.serve.state import ServerState

log = logging.getLogger(__name__)
# the paths the request metrics name; anything else is counted as "other"
ROUTES = ("/", "/predict", "/health", "/ready", "/metrics", "/labels", "/openapi.json", "/docs")


def _body_too_large(limit: int) -> Exception:
    """Raised from ``receive`` as the body arrives: an HTTPException, so FastAPI passes it on as is."""
    from starlette.exceptions import HTTPException

    exc = HTTPException(413, f"request body exceeds the limit of {limit} bytes")
    exc.field = "body"  # type: ignore[attr-defined]
    return exc


class Guard:
    """Pure ASGI middleware (``app.add_middleware(Guard, server=state)``)."""

    def __init__(self, app: Any, server: ServerState):
        self.app = app
        self.s = server

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        s = self.s
        t0 = time.monotonic()
        scope["xmc_t0"] = asyncio.get_running_loop().time()
        path = scope.get("path", "")
        status = [0]

        async def send_status(message: dict) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if s.draining:
                    message.setdefault("headers", [])
                    message["headers"] = [*message["headers"], (b"connection", b"close")]
            await send(message)

        try:
            response = self._refuse(scope, path)
            if response is not None:
                return await response(scope, receive, send_status)
            limit, seen = s.limits.max_body_bytes, 0

            async def receive_limited() -> dict:
                nonlocal seen
                message = await receive()
                if message["type"] == "http.request":
                    seen += len(message.get("body", b""))
                    if seen > limit:
                        raise _body_too_large(limit)
                return message

            await self.app(scope, receive_limited, send_status)
        except Exception:
            log.exception("error while answering %s %s", scope.get("method"), path)
            if not status[0]:
                await json_error(500, "internal error (the server log has the details)")(scope, receive, send_status)
        finally:
            s.metrics.request(path if path in ROUTES else "other", status[0] or 500, time.monotonic() - t0)

    def _refuse(self, scope: dict, path: str) -> Any:
        """The answer to a request refused before the app sees it (None: let it through)."""
        s = self.s
        if not authorized(scope, s.key_hashes):
            return json_error(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>'",
                "Authorization",
                {"WWW-Authenticate": "Bearer"},
            )
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                size = value.decode("latin-1").strip()
                if not size.isdigit():
                    return json_error(400, f"bad Content-Length {size!r}", "Content-Length")
                if int(size) > s.limits.max_body_bytes:
                    return json_error(
                        413, f"request body of {size} bytes exceeds the limit of {s.limits.max_body_bytes}", "body"
                    )
        if s.draining and path == "/predict":
            s.metrics.reject("draining")
            return json_error(503, "the server is shutting down; retry on another instance", None, {"Retry-After": "1"})
        return None
