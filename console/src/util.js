// What every view shares: the page state, the API client and a DOM helper. The operator token
// lives in this tab's sessionStorage only and travels as a bearer header (never in a URL).

export const $ = (id) => document.getElementById(id);

export const state = {
  token: null,
  role: null, // 'viewer' | 'admin', from GET /audit/whoami
  operator: null,
  signer: null,
};

/** The token was refused (401, or 403 on a read: not an operator token). */
export class Unauthorized extends Error {}

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
  const headers = { Accept: 'application/json' };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
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
  const headers = state.token ? { Authorization: `Bearer ${state.token}` } : {};
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
