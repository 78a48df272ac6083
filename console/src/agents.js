// Agents: spend against each budget, burn rate, limits and allowlists (a form that PATCHes
// /admin/agents/{id}), disable / enable / rotate key, and creating an agent. A new API key is
// shown once in #key-box and kept nowhere else (cleared on dismiss, on leaving, on sign-out).
import { $, api, act, change, el } from './util.js';

// [field, label, kind]: kind `amount` (atomic units, a decimal string), `int`, or `list`.
const LIMITS = [
  ['max_per_call', 'Max per call', 'amount'],
  ['daily_budget', 'Daily budget (rolling 24 h)', 'amount'],
  ['month_budget', 'Month budget (calendar month, UTC)', 'amount'],
  ['calls_per_minute', 'Calls per minute', 'int'],
  ['payments_per_minute', 'Payments per minute', 'int'],
  ['allowed_hosts', 'Allowed upstream hosts (comma or space separated)', 'list'],
  ['allowed_pay_to', 'Allowed payTo addresses (comma or space separated)', 'list'],
];

const shown = (v) => (v === null || v === undefined ? '' : Array.isArray(v) ? v.join(', ') : String(v));

// The form's value for one field: empty removes the limit (null); anything not an integer
// goes to the API as typed, so that its 400 names the field.
function valueOf(kind, raw) {
  const s = raw.trim();
  if (s === '') return null;
  if (kind === 'int') return /^\d+$/.test(s) ? Number(s) : s;
  if (kind === 'list') return s.split(/[\s,]+/).filter(Boolean);
  return s;
}

// Atomic units per hour over the last 24 h (the 24 h spend / 24), exact (BigInt), one decimal.
export function burnRate(settled24h) {
  const tenths = (BigInt(settled24h) * 10n) / 24n;
  return `${tenths / 10n}.${tenths % 10n}`;
}

function bar(label, spent, budget) {
  if (budget === null || budget === undefined) {
    return el('div', { class: 'bar' }, el('span', { text: `${label}: ${spent} spent, no budget` }));
  }
  const b = Number(budget);
  const s = Number(spent);
  const pct = b > 0 ? Math.round((Math.min(s, b) / b) * 100) : 100;
  return el('div', { class: 'bar' },
    el('span', { text: `${label}: ${spent} of ${budget} (${pct} %)` }),
    el('meter', { min: '0', max: String(b), value: String(Math.min(s, b)), low: String(b * 0.5), high: String(b * 0.8), optimum: '0', 'aria-label': `${label}: ${spent} of ${budget}` }));
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

function card(a) {
  const id = a.agent_id;
  const err = el('p', { class: 'error', role: 'alert' });
  const status = el('p', { class: 'ok-text', role: 'status' });
  const fields = LIMITS.map(([name, label, kind]) => {
    const fid = `${name}-${id}`;
    const input = change(el('input', { id: fid, name, value: shown(a[name]), spellcheck: 'false', autocomplete: 'off', inputmode: kind === 'list' ? undefined : 'numeric' }));
    return el('div', {}, el('label', { for: fid, text: label }), input);
  });
  const save = change(el('button', { type: 'submit', text: 'Save limits' }));
  const form = el('form', { class: 'limits', 'aria-label': `limits of ${a.name}` }, ...fields, el('div', { class: 'actions' }, save));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    const patch = {};
    for (const [name, , kind] of LIMITS) {
      const v = valueOf(kind, String(data.get(name) ?? ''));
      if (JSON.stringify(v) !== JSON.stringify(a[name] ?? null)) patch[name] = v;
    }
    if (Object.keys(patch).length === 0) {
      status.textContent = 'Nothing changed.';
      return;
    }
    act(save, err, async () => {
      await api(`/admin/agents/${encodeURIComponent(id)}`, { method: 'PATCH', body: patch });
      await renderAgents();
      $(`status-${id}`)?.replaceChildren(`Saved: ${Object.keys(patch).join(', ')}.`);
    });
  });
  const toggle = change(el('button', { type: 'button', text: a.disabled ? 'Enable' : 'Disable', class: a.disabled ? '' : 'danger' }));
  toggle.addEventListener('click', () => act(toggle, err, async () => {
    await api(`/admin/agents/${encodeURIComponent(id)}/${a.disabled ? 'enable' : 'disable'}`, { method: 'POST' });
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
  status.id = `status-${id}`;
  return el('article', { class: 'card agent', 'data-agent': id, 'aria-labelledby': `agent-h-${id}` },
    el('h3', { id: `agent-h-${id}` }, `${a.name} `, el('span', { class: a.disabled ? 'st st-rejected' : 'st st-settled', text: a.disabled ? 'disabled' : 'enabled' })),
    el('div', { class: 'mono muted', text: id }),
    bar('24 h', a.settled_24h, a.daily_budget),
    bar('Month', a.settled_month, a.month_budget),
    el('div', { class: 'muted', text: `reserved (in flight): ${a.reserved_24h}` }),
    el('div', { class: 'burn', text: `burn rate: ${burnRate(a.settled_24h)} per hour (24 h spend / 24)` }),
    form,
    el('div', { class: 'actions' }, toggle, rotate),
    status, err);
}

export async function renderAgents() {
  const { agents } = await api('/admin/agents');
  $('agents').replaceChildren(...(agents.length ? agents.map(card) : [el('p', { text: 'No agents yet.' })]));
  $('create-agent').querySelectorAll('input, button').forEach((c) => change(c));
}

export function initAgents() {
  $('copy-key').addEventListener('click', () => copyKey());
  $('dismiss-key').addEventListener('click', () => clearKey());
  const form = $('create-agent');
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const data = new FormData(form);
    const body = { name: String(data.get('name') ?? '').trim() };
    for (const name of ['max_per_call', 'daily_budget', 'month_budget']) {
      const v = valueOf('amount', String(data.get(name) ?? ''));
      if (v !== null) body[name] = v;
    }
    const button = form.querySelector('button');
    act(button, $('create-error'), async () => {
      const r = await api('/admin/agents', { method: 'POST', body });
      form.reset();
      showKey(r.agent, r.api_key);
      await renderAgents();
    });
  });
}
