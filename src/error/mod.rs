//! The one place that maps errors to HTTP. Every error body is `{"error": "…", "code": "…"}`:
//! `error` for humans, `code` ([`Code`]) for programs. 5xx bodies are opaque; their cause is
//! logged once, here. Domain errors (the relay's [`relay::Error`]) are converted here and
//! nowhere else: unreachable dependencies ⇒ 503, failed queries and broken invariants ⇒ 500.

pub mod problem;

use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderValue, RETRY_AFTER};
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::audit::BadQuery;
use crate::codes::Code;
use crate::idempotency::key::InvalidKey;
use crate::relay::{self, request::BadRequest};

/// Errors of the HTTP API.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("Idempotency-Key header required (16–128 chars)")]
    IdempotencyKeyRequired,
    #[error("request body exceeds {0} bytes")]
    PayloadTooLarge(usize),
    #[error("missing or unknown API key")]
    Unauthorized,
    #[error("agent is disabled")]
    Forbidden,
    #[error("agent keys cannot use the operator API")]
    OperatorOnly,
    #[error("{0}")]
    UpstreamNotAllowed(String),
    #[error("{message}")]
    RateLimited { message: String, retry_after: u32 },
    #[error("too many failed operator authentications from this address; retry after {retry_after} s")]
    AuthThrottled { retry_after: u32 },
    #[error("{0}")]
    LastAdmin(String),
    #[error("{0}")]
    PaymentsPaused(String),
    #[error("this needs an admin operator token")]
    AdminOnly,
    #[error("not found")]
    NotFound,
    #[error("Idempotency-Key reused with different body")]
    KeyReused,
    #[error("Original request still in flight; retry shortly")]
    InFlight,
    #[error("this attempt was superseded by a retry of the same Idempotency-Key; retry to read the recorded result")]
    Superseded,
    #[error("service unavailable: {0}")]
    Unavailable(&'static str),
    #[error("the payment network cannot be read to check an earlier payment; retry later")]
    PaymentNetworkUnavailable,
    /// An operator's decision came too late: the approval was decided or expired.
    #[error("the approval is already {}; nothing changed", .0.state.as_str())]
    ApprovalDecided(Box<crate::approvals::Approval>),
    /// The two-person rule: the proposer may not confirm their own change, and the bootstrap
    /// `OPERATOR_TOKEN` (no person) may neither confirm a change nor approve a payment.
    #[error(
        "under the two-person rule a change is confirmed by a named admin other than its proposer, and a held \
         payment approved by a named admin (the bootstrap OPERATOR_TOKEN names nobody); nothing changed"
    )]
    OwnChange,
    /// The two-person rule: the change's target changed since it was proposed.
    #[error("the agent or settings changed since this change was proposed; nothing changed (propose it again)")]
    ChangeStale,
    /// The two-person rule: the proposal was decided or expired.
    #[error("the change is already {}; nothing changed", .0.state.as_str())]
    ChangeDecided(Box<crate::admin::Proposal>),
    /// A payment held for an operator's approval: 202 while pending, 403 once denied or
    /// expired; the body carries the `approval`.
    #[error("{message}")]
    Held { message: String, held: crate::approvals::Held },
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    /// A database error outside the relay (audit, receipts, auth): transient ⇒ 503,
    /// anything else ⇒ 500.
    pub fn database(e: diesel::result::Error) -> Self {
        if crate::db::is_transient(&e) {
            tracing::warn!(error = %e, "postgres unavailable");
            Self::Unavailable("database unavailable")
        } else {
            Self::Internal(anyhow::Error::new(e).context("database query failed"))
        }
    }

    /// No pooled connection: 503, and nothing was executed.
    pub fn pool(e: impl std::fmt::Display) -> Self {
        tracing::warn!(error = %e, "postgres unavailable (no connection)");
        Self::Unavailable("database unavailable")
    }

    /// The machine-readable code of this error.
    pub fn code(&self) -> Code {
        match self {
            Self::BadRequest(_) => Code::BadRequest,
            Self::IdempotencyKeyRequired => Code::IdempotencyKeyRequired,
            Self::PayloadTooLarge(_) => Code::PayloadTooLarge,
            Self::Unauthorized => Code::Unauthorized,
            Self::Forbidden => Code::AgentDisabled,
            Self::UpstreamNotAllowed(_) => Code::UpstreamNotAllowed,
            Self::RateLimited { .. } => Code::RateLimited,
            Self::AuthThrottled { .. } => Code::AuthThrottled,
            Self::LastAdmin(_) => Code::LastAdmin,
            Self::PaymentsPaused(_) => Code::PaymentsPaused,
            Self::OperatorOnly | Self::AdminOnly => Code::OperatorOnly,
            Self::NotFound => Code::NotFound,
            Self::KeyReused => Code::IdempotencyKeyReused,
            Self::InFlight => Code::IdempotencyKeyInFlight,
            Self::Superseded => Code::Superseded,
            Self::Unavailable(_) => Code::DatabaseUnavailable,
            Self::PaymentNetworkUnavailable => Code::PaymentNetworkUnavailable,
            Self::ApprovalDecided(_) => Code::ApprovalDecided,
            Self::OwnChange => Code::OwnChange,
            Self::ChangeStale => Code::ChangeStale,
            Self::ChangeDecided(_) => Code::ChangeDecided,
            Self::Held { held, .. } => match held {
                crate::approvals::Held::Pending(_) => Code::ApprovalPending,
                crate::approvals::Held::Denied(_) => Code::ApprovalDenied,
                crate::approvals::Held::Expired(_) => Code::ApprovalExpired,
            },
            Self::Internal(_) => Code::InternalError,
        }
    }

    /// The seconds an agent should wait before retrying the same key, when it should.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            Self::InFlight | Self::PaymentNetworkUnavailable => Some(5),
            Self::Unavailable(_) => Some(1),
            Self::RateLimited { retry_after, .. } | Self::AuthThrottled { retry_after } => Some(*retry_after),
            Self::PaymentsPaused(_) => Some(30),
            Self::Held { held: crate::approvals::Held::Pending(_), .. } => Some(APPROVAL_RETRY_AFTER),
            _ => None,
        }
    }

    /// The JSON body (`{"error", "code"}`; a held payment's adds `approval`).
    pub fn body(&self) -> serde_json::Value {
        let fallback = || json!({ "error": "internal error", "code": Code::InternalError });
        let approval = match self {
            Self::Held { held, .. } => Some(held.approval()),
            Self::ApprovalDecided(a) => Some(&**a),
            _ => None,
        };
        if let Some(approval) = approval {
            let body = HeldBody { error: self.to_string(), code: self.code(), approval };
            return serde_json::to_value(body).unwrap_or_else(|_| fallback());
        }
        // Through a value: members in name order, as before.
        let body = ErrorBody { error: self.to_string(), code: self.code() };
        serde_json::to_value(body).unwrap_or_else(|_| fallback())
    }
}

/// Every error body (`Error` in the OpenAPI document; `Error_<code>` narrows `code`).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[schema(as = Error,
    description = "Every error body. `error` is for humans and may change; `code` is stable: branch on it. One schema per code follows (`Error_<code>`).",
    example = json!({ "error": "not found", "code": "not_found" }))]
pub struct ErrorBody {
    /// What went wrong. 5xx messages are opaque.
    pub error: String,
    pub code: Code,
}

/// How long an agent waits before asking again about a payment held for approval, seconds.
pub const APPROVAL_RETRY_AFTER: u32 = 5;

/// The body of a payment held for an operator's approval (`approval_pending`,
/// `approval_denied`, `approval_expired`).
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[schema(as = HeldPayment)]
pub struct HeldBody<'a> {
    pub error: String,
    pub code: Code,
    /// The payment's terms, the approval's id and state, and the key to retry with.
    #[schema(value_type = crate::approvals::Approval)]
    pub approval: &'a crate::approvals::Approval,
}

/// A pooled Postgres connection for the HTTP entry points, an empty or broken pool mapped to
/// 503 here, once. Taken where a handler needs it, after its input is read and checked: an
/// eager extractor would hold a connection while a slow client still sends its body.
pub trait PoolConn {
    /// A connection, or [`ApiError::Unavailable`].
    fn conn(&self) -> impl std::future::Future<Output = Result<crate::db::PgConn<'_>, ApiError>>;
}

impl PoolConn for crate::state::AppState {
    async fn conn(&self) -> Result<crate::db::PgConn<'_>, ApiError> {
        self.pool.get().await.map_err(ApiError::pool)
    }
}

impl From<relay::Error> for ApiError {
    fn from(e: relay::Error) -> Self {
        match e {
            relay::Error::BadRequest(m) | relay::Error::ForbiddenUpstream(m) => Self::BadRequest(m),
            relay::Error::Refused(refusal) => {
                use crate::payments::limits::Refusal;
                let message = relay::Error::Refused(refusal.clone()).to_string();
                match refusal {
                    Refusal::HostNotAllowed(why) => Self::UpstreamNotAllowed(why),
                    Refusal::RateLimited { retry_after, .. } => Self::RateLimited { message, retry_after },
                    Refusal::Paused => Self::PaymentsPaused(message),
                    Refusal::Disabled => Self::Forbidden,
                    Refusal::KeyRotated => Self::Unauthorized,
                    // Recorded as the call's answer, never raised: a bug if it is.
                    Refusal::OverBudget(_) | Refusal::PayToNotAllowed(_) => {
                        Self::Internal(anyhow::anyhow!("a recorded refusal was raised as an error: {message}"))
                    }
                }
            }
            relay::Error::Held(held) => Self::Held { message: relay::Error::Held(held.clone()).to_string(), held },
            relay::Error::InFlight => Self::InFlight,
            relay::Error::KeyReused => Self::KeyReused,
            relay::Error::Superseded => Self::Superseded,
            relay::Error::Unavailable(what) => Self::Unavailable(what),
            relay::Error::PaymentNetworkUnavailable(what) => {
                tracing::warn!(reason = what, "payment network unavailable");
                Self::PaymentNetworkUnavailable
            }
            relay::Error::Internal(e) => Self::Internal(e),
        }
    }
}

impl From<crate::admin::Invalid> for ApiError {
    fn from(e: crate::admin::Invalid) -> Self {
        Self::BadRequest(e.0)
    }
}

impl From<crate::admin::AdminError> for ApiError {
    fn from(e: crate::admin::AdminError) -> Self {
        use crate::admin::AdminError;
        match e {
            AdminError::Invalid(e) => Self::BadRequest(e.0),
            AdminError::NotFound => Self::NotFound,
            AdminError::NoRandomness(e) => Self::Internal(anyhow::anyhow!("no randomness: {e}")),
            AdminError::Stale => Self::ChangeStale,
            AdminError::Database(e) => Self::database(e),
            AdminError::Channel(crate::relay::pay::registry::channels::ChannelError::Chain(e)) => {
                tracing::warn!(error = %e, "a batch-settlement channel's chain cannot be read");
                Self::PaymentNetworkUnavailable
            }
            AdminError::Channel(e) => Self::Internal(anyhow::anyhow!("closing a batch-settlement channel: {e}")),
        }
    }
}

impl From<crate::admin::proposals::DecideError> for ApiError {
    fn from(e: crate::admin::proposals::DecideError) -> Self {
        use crate::admin::proposals::DecideError;
        match e {
            DecideError::NotFound => Self::NotFound,
            DecideError::Decided(p) => Self::ChangeDecided(p),
            DecideError::OwnChange => Self::OwnChange,
            DecideError::Stale => Self::ChangeStale,
            DecideError::Admin(e) => e.into(),
        }
    }
}

impl From<crate::operators::manage::OperatorError> for ApiError {
    fn from(e: crate::operators::manage::OperatorError) -> Self {
        use crate::operators::manage::OperatorError;
        match e {
            OperatorError::Invalid(m) => Self::BadRequest(m),
            OperatorError::NotFound => Self::NotFound,
            OperatorError::LastAdmin => Self::LastAdmin(OperatorError::LastAdmin.to_string()),
            OperatorError::NoRandomness(e) => Self::Internal(anyhow::anyhow!("no randomness: {e}")),
            OperatorError::Database(e) => Self::database(e),
        }
    }
}

impl From<crate::admin::approval_queue::DecideError> for ApiError {
    fn from(e: crate::admin::approval_queue::DecideError) -> Self {
        use crate::admin::approval_queue::DecideError;
        match e {
            DecideError::NotFound => Self::NotFound,
            DecideError::Decided(a) => Self::ApprovalDecided(a),
            DecideError::Unnamed => Self::OwnChange,
            DecideError::Database(e) => Self::database(e),
        }
    }
}

impl From<BadRequest> for ApiError {
    fn from(e: BadRequest) -> Self {
        Self::BadRequest(e.0)
    }
}

impl From<BadQuery> for ApiError {
    fn from(e: BadQuery) -> Self {
        Self::BadRequest(e.0)
    }
}

impl From<InvalidKey> for ApiError {
    fn from(_: InvalidKey) -> Self {
        Self::IdempotencyKeyRequired
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) | Self::IdempotencyKeyRequired => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::UpstreamNotAllowed(_) => StatusCode::FORBIDDEN,
            Self::RateLimited { .. } | Self::AuthThrottled { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::PaymentsPaused(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Forbidden | Self::OperatorOnly | Self::AdminOnly | Self::OwnChange => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::KeyReused
            | Self::InFlight
            | Self::Superseded
            | Self::LastAdmin(_)
            | Self::ApprovalDecided(_)
            | Self::ChangeStale
            | Self::ChangeDecided(_) => StatusCode::CONFLICT,
            Self::Unavailable(_) | Self::PaymentNetworkUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Held { held: crate::approvals::Held::Pending(_), .. } => StatusCode::ACCEPTED,
            Self::Held { .. } => StatusCode::FORBIDDEN,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Internal(e) = self {
            tracing::error!(error = ?e, "internal error");
        }
        let mut resp = HttpResponse::build(self.status_code());
        if let Some(secs) = self.retry_after() {
            resp.insert_header((RETRY_AFTER, HeaderValue::from(secs)));
        }
        if let Self::Unauthorized = self {
            resp.insert_header(("WWW-Authenticate", "Bearer"));
        }
        resp.json(self.body())
    }
}

/// Re-shapes actix's own rejections (bad query, bad path, …) into `{"error", "code"}`.
pub fn json_error(status: StatusCode, code: Code, message: impl Into<String>) -> HttpResponse {
    HttpResponse::build(status).json(json!({ "error": message.into(), "code": code }))
}

#[cfg(test)]
mod tests {
    use actix_web::ResponseError;

    use super::*;

    fn approval() -> crate::approvals::Approval {
        crate::approvals::Approval {
            id: uuid::Uuid::nil(),
            agent_id: uuid::Uuid::nil(),
            idempotency_key: "k".repeat(16),
            state: crate::approvals::ApprovalState::Pending,
            network: "eip155:8453".into(),
            asset: "0x".into(),
            amount: crate::money::Amount::from(1),
            pay_to: "0x".into(),
            upstream_url: "https://api.example.com/".into(),
            created_at: chrono::Utc::now(),
            expires_at: chrono::Utc::now(),
            decided_at: None,
            decided_by: None,
        }
    }

    fn held(held: crate::approvals::Held) -> ApiError {
        ApiError::Held { message: "x".into(), held }
    }

    /// The status of every error is one its code documents (`Code::http_status`, the
    /// OpenAPI document's `x-http-status`).
    #[test]
    fn every_error_status_is_one_its_code_documents() {
        let all = [
            ApiError::BadRequest("x".into()),
            ApiError::IdempotencyKeyRequired,
            ApiError::PayloadTooLarge(1),
            ApiError::Unauthorized,
            ApiError::Forbidden,
            ApiError::OperatorOnly,
            ApiError::UpstreamNotAllowed("x".into()),
            ApiError::RateLimited { message: "x".into(), retry_after: 1 },
            ApiError::AuthThrottled { retry_after: 1 },
            ApiError::LastAdmin("x".into()),
            ApiError::PaymentsPaused("x".into()),
            ApiError::AdminOnly,
            ApiError::NotFound,
            ApiError::KeyReused,
            ApiError::InFlight,
            ApiError::Superseded,
            ApiError::Unavailable("x"),
            ApiError::PaymentNetworkUnavailable,
            ApiError::Internal(anyhow::anyhow!("x")),
            ApiError::ApprovalDecided(Box::new(approval())),
            ApiError::OwnChange,
            ApiError::ChangeStale,
            held(crate::approvals::Held::Pending(Box::new(approval()))),
            held(crate::approvals::Held::Denied(Box::new(approval()))),
            held(crate::approvals::Held::Expired(Box::new(approval()))),
        ];
        for e in all {
            let status = e.status_code().as_u16();
            assert!(e.code().http_status().contains(&status), "{e:?}: {status} vs {:?}", e.code().http_status());
        }
    }
}
