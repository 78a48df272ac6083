//! Plain answers (free, stats, 404, errors, 402 bodies), the query parameters, a dropped connection.

use std::pin::Pin;
use std::str::FromStr;
use std::task::{Context, Poll};

use actix_web::body::{BodySize, MessageBody};
use actix_web::http::header::CACHE_CONTROL;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use serde_json::{Value, json};

use crate::payment::error_chain;
use crate::wire::{self};

use super::*;

/// `GET|POST /free`: no payment needed. Counted per `?op=` tag; a POST's JSON body is echoed.
pub(super) async fn free(state: web::Data<AppState>, req: HttpRequest, body: Bytes) -> HttpResponse {
    let op = web::Query::<std::collections::HashMap<String, String>>::from_query(req.query_string())
        .ok()
        .and_then(|q| q.get("op").cloned())
        .unwrap_or_default();
    state.stats.free_hit(&op);
    if req.method() == actix_web::http::Method::POST {
        let echo: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        return HttpResponse::Ok().json(json!({ "free": true, "op": op, "echo": echo }));
    }
    HttpResponse::Ok().json(json!({ "free": true, "message": "no payment needed" }))
}

/// `GET /_stats`: per-route counters (see `stats::RouteStats`).
pub(super) async fn stats_handler(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(state.stats.snapshot())
}

pub(super) async fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(json!({ "error": "not found" }))
}

pub(super) fn bad_request(message: &str) -> HttpResponse {
    HttpResponse::BadRequest().json(json!({ "error": message }))
}

/// Every route of [`ROUTES`].
pub(super) fn weather(spec: &RouteSpec) -> Value {
    json!({
        "route": spec.path,
        "city": "Paris",
        "forecast": "sunny",
        "temperature_c": 21
    })
}

pub(super) fn payment_required_v2(required: &wire::PaymentRequiredV2, body: Value) -> HttpResponse {
    match wire::encode_header(required) {
        Ok(header) => HttpResponse::PaymentRequired()
            .insert_header((wire::PAYMENT_REQUIRED, header))
            .insert_header((CACHE_CONTROL, "no-store"))
            .json(body),
        Err(err) => internal_error(&err),
    }
}

pub(super) fn payment_required_v1(required: &wire::PaymentRequiredV1) -> HttpResponse {
    HttpResponse::PaymentRequired().insert_header((CACHE_CONTROL, "no-store")).json(required)
}

pub(super) fn internal_error(err: &dyn std::error::Error) -> HttpResponse {
    tracing::error!(error = %error_chain(err), "could not build the response");
    HttpResponse::InternalServerError().json(json!({ "error": "internal error" }))
}

/// `scheme://host/path?query` of this request, as the client addressed it.
pub(super) fn resource_url(req: &HttpRequest) -> String {
    let info = req.connection_info();
    let path = req.uri().path_and_query().map_or_else(|| req.path().to_owned(), |pq| pq.as_str().to_owned());
    format!("{}://{}{}", info.scheme(), info.host(), path)
}

/// `POST /_defaults`: the body (a query string, at most 1000 bytes; empty: none) is read
/// before every paid request's own query parameters from now on.
pub(super) async fn set_defaults(state: web::Data<AppState>, body: String) -> HttpResponse {
    if body.len() > 1000 {
        return bad_request("defaults hold at most 1000 bytes");
    }
    match state.defaults.lock() {
        Ok(mut defaults) => {
            *defaults = body.trim().to_owned();
            HttpResponse::NoContent().finish()
        }
        Err(_) => HttpResponse::InternalServerError().finish(),
    }
}

/// The query parameters the test routes understand.
pub(super) struct Query {
    hold: Option<String>,
    seconds: Option<String>,
    reason: Option<String>,
    max_timeout: Option<String>,
    conflict: bool,
    price: Option<String>,
    keep_all: bool,
    free: bool,
}

impl Query {
    pub(super) fn parse(raw: &str) -> Self {
        let mut query = Self {
            hold: None,
            seconds: None,
            reason: None,
            max_timeout: None,
            conflict: false,
            price: None,
            keep_all: false,
            free: false,
        };
        for (key, value) in url::form_urlencoded::parse(raw.as_bytes()) {
            match &*key {
                "seconds" => query.seconds = Some(value.into_owned()),
                "hold" => query.hold = Some(value.into_owned()),
                "reason" => query.reason = Some(value.into_owned()),
                "max_timeout" => query.max_timeout = Some(value.into_owned()),
                "conflict" => query.conflict = value == "true",
                "price" => query.price = Some(value.into_owned()),
                "keep" => query.keep_all = value == "all",
                "free" => query.free = value == "1",
                _ => {}
            }
        }
        query
    }

    /// `?price=N`: the price to ask instead of the configured one (atomic units, > 0), so that
    /// one path can change its price between two calls.
    pub(super) fn price(&self) -> Option<alloy::primitives::U256> {
        let raw = self.price.as_deref()?;
        let ok = !raw.is_empty() && raw.len() <= 30 && raw.bytes().all(|b| b.is_ascii_digit());
        ok.then(|| alloy::primitives::U256::from_str_radix(raw, 10).ok()).flatten().filter(|p| !p.is_zero())
    }

    /// `?keep=all`: keep every authorization received, before verifying it (for
    /// `POST /_settle_kept`), as an upstream that hoards whatever it is sent would.
    pub(super) fn keep_all(&self) -> bool {
        self.keep_all
    }

    /// `?free=1`: the route charges nothing now: 200 with its answer, paid or not, no
    /// settlement (with `keep=all`, it still keeps an authorization it did not ask for).
    pub(super) fn free(&self) -> bool {
        self.free
    }

    /// `?hold=N`: an unpaid request is answered its `402` only after N seconds (an upstream
    /// that holds calls back before naming its price); whole seconds, at most an hour.
    pub(super) fn hold(&self) -> Result<u64, String> {
        match &self.hold {
            None => Ok(0),
            Some(raw) => match u64::from_str(raw) {
                Ok(n) if n <= MAX_SECONDS => Ok(n),
                _ => Err(format!("hold must be a whole number from 0 to {MAX_SECONDS}")),
            },
        }
    }

    /// `?seconds=N`, whole seconds, at most an hour.
    pub(super) fn seconds(&self) -> Result<u64, String> {
        self.seconds_or(DEFAULT_SECONDS)
    }

    /// `?seconds=N`, or `default` without it.
    pub(super) fn seconds_or(&self, default: u64) -> Result<u64, String> {
        match &self.seconds {
            None => Ok(default),
            Some(raw) => match u64::from_str(raw) {
                Ok(n) if n <= MAX_SECONDS => Ok(n),
                _ => Err(format!("seconds must be a whole number from 0 to {MAX_SECONDS}")),
            },
        }
    }

    /// `?max_timeout=N`: the `maxTimeoutSeconds` to advertise instead of the configured one
    /// (a hostile upstream asking for an authorization that lives for centuries).
    pub(super) fn max_timeout(&self) -> Option<u64> {
        self.max_timeout.as_deref().and_then(|v| u64::from_str(v).ok())
    }

    /// `/v2/pid?conflict=true`: a hostile cache that answers 409 to every re-send of an id.
    pub(super) fn conflict(&self) -> bool {
        self.conflict
    }

    /// `/v2/reject?reason=…` (letters, digits, `_`, `-`), default `invalid_exact_evm_signature`.
    pub(super) fn reason(&self) -> String {
        self.reason
            .as_deref()
            .filter(|r| {
                !r.is_empty()
                    && r.len() <= 100
                    && r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            })
            .unwrap_or("invalid_exact_evm_signature")
            .to_owned()
    }
}

/// A response whose body fails before its first byte. actix-http encodes the head into its
/// write buffer, polls the body in the same turn, and on the error tears the connection down
/// before flushing, so the client sees the connection close with no HTTP response at all.
pub(super) fn dropped_connection() -> HttpResponse {
    tracing::info!("closing the connection without a response");
    HttpResponse::Ok().body(AbortBody)
}

pub(super) struct AbortBody;

impl MessageBody for AbortBody {
    type Error = std::io::Error;

    fn size(&self) -> BodySize {
        BodySize::Stream
    }

    fn poll_next(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Poll::Ready(Some(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "settle-then-drop: closing the connection without a response",
        ))))
    }
}

/// `?bazaar=1`: the route declares itself for discovery (the x402 `bazaar` extension: how to
/// call it and what it answers, with the JSON Schema of both), as the official servers do.
pub(super) fn bazaar_declaration(spec: &RouteSpec) -> Value {
    let (method, input, input_schema) = match spec.method {
        Method::Get => (
            "GET",
            json!({"type": "http", "method": "GET", "queryParams": {"city": "Paris"}}),
            json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        ),
        Method::Post => (
            "POST",
            json!({"type": "http", "method": "POST", "bodyType": "json", "body": {"hello": "world"}}),
            json!({"type": "object"}),
        ),
    };
    json!({
        "info": {"input": input, "output": {"type": "json", "example": weather(spec)}},
        "schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "input": {"type": "object", "properties": {
                    "type": {"type": "string", "const": "http"},
                    "method": {"type": "string", "enum": [method]},
                    "queryParams": input_schema
                }, "required": ["type", "method"]},
                "output": {"type": "object", "properties": {"type": {"type": "string"}, "example": {"type": "object"}}}
            },
            "required": ["input"]
        }
    })
}
