"""The API key. It is checked by an ASGI middleware rather than a route dependency because
FastAPI reads and validates a request's body before it solves the route's dependencies: a
middleware refuses a caller without the key before any of its body is read or parsed."""

from __future__ import annotations

import hmac
from typing import Any

from .errors import error_response
from .metrics import Metrics

OPEN_PATHS = ("/health",)  # liveness probes need no key


class ApiKeyMiddleware:
    """Every endpoint but /health (and CORS preflights) needs 'Authorization: Bearer KEY',
    compared in constant time; checked before the body is read."""

    def __init__(self, app: Any, key: str, metrics: Metrics):
        self.app, self.key, self.metrics = app, key.encode(), metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and scope["method"] != "OPTIONS":
            header = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, given = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.key):
                self.metrics.requests.labels(scope["path"], "401").inc()
                response = error_response(401, "Missing or wrong API key; send the header "
                                          "'Authorization: Bearer <key>'.", code="invalid_api_key",
                                          headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
