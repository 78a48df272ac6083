//! `mcp`: the MCP tools on stdio, as a client of a running router (no database access).

use clap::Args;

#[derive(Debug, Args)]
pub struct McpArgs {
    /// Base URL of the running router.
    #[arg(long, env = "X402_ROUTER_URL", default_value = "http://127.0.0.1:8080")]
    pub router_url: String,
    /// The agent's API key (`x4r_…`).
    #[arg(long, env = "X402_ROUTER_AGENT_KEY", hide_env_values = true)]
    pub agent_key: Option<String>,
    /// Longest a `fetch` waits before answering that the call goes on (with its
    /// idempotency_key to collect it), in seconds, 1–3600: MCP clients time tool calls out.
    #[arg(long, env = "MCP_FETCH_WAIT_SECONDS", default_value = "20")]
    pub mcp_fetch_wait_seconds: String,
}

/// `mcp`: the MCP tools on stdio for the router at `X402_ROUTER_URL`, as the agent of
/// `X402_ROUTER_AGENT_KEY`. Logs go to stderr (stdout is the protocol).
///
/// # Errors
/// A missing or malformed setting, or the MCP session failing.
pub async fn run(args: &McpArgs) -> anyhow::Result<()> {
    crate::telemetry::init(false);
    let mut base = url::Url::parse(&args.router_url)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .ok_or_else(|| anyhow::anyhow!("X402_ROUTER_URL must be an http(s) URL, got {:?}", args.router_url))?;
    if !base.path().ends_with('/') {
        let path = format!("{}/", base.path());
        base.set_path(&path);
    }
    let key = args
        .agent_key
        .clone()
        .filter(|k| k.starts_with(crate::auth::KEY_PREFIX))
        .ok_or_else(|| anyhow::anyhow!("X402_ROUTER_AGENT_KEY must be set to an agent key (x4r_…)"))?;
    let wait = crate::config::parse_mcp_wait(&args.mcp_fetch_wait_seconds)?;
    crate::mcp::serve_stdio(base, key, wait).await
}
