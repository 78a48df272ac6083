//! A local Solana chain (`testkit::solana`) with `x402-test-upstream serve-svm` over it, and
//! router settings that pay there with the chain's public test payer key. The router is given
//! two RPC URLs of the chain, its main one and the view [`WITNESS`] (one ledger, two signature
//! indexes: a test makes one lag), as an operator gives two providers: a Solana payment is
//! signed again, or released, only when both say it can never land.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use x402_router_testkit::Proc;
use x402_router_testkit::solana::SolanaChain;

/// The price of every serve-svm route, atomic units (the mint has 6 decimals).
pub const SVM_PRICE: u64 = 10_000;

/// The chain's view that the router has as its second RPC URL (`SolanaChain::view_url`).
pub const WITNESS: &str = "witness";

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

    /// The router's RPC URLs of the chain: its main one, then the [`WITNESS`] view.
    pub fn rpc_urls(&self) -> Vec<String> {
        vec![self.chain.field("rpc_url").to_owned(), self.chain.view_url(WITNESS)]
    }

    /// Router settings paying on this chain (and nowhere else) with the chain's payer key.
    pub fn router_extra(&self) -> Vec<(String, String)> {
        self.router_extra_via(&self.rpc_urls())
    }

    /// `X402_RPC_URLS` of the chain's network with `rpc_urls` (the first is read to pay).
    pub fn rpc_urls_setting(&self, rpc_urls: &[String]) -> String {
        let network = self.chain.field("network");
        rpc_urls.iter().map(|u| format!("{network}={u}")).collect::<Vec<_>>().join(",")
    }

    /// [`Self::router_extra`] with other RPC URLs for the chain's network.
    pub fn router_extra_via(&self, rpc_urls: &[String]) -> Vec<(String, String)> {
        let network = self.chain.field("network");
        vec![
            ("x402-rpc-urls".into(), self.rpc_urls_setting(rpc_urls)),
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

    /// `x402-router reconcile` with no grace period, reading this chain at [`Self::rpc_urls`]:
    /// its JSON report (the run must succeed).
    pub fn reconcile(&self, db: &super::TestDb) -> Value {
        let (ok, report, stderr) = self.reconcile_via(db, &self.rpc_urls());
        assert!(ok, "{stderr}");
        report
    }

    /// `x402-router reconcile` with no grace period, reading this chain at `rpc_urls`: whether
    /// it succeeded, its JSON report, its stderr.
    pub fn reconcile_via(&self, db: &super::TestDb, rpc_urls: &[String]) -> (bool, Value, String) {
        let out = super::router_command()
            .arg("reconcile")
            .env("DATABASE_URL", &db.url)
            .env("X402_RPC_URLS", self.rpc_urls_setting(rpc_urls))
            .env("RECONCILE_OLDER_THAN_SECS", "0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("no report: {stderr}"));
        (out.status.success(), report, stderr)
    }
}
