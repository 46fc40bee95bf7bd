"""Every refusal as the same JSON body, ``{"error": one line, "field": where}``: the response, the
field a validation error points at, FastAPI's own errors turned into it, and the OpenAPI
description of each error status."""

# no `from __future__ import annotations`: FastAPI and pydantic read these annotations at run time
from collections.abc import Sequence
from typing import Any

ERROR_STATUSES = {
    400: "malformed request",
    401: "missing or wrong API key",
    413: "request too large",
    422: "invalid field",
    503: "queue full or shutting down (see Retry-After)",
    504: "no answer within the request timeout",
}


def json_error(status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None) -> Any:
    from fastapi.responses import JSONResponse

    body: dict[str, Any] = {"error": message.replace("\n", " ")}
    if field is not None:
        body["field"] = field
    return JSONResponse(status_code=status, content=body, headers=headers)


def field_path(loc: Sequence[Any]) -> str:
    """``("body", "texts", 3)`` -> ``texts[3]``; ``("query", "limit")`` -> ``limit``."""
    parts = [p for p in loc if p not in ("body", "query", "path", "header")] if len(loc) > 1 else list(loc)
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


def error_responses(error_model: Any, *codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses of ``codes``, each with the error body's schema."""
    return {code: {"model": error_model, "description": ERROR_STATUSES[code]} for code in codes}


def add_error_handlers(app: Any) -> None:
    """Every 4xx as a JSON body naming the field at fault."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            return json_error(400, f"malformed JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", "body")
        where = field_path(first.get("loc", ()))
        msg = str(first.get("msg", "invalid request"))
        ctype = request.headers.get("content-type", "")
        if where == "body" and "json" not in ctype.lower():
            msg = f"send a JSON object with Content-Type: application/json (got {ctype or 'no Content-Type'})"
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        return json_error(422, f"{where}: {msg}{more}", where)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        field, detail = getattr(exc, "field", None), str(exc.detail)
        if exc.status_code == 400 and field is None:  # FastAPI could not decode the body (not UTF-8 JSON)
            field, detail = "body", f"malformed request body: not UTF-8 JSON ({detail.lower()})"
        return json_error(exc.status_code, detail, field, getattr(exc, "headers", None))
