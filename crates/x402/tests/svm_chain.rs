//! `x402::svm` against a real local Solana chain (tools/solana-chain: LiteSVM behind JSON-RPC,
//! started by scripts/solana-chain, which installs its pinned npm packages when missing): the
//! router's transaction lands once and moves exactly the price; the chain, not any sender,
//! decides what happened to it; an endpoint of another chain is never believed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use solana_keypair::Keypair;
use solana_signer::Signer;
use solana_transaction::versioned::VersionedTransaction;
use x402::svm::{
    ComputeBudget, SignedSvmTransfer, SvmNetwork, SvmRpc, SvmRpcError, SvmSigner, SvmTerms, TOKEN_PROGRAM,
    TransferState, sign_transfer,
};
use x402::wire::X402Version;

const PRICE: u64 = 10_000;

/// A chain of this test's own, stopped (by the pid it recorded) when dropped.
struct Chain {
    dir: PathBuf,
    state: Value,
    http: reqwest::Client,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

impl Chain {
    fn start() -> Self {
        Self::start_with(&["--slot-ms", "0"])
    }

    fn start_with(options: &[&str]) -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dir = std::env::temp_dir().join(format!("x402-svm-test-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state_path = dir.join("chain.json");
        // By default slot-ms 0: heights move only with transactions and the advance hook.
        let status = Command::new(repo_root().join("scripts/solana-chain"))
            .args(["start", state_path.to_str().unwrap()])
            .args(options)
            .status()
            .expect("scripts/solana-chain runs");
        assert!(status.success(), "the local Solana chain did not start");
        let state = serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
        Self { dir, state, http: reqwest::Client::new() }
    }

    fn s(&self, field: &str) -> &str {
        self.state[field].as_str().unwrap()
    }

    fn key(&self, role: &str) -> String {
        std::fs::read_to_string(self.state["keys"][role].as_str().unwrap()).unwrap()
    }

    fn rpc(&self) -> SvmRpc {
        let network = SvmNetwork::parse(self.s("network")).unwrap();
        SvmRpc::new(network, self.s("rpc_url").parse().unwrap(), Duration::from_secs(10)).unwrap()
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.s("rpc_url"));
        self.http.post(url).json(&body).send().await.unwrap().json().await.unwrap()
    }

    async fn rpc_call(&self, method: &str, params: Value) -> Value {
        self.post("", json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params})).await
    }

    async fn token_balance(&self, account: &str) -> u64 {
        let v = self.rpc_call("getTokenAccountBalance", json!([account])).await;
        v["result"]["value"]["amount"].as_str().unwrap().parse().unwrap()
    }

    async fn balances(&self) -> (u64, u64) {
        (self.token_balance(self.s("payer_ata")).await, self.token_balance(self.s("pay_to_ata")).await)
    }

    fn terms(&self, fee_payer: &str) -> SvmTerms {
        let entry = json!({"scheme": "exact", "network": self.s("network"), "amount": PRICE.to_string(),
            "asset": self.s("mint"), "payTo": self.s("pay_to"), "maxTimeoutSeconds": 60,
            "extra": {"feePayer": fee_payer}});
        SvmTerms::from_json(X402Version::V2, &entry).unwrap()
    }

    /// The router's side: the chain's mint and blockhash, the payer's signature.
    async fn sign(&self, rpc: &SvmRpc, memo: &str) -> SignedSvmTransfer {
        let terms = self.terms(self.s("fee_payer"));
        let mint = rpc.mint(&terms.mint()).await.unwrap();
        let blockhash = rpc.latest_blockhash().await.unwrap();
        let signer = SvmSigner::parse(&self.key("payer")).unwrap();
        sign_transfer(&signer, &terms, &mint, &blockhash, memo, ComputeBudget::default()).unwrap()
    }

    /// The facilitator's side: co-sign as fee payer and submit (skipPreflight, as it does).
    async fn submit(&self, transfer: &SignedSvmTransfer) -> Value {
        let bytes: Vec<u8> = serde_json::from_str(&self.key("fee_payer")).unwrap();
        let fee_payer = Keypair::try_from(bytes.as_slice()).unwrap();
        let mut tx: VersionedTransaction =
            wincode::deserialize(&BASE64.decode(&transfer.transaction).unwrap()).unwrap();
        tx.signatures[0] = fee_payer.sign_message(&tx.message.serialize());
        let wire = BASE64.encode(wincode::serialize(&tx).unwrap());
        self.rpc_call("sendTransaction", json!([wire, {"encoding": "base64", "skipPreflight": true}])).await
    }

    async fn advance(&self, slots: u64) {
        let v = self.post("/_test/advance", json!({"slots": slots})).await;
        assert!(v["slot"].is_u64(), "advance answered {v}");
    }
}

/// The official @x402/svm facilitator and an official resource server over a chain
/// (scripts/solana-official), stopped by the pid it recorded when dropped.
struct Official {
    state_path: PathBuf,
    server: String,
}

impl Official {
    fn start(chain: &Chain) -> Self {
        let state_path = chain.dir.join("official.json");
        let status = Command::new(repo_root().join("scripts/solana-official"))
            .args(["start", chain.dir.join("chain.json").to_str().unwrap(), state_path.to_str().unwrap()])
            .args(["--price", &PRICE.to_string()])
            .status()
            .expect("scripts/solana-official runs");
        assert!(status.success(), "the official SVM server did not start");
        let state: Value = serde_json::from_str(&std::fs::read_to_string(&state_path).unwrap()).unwrap();
        Self { server: state["server"].as_str().unwrap().to_owned(), state_path }
    }
}

impl Drop for Official {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("scripts/solana-official"))
            .args(["stop", self.state_path.to_str().unwrap()])
            .status();
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        let state = self.dir.join("chain.json");
        let _ = Command::new(repo_root().join("scripts/solana-chain")).args(["stop", state.to_str().unwrap()]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn state_until(
    rpc: &SvmRpc,
    transfer: &SignedSvmTransfer,
    done: impl Fn(&TransferState) -> bool,
) -> TransferState {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state = rpc.transfer_state(transfer).await.unwrap();
        if done(&state) || Instant::now() > deadline {
            return state;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_payment_lands_once_moves_exactly_the_price_and_the_chain_says_so() {
    let chain = Chain::start();
    let rpc = chain.rpc();
    let before = chain.balances().await;
    let transfer = chain.sign(&rpc, "a1").await;
    assert!(matches!(rpc.transfer_state(&transfer).await.unwrap(), TransferState::Pending { .. }));
    let sent = chain.submit(&transfer).await;
    let tx_id = sent["result"].as_str().expect("a transaction id").to_owned();
    assert_ne!(tx_id, transfer.signature, "the id is the fee payer's signature, not the payer's");
    let state = state_until(&rpc, &transfer, |s| matches!(s, TransferState::Settled { .. })).await;
    assert!(matches!(&state, TransferState::Settled { tx_id: found, .. } if *found == tx_id), "{state:?}");
    assert!(!state.may_sign_again());
    // An id is believed only for the transaction that carries the payer's signature.
    assert!(rpc.landed_as(&transfer, &tx_id).await.unwrap().is_some());
    let other = chain.sign(&rpc, "a2").await;
    assert_eq!(rpc.landed_as(&other, &tx_id).await.unwrap(), None, "a claimed id of another payment proves nothing");
    assert_eq!(rpc.landed_as(&other, "1111").await.unwrap(), None);
    let after = chain.balances().await;
    assert_eq!((before.0 - after.0, after.1 - before.1), (PRICE, PRICE));

    // The same transaction again (a kept copy, a replaying facilitator): the chain refuses it.
    let again = chain.submit(&transfer).await;
    assert!(again["result"].as_str() == Some(tx_id.as_str()) || again["error"].is_object(), "{again}");
    chain.advance(2).await;
    assert_eq!(chain.balances().await, after, "a signature moves money once");
    // Finalized after 32 blocks: settled for good.
    chain.advance(40).await;
    assert!(matches!(rpc.transfer_state(&transfer).await.unwrap(), TransferState::Settled { finalized: true, .. }));
}

#[tokio::test(flavor = "current_thread")]
async fn an_unsent_payment_expires_only_once_the_chain_is_past_its_last_valid_height() {
    let chain = Chain::start();
    let rpc = chain.rpc();
    let transfer = chain.sign(&rpc, "b1").await;
    let height = rpc.finalized_block_height().await.unwrap();
    let lifetime = transfer.last_valid_block_height - height;
    assert!(lifetime > 0 && lifetime <= 151, "lifetime {lifetime}");
    chain.advance(lifetime).await;
    let at_last_valid = rpc.transfer_state(&transfer).await.unwrap();
    assert!(
        matches!(at_last_valid, TransferState::Pending { .. }),
        "at its last valid height it can still land: {at_last_valid:?}"
    );
    assert!(!at_last_valid.may_sign_again());
    chain.advance(1).await;
    let past = rpc.transfer_state(&transfer).await.unwrap();
    assert!(matches!(past, TransferState::Expired { .. }) && past.may_sign_again(), "{past:?}");

    // A kept copy submitted now moves nothing and the verdict stands.
    let before = chain.balances().await;
    chain.submit(&transfer).await;
    chain.advance(1).await;
    assert_eq!(chain.balances().await, before);
    assert!(matches!(rpc.transfer_state(&transfer).await.unwrap(), TransferState::Expired { .. }));
}

#[tokio::test(flavor = "current_thread")]
async fn a_submitted_but_unexecuted_payment_stays_pending_whatever_the_sender_answered() {
    let chain = Chain::start();
    let rpc = chain.rpc();
    let transfer = chain.sign(&rpc, "c1").await;
    // The node answers the signature (as for any send) but has not executed it yet.
    chain.post("/_test/hold", json!({"count": 1})).await;
    let sent = chain.submit(&transfer).await;
    assert!(sent["result"].is_string(), "{sent}");
    let state = rpc.transfer_state(&transfer).await.unwrap();
    assert!(matches!(state, TransferState::Pending { .. }) && !state.may_sign_again(), "{state:?}");
    let released = chain.post("/_test/release", json!({})).await;
    assert_eq!(released["released"][0]["landed"], json!(true), "{released}");
    let state = state_until(&rpc, &transfer, |s| matches!(s, TransferState::Settled { .. })).await;
    assert!(matches!(state, TransferState::Settled { .. }), "{state:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn an_endpoint_of_another_chain_is_never_believed_and_only_real_mints_are_read() {
    let chain = Chain::start();
    let mainnet = SvmNetwork::parse("solana").unwrap();
    let liar = SvmRpc::new(mainnet, chain.s("rpc_url").parse().unwrap(), Duration::from_secs(10)).unwrap();
    let mint = chain.s("mint").parse().unwrap();
    assert!(matches!(liar.mint(&mint).await, Err(SvmRpcError::WrongChain { .. })));
    assert!(matches!(liar.latest_blockhash().await, Err(SvmRpcError::WrongChain { .. })));
    assert!(matches!(liar.finalized_block_height().await, Err(SvmRpcError::WrongChain { .. })));

    let rpc = chain.rpc();
    let m = rpc.mint(&mint).await.unwrap();
    assert_eq!((m.token_program, m.decimals), (TOKEN_PROGRAM, 6));
    // A token account (owned by the token program, not a mint) and a wallet are not mints.
    let token_account = chain.s("payer_ata").parse().unwrap();
    assert!(matches!(rpc.mint(&token_account).await, Err(SvmRpcError::NotAMint)));
    let wallet = chain.s("payer").parse().unwrap();
    assert!(matches!(rpc.mint(&wallet).await, Err(SvmRpcError::NotAMint)));
    let nothing = solana_address::Address::new_from_array([3; 32]);
    assert!(matches!(rpc.mint(&nothing).await, Err(SvmRpcError::NoMint)));
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_payment_moves_nothing_and_is_final_only_once_finalized() {
    let chain = Chain::start();
    let rpc = chain.rpc();
    // More than the payer holds: the token program fails the transfer, the fee is charged.
    let entry = json!({"scheme": "exact", "network": chain.s("network"), "amount": (u64::MAX / 2).to_string(),
        "asset": chain.s("mint"), "payTo": chain.s("pay_to"), "maxTimeoutSeconds": 60,
        "extra": {"feePayer": chain.s("fee_payer")}});
    let terms = SvmTerms::from_json(X402Version::V2, &entry).unwrap();
    let mint = rpc.mint(&terms.mint()).await.unwrap();
    let blockhash = rpc.latest_blockhash().await.unwrap();
    let signer = SvmSigner::parse(&chain.key("payer")).unwrap();
    let transfer = sign_transfer(&signer, &terms, &mint, &blockhash, "d1", ComputeBudget::default()).unwrap();
    let before = chain.balances().await;
    chain.submit(&transfer).await;
    let state = state_until(&rpc, &transfer, |s| matches!(s, TransferState::Failed { .. })).await;
    assert!(matches!(state, TransferState::Failed { finalized: false, .. }) && !state.may_sign_again(), "{state:?}");
    assert_eq!(chain.balances().await, before);
    chain.advance(40).await;
    let state = rpc.transfer_state(&transfer).await.unwrap();
    assert!(matches!(state, TransferState::Failed { finalized: true, .. }) && state.may_sign_again(), "{state:?}");
}

/// Pays `path` of the official server as the router's x402 code does: the 402 parsed, the SVM
/// option read, the transaction built and signed here, sent in the version's header. Returns
/// the transfer, the paid answer's status and the settlement the server claimed.
async fn pay_official(
    chain: &Chain,
    rpc: &SvmRpc,
    url: &str,
    memo: &str,
) -> (SignedSvmTransfer, u16, Option<x402::SettlementResponse>, (String, String)) {
    let first = chain.http.get(url).send().await.unwrap();
    let status = first.status();
    let headers = first.headers().clone();
    let body = first.bytes().await.unwrap();
    let required = x402::wire::parse_payment_required(status, &headers, &body).unwrap();
    assert!(required.accepts.is_empty(), "no EVM option: the Solana one is skipped by the EVM parser");
    let terms = SvmTerms::from_json(required.version, &required.raw_accepts[0]).unwrap();
    assert_eq!(terms.fee_payer().to_string(), chain.s("fee_payer"));
    let mint = rpc.mint(&terms.mint()).await.unwrap();
    let blockhash = rpc.latest_blockhash().await.unwrap();
    let signer = SvmSigner::parse(&chain.key("payer")).unwrap();
    let transfer = sign_transfer(&signer, &terms, &mint, &blockhash, memo, ComputeBudget::default()).unwrap();
    let payload = x402::svm::payment_payload(&terms, required.resource.as_ref(), &transfer.transaction);
    let (name, value) = x402::wire::encode_payment_header(required.version, &payload).unwrap();
    let header = (name.to_owned(), value.to_str().unwrap().to_owned());
    let paid = chain.http.get(url).header(name, value).send().await.unwrap();
    let settled = x402::wire::parse_settlement(paid.headers()).unwrap();
    (transfer, paid.status().as_u16(), settled, header)
}

#[tokio::test(flavor = "current_thread")]
async fn the_official_facilitator_and_server_accept_the_payments_and_the_chain_counts_them() {
    let chain = Chain::start_with(&[]);
    let official = Official::start(&chain);
    let rpc = chain.rpc();
    let before = chain.balances().await;
    let mut paid = Vec::new();
    for (path, memo) in [("/v2/sol", "e1"), ("/v2/sol", "e2"), ("/v1/sol", "e3")] {
        let url = format!("{}{path}", official.server);
        let (transfer, status, settled, header) = pay_official(&chain, &rpc, &url, memo).await;
        assert_eq!(status, 200, "{path}: {settled:?}");
        let settled = settled.expect("a settlement header");
        assert!(settled.success, "{settled:?}");
        let claimed = settled.transaction.expect("a transaction id");
        // The claim is checked on chain: that transaction carries the payer's signature.
        let landed = rpc.landed_as(&transfer, &claimed).await.unwrap().expect("the claimed transaction is ours");
        assert_eq!(landed.error, None);
        let state = rpc.transfer_state(&transfer).await.unwrap();
        assert!(matches!(state, TransferState::Settled { ref tx_id, .. } if *tx_id == claimed), "{state:?}");
        paid.push((url, header, claimed));
    }
    let after = chain.balances().await;
    let n = paid.len() as u64;
    assert_eq!((before.0 - after.0, after.1 - before.1), (n * PRICE, n * PRICE), "exactly the price, once per payment");
    assert_eq!(paid.iter().map(|p| &p.2).collect::<std::collections::HashSet<_>>().len(), paid.len());

    // A kept payment header sent again (a replaying client or upstream): no second transfer.
    for (url, (name, value), _) in &paid {
        let again = chain.http.get(url).header(name.as_str(), value.as_str()).send().await.unwrap();
        assert_ne!(again.status().as_u16(), 200, "a replayed payment header is refused");
    }
    chain.advance(2).await;
    assert_eq!(chain.balances().await, after, "replays moved nothing");
}
