"""``xmc-serve`` whose every forward pass takes ``--delay`` seconds longer and, while the file
``--gate`` exists, waits for it to go: the tests hold the model in a pass, fill the queue, outwait
the request timeout or send SIGTERM while requests wait, then let it go (the real server code, only
the model is wrapped).

    python tests/slow_serve.py --delay 0.3 [--gate FILE] --model FOLDER --port 8000 [xmc-serve options]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from xtransformer import serve


class SlowModel:
    def __init__(self, model: Any, delay: float, gate: Path | None = None):
        self.model, self.delay, self.gate = model, delay, gate

    def predict(self, texts: list[str], k: int = 5, **overrides: Any) -> list[dict[str, Any]]:
        for _ in range(6000):  # at most 10 minutes
            if self.gate is None or not self.gate.exists():
                break
            time.sleep(0.01)
        time.sleep(self.delay)
        return self.model.predict(texts, k=k, **overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def main(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--delay", type=float, required=True)
    pre.add_argument("--gate", type=Path, default=None)
    ours, rest = pre.parse_known_args(argv)
    args = serve.parser().parse_args(rest)
    options = serve.ServeOptions.from_args(args)
    return serve.serve_model(SlowModel(serve.load_served_model(args), ours.delay, ours.gate), options)


if __name__ == "__main__":
    sys.exit(main())
