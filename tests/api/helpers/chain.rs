//! A private local chain per test: anvil, the project's EIP-3009 test token, and the
//! project's x402 test upstream (`x402-test-upstream`), all real processes on loopback.

use std::process::Stdio;
use std::str::FromStr;
use std::time::Duration;

use alloy::primitives::{Address, B256, U256, address};
use alloy::providers::{ProviderBuilder, RootProvider};
use alloy::sol;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use serde_json::json;

use super::app::{ROUTER_KEY, TestApp, exec, free_port, insert_in_flight};

sol! {
    #[sol(rpc)]
    interface ITestToken {
        function balanceOf(address who) external view returns (uint256);
        function authorizationState(address authorizer, bytes32 nonce) external view returns (bool);
        function allowance(address owner, address spender) external view returns (uint256);
        event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
    }
}

/// anvil #0: deployer and facilitator (pays gas).
pub const FACILITATOR_KEY: &str = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";
/// anvil #5 to #9: facilitators of further test upstreams on one chain ([`Devnet::upstream_of`]),
/// one each, so that no two processes send transactions from one account (nonce races).
const MORE_FACILITATOR_KEYS: [&str; 5] = [
    "0x8b3a350cf5c34c9194ca85829a2df0ec3153be0318b5e2d3348e872092edffba",
    "0x92db14e403b83dfe3df233f83dfa3a0d7096f21ca9b0d6d6b8d88b2b4ec1564e",
    "0x4bbbf85ce3377467afe5d46f804f221813b2bb87f24d81f60f1fcdbf7cbf4356",
    "0xdbda1821b80551c9d65939329250298aa3472ba22feea921c0cf5d620ea67b97",
    "0x2a871d0798f97d79848a013d4936a73bf4cc922c825d33c1cf7073dff6d409c6",
];
/// anvil #1: the router's wallet in tests (see `ROUTER_KEY`).
pub const ROUTER_ADDRESS: Address = address!("0x70997970C51812dc3A010C7d01b50e0d17dc79C8");
/// anvil #2: the upstream's payTo.
pub const PAY_TO: Address = address!("0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC");
/// The price of the test upstream's routes (0.01 USDC).
pub const PRICE: u64 = 10_000;

fn anvil_bin() -> String {
    std::env::var("ANVIL_BIN").unwrap_or_else(|_| {
        format!("{}/tools/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil", env!("CARGO_MANIFEST_DIR"))
    })
}

/// A bare anvil (no token, no upstream) on a chain id of the test's choosing, killed when
/// dropped: an RPC URL that serves another chain.
pub struct BareAnvil {
    pub rpc_url: String,
    _child: Child,
}

impl BareAnvil {
    pub async fn start(chain_id: u64) -> Self {
        let (child, rpc_url, _) = start_anvil(chain_id, Duration::from_secs(10)).await;
        Self { rpc_url, _child: child }
    }
}

/// Starts anvil on a free port with `chain_id` and waits (at most `limit`) until it answers:
/// the process (killed when dropped), its RPC URL and a provider on it.
async fn start_anvil(chain_id: u64, limit: Duration) -> (Child, String, RootProvider) {
    let port = free_port();
    let mut child = Command::new(anvil_bin())
        .args(["--port", &port.to_string(), "--host", "127.0.0.1", "--chain-id", &chain_id.to_string()])
        .arg("--silent")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start anvil (run scripts/install-tools, or set ANVIL_BIN)");
    let rpc_url = format!("http://127.0.0.1:{port}");
    let provider = ProviderBuilder::new().disable_recommended_fillers().connect_http(rpc_url.parse().unwrap());
    let up = x402_router_testkit::wait_until(limit, "anvil to answer", || async {
        alloy::providers::Provider::get_chain_id(&provider).await.is_ok()
    })
    .await;
    if let Err(e) = up {
        let _ = child.kill().await;
        panic!("{e}");
    }
    (child, rpc_url, provider)
}

pub struct Devnet {
    pub rpc_url: String,
    /// The chain id anvil runs with (the router's network is `eip155:<chain_id>`).
    pub chain_id: u64,
    pub token: Address,
    /// TestToken18: TestToken with 18 decimals (the same value, 10^21, minted to the router).
    pub token18: Address,
    /// PlainToken: an ERC-20 without EIP-3009 (1000 minted to the router, Permit2 approved).
    pub plain_token: Address,
    /// PermitToken: an ERC-20 with EIP-2612 and without EIP-3009 (1000 minted to the router,
    /// never approved for Permit2).
    pub permit_token: Address,
    /// Base URL of the x402 test upstream.
    pub upstream: String,
    anvil: Option<Child>,
    server: Option<Child>,
    provider: RootProvider,
    /// Further upstreams started ([`Devnet::upstream_of`]): picks each one's facilitator.
    more_upstreams: std::sync::atomic::AtomicUsize,
}

impl Devnet {
    /// anvil + token (1000 USDC minted to the router) + the x402 test upstream.
    pub async fn start() -> Self {
        Self::start_on(84532).await
    }

    /// [`Self::start`] on a chain of any id.
    pub async fn start_on(chain_id: u64) -> Self {
        let (anvil, rpc_url, provider) = start_anvil(chain_id, Duration::from_secs(5)).await;

        let deploy = Command::new(upstream_bin())
            .args(["deploy", "--rpc-url", &rpc_url, "--deployer-key", FACILITATOR_KEY])
            .arg("--mint")
            .arg(format!("{ROUTER_ADDRESS}=1000000000"))
            .args(["--approve-permit2", ROUTER_KEY])
            .output()
            .await
            .unwrap();
        assert!(deploy.status.success(), "deploy failed: {}", String::from_utf8_lossy(&deploy.stderr));
        let line: Value = serde_json::from_slice(&deploy.stdout).expect("deploy prints one JSON line");
        let token = Address::from_str(line["token"].as_str().unwrap()).unwrap();
        let token18 = Address::from_str(line["token18"].as_str().unwrap()).unwrap();
        let plain_token = Address::from_str(line["plain_token"].as_str().unwrap()).unwrap();
        let permit_token = Address::from_str(line["permit_token"].as_str().unwrap()).unwrap();

        let extra = [
            "--plain-token".to_owned(),
            plain_token.to_string(),
            "--permit-token".to_owned(),
            permit_token.to_string(),
            "--price".to_owned(),
            PRICE.to_string(),
        ];
        let (server, upstream) = serve_upstream(&rpc_url, chain_id, (token, FACILITATOR_KEY), &extra).await;
        Self {
            rpc_url,
            chain_id,
            token,
            token18,
            plain_token,
            permit_token,
            upstream,
            anvil: Some(anvil),
            server: Some(server),
            provider,
            more_upstreams: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Another test upstream on this chain asking `price` of `token` on every paid route
    /// (killed when dropped), settling from an account of its own (at most five per chain).
    pub async fn upstream_of(&self, token: Address, price: U256) -> SecondUpstream {
        let extra = ["--price".to_owned(), price.to_string()];
        let n = self.more_upstreams.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let key = MORE_FACILITATOR_KEYS[n];
        let (child, url) = serve_upstream(&self.rpc_url, self.chain_id, (token, key), &extra).await;
        SecondUpstream { url, _child: child }
    }

    /// Router options that pay on this chain with this token.
    pub fn router_extra(&self) -> Vec<(String, String)> {
        vec![
            ("x402-rpc-urls".into(), format!("eip155:{}={}", self.chain_id, self.rpc_url)),
            ("x402-assets".into(), format!("eip155:{}={}@6", self.chain_id, self.token)),
        ]
    }

    /// A JSON-RPC call to anvil (`evm_setAutomine`, `evm_mine`, …).
    pub async fn rpc(&self, method: &'static str, params: Value) -> Value {
        alloy::providers::Provider::raw_request::<_, Value>(&self.provider, method.into(), params).await.unwrap()
    }

    /// The token's `allowance(owner, spender)`.
    pub async fn allowance(&self, owner: Address, spender: Address) -> U256 {
        ITestToken::new(self.token, &self.provider).allowance(owner, spender).call().await.unwrap()
    }

    /// `allowance(owner, spender)` of any token.
    pub async fn allowance_in(&self, token: Address, owner: Address, spender: Address) -> U256 {
        ITestToken::new(token, &self.provider).allowance(owner, spender).call().await.unwrap()
    }

    /// The native balance (wei) of `who`.
    pub async fn eth(&self, who: Address) -> U256 {
        alloy::providers::Provider::get_balance(&self.provider, who).await.unwrap()
    }

    /// How many `AuthorizationUsed` events of `payer` the token emitted (each one moved money).
    pub async fn authorizations_used_by(&self, payer: Address) -> usize {
        let filter = alloy::rpc::types::Filter::new()
            .address(self.token)
            .event_signature(<ITestToken::AuthorizationUsed as alloy::sol_types::SolEvent>::SIGNATURE_HASH)
            .topic1(payer.into_word())
            .from_block(0u64);
        alloy::providers::Provider::get_logs(&self.provider, &filter).await.unwrap().len()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.upstream)
    }

    pub async fn balance(&self, who: Address) -> U256 {
        ITestToken::new(self.token, &self.provider).balanceOf(who).call().await.unwrap()
    }

    /// `balanceOf(who)` on any token (e.g. [`Self::plain_token`]).
    pub async fn balance_in(&self, token: Address, who: Address) -> U256 {
        ITestToken::new(token, &self.provider).balanceOf(who).call().await.unwrap()
    }

    pub async fn authorization_used(&self, payer: Address, nonce: B256) -> bool {
        ITestToken::new(self.token, &self.provider).authorizationState(payer, nonce).call().await.unwrap()
    }

    /// The upstream's counters per route path (`GET /_stats`, `routes`).
    pub async fn stats(&self) -> Value {
        let all: Value = reqwest::get(format!("{}/_stats", self.upstream)).await.unwrap().json().await.unwrap();
        all["routes"].clone()
    }

    /// Query parameters the upstream reads before every paid request's own (`POST /_defaults`;
    /// "" clears them): one exact URL changes its price, `keep`, `free` or `hold` between calls.
    pub async fn set_defaults(&self, query: &str) {
        let resp = reqwest::Client::new().post(self.url("/_defaults")).body(query.to_owned()).send().await.unwrap();
        assert_eq!(resp.status(), 204);
    }

    /// The authorizations the upstream kept and has not submitted (`GET /_kept`): `from`,
    /// `to`, `value`, `nonce` of each.
    pub async fn kept(&self) -> Vec<Value> {
        reqwest::get(self.url("/_kept")).await.unwrap().json().await.unwrap()
    }

    /// Stops anvil (the RPC goes away; the upstream stays up).
    pub async fn stop_chain(&mut self) {
        if let Some(mut a) = self.anvil.take() {
            let _ = a.kill().await;
        }
    }
}

/// A test upstream besides the devnet's own ([`Devnet::upstream_of`]).
pub struct SecondUpstream {
    pub url: String,
    _child: Child,
}

impl SecondUpstream {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }
}

/// Starts `x402-test-upstream serve` on `chain_id` asking payment in `token`, settling with
/// `facilitator`'s key, with `extra` flags: the process (killed when dropped) and its base URL,
/// once it listens.
async fn serve_upstream(
    rpc_url: &str,
    chain_id: u64,
    (token, facilitator): (Address, &str),
    extra: &[String],
) -> (Child, String) {
    let mut server = Command::new(upstream_bin())
        .args(["serve", "--bind", "127.0.0.1:0", "--rpc-url", rpc_url, "--token", &token.to_string()])
        .args(extra)
        .args([
            "--pay-to",
            &PAY_TO.to_string(),
            "--facilitator-key",
            facilitator,
            "--network",
            &format!("eip155:{chain_id}"),
            "--network-v1",
            x402_router::x402::Network::from_chain_id(chain_id).unwrap().v1_name().unwrap_or("local-test-chain"),
        ])
        .stdout(Stdio::piped())
        .stderr(if std::env::var_os("TEST_LOG").is_some() { Stdio::inherit() } else { Stdio::null() })
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = server.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await.unwrap().unwrap().unwrap();
    let listening: Value = serde_json::from_str(&first).unwrap();
    let upstream = format!("http://{}", listening["listening"].as_str().unwrap());
    // Keep draining stdout so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (server, upstream)
}

impl Drop for Devnet {
    fn drop(&mut self) {
        if let Some(s) = self.server.as_mut() {
            let _ = s.start_kill();
        }
        if let Some(a) = self.anvil.as_mut() {
            let _ = a.start_kill();
        }
    }
}

/// The EIP-3009 nonce the router (wallet `ROUTER_KEY`) uses for `body` under `(agent, key)`.
/// A router on `chain` with these settings added (flag, value).
pub async fn paid_app_with(chain: &Devnet, extra: &[(&str, &str)]) -> super::TestApp {
    let mut options = chain.router_extra();
    options.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    super::spawn_app_with(super::AppOptions { extra: options, ..Default::default() }).await
}

/// The test upstream submits every authorization its hostile routes kept (`POST
/// /_settle_kept`): `{"settled": N, "refused": [reasons]}`.
pub async fn settle_kept(chain: &Devnet) -> Value {
    reqwest::Client::new().post(chain.url("/_settle_kept")).send().await.unwrap().json().await.unwrap()
}

/// `x402-router reconcile` with no grace period on `chain`: it succeeds; its JSON report.
pub fn reconcile_now(db: &super::TestDb, chain: &Devnet) -> Value {
    let out = super::router_command()
        .arg("reconcile")
        .env("DATABASE_URL", &db.url)
        .env("X402_RPC_URLS", format!("eip155:{}={}", chain.chain_id, chain.rpc_url))
        .env("RECONCILE_OLDER_THAN_SECS", "0")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn router_nonce(agent: uuid::Uuid, key: &str, body: &Value) -> B256 {
    let signer: alloy::signers::local::PrivateKeySigner = super::app::ROUTER_KEY.parse().unwrap();
    x402_router::x402::deterministic_nonce(
        &x402_router::x402::nonce::nonce_secret(&signer),
        agent,
        key,
        &super::app::request_hash(body),
    )
}

/// Leaves the state a router would leave if it crashed after committing a signed intent
/// and before sending it: an old in-flight row plus a `signed` payment.
pub async fn crash_after_signing(app: &TestApp, chain: &Devnet, key: &str, body: &Value, valid_before_offset: i64) {
    use x402_router::x402::{Requirement, X402Version, sign_authorization, wire};
    insert_in_flight(&app.db, app.agent.id, key, body, 300).await;
    // The requirement the upstream advertises, as the crashed router saw it.
    let first = reqwest::get(chain.url("/v2/weather")).await.unwrap();
    let headers = first.headers().clone();
    let required =
        wire::parse_payment_required(reqwest::StatusCode::PAYMENT_REQUIRED, &headers, &first.bytes().await.unwrap())
            .unwrap();
    let req: &Requirement = &required.accepts[0];
    let signer: alloy::signers::local::PrivateKeySigner = ROUTER_KEY.parse().unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let signing_time = (now as i64 + valid_before_offset - req.max_timeout_seconds() as i64) as u64;
    let signed = sign_authorization(&signer, req, router_nonce(app.agent.id, key, body), signing_time, 86_400).unwrap();
    let payload = x402_router::x402::payload::payment_payload(
        X402Version::V2,
        req,
        required.resource.as_ref(),
        &signed.clone().into(),
        None,
    )
    .unwrap();
    let (name, value) = wire::encode_payment_header(X402Version::V2, &payload).unwrap();
    let auth = signed.authorization();
    // Written as the router writes an intent: the request as sent, the payment header and the
    // exact terms sealed (src/secrets/), redacted copies beside them.
    let id = uuid::Uuid::new_v4();
    let context = json!({"version": 2, "resource": required.resource, "extensions": null});
    let call = x402_router::relay::request::RouteCall::parse(body.to_string().as_bytes(), "/route", "").unwrap();
    let exact = x402_router::payments::sealed::Exact {
        request: Some(x402_router::recovery::as_sent(&call.upstream).unwrap()),
        header_value: value.to_str().unwrap().to_owned(),
        requirement_json: serde_json::to_vec(&req.raw_json()).unwrap(),
        context_json: serde_json::to_vec(&context).unwrap(),
        advertised_extensions: None,
    };
    let redaction = x402_router::secrets::Redaction::default();
    let kept = x402_router::secrets::intent::keep((&super::app::test_keyring(), &redaction), app.agent.id, id, &exact)
        .unwrap();
    exec(
        &app.db,
        &format!(
            "INSERT INTO payments (id, agent_id, idempotency_key, x402_version, scheme, network, asset, amount, pay_to, payer, nonce, \
             valid_after, valid_before, requirement, context, signed_authorization, header_name, status, request_hash, \
             request_method, request_url, sealed, sealed_key_id) VALUES \
             ('{id}', '{}', '{key}', 2, 'exact', 'eip155:84532', '{}', {PRICE}, '{}', '{}', '{}', {}, {}, '{}', '{}', '{}', '{}', 'signed', '{}', \
              '{}', '{}', '\\x{}', '{}')",
            app.agent.id,
            chain.token,
            PAY_TO,
            ROUTER_ADDRESS,
            auth.nonce,
            auth.valid_after,
            auth.valid_before,
            kept.shown.requirement,
            kept.shown.context,
            serde_json::to_value(&signed).unwrap(),
            name,
            super::app::request_hash(body),
            kept.shown.request_method.unwrap(),
            kept.shown.request_url.unwrap(),
            alloy::hex::encode(&kept.sealed.bytes),
            kept.sealed.key_id,
        ),
    )
    .await;
}

/// The `x402-test-upstream` binary: a member of the workspace (crates/x402-test-upstream), not
/// of this package, so Cargo gives no `CARGO_BIN_EXE_` for it. A plain `cargo test` or
/// `cargo build` at the root builds it (a default member) next to the router's binary. Stops
/// the test when it is missing or older than its sources rather than run a stale one.
pub fn upstream_bin() -> std::path::PathBuf {
    let router = std::path::Path::new(env!("CARGO_BIN_EXE_x402-router"));
    let bin = router.with_file_name(format!("x402-test-upstream{}", std::env::consts::EXE_SUFFIX));
    let build = "build it with `cargo build -p x402-test-upstream` (or run a plain `cargo test`)";
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("no x402-test-upstream at {}: {e}; {build}", bin.display()));
    let sources = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/x402-test-upstream");
    if let Some(newer) = newest_file(&sources).filter(|(t, _)| *t > built) {
        panic!("{} is older than {}; {build}", bin.display(), newer.1.display());
    }
    bin
}

/// The most recently modified file under `dir` (sources and manifest).
fn newest_file(dir: &std::path::Path) -> Option<(std::time::SystemTime, std::path::PathBuf)> {
    let mut newest = None;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).ok()?.flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if let Ok(t) = entry.metadata().and_then(|m| m.modified())
                && newest.as_ref().is_none_or(|(n, _)| t > *n)
            {
                newest = Some((t, path));
            }
        }
    }
    newest
}
