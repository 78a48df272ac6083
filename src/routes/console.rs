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

/// Middleware: `Cache-Control: no-store` on every response that does not set its own, so that
/// no browser or proxy keeps operator or agent data (the console's own files set it too).
///
/// # Errors
/// Only those of the wrapped service.
pub async fn no_store(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    use actix_web::http::header::{CACHE_CONTROL, HeaderValue};
    let mut res = next.call(req).await?;
    if !res.headers().contains_key(CACHE_CONTROL) {
        res.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    Ok(res)
}
