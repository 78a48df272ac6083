//! `serve-svm` against the local Solana chain, paid by the router's own `x402::svm` code: the
//! honest routes settle exactly once and their claims hold on chain; the hostile ones lie in the
//! ways a router must survive (keep and settle later, say "failed" after settling, claim a
//! settlement that never happened, name the payer as fee payer), and the chain tells the truth.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use x402::svm::{
    ComputeBudget, SignedSvmTransfer, SvmNetwork, SvmRpc, SvmSigner, SvmTerms, TransferError, TransferState,
    sign_transfer,
};
use x402_router_testkit::Proc;
use x402_router_testkit::solana::SolanaChain;

const PRICE: u64 = 10_000;

struct Upstream {
    _proc: Proc,
    base: String,
    http: reqwest::Client,
}

async fn serve_svm(chain: &SolanaChain) -> Upstream {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_x402-test-upstream"));
    cmd.arg("serve-svm")
        .args(["--rpc-url", chain.field("rpc_url"), "--mint", chain.field("mint"), "--pay-to", chain.field("pay_to")])
        .arg("--fee-payer-key")
        .arg(chain.key_file("fee_payer"))
        .args(["--price", &PRICE.to_string()])
        .stdout(std::process::Stdio::piped());
    let mut proc = Proc::spawn(&mut cmd).unwrap();
    let stdout = proc.child_mut().stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(30), BufReader::new(stdout).read_line(&mut line)).await.unwrap().unwrap();
    let listening: Value = serde_json::from_str(&line).unwrap();
    let base = format!("http://{}", listening["listening"].as_str().unwrap());
    Upstream { _proc: proc, base, http: reqwest::Client::new() }
}

fn rpc_of(chain: &SolanaChain) -> SvmRpc {
    let network = SvmNetwork::parse(chain.field("network")).unwrap();
    SvmRpc::new(network, chain.field("rpc_url").parse().unwrap(), Duration::from_secs(10)).unwrap()
}

/// One paid attempt as the router's x402 code makes it. The transfer (None when the router's
/// code refused to sign), the paid answer's status and the claimed transaction id.
async fn pay(
    up: &Upstream,
    chain: &SolanaChain,
    rpc: &SvmRpc,
    path: &str,
    memo: &str,
) -> Result<(SignedSvmTransfer, u16, Option<String>, (String, String)), TransferError> {
    let url = format!("{}{path}", up.base);
    let first = up.http.get(&url).send().await.unwrap();
    let (status, headers) = (first.status(), first.headers().clone());
    let body = first.bytes().await.unwrap();
    let required = x402::wire::parse_payment_required(status, &headers, &body).unwrap();
    let terms = SvmTerms::from_json(required.version, &required.raw_accepts[0]).unwrap();
    let mint = rpc.mint(&terms.mint()).await.unwrap();
    let blockhash = rpc.latest_blockhash().await.unwrap();
    let signer = SvmSigner::parse(&chain.key("payer").unwrap()).unwrap();
    let transfer = sign_transfer(&signer, &terms, &mint, &blockhash, memo, ComputeBudget::default())?;
    let payload = x402::svm::payment_payload(&terms, required.resource.as_ref(), &transfer.transaction, None);
    let (name, value) = x402::wire::encode_payment_header(required.version, &payload).unwrap();
    let header = (name.to_owned(), value.to_str().unwrap().to_owned());
    let paid = up.http.get(&url).header(name, value).send().await.unwrap();
    let claimed = x402::wire::parse_settlement(paid.headers()).unwrap().and_then(|s| s.transaction);
    Ok((transfer, paid.status().as_u16(), claimed, header))
}

async fn stats(up: &Upstream) -> Value {
    up.http.get(format!("{}/_stats", up.base)).send().await.unwrap().json().await.unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn honest_routes_settle_once_and_their_claims_hold_on_chain() {
    let chain = SolanaChain::start(&["--slot-ms", "0"]).unwrap();
    let up = serve_svm(&chain).await;
    let rpc = rpc_of(&chain);
    let before = chain.balances().await.unwrap();
    for (path, memo) in [("/svm/v2/paid", "h1"), ("/svm/v1/paid", "h2")] {
        let (transfer, status, claimed, (name, value)) = pay(&up, &chain, &rpc, path, memo).await.unwrap();
        assert_eq!(status, 200, "{path}");
        let claimed = claimed.expect("a settlement");
        let landed = rpc.landed_as(&transfer, &claimed).await.unwrap();
        assert!(landed.is_some(), "{path}: the claim is the payer's transaction");
        let again = up.http.get(format!("{}{path}", up.base)).header(name, value).send().await.unwrap();
        assert_eq!(again.status().as_u16(), 402, "{path}: a replayed payment is refused");
    }
    let after = chain.balances().await.unwrap();
    assert_eq!((before.0 - after.0, after.1 - before.1), (2 * PRICE, 2 * PRICE));
    let counted = stats(&up).await;
    assert_eq!((&counted["settled"], &counted["refused"]), (&json!(2), &json!(2)), "{counted}");
}

#[tokio::test(flavor = "current_thread")]
async fn hostile_routes_lie_and_the_chain_tells_the_truth() {
    let chain = SolanaChain::start(&["--slot-ms", "0"]).unwrap();
    let up = serve_svm(&chain).await;
    let rpc = rpc_of(&chain);
    let start = chain.balances().await.unwrap();

    // "failed" after settling: the money moved, and the chain says so.
    let (lied, status, _, _) = pay(&up, &chain, &rpc, "/svm/v2/lie-failed", "x1").await.unwrap();
    assert_eq!(status, 402);
    assert!(matches!(rpc.transfer_state(&lied).await.unwrap(), TransferState::Settled { .. }));

    // A settlement claimed that never happened: the claimed id is not the payer's transaction.
    let (claimed_only, status, claimed, _) = pay(&up, &chain, &rpc, "/svm/v2/claim-unsettled", "x2").await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(rpc.landed_as(&claimed_only, &claimed.unwrap()).await.unwrap(), None);
    assert!(matches!(rpc.transfer_state(&claimed_only).await.unwrap(), TransferState::Pending { .. }));

    // Kept, "failed", then settled later: pending (never re-signable) until it lands.
    let (kept, status, _, _) = pay(&up, &chain, &rpc, "/svm/v2/keep", "x3").await.unwrap();
    assert_eq!(status, 402);
    let state = rpc.transfer_state(&kept).await.unwrap();
    assert!(matches!(state, TransferState::Pending { .. }) && !state.may_sign_again(), "{state:?}");
    let settled: Value = up.http.post(format!("{}/_settle_kept", up.base)).send().await.unwrap().json().await.unwrap();
    assert!(settled["settled"][0]["transaction"].is_string(), "{settled}");
    assert!(matches!(rpc.transfer_state(&kept).await.unwrap(), TransferState::Settled { .. }));
    assert_eq!(
        chain.balances().await.unwrap().1 - start.1,
        2 * PRICE,
        "lie-failed and keep moved money; the claim did not"
    );

    // The payer named as fee payer: the router's code never signs it.
    let payer = chain.field("payer");
    let refused = pay(&up, &chain, &rpc, &format!("/svm/v2/paid?fee_payer={payer}"), "x4").await;
    assert_eq!(refused.err(), Some(TransferError::FeePayerIsPayer));
}
