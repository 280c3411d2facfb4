"""Every error leaves the server in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}."""
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from atomlite.engine.ipc.client import EngineStopped, QueueFull
from atomlite.server.protocol import MAX_STOP

logger = logging.getLogger("atomlite.server")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
               415: "invalid_request_error", 503: "service_unavailable",
               500: "internal_error"}


NESTED_TOO_DEEPLY = "the request is nested too deeply (objects and lists inside one another); flatten it"


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


def error_body(status: int, message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param), status_code=status)


# Fields whose type is a union: pydantic reports one error per branch, named by the branch's type
# ("prompt.constrained-str"); the message says instead what the field takes.
FIELD_RULES = {
    "prompt": "a non-empty string, a list of them, a list of token ids (integers >= 0), or a list of such lists",
    "stop": f"a non-empty string or a list of at most {MAX_STOP} of them",
    "content": 'a string or a list of text parts ({"type": "text", "text": ...}), image_url parts ({"type": '
               '"image_url", "image_url": {"url": ...}}) and video_url parts ({"type": "video_url", "video_url": '
               '{"url": ...}})',
    "logit_bias": 'an object of token ids (as digit strings, e.g. "50256") to numbers',
    "tool_choice": '"none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
}


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    message = first.get("msg", "invalid request").removeprefix("Value error, ")  # our validators' own words
    if first.get("type") == "json_invalid":
        error = first.get("ctx", {}).get("error", message)
        if "recursion limit" in str(error):
            return NESTED_TOO_DEEPLY, None
        return f"the request body is not valid JSON: {error}", None
    ruled = next((i for i, part in enumerate(loc) if part in FIELD_RULES), None)
    if ruled is not None and (len(loc) > ruled + 1 or first.get("type") in ("string_type", "list_type")):
        return f"{'.'.join(loc[:ruled + 1])}: must be {FIELD_RULES[loc[ruled]]}", loc[0]
    where = ".".join(loc)
    return (f"{where}: {message}" if where else message), (loc[0] if loc else None)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException):
        status = 400 if exc.status_code == 422 else exc.status_code
        detail = str(exc.detail)
        if status == 400 and detail == "There was an error parsing the body":  # FastAPI's words for bad UTF-8
            detail = "the request body is not valid JSON text (it must be UTF-8)"
        return error_response(status, detail)

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError):
        return error_response(exc.status, exc.message, exc.param)

    @app.exception_handler(ValueError)
    async def _value(request: Request, exc: ValueError):
        return error_response(400, str(exc))

    @app.exception_handler(QueueFull)
    async def _full(request: Request, exc: QueueFull):
        return error_response(503, str(exc))

    @app.exception_handler(EngineStopped)
    async def _stopped(request: Request, exc: EngineStopped):
        return error_response(503, str(exc))

    @app.exception_handler(RecursionError)
    async def _too_deep(request: Request, exc: RecursionError):
        return error_response(400, NESTED_TOO_DEEPLY)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        logger.exception("internal error on %s", request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}")
