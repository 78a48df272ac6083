//! A local Solana chain (`testkit::solana`) with `x402-test-upstream serve-svm` over it, and
//! router settings that pay there with the chain's public test payer key.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use x402_router_testkit::Proc;
use x402_router_testkit::solana::SolanaChain;

/// The price of every serve-svm route, atomic units (the mint has 6 decimals).
pub const SVM_PRICE: u64 = 10_000;

pub struct SolanaRig {
    pub chain: SolanaChain,
    /// serve-svm's base URL.
    pub upstream: String,
    _server: Proc,
    http: reqwest::Client,
}

impl SolanaRig {
    /// A chain (`options` go to `scripts/solana-chain start`) and serve-svm over it.
    pub async fn start(options: &[&'static str]) -> Self {
        let options = options.to_vec();
        let chain = tokio::task::spawn_blocking(move || SolanaChain::start(&options)).await.unwrap().unwrap();
        let mut cmd = tokio::process::Command::new(super::chain::upstream_bin());
        cmd.arg("serve-svm")
            .args([
                "--rpc-url",
                chain.field("rpc_url"),
                "--mint",
                chain.field("mint"),
                "--pay-to",
                chain.field("pay_to"),
            ])
            .arg("--fee-payer-key")
            .arg(chain.key_file("fee_payer"))
            .args(["--price", &SVM_PRICE.to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(if std::env::var_os("TEST_LOG").is_some() {
                std::process::Stdio::inherit()
            } else {
                std::process::Stdio::null()
            });
        let mut server = Proc::spawn(&mut cmd).unwrap();
        let stdout = server.child_mut().stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await.unwrap().unwrap().unwrap();
        let listening: Value = serde_json::from_str(&first).unwrap();
        let upstream = format!("http://{}", listening["listening"].as_str().unwrap());
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Self { chain, upstream, _server: server, http: reqwest::Client::new() }
    }

    /// Router settings paying on this chain (and nowhere else) with the chain's payer key.
    pub fn router_extra(&self) -> Vec<(String, String)> {
        self.router_extra_via(self.chain.field("rpc_url"))
    }

    /// [`Self::router_extra`] with another RPC URL for the chain's network.
    pub fn router_extra_via(&self, rpc_url: &str) -> Vec<(String, String)> {
        let network = self.chain.field("network");
        vec![
            ("x402-rpc-urls".into(), format!("{network}={rpc_url}")),
            ("x402-assets".into(), format!("{network}={}@6", self.chain.field("mint"))),
            ("solana-private-key-file".into(), self.chain.key_file("payer").display().to_string()),
            // Several of these tests run two routers at once beside other tests: a small pool
            // keeps the suite under Postgres's 100 connections.
            ("database-pool-size".into(), "6".into()),
        ]
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.upstream)
    }

    /// serve-svm's `{"settled", "kept", "refused"}`.
    pub async fn stats(&self) -> Value {
        self.http.get(self.url("/_stats")).send().await.unwrap().json().await.unwrap()
    }

    /// serve-svm submits every transaction its `keep` routes kept.
    pub async fn settle_kept(&self) -> Value {
        self.http.post(self.url("/_settle_kept")).send().await.unwrap().json().await.unwrap()
    }

    /// The payer's and `pay_to`'s token balances.
    pub async fn balances(&self) -> (u64, u64) {
        self.chain.balances().await.unwrap()
    }

    /// `x402-router reconcile` with no grace period, reading this chain: its JSON report.
    pub fn reconcile(&self, db: &super::TestDb) -> Value {
        let out = super::router_command()
            .arg("reconcile")
            .env("DATABASE_URL", &db.url)
            .env("X402_RPC_URLS", format!("{}={}", self.chain.field("network"), self.chain.field("rpc_url")))
            .env("RECONCILE_OLDER_THAN_SECS", "0")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }
}
