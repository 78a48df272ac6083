// Operator events: who changed what, when, from where, and what changed, field by field
// (`daily_budget: none → 0.20 USDC`), amounts in the router's unit with the atomic units in
// the tooltip. Agents are named by name (their id in the tooltip).
import { $, api, el, state as session } from './util.js';
import { formatAmount } from './amount.js';

// Members that hold amounts of the router's unit (agents' limits and spend, the settings).
const AMOUNTS = new Set(['max_per_call', 'daily_budget', 'month_budget', 'settled_24h', 'reserved_24h', 'remaining_24h',
  'settled_month', 'remaining_month', 'wallet_daily_cap', 'wallet_used_24h', 'week_budget', 'settled_7d', 'remaining_7d',
  'lifetime_budget', 'settled_lifetime', 'remaining_lifetime']);

const isAtomic = (key, v) => AMOUNTS.has(key) && typeof v === 'string' && /^(0|[1-9][0-9]*)$/.test(v);

/** One member's value as people read it: `none`, `0.20 USDC`, `a.com, b.com`, `true`. */
export function readableValue(key, v, unit) {
  if (v === undefined) return '(absent)';
  if (v === null) return 'none';
  if (isAtomic(key, v)) return formatAmount(v, unit);
  // Each host budget's use: `api.example.com: 0.01 USDC of 0.05 USDC`.
  const atomic = (a) => (typeof a === 'string' && /^(0|[1-9][0-9]*)$/.test(a) ? formatAmount(a, unit) : String(a));
  if (key === 'host_budget_use' && Array.isArray(v)) {
    return v.length ? v.map((h) => `${h.host}: ${atomic(h.used_24h)} of ${atomic(h.budget)}`).join(', ') : '(empty)';
  }
  if (Array.isArray(v)) return v.length ? v.map((x) => (typeof x === 'string' ? x : JSON.stringify(x))).join(', ') : '(empty)';
  // Budgets per upstream host: `api.example.com: 0.05 USDC, …` (hosts in order).
  if (key === 'host_budgets' && typeof v === 'object') {
    return Object.keys(v).sort().map((h) => `${h}: ${atomic(v[h])}`).join(', ') || '(empty)';
  }
  if (typeof v === 'object') return JSON.stringify(v);
  return String(v);
}

/**
 * The members that differ between `before` and `after` (objects, or null for "did not exist"),
 * each `{ key, text, title }`: text `key: before → after` (a member of a created object:
 * `key: value`), title the atomic units of amounts.
 */
export function diff(before, after, unit = null) {
  const line = (key, b, a) => {
    const atomic = [b, a].filter((v) => isAtomic(key, v));
    const title = atomic.length ? `atomic units: ${[b, a].map((v) => (isAtomic(key, v) ? v : readableValue(key, v, unit))).join(' → ')}` : undefined;
    return { key, text: `${key}: ${readableValue(key, b, unit)} → ${readableValue(key, a, unit)}`, title };
  };
  if (before === null && after === null) return [];
  const object = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
  if (!object(before) && !object(after)) return [line('value', before ?? undefined, after ?? undefined)];
  if (!object(before)) {
    // Created (or a report): every member it has.
    return Object.keys(after).sort().filter((k) => after[k] !== null).map((k) => ({
      key: k,
      text: `${k}: ${readableValue(k, after[k], unit)}`,
      title: isAtomic(k, after[k]) ? `atomic units: ${after[k]}` : undefined,
    }));
  }
  if (!object(after)) return [{ key: 'removed', text: `removed (was ${Object.keys(before).length} fields)`, title: JSON.stringify(before) }];
  const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])].sort();
  return keys
    .filter((k) => JSON.stringify(before[k]) !== JSON.stringify(after[k]))
    .map((k) => line(k, before[k], after[k]));
}

// The target of an event: an agent by name (id in the tooltip), or as recorded.
function target(e) {
  const name = e.after?.name ?? e.before?.name;
  if (e.action.startsWith('agent.') && typeof name === 'string') return el('td', { text: name, title: e.target ?? '' });
  return el('td', { class: 'mono', text: e.target ?? '' });
}

export async function renderEvents() {
  const events = [];
  let cursor = null;
  for (let guard = 0; guard < 20; guard++) {
    const q = new URLSearchParams({ limit: '500' });
    if (cursor) q.set('cursor', cursor);
    const page = await api(`/audit/operator-events?${q}`);
    events.push(...page.events);
    cursor = page.next_cursor;
    if (!cursor) break;
  }
  events.reverse(); // newest first
  const body = $('events').tBodies[0];
  body.replaceChildren(...(events.length ? events.map((e) => {
    const changes = diff(e.before ?? null, e.after ?? null, session.unit);
    return el('tr', { 'data-action': e.action },
      el('td', { text: new Date(e.at).toLocaleString() }),
      el('td', { text: e.operator_name, title: e.operator_id ?? 'bootstrap token' }),
      el('td', { class: 'mono', text: e.action }),
      target(e),
      el('td', { class: 'diff' }, ...(changes.length
        ? changes.map((c) => el('div', { class: 'change-line', 'data-field': c.key, text: c.text, title: c.title }))
        : ['no change'])),
      el('td', { class: 'mono', text: e.remote_addr ?? '' }));
  }) : [el('tr', {}, el('td', { colspan: '6', text: 'No operator has changed anything yet.' }))]));
  $('events-count').textContent = `${events.length} events, newest first`;
}
