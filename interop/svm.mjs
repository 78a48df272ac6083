// Interop check of the OFFICIAL x402 SVM packages over the local Solana test chain
// (tools/solana-chain, started by scripts/solana-chain). Driven by scripts/solana-interop:
//
//   node interop/svm.mjs --state STATEFILE [--count 5] [--v1-count 2] [--price 10000] [--test-upstream URL]
//
// In this process, all on 127.0.0.1 (the facilitator and the resource server are built by
// interop/svm-official.mjs, shared with interop/svm-server.mjs):
//   - the official facilitator: @x402/core x402Facilitator + @x402/svm's exact facilitator scheme
//     (v2 on CAIP-2 "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1" and v1 on "solana-devnet", the names
//     @x402/svm gives the chain whose genesis hash the local chain reports), its fee payer the
//     chain's fee-payer test key, every RPC call going to the local chain (defaultRpcUrl), served
//     over HTTP (GET /supported, POST /verify, POST /settle, GET /_exchanges) like interop/facilitator.mjs;
//   - an official express resource server: @x402/express (v2, GET /v2/sol) and the legacy
//     x402-express (v1, GET /v1/sol), both priced in the chain's test mint, payTo its pay_to key;
//   - the official client: @x402/fetch with @x402/svm's exact client schemes (v2 and v1), paying
//     with the chain's payer test key, its RPC the local chain.
// It pays /v2/sol --count times and /v1/sol --v1-count times, then counts on chain: pay_to's token
// balance rose by exactly (count + v1-count) × price, the payer's fell by as much, the payer's SOL
// did not move and the fee payer's SOL fell by exactly the fees of the settled transactions, each
// of which is a successful TransferChecked of the price. It also checks that a replay of a signed
// payment header is refused without moving money (by the server + facilitator, and by a second,
// fresh facilitator without settlement cache, whose answer the summary records), that the landed transaction sent again is
// refused by the chain (AlreadyProcessed), and that a payment whose blockhash expired before
// settlement (the chain advanced 151 blocks through its /_test/advance hook) is refused and moves
// nothing. Exit 0 only when everything holds; stdout's last line is a one-line JSON summary.
// The keys it uses are the chain's public, test-only fixtures (tools/solana-chain/keys).
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { createKeyPairSignerFromBytes, createSolanaRpc, getBase58Encoder } from "@solana/kit";
import { x402Facilitator } from "@x402/core/facilitator";
import { wrapFetchWithPaymentFromConfig } from "@x402/fetch";
import { TOKEN_PROGRAM_ADDRESS, toFacilitatorSvmSigner } from "@x402/svm";
import { registerExactSvmScheme } from "@x402/svm/exact/facilitator";
import { ExactSvmScheme as ExactSvmClientScheme } from "@x402/svm/exact/client";
import { ExactSvmSchemeV1 as ExactSvmClientSchemeV1 } from "@x402/svm/exact/v1/client";
import { NETWORK_V1, startOfficialSvm } from "./svm-official.mjs";

const { values: opts } = parseArgs({
  options: {
    state: { type: "string" },
    count: { type: "string", default: "5" },
    "v1-count": { type: "string", default: "2" },
    price: { type: "string", default: "10000" },
    "test-upstream": { type: "string" },
  },
});
const progress = (msg) => console.error(`[svm] ${msg}`);
const failures = [];
const check = (ok, what) => {
  if (!ok) failures.push(what);
  progress(`${ok ? "ok  " : "FAIL"} ${what}`);
  return ok;
};
if (!opts.state) {
  console.error("usage: node interop/svm.mjs --state STATEFILE [--count N] [--v1-count N] [--price ATOMIC]");
  process.exit(2);
}
const chain = JSON.parse(readFileSync(opts.state, "utf8"));
const COUNT = Number(opts.count);
const V1_COUNT = Number(opts["v1-count"]);
const PRICE = BigInt(opts.price);
const NETWORK = chain.network; // solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1 (devnet's CAIP-2 id)
const rpcUrl = chain.rpc_url;
const rpc = createSolanaRpc(rpcUrl);
const loadKey = (path) => createKeyPairSignerFromBytes(Uint8Array.from(JSON.parse(readFileSync(path, "utf8"))));
const feePayer = await loadKey(chain.keys.fee_payer);
const payer = await loadKey(chain.keys.payer);
const started = Date.now();

async function hook(path, body) {
  const r = await fetch(`${rpcUrl}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body ?? {}) });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

// ---- the official facilitator, over HTTP, and the official resource server (interop/svm-official.mjs)
const official = await startOfficialSvm({ chain, price: PRICE, feePayer, progress });
const exchanges = official.exchanges;
const srv = { server: official.server, url: official.serverUrl };
const fac = { server: official.facilitatorServer, url: official.facilitatorUrl };

// ---- the official client; its fetch records the payment headers it sends
const sent = [];
let beforePaidRetry = null; // an async hook run once before the next paid request leaves
const recordingFetch = async (input, init) => {
  const req = new Request(input, init);
  const header = req.headers.get("payment-signature") ?? req.headers.get("x-payment");
  if (header) {
    sent.push({ url: req.url, name: req.headers.has("payment-signature") ? "PAYMENT-SIGNATURE" : "X-PAYMENT", value: header });
    if (beforePaidRetry) {
      const h = beforePaidRetry;
      beforePaidRetry = null;
      await h();
    }
  }
  return fetch(req);
};
const pay = wrapFetchWithPaymentFromConfig(recordingFetch, {
  schemes: [
    { network: NETWORK, client: new ExactSvmClientScheme(payer, { rpcUrl }) },
    { network: NETWORK_V1, client: new ExactSvmClientSchemeV1(payer, { rpcUrl }), x402Version: 1 },
  ],
  spendControls: {
    allowedAssets: [
      { network: NETWORK, asset: chain.mint },
      { network: NETWORK_V1, asset: chain.mint },
    ],
  },
});

// ---- on-chain measurements
const tokenBalance = async (ata) => BigInt((await rpc.getTokenAccountBalance(ata, { commitment: "confirmed" }).send()).value.amount);
const lamports = async (addr) => (await rpc.getBalance(addr, { commitment: "confirmed" }).send()).value;
async function measure() {
  return {
    payTo: await tokenBalance(chain.pay_to_ata),
    payer: await tokenBalance(chain.payer_ata),
    payerSol: await lamports(chain.payer),
    feePayerSol: await lamports(chain.fee_payer),
  };
}
const decodeHeader = (v) => JSON.parse(Buffer.from(v, "base64").toString("utf8"));

const before = await measure();
const signatures = [];
// The project's own fixture (x402-test-upstream serve-svm, --test-upstream URL), paid by the
// official client before the official server: a faithful peer accepts what the official client sends.
const fixtureSignatures = [];
async function payOnce(path, version, base = srv.url, into = signatures) {
  const r = await pay(`${base}${path}`);
  const body = await r.text();
  const header = r.headers.get(version === 2 ? "payment-response" : "x-payment-response");
  let settled = null;
  try {
    settled = header ? decodeHeader(header) : null;
  } catch {
    settled = null;
  }
  const ok = r.status === 200 && settled?.success === true && typeof settled.transaction === "string" && settled.transaction.length > 0;
  check(ok, `pay ${path} (v${version}): HTTP ${r.status}, settled ${settled?.transaction ?? "-"}${ok ? "" : ` body ${body.slice(0, 300)}`}`);
  if (ok) into.push(settled.transaction);
  return ok;
}
if (opts["test-upstream"]) {
  await payOnce("/svm/v2/paid", 2, opts["test-upstream"], fixtureSignatures);
  await payOnce("/svm/v1/paid", 1, opts["test-upstream"], fixtureSignatures);
  check(fixtureSignatures.length === 2, "x402-test-upstream serve-svm accepted the official client's v2 and v1 payments");
}
for (let i = 0; i < COUNT; i++) await payOnce("/v2/sol", 2);
for (let i = 0; i < V1_COUNT; i++) await payOnce("/v1/sol", 1);
const afterPaying = await measure();

// ---- replay: the last signed v2 payment header again, and the landed transaction again
const lastV2 = [...sent].reverse().find((s) => s.name === "PAYMENT-SIGNATURE");
if (check(!!lastV2, "a v2 payment header was recorded")) {
  const r = await fetch(lastV2.url, { headers: { [lastV2.name]: lastV2.value } });
  await r.arrayBuffer();
  check(r.status !== 200, `replayed PAYMENT-SIGNATURE refused (HTTP ${r.status})`);
}
const lastV1 = [...sent].reverse().find((s) => s.name === "X-PAYMENT");
if (V1_COUNT > 0 && check(!!lastV1, "a v1 payment header was recorded")) {
  const r = await fetch(lastV1.url, { headers: { [lastV1.name]: lastV1.value } });
  await r.arrayBuffer();
  check(r.status !== 200, `replayed X-PAYMENT refused (HTTP ${r.status})`);
}
if (signatures.length) {
  const landedTx = await rpc.getTransaction(signatures[0], { commitment: "confirmed", encoding: "base64", maxSupportedTransactionVersion: 0 }).send();
  // Raw JSON-RPC, so that the chain's own answer is what is checked (with preflight).
  const r = await fetch(rpcUrl, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "sendTransaction", params: [landedTx.transaction[0], { encoding: "base64" }] }),
  });
  const answer = await r.json();
  const refused = answer.error?.code === -32002;
  const reason = JSON.stringify(answer.error?.data?.err ?? answer.result);
  check(refused && answer.error.data.err === "AlreadyProcessed", `the landed transaction sent again is refused by the chain (${reason})`);
}
// The same signed payment at a second, fresh official facilitator (no settlement cache): the
// facilitator signs the same message again (same signature), and the chain must not move money twice.
let freshReplay = null;
if (lastV2) {
  const fresh = new x402Facilitator();
  registerExactSvmScheme(fresh, { signer: toFacilitatorSvmSigner(feePayer, { defaultRpcUrl: rpcUrl }), networks: [NETWORK] });
  const payload = decodeHeader(lastV2.value);
  try {
    const answer = await fresh.settle(payload, payload.accepted);
    freshReplay = { success: answer.success, errorReason: answer.errorReason ?? null, transaction: answer.transaction || null };
  } catch (e) {
    freshReplay = { error: String(e?.message ?? e) };
  }
  const sameTx = freshReplay.transaction === signatures[COUNT - 1];
  progress(`a fresh facilitator settling the replayed payload answered ${JSON.stringify(freshReplay)}${sameTx ? " (the original transaction)" : ""}`);
  check(!freshReplay.success || sameTx, "a fresh facilitator reports no new transaction for the replayed payload");
}
const afterReplay = await measure();
check(
  afterReplay.payTo === afterPaying.payTo && afterReplay.payer === afterPaying.payer && afterReplay.feePayerSol === afterPaying.feePayerSol,
  "the replays moved no tokens and no SOL",
);

// ---- an expired blockhash: the client signs, the chain advances 151 blocks, then it is settled
beforePaidRetry = async () => {
  const { slot } = await hook("/_test/advance", { slots: 151 });
  progress(`advanced the chain 151 blocks (slot ${slot}) before the payment reaches the server`);
};
{
  const r = await pay(`${srv.url}/v2/sol`);
  await r.arrayBuffer();
  check(r.status !== 200, `a payment whose blockhash expired before settlement is refused (HTTP ${r.status})`);
}
const afterExpired = await measure();
check(
  afterExpired.payTo === afterReplay.payTo && afterExpired.payer === afterReplay.payer && afterExpired.feePayerSol === afterReplay.feePayerSol,
  "the expired payment moved no tokens and no SOL",
);

// ---- count on chain
const n = BigInt(COUNT + V1_COUNT + fixtureSignatures.length);
const payToDelta = afterExpired.payTo - before.payTo;
const payerDelta = afterExpired.payer - before.payer;
check(signatures.length === COUNT + V1_COUNT, `${signatures.length} settlements of ${COUNT + V1_COUNT} payments`);
const allSignatures = [...fixtureSignatures, ...signatures];
check(new Set(allSignatures).size === allSignatures.length, "every settlement has its own transaction");
check(payToDelta === n * PRICE, `pay_to's token balance rose by ${payToDelta} (expected ${n * PRICE})`);
check(payerDelta === -n * PRICE, `payer's token balance fell by ${-payerDelta} (expected ${n * PRICE})`);
check(afterExpired.payerSol === before.payerSol, `payer's SOL unchanged (${before.payerSol} -> ${afterExpired.payerSol})`);
let fees = 0n, transfers = 0;
for (const sig of allSignatures) {
  const st = (await rpc.getSignatureStatuses([sig]).send()).value[0];
  const tx = await rpc.getTransaction(sig, { commitment: "confirmed", encoding: "json", maxSupportedTransactionVersion: 0 }).send();
  const ok = st && st.err === null && tx && tx.meta.err === null;
  const feePayerIndex = tx ? tx.transaction.message.accountKeys.indexOf(chain.fee_payer) : -1;
  const pre = tx?.meta.preTokenBalances.find((b) => b.owner === chain.pay_to);
  const post = tx?.meta.postTokenBalances.find((b) => b.owner === chain.pay_to);
  const moved = pre && post ? BigInt(post.uiTokenAmount.amount) - BigInt(pre.uiTokenAmount.amount) : null;
  // The token instruction itself: TransferChecked (12) of exactly the price, to pay_to's ATA.
  const keys = tx?.transaction.message.accountKeys ?? [];
  const isTransferChecked = !!tx?.transaction.message.instructions.some((ix) => {
    const data = getBase58Encoder().encode(ix.data);
    return (
      keys[ix.programIdIndex] === TOKEN_PROGRAM_ADDRESS &&
      data[0] === 12 &&
      new DataView(data.buffer, data.byteOffset, data.byteLength).getBigUint64(1, true) === PRICE &&
      keys[ix.accounts[2]] === chain.pay_to_ata
    );
  });
  if (ok && feePayerIndex === 0 && moved === PRICE && isTransferChecked) transfers += 1;
  else check(false, `transaction ${sig}: status ${JSON.stringify(st?.err ?? null)}, fee payer index ${feePayerIndex}, moved ${moved}, TransferChecked ${isTransferChecked}`);
  if (tx) fees += BigInt(tx.meta.fee);
}
check(transfers === allSignatures.length, `${transfers} successful SPL TransferChecked of ${PRICE} to pay_to, fee payer first, found on chain`);
const feePayerDelta = before.feePayerSol - afterExpired.feePayerSol;
check(fees > 0n && feePayerDelta === fees, `the fee payer paid the fees: its SOL fell by ${feePayerDelta}, the transactions' fees sum to ${fees}`);

const summary = {
  ok: failures.length === 0,
  network: NETWORK,
  v2_payments: COUNT,
  v1_payments: V1_COUNT,
  settled: signatures.length,
  test_upstream_settled: fixtureSignatures.length,
  price: PRICE.toString(),
  pay_to_delta: payToDelta.toString(),
  payer_delta: payerDelta.toString(),
  payer_sol_delta: (afterExpired.payerSol - before.payerSol).toString(),
  fee_payer_sol_delta: (-feePayerDelta).toString(),
  fees: fees.toString(),
  fresh_facilitator_replay: freshReplay,
  failures,
  elapsed_ms: Date.now() - started,
};
if (failures.length) {
  progress(`facilitator exchanges: ${JSON.stringify(exchanges).slice(0, 4000)}`);
}
process.stdout.write(`${JSON.stringify(summary)}\n`);
srv.server.close();
fac.server.close();
srv.server.closeAllConnections();
fac.server.closeAllConnections();
process.exit(failures.length ? 1 : 0);
