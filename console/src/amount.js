// Amounts as people read them: atomic units (decimal strings, as the API keeps them) shown in
// the token's units with its symbol, and typed amounts converted back to atomic units exactly.
// Everything here works on strings and BigInt: never a float.
//
// A unit is `{ decimals, symbol }` (symbol may be null): the router's unit
// (`unit` of /.well-known/x402-router) or one asset's.

const ATOMIC = /^(0|[1-9][0-9]*)$/;

/** `atomic` (a decimal string of atomic units) in tokens: `10000` with 6 decimals is `0.01`.
 *  Trailing zeros of the fraction are dropped, but at least `min` fraction digits are kept
 *  (2 by default: `5.00`, `0.01`, `0.000001`). Not a decimal string: returned as given. */
export function formatUnits(atomic, decimals, min = 2) {
  const s = String(atomic);
  if (!ATOMIC.test(s) || !Number.isInteger(decimals) || decimals < 0) return s;
  if (decimals === 0) return s;
  const padded = s.padStart(decimals + 1, '0');
  const whole = padded.slice(0, -decimals);
  let frac = padded.slice(-decimals).replace(/0+$/, '');
  const keep = Math.min(min, decimals);
  if (frac.length < keep) frac = frac.padEnd(keep, '0');
  return frac ? `${groupThousands(whole)}.${frac}` : groupThousands(whole);
}

function groupThousands(whole) {
  return whole.replace(/\B(?=(\d{3})+(?!\d))/g, ',');
}

/** `atomic` in its token's units with its symbol: `0.01 USDC`; without a symbol, the amount in
 *  tokens alone (`0.01`: the token is named beside it, by its address); without a unit
 *  (decimals unknown), the atomic amount itself: `10000 atomic units`. */
export function formatAmount(atomic, unit) {
  if (atomic === null || atomic === undefined) return 'none';
  if (!unit || !Number.isInteger(unit.decimals)) return `${atomic} atomic units`;
  const tokens = formatUnits(atomic, unit.decimals);
  return unit.symbol ? `${tokens} ${unit.symbol}` : tokens;
}

/** The tooltip of a shown amount: the atomic units it stands for. */
export function atomicTitle(atomic) {
  return `${atomic} atomic units`;
}

/** Why a typed amount was refused. */
export class AmountError extends Error {}

/**
 * Parses an amount typed by a person: `5`, `5.00`, `0.000001`, `5.00 USDC`, `1,000.5`
 * (commas between groups of three digits only), in `unit`; returns the atomic units as a
 * decimal string (`5.00` with 6 decimals is `5000000`). Refuses (AmountError): empty input,
 * a sign, an exponent, more fraction digits than the unit has, another symbol than the
 * unit's, and anything else that is not a plain decimal number.
 */
export function parseAmount(input, unit) {
  if (!unit || !Number.isInteger(unit.decimals) || unit.decimals < 0) throw new AmountError('the router\'s unit is unknown: type atomic units');
  let s = String(input).trim();
  if (s === '') throw new AmountError('empty amount');
  if (/^[+-]?[\d.,]*\d\s*e\s*[+-]?\d/i.test(s)) throw new AmountError('write the amount without an exponent');
  const m = /^(\S*?)(\s*)([A-Za-z$]\S*)$/.exec(s); // a number, then a symbol (`5 USDC`, `5USDC`)
  if (m && m[1] !== '') {
    const [, number, space, symbol] = m;
    if (unit.symbol && symbol.toUpperCase() === unit.symbol.toUpperCase()) s = number;
    else if (!space) throw new AmountError(`"${s}" is not an amount (e.g. 5, 5.00 or 0.01${unit.symbol ? ` ${unit.symbol}` : ''})`);
    else if (!unit.symbol) throw new AmountError(`"${symbol}": this unit has no symbol; type the number alone`);
    else throw new AmountError(`"${symbol}" is not ${unit.symbol}`);
  }
  if (/^[+-]/.test(s)) throw new AmountError('an amount has no sign');
  if (/e/i.test(s)) throw new AmountError('write the amount without an exponent');
  if (!/^(\d{1,3}(,\d{3})+|\d+)?(\.\d*)?$/.test(s) || s === '' || s === '.') {
    throw new AmountError(`"${String(input).trim()}" is not an amount (e.g. 5, 5.00 or 0.01${unit.symbol ? ` ${unit.symbol}` : ''})`);
  }
  const [whole = '', frac = ''] = s.replaceAll(',', '').split('.');
  if (frac.length > unit.decimals) {
    throw new AmountError(`at most ${unit.decimals} digits after the point (${unit.symbol || 'this unit'} has ${unit.decimals} decimals)`);
  }
  const atomic = BigInt(whole || '0') * 10n ** BigInt(unit.decimals) + BigInt(frac.padEnd(unit.decimals, '0') || '0');
  return atomic.toString();
}

/** A short form of an address: `0x036C…CF7e`. */
export function shortAddress(a) {
  const s = String(a ?? '');
  return s.length > 14 ? `${s.slice(0, 6)}…${s.slice(-4)}` : s;
}
