// The project's own batch-settlement contracts (contracts/X402BatchSettlement.sol and the two
// deposit collectors), tested on a local chain where `x402-test-upstream deploy` installed them at
// their canonical addresses: deposits (EIP-3009 and Permit2), claims of cumulative vouchers
// (direct and with the receiver authorizer's batch signature), settle, cooperative refunds
// (direct and signed) and the payer's timed withdrawal with its delay. Every EIP-712 hash is
// computed here with viem, independently of the contract, and compared with the contract's.
//
//   ANVIL_BIN=$(scripts/install-tools) node --test interop/batch-settlement.test.mjs
//   (scripts/interop runs it; X402_TEST_UPSTREAM_BIN defaults to target/debug/x402-test-upstream)
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import {
  BaseError,
  ContractFunctionRevertedError,
  createPublicClient,
  createWalletClient,
  encodeAbiParameters,
  encodeFunctionData,
  getAddress,
  hashTypedData,
  http,
  keccak256,
  parseEventLogs,
  toHex,
} from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { startLocalChain } from "./local-chain.mjs";

const fixture = (name) => JSON.parse(readFileSync(new URL(`../tests/fixtures/${name}.json`, import.meta.url), "utf8"));
const SETTLEMENT_ABI = fixture("X402BatchSettlement").abi;
const TOKEN_ABI = fixture("TestToken").abi;
// Errors a call may bubble up from the collectors or Permit2, so that reverts() can name them.
const NESTED_ERRORS = ["ERC3009DepositCollector", "Permit2DepositCollector", "Permit2"].flatMap((n) =>
  fixture(n).abi.filter((x) => x.type === "error"),
);

const SETTLEMENT = getAddress("0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003");
const ERC3009_COLLECTOR = getAddress("0x4020806089470a89826cB9fB1f4059150b550004");
const PERMIT2_COLLECTOR = getAddress("0x4020425FAf3B746C082C2f942b4E5159887B0005");
const PERMIT2 = getAddress("0x000000000022D473030F116dDEE9F6B43aC78BA3");
const WITHDRAW_DELAY = 900;

// anvil's public dev keys (mnemonic "test test … junk"); never real funds.
const KEYS = {
  gas: "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80", // #0: submits (a facilitator)
  payer: "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d", // #1
  receiver: "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a", // #2
  receiverAuthorizer: "0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6", // #3
  payerAuthorizer: "0x47e179ec197488593b187f80a00eb0da91f1b9d0b13f8733639f19c30a34926a", // #4
  stranger: "0x8b3a350cf5c34c9194ca85829a2df0ec3153be0318b5e2d3348e872092edffba", // #5
};
const acct = Object.fromEntries(Object.entries(KEYS).map(([k, v]) => [k, privateKeyToAccount(v)]));
const MINT = 10_000_000n;

let chain;
let pub;
let wallets;
let chainId;
let saltCounter = 0;

before(async () => {
  chain = await startLocalChain({
    mints: [`${acct.payer.address}=${MINT}`],
    approvePermit2: [KEYS.payer],
  });
  chainId = chain.chainId;
  const transport = http(chain.rpcUrl);
  pub = createPublicClient({ transport, pollingInterval: 50 });
  wallets = Object.fromEntries(
    Object.entries(acct).map(([k, a]) => [k, createWalletClient({ account: a, transport, pollingInterval: 50 })]),
  );
});
after(async () => {
  await chain?.stop();
});

// ---------------------------------------------------------------- helpers

const domain = () => ({ name: "x402 Batch Settlement", version: "1", chainId, verifyingContract: SETTLEMENT });
const CHANNEL_CONFIG_TYPES = {
  ChannelConfig: [
    { name: "payer", type: "address" },
    { name: "payerAuthorizer", type: "address" },
    { name: "receiver", type: "address" },
    { name: "receiverAuthorizer", type: "address" },
    { name: "token", type: "address" },
    { name: "withdrawDelay", type: "uint40" },
    { name: "salt", type: "bytes32" },
  ],
};
const VOUCHER_TYPES = {
  Voucher: [
    { name: "channelId", type: "bytes32" },
    { name: "maxClaimableAmount", type: "uint128" },
  ],
};
const REFUND_TYPES = {
  Refund: [
    { name: "channelId", type: "bytes32" },
    { name: "nonce", type: "uint256" },
    { name: "amount", type: "uint128" },
  ],
};
const CLAIM_BATCH_TYPES = {
  ClaimBatch: [{ name: "claims", type: "ClaimEntry[]" }],
  ClaimEntry: [
    { name: "channelId", type: "bytes32" },
    { name: "maxClaimableAmount", type: "uint128" },
    { name: "totalClaimed", type: "uint128" },
  ],
};

/** A fresh channel config (a new salt each call, so tests never share a channel). */
function newConfig(overrides = {}) {
  saltCounter += 1;
  return {
    payer: acct.payer.address,
    payerAuthorizer: acct.payerAuthorizer.address,
    receiver: acct.receiver.address,
    receiverAuthorizer: acct.receiverAuthorizer.address,
    token: getAddress(chain.token),
    withdrawDelay: WITHDRAW_DELAY,
    salt: toHex(BigInt(Date.now()) * 1000n + BigInt(saltCounter), { size: 32 }),
    ...overrides,
  };
}
const channelIdOf = (config) =>
  hashTypedData({ domain: domain(), types: CHANNEL_CONFIG_TYPES, primaryType: "ChannelConfig", message: config });

const signVoucher = (who, channelId, max) =>
  acct[who].signTypedData({
    domain: domain(),
    types: VOUCHER_TYPES,
    primaryType: "Voucher",
    message: { channelId, maxClaimableAmount: BigInt(max) },
  });
const signRefund = (who, channelId, nonce, amount) =>
  acct[who].signTypedData({
    domain: domain(),
    types: REFUND_TYPES,
    primaryType: "Refund",
    message: { channelId, nonce: BigInt(nonce), amount: BigInt(amount) },
  });
const signClaimBatch = (who, rows) =>
  acct[who].signTypedData({
    domain: domain(),
    types: CLAIM_BATCH_TYPES,
    primaryType: "ClaimBatch",
    message: {
      claims: rows.map((r) => ({
        channelId: channelIdOf(r.voucher.channel),
        maxClaimableAmount: r.voucher.maxClaimableAmount,
        totalClaimed: r.totalClaimed,
      })),
    },
  });

/** A claim row: the voucher (config, ceiling) signed by `signer`, claimed at `total`. */
async function row(config, max, total, signer = "payerAuthorizer") {
  return {
    voucher: { channel: config, maxClaimableAmount: BigInt(max) },
    signature: await signVoucher(signer, channelIdOf(config), max),
    totalClaimed: BigInt(total),
  };
}

const chainTime = async () => (await pub.getBlock()).timestamp;

/** collectorData of an EIP-3009 deposit of `amount` into `config`'s channel, signed by the payer. */
async function erc3009CollectorData(config, amount, { channelId = channelIdOf(config), salt = 7n, signer = "payer" } = {}) {
  const validBefore = (await chainTime()) + 3600n;
  const nonce = keccak256(encodeAbiParameters([{ type: "bytes32" }, { type: "uint256" }], [channelId, salt]));
  const signature = await acct[signer].signTypedData({
    domain: { name: "USD Coin", version: "2", chainId, verifyingContract: getAddress(config.token) },
    types: {
      ReceiveWithAuthorization: [
        { name: "from", type: "address" },
        { name: "to", type: "address" },
        { name: "value", type: "uint256" },
        { name: "validAfter", type: "uint256" },
        { name: "validBefore", type: "uint256" },
        { name: "nonce", type: "bytes32" },
      ],
    },
    primaryType: "ReceiveWithAuthorization",
    message: { from: config.payer, to: ERC3009_COLLECTOR, value: BigInt(amount), validAfter: 0n, validBefore, nonce },
  });
  return encodeAbiParameters(
    [{ type: "uint256" }, { type: "uint256" }, { type: "uint256" }, { type: "bytes" }],
    [0n, validBefore, salt, signature],
  );
}

/** Sends a settlement-contract call from `who`; resolves to the decoded events of its receipt. */
async function send(who, functionName, args, address = SETTLEMENT, abi = SETTLEMENT_ABI) {
  const hash = await wallets[who].writeContract({ address, abi, functionName, args, chain: null });
  const receipt = await pub.waitForTransactionReceipt({ hash });
  assert.equal(receipt.status, "success", `${functionName} reverted`);
  return parseEventLogs({ abi: SETTLEMENT_ABI, logs: receipt.logs.filter((l) => getAddress(l.address) === SETTLEMENT) });
}

/** Asserts that the call from `who` reverts with the custom error (or require message) `expected`. */
async function reverts(who, functionName, args, expected, address = SETTLEMENT, abi = SETTLEMENT_ABI) {
  let err;
  try {
    await pub.simulateContract({ account: acct[who], address, abi: [...abi, ...NESTED_ERRORS], functionName, args });
  } catch (e) {
    err = e;
  }
  assert.ok(err, `${functionName} was expected to revert with ${expected}, but succeeded`);
  const reverted = err instanceof BaseError ? err.walk((e) => e instanceof ContractFunctionRevertedError) : null;
  const got = reverted?.reason ?? reverted?.data?.errorName ?? err.shortMessage;
  assert.equal(got, expected, `${functionName}: ${err.shortMessage}`);
}

const deposit = async (config, amount, opts) =>
  send("gas", "deposit", [config, BigInt(amount), ERC3009_COLLECTOR, await erc3009CollectorData(config, amount, opts)]);
const channelState = async (config) => {
  const [balance, totalClaimed] = await pub.readContract({
    address: SETTLEMENT, abi: SETTLEMENT_ABI, functionName: "channels", args: [channelIdOf(config)],
  });
  return { balance, totalClaimed };
};
const receiverTotals = async (receiver, token) => {
  const [totalClaimed, totalSettled] = await pub.readContract({
    address: SETTLEMENT, abi: SETTLEMENT_ABI, functionName: "receivers", args: [receiver, token],
  });
  return { totalClaimed, totalSettled };
};
const read = (functionName, args) => pub.readContract({ address: SETTLEMENT, abi: SETTLEMENT_ABI, functionName, args });
const balanceOf = (token, who) =>
  pub.readContract({ address: token, abi: TOKEN_ABI, functionName: "balanceOf", args: [who] });
const names = (events) => events.map((e) => e.eventName);

// ---------------------------------------------------------------- tests

describe("x402 batch-settlement contracts", () => {
  test("the EIP-712 hashes (channel id, voucher, refund, claim batch) are those of the scheme's domain", async () => {
    const config = newConfig();
    const id = channelIdOf(config);
    assert.equal(await read("getChannelId", [config]), id);
    const expectedVoucher = hashTypedData({
      domain: domain(), types: VOUCHER_TYPES, primaryType: "Voucher", message: { channelId: id, maxClaimableAmount: 123n },
    });
    assert.equal(await read("getVoucherDigest", [id, 123n]), expectedVoucher);
    const expectedRefund = hashTypedData({
      domain: domain(), types: REFUND_TYPES, primaryType: "Refund", message: { channelId: id, nonce: 4n, amount: 5n },
    });
    assert.equal(await read("getRefundDigest", [id, 4n, 5n]), expectedRefund);
    const rows = [await row(config, 10, 7), await row(newConfig(), 20, 20)];
    const expectedBatch = hashTypedData({
      domain: domain(),
      types: CLAIM_BATCH_TYPES,
      primaryType: "ClaimBatch",
      message: {
        claims: rows.map((r) => ({
          channelId: channelIdOf(r.voucher.channel), maxClaimableAmount: r.voucher.maxClaimableAmount, totalClaimed: r.totalClaimed,
        })),
      },
    });
    assert.equal(await read("getClaimBatchDigest", [rows]), expectedBatch);
    // Another chain or another address would give another id: the domain binds both.
    assert.notEqual(hashTypedData({ domain: { ...domain(), chainId: chainId + 1 }, types: CHANNEL_CONFIG_TYPES, primaryType: "ChannelConfig", message: config }), id);
  });

  test("an EIP-3009 deposit moves the tokens into the channel, once, for that channel only", async () => {
    const config = newConfig();
    const id = channelIdOf(config);
    const payerBefore = await balanceOf(chain.token, acct.payer.address);
    const escrowBefore = await balanceOf(chain.token, SETTLEMENT);

    const data = await erc3009CollectorData(config, 1000n);
    const events = await send("gas", "deposit", [config, 1000n, ERC3009_COLLECTOR, data]);
    assert.deepEqual(names(events), ["ChannelCreated", "Deposited"]);
    assert.equal(events[1].args.channelId, id);
    assert.equal(events[1].args.newBalance, 1000n);
    assert.deepEqual(await channelState(config), { balance: 1000n, totalClaimed: 0n });
    assert.equal(await balanceOf(chain.token, acct.payer.address), payerBefore - 1000n);
    assert.equal(await balanceOf(chain.token, SETTLEMENT), escrowBefore + 1000n);

    // The same authorization again: the token refuses the used nonce.
    await reverts("gas", "deposit", [config, 1000n, ERC3009_COLLECTOR, data], "TestToken: authorization is used or canceled");
    // An authorization bound to this channel cannot fund another one (its nonce names the channel).
    const other = newConfig();
    await reverts("gas", "deposit", [other, 500n, ERC3009_COLLECTOR, await erc3009CollectorData(other, 500n, { channelId: id })], "TestToken: invalid signature");
    // Signed by someone else than the config's payer.
    await reverts("gas", "deposit", [other, 500n, ERC3009_COLLECTOR, await erc3009CollectorData(other, 500n, { signer: "stranger" })], "TestToken: invalid signature");
    // An amount other than the one signed.
    await reverts("gas", "deposit", [config, 999n, ERC3009_COLLECTOR, await erc3009CollectorData(config, 1000n, { salt: 8n })], "TestToken: invalid signature");
    // Nobody but the settlement contract may use the collector (it would strand the payer's tokens).
    await reverts("stranger", "collect", [acct.payer.address, chain.token, 1n, id, await erc3009CollectorData(config, 1n, { salt: 9n })], "OnlySettlement", ERC3009_COLLECTOR, fixture("ERC3009DepositCollector").abi);
    // Out-of-range withdraw delay, zero amount, missing receiver authorizer.
    await reverts("gas", "deposit", [newConfig({ withdrawDelay: 899 }), 1n, ERC3009_COLLECTOR, "0x"], "WithdrawDelayOutOfRange");
    await reverts("gas", "deposit", [newConfig({ withdrawDelay: 2_592_001 }), 1n, ERC3009_COLLECTOR, "0x"], "WithdrawDelayOutOfRange");
    await reverts("gas", "deposit", [config, 0n, ERC3009_COLLECTOR, "0x"], "ZeroDeposit");
    await reverts("gas", "deposit", [newConfig({ receiverAuthorizer: "0x0000000000000000000000000000000000000000" }), 1n, ERC3009_COLLECTOR, "0x"], "InvalidChannel");

    // A top-up adds to the balance without a second ChannelCreated.
    const topUp = await deposit(config, 250n, { salt: 10n });
    assert.deepEqual(names(topUp), ["Deposited"]);
    assert.deepEqual(await channelState(config), { balance: 1250n, totalClaimed: 0n });
  });

  test("a collector that moves no tokens credits nothing", async () => {
    const fake = "0x00000000000000000000000000000000000b0b01";
    await pub.request({ method: "anvil_setCode", params: [fake, "0x00"] }); // STOP: every call succeeds, does nothing
    const config = newConfig();
    await reverts("gas", "deposit", [config, 1000n, fake, "0x"], "DepositCollectionFailed");
    assert.deepEqual(await channelState(config), { balance: 0n, totalClaimed: 0n });
  });

  test("a collector that re-enters the settlement contract cannot get one payment credited twice", async () => {
    const attacker = fixture("ReentrantDepositCollector");
    const hash = await wallets.stranger.deployContract({ abi: attacker.abi, bytecode: attacker.bytecode, chain: null });
    const collector = (await pub.waitForTransactionReceipt({ hash })).contractAddress;
    // Armed with a genuine deposit of 700 into channel `inner`: if the outer deposit of 700 into
    // `outer` counted those same tokens, the escrow would owe 1400 for 700 received.
    const inner = newConfig();
    const outer = newConfig();
    const genuine = encodeFunctionData({
      abi: SETTLEMENT_ABI, functionName: "deposit", args: [inner, 700n, ERC3009_COLLECTOR, await erc3009CollectorData(inner, 700n)],
    });
    await send("stranger", "arm", [SETTLEMENT, genuine], collector, attacker.abi);
    await reverts("stranger", "deposit", [outer, 700n, collector, "0x"], "Reentered");
    await reverts("stranger", "multicall", [[encodeFunctionData({ abi: SETTLEMENT_ABI, functionName: "deposit", args: [outer, 700n, collector, "0x"] })]], "Reentered");
    assert.deepEqual(await channelState(outer), { balance: 0n, totalClaimed: 0n });
    assert.deepEqual(await channelState(inner), { balance: 0n, totalClaimed: 0n });
  });

  test("a Permit2 deposit (PlainToken, no EIP-3009) is bound to its channel by the witness", async () => {
    const config = newConfig({ token: getAddress(chain.plainToken) });
    const id = channelIdOf(config);
    const permit = async (channelId, nonce) => {
      const deadline = (await chainTime()) + 3600n;
      const signature = await acct.payer.signTypedData({
        domain: { name: "Permit2", chainId, verifyingContract: PERMIT2 },
        types: {
          PermitWitnessTransferFrom: [
            { name: "permitted", type: "TokenPermissions" },
            { name: "spender", type: "address" },
            { name: "nonce", type: "uint256" },
            { name: "deadline", type: "uint256" },
            { name: "witness", type: "DepositWitness" },
          ],
          TokenPermissions: [
            { name: "token", type: "address" },
            { name: "amount", type: "uint256" },
          ],
          DepositWitness: [{ name: "channelId", type: "bytes32" }],
        },
        primaryType: "PermitWitnessTransferFrom",
        message: { permitted: { token: config.token, amount: 600n }, spender: PERMIT2_COLLECTOR, nonce, deadline, witness: { channelId } },
      });
      return encodeAbiParameters(
        [{ type: "uint256" }, { type: "uint256" }, { type: "bytes" }, { type: "bytes" }],
        [nonce, deadline, signature, "0x"],
      );
    };
    await reverts("gas", "deposit", [config, 600n, PERMIT2_COLLECTOR, await permit(channelIdOf(newConfig()), 1n)], "InvalidSigner");
    const events = await send("gas", "deposit", [config, 600n, PERMIT2_COLLECTOR, await permit(id, 2n)]);
    assert.deepEqual(names(events), ["ChannelCreated", "Deposited"]);
    assert.deepEqual(await channelState(config), { balance: 600n, totalClaimed: 0n });
    assert.equal(await balanceOf(chain.plainToken, SETTLEMENT), 600n);
  });

  test("claims follow cumulative vouchers: within the ceiling and the deposit, signed by the payer authorizer", async () => {
    const config = newConfig();
    await deposit(config, 1000n);
    const id = channelIdOf(config);
    const before = await receiverTotals(config.receiver, config.token);

    let events = await send("receiver", "claim", [[await row(config, 300, 300)]]);
    assert.deepEqual(names(events), ["Claimed"]);
    assert.equal(events[0].args.claimAmount, 300n);
    assert.equal(events[0].args.newTotalClaimed, 300n);
    assert.deepEqual(await channelState(config), { balance: 1000n, totalClaimed: 300n });

    // Replaying the same voucher, or an older (lower) one, changes nothing.
    assert.deepEqual(names(await send("receiver", "claim", [[await row(config, 300, 300)]])), []);
    assert.deepEqual(names(await send("receiver", "claim", [[await row(config, 200, 200)]])), []);
    assert.deepEqual(await channelState(config), { balance: 1000n, totalClaimed: 300n });

    // The receiver authorizer may claim too; a total below the ceiling (the actual charge) is fine.
    events = await send("receiverAuthorizer", "claim", [[await row(config, 700, 550)]]);
    assert.equal(events[0].args.claimAmount, 250n);
    assert.deepEqual(await channelState(config), { balance: 1000n, totalClaimed: 550n });

    await reverts("receiver", "claim", [[await row(config, 700, 701)]], "ClaimExceedsCeiling");
    await reverts("receiver", "claim", [[await row(config, 1500, 1001)]], "ClaimExceedsBalance"); // over the deposit
    await reverts("receiver", "claim", [[await row(config, 900, 900, "stranger")]], "InvalidSignature");
    // With a payer authorizer set, only its signature counts, not the payer's.
    await reverts("receiver", "claim", [[await row(config, 900, 900, "payer")]], "InvalidSignature");
    // A voucher signed for another channel.
    const foreign = await row(config, 900, 900);
    foreign.signature = await signVoucher("payerAuthorizer", channelIdOf(newConfig()), 900);
    await reverts("receiver", "claim", [[foreign]], "InvalidSignature");
    // A malleable (high-s) copy of a valid signature.
    const valid = await row(config, 900, 900);
    const n = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;
    const s = BigInt(`0x${valid.signature.slice(66, 130)}`);
    const v = Number.parseInt(valid.signature.slice(130), 16);
    const malleable = { ...valid, signature: `${valid.signature.slice(0, 66)}${toHex(n - s, { size: 32 }).slice(2)}${(v === 27 ? 28 : 27).toString(16)}` };
    await reverts("receiver", "claim", [[malleable]], "InvalidSignature");
    // Only the receiver side may claim directly.
    await reverts("stranger", "claim", [[valid]], "NotAuthorizedToClaim");
    await reverts("payer", "claim", [[valid]], "NotAuthorizedToClaim");
    await reverts("receiver", "claim", [[]], "EmptyBatch");

    assert.deepEqual(await channelState(config), { balance: 1000n, totalClaimed: 550n });
    const afterTotals = await receiverTotals(config.receiver, config.token);
    assert.equal(afterTotals.totalClaimed - before.totalClaimed, 550n);
    assert.equal(id, channelIdOf(config));
  });

  test("without a payer authorizer the payer itself signs the vouchers", async () => {
    const config = newConfig({ payerAuthorizer: "0x0000000000000000000000000000000000000000" });
    await deposit(config, 400n);
    await reverts("receiver", "claim", [[await row(config, 100, 100, "payerAuthorizer")]], "InvalidSignature");
    await send("receiver", "claim", [[await row(config, 100, 100, "payer")]]);
    assert.deepEqual(await channelState(config), { balance: 400n, totalClaimed: 100n });
  });

  test("claimWithSignature: anyone relays a batch the receiver authorizer signed, as signed", async () => {
    const a = newConfig();
    const b = newConfig();
    await deposit(a, 500n);
    await deposit(b, 500n);
    const rows = [await row(a, 120, 100), await row(b, 300, 300)];
    const sig = await signClaimBatch("receiverAuthorizer", rows);

    // Tampered: a row's total raised after signing; another signer; an empty batch.
    await reverts("stranger", "claimWithSignature", [[rows[0], { ...rows[1], totalClaimed: 301n }], sig], "InvalidSignature");
    await reverts("stranger", "claimWithSignature", [rows, await signClaimBatch("stranger", rows)], "InvalidSignature");
    await reverts("stranger", "claimWithSignature", [[], sig], "EmptyBatch");
    // Rows of channels with different receiver authorizers cannot share one signature.
    const c = newConfig({ receiverAuthorizer: acct.stranger.address });
    const mixed = [await row(a, 120, 100), await row(c, 10, 10)];
    await reverts("stranger", "claimWithSignature", [mixed, await signClaimBatch("receiverAuthorizer", mixed)], "NotReceiverAuthorizer");

    const events = await send("stranger", "claimWithSignature", [rows, sig]);
    assert.deepEqual(names(events), ["Claimed", "Claimed"]);
    assert.deepEqual(await channelState(a), { balance: 500n, totalClaimed: 100n });
    assert.deepEqual(await channelState(b), { balance: 500n, totalClaimed: 300n });
    // The same signed batch again moves nothing.
    assert.deepEqual(names(await send("stranger", "claimWithSignature", [rows, sig])), []);
  });

  test("settle pays the receiver what was claimed, once, and a multicall is all or nothing", async () => {
    const receiver = acct.stranger.address; // a receiver used by this test only
    const config = newConfig({ receiver });
    await deposit(config, 800n);
    await send("receiverAuthorizer", "claim", [[await row(config, 450, 450)]]);
    const before = await balanceOf(chain.token, receiver);

    const events = await send("gas", "settle", [receiver, config.token]);
    assert.deepEqual(names(events), ["Settled"]);
    assert.equal(getAddress(events[0].args.receiver), receiver);
    assert.equal(events[0].args.amount, 450n);
    assert.equal(await balanceOf(chain.token, receiver), before + 450n);
    assert.deepEqual(await receiverTotals(receiver, config.token), { totalClaimed: 450n, totalSettled: 450n });
    // Nothing left: a second settle pays nothing (and does not fail).
    assert.deepEqual(names(await send("gas", "settle", [receiver, config.token])), []);
    assert.equal(await balanceOf(chain.token, receiver), before + 450n);

    // multicall(claim, failing refund): the claim is undone with the failure.
    const claimCall = encodeFunctionData({ abi: SETTLEMENT_ABI, functionName: "claim", args: [[await row(config, 600, 600)]] });
    const refundCall = encodeFunctionData({ abi: SETTLEMENT_ABI, functionName: "refund", args: [config, 0n] });
    await reverts("receiverAuthorizer", "multicall", [[claimCall, refundCall]], "ZeroRefund");
    assert.deepEqual(await channelState(config), { balance: 800n, totalClaimed: 450n });
  });

  test("cooperative refund: the receiver side returns the unclaimed rest, each refund uses a nonce", async () => {
    const config = newConfig();
    const id = channelIdOf(config);
    await deposit(config, 1000n);
    await send("receiver", "claim", [[await row(config, 400, 400)]]);
    const payerBefore = await balanceOf(chain.token, acct.payer.address);

    await reverts("stranger", "refund", [config, 100n], "NotAuthorizedToRefund");
    await reverts("payer", "refund", [config, 100n], "NotAuthorizedToRefund");
    await reverts("receiver", "refund", [config, 0n], "ZeroRefund");

    // Direct refund by the receiver: 100 back, nonce 0 -> 1.
    let events = await send("receiver", "refund", [config, 100n]);
    assert.deepEqual(names(events), ["Refunded"]);
    assert.equal(await read("refundNonce", [id]), 1n);
    assert.deepEqual(await channelState(config), { balance: 900n, totalClaimed: 400n });

    // Signed refund, relayed by anyone; the signature is bound to nonce and amount.
    const sig = await signRefund("receiverAuthorizer", id, 1, 200);
    await reverts("stranger", "refundWithSignature", [config, 300n, 1n, sig], "InvalidSignature"); // other amount
    await reverts("stranger", "refundWithSignature", [config, 200n, 0n, await signRefund("receiverAuthorizer", id, 0, 200)], "InvalidRefundNonce");
    await reverts("stranger", "refundWithSignature", [config, 200n, 1n, await signRefund("receiver", id, 1, 200)], "InvalidSignature");
    events = await send("stranger", "refundWithSignature", [config, 200n, 1n, sig]);
    assert.deepEqual(names(events), ["Refunded"]);
    assert.equal(events[0].args.amount, 200n);
    assert.equal(await read("refundNonce", [id]), 2n);
    // Replayed: the nonce moved on.
    await reverts("stranger", "refundWithSignature", [config, 200n, 1n, sig], "InvalidRefundNonce");

    // More than is unclaimed: capped at balance - totalClaimed (1000 - 100 - 200 - 400 = 300).
    events = await send("receiverAuthorizer", "refund", [config, 10_000n]);
    assert.equal(events[0].args.amount, 300n);
    assert.deepEqual(await channelState(config), { balance: 400n, totalClaimed: 400n });
    assert.equal(await balanceOf(chain.token, acct.payer.address), payerBefore + 600n);
    // Nothing unclaimed left: no tokens move, no event, yet the nonce advances.
    assert.deepEqual(names(await send("receiver", "refund", [config, 1n])), []);
    assert.equal(await read("refundNonce", [id]), 4n);
    // A claimed voucher stays claimable for the receiver (the refund took only unclaimed escrow).
    await send("gas", "settle", [config.receiver, config.token]);
  });

  test("a full refund of a never-claimed channel closes it", async () => {
    const config = newConfig();
    await deposit(config, 300n);
    const events = await send("receiver", "refund", [config, 300n]);
    assert.deepEqual(names(events), ["Refunded", "ChannelClosed"]);
    assert.deepEqual(await channelState(config), { balance: 0n, totalClaimed: 0n });
    // Re-funding the same channel creates it again.
    assert.deepEqual(names(await deposit(config, 50n, { salt: 11n })), ["ChannelCreated", "Deposited"]);
  });

  test("timed withdrawal: refused before the withdraw delay, paid after it, minus what the receiver claimed meanwhile", async () => {
    const config = newConfig();
    const id = channelIdOf(config);
    await deposit(config, 1000n);
    await send("receiver", "claim", [[await row(config, 200, 200)]]);

    await reverts("stranger", "initiateWithdraw", [config, 100n], "NotAuthorizedToWithdraw");
    await reverts("receiver", "initiateWithdraw", [config, 100n], "NotAuthorizedToWithdraw");
    await reverts("payer", "initiateWithdraw", [config, 801n], "WithdrawAmountExceedsAvailable");
    await reverts("payer", "initiateWithdraw", [config, 0n], "NothingToWithdraw");
    await reverts("payer", "finalizeWithdraw", [config], "WithdrawalNotPending");

    const started = await send("payer", "initiateWithdraw", [config, 800n]);
    assert.deepEqual(names(started), ["WithdrawInitiated"]);
    const [pendingAmount, initiatedAt] = await read("pendingWithdrawals", [id]);
    assert.equal(pendingAmount, 800n);
    assert.equal(started[0].args.finalizeAfter, initiatedAt + WITHDRAW_DELAY);
    await reverts("payerAuthorizer", "initiateWithdraw", [config, 1n], "WithdrawalAlreadyPending");

    // Before the delay: refused, also just short of it.
    await reverts("payer", "finalizeWithdraw", [config], "WithdrawDelayNotElapsed");
    await pub.request({ method: "evm_increaseTime", params: [WITHDRAW_DELAY - 60] });
    await pub.request({ method: "evm_mine", params: [] });
    await reverts("payer", "finalizeWithdraw", [config], "WithdrawDelayNotElapsed");

    // During the grace period the receiver claims more (and a partial refund shrinks the withdrawal).
    await send("receiverAuthorizer", "claim", [[await row(config, 500, 500)]]);
    await send("receiver", "refund", [config, 100n]);
    assert.equal((await read("pendingWithdrawals", [id]))[0], 700n);

    await pub.request({ method: "evm_increaseTime", params: [60] });
    await pub.request({ method: "evm_mine", params: [] });
    await reverts("stranger", "finalizeWithdraw", [config], "NotAuthorizedToWithdraw");
    const payerBefore = await balanceOf(chain.token, acct.payer.address);
    // The payer authorizer may finalize too; it pays the payer min(700 pending, 900 - 500 unclaimed).
    const done = await send("payerAuthorizer", "finalizeWithdraw", [config]);
    assert.deepEqual(names(done), ["WithdrawFinalized"]);
    assert.equal(done[0].args.amount, 400n);
    assert.equal(await balanceOf(chain.token, acct.payer.address), payerBefore + 400n);
    assert.deepEqual(await channelState(config), { balance: 500n, totalClaimed: 500n });
    assert.deepEqual(await read("pendingWithdrawals", [id]), [0n, 0]);
    // The claimed 500 is still the receiver's; nothing is claimable beyond the balance now.
    await reverts("receiver", "claim", [[await row(config, 900, 501)]], "ClaimExceedsBalance");
  });

  test("a refund covering the pending withdrawal cancels it", async () => {
    const config = newConfig();
    const id = channelIdOf(config);
    await deposit(config, 600n);
    await send("payer", "initiateWithdraw", [config, 250n]);
    await send("receiver", "refund", [config, 250n]);
    assert.deepEqual(await read("pendingWithdrawals", [id]), [0n, 0]);
    await reverts("payer", "finalizeWithdraw", [config], "WithdrawalNotPending");
  });
});
