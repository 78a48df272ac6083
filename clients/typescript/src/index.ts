/**
 * x402-router client: call paid HTTP APIs through an x402-router, paying at most once per call.
 *
 * One logical call = one idempotency key, generated here once (or given by you) and reused by
 * every retry. Retries happen only where they are safe: a lost connection, `409
 * idempotency_key_in_flight`, `409 superseded`, `500` and `503`, honouring `Retry-After`, within
 * a bounded budget. An ambiguous outcome is never retried under a new key: see {@link classify}.
 */

/** What to do after an answer of `POST /route` (the router's README, "For agent developers"). */
export type Next = "done" | "retry_same_key" | "new_key_safe" | "do_not_rekey" | "fix_request";

/** Ledger states of a payment. */
export type PaymentStatus =
  | "signed"
  | "settled"
  | "unconfirmed"
  | "not_settled"
  | "rejected"
  | "settled_response_lost"
  | "unknown"
  | "expired";

/** The `payment` member of the router's envelope. Amounts are decimal strings of atomic units. */
export interface Payment {
  x402_version: 1 | 2;
  /** `exact` (EIP-3009 or Permit2), or `upto` (Permit2: signs a maximum, charged what moved). */
  scheme: "exact" | "upto";
  network: string;
  asset: string;
  /** What was (or may be) charged; for `upto`, what the chain shows moved once settled. */
  amount?: string;
  pay_to?: string;
  payer: string;
  nonce: string;
  tx_hash?: string | null;
  status: PaymentStatus;
  /** `permit2` when paid through Permit2 (absent for EIP-3009). */
  asset_transfer_method?: "permit2";
  /** `upto`: the signed maximum. */
  max_amount?: string;
  /** `upto`: what the upstream said it charged (its word; `amount` is the chain's). */
  claimed_amount?: string;
  /** `settlement_pending`: the transaction the upstream named (a hint, checked on-chain). */
  claimed_tx_hash?: string;
  /** How an answer lost after this payment settled was recovered, if it was. */
  recovery?: "recovered" | "reaccessed" | "lost";
}

/** The router's answer to a routed call that happened (HTTP 200). */
export interface Envelope {
  status: number;
  headers: Record<string, string>;
  body: unknown;
  payment: Payment | null;
  receipt_id: string;
}

/** Every router error body: `error` for humans, `code` for programs (plus envelope fields on 402/502/504). */
export interface ErrorBody {
  error: string;
  code: string | null;
  payment?: Payment | null;
  receipt_id?: string | null;
  accepts?: unknown[];
  [member: string]: unknown;
}

/** The payment signed under one of the agent's keys, as the ledger has it now (`GET /payments`). */
export interface KeyPayment {
  idempotency_key: string;
  status: PaymentStatus;
  network: string;
  asset: string;
  amount: string;
  pay_to: string;
  nonce: string;
  valid_before: number;
  tx_hash: string | null;
  updated_at: string;
  /** The status can no longer move money: a new key for the same call cannot pay twice. */
  new_key_safe: boolean;
  /** How recovery of an answer lost after this payment settled ended, if one was tried. */
  recovery: "recovered" | "reaccessed" | "lost" | null;
  /**
   * The answer `reconcile` recovered after the key was answered `settled_response_lost` (the
   * key's own answer is never rewritten): the `/route` envelope the agent would have had.
   */
  recovered_answer: {
    kind: "recovered" | "reaccessed";
    receipt_id: string;
    http_status: number;
    answer: Record<string, unknown>;
  } | null;
}

/** A signed receipt (`GET /receipts/{id}`). */
export interface Receipt {
  id: string;
  agent_id: string;
  idempotency_key: string;
  request_hash: string;
  method: string;
  url: string;
  upstream_status: number | null;
  upstream_body_sha256: string;
  payment: Payment | null;
  outcome: "completed" | "errored";
  created_at: string;
  signer: string;
  signature: string;
  /** The call's OpenTelemetry trace id, when the router exports traces (signed with the rest). */
  trace_id?: string;
}

/** `GET /agents/me`. */
export interface Budget {
  agent_id: string;
  name: string;
  created_at: string;
  window_hours: number;
  max_per_call: string | null;
  daily_budget: string | null;
  spent: string;
  reserved: string;
  remaining: string | null;
  month_budget: string | null;
  spent_month: string;
  remaining_month: string | null;
  allowed_hosts: string[] | null;
  allowed_pay_to: string[] | null;
  calls_per_minute: number | null;
  payments_per_minute: number | null;
  week_budget: string | null;
  spent_7d: string;
  remaining_7d: string | null;
  lifetime_budget: string | null;
  spent_lifetime: string | null;
  remaining_lifetime: string | null;
  host_budgets: { host: string; budget: string; used_24h: string; remaining_24h: string }[];
  blocked_pay_to: string[] | null;
  assets: { network: string; asset: string; spent: string; reserved: string }[];
}

/** One advertised price option of a discovered resource, judged for this agent. */
export interface DiscoveredOption {
  scheme: string | null;
  network: string | null;
  asset: string | null;
  /** Atomic units, decimal string; informational: `fetch` pays what the live 402 asks. */
  amount: string;
  pay_to: string | null;
  max_timeout_seconds: number | null;
  asset_transfer_method: string | null;
  /** Whether this agent may pay it now; else `code` and `why_not` say why. */
  payable: boolean;
  code: string | null;
  why_not: string | null;
}

/** A discovered paid resource (`GET /discovery`). */
export interface DiscoveredResource {
  url: string;
  type: "http" | "mcp";
  method: string | null;
  tool_name: string | null;
  description: string | null;
  mime_type: string | null;
  service_name: string | null;
  tags: string[];
  x402_version: number;
  accepts: DiscoveredOption[];
  payable: boolean;
  /** How to call it (bazaar `info.input`), its output and JSON Schema: data as advertised. */
  input: Record<string, unknown> | null;
  output: Record<string, unknown> | null;
  schema: Record<string, unknown> | null;
  source: "facilitator" | "seen";
  facilitator: string | null;
  updated_at: string;
}

/** Filters of {@link Router.discover}. */
export interface DiscoverQuery {
  /** Words that must each appear (URL, description, service name, tags, tool name, method). */
  q?: string;
  /** Only resources with an option at most this price (atomic units). */
  maxPrice?: string | number | bigint;
  network?: string;
  type?: "http" | "mcp";
  /** `true`: only what this agent may pay now. */
  payable?: boolean;
  limit?: number;
  cursor?: string;
}

/** Payment states that can no longer move money. */
export const RELEASED_PAYMENT_STATES: readonly string[] = ["expired"];

/** The retry table, identical to the router's `mcp::policy::classify`. */
export function classify(status: number, body: Partial<ErrorBody> | null | undefined): Next {
  const code = body?.code ?? "";
  if (status === 202 && code === "approval_pending") return "retry_same_key";
  if (status >= 200 && status < 300) return "done";
  if (status === 402) return "new_key_safe";
  if (status === 403 && (code === "approval_denied" || code === "approval_expired")) return "new_key_safe";
  if (status === 409 && code === "idempotency_key_reused") return "fix_request";
  if (status === 409 && code === "already_paid") return "do_not_rekey";
  if (status === 409 || status === 429 || status === 500 || status === 503) return "retry_same_key";
  if (status === 502 || status === 504) {
    const payment = body?.payment;
    if (payment == null) return "new_key_safe";
    return RELEASED_PAYMENT_STATES.includes(payment.status) ? "new_key_safe" : "do_not_rekey";
  }
  if (status >= 400 && status < 500) return "fix_request";
  return "retry_same_key";
}

/** A call that did not end in an upstream answer; `next` says what may be done about it. */
export class RouterError extends Error {
  /** HTTP status of the router's last answer; `null` when the router could not be reached. */
  readonly status: number | null;
  /** The router's machine-readable code (`router_unreachable` when there was no answer). */
  readonly code: string;
  readonly next: Next;
  readonly idempotencyKey: string;
  readonly body: ErrorBody | null;
  readonly receiptId: string | null;
  readonly payment: Payment | null;
  readonly retryAfter: number | null;
  /**
   * With `approval_pending` (202), `approval_denied` and `approval_expired`: the held payment's
   * terms (`network`, `asset`, `amount`, `payTo`, `upstream_url`), its `id` and `state`. Pending:
   * call `fetch` again later with `idempotencyKey` to get the call's answer once an operator decided.
   */
  readonly approval: Record<string, unknown> | null;

  constructor(init: {
    message: string;
    status: number | null;
    code: string;
    next: Next;
    idempotencyKey: string;
    body: ErrorBody | null;
    retryAfter: number | null;
    cause?: unknown;
  }) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "RouterError";
    this.status = init.status;
    this.code = init.code;
    this.next = init.next;
    this.idempotencyKey = init.idempotencyKey;
    this.body = init.body;
    this.receiptId = (init.body?.receipt_id as string | null | undefined) ?? null;
    this.payment = init.body?.payment ?? null;
    this.retryAfter = init.retryAfter;
    this.approval = ((init.body as Record<string, unknown> | null)?.approval as Record<string, unknown> | undefined) ?? null;
  }
}

/** The upstream's answer as a `Response`, plus what the router recorded about it. */
export interface RouterResponse extends Response {
  readonly envelope: Envelope;
  readonly payment: Payment | null;
  readonly receiptId: string;
  readonly idempotencyKey: string;
  /** True when the router answered from its record (an earlier attempt under this key). */
  readonly replayed: boolean;
}

export interface RouterOptions {
  /** Base URL of the router. Default: `X402_ROUTER_URL`, else `http://127.0.0.1:8080`. */
  baseUrl?: string;
  /** The agent's API key (`x4r_…`). Default: `X402_ROUTER_AGENT_KEY`. */
  agentKey?: string;
  /** Longest total time spent retrying one call with its key, in ms (default 30000). */
  retryBudgetMs?: number;
  /** Most attempts of one call (default 10). */
  maxAttempts?: number;
  /** Timeout of one attempt in ms (default 75000; the router's own deadline is 50 s). */
  attemptTimeoutMs?: number;
  /** The fetch to use (default: the global one). */
  fetch?: typeof fetch;
}

/** `RequestInit`, except that the body is JSON: a JSON string or a plain object/array. */
export type RouterRequestInit = Omit<RequestInit, "body"> & { body?: string | Record<string, unknown> | unknown[] | null };

export interface CallOptions {
  /** Most this call may pay, in the asset's atomic units (USDC: 1000000 = 1 USDC). Absent: pay nothing. */
  maxAmount?: string | bigint | number;
  /** Only to resume an earlier call: its key. Default: a new key for this call. */
  idempotencyKey?: string;
}

/** A new idempotency key for one logical call. */
export function newIdempotencyKey(): string {
  return `ts_${globalThis.crypto.randomUUID()}`;
}

const env = (name: string): string | undefined =>
  (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env?.[name];

function retryAfterSeconds(headers: Headers): number | null {
  const v = headers.get("retry-after");
  if (v === null) return null;
  const n = Number(v.trim());
  return Number.isFinite(n) && n >= 0 ? n : null;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** A client of one router, as one agent. */
export class Router {
  readonly baseUrl: string;
  private readonly agentKey: string;
  private readonly retryBudgetMs: number;
  private readonly maxAttempts: number;
  private readonly attemptTimeoutMs: number;
  private readonly fetchImpl: typeof fetch;

  constructor(options: RouterOptions = {}) {
    const base = options.baseUrl ?? env("X402_ROUTER_URL") ?? "http://127.0.0.1:8080";
    this.baseUrl = base.endsWith("/") ? base : `${base}/`;
    const key = options.agentKey ?? env("X402_ROUTER_AGENT_KEY");
    if (!key) throw new TypeError("an agent key is required (agentKey or X402_ROUTER_AGENT_KEY)");
    this.agentKey = key;
    this.retryBudgetMs = options.retryBudgetMs ?? 30_000;
    this.maxAttempts = options.maxAttempts ?? 10;
    this.attemptTimeoutMs = options.attemptTimeoutMs ?? 75_000;
    this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /**
   * Calls `url` through the router, fetch-style. Resolves with the upstream's answer (any
   * status below 500) as a {@link RouterResponse}; rejects with a {@link RouterError} otherwise.
   */
  async fetch(url: string | URL, init: RouterRequestInit = {}, options: CallOptions = {}): Promise<RouterResponse> {
    const key = options.idempotencyKey ?? newIdempotencyKey();
    const request: Record<string, unknown> = { url: String(url), method: (init.method ?? "GET").toUpperCase() };
    const headers: Record<string, string> = {};
    new Headers(init.headers ?? {}).forEach((value, name) => {
      headers[name] = value;
    });
    if (Object.keys(headers).length > 0) request.headers = headers;
    if (init.body != null) request.body = jsonBody(init.body);
    if (options.maxAmount !== undefined) request.max_amount = String(options.maxAmount);
    const { response, body, replayed } = await this.send("route", { method: "POST", key, json: request });
    return toResponse(body as Envelope, key, replayed, response.headers);
  }

  /**
   * Calls the MCP tool `tool` of the MCP server at `url` (streamable HTTP) through the router,
   * paying at most `options.maxAmount` once when the tool asks (x402 over MCP). Resolves with
   * a {@link RouterResponse} whose `json()` is the MCP `CallToolResult`; retries and rejects as
   * {@link Router.fetch} does.
   */
  async callTool(
    url: string | URL,
    tool: string,
    args: Record<string, unknown> = {},
    options: CallOptions & { headers?: HeadersInit } = {},
  ): Promise<RouterResponse> {
    const key = options.idempotencyKey ?? newIdempotencyKey();
    const request: Record<string, unknown> = { mcp: { url: String(url), tool, arguments: args } };
    const headers: Record<string, string> = {};
    new Headers(options.headers ?? {}).forEach((value, name) => {
      headers[name] = value;
    });
    if (Object.keys(headers).length > 0) request.headers = headers;
    if (options.maxAmount !== undefined) request.max_amount = String(options.maxAmount);
    const { response, body, replayed } = await this.send("route", { method: "POST", key, json: request });
    return toResponse(body as Envelope, key, replayed, response.headers);
  }

  /** One of the agent's receipts, and its payment's current ledger state (`X-Payment-Status`). */
  async getReceipt(id: string): Promise<{ receipt: Receipt; paymentStatus: PaymentStatus | null }> {
    const { response, body } = await this.send(`receipts/${encodeURIComponent(id)}`, { method: "GET" });
    return { receipt: body as Receipt, paymentStatus: response.headers.get("x-payment-status") as PaymentStatus | null };
  }

  /** The agent's receipts, newest first; pass `nextCursor` back as `cursor` for older ones. */
  async listReceipts(page: { limit?: number; cursor?: string } = {}): Promise<{ receipts: Receipt[]; nextCursor: string | null }> {
    const q = new URLSearchParams();
    if (page.limit !== undefined) q.set("limit", String(page.limit));
    if (page.cursor !== undefined) q.set("cursor", page.cursor);
    const qs = q.toString();
    const { body } = await this.send(`receipts${qs ? `?${qs}` : ""}`, { method: "GET" });
    const b = body as { receipts: Receipt[]; next_cursor: string | null };
    return { receipts: b.receipts, nextCursor: b.next_cursor };
  }

  /**
   * The payment signed under `idempotencyKey`, as the ledger has it now; `null` when none was
   * ever signed (nothing was paid under that key). After `do_not_rekey` with
   * `payment_unknown`, poll this: `new_key_safe` turns true once `reconcile` saw it expire unused.
   */
  async getPayment(idempotencyKey: string): Promise<KeyPayment | null> {
    try {
      const { body } = await this.send(`payments?idempotency_key=${encodeURIComponent(idempotencyKey)}`, { method: "GET" });
      return body as KeyPayment;
    } catch (e) {
      if (e instanceof RouterError && e.status === 404) return null;
      throw e;
    }
  }

  /** The agent's limits and rolling 24 h spend (decimal strings of atomic units). */
  async getBudget(): Promise<Budget> {
    const { body } = await this.send("agents/me", { method: "GET" });
    return body as Budget;
  }

  /**
   * What this agent can buy: discovered paid resources (facilitators' catalogues, 402s the router
   * saw) with their price options, each judged for this agent, and their input/output schemas.
   * Prices are informational: buy with {@link Router.fetch} and a `maxAmount`.
   */
  async discover(query: DiscoverQuery = {}): Promise<{ resources: DiscoveredResource[]; nextCursor: string | null }> {
    const q = new URLSearchParams();
    if (query.q !== undefined) q.set("q", query.q);
    if (query.maxPrice !== undefined) q.set("max_price", String(query.maxPrice));
    if (query.network !== undefined) q.set("network", query.network);
    if (query.type !== undefined) q.set("type", query.type);
    if (query.payable !== undefined) q.set("payable", String(query.payable));
    if (query.limit !== undefined) q.set("limit", String(query.limit));
    if (query.cursor !== undefined) q.set("cursor", query.cursor);
    const qs = q.toString();
    const { body } = await this.send(`discovery${qs ? `?${qs}` : ""}`, { method: "GET" });
    const b = body as { resources: DiscoveredResource[]; next_cursor: string | null };
    return { resources: b.resources, nextCursor: b.next_cursor };
  }

  /** Sends one request, retrying the same request (and key) while the answer says so. */
  private async send(
    path: string,
    req: { method: string; key?: string; json?: unknown },
  ): Promise<{ response: Response; body: unknown; replayed: boolean }> {
    const started = Date.now();
    const key = req.key ?? "";
    for (let attempt = 1; ; attempt++) {
      let response: Response | null = null;
      let body: ErrorBody | null = null;
      let failure: unknown = null;
      try {
        const headers: Record<string, string> = { authorization: `Bearer ${this.agentKey}`, accept: "application/json" };
        if (req.key) headers["idempotency-key"] = req.key;
        if (req.json !== undefined) headers["content-type"] = "application/json";
        response = await this.fetchImpl(new URL(path, this.baseUrl), {
          method: req.method,
          headers,
          body: req.json === undefined ? undefined : JSON.stringify(req.json),
          signal: AbortSignal.timeout(this.attemptTimeoutMs),
        });
        const text = await response.text();
        try {
          body = JSON.parse(text) as ErrorBody;
        } catch {
          body = { error: text, code: null };
        }
      } catch (e) {
        failure = e; // No answer, or the answer was cut off: the outcome is unknown.
      }
      const next: Next = response ? classify(response.status, body) : "retry_same_key";
      if (response && next === "done") {
        return { response, body, replayed: response.headers.get("x-idempotent-replay") === "true" };
      }
      const retryAfter = response ? retryAfterSeconds(response.headers) : null;
      // A payment waiting for a human is answered at once (with its key), not waited for here.
      const held = body?.code === "approval_pending";
      if (next === "retry_same_key" && !held && attempt < this.maxAttempts) {
        const wait = retryAfter !== null ? Math.min(retryAfter, 10) * 1000 : Math.min(500 * 2 ** (attempt - 1), 8000);
        if (Date.now() - started + wait < this.retryBudgetMs) {
          await sleep(wait);
          continue;
        }
      }
      if (!response) {
        throw new RouterError({
          message: `router unreachable; retry later with the same idempotency key (${key}): ${String(failure)}`,
          status: null,
          code: "router_unreachable",
          next: "retry_same_key",
          idempotencyKey: key,
          body: null,
          retryAfter: null,
          cause: failure,
        });
      }
      throw new RouterError({
        message: body?.error ?? `router answered ${response.status}`,
        status: response.status,
        code: body?.code ?? `http_${response.status}`,
        next,
        idempotencyKey: key,
        body,
        retryAfter,
      });
    }
  }
}

function jsonBody(body: string | Record<string, unknown> | unknown[]): unknown {
  if (typeof body === "string") {
    try {
      return JSON.parse(body);
    } catch {
      throw new TypeError("the router sends JSON bodies: pass a JSON string or a plain object");
    }
  }
  if (typeof body === "object" && body !== null && (Array.isArray(body) || Object.getPrototypeOf(body) === Object.prototype)) {
    return body;
  }
  throw new TypeError("the router sends JSON bodies: pass a JSON string or a plain object");
}

function base64ToBytes(b64: string): Uint8Array<ArrayBuffer> {
  const bin = atob(b64);
  const out = new Uint8Array(new ArrayBuffer(bin.length));
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

const NULL_BODY_STATUSES = [101, 103, 204, 205, 304];

function toResponse(envelope: Envelope, key: string, replayed: boolean, routerHeaders: Headers): RouterResponse {
  let payload: BodyInit | null = null;
  const b = envelope.body as Record<string, unknown> | null;
  const contentType = envelope.headers["content-type"] ?? "";
  if (b === null || b === undefined) payload = null;
  else if (contentType.toLowerCase().includes("json")) payload = JSON.stringify(b);
  else if (typeof b === "object" && typeof b.text === "string") payload = b.text;
  else if (typeof b === "object" && typeof b.base64 === "string") payload = base64ToBytes(b.base64);
  else payload = JSON.stringify(b);
  if (NULL_BODY_STATUSES.includes(envelope.status)) payload = null;
  const response = new Response(payload, { status: envelope.status, headers: envelope.headers }) as Response & Record<string, unknown>;
  const receiptId = envelope.receipt_id ?? routerHeaders.get("x-receipt-id") ?? "";
  Object.defineProperties(response, {
    envelope: { value: envelope },
    payment: { value: envelope.payment ?? null },
    receiptId: { value: receiptId },
    idempotencyKey: { value: key },
    replayed: { value: replayed },
  });
  return response as unknown as RouterResponse;
}

let defaultRouter: Router | null = null;

/**
 * `fetch`, through the router named by `X402_ROUTER_URL` and `X402_ROUTER_AGENT_KEY`:
 * `await routerFetch("https://api.example.com/forecast", {}, { maxAmount: "50000" })`.
 */
export function routerFetch(url: string | URL, init: RouterRequestInit = {}, options: CallOptions = {}): Promise<RouterResponse> {
  defaultRouter ??= new Router();
  return defaultRouter.fetch(url, init, options);
}
