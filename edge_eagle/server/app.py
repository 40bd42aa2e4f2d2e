"""The ASGI app (FastAPI): /v1/models, /v1/chat/completions, /v1/completions, /health, /metrics,
/openapi.json.

Responses carry OpenAI's `usage`, an `edge_eagle` object with the acceptance figures, and
llama-server's `timings` (draft_n, draft_n_accepted, ...) so clients that read those work.
Errors are OpenAI-shaped JSON: {"error": {"message", "type", "param", "code"}}.

The pieces: state.py (options, the per-app state), routes.py (the endpoints), generation.py
(queueing, streaming), responses.py (the bodies), errors.py (error handling), auth.py (the
API key), body.py (the body-size limit, JSON whatever the Content-Type)."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from ..api import EdgeEagle
from .auth import ApiKeyMiddleware
from .body import BodyMiddleware
from .errors import add_error_handlers
from .routes import router
from .state import ServerOptions, ServerState

__all__ = ["ServerOptions", "create_app"]


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    yield
    app.state.server.close()


def create_app(engine: EdgeEagle, options: ServerOptions | None = None) -> FastAPI:
    """The app over one engine (which it does not close)."""
    state = ServerState(engine, options)
    app = FastAPI(title="edge-eagle", docs_url=None, redoc_url=None, openapi_url="/openapi.json", lifespan=_lifespan)
    app.state.server = state
    # kept as before for callers that read them (the CLI prints model_id)
    app.state.worker, app.state.metrics, app.state.model_id = state.worker, state.metrics, state.model_id
    opts = state.options
    app.add_middleware(BodyMiddleware, max_bytes=opts.max_body_bytes, metrics=state.metrics)
    if opts.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, key=opts.api_key, metrics=state.metrics)
    if opts.cors_origins:  # added last, so outermost: a 401 carries CORS headers too
        app.add_middleware(CORSMiddleware, allow_origins=list(opts.cors_origins), allow_methods=["*"],
                           allow_headers=["*"])
    add_error_handlers(app)
    app.include_router(router)
    return app
