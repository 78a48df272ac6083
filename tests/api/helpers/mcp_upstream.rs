//! The paid MCP server of the tests (tests/mcp-upstream/server.mjs, started through
//! scripts/mcp-upstream): the official MCP SDK whose tools charge with x402 over MCP, settled by
//! the official x402 facilitator in its process on a [`Devnet`]'s chain and token. Killed when
//! dropped.

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::chain::{Devnet, PAY_TO, PRICE};

pub struct McpUpstream {
    /// Base URL (`http://127.0.0.1:PORT`); the SDK's endpoint is `/mcp`, the hostile ones
    /// `/hostile/<mode>`.
    pub base: String,
    _child: Child,
}

impl McpUpstream {
    /// Starts it on `chain` (payTo [`PAY_TO`], price [`PRICE`]); installs its pinned packages
    /// the first time (npm ci), hence the long limit.
    pub async fn start(chain: &Devnet) -> Self {
        let script = format!("{}/scripts/mcp-upstream", env!("CARGO_MANIFEST_DIR"));
        let mut child = Command::new(script)
            .args(["--rpc-url", &chain.rpc_url, "--chain-id", &chain.chain_id.to_string()])
            .args(["--token", &chain.token.to_string(), "--pay-to", &PAY_TO.to_string()])
            .args(["--price", &PRICE.to_string()])
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("TEST_LOG").is_some() { Stdio::inherit() } else { Stdio::null() })
            .kill_on_drop(true)
            .spawn()
            .expect("scripts/mcp-upstream (needs node and npm)");
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(240), lines.next_line())
            .await
            .expect("the MCP upstream did not get ready in time")
            .unwrap()
            .expect("the MCP upstream exited before it was ready");
        let ready: Value = serde_json::from_str(&first).unwrap();
        let base = ready["url"].as_str().unwrap().to_owned();
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { base, _child: child }
    }

    /// The SDK server's MCP endpoint.
    pub fn endpoint(&self) -> String {
        format!("{}/mcp", self.base)
    }

    /// A hostile endpoint (see the server's header).
    pub fn hostile(&self, mode: &str) -> String {
        format!("{}/hostile/{mode}", self.base)
    }

    /// `{"executions": {tool: n}, "settlements": n}`.
    pub async fn stats(&self) -> Value {
        reqwest::get(format!("{}/_stats", self.base)).await.unwrap().json().await.unwrap()
    }
}
