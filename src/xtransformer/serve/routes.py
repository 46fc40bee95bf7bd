"""The routes: ``POST /predict``, ``/health``, ``/ready``, ``/metrics``, ``/labels`` and the page at ``/``."""

# no `from __future__ import annotations`: FastAPI reads the request model from the real annotation
import asyncio
from typing import Any

from xtransformer.serve.batching import Ask
from xtransformer.serve.errors import json_error
from xtransformer.serve.limits import QueueFull, RequestTimeout
from xtransformer.serve.metrics import CONTENT_TYPE
from xtransformer.serve.state import Served

PAGE = "page.html"  # beside this module, shipped as package data


def _valid_unicode(text: str) -> str:
    """``text`` with lone surrogates (JSON allows ``"\\ud800"``; tokenizers do not) replaced by '?'."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")


def _size_error(req: Any, limits: Any) -> Any:
    """The 413 / 422 of a request over the limits (None: within them)."""
    if len(req.texts) > limits.max_texts:
        return json_error(413, f"{len(req.texts)} texts in one request; the limit is {limits.max_texts}", "texts")
    for i, text in enumerate(req.texts):
        if len(text) > limits.max_text_chars:
            return json_error(
                413, f"texts[{i}] has {len(text)} characters; the limit is {limits.max_text_chars}", f"texts[{i}]"
            )
    if not 1 <= req.k <= limits.max_k:
        return json_error(422, f"k must be between 1 and {limits.max_k}, got {req.k}", "k")
    return None


def predict_route(app: Any, srv: Served) -> None:
    from fastapi import Request
    from fastapi.responses import JSONResponse

    limits, S = srv.limits, srv.schemas
    PredictRequest = S.PredictRequest

    @app.post("/predict", response_model=S.PredictResponse, responses=srv.errors(400, 401, 413, 422, 503, 504))
    async def predict(req: PredictRequest, request: Request) -> Any:
        too_big = _size_error(req, limits)
        if too_big is not None:
            return too_big
        fields = req.decision_fields()
        try:
            decide = Ask.of(srv.model, fields)
        except ValueError as e:  # no calibrator, or a value out of range: the message names the field
            where = next((k for k in fields if str(e).startswith(k)), "body")
            return json_error(422, str(e), where)
        t0 = request.scope.get("xmc_t0") or asyncio.get_running_loop().time()
        try:
            rows = await srv.batcher.predict(
                [_valid_unicode(t) for t in req.texts], req.k, deadline=t0 + limits.request_timeout, decide=decide
            )
        except QueueFull as e:
            srv.metrics.reject("queue_full")
            return json_error(503, str(e), None, {"Retry-After": str(e.retry_after)})
        except RequestTimeout as e:
            srv.metrics.reject("timeout")
            return json_error(504, str(e))
        return JSONResponse({"predictions": rows})


def _health(srv: Served) -> dict[str, Any]:
    model, batcher, limits = srv.model, srv.batcher, srv.limits
    return {
        "status": "ok",
        "method": model.method,
        "workers": batcher.workers,
        "n_labels": model.n_labels,
        "calibrated": bool(getattr(model, "decides", False)),
        "abilities": sorted(str(a) for a in getattr(model, "abilities", ())),  # what else the model can do
        "format_version": srv.manifest.get("format_version"),
        "batching": dict(batcher.stats),
        "queue_texts": batcher.queued_texts,
        "auth": bool(srv.state.key_hashes),
        "limits": {
            "max_texts": limits.max_texts,
            "max_text_chars": limits.max_text_chars,
            "max_k": limits.max_k,
            "max_queue": limits.max_queue,
            "request_timeout": limits.request_timeout,
        },
    }


def status_routes(app: Any, srv: Served) -> None:
    """``/health``, ``/ready`` and ``/metrics``."""
    from fastapi.responses import JSONResponse, PlainTextResponse

    batcher = srv.batcher

    @app.get("/health", responses={503: {"model": srv.schemas.Error, "description": "a model worker died"}})
    async def health() -> Any:
        """Liveness: the process answers and its model workers live (200 whatever the queue)."""
        if not batcher.alive:
            return json_error(503, "a model worker died; restart the server")
        return _health(srv)

    @app.get("/ready", responses={503: {"model": srv.schemas.Error, "description": "not ready"}})
    async def ready() -> Any:
        """Readiness: the model is loaded, the queue is below its limit and the server is not shutting down."""
        ok, why = srv.is_ready()
        body = {"ready": ok, "queue_texts": batcher.queued_texts, "max_queue": batcher.max_queue}
        return JSONResponse(body) if ok else JSONResponse({"error": why, **body}, status_code=503)

    @app.get("/metrics", response_class=PlainTextResponse, responses=srv.errors(401))
    async def prometheus() -> PlainTextResponse:
        """Prometheus text format: requests, texts, batch sizes, queue depth, latency histograms,
        this process and its model workers."""
        return PlainTextResponse(srv.metrics.render(), media_type=CONTENT_TYPE)


def info_routes(app: Any, srv: Served) -> None:
    """``/labels`` (the label space, paged) and the page at ``/``."""
    from fastapi import Query
    from fastapi.responses import HTMLResponse

    model = srv.model

    @app.get("/labels", responses=srv.errors(401, 422))
    async def labels(
        offset: int = Query(0, ge=0, description="first label index"),
        limit: int | None = Query(None, ge=0, description="labels to return (default: all)"),
    ) -> dict[str, Any]:
        end = None if limit is None else offset + limit
        return {
            "n_labels": model.n_labels,
            "offset": offset,
            "ids": model.label_ids[offset:end],
            "names": model.label_names[offset:end],
        }

    page = page_html()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(page)


def page_html() -> str:
    from importlib.resources import files

    return files(__package__).joinpath(PAGE).read_text(encoding="utf-8")
