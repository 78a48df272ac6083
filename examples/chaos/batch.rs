//! The batch-settlement side of a chaos run (issue 40): the official x402 facilitator and
//! resource server (interop/, `@x402/*` pinned) on the run's chain, whose GET /v2/batch the
//! routers pay with vouchers over payment channels (`X402_SCHEMES=batch-settlement`). At the
//! end the server claims and settles, and `x402_router_testkit::invariants::batch` checks the
//! channels against the ledger, every voucher the server was sent (its log) and the chain.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use x402_router_testkit::invariants::batch;
use x402_router_testkit::wait::wait_for_every;

/// /v2/batch's receiver (interop/server.mjs: anvil's dev account #5) and price.
pub const PAY_TO: &str = "0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc";
pub const PRICE: &str = "1000";
/// The facilitator's gas payer: anvil's dev account #6 (public test key), since #0 is the test
/// upstream's, and two senders of one account would race for its nonces.
const GAS_PAYER_KEY: &str = "0x92db14e403b83dfe3df233f83dfa3a0d7096f21ca9b0d6d6b8d88b2b4ec1564e";

/// The official facilitator and server, killed when dropped; the server's log (one JSON line per
/// paid request, the payment decoded) is kept in the run's directory.
pub struct Official {
    pub port: u16,
    log: PathBuf,
    _facilitator: Child,
    _server: Child,
}

/// Starts `node <interop>/<script> <args>`, waits for its `{"ready": …}` line, then copies the
/// rest of its stdout to `log`.
async fn start(interop: &Path, script: &str, args: &[&str], log: &Path) -> anyhow::Result<(Child, Value)> {
    anyhow::ensure!(interop.join("node_modules/@x402/evm").is_dir(), "run `npm ci` in interop/ first");
    let mut child = Command::new("node")
        .arg(interop.join(script))
        .args(args)
        .current_dir(interop)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log.with_extension("stderr"))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start node {script}"))?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let ready = loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .with_context(|| format!("{script} did not get ready"))??
            .with_context(|| format!("{script} exited"))?;
        if let Ok(v) = serde_json::from_str::<Value>(&line)
            && v.get("ready").is_some()
        {
            break v;
        }
    };
    let mut out = tokio::fs::File::create(log).await?;
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            let _ = out.write_all(line.as_bytes()).await;
            let _ = out.write_all(b"\n").await;
            let _ = out.flush().await;
        }
    });
    Ok((child, ready))
}

fn port_of(ready: &Value) -> anyhow::Result<u16> {
    let url = ready["url"].as_str().context("no url")?;
    Ok(url.rsplit(':').next().context("no port")?.parse()?)
}

impl Official {
    pub async fn start(interop: &Path, rpc: &str, token: &str, run_dir: &Path) -> anyhow::Result<Self> {
        let (facilitator, ready) = start(
            interop,
            "facilitator.mjs",
            &["--rpc-url", rpc, "--port", "0", "--gas-payer-key", GAS_PAYER_KEY],
            &run_dir.join("facilitator.log"),
        )
        .await?;
        let facilitator_url = ready["url"].as_str().context("facilitator url")?.to_owned();
        let log = run_dir.join("batch-server.log");
        let (server, ready) = start(
            interop,
            "server.mjs",
            &["--token", token, "--facilitator-url", &facilitator_url, "--port", "0"],
            &log,
        )
        .await?;
        Ok(Self { port: port_of(&ready)?, log, _facilitator: facilitator, _server: server })
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Every voucher the server was sent on /v2/batch: (channel id, maxClaimableAmount).
    fn vouchers_seen(&self) -> anyhow::Result<Vec<(String, String)>> {
        let text = std::fs::read_to_string(&self.log)?;
        let mut out = Vec::new();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
            if !v["request"]["url"].as_str().is_some_and(|u| u.starts_with("/v2/batch")) {
                continue;
            }
            let voucher = &v["request"]["payment-signature (decoded)"]["payload"]["voucher"];
            if let (Some(c), Some(m)) = (voucher["channelId"].as_str(), voucher["maxClaimableAmount"].as_str()) {
                out.push((c.to_owned(), m.to_owned()));
            }
        }
        Ok(out)
    }

    /// The server claims and settles what it holds (retried: the chain was faulty a moment
    /// ago), then every batch invariant is checked. Returns the figures and the violations.
    pub async fn settle_and_check(
        &self,
        client: &reqwest::Client,
        (database_url, rpc_url, token): (&str, &str, &str),
    ) -> anyhow::Result<(Value, Vec<String>)> {
        let claim = wait_for_every(Duration::from_secs(60), Duration::from_millis(500), "the claim", || async move {
            let r = client.post(self.url("/_batch/claim-settle")).send().await.ok()?;
            if r.status().is_success() { r.json::<Value>().await.ok() } else { None }
        })
        .await;
        let mut violations = Vec::new();
        let claim = claim.unwrap_or_else(|e| {
            violations.push(format!("the batch server could not claim and settle: {e}"));
            Value::Null
        });
        let channels: Value = client.get(self.url("/_batch/channels")).send().await?.json().await?;
        let channels = channels.as_array().cloned().unwrap_or_default();
        let mut vouchers = self.vouchers_seen()?;
        // The highest voucher the server holds per channel, too.
        for c in &channels {
            if let (Some(id), Some(m)) = (c["channelId"].as_str(), c["signedMaxClaimable"].as_str()) {
                vouchers.push((id.to_owned(), m.to_owned()));
            }
        }
        let report = batch::check(&batch::Target {
            database_url,
            rpc_url,
            token: token.parse()?,
            payee: PAY_TO.parse()?,
            channels: &channels,
            vouchers: &vouchers,
        })
        .await?;
        violations.extend(report.violations.iter().cloned());
        let claims = claim.get("claims").map_or(0, |c| c.as_array().map_or(1, Vec::len));
        Ok((json!({"report": report, "channels": channels.len(), "claims": claims}), violations))
    }
}
