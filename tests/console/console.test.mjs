// Browser tests of the operator console (/console): Debian's chromium driven by
// playwright-core, against a real router on a local chain with the project's paid test
// upstream (started by scripts/console-test, which passes their addresses in the environment).
//
// Every page listens for Content-Security-Policy violations, console errors and uncaught
// exceptions; any one fails the scenario it happened in. Screenshots go to $SCREENSHOTS.
// Prints `N passed, M failed` last and exits non-zero on any failure.
import { mkdirSync } from 'node:fs';
import { chromium } from 'playwright-core';
import { verifyReceipt } from '../../console/src/verify.js';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set (run scripts/console-test)`);
  return v;
};
const ROUTER = env('X402_ROUTER_URL');
const OPERATOR_TOKEN = env('OPERATOR_TOKEN');
const AGENT_KEY = env('X402_ROUTER_AGENT_KEY');
const UPSTREAM = env('X402_TEST_UPSTREAM');
const SHOTS = env('SCREENSHOTS');
const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';
mkdirSync(SHOTS, { recursive: true });

const LAPTOP = { width: 1280, height: 800 };
const PHONE = { width: 390, height: 844 };
const WAIT = 15_000;

function assert(cond, message) {
  if (!cond) throw new Error(message);
}

let seq = 0;
async function paidCall(key = AGENT_KEY) {
  seq += 1;
  const resp = await fetch(`${ROUTER}/route`, {
    method: 'POST',
    headers: {
      Authorization: `Bearer ${key}`,
      'Idempotency-Key': `console-test-${process.pid}-${Date.now()}-${seq}`,
      'Content-Type': 'application/json',
    },
    body: JSON.stringify({ url: `${UPSTREAM}/v2/weather`, max_amount: '50000' }),
  });
  return { status: resp.status, body: await resp.text() };
}

async function operator(path) {
  const resp = await fetch(`${ROUTER}${path}`, { headers: { Authorization: `Bearer ${OPERATOR_TOKEN}` } });
  assert(resp.ok, `${path}: HTTP ${resp.status}`);
  return resp.json();
}

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  headless: true,
  // Playwright gives each launch a fresh temporary profile (its own --user-data-dir).
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync'],
});

// A page that records every CSP violation, console error and uncaught exception.
async function openPage(viewport = LAPTOP) {
  const context = await browser.newContext({ viewport, acceptDownloads: true });
  const page = await context.newPage();
  const problems = [];
  await page.exposeFunction('__cspViolation', (v) => problems.push(`CSP violation: ${v}`));
  await page.addInitScript(() => {
    document.addEventListener('securitypolicyviolation', (e) => {
      window.__cspViolation(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'} at ${e.sourceFile}:${e.lineNumber}`);
    });
  });
  page.on('console', (m) => { if (m.type() === 'error') problems.push(`console error: ${m.text()}`); });
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  const urls = [];
  page.on('request', (r) => urls.push(r.url()));
  return { context, page, problems, urls };
}

async function signIn(page, token = OPERATOR_TOKEN) {
  await page.goto(`${ROUTER}/console`);
  await page.getByLabel('Operator token').fill(token);
  await page.getByRole('button', { name: 'Sign in' }).click();
}

async function noSidewaysScroll(page, what) {
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth);
  assert(overflow <= 1, `${what}: the page scrolls sideways by ${overflow}px`);
}

const results = [];
async function scenario(name, fn) {
  const opened = [];
  const open = async (viewport) => {
    const o = await openPage(viewport);
    opened.push(o);
    return o;
  };
  try {
    await fn(open);
    const problems = opened.flatMap((o) => o.problems);
    assert(problems.length === 0, problems.join('\n'));
    results.push([name, null]);
    console.log(`ok    ${name}`);
  } catch (e) {
    results.push([name, e]);
    console.log(`FAIL  ${name}\n      ${String(e.stack || e).split('\n').join('\n      ')}`);
  } finally {
    for (const o of opened) await o.context.close();
  }
}

// ------------------------------------------------------------------ scenarios
await scenario('the console is served with a strict CSP and no-store', async () => {
  for (const path of ['/console', '/console/app.js', '/console/app.css']) {
    const resp = await fetch(`${ROUTER}${path}`);
    assert(resp.status === 200, `${path}: HTTP ${resp.status}`);
    const csp = resp.headers.get('content-security-policy') || '';
    for (const d of ["default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "base-uri 'none'", "form-action 'none'"]) {
      assert(csp.includes(d), `${path}: CSP lacks ${d}: ${csp}`);
    }
    assert(!csp.includes('unsafe-inline') && !csp.includes('unsafe-eval'), `${path}: CSP allows inline code`);
    assert(resp.headers.get('cache-control') === 'no-store', `${path}: cache-control`);
    assert(resp.headers.get('x-content-type-options') === 'nosniff', `${path}: nosniff`);
    assert(resp.headers.get('referrer-policy') === 'no-referrer', `${path}: referrer-policy`);
  }
  assert((await fetch(`${ROUTER}/console/app.js`)).headers.get('content-type').startsWith('text/javascript'), 'js type');
  assert((await fetch(`${ROUTER}/console/app.css`)).headers.get('content-type').startsWith('text/css'), 'css type');
  assert((await fetch(`${ROUTER}/console/..%2FCargo.toml`)).status === 404, 'only embedded files');
  // The data the console reads is not kept by any cache either.
  for (const path of ['/audit/payments?limit=1', '/.well-known/x402-router']) {
    const resp = await fetch(`${ROUTER}${path}`, { headers: { Authorization: `Bearer ${OPERATOR_TOKEN}` } });
    assert(resp.ok && resp.headers.get('cache-control') === 'no-store', `${path}: cache-control ${resp.headers.get('cache-control')}`);
  }
});

await scenario('the CSP violation and console error detectors catch what they watch', async (open) => {
  // Without this, a detector that never fires would make every scenario pass.
  const opened = await open();
  await opened.page.goto(`${ROUTER}/console`);
  await opened.page.evaluate(() => {
    const s = document.createElement('script');
    s.textContent = 'window.__inline = 1';
    document.body.append(s);
  });
  await opened.page.evaluate(() => fetch('https://example.invalid/x').catch(() => {}));
  const deadline = Date.now() + WAIT;
  while (opened.problems.filter((p) => p.startsWith('CSP violation')).length < 2 && Date.now() < deadline) {
    await opened.page.waitForTimeout(50);
  }
  const csp = opened.problems.filter((p) => p.startsWith('CSP violation'));
  assert(csp.some((p) => p.includes('script-src')), `inline script not reported: ${opened.problems}`);
  assert(csp.some((p) => p.includes('connect-src')), `cross-origin fetch not reported: ${opened.problems}`);
  assert(await opened.page.evaluate(() => window.__inline) === undefined, 'an inline script ran');
  opened.problems.length = 0;
});

await scenario('a wrong token is refused and nothing is stored', async (open) => {
  const opened = await open();
  const { page } = opened;
  await signIn(page, 'not-the-operator-token');
  await page.getByRole('alert').filter({ hasText: 'refused' }).waitFor({ timeout: WAIT });
  // Signed out, nothing but the sign-in form is shown.
  for (const name of ['Payments', 'Sign out']) {
    assert(!(await page.getByRole('button', { name }).isVisible()), `"${name}" is shown before sign-in`);
  }
  assert(await page.evaluate(() => sessionStorage.length) === 0, 'a refused token was stored');
  await page.screenshot({ path: `${SHOTS}/signin-refused.png` });
  // Chromium reports the refused probe (HTTP 401) as a console error: expected here, and
  // only that.
  const expected = (p) => p.startsWith('console error: Failed to load resource') && p.includes('401');
  assert(opened.problems.some(expected), 'the probe was not refused');
  opened.problems.splice(0, opened.problems.length, ...opened.problems.filter((p) => !expected(p)));
});

await scenario('sign in: the token stays out of URLs and lives in session storage', async (open) => {
  const { page, urls } = await open();
  await signIn(page);
  await page.getByRole('heading', { name: 'Overview' }).waitFor({ timeout: WAIT });
  assert(await page.evaluate(() => sessionStorage.getItem('x402-router.operator-token')) === OPERATOR_TOKEN, 'session storage');
  assert(await page.evaluate(() => localStorage.length) === 0, 'local storage used');
  assert(await page.evaluate(() => document.cookie) === '', 'a cookie was set');
  assert(!urls.some((u) => u.includes(OPERATOR_TOKEN)), 'the token appeared in a URL');
  await page.reload();
  await page.getByRole('heading', { name: 'Overview' }).waitFor({ timeout: WAIT });
  await page.getByRole('button', { name: 'Sign out' }).click();
  await page.getByLabel('Operator token').waitFor({ timeout: WAIT });
  assert(await page.evaluate(() => sessionStorage.length) === 0, 'sign-out left the token');
});

let paidReceiptId = null;
await scenario('a paid call through the demo upstream appears live, and filters find it', async (open) => {
  const { page } = await open();
  await signIn(page);
  await page.getByRole('button', { name: 'Payments' }).click();
  await page.getByRole('heading', { name: /Payments/ }).waitFor({ timeout: WAIT });
  const before = await page.locator('#payments tbody tr').count();
  const call = await paidCall();
  assert(call.status === 200, `paid call: HTTP ${call.status} ${call.body}`);
  // No reload: the list polls its cursor.
  await page.waitForFunction((n) => document.querySelectorAll('#payments tbody tr').length > n, before, { timeout: WAIT });
  const row = page.locator('#payments tbody tr').first();
  await row.getByText('settled').waitFor({ timeout: WAIT });
  const id = await row.getAttribute('data-id');
  const payment = (await operator('/audit/payments?limit=500')).payments.find((p) => p.id === id);
  assert(payment && payment.receipt_id, 'the newest row is the paid call with a receipt');
  paidReceiptId = payment.receipt_id;
  const host = new URL(UPSTREAM).host;
  await page.getByLabel('Status').selectOption('settled');
  await page.getByLabel('Agent', { exact: true }).fill(payment.agent_id);
  await page.getByLabel('Upstream host').fill(host);
  await page.locator(`#payments tbody tr[data-id="${id}"]`).waitFor({ timeout: WAIT });
  await page.screenshot({ path: `${SHOTS}/payments-laptop.png`, fullPage: true });
  await page.getByLabel('Upstream host').fill('no-such-host.example');
  await page.locator(`#payments tbody tr[data-id="${id}"]`).waitFor({ state: 'detached', timeout: WAIT });
  await page.getByLabel('Upstream host').fill(host);
  await page.getByLabel('Status').selectOption('rejected');
  await page.locator(`#payments tbody tr[data-id="${id}"]`).waitFor({ state: 'detached', timeout: WAIT });
  await page.getByLabel('Status').selectOption('settled');
  // From reloads the list from the server: an hour ahead holds nothing, cleared it is back.
  const local = await page.evaluate(() => {
    const t = new Date(Date.now() + 3600e3);
    const pad = (n) => String(n).padStart(2, '0');
    return `${t.getFullYear()}-${pad(t.getMonth() + 1)}-${pad(t.getDate())}T${pad(t.getHours())}:${pad(t.getMinutes())}`;
  });
  await page.getByLabel(/^From/).fill(local);
  await page.locator(`#payments tbody tr[data-id="${id}"]`).waitFor({ state: 'detached', timeout: WAIT });
  await page.getByText(/^0 of 0 payments since/).waitFor({ timeout: WAIT });
  await page.getByLabel(/^From/).fill('');
  await page.locator(`#payments tbody tr[data-id="${id}"]`).waitFor({ timeout: WAIT });
  const [download] = await Promise.all([page.waitForEvent('download'), page.getByRole('button', { name: 'Export CSV' }).click()]);
  const csv = await (await download.createReadStream()).toArray().then((c) => Buffer.concat(c).toString());
  const lines = csv.trim().split('\r\n');
  assert(lines[0].startsWith('id,created_at,agent_id'), `csv header: ${lines[0]}`);
  assert(lines.length >= 2 && lines.slice(1).every((l) => l.includes(',settled,')), 'csv holds the filtered rows');
  assert(lines.some((l) => l.startsWith(id)), 'csv holds the paid call');
});

await scenario('the receipt view verifies the signature in the browser', async (open) => {
  assert(paidReceiptId, 'no paid receipt from the scenario before');
  const { page } = await open();
  await signIn(page);
  await page.getByRole('button', { name: 'Payments' }).click();
  await page.getByRole('link', { name: /^receipt of payment/ }).first().click();
  await page.getByRole('status').filter({ hasText: 'signature valid' }).waitFor({ timeout: WAIT });
  await page.screenshot({ path: `${SHOTS}/receipt-laptop.png`, fullPage: true });
  // The same check the page runs, on the same receipt: a changed byte or another signer fails.
  const receipt = await operator(`/audit/receipts/${paidReceiptId}`);
  const signer = (await operator('/.well-known/x402-router')).receipt_signer;
  assert(verifyReceipt(receipt, signer).valid, 'valid receipt');
  assert(!verifyReceipt({ ...receipt, upstream_status: 201 }, signer).valid, 'tampered status verified');
  assert(!verifyReceipt({ ...receipt, extra: 'x' }, signer).valid, 'extra member verified');
  assert(!verifyReceipt(receipt, '0x0000000000000000000000000000000000000001').valid, 'wrong published signer verified');
});

await scenario('overview, queues and agents render at laptop and phone widths', async (open) => {
  for (const [name, viewport] of [['laptop', LAPTOP], ['phone', PHONE]]) {
    const { page } = await open(viewport);
    await signIn(page);
    await page.getByRole('heading', { name: 'Overview' }).waitFor({ timeout: WAIT });
    await page.locator('#tiles .tile').first().waitFor({ timeout: WAIT });
    await page.locator('#chart-hour canvas').waitFor({ timeout: WAIT });
    await page.locator('#wallet tr td.num').first().waitFor({ timeout: WAIT });
    const paid = await page.locator('#tiles .tile', { hasText: 'paid calls, 24 h' }).locator('.v').textContent();
    assert(Number(paid) >= 1, `the paid calls tile shows ${paid}`);
    await page.locator('#moved td.num').first().waitFor({ timeout: WAIT });
    await page.screenshot({ path: `${SHOTS}/overview-${name}.png`, fullPage: true });
    await noSidewaysScroll(page, `${name} overview`);
    await page.getByRole('button', { name: 'Queues' }).click();
    await page.getByRole('heading', { name: 'Paid, not served' }).waitFor({ timeout: WAIT });
    await page.locator('#q-pending li').first().waitFor({ timeout: WAIT });
    await page.getByRole('button', { name: 'Agents' }).click();
    await page.locator('#agents meter').first().waitFor({ timeout: WAIT });
    const burn = await page.locator('#agents .burn').first().textContent();
    assert(/^burn rate: [1-9]\d*\.\d per hour/.test(burn), `burn rate: ${burn}`);
    await page.screenshot({ path: `${SHOTS}/agents-${name}.png`, fullPage: true });
    await noSidewaysScroll(page, `${name} agents`);
    await page.getByRole('button', { name: 'Payments' }).click();
    await page.locator('#payments tbody tr').first().waitFor({ timeout: WAIT });
    await page.screenshot({ path: `${SHOTS}/payments-${name}.png`, fullPage: true });
    await noSidewaysScroll(page, `${name} payments`);
  }
});

await scenario('keyboard only: sign in and reach every section', async (open) => {
  const { page } = await open();
  await page.goto(`${ROUTER}/console`);
  await page.keyboard.type(OPERATOR_TOKEN); // the token field has focus on load
  await page.keyboard.press('Enter');
  await page.getByRole('heading', { name: 'Overview' }).waitFor({ timeout: WAIT });
  await page.getByRole('button', { name: 'Payments' }).focus();
  await page.keyboard.press('Enter');
  await page.getByRole('heading', { name: /Payments/ }).waitFor({ timeout: WAIT });
  // Every form control has a label.
  const unlabeled = await page.evaluate(() => [...document.querySelectorAll('input, select')]
    .filter((e) => !e.labels || e.labels.length === 0).map((e) => e.id));
  assert(unlabeled.length === 0, `unlabeled controls: ${unlabeled}`);
});

await browser.close();
const failed = results.filter(([, e]) => e).length;
console.log(`${results.length - failed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
