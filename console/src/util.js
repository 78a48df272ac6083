// What every view shares: the page state, the API client and a DOM helper. The operator token
// lives in this tab's sessionStorage only and travels as a bearer header (never in a URL).

import { AmountError, atomicTitle, formatAmount, formatUnits, parseAmount, shortAddress } from './amount.js';

export const $ = (id) => document.getElementById(id);

export const state = {
  token: null,
  role: null, // 'viewer' | 'admin', from GET /audit/whoami
  operator: null,
  operatorId: null, // null: the bootstrap OPERATOR_TOKEN
  signer: null,
  unit: null, // the router's unit { decimals, symbol }: budgets, caps (/.well-known/x402-router)
  assets: new Map(), // `network asset` (asset lowercase) -> { decimals, symbol }
  networks: new Map(), // CAIP-2 -> display name (the x402 v1 name, when it has one)
};

/** Learns the router's unit, assets and network names from /.well-known/x402-router. */
export function learnUnits(wk) {
  state.unit = wk.unit ?? null;
  state.assets.clear();
  state.networks.clear();
  for (const n of wk.networks ?? []) {
    state.networks.set(n.network, n.v1_name || n.network);
    for (const a of n.assets) state.assets.set(`${n.network} ${a.asset.toLowerCase()}`, { decimals: a.decimals, symbol: a.symbol ?? null });
  }
}

/** The unit of `asset` on `network` ({ decimals, symbol }), or null when the router does not
 *  pay with it (then its amounts are shown in atomic units). */
export const assetUnit = (network, asset) => state.assets.get(`${network} ${String(asset).toLowerCase()}`) ?? null;

/** A network by name: `base-sepolia` for `eip155:84532`; its CAIP-2 id when it has no name. */
export const networkName = (network) => state.networks.get(network) ?? network;

/** An amount of atomic units shown in `unit` (`0.01 USDC`); the tooltip holds the atomic units.
 *  `unit` defaults to the router's unit (budgets, caps). */
export function amountEl(atomic, unit = state.unit, tag = 'span', attrs = {}) {
  if (atomic === null || atomic === undefined) return el(tag, { ...attrs, text: 'none' });
  return el(tag, { ...attrs, text: formatAmount(atomic, unit), title: atomicTitle(atomic), 'data-atomic': String(atomic) });
}

/** An asset by symbol (a short address when it has none); its address in the tooltip. */
export function symbolEl(network, asset, tag = 'span', attrs = {}) {
  return el(tag, { ...attrs, text: assetUnit(network, asset)?.symbol || shortAddress(asset), title: `${asset} on ${network}` });
}

/** The token was refused (401, or 403 on a read: not an operator token). */
export class Unauthorized extends Error {}

/** No token any more (signed out while a view was still loading): nothing was sent. */
export class SignedOut extends Unauthorized {}

// What the router serves to anyone: every other path needs the operator token.
const PUBLIC_PATHS = ['/.well-known/x402-router', '/healthz', '/readyz', '/openapi.json'];

/** The bearer header, or SignedOut: a request that needs a token never leaves without one. */
function authHeaders(path) {
  if (state.token) return { Authorization: `Bearer ${state.token}` };
  if (PUBLIC_PATHS.includes(path.split('?')[0])) return {};
  throw new SignedOut('signed out');
}

/** The API refused a request: `status`, `code` and the API's own error text. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** One JSON call to the router. `body` (an object) is sent as JSON. */
export async function api(path, { method = 'GET', body } = {}) {
  const headers = { Accept: 'application/json', ...authHeaders(path) };
  const init = { method, headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  if (resp.status === 401 || (resp.status === 403 && method === 'GET')) throw new Unauthorized('the token was refused');
  if (!resp.ok) {
    let detail = null;
    try {
      detail = await resp.json();
    } catch {
      // not JSON: the status says it
    }
    throw new ApiError(resp.status, detail?.code ?? null, detail?.error ?? `${path.split('?')[0]}: HTTP ${resp.status}`);
  }
  if (resp.status === 204) return null;
  return resp.json();
}

/** Raw GET with the bearer header (for CSV and /metrics). */
export async function fetchText(path) {
  const headers = authHeaders(path);
  const resp = await fetch(path, { headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' });
  if (resp.status === 401) throw new Unauthorized('the token was refused');
  if (!resp.ok) {
    let detail = null;
    try {
      detail = await resp.json();
    } catch {
      // not JSON
    }
    throw new ApiError(resp.status, detail?.code ?? null, detail?.error ?? `${path.split('?')[0]}: HTTP ${resp.status}`);
  }
  return resp.text();
}

export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else if (k === 'onclick') e.addEventListener('click', v);
    else if (k === 'onsubmit') e.addEventListener('submit', v);
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c);
  return e;
}

export const isAdmin = () => state.role === 'admin';

/** A control that changes something: disabled, with the reason, for a viewer token. */
export function change(control) {
  control.classList.add('change');
  control.disabled = !isAdmin();
  if (isAdmin()) control.removeAttribute('title');
  else control.title = 'needs an admin operator token';
  return control;
}

/** Runs `fn` with `button` disabled meanwhile; its error text goes to `out` (role=alert). */
export async function act(button, out, fn) {
  out.textContent = '';
  out.classList.remove('news');
  button.disabled = true;
  try {
    await fn();
  } catch (e) {
    if (e instanceof Unauthorized) throw e;
    out.textContent = e instanceof ApiError ? `${e.message}${e.code ? ` (${e.code})` : ''}` : `failed: ${e.message}`;
  } finally {
    if (button.isConnected) button.disabled = !isAdmin();
  }
}

export function upstreamOf(resource) {
  const r = resource;
  const url = typeof r === 'string' ? r : r && typeof r.url === 'string' ? r.url : null;
  if (!url) return '';
  try {
    return new URL(url).host;
  } catch {
    return '';
  }
}

export function saveBlob(text, name, type) {
  const blob = new Blob([text], { type });
  const a = el('a', { href: URL.createObjectURL(blob), download: name });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

/** A typed amount in the router's unit as atomic units (a decimal string); null for empty
 *  (no limit). Without a known unit, the input is taken as atomic units. Throws AmountError. */
export function readAmount(raw) {
  const s = String(raw ?? '').trim();
  if (s === '') return null;
  if (!state.unit) {
    if (!/^(0|[1-9][0-9]*)$/.test(s)) throw new AmountError('the router has no payable asset: type atomic units');
    return s;
  }
  return parseAmount(s, state.unit);
}

/** Shows, under an amount field, what it will save: `= 5000000 atomic units (5.00 USDC)`,
 *  `no limit`, or why the text is not an amount. Updated as the operator types. */
export function watchAmount(input, out) {
  const update = () => {
    try {
      const atomic = readAmount(input.value);
      out.classList.remove('error');
      out.textContent = atomic === null ? 'empty: no limit' : `= ${atomic} atomic units (${formatAmount(atomic, state.unit)})`;
      input.removeAttribute('aria-invalid');
    } catch (e) {
      out.classList.add('error');
      out.textContent = e.message;
      input.setAttribute('aria-invalid', 'true');
    }
  };
  input.addEventListener('input', update);
  update();
  return update;
}

/** The text an amount field starts with: the amount in the router's unit, no symbol. */
export const amountText = (atomic) => (atomic === null || atomic === undefined ? '' : state.unit ? formatUnits(atomic, state.unit.decimals).replaceAll(',', '') : String(atomic));
