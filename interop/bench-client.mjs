// The official x402 client (@x402/fetch and @x402/evm) paying one URL `count` times,
// `concurrency` at a time, for scripts/bench's paid comparison. Prints one JSON line shaped
// like examples/bench_paid.rs: {requests, ok, errors, first_error, duration_s, rps, latency_us}.
//
//   node bench-client.mjs --url URL --network eip155:N --asset 0x… --count N --concurrency C
//   (key: ROUTER_PRIVATE_KEY)
import { wrapFetchWithPaymentFromConfig } from "@x402/fetch";
import { ExactEvmScheme } from "@x402/evm";
import { privateKeyToAccount } from "viem/accounts";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => (a.startsWith("--") ? [...pairs, [a.slice(2), all[i + 1]]] : pairs), []),
);
const count = Number(args.count), concurrency = Number(args.concurrency);
if (!args.url || !args.network || !args.asset || !(count > 0) || !(concurrency > 0)) {
  console.error("usage: bench-client.mjs --url URL --network eip155:N --asset 0x… --count N --concurrency C");
  process.exit(2);
}
const key = (process.env.ROUTER_PRIVATE_KEY || "").trim();
if (!key) {
  console.error("ROUTER_PRIVATE_KEY is required");
  process.exit(2);
}
const account = privateKeyToAccount(key.startsWith("0x") ? key : `0x${key}`);
const pay = wrapFetchWithPaymentFromConfig(fetch, {
  schemes: [{ network: args.network, client: new ExactEvmScheme(account) }],
  // The local test token is no default asset: allowed by name, uncapped (the router's own
  // limits are off in the benchmark too).
  spendControls: { allowedAssets: [{ network: args.network, asset: args.asset }] },
});

const latencies = [];
let errors = 0, firstError = null, next = 0;
const started = process.hrtime.bigint();
async function worker() {
  while (next++ < count) {
    const t = process.hrtime.bigint();
    try {
      const r = await pay(args.url);
      await r.arrayBuffer();
      if (r.status !== 200) throw new Error(`status ${r.status}`);
      latencies.push(Number((process.hrtime.bigint() - t) / 1000n));
    } catch (e) {
      errors += 1;
      firstError ??= String(e && e.message ? e.message : e);
    }
  }
}
await Promise.all(Array.from({ length: concurrency }, worker));
const secs = Number(process.hrtime.bigint() - started) / 1e9;
latencies.sort((a, b) => a - b);
const pct = (p) => (latencies.length ? latencies[Math.min(latencies.length - 1, Math.ceil((p / 100) * latencies.length) - 1)] : 0);
const mean = latencies.length ? latencies.reduce((a, b) => a + b, 0) / latencies.length : 0;
console.log(JSON.stringify({
  requests: latencies.length + errors, ok: latencies.length, errors, first_error: firstError,
  duration_s: secs, rps: latencies.length / secs,
  latency_us: { p50: pct(50), p99: pct(99), p999: pct(99.9), max: latencies.at(-1) ?? 0, mean },
}));
