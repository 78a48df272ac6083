//! `GET /console` and its embedded files (`crate::console`), with the console's security
//! headers. Pages only: the data comes from the operator API, behind the operator token.

use actix_web::{HttpResponse, HttpResponseBuilder, web};

use crate::console::{Asset, INDEX, SECURITY_HEADERS, asset};
use crate::error::ApiError;

fn serve(a: Asset) -> HttpResponse {
    let mut resp = HttpResponseBuilder::new(actix_web::http::StatusCode::OK);
    for (name, value) in SECURITY_HEADERS {
        resp.insert_header((*name, *value));
    }
    resp.content_type(a.content_type).body(a.body)
}

/// GET /console — the console page.
pub async fn index() -> HttpResponse {
    serve(INDEX)
}

/// GET /console/{file} — one of the page's embedded files (404 for any other name).
pub async fn file(name: web::Path<String>) -> Result<HttpResponse, ApiError> {
    asset(&name).map(serve).ok_or(ApiError::NotFound)
}
