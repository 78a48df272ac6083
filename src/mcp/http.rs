//! `/mcp`: MCP over streamable HTTP on the service, behind the agent's bearer key.
//!
//! rmcp's streamable-HTTP server is a tower service over `http` 1.x types; actix-web is not
//! tower-based, so this handler adapts: it authenticates the agent (401/403 like every agent
//! endpoint), copies the request into an `http::Request` carrying [`McpAgent`] in its
//! extensions, lets rmcp handle the JSON-RPC (sessions, SSE, protocol versions), and
//! streams rmcp's response back. The tools run in-process ([`Backend::Local`]): no HTTP
//! round trip to ourselves.
//!
//! Sessions (`Mcp-Session-Id`) live in the memory of the router process that created them,
//! so behind a load balancer `/mcp` needs session affinity (or use `x402-router mcp`, the
//! stdio server, which talks to any router). Host validation is left to the deployment
//! (the endpoint needs a bearer key, so DNS rebinding gains nothing).
//!
//! A session belongs to the agent that opened it ([`Owners`]): a request naming another
//! agent's session id gets 404, as an unknown one does, and never reaches the session.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::tower::{StreamableHttpServerConfig, StreamableHttpService};

use super::backend::Backend;
use super::{McpAgent, RouterTools};
use crate::auth::AuthenticatedAgent;
use crate::error::ApiError;
use crate::state::AppState;

/// The process's one MCP HTTP service (its sessions are shared by every worker).
#[derive(Clone)]
pub struct McpEndpoint {
    service: Arc<StreamableHttpService<RouterTools, LocalSessionManager>>,
    sessions: Arc<LocalSessionManager>,
    owners: Arc<Owners>,
}

/// The agent that opened each live session. An entry is added when an `initialize` answer
/// names a new session, removed when its owner ends it, and dropped once the session
/// manager no longer has the session (pruned whenever a session is opened).
#[derive(Default)]
struct Owners(Mutex<HashMap<String, uuid::Uuid>>);

impl Owners {
    /// Whether `agent` may use session `id`: its owner, or nobody's (then rmcp answers an
    /// unknown session itself).
    fn allows(&self, id: &str, agent: uuid::Uuid) -> bool {
        self.0.lock().is_ok_and(|m| m.get(id).is_none_or(|owner| *owner == agent))
    }

    /// Records `agent` as the owner of `id`, forgetting sessions not in `live` (when known).
    fn open(&self, id: String, agent: uuid::Uuid, live: Option<HashSet<String>>) {
        if let Ok(mut m) = self.0.lock() {
            if let Some(live) = live {
                m.retain(|k, _| live.contains(k));
            }
            m.insert(id, agent);
        }
    }

    fn end(&self, id: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(id);
        }
    }
}

impl McpEndpoint {
    /// Tools backed by this process's state.
    pub fn new(state: AppState) -> Self {
        let tools = RouterTools::new(Backend::Local(Box::new(state.clone())), state.config.mcp_fetch_wait);
        let config = StreamableHttpServerConfig::default().disable_allowed_hosts().with_json_response(true);
        let sessions = Arc::new(LocalSessionManager::default());
        let service = StreamableHttpService::new(move || Ok(tools.clone()), Arc::clone(&sessions), config);
        Self { service: Arc::new(service), sessions, owners: Arc::default() }
    }

    /// The sessions the session manager holds (`None` when its table is busy: a
    /// non-blocking look, pruning waits for the next session).
    fn live(&self) -> Option<HashSet<String>> {
        self.sessions.sessions.try_read().ok().map(|m| m.keys().map(|k| k.to_string()).collect())
    }
}

/// POST|GET|DELETE /mcp — the MCP streamable-HTTP endpoint (bearer agent key).
pub async fn mcp(
    endpoint: web::Data<McpEndpoint>,
    agent: AuthenticatedAgent,
    req: HttpRequest,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let mut builder = ::http::Request::builder().method(req.method().as_str()).uri(req.uri().to_string());
    for (name, value) in req.headers() {
        builder = builder.header(name.as_str(), value.as_bytes());
    }
    let session = req.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()).map(str::to_owned);
    if let Some(id) = &session
        && !endpoint.owners.allows(id, agent.id)
    {
        return Err(ApiError::NotFound);
    }
    let mut request = builder.body(Full::new(body)).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    request.extensions_mut().insert(McpAgent { id: agent.id, credential: agent.key_hash });
    let ending = req.method() == actix_web::http::Method::DELETE;
    let response = endpoint.service.handle(request).await;
    let (parts, body) = response.into_parts();
    match (&session, parts.headers.get("mcp-session-id").and_then(|v| v.to_str().ok())) {
        (None, Some(opened)) => endpoint.owners.open(opened.to_owned(), agent.id, endpoint.live()),
        (Some(id), _) if ending && parts.status.is_success() => endpoint.owners.end(id),
        _ => {}
    }
    let status = StatusCode::from_u16(parts.status.as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut out = HttpResponse::build(status);
    for (name, value) in &parts.headers {
        // actix frames the streamed body itself.
        if name != ::http::header::CONTENT_LENGTH && name != ::http::header::TRANSFER_ENCODING {
            out.append_header((name.as_str(), value.as_bytes()));
        }
    }
    let stream = body.into_data_stream().map(|chunk| chunk.map_err(|never| match never {}));
    Ok(out.streaming::<_, std::convert::Infallible>(stream))
}
