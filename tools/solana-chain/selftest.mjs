// Self-test of the local Solana test chain's payment-safety semantics, over its JSON-RPC and its
// test hooks (run by scripts/solana-interop before the official x402 check; or by hand):
//
//   node tools/solana-chain/selftest.mjs --state STATEFILE     (STATEFILE from scripts/solana-chain)
//
// Checks: a failed SPL transfer lands as failed (err in getSignatureStatuses and getTransaction,
// fee charged, no token moved); a signature lands at most once (preflight: -32002 AlreadyProcessed;
// skipPreflight: same signature answered, nothing executed twice); a blockhash is valid for 150
// blocks and refused after (-32002 BlockhashNotFound; dropped with skipPreflight: status stays null);
// base58 and base64 encodings; /_test/hold + /_test/release (signature answered, status null until
// released); unknown signatures answer null; "finalized" 32 slots after landing; getFeeForMessage
// agrees with the fee charged. It stops the chain's slot timer while it runs (/_test/slot-ms). Exit 0 only when all hold; stdout's last line is a JSON summary.
// Keys: the chain's public, test-only fixtures (tools/solana-chain/keys).
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import {
  appendTransactionMessageInstruction,
  compileTransactionMessage,
  createKeyPairSignerFromBytes,
  createTransactionMessage,
  getBase58Decoder,
  getBase64Decoder,
  getBase64EncodedWireTransaction,
  getCompiledTransactionMessageEncoder,
  getSignatureFromTransaction,
  getTransactionEncoder,
  pipe,
  setTransactionMessageFeePayerSigner,
  setTransactionMessageLifetimeUsingBlockhash,
  signTransactionMessageWithSigners,
} from "@solana/kit";
import { getTransferCheckedInstruction } from "@solana-program/token";

const { values: opts } = parseArgs({ options: { state: { type: "string" } } });
if (!opts.state) {
  console.error("usage: node tools/solana-chain/selftest.mjs --state STATEFILE");
  process.exit(2);
}
const chain = JSON.parse(readFileSync(opts.state, "utf8"));
const url = chain.rpc_url;
const failures = [];
const check = (ok, what) => {
  if (!ok) failures.push(what);
  console.error(`[chain-selftest] ${ok ? "ok  " : "FAIL"} ${what}`);
};
let id = 0;
async function call(method, params = []) {
  const r = await fetch(url, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: ++id, method, params }),
  });
  return r.json();
}
async function result(method, params) {
  const a = await call(method, params);
  if (a.error) throw new Error(`${method}: ${JSON.stringify(a.error)}`);
  return a.result;
}
async function hook(path, body) {
  const r = await fetch(`${url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body ?? {}) });
  return r.json();
}
const loadKey = (p) => createKeyPairSignerFromBytes(Uint8Array.from(JSON.parse(readFileSync(p, "utf8"))));
const feePayer = await loadKey(chain.keys.fee_payer);
const payer = await loadKey(chain.keys.payer);
const tokens = async (ata) => BigInt((await result("getTokenAccountBalance", [ata])).value.amount);
const sol = async (a) => BigInt((await result("getBalance", [a])).value);
const status = async (sig, search = false) => (await result("getSignatureStatuses", [[sig], { searchTransactionHistory: search }])).value[0];

// A TransferChecked of `amount` from the payer to pay_to, fee paid by the fee payer.
async function transfer(amount, blockhash) {
  const lifetime = blockhash ?? (await result("getLatestBlockhash", [])).value;
  const message = pipe(
    createTransactionMessage({ version: 0 }),
    (m) => setTransactionMessageFeePayerSigner(feePayer, m),
    (m) =>
      appendTransactionMessageInstruction(
        getTransferCheckedInstruction({
          source: chain.payer_ata,
          mint: chain.mint,
          destination: chain.pay_to_ata,
          authority: payer,
          amount: BigInt(amount),
          decimals: chain.decimals,
        }),
        m,
      ),
    (m) => setTransactionMessageLifetimeUsingBlockhash({ blockhash: lifetime.blockhash, lastValidBlockHeight: BigInt(lifetime.lastValidBlockHeight) }, m),
  );
  const tx = await signTransactionMessageWithSigners(message);
  const messageB64 = getBase64Decoder().decode(getCompiledTransactionMessageEncoder().encode(compileTransactionMessage(message)));
  return { tx, sig: getSignatureFromTransaction(tx), b64: getBase64EncodedWireTransaction(tx), messageB64, lifetime };
}
const send = (t, cfg = {}) =>
  call("sendTransaction", [cfg.encoding === "base58" ? getBase58Decoder().decode(getTransactionEncoder().encode(t.tx)) : t.b64, { encoding: cfg.encoding ?? "base64", skipPreflight: !!cfg.skipPreflight }]);

// Deterministic heights while this runs: the slot timer is stopped, and restored at the end.
const { previous: slotMs } = await hook("/_test/slot-ms", { ms: 0 });

// 1. unknown signature
check((await status("1111111111111111111111111111111111111111111111111111111111111111", true)) === null, "an unknown signature's status is null");

// 2. a failed transfer lands as failed: fee charged, nothing moved
{
  const before = { payer: await tokens(chain.payer_ata), payTo: await tokens(chain.pay_to_ata), fee: await sol(chain.fee_payer) };
  const t = await transfer(before.payer + 1n);
  const a = await send(t, { skipPreflight: true });
  check(a.result === t.sig, "skipPreflight: a transfer beyond the balance answers its signature");
  const st = await status(t.sig);
  check(
    st && JSON.stringify(st.err) === JSON.stringify({ InstructionError: [0, { Custom: 1 }] }) && st.confirmationStatus === "confirmed",
    `it landed as failed: ${JSON.stringify(st)}`,
  );
  const tx = await result("getTransaction", [t.sig, { commitment: "confirmed", encoding: "json", maxSupportedTransactionVersion: 0 }]);
  check(tx && JSON.stringify(tx.meta.err) === JSON.stringify(st.err), "getTransaction reports the same err");
  const fee = (await result("getFeeForMessage", [t.messageB64])).value;
  const after = { payer: await tokens(chain.payer_ata), payTo: await tokens(chain.pay_to_ata), fee: await sol(chain.fee_payer) };
  check(after.payer === before.payer && after.payTo === before.payTo, "no token moved");
  check(before.fee - after.fee === BigInt(tx.meta.fee) && BigInt(tx.meta.fee) === BigInt(fee ?? -1), `the fee was charged (${before.fee - after.fee}, getFeeForMessage ${fee})`);
  const p = await send(t);
  check(p.error?.code === -32002 && p.error.data?.err === "AlreadyProcessed", `sent again with preflight: ${JSON.stringify(p.error?.data?.err ?? p.result)}`);
}

// 3. at most once, base58, and finality
{
  const before = await tokens(chain.pay_to_ata);
  const t = await transfer(7n);
  const a = await send(t, { encoding: "base58" });
  check(a.result === t.sig, "a base58-encoded transfer answers its signature");
  const again = await send(t, { skipPreflight: true });
  check(again.result === t.sig, "the same transaction again with skipPreflight answers the same signature");
  check((await tokens(chain.pay_to_ata)) - before === 7n, "it moved the amount once");
  const st = await status(t.sig);
  check(st && st.err === null && st.status?.Ok === null && st.confirmationStatus === "confirmed", "its status: confirmed, no err");
  check((await result("getTransaction", [t.sig, { maxSupportedTransactionVersion: 0 }])) === null, "getTransaction at commitment finalized: null before 32 slots");
  await hook("/_test/advance", { slots: 32 });
  check((await status(t.sig)).confirmationStatus === "finalized", "finalized 32 slots later");
  check((await result("getTransaction", [t.sig, { maxSupportedTransactionVersion: 0 }])) !== null, "getTransaction at commitment finalized: found then");
}

// 4. blockhash lifetime: valid for 150 blocks, refused after
{
  const lifetime = (await result("getLatestBlockhash", [])).value;
  const height = await result("getBlockHeight", []);
  check(lifetime.lastValidBlockHeight === height + 150, `lastValidBlockHeight = height + 150 (${lifetime.lastValidBlockHeight}, ${height})`);
  const t1 = await transfer(1n, lifetime);
  const t2 = await transfer(2n, lifetime);
  const t3 = await transfer(3n, lifetime);
  await hook("/_test/advance", { slots: 150 });
  check((await result("getBlockHeight", [])) === lifetime.lastValidBlockHeight && (await result("isBlockhashValid", [lifetime.blockhash])).value === true, "at lastValidBlockHeight the blockhash is still valid");
  const a1 = await send(t1);
  check(a1.result === t1.sig && (await status(t1.sig))?.err === null, "a transaction with it lands at lastValidBlockHeight");
  // t1 landing advanced the chain one block: the blockhash has now expired.
  check((await result("isBlockhashValid", [lifetime.blockhash])).value === false, "one block later it is not valid");
  const a2 = await send(t2);
  check(a2.error?.code === -32002 && a2.error.data?.err === "BlockhashNotFound", `with preflight: ${JSON.stringify(a2.error?.data?.err ?? a2.result)}`);
  const a3 = await send(t3, { skipPreflight: true });
  check(a3.result === t3.sig && (await status(t3.sig, true)) === null, "with skipPreflight: signature answered, dropped (status null)");
  const fee = (await result("getFeeForMessage", [t3.messageB64])).value;
  check(fee === null, "getFeeForMessage of the expired message: null");
}

// 5. hold / release
{
  const before = await tokens(chain.pay_to_ata);
  await hook("/_test/hold", { count: 1 });
  const t = await transfer(5n);
  const a = await send(t, { skipPreflight: true });
  check(a.result === t.sig && (await status(t.sig, true)) === null && (await tokens(chain.pay_to_ata)) === before, "held: signature answered, status null, nothing moved");
  const r = await hook("/_test/release", {});
  check(r.released?.[0]?.landed === true && (await status(t.sig))?.err === null && (await tokens(chain.pay_to_ata)) - before === 5n, "released: landed, moved once");
}

await hook("/_test/slot-ms", { ms: slotMs });
console.log(JSON.stringify({ ok: failures.length === 0, failures }));
process.exit(failures.length ? 1 : 0);
