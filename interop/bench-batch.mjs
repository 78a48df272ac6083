// Per-call latency of a paid call with a batch-settlement voucher against one with `exact`, for
// scripts/bench --batch (scripts/bench.d/batch): the router (POST /route) and the official client
// (@x402/fetch with @x402/evm's batch-settlement and exact clients) each pay interop/server.mjs
// directly, one call at a time: GET /v2/batch (a voucher; the channel's deposit is made by a
// warm-up call first, not measured) and GET /v2/weather (exact: the facilitator settles each
// call on-chain and waits for its block). The upstream's own time of each measured call is read
// from the server's log (`handled_ms`: from the request's arrival to its answer's end, its x402
// middleware and voucher check included).
//
//   node bench-batch.mjs --router URL --server URL --server-log FILE --network eip155:N --asset 0x…
//                        [--vouchers 200] [--exacts 10] [--warmup 3]
//   (BENCH_API_KEY: the router's agent key; ROUTER_PRIVATE_KEY: the official client's payer)
//
// stdout: one JSON object {clients: {name: {ok, errors, first_error, latency_ms, upstream_ms}}}.
import { parseArgs } from "node:util";
import { readFileSync } from "node:fs";
import { randomUUID } from "node:crypto";
import { createPublicClient, defineChain, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { wrapFetchWithPaymentFromConfig } from "@x402/fetch";
import { ExactEvmScheme, toClientEvmSigner } from "@x402/evm";
import { BatchSettlementEvmScheme } from "@x402/evm/batch-settlement/client";

const { values: opts } = parseArgs({
  options: {
    router: { type: "string" },
    server: { type: "string" },
    "server-log": { type: "string" },
    "rpc-url": { type: "string" },
    network: { type: "string" },
    asset: { type: "string" },
    vouchers: { type: "string", default: "200" },
    exacts: { type: "string", default: "10" },
    warmup: { type: "string", default: "3" },
  },
});
const vouchers = Number(opts.vouchers), exacts = Number(opts.exacts), warmup = Number(opts.warmup);
const apiKey = process.env.BENCH_API_KEY, key = process.env.ROUTER_PRIVATE_KEY;
if (!opts.router || !opts.server || !opts["server-log"] || !opts["rpc-url"] || !opts.network || !opts.asset
  || !(vouchers > 0) || !(exacts > 0) || !(warmup >= 1) || !apiKey || !key) {
  console.error("usage: bench-batch.mjs --router URL --server URL --server-log FILE --rpc-url URL --network N --asset 0x… [--vouchers 200] [--exacts 10] [--warmup 3] (BENCH_API_KEY, ROUTER_PRIVATE_KEY)");
  process.exit(2);
}
const server = opts.server.replace(/\/+$/, "");
const chain = defineChain({
  id: Number(opts.network.split(":")[1]),
  name: "bench anvil",
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [opts["rpc-url"]] } },
});
const pub = createPublicClient({ chain, transport: http(opts["rpc-url"]) });
const account = privateKeyToAccount(key.startsWith("0x") ? key : `0x${key}`);
const spendControls = { allowedAssets: [{ network: opts.network, asset: opts.asset }] };
// One deposit covers every measured call (the router's X402_BATCH_DEPOSIT_MULTIPLIER is the same).
const officialBatch = wrapFetchWithPaymentFromConfig(fetch, {
  schemes: [{
    network: opts.network,
    client: new BatchSettlementEvmScheme(toClientEvmSigner(account, pub), { depositPolicy: { depositMultiplier: 1000 } }),
  }],
  spendControls,
});
const officialExact = wrapFetchWithPaymentFromConfig(fetch, {
  schemes: [{ network: opts.network, client: new ExactEvmScheme(account) }],
  spendControls,
});

// The server's log lines so far (one JSON object per paid-route request).
const logLines = () => readFileSync(opts["server-log"], "utf8").split("\n").filter(Boolean);

async function viaRouter(path, maxAmount) {
  const r = await fetch(`${opts.router}/route`, {
    method: "POST",
    headers: { authorization: `Bearer ${apiKey}`, "idempotency-key": randomUUID(), "content-type": "application/json" },
    body: JSON.stringify({ url: `${server}${path}`, max_amount: maxAmount }),
  });
  const body = await r.json();
  if (r.status !== 200 || body.status !== 200) throw new Error(`router ${r.status}: ${JSON.stringify(body).slice(0, 300)}`);
}

async function direct(pay, path) {
  const r = await pay(`${server}${path}`);
  await r.arrayBuffer();
  if (r.status !== 200) throw new Error(`status ${r.status}`);
}

const pct = (xs, p) => (xs.length ? xs[Math.min(xs.length - 1, Math.ceil((p / 100) * xs.length) - 1)] : null);
const stats = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return { n: s.length, p50: pct(s, 50), p99: pct(s, 99), max: s.at(-1) ?? null };
};

// `warmup` calls not measured, then `count` calls one at a time; the upstream's own time of the
// measured ones, from the lines the server logged for their path meanwhile.
async function measure(call, path, count) {
  for (let i = 0; i < warmup; i++) await call();
  const from = logLines().length;
  const lat = [];
  let errors = 0, firstError = null;
  for (let i = 0; i < count; i++) {
    const t = process.hrtime.bigint();
    try {
      await call();
      lat.push(Number(process.hrtime.bigint() - t) / 1e6);
    } catch (e) {
      errors += 1;
      firstError ??= String(e?.message ?? e);
    }
  }
  const seen = logLines().slice(from).map((l) => JSON.parse(l)).filter((l) => l.request?.url?.startsWith(path));
  const paid = seen.filter((l) => l.request["payment-signature (decoded)"] && l.response?.status === 200);
  const unpaid = seen.filter((l) => !l.request["payment-signature (decoded)"]);
  return {
    ok: lat.length, errors, first_error: firstError, latency_ms: stats(lat),
    // The server's own time of the paid requests; the unpaid ones (a probe answered 402) apart.
    upstream_ms: stats(paid.map((l) => l.handled_ms)),
    unpaid_requests: unpaid.length,
    unpaid_ms: stats(unpaid.map((l) => l.handled_ms)),
  };
}

const clients = {};
clients["router batch-settlement"] = await measure(() => viaRouter("/v2/batch", "1000"), "/v2/batch", vouchers);
clients["official batch-settlement"] = await measure(() => direct(officialBatch, "/v2/batch"), "/v2/batch", vouchers);
clients["router exact"] = await measure(() => viaRouter("/v2/weather", "10000"), "/v2/weather", exacts);
clients["official exact"] = await measure(() => direct(officialExact, "/v2/weather"), "/v2/weather", exacts);
console.log(JSON.stringify({ vouchers, exacts, warmup, clients }));
