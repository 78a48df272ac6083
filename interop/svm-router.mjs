// The router paying on Solana, checked from outside. Driven by scripts/solana-interop:
//
//   node interop/svm-router.mjs --state CHAIN_STATE --router URL --api-key KEY --price N \
//        --route NAME=URL [--route NAME=URL …]
//
// For each route (the project's fixture, x402-test-upstream serve-svm, and the OFFICIAL @x402/svm
// facilitator and express servers, v2 and v1), one POST /route through a running x402-router
// whose Solana wallet is the chain's payer test key: the answer is 200 with a `settled` payment
// naming a transaction that the chain shows landed, successful, carrying exactly one transfer of
// the price from the payer to pay_to; a replay of the same Idempotency-Key is the same answer and
// moves nothing. Then the money is counted on chain: pay_to rose by routes × price and the payer
// fell by as much (the payer's SOL did not move: the upstreams' fee payers pay the fees). Exit 0
// only when everything holds; stdout's last line is a one-line JSON summary.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

const { values: opts } = parseArgs({
  options: {
    state: { type: "string" },
    router: { type: "string" },
    "api-key": { type: "string" },
    price: { type: "string", default: "10000" },
    route: { type: "string", multiple: true, default: [] },
  },
});
if (!opts.state || !opts.router || !opts["api-key"] || opts.route.length === 0) {
  console.error("usage: node interop/svm-router.mjs --state F --router URL --api-key K --route NAME=URL …");
  process.exit(2);
}
const progress = (msg) => console.error(`[svm-router] ${msg}`);
const failures = [];
const check = (ok, what) => {
  if (!ok) failures.push(what);
  progress(`${ok ? "ok  " : "FAIL"} ${what}`);
  return ok;
};
const chain = JSON.parse(readFileSync(opts.state, "utf8"));
const price = BigInt(opts.price);
const runId = Math.random().toString(36).slice(2, 10);

const rpc = async (method, params) => {
  const r = await fetch(chain.rpc_url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }),
  });
  const j = await r.json();
  if (j.error) throw new Error(`${method}: ${JSON.stringify(j.error)}`);
  return j.result;
};
const tokenBalance = async (account) =>
  BigInt((await rpc("getTokenAccountBalance", [account, { commitment: "confirmed" }])).value.amount);
const solBalance = async (address) => BigInt((await rpc("getBalance", [address, { commitment: "confirmed" }])).value);
const balances = async () => ({
  payer: await tokenBalance(chain.payer_ata),
  payTo: await tokenBalance(chain.pay_to_ata),
  payerSol: await solBalance(chain.payer),
});

const route = async (key, url) => {
  const r = await fetch(`${opts.router}/route`, {
    method: "POST",
    headers: {
      authorization: `Bearer ${opts["api-key"]}`,
      "idempotency-key": key,
      "content-type": "application/json",
    },
    body: JSON.stringify({ url, max_amount: price.toString() }),
  });
  return { status: r.status, text: await r.text(), replay: r.headers.get("x-idempotent-replay") };
};

// The token balance changes a landed transaction made, by account.
const moved = (tx) => {
  const by = new Map();
  const accounts = tx.transaction.message.accountKeys;
  for (const b of tx.meta.preTokenBalances ?? []) by.set(accounts[b.accountIndex], -BigInt(b.uiTokenAmount.amount));
  for (const b of tx.meta.postTokenBalances ?? []) {
    const k = accounts[b.accountIndex];
    by.set(k, (by.get(k) ?? 0n) + BigInt(b.uiTokenAmount.amount));
  }
  return by;
};

const before = await balances();
const results = [];
for (const spec of opts.route) {
  const [name, url] = [spec.slice(0, spec.indexOf("=")), spec.slice(spec.indexOf("=") + 1)];
  const key = `svm-interop-${runId}-${name}`;
  const start = await balances();
  const first = await route(key, url);
  let env = {};
  try {
    env = JSON.parse(first.text);
  } catch {}
  const p = env.payment ?? {};
  check(first.status === 200 && p.status === "settled", `${name}: 200 and settled (got ${first.status} ${first.text.slice(0, 300)})`);
  check(p.network === chain.network && p.payer === chain.payer && p.amount === price.toString(), `${name}: the payment names the chain, the payer and the price`);
  let landed = null;
  if (typeof p.tx_hash === "string") {
    landed = await rpc("getTransaction", [p.tx_hash, { encoding: "json", commitment: "confirmed", maxSupportedTransactionVersion: 0 }]);
  }
  check(landed !== null && landed.meta.err === null, `${name}: the chain shows its transaction ${p.tx_hash} landed and succeeded`);
  if (landed) {
    const m = moved(landed);
    check(m.get(chain.pay_to_ata) === price && m.get(chain.payer_ata) === -price, `${name}: that transaction moved exactly the price from the payer to pay_to`);
  }
  const after = await balances();
  check(after.payTo - start.payTo === price && start.payer - after.payer === price, `${name}: balances moved by the price once`);
  const again = await route(key, url);
  check(again.status === first.status && again.text === first.text && again.replay === "true", `${name}: a replay is the same answer`);
  const replayed = await balances();
  check(replayed.payTo === after.payTo && replayed.payer === after.payer, `${name}: the replay moved nothing`);
  results.push({ name, status: first.status, payment: p.status, tx: p.tx_hash ?? null });
}
const end = await balances();
const n = BigInt(opts.route.length);
check(end.payTo - before.payTo === n * price, `pay_to rose by ${n} × ${price} in all`);
check(before.payer - end.payer === n * price, `the payer fell by ${n} × ${price} in all`);
check(end.payerSol === before.payerSol, "the payer's SOL did not move (the upstreams' fee payers paid the fees)");
console.log(JSON.stringify({ check: "svm-router", passed: failures.length === 0, routes: results, failures }));
process.exit(failures.length === 0 ? 0 : 1);
