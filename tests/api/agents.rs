//! The error contract: a stable `code` in every error body, documented per code.

use serde_json::{Value, json};
use x402_router::codes::Code;

#[actix_web::test]
async fn the_openapi_document_has_one_schema_per_error_code() {
    let doc: Value = serde_json::from_str(x402_router::routes::OPENAPI_JSON).unwrap();
    let schemas = &doc["components"]["schemas"];
    let listed: Vec<&str> =
        schemas["ErrorCode"]["enum"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    let codes: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(listed, codes);
    for code in codes {
        let s = &schemas[format!("Error_{code}")];
        assert_eq!(s["properties"]["code"]["const"], code, "Error_{code}");
        assert!(s["description"].as_str().is_some_and(|d| d.len() > 20), "Error_{code}");
    }
    assert_eq!(schemas["Error"]["required"], json!(["error", "code"]));
}
