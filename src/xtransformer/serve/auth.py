"""API keys: the key file (``--api-key-file``, one key a line, kept as sha256 digests), the
constant-time check of ``Authorization: Bearer <key>``, the paths anyone may call, and the keys as
the OpenAPI schema's bearer security scheme."""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# paths anyone may call when keys are required: probes, the page itself (it asks for a key) and the docs
PUBLIC_PATHS = frozenset(
    {"/", "/health", "/ready", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc", "/favicon.ico"}
)


def read_api_keys(path: str | os.PathLike) -> list[bytes]:
    """The sha256 of every key in ``path`` (one a line; blank lines and ``#`` comments skipped)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--api-key-file {path}: cannot read it ({e})") from None
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise ValueError(f"--api-key-file {path}: no keys in it (one key a line)")
    for i, key in enumerate(keys):
        if any(c.isspace() for c in key) or not key.isprintable() or not key.isascii():
            raise ValueError(f"--api-key-file {path}: key {i + 1} holds whitespace or non-printable characters")
    return [hashlib.sha256(k.encode()).digest() for k in keys]


def key_matches(header: str | None, key_hashes: Sequence[bytes]) -> bool:
    """Whether ``Authorization: Bearer <key>`` names one of the keys; the time taken does not depend
    on which key or how much of it matched (fixed-length digests, every key compared)."""
    if not header:
        return False
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return False
    digest = hashlib.sha256(token.strip().encode("utf-8", "surrogatepass")).digest()
    found = False
    for key in key_hashes:
        found |= hmac.compare_digest(digest, key)
    return found


def authorized(scope: dict, key_hashes: Sequence[bytes]) -> bool:
    """Whether an ASGI request may go on: no keys required, a public path, or a right key."""
    if not key_hashes or scope.get("path", "") in PUBLIC_PATHS:
        return True
    header = next((v.decode("latin-1") for n, v in scope.get("headers", ()) if n == b"authorization"), None)
    return key_matches(header, key_hashes)


def add_bearer_security(schema: dict[str, Any]) -> None:
    """The keys in an OpenAPI schema: a bearer security scheme, required by every guarded path."""
    schema.setdefault("components", {})["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for path, ops in schema.get("paths", {}).items():
        if path not in PUBLIC_PATHS:
            for op in ops.values():
                op["security"] = [{"bearer": []}]
