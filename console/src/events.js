// Operator events: who changed what, when, from where, with what changed (before → after).
import { $, api, el } from './util.js';

const text = (v) => (v === undefined ? '(absent)' : JSON.stringify(v));

/** The members that differ between `before` and `after`, as `name: before → after`. */
export function diff(before, after) {
  if (before === null && after === null) return [];
  if (before === null || typeof before !== 'object') return [`created: ${text(after)}`];
  if (after === null || typeof after !== 'object') return [`removed: ${text(before)}`];
  const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])].sort();
  return keys
    .filter((k) => JSON.stringify(before[k]) !== JSON.stringify(after[k]))
    .map((k) => `${k}: ${text(before[k])} → ${text(after[k])}`);
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
    const changes = diff(e.before ?? null, e.after ?? null);
    return el('tr', { 'data-action': e.action },
      el('td', { text: new Date(e.at).toLocaleString() }),
      el('td', { text: e.operator_name, title: e.operator_id ?? 'bootstrap token' }),
      el('td', { class: 'mono', text: e.action }),
      el('td', { class: 'mono', text: e.target ?? '' }),
      el('td', { class: 'diff' }, ...(changes.length ? changes.map((c) => el('div', { class: 'mono', text: c })) : ['no change'])),
      el('td', { class: 'mono', text: e.remote_addr ?? '' }));
  }) : [el('tr', {}, el('td', { colspan: '6', text: 'No operator has changed anything yet.' }))]));
  $('events-count').textContent = `${events.length} events, newest first`;
}
