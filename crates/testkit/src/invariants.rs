//! The money invariants, checked from the chain's logs and the ledger after a run that
//! crashed, froze or disconnected routers at will (the fault-point tests and `scripts/chaos`).
//! Self-contained: it reads Postgres and the RPC directly and trusts nothing the routers say.
//!
//! 1. every nonce used on-chain by the payer belongs to a ledger row;
//! 2. at most one used nonce per (agent, key, request), and each nonce used at most once;
//! 3. money moved (the payer's `Transfer`s) = the sum of the used authorizations' amounts;
//! 4. every used nonce is `settled` with a receipt, or flagged `settled_response_lost`
//!    (paid, not served); a row says `settled` only if the chain shows its nonce used;
//! 5. no key is left `in_flight`;
//! 6. no agent moved more than its daily budget, no payment exceeds its agent's per-call cap.
//!
//! A `batch-settlement` row (a voucher on a payment channel) uses a nonce on-chain only when it
//! carried the channel's deposit: that deposit's nonce is the one checked (1-3; the money it
//! moved is locked in the channel, not spent), and its agent is counted the voucher's price
//! (6) whatever its status says, unless refused, while the server may still claim it. What the
//! channels' server charged, claimed and paid is checked by [`batch`].

pub mod batch;

use std::collections::{BTreeMap, BTreeSet};
use std::str::FromStr;

use alloy::primitives::{Address, B256, U256};
use alloy::providers::{Provider, ProviderBuilder};
use alloy::rpc::types::Filter;
use serde::Serialize;

alloy::sol! {
    event Transfer(address indexed from, address indexed to, uint256 value);
    event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
}

/// What to check: the ledger's database, the chain and the paying wallet.
pub struct Target<'a> {
    pub database_url: &'a str,
    pub rpc_url: &'a str,
    pub token: Address,
    pub payer: Address,
}

/// Figures and violations of one check.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub ledger_rows: u64,
    pub used_nonces: u64,
    /// Atomic units the payer transferred, from the chain's `Transfer` logs.
    pub moved: String,
    /// Used nonces whose call was answered and has a receipt.
    pub served_paid: u64,
    /// Used nonces flagged `settled_response_lost` (paid, answer lost).
    pub paid_not_served: u64,
    pub receipts: u64,
    pub violations: Vec<String>,
}

struct Row {
    agent: String,
    key: String,
    request_hash: String,
    /// What its used nonce moved (a batch-settlement row: its deposit).
    amount: U256,
    status: String,
    /// A batch-settlement row: the voucher's price (what its agent is charged).
    batch_price: Option<U256>,
}

/// Statuses of a batch-settlement row whose voucher the server may have charged.
pub(crate) fn batch_counted(status: &str) -> bool {
    !matches!(status, "rejected" | "not_settled" | "expired")
}

/// Runs every check.
///
/// # Errors
/// When the database or the RPC cannot be read (not a violation: nothing was decided).
pub async fn check(target: &Target<'_>) -> anyhow::Result<Report> {
    let mut report = Report::default();
    let (used, moved) = chain_facts(target).await?;
    report.used_nonces = used.len() as u64;
    report.moved = moved.to_string();

    let (client, connection) = tokio_postgres::connect(target.database_url, tokio_postgres::NoTls).await?;
    let conn_task = tokio::spawn(connection);
    let ledger = read_ledger(&client, &mut report).await?;
    // 1-4: the chain against the ledger.
    let moved_by_agent = compare(&used, moved, &ledger, &mut report);
    // 5: nothing left in flight.
    let in_flight: i64 =
        client.query_one("SELECT count(*) FROM idempotency_keys WHERE status = 'in_flight'", &[]).await?.get(0);
    if in_flight > 0 {
        report.violations.push(format!("{in_flight} keys left in_flight"));
    }
    // 6: limits.
    check_limits(&client, &used, &ledger.rows, &moved_by_agent, &mut report.violations).await?;
    drop(client);
    conn_task.abort();
    Ok(report)
}

/// How many times the chain shows each of the payer's nonces used, and what left its wallet.
async fn chain_facts(target: &Target<'_>) -> anyhow::Result<(BTreeMap<B256, u32>, U256)> {
    let provider = ProviderBuilder::new().disable_recommended_fillers().connect_http(target.rpc_url.parse()?);
    let logs = provider.get_logs(&Filter::new().address(target.token).from_block(0)).await?;
    let mut used: BTreeMap<B256, u32> = BTreeMap::new();
    let mut moved = U256::ZERO;
    for log in &logs {
        if let Ok(e) = log.log_decode::<AuthorizationUsed>() {
            if e.inner.data.authorizer == target.payer {
                *used.entry(e.inner.data.nonce).or_default() += 1;
            }
        } else if let Ok(e) = log.log_decode::<Transfer>()
            && e.inner.data.from == target.payer
        {
            moved += e.inner.data.value;
        }
    }
    Ok((used, moved))
}

/// The ledger's payments by nonce and the (nonce, agent, key) of every receipt with a payment.
struct Ledger {
    rows: BTreeMap<B256, Row>,
    receipted: BTreeSet<(String, String, String)>,
}

async fn read_ledger(client: &tokio_postgres::Client, report: &mut Report) -> anyhow::Result<Ledger> {
    let mut rows: BTreeMap<B256, Row> = BTreeMap::new();
    let sql = "SELECT agent_id::text, idempotency_key, request_hash, nonce, amount::text, status, scheme, \
                      signed_authorization->'deposit'->>'nonce', signed_authorization->'deposit'->>'amount' \
                 FROM payments";
    for r in client.query(sql, &[]).await? {
        let mut nonce = B256::from_str(r.get::<_, &str>(3))?;
        let price = U256::from_str(r.get::<_, &str>(4))?;
        let mut row = Row {
            agent: r.get(0),
            key: r.get(1),
            request_hash: r.get(2),
            amount: price,
            status: r.get(5),
            batch_price: None,
        };
        if r.get::<_, &str>(6) == "batch-settlement" {
            row.batch_price = Some(price);
            // Its on-chain nonce is its deposit's, if it carried one; else none: keyed apart.
            match (r.get::<_, Option<&str>>(7), r.get::<_, Option<&str>>(8)) {
                (Some(n), Some(a)) => {
                    nonce = B256::from_str(n)?;
                    row.amount = U256::from_str(a)?;
                }
                _ => {
                    row.amount = U256::ZERO;
                    nonce = alloy::primitives::keccak256(nonce);
                }
            }
        }
        if rows.insert(nonce, row).is_some() {
            report.violations.push(format!("nonce {nonce} appears on two ledger rows"));
        }
    }
    report.ledger_rows = rows.len() as u64;
    let mut receipted: BTreeSet<(String, String, String)> = BTreeSet::new();
    for r in client
        .query("SELECT payment->>'nonce', agent_id::text, idempotency_key FROM receipts WHERE payment IS NOT NULL", &[])
        .await?
    {
        if let Some(n) = r.get::<_, Option<String>>(0) {
            receipted.insert((n.to_lowercase(), r.get(1), r.get(2)));
        }
    }
    report.receipts = u64::try_from(client.query_one("SELECT count(*) FROM receipts", &[]).await?.get::<_, i64>(0))?;
    Ok(Ledger { rows, receipted })
}

/// Checks 1-4 (the chain against the ledger); what each agent's used payments moved.
fn compare(used: &BTreeMap<B256, u32>, moved: U256, ledger: &Ledger, report: &mut Report) -> BTreeMap<String, U256> {
    let mut used_per_request: BTreeMap<(String, String, String), u32> = BTreeMap::new();
    let mut used_amount = U256::ZERO;
    let mut moved_by_agent: BTreeMap<String, U256> = BTreeMap::new();
    for (nonce, times) in used {
        if *times > 1 {
            report.violations.push(format!("nonce {nonce} used {times} times on-chain"));
        }
        let Some(row) = ledger.rows.get(nonce) else {
            report.violations.push(format!("nonce {nonce} was used on-chain but belongs to no ledger row"));
            continue;
        };
        used_amount += row.amount;
        *used_per_request.entry((row.agent.clone(), row.key.clone(), row.request_hash.clone())).or_default() += 1;
        if row.batch_price.is_some() {
            // A deposit: the wallet's money locked in a channel (what was charged: `batch`).
            continue;
        }
        *moved_by_agent.entry(row.agent.clone()).or_default() += row.amount;
        match row.status.as_str() {
            "settled" => {
                if ledger.receipted.contains(&(nonce.to_string(), row.agent.clone(), row.key.clone())) {
                    report.served_paid += 1;
                } else {
                    report.violations.push(format!("nonce {nonce} is settled but its call has no receipt"));
                }
            }
            "settled_response_lost" => report.paid_not_served += 1,
            other => {
                report.violations.push(format!("nonce {nonce} was used on-chain but its ledger row says {other:?}"))
            }
        }
    }
    let v = &mut report.violations;
    for ((agent, key, _), n) in &used_per_request {
        if *n > 1 {
            v.push(format!("{n} nonces used for one request of agent {agent} under key {key:?}"));
        }
    }
    if used_amount != moved {
        v.push(format!("money moved {moved} != sum of used authorizations {used_amount}"));
    }
    for (nonce, row) in &ledger.rows {
        if let Some(price) = row.batch_price {
            // A voucher the server may have charged counts against its agent.
            if batch_counted(&row.status) {
                *moved_by_agent.entry(row.agent.clone()).or_default() += price;
            }
            continue;
        }
        if matches!(row.status.as_str(), "settled" | "settled_response_lost") && !used.contains_key(nonce) {
            v.push(format!("ledger says {} for nonce {nonce}, which the chain never used", row.status));
        }
    }
    moved_by_agent
}

/// Check 6: no agent moved more than its daily budget, no used payment over its cap.
async fn check_limits(
    client: &tokio_postgres::Client,
    used: &BTreeMap<B256, u32>,
    rows: &BTreeMap<B256, Row>,
    moved_by_agent: &BTreeMap<String, U256>,
    v: &mut Vec<String>,
) -> anyhow::Result<()> {
    for r in client.query("SELECT id::text, max_per_call::text, daily_budget::text FROM agents", &[]).await? {
        let agent: String = r.get(0);
        let cap = r.get::<_, Option<&str>>(1).map(U256::from_str).transpose()?;
        let budget = r.get::<_, Option<&str>>(2).map(U256::from_str).transpose()?;
        let spent = moved_by_agent.get(&agent).copied().unwrap_or_default();
        if let Some(b) = budget
            && spent > b
        {
            v.push(format!("agent {agent} moved {spent}, over its daily budget {b}"));
        }
        if let Some(c) = cap {
            for (nonce, row) in rows.iter().filter(|(n, row)| row.agent == agent && used.contains_key(*n)) {
                if row.batch_price.is_none() && row.amount > c {
                    v.push(format!("payment {nonce} of {} exceeds agent {agent}'s cap {c}", row.amount));
                }
            }
            for (nonce, row) in rows.iter().filter(|(_, row)| row.agent == agent) {
                if let Some(price) = row.batch_price.filter(|p| *p > c && batch_counted(&row.status)) {
                    v.push(format!("voucher {nonce} of {price} exceeds agent {agent}'s cap {c}"));
                }
            }
        }
    }
    Ok(())
}
