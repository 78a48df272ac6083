//! The payment intent ledger (`payments`): one row per signed authorization, its status and
//! the agent's spend computed from it. Storage and state only; the flow that signs, sends
//! and confirms payments is `relay::pay`. Depends on nothing above `db`.
//!
//! A row is written (status `signed`) *before* the paid request leaves, and finalised in the
//! same transaction as the call's receipt and idempotency transition.

pub mod store;

use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types::Text;
use uuid::Uuid;

/// Every state a payment intent can be in; the `payments.status` CHECK constraint allows
/// exactly these (a test holds the two together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, AsExpression, FromSqlRow)]
#[diesel(sql_type = Text)]
pub enum PaymentStatus {
    /// Signed and committed; the paid request may have left. Counts against the budget.
    Signed,
    /// The chain shows the authorization consumed.
    Settled,
    /// The upstream claimed settlement, but the chain does not show it.
    Unconfirmed,
    /// The upstream answered without settling (e.g. a 5xx before settlement).
    NotSettled,
    /// The upstream refused the payment.
    Rejected,
    /// Consumed on-chain, but the upstream's answer never reached us.
    SettledResponseLost,
    /// The chain could not be read, or the answer was lost before settlement.
    Unknown,
    /// Unused on-chain after `validBefore` (found by `reconcile`): can no longer move money.
    Expired,
}

impl PaymentStatus {
    /// Every status, in the order the database lists them.
    pub const ALL: [Self; 8] = [
        Self::Signed,
        Self::Settled,
        Self::Unconfirmed,
        Self::NotSettled,
        Self::Rejected,
        Self::SettledResponseLost,
        Self::Unknown,
        Self::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Signed => "signed",
            Self::Settled => "settled",
            Self::Unconfirmed => "unconfirmed",
            Self::NotSettled => "not_settled",
            Self::Rejected => "rejected",
            Self::SettledResponseLost => "settled_response_lost",
            Self::Unknown => "unknown",
            Self::Expired => "expired",
        }
    }

    /// The status named `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Money has provably moved (counted as spent).
    pub fn is_spent(self) -> bool {
        matches!(self, Self::Settled | Self::SettledResponseLost)
    }

    /// States that release their reservation (counted neither as spent nor as reserved):
    /// only a fact of the chain (unused past `validBefore`), never an upstream's word.
    pub fn releases_reservation(self) -> bool {
        matches!(self, Self::Expired)
    }
}

impl std::fmt::Display for PaymentStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromSql<Text, Pg> for PaymentStatus {
    fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<Self> {
        let s = <String as FromSql<Text, Pg>>::from_sql(bytes)?;
        Self::parse(&s).ok_or_else(|| format!("unknown payment status {s:?}").into())
    }
}

impl ToSql<Text, Pg> for PaymentStatus {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        <str as ToSql<Text, Pg>>::to_sql(self.as_str(), out)
    }
}

/// SQL condition (on a `payments p` row) for "in the rolling 24 h window": a payment counts
/// from the moment its current authorization was signed (`signed_at`, set again by every
/// re-signing) until 24 h after the last moment it could have moved money (`valid_before`),
/// never by the row's creation. A payment first signed long ago, expired unused and re-signed
/// now is spent now.
pub const IN_WINDOW_24H: &str = "GREATEST(p.signed_at, to_timestamp(p.valid_before)) > now() - interval '24 hours'";

/// SQL list of `statuses`, e.g. `('a', 'b')`, for queries built from the enum.
pub fn sql_list(statuses: impl IntoIterator<Item = PaymentStatus>) -> String {
    let names: Vec<String> = statuses.into_iter().map(|s| format!("'{}'", s.as_str())).collect();
    format!("({})", names.join(", "))
}

/// What the recording transaction writes to the intent.
#[derive(Debug, Clone)]
pub struct Final {
    pub id: Uuid,
    pub status: PaymentStatus,
    pub tx_hash: Option<String>,
    pub error: Option<String>,
    /// What recovery of a lost answer did (only for a takeover that found the payment used).
    pub recovery: Option<RecoveryNote>,
}

/// How recovering a paid answer that was lost ended (the `payments.recovery` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryKind {
    /// The upstream gave back the original answer (a byte-identical re-send).
    Recovered,
    /// A new execution, reached by signing in as the payer (SIWX).
    Reaccessed,
    /// Nothing could be recovered: settled, response lost.
    Lost,
}

impl RecoveryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recovered => "recovered",
            Self::Reaccessed => "reaccessed",
            Self::Lost => "lost",
        }
    }
}

/// The ledger's record of a recovery: its ending and every attempt.
#[derive(Debug, Clone)]
pub struct RecoveryNote {
    pub kind: RecoveryKind,
    /// A JSON array, one object per attempt.
    pub log: serde_json::Value,
}

impl RecoveryNote {
    /// The `payments.recovery` value.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "outcome": self.kind.as_str(), "attempts": self.log })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in PaymentStatus::ALL {
            assert_eq!(PaymentStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(PaymentStatus::parse("paid"), None);
        assert_eq!(sql_list([PaymentStatus::Signed, PaymentStatus::Expired]), "('signed', 'expired')");
    }
}
