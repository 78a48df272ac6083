//! The local Solana test chain (tools/solana-chain, started by `scripts/solana-chain`, which
//! installs its pinned npm packages when missing) and the official @x402/svm facilitator and
//! servers over it (`scripts/solana-official`): each owned by a test, stopped (by the pid its
//! script recorded) when dropped.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

/// The repository's root (scripts, tools).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn script(name: &str, args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new(repo_root().join("scripts").join(name)).args(args).status()?;
    if !status.success() {
        bail!("scripts/{name} {args:?} failed ({status})");
    }
    Ok(())
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str().context("a temporary path is not UTF-8")
}

/// A chain of the caller's own, in a fresh temporary directory.
pub struct SolanaChain {
    dir: PathBuf,
    state: Value,
    http: reqwest::Client,
}

impl SolanaChain {
    /// Starts a chain; `options` go to `scripts/solana-chain start` (e.g. `["--slot-ms", "0"]`:
    /// heights move only with transactions and [`Self::advance`]).
    pub fn start(options: &[&str]) -> anyhow::Result<Self> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
        let dir = std::env::temp_dir().join(format!("x402-solana-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let state_path = dir.join("chain.json");
        let mut args = vec!["start", path_str(&state_path)?];
        args.extend_from_slice(options);
        script("solana-chain", &args)?;
        let state = serde_json::from_str(&std::fs::read_to_string(&state_path)?)?;
        Ok(Self { dir, state, http: reqwest::Client::new() })
    }

    /// A string field of the chain's state (`rpc_url`, `network`, `mint`, `payer`, `payer_ata`,
    /// `pay_to`, `pay_to_ata`, `fee_payer`, …); empty when absent.
    pub fn field(&self, name: &str) -> &str {
        self.state[name].as_str().unwrap_or_default()
    }

    /// The path of a role's public test key file (`payer`, `pay_to`, `fee_payer`, `mint`).
    pub fn key_file(&self, role: &str) -> PathBuf {
        PathBuf::from(self.state["keys"][role].as_str().unwrap_or_default())
    }

    /// The text of a role's key file.
    pub fn key(&self, role: &str) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(self.key_file(role))?)
    }

    /// The chain's state file.
    pub fn state_path(&self) -> PathBuf {
        self.dir.join("chain.json")
    }

    /// A JSON-RPC call; the whole answer (`result` or `error`).
    pub async fn rpc(&self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.post("", json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})).await
    }

    /// A POST to the chain's URL + `path` (the `/_test/*` hooks).
    pub async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.field("rpc_url"));
        Ok(self.http.post(url).json(&body).send().await?.json().await?)
    }

    /// A token account's balance in atomic units.
    pub async fn token_balance(&self, account: &str) -> anyhow::Result<u64> {
        let v = self.rpc("getTokenAccountBalance", json!([account])).await?;
        v["result"]["value"]["amount"].as_str().context("no token balance")?.parse().context("balance")
    }

    /// The payer's and `pay_to`'s token balances.
    pub async fn balances(&self) -> anyhow::Result<(u64, u64)> {
        Ok((self.token_balance(self.field("payer_ata")).await?, self.token_balance(self.field("pay_to_ata")).await?))
    }

    /// The JSON-RPC URL of the chain's view `name` (one ledger; a view's signature index can be
    /// made to lag or its ledger pruned: [`Self::index`]). The view "" is `rpc_url`.
    pub fn view_url(&self, name: &str) -> String {
        format!("{}/view/{name}", self.field("rpc_url"))
    }

    /// The view `view`'s index (`""`: `rpc_url`'s): getSignaturesForAddress omits what landed in
    /// the last `lag_slots` slots; the ledger is pruned below `first_available`.
    pub async fn index(&self, view: &str, lag_slots: u64, first_available: u64) -> anyhow::Result<()> {
        let body = json!({"view": view, "lag_slots": lag_slots, "first_available": first_available});
        let v = self.post("/_test/index", body).await?;
        if v["lag_slots"].as_u64() != Some(lag_slots) {
            bail!("/_test/index answered {v}");
        }
        Ok(())
    }

    /// Advances the chain `slots` blocks now.
    pub async fn advance(&self, slots: u64) -> anyhow::Result<()> {
        let v = self.post("/_test/advance", json!({"slots": slots})).await?;
        if !v["slot"].is_u64() {
            bail!("advance answered {v}");
        }
        Ok(())
    }
}

impl Drop for SolanaChain {
    fn drop(&mut self) {
        if let Ok(state) = path_str(&self.state_path()) {
            let _ = script("solana-chain", &["stop", state]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The official @x402/svm facilitator and express servers over a chain: `GET /v2/sol` and
/// `GET /v1/sol` at [`Self::server`].
pub struct OfficialSvm {
    state_path: PathBuf,
    /// The resource server's base URL.
    pub server: String,
}

impl OfficialSvm {
    /// Starts them over `chain`, both routes priced `price` atomic units.
    pub fn start(chain: &SolanaChain, price: u64) -> anyhow::Result<Self> {
        let state_path = chain.dir.join("official.json");
        let price = price.to_string();
        script(
            "solana-official",
            &["start", path_str(&chain.state_path())?, path_str(&state_path)?, "--price", &price],
        )?;
        let state: Value = serde_json::from_str(&std::fs::read_to_string(&state_path)?)?;
        let server = state["server"].as_str().context("no server URL")?.to_owned();
        Ok(Self { state_path, server })
    }
}

impl Drop for OfficialSvm {
    fn drop(&mut self) {
        if let Ok(state) = path_str(&self.state_path) {
            let _ = script("solana-official", &["stop", state]);
        }
    }
}
