"""OpenAI-shaped errors: APIError, which routes raise, and the exception handlers that turn it,
invalid request bodies and unknown paths into {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .responses import error_body
from .state import get_state


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers


def error_response(status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                   code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, type_, param, code), status_code=status, headers=headers)


async def _api_error(request: Request, exc: APIError) -> JSONResponse:
    get_state(request).metrics.requests.labels(request.url.path, str(exc.status)).inc()
    return error_response(exc.status, exc.message, exc.type, exc.param, exc.code, exc.headers)


async def _invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
    get_state(request).metrics.requests.labels(request.url.path, "400").inc()
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":
        return error_response(400, "The request body is not valid JSON; send a JSON object.")
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if not loc and ": " in msg:  # a check of the whole body names its field first ("tools: ...")
        field, _, msg = msg.partition(": ")
        loc = [field]
    where = ".".join(loc) or "body"
    return error_response(400, f"Invalid '{where}': {msg}; fix it and retry.", param=where)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    path = request.url.path if exc.status_code != 404 else "(unknown)"  # no label per probed path
    get_state(request).metrics.requests.labels(path, str(exc.status_code)).inc()
    return error_response(exc.status_code, f"{exc.detail}; see GET /v1/models and the README for the endpoints.",
                          code=str(exc.status_code), headers=getattr(exc, "headers", None))  # 405: Allow


def add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _invalid_body)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
