// A long-running OFFICIAL x402 SVM facilitator and resource server over the local Solana test chain
// (tools/solana-chain, started by scripts/solana-chain), for a test (e.g. a Rust one) to pay.
// Started in the background by scripts/solana-official:
//
//   node interop/svm-server.mjs --state CHAIN_STATE [--price ATOMIC]
//
// Both are built by interop/svm-official.mjs, exactly as interop/svm.mjs builds them, all on
// 127.0.0.1, each on a free port:
//   - the official facilitator (@x402/core + @x402/svm 2.27.0 exact, fee payer the chain's
//     fee-payer test key, RPC the local chain): GET /supported, POST /verify, POST /settle, and
//     GET /_exchanges, the verify/settle answers so far (JSON array of {op, result} or {op, error});
//   - the official resource server: GET /v2/sol (@x402/express, x402 v2, exact on the chain's
//     CAIP-2 network) and GET /v1/sol (legacy x402-express, x402 v1, network "solana-devnet"),
//     both `--price` atomic units (default 10000) of the chain's test mint, payTo its pay_to key.
// stdout, exactly one line once both listen (and the server synced with the facilitator):
//   {"ready":"svm-server","server":"http://127.0.0.1:PORT","facilitator":"http://127.0.0.1:PORT"}
// Progress and diagnostics go to stderr. Runs until SIGTERM or SIGINT, then closes both and exits 0.
// The keys are the chain's public, test-only fixtures (tools/solana-chain/keys).
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { createKeyPairSignerFromBytes } from "@solana/kit";
import { startOfficialSvm } from "./svm-official.mjs";

const { values: opts } = parseArgs({
  options: {
    state: { type: "string" },
    price: { type: "string", default: "10000" },
  },
});
const progress = (msg) => console.error(`[svm-server] ${msg}`);
if (!opts.state || !/^[0-9]+$/.test(opts.price)) {
  console.error("usage: node interop/svm-server.mjs --state CHAIN_STATE [--price ATOMIC]");
  process.exit(2);
}
const chain = JSON.parse(readFileSync(opts.state, "utf8"));
const feePayer = await createKeyPairSignerFromBytes(
  Uint8Array.from(JSON.parse(readFileSync(chain.keys.fee_payer, "utf8"))),
);

const official = await startOfficialSvm({ chain, price: BigInt(opts.price), feePayer, progress });

let stopping = false;
async function stop(signal) {
  if (stopping) return;
  stopping = true;
  progress(`${signal}: closing (${official.exchanges.length} facilitator exchanges)`);
  const timer = setTimeout(() => process.exit(0), 3000);
  timer.unref();
  try {
    await official.close();
  } finally {
    process.exit(0);
  }
}
process.on("SIGTERM", () => stop("SIGTERM"));
process.on("SIGINT", () => stop("SIGINT"));

process.stdout.write(
  `${JSON.stringify({ ready: "svm-server", server: official.serverUrl, facilitator: official.facilitatorUrl })}\n`,
);
