//! Where the MCP tools send their calls: a running router over HTTP (`x402-router mcp`,
//! stdio) or this router process itself (`/mcp`). Both answer with the same statuses and
//! bodies as the HTTP API, so the tools and the retry policy cannot tell them apart.

use std::time::Duration;

use actix_web::ResponseError;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::error::{ApiError, PoolConn};
use crate::idempotency::IdempotencyKey;
use crate::relay::{self, request::Incoming};
use crate::state::AppState;

/// Why the MCP server could not reach the router (one line for the model).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

impl From<String> for BackendError {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for BackendError {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// One call of the router's agent API.
#[derive(Debug, Clone)]
pub enum Call {
    /// `POST /route` with this `Idempotency-Key` and JSON body.
    Route { key: String, body: Value },
    /// `GET /agents/me`.
    Me,
    /// `GET /receipts/{id}`.
    Receipt(String),
    /// `GET /payments?idempotency_key=`.
    Payment(String),
    /// `GET /discovery?<query>` (the query string, already encoded).
    Discover(String),
}

/// An HTTP-shaped answer.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
    /// Seconds, from `Retry-After`.
    pub retry_after: Option<u64>,
    /// `X-Idempotent-Replay: true`.
    pub replayed: bool,
    /// `X-Payment-Status` of `GET /receipts/{id}`.
    pub payment_status: Option<String>,
}

impl Reply {
    fn json(status: u16, body: Value) -> Self {
        Self { status, body, retry_after: None, replayed: false, payment_status: None }
    }

    fn error(e: &ApiError) -> Self {
        Self { retry_after: e.retry_after().map(u64::from), ..Self::json(e.status_code().as_u16(), e.body()) }
    }
}

/// The router the tools talk to.
#[derive(Clone)]
pub enum Backend {
    /// A router reached over HTTP with one agent's key.
    Remote { client: reqwest::Client, base: url::Url, agent_key: String },
    /// This process; the agent comes from the authenticated `/mcp` request.
    Local(Box<AppState>),
}

/// Longest wait for one HTTP answer: the router's own route deadline is 50 s by default.
const REMOTE_TIMEOUT: Duration = Duration::from_secs(75);

impl Backend {
    /// A backend for the router at `base` (e.g. `http://127.0.0.1:8080`).
    ///
    /// # Errors
    /// If the HTTP client cannot be built.
    pub fn remote(base: url::Url, agent_key: String) -> anyhow::Result<Self> {
        // A client of the router (the operator's own `base`), never of an upstream: the router
        // reaches upstreams through `upstream::UpstreamClient` (its SSRF guard, timeouts and
        // size limits), which is why this is not built from `UpstreamConfig`.
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(REMOTE_TIMEOUT)
            .user_agent(concat!("x402-router-mcp/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self::Remote { client, base, agent_key })
    }

    /// Performs `call` for `agent` (only `Local` needs it).
    ///
    /// # Errors
    /// A connection-level failure (no HTTP answer): the outcome is unknown.
    pub async fn call(&self, agent: Option<&super::McpAgent>, call: &Call) -> Result<Reply, BackendError> {
        match self {
            Self::Remote { client, base, agent_key } => remote(client, base, agent_key, call).await,
            Self::Local(state) => {
                let Some(agent) = agent else {
                    return Ok(Reply::error(&ApiError::Unauthorized));
                };
                Ok(local(state, agent, call).await)
            }
        }
    }
}

async fn remote(client: &reqwest::Client, base: &url::Url, key: &str, call: &Call) -> Result<Reply, BackendError> {
    let join = |path: &str| base.join(path).map_err(|e| format!("bad router URL: {e}"));
    let req = match call {
        Call::Route { key: idem, body } => client.post(join("route")?).header("Idempotency-Key", idem).json(body),
        Call::Me => client.get(join("agents/me")?),
        Call::Receipt(id) => {
            let mut url = join("receipts/")?;
            url.path_segments_mut().map_err(|()| "bad router URL".to_owned())?.pop_if_empty().push(id);
            client.get(url)
        }
        Call::Payment(idem) => {
            let mut url = join("payments")?;
            url.query_pairs_mut().append_pair("idempotency_key", idem);
            client.get(url)
        }
        Call::Discover(query) => {
            let mut url = join("discovery")?;
            url.set_query((!query.is_empty()).then_some(query.as_str()));
            client.get(url)
        }
    };
    let resp = req.bearer_auth(key).send().await.map_err(|e| format!("router unreachable: {e}"))?;
    let status = resp.status().as_u16();
    let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let retry_after = header("retry-after").and_then(|v| v.trim().parse().ok());
    let replayed = header("x-idempotent-replay").as_deref() == Some("true");
    let payment_status = header("x-payment-status");
    let bytes = resp.bytes().await.map_err(|e| format!("connection lost while reading the answer: {e}"))?;
    let body = crate::relay::envelope::to_value(&bytes)
        .unwrap_or_else(|| json!({ "error": String::from_utf8_lossy(&bytes), "code": null }));
    Ok(Reply { status, body, retry_after, replayed, payment_status })
}

async fn local(state: &AppState, caller: &super::McpAgent, call: &Call) -> Reply {
    let agent = caller.id;
    match call {
        Call::Route { key, body } => {
            let raw = match serde_json::to_vec(body) {
                Ok(raw) => raw,
                Err(e) => return Reply::error(&ApiError::BadRequest(e.to_string())),
            };
            if raw.len() > state.config.request_max_bytes {
                return Reply::error(&ApiError::PayloadTooLarge(state.config.request_max_bytes));
            }
            let key = match IdempotencyKey::parse(Some(key.as_bytes())) {
                Ok(k) => k,
                Err(e) => return Reply::error(&ApiError::from(e)),
            };
            let incoming = Incoming { raw: &raw, path: "/route", query: "" };
            match relay::handle(state, (agent, &caller.credential), key, incoming).await {
                Ok(r) => {
                    let body = crate::relay::envelope::to_value(&r.body).unwrap_or(serde_json::Value::Null);
                    Reply { replayed: r.replay, ..Reply::json(r.http_status, body) }
                }
                Err(e) => Reply::error(&ApiError::from(e)),
            }
        }
        Call::Me => {
            let result = async {
                let mut conn = state.conn().await?;
                crate::self_service::me(&mut conn, agent).await.map_err(ApiError::database)?.ok_or(ApiError::NotFound)
            }
            .await;
            match result.and_then(|me| serde_json::to_value(me).map_err(|e| ApiError::Internal(e.into()))) {
                Ok(v) => Reply::json(200, v),
                Err(e) => Reply::error(&e),
            }
        }
        Call::Receipt(id) => {
            let result = async {
                let id = Uuid::parse_str(id).map_err(|_| ApiError::NotFound)?;
                let mut conn = state.conn().await?;
                let receipt = crate::receipts::store::find_for_agent(&mut conn, agent, id)
                    .await
                    .map_err(ApiError::database)?
                    .ok_or(ApiError::NotFound)?;
                let status = crate::self_service::payment_status(&mut conn, agent, &receipt.idempotency_key)
                    .await
                    .map_err(ApiError::database)?;
                let body = serde_json::to_value(receipt).map_err(|e| ApiError::Internal(e.into()))?;
                Ok::<_, ApiError>((body, status))
            }
            .await;
            match result {
                Ok((body, payment_status)) => Reply { payment_status, ..Reply::json(200, body) },
                Err(e) => Reply::error(&e),
            }
        }
        Call::Discover(query) => discover(state, agent, query).await,
        Call::Payment(key) => {
            let result = async {
                let mut conn = state.conn().await?;
                let p = crate::self_service::payment_for_key(&mut conn, agent, key)
                    .await
                    .map_err(ApiError::database)?
                    .ok_or(ApiError::NotFound)?;
                let safe = super::policy::RELEASED_PAYMENT_STATES.contains(&p.status.as_str());
                let body = serde_json::to_value(crate::self_service::KeyPaymentView::new(&p, safe))
                    .map_err(|e| ApiError::Internal(e.into()))?;
                Ok::<_, ApiError>(body)
            }
            .await;
            match result {
                Ok(body) => Reply::json(200, body),
                Err(e) => Reply::error(&e),
            }
        }
    }
}

/// `GET /discovery` in this process.
async fn discover(state: &AppState, agent: Uuid, query: &str) -> Reply {
    let result = async {
        let query = crate::discovery::DiscoveryQuery::parse(query).map_err(|e| ApiError::BadRequest(e.0))?;
        let mut conn = state.conn().await?;
        let paid_with = (&state.supported, state.solana.as_deref());
        let page = crate::discovery::find_for(&mut conn, &state.discovery, paid_with, agent, &query)
            .await
            .map_err(ApiError::database)?;
        serde_json::to_value(page).map_err(|e| ApiError::Internal(e.into()))
    }
    .await;
    match result {
        Ok(body) => Reply::json(200, body),
        Err(e) => Reply::error(&e),
    }
}
