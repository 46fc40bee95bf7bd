"""``xmc-serve`` whose every forward pass takes ``--delay`` seconds longer, so the tests can fill the
queue, outwait the request timeout and send SIGTERM while requests wait (the real server code,
only the model is wrapped).

    python tests/slow_serve.py --delay 0.3 --model FOLDER --port 8000 [xmc-serve options]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from xtransformer import serve


class SlowModel:
    def __init__(self, model: Any, delay: float):
        self.model, self.delay = model, delay

    def predict(self, texts: list[str], k: int = 5, **overrides: Any) -> list[dict[str, Any]]:
        time.sleep(self.delay)
        return self.model.predict(texts, k=k, **overrides)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def main(argv: list[str] | None = None) -> int:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--delay", type=float, required=True)
    ours, rest = pre.parse_known_args(argv)
    return serve.serve(serve.parser().parse_args(rest), wrap_model=lambda model: SlowModel(model, ours.delay))


if __name__ == "__main__":
    sys.exit(main())
