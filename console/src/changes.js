// Changes waiting for a second admin (the two-person rule, `REQUIRE_SECOND_ADMIN`): GET
// /admin/changes lists each proposal with its proposer and what it would change, field by
// field; another admin confirms it (POST /admin/changes/{id}/confirm) or any admin rejects it
// (…/reject; the proposer's own rejection withdraws it). The proposer sees theirs but cannot
// confirm it (the API refuses with 403 `own_change` either way).
import { $, amountEl, api, act, change, el, state } from './util.js';

// Fields holding an amount of the router's unit (shown like every budget of the console).
const AMOUNTS = new Set(['max_per_call', 'daily_budget', 'month_budget', 'week_budget', 'lifetime_budget',
  'approval_above', 'wallet_daily_cap']);

function valueEl(field, v) {
  if (v === null || v === undefined) return el('span', { class: 'muted', text: 'none' });
  if (AMOUNTS.has(field)) return amountEl(v);
  if (field === 'host_budgets' && typeof v === 'object') {
    const span = el('span', {});
    Object.entries(v).forEach(([host, amount], i) => span.append(i ? ', ' : '', `${host} `, amountEl(amount)));
    return span.childNodes.length ? span : el('span', { text: '{}' });
  }
  if (Array.isArray(v)) return el('span', { class: 'mono', text: v.length ? v.join(', ') : '[]' });
  return el('span', { text: String(v) });
}

function fieldsEl(p) {
  return el('ul', { class: 'fields' }, ...p.fields.map((f) => el('li', { class: f.raises ? 'raises' : '' },
    el('strong', { text: f.field }), ': ', valueEl(f.field, f.before), ' → ', valueEl(f.field, f.after),
    f.raises ? el('span', { class: 'tag', text: 'raises' }) : null)));
}

const mine = (p) => (p.proposed_by_id ?? null) === (state.operatorId ?? null) && p.proposed_by === state.operator;

function decision(p, what, err, row) {
  const label = what === 'confirm' ? 'Confirm' : 'Reject';
  const b = change(el('button', { type: 'button', text: label, class: what === 'confirm' ? '' : 'danger' }));
  b.setAttribute('aria-label', `${label} change ${p.id}`);
  if (what === 'confirm' && mine(p)) {
    b.disabled = true;
    b.title = 'you proposed this change: another admin confirms it';
  }
  b.addEventListener('click', () => act(b, err, async () => {
    const decided = await api(`/admin/changes/${p.id}/${what}`, { method: 'POST' });
    row.querySelector('.state').textContent = decided.state;
    for (const x of row.querySelectorAll('button')) x.remove();
    if (decided.token) {
      // A new admin's token: shown this once, to the admin who agreed to it.
      const input = el('input', { readonly: true, class: 'mono', 'aria-label': `Token of the new admin ${p.change.name}`, spellcheck: 'false' });
      input.value = decided.token;
      row.lastChild.prepend(el('span', { text: 'New admin token, shown once: ' }), input, ' ');
    }
  }));
  return b;
}

function changeRow(p, names) {
  const err = el('span', { class: 'error', role: 'alert' });
  const row = el('tr', { 'data-id': p.id });
  const target = { settings: 'wallet settings', operators: `new operator ${p.change.name ?? ''}` }[p.target]
    ?? names.get(p.target) ?? p.target;
  const actions = el('td', {});
  if (p.state === 'pending') actions.append(decision(p, 'confirm', err, row), ' ', decision(p, 'reject', err, row), ' ');
  actions.append(err);
  row.append(
    el('td', { text: target, title: p.target }),
    el('td', { class: 'mono kind', text: p.kind }),
    el('td', {}, fieldsEl(p)),
    el('td', { text: mine(p) ? `${p.proposed_by} (you: another admin confirms)` : p.proposed_by, title: p.proposed_by_id ?? 'bootstrap token' }),
    el('td', { text: new Date(p.expires_at).toLocaleString() }),
    el('td', { class: 'state', text: p.state }),
    actions,
  );
  return row;
}

export async function renderChanges() {
  const filter = $('changes-state').value;
  const [{ changes, require_second_admin: ruled }, { agents }] = await Promise.all([
    api(`/admin/changes?state=${filter}`),
    api('/admin/agents'),
  ]);
  const names = new Map(agents.map((a) => [a.agent_id, a.name]));
  const rows = changes.map((p) => changeRow(p, names));
  $('changes-body').replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { colspan: 7, text: 'none' }))]));
  $('changes-count').textContent = `${changes.length} ${filter}${state.role === 'admin' ? '' : ' (read-only)'}`;
  $('changes-rule').textContent = ruled
    ? 'This router holds every change that raises spending power for a second admin.'
    : 'This router applies every change at once (REQUIRE_SECOND_ADMIN is off).';
}

const proposed = (r) => Boolean(r && r.kind && r.fields);

/** The text to show after a change the API answered: applied, or proposed (202). */
export const outcome = (r, applied) => (proposed(r)
  ? `Proposed: waits for another admin to confirm it (Pending changes).`
  : applied);

/** Shows `outcome` in a form's message slot: a proposal as news (`.news`), not as an error. */
export function tell(slot, r, applied = '') {
  slot.textContent = outcome(r, applied);
  slot.classList.toggle('news', proposed(r));
}
