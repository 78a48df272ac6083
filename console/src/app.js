// The operator console: a single page over the operator API. The operator token lives in
// this tab's sessionStorage only and travels as a bearer header (never in a URL).
import uPlot from 'uplot';
import { verifyReceipt } from './verify.js';

const TOKEN_KEY = 'x402-router.operator-token';
const POLL_MS = 1500;
const $ = (id) => document.getElementById(id);

const state = {
  token: null,
  signer: null,
  payments: new Map(), // id -> payment view
  tailCursor: null, // the cursor that fetched the last (partial) page
  since: null, // RFC 3339: the list's lower bound
  windowKey: '', // the From filter the list was loaded for
  generation: 0,
  seen: new Set(),
  timer: null,
  view: 'overview',
  charts: {},
};

class Unauthorized extends Error {}

async function api(path) {
  const headers = { Accept: 'application/json' };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  const resp = await fetch(path, { headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' });
  if (resp.status === 401 || resp.status === 403) throw new Unauthorized('the token was refused');
  if (!resp.ok) throw new Error(`${path.split('?')[0]}: HTTP ${resp.status}`);
  return resp.json();
}

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

// ------------------------------------------------------------------ sign-in
async function signIn(token) {
  state.token = token;
  try {
    await api('/audit/payments?limit=1'); // throws on a refused token
  } catch (e) {
    // Without OPERATOR_TOKEN the router serves no operator API at all (404).
    if (/HTTP 404$/.test(e.message)) throw new Error('this router has no operator API (OPERATOR_TOKEN is not set)');
    throw e;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  const wk = await api('/.well-known/x402-router');
  state.signer = wk.receipt_signer;
  $('signer').textContent = `signer ${wk.receipt_signer}`;
  $('signin').hidden = true;
  $('nav').hidden = false;
  $('who').hidden = false;
  await refreshPayments();
  route();
  schedule();
}

function signOut(message = '') {
  sessionStorage.removeItem(TOKEN_KEY);
  state.token = null;
  state.payments.clear();
  state.seen.clear();
  state.tailCursor = null;
  state.since = null;
  clearTimeout(state.timer);
  for (const v of document.querySelectorAll('.view')) v.hidden = true;
  $('nav').hidden = true;
  $('who').hidden = true;
  $('signin').hidden = false;
  $('signin-error').textContent = message;
  $('token').value = '';
  $('token').focus();
}

// ------------------------------------------------------------------ payments (live)
// The list holds the payments created since `state.since` (the From filter, or 24 h before
// the list was loaded), fetched once and then followed by polling the cursor of its last page.
function resetWindow() {
  const from = $('f-from').value;
  state.windowKey = from;
  state.since = new Date(from ? new Date(from).getTime() : Date.now() - 24 * 3600e3).toISOString();
  state.payments.clear();
  state.tailCursor = null;
  state.generation += 1; // a fetch of the previous window still in flight is dropped
}

async function refreshPayments() {
  if (state.since === null) resetWindow();
  const generation = state.generation;
  for (let guard = 0; guard < 100; guard++) {
    const q = new URLSearchParams({ limit: '500', from: state.since });
    if (state.tailCursor) q.set('cursor', state.tailCursor);
    const page = await api(`/audit/payments?${q}`);
    if (generation !== state.generation) return;
    for (const p of page.payments) state.payments.set(p.id, p);
    if (!page.next_cursor) break;
    state.tailCursor = page.next_cursor;
  }
  const t = new Date().toLocaleTimeString();
  $('live').textContent = `live, updated ${t}`;
}

function schedule() {
  clearTimeout(state.timer);
  state.timer = setTimeout(async () => {
    try {
      await refreshPayments();
      render();
    } catch (e) {
      if (e instanceof Unauthorized) return signOut('Signed out: the token was refused.');
      $('live').textContent = `not updating: ${e.message}`;
    }
    if (state.token) schedule();
  }, POLL_MS);
}

function upstreamOf(p) {
  const r = p.resource;
  const url = typeof r === 'string' ? r : r && typeof r.url === 'string' ? r.url : null;
  if (!url) return '';
  try {
    return new URL(url).host;
  } catch {
    return '';
  }
}

function filters() {
  const f = Object.fromEntries(new FormData($('filters')).entries());
  const time = (v) => (v ? new Date(v).getTime() : null);
  return { agent: f.agent.trim(), status: f.status, host: f.host.trim().toLowerCase(), from: time(f.from), to: time(f.to) };
}

function filtered() {
  const f = filters();
  return [...state.payments.values()]
    .filter((p) => !f.agent || p.agent_id === f.agent)
    .filter((p) => !f.status || p.status === f.status)
    .filter((p) => !f.host || upstreamOf(p).toLowerCase().includes(f.host))
    .filter((p) => f.from === null || Date.parse(p.created_at) >= f.from)
    .filter((p) => f.to === null || Date.parse(p.created_at) < f.to)
    .sort((a, b) => b.created_at.localeCompare(a.created_at));
}

function renderPayments() {
  const rows = filtered();
  $('count').textContent = `${rows.length} of ${state.payments.size} payments since ${new Date(state.since).toLocaleString()}`;
  const body = $('payments').tBodies[0];
  body.replaceChildren(...rows.slice(0, 500).map((p) => {
    const tr = el('tr', { 'data-id': p.id });
    if (!state.seen.has(p.id) && state.seen.size > 0) tr.className = 'new';
    const receipt = p.receipt_id
      ? el('a', { href: `#receipt/${p.receipt_id}`, text: 'receipt', 'aria-label': `receipt of payment ${p.id}` })
      : document.createTextNode('none');
    tr.append(
      el('td', { text: new Date(p.created_at).toLocaleString() }),
      el('td', { class: 'mono', text: p.agent_id.slice(0, 8), title: p.agent_id }),
      el('td', { text: upstreamOf(p) || '?' }),
      el('td', { class: 'num', text: p.amount }),
      el('td', {}, el('span', { class: `st st-${p.status}`, text: p.status })),
      el('td', {}, receipt),
    );
    return tr;
  }));
  for (const p of rows) state.seen.add(p.id);
  if (state.seen.size === 0) state.seen.add('');
}

function csvCell(v) {
  const s = v === null || v === undefined ? '' : typeof v === 'object' ? JSON.stringify(v) : String(v);
  // A leading =, +, - or @ would be a formula in a spreadsheet.
  const safe = /^[=+\-@]/.test(s) ? `'${s}` : s;
  return /[",\n\r]/.test(safe) ? `"${safe.replaceAll('"', '""')}"` : safe;
}

function exportCsv() {
  const cols = ['id', 'created_at', 'agent_id', 'idempotency_key', 'network', 'asset', 'amount', 'pay_to', 'status', 'tx_hash', 'receipt_id'];
  const lines = [cols.join(',')];
  for (const p of filtered()) lines.push([...cols.map((c) => csvCell(p[c])), csvCell(upstreamOf(p))].join(','));
  lines[0] += ',upstream_host';
  const blob = new Blob([lines.join('\r\n') + '\r\n'], { type: 'text/csv' });
  const a = el('a', { href: URL.createObjectURL(blob), download: 'payments.csv' });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// ------------------------------------------------------------------ overview

// uPlot's columns from the server's buckets: x (seconds), calls, paid calls, settled payments.
function columns(buckets) {
  return [
    buckets.map((b) => Date.parse(b.start) / 1000),
    buckets.map((b) => b.calls),
    buckets.map((b) => b.paid_calls),
    buckets.map((b) => b.settled),
  ];
}

function chart(id, data, step) {
  const box = $(id);
  const width = Math.max(260, box.clientWidth || 600);
  if (state.charts[id] && state.charts[id].width === width) {
    state.charts[id].setData(data);
    return;
  }
  state.charts[id]?.destroy();
  state.charts[id] = new uPlot({
    width,
    height: 220,
    series: [
      {},
      { label: 'calls', stroke: '#1f4e79', fill: 'rgba(31,78,121,.25)', paths: uPlot.paths.bars({ size: [0.8] }) },
      { label: 'paid calls', stroke: '#8a4b00', width: 2 },
      { label: 'settled payments', stroke: '#14642e', width: 2, dash: [6, 4] },
    ],
    axes: [{}, { label: 'count', incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] }],
    scales: {
      x: { time: true, range: (u, min, max) => [min - step / 2, max + step / 2] },
      y: { range: (u, min, max) => [0, Math.max(1, max)] },
    },
  }, data, box);
}

async function renderOverview() {
  const o = await api('/audit/overview');
  const day = o.hourly.reduce((acc, b) => ({ calls: acc.calls + b.calls, paid: acc.paid + b.paid_calls }), { calls: 0, paid: 0 });
  const tile = (k, v, alert = false) => el('div', { class: alert && v > 0 ? 'tile alert' : 'tile' }, el('div', { class: 'v', text: String(v) }), el('div', { class: 'k', text: k }));
  $('tiles').replaceChildren(
    tile('calls, 24 h', day.calls),
    tile('paid calls, 24 h', day.paid),
    tile('paid, not served', o.paid_not_served, true),
    tile('stuck', o.stuck, true),
    tile('settlement pending', o.settlement_pending, true),
  );
  $('moved').replaceChildren(...o.moved.map((m) => el('tr', {},
    el('td', { text: m.network }), el('td', { class: 'mono', text: m.asset }),
    el('td', { class: 'num', text: m.settled_24h }), el('td', { class: 'num', text: m.settled_30d }))));
  if (o.moved.length === 0) $('moved').append(el('tr', {}, el('td', { colspan: '4', text: 'nothing settled in 30 days' })));
  const wallet = await walletBalances();
  $('wallet').replaceChildren(...(wallet.length
    ? wallet.map((w) => el('tr', {}, el('td', { text: w.network }), el('td', { class: 'mono', text: w.asset }), el('td', { class: 'num', text: w.balance })))
    : [el('tr', {}, el('td', { colspan: '3', text: 'not read yet' }))]));
  chart('chart-hour', columns(o.hourly), 3600);
  chart('chart-day', columns(o.daily), 86400);
}

// The paying wallet's balances, from the router's own gauge
// `x402_router_wallet_balance{network, asset}` on /metrics (refreshed in the background).
async function walletBalances() {
  // /metrics needs an operator token on the main listener, like /audit/*.
  const headers = state.token ? { Authorization: `Bearer ${state.token}` } : {};
  const resp = await fetch('/metrics', { headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' });
  if (!resp.ok) throw new Error(`/metrics: HTTP ${resp.status}`);
  const rows = [];
  for (const line of (await resp.text()).split('\n')) {
    const m = /^x402_router_wallet_balance\{([^}]*)\}\s+(\S+)$/.exec(line);
    if (!m) continue;
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]));
    rows.push({ network: labels.network || '?', asset: labels.asset || '?', balance: m[2] });
  }
  return rows;
}

// ------------------------------------------------------------------ queues
function queueItem(p) {
  const li = el('li', {}, `${new Date(p.created_at).toLocaleString()} · agent ${p.agent_id.slice(0, 8)} · ${upstreamOf(p) || '?'} · ${p.amount} · ${p.status} `);
  if (p.tx_hash) li.append(el('span', { class: 'mono', text: p.tx_hash }));
  return li;
}

async function renderQueues() {
  const fill = (id, rows) => $(id).replaceChildren(...(rows.length ? rows.map(queueItem) : [el('li', { text: 'empty' })]));
  fill('q-pns', (await api('/audit/payments?status=paid_not_served&limit=500')).payments);
  fill('q-stuck', (await api('/audit/payments?status=stuck&limit=500')).payments);
  // An upstream that answered `settlement_pending` (or whose settlement the chain does not
  // show yet) leaves the intent `unconfirmed` or `unknown` until reconcile reads the chain.
  const pending = [];
  for (const status of ['unconfirmed', 'unknown']) pending.push(...(await api(`/audit/payments?status=${status}&limit=500`)).payments);
  fill('q-pending', pending);
}

// ------------------------------------------------------------------ agents
// Atomic units per hour over the last 24 h, exact (BigInt), one decimal.
function burnRate(settled24h) {
  const tenths = (BigInt(settled24h) * 10n) / 24n;
  return `${tenths / 10n}.${tenths % 10n}`;
}

async function renderAgents() {
  const ids = [...new Set([...state.payments.values()].map((p) => p.agent_id))];
  const cards = [];
  for (const id of ids) {
    const s = await api(`/audit/agents/${encodeURIComponent(id)}/spend`);
    const spent = Number(s.settled_24h);
    const budget = s.daily_budget === null ? null : Number(s.daily_budget);
    const card = el('div', { class: 'card agent', 'data-agent': id },
      el('h3', { class: 'mono', text: id }),
      el('div', { text: s.disabled ? 'disabled' : 'enabled' }),
      el('div', { text: `settled in 24 h: ${s.settled_24h}; reserved: ${s.reserved_24h}; daily budget: ${s.daily_budget ?? 'none'}; per call: ${s.max_per_call ?? 'no limit'}` }),
      el('div', { class: 'burn', text: `burn rate: ${burnRate(s.settled_24h)} per hour (24 h average)` }));
    if (budget !== null) {
      const label = `${id.slice(0, 8)}: 24 h spend against the daily budget`;
      card.append(el('meter', { min: '0', max: String(budget), value: String(Math.min(spent, budget)), high: String(budget * 0.8), 'aria-label': label, title: `${spent} of ${budget}` }));
    }
    cards.push(card);
  }
  $('agents').replaceChildren(...(cards.length ? cards : [el('p', { text: 'No agent has paid yet.' })]));
}

// ------------------------------------------------------------------ receipt
async function renderReceipt(id) {
  $('verdict').className = 'verdict';
  $('verdict').textContent = 'verifying…';
  const receipt = await api(`/audit/receipts/${encodeURIComponent(id)}`);
  const wk = await api('/.well-known/x402-router');
  const result = verifyReceipt(receipt, wk.receipt_signer);
  $('verdict').className = result.valid ? 'verdict ok' : 'verdict bad';
  $('verdict').textContent = result.valid
    ? `signature valid: signed by ${result.recovered}, the signer published at /.well-known/x402-router`
    : `signature INVALID: ${result.reason}`;
  $('receipt-json').textContent = JSON.stringify(receipt, null, 2);
}

// ------------------------------------------------------------------ views
function render() {
  if (state.view === 'payments') renderPayments();
  else if (state.view === 'overview') renderOverview().catch(showError);
}

function showError(e) {
  if (e instanceof Unauthorized) return signOut('Signed out: the token was refused.');
  $('live').textContent = `error: ${e.message}`;
}

function show(view) {
  state.view = view;
  for (const v of document.querySelectorAll('.view')) v.hidden = v.id !== `view-${view}`;
  for (const b of document.querySelectorAll('#nav button')) {
    if (b.dataset.view === view) b.setAttribute('aria-current', 'page');
    else b.removeAttribute('aria-current');
  }
}

function route() {
  if (!state.token) return;
  const hash = location.hash.slice(1);
  if (hash.startsWith('receipt/')) {
    show('receipt');
    renderReceipt(hash.slice('receipt/'.length)).catch(showError);
    return;
  }
  const view = ['overview', 'payments', 'queues', 'agents'].includes(hash) ? hash : 'overview';
  show(view);
  if (view === 'queues') renderQueues().catch(showError);
  else if (view === 'agents') renderAgents().catch(showError);
  else render();
}

function init() {
  $('signin-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const token = $('token').value.trim();
    $('signin-error').textContent = '';
    signIn(token).catch((e) => signOut(e instanceof Unauthorized ? 'That token was refused.' : `Cannot sign in: ${e.message}`));
  });
  $('signout').addEventListener('click', () => signOut());
  for (const b of document.querySelectorAll('#nav button')) {
    b.addEventListener('click', () => { location.hash = b.dataset.view; });
  }
  $('filters').addEventListener('input', () => {
    if ($('f-from').value !== state.windowKey) {
      resetWindow();
      refreshPayments().then(renderPayments).catch(showError);
    } else renderPayments();
  });
  $('filters').addEventListener('submit', (ev) => ev.preventDefault());
  $('csv').addEventListener('click', exportCsv);
  $('back').addEventListener('click', () => { location.hash = 'payments'; });
  window.addEventListener('hashchange', route);
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) signIn(saved).catch(() => signOut('Your session ended; sign in again.'));
  else $('token').focus();
}

init();
