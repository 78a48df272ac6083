//! The batch-settlement invariants, checked after the channels' server claimed and settled
//! (issue 40): from the ledger (`payments`, `batch_lanes`), the server's own records (its
//! channels, and every voucher it was sent, from its log) and the chain's `Transfer` logs.
//!
//! 1. every voucher the server was sent is on one of the router's channels, at most the
//!    ceiling the ledger recorded as signed on it;
//! 2. on every channel, what the server charged is at most what the ledger reserved there (the
//!    prices of its vouchers that may have been charged), and what it claimed at most what it
//!    charged: no charge above what was reserved;
//! 3. the payee received exactly the sum the server claimed;
//! 4. nothing charged twice per (agent, key): one counted voucher per key at most.

use std::collections::BTreeMap;
use std::str::FromStr;

use alloy::primitives::{Address, U256};
use alloy::providers::{Provider, ProviderBuilder};
use alloy::rpc::types::Filter;
use serde::Serialize;
use serde_json::Value;

use super::{Transfer, batch_counted};

/// What to check.
pub struct Target<'a> {
    pub database_url: &'a str,
    pub rpc_url: &'a str,
    pub token: Address,
    /// The channels' receiver (it receives nothing else on this chain).
    pub payee: Address,
    /// The server's channel records after its claim (`chargedCumulativeAmount`, `totalClaimed`).
    pub channels: &'a [Value],
    /// Every voucher the server was sent: (channel id, maxClaimableAmount).
    pub vouchers: &'a [(String, String)],
}

/// Figures and violations of one check.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub lanes: u64,
    pub voucher_rows: u64,
    pub vouchers_seen: u64,
    pub reserved: String,
    pub charged: String,
    pub claimed: String,
    pub payee_received: String,
    pub deposited: String,
    pub violations: Vec<String>,
}

fn amount(v: &Value) -> U256 {
    v.as_str().and_then(|s| U256::from_str(s).ok()).unwrap_or_default()
}

/// Runs every check.
///
/// # Errors
/// When the database or the RPC cannot be read (not a violation: nothing was decided).
pub async fn check(t: &Target<'_>) -> anyhow::Result<Report> {
    let mut r = Report::default();
    let ledger = read_ledger(t.database_url, &mut r).await?;
    let (signed, reserved, per_key) = (&ledger.signed, &ledger.reserved, &ledger.per_key);
    let v = &mut r.violations;
    // 1. Every voucher seen, at most its channel's recorded ceiling.
    r.vouchers_seen = t.vouchers.len() as u64;
    for (channel, max) in t.vouchers {
        let max = U256::from_str(max).unwrap_or(U256::MAX);
        match signed.get(&channel.to_lowercase()) {
            None => v.push(format!("the server was sent a voucher on channel {channel}, not one of the router's")),
            Some(ceiling) if max > *ceiling => {
                v.push(format!("a voucher of {max} on channel {channel} is above its recorded ceiling {ceiling}"));
            }
            Some(_) => {}
        }
    }
    // 2. Charged <= reserved, claimed <= charged, per channel.
    let (mut charged_sum, mut claimed_sum) = (U256::ZERO, U256::ZERO);
    for c in t.channels {
        let id = c["channelId"].as_str().unwrap_or_default().to_lowercase();
        let (charged, claimed) = (amount(&c["chargedCumulativeAmount"]), amount(&c["totalClaimed"]));
        charged_sum += charged;
        claimed_sum += claimed;
        let held = reserved.get(&id).copied().unwrap_or_default();
        if charged > held {
            v.push(format!("channel {id}: the server charged {charged}, above the {held} the ledger reserved there"));
        }
        if claimed > charged {
            v.push(format!("channel {id}: the server claimed {claimed}, above what it charged ({charged})"));
        }
        if !signed.contains_key(&id) {
            v.push(format!("the server holds channel {id}, not one of the router's"));
        }
    }
    r.reserved = reserved.values().fold(U256::ZERO, |a, b| a + b).to_string();
    r.charged = charged_sum.to_string();
    r.claimed = claimed_sum.to_string();
    // 3. The payee received exactly what was claimed.
    let provider = ProviderBuilder::new().disable_recommended_fillers().connect_http(t.rpc_url.parse()?);
    let logs = provider.get_logs(&Filter::new().address(t.token).from_block(0)).await?;
    let received = logs
        .iter()
        .filter_map(|l| l.log_decode::<Transfer>().ok())
        .filter(|e| e.inner.data.to == t.payee)
        .fold(U256::ZERO, |a, e| a + e.inner.data.value);
    r.payee_received = received.to_string();
    if received != claimed_sum {
        v.push(format!("the payee received {received}, the server claimed {claimed_sum}"));
    }
    // 4. One counted voucher per (agent, key).
    for ((agent, key), n) in per_key.iter().filter(|(_, n)| **n > 1) {
        v.push(format!("{n} vouchers counted for agent {agent} under key {key:?}"));
    }
    Ok(r)
}

/// The router's channels and what its ledger reserved on them.
struct Ledger {
    /// Signed ceiling per channel id (lower case).
    signed: BTreeMap<String, U256>,
    /// Prices of the counted vouchers per channel id.
    reserved: BTreeMap<String, U256>,
    /// Counted vouchers per (agent, key).
    per_key: BTreeMap<(String, String), u32>,
}

async fn read_ledger(database_url: &str, r: &mut Report) -> anyhow::Result<Ledger> {
    let (client, connection) = tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
    let conn_task = tokio::spawn(connection);
    let mut signed: BTreeMap<String, U256> = BTreeMap::new();
    let mut deposited = U256::ZERO;
    for row in
        client.query("SELECT lower(channel_id), signed_ceiling::text, deposited::text FROM batch_lanes", &[]).await?
    {
        signed.insert(row.get(0), U256::from_str(row.get::<_, &str>(1))?);
        deposited += U256::from_str(row.get::<_, &str>(2))?;
    }
    r.lanes = signed.len() as u64;
    r.deposited = deposited.to_string();
    let mut reserved: BTreeMap<String, U256> = BTreeMap::new();
    let mut per_key: BTreeMap<(String, String), u32> = BTreeMap::new();
    let sql = "SELECT agent_id::text, idempotency_key, lower(signed_authorization->>'channel_id'), amount::text, status \
                 FROM payments WHERE scheme = 'batch-settlement'";
    for row in client.query(sql, &[]).await? {
        r.voucher_rows += 1;
        if !batch_counted(row.get(4)) {
            continue;
        }
        let channel: Option<String> = row.get(2);
        *reserved.entry(channel.unwrap_or_default()).or_default() += U256::from_str(row.get::<_, &str>(3))?;
        *per_key.entry((row.get(0), row.get(1))).or_default() += 1;
    }
    drop(client);
    conn_task.abort();
    Ok(Ledger { signed, reserved, per_key })
}
