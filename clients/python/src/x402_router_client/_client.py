"""The sync (``Router``) and async (``AsyncRouter``) clients.

One logical call = one idempotency key, generated once (or given) and reused by every retry.
Retries happen only where they are safe: a lost connection, 409 ``idempotency_key_in_flight``,
409 ``superseded``, 500 and 503, honouring ``Retry-After``, within a bounded budget. An
ambiguous outcome is never retried under a new key.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Mapping
from urllib.parse import quote

import httpx

from ._core import (
    RoutedResponse,
    RouterError,
    Settings,
    error_for,
    new_idempotency_key,
    parse_body,
    retry_after,
    route_body,
    to_response,
    tool_body,
    wait_seconds,
)
from ._policy import classify


class _Base:
    def __init__(
        self,
        base_url: str | None = None,
        agent_key: str | None = None,
        *,
        retry_budget: float = 30.0,
        max_attempts: int = 10,
        attempt_timeout: float = 75.0,
    ) -> None:
        self._settings = Settings.build(base_url, agent_key, retry_budget, max_attempts, attempt_timeout)

    def _headers(self, key: str | None) -> dict[str, str]:
        h = {"authorization": f"Bearer {self._settings.agent_key}", "accept": "application/json"}
        if key:
            h["idempotency-key"] = key
        return h

    def _decide(self, resp, failure, key, attempt, started):
        """(result, wait): a final (response, body) or an exception, else seconds to wait."""
        body = parse_body(resp) if resp is not None else None
        next_ = classify(resp.status_code, body) if resp is not None else "retry_same_key"
        if resp is not None and next_ == "done":
            return (resp, body), None
        # A payment waiting for a human is answered at once (with its key), not waited for here.
        held = (body or {}).get("code") == "approval_pending"
        if next_ == "retry_same_key" and not held and attempt < self._settings.max_attempts:
            wait = wait_seconds(retry_after(resp), attempt)
            if time.monotonic() - started + wait < self._settings.retry_budget:
                return None, wait
        return error_for(resp, body, next_, key or "", failure), None


def discover_params(
    q: str | None, max_price: str | int | None, network: str | None, type_: str | None,
    payable: bool | None, limit: int | None, cursor: str | None,
) -> dict[str, str]:
    """The query of ``GET /discovery`` (only the filters given)."""
    raw = {"q": q, "max_price": max_price, "network": network, "type": type_, "limit": limit, "cursor": cursor}
    params = {k: str(v) for k, v in raw.items() if v is not None}
    if payable is not None:
        params["payable"] = "true" if payable else "false"
    return params


class Router(_Base):
    """A synchronous client of one router, as one agent."""

    def __init__(self, base_url: str | None = None, agent_key: str | None = None, **options: Any) -> None:
        super().__init__(base_url, agent_key, **options)
        self._http = httpx.Client(base_url=self._settings.base_url, timeout=self._settings.attempt_timeout)

    def __enter__(self) -> "Router":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def fetch(
        self,
        url: str,
        *,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        max_amount: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> RoutedResponse:
        """Calls ``url`` through the router; pays at most ``max_amount`` atomic units, once.

        Returns the upstream's answer (status below 500); raises ``RouterError`` otherwise.
        """
        key = idempotency_key or new_idempotency_key()
        body = route_body(url, method, headers, json, max_amount)
        resp, _ = self._send("POST", "route", key, body)
        return to_response(parse_body(resp), key, resp.headers.get("x-idempotent-replay") == "true")

    def call_tool(
        self,
        url: str,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        max_amount: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> RoutedResponse:
        """Calls the MCP tool ``tool`` of the MCP server at ``url`` (streamable HTTP) through the
        router; pays at most ``max_amount`` atomic units, once, when the tool asks (x402 over MCP).

        The response's ``json()`` is the MCP ``CallToolResult``; retries as ``fetch`` does.
        """
        key = idempotency_key or new_idempotency_key()
        body = tool_body(url, tool, arguments, headers, max_amount)
        resp, _ = self._send("POST", "route", key, body)
        return to_response(parse_body(resp), key, resp.headers.get("x-idempotent-replay") == "true")

    def get_receipt(self, receipt_id: str) -> tuple[dict[str, Any], str | None]:
        """One of the agent's receipts and its payment's current ledger state (``X-Payment-Status``)."""
        resp, body = self._send("GET", f"receipts/{quote(receipt_id, safe='')}", None, None)
        return body, resp.headers.get("x-payment-status")

    def list_receipts(self, *, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        """The agent's receipts, newest first: ``{"receipts": [...], "next_cursor": ...}``."""
        params = {k: v for k, v in {"limit": limit, "cursor": cursor}.items() if v is not None}
        _, body = self._send("GET", "receipts", None, None, params)
        return body

    def get_payment(self, idempotency_key: str) -> dict[str, Any] | None:
        """The payment signed under ``idempotency_key`` as the ledger has it now; ``None`` when
        none was ever signed. After ``do_not_rekey`` with ``payment_unknown``, poll this:
        ``new_key_safe`` turns true once ``reconcile`` saw the authorization expire unused."""
        try:
            _, body = self._send("GET", "payments", None, None, {"idempotency_key": idempotency_key})
        except RouterError as e:
            if e.status == 404:
                return None
            raise
        return body

    def get_budget(self) -> dict[str, Any]:
        """The agent's limits and rolling 24 h spend (decimal strings of atomic units)."""
        _, body = self._send("GET", "agents/me", None, None)
        return body

    def discover(
        self,
        q: str | None = None,
        *,
        max_price: str | int | None = None,
        network: str | None = None,
        type: str | None = None,  # noqa: A002 (the API's name)
        payable: bool | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """What this agent can buy: ``{"resources": [...], "next_cursor": ..., "sources": [...]}``.

        Each resource (facilitators' catalogues, 402s the router saw) carries its price options,
        each judged for this agent (``payable``, else ``code`` and ``why_not``), and its input and
        output schemas as advertised. Prices are informational: buy with ``fetch(..., max_amount=)``.
        """
        params = discover_params(q, max_price, network, type, payable, limit, cursor)
        _, body = self._send("GET", "discovery", None, None, params)
        return body

    def _send(self, method, path, key, json_body, params=None):
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            resp, failure = None, None
            try:
                resp = self._http.request(method, path, headers=self._headers(key), json=json_body, params=params)
            except httpx.TransportError as e:  # no answer, or cut off: the outcome is unknown
                failure = e
            result, wait = self._decide(resp, failure, key, attempt, started)
            if wait is None:
                if isinstance(result, Exception):
                    raise result
                return result
            time.sleep(wait)


class AsyncRouter(_Base):
    """An asyncio client of one router, as one agent."""

    def __init__(self, base_url: str | None = None, agent_key: str | None = None, **options: Any) -> None:
        super().__init__(base_url, agent_key, **options)
        self._http = httpx.AsyncClient(base_url=self._settings.base_url, timeout=self._settings.attempt_timeout)

    async def __aenter__(self) -> "AsyncRouter":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def fetch(
        self,
        url: str,
        *,
        method: str = "GET",
        headers: Mapping[str, str] | None = None,
        json: Any = None,
        max_amount: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> RoutedResponse:
        """See ``Router.fetch``."""
        key = idempotency_key or new_idempotency_key()
        body = route_body(url, method, headers, json, max_amount)
        resp, _ = await self._send("POST", "route", key, body)
        return to_response(parse_body(resp), key, resp.headers.get("x-idempotent-replay") == "true")

    async def call_tool(
        self,
        url: str,
        tool: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        max_amount: str | int | None = None,
        idempotency_key: str | None = None,
    ) -> RoutedResponse:
        """See ``Router.call_tool``."""
        key = idempotency_key or new_idempotency_key()
        body = tool_body(url, tool, arguments, headers, max_amount)
        resp, _ = await self._send("POST", "route", key, body)
        return to_response(parse_body(resp), key, resp.headers.get("x-idempotent-replay") == "true")

    async def get_receipt(self, receipt_id: str) -> tuple[dict[str, Any], str | None]:
        resp, body = await self._send("GET", f"receipts/{quote(receipt_id, safe='')}", None, None)
        return body, resp.headers.get("x-payment-status")

    async def list_receipts(self, *, limit: int | None = None, cursor: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in {"limit": limit, "cursor": cursor}.items() if v is not None}
        _, body = await self._send("GET", "receipts", None, None, params)
        return body

    async def get_payment(self, idempotency_key: str) -> dict[str, Any] | None:
        try:
            _, body = await self._send("GET", "payments", None, None, {"idempotency_key": idempotency_key})
        except RouterError as e:
            if e.status == 404:
                return None
            raise
        return body

    async def get_budget(self) -> dict[str, Any]:
        _, body = await self._send("GET", "agents/me", None, None)
        return body

    async def discover(
        self,
        q: str | None = None,
        *,
        max_price: str | int | None = None,
        network: str | None = None,
        type: str | None = None,  # noqa: A002 (the API's name)
        payable: bool | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """See ``Router.discover``."""
        params = discover_params(q, max_price, network, type, payable, limit, cursor)
        _, body = await self._send("GET", "discovery", None, None, params)
        return body

    async def _send(self, method, path, key, json_body, params=None):
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            resp, failure = None, None
            try:
                resp = await self._http.request(method, path, headers=self._headers(key), json=json_body, params=params)
            except httpx.TransportError as e:
                failure = e
            result, wait = self._decide(resp, failure, key, attempt, started)
            if wait is None:
                if isinstance(result, Exception):
                    raise result
                return result
            await asyncio.sleep(wait)
