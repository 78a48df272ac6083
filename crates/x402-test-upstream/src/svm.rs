//! `serve-svm`: SVM (Solana) `exact` routes over a Solana JSON-RPC node, settled by this server
//! as its own facilitator: it decodes each payment transaction, checks it against its offer
//! (fee payer first and not moving funds, compute limit and price, one `TransferChecked` of
//! exactly the price of its mint to `payTo`'s associated token account, a memo at most, the
//! payer's signature), co-signs it as the fee payer and submits it.
//!
//! Routes, each in v1 (`/svm/v1/…`, body JSON, `X-PAYMENT`) and v2 (`/svm/v2/…`, the
//! `PAYMENT-REQUIRED` / `PAYMENT-SIGNATURE` / `PAYMENT-RESPONSE` headers):
//! - `paid`: settles, then answers 200 `{"paid": true}` with the settlement.
//! - `keep`: co-signs and keeps the transaction, answers 402 "settlement failed"; `POST
//!   /_settle_kept` submits everything kept (a lying upstream that settles later).
//! - `lie-failed`: settles, then answers 402 "settlement failed".
//! - `claim-unsettled`: submits nothing and answers 200 with a made-up successful settlement.
//! - `pid` (v2 only): like `paid`, advertising the `payment-identifier` extension; `?slow=N`
//!   answers N seconds after settling. A request whose payment carries an id is remembered: the
//!   same id with the same payment header gets 503 (`Retry-After: 1`) while the first is handled,
//!   then the first's answer again (nothing settled twice); another header with that id gets 409.
//!   The first is handled to its end even when its client went away.
//!
//! Query: `?price=N` (atomic units) and `?fee_payer=ADDR` (the fee payer advertised, e.g. the
//! payer's own wallet: a transaction naming it is refused, it cannot be co-signed here).
//! `GET /_stats`: `{"settled", "kept", "refused"}`. A transaction whose payer signature was seen
//! before is refused (no second settlement of one payment).
//!
//! Shares no code with the `x402` crate: written against the scheme, not against the router.

use std::collections::{HashMap, HashSet};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use anyhow::{Context as _, bail};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use clap::Args;
use serde_json::{Value, json};
use solana_address::Address;
use solana_keypair::Keypair;
use solana_signer::Signer;
use solana_transaction::versioned::VersionedTransaction;
use tokio::sync::Mutex;
use url::Url;

const TOKEN: Address = Address::from_str_const("TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA");
const TOKEN_2022: Address = Address::from_str_const("TokenzQdBNbLqP5VEhdkAS6EPFLC1PHnBqCXEpPxuEb");
const ATA_PROGRAM: Address = Address::from_str_const("ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL");
const COMPUTE_BUDGET: Address = Address::from_str_const("ComputeBudget111111111111111111111111111111");
const MEMO: Address = Address::from_str_const("MemoSq4gqABAXKb96qnH8TysNcWxMyWCqXgDLGmfcHr");
/// The highest compute-unit price accepted (micro-lamports), the official facilitator's.
const MAX_UNIT_PRICE: u64 = 5_000_000;
/// The longest payment header read.
const MAX_HEADER_BYTES: usize = 16 * 1024;

#[derive(Debug, Args)]
pub struct SvmServeArgs {
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: SocketAddr,
    /// Solana JSON-RPC URL (e.g. tools/solana-chain's).
    #[arg(long)]
    pub rpc_url: Url,
    /// The SPL mint the routes are priced in (base58).
    #[arg(long)]
    pub mint: String,
    /// The recipient wallet (base58); paid into its associated token account.
    #[arg(long)]
    pub pay_to: String,
    /// The fee payer's key file: a JSON array of 64 bytes (secret, then public key).
    #[arg(long)]
    pub fee_payer_key: PathBuf,
    /// Price of the routes, atomic units.
    #[arg(long, default_value_t = 10_000)]
    pub price: u64,
    /// maxTimeoutSeconds advertised.
    #[arg(long, default_value_t = 60)]
    pub max_timeout_seconds: u64,
    /// How long a submitted transaction may take to land, in seconds.
    #[arg(long, default_value_t = 30)]
    pub settle_timeout_seconds: u64,
}

struct Settings {
    rpc_url: Url,
    network: String,
    network_v1: String,
    mint: Address,
    token_program: Address,
    pay_to: Address,
    destination: Address,
    fee_payer: Keypair,
    price: u64,
    max_timeout_seconds: u64,
    settle_timeout: Duration,
}

#[derive(Default)]
struct Counters {
    settled: AtomicU64,
    refused: AtomicU64,
}

#[derive(Clone)]
struct State {
    settings: Arc<Settings>,
    http: reqwest::Client,
    counters: Arc<Counters>,
    /// Payer signatures of the payments taken (settled, kept or claimed).
    seen: Arc<Mutex<HashSet<Vec<u8>>>>,
    /// Co-signed transactions of the `keep` route, submitted by `POST /_settle_kept`.
    kept: Arc<Mutex<Vec<String>>>,
    /// The `pid` route's requests by payment-identifier id.
    pids: Arc<Mutex<HashMap<String, PidEntry>>>,
}

pub async fn run(args: SvmServeArgs) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let key: Vec<u8> = serde_json::from_str(&std::fs::read_to_string(&args.fee_payer_key)?)
        .context("the fee payer key file is not a JSON array of bytes")?;
    let fee_payer = Keypair::try_from(key.as_slice()).map_err(|_| anyhow::anyhow!("not a 64-byte Solana keypair"))?;
    let mint: Address = args.mint.parse().map_err(|_| anyhow::anyhow!("--mint is not a base58 address"))?;
    let pay_to: Address = args.pay_to.parse().map_err(|_| anyhow::anyhow!("--pay-to is not a base58 address"))?;
    let genesis = rpc(&http, &args.rpc_url, "getGenesisHash", json!([])).await?;
    let reference: String = genesis.as_str().context("genesis hash")?.chars().take(32).collect();
    let network = format!("solana:{reference}");
    let network_v1 = match reference.as_str() {
        "5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp" => "solana".to_owned(),
        "EtWTRABZaYq6iMfeYKouRu166VU2xqa1" => "solana-devnet".to_owned(),
        "4uhcVJyU9pJkvQyS88uRDiswHXSCkY3z" => "solana-testnet".to_owned(),
        _ => network.clone(),
    };
    let account = rpc(&http, &args.rpc_url, "getAccountInfo", json!([args.mint, {"encoding": "base64"}])).await?;
    let owner: Address =
        account["value"]["owner"].as_str().and_then(|s| s.parse().ok()).context("the mint account does not exist")?;
    if owner != TOKEN && owner != TOKEN_2022 {
        bail!("the mint is not an SPL Token or Token-2022 mint");
    }
    let destination = ata(&pay_to, &mint, &owner);
    let settings = Arc::new(Settings {
        rpc_url: args.rpc_url,
        network,
        network_v1,
        mint,
        token_program: owner,
        pay_to,
        destination,
        fee_payer,
        price: args.price,
        max_timeout_seconds: args.max_timeout_seconds,
        settle_timeout: Duration::from_secs(args.settle_timeout_seconds.max(1)),
    });
    tracing::info!(network = %settings.network, mint = %mint, pay_to = %pay_to, fee_payer = %settings.fee_payer.pubkey(), "x402 SVM test upstream configured");
    let state = State {
        settings,
        http,
        counters: Arc::default(),
        seen: Arc::default(),
        kept: Arc::default(),
        pids: Arc::default(),
    };
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(state.clone()))
            .route("/svm/{version}/{behaviour}", web::get().to(paid_route))
            .route("/_settle_kept", web::post().to(settle_kept))
            .route("/_stats", web::get().to(stats))
    })
    .workers(2)
    .bind(args.bind)?;
    let bound = server.addrs().first().copied().context("not bound")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", json!({"listening": bound.to_string()}))?;
    out.flush()?;
    drop(out);
    server.run().await?;
    Ok(())
}

fn ata(owner: &Address, mint: &Address, program: &Address) -> Address {
    Address::find_program_address(&[owner.as_ref(), program.as_ref(), mint.as_ref()], &ATA_PROGRAM).0
}

async fn rpc(http: &reqwest::Client, url: &Url, method: &str, params: Value) -> anyhow::Result<Value> {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let mut answer: Value = http.post(url.clone()).json(&body).send().await?.json().await?;
    if let Some(error) = answer.get("error") {
        bail!("{method}: {error}");
    }
    Ok(answer.get_mut("result").map(Value::take).unwrap_or(Value::Null))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    Paid,
    Keep,
    LieFailed,
    ClaimUnsettled,
    Pid,
}

/// A payment-identifier id's first request: its payment header, and its answer once handled
/// (the settling transaction and the payer).
type PidEntry = (String, Option<(String, String)>);

/// The offer of one request: its price and advertised fee payer.
#[derive(Clone)]
struct Offer {
    version: Version,
    price: u64,
    fee_payer: Address,
    url: String,
    /// The 402 advertises `payment-identifier`.
    pid: bool,
}

async fn paid_route(req: HttpRequest, state: web::Data<State>, path: web::Path<(String, String)>) -> HttpResponse {
    let (version, behaviour) = path.into_inner();
    let version = match version.as_str() {
        "v1" => Version::V1,
        "v2" => Version::V2,
        _ => return HttpResponse::NotFound().json(json!({"error": "no such version"})),
    };
    let behaviour = match behaviour.as_str() {
        "paid" => Behaviour::Paid,
        "keep" => Behaviour::Keep,
        "lie-failed" => Behaviour::LieFailed,
        "claim-unsettled" => Behaviour::ClaimUnsettled,
        "pid" if version == Version::V2 => Behaviour::Pid,
        _ => return HttpResponse::NotFound().json(json!({"error": "no such route"})),
    };
    let s = &state.settings;
    let query = web::Query::<std::collections::HashMap<String, String>>::from_query(req.query_string())
        .map(web::Query::into_inner)
        .unwrap_or_default();
    let price = match query.get("price").map(|p| p.parse::<u64>()) {
        None => s.price,
        Some(Ok(p)) => p,
        Some(Err(_)) => return HttpResponse::BadRequest().json(json!({"error": "price is not a u64"})),
    };
    let fee_payer = match query.get("fee_payer").map(|p| p.parse::<Address>()) {
        None => s.fee_payer.pubkey(),
        Some(Ok(a)) => a,
        Some(Err(_)) => return HttpResponse::BadRequest().json(json!({"error": "fee_payer is not an address"})),
    };
    let slow = match query.get("slow").map(|p| p.parse::<u64>()) {
        None => 0,
        Some(Ok(n)) if n <= 60 => n,
        Some(_) => return HttpResponse::BadRequest().json(json!({"error": "slow is 0 to 60 seconds"})),
    };
    let url = format!("http://{}{}", req.connection_info().host(), req.uri());
    let offer = Offer { version, price, fee_payer, url, pid: behaviour == Behaviour::Pid };
    let header = match version {
        Version::V1 => "x-payment",
        Version::V2 => "payment-signature",
    };
    let Some(value) = req.headers().get(header).and_then(|v| v.to_str().ok()) else {
        return payment_required(s, &offer, "payment required");
    };
    // The payment-identifier cache answers before anything is verified (a re-send of a settled
    // payment would fail verification).
    let pid = if behaviour == Behaviour::Pid { payment_id(value) } else { None };
    if let Some(id) = &pid
        && let Some(answer) = remembered(&state, &offer, id, value).await
    {
        return answer;
    }
    let forget = || async {
        if let Some(id) = &pid {
            state.pids.lock().await.remove(id);
        }
    };
    let tx = match decode(value).and_then(|tx| check(s, &offer, tx)) {
        Ok(tx) => tx,
        Err(why) => {
            forget().await;
            state.counters.refused.fetch_add(1, Ordering::Relaxed);
            return payment_required(s, &offer, why);
        }
    };
    if !state.seen.lock().await.insert(tx.signatures[1].as_ref().to_vec()) {
        forget().await;
        state.counters.refused.fetch_add(1, Ordering::Relaxed);
        return payment_required(s, &offer, "duplicate payment");
    }
    if behaviour == Behaviour::Pid {
        // Handled to its end in a task of its own, even if the client goes away meanwhile.
        let (state, offer) = (state.get_ref().clone(), offer.clone());
        let handled = actix_web::rt::spawn(async move { settle_pid(&state, &offer, tx, pid, slow).await });
        return handled.await.unwrap_or_else(|_| HttpResponse::InternalServerError().finish());
    }
    settle_as(&state, &offer, behaviour, tx).await
}

/// The answer to a request whose payment-identifier id was seen before: 409 for another payment
/// header, 503 while the first is handled, its answer once handled. `None`: a new id, now taken.
async fn remembered(state: &State, offer: &Offer, id: &str, header: &str) -> Option<HttpResponse> {
    let mut pids = state.pids.lock().await;
    match pids.get(id) {
        Some((first, _)) if first != header => {
            Some(HttpResponse::Conflict().json(json!({"error": "payment-identifier reused with another payment"})))
        }
        Some((_, None)) => Some(
            HttpResponse::ServiceUnavailable().insert_header(("Retry-After", "1")).json(json!({"error": "in flight"})),
        ),
        Some((_, Some((tx_id, payer)))) => Some(paid(&state.settings, offer, tx_id, payer)),
        None => {
            pids.insert(id.to_owned(), (header.to_owned(), None));
            None
        }
    }
}

/// `extensions["payment-identifier"].info.id` of a payment header, if any.
fn payment_id(header: &str) -> Option<String> {
    let message: Value = B64.decode(header).ok().and_then(|b| serde_json::from_slice(&b).ok())?;
    message.pointer("/extensions/payment-identifier/info/id")?.as_str().map(str::to_owned)
}

/// The `pid` route: settles, waits `slow` seconds, remembers the answer under the id.
async fn settle_pid(
    state: &State,
    offer: &Offer,
    mut tx: VersionedTransaction,
    pid: Option<String>,
    slow: u64,
) -> HttpResponse {
    let s = &state.settings;
    let payer = tx.message.static_account_keys()[1].to_string();
    tx.signatures[0] = s.fee_payer.sign_message(&tx.message.serialize());
    let submitted = match wincode::serialize(&tx) {
        Ok(bytes) => submit(state, &B64.encode(bytes)).await,
        Err(e) => Err(anyhow::anyhow!("unserializable transaction: {e}")),
    };
    match submitted {
        Ok(tx_id) => {
            state.counters.settled.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_secs(slow)).await;
            if let Some(id) = pid
                && let Some(entry) = state.pids.lock().await.get_mut(&id)
            {
                entry.1 = Some((tx_id.clone(), payer.clone()));
            }
            paid(s, offer, &tx_id, &payer)
        }
        Err(e) => {
            tracing::warn!("settlement failed: {e:#}");
            if let Some(id) = pid {
                state.pids.lock().await.remove(&id);
            }
            payment_required(s, offer, "settlement failed")
        }
    }
}

async fn settle_as(state: &State, offer: &Offer, behaviour: Behaviour, mut tx: VersionedTransaction) -> HttpResponse {
    let s = &state.settings;
    let payer = tx.message.static_account_keys()[1].to_string();
    if behaviour == Behaviour::ClaimUnsettled {
        let made_up = bs58_of(&[7u8; 64]);
        return paid(s, offer, &made_up, &payer);
    }
    tx.signatures[0] = s.fee_payer.sign_message(&tx.message.serialize());
    let wire = match wincode::serialize(&tx) {
        Ok(bytes) => B64.encode(bytes),
        Err(_) => return payment_required(s, offer, "unserializable transaction"),
    };
    if behaviour == Behaviour::Keep {
        state.kept.lock().await.push(wire);
        return payment_required(s, offer, "settlement failed");
    }
    match submit(state, &wire).await {
        Ok(tx_id) => {
            state.counters.settled.fetch_add(1, Ordering::Relaxed);
            if behaviour == Behaviour::LieFailed {
                payment_required(s, offer, "settlement failed")
            } else {
                paid(s, offer, &tx_id, &payer)
            }
        }
        Err(e) => {
            tracing::warn!("settlement failed: {e:#}");
            payment_required(s, offer, "settlement failed")
        }
    }
}

/// Sends a co-signed transaction and waits until it landed successfully; its id.
async fn submit(state: &State, wire: &str) -> anyhow::Result<String> {
    let s = &state.settings;
    let sent = rpc(&state.http, &s.rpc_url, "sendTransaction", json!([wire, {"encoding": "base64"}])).await?;
    let tx_id = sent.as_str().context("sendTransaction answered no signature")?.to_owned();
    let deadline = Instant::now() + s.settle_timeout;
    loop {
        let st =
            rpc(&state.http, &s.rpc_url, "getSignatureStatuses", json!([[tx_id], {"searchTransactionHistory": true}]))
                .await?;
        let status = &st["value"][0];
        if !status.is_null() {
            if !status["err"].is_null() {
                bail!("transaction {tx_id} failed: {}", status["err"]);
            }
            return Ok(tx_id);
        }
        if Instant::now() > deadline {
            bail!("transaction {tx_id} did not land in time");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn decode(header: &str) -> Result<VersionedTransaction, &'static str> {
    if header.len() > MAX_HEADER_BYTES {
        return Err("payment header too large");
    }
    let message: Value = B64
        .decode(header)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or("payment header is not base64 JSON")?;
    let tx = message["payload"]["transaction"].as_str().ok_or("payload.transaction is missing")?;
    let bytes = B64.decode(tx).map_err(|_| "payload.transaction is not base64")?;
    wincode::deserialize::<VersionedTransaction>(&bytes).map_err(|_| "payload.transaction is not a transaction")
}

/// The scheme's checks, as a facilitator makes them.
fn check(s: &Settings, offer: &Offer, tx: VersionedTransaction) -> Result<VersionedTransaction, &'static str> {
    let keys = tx.message.static_account_keys();
    let header = tx.message.header();
    if header.num_required_signatures != 2 || tx.signatures.len() != 2 || keys.len() < 2 {
        return Err("the transaction must need exactly two signatures, the fee payer's and the payer's");
    }
    if keys[0] != offer.fee_payer {
        return Err("the fee payer is not the one offered");
    }
    if keys[0] != s.fee_payer.pubkey() {
        return Err("the fee payer is not managed here");
    }
    let ixs = tx.message.instructions();
    if !(3..=4).contains(&ixs.len()) {
        return Err("the transaction must hold 3 or 4 instructions");
    }
    let program = |i: usize| keys.get(usize::from(ixs[i].program_id_index)).copied();
    let account = |i: usize, a: usize| ixs[i].accounts.get(a).and_then(|&k| keys.get(usize::from(k))).copied();
    if program(0) != Some(COMPUTE_BUDGET) || ixs[0].data.first() != Some(&2) || ixs[0].data.len() != 5 {
        return Err("the first instruction must set the compute unit limit");
    }
    let unit_price = ixs[1].data.get(1..9).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    if program(1) != Some(COMPUTE_BUDGET) || ixs[1].data.first() != Some(&3) || ixs[1].data.len() != 9 {
        return Err("the second instruction must set the compute unit price");
    }
    if unit_price.is_none_or(|p| p > MAX_UNIT_PRICE) {
        return Err("the compute unit price is too high");
    }
    let data = &ixs[2].data;
    let amount = data.get(1..9).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    if program(2) != Some(s.token_program)
        || data.first() != Some(&12)
        || data.len() != 10
        || ixs[2].accounts.len() != 4
    {
        return Err("the third instruction must be one TransferChecked of the mint's token program");
    }
    if amount != Some(offer.price) {
        return Err("the amount is not the price");
    }
    if account(2, 1) != Some(s.mint) || account(2, 2) != Some(s.destination) {
        return Err("the transfer is not of the mint to payTo's token account");
    }
    let authority = account(2, 3).ok_or("no authority")?;
    if authority == keys[0] || ixs[2].accounts.iter().any(|&k| keys.get(usize::from(k)) == Some(&keys[0])) {
        return Err("the fee payer may not move funds");
    }
    if ixs.len() == 4 && program(3) != Some(MEMO) {
        return Err("the fourth instruction may only be a memo");
    }
    if keys[1] != authority || !tx.signatures[1].verify(authority.as_ref(), &tx.message.serialize()) {
        return Err("the payer's signature does not verify");
    }
    Ok(tx)
}

fn requirement(s: &Settings, offer: &Offer) -> Value {
    let (network, amount_field) = match offer.version {
        Version::V1 => (&s.network_v1, "maxAmountRequired"),
        Version::V2 => (&s.network, "amount"),
    };
    let mut entry = json!({
        "scheme": "exact",
        "network": network,
        "asset": s.mint.to_string(),
        "payTo": s.pay_to.to_string(),
        "maxTimeoutSeconds": s.max_timeout_seconds,
        "extra": {"feePayer": offer.fee_payer.to_string()},
    });
    entry[amount_field] = json!(offer.price.to_string());
    if offer.version == Version::V1 {
        entry["resource"] = json!(offer.url);
        entry["description"] = json!("");
        entry["mimeType"] = json!("application/json");
    }
    entry
}

fn payment_required(s: &Settings, offer: &Offer, error: &str) -> HttpResponse {
    let accepts = json!([requirement(s, offer)]);
    match offer.version {
        Version::V1 => {
            HttpResponse::PaymentRequired().json(json!({"x402Version": 1, "error": error, "accepts": accepts}))
        }
        Version::V2 => {
            let mut message =
                json!({"x402Version": 2, "error": error, "resource": {"url": offer.url}, "accepts": accepts});
            if offer.pid {
                message["extensions"] = crate::wire::payment_identifier_declaration();
            }
            HttpResponse::PaymentRequired()
                .insert_header(("PAYMENT-REQUIRED", B64.encode(message.to_string())))
                .json(json!({}))
        }
    }
}

fn paid(s: &Settings, offer: &Offer, tx_id: &str, payer: &str) -> HttpResponse {
    let network = match offer.version {
        Version::V1 => &s.network_v1,
        Version::V2 => &s.network,
    };
    let settlement = json!({"success": true, "transaction": tx_id, "network": network, "payer": payer});
    let name = match offer.version {
        Version::V1 => "X-PAYMENT-RESPONSE",
        Version::V2 => "PAYMENT-RESPONSE",
    };
    HttpResponse::Ok().insert_header((name, B64.encode(settlement.to_string()))).json(json!({"paid": true}))
}

async fn settle_kept(state: web::Data<State>) -> HttpResponse {
    let kept: Vec<String> = std::mem::take(&mut *state.kept.lock().await);
    let mut settled = Vec::new();
    for wire in kept {
        match submit(&state, &wire).await {
            Ok(tx_id) => {
                state.counters.settled.fetch_add(1, Ordering::Relaxed);
                settled.push(json!({"transaction": tx_id}));
            }
            Err(e) => settled.push(json!({"error": format!("{e:#}")})),
        }
    }
    HttpResponse::Ok().json(json!({"settled": settled}))
}

async fn stats(state: web::Data<State>) -> HttpResponse {
    HttpResponse::Ok().json(json!({
        "settled": state.counters.settled.load(Ordering::Relaxed),
        "kept": state.kept.lock().await.len(),
        "refused": state.counters.refused.load(Ordering::Relaxed),
    }))
}

/// Base58 of `bytes` (a made-up transaction id).
fn bs58_of(bytes: &[u8]) -> String {
    solana_signature::Signature::try_from(bytes).map(|s| s.to_string()).unwrap_or_default()
}
