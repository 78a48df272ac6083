// A local x402 facilitator made of the official packages: @x402/core's x402Facilitator with
// @x402/evm's "exact" EVM schemes, for x402 v2 (CAIP-2 "eip155:84532") and v1 ("base-sepolia"),
// its "upto" scheme (v2) and its "batch-settlement" scheme (v2). Permit2 payments settle through
// the Permit2 and x402 proxy contracts, batch-settlement deposits, claims, settles and refunds
// through the project's own channel contract and deposit collectors (contracts/X402BatchSettlement.sol,
// contracts/*DepositCollector.sol), all installed at their canonical addresses by the deploy step.
// For batch-settlement it advertises a receiver authorizer (anvil's dev account #3) in /supported
// and signs the claim batches and refunds of servers that delegate that role to it.
// It verifies payments and settles them on a local chain (anvil) with anvil's dev account #0 as
// the transaction sender. Used by scripts/interop; binds 127.0.0.1 only.
//
//   node interop/facilitator.mjs --rpc-url http://127.0.0.1:8545 [--port 0] [--gas-payer-key 0x…]
//   (or INTEROP_RPC_URL / INTEROP_FACILITATOR_PORT; port 0 = any free port; --gas-payer-key: another
//   funded dev account's key, when account #0 sends transactions of its own on that chain, as the
//   project's test upstream does in scripts/chaos)
//
// With the official Bazaar extension registered (@x402/extensions/bazaar: BAZAAR advertised in
// /supported, extractDiscoveryInfo on every verified payment), it keeps an in-memory catalogue
// of the resources whose payments echoed a `bazaar` declaration, as the official example
// facilitator does, and serves it at GET /discovery/resources (filters type, payTo, scheme,
// network, extensions; paging limit, offset; {x402Version, items, pagination}).
//
// HTTP: GET /supported, POST /verify, POST /settle, GET /discovery/resources, GET /healthz, and one test hook:
//   POST /_pending {"count": N}: the next N waits for a settlement's receipt fail as viem's
//   waitForTransactionReceipt does when it times out (WaitForTransactionReceiptTimeoutError),
//   after the transaction was broadcast (anvil mines it at once). The official schemes then
//   answer `settlement_pending` with the transaction hash, and the official resource server
//   retries the settlement once (the facilitator waits for the same transaction again): N = 2
//   makes the paying client see `settlement_pending`. Only the viem client given to the
//   official signer is wrapped; the facilitator's answers are its own.
// stdout: first line is one JSON object once listening:
//   {"ready":"facilitator","url":"http://127.0.0.1:PORT","signer":"0x…","rpc_url":"…"}
// then one JSON line per verify/settle exchange (request and answer), for diagnosis.
import { parseArgs } from "node:util";
import express from "express";
import { WaitForTransactionReceiptTimeoutError, createWalletClient, defineChain, http, publicActions } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { x402Facilitator } from "@x402/core/facilitator";
import { toFacilitatorEvmSigner } from "@x402/evm";
import { ExactEvmScheme } from "@x402/evm/exact/facilitator";
import { ExactEvmSchemeV1 } from "@x402/evm/exact/v1/facilitator";
import { UptoEvmScheme } from "@x402/evm/upto/facilitator";
import { BatchSettlementEvmScheme } from "@x402/evm/batch-settlement/facilitator";
import { BAZAAR, extractDiscoveryInfo } from "@x402/extensions/bazaar";

// anvil's well-known dev account #0 (public test key): submits the settlements and pays gas.
const GAS_PAYER_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";
// anvil's dev account #3 (public test key): the batch-settlement receiver authorizer it offers.
const RECEIVER_AUTHORIZER_KEY = "0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6";
const CHAIN_ID = 84532; // Base Sepolia's chain id, so both network spellings below apply
const NETWORK_V2 = `eip155:${CHAIN_ID}`;
const NETWORK_V1 = "base-sepolia";
const MULTICALL3 = "0xcA11bde05977b3631167028862bE2a173976CA11";

const { values: opts } = parseArgs({
  options: {
    "rpc-url": { type: "string", default: process.env.INTEROP_RPC_URL },
    port: { type: "string", default: process.env.INTEROP_FACILITATOR_PORT || "0" },
    "gas-payer-key": { type: "string", default: GAS_PAYER_KEY },
  },
});
if (!opts["rpc-url"]) {
  console.error("facilitator: --rpc-url (or INTEROP_RPC_URL) is required");
  process.exit(2);
}
const rpcUrl = opts["rpc-url"];
const port = Number(opts.port);
if (!Number.isInteger(port) || port < 0 || port > 65535) {
  console.error(`facilitator: bad port ${opts.port}`);
  process.exit(2);
}

const chain = defineChain({
  id: CHAIN_ID,
  name: "interop anvil",
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [rpcUrl] } },
  // The EVM scheme names failure reasons with a Multicall3 read; the deploy step installs it.
  contracts: { multicall3: { address: MULTICALL3 } },
});
const wallet = createWalletClient({
  chain,
  account: privateKeyToAccount(opts["gas-payer-key"]),
  transport: http(rpcUrl),
  pollingInterval: 100, // anvil mines at once: don't wait viem's default 4 s for receipts
}).extend(publicActions);
// POST /_pending: how many of the next receipt waits fail as a timeout would.
let failingReceiptWaits = 0;
const emit = (obj) => process.stdout.write(`${JSON.stringify({ at: new Date().toISOString(), ...obj })}\n`);
const signer = toFacilitatorEvmSigner(
  {
    ...wallet,
    address: wallet.account.address,
    waitForTransactionReceipt: async (args) => {
      if (failingReceiptWaits > 0) {
        failingReceiptWaits -= 1;
        emit({ op: "receipt_wait_timed_out", hash: args.hash, still_failing: failingReceiptWaits });
        throw new WaitForTransactionReceiptTimeoutError({ hash: args.hash });
      }
      return wallet.waitForTransactionReceipt(args);
    },
  },
  { confirmationTimeoutMs: 30_000 },
);

const facilitator = new x402Facilitator()
  .register(NETWORK_V2, new ExactEvmScheme(signer))
  .registerV1(NETWORK_V1, new ExactEvmSchemeV1(signer));
facilitator.register(NETWORK_V2, new UptoEvmScheme(signer));
facilitator.register(NETWORK_V2, new BatchSettlementEvmScheme(signer, privateKeyToAccount(RECEIVER_AUTHORIZER_KEY)));

// The Bazaar catalogue: resource key (URL, method or tool) -> the official DiscoveryResource shape.
const catalogue = new Map();
facilitator.registerExtension(BAZAAR).onAfterVerify(async ({ paymentPayload, requirements }) => {
  let found = null;
  try {
    found = extractDiscoveryInfo(paymentPayload, requirements, true);
  } catch (err) {
    emit({ op: "catalogue", error: err instanceof Error ? err.message : String(err) });
  }
  if (!found) return;
  const key = `${found.resourceUrl} ${found.method ?? found.toolName ?? ""}`;
  catalogue.set(key, {
    resource: found.resourceUrl,
    type: found.discoveryInfo.input.type,
    x402Version: found.x402Version,
    accepts: [requirements],
    lastUpdated: new Date().toISOString(),
    description: found.description,
    mimeType: found.mimeType,
    serviceName: found.serviceName,
    tags: found.tags,
    extensions: found.extensions,
  });
  emit({ op: "catalogued", resource: found.resourceUrl, method: found.method ?? null, tool: found.toolName ?? null });
});

const app = express();
app.disable("x-powered-by");
app.use(express.json({ limit: "256kb" }));

app.get("/healthz", (_req, res) => res.json({ ok: true }));
app.get("/supported", (_req, res) => res.json(facilitator.getSupported()));
app.get("/discovery/resources", (req, res) => {
  const q = (name) => (typeof req.query[name] === "string" ? req.query[name] : undefined);
  const limit = Math.max(1, Math.min(Number.parseInt(q("limit") ?? "100", 10) || 100, 1000));
  const offset = Math.max(0, Number.parseInt(q("offset") ?? "0", 10) || 0);
  const items = [...catalogue.values()].filter(
    (r) =>
      (!q("type") || r.type === q("type")) &&
      (!q("extensions") || Object.hasOwn(r.extensions ?? {}, q("extensions"))) &&
      r.accepts.some(
        (a) =>
          (!q("payTo") || a.payTo?.toLowerCase() === q("payTo").toLowerCase()) &&
          (!q("scheme") || a.scheme === q("scheme")) &&
          (!q("network") || a.network === q("network")),
      ),
  );
  emit({ op: "discovery_resources", query: req.query, total: items.length });
  res.json({ x402Version: 2, items: items.slice(offset, offset + limit), pagination: { limit, offset, total: items.length } });
});

// verify and settle take the same body: {x402Version, paymentPayload, paymentRequirements}.
function exchange(op) {
  return async (req, res) => {
    const { paymentPayload, paymentRequirements } = req.body ?? {};
    if (typeof paymentPayload !== "object" || typeof paymentRequirements !== "object" || !paymentPayload || !paymentRequirements) {
      emit({ op, error: "missing paymentPayload/paymentRequirements", request: req.body ?? null });
      res.status(400).json({ error: "body must carry paymentPayload and paymentRequirements objects" });
      return;
    }
    try {
      const result = await facilitator[op](paymentPayload, paymentRequirements);
      emit({ op, request: req.body, response: result });
      res.json(result);
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      emit({ op, request: req.body, error: message });
      res.status(500).json({ error: message });
    }
  };
}
app.post("/verify", exchange("verify"));
app.post("/settle", exchange("settle"));
app.post("/_pending", (req, res) => {
  const count = req.body?.count;
  if (!Number.isInteger(count) || count < 0 || count > 100) {
    res.status(400).json({ error: "count must be an integer in 0..=100" });
    return;
  }
  failingReceiptWaits = count;
  emit({ op: "_pending", count });
  res.json({ failing_receipt_waits: failingReceiptWaits });
});

const server = app.listen(port, "127.0.0.1", () => {
  const { port: bound } = server.address();
  process.stdout.write(
    `${JSON.stringify({ ready: "facilitator", url: `http://127.0.0.1:${bound}`, signer: wallet.account.address, rpc_url: rpcUrl })}\n`,
  );
});
server.on("error", (err) => {
  console.error(`facilitator: ${err.message}`);
  process.exit(1);
});
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, () => {
    server.close(() => process.exit(0));
    server.closeAllConnections();
    setTimeout(() => process.exit(0), 1000).unref();
  });
}
