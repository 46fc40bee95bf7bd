"""What one app's parts share: :class:`ServerState` (the guard and the signal handler: limits,
metrics, keys, whether the server is draining) and :class:`Served` (what every route reads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from xtransformer.serve.batching import MicroBatcher
from xtransformer.serve.errors import error_responses
from xtransformer.serve.limits import Limits
from xtransformer.serve.metrics import ServeMetrics


@dataclass
class ServerState:
    limits: Limits
    metrics: ServeMetrics
    key_hashes: list[bytes]
    draining: bool = False


@dataclass
class Served:
    """What every route of one app reads: the model, its batcher, limits, metrics and state."""

    model: Any
    batcher: MicroBatcher
    limits: Limits
    metrics: ServeMetrics
    state: ServerState
    manifest: dict[str, Any]
    loaded: dict[str, bool]
    schemas: Any  # the request / response models (:func:`~xtransformer.serve.schemas.api_schemas`)

    def is_ready(self) -> tuple[bool, str]:
        if not self.loaded["ready"]:
            return False, "model not loaded yet"
        if not self.batcher.alive:
            return False, "a model worker died"
        if self.state.draining:
            return False, "shutting down"
        if not self.batcher.has_room:
            return False, f"queue full ({self.batcher.queued_texts} of {self.batcher.max_queue} texts)"
        return True, "ok"

    def errors(self, *codes: int) -> dict[int | str, dict[str, Any]]:
        """OpenAPI responses of ``codes``, each with the error body's schema."""
        return error_responses(self.schemas.Error, *codes)
