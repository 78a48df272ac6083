//! THE route table. Handlers only adapt HTTP: extract, call a feature module, map.

mod health;
mod receipts;
mod route;

use actix_web::http::StatusCode;
use actix_web::web;

use crate::error::json_error;

/// Registers every endpoint.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/route", web::post().to(route::route))
        .route("/receipts/{id}", web::get().to(receipts::get_own))
        .route("/healthz", web::get().to(health::healthz))
        .route("/readyz", web::get().to(health::readyz))
        .route("/metrics", web::get().to(health::metrics))
        .route(
            "/.well-known/x402-router",
            web::get().to(health::well_known),
        )
        .default_service(web::to(not_found));
}

async fn not_found() -> actix_web::HttpResponse {
    json_error(StatusCode::NOT_FOUND, "not found")
}
