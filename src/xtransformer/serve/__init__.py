"""HTTP server for a saved model folder (FastAPI + uvicorn).

    xmc-serve --model outputs/train/runs/<date>/model                        # 127.0.0.1:8000
    xmc-serve --model RUN/model --host 0.0.0.0 --api-key-file keys.txt        # reachable, with keys

Endpoints: ``POST /predict`` ``{"texts": [...], "k": 5}`` -> ``{"predictions": [{labels, names,
scores}, ...]}`` (a calibrated model adds ``probabilities``, and takes ``decision``,
``threshold``, ``min_labels``, ``max_labels``: the decided labels instead of the k best);
``GET /`` a page to try the model; ``GET /health`` (liveness), ``GET /ready`` (model loaded,
queue below its limit, not shutting down), ``GET /metrics`` (Prometheus text format),
``GET /labels``; OpenAPI at ``/openapi.json`` and ``/docs``.

Under load: one worker thread runs the model; while it is busy, arriving requests queue and the
next forward pass takes all of them at once (up to ``--max-batch`` texts), so a lone request never
waits for company and many small requests share few passes. The queue is bounded
(``--max-queue`` texts): a request that does not fit is refused at once with ``503`` and
``Retry-After``, and so is one that would wait longer than ``--request-timeout`` by the recent pass
times; a request still unanswered at ``--request-timeout`` gets ``504`` (its texts leave the queue).
SIGTERM (or Ctrl+C) stops accepting connections, answers every queued request, then exits 0.

Hostile input: size limits (body bytes, texts per request, characters per text, k), malformed
JSON and schema errors get a 4xx whose JSON body is ``{"error": one line, "field": where}``;
``--api-key-file`` (one key a line) requires ``Authorization: Bearer <key>`` on everything but
the page, ``/health``, ``/ready`` and the docs; keys are compared in constant time. Without
``--host`` the server listens on 127.0.0.1 only, and says so when it starts.

The modules: ``limits`` (what a request may hold, the two refusals), ``batching`` (the queue and
its forward passes) and ``workers`` (the thread or forked processes a pass runs in), ``metrics``
(``/metrics``), ``auth`` (API keys), ``guard`` (the ASGI middleware), ``errors`` and ``schemas``
(the error body, the request and response models), ``routes``, ``state`` and ``app``
(:func:`create_app`), ``cli`` (``xmc-serve``). Importing this package imports neither torch nor
FastAPI: an app is built, and uvicorn started, only when asked for.
"""

from xtransformer.serve.app import create_app
from xtransformer.serve.auth import key_matches, read_api_keys
from xtransformer.serve.batching import Ask, MicroBatcher
from xtransformer.serve.cli import (
    DEFAULT_HOST,
    ServeOptions,
    announce,
    is_loopback,
    load_served_model,
    main,
    make_server,
    parser,
    serve_model,
)
from xtransformer.serve.limits import Limits, QueueFull, RequestTimeout
from xtransformer.serve.metrics import ServeMetrics
from xtransformer.serve.schemas import api_schemas
from xtransformer.serve.workers import WorkerDied

__all__ = [
    "DEFAULT_HOST",
    "Ask",
    "Limits",
    "MicroBatcher",
    "QueueFull",
    "RequestTimeout",
    "ServeMetrics",
    "ServeOptions",
    "WorkerDied",
    "announce",
    "api_schemas",
    "create_app",
    "is_loopback",
    "key_matches",
    "load_served_model",
    "main",
    "make_server",
    "parser",
    "read_api_keys",
    "serve_model",
]
