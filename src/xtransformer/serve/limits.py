"""What the server accepts (request size, batching, queue, timeout) and the two refusals of a
request it cannot answer in time: :class:`QueueFull` (503) and :class:`RequestTimeout` (504)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Limits:
    max_texts: int = 256  # texts per request
    max_text_chars: int = 100_000  # characters per text
    max_k: int = 100  # labels per text
    max_body_bytes: int = 16 << 20
    max_batch: int = 1024  # texts per forward pass (several requests together)
    max_queue: int = 4096  # texts waiting for a forward pass; beyond: 503
    request_timeout: float = 30.0  # seconds from arrival to answer; beyond: 504

    def check(self) -> None:
        for name in ("max_texts", "max_text_chars", "max_k", "max_body_bytes", "max_batch", "max_queue"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.max_queue < self.max_texts:
            raise ValueError(
                f"--max-queue ({self.max_queue} texts) must hold one full request (--max-texts {self.max_texts})"
            )
        if not self.request_timeout > 0:
            raise ValueError(f"--request-timeout must be > 0 seconds, got {self.request_timeout}")


class QueueFull(Exception):
    """The request does not fit the queue: answer 503 with ``Retry-After`` (seconds)."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class RequestTimeout(Exception):
    """No answer within the request timeout: 504."""
