"""What the page reads of a request: a WSGI environ, its query, its cookie, and its JSON body,
each checked and bounded; anything malformed is refused with a message that says what to send."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs

from synclane.dashboard.guard import Refused

MAX_BODY = 64 * 1024
MAX_SEARCH = 200


class Request:
    """What the page reads of a WSGI request."""

    def __init__(self, environ: Mapping[str, Any]) -> None:
        self.environ = environ
        self.method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        self.path = str(environ.get("PATH_INFO", ""))
        self.query_string = str(environ.get("QUERY_STRING", ""))
        self.root = str(environ.get("SCRIPT_NAME", "")).rstrip("/")

    def header(self, name: str) -> str | None:
        key = name.upper().replace("-", "_")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        value = self.environ.get(key)
        return None if value is None else str(value)

    def header_count(self) -> int:
        return sum(1 for key in self.environ if str(key).startswith("HTTP_"))

    def query(self, name: str) -> str | None:
        try:
            values = parse_qs(self.query_string, keep_blank_values=True, max_num_fields=20)
        except ValueError:
            raise Refused(400, "too many query parameters") from None
        found = values.get(name)
        if not found or found[-1] == "":
            return None
        return found[-1]

    def cookie(self, name: str) -> str | None:
        for part in (self.header("Cookie") or "").split(";"):
            key, _, value = part.strip().partition("=")
            if key == name:
                return value
        return None

    def body(self) -> bytes:
        length_header = self.header("Content-Length")
        if length_header is None:
            raise Refused(411, "send a Content-Length")
        try:
            length = int(length_header)
        except ValueError:
            raise Refused(400, "Content-Length is not a number") from None
        if not 0 <= length <= MAX_BODY:
            raise Refused(413, f"the body may hold at most {MAX_BODY} bytes")
        stream = self.environ["wsgi.input"]
        data: bytes = stream.read(length) if length else b""
        return data


def request_headers(request: Request) -> dict[str, str]:
    found = {}
    for name in ("Sec-Fetch-Site", "Origin"):
        value = request.header(name)
        if value is not None:
            found[name] = value
    return found


def search_text(request: Request) -> str | None:
    text = request.query("search")
    if text is None:
        return None
    text = text.strip()
    if len(text) > MAX_SEARCH or "\x00" in text:
        raise Refused(400, f"search for at most {MAX_SEARCH} characters")
    return text or None


def name_param(request: Request, key: str) -> str | None:
    value = request.query(key)
    if value is not None and (len(value) > 1000 or "\x00" in value):
        raise Refused(400, f"{key} is not a name")
    return value


def number_param(request: Request, key: str, most: int) -> int | None:
    value = request.query(key)
    if value is None:
        return None
    if not value.isdigit() or int(value) > most:
        raise Refused(400, f"{key} must be a whole number from 0 to {most}")
    return int(value)


def read_json(request: Request) -> Any:
    data = request.body()
    try:
        return json.loads(data)
    except RecursionError:
        raise Refused(400, "the body nests too deeply; send a flat JSON object") from None
    except (ValueError, UnicodeDecodeError):
        raise Refused(400, "the body is not JSON") from None


def requeue_request(request: Any) -> tuple[str, dict[str, Any]]:
    """`{"queue": q}` with exactly one of `job` (an id), `owner`, `cause`, `cause_id` or
    `all: true`; `type` may narrow all but `job`. Returns the queue and requeue()'s other
    arguments."""
    choices = ("job", "owner", "cause", "cause_id", "all")
    request = _fields(request, {"queue", "type", *choices}, '{"queue": "shops", "job": 12}')
    queue = _queue(request)
    chosen = [key for key in choices if key in request]
    if len(chosen) != 1:
        raise Refused(400, "say what to requeue with exactly one of job, owner, cause or all")
    selection: dict[str, Any] = {}
    kind = request.get("type")
    if kind is not None:
        if not isinstance(kind, str) or chosen[0] == "job":
            raise Refused(400, "type must be a type name, and goes with owner, cause or all")
        selection["type"] = kind
    value = request[chosen[0]]
    if chosen[0] == "job":
        if not isinstance(value, int) or isinstance(value, bool):
            raise Refused(400, "job must be a job id (a whole number)")
        selection["ids"] = [value]
    elif chosen[0] == "all":
        if value is not True:
            raise Refused(400, "all must be true")
    else:
        if not isinstance(value, str) or not value:
            raise Refused(400, f"{chosen[0]} must be a non-empty string")
        selection[chosen[0]] = value
    return queue, selection


def pause_request(request: Any) -> tuple[str, str, str | None]:
    """`{"queue": q, "reason": why}`, and `by` (who pauses) if the sender says. Returns them;
    a reason is required, as app.pause requires one."""
    fields = _fields(request, {"queue", "reason", "by"}, '{"queue": "shops", "reason": "..."}')
    reason = fields.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise Refused(
            400, 'say why you pause the queue: {"queue": "shops", "reason": "warehouse down"}'
        )
    by = fields.get("by")
    if by is not None and (not isinstance(by, str) or not by.strip()):
        raise Refused(400, "by must be a non-empty string: who pauses the queue")
    return _queue(fields), reason.strip(), by


def resume_request(request: Any) -> str:
    """`{"queue": q}`: the queue to take from again."""
    return _queue(_fields(request, {"queue"}, '{"queue": "shops"}'))


def _fields(request: Any, known: set[str], example: str) -> dict[str, Any]:
    if not isinstance(request, dict):
        raise Refused(400, f"send a JSON object such as {example}")
    unknown = sorted(set(request) - known)
    if unknown:
        raise Refused(400, f"unknown field(s) {', '.join(unknown)}; use {', '.join(sorted(known))}")
    return request


def _queue(request: dict[str, Any]) -> str:
    queue = request.get("queue")
    if not isinstance(queue, str) or not queue:
        raise Refused(400, 'name the queue: {"queue": "shops", ...}')
    return queue
