// Payments held for an operator's approval (GET /admin/approvals): the terms, the agent and what
// it spent so far; admins approve or deny (POST /admin/approvals/{id}/approve|deny). A decision
// someone else took first answers 409 `approval_decided`, shown on the row.
import { $, amountEl, api, act, assetUnit, change, el, networkName, state } from './util.js';
import { shortAddress } from './amount.js';

function decision(a, what, err, row) {
  const b = change(el('button', { type: 'button', text: what === 'approve' ? 'Approve' : 'Deny', class: what }));
  b.setAttribute('aria-label', `${what === 'approve' ? 'Approve' : 'Deny'} payment ${a.id}`);
  b.addEventListener('click', () => act(b, err, async () => {
    const decided = await api(`/admin/approvals/${a.id}/${what}`, { method: 'POST' });
    row.querySelector('.state').textContent = decided.state;
    for (const x of row.querySelectorAll('button')) x.remove();
  }));
  return b;
}

function spentSoFar(agent) {
  if (!agent) return el('span', { text: '?' });
  const span = el('span', {}, amountEl(agent.settled_24h), ' in 24 h', el('br'), amountEl(agent.settled_month), ' this month');
  if (agent.daily_budget) span.append(el('br'), 'daily budget ', amountEl(agent.daily_budget));
  return span;
}

function approvalRow(a, agents) {
  const err = el('span', { class: 'error', role: 'alert' });
  const row = el('tr', { 'data-id': a.id });
  const terms = el('td', {}, amountEl(a.amount, assetUnit(a.network, a.asset)), ` to `,
    el('span', { class: 'mono', text: shortAddress(a.payTo), title: a.payTo }), ` on ${networkName(a.network)}`);
  const actions = el('td', {});
  if (a.state === 'pending') actions.append(decision(a, 'approve', err, row), ' ', decision(a, 'deny', err, row), ' ');
  actions.append(err);
  row.append(
    el('td', { text: a.agent_name, title: a.agent_id }),
    terms,
    el('td', { class: 'mono url', text: a.upstream_url }),
    el('td', {}, spentSoFar(agents.get(a.agent_id))),
    el('td', { text: new Date(a.expires_at).toLocaleString() }),
    el('td', { class: 'state', text: a.state }),
    actions,
  );
  return row;
}

export async function renderApprovals() {
  const filter = $('approvals-state').value;
  const [{ approvals }, { agents }] = await Promise.all([
    api(`/admin/approvals${filter ? `?state=${filter}` : ''}`),
    api('/admin/agents'),
  ]);
  const byId = new Map(agents.map((a) => [a.agent_id, a]));
  const rows = approvals.map((a) => approvalRow(a, byId));
  $('approvals-body').replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { colspan: 7, text: 'none' }))]));
  $('approvals-count').textContent = `${approvals.length} ${filter || 'in all'}${state.role === 'admin' ? '' : ' (read-only)'}`;
}
