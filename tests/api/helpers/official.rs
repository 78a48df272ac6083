//! The official x402 packages as real processes (interop/, `@x402/*` pinned): the facilitator
//! (interop/facilitator.mjs) and the resource server (interop/server.mjs) on a test's chain.
//! Needs `npm ci` in interop/ (scripts/interop runs it).

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::Devnet;

/// The official facilitator and server, killed when dropped.
pub struct Official {
    /// The server's base URL.
    pub server: String,
    pub facilitator: String,
    _facilitator: Child,
    _server: Child,
}

fn interop_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("interop")
}

/// Starts `node interop/<script> <args>` and waits for its first line, a `{"ready": …}` object.
async fn start(script: &str, args: &[&str]) -> (Child, Value) {
    let dir = interop_dir();
    assert!(dir.join("node_modules/@x402/evm").is_dir(), "run `npm ci` in interop/ first (scripts/interop does)");
    let mut child = Command::new("node")
        .arg(dir.join(script))
        .args(args)
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(if std::env::var_os("TEST_LOG").is_some() { Stdio::inherit() } else { Stdio::null() })
        .kill_on_drop(true)
        .spawn()
        .expect("start node");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let ready = loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{script} did not get ready"))
            .unwrap()
            .unwrap_or_else(|| panic!("{script} exited"));
        if let Ok(v) = serde_json::from_str::<Value>(&line)
            && v.get("ready").is_some()
        {
            break v;
        }
    };
    // Keep draining stdout so the process never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, ready)
}

impl Official {
    pub async fn start(chain: &Devnet) -> Self {
        let (facilitator, ready) = start("facilitator.mjs", &["--rpc-url", &chain.rpc_url, "--port", "0"]).await;
        let facilitator_url = ready["url"].as_str().unwrap().to_owned();
        let token = chain.token.to_string();
        let (server, ready) =
            start("server.mjs", &["--token", &token, "--facilitator-url", &facilitator_url, "--port", "0"]).await;
        let server_url = ready["url"].as_str().unwrap().to_owned();
        Self { server: server_url, facilitator: facilitator_url, _facilitator: facilitator, _server: server }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server)
    }

    /// The server's channel records (`GET /_batch/channels`).
    pub async fn channels(&self) -> Value {
        reqwest::get(self.url("/_batch/channels")).await.unwrap().json().await.unwrap()
    }

    /// The server claims and settles the vouchers it holds (`POST /_batch/claim-settle`).
    pub async fn claim_and_settle(&self) -> Value {
        let r = reqwest::Client::new().post(self.url("/_batch/claim-settle")).send().await.unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert!(status.is_success(), "claim-settle: {status} {body}");
        body
    }
}
