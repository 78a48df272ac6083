//! The OpenAPI 3.1 description of this service, produced by code and served at
//! `GET /openapi.json`.
//!
//! The document is assembled from:
//! - [`crate::codes::Code::ALL`] writes one `Error_<code>` schema per code (`x-http-status`
//!   from [`Code::http_status`], `x-next` from the retry table of [`crate::mcp::policy`]
//!   applied to the code, its status and its `payment.status`), and the `code` enums of
//!   /route's `PaymentDeclined` (402) and `RouteError` (502/504); `ErrorCode` is `Code`'s own
//!   schema;
//! - [`Generated`] collects every operation from `#[utoipa::path]` on its handler (the three
//!   methods of `/mcp`, served by one handler, on the functions of `mcp.rs`), the body schemas
//!   from `#[derive(ToSchema)]` on the types the handlers serialize (`#[schema(...)]` where a
//!   schema is stricter than the type; [`super::inline`] for defaults, string enums and
//!   choices of `Error_<code>` the macros cannot state) and the shared answers of
//!   [`super::responses`]. A generated parameter or response header equal to one of
//!   `#/components/parameters` or `#/components/headers` becomes a `$ref` to it; the schemas
//!   of [`CLOSED`] get `additionalProperties: false`.
//! - `base.json` (next to this file) holds what does not come from code: the info, tags,
//!   servers, security schemes, shared parameters and headers. Every body schema is
//!   generated: from the type the handler serializes, or, where a body is read by a hand
//!   parser or written member by member, from a type beside that code whose members a unit
//!   test holds equal to it (`admin::AgentChange`, `relay::envelope_doc`).
//!
//! Paths are keyed by the route table [`super::ROUTES`]: the document's paths are exactly
//! ROUTES (an entry of ROUTES without an operation is a panic the tests catch; an operation
//! not in ROUTES is dropped). A test validates real responses of every endpoint against the
//! result, so neither can drift.
//!
//! `docs/openapi.json` is a generated copy for readers (a test holds it equal):
//! `cargo run --quiet -- openapi > docs/openapi.json` regenerates it.

mod mcp;

use std::sync::LazyLock;

use serde_json::{Map, Value, json};
use utoipa::OpenApi;

use super::{ROUTES, responses};
use crate::codes::Code;
use crate::mcp::policy::{Next, classify};

/// The operations, schemas and shared answers described in code.
#[derive(OpenApi)]
#[openapi(
    paths(
        super::health::healthz,
        super::health::readyz,
        super::health::metrics,
        super::openapi,
        super::audit::whoami,
        super::admin::settings,
        super::admin::update_settings,
        super::admin::pause,
        super::admin::resume,
        super::admin::create_agent,
        super::admin::list_agents,
        super::admin::show_agent,
        super::admin::update_agent,
        super::admin::disable_agent,
        super::admin::enable_agent,
        super::admin::rotate_key,
        super::admin::reconcile,
        super::approvals::list,
        super::approvals::approve,
        super::approvals::deny,
        super::channels::list,
        super::channels::close,
        super::changes::list,
        super::changes::confirm,
        super::changes::reject,
        super::operators::create,
        super::operators::list,
        super::operators::revoke,
        super::health::well_known,
        super::agents::me,
        super::receipts::get_own,
        super::audit::receipt,
        super::audit::spend,
        super::audit::upto,
        super::agents::payment,
        super::discovery::discover,
        super::audit::receipts,
        super::audit::idempotency,
        super::audit::payments,
        super::audit::payments_csv,
        super::audit::operator_events,
        super::agents::receipts,
        super::console::overview,
        super::route::route,
        mcp::post,
        mcp::get,
        mcp::delete,
    ),
    components(
        schemas(
            crate::error::ErrorBody,
            Code,
            super::inline::Amount,
            super::inline::Address,
            super::pages::ReceiptPage,
            super::pages::PaymentPage,
            super::pages::OperatorEventPage,
            crate::relay::view::PaymentView,
        ), responses(
        responses::Unauthorized,
        responses::ForbiddenAgentKey,
        responses::AuditDisabledOrNotFound,
        responses::NotFound,
        responses::BadQuery,
        responses::Unavailable,
        responses::AgentDisabled,
        responses::AdminOnly,
        responses::BadInput,
        responses::BodyTooLarge,
        responses::LastAdmin,
        responses::ApprovalDecided,
        responses::ChangeDecided,
        responses::AuthThrottled,
        responses::ChainUnavailable,
    )),
    modifiers(&EmptyBodyAllowed)
)]
pub struct Generated;

/// Marks the request bodies an empty body stands for (`{}`) as optional: utoipa makes a
/// body optional only as `Option<T>`, which would also admit a JSON `null` these refuse.
struct EmptyBodyAllowed;

impl utoipa::Modify for EmptyBodyAllowed {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for path in ["/admin/pause", "/admin/reconcile", "/admin/agents", "/admin/agents/{id}"] {
            let Some(item) = openapi.paths.paths.get_mut(path) else { continue };
            for op in [item.post.as_mut(), item.patch.as_mut()].into_iter().flatten() {
                if let Some(utoipa::openapi::RefOr::T(body)) = op.request_body.as_mut() {
                    body.required = Some(utoipa::openapi::Required::False);
                }
            }
        }
    }
}

/// The hand-written remainder: info, tags, security schemes, shared parameters and headers,
/// the body schemas not yet derived.
const BASE: &str = include_str!("base.json");

/// Schemas the router writes with exactly their members, whose types still read more (a
/// [`crate::receipts::Receipt`] deserializes leniently): `additionalProperties: false`.
const CLOSED: &[&str] = &["Receipt", "Payment", "RouteRequest"];

/// The document, built once on first use.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
    text.push('\n');
    text
});

/// The document as served (pretty JSON, trailing newline).
pub fn json() -> &'static str {
    &DOCUMENT
}

/// Builds the document.
///
/// # Panics
/// If `base.json` is not valid JSON or an entry of ROUTES has no generated operation: both
/// are build-time facts, checked by the tests.
#[allow(clippy::expect_used)]
pub fn document() -> Value {
    let mut doc: Value = serde_json::from_str(BASE).expect("src/routes/openapi/base.json is JSON");
    doc["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    let generated = serde_json::to_value(Generated::openapi()).expect("the generated document is JSON");
    let operations = &generated["paths"];
    merge(&mut doc["components"]["schemas"], &generated["components"]["schemas"], 1);
    for name in CLOSED {
        doc["components"]["schemas"][name]["additionalProperties"] = json!(false);
    }
    merge(&mut doc["components"]["responses"], &generated["components"]["responses"], 1);
    let mut paths = Map::new();
    for (method, path, _) in ROUTES {
        let method = method.as_str().to_ascii_lowercase();
        let operation = operations
            .get(*path)
            .and_then(|p| p.get(&method))
            .unwrap_or_else(|| panic!("no operation for {method} {path}: no #[utoipa::path] in Generated"));
        let item = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        item[&method] = operation.clone();
    }
    doc["paths"] = Value::Object(paths);
    declare_throttle(&mut doc);
    share(&mut doc);
    let schemas = &mut doc["components"]["schemas"];
    for code in Code::ALL {
        schemas[format!("Error_{}", code.as_str())] = error_schema(*code);
    }
    // The codes of /route's recorded outcomes, by status.
    let with_status = |wanted: &[u16]| -> Vec<&str> {
        Code::ALL.iter().filter(|c| c.http_status().iter().any(|s| wanted.contains(s))).map(|c| c.as_str()).collect()
    };
    schemas["PaymentDeclined"]["properties"]["code"]["enum"] = json!(with_status(&[402]));
    schemas["RouteError"]["properties"]["code"]["enum"] = json!(with_status(&[502, 504]));
    doc
}

/// Every operation that takes an operator token may answer 429 `auth_throttled`
/// (`auth_throttle`): declared once here rather than on each handler.
fn declare_throttle(doc: &mut Value) {
    let Some(paths) = doc["paths"].as_object_mut() else { return };
    for operation in paths.values_mut().filter_map(Value::as_object_mut).flat_map(|item| item.values_mut()) {
        let operator =
            operation["security"].as_array().is_some_and(|s| s.iter().any(|r| r.get("operatorToken").is_some()));
        if operator && operation["responses"].get("429").is_none() {
            operation["responses"]["429"] = json!({ "$ref": "#/components/responses/AuthThrottled" });
        }
    }
}

/// Points the generated parameters and response headers equal to a shared one of
/// `base.json` (`#/components/parameters/…`, `#/components/headers/…`) at it, and drops
/// the `"required": false` utoipa writes on optional parameters (the default).
fn share(doc: &mut Value) {
    let parameters = doc["components"]["parameters"].as_object().cloned().unwrap_or_default();
    let headers = doc["components"]["headers"].as_object().cloned().unwrap_or_default();
    let to_ref = |value: &mut Value, shared: &Map<String, Value>, kind: &str| {
        if let Some(name) = shared.iter().find(|(_, s)| *s == value).map(|(n, _)| n) {
            *value = json!({ "$ref": format!("#/components/{kind}/{name}") });
        }
    };
    let Some(paths) = doc["paths"].as_object_mut() else { return };
    for operation in paths.values_mut().filter_map(Value::as_object_mut).flat_map(|item| item.values_mut()) {
        for parameter in operation.get_mut("parameters").and_then(Value::as_array_mut).into_iter().flatten() {
            if parameter["required"] == json!(false)
                && let Some(p) = parameter.as_object_mut()
            {
                p.remove("required");
            }
            to_ref(parameter, &parameters, "parameters");
        }
        for response in
            operation.get_mut("responses").and_then(Value::as_object_mut).into_iter().flat_map(|r| r.values_mut())
        {
            for header in
                response.get_mut("headers").and_then(Value::as_object_mut).into_iter().flat_map(|h| h.values_mut())
            {
                to_ref(header, &headers, "headers");
            }
        }
    }
}

/// Copies `from` into `into`, `depth` levels of objects deep (a path's methods at 2, a
/// component at 1): what `from` has replaces what `into` has under the same keys.
fn merge(into: &mut Value, from: &Value, depth: u8) {
    let Some(from) = from.as_object() else { return };
    if !into.is_object() {
        *into = json!({});
    }
    for (key, value) in from {
        if depth > 1 {
            merge(&mut into[key], value, depth - 1);
        } else {
            into[key] = value.clone();
        }
    }
}

/// `Error_<code>`: the common `Error` body with this `code`, its status(es) and what to do next.
fn error_schema(code: Code) -> Value {
    let statuses = code.http_status();
    let listed = statuses.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
    let next = serde_json::to_value(next(code)).unwrap_or(Value::Null);
    let next_str = next.as_str().unwrap_or_default();
    let mut properties = json!({ "code": { "const": code.as_str() } });
    if matches!(code, Code::ApprovalPending | Code::ApprovalDenied | Code::ApprovalExpired | Code::ApprovalDecided) {
        properties["approval"] = json!({ "$ref": "#/components/schemas/Approval" });
    }
    json!({
        "allOf": [{ "$ref": "#/components/schemas/Error" }],
        "properties": properties,
        "description": format!("HTTP {listed}. {} Next: {next_str}.", code.description()),
        "x-http-status": statuses,
        "x-next": next,
    })
}

/// What an agent does after an answer with this code: the retry table of
/// [`crate::mcp::policy`] applied to the code's (first) status and its `payment.status`
/// (for `upstream_failed`, the answer without a payment).
pub fn next(code: Code) -> Next {
    let status = code.http_status().first().copied().unwrap_or(500);
    let payment = code.payment_status().map(|s| json!({ "status": s }));
    classify(status, &json!({ "code": code.as_str(), "payment": payment }))
}
