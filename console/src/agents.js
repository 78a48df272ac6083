// Agents: a sortable, searchable, paged table (500 agents draw 50 rows at a time), and per
// agent a panel with its spend against each budget (24 h, month, 7 days, lifetime, each host
// budget), burn rate, limits, allowlists and the payTo block list (a form
// that PATCHes /admin/agents/{id} after showing the change, amounts in atomic units),
// disable / enable / rotate key. Creating an agent. Amounts are typed and shown in the
// router's unit (`5`, `5.00 USDC`; converted exactly, see amount.js). A new API key is shown
// once in #key-box and kept nowhere else (cleared on dismiss, on leaving, on sign-out).
import { $, act, amountEl, amountText, api, change, el, readAmount, state as session, watchAmount } from './util.js';
import { formatAmount } from './amount.js';
import { outcome } from './changes.js';

// [field, label, kind]: kind `amount` (typed in the router's unit), `int`, `list`, or `hosts`
// (`host=amount, …`, each amount typed in the router's unit).
const LIMITS = [
  ['max_per_call', 'Max per call', 'amount'],
  ['daily_budget', 'Daily budget (rolling 24 h)', 'amount'],
  ['month_budget', 'Month budget (calendar month, UTC)', 'amount'],
  ['week_budget', 'Week budget (rolling 7 days)', 'amount'],
  ['lifetime_budget', 'Lifetime budget', 'amount'],
  ['calls_per_minute', 'Calls per minute', 'int'],
  ['payments_per_minute', 'Payments per minute', 'int'],
  ['allowed_hosts', 'Allowed upstream hosts (comma or space separated)', 'list'],
  ['host_budgets', 'Host budgets, rolling 24 h (host=amount, comma separated)', 'hosts'],
  ['allowed_pay_to', 'Allowed payTo addresses (comma or space separated)', 'list'],
  ['blocked_pay_to', 'Blocked payTo addresses (comma or space separated)', 'list'],
];

const kindOf = (field) => LIMITS.find(([n]) => n === field)?.[2];

// A host budget map with its hosts in order (the API's JSON object may list them in any order).
const sortedHosts = (m) => (m ? Object.fromEntries(Object.entries(m).sort(([x], [y]) => (x < y ? -1 : x > y ? 1 : 0))) : null);

/** The text of a host budget map: `api.example.com=0.05, *.example.org=0.001` (amounts in
 *  the router's unit, no symbol; with `atomic`, in atomic units). */
export function hostsText(m, atomic = false) {
  return Object.entries(sortedHosts(m) ?? {}).map(([h, v]) => `${h}=${atomic ? v : amountText(v)}`).join(', ');
}

/** The host budget map typed as `host=amount, …` (amounts in the router's unit), null for
 *  empty (no budgets). Throws naming the entry it cannot read. */
export function readHosts(raw) {
  const entries = String(raw ?? '').split(/[,\n]/).map((e) => e.trim()).filter(Boolean);
  if (entries.length === 0) return null;
  const out = {};
  for (const entry of entries) {
    const at = entry.indexOf('=');
    if (at <= 0) throw new Error(`"${entry}" is not host=amount`);
    const host = entry.slice(0, at).trim();
    let v;
    try {
      v = readAmount(entry.slice(at + 1));
    } catch (e) {
      throw new Error(`${host}: ${e.message}`);
    }
    if (v === null) throw new Error(`${host}: no amount`);
    out[host] = v;
  }
  return sortedHosts(out);
}

// The table's columns: [key, header, kind]; kind `amount` sorts as BigInt (none last).
const COLUMNS = [
  ['name', 'Name', 'text'],
  ['disabled', 'Status', 'bool'],
  ['created_at', 'Created', 'text'],
  ['settled_24h', 'Spent 24 h', 'amount'],
  ['remaining_24h', 'Remaining 24 h', 'amount'],
  ['daily_budget', 'Daily budget', 'amount'],
  ['settled_month', 'Spent this month', 'amount'],
  ['month_budget', 'Month budget', 'amount'],
  ['max_per_call', 'Max per call', 'amount'],
];

const PAGE = 50;

const view = {
  agents: [],
  sort: 'created_at',
  dir: 1, // 1 ascending, -1 descending
  query: '',
  page: 0,
  open: null, // the agent whose panel is open
  flash: null, // { id, text }: shown in that agent's panel after it is drawn again
};

const shown = (v) => (v === null || v === undefined ? '' : Array.isArray(v) ? v.join(', ') : String(v));

// The form's value for one non-amount field: empty removes the limit (null); a rate that is
// not an integer goes to the API as typed, so that its 400 names the field.
function valueOf(kind, raw) {
  const s = raw.trim();
  if (s === '') return null;
  if (kind === 'int') return /^\d+$/.test(s) ? Number(s) : s;
  if (kind === 'list') return s.split(/[\s,]+/).filter(Boolean);
  return s;
}

/** Atomic units per hour over the last 24 h (the 24 h spend / 24), exact (BigInt), whole
 *  atomic units (one atomic unit of USDC is 0.000001). */
export function burnRate(settled24h) {
  return (BigInt(settled24h) / 24n).toString();
}

/** Shows, under a host budgets field, what it will save (each host's atomic units and the
 *  amount in the router's unit), or why the text cannot be read. Updated as it is typed. */
function watchHosts(input, out) {
  const update = () => {
    try {
      const m = readHosts(input.value);
      out.classList.remove('error');
      out.textContent = m === null
        ? 'empty: no host budgets'
        : `= ${Object.entries(m).map(([h, v]) => `${h}: ${v} atomic units (${formatAmount(v, session.unit)})`).join('; ')}`;
      input.removeAttribute('aria-invalid');
    } catch (e) {
      out.classList.add('error');
      out.textContent = e.message;
      input.setAttribute('aria-invalid', 'true');
    }
  };
  input.addEventListener('input', update);
  update();
}

/** How a value of an agent reads: amounts in the router's unit, the rest as typed. */
export function readable(field, v) {
  if (v === null || v === undefined) return 'none';
  if (kindOf(field) === 'amount') return formatAmount(v, session.unit);
  if (kindOf(field) === 'hosts') return Object.entries(sortedHosts(v)).map(([h, a]) => `${h}: ${formatAmount(a, session.unit)}`).join(', ');
  return shown(v);
}

function bar(label, spent, budget) {
  const spentEl = amountEl(spent);
  if (budget === null || budget === undefined) {
    return el('div', { class: 'bar' }, el('span', {}, `${label}: `, spentEl, ' spent, no budget'));
  }
  const b = Number(budget); // the meter only: the text is exact
  const s = Number(spent);
  const pct = b > 0 ? Math.round((Math.min(s, b) / b) * 100) : 100;
  const words = `${label}: ${formatAmount(spent, session.unit)} of ${formatAmount(budget, session.unit)}`;
  return el('div', { class: 'bar' },
    el('span', {}, `${label}: `, spentEl, ' of ', amountEl(budget), ` (${pct} %)`),
    el('meter', { min: '0', max: String(b), value: String(Math.min(s, b)), low: String(b * 0.5), high: String(b * 0.8), optimum: '0', 'aria-label': words }));
}

export function showKey(agent, key) {
  $('key-name').textContent = `${agent.name} (${agent.agent_id})`;
  $('new-key').value = key;
  $('key-status').textContent = '';
  $('key-box').hidden = false;
  $('new-key').focus();
  $('new-key').select();
}

export function clearKey() {
  $('new-key').value = '';
  $('key-box').hidden = true;
}

async function copyKey() {
  const input = $('new-key');
  try {
    await navigator.clipboard.writeText(input.value);
  } catch {
    input.select();
    document.execCommand('copy');
  }
  $('key-status').textContent = 'Copied. It will not be shown again.';
}

// The patch the form asks for (only the fields that differ), or throws the first bad amount.
function patchOf(form, a) {
  const data = new FormData(form);
  const patch = {};
  for (const [name, label, kind] of LIMITS) {
    const raw = String(data.get(name) ?? '');
    let v;
    if (kind === 'amount' || kind === 'hosts') {
      try {
        v = kind === 'amount' ? readAmount(raw) : readHosts(raw);
      } catch (e) {
        throw new Error(`${label}: ${e.message}`);
      }
    } else v = valueOf(kind, raw);
    const was = kind === 'hosts' ? sortedHosts(a[name]) : a[name] ?? null;
    if (JSON.stringify(v) !== JSON.stringify(was)) patch[name] = v;
  }
  return patch;
}

// What a patch changes, one line per field: `daily_budget: none → 0.20 USDC (200000 atomic units)`.
function reviewLines(patch, a) {
  return Object.entries(patch).map(([k, v]) => {
    const kind = kindOf(k);
    const atomic = v === null ? '' : kind === 'amount' ? ` (${v} atomic units)` : kind === 'hosts' ? ` (atomic units: ${hostsText(v, true)})` : '';
    return el('li', { class: 'mono', text: `${k}: ${readable(k, a[k])} → ${readable(k, v)}${atomic}` });
  });
}

function limitsForm(a, err, status) {
  const id = a.agent_id;
  const fields = LIMITS.map(([name, label, kind]) => {
    const fid = `${name}-${id}`;
    const value = kind === 'amount' ? amountText(a[name]) : kind === 'hosts' ? hostsText(a[name]) : shown(a[name]);
    const input = change(el('input', { id: fid, name, value, spellcheck: 'false', autocomplete: 'off', inputmode: kind === 'int' ? 'numeric' : kind === 'amount' ? 'decimal' : undefined }));
    const box = el('div', {}, el('label', { for: fid, text: kind === 'amount' ? `${label}${session.unit?.symbol ? `, ${session.unit.symbol}` : ''}` : label }), input);
    if (kind === 'amount' || kind === 'hosts') {
      const out = el('output', { class: 'hint', for: fid, id: `${fid}-hint` });
      input.setAttribute('aria-describedby', out.id);
      box.append(out);
      if (kind === 'amount') watchAmount(input, out);
      else watchHosts(input, out);
    }
    return box;
  });
  const review = change(el('button', { type: 'submit', text: 'Review changes' }));
  const pending = el('div', { class: 'review', hidden: true, role: 'group', 'aria-label': `changes to ${a.name}` });
  const form = el('form', { class: 'limits', 'aria-label': `limits of ${a.name}` }, ...fields, el('div', { class: 'actions' }, review));
  form.addEventListener('input', () => { pending.hidden = true; });
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    err.textContent = '';
    status.textContent = '';
    let patch;
    try {
      patch = patchOf(form, a);
    } catch (e) {
      err.textContent = e.message;
      return;
    }
    if (Object.keys(patch).length === 0) {
      pending.hidden = true;
      status.textContent = 'Nothing changed.';
      return;
    }
    const confirm = change(el('button', { type: 'button', text: 'Confirm and save' }));
    const cancel = el('button', { type: 'button', class: 'secondary', text: 'Cancel' });
    cancel.addEventListener('click', () => { pending.hidden = true; });
    confirm.addEventListener('click', () => act(confirm, err, async () => {
      const r = await api(`/admin/agents/${encodeURIComponent(id)}`, { method: 'PATCH', body: patch });
      view.flash = { id, text: outcome(r, `Saved: ${Object.keys(patch).join(', ')}.`) };
      await renderAgents();
    }));
    pending.replaceChildren(
      el('p', { text: 'Save these changes? Amounts are saved in atomic units:' }),
      el('ul', {}, ...reviewLines(patch, a)),
      el('div', { class: 'actions' }, confirm, cancel));
    pending.hidden = false;
    confirm.focus();
  });
  return [form, pending];
}

function panel(a) {
  const id = a.agent_id;
  const err = el('p', { class: 'error', role: 'alert' });
  const status = el('p', { class: 'ok-text', role: 'status', id: `status-${id}` });
  if (view.flash?.id === id) {
    status.textContent = view.flash.text;
    view.flash = null;
  }
  const toggle = change(el('button', { type: 'button', text: a.disabled ? 'Enable' : 'Disable', class: a.disabled ? '' : 'danger' }));
  toggle.addEventListener('click', () => act(toggle, err, async () => {
    const r = await api(`/admin/agents/${encodeURIComponent(id)}/${a.disabled ? 'enable' : 'disable'}`, { method: 'POST' });
    if (r?.kind) view.flash = { id, text: outcome(r, '') };
    await renderAgents();
  }));
  const rotate = change(el('button', { type: 'button', text: 'Rotate key', class: 'danger' }));
  rotate.addEventListener('click', () => {
    // eslint-disable-next-line no-alert
    if (!window.confirm(`Rotate the API key of ${a.name}? The current key stops working at once.`)) return;
    act(rotate, err, async () => {
      const r = await api(`/admin/agents/${encodeURIComponent(id)}/rotate-key`, { method: 'POST' });
      showKey(r.agent, r.api_key);
      await renderAgents();
    });
  });
  const rate = burnRate(a.settled_24h);
  return el('div', { class: 'agent', id: `panel-${id}`, 'data-panel': id },
    el('div', { class: 'mono muted', text: `id ${id}` }),
    bar('24 h', a.settled_24h, a.daily_budget),
    bar('Month', a.settled_month, a.month_budget),
    bar('7 days', a.settled_7d, a.week_budget),
    ...(a.lifetime_budget === null ? [] : [bar('Lifetime', a.settled_lifetime, a.lifetime_budget)]),
    ...(a.host_budget_use ?? []).map((h) => bar(`Host ${h.host}, 24 h, reserved included`, h.used_24h, h.budget)),
    el('div', { class: 'muted' }, 'reserved (in flight): ', amountEl(a.reserved_24h)),
    el('div', { class: 'burn' }, 'burn rate: ', amountEl(rate), ' per hour (24 h spend / 24)'),
    ...limitsForm(a, err, status),
    el('div', { class: 'actions' }, toggle, rotate),
    status, err);
}

// ------------------------------------------------------------------ the table
function compare(key, kind) {
  if (kind === 'amount') {
    return (x, y) => {
      const a = x[key];
      const b = y[key];
      if (a === null || a === undefined) return b === null || b === undefined ? 0 : 1; // none last
      if (b === null || b === undefined) return -1;
      const d = BigInt(a) - BigInt(b);
      return view.dir * (d > 0n ? 1 : d < 0n ? -1 : 0);
    };
  }
  if (kind === 'bool') return (x, y) => view.dir * (Number(x[key]) - Number(y[key]));
  return (x, y) => view.dir * String(x[key]).localeCompare(String(y[key]), undefined, { sensitivity: 'base', numeric: true });
}

/** The agents the search matches (name contains it, any case; or id starts with it), sorted. */
function selected() {
  const q = view.query.trim().toLowerCase();
  const match = (a) => !q || a.name.toLowerCase().includes(q) || a.agent_id.startsWith(q);
  const [key, , kind] = COLUMNS.find(([k]) => k === view.sort);
  const byId = (x, y) => x.agent_id.localeCompare(y.agent_id);
  const cmp = compare(key, kind);
  return view.agents.filter(match).sort((x, y) => cmp(x, y) || byId(x, y));
}

function row(a) {
  const id = a.agent_id;
  const open = view.open === id;
  const name = el('button', { type: 'button', class: 'link', text: a.name, title: id, 'aria-expanded': String(open), 'aria-controls': `panel-${id}` });
  name.addEventListener('click', () => {
    view.open = open ? null : id;
    draw();
  });
  const label = (k) => COLUMNS.find(([c]) => c === k)[1];
  const money = (k) => el('td', { class: 'num', 'data-label': label(k) }, amountEl(a[k]));
  const tr = el('tr', { 'data-agent': id, class: open ? 'open' : undefined },
    el('th', { scope: 'row' }, name),
    el('td', {}, el('span', { class: a.disabled ? 'st st-rejected' : 'st st-settled', text: a.disabled ? 'disabled' : 'enabled' })),
    el('td', { text: new Date(a.created_at).toLocaleString(), title: a.created_at, 'data-label': label('created_at') }),
    ...COLUMNS.slice(3).map(([k]) => money(k)));
  if (!open) return [tr];
  return [tr, el('tr', { class: 'detail', 'data-detail': id }, el('td', { colspan: String(COLUMNS.length) }, panel(a)))];
}

function drawHeader() {
  $('agents-head').replaceChildren(el('tr', {}, ...COLUMNS.map(([key, label, kind]) => {
    const sorted = view.sort === key;
    const b = el('button', { type: 'button', class: 'sort', 'data-sort': key, text: label });
    b.addEventListener('click', () => {
      view.dir = sorted ? -view.dir : kind === 'text' || kind === 'bool' ? 1 : -1; // amounts: largest first
      view.sort = key;
      view.page = 0;
      draw();
    });
    return el('th', { scope: 'col', class: kind === 'amount' ? 'num' : undefined, 'aria-sort': sorted ? (view.dir > 0 ? 'ascending' : 'descending') : 'none' }, b);
  })));
}

function draw() {
  const rows = selected();
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  view.page = Math.min(view.page, pages - 1);
  const first = view.page * PAGE;
  const page = rows.slice(first, first + PAGE);
  drawHeader();
  $('agents').replaceChildren(...(page.length
    ? page.flatMap(row)
    : [el('tr', {}, el('td', { colspan: String(COLUMNS.length), text: view.agents.length ? 'No agent matches.' : 'No agents yet.' }))]));
  const agents = (n) => `${n} agent${n === 1 ? '' : 's'}`;
  $('agents-count').textContent = rows.length === view.agents.length
    ? agents(rows.length)
    : `${rows.length} of ${agents(view.agents.length)} match`;
  $('agents-page').textContent = rows.length ? `${first + 1}–${first + page.length} of ${rows.length}` : '';
  $('agents-prev').disabled = view.page === 0;
  $('agents-next').disabled = view.page >= pages - 1;
}

// Opens the panel of agent `id` on the page that shows it.
function reveal(id) {
  const index = selected().findIndex((a) => a.agent_id === id);
  if (index < 0) return;
  view.open = id;
  view.page = Math.floor(index / PAGE);
  draw();
}

export async function renderAgents() {
  const { agents } = await api('/admin/agents');
  view.agents = agents;
  draw();
  const form = $('create-agent');
  form.querySelectorAll('input, button').forEach((c) => change(c));
  const example = session.unit ? `e.g. 5.00 ${session.unit.symbol || ''}`.trim() : 'atomic units';
  for (const name of ['max_per_call', 'daily_budget', 'month_budget']) form.elements[name].placeholder = example;
}

export function initAgents() {
  $('copy-key').addEventListener('click', () => copyKey());
  $('dismiss-key').addEventListener('click', () => clearKey());
  $('agent-search').addEventListener('input', () => {
    view.query = $('agent-search').value;
    view.page = 0;
    draw();
  });
  $('agents-prev').addEventListener('click', () => { view.page -= 1; draw(); });
  $('agents-next').addEventListener('click', () => { view.page += 1; draw(); });
  const form = $('create-agent');
  for (const name of ['max_per_call', 'daily_budget', 'month_budget']) {
    const input = form.elements[name];
    watchAmount(input, $(`${input.id}-hint`));
  }
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    const body = { name: String(data.get('name') ?? '').trim() };
    try {
      for (const name of ['max_per_call', 'daily_budget', 'month_budget']) {
        const v = readAmount(String(data.get(name) ?? ''));
        if (v !== null) body[name] = v;
      }
    } catch (e) {
      $('create-error').textContent = e.message;
      return;
    }
    const button = form.querySelector('button');
    act(button, $('create-error'), async () => {
      const r = await api('/admin/agents', { method: 'POST', body });
      form.reset();
      form.querySelectorAll('input').forEach((i) => i.dispatchEvent(new Event('input')));
      showKey(r.agent, r.api_key);
      view.query = '';
      $('agent-search').value = '';
      await renderAgents();
      reveal(r.agent.agent_id);
    });
  });
}

/** Resets what the table shows (sign-out). */
export function resetAgents() {
  Object.assign(view, { agents: [], query: '', page: 0, open: null, flash: null });
}
