//! RFC 9457 problem details, by content negotiation.
//!
//! Error bodies are plain JSON `{"error", "code", …}` by default. A client whose `Accept`
//! names `application/problem+json` gets the same body as a problem document instead:
//! `type` (`urn:x402-router:error:<code>`), `title` (the `error` sentence), `status`, plus every
//! member of the plain body (`error`, `code`, and for `/route` outcomes `accepts`, `payment`,
//! `receipt_id`, …) as extension members, with `Content-Type: application/problem+json`.
//! Nothing else changes: status, headers, idempotency replays.

use actix_web::body::{BoxBody, MessageBody, to_bytes};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use actix_web::middleware::Next;
use serde_json::{Map, Value};

/// The media type of RFC 9457.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// Middleware: rewrites JSON error bodies as problem documents when the client asks for them.
///
/// # Errors
/// Only those of the wrapped service.
pub async fn negotiate(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let wants = req
        .headers()
        .get_all(ACCEPT)
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|t| t.trim().to_ascii_lowercase().starts_with(PROBLEM_JSON)));
    let res = next.call(req).await?;
    let is_json_error = res.status().as_u16() >= 400
        && res
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/json"));
    if !wants || !is_json_error {
        return Ok(res.map_into_boxed_body());
    }
    let (req, res) = res.into_parts();
    let status = res.status();
    let (mut head, body) = res.into_parts();
    // Our own JSON body, already bounded by what produced it (a 502 envelope by
    // UPSTREAM_MAX_RESPONSE_BYTES), so buffering it whole is safe.
    let Ok(bytes) = to_bytes(body).await else {
        tracing::warn!("could not buffer an error body for problem+json; answered 500");
        let res = actix_web::HttpResponse::InternalServerError().finish();
        return Ok(ServiceResponse::new(req, res));
    };
    let problem = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(plain)) => problem(status.as_u16(), plain),
        _ => return Ok(ServiceResponse::new(req, head.set_body(BoxBody::new(bytes)))),
    };
    let out = serde_json::to_vec(&problem).unwrap_or_else(|_| bytes.to_vec());
    head.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    head.headers_mut().remove(CONTENT_LENGTH);
    Ok(ServiceResponse::new(req, head.set_body(BoxBody::new(out))))
}

/// The problem document of a plain error body.
pub fn problem(status: u16, plain: Map<String, Value>) -> Value {
    let code = plain.get("code").and_then(Value::as_str).unwrap_or("error").to_owned();
    let title = plain.get("error").cloned().unwrap_or(Value::String(code.clone()));
    let mut doc = Map::new();
    doc.insert("type".into(), Value::String(format!("urn:x402-router:error:{code}")));
    doc.insert("title".into(), title);
    doc.insert("status".into(), Value::from(status));
    for (k, v) in plain {
        // `status` of a /route envelope is the upstream's; keep it under its own name.
        let k = if k == "status" { "upstream_status".to_owned() } else { k };
        doc.entry(k).or_insert(v);
    }
    Value::Object(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_plain_error_becomes_a_problem_with_its_members_kept() {
        let Value::Object(plain) = json!({"error": "boom", "code": "upstream_failed", "status": 500, "payment": null})
        else {
            unreachable!()
        };
        let p = problem(502, plain);
        assert_eq!(p["type"], "urn:x402-router:error:upstream_failed");
        assert_eq!(p["title"], "boom");
        assert_eq!(p["status"], 502);
        assert_eq!(p["upstream_status"], 500);
        assert_eq!(p["code"], "upstream_failed");
        assert!(p.get("payment").is_some());
    }
}
