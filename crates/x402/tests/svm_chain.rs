//! `x402::svm` against a real local Solana chain (tools/solana-chain: LiteSVM behind JSON-RPC,
//! started by scripts/solana-chain, which installs its pinned npm packages when missing): the
//! router's transaction lands once and moves exactly the price; the chain, not any sender,
//! decides what happened to it; an endpoint of another chain is never believed; one
//! endpoint's lagging or pruned signature index never says alone that a payment can never land.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use solana_keypair::Keypair;
use solana_signer::Signer;
use solana_transaction::versioned::VersionedTransaction;
use x402::svm::{
    ComputeBudget, SignedSvmTransfer, SvmEndpoints, SvmNetwork, SvmRpc, SvmRpcError, SvmSigner, SvmTerms,
    TOKEN_PROGRAM, TransferState, sign_transfer,
};
use x402::wire::X402Version;
use x402_router_testkit::solana::{OfficialSvm, SolanaChain};

const PRICE: u64 = 10_000;

fn rpc_of(chain: &SolanaChain) -> SvmRpc {
    rpc_at(chain, chain.field("rpc_url"))
}

/// An endpoint of `chain`'s network at `url`.
fn rpc_at(chain: &SolanaChain, url: &str) -> SvmRpc {
    let network = SvmNetwork::parse(chain.field("network")).unwrap();
    SvmRpc::new(network, url.parse().unwrap(), Duration::from_secs(10)).unwrap()
}

fn terms_of(chain: &SolanaChain, amount: u64) -> SvmTerms {
    let entry = json!({"scheme": "exact", "network": chain.field("network"), "amount": amount.to_string(),
        "asset": chain.field("mint"), "payTo": chain.field("pay_to"), "maxTimeoutSeconds": 60,
        "extra": {"feePayer": chain.field("fee_payer")}});
    SvmTerms::from_json(X402Version::V2, &entry).unwrap()
}

/// The router's side: the chain's mint and blockhash, the payer's signature.
async fn sign(chain: &SolanaChain, rpc: &SvmRpc, amount: u64, memo: &str) -> SignedSvmTransfer {
    let terms = terms_of(chain, amount);
    let mint = rpc.mint(&terms.mint()).await.unwrap();
    let blockhash = rpc.latest_blockhash().await.unwrap();
    let signer = SvmSigner::parse(&chain.key("payer").unwrap()).unwrap();
    sign_transfer(&signer, &terms, &mint, &blockhash, memo, ComputeBudget::default()).unwrap()
}

/// The facilitator's side: co-sign as fee payer and submit (skipPreflight, as it does).
async fn submit(chain: &SolanaChain, transfer: &SignedSvmTransfer) -> Value {
    let bytes: Vec<u8> = serde_json::from_str(&chain.key("fee_payer").unwrap()).unwrap();
    let fee_payer = Keypair::try_from(bytes.as_slice()).unwrap();
    let mut tx: VersionedTransaction = wincode::deserialize(&BASE64.decode(&transfer.transaction).unwrap()).unwrap();
    tx.signatures[0] = fee_payer.sign_message(&tx.message.serialize());
    let wire = BASE64.encode(wincode::serialize(&tx).unwrap());
    chain.rpc("sendTransaction", json!([wire, {"encoding": "base64", "skipPreflight": true}])).await.unwrap()
}

fn deterministic_chain() -> SolanaChain {
    SolanaChain::start(&["--slot-ms", "0"]).unwrap()
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
    let chain = deterministic_chain();
    let rpc = rpc_of(&chain);
    let before = chain.balances().await.unwrap();
    let transfer = sign(&chain, &rpc, PRICE, "a1").await;
    assert!(matches!(rpc.transfer_state(&transfer).await.unwrap(), TransferState::Pending { .. }));
    let sent = submit(&chain, &transfer).await;
    let tx_id = sent["result"].as_str().expect("a transaction id").to_owned();
    assert_ne!(tx_id, transfer.signature, "the id is the fee payer's signature, not the payer's");
    let state = state_until(&rpc, &transfer, |s| matches!(s, TransferState::Settled { .. })).await;
    assert!(matches!(&state, TransferState::Settled { tx_id: found, .. } if *found == tx_id), "{state:?}");
    assert!(!state.may_sign_again());
    // An id is believed only for the transaction that carries the payer's signature.
    assert!(rpc.landed_as(&transfer, &tx_id).await.unwrap().is_some());
    let other = sign(&chain, &rpc, PRICE, "a2").await;
    assert_eq!(rpc.landed_as(&other, &tx_id).await.unwrap(), None, "a claimed id of another payment proves nothing");
    assert_eq!(rpc.landed_as(&other, "1111").await.unwrap(), None);
    let after = chain.balances().await.unwrap();
    assert_eq!((before.0 - after.0, after.1 - before.1), (PRICE, PRICE));

    // The same transaction again (a kept copy, a replaying facilitator): the chain refuses it.
    let again = submit(&chain, &transfer).await;
    assert!(again["result"].as_str() == Some(tx_id.as_str()) || again["error"].is_object(), "{again}");
    chain.advance(2).await.unwrap();
    assert_eq!(chain.balances().await.unwrap(), after, "a signature moves money once");
    // Finalized after 32 blocks: settled for good.
    chain.advance(40).await.unwrap();
    assert!(matches!(rpc.transfer_state(&transfer).await.unwrap(), TransferState::Settled { finalized: true, .. }));
}

#[tokio::test(flavor = "current_thread")]
async fn an_unsent_payment_expires_only_once_the_chain_is_past_its_last_valid_height() {
    let chain = deterministic_chain();
    let rpc = rpc_of(&chain);
    let transfer = sign(&chain, &rpc, PRICE, "b1").await;
    let height = rpc.finalized_block_height().await.unwrap();
    let lifetime = transfer.last_valid_block_height - height;
    assert!(lifetime > 0 && lifetime <= 151, "lifetime {lifetime}");
    chain.advance(lifetime).await.unwrap();
    let at_last_valid = rpc.transfer_state(&transfer).await.unwrap();
    assert!(
        matches!(at_last_valid, TransferState::Pending { .. }),
        "at its last valid height it can still land: {at_last_valid:?}"
    );
    assert!(!at_last_valid.may_sign_again());
    chain.advance(1).await.unwrap();
    let past = rpc.transfer_state(&transfer).await.unwrap();
    assert!(matches!(past, TransferState::Expired { .. }) && past.may_sign_again(), "{past:?}");

    // A kept copy submitted now moves nothing and the verdict stands.
    let before = chain.balances().await.unwrap();
    submit(&chain, &transfer).await;
    chain.advance(1).await.unwrap();
    assert_eq!(chain.balances().await.unwrap(), before);
    assert!(matches!(rpc.transfer_state(&transfer).await.unwrap(), TransferState::Expired { .. }));
}

#[tokio::test(flavor = "current_thread")]
async fn a_submitted_but_unexecuted_payment_stays_pending_whatever_the_sender_answered() {
    let chain = deterministic_chain();
    let rpc = rpc_of(&chain);
    let transfer = sign(&chain, &rpc, PRICE, "c1").await;
    // The node answers the signature (as for any send) but has not executed it yet.
    chain.post("/_test/hold", json!({"count": 1})).await.unwrap();
    let sent = submit(&chain, &transfer).await;
    assert!(sent["result"].is_string(), "{sent}");
    let state = rpc.transfer_state(&transfer).await.unwrap();
    assert!(matches!(state, TransferState::Pending { .. }) && !state.may_sign_again(), "{state:?}");
    let released = chain.post("/_test/release", json!({})).await.unwrap();
    assert_eq!(released["released"][0]["landed"], json!(true), "{released}");
    let state = state_until(&rpc, &transfer, |s| matches!(s, TransferState::Settled { .. })).await;
    assert!(matches!(state, TransferState::Settled { .. }), "{state:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn an_endpoint_of_another_chain_is_never_believed_and_only_real_mints_are_read() {
    let chain = deterministic_chain();
    let mainnet = SvmNetwork::parse("solana").unwrap();
    let liar = SvmRpc::new(mainnet, chain.field("rpc_url").parse().unwrap(), Duration::from_secs(10)).unwrap();
    let mint = chain.field("mint").parse().unwrap();
    assert!(matches!(liar.mint(&mint).await, Err(SvmRpcError::WrongChain { .. })));
    assert!(matches!(liar.latest_blockhash().await, Err(SvmRpcError::WrongChain { .. })));
    assert!(matches!(liar.finalized_block_height().await, Err(SvmRpcError::WrongChain { .. })));

    let rpc = rpc_of(&chain);
    let m = rpc.mint(&mint).await.unwrap();
    assert_eq!((m.token_program, m.decimals), (TOKEN_PROGRAM, 6));
    // A token account (owned by the token program, not a mint) and a wallet are not mints.
    let token_account = chain.field("payer_ata").parse().unwrap();
    assert!(matches!(rpc.mint(&token_account).await, Err(SvmRpcError::NotAMint)));
    let wallet = chain.field("payer").parse().unwrap();
    assert!(matches!(rpc.mint(&wallet).await, Err(SvmRpcError::NotAMint)));
    let nothing = solana_address::Address::new_from_array([3; 32]);
    assert!(matches!(rpc.mint(&nothing).await, Err(SvmRpcError::NoMint)));
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_payment_moves_nothing_and_is_final_only_once_finalized() {
    let chain = deterministic_chain();
    let rpc = rpc_of(&chain);
    // More than the payer holds: the token program fails the transfer, the fee is charged.
    let transfer = sign(&chain, &rpc, u64::MAX / 2, "d1").await;
    let before = chain.balances().await.unwrap();
    submit(&chain, &transfer).await;
    let state = state_until(&rpc, &transfer, |s| matches!(s, TransferState::Failed { .. })).await;
    assert!(matches!(state, TransferState::Failed { finalized: false, .. }) && !state.may_sign_again(), "{state:?}");
    assert_eq!(chain.balances().await.unwrap(), before);
    chain.advance(40).await.unwrap();
    let state = rpc.transfer_state(&transfer).await.unwrap();
    assert!(matches!(state, TransferState::Failed { finalized: true, .. }) && state.may_sign_again(), "{state:?}");
}

/// Pays `path` of the official server as the router's x402 code does: the 402 parsed, the SVM
/// option read, the transaction built and signed here, sent in the version's header. Returns
/// the transfer, the paid answer's status and the settlement the server claimed.
async fn pay_official(
    chain: &SolanaChain,
    rpc: &SvmRpc,
    url: &str,
    memo: &str,
) -> (SignedSvmTransfer, u16, Option<x402::SettlementResponse>, (String, String)) {
    let http = reqwest::Client::new();
    let first = http.get(url).send().await.unwrap();
    let status = first.status();
    let headers = first.headers().clone();
    let body = first.bytes().await.unwrap();
    let required = x402::wire::parse_payment_required(status, &headers, &body).unwrap();
    assert!(required.accepts.is_empty(), "no EVM option: the Solana one is skipped by the EVM parser");
    let terms = SvmTerms::from_json(required.version, &required.raw_accepts[0]).unwrap();
    assert_eq!(terms.fee_payer().to_string(), chain.field("fee_payer"));
    let mint = rpc.mint(&terms.mint()).await.unwrap();
    let blockhash = rpc.latest_blockhash().await.unwrap();
    let signer = SvmSigner::parse(&chain.key("payer").unwrap()).unwrap();
    let transfer = sign_transfer(&signer, &terms, &mint, &blockhash, memo, ComputeBudget::default()).unwrap();
    let payload = x402::svm::payment_payload(&terms, required.resource.as_ref(), &transfer.transaction, None);
    let (name, value) = x402::wire::encode_payment_header(required.version, &payload).unwrap();
    let header = (name.to_owned(), value.to_str().unwrap().to_owned());
    let paid = http.get(url).header(name, value).send().await.unwrap();
    let settled = x402::wire::parse_settlement(paid.headers()).unwrap();
    (transfer, paid.status().as_u16(), settled, header)
}

#[tokio::test(flavor = "current_thread")]
async fn the_official_facilitator_and_server_accept_the_payments_and_the_chain_counts_them() {
    let chain = SolanaChain::start(&[]).unwrap();
    let official = OfficialSvm::start(&chain, PRICE).unwrap();
    let rpc = rpc_of(&chain);
    let before = chain.balances().await.unwrap();
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
    let after = chain.balances().await.unwrap();
    let n = paid.len() as u64;
    assert_eq!((before.0 - after.0, after.1 - before.1), (n * PRICE, n * PRICE), "exactly the price, once per payment");
    assert_eq!(paid.iter().map(|p| &p.2).collect::<std::collections::HashSet<_>>().len(), paid.len());

    // A kept payment header sent again (a replaying client or upstream): no second transfer.
    for (url, (name, value), _) in &paid {
        let again = reqwest::Client::new().get(url).header(name.as_str(), value.as_str()).send().await.unwrap();
        assert_ne!(again.status().as_u16(), 200, "a replayed payment header is refused");
    }
    chain.advance(2).await.unwrap();
    assert_eq!(chain.balances().await.unwrap(), after, "replays moved nothing");
}

/// Issue 38, item 5. The chain's main URL gets a signature index that lags (it omits what
/// landed); the view "witness" is a second URL of the same ledger. A landed payment, past its
/// blockhash's last valid height: the lagging endpoint alone says it expired, which is why its
/// word alone decides nothing; the witness shows it landed. A payment that really never landed
/// expires by both. A pruned ledger, or a witness of another chain, decides nothing.
#[tokio::test(flavor = "current_thread")]
async fn one_endpoints_lagging_or_pruned_index_never_says_alone_that_a_payment_never_landed() {
    let chain = deterministic_chain();
    let main = rpc_of(&chain);
    let witness_url = chain.view_url("witness");
    let endpoints = |witnesses: &[&str]| {
        SvmEndpoints::new(rpc_of(&chain), witnesses.iter().map(|u| rpc_at(&chain, u)).collect()).unwrap()
    };
    let landed = sign(&chain, &main, PRICE, "f1").await;
    submit(&chain, &landed).await;
    state_until(&main, &landed, |s| matches!(s, TransferState::Settled { .. })).await;
    chain.index("", 1_000_000, 0).await.unwrap();
    let never_sent = sign(&chain, &main, PRICE, "f2").await;
    chain.advance(200).await.unwrap();

    let lied = main.transfer_state(&landed).await.unwrap();
    assert!(matches!(lied, TransferState::Expired { .. }), "the lagging index alone: {lied:?}");
    assert!(matches!(endpoints(&[]).fate(&landed).await, Err(SvmRpcError::NoSecondOpinion)));
    let fate = endpoints(&[&witness_url]).fate(&landed).await.unwrap();
    assert!(matches!(fate, TransferState::Settled { .. }), "{fate:?}");
    assert!(matches!(endpoints(&[]).fate(&never_sent).await, Err(SvmRpcError::NoSecondOpinion)));
    let fate = endpoints(&[&witness_url]).fate(&never_sent).await.unwrap();
    assert!(matches!(fate, TransferState::Expired { .. }) && fate.may_sign_again(), "{fate:?}");

    // The witness's ledger pruned after the payment's blockhash: its search proves nothing.
    let now = main.finalized_block_height().await.unwrap();
    chain.index("witness", 0, now).await.unwrap();
    let pruned = endpoints(&[&witness_url]).fate(&never_sent).await;
    assert!(matches!(pruned, Err(SvmRpcError::HistoryPruned { .. })), "{pruned:?}");
    chain.index("witness", 0, 0).await.unwrap();

    // A witness URL that serves another chain is never believed.
    let other =
        SolanaChain::start(&["--slot-ms", "0", "--genesis-hash", "4uhcVJyU9pJkvQyS88uRDiswHXSCkY3zQawwpjk2NsNY"])
            .unwrap();
    let wrong = endpoints(&[&witness_url, other.field("rpc_url")]).fate(&never_sent).await;
    assert!(matches!(wrong, Err(SvmRpcError::WrongChain { .. })), "{wrong:?}");
}
