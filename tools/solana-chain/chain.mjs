// A local Solana test chain: an HTTP JSON-RPC 2.0 server on 127.0.0.1 backed by an in-process
// LiteSVM (no network access at run time). Used by the x402 SVM "exact" tests and by
// scripts/solana-interop; started in the background by scripts/solana-chain.
//
//   node tools/solana-chain/chain.mjs [--port 0] [--slot-ms 400] [--keys DIR]
//        [--payer-tokens 1000000000] [--payer-sol 1000000000] [--fee-payer-sol 10000000000]
//        [--genesis-hash EtWTRABZaYq6iMfeYKouRu166VU2xqa1wcaWoxPkrZBG]
//
// KEYS: tools/solana-chain/keys/*.json are PUBLIC, TEST-ONLY fixtures (standard Solana 64-byte
// JSON arrays, committed on purpose). Never fund them anywhere real.
//
// Setup on start (accounts written straight into the LiteSVM, classic SPL Token program):
//   mint (keys/mint.json)      6 decimals, mint authority keys/mint_authority.json, no freeze authority
//   payer (keys/payer.json)    --payer-sol lamports, --payer-tokens atomic units in its ATA
//   pay_to (keys/pay_to.json)  0 SOL, its ATA created with 0 tokens
//   fee_payer (keys/fee_payer.json)  --fee-payer-sol lamports (the facilitator's fee payer)
// stdout, first line, once listening: {"ready":"solana-chain","rpc_url":"http://127.0.0.1:PORT",
//   "genesis_hash", "network" (CAIP-2), "mint", "mint_authority", "payer", "payer_ata", "pay_to",
//   "pay_to_ata", "fee_payer", "decimals", "slot"}. Diagnostics go to stderr.
//
// The genesis hash defaults to devnet's, so that CAIP-2 "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1"
// (the only test network the official @x402/svm package knows, besides testnet) names this chain;
// clients must be given this chain's RPC URL explicitly.
//
// Chain semantics (real, not faked):
//   - block height == slot. Every landed transaction gets its own slot (the slot advances after
//     it), and a timer advances one slot every --slot-ms ms (0 = no timer). Each new slot gets a
//     new LiteSVM blockhash (expireBlockhash) and the Clock sysvar follows (warpToSlot).
//   - getLatestBlockhash answers the current blockhash, lastValidBlockHeight = height + 150. A
//     transaction is accepted when its blockhash is the current one (LiteSVM's own check) or one
//     issued by this chain at most 150 blocks ago (then checked here, LiteSVM's check relaxed for
//     that one transaction). Older or unknown blockhashes are refused by LiteSVM (BlockhashNotFound).
//   - a signature lands at most once (AlreadyProcessed); failed-but-landed transactions (e.g. an
//     SPL InstructionError) pay their fee and report their `err` in getSignatureStatuses /
//     getTransaction; transactions that cannot land (bad blockhash, bad signature, fee payer
//     without funds, duplicate) are dropped: with skipPreflight the signature is returned and its
//     status stays null (like a real cluster), without it the RPC answers -32002 with the error.
//   - confirmationStatus: "confirmed" when landed, "finalized" 32 slots later. getTransaction with
//     commitment "finalized" (the default) answers null until then, as a real node does.
//     getSignatureStatuses without searchTransactionHistory only knows the last 300 slots.
//
// JSON-RPC methods: getAccountInfo, getMultipleAccounts, getBalance, getTokenAccountBalance,
// getLatestBlockhash, isBlockhashValid, getBlockHeight, getSlot, getEpochInfo, getGenesisHash,
// getFirstAvailableBlock,
// getVersion, getHealth, getIdentity, getMinimumBalanceForRentExemption, getFeeForMessage,
// sendTransaction, simulateTransaction, getSignatureStatuses, getSignaturesForAddress, getTransaction,
// requestAirdrop, getTokenAccountsByOwner. Batches are accepted. requestAirdrop lands at once (its status is
// polled like any other; getTransaction answers null for it). No websocket (the official x402 packages poll).
// Account encodings: base64 (default), base58, jsonParsed (SPL Token mints and accounts; other
// accounts fall back to base64), with dataSlice. getTransaction: json, base64, base58 (jsonParsed
// answers json). There is one ledger state: commitment and minContextSlot are accepted and
// ignored by account reads. simulateTransaction honours sigVerify (default false, so partially
// signed x402 payloads simulate), replaceRecentBlockhash, innerInstructions and accounts.
//
// Views: the JSON-RPC endpoint is served at "/" and at "/view/NAME" (any NAME of [A-Za-z0-9_-],
// at most 32 characters): one ledger, so that a test can give a client two RPC URLs of one
// network and make the signature index of one of them lag or be pruned (/_test/index); "/" is
// the view named "".
//
// Test hooks (NOT the JSON-RPC endpoint; POST with a JSON body, answers JSON):
//   POST /_test/advance {"slots":N}    advance N slots now (N new blockhashes); answers {"slot"}
//   POST /_test/hold {"count":N}       the next N sendTransaction calls answer a signature but the
//                                      transactions are only queued (status null) until release
//   POST /_test/release {}             execute the queued transactions now, in order; answers
//                                      {"released":[{"signature","landed","err"}]}
//   POST /_test/airdrop {"address","lamports"}         credit SOL
//   POST /_test/mint {"owner","amount"}                mint test tokens into owner's ATA (created)
//   POST /_test/slot-ms {"ms":N}       set the slot timer (0 = stop it; deterministic heights);
//                                      answers {"slot_ms","previous"}
//   POST /_test/index {"view":"","lag_slots":N,"first_available":S}
//                                      the view's signature index: getSignaturesForAddress omits
//                                      what landed in the last N slots (an index lagging behind
//                                      the ledger, which getTransaction and getSignatureStatuses
//                                      still read); the ledger is pruned below slot S
//                                      (getFirstAvailableBlock answers S; what landed before S is
//                                      unknown to every read). Omitted fields keep their value;
//                                      answers the view's {"view","lag_slots","first_available"}
//   GET  /_test/state                  {"slot","slot_ms","held","queued","landed","dropped":[{"signature","err"}]}
import http from "node:http";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { LiteSVM } from "litesvm";
import {
  address as toAddress,
  createKeyPairSignerFromBytes,
  getAddressDecoder,
  getAddressEncoder,
  getBase58Decoder,
  getBase58Encoder,
  getBase64Decoder,
  getBase64Encoder,
  getCompiledTransactionMessageDecoder,
  lamports as toLamports,
  none,
  some,
} from "@solana/kit";
import {
  AccountState,
  TOKEN_PROGRAM_ADDRESS,
  findAssociatedTokenPda,
  getMintDecoder,
  getMintEncoder,
  getTokenDecoder,
  getTokenEncoder,
} from "@solana-program/token";

const here = dirname(fileURLToPath(import.meta.url));
const { values: opts } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    "slot-ms": { type: "string", default: "400" },
    keys: { type: "string", default: join(here, "keys") },
    "payer-tokens": { type: "string", default: "1000000000" },
    "payer-sol": { type: "string", default: "1000000000" },
    "fee-payer-sol": { type: "string", default: "10000000000" },
    "genesis-hash": { type: "string", default: "EtWTRABZaYq6iMfeYKouRu166VU2xqa1wcaWoxPkrZBG" },
  },
});

const DECIMALS = 6;
const MAX_AGE = 150n; // blocks a blockhash stays valid, as on mainnet
const FINALIZE_AFTER = 32n;
const STATUS_CACHE_SLOTS = 300n;
const LAMPORTS_PER_SIGNATURE = 5000n;
const COMPUTE_BUDGET = "ComputeBudget111111111111111111111111111111";

const b58enc = getBase58Encoder(); // string -> bytes
const b58dec = getBase58Decoder(); // bytes -> string
const b64enc = getBase64Encoder();
const b64dec = getBase64Decoder();
const addrEnc = getAddressEncoder();
const addrDec = getAddressDecoder();
const msgDecoder = getCompiledTransactionMessageDecoder();
const log = (...a) => console.error("solana-chain:", ...a);

// ---------------------------------------------------------------------------------------------
// The ledger
const svm = new LiteSVM().withTransactionHistory(100000n);
const inner = svm.inner; // the native handle: raw-bytes send/simulate and the check toggles
let slot = svm.getClock().slot;
const blockhashes = new Map(); // blockhash -> slot it was issued at
const landed = new Map(); // signature -> {slot, err, tx, fee, pre, post, preTok, postTok, logs, cu, inner, time}
const dropped = []; // {signature, err}
let held = 0;
const queue = []; // held raw transactions
const views = new Map(); // view name -> {lag: slots the index lags, firstAvailable: pruned below}
const viewOf = (name) => views.get(name) ?? { lag: 0n, firstAvailable: 0n };
const VIEW_NAME = /^[A-Za-z0-9_-]{0,32}$/;
let txCount = 0n;

blockhashes.set(svm.latestBlockhash(), slot);

function newSlot() {
  slot += 1n;
  svm.warpToSlot(slot);
  svm.expireBlockhash();
  blockhashes.set(svm.latestBlockhash(), slot);
  for (const [h, s] of blockhashes) if (slot - s > 2n * MAX_AGE) blockhashes.delete(h);
}

function blockhashUsable(hash) {
  const issued = blockhashes.get(hash);
  return issued !== undefined && slot <= issued + MAX_AGE;
}

// ---------------------------------------------------------------------------------------------
// Accounts
const RENT_EXEMPT = (len) => svm.minimumBalanceForRentExemption(BigInt(len));

function setRaw(addr, { lamports, data, owner, executable = false }) {
  svm.setAccount({
    address: toAddress(addr),
    lamports: toLamports(BigInt(lamports)),
    programAddress: toAddress(owner),
    executable,
    data,
    space: BigInt(data.length),
  });
}

function readAccount(addr) {
  const a = inner.getAccount(addrEnc.encode(toAddress(addr)));
  if (!a) return null;
  return {
    lamports: a.lamports(),
    data: a.data(),
    owner: addrDec.decode(a.owner()),
    executable: a.executable(),
    rentEpoch: a.rentEpoch(),
  };
}

// An SPL Token program account of `size` bytes decoded by `decoder`, else null.
function tokenProgramAccount(acc, size, decoder) {
  if (!acc || acc.owner !== TOKEN_PROGRAM_ADDRESS || acc.data.length !== size) return null;
  try {
    return decoder.decode(acc.data);
  } catch {
    return null;
  }
}
const tokenInfo = (acc) => tokenProgramAccount(acc, 165, getTokenDecoder());
const mintInfo = (acc) => tokenProgramAccount(acc, 82, getMintDecoder());

function uiAmount(amount, decimals) {
  const s = amount.toString().padStart(decimals + 1, "0");
  const whole = s.slice(0, s.length - decimals);
  const frac = s.slice(s.length - decimals).replace(/0+$/, "");
  const str = frac ? `${whole}.${frac}` : whole;
  return { amount: amount.toString(), decimals, uiAmount: Number(str), uiAmountString: str };
}

function decimalsOf(mint) {
  const m = mintInfo(readAccount(mint));
  return m ? m.decimals : 0;
}

function optAddr(o) {
  return o.__option === "Some" ? o.value : null;
}

function parsedAccount(acc) {
  const t = tokenInfo(acc);
  if (t) {
    const info = {
      isNative: t.isNative.__option === "Some",
      mint: t.mint,
      owner: t.owner,
      state: ["uninitialized", "initialized", "frozen"][t.state] ?? "initialized",
      tokenAmount: uiAmount(t.amount, decimalsOf(t.mint)),
    };
    if (optAddr(t.delegate)) {
      info.delegate = optAddr(t.delegate);
      info.delegatedAmount = uiAmount(t.delegatedAmount, info.tokenAmount.decimals);
    }
    if (optAddr(t.closeAuthority)) info.closeAuthority = optAddr(t.closeAuthority);
    return { program: "spl-token", parsed: { info, type: "account" }, space: 165 };
  }
  const m = mintInfo(acc);
  if (m) {
    return {
      program: "spl-token",
      parsed: {
        info: {
          decimals: m.decimals,
          freezeAuthority: optAddr(m.freezeAuthority),
          isInitialized: m.isInitialized,
          mintAuthority: optAddr(m.mintAuthority),
          supply: m.supply.toString(),
        },
        type: "mint",
      },
      space: 82,
    };
  }
  return null;
}

function encodeAccount(acc, cfg = {}) {
  if (!acc) return null;
  const encoding = cfg.encoding ?? "base64";
  let bytes = acc.data;
  if (cfg.dataSlice) {
    const { offset = 0, length = bytes.length } = cfg.dataSlice;
    bytes = bytes.slice(offset, offset + length);
  }
  let data;
  if (encoding === "jsonParsed") {
    data = parsedAccount(acc) ?? [b64dec.decode(bytes), "base64"];
  } else if (encoding === "base58") {
    if (bytes.length > 128) throw rpcError(-32600, "Encoded binary (base 58) data should be less than 128 bytes, please use Base64 encoding.");
    data = [b58dec.decode(bytes), "base58"];
  } else if (encoding === "base64") {
    data = [b64dec.decode(bytes), "base64"];
  } else {
    throw rpcError(-32602, `Invalid params: unsupported encoding ${encoding}`);
  }
  return {
    data,
    executable: acc.executable,
    lamports: acc.lamports,
    owner: acc.owner,
    rentEpoch: acc.rentEpoch,
    space: BigInt(acc.data.length),
  };
}

function ataOf(owner, mint) {
  return findAssociatedTokenPda({ owner: toAddress(owner), mint: toAddress(mint), tokenProgram: TOKEN_PROGRAM_ADDRESS });
}

async function writeTokenAccount(owner, mint, amount) {
  const [ata] = await ataOf(owner, mint);
  const data = getTokenEncoder().encode({
    mint: toAddress(mint),
    owner: toAddress(owner),
    amount: BigInt(amount),
    delegate: none(),
    state: AccountState.Initialized,
    isNative: none(),
    delegatedAmount: 0n,
    closeAuthority: none(),
  });
  setRaw(ata, { lamports: RENT_EXEMPT(165), data: new Uint8Array(data), owner: TOKEN_PROGRAM_ADDRESS });
  return ata;
}

function setSupply(mint, delta) {
  const acc = readAccount(mint);
  const m = getMintDecoder().decode(acc.data);
  const data = getMintEncoder().encode({ ...m, supply: m.supply + BigInt(delta) });
  setRaw(mint, { lamports: acc.lamports, data: new Uint8Array(data), owner: TOKEN_PROGRAM_ADDRESS });
}

async function mintTo(owner, amount) {
  const [ata] = await ataOf(owner, keys.mint.address);
  const before = tokenInfo(readAccount(ata));
  await writeTokenAccount(owner, keys.mint.address, (before ? before.amount : 0n) + BigInt(amount));
  setSupply(keys.mint.address, amount);
  return ata;
}

// ---------------------------------------------------------------------------------------------
// Keys and setup
async function loadKey(name) {
  const bytes = Uint8Array.from(JSON.parse(readFileSync(join(opts.keys, `${name}.json`), "utf8")));
  return createKeyPairSignerFromBytes(bytes);
}
const keys = {};
for (const name of ["mint", "mint_authority", "payer", "pay_to", "fee_payer"]) keys[name] = await loadKey(name);

setRaw(keys.mint.address, {
  lamports: RENT_EXEMPT(82),
  owner: TOKEN_PROGRAM_ADDRESS,
  data: new Uint8Array(
    getMintEncoder().encode({
      mintAuthority: some(keys.mint_authority.address),
      supply: 0n,
      decimals: DECIMALS,
      isInitialized: true,
      freezeAuthority: none(),
    }),
  ),
});
svm.airdrop(keys.payer.address, toLamports(BigInt(opts["payer-sol"])));
svm.airdrop(keys.fee_payer.address, toLamports(BigInt(opts["fee-payer-sol"])));
const payerAta = await mintTo(keys.payer.address, BigInt(opts["payer-tokens"]));
const payToAta = await writeTokenAccount(keys.pay_to.address, keys.mint.address, 0n);
newSlot();

// ---------------------------------------------------------------------------------------------
// Transactions
const TX_ERR = ["AccountInUse", "AccountLoadedTwice", "AccountNotFound", "ProgramAccountNotFound", "InsufficientFundsForFee", "InvalidAccountForFee", "AlreadyProcessed", "BlockhashNotFound", "CallChainTooDeep", "MissingSignatureForFee", "InvalidAccountIndex", "SignatureFailure", "InvalidProgramForExecution", "SanitizeFailure", "ClusterMaintenance", "AccountBorrowOutstanding", "WouldExceedMaxBlockCostLimit", "UnsupportedVersion", "InvalidWritableAccount", "WouldExceedMaxAccountCostLimit", "WouldExceedAccountDataBlockLimit", "TooManyAccountLocks", "AddressLookupTableNotFound", "InvalidAddressLookupTableOwner", "InvalidAddressLookupTableData", "InvalidAddressLookupTableIndex", "InvalidRentPayingAccount", "WouldExceedMaxVoteCostLimit", "WouldExceedAccountDataTotalLimit", "MaxLoadedAccountsDataSizeExceeded", "ResanitizationNeeded", "InvalidLoadedAccountsDataSizeLimit", "UnbalancedTransaction", "ProgramCacheHitMaxLimit", "CommitCancelled"];
const IX_ERR = ["GenericError", "InvalidArgument", "InvalidInstructionData", "InvalidAccountData", "AccountDataTooSmall", "InsufficientFunds", "IncorrectProgramId", "MissingRequiredSignature", "AccountAlreadyInitialized", "UninitializedAccount", "UnbalancedInstruction", "ModifiedProgramId", "ExternalAccountLamportSpend", "ExternalAccountDataModified", "ReadonlyLamportChange", "ReadonlyDataModified", "DuplicateAccountIndex", "ExecutableModified", "RentEpochModified", "NotEnoughAccountKeys", "AccountDataSizeChanged", "AccountNotExecutable", "AccountBorrowFailed", "AccountBorrowOutstanding", "DuplicateAccountOutOfSync", "InvalidError", "ExecutableDataModified", "ExecutableLamportChange", "ExecutableAccountNotRentExempt", "UnsupportedProgramId", "CallDepth", "MissingAccount", "ReentrancyNotAllowed", "MaxSeedLengthExceeded", "InvalidSeeds", "InvalidRealloc", "ComputationalBudgetExceeded", "PrivilegeEscalation", "ProgramEnvironmentSetupFailure", "ProgramFailedToComplete", "ProgramFailedToCompile", "Immutable", "IncorrectAuthority", "AccountNotRentExempt", "InvalidAccountOwner", "ArithmeticOverflow", "UnsupportedSysvar", "IllegalOwner", "MaxAccountsDataAllocationsExceeded", "MaxAccountsExceeded", "MaxInstructionTraceLengthExceeded", "BuiltinProgramsMustConsumeComputeUnits", "BorshIoError"];

// LiteSVM's error objects -> the JSON a Solana RPC node gives (serde's externally tagged enums).
function errJson(e) {
  if (typeof e === "number") return TX_ERR[e] ?? `Unknown(${e})`;
  const name = e?.constructor?.name ?? "";
  if (name === "TransactionErrorInstructionError") {
    const ie = e.err();
    let ij;
    if (typeof ie === "number") ij = IX_ERR[ie] ?? `Unknown(${ie})`;
    else if (ie?.constructor?.name === "InstructionErrorCustom") ij = { Custom: ie.code };
    else ij = { BorshIoError: String(ie) };
    return { InstructionError: [e.index, ij] };
  }
  if (name === "TransactionErrorDuplicateInstruction") return { DuplicateInstruction: e.index };
  if (name === "TransactionErrorInsufficientFundsForRent") return { InsufficientFundsForRent: { account_index: e.accountIndex } };
  if (name === "TransactionErrorProgramExecutionTemporarilyRestricted") return { ProgramExecutionTemporarilyRestricted: { account_index: e.accountIndex } };
  return String(e);
}

function readShortVec(bytes, off) {
  let len = 0, size = 0;
  for (;;) {
    const b = bytes[off + size];
    len |= (b & 0x7f) << (7 * size);
    size += 1;
    if ((b & 0x80) === 0) break;
  }
  return [len, size];
}

// Raw wire transaction -> what the RPC needs from it.
function parseTx(bytes) {
  const [n, size] = readShortVec(bytes, 0);
  if (n < 1) throw rpcError(-32602, "invalid transaction: no signatures");
  const sigs = [];
  for (let i = 0; i < n; i++) sigs.push(bytes.slice(size + 64 * i, size + 64 * (i + 1)));
  const messageBytes = bytes.slice(size + 64 * n);
  let msg;
  try {
    msg = msgDecoder.decode(messageBytes);
  } catch (e) {
    throw rpcError(-32602, `invalid transaction: ${e.message}`);
  }
  return {
    bytes,
    signature: b58dec.decode(sigs[0]),
    signatures: sigs.map((s) => b58dec.decode(s)),
    messageBytes,
    msg,
    blockhash: msg.lifetimeToken,
    legacy: msg.version === "legacy",
  };
}

function decodeWire(data, encoding = "base58") {
  if (typeof data !== "string") throw rpcError(-32602, "Invalid params: transaction must be a string");
  try {
    if (encoding === "base64") return b64enc.encode(data);
    if (encoding === "base58") return b58enc.encode(data);
  } catch {
    throw rpcError(-32602, `invalid transaction: failed to decode ${encoding} string`);
  }
  throw rpcError(-32602, `Invalid params: unsupported encoding: ${encoding}. Supported encodings: base58, base64`);
}

// Signature fee + prioritization fee (compute-budget price × limit), as the runtime charges it.
function feeOf(msg) {
  let price = 0n, limit = null, others = 0n;
  for (const ix of msg.instructions) {
    const program = msg.staticAccounts[ix.programAddressIndex];
    const d = ix.data ?? new Uint8Array();
    if (program === COMPUTE_BUDGET) {
      const v = new DataView(d.buffer, d.byteOffset, d.byteLength);
      if (d[0] === 2 && d.length >= 5) limit = BigInt(v.getUint32(1, true));
      else if (d[0] === 3 && d.length >= 9) price = v.getBigUint64(1, true);
    } else others += 1n;
  }
  if (limit === null) limit = others * 200000n < 1400000n ? others * 200000n : 1400000n;
  const priority = (price * limit + 999999n) / 1000000n;
  return LAMPORTS_PER_SIGNATURE * BigInt(msg.header.numSignerAccounts) + priority;
}

function snapshot(tx) {
  const accounts = tx.msg.staticAccounts;
  const lamports = [], tokens = [];
  accounts.forEach((a, i) => {
    const acc = readAccount(a);
    lamports.push(acc ? acc.lamports : 0n);
    const t = tokenInfo(acc);
    if (t) {
      tokens.push({
        accountIndex: i,
        mint: t.mint,
        owner: t.owner,
        programId: TOKEN_PROGRAM_ADDRESS,
        uiTokenAmount: uiAmount(t.amount, decimalsOf(t.mint)),
      });
    }
  });
  return { lamports, tokens };
}

// Runs `fn` with LiteSVM's signature and blockhash checks set as asked, restoring both after.
function withChecks({ sigverify, blockhashCheck }, fn) {
  inner.setSigverify(sigverify);
  inner.setBlockhashCheck(blockhashCheck);
  try {
    return fn();
  } finally {
    inner.setSigverify(true);
    inner.setBlockhashCheck(true);
  }
}

function blockhashCheckFor(tx) {
  // The current blockhash: LiteSVM checks it itself. A recent one of ours (≤ 150 blocks): checked
  // here, so LiteSVM's check is relaxed. Anything else: LiteSVM's check refuses it.
  return !(tx.blockhash !== svm.latestBlockhash() && blockhashUsable(tx.blockhash));
}

function innerIxJson(metaInner) {
  const out = [];
  metaInner.forEach((list, index) => {
    if (!list.length) return;
    out.push({
      index,
      instructions: list.map((ii) => {
        const ci = ii.instruction();
        return {
          programIdIndex: ci.programIdIndex(),
          accounts: Array.from(ci.accounts()),
          data: b58dec.decode(ci.data()),
          stackHeight: ii.stackHeight(),
        };
      }),
    });
  });
  return out;
}

// Executes a raw transaction on the ledger. Returns {landed, err, signature}.
function execute(tx) {
  if (landed.has(tx.signature)) {
    return { landed: false, err: "AlreadyProcessed", signature: tx.signature };
  }
  const pre = snapshot(tx);
  const result = withChecks({ sigverify: true, blockhashCheck: blockhashCheckFor(tx) }, () =>
    tx.legacy ? inner.sendLegacyTransaction(tx.bytes) : inner.sendVersionedTransaction(tx.bytes),
  );
  const failed = result.constructor.name === "FailedTransactionMetadata";
  const meta = failed ? result.meta() : result;
  const err = failed ? errJson(result.err()) : null;
  // Landed = executed with its fee charged (LiteSVM records it in its history); otherwise dropped.
  const isLanded = inner.getTransaction(b58enc.encode(tx.signature)) !== null;
  if (!isLanded) {
    dropped.push({ signature: tx.signature, err });
    if (dropped.length > 1000) dropped.shift();
    log(`dropped ${tx.signature}: ${JSON.stringify(err)}`);
    return { landed: false, err, signature: tx.signature };
  }
  const post = snapshot(tx);
  txCount += 1n;
  landed.set(tx.signature, {
    slot,
    err,
    tx,
    fee: feeOf(tx.msg),
    pre,
    post,
    logs: meta.logs(),
    cu: meta.computeUnitsConsumed(),
    inner: innerIxJson(meta.innerInstructions()),
    time: BigInt(Math.floor(Date.now() / 1000)),
  });
  log(`landed ${tx.signature} in slot ${slot}${err ? ` failed: ${JSON.stringify(err)}` : ""}`);
  newSlot();
  return { landed: true, err, signature: tx.signature };
}

function simulate(tx, cfg) {
  const replace = !!cfg.replaceRecentBlockhash;
  if (replace && cfg.sigVerify) throw rpcError(-32602, "sigVerify may not be used with replaceRecentBlockhash");
  const result = withChecks(
    { sigverify: !!cfg.sigVerify, blockhashCheck: replace ? false : blockhashCheckFor(tx) },
    () => (tx.legacy ? inner.simulateLegacyTransaction(tx.bytes) : inner.simulateVersionedTransaction(tx.bytes)),
  );
  const failed = result.constructor.name === "FailedTransactionMetadata";
  const meta = result.meta();
  let err = failed ? errJson(result.err()) : null;
  if (!err && !replace && landed.has(tx.signature) && cfg.sigVerify) err = "AlreadyProcessed";
  const value = {
    err,
    logs: meta.logs(),
    accounts: null,
    unitsConsumed: meta.computeUnitsConsumed(),
    returnData: null,
    fee: feeOf(tx.msg),
    loadedAccountsDataSize: 0,
  };
  if (cfg.innerInstructions) value.innerInstructions = innerIxJson(meta.innerInstructions());
  if (replace) value.replacementBlockhash = { blockhash: svm.latestBlockhash(), lastValidBlockHeight: slot + MAX_AGE };
  if (cfg.accounts?.addresses?.length && !failed) {
    const post = new Map(result.postAccounts().map((pa) => [addrDec.decode(pa.address), pa.account()]));
    value.accounts = cfg.accounts.addresses.map((a) => {
      const pa = post.get(a);
      const acc = pa
        ? { lamports: pa.lamports(), data: pa.data(), owner: addrDec.decode(pa.owner()), executable: pa.executable(), rentEpoch: pa.rentEpoch() }
        : readAccount(a);
      return encodeAccount(acc, { encoding: cfg.accounts.encoding ?? "base64" });
    });
  }
  return value;
}

// What the view's ledger holds of `sig` (nothing below its pruned slot).
function landedIn(view, sig) {
  const t = landed.get(sig);
  return t && t.slot >= view.firstAvailable ? t : undefined;
}

function statusOf(sig, searchHistory, view = viewOf("")) {
  const t = landedIn(view, sig);
  if (!t) return null;
  if (!searchHistory && slot - t.slot > STATUS_CACHE_SLOTS) return null;
  const age = slot - t.slot;
  const finalized = age >= FINALIZE_AFTER;
  return {
    slot: t.slot,
    confirmations: finalized ? null : age,
    err: t.err,
    status: t.err ? { Err: t.err } : { Ok: null },
    confirmationStatus: finalized ? "finalized" : "confirmed",
  };
}

function txJson(t, encoding) {
  const { msg, signatures, bytes } = t.tx;
  if (encoding === "base64") return [b64dec.decode(bytes), "base64"];
  if (encoding === "base58") return [b58dec.decode(bytes), "base58"];
  const message = {
    accountKeys: msg.staticAccounts,
    header: msg.header
      ? {
          numRequiredSignatures: msg.header.numSignerAccounts,
          numReadonlySignedAccounts: msg.header.numReadonlySignerAccounts,
          numReadonlyUnsignedAccounts: msg.header.numReadonlyNonSignerAccounts,
        }
      : undefined,
    instructions: msg.instructions.map((ix) => ({
      programIdIndex: ix.programAddressIndex,
      accounts: ix.accountIndices ?? [],
      data: b58dec.decode(ix.data ?? new Uint8Array()),
      stackHeight: null,
    })),
    recentBlockhash: msg.lifetimeToken,
  };
  if (!t.tx.legacy) message.addressTableLookups = (msg.addressTableLookups ?? []).map((l) => ({
    accountKey: l.lookupTableAddress,
    writableIndexes: l.writableIndexes ?? [],
    readonlyIndexes: l.readonlyIndexes ?? [],
  }));
  return { signatures, message };
}

// ---------------------------------------------------------------------------------------------
// JSON-RPC
class RpcError extends Error {
  constructor(code, message, data) {
    super(message);
    this.code = code;
    this.data = data;
  }
}
function rpcError(code, message, data) {
  return new RpcError(code, message, data);
}
const ctx = () => ({ apiVersion: "2.2.0", slot });
const wrap = (value) => ({ context: ctx(), value });
const cfgAt = (params, i) => (params[i] && typeof params[i] === "object" && !Array.isArray(params[i]) ? params[i] : {});
function needAddress(a) {
  try {
    return toAddress(a);
  } catch {
    throw rpcError(-32602, `Invalid param: Invalid`);
  }
}

const methods = {
  getHealth: () => "ok",
  getVersion: () => ({ "solana-core": "2.2.0", "feature-set": 0 }),
  getGenesisHash: () => opts["genesis-hash"],
  getIdentity: () => ({ identity: keys.fee_payer.address }),
  getSlot: () => slot,
  getBlockHeight: () => slot,
  getFirstAvailableBlock: (_, view) => view.firstAvailable,
  getEpochInfo: () => {
    const per = svm.getEpochSchedule().slotsPerEpoch;
    return { absoluteSlot: slot, blockHeight: slot, epoch: slot / per, slotIndex: slot % per, slotsInEpoch: per, transactionCount: txCount };
  },
  getLatestBlockhash: () => wrap({ blockhash: svm.latestBlockhash(), lastValidBlockHeight: slot + MAX_AGE }),
  isBlockhashValid: (p) => wrap(blockhashUsable(p[0])),
  getMinimumBalanceForRentExemption: (p) => RENT_EXEMPT(Number(p[0] ?? 0)),
  getBalance: (p) => wrap(readAccount(needAddress(p[0]))?.lamports ?? 0n),
  getAccountInfo: (p) => wrap(encodeAccount(readAccount(needAddress(p[0])), cfgAt(p, 1))),
  getMultipleAccounts: (p) => {
    if (!Array.isArray(p[0])) throw rpcError(-32602, "Invalid params: expected an array of addresses");
    if (p[0].length > 100) throw rpcError(-32602, "Too many inputs provided; max 100");
    return wrap(p[0].map((a) => encodeAccount(readAccount(needAddress(a)), cfgAt(p, 1))));
  },
  getTokenAccountBalance: (p) => {
    const t = tokenInfo(readAccount(needAddress(p[0])));
    if (!t) throw rpcError(-32602, "Invalid param: could not find account");
    return wrap(uiAmount(t.amount, decimalsOf(t.mint)));
  },
  getTokenAccountsByOwner: (p) => {
    const owner = needAddress(p[0]);
    const filter = p[1] ?? {};
    const list = inner
      .getProgramAccounts(addrEnc.encode(TOKEN_PROGRAM_ADDRESS))
      .map((aa) => ({ pubkey: addrDec.decode(aa.address), a: aa.account() }))
      .map(({ pubkey, a }) => ({ pubkey, acc: { lamports: a.lamports(), data: a.data(), owner: TOKEN_PROGRAM_ADDRESS, executable: a.executable(), rentEpoch: a.rentEpoch() } }))
      .filter(({ acc }) => {
        const t = tokenInfo(acc);
        return t && t.owner === owner && (!filter.mint || t.mint === filter.mint);
      });
    return wrap(list.map(({ pubkey, acc }) => ({ pubkey, account: encodeAccount(acc, cfgAt(p, 2)) })));
  },
  getFeeForMessage: (p) => {
    const bytes = decodeWire(p[0], "base64");
    let msg;
    try {
      msg = msgDecoder.decode(bytes);
    } catch (e) {
      throw rpcError(-32602, `invalid message: ${e.message}`);
    }
    return wrap(blockhashUsable(msg.lifetimeToken) ? feeOf(msg) : null);
  },
  requestAirdrop: (p) => {
    const to = needAddress(p[0]);
    const r = svm.airdrop(to, toLamports(BigInt(p[1] ?? 0)));
    if (!r || r.constructor.name === "FailedTransactionMetadata") throw rpcError(-32600, "airdrop failed");
    // Landed like any transaction (its status can be polled); getTransaction knows no body for it.
    const signature = b58dec.decode(r.signature());
    landed.set(signature, { slot, err: null, tx: null });
    txCount += 1n;
    newSlot();
    return signature;
  },
  sendTransaction: (p) => {
    const cfg = cfgAt(p, 1);
    const tx = parseTx(decodeWire(p[0], cfg.encoding ?? "base58"));
    if (!cfg.skipPreflight) {
      const sim = simulate(tx, { sigVerify: true });
      if (!sim.err && landed.has(tx.signature)) sim.err = "AlreadyProcessed";
      if (sim.err) {
        throw rpcError(-32002, `Transaction simulation failed: ${typeof sim.err === "string" ? sim.err : JSON.stringify(sim.err)}`, {
          accounts: null,
          err: sim.err,
          innerInstructions: null,
          loadedAccountsDataSize: 0,
          logs: sim.logs,
          replacementBlockhash: null,
          returnData: null,
          unitsConsumed: sim.unitsConsumed,
        });
      }
    }
    if (held > 0) {
      held -= 1;
      queue.push(tx);
      log(`held ${tx.signature}`);
      return tx.signature;
    }
    execute(tx);
    return tx.signature;
  },
  simulateTransaction: (p) => {
    const cfg = cfgAt(p, 1);
    const tx = parseTx(decodeWire(p[0], cfg.encoding ?? "base58"));
    return wrap(simulate(tx, cfg));
  },
  getSignatureStatuses: (p, view) => {
    if (!Array.isArray(p[0])) throw rpcError(-32602, "Invalid params: expected an array of signatures");
    if (p[0].length > 256) throw rpcError(-32602, "Too many inputs provided; max 256");
    const search = !!cfgAt(p, 1).searchTransactionHistory;
    return wrap(p[0].map((s) => statusOf(s, search, view)));
  },
  // Newest first; an address's transactions are those whose static account keys name it.
  // Options: limit (1..=1000, default 1000), before and until (signatures, both exclusive).
  // The view's index omits the last `lag` slots and what its ledger pruned.
  getSignaturesForAddress: (p, view) => {
    const address = needAddress(p[0]);
    const cfg = cfgAt(p, 1);
    const limit = cfg.limit ?? 1000;
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw rpcError(-32602, "Invalid limit; max 1000");
    const out = [];
    let started = cfg.before === undefined;
    for (const [signature, t] of [...landed.entries()].reverse()) {
      if (!started) {
        started = signature === cfg.before;
        continue;
      }
      if (signature === cfg.until) break;
      if (!t.tx || !t.tx.msg.staticAccounts.includes(address)) continue;
      if (t.slot + view.lag > slot || t.slot < view.firstAvailable) continue;
      const st = statusOf(signature, true);
      out.push({ signature, slot: t.slot, err: t.err, memo: null, blockTime: t.time, confirmationStatus: st.confirmationStatus });
      if (out.length >= limit) break;
    }
    return out;
  },
  getTransaction: (p, view) => {
    const cfg = typeof p[1] === "string" ? { encoding: p[1] } : cfgAt(p, 1);
    const t = landedIn(view, p[0]);
    if (!t || !t.tx) return null;
    if ((cfg.commitment ?? "finalized") === "finalized" && slot - t.slot < FINALIZE_AFTER) return null;
    if (!t.tx.legacy && cfg.maxSupportedTransactionVersion === undefined) {
      throw rpcError(-32015, "Transaction version (0) is not supported by the requesting client. Please try the request again with the following configuration parameter: \"maxSupportedTransactionVersion\": 0");
    }
    return {
      slot: t.slot,
      blockTime: t.time,
      version: t.tx.legacy ? "legacy" : 0,
      transaction: txJson(t, cfg.encoding ?? "json"),
      meta: {
        err: t.err,
        status: t.err ? { Err: t.err } : { Ok: null },
        fee: t.fee,
        preBalances: t.pre.lamports,
        postBalances: t.post.lamports,
        innerInstructions: t.inner,
        logMessages: t.logs,
        preTokenBalances: t.pre.tokens,
        postTokenBalances: t.post.tokens,
        rewards: [],
        loadedAddresses: { writable: [], readonly: [] },
        computeUnitsConsumed: t.cu,
      },
    };
  },
};

// Exact JSON: bigints become bare numbers (u64 values such as rentEpoch exceed 2^53).
function stringify(obj) {
  return JSON.stringify(obj, (_, v) => (typeof v === "bigint" ? `__u64__${v}` : v)).replace(/"__u64__(\d+)"/g, "$1");
}

function handleOne(req, view) {
  const id = req && Object.hasOwn(req, "id") ? req.id : null;
  if (!req || typeof req !== "object" || req.jsonrpc !== "2.0" || typeof req.method !== "string") {
    return { jsonrpc: "2.0", error: { code: -32600, message: "Invalid request" }, id };
  }
  const fn = methods[req.method];
  if (!fn) return { jsonrpc: "2.0", error: { code: -32601, message: "Method not found" }, id };
  try {
    const params = req.params === undefined ? [] : req.params;
    if (!Array.isArray(params)) throw rpcError(-32602, "Invalid params: expected an array");
    return { jsonrpc: "2.0", result: fn(params, view), id };
  } catch (e) {
    if (e instanceof RpcError) {
      const error = { code: e.code, message: e.message };
      if (e.data !== undefined) error.data = e.data;
      return { jsonrpc: "2.0", error, id };
    }
    log(`internal error in ${req.method}:`, e);
    return { jsonrpc: "2.0", error: { code: -32603, message: `Internal error: ${e.message}` }, id };
  }
}

const hooks = {
  "POST /_test/advance": (b) => {
    const n = Number(b.slots ?? 1);
    if (!Number.isInteger(n) || n < 0 || n > 100000) throw new Error("slots must be an integer 0..100000");
    for (let i = 0; i < n; i++) newSlot();
    return { slot };
  },
  "POST /_test/hold": (b) => {
    const n = Number(b.count ?? 1);
    if (!Number.isInteger(n) || n < 0) throw new Error("count must be a non-negative integer");
    held = n;
    return { held };
  },
  "POST /_test/release": () => {
    held = 0;
    const released = queue.splice(0).map((tx) => execute(tx));
    return { released, slot };
  },
  "POST /_test/airdrop": (b) => {
    svm.airdrop(toAddress(b.address), toLamports(BigInt(b.lamports)));
    return { address: b.address, lamports: readAccount(b.address)?.lamports ?? 0n };
  },
  "POST /_test/mint": async (b) => {
    const ata = await mintTo(toAddress(b.owner), BigInt(b.amount));
    return { ata, amount: tokenInfo(readAccount(ata)).amount };
  },
  "POST /_test/slot-ms": (b) => {
    const ms = Number(b.ms);
    if (!Number.isInteger(ms) || ms < 0) throw new Error("ms must be a non-negative integer");
    const previous = slotMs;
    setSlotTimer(ms);
    return { slot_ms: ms, previous };
  },
  "POST /_test/index": (b) => {
    const name = b.view ?? "";
    if (typeof name !== "string" || !VIEW_NAME.test(name)) throw new Error("view must be a view name");
    const view = { ...viewOf(name) };
    for (const [field, key] of [["lag_slots", "lag"], ["first_available", "firstAvailable"]]) {
      if (b[field] === undefined) continue;
      const n = Number(b[field]);
      if (!Number.isInteger(n) || n < 0) throw new Error(`${field} must be a non-negative integer`);
      view[key] = BigInt(n);
    }
    views.set(name, view);
    return { view: name, lag_slots: view.lag, first_available: view.firstAvailable };
  },
  "GET /_test/state": () => ({ slot, slot_ms: slotMs, held, queued: queue.length, landed: landed.size, dropped }),
};

function send(res, status, body) {
  const text = stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", async () => {
    const raw = Buffer.concat(chunks).toString("utf8");
    const path = (req.url ?? "/").split("?")[0];
    const hook = hooks[`${req.method} ${path}`];
    if (hook) {
      try {
        send(res, 200, await hook(raw ? JSON.parse(raw) : {}));
      } catch (e) {
        send(res, 400, { error: e.message });
      }
      return;
    }
    const name = path === "/" ? "" : path.startsWith("/view/") ? path.slice(6) : null;
    if (req.method !== "POST" || name === null || !VIEW_NAME.test(name)) return send(res, 404, { error: "not found" });
    const view = viewOf(name);
    let body;
    try {
      body = JSON.parse(raw);
    } catch {
      return send(res, 200, { jsonrpc: "2.0", error: { code: -32700, message: "Parse error" }, id: null });
    }
    if (Array.isArray(body)) {
      if (!body.length) return send(res, 200, { jsonrpc: "2.0", error: { code: -32600, message: "Invalid request" }, id: null });
      return send(res, 200, body.map((one) => handleOne(one, view)));
    }
    send(res, 200, handleOne(body, view));
  });
});

let slotMs = 0;
let timer = null;
function setSlotTimer(ms) {
  if (timer) clearInterval(timer);
  timer = null;
  slotMs = ms;
  if (ms > 0) {
    timer = setInterval(newSlot, ms);
    timer.unref();
  }
}
setSlotTimer(Number(opts["slot-ms"]));
const shutdown = () => {
  if (timer) clearInterval(timer);
  server.close();
  process.exit(0);
};
process.on("SIGTERM", shutdown);
process.on("SIGINT", shutdown);

server.listen(Number(opts.port), "127.0.0.1", () => {
  const { port } = server.address();
  process.stdout.write(
    stringify({
      ready: "solana-chain",
      rpc_url: `http://127.0.0.1:${port}`,
      genesis_hash: opts["genesis-hash"],
      network: `solana:${opts["genesis-hash"].slice(0, 32)}`,
      mint: keys.mint.address,
      mint_authority: keys.mint_authority.address,
      decimals: DECIMALS,
      payer: keys.payer.address,
      payer_ata: payerAta,
      pay_to: keys.pay_to.address,
      pay_to_ata: payToAta,
      fee_payer: keys.fee_payer.address,
      slot,
    }) + "\n",
  );
});
