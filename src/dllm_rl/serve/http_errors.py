"""The refusals the web framework makes before a route runs, in OpenAI's error shape (``{"error": {...}}``, which
the SDKs read) rather than FastAPI's ``{"detail": ...}``: a body that does not fit the request's schema
(:func:`schema_error`), and Starlette's own (:func:`framework_error`: an unknown route, a method not allowed, a body
it cannot parse). The application's handlers (:func:`~dllm_rl.serve.app.create_app`) count and answer them."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from dllm_rl.serve.schema import ApiError


def schema_error(err: RequestValidationError) -> ApiError:
    """The 400 of a body that does not fit the request's schema, naming its first problem's field."""
    first = err.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = loc[0] if loc else None
    where = ".".join(loc) or "body"
    kind = first.get("type")
    if kind == "extra_forbidden":  # refused rather than ignored: it would change nothing unsaid
        return ApiError(400, f"{where}: not a field this server knows, so it cannot be honoured; leave it out "
                        "(the fields served are listed in docs/serve.md)", param)
    if kind == "json_invalid":  # its loc is the character where the JSON broke, not a field
        return ApiError(400, f"body: not valid JSON ({first.get('ctx', {}).get('error', 'invalid')} at character "
                        f"{loc[0] if loc else 0})")
    if kind == "model_attributes_type" and not loc:  # a JSON array or scalar, or a body not sent as JSON
        return ApiError(400, "body: a JSON object is needed, sent with Content-Type: application/json")
    return ApiError(400, f"{where}: {first.get('msg', 'invalid')}", param)


def framework_error(request: Request, err: StarletteHTTPException) -> ApiError:
    """FastAPI's and Starlette's own refusals (an unknown route, a method not allowed, a body FastAPI cannot parse:
    not UTF-8, nested too deep) in OpenAI's error shape, which the SDKs read, rather than ``{"detail": ...}``."""
    message = str(err.detail)
    if err.status_code == 400:
        message = f"body: {message} (send a JSON object in UTF-8)"
    elif err.status_code in (404, 405):
        message = f"{message}: {request.method} {request.url.path}"
    return ApiError(err.status_code, message)
