"""HTTP server for a saved model folder (FastAPI + uvicorn).

    xmc-serve --model outputs/train/runs/<date>/model --host 127.0.0.1 --port 8000

``POST /predict`` ``{"texts": [...], "k": 5}`` -> ``{"predictions": [{labels, names, scores}, ...]}``,
``GET /health``, ``GET /labels``, OpenAPI docs at ``/docs``.

Concurrent requests are micro-batched: one worker thread runs the model; while it is busy,
arriving requests queue up and the next forward pass takes all of them at once (up to
``max_batch`` texts). A lone request never waits for company, so batching costs no latency at
concurrency 1 and turns many small forward passes into few large ones under load. Requests over
the limits (texts per request, characters per text, k, body bytes) and malformed JSON get a 4xx
with a one-line message; the server keeps serving.
"""

# no `from __future__ import annotations`: FastAPI reads the request model from the real annotation
import argparse
import asyncio
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

log = logging.getLogger(__name__)


@dataclass
class Limits:
    max_texts: int = 256  # texts per request
    max_text_chars: int = 100_000  # characters per text
    max_k: int = 100  # labels per text
    max_body_bytes: int = 16 << 20
    max_batch: int = 1024  # texts per forward pass (several requests together)


@dataclass
class _Job:
    texts: list[str]
    k: int
    future: asyncio.Future


@dataclass
class MicroBatcher:
    """Queue of requests served by one model thread, several requests per forward pass."""

    model: Any  # XMCModel (anything with predict(texts, k=...))
    max_batch: int = 1024
    stats: dict[str, int] = field(default_factory=lambda: {"requests": 0, "batches": 0, "texts": 0})

    def __post_init__(self) -> None:
        self.queue: asyncio.Queue[_Job] | None = None
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="xmc-model")
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self.queue = asyncio.Queue()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def predict(self, texts: list[str], k: int) -> list[dict[str, Any]]:
        assert self.queue is not None, "start() the batcher first"
        job = _Job(texts, k, asyncio.get_running_loop().create_future())
        await self.queue.put(job)
        return await job.future

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self.queue.get()]
            size = len(batch[0].texts)
            while size < self.max_batch and not self.queue.empty():  # whatever queued meanwhile
                job = self.queue.get_nowait()
                batch.append(job)
                size += len(job.texts)
            texts = [t for job in batch for t in job.texts]
            k = max(job.k for job in batch)
            try:
                rows = await loop.run_in_executor(self.executor, self._run, texts, k)
            except Exception as e:  # noqa: BLE001  (reported to every waiting request)
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(e)
                continue
            self.stats["requests"] += len(batch)
            self.stats["batches"] += 1
            self.stats["texts"] += len(texts)
            start = 0
            for job in batch:  # each request gets its rows, cut to its own k (rows are sorted)
                part = rows[start:start + len(job.texts)]
                start += len(job.texts)
                if not job.future.done():
                    job.future.set_result([{key: value[:job.k] for key, value in row.items()} for row in part])

    def _run(self, texts: list[str], k: int) -> list[dict[str, Any]]:
        return self.model.predict(texts, k=k) if texts else []


def create_app(model: Any, limits: Limits | None = None) -> Any:
    """The FastAPI app serving ``model`` (an :class:`xtransformer.model.XMCModel`)."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, Field

    limits = limits or Limits()
    batcher = MicroBatcher(model, max_batch=limits.max_batch)

    class PredictRequest(BaseModel):
        texts: list[str] = Field(description=f"documents to label (at most {limits.max_texts}, "
                                             f"{limits.max_text_chars} characters each)")
        k: int = Field(5, description=f"labels per document, 1..{limits.max_k}")

    class Prediction(BaseModel):
        labels: list[str]
        names: list[str]
        scores: list[float]

    class PredictResponse(BaseModel):
        predictions: list[Prediction]

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="xtransformer model server", version=str(model.manifest.get("library_version")),
                  description=f"{model.method} model, {model.n_labels} labels", lifespan=lifespan)
    app.state.batcher = batcher

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse(status_code=status, content={"error": message})

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errs):
            return error(400, f"malformed JSON: {errs[0].get('ctx', {}).get('error', errs[0].get('msg'))}")
        first = errs[0] if errs else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error(422, f"{where or 'body'}: {first.get('msg', 'invalid request')}")

    @app.middleware("http")
    async def body_limit(request: Request, call_next):
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > limits.max_body_bytes:
            return error(413, f"request body of {size} bytes exceeds the limit of {limits.max_body_bytes}")
        return await call_next(request)

    @app.post("/predict", response_model=PredictResponse)
    async def predict(req: PredictRequest) -> Any:
        if len(req.texts) > limits.max_texts:
            return error(413, f"{len(req.texts)} texts in one request; the limit is {limits.max_texts}")
        for i, text in enumerate(req.texts):
            if len(text) > limits.max_text_chars:
                return error(413, f"texts[{i}] has {len(text)} characters; the limit is {limits.max_text_chars}")
        if not 1 <= req.k <= limits.max_k:
            return error(422, f"k must be between 1 and {limits.max_k}, got {req.k}")
        return {"predictions": await batcher.predict(req.texts, req.k)}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "method": model.method, "n_labels": model.n_labels,
                "format_version": model.manifest["format_version"], "batching": dict(batcher.stats)}

    @app.get("/labels")
    async def labels(offset: int = 0, limit: int | None = None) -> dict[str, Any]:
        end = None if limit is None else offset + max(limit, 0)
        return {"n_labels": model.n_labels, "offset": offset, "ids": model.label_ids[offset:end],
                "names": model.label_names[offset:end]}

    return app


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="xmc-serve", description="Serve a saved model folder over HTTP "
                                "(POST /predict, GET /health, GET /labels, docs at /docs).")
    p.add_argument("--model", required=True, help="a method folder, a run's model/ folder or a run folder")
    p.add_argument("--method", default=None, help="which method of a run's model/ folder (default: the main one)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    d = Limits()
    p.add_argument("--max-texts", type=int, default=d.max_texts, help="texts per request")
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars, help="characters per text")
    p.add_argument("--max-k", type=int, default=d.max_k, help="labels per text")
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="texts per forward pass")
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the model's files")
    p.add_argument("--log-level", default="warning")
    args = p.parse_args(argv)
    from xtransformer.model import XMCModel

    try:
        model = XMCModel.load(args.model, method=args.method, verify=not args.no_verify)
    except (ValueError, OSError) as e:
        print(f"xmc-serve: error: {e}", file=sys.stderr)
        return 2
    import uvicorn

    limits = Limits(args.max_texts, args.max_text_chars, args.max_k, max_batch=args.max_batch)
    uvicorn.run(create_app(model, limits), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
