// Batch-settlement channels (GET /admin/channels): what the router's wallet deposited, the
// highest voucher ceiling it signed, what the server charged and what it claimed on-chain (at
// the last reconcile or close), what came back. Admins close one (POST
// /admin/channels/{id}/close): each click does the next step that is due (a cooperative refund,
// else the wallet's timed withdrawal, finalized by a later click after `withdraw_after`).
import { $, amountEl, api, act, assetUnit, change, el, networkName, state } from './util.js';
import { shortAddress } from './amount.js';

const STEPS = {
  busy: 'a call is using it; nothing new is signed on it; close again in a moment',
  refunded: 'the server refunded what was unclaimed',
  withdraw_initiated: 'the server did not refund; the wallet started its withdrawal',
  withdraw_pending: 'the withdrawal waits for the channel’s delay',
  withdraw_finalized: 'the wallet withdrew what was unclaimed',
  closed: 'closed',
};

// What the last close of each channel said (kept across a re-render of the table).
const said = new Map();

function closeButton(c, err) {
  const b = change(el('button', { type: 'button', text: 'Close', class: 'deny' }));
  b.setAttribute('aria-label', `Close channel ${c.channel_id}`);
  b.addEventListener('click', () => act(b, err, async () => {
    const r = await api(`/admin/channels/${c.id}/close`, { method: 'POST' });
    said.set(c.id, STEPS[r.step] ?? r.step);
    await renderChannels();
  }));
  return b;
}

function amounts(c) {
  const unit = assetUnit(c.network, c.asset);
  const a = (v) => (v === null || v === undefined ? el('span', { class: 'muted', text: 'not read' }) : amountEl(v, unit));
  return [a(c.deposited), a(c.signed_ceiling), a(c.charged), a(c.claimed), a(c.refunded)];
}

function channelRow(c) {
  const err = el('span', { class: 'error', role: 'alert' });
  const out = el('span', { class: 'report', role: 'status', text: said.get(c.id) ?? '' });
  const row = el('tr', { 'data-id': c.id });
  const actions = el('td', {});
  if (c.state !== 'closed') actions.append(closeButton(c, err), ' ');
  actions.append(out, err);
  let st = c.state;
  if (c.stopped) st += ' (stopped: ' + c.stopped + ')';
  if (c.withdraw_after) st += ` · withdraw after ${new Date(c.withdraw_after * 1000).toLocaleString()}`;
  row.append(
    el('td', { text: networkName(c.network) }),
    el('td', { class: 'mono', text: shortAddress(c.pay_to), title: c.pay_to }),
    el('td', { class: 'mono', text: shortAddress(c.channel_id), title: c.channel_id }),
    ...amounts(c).map((x) => el('td', { class: 'num' }, x)),
    el('td', { class: 'state', text: st }),
    actions,
  );
  return row;
}

export async function renderChannels() {
  const { channels } = await api('/admin/channels');
  const rows = channels.map(channelRow);
  $('channels-body').replaceChildren(...(rows.length ? rows : [el('tr', {}, el('td', { colspan: 10, text: 'none' }))]));
  const open = channels.filter((c) => c.state !== 'closed').length;
  $('channels-count').textContent = `${open} open or closing of ${channels.length}${state.role === 'admin' ? '' : ' (read-only)'}`;
}
