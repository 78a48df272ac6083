// Queues to act on: paid-not-served, stuck, settlement pending; each row reconciles on demand
// (POST /admin/reconcile {payment_id}) and shows the report.
import { $, amountEl, api, act, assetUnit, change, el, upstreamOf } from './util.js';

function report(r) {
  return Object.entries(r).filter(([, v]) => v !== 0).map(([k, v]) => `${k} ${typeof v === 'object' ? JSON.stringify(v) : v}`).join(', ') || 'nothing to do';
}

function reconcileButton(label, body, out, err) {
  const b = change(el('button', { type: 'button', text: label }));
  b.addEventListener('click', () => act(b, err, async () => {
    out.textContent = 'reconciling…';
    const r = await api('/admin/reconcile', { method: 'POST', body });
    out.textContent = `report: ${report(r)}`;
  }));
  return b;
}

function queueItem(p) {
  const out = el('span', { class: 'report', role: 'status' });
  const err = el('span', { class: 'error', role: 'alert' });
  const li = el('li', { 'data-id': p.id },
    `${new Date(p.created_at).toLocaleString()} · agent `, el('span', { text: p.agent_name ?? p.agent_id, title: p.agent_id }),
    ` · ${upstreamOf(p.resource) || '?'} · `, amountEl(p.amount, assetUnit(p.network, p.asset)), ` · ${p.status} `);
  if (p.tx_hash) li.append(el('span', { class: 'mono', text: p.tx_hash }), ' ');
  li.append(reconcileButton('Reconcile', { payment_id: p.id }, out, err), ' ', out, err);
  li.querySelector('button').setAttribute('aria-label', `Reconcile payment ${p.id}`);
  return li;
}

export async function renderQueues() {
  const fill = (id, rows) => $(id).replaceChildren(...(rows.length ? rows.map(queueItem) : [el('li', { text: 'empty' })]));
  fill('q-pns', (await api('/audit/payments?status=paid_not_served&limit=500')).payments);
  fill('q-stuck', (await api('/audit/payments?status=stuck&limit=500')).payments);
  // An upstream that answered `settlement_pending` (or whose settlement the chain does not
  // show yet) leaves the intent `unconfirmed` or `unknown` until reconcile reads the chain.
  const pending = [];
  for (const status of ['unconfirmed', 'unknown']) pending.push(...(await api(`/audit/payments?status=${status}&limit=500`)).payments);
  fill('q-pending', pending);
  const out = $('reconcile-all-report');
  $('reconcile-all-slot').replaceChildren(reconcileButton('Reconcile all now', {}, out, $('reconcile-all-error')));
}
