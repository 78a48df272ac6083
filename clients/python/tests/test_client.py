"""Tests of the Python client against a real router, chain and paid test upstream, started by
scripts/agent-clients-test (env: X402_ROUTER_URL, X402_ROUTER_AGENT_KEY, X402_TEST_UPSTREAM)."""

from __future__ import annotations

import asyncio
import http.server
import os
import threading
import uuid

import httpx
import pytest

from x402_router_client import AsyncRouter, Router, RouterError, classify

ROUTER = os.environ.get("X402_ROUTER_URL")
KEY = os.environ.get("X402_ROUTER_AGENT_KEY")
UPSTREAM = os.environ.get("X402_TEST_UPSTREAM")
MCP_UPSTREAM = os.environ.get("X402_TEST_MCP_UPSTREAM")

if not (ROUTER and KEY and UPSTREAM):
    raise RuntimeError("run through scripts/agent-clients-test (X402_ROUTER_URL, X402_ROUTER_AGENT_KEY, X402_TEST_UPSTREAM)")


def stats(path: str) -> dict:
    return httpx.get(f"{UPSTREAM}/_stats").json()["routes"].get(path, {"requests": 0, "paid": 0})


class DropFirstAnswerProxy:
    """Forwards every request to the router, but drops the answer to the first one."""

    def __init__(self, target: str) -> None:
        self.count = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                proxy.count += 1
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                answer = httpx.request("POST", target.rstrip("/") + self.path, headers=headers, content=body, timeout=80)
                if proxy.count == 1:
                    self.close_connection = True
                    self.connection.close()  # the router answered; the agent never hears it
                    return
                self.send_response(answer.status_code)
                for k, v in answer.headers.items():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "DropFirstAnswerProxy":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def router():
    with Router(ROUTER, KEY) as r:
        yield r


def test_a_free_call_answers_with_a_receipt_and_no_payment(router: Router) -> None:
    r = router.fetch(f"{UPSTREAM}/free")
    assert r.status_code == 200
    assert r.payment is None
    assert len(r.receipt_id) == 36
    assert r.replayed is False


def test_a_paid_call_pays_once_and_the_same_key_replays(router: Router) -> None:
    before = stats("/v2/weather")
    first = router.fetch(f"{UPSTREAM}/v2/weather", max_amount="50000")
    assert first.status_code == 200
    assert first.payment["status"] == "settled"
    again = router.fetch(f"{UPSTREAM}/v2/weather", max_amount="50000", idempotency_key=first.idempotency_key)
    assert again.replayed is True
    assert again.receipt_id == first.receipt_id
    assert again.json() == first.json()
    assert stats("/v2/weather")["paid"] - before["paid"] == 1
    receipt, payment_status = router.get_receipt(first.receipt_id)
    assert receipt["payment"]["status"] == "settled"
    assert payment_status == "settled"
    payment = router.get_payment(first.idempotency_key)
    assert payment["status"] == "settled" and payment["new_key_safe"] is False
    assert router.get_payment("py-never-used-key-0001") is None
    page = router.list_receipts(limit=1)
    assert page["receipts"][0]["id"] == first.receipt_id
    assert page["next_cursor"]


def mcp_executions(tool: str) -> int:
    return httpx.get(f"{MCP_UPSTREAM}/_stats").json()["executions"].get(tool, 0)


@pytest.mark.skipif(not MCP_UPSTREAM, reason="no paid MCP upstream (X402_TEST_MCP_UPSTREAM)")
def test_call_tool_pays_a_paid_mcp_tool_once_and_the_same_key_replays(router: Router) -> None:
    before = mcp_executions("paid_echo")
    first = router.call_tool(f"{MCP_UPSTREAM}/mcp", "paid_echo", {"text": "py"}, max_amount="50000")
    assert first.status_code == 200
    assert first.json()["structuredContent"] == {"echo": "py"}
    assert first.payment["status"] == "settled"
    again = router.call_tool(
        f"{MCP_UPSTREAM}/mcp", "paid_echo", {"text": "py"}, max_amount="50000", idempotency_key=first.idempotency_key
    )
    assert again.replayed is True and again.receipt_id == first.receipt_id
    with pytest.raises(RouterError) as other:
        router.call_tool(
            f"{MCP_UPSTREAM}/mcp", "paid_echo", {"text": "other"}, max_amount="50000", idempotency_key=first.idempotency_key
        )
    assert other.value.code == "idempotency_key_reused"
    assert mcp_executions("paid_echo") - before == 1


@pytest.mark.skipif(not MCP_UPSTREAM, reason="no paid MCP upstream (X402_TEST_MCP_UPSTREAM)")
def test_async_call_tool_calls_a_free_mcp_tool_unpaid() -> None:
    async def run() -> None:
        async with AsyncRouter(ROUTER, KEY) as r:
            resp = await r.call_tool(f"{MCP_UPSTREAM}/mcp", "free_echo", {"text": "async"})
            assert resp.status_code == 200 and resp.payment is None
            assert resp.json()["content"][0]["text"] == "free echo: async"

    asyncio.run(run())


def test_a_price_over_max_amount_is_a_typed_error_and_a_new_key_is_safe(router: Router) -> None:
    with pytest.raises(RouterError) as err:
        router.fetch(f"{UPSTREAM}/v2/weather")
    assert err.value.status == 402
    assert err.value.code == "payment_over_max_amount"
    assert err.value.next == "new_key_safe"
    assert err.value.body["accepts"][0]["amount"] == "10000"


def test_a_lost_answer_is_retried_with_the_same_key_and_pays_once() -> None:
    before = stats("/v2/echo")
    with DropFirstAnswerProxy(ROUTER) as proxy, Router(proxy.url, KEY) as via:
        r = via.fetch(f"{UPSTREAM}/v2/echo", method="POST", json={"n": 2}, max_amount="50000")
        assert r.status_code == 200
        assert r.replayed is True
        assert r.payment["status"] == "settled"
        assert proxy.count == 2
    assert stats("/v2/echo")["paid"] - before["paid"] == 1


def test_an_unreachable_router_is_retried_then_surfaces_the_key() -> None:
    with Router("http://127.0.0.1:9", KEY, retry_budget=1.2) as dead:
        with pytest.raises(RouterError) as err:
            dead.fetch(f"{UPSTREAM}/free", idempotency_key="py-unreachable-0001")
    assert err.value.code == "router_unreachable"
    assert err.value.next == "retry_same_key"
    assert err.value.idempotency_key == "py-unreachable-0001"


def test_async_duplicates_in_flight_wait_and_share_one_payment() -> None:
    async def main() -> None:
        key = f"py-inflight-{uuid.uuid4()}"
        url = f"{UPSTREAM}/v2/stall?seconds=2"
        before = stats("/v2/stall")
        async with AsyncRouter(ROUTER, KEY) as router:

            async def late():
                await asyncio.sleep(0.3)
                return await router.fetch(url, max_amount="50000", idempotency_key=key)

            a, b = await asyncio.gather(router.fetch(url, max_amount="50000", idempotency_key=key), late())
            assert a.receipt_id == b.receipt_id
            assert b.replayed is True
            budget = await router.get_budget()
            assert budget["spent"].isdigit()
        assert stats("/v2/stall")["paid"] - before["paid"] == 1

    asyncio.run(main())


def test_the_budget_is_decimal_strings_per_asset(router: Router) -> None:
    b = router.get_budget()
    assert b["spent"].isdigit() and b["reserved"].isdigit()
    assert b["assets"] and b["assets"][0]["spent"].isdigit()


def test_the_retry_table() -> None:
    assert classify(409, {"code": "idempotency_key_in_flight"}) == "retry_same_key"
    assert classify(409, {"code": "idempotency_key_reused"}) == "fix_request"
    assert classify(503, {"code": "database_unavailable"}) == "retry_same_key"
    assert classify(429, {"code": "rate_limited"}) == "retry_same_key"
    assert classify(502, {"code": "upstream_failed", "payment": None}) == "new_key_safe"
    assert classify(502, {"code": "payment_rejected", "payment": {"status": "rejected"}}) == "do_not_rekey"
    assert classify(502, {"code": "permit2_allowance_required", "payment": {"status": "rejected"}}) == "do_not_rekey"
    assert classify(502, {"code": "upstream_failed", "payment": {"status": "expired"}}) == "new_key_safe"
    assert classify(502, {"code": "settled_response_lost", "payment": {"status": "settled_response_lost"}}) == "do_not_rekey"
    assert classify(504, {"code": "payment_unknown", "payment": {"status": "unknown"}}) == "do_not_rekey"
    assert classify(202, {"code": "approval_pending", "approval": {"id": "x"}}) == "retry_same_key"
    assert classify(403, {"code": "approval_denied"}) == "new_key_safe"
    assert classify(403, {"code": "approval_expired"}) == "new_key_safe"
    assert classify(403, {"code": "agent_disabled"}) == "fix_request"


def test_discover_finds_a_seen_402_with_its_schema_and_what_this_agent_may_pay() -> None:
    with Router(ROUTER, KEY) as router:
        with pytest.raises(RouterError) as declined:
            router.fetch(f"{UPSTREAM}/v2/echo?bazaar=1", method="POST", json={"hello": "py"})
        assert declined.value.code == "payment_over_max_amount"
        page = router.discover("echo", max_price=1_000_000, type="http")
        found = [r for r in page["resources"] if r["url"] == f"{UPSTREAM}/v2/echo" and r["source"] == "seen"]
        assert len(found) == 1, page
        echo = found[0]
        assert echo["method"] == "POST" and echo["input"]["bodyType"] == "json"
        assert echo["accepts"][0]["payable"] is True, echo
        assert router.discover("echo", max_price=1)["resources"] == []
        with pytest.raises(RouterError) as bad:
            router.discover(limit=1000)
        assert bad.value.status == 400


def test_async_discover_pages_with_the_cursor() -> None:
    async def main() -> None:
        async with AsyncRouter(ROUTER, KEY) as router:
            with pytest.raises(RouterError):
                await router.fetch(f"{UPSTREAM}/v2/weather?bazaar=1&city=py")
            with pytest.raises(RouterError):
                await router.fetch(f"{UPSTREAM}/v2/echo?bazaar=1", method="POST", json={"hello": "py"})
            first = await router.discover(limit=1)
            assert len(first["resources"]) == 1 and first["next_cursor"], first
            second = await router.discover(limit=1, cursor=first["next_cursor"])
            assert second["resources"] and second["resources"][0]["url"] != first["resources"][0]["url"], second

    asyncio.run(main())



def test_a_payment_held_for_approval_surfaces_its_key_and_terms_then_pays_once_when_approved() -> None:
    held_key, admin = os.environ["X402_TEST_HELD_AGENT_KEY"], os.environ["X402_TEST_ADMIN_TOKEN"]
    url = f"{UPSTREAM}/v2/weather?city=py-approval-{uuid.uuid4().hex[:8]}"
    before = stats("/v2/weather")["paid"]
    with Router(ROUTER, held_key) as router:
        with pytest.raises(RouterError) as pending:
            router.fetch(url, max_amount="10000")
        e = pending.value
        assert (e.status, e.code, e.next) == (202, "approval_pending", "retry_same_key")
        assert e.approval is not None and e.approval["amount"] == "10000" and e.approval["state"] == "pending"
        assert e.approval["idempotency_key"] == e.idempotency_key
        assert e.retry_after == 5
        decided = httpx.post(
            f"{ROUTER}/admin/approvals/{e.approval['id']}/approve", headers={"authorization": f"Bearer {admin}"}
        )
        assert decided.status_code == 200, decided.text
        r = router.fetch(url, max_amount="10000", idempotency_key=e.idempotency_key)
        assert r.status_code == 200 and r.payment is not None and r.payment["status"] == "settled"
        again = router.fetch(url, max_amount="10000", idempotency_key=e.idempotency_key)
        assert again.replayed and again.receipt_id == r.receipt_id
    assert stats("/v2/weather")["paid"] == before + 1
