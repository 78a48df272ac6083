"""Types shared by the sync and async clients."""

from __future__ import annotations

import base64
import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

import httpx

from ._policy import Next

DEFAULT_URL = "http://127.0.0.1:8080"


def new_idempotency_key() -> str:
    """A new idempotency key for one logical call."""
    return f"py_{uuid.uuid4()}"


class RouterError(Exception):
    """A call that did not end in an upstream answer; ``next`` says what may be done about it.

    ``status`` is ``None`` (and ``code`` ``router_unreachable``) when the router never answered.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None,
        code: str,
        next: Next,
        idempotency_key: str,
        body: Mapping[str, Any] | None,
        retry_after: float | None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.next = next
        self.idempotency_key = idempotency_key
        self.body = body
        self.retry_after = retry_after
        self.receipt_id: str | None = (body or {}).get("receipt_id")
        self.payment: Mapping[str, Any] | None = (body or {}).get("payment")
        #: With ``approval_pending`` (202), ``approval_denied`` and ``approval_expired``: the held
        #: payment's terms (network, asset, amount, payTo, upstream_url), id and state. Pending:
        #: call ``fetch`` again later with ``idempotency_key`` for the call's answer.
        self.approval: Mapping[str, Any] | None = (body or {}).get("approval")


@dataclass(frozen=True)
class RoutedResponse:
    """The upstream's answer (any status below 500) and what the router recorded about it."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes
    envelope: Mapping[str, Any]
    payment: Mapping[str, Any] | None
    receipt_id: str
    idempotency_key: str
    #: True when the router answered from its record of an earlier attempt under this key.
    replayed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


@dataclass(frozen=True)
class Settings:
    base_url: str
    agent_key: str
    retry_budget: float
    max_attempts: int
    attempt_timeout: float

    @staticmethod
    def build(
        base_url: str | None,
        agent_key: str | None,
        retry_budget: float,
        max_attempts: int,
        attempt_timeout: float,
    ) -> "Settings":
        url = base_url or os.environ.get("X402_ROUTER_URL") or DEFAULT_URL
        key = agent_key or os.environ.get("X402_ROUTER_AGENT_KEY")
        if not key:
            raise ValueError("an agent key is required (agent_key or X402_ROUTER_AGENT_KEY)")
        return Settings(url.rstrip("/") + "/", key, retry_budget, max_attempts, attempt_timeout)


def route_body(
    url: str,
    method: str,
    headers: Mapping[str, str] | None,
    json_body: Any,
    max_amount: str | int | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"url": str(url), "method": method.upper()}
    if headers:
        body["headers"] = {k.lower(): v for k, v in headers.items()}
    if json_body is not None:
        body["body"] = json_body
    if max_amount is not None:
        body["max_amount"] = str(max_amount)
    return body


def tool_body(
    url: str,
    tool: str,
    arguments: Mapping[str, Any] | None,
    headers: Mapping[str, str] | None,
    max_amount: str | int | None,
) -> dict[str, Any]:
    """The ``mcp`` form of a ``/route`` body: a tool of an MCP server, paid with x402 over MCP."""
    body: dict[str, Any] = {"mcp": {"url": str(url), "tool": tool, "arguments": dict(arguments or {})}}
    if headers:
        body["headers"] = {k.lower(): v for k, v in headers.items()}
    if max_amount is not None:
        body["max_amount"] = str(max_amount)
    return body


def parse_body(resp: httpx.Response) -> dict[str, Any]:
    try:
        value = resp.json()
        return value if isinstance(value, dict) else {"error": resp.text, "code": None}
    except ValueError:
        return {"error": resp.text, "code": None}


def retry_after(resp: httpx.Response | None) -> float | None:
    if resp is None:
        return None
    value = resp.headers.get("retry-after")
    try:
        return max(float(value), 0.0) if value is not None else None
    except ValueError:
        return None


def wait_seconds(after: float | None, attempt: int) -> float:
    """``Retry-After`` when given (capped at 10 s), else 0.5 s, 1 s, 2 s, … up to 8 s."""
    if after is not None:
        return min(after, 10.0)
    return min(0.5 * 2 ** (attempt - 1), 8.0)


def to_response(envelope: Mapping[str, Any], key: str, replayed: bool) -> RoutedResponse:
    headers = dict(envelope.get("headers") or {})
    body = envelope.get("body")
    content_type = headers.get("content-type", "").lower()
    if body is None:
        content = b""
    elif "json" in content_type:
        content = json.dumps(body).encode()
    elif isinstance(body, dict) and isinstance(body.get("text"), str):
        content = body["text"].encode()
    elif isinstance(body, dict) and isinstance(body.get("base64"), str):
        content = base64.b64decode(body["base64"])
    else:
        content = json.dumps(body).encode()
    return RoutedResponse(
        status_code=int(envelope["status"]),
        headers=headers,
        content=content,
        envelope=envelope,
        payment=envelope.get("payment"),
        receipt_id=str(envelope.get("receipt_id")),
        idempotency_key=key,
        replayed=replayed,
    )


def error_for(
    resp: httpx.Response | None, body: Mapping[str, Any] | None, next: Next, key: str, failure: Exception | None
) -> RouterError:
    if resp is None:
        return RouterError(
            f"router unreachable; retry later with the same idempotency key ({key}): {failure!r}",
            status=None,
            code="router_unreachable",
            next="retry_same_key",
            idempotency_key=key,
            body=None,
            retry_after=None,
        )
    return RouterError(
        str((body or {}).get("error") or f"router answered {resp.status_code}"),
        status=resp.status_code,
        code=str((body or {}).get("code") or f"http_{resp.status_code}"),
        next=next,
        idempotency_key=key,
        body=body,
        retry_after=retry_after(resp),
    )
