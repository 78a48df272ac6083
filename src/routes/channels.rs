//! Batch-settlement channels over HTTP (`/admin/channels*`): the list for viewers and admins,
//! closing for admins. The domain is `crate::admin::channels`; this only extracts, calls and
//! shapes JSON.

use actix_web::{HttpResponse, web};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::admin::channels::{self, ChannelView, CloseReport};
use crate::auth::{Admin, Viewer};
use crate::error::{ApiError, PoolConn};
use crate::relay::pay::registry::channels::Closer;
use crate::routes::responses::{AdminOnly, ChainUnavailable, ForbiddenAgentKey, NotFound, Unauthorized, Unavailable};
use crate::state::AppState;

/// The body of `GET /admin/channels`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChannelList {
    /// Every batch-settlement channel (lane) the router's wallet opened, oldest first.
    pub channels: Vec<ChannelView>,
}

/// GET /admin/channels — every batch-settlement channel with its amounts and state.
#[utoipa::path(get, path = "/admin/channels", tag = "admin", operation_id = "adminListChannels",
    summary = "Batch-settlement channels",
    description = "Viewer or admin. Every channel (lane) of the router's wallet, oldest first: deposited, the highest voucher ceiling signed, charged, claimed on-chain at the last reconcile or close, refunded, state.",
    security(("operatorToken" = [])),
    responses(
        (status = 200, description = "The channels.", body = ChannelList),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 503, response = Unavailable),
    ))]
pub async fn list(state: web::Data<AppState>, _: Viewer) -> Result<HttpResponse, ApiError> {
    let mut conn = state.conn().await?;
    Ok(HttpResponse::Ok().json(ChannelList { channels: channels::list(&mut conn).await? }))
}

/// POST /admin/channels/{id}/close — the next step of closing a channel.
#[utoipa::path(post, path = "/admin/channels/{id}/close", tag = "admin", operation_id = "adminCloseChannel",
    summary = "Close a batch-settlement channel",
    description = "Admin. Marks the channel closing (no voucher is signed on it again), then does the next step that is due and answers which (`step`): a cooperative refund asked of its server over HTTP; if the server does not refund, the wallet's `initiateWithdraw`; after the channel's withdraw delay, a later call sends `finalizeWithdraw`. `busy` while a call's voucher is out on it. Each step is a `channel.*` operator event.",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The channel's lane id (not a uuid: 404).")),
    responses(
        (status = 200, description = "What was done.", body = CloseReport),
        (status = 401, response = Unauthorized),
        (status = 403, response = AdminOnly),
        (status = 404, response = NotFound),
        (status = 503, response = ChainUnavailable),
    ))]
pub async fn close(state: web::Data<AppState>, op: Admin, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    let mut conn = state.conn().await?;
    let row =
        crate::payments::channels::get(&mut conn, id).await.map_err(ApiError::database)?.ok_or(ApiError::NotFound)?;
    let network = crate::x402::Network::parse_caip2(&row.network).map_err(|_| ApiError::NotFound)?;
    let payments = &state.config.payments;
    let urls = payments.rpc_urls.get(&network).map(Vec::as_slice).unwrap_or_default();
    let closer = Closer {
        upstream: &state.upstream,
        signer: &state.config.signer,
        rpc_urls: urls,
        timeout: payments.rpc_timeout,
    };
    let report = channels::close(&mut conn, (&state.chain, &closer), &op.actor, id).await?;
    Ok(HttpResponse::Ok().json(report))
}
