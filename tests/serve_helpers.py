"""Start ``xmc-serve`` (or the slowed-down copy in ``slow_serve.py``) on 127.0.0.1 for the serving
tests: a real uvicorn process, found by polling ``/health`` for a bounded time; its stderr is
collected line by line (the start lines, the shutdown line)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

HOST = "127.0.0.1"
TESTS = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@dataclass
class Served:
    proc: subprocess.Popen
    base: str
    stderr: list[str] = field(default_factory=list)

    def wait_for_line(self, words: str, timeout: float = 30) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for line in list(self.stderr):
                if words in line:
                    return line
            time.sleep(0.02)
        raise AssertionError(f"no stderr line with {words!r}; got {self.stderr}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)


def start(
    model: Path | str, *args: str, slow: float | None = None, gate: Path | None = None, timeout: float = 90
) -> Served:
    """``xmc-serve --model model --port <free> args...`` (``slow``: seconds added to every forward pass,
    ``gate``: a pass waits while this file exists; see ``slow_serve.py``)."""
    port = free_port()
    if slow is None:
        cmd = [sys.executable, "-m", "xtransformer", "serve"]
    else:
        cmd = [sys.executable, str(TESTS / "slow_serve.py"), "--delay", str(slow)]
        cmd += ["--gate", str(gate)] if gate is not None else []
    proc = subprocess.Popen(
        [*cmd, "--model", str(model), "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    served = Served(proc, f"http://{HOST}:{port}")

    def read() -> None:
        for line in proc.stderr:
            served.stderr.append(line.rstrip("\n"))

    threading.Thread(target=read, daemon=True).start()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            time.sleep(0.2)  # let the reader catch the last lines
            raise RuntimeError(f"server exited with {proc.returncode}: " + "\n".join(served.stderr))
        try:
            if httpx.get(f"{served.base}/health", timeout=1).status_code == 200:
                return served
        except httpx.TransportError:
            time.sleep(0.1)
    served.stop()
    raise RuntimeError("server did not start: " + "\n".join(served.stderr))
