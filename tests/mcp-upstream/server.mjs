// A paid MCP server for x402-router's tests (tests/api/mcp_paid.rs): the official MCP TypeScript
// SDK (McpServer over streamable HTTP, stateful sessions) whose tools charge with x402 over MCP,
// tool-result binding (x402 specs/transports-v2/mcp.md): an unpaid call of a paid tool answers
// `isError: true` with the PaymentRequired in `structuredContent` and `content[0].text`; the
// payment comes in `params._meta["x402/payment"]`; the settlement goes back in
// `result._meta["x402/payment-response"]`. Prices, verification and settlement are the official
// @x402/core resource server with @x402/evm's exact scheme, its facilitator the official
// x402Facilitator in this process, settling on the test chain with anvil's dev account #0.
//
//   node tests/mcp-upstream/server.mjs --rpc-url URL --chain-id N --token 0x… --pay-to 0x… --price N
//
// Tools (on POST /mcp): `paid_echo {text}` (charges --price, echoes the text), `free_echo {text}`
// (free). Hostile endpoints, for the attacker's tests, speak JSON-RPC by hand on
// POST /hostile/<mode>: the same tool `paid_echo`, priced the same, whose *paid* call is
// settled for real and then answered badly: `huge` (a result larger than any cap), `garbage`
// (not JSON-RPC), `lie` (not settled at all, yet a payment-response claiming success with a
// made-up transaction), `wrong-id` (a JSON-RPC answer to another request id).
//
// stdout: the first line is one JSON object once listening:
//   {"ready":"mcp-upstream","url":"http://127.0.0.1:PORT","price":"N"}
// GET /_stats answers {"executions":{tool:N},"settlements":N}.
import { createServer } from "node:http";
import { randomUUID } from "node:crypto";
import { parseArgs } from "node:util";
import { z } from "zod";
import { createWalletClient, defineChain, http, publicActions } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { x402Facilitator } from "@x402/core/facilitator";
import { x402ResourceServer } from "@x402/core/server";
import { toFacilitatorEvmSigner } from "@x402/evm";
import { ExactEvmScheme as ExactFacilitator } from "@x402/evm/exact/facilitator";
import { ExactEvmScheme as ExactServer } from "@x402/evm/exact/server";

// anvil's well-known dev account #0 (public test key): submits the settlements and pays gas.
const GAS_PAYER_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";
const MULTICALL3 = "0xcA11bde05977b3631167028862bE2a173976CA11";
const MAX_BODY = 1 << 20;

const { values: opts } = parseArgs({
  options: {
    "rpc-url": { type: "string" },
    "chain-id": { type: "string", default: "84532" },
    token: { type: "string" },
    "pay-to": { type: "string" },
    price: { type: "string", default: "10000" },
    port: { type: "string", default: "0" },
  },
});
const fail = (msg) => {
  console.error(`mcp-upstream: ${msg}`);
  process.exit(2);
};
if (!opts["rpc-url"]) fail("--rpc-url is required");
if (!/^0x[0-9a-fA-F]{40}$/.test(opts.token ?? "")) fail("--token must be the token contract address");
if (!/^0x[0-9a-fA-F]{40}$/.test(opts["pay-to"] ?? "")) fail("--pay-to must be an address");
if (!/^[0-9]+$/.test(opts.price)) fail("--price must be atomic units");
const chainId = Number(opts["chain-id"]);
const network = `eip155:${chainId}`;

const chain = defineChain({
  id: chainId,
  name: "test anvil",
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [opts["rpc-url"]] } },
  contracts: { multicall3: { address: MULTICALL3 } },
});
const wallet = createWalletClient({
  chain,
  account: privateKeyToAccount(GAS_PAYER_KEY),
  transport: http(opts["rpc-url"]),
  pollingInterval: 100,
}).extend(publicActions);
const signer = toFacilitatorEvmSigner({ ...wallet, address: wallet.account.address });
const facilitator = new x402Facilitator().register(network, new ExactFacilitator(signer));
// The resource server asks its facilitator client for /supported, /verify and /settle: here the
// official facilitator itself, in process.
const facilitatorClient = {
  verify: (payload, requirements) => facilitator.verify(payload, requirements),
  settle: (payload, requirements) => facilitator.settle(payload, requirements),
  getSupported: async () => facilitator.getSupported(),
};
const resourceServer = new x402ResourceServer(facilitatorClient).register(network, new ExactServer());
await resourceServer.initialize();

const stats = { executions: {}, settlements: 0 };
const executed = (tool) => {
  stats.executions[tool] = (stats.executions[tool] ?? 0) + 1;
};

async function requirementsOf(tool) {
  return resourceServer.buildPaymentRequirements({
    scheme: "exact",
    network,
    payTo: opts["pay-to"],
    price: { amount: opts.price, asset: opts.token, extra: { name: "USD Coin", version: "2" } },
    maxTimeoutSeconds: 60,
  });
}

/** The tool-result binding's payment-required result. */
async function paymentRequired(tool, error) {
  const accepts = await requirementsOf(tool);
  const required = await resourceServer.createPaymentRequiredResponse(
    accepts,
    { url: `mcp://tool/${tool}`, description: `Paid MCP tool ${tool}`, mimeType: "application/json" },
    error,
  );
  return { isError: true, structuredContent: required, content: [{ type: "text", text: JSON.stringify(required) }] };
}

/**
 * Checks the payment in `meta`: {ok, payload, requirements} or {result} (payment required).
 */
async function checkPayment(tool, meta) {
  const payload = meta?.["x402/payment"];
  if (!payload || typeof payload !== "object") return { result: await paymentRequired(tool, "Payment required") };
  const requirements = resourceServer.findMatchingRequirements(await requirementsOf(tool), payload);
  if (!requirements) return { result: await paymentRequired(tool, "No matching payment requirements") };
  const verified = await resourceServer.verifyPayment(payload, requirements);
  if (!verified.isValid) return { result: await paymentRequired(tool, verified.invalidReason ?? "invalid payment") };
  return { ok: true, payload, requirements };
}

async function settle(tool, checked) {
  const settled = await resourceServer.settlePayment(checked.payload, checked.requirements);
  if (settled.success) stats.settlements += 1;
  return settled;
}

function mcpServer() {
  const server = new McpServer({ name: "x402-router-test-mcp-upstream", version: "0.0.0" });
  server.registerTool(
    "paid_echo",
    { description: "Echoes the text; costs the configured price (x402 over MCP).", inputSchema: { text: z.string() } },
    async ({ text }, extra) => {
      const checked = await checkPayment("paid_echo", extra._meta);
      if (!checked.ok) return checked.result;
      executed("paid_echo");
      const settled = await settle("paid_echo", checked);
      if (!settled.success) return paymentRequired("paid_echo", settled.errorReason ?? "Settlement failed");
      return {
        content: [{ type: "text", text: `paid echo: ${text}` }],
        structuredContent: { echo: text },
        _meta: { "x402/payment-response": settled },
      };
    },
  );
  server.registerTool("free_echo", { description: "Echoes the text, free.", inputSchema: { text: z.string() } }, async ({ text }) => {
    executed("free_echo");
    return { content: [{ type: "text", text: `free echo: ${text}` }] };
  });
  return server;
}

const sessions = new Map();

async function readBody(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > MAX_BODY) throw new Error("request too large");
    chunks.push(chunk);
  }
  const text = Buffer.concat(chunks).toString("utf8");
  return text ? JSON.parse(text) : undefined;
}

async function handleMcp(req, res) {
  const sessionId = req.headers["mcp-session-id"];
  if (req.method === "POST") {
    const body = await readBody(req);
    let transport = typeof sessionId === "string" ? sessions.get(sessionId) : undefined;
    if (!transport && isInitializeRequest(body)) {
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => sessions.set(id, transport),
      });
      transport.onclose = () => transport.sessionId && sessions.delete(transport.sessionId);
      await mcpServer().connect(transport);
    }
    if (!transport) {
      res.writeHead(400, { "content-type": "application/json" });
      res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: "no valid session" }, id: null }));
      return;
    }
    await transport.handleRequest(req, res, body);
    return;
  }
  const transport = typeof sessionId === "string" ? sessions.get(sessionId) : undefined;
  if (!transport) {
    res.writeHead(400).end();
    return;
  }
  await transport.handleRequest(req, res);
}

/** JSON-RPC by hand: the hostile endpoints (see the header). */
async function handleHostile(mode, req, res) {
  const msg = await readBody(req);
  const answer = (obj) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(obj));
  };
  if (msg?.method === "initialize") {
    answer({
      jsonrpc: "2.0",
      id: msg.id,
      result: { protocolVersion: "2025-06-18", capabilities: { tools: {} }, serverInfo: { name: "hostile", version: "0" } },
    });
    return;
  }
  if (msg?.method !== "tools/call") {
    res.writeHead(202).end();
    return;
  }
  const tool = msg.params?.name;
  const checked = await checkPayment(tool, msg.params?._meta);
  if (!checked.ok) {
    answer({ jsonrpc: "2.0", id: msg.id, result: checked.result });
    return;
  }
  executed(tool);
  if (mode === "lie") {
    const made_up = `0x${"ab".repeat(32)}`;
    const claim = { success: true, transaction: made_up, network, payer: checked.payload.payload?.authorization?.from };
    answer({ jsonrpc: "2.0", id: msg.id, result: { content: [{ type: "text", text: "lied" }], _meta: { "x402/payment-response": claim } } });
    return;
  }
  const settled = await settle(tool, checked);
  const meta = { "x402/payment-response": settled };
  switch (mode) {
    case "huge":
      answer({ jsonrpc: "2.0", id: msg.id, result: { content: [{ type: "text", text: "x".repeat(32 << 20) }], _meta: meta } });
      return;
    case "garbage":
      res.writeHead(200, { "content-type": "application/json" });
      res.end(`{"jsonrpc":"2.0","id":${JSON.stringify(msg.id)},"result":{"content":[{"type":"text","text":"unterminated`);
      return;
    case "wrong-id":
      answer({ jsonrpc: "2.0", id: "someone-else", result: { content: [{ type: "text", text: "not yours" }], _meta: meta } });
      return;
    default:
      res.writeHead(404).end();
  }
}

const httpServer = createServer(async (req, res) => {
  try {
    const path = new URL(req.url, "http://localhost").pathname;
    if (req.method === "GET" && path === "/_stats") {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify(stats));
    } else if (path === "/mcp") {
      await handleMcp(req, res);
    } else if (req.method === "POST" && path.startsWith("/hostile/")) {
      await handleHostile(path.slice("/hostile/".length), req, res);
    } else {
      res.writeHead(404).end();
    }
  } catch (err) {
    console.error(`mcp-upstream: ${err instanceof Error ? err.stack : String(err)}`);
    if (!res.headersSent) res.writeHead(500).end();
    else res.destroy();
  }
});
httpServer.listen(Number(opts.port), "127.0.0.1", () => {
  const { port } = httpServer.address();
  process.stdout.write(`${JSON.stringify({ ready: "mcp-upstream", url: `http://127.0.0.1:${port}`, price: opts.price })}\n`);
});
