//! Agent API keys, and the operator extractors ([`operator`]: `Viewer`, `Admin`).
//!
//! Keys look like `x4r_<43 base64url chars>` (256 random bits) so secret scanners can
//! spot leaked ones. Only their sha256 is stored. An agent's identity comes only from
//! its key: every query in the service filters by the authenticated agent id.
//!
//! Enabled agents are cached in-process for [`cache::TTL`] (1 s): a disabled agent is
//! refused at most that long after `agents disable` (see [`cache`]).

pub mod agents;
pub mod cache;
pub mod operator;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, web};
use uuid::Uuid;

pub use cache::AgentCache;

use crate::error::{ApiError, PoolConn};
use crate::state::AppState;

pub use crate::keys::{KEY_PREFIX, generate_api_key, hash_api_key};

/// The agent behind a request's `Authorization: Bearer` key.
#[derive(Debug, Clone)]
pub struct AuthenticatedAgent {
    pub id: Uuid,
    /// The sha256 of the key (hex): a call reserves a payment only while it is still the
    /// agent's key (a rotated key's calls in flight reserve nothing new).
    pub key_hash: String,
}

pub(crate) fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get(actix_web::http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
}

impl FromRequest for AuthenticatedAgent {
    type Error = ApiError;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let state = req.app_data::<web::Data<AppState>>().cloned();
        let cache = req.app_data::<web::Data<AgentCache>>().cloned();
        let token = bearer(req).map(str::to_owned);
        Box::pin(async move {
            let state = state.ok_or_else(|| ApiError::Internal(anyhow::anyhow!("app state missing")))?;
            let token = token.ok_or(ApiError::Unauthorized)?;
            if !token.starts_with(KEY_PREFIX) || token.len() > 200 {
                return Err(ApiError::Unauthorized);
            }
            let key_hash = hash_api_key(&token);
            if let Some(id) = cache.as_ref().and_then(|c| c.get(&key_hash)) {
                // Postgres stays the judge of availability: the cache answers only while the
                // pool can hand out a live connection (no query; 503 without Postgres, as
                // without the cache).
                drop(state.conn().await?);
                return Ok(AuthenticatedAgent { id, key_hash });
            }
            let mut conn = state.conn().await?;
            let found = agents::find_by_key_hash(&mut conn, &key_hash).await.map_err(ApiError::database)?;
            match found {
                None => Err(ApiError::Unauthorized),
                Some(a) if a.disabled => Err(ApiError::Forbidden),
                Some(a) => {
                    if let Some(c) = &cache {
                        c.insert_enabled(key_hash.clone(), a.id);
                    }
                    Ok(AuthenticatedAgent { id: a.id, key_hash })
                }
            }
        })
    }
}

pub use operator::{Admin, Viewer};

pub use crate::operators::Actor;

/// Any operator (an operator token of either role, or `OPERATOR_TOKEN`): the old name of
/// [`Viewer`].
pub type Operator = Viewer;
