//! The error contract: a stable `code` in every error body, documented per code.

use serde_json::{Value, json};
use x402_router::codes::Code;

use crate::helpers::*;

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

#[actix_web::test]
async fn errors_are_plain_json_by_default_and_problem_json_on_request() {
    let app = spawn_app().await;
    let url = format!("{}/receipts/{}", app.address, uuid::Uuid::new_v4());
    let plain = app.client.get(&url).bearer_auth(&app.agent.key).send().await.unwrap();
    assert_eq!(plain.status(), 404);
    assert!(plain.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    assert_eq!(plain.json::<Value>().await.unwrap(), json!({"error": "not found", "code": "not_found"}));

    let problem = app
        .client
        .get(&url)
        .bearer_auth(&app.agent.key)
        .header("accept", "application/problem+json, application/json;q=0.5")
        .send()
        .await
        .unwrap();
    assert_eq!(problem.status(), 404);
    assert_eq!(problem.headers()["content-type"], "application/problem+json");
    let doc: Value = problem.json().await.unwrap();
    assert_eq!(doc["type"], "urn:x402-router:error:not_found");
    assert_eq!((doc["title"].as_str(), doc["status"].as_u64()), (Some("not found"), Some(404)));
    assert_eq!(doc["code"], "not_found");
}
