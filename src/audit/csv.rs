//! `GET /audit/payments.csv`: the payment ledger as CSV (RFC 4180), with the filters of
//! `GET /audit/payments`. Rows come from the same column list as the JSON API
//! ([`super::store::PAYMENT_FROM`]): never the signed authorization or the payment header.
//!
//! Cells are quoted when they hold a comma, a quote or a line break (quotes doubled), and a
//! cell starting with `=`, `+`, `-`, `@`, a tab or a carriage return is prefixed with `'`, so
//! that a spreadsheet opening the file never evaluates a formula an upstream or an agent
//! planted (an error text, an idempotency key, a resource description, an agent's name).

use super::store::PaymentView;

/// The header row's column names, in order.
pub const COLUMNS: [&str; 26] = [
    "id",
    "agent_id",
    "idempotency_key",
    "x402_version",
    "scheme",
    "network",
    "asset",
    "amount",
    "pay_to",
    "payer",
    "nonce",
    "valid_after",
    "valid_before",
    "resource",
    "status",
    "tx_hash",
    "error",
    "attempts",
    "created_at",
    "updated_at",
    "signed_at",
    "receipt_id",
    "receipt_outcome",
    "idempotency_status",
    "recovery",
    "agent_name",
];

/// One CSV cell: neutralized against formula injection, then quoted if needed.
pub fn cell(value: &str) -> String {
    let neutral =
        if value.starts_with(['=', '+', '-', '@', '\t', '\r']) { format!("'{value}") } else { value.to_owned() };
    if neutral.contains([',', '"', '\n', '\r']) { format!("\"{}\"", neutral.replace('"', "\"\"")) } else { neutral }
}

fn line(cells: impl IntoIterator<Item = String>) -> String {
    let mut out = cells.into_iter().map(|c| cell(&c)).collect::<Vec<_>>().join(",");
    out.push_str("\r\n");
    out
}

/// The header row.
pub fn header() -> String {
    line(COLUMNS.iter().map(|c| (*c).to_owned()))
}

/// One payment as a CSV row (JSON values as compact JSON, absent values empty).
pub fn row(p: &PaymentView) -> String {
    let json = |v: &Option<serde_json::Value>| v.as_ref().map(ToString::to_string).unwrap_or_default();
    let opt = |v: &Option<String>| v.clone().unwrap_or_default();
    let time = |t: &chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    line([
        p.id.to_string(),
        p.agent_id.to_string(),
        p.idempotency_key.clone(),
        p.x402_version.to_string(),
        p.scheme.clone(),
        p.network.clone(),
        p.asset.clone(),
        p.amount.clone(),
        p.pay_to.clone(),
        p.payer.clone(),
        p.nonce.clone(),
        p.valid_after.to_string(),
        p.valid_before.to_string(),
        json(&p.resource),
        p.status.clone(),
        opt(&p.tx_hash),
        opt(&p.error),
        p.attempts.to_string(),
        time(&p.created_at),
        time(&p.updated_at),
        time(&p.signed_at),
        p.receipt_id.map(|i| i.to_string()).unwrap_or_default(),
        opt(&p.receipt_outcome),
        opt(&p.idempotency_status),
        json(&p.recovery),
        p.agent_name.clone(),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_quoted_and_formulas_neutralized() {
        assert_eq!(cell("plain"), "plain");
        assert_eq!(cell("a,b"), "\"a,b\"");
        assert_eq!(cell("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(cell("two\nlines"), "\"two\nlines\"");
        assert_eq!(cell("=1+1"), "'=1+1");
        assert_eq!(cell("+1"), "'+1");
        assert_eq!(cell("-2"), "'-2");
        assert_eq!(cell("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(cell("=HYPERLINK(\"x\",\"y\")"), "\"'=HYPERLINK(\"\"x\"\",\"\"y\"\")\"");
        assert_eq!(cell(""), "");
        assert!(header().starts_with("id,agent_id,") && header().ends_with("recovery,agent_name\r\n"));
    }
}
