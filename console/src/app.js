// The operator console: a single page over the operator API. The operator token lives in
// this tab's sessionStorage only and travels as a bearer header (never in a URL).
import uPlot from 'uplot';
import { verifyReceipt } from './verify.js';
import { $, ApiError, SignedOut, Unauthorized, act, amountEl, amountText, api, assetUnit, symbolEl, change, el, fetchText, isAdmin, learnUnits, networkName, readAmount, saveBlob, state as session, upstreamOf as hostOf, watchAmount } from './util.js';
import { shortAddress } from './amount.js';
import { clearKey, initAgents, renderAgents, resetAgents } from './agents.js';
import { renderQueues } from './queues.js';
import { renderApprovals } from './approvals.js';
import { renderChannels } from './channels.js';
import { renderChanges, tell } from './changes.js';
import { renderEvents } from './events.js';

const TOKEN_KEY = 'x402-router.operator-token';
const POLL_MS = 1500;

const state = {
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

// ------------------------------------------------------------------ sign-in
async function signIn(token) {
  session.token = token;
  let me;
  try {
    me = await api('/audit/whoami'); // throws on a refused token
  } catch (e) {
    // Without OPERATOR_TOKEN the router serves no operator API at all (404).
    if (e instanceof ApiError && e.status === 404) throw new Error('this router has no operator API (OPERATOR_TOKEN is not set)');
    throw e;
  }
  session.role = me.role;
  session.operator = me.name;
  session.operatorId = me.operator_id ?? null;
  sessionStorage.setItem(TOKEN_KEY, token);
  $('role').textContent = `${me.name} (${me.role})`;
  $('readonly').hidden = isAdmin();
  const wk = await api('/.well-known/x402-router');
  session.signer = wk.receipt_signer;
  learnUnits(wk);
  updateCapHint();
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
  session.token = null;
  session.role = null;
  clearKey();
  resetAgents();
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
      if (e instanceof SignedOut) return;
      if (e instanceof Unauthorized) return signOut('Signed out: the token was refused.');
      $('live').textContent = `not updating: ${e.message}`;
    }
    if (session.token) schedule();
  }, POLL_MS);
}

const upstreamOf = (p) => hostOf(p.resource);
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

function filters() {
  const f = Object.fromEntries(new FormData($('filters')).entries());
  const time = (v) => (v ? new Date(v).getTime() : null);
  return { agent: f.agent.trim(), status: f.status, host: f.host.trim().toLowerCase(), from: time(f.from), to: time(f.to) };
}

function filtered() {
  const f = filters();
  const agent = f.agent.toLowerCase();
  return [...state.payments.values()]
    .filter((p) => !agent || p.agent_id === agent || (p.agent_name ?? '').toLowerCase().includes(agent))
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
      el('td', { text: p.agent_name ?? p.agent_id, title: p.agent_id, class: 'agent-name' }),
      el('td', { text: upstreamOf(p) || '?' }),
      amountEl(p.amount, assetUnit(p.network, p.asset), 'td', { class: 'num amount' }),
      el('td', {}, el('span', { class: `st st-${p.status}`, text: p.status })),
      el('td', {}, receipt),
    );
    return tr;
  }));
  for (const p of rows) state.seen.add(p.id);
  if (state.seen.size === 0) state.seen.add('');
}

// Splits CSV text (RFC 4180, as the router writes it) into records of cells.
function csvRecords(text) {
  const records = [];
  let cell = '';
  let record = [];
  let quoted = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quoted) {
      if (c === '"' && text[i + 1] === '"') { cell += '"'; i++; } else if (c === '"') quoted = false;
      else cell += c;
    } else if (c === '"') quoted = true;
    else if (c === ',') { record.push(cell); cell = ''; } else if (c === '\r' && text[i + 1] === '\n') {
      record.push(cell); records.push(record); record = []; cell = ''; i++;
    } else cell += c;
  }
  if (cell !== '' || record.length) { record.push(cell); records.push(record); }
  return records;
}

// The filtered list as the router's CSV (GET /audit/payments.csv with the bearer header,
// saved as a blob: the token is never in a URL). Agent, status and time are the API's own
// filters; the upstream host (not an API filter) is applied to the rows here.
async function exportCsv() {
  const f = filters();
  const q = new URLSearchParams({ limit: '500' });
  // An agent id is the API's filter; a name (or part of one) is applied to the rows here.
  const byId = UUID.test(f.agent);
  if (byId) q.set('agent_id', f.agent.toLowerCase());
  if (f.status) q.set('status', f.status);
  q.set('from', new Date(f.from ?? Date.parse(state.since)).toISOString());
  if (f.to !== null) q.set('to', new Date(f.to).toISOString());
  $('csv-error').textContent = '';
  let text;
  try {
    text = await fetchText(`/audit/payments.csv?${q}`);
  } catch (e) {
    if (e instanceof Unauthorized) throw e;
    $('csv-error').textContent = `Export failed: ${e.message}`;
    return;
  }
  const name = byId ? '' : f.agent.toLowerCase();
  if (f.host || name) {
    const records = csvRecords(text);
    const col = records[0].indexOf('resource');
    const nameCol = records[0].indexOf('agent_name');
    // Keep the header and each record whose resource's host matches; records are re-joined
    // from the original text to keep the router's quoting.
    const keep = [records[0]];
    for (const r of records.slice(1)) {
      let resource = r[col];
      try { resource = JSON.parse(resource); } catch { /* a plain URL */ }
      if (!hostOf(resource).toLowerCase().includes(f.host)) continue;
      if (name && !(r[nameCol] ?? '').toLowerCase().includes(name)) continue;
      keep.push(r);
    }
    const quote = (c) => (/[",\r\n]/.test(c) ? `"${c.replaceAll('"', '""')}"` : c);
    text = keep.map((r) => r.map(quote).join(',')).join('\r\n') + '\r\n';
  }
  saveBlob(text, 'payments.csv', 'text/csv');
}

// ------------------------------------------------------------------ overview

// uPlot's columns from the server's buckets: x (seconds), then calls, paid calls, settled
// payments, paid-not-served, stuck.
const COUNT_SERIES = [
  { label: 'calls', stroke: '#1f4e79', fill: 'rgba(31,78,121,.25)', paths: uPlot.paths.bars({ size: [0.8] }) },
  { label: 'paid calls', stroke: '#8a4b00', width: 2 },
  { label: 'settled payments', stroke: '#14642e', width: 2, dash: [6, 4] },
  { label: 'paid, not served', stroke: '#a11818', width: 2 },
  { label: 'stuck', stroke: '#6b2d8f', width: 2, dash: [2, 3] },
];

function columns(buckets) {
  return [
    buckets.map((b) => Date.parse(b.start) / 1000),
    buckets.map((b) => b.calls),
    buckets.map((b) => b.paid_calls),
    buckets.map((b) => b.settled),
    buckets.map((b) => b.paid_not_served),
    buckets.map((b) => b.stuck),
  ];
}

const ASSET_COLORS = ['#14642e', '#1f4e79', '#8a4b00', '#6b2d8f', '#a11818', '#005f66'];

// The amount settled per (network, asset) and bucket: one series per asset, in tokens (the
// chart's scale only: a float is fine to draw, never to save).
function movedColumns(buckets) {
  const assets = [...new Set(buckets.flatMap((b) => b.moved.map((m) => `${m.network} ${m.asset}`)))].sort();
  const label = (network, asset) => `${assetUnit(network, asset)?.symbol || shortAddress(asset)} on ${networkName(network)}`;
  const series = assets.map((a, i) => ({ label: label(...a.split(' ')), stroke: ASSET_COLORS[i % ASSET_COLORS.length], width: 2, points: { show: true } }));
  const data = [buckets.map((b) => Date.parse(b.start) / 1000)];
  for (const a of assets) {
    const [network, asset] = a.split(' ');
    const decimals = assetUnit(network, asset)?.decimals ?? 0;
    data.push(buckets.map((b) => {
      const m = b.moved.find((x) => `${x.network} ${x.asset}` === a);
      return m ? Number(m.amount) / 10 ** decimals : 0;
    }));
  }
  // Drawn in tokens when the asset's decimals are known (named by symbol, else by address).
  const yOf = (network, asset) => { const u = assetUnit(network, asset); return u ? u.symbol || shortAddress(asset) : 'atomic units'; };
  const symbols = new Set(assets.map((a) => yOf(...a.split(' '))));
  return { series, data, key: assets.join('|'), yLabel: symbols.size === 1 ? [...symbols][0] : 'amount' };
}

function chart(id, data, step, series = COUNT_SERIES, yLabel = 'count', key = '') {
  const box = $(id);
  const width = Math.max(260, box.clientWidth || 600);
  const old = state.charts[id];
  if (old && old.width === width && old.key === key) {
    old.setData(data);
    return;
  }
  old?.destroy();
  const u = new uPlot({
    width,
    height: 220,
    series: [{}, ...series],
    axes: [{}, { label: yLabel, size: 70, ...(yLabel === 'count' ? { incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] } : {}) }],
    scales: {
      x: { time: true, range: (_, min, max) => [min - step / 2, max + step / 2] },
      // Counts: at least 0 to 1; amounts (tokens): up to a little over the largest.
      y: { range: (_, min, max) => [0, yLabel === 'count' ? Math.max(1, max) : max > 0 ? max * 1.1 : 1] },
    },
  }, data, box);
  u.key = key;
  state.charts[id] = u;
}

function movedChart(id, buckets, step) {
  const { series, data, key, yLabel } = movedColumns(buckets);
  if (series.length === 0) {
    state.charts[id]?.destroy();
    delete state.charts[id];
    $(id).replaceChildren(el('p', { class: 'muted', text: 'nothing settled in this period' }));
    return;
  }
  if (!state.charts[id]) $(id).replaceChildren();
  chart(id, data, step, series, yLabel, key);
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
  $('moved').replaceChildren(...o.moved.map((m) => {
    const unit = assetUnit(m.network, m.asset);
    return el('tr', {},
      el('td', { text: networkName(m.network), title: m.network }), symbolEl(m.network, m.asset, 'td'),
      amountEl(m.settled_24h, unit, 'td', { class: 'num' }), amountEl(m.settled_30d, unit, 'td', { class: 'num' }));
  }));
  if (o.moved.length === 0) $('moved').append(el('tr', {}, el('td', { colspan: '4', text: 'nothing settled in 30 days' })));
  const wallet = await walletBalances();
  $('wallet').replaceChildren(...(wallet.length
    ? wallet.map((w) => el('tr', {}, el('td', { text: networkName(w.network), title: w.network }), symbolEl(w.network, w.asset, 'td'),
      amountEl(w.balance, assetUnit(w.network, w.asset), 'td', { class: 'num' })))
    : [el('tr', {}, el('td', { colspan: '3', text: 'not read yet' }))]));
  await refreshSettings();
  chart('chart-hour', columns(o.hourly), 3600);
  chart('chart-day', columns(o.daily), 86400);
  movedChart('moved-hour', o.hourly, 3600);
  movedChart('moved-day', o.daily, 86400);
}

let updateCapHint = () => {}; // the cap field's conversion, shown again when it is set

// The global pause switch, the wallet-wide cap and payTo block list (GET /admin/settings; changes need an
// admin token). Updated in place on every poll so that a half-typed cap is not lost.
function renderSettings(st) {
  const paused = st.paused;
  $('pause-state').textContent = paused
    ? (st.pause_unpaid ? 'PAUSED: every new call is refused (503 payments_paused).' : 'PAUSED: every new payment is refused (503 payments_paused); unpaid calls pass.')
    : 'Running: payments are allowed.';
  $('pause-card').classList.toggle('paused', paused);
  change($('pause'));
  change($('pause-unpaid'));
  change($('resume'));
  change($('cap'));
  change($('cap-save'));
  change($('blocked'));
  change($('blocked-save'));
  $('pause').disabled = $('pause').disabled || paused;
  $('resume').disabled = $('resume').disabled || !paused;
  $('cap-used').replaceChildren('used in 24 h: ', amountEl(st.wallet_used_24h), '; cap: ', amountEl(st.wallet_daily_cap));
  if (!$('cap').dataset.touched && $('cap').value !== amountText(st.wallet_daily_cap)) {
    $('cap').value = amountText(st.wallet_daily_cap);
    updateCapHint();
  }
  const blocked = (st.blocked_pay_to ?? []).join(', ');
  if (!$('blocked').dataset.touched && $('blocked').value !== blocked) $('blocked').value = blocked;
}

async function refreshSettings() {
  renderSettings(await api('/admin/settings'));
}

function initSettings() {
  const err = $('pause-error');
  $('pause').addEventListener('click', () => act($('pause'), err, async () => {
    await api('/admin/pause', { method: 'POST', body: { unpaid: $('pause-unpaid').checked } });
  }).then(refreshSettings).catch(showError));
  $('resume').addEventListener('click', () => act($('resume'), err, async () => {
    tell(err, await api('/admin/pause', { method: 'DELETE' }));
  }).then(refreshSettings).catch(showError));
  $('cap').addEventListener('input', () => { $('cap').dataset.touched = '1'; });
  updateCapHint = watchAmount($('cap'), $('cap-hint'));
  $('cap-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    let cap;
    try {
      cap = readAmount($('cap').value);
    } catch (e) {
      $('cap-error').classList.remove('news');
      $('cap-error').textContent = `Wallet daily cap: ${e.message}`;
      return;
    }
    act($('cap-save'), $('cap-error'), async () => {
      tell($('cap-error'), await api('/admin/settings', { method: 'PATCH', body: { wallet_daily_cap: cap } }));
      delete $('cap').dataset.touched;
    }).then(refreshSettings).catch(showError);
  });
  // The wallet-wide payTo block list: addresses as typed (the API checks and normalizes them).
  $('blocked').addEventListener('input', () => { $('blocked').dataset.touched = '1'; });
  $('blocked-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const list = $('blocked').value.split(/[\s,]+/).filter(Boolean);
    act($('blocked-save'), $('blocked-error'), async () => {
      tell($('blocked-error'), await api('/admin/settings', { method: 'PATCH', body: { blocked_pay_to: list.length ? list : null } }));
      delete $('blocked').dataset.touched;
    }).then(refreshSettings).catch(showError);
  });
}

// The paying wallet's balances, from the router's own gauge
// `x402_router_wallet_balance{network, asset}` on /metrics (refreshed in the background).
async function walletBalances() {
  // /metrics needs an operator token on the main listener, like /audit/*.
  const rows = [];
  for (const line of (await fetchText('/metrics')).split('\n')) {
    const m = /^x402_router_wallet_balance\{([^}]*)\}\s+(\S+)$/.exec(line);
    if (!m) continue;
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="([^"]*)"/g)].map((l) => [l[1], l[2]]));
    rows.push({ network: labels.network || '?', asset: labels.asset || '?', balance: m[2] });
  }
  return rows;
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
  if (e instanceof SignedOut) return; // signed out while it loaded: nothing was sent
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
  if (!session.token) return;
  const hash = location.hash.slice(1);
  if (hash.startsWith('receipt/')) {
    show('receipt');
    renderReceipt(hash.slice('receipt/'.length)).catch(showError);
    return;
  }
  const view = ['overview', 'payments', 'queues', 'approvals', 'channels', 'changes', 'agents', 'events'].includes(hash) ? hash : 'overview';
  if (view !== 'agents') clearKey(); // a new key is shown once, never kept
  show(view);
  if (view === 'queues') renderQueues().catch(showError);
  else if (view === 'approvals') renderApprovals().catch(showError);
  else if (view === 'channels') renderChannels().catch(showError);
  else if (view === 'changes') renderChanges().catch(showError);
  else if (view === 'agents') renderAgents().catch(showError);
  else if (view === 'events') renderEvents().catch(showError);
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
  $('approvals-state').addEventListener('change', () => renderApprovals().catch(showError));
  $('changes-state').addEventListener('change', () => renderChanges().catch(showError));
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
  $('csv').addEventListener('click', () => exportCsv().catch(showError));
  initSettings();
  initAgents();
  $('back').addEventListener('click', () => { location.hash = 'payments'; });
  window.addEventListener('hashchange', route);
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) signIn(saved).catch(() => signOut('Your session ended; sign in again.'));
  else $('token').focus();
}

init();
