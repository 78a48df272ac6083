//! The MCP server (official Rust SDK, `rmcp`): five tools ([`tools`]), `fetch`, `call_tool`,
//! `get_receipt`, `get_budget`, `discover`. `call_tool` is `fetch` for a tool of another MCP
//! server (the `mcp` form of `POST /route`), with the same keys, retries and bounded wait.
//!
//! Two transports share one [`RouterTools`] handler:
//! * `x402-router mcp` over stdio, a thin HTTP client of a running router
//!   (`X402_ROUTER_URL`, `X402_ROUTER_AGENT_KEY`; no database access) — [`serve_stdio`];
//! * `POST/GET/DELETE /mcp` on the service (streamable HTTP, bearer agent key) — [`http`].
//!
//! Idempotency: `fetch` derives its `Idempotency-Key` from the MCP request — the connection
//! (stdio: one random scope per process; HTTP: the `Mcp-Session-Id`), the JSON-RPC request
//! id and the arguments — so a client that re-sends the same tool call reuses the key and
//! gets the recorded answer instead of a second payment. (A sessionless HTTP client, protocol
//! 2026-07-28, is scoped by request id and arguments alone: identical calls replay, never pay
//! twice; `idempotency_key` tells them apart.) A model that retries by calling
//! the tool again passes the `idempotency_key` it got back (the tool descriptions say so).
//! Transient answers (409 in flight, 503, a lost connection) are retried inside the tool
//! with the same key, honouring `Retry-After`, for at most [`RETRY_BUDGET`]; see [`policy`].
//!
//! Bounded answers: MCP clients time tool calls out (60 s is common), and a model that never
//! saw the key calls `fetch` again: a new key, a second payment. So `fetch` answers within
//! `MCP_FETCH_WAIT_SECONDS` (default 20): the call runs in a task of its own, progress
//! notifications go out while it runs (when the client asked for them with a progress
//! token), and past the bound the result says the call goes on (`code`
//! `fetch_in_progress`, `next` `retry_same_key`) with its `idempotency_key`; the call finishes
//! in the background and records its answer. Calling `fetch` again with that key collects it
//! (a replay, never a second payment), waiting again within the bound while it still runs.

pub mod backend;
pub mod http;
pub mod policy;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, InitializeResult,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::idempotency::canonical::sha256_hex;
use backend::{Backend, Call, Reply};
use policy::Next;

/// How long `fetch` keeps retrying a transient answer with the same key before handing the
/// decision back to the model (with the key, so that it retries the same key).
pub const RETRY_BUDGET: Duration = Duration::from_secs(30);

/// Longest pause between two progress notifications of a waiting `fetch`.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

/// The `code` of a `fetch` result whose call goes on past the wait bound.
pub const IN_PROGRESS: &str = "fetch_in_progress";

/// The authenticated agent of an `/mcp` HTTP request (put in the request's extensions): its id
/// and the sha256 of the key it authenticated with (see `idempotency::Ownership::credential`).
#[derive(Debug, Clone)]
pub struct McpAgent {
    pub id: Uuid,
    pub credential: String,
}

/// The MCP server handler: the five tools of [`tools`] over a [`Backend`].
#[derive(Clone)]
pub struct RouterTools {
    backend: Backend,
    /// stdio: random per process, so that JSON-RPC ids restarting at 0 in a new connection
    /// never map to an old key. HTTP: the session id scopes keys; a sessionless request gets
    /// one fixed scope, so that a re-send reaching another router process derives the same key.
    scope: Arc<str>,
    /// How long `fetch` waits for its call before answering that it goes on.
    wait: Duration,
}

const FETCH_DESCRIPTION: &str = "\
Call an HTTP API through the x402 router. If the API answers 402 Payment Required, the router \
pays it in USDC from its own wallet, at most once per idempotency key, and returns the API's \
answer with a payment record and a signed receipt id.

PRICE CAP: max_amount is the most this one call may pay, in the token's atomic units as a \
decimal string (USDC has 6 decimals: \"10000\" = 0.01 USDC, \"1000000\" = 1 USDC). Leave it out \
to pay nothing: a paid API then comes back with code payment_over_max_amount, its price in \
response.accepts[].amount (x402 v1 upstreams: maxAmountRequired), and nothing is paid. The router never pays more than max_amount, \
nor more than your per-call cap or remaining daily budget (see get_budget).

RETRIES: this tool already retries transient failures with the same key. Every result carries \
idempotency_key and next. If next is retry_same_key, call fetch again with the SAME arguments \
AND that idempotency_key. Never make up a new idempotency_key to retry a call, and never \
retry after next = do_not_rekey (settled_response_lost, payment_unknown, payment_rejected, already_paid, \
permit2_allowance_required: an operator must approve Permit2 first): a new key can pay a second \
time. Calling fetch without idempotency_key starts a new call (and may pay again); do that only \
when next was done or new_key_safe and you want the resource again.

SLOW CALLS: fetch answers within a bounded time. If the API is slower, the result has code \
fetch_in_progress and next = retry_same_key: the call goes on (nothing more is paid by \
waiting); collect its answer by calling fetch again with the same arguments AND that \
idempotency_key.";

const CALL_TOOL_DESCRIPTION: &str = "\
Call a tool of another MCP server (streamable HTTP) through the x402 router. If the tool asks \
for an x402 payment (x402 over MCP), the router pays it in USDC from its own wallet, at most once \
per idempotency key, and returns the tool's result (response.body: the MCP CallToolResult) with a \
payment record and a signed receipt id.

PRICE CAP, RETRIES and SLOW CALLS: exactly as for fetch. max_amount is the most this one call \
may pay, in atomic units as a decimal string (USDC: \"10000\" = 0.01 USDC); absent: pay nothing. \
If next is retry_same_key, call call_tool again with the SAME arguments AND that \
idempotency_key; never make up a new idempotency_key to retry, and never retry after next = \
do_not_rekey.";

const RECEIPT_DESCRIPTION: &str = "\
Read one of your signed receipts by receipt_id (from a fetch result): what was called, the \
upstream status, the payment (amount, network, asset, tx hash, status) and the router's \
signature. payment_status_now is the payment's current state, which may have moved on since \
the call (e.g. unknown -> expired once its authorization lapsed unused: then nothing was paid \
and a new call is safe; settled_response_lost: paid, not served, do not pay again). \
A fetch that ended with payment_unknown and no receipt_id: pass its idempotency_key instead \
to read that payment's current state (new_key_safe tells whether a new call is safe).";

const BUDGET_DESCRIPTION: &str = "\
Your spending limits and rolling 24 h spend, as decimal strings of atomic token units \
(USDC: 6 decimals): max_per_call (null: no cap), daily_budget (null: none), spent, reserved \
(signed payments not yet known settled or released), remaining (null without a budget), and \
the same per asset. Check it before a fetch whose price may not fit.";

const DISCOVER_DESCRIPTION: &str = "\
Find paid APIs you can buy through the router: resources listed by the facilitators' catalogues \
the router reads and declared by the 402s it has seen. Each result has its url, method (or MCP \
tool_name), description, input (how to call it: query parameters, body) and output (an example \
answer) as advertised, and accepts: its price options (amount in atomic units, network, asset), \
each with payable (whether YOU may pay it now: your allowlists, per-call cap, budget, and what \
the router pays with) and, when not, code and why_not. Prices are only advertised: to buy, call \
fetch with the url (and method/body as input describes) and max_amount at least the price; the \
router pays what the API's live 402 asks, never more than max_amount. Filters: q (words), \
max_price, network, type (http, mcp), payable; limit and cursor (next_cursor) to page.";

const INSTRUCTIONS: &str = "\
Use fetch to call paid HTTP APIs; the router pays in USDC at most once per idempotency key. \
max_amount is a hard price cap in atomic units (USDC: 1000000 = 1 USDC); leave it out to pay \
nothing and learn the price. Never change an idempotency_key to retry: retry with the one the \
result gives you when next = retry_same_key, and stop when next = do_not_rekey.";

fn schema(value: Value) -> Arc<Map<String, Value>> {
    match value {
        Value::Object(map) => Arc::new(map),
        _ => Arc::new(Map::new()),
    }
}

/// The `discover` tool.
fn discover_tool() -> Tool {
    Tool::new(
        "discover",
        DISCOVER_DESCRIPTION,
        schema(json!({
            "type": "object",
            "properties": {
                "q": {"type": "string", "maxLength": 200, "description": "Words that must each appear (e.g. \"weather forecast\")."},
                "max_price": {"type": "string", "pattern": "^(0|[1-9][0-9]{0,77})$",
                              "description": "Only APIs with an option at most this price, in atomic units (USDC: 1000000 = 1 USDC)."},
                "network": {"type": "string", "description": "Only APIs payable on this network, e.g. eip155:8453."},
                "type": {"type": "string", "enum": ["http", "mcp"]},
                "payable": {"type": "boolean", "description": "true: only what you may pay now."},
                "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20},
                "cursor": {"type": "string", "description": "next_cursor of the previous result, for the next page."}
            },
            "additionalProperties": false
        })),
    )
    .with_title("Discover paid APIs")
    .with_annotations(ToolAnnotations::new().read_only(true).open_world(false))
}

/// The query string of `discover`'s arguments, or why they are invalid.
fn discover_query(args: &Map<String, Value>) -> Result<String, McpError> {
    let invalid = |why: String| McpError::invalid_params(why, None);
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    for (name, value) in args {
        let text = match (name.as_str(), value) {
            ("q" | "max_price" | "network" | "type" | "cursor", Value::String(s)) => s.clone(),
            ("payable", Value::Bool(b)) => b.to_string(),
            ("limit", Value::Number(n)) if n.is_u64() => n.to_string(),
            ("q" | "max_price" | "network" | "type" | "cursor" | "payable" | "limit", _) => {
                return Err(invalid(format!("discover: `{name}` has the wrong type")));
            }
            _ => return Err(invalid(format!("discover: unknown argument `{name}`"))),
        };
        query.append_pair(name, &text);
    }
    Ok(query.finish())
}

/// The five tools, as listed to clients.
pub fn tools() -> Vec<Tool> {
    let fetch = Tool::new(
        "fetch",
        FETCH_DESCRIPTION,
        schema(json!({
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "Absolute http(s) URL of the API, with its query string."},
                "method": {"type": "string", "enum": ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"],
                           "default": "GET"},
                "headers": {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "Request headers; Host, hop-by-hop and payment headers are dropped."},
                "body": {"description": "Any JSON value, sent as application/json (not with GET or HEAD)."},
                "max_amount": {"type": "string", "pattern": "^[0-9]{1,78}$",
                               "description": "Price cap of this call in atomic token units (USDC: 1000000 = 1 USDC). Absent: pay nothing."},
                "idempotency_key": {"type": "string", "minLength": 16, "maxLength": 128,
                                    "description": "Only to retry an earlier call: the idempotency_key its result returned. Never invent one."}
            },
            "required": ["url"],
            "additionalProperties": false
        })),
    )
    .with_title("Fetch a (paid) HTTP API")
    .with_annotations(ToolAnnotations::new().read_only(false).destructive(false).idempotent(false).open_world(true));
    let call_tool = Tool::new(
        "call_tool",
        CALL_TOOL_DESCRIPTION,
        schema(json!({
            "type": "object",
            "properties": {
                "url": {"type": "string", "description": "Absolute http(s) URL of the MCP server's endpoint."},
                "tool": {"type": "string", "pattern": "^[A-Za-z0-9_./-]{1,128}$", "description": "The tool's name."},
                "arguments": {"type": "object", "description": "The tool's arguments."},
                "headers": {"type": "object", "additionalProperties": {"type": "string"},
                            "description": "HTTP headers sent to the MCP server (e.g. Authorization)."},
                "max_amount": {"type": "string", "pattern": "^[0-9]{1,78}$",
                               "description": "Price cap of this call in atomic token units (USDC: 1000000 = 1 USDC). Absent: pay nothing."},
                "idempotency_key": {"type": "string", "minLength": 16, "maxLength": 128,
                                    "description": "Only to retry an earlier call: the idempotency_key its result returned. Never invent one."}
            },
            "required": ["url", "tool"],
            "additionalProperties": false
        })),
    )
    .with_title("Call a (paid) MCP tool")
    .with_annotations(ToolAnnotations::new().read_only(false).destructive(false).idempotent(false).open_world(true));
    let receipt = Tool::new(
        "get_receipt",
        RECEIPT_DESCRIPTION,
        schema(json!({
            "type": "object",
            "properties": {
                "receipt_id": {"type": "string", "description": "The receipt_id of a fetch result."},
                "idempotency_key": {"type": "string", "description": "Instead of receipt_id: a fetch result's idempotency_key, to read its payment's current state."}
            },
            "additionalProperties": false
        })),
    )
    .with_title("Get a receipt")
    .with_annotations(ToolAnnotations::new().read_only(true).open_world(false));
    let budget = Tool::new(
        "get_budget",
        BUDGET_DESCRIPTION,
        schema(json!({"type": "object", "properties": {}, "additionalProperties": false})),
    )
    .with_title("Get spending limits and budget")
    .with_annotations(ToolAnnotations::new().read_only(true).open_world(false));
    vec![fetch, call_tool, receipt, budget, discover_tool()]
}

impl RouterTools {
    /// Tools backed by `backend`; `fetch` answers within `wait`.
    pub fn new(backend: Backend, wait: Duration) -> Self {
        let scope = match backend {
            Backend::Remote { .. } => Uuid::new_v4().simple().to_string(),
            Backend::Local(_) => "http-sessionless".to_owned(),
        };
        Self { backend, scope: Arc::from(scope), wait }
    }

    /// `fetch` (`mcp` false) or `call_tool` (`mcp` true): the `/route` body of `args`, run
    /// under the key they give or derive.
    async fn fetch(&self, args: Map<String, Value>, mcp: bool, ctx: &RequestContext<RoleServer>) -> CallToolResult {
        let (agent, session) = http_identity(ctx);
        let explicit = args.get("idempotency_key").and_then(Value::as_str).map(str::to_owned);
        let mut route = args.clone();
        route.remove("idempotency_key");
        if mcp {
            route = tool_route(route);
        }
        let key = explicit.unwrap_or_else(|| {
            let scope = session.unwrap_or_else(|| self.scope.to_string());
            derive_key(&scope, &serde_json::to_value(&ctx.id).unwrap_or(Value::Null), &route)
        });
        let call = Call::Route { key: key.clone(), body: Value::Object(route) };
        // In a task of its own: a result past the bound, or a client that hangs up or cancels,
        // never cuts the call short; it finishes and records its answer for the key.
        let mut running = tokio::spawn(Self::run_fetch(self.backend.clone(), agent, call, key.clone()));
        let started = Instant::now();
        let bound = tokio::time::sleep(self.wait);
        tokio::pin!(bound);
        let progress = ctx.meta.get_progress_token();
        let mut ticks = tokio::time::interval(PROGRESS_EVERY.min(self.wait / 2).max(Duration::from_millis(100)));
        ticks.tick().await;
        loop {
            tokio::select! {
                done = &mut running => {
                    return done.unwrap_or_else(|e| {
                        tracing::error!(error = %e, "mcp fetch: the call's task failed");
                        fetch_result(&key, Next::RetrySameKey, None, Some("the call's task failed".into()))
                    });
                }
                () = &mut bound => {
                    tracing::info!(waited_ms = started.elapsed().as_millis() as u64,
                        "mcp fetch: still running past the wait bound; answering with the key");
                    return in_progress(&key, self.wait);
                }
                _ = ticks.tick() => {
                    if let Some(token) = progress.clone() {
                        let secs = started.elapsed().as_secs_f64();
                        let note = ProgressNotificationParam::new(token, secs)
                            .with_message(format!("the call is running ({secs:.0} s); its idempotency_key is {key}"));
                        if let Err(e) = ctx.peer.notify_progress(note).await {
                            tracing::debug!(error = %e, "mcp fetch: progress notification not sent");
                        }
                    }
                }
            }
        }
    }

    /// The call with its retries of transient answers (same key), to its result.
    async fn run_fetch(backend: Backend, agent: Option<McpAgent>, call: Call, key: String) -> CallToolResult {
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let (next, reply, transport) = match backend.call(agent.as_ref(), &call).await {
                Ok(reply) => (policy::classify(reply.status, &reply.body), Some(reply), None),
                Err(e) => (Next::RetrySameKey, None, Some(e.0)),
            };
            // A payment held for a human's approval is answered at once (with its key): waiting
            // here for a decision that may take an hour would only time the tool call out.
            let held = reply.as_ref().is_some_and(|r| r.body.get("code") == Some(&json!("approval_pending")));
            if next == Next::RetrySameKey && !held {
                let wait = wait_before_retry(reply.as_ref().and_then(|r| r.retry_after), attempt);
                if started.elapsed() + wait < RETRY_BUDGET {
                    tracing::debug!(attempt, wait_ms = wait.as_millis() as u64, "mcp fetch: retrying the same key");
                    tokio::time::sleep(wait).await;
                    continue;
                }
            }
            return fetch_result(&key, next, reply, transport);
        }
    }

    async fn simple(&self, call: Call, ctx: &RequestContext<RoleServer>) -> CallToolResult {
        let (agent, _) = http_identity(ctx);
        match self.backend.call(agent.as_ref(), &call).await {
            Ok(reply) if reply.status == 200 => {
                let mut body = reply.body;
                if let (Call::Receipt(_), Value::Object(_)) = (&call, &body) {
                    body = json!({ "receipt": body, "payment_status_now": reply.payment_status });
                }
                structured(body, false)
            }
            Ok(reply) => structured(json!({ "http_status": reply.status, "response": reply.body }), true),
            Err(e) => structured(json!({ "error": e.0, "next": Next::RetrySameKey }), true),
        }
    }
}

/// The `/route` body of `call_tool`'s arguments: `{"mcp": {url, tool, arguments}, headers,
/// max_amount}` (what the router validates; unknown arguments are passed on and refused there).
fn tool_route(mut args: Map<String, Value>) -> Map<String, Value> {
    let mut mcp = Map::new();
    for name in ["url", "tool", "arguments"] {
        if let Some(v) = args.remove(name) {
            mcp.insert(name.to_owned(), v);
        }
    }
    args.insert("mcp".to_owned(), Value::Object(mcp));
    args
}
/// What a model is told of a payment held for an operator's approval.
const APPROVAL_ADVICE: &str = "The price is above what this agent may pay without a human: the payment waits for an \
     operator's approval and nothing was paid (`approval` shows the terms). Later (after `Retry-After` seconds at \
     least), call fetch again with exactly the same arguments AND this idempotency_key: it answers the same until an \
     operator decides, then the call's real answer. Never use a new idempotency_key for it.";

/// The result of a `fetch` whose call goes on past the wait bound: the key to collect it with.
fn in_progress(key: &str, waited: Duration) -> CallToolResult {
    let body = json!({
        "http_status": null,
        "code": IN_PROGRESS,
        "idempotency_key": key,
        "waited_seconds": waited.as_secs(),
        "next": Next::RetrySameKey,
        "advice": "The call is still running and goes on; nothing more is paid by waiting. To collect its \
                   answer, call the same tool (fetch or call_tool) again with exactly the same arguments AND this idempotency_key (or \
                   get_receipt with this idempotency_key to read its payment). Never call the tool for it \
                   without this idempotency_key: that would be a new call and could pay twice.",
    });
    structured(body, true)
}

/// The `fetch` result: everything a model needs to decide, in one object.
fn fetch_result(key: &str, next: Next, reply: Option<Reply>, transport: Option<String>) -> CallToolResult {
    let is_error = next != Next::Done;
    let body = match reply {
        Some(r) => json!({
            "http_status": r.status,
            "code": r.body.get("code").cloned().unwrap_or(Value::Null),
            "idempotency_key": key,
            "replayed": r.replayed,
            "receipt_id": r.body.get("receipt_id").cloned().unwrap_or(Value::Null),
            "payment": r.body.get("payment").cloned().unwrap_or(Value::Null),
            "next": next,
            "advice": if r.body.get("code") == Some(&json!("approval_pending")) { APPROVAL_ADVICE } else { policy::advice(next) },
            "approval": r.body.get("approval").cloned().unwrap_or(Value::Null),
            "response": r.body,
        }),
        None => json!({
            "http_status": null,
            "code": "router_unreachable",
            "idempotency_key": key,
            "next": next,
            "advice": policy::advice(next),
            "error": transport,
        }),
    };
    structured(body, is_error)
}

fn structured(body: Value, is_error: bool) -> CallToolResult {
    let text = serde_json::to_string_pretty(&body).unwrap_or_default();
    let mut result = if is_error { CallToolResult::error(vec![]) } else { CallToolResult::success(vec![]) };
    result.content = vec![ContentBlock::text(text)];
    result.structured_content = Some(body);
    result
}

/// `Retry-After` when given (capped at 10 s), else 0.5 s, 1 s, 2 s, 4 s, …
fn wait_before_retry(retry_after: Option<u64>, attempt: u32) -> Duration {
    match retry_after {
        Some(s) => Duration::from_secs(s.min(10)),
        None => Duration::from_millis(500u64.saturating_mul(1 << attempt.saturating_sub(1).min(4))),
    }
}

/// `mcp_` + 40 hex digits of sha256(JCS({scope, id, arguments})): 44 visible ASCII chars.
pub fn derive_key(scope: &str, request_id: &Value, arguments: &Map<String, Value>) -> String {
    let material = json!({ "scope": scope, "id": request_id, "arguments": arguments });
    let bytes = serde_jcs::to_vec(&material).unwrap_or_default();
    format!("mcp_{}", &sha256_hex(&bytes)[..40])
}

/// The agent and session of an `/mcp` HTTP request (`None` on stdio).
fn http_identity(ctx: &RequestContext<RoleServer>) -> (Option<McpAgent>, Option<String>) {
    let Some(parts) = ctx.extensions.get::<::http::request::Parts>() else {
        return (None, None);
    };
    let agent = parts.extensions.get::<McpAgent>().cloned();
    let session = parts.headers.get("mcp-session-id").and_then(|v| v.to_str().ok()).map(|s| format!("session:{s}"));
    (agent, session)
}

impl ServerHandler for RouterTools {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("x402-router", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let args = request.arguments.unwrap_or_default();
        let result = match request.name.as_ref() {
            "fetch" => {
                if !args.get("url").is_some_and(Value::is_string) {
                    return Err(McpError::invalid_params("fetch needs a `url` string", None));
                }
                self.fetch(args, false, &context).await
            }
            "call_tool" => {
                if !args.get("url").is_some_and(Value::is_string) || !args.get("tool").is_some_and(Value::is_string) {
                    return Err(McpError::invalid_params("call_tool needs `url` and `tool` strings", None));
                }
                self.fetch(args, true, &context).await
            }
            "get_receipt" => {
                let text = |name: &str| args.get(name).and_then(Value::as_str).map(str::to_owned);
                let call = match (text("receipt_id"), text("idempotency_key")) {
                    (Some(id), _) => Call::Receipt(id),
                    (None, Some(key)) => Call::Payment(key),
                    (None, None) => {
                        return Err(McpError::invalid_params(
                            "get_receipt needs a `receipt_id` (or an `idempotency_key`) string",
                            None,
                        ));
                    }
                };
                self.simple(call, &context).await
            }
            "get_budget" => self.simple(Call::Me, &context).await,
            "discover" => {
                let query = discover_query(&args)?;
                self.simple(Call::Discover(query), &context).await
            }
            other => {
                return Err(McpError::invalid_params(Cow::Owned(format!("unknown tool {other:?}")), None));
            }
        };
        Ok(result.into())
    }
}

/// `x402-router mcp`: serves the tools on stdin/stdout for the router at `base`.
///
/// # Errors
/// Bad settings, or the MCP session failing.
pub async fn serve_stdio(base: url::Url, agent_key: String, wait: Duration) -> anyhow::Result<()> {
    let tools = RouterTools::new(Backend::remote(base, agent_key)?, wait);
    let running = tools.serve(rmcp::transport::stdio()).await?;
    running.waiting().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_are_valid_stable_and_depend_on_scope_id_and_arguments() {
        let args: Map<String, Value> = serde_json::from_value(json!({"url": "http://x/a", "max_amount": "5"})).unwrap();
        let k = derive_key("s", &json!(3), &args);
        assert!(crate::idempotency::IdempotencyKey::parse(Some(k.as_bytes())).is_ok(), "{k}");
        assert_eq!(k, derive_key("s", &json!(3), &args));
        assert_ne!(k, derive_key("t", &json!(3), &args));
        assert_ne!(k, derive_key("s", &json!(4), &args));
        let mut other = args.clone();
        other.insert("max_amount".into(), json!("6"));
        assert_ne!(k, derive_key("s", &json!(3), &other));
    }

    #[test]
    fn tool_descriptions_say_what_a_price_cap_is_and_never_to_rekey() {
        let fetch = tools().into_iter().find(|t| t.name == "fetch").unwrap();
        let d = fetch.description.unwrap();
        assert!(d.contains("max_amount is the most this one call may pay"));
        assert!(d.contains("Never make up a new idempotency_key to retry"));
    }

    #[test]
    fn discover_arguments_become_a_query_and_strangers_are_refused() {
        let args: Map<String, Value> =
            serde_json::from_value(json!({"q": "weather & co", "max_price": "5", "payable": true, "limit": 3}))
                .unwrap();
        let q = discover_query(&args).unwrap();
        let parsed = crate::discovery::DiscoveryQuery::parse(&q).unwrap();
        assert_eq!((parsed.words.len(), parsed.payable, parsed.limit), (3, Some(true), 3));
        for bad in [json!({"qq": "x"}), json!({"limit": "3"}), json!({"payable": "yes"})] {
            assert!(discover_query(bad.as_object().unwrap()).is_err(), "{bad}");
        }
    }

    #[test]
    fn waits_honour_retry_after_and_back_off_otherwise() {
        assert_eq!(wait_before_retry(Some(5), 1), Duration::from_secs(5));
        assert_eq!(wait_before_retry(Some(500), 1), Duration::from_secs(10));
        assert_eq!(wait_before_retry(None, 1), Duration::from_millis(500));
        assert_eq!(wait_before_retry(None, 3), Duration::from_millis(2000));
    }

    #[test]
    fn five_tools_as_the_module_says() {
        let names: Vec<String> = tools().into_iter().map(|t| t.name.to_string()).collect();
        assert_eq!(names, ["fetch", "call_tool", "get_receipt", "get_budget", "discover"]);
    }
}
