//! The operator extractors: [`Viewer`] (any live operator token, or the bootstrap
//! `OPERATOR_TOKEN`) and [`Admin`] (the admin role only). Both carry the [`Actor`] that
//! [`crate::operators::events::record`] writes down.
//!
//! - no or an unknown/revoked token: 401 `unauthorized`;
//! - an agent key (`x4r_…`): 403 `operator_only`;
//! - a viewer token on an admin endpoint: 403 `operator_only` ("this needs an admin operator
//!   token");
//! - an address with too many failed authentications (the three above but the last):
//!   429 `auth_throttled` with `Retry-After`, before the token is looked up
//!   ([`crate::auth_throttle`]).

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, web};
use subtle::ConstantTimeEq;

use crate::error::{ApiError, PoolConn};
use crate::operators::{Actor, BOOTSTRAP_NAME, Role, TOKEN_PREFIX, hash_token, store};
use crate::state::AppState;

/// Any operator (viewer or admin).
#[derive(Debug, Clone)]
pub struct Viewer {
    pub actor: Actor,
}

/// An admin operator.
#[derive(Debug, Clone)]
pub struct Admin {
    pub actor: Actor,
}

/// Longest token looked up (a real one is 47 characters).
const MAX_TOKEN_LEN: usize = 200;

/// Authenticates the request's bearer token as an operator, unless its address failed too
/// often (`auth_throttle`: 429 before anything is looked up). Failures are counted for the
/// address and in `x402_router_operator_auth_failures_total{reason}`.
async fn authenticate(
    state: Option<web::Data<AppState>>,
    token: Option<String>,
    peer: Option<IpAddr>,
) -> Result<Actor, ApiError> {
    let state = state.ok_or_else(|| ApiError::Internal(anyhow::anyhow!("app state missing")))?;
    let attempt = state.operator_auth.begin(peer).map_err(|t| {
        state.metrics.operator_auth_throttled.inc();
        ApiError::AuthThrottled { retry_after: t.retry_after }
    })?;
    let missing = token.is_none();
    let result = check(&state, token, peer.map(|ip| ip.to_string())).await;
    let reason = match &result {
        Err(ApiError::Unauthorized) if missing => "missing",
        Err(ApiError::Unauthorized) => "unknown",
        Err(ApiError::OperatorOnly) => "agent_key",
        // A success, or Postgres unavailable: nothing was refused.
        _ => return result,
    };
    state.metrics.operator_auth_failures.with_label_values(&[reason]).inc();
    if attempt.failed() {
        tracing::warn!(
            client.address = peer.map(|ip| ip.to_string()).unwrap_or_default(),
            "too many failed operator authentications: the address is refused until its window ends"
        );
    }
    result
}

/// The token's operator: the bootstrap `OPERATOR_TOKEN` (compared in constant time) or a live
/// operator row.
async fn check(state: &AppState, token: Option<String>, remote_addr: Option<String>) -> Result<Actor, ApiError> {
    let token = token.ok_or(ApiError::Unauthorized)?;
    if let Some(expected) = state.config.operator_token.as_ref()
        && bool::from(token.as_bytes().ct_eq(expected.expose().as_bytes()))
    {
        return Ok(Actor { operator_id: None, name: BOOTSTRAP_NAME.into(), role: Role::Admin, remote_addr });
    }
    // An agent key is a valid credential, but not for this surface.
    if token.starts_with(super::KEY_PREFIX) {
        return Err(ApiError::OperatorOnly);
    }
    if !token.starts_with(TOKEN_PREFIX) || token.len() > MAX_TOKEN_LEN {
        return Err(ApiError::Unauthorized);
    }
    let mut conn = state.conn().await?;
    let found = store::find_by_hash(&mut conn, &hash_token(&token)).await.map_err(ApiError::database)?;
    let op = found.ok_or(ApiError::Unauthorized)?;
    let role = Role::parse(&op.role)
        .ok_or_else(|| ApiError::Internal(anyhow::anyhow!("operator {} has an unknown role", op.id)))?;
    Ok(Actor { operator_id: Some(op.id), name: op.name, role, remote_addr })
}

fn parts(req: &HttpRequest) -> (Option<web::Data<AppState>>, Option<String>, Option<IpAddr>) {
    (
        req.app_data::<web::Data<AppState>>().cloned(),
        super::bearer(req).map(str::to_owned),
        req.peer_addr().map(|a| a.ip()),
    )
}

impl FromRequest for Viewer {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let (state, token, remote) = parts(req);
        Box::pin(async move { authenticate(state, token, remote).await.map(|actor| Self { actor }) })
    }
}

impl FromRequest for Admin {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let (state, token, remote) = parts(req);
        Box::pin(async move {
            let actor = authenticate(state, token, remote).await?;
            if actor.role == Role::Admin { Ok(Self { actor }) } else { Err(ApiError::AdminOnly) }
        })
    }
}
