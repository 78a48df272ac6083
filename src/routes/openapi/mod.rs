//! The OpenAPI 3.1 description of this service, produced by code and served at
//! `GET /openapi.json`.
//!
//! Two sources make the document:
//! - [`crate::codes::Code::ALL`] writes `ErrorCode` and one `Error_<code>` schema per code
//!   (`x-http-status` from [`Code::http_status`], `x-next` from the retry table of
//!   [`crate::mcp::policy`] applied to the code, its status and its `payment.status`), and
//!   the `code` enums of /route's `PaymentDeclined` (402) and `RouteError` (502/504);
//! - `operations.json` (next to this file) holds the operations, keyed by the route table
//!   [`super::ROUTES`]: the document's paths are exactly ROUTES (an entry
//!   of ROUTES without an operation is a panic the tests catch; an operation not in ROUTES is
//!   dropped), and the body schemas. A test validates real responses of every endpoint
//!   against the result, so neither can drift.
//!
//! `docs/openapi.json` is a generated copy for readers (a test holds it equal):
//! `cargo run --quiet -- openapi > docs/openapi.json` regenerates it.

use std::sync::LazyLock;

use serde_json::{Map, Value, json};

use super::ROUTES;
use crate::codes::Code;
use crate::mcp::policy::{Next, classify};

/// The hand-described operations and body schemas (no error codes, no path list).
const OPERATIONS: &str = include_str!("operations.json");

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
/// If `operations.json` is not valid JSON or lacks an operation for an entry of ROUTES: both
/// are build-time facts, checked by the tests.
#[allow(clippy::expect_used)]
pub fn document() -> Value {
    let mut doc: Value = serde_json::from_str(OPERATIONS).expect("src/openapi/operations.json is JSON");
    doc["info"]["version"] = json!(env!("CARGO_PKG_VERSION"));
    let described = doc["paths"].take();
    let mut paths = Map::new();
    for (method, path, _) in ROUTES {
        let method = method.as_str().to_ascii_lowercase();
        let operation = described
            .get(*path)
            .and_then(|p| p.get(&method))
            .unwrap_or_else(|| panic!("src/openapi/operations.json describes no {method} {path}"));
        let item = paths.entry(path.to_string()).or_insert_with(|| json!({}));
        item[&method] = operation.clone();
    }
    doc["paths"] = Value::Object(paths);
    let schemas = &mut doc["components"]["schemas"];
    schemas["ErrorCode"] = json!({
        "type": "string",
        "description": "The machine-readable error code (see `Error_<code>` for each).",
        "enum": Code::ALL.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
    });
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

/// `Error_<code>`: the common `Error` body with this `code`, its status(es) and what to do next.
fn error_schema(code: Code) -> Value {
    let statuses = code.http_status();
    let listed = statuses.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
    let next = serde_json::to_value(next(code)).unwrap_or(Value::Null);
    let next_str = next.as_str().unwrap_or_default();
    json!({
        "allOf": [{ "$ref": "#/components/schemas/Error" }],
        "properties": { "code": { "const": code.as_str() } },
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
