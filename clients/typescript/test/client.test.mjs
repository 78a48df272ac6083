// Tests of the TypeScript client against a real router, chain and paid test upstream, started by
// scripts/agent-clients-test (env: X402_ROUTER_URL, X402_ROUTER_AGENT_KEY, X402_TEST_UPSTREAM).
import assert from "node:assert/strict";
import http from "node:http";
import { describe, test } from "node:test";

import { Router, RouterError, classify, routerFetch } from "../dist/index.js";

const ROUTER = process.env.X402_ROUTER_URL;
const KEY = process.env.X402_ROUTER_AGENT_KEY;
const UPSTREAM = process.env.X402_TEST_UPSTREAM;
if (!ROUTER || !KEY || !UPSTREAM) {
  throw new Error("run through scripts/agent-clients-test (X402_ROUTER_URL, X402_ROUTER_AGENT_KEY, X402_TEST_UPSTREAM)");
}

async function stats(path) {
  const all = await (await fetch(`${UPSTREAM}/_stats`)).json();
  return all[path] ?? all.routes?.[path] ?? { requests: 0, paid: 0 };
}

/** A proxy in front of the router that forwards the first request and drops its answer. */
function dropFirstAnswerProxy(target) {
  let seen = 0;
  const server = http.createServer(async (req, res) => {
    seen += 1;
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const headers = { ...req.headers };
    delete headers.host;
    delete headers["content-length"];
    const upstream = await fetch(new URL(req.url, target), {
      method: req.method,
      headers,
      body: chunks.length ? Buffer.concat(chunks) : undefined,
    });
    const body = Buffer.from(await upstream.arrayBuffer());
    if (seen === 1) {
      req.socket.destroy(); // The router answered; the agent never hears it.
      return;
    }
    res.writeHead(upstream.status, Object.fromEntries(upstream.headers));
    res.end(body);
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () => resolve({ server, url: `http://127.0.0.1:${server.address().port}`, count: () => seen })),
  );
}

describe("routerFetch against a real router", () => {
  const router = new Router({ baseUrl: ROUTER, agentKey: KEY });

  test("a free call answers like fetch and carries a receipt", async () => {
    const res = await routerFetch(`${UPSTREAM}/free`);
    assert.equal(res.status, 200);
    assert.equal(res.payment, null);
    assert.match(res.receiptId, /^[0-9a-f-]{36}$/);
    assert.equal(res.replayed, false);
    assert.ok((await res.text()).length > 0);
  });

  test("a paid call pays once, and the same key replays without paying again", async () => {
    const before = await stats("/v2/weather");
    const first = await router.fetch(`${UPSTREAM}/v2/weather`, {}, { maxAmount: "50000" });
    assert.equal(first.status, 200);
    assert.equal(first.payment.status, "settled");
    assert.equal(first.payment.amount, "10000");
    const again = await router.fetch(`${UPSTREAM}/v2/weather`, {}, { maxAmount: "50000", idempotencyKey: first.idempotencyKey });
    assert.equal(again.replayed, true);
    assert.equal(again.receiptId, first.receiptId);
    assert.deepEqual(await again.json(), await first.json());
    const afterStats = await stats("/v2/weather");
    assert.equal(afterStats.paid - before.paid, 1);

    const { receipt, paymentStatus } = await router.getReceipt(first.receiptId);
    assert.equal(receipt.id, first.receiptId);
    assert.equal(receipt.payment.status, "settled");
    assert.equal(paymentStatus, "settled");
    const payment = await router.getPayment(first.idempotencyKey);
    assert.equal(payment.status, "settled");
    assert.equal(payment.new_key_safe, false);
    assert.equal(await router.getPayment("ts-never-used-key-0001"), null);
    const page = await router.listReceipts({ limit: 1 });
    assert.equal(page.receipts[0].id, first.receiptId, "newest first");
    assert.ok(page.nextCursor);
  });

  test("a price over maxAmount is a typed error: nothing paid, a new key is safe", async () => {
    await assert.rejects(router.fetch(`${UPSTREAM}/v2/weather`), (e) => {
      assert.ok(e instanceof RouterError);
      assert.equal(e.status, 402);
      assert.equal(e.code, "payment_over_max_amount");
      assert.equal(e.next, "new_key_safe");
      assert.equal(e.body.accepts[0].amount, "10000");
      return true;
    });
  });

  test("a lost answer is retried with the same key: one payment, the recorded answer", async () => {
    const proxy = await dropFirstAnswerProxy(ROUTER);
    try {
      const via = new Router({ baseUrl: proxy.url, agentKey: KEY });
      const before = await stats("/v2/echo");
      const res = await via.fetch(`${UPSTREAM}/v2/echo`, { method: "POST", body: { n: 1 } }, { maxAmount: "50000" });
      assert.equal(res.status, 200);
      assert.equal(res.replayed, true, "the second attempt read the first one's record");
      assert.equal(res.payment.status, "settled");
      assert.equal(proxy.count(), 2);
      assert.equal((await stats("/v2/echo")).paid - before.paid, 1);
    } finally {
      proxy.server.close();
    }
  });

  test("a duplicate while the first is in flight waits for Retry-After and gets the same answer", async () => {
    const key = `ts-inflight-${crypto.randomUUID()}`;
    const before = await stats("/v2/stall");
    const url = `${UPSTREAM}/v2/stall?seconds=2`;
    const [a, b] = await Promise.all([
      router.fetch(url, {}, { maxAmount: "50000", idempotencyKey: key }),
      new Promise((r) => setTimeout(r, 300)).then(() => router.fetch(url, {}, { maxAmount: "50000", idempotencyKey: key })),
    ]);
    assert.equal(a.receiptId, b.receiptId);
    assert.equal(b.replayed, true);
    assert.equal((await stats("/v2/stall")).paid - before.paid, 1);
  });

  test("an unreachable router is retried within the budget, then surfaces the key to retry", async () => {
    const dead = new Router({ baseUrl: "http://127.0.0.1:9", agentKey: KEY, retryBudgetMs: 1200 });
    await assert.rejects(dead.fetch(`${UPSTREAM}/free`, {}, { idempotencyKey: "ts-unreachable-0001" }), (e) => {
      assert.equal(e.code, "router_unreachable");
      assert.equal(e.next, "retry_same_key");
      assert.equal(e.idempotencyKey, "ts-unreachable-0001");
      return true;
    });
  });

  test("the budget is decimal strings per asset", async () => {
    const b = await router.getBudget();
    assert.match(b.spent, /^[0-9]+$/);
    assert.match(b.reserved, /^[0-9]+$/);
    assert.ok(Array.isArray(b.assets) && b.assets.length >= 1);
    assert.match(b.assets[0].spent, /^[0-9]+$/);
  });

  test("the retry table", () => {
    assert.equal(classify(409, { code: "idempotency_key_in_flight" }), "retry_same_key");
    assert.equal(classify(409, { code: "idempotency_key_reused" }), "fix_request");
    assert.equal(classify(503, { code: "database_unavailable" }), "retry_same_key");
    assert.equal(classify(429, { code: "rate_limited" }), "retry_same_key");
    assert.equal(classify(502, { code: "upstream_failed", payment: null }), "new_key_safe");
    assert.equal(classify(502, { code: "payment_rejected", payment: { status: "rejected" } }), "do_not_rekey");
    assert.equal(classify(502, { code: "permit2_allowance_required", payment: { status: "rejected" } }), "do_not_rekey");
    assert.equal(classify(502, { code: "upstream_failed", payment: { status: "expired" } }), "new_key_safe");
    assert.equal(classify(502, { code: "settled_response_lost", payment: { status: "settled_response_lost" } }), "do_not_rekey");
    assert.equal(classify(504, { code: "payment_unknown", payment: { status: "unknown" } }), "do_not_rekey");
    assert.equal(classify(202, { code: "approval_pending", approval: { id: "x" } }), "retry_same_key");
    assert.equal(classify(403, { code: "approval_denied" }), "new_key_safe");
    assert.equal(classify(403, { code: "approval_expired" }), "new_key_safe");
    assert.equal(classify(403, { code: "agent_disabled" }), "fix_request");
  });
});

describe("approvals against a real router", () => {
  test("a payment held for approval surfaces its key and terms, then pays once when approved", async () => {
    const router = new Router({ baseUrl: ROUTER, agentKey: process.env.X402_TEST_HELD_AGENT_KEY });
    const url = `${UPSTREAM}/v2/weather?city=ts-approval-${Date.now()}`;
    const before = (await stats("/v2/weather")).paid;
    let pending;
    await assert.rejects(router.fetch(url, {}, { maxAmount: "10000" }), (e) => {
      pending = e;
      return e instanceof RouterError && e.status === 202 && e.code === "approval_pending" && e.next === "retry_same_key";
    });
    assert.equal(pending.approval.amount, "10000");
    assert.equal(pending.approval.idempotency_key, pending.idempotencyKey);
    assert.equal(pending.retryAfter, 5);
    const decided = await fetch(`${ROUTER}/admin/approvals/${pending.approval.id}/approve`, {
      method: "POST",
      headers: { authorization: `Bearer ${process.env.X402_TEST_ADMIN_TOKEN}` },
    });
    assert.equal(decided.status, 200, await decided.text());
    const paid = await router.fetch(url, {}, { maxAmount: "10000", idempotencyKey: pending.idempotencyKey });
    assert.equal(paid.status, 200);
    assert.equal(paid.payment.status, "settled");
    assert.equal((await stats("/v2/weather")).paid, before + 1);
  });
});

describe("discover against a real router", () => {
  const router = new Router({ baseUrl: ROUTER, agentKey: KEY });

  test("a 402 that declares bazaar is discovered with its schema, price and what this agent may pay", async () => {
    const url = `${UPSTREAM}/v2/weather?bazaar=1&city=ts-client`;
    await assert.rejects(router.fetch(url), (e) => e instanceof RouterError && e.code === "payment_over_max_amount");
    const { resources, nextCursor } = await router.discover({ q: "weather", maxPrice: "1000000" });
    const found = resources.find((r) => r.url === `${UPSTREAM}/v2/weather` && r.source === "seen");
    assert.ok(found, JSON.stringify(resources));
    assert.equal(nextCursor, null);
    assert.equal(found.method, "GET");
    assert.equal(found.input.queryParams.city, "Paris");
    assert.ok(found.schema);
    const option = found.accepts[0];
    assert.match(option.amount, /^[1-9][0-9]*$/);
    assert.equal(option.payable, true, JSON.stringify(option));
    assert.equal(option.code, null);
    const unpayable = await router.discover({ q: "weather", payable: false });
    assert.ok(!unpayable.resources.some((r) => r.url === found.url && r.source === "seen"));
    assert.equal((await router.discover({ q: "weather", maxPrice: "1" })).resources.length, 0);
    await assert.rejects(router.discover({ q: "x".repeat(300) }), (e) => e instanceof RouterError && e.status === 400);
  });
});

const MCP_UPSTREAM = process.env.X402_TEST_MCP_UPSTREAM;

describe("callTool (paid MCP tools) against a real router", { skip: !MCP_UPSTREAM && "no X402_TEST_MCP_UPSTREAM" }, () => {
  const router = new Router({ baseUrl: ROUTER, agentKey: KEY });
  const executions = async (tool) => (await (await fetch(`${MCP_UPSTREAM}/_stats`)).json()).executions[tool] ?? 0;

  test("a paid tool is paid once, and the same key replays without paying again", async () => {
    const before = await executions("paid_echo");
    const first = await router.callTool(`${MCP_UPSTREAM}/mcp`, "paid_echo", { text: "ts" }, { maxAmount: "50000" });
    assert.equal(first.status, 200);
    assert.equal(first.payment.status, "settled");
    assert.deepEqual((await first.json()).structuredContent, { echo: "ts" });
    const again = await router.callTool(`${MCP_UPSTREAM}/mcp`, "paid_echo", { text: "ts" }, {
      maxAmount: "50000",
      idempotencyKey: first.idempotencyKey,
    });
    assert.equal(again.replayed, true);
    assert.equal(again.receiptId, first.receiptId);
    await assert.rejects(
      router.callTool(`${MCP_UPSTREAM}/mcp`, "paid_echo", { text: "other" }, { maxAmount: "50000", idempotencyKey: first.idempotencyKey }),
      (e) => e instanceof RouterError && e.status === 409 && e.code === "idempotency_key_reused",
    );
    assert.equal((await executions("paid_echo")) - before, 1);
  });

  test("a free tool answers unpaid", async () => {
    const res = await router.callTool(`${MCP_UPSTREAM}/mcp`, "free_echo", { text: "free" });
    assert.equal(res.status, 200);
    assert.equal(res.payment, null);
    assert.equal((await res.json()).content[0].text, "free echo: free");
  });
});
