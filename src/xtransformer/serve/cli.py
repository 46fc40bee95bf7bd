"""``xmc-serve``: the command line, loading the model folder, the uvicorn server that drains on
SIGTERM, and the start lines (what is served, where, who may call it).

:func:`main` is :func:`load_served_model` then :func:`serve_model`; a caller that wraps the loaded
model (e.g. to slow it down) runs the two itself."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xtransformer.serve.app import create_app
from xtransformer.serve.auth import read_api_keys
from xtransformer.serve.limits import Limits
from xtransformer.serve.state import ServerState
from xtransformer.utils.hardware import DEVICE_HELP, DEVICES

DEFAULT_HOST = "127.0.0.1"


@dataclass
class ServeOptions:
    """The command line's serving options, checked (:meth:`from_args` raises a one-line ValueError)."""

    limits: Limits
    keys: list[bytes]  # sha256 of the accepted API keys; empty: none needed
    key_file: str | None
    host: str | None  # as given; None: DEFAULT_HOST, and the start line says so
    port: int
    workers: int
    log_level: str

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeOptions:
        limits = Limits(
            args.max_texts,
            args.max_text_chars,
            args.max_k,
            args.max_body_bytes,
            args.max_batch,
            args.max_queue,
            args.request_timeout,
        )
        limits.check()
        keys = read_api_keys(args.api_key_file) if args.api_key_file else []
        if not 0 <= args.port <= 65535:
            raise ValueError(f"--port must be 0..65535, got {args.port}")
        if not 1 <= args.workers <= 64:
            raise ValueError(f"--workers must be 1..64, got {args.workers}")
        return cls(limits, keys, args.api_key_file, args.host, args.port, args.workers, args.log_level)

    @property
    def listen_host(self) -> str:
        return self.host or DEFAULT_HOST


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xmc-serve",
        description="Serve a saved model folder over HTTP: POST /predict, "
        "a page to try it at /, GET /health, /ready, /metrics, /labels, docs at /docs.",
    )
    p.add_argument("--model", required=True, help="a method folder, a run's model/ folder, a run folder or hf://...")
    p.add_argument("--method", default=None, help="which method of a run's model/ folder (default: the main one)")
    p.add_argument(
        "--host",
        default=None,
        help=f"address to listen on (default {DEFAULT_HOST}: this machine only; 0.0.0.0: every interface)",
    )
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key-file",
        default=None,
        help="require 'Authorization: Bearer <key>' with one of the keys in this file (one a line)",
    )
    d = Limits()
    p.add_argument("--max-texts", type=int, default=d.max_texts, help="texts per request (more: 413)")
    p.add_argument("--max-text-chars", type=int, default=d.max_text_chars, help="characters per text (more: 413)")
    p.add_argument("--max-k", type=int, default=d.max_k, help="labels per text")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="request body size (more: 413)")
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="texts per forward pass")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="forward passes at once, each in a worker process forked after loading the model (its "
        "arrays shared); for models whose prediction holds the GIL, e.g. XR-Linear's TF-IDF. "
        "Default 1: one model thread in the server process",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=d.max_queue,
        help="texts waiting for a forward pass; a request that does not fit gets 503 + Retry-After",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=d.request_timeout,
        help="seconds from arrival to answer; a request still waiting then gets 504",
    )
    p.add_argument("--no-verify", action="store_true", help="skip the sha256 check of the model's files")
    p.add_argument("--device", choices=DEVICES, default=None, help=f"{DEVICE_HELP}; a GPU takes --workers 1")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``xmc-serve``: 2 and one line on bad options or a folder that does not load; 1 when the server
    could not start (e.g. the port is taken); 0 after a SIGTERM / Ctrl+C drained the queue."""
    args = parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        options = ServeOptions.from_args(args)
        model = load_served_model(args)
        check_workers_device(options, model)
    except ValueError as e:
        print(f"xmc-serve: error: {e}", file=sys.stderr)
        return 2
    return serve_model(model, options)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def load_served_model(args: argparse.Namespace) -> Any:
    """The folder ``--model`` names (``--method``, ``--no-verify``), loaded; a ValueError says in one
    line why it does not load."""
    from xtransformer.model import XMCModel

    try:
        return XMCModel.load(args.model, method=args.method, verify=not args.no_verify, device=args.device)
    except (ValueError, OSError) as e:
        raise ValueError(str(e)) from None
    except Exception as e:
        raise ValueError(f"{args.model}: cannot load the model ({type(e).__name__}: {e})") from None


def check_workers_device(options: ServeOptions, model: Any) -> None:
    """Worker processes are forked after loading, and a forked process cannot use the CUDA context of
    its parent: a model on a GPU is served by one model thread."""
    device = getattr(model, "device", "cpu")
    if options.workers > 1 and device != "cpu":
        raise ValueError(f"--workers {options.workers}: the model predicts on {device}, which only --workers 1 can use")


def serve_model(model: Any, options: ServeOptions) -> int:
    """Serves ``model`` (anything with an XMCModel's ``predict``, ``method``, ``n_labels``, labels)
    until SIGTERM / Ctrl+C: 0 once stopped, 1 when the server did not start."""
    configure_logging(options.log_level)  # a no-op when main configured it before loading
    announce(options, model)
    if options.workers > 1:
        print(f"xmc-serve: {options.workers} model worker processes", file=sys.stderr)
    app = create_app(model, options.limits, options.keys, workers=options.workers)
    server = make_server(app, options.listen_host, options.port, options.log_level)
    server.run()
    if not server.started:  # e.g. the port is taken (uvicorn logged why)
        return 1
    print("xmc-serve: stopped", file=sys.stderr)
    return 0


def announce(options: ServeOptions, model: Any) -> None:
    """What is served, where, and who may call it (stderr, at start)."""
    host, port = options.listen_host, options.port
    where = "this machine only" if is_loopback(host) else "reachable from other machines"
    origin = "" if options.host else " (no --host given; --host 0.0.0.0 to listen on every interface)"
    print(f"xmc-serve: {model.method} model, {model.n_labels} labels, from {model.folder}", file=sys.stderr)
    print(f"xmc-serve: listening on http://{host}:{port}: {where}{origin}; try it at /", file=sys.stderr)
    if options.keys:
        print(
            f"xmc-serve: {len(options.keys)} API key(s) from {options.key_file}: "
            "requests need 'Authorization: Bearer <key>'",
            file=sys.stderr,
        )
    else:
        anyone = "" if is_loopback(host) else f"; anyone who can reach {host}:{port} can use the model"
        print(f"xmc-serve: no --api-key-file: requests are not authenticated{anyone}", file=sys.stderr)
    sys.stderr.flush()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def make_server(app: Any, host: str, port: int, log_level: str = "warning") -> Any:
    """A uvicorn server whose SIGTERM / SIGINT stop accepting connections, let every queued request
    be answered (for up to the request timeout and 10 s more), and end the process with status 0
    (uvicorn itself re-raises the signal)."""
    import uvicorn

    state: ServerState | None = getattr(app.state, "server", None)
    timeout = state.limits.request_timeout + 10 if state is not None else 30

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if state is not None and not state.draining:
                state.draining = True
                print(
                    f"xmc-serve: signal {sig}: not accepting connections, answering "
                    f"{app.state.batcher.queued_texts} queued texts, then exiting",
                    file=sys.stderr,
                    flush=True,
                )
            if self.should_exit:  # a second signal: stop now
                self.force_exit = True
            self.should_exit = True

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=timeout,
        access_log=log_level in ("debug", "trace", "info"),
    )
    return Server(config)
