// The official x402 batch-settlement client (@x402/evm/batch-settlement/client with @x402/fetch)
// paying interop/server.mjs's GET /v2/batch directly, against the official facilitator, on the
// local chain where the project's own channel contract and deposit collectors sit at their
// canonical addresses. One channel: a deposit with the first request, vouchers for the next ones,
// the server's official channel manager claims and settles them (POST /_batch/claim-settle), then
// the client asks for a cooperative refund of the rest. Everything is counted on-chain here, with
// viem reads independent of the packages' own state, before and after.
//
//   node interop/batch-settlement.mjs --server-url URL --rpc-url URL --token 0x… [--requests 3]
//   (payer key: BATCH_PAYER_KEY, default anvil's dev account #4, minted by the deploy step)
//
// stdout: one JSON object: what each step answered and the on-chain deltas (scripts/interop checks
// them). Exit 1 if a step failed outright (the JSON then carries "error").
import { parseArgs } from "node:util";
import { readFileSync } from "node:fs";
import { createPublicClient, defineChain, getAddress, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { wrapFetchWithPaymentFromConfig } from "@x402/fetch";
import { decodePaymentRequiredHeader, decodePaymentResponseHeader } from "@x402/core/http";
import { toClientEvmSigner } from "@x402/evm";
import { BatchSettlementEvmScheme, computeChannelId } from "@x402/evm/batch-settlement/client";

const NETWORK = "eip155:84532";
const SETTLEMENT = "0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003";
const DEFAULT_PAYER_KEY = "0x47e179ec197488593b187f80a00eb0da91f1b9d0b13f8733639f19c30a34926a"; // anvil #4

const { values: opts } = parseArgs({
  options: {
    "server-url": { type: "string" },
    "rpc-url": { type: "string" },
    token: { type: "string" },
    requests: { type: "string", default: "3" },
  },
});
const requests = Number(opts.requests);
if (!opts["server-url"] || !opts["rpc-url"] || !/^0x[0-9a-fA-F]{40}$/.test(opts.token ?? "") || !(requests >= 2)) {
  console.error("usage: batch-settlement.mjs --server-url URL --rpc-url URL --token 0x… [--requests N>=2]");
  process.exit(2);
}
const serverUrl = opts["server-url"].replace(/\/+$/, "");
const url = `${serverUrl}/v2/batch`;
const token = getAddress(opts.token);

const chain = defineChain({
  id: 84532,
  name: "interop anvil",
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [opts["rpc-url"]] } },
});
const pub = createPublicClient({ chain, transport: http(opts["rpc-url"]) });
const account = privateKeyToAccount(process.env.BATCH_PAYER_KEY || DEFAULT_PAYER_KEY);
const settlementAbi = JSON.parse(readFileSync(new URL("../tests/fixtures/X402BatchSettlement.json", import.meta.url), "utf8")).abi;
const erc20Abi = [
  { type: "function", name: "balanceOf", stateMutability: "view", inputs: [{ type: "address" }], outputs: [{ type: "uint256" }] },
];

// The official client: the payer signs deposits and vouchers itself (payerAuthorizer = payer);
// readContract lets it recover a channel from the chain.
const scheme = new BatchSettlementEvmScheme(toClientEvmSigner(account, pub));
const pay = wrapFetchWithPaymentFromConfig(fetch, {
  schemes: [{ network: NETWORK, client: scheme }],
  // The local test token is no default asset: allowed by address.
  spendControls: { allowedAssets: [{ network: NETWORK, asset: token }] },
});

const out = { payer: account.address, url, steps: [] };
const balanceOf = (who) => pub.readContract({ address: token, abi: erc20Abi, functionName: "balanceOf", args: [who] });
const readSettlement = (functionName, args) => pub.readContract({ address: SETTLEMENT, abi: settlementAbi, functionName, args });
const str = (v) => (typeof v === "bigint" ? v.toString() : v);
const jsonable = (o) => JSON.parse(JSON.stringify(o, (_k, v) => str(v)));

try {
  // What the route asks for, as an unpaid client sees it.
  const probe = await fetch(url);
  const required = decodePaymentRequiredHeader(probe.headers.get("payment-required") ?? "");
  const accept = required.accepts.find((a) => a.scheme === "batch-settlement");
  if (probe.status !== 402 || !accept) throw new Error(`GET ${url} unpaid: ${probe.status}, no batch-settlement offer`);
  out.accept = accept;
  const payTo = getAddress(accept.payTo);
  const channelId = computeChannelId(scheme.buildChannelConfig(accept), NETWORK);
  out.channel_id = channelId;

  const before = {
    payer: await balanceOf(account.address),
    pay_to: await balanceOf(payTo),
    escrow: await balanceOf(SETTLEMENT),
    receiver: await readSettlement("receivers", [payTo, token]),
  };

  for (let i = 0; i < requests; i++) {
    const r = await pay(url);
    const body = await r.json().catch(() => null);
    const header = r.headers.get("payment-response");
    out.steps.push({ step: `request ${i + 1}`, status: r.status, body, payment_response: header ? decodePaymentResponseHeader(header) : null });
    if (r.status !== 200) throw new Error(`request ${i + 1}: HTTP ${r.status}`);
  }
  const afterRequests = await readSettlement("channels", [channelId]);

  const cs = await fetch(`${serverUrl}/_batch/claim-settle`, { method: "POST" });
  const claimSettle = await cs.json();
  out.steps.push({ step: "claim-settle", status: cs.status, answer: claimSettle });
  if (cs.status !== 200) throw new Error(`claim-settle: HTTP ${cs.status} ${JSON.stringify(claimSettle)}`);
  const afterClaim = await readSettlement("channels", [channelId]);

  const refund = await scheme.refund(url);
  out.steps.push({ step: "refund", answer: refund });
  if (!refund.success) throw new Error(`refund: ${refund.errorReason}`);

  const [balance, totalClaimed] = await readSettlement("channels", [channelId]);
  const receiver = await readSettlement("receivers", [payTo, token]);
  const txs = [
    out.steps[0].payment_response?.transaction,
    claimSettle.claims?.[0]?.transaction,
    claimSettle.settle?.transaction,
    refund.transaction,
  ];
  out.onchain = {
    price: accept.amount,
    deposit_amount: out.steps[0].payment_response?.amount,
    voucher_transactions: out.steps.slice(1, requests).map((s) => s.payment_response?.transaction),
    after_requests: { balance: afterRequests[0], total_claimed: afterRequests[1] },
    after_claim: { balance: afterClaim[0], total_claimed: afterClaim[1] },
    channel: { balance, total_claimed: totalClaimed },
    refund_nonce: await readSettlement("refundNonce", [channelId]),
    receiver_claimed_delta: receiver[0] - before.receiver[0],
    receiver_settled_delta: receiver[1] - before.receiver[1],
    payer_delta: (await balanceOf(account.address)) - before.payer,
    pay_to_delta: (await balanceOf(payTo)) - before.pay_to,
    escrow_delta: (await balanceOf(SETTLEMENT)) - before.escrow,
    refund_amount: refund.amount,
    transactions: txs,
    transaction_status: await Promise.all(
      txs.map(async (hash) => (hash ? (await pub.getTransactionReceipt({ hash })).status : "none")),
    ),
  };
  console.log(JSON.stringify(jsonable(out)));
} catch (err) {
  out.error = err instanceof Error ? err.message : String(err);
  console.log(JSON.stringify(jsonable(out)));
  process.exit(1);
}
