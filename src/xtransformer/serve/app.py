"""The FastAPI app serving one model: :func:`create_app` wires the batcher, the metrics, the routes,
the error bodies, the guard and the OpenAPI schema (FastAPI is imported here, when an app is built)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from xtransformer.serve.auth import add_bearer_security
from xtransformer.serve.batching import MicroBatcher
from xtransformer.serve.errors import add_error_handlers
from xtransformer.serve.guard import Guard
from xtransformer.serve.limits import Limits
from xtransformer.serve.metrics import ServeMetrics
from xtransformer.serve.routes import info_routes, predict_route, status_routes
from xtransformer.serve.schemas import api_schemas
from xtransformer.serve.state import Served, ServerState

log = logging.getLogger(__name__)


def create_app(
    model: Any,
    limits: Limits | None = None,
    api_keys: Sequence[bytes] | None = None,
    workers: int = 1,
) -> Any:
    """The FastAPI app serving ``model`` (an :class:`xtransformer.model.XMCModel`); ``api_keys``:
    sha256 digests of the accepted keys (:func:`~xtransformer.serve.auth.read_api_keys`), none: no
    keys needed; ``workers``: forward passes at once, in worker processes forked here (1: a thread
    of this process)."""
    from fastapi import FastAPI

    srv = _served(model, limits or Limits(), api_keys, workers)
    app = FastAPI(
        title="xtransformer model server",
        version=str(srv.manifest.get("library_version", "unknown")),
        description=f"{model.method} model, {model.n_labels} labels",
        lifespan=_lifespan(srv),
    )
    app.state.batcher = srv.batcher
    app.state.server = srv.state
    add_error_handlers(app)
    predict_route(app, srv)
    status_routes(app, srv)
    info_routes(app, srv)
    app.openapi = lambda: _openapi(app, srv.state)
    app.add_middleware(Guard, server=srv.state)
    return app


def _served(model: Any, limits: Limits, api_keys: Sequence[bytes] | None, workers: int) -> Served:
    """The checked limits, the metrics and the batcher (its worker processes forked now) of one app."""
    limits.check()
    metrics = ServeMetrics()
    batcher = MicroBatcher(
        model,
        max_batch=limits.max_batch,
        max_queue=limits.max_queue,
        request_timeout=limits.request_timeout,
        metrics=metrics,
        workers=workers,
    )
    manifest = getattr(model, "manifest", None) or {}  # not part of the model's promised surface: optional
    state = ServerState(limits, metrics, list(api_keys or []))
    srv = Served(model, batcher, limits, metrics, state, manifest, {"ready": False}, api_schemas(limits))
    metrics.watch(batcher, model, lambda: srv.is_ready()[0])
    return srv


def _lifespan(srv: Served) -> Any:
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: Any):
        await srv.batcher.start()
        try:  # the first pass pays for lazy imports and allocations, not the first client
            await srv.batcher.predict(["warm up"], 1)
        except Exception as e:
            log.warning("warm-up prediction failed: %s", e)
        srv.loaded["ready"] = True
        yield
        srv.loaded["ready"] = False
        await srv.batcher.stop()

    return lifespan


def _openapi(app: Any, state: ServerState) -> dict[str, Any]:
    """The schema, with the keys (when required) as a bearer security scheme of the guarded paths."""
    from fastapi.openapi.utils import get_openapi

    if app.openapi_schema is None:
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        if state.key_hashes:
            add_bearer_security(schema)
        app.openapi_schema = schema
    return app.openapi_schema
