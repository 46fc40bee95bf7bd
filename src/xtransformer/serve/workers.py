"""Where a forward pass runs: a thread of the server process (:class:`ThreadSlot`) or a model worker
process forked after the model was loaded (:class:`ProcessSlot`, :func:`worker_main`). A slot runs
one pass at a time; the batcher hands passes to whichever slot is free."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class WorkerDied(RuntimeError):
    pass


class ThreadSlot:
    """Runs the model's forward passes in one thread of this process."""

    pid: int | None = None  # no process of its own

    def __init__(self, model: Any):
        self.model = model
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="xmc-model")

    @property
    def alive(self) -> bool:
        return True

    async def run(self, texts: list[str], k: int, settings: dict[str, Any]) -> list[dict[str, Any]]:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._predict, texts, k, settings)

    def _predict(self, texts: list[str], k: int, settings: dict[str, Any]) -> list[dict[str, Any]]:
        return self.model.predict(texts, k=k, **settings) if texts else []

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)


def worker_main(conn: Any, model: Any, overrides: dict[str, Any], threads: int) -> None:
    """A forked model worker: answers ``(texts, k, settings)`` on its pipe until the pipe closes. It
    ignores SIGINT / SIGTERM (a signal to the whole process group must not cut the server's drain short)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    with contextlib.suppress(Exception):
        model.predict(["warm up"], k=1, **overrides)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message is None:
            break
        texts, k, settings = message
        try:
            reply = (True, model.predict(texts, k=k, **overrides, **settings) if texts else [])
        except Exception as e:
            reply = (False, f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except (OSError, ValueError):
            break


class ProcessSlot:
    """A worker process forked after the model was loaded (its arrays shared copy-on-write), fed
    over a pipe; one thread of this process waits on the pipe without holding the GIL."""

    def __init__(self, model: Any, overrides: dict[str, Any], threads: int):
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=worker_main, args=(child, model, overrides, threads), daemon=True, name="xmc-model-worker"
        )
        self.proc.start()
        child.close()
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="xmc-worker-pipe")

    @property
    def pid(self) -> int | None:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.is_alive()

    async def run(self, texts: list[str], k: int, settings: dict[str, Any]) -> list[dict[str, Any]]:
        return await asyncio.get_running_loop().run_in_executor(self.executor, self._call, texts, k, settings)

    def _call(self, texts: list[str], k: int, settings: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            self.conn.send((texts, k, settings))
            ok, value = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError) as e:
            raise WorkerDied(
                f"model worker {self.proc.pid} died ({type(e).__name__}; exit code {self.proc.exitcode})"
            ) from None
        if not ok:
            raise RuntimeError(value)
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        self.conn.close()
        self.executor.shutdown(wait=False, cancel_futures=True)


def fork_workers(model: Any, workers: int) -> list[ProcessSlot]:
    """``workers`` model worker processes, forked now (before the server starts any thread), the
    host's cores split among them."""
    import gc

    gc.collect()
    gc.freeze()  # the model's objects: never scanned by the workers' collector, so their pages stay shared
    threads = max(1, (os.cpu_count() or 1) // workers)
    settings = getattr(model, "predict_settings", {}) or {}
    overrides = {"threads": threads} if "threads" in settings else {}
    return [ProcessSlot(model, overrides, threads) for _ in range(workers)]
