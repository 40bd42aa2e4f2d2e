"""Request bodies before FastAPI sees them: a size limit (413), and JSON taken as JSON whatever
the Content-Type says. curl -d sends application/x-www-form-urlencoded and some clients send
none; the endpoints only take JSON, so such a body is read as JSON instead of failing with a
misleading "Input should be a valid dictionary"."""

from __future__ import annotations

from typing import Any

from .errors import error_response
from .metrics import Metrics

JSON_TYPES = (b"application/json",)


class BodyMiddleware:
    def __init__(self, app: Any, max_bytes: int, metrics: Metrics):
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more:  # the endpoints parse whole bodies anyway: read it here, counting
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if ctype not in JSON_TYPES and scope["path"].startswith("/v1/"):
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-type"] + [
                (b"content-type", b"application/json")]
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect, when it comes

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Any, receive: Any, send: Any) -> None:
        self.metrics.requests.labels(scope["path"], "413").inc()
        response = error_response(413, f"The request body is larger than {self.max_bytes} bytes; send less, or "
                                  "start the server with a larger --max-body-mb.", code="request_too_large")
        await response(scope, receive, send)
