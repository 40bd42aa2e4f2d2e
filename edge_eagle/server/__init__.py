"""`edge-eagle serve`: an OpenAI-compatible HTTP server over one EdgeEagle engine."""

from .app import ServerOptions, create_app  # noqa: F401

__all__ = ["ServerOptions", "create_app"]
