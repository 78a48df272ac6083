// The official x402 client (@x402/fetch and @x402/evm) paying one URL `count` times,
// `concurrency` at a time, for scripts/bench's paid comparison. Prints one JSON line shaped
// like examples/bench_paid.rs: {requests, ok, errors, first_error, duration_s, rps, latency_us},
// plus every latency (latencies_us) with --latencies. --warmup N: N calls at the same
// concurrency before the measurement, not counted (they open the connections a steady client
// keeps). --barrier PREFIX: after the warm-up, create PREFIX.warm and wait (at most 120 s) for
// PREFIX.go before measuring (the caller reads its counters in between).
//
//   node bench-client.mjs --url URL --network eip155:N --asset 0x… --count N --concurrency C
//                         [--warmup N] [--barrier PREFIX] [--latencies]   (key: ROUTER_PRIVATE_KEY)
import { wrapFetchWithPaymentFromConfig } from "@x402/fetch";
import { ExactEvmScheme } from "@x402/evm";
import { existsSync, writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import { privateKeyToAccount } from "viem/accounts";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((pairs, a, i, all) => (a.startsWith("--") ? [...pairs, [a.slice(2), all[i + 1]]] : pairs), []),
);
const count = Number(args.count), concurrency = Number(args.concurrency), warmup = Number(args.warmup ?? 0);
if (!args.url || !args.network || !args.asset || !(count > 0) || !(concurrency > 0) || !(warmup >= 0)) {
  console.error("usage: bench-client.mjs --url URL --network eip155:N --asset 0x… --count N --concurrency C [--warmup N] [--barrier PREFIX] [--latencies]");
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

// `total` calls, `concurrency` at a time; the latencies (µs) of those that paid and got 200.
async function run(total) {
  const out = { latencies: [], errors: 0, firstError: null };
  let next = 0;
  async function worker() {
    while (next++ < total) {
      const t = process.hrtime.bigint();
      try {
        const r = await pay(args.url);
        await r.arrayBuffer();
        if (r.status !== 200) throw new Error(`status ${r.status}`);
        out.latencies.push(Number((process.hrtime.bigint() - t) / 1000n));
      } catch (e) {
        out.errors += 1;
        out.firstError ??= String(e && e.message ? e.message : e);
      }
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker));
  return out;
}

if (warmup > 0) {
  const w = await run(warmup);
  if (w.errors) {
    console.error(`${w.errors} warm-up call(s) failed: ${w.firstError}`);
    process.exit(1);
  }
}
if (args.barrier) {
  writeFileSync(`${args.barrier}.warm`, "");
  const deadline = Date.now() + 120_000;
  while (!existsSync(`${args.barrier}.go`)) {
    if (Date.now() > deadline) {
      console.error(`no ${args.barrier}.go within 120 s`);
      process.exit(1);
    }
    await sleep(10);
  }
}
const started = process.hrtime.bigint();
const { latencies, errors, firstError } = await run(count);
const secs = Number(process.hrtime.bigint() - started) / 1e9;
latencies.sort((a, b) => a - b);
const pct = (p) => (latencies.length ? latencies[Math.min(latencies.length - 1, Math.ceil((p / 100) * latencies.length) - 1)] : 0);
const mean = latencies.length ? latencies.reduce((a, b) => a + b, 0) / latencies.length : 0;
console.log(JSON.stringify({
  requests: latencies.length + errors, ok: latencies.length, errors, first_error: firstError,
  duration_s: secs, rps: latencies.length / secs,
  latency_us: { p50: pct(50), p99: pct(99), p999: pct(99.9), max: latencies.at(-1) ?? 0, mean },
  ...("latencies" in args ? { latencies_us: latencies } : {}),
}));
