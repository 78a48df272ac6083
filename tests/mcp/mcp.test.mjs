// x402-router's MCP server, driven by the official MCP TypeScript SDK against a real router,
// chain and paid test upstream (started by scripts/agent-clients-test; env X402_ROUTER_URL,
// X402_ROUTER_AGENT_KEY, X402_TEST_UPSTREAM, X402_ROUTER_BIN).
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const ROUTER = process.env.X402_ROUTER_URL;
const KEY = process.env.X402_ROUTER_AGENT_KEY;
const UPSTREAM = process.env.X402_TEST_UPSTREAM;
const BIN = process.env.X402_ROUTER_BIN;
if (!ROUTER || !KEY || !UPSTREAM || !BIN) {
  throw new Error("run through scripts/agent-clients-test");
}

async function paidCount(path) {
  const all = await (await fetch(`${UPSTREAM}/_stats`)).json();
  return all.routes[path]?.paid ?? 0;
}

async function stdioClient(extraEnv = {}) {
  const transport = new StdioClientTransport({
    command: BIN,
    args: ["mcp"],
    env: { X402_ROUTER_URL: ROUTER, X402_ROUTER_AGENT_KEY: KEY, RUST_LOG: "warn", PATH: process.env.PATH ?? "", ...extraEnv },
    stderr: "inherit",
  });
  const client = new Client({ name: "x402-router-tests", version: "0.0.0" });
  await client.connect(transport);
  return client;
}

async function httpClient() {
  const transport = new StreamableHTTPClientTransport(new URL("/mcp", ROUTER), {
    requestInit: { headers: { Authorization: `Bearer ${KEY}` } },
  });
  const client = new Client({ name: "x402-router-tests", version: "0.0.0" });
  await client.connect(transport);
  return { client, transport };
}

async function checkTools(client) {
  const { tools } = await client.listTools();
  assert.deepEqual(tools.map((t) => t.name).sort(), ["call_tool", "discover", "fetch", "get_budget", "get_receipt"]);
  const callTool = tools.find((t) => t.name === "call_tool");
  assert.deepEqual(callTool.inputSchema.required, ["url", "tool"]);
  assert.match(callTool.description, /x402 over MCP/);
  const discoverTool = tools.find((t) => t.name === "discover");
  assert.match(discoverTool.description, /Prices are only advertised/);
  assert.equal(discoverTool.inputSchema.additionalProperties, false);
  const fetchTool = tools.find((t) => t.name === "fetch");
  assert.match(fetchTool.description, /max_amount is the most this one call may pay/);
  assert.match(fetchTool.description, /Never make up a new idempotency_key to retry/);
  assert.deepEqual(fetchTool.inputSchema.required, ["url"]);
  assert.equal(fetchTool.inputSchema.properties.max_amount.type, "string");
}

/** A 402 that declares bazaar, seen through `fetch`, is found by `discover` with its schema. */
async function checkDiscover(client) {
  const probe = await client.callTool({ name: "fetch", arguments: { url: `${UPSTREAM}/v2/weather?bazaar=1&city=mcp` } });
  assert.equal(probe.structuredContent.code, "payment_over_max_amount");
  const r = await client.callTool({ name: "discover", arguments: { q: "weather", max_price: "50000", payable: true } });
  assert.equal(r.isError, false, JSON.stringify(r));
  const found = r.structuredContent.resources.find((x) => x.url === `${UPSTREAM}/v2/weather` && x.source === "seen");
  assert.ok(found, JSON.stringify(r.structuredContent));
  assert.equal(found.method, "GET");
  assert.equal(found.input.queryParams.city, "Paris");
  assert.equal(found.accepts[0].amount, "10000");
  assert.equal(found.accepts[0].payable, true);
  const bad = await client.callTool({ name: "discover", arguments: { max_price: "1.5" } });
  assert.equal(bad.isError, true);
  assert.equal(bad.structuredContent.http_status, 400);
  await assert.rejects(client.callTool({ name: "discover", arguments: { nope: 1 } }));
}

const MCP_UPSTREAM = process.env.X402_TEST_MCP_UPSTREAM;

/** call_tool pays a paid tool of another MCP server once; its key replays. */
async function checkCallTool(client) {
  if (!MCP_UPSTREAM) return;
  const executions = async () => (await (await fetch(`${MCP_UPSTREAM}/_stats`)).json()).executions.paid_echo ?? 0;
  const before = await executions();
  const args = { url: `${MCP_UPSTREAM}/mcp`, tool: "paid_echo", arguments: { text: "sdk" }, max_amount: "50000" };
  const paid = await client.callTool({ name: "call_tool", arguments: args });
  assert.equal(paid.isError, false, JSON.stringify(paid));
  const r = paid.structuredContent;
  assert.equal(r.payment.status, "settled");
  assert.deepEqual(r.response.body.structuredContent, { echo: "sdk" });
  const retried = await client.callTool({ name: "call_tool", arguments: { ...args, idempotency_key: r.idempotency_key } });
  assert.equal(retried.structuredContent.replayed, true);
  assert.equal(await executions(), before + 1);
}

async function checkPaidFetch(client, path) {
  const before = await paidCount(path);
  const paid = await client.callTool({ name: "fetch", arguments: { url: `${UPSTREAM}${path}`, max_amount: "50000" } });
  assert.equal(paid.isError, false, JSON.stringify(paid));
  const r = paid.structuredContent;
  assert.equal(r.http_status, 200);
  assert.equal(r.next, "done");
  assert.equal(r.payment.status, "settled");
  assert.match(r.idempotency_key, /^mcp_[0-9a-f]{40}$/);
  assert.equal(await paidCount(path), before + 1);

  const receipt = await client.callTool({ name: "get_receipt", arguments: { receipt_id: r.receipt_id } });
  assert.equal(receipt.isError, false);
  assert.equal(receipt.structuredContent.receipt.id, r.receipt_id);
  assert.equal(receipt.structuredContent.payment_status_now, "settled");

  const byKey = await client.callTool({ name: "get_receipt", arguments: { idempotency_key: r.idempotency_key } });
  assert.equal(byKey.isError, false);
  assert.equal(byKey.structuredContent.status, "settled");
  assert.equal(byKey.structuredContent.new_key_safe, false);

  // The model retries with the key it was given: the recorded answer, no second payment.
  const retried = await client.callTool({
    name: "fetch",
    arguments: { url: `${UPSTREAM}${path}`, max_amount: "50000", idempotency_key: r.idempotency_key },
  });
  assert.equal(retried.structuredContent.replayed, true);
  assert.equal(retried.structuredContent.receipt_id, r.receipt_id);
  assert.equal(await paidCount(path), before + 1);

  const budget = await client.callTool({ name: "get_budget", arguments: {} });
  assert.equal(budget.isError, false);
  assert.match(budget.structuredContent.spent, /^[0-9]+$/);
  assert.ok(BigInt(budget.structuredContent.spent) >= 10000n);
  return r;
}

// A paid upstream slower than the tool's wait bound (`waitSeconds`) and than the client's own
// request timeout: the tool must answer within the bound with the call's idempotency_key
// (progress notifications meanwhile), the call goes on and pays once, and the model collects
// the answer by calling fetch again with that key, never a new one.
async function checkBoundedFetch(client, waitSeconds) {
  const path = "/v2/slow-settle";
  const url = `${UPSTREAM}${path}?seconds=${waitSeconds * 2 + 2}&case=${Math.random().toString(36).slice(2)}`;
  const clientTimeoutMs = (waitSeconds + 3) * 1000;
  const before = await paidCount(path);
  const progress = [];
  const started = Date.now();
  const first = await client.callTool({ name: "fetch", arguments: { url, max_amount: "50000" } }, undefined, {
    timeout: clientTimeoutMs,
    onprogress: (p) => progress.push(p),
  });
  assert.ok(Date.now() - started < clientTimeoutMs, "answered before the client's timeout");
  const r = first.structuredContent;
  assert.equal(r.code, "fetch_in_progress", JSON.stringify(r));
  assert.equal(r.next, "retry_same_key");
  assert.match(r.idempotency_key, /^mcp_[0-9a-f]{40}$/);
  assert.match(r.advice, /this idempotency_key/);
  assert.ok(progress.length >= 1, "progress notifications while the call ran");
  assert.match(progress[0].message, new RegExp(r.idempotency_key));

  // The model collects the answer with the key it was given.
  let done;
  const deadline = Date.now() + 60_000;
  while (!done) {
    assert.ok(Date.now() < deadline, "the call never finished");
    const again = await client.callTool(
      { name: "fetch", arguments: { url, max_amount: "50000", idempotency_key: r.idempotency_key } },
      undefined,
      { timeout: clientTimeoutMs },
    );
    const a = again.structuredContent;
    if (a.next === "done") {
      done = a;
    } else {
      assert.equal(a.code, "fetch_in_progress", JSON.stringify(a));
    }
  }
  assert.equal(done.idempotency_key, r.idempotency_key);
  assert.equal(done.payment.status, "settled");
  assert.equal(await paidCount(path), before + 1, "one payment on-chain for the call");
  const receipt = await client.callTool({ name: "get_receipt", arguments: { receipt_id: done.receipt_id } });
  assert.equal(receipt.isError, false);
  assert.equal(receipt.structuredContent.payment_status_now, "settled");
}

describe("x402-router mcp (stdio)", () => {
  test("a fetch slower than MCP_FETCH_WAIT_SECONDS answers in time with its key, and pays once", async () => {
    const client = await stdioClient({ MCP_FETCH_WAIT_SECONDS: "2" });
    try {
      await checkBoundedFetch(client, 2);
    } finally {
      await client.close();
    }
  });

  test("lists five tools whose descriptions explain the price cap and keys", async () => {
    const client = await stdioClient();
    try {
      await checkTools(client);
    } finally {
      await client.close();
    }
  });

  test("discover finds a paid API from a 402 the router saw, with its schema and price", async () => {
    const client = await stdioClient();
    try {
      await checkDiscover(client);
    } finally {
      await client.close();
    }
  });

  test("fetch pays once; get_receipt and get_budget read the record", async () => {
    const client = await stdioClient();
    try {
      await checkPaidFetch(client, "/v2/weather");
      await checkCallTool(client);
    } finally {
      await client.close();
    }
  });

  test("without max_amount nothing is paid and the result says a new key is safe", async () => {
    const client = await stdioClient();
    try {
      const before = await paidCount("/v2/weather");
      const r = await client.callTool({ name: "fetch", arguments: { url: `${UPSTREAM}/v2/weather` } });
      assert.equal(r.isError, true);
      assert.equal(r.structuredContent.code, "payment_over_max_amount");
      assert.equal(r.structuredContent.next, "new_key_safe");
      assert.equal(r.structuredContent.response.accepts[0].amount, "10000");
      assert.equal(await paidCount("/v2/weather"), before);
    } finally {
      await client.close();
    }
  });
});

describe("/mcp (streamable HTTP)", () => {
  test("needs the agent's bearer key", async () => {
    const init = { jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-11-25", capabilities: {}, clientInfo: { name: "t", version: "0" } } };
    const resp = await fetch(new URL("/mcp", ROUTER), {
      method: "POST",
      headers: { "content-type": "application/json", accept: "application/json, text/event-stream" },
      body: JSON.stringify(init),
    });
    assert.equal(resp.status, 401);
    assert.equal((await resp.json()).code, "unauthorized");
  });

  test("a fetch slower than MCP_FETCH_WAIT_SECONDS answers in time with its key, and pays once", async () => {
    const { client } = await httpClient();
    try {
      await checkBoundedFetch(client, Number(process.env.X402_MCP_FETCH_WAIT_SECONDS ?? "5"));
    } finally {
      await client.close();
    }
  });

  test("lists the tools, pays once, reads receipt and budget, discovers", async () => {
    const { client } = await httpClient();
    try {
      await checkTools(client);
      await checkPaidFetch(client, "/v2/weather");
      await checkDiscover(client);
      await checkCallTool(client);
    } finally {
      await client.close();
    }
  });

  test("a client re-sending the same tools/call (same JSON-RPC id) reuses the derived key", async () => {
    const { client, transport } = await httpClient();
    try {
      const before = await paidCount("/v2/weather");
      const message = {
        jsonrpc: "2.0",
        id: "resent-call-1",
        method: "tools/call",
        params: { name: "fetch", arguments: { url: `${UPSTREAM}/v2/weather`, max_amount: "50000" } },
      };
      const post = async () => {
        const resp = await fetch(new URL("/mcp", ROUTER), {
          method: "POST",
          headers: {
            authorization: `Bearer ${KEY}`,
            "content-type": "application/json",
            accept: "application/json, text/event-stream",
            "mcp-session-id": transport.sessionId,
            "mcp-protocol-version": transport.protocolVersion ?? "2025-11-25",
          },
          body: JSON.stringify(message),
        });
        assert.equal(resp.status, 200);
        const text = await resp.text();
        const json = resp.headers.get("content-type").includes("json")
          ? JSON.parse(text)
          : JSON.parse(text.split("\n").filter((l) => l.startsWith("data:") && l.length > 6).map((l) => l.slice(5)).pop());
        return json.result.structuredContent;
      };
      const first = await post();
      const second = await post();
      assert.equal(first.payment.status, "settled");
      assert.equal(second.idempotency_key, first.idempotency_key);
      assert.equal(second.receipt_id, first.receipt_id);
      assert.equal(second.replayed, true);
      assert.equal(await paidCount("/v2/weather"), before + 1);
    } finally {
      await client.close();
    }
  });
});
