// Receipt verification, in the browser, exactly as the router signs (src/receipts/): EIP-191
// personal_sign by the receipt signer over the RFC 8785 (JCS) bytes of the receipt without its
// `signature` member.
import { secp256k1 } from '@noble/curves/secp256k1';
import { keccak_256 } from '@noble/hashes/sha3';
import { bytesToHex, hexToBytes, utf8ToBytes, concatBytes } from '@noble/hashes/utils';

// RFC 8785: members sorted by UTF-16 code units (JavaScript's default sort), ECMAScript
// serialization of strings and numbers, no whitespace.
export function jcs(value) {
  if (value === null || typeof value !== 'object') {
    if (typeof value === 'number' && !Number.isFinite(value)) throw new Error('non-finite number');
    return JSON.stringify(value);
  }
  if (Array.isArray(value)) return '[' + value.map(jcs).join(',') + ']';
  return '{' + Object.keys(value).sort()
    .filter((k) => value[k] !== undefined)
    .map((k) => JSON.stringify(k) + ':' + jcs(value[k])).join(',') + '}';
}

function address(uncompressed) {
  return '0x' + bytesToHex(keccak_256(uncompressed.slice(1)).slice(-20));
}

// The address that signed `receipt` (an object as served), or throws why it cannot be read.
export function recoverSigner(receipt) {
  const { signature, ...unsigned } = receipt;
  if (typeof signature !== 'string' || !/^0x[0-9a-fA-F]{130}$/.test(signature)) throw new Error('signature is malformed');
  const message = utf8ToBytes(jcs(unsigned));
  const prefix = utf8ToBytes(`\x19Ethereum Signed Message:\n${message.length}`);
  const digest = keccak_256(concatBytes(prefix, message));
  const raw = hexToBytes(signature.slice(2));
  const v = raw[64];
  const recovery = v >= 27 ? v - 27 : v;
  if (recovery !== 0 && recovery !== 1) throw new Error('signature is malformed');
  const sig = secp256k1.Signature.fromCompact(raw.slice(0, 64)).addRecoveryBit(recovery);
  return address(sig.recoverPublicKey(digest).toRawBytes(false));
}

// { valid, reason, recovered }: valid only when the signature recovers to both the receipt's
// stated signer and the signer the router publishes.
export function verifyReceipt(receipt, publishedSigner) {
  let recovered;
  try {
    recovered = recoverSigner(receipt);
  } catch (e) {
    return { valid: false, reason: String(e.message || e) };
  }
  const same = (a, b) => typeof a === 'string' && typeof b === 'string' && a.toLowerCase() === b.toLowerCase();
  if (!same(recovered, receipt.signer)) return { valid: false, recovered, reason: `signed by ${recovered}, not by the stated signer` };
  if (!same(recovered, publishedSigner)) return { valid: false, recovered, reason: `signed by ${recovered}, not by the published signer ${publishedSigner}` };
  return { valid: true, recovered };
}
