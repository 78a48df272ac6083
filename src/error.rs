//! The one place that maps errors to HTTP. Every error body is `{"error": "…"}`.
//! 5xx bodies are opaque; their cause is logged once, here. Domain errors (the relay's
//! [`relay::Error`]) are converted here and nowhere else: unreachable dependencies ⇒ 503,
//! failed queries and broken invariants ⇒ 500.

use actix_web::http::StatusCode;
use actix_web::http::header::{HeaderValue, RETRY_AFTER};
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::audit::BadQuery;
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
}

impl From<relay::Error> for ApiError {
    fn from(e: relay::Error) -> Self {
        match e {
            relay::Error::ForbiddenUpstream(m) => Self::BadRequest(m),
            relay::Error::InFlight => Self::InFlight,
            relay::Error::KeyReused => Self::KeyReused,
            relay::Error::Superseded => Self::Superseded,
            relay::Error::Unavailable(what) => Self::Unavailable(what),
            relay::Error::Internal(e) => Self::Internal(e),
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
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::KeyReused | Self::InFlight | Self::Superseded => StatusCode::CONFLICT,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Internal(e) = self {
            tracing::error!(error = ?e, "internal error");
        }
        let mut resp = HttpResponse::build(self.status_code());
        match self {
            Self::InFlight => {
                resp.insert_header((RETRY_AFTER, HeaderValue::from_static("5")));
            }
            Self::Unauthorized => {
                resp.insert_header(("WWW-Authenticate", "Bearer"));
            }
            Self::Unavailable(_) => {
                resp.insert_header((RETRY_AFTER, HeaderValue::from_static("1")));
            }
            _ => {}
        }
        resp.json(json!({ "error": self.to_string() }))
    }
}

/// Re-shapes actix's own rejections (bad query, bad path, …) into `{"error": …}`.
pub fn json_error(status: StatusCode, message: impl Into<String>) -> HttpResponse {
    HttpResponse::build(status).json(json!({ "error": message.into() }))
}
