//! The three operations of `/mcp`: one handler ([`crate::mcp::http::mcp`]) serves them, so
//! each is described on a function of its own here that only the document uses.

#![allow(dead_code, reason = "the functions only carry #[utoipa::path]; crate::mcp::http::mcp serves /mcp")]

use crate::routes::inline::JsonObject;
use crate::routes::responses::{AgentDisabled, Unauthorized, Unavailable};

/// What the three operations say (MCP over streamable HTTP).
macro_rules! mcp {
    ($($method:ident $name:ident $id:literal $summary:literal;)*) => {$(
        #[utoipa::path($method, path = "/mcp", tag = "agent", operation_id = $id, summary = $summary,
            description = "MCP (Model Context Protocol) over streamable HTTP, served by the official Rust SDK (rmcp): JSON-RPC requests by POST (answered as JSON, or as an SSE stream when the server sends messages first), GET for the session's SSE stream, DELETE to end a session (`Mcp-Session-Id`). Tools: `fetch` (url, method, headers, body, max_amount, idempotency_key), `get_receipt`, `get_budget`; the agent is the bearer key's. Sessions live in one router process: behind a load balancer use session affinity.",
            security(("agentKey" = [])),
            responses(
                (status = 200, description = "A JSON-RPC answer (`application/json`) or an SSE stream (`text/event-stream`).",
                    content((inline(JsonObject) = "application/json"), (String = "text/event-stream"))),
                (status = 202, description = "A notification or response was accepted."),
                (status = 400, description = "Not a valid MCP message or session (rmcp's own body)."),
                (status = 401, response = Unauthorized),
                (status = 403, response = AgentDisabled),
                (status = 503, response = Unavailable),
            ))]
        pub fn $name() {}
    )*};
}

mcp! {
    post post "mcpPost" "Send an MCP JSON-RPC message";
    get get "mcpGet" "Open the session's server-to-client SSE stream";
    delete delete "mcpDelete" "End an MCP session";
}
