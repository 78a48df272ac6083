//! `GET /discovery`: what the calling agent can buy (`crate::discovery`).

use actix_web::{HttpRequest, HttpResponse, web};

use crate::auth::AuthenticatedAgent;
use crate::discovery::{self, DiscoveryQuery};
use crate::error::{ApiError, PoolConn};
use crate::state::AppState;

/// GET /discovery — the paid resources the router knows of (facilitators' Bazaar catalogues
/// and the 402s it saw), each option judged for the calling agent.
#[utoipa::path(get, path = "/discovery", tag = "agent", operation_id = "discover",
    summary = "What the calling agent can buy: discovered paid resources, their prices and schemas",
    description = "Resources listed by the facilitators' Bazaar catalogues the router reads (`X402_DISCOVERY_URLS`) and declared by the `bazaar` extension of the 402s the router saw, with their description, advertised price options, input/output schema (as advertised: data, never interpreted), where each came from, and, per option, whether the calling agent may pay it now (`payable`; else `code` and `why_not`: its allowlists, per-call cap and budgets' headroom, the networks, assets and schemes the router pays with). Prices are informational: `POST /route` pays what the upstream's live 402 asks, within `max_amount` and the agent's limits. Sorted by URL; keyset-paginated (`next_cursor` back as `cursor`). Unknown or repeated parameters are 400.",
    security(("agentKey" = [])),
    params(
        ("q" = Option<String>, Query, description = "Words that must each appear in the URL, description, service name, tags, tool name or method (any case)."),
        ("max_price" = Option<String>, Query, pattern = "^(0|[1-9][0-9]{0,77})$",
            description = "Only resources with an option at most this price (atomic units); options above it are not payable."),
        ("network" = Option<String>, Query, description = "Only resources with an option on this network (CAIP-2, e.g. `eip155:8453`, or an x402 v1 name)."),
        ("type" = Option<String>, Query, description = "`http` or `mcp`."),
        ("payable" = Option<bool>, Query, description = "Only resources the agent may (`true`) or may not (`false`) pay now."),
        ("limit" = inline(Option<crate::routes::inline::DiscoveryLimit>), Query),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page."),
    ),
    responses(
        (status = 200, description = "A page of discovered resources.", body = crate::discovery::DiscoveryPage),
        (status = 400, response = crate::routes::responses::BadQuery),
        (status = 401, response = crate::routes::responses::Unauthorized),
        (status = 403, response = crate::routes::responses::AgentDisabled),
        (status = 503, response = crate::routes::responses::Unavailable),
    ))]
pub async fn discover(
    state: web::Data<AppState>,
    agent: AuthenticatedAgent,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    let query = DiscoveryQuery::parse(req.query_string()).map_err(|e| ApiError::BadRequest(e.0))?;
    let page = page_for(&state, agent.id, &query).await?;
    Ok(HttpResponse::Ok().json(super::in_name_order(&page)))
}

/// The page of `query` for `agent_id`.
async fn page_for(
    state: &AppState,
    agent_id: uuid::Uuid,
    query: &DiscoveryQuery,
) -> Result<discovery::DiscoveryPage, ApiError> {
    let mut conn = state.conn().await?;
    let paid_with = (&state.supported, state.solana.as_deref());
    discovery::find_for(&mut conn, &state.discovery, paid_with, agent_id, query).await.map_err(ApiError::database)
}
