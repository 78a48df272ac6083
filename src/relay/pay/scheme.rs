//! The seam between the payment walk and a payment scheme (docs/ARCHITECTURE.md, "Payment
//! schemes"; docs/adding-a-scheme.md).
//!
//! The walk — choose → sign → reserve → send → confirm → record, resume at a takeover, and
//! `reconcile`'s verdict — is written once, in this module's parent, over [`Scheme`]. A scheme
//! is one folder (`evm/`: EIP-3009, Permit2 `exact` and `upto`; `svm/`: Solana SPL `exact`)
//! that says how *its* payments are chosen, signed, read on the chain and shown; it knows
//! nothing of the walk's order, the ledger's fencing, the operator's stops or recovery. The
//! one place that names the schemes is `registry.rs`.

use std::future::Future;

use alloy::primitives::U256;
use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;
use uuid::Uuid;

use super::call::PaidCall;
use super::{Declined, Stop};
use crate::codes::Code;
use crate::money::Amount;
use crate::payments::PaymentStatus;
use crate::payments::sealed::Exact;
use crate::payments::store::PaymentRow;
use crate::relay::Error;
use crate::relay::view::{DecodeError, PaymentView};
use crate::upstream::UpstreamResponse;
use crate::x402::{PaymentRequired, SettlementResponse, X402Version};

/// A signed payment ready to leave: its ledger row, the x402 version, the request's nonce as
/// the ledger keeps it, the scheme's signed record and the payment header.
#[derive(Debug, Clone)]
pub(crate) struct Attempt<S> {
    pub id: Uuid,
    pub version: X402Version,
    pub nonce: String,
    pub signed: S,
    pub header: (HeaderName, HeaderValue),
}

/// A payment as its views and notes read it: its ledger row, x402 version, nonce and record.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parts<'a, S> {
    pub id: Uuid,
    pub version: X402Version,
    pub nonce: &'a str,
    pub signed: &'a S,
}

impl<S> Attempt<S> {
    pub fn parts(&self) -> Parts<'_, S> {
        Parts { id: self.id, version: self.version, nonce: &self.nonce, signed: &self.signed }
    }
}

/// A recorded payment, decoded from its ledger row: what a takeover (or a reused key) resumes.
#[derive(Debug, Clone)]
pub(crate) struct Recorded<S> {
    pub id: Uuid,
    pub version: X402Version,
    pub nonce: String,
    pub signed: S,
}

impl<S: Clone> Recorded<S> {
    pub fn parts(&self) -> Parts<'_, S> {
        Parts { id: self.id, version: self.version, nonce: &self.nonce, signed: &self.signed }
    }

    /// The recorded payment as an attempt with `header` (its recorded header, or a new one).
    pub fn attempt(&self, header: (HeaderName, HeaderValue)) -> Attempt<S> {
        Attempt { id: self.id, version: self.version, nonce: self.nonce.clone(), signed: self.signed.clone(), header }
    }
}

/// The columns of a ledger row a scheme reads to decode its record (all that `reconcile`
/// selects of a row).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowRef<'a> {
    pub id: Uuid,
    pub network: &'a str,
    pub asset: &'a str,
    pub pay_to: &'a str,
    pub payer: &'a str,
    pub nonce: &'a str,
    pub x402_version: i16,
    pub authorization: &'a Value,
}

impl<'a> RowRef<'a> {
    pub fn of(row: &'a PaymentRow) -> Self {
        Self {
            id: row.id,
            network: &row.network,
            asset: &row.asset,
            pay_to: &row.pay_to,
            payer: &row.payer,
            nonce: &row.nonce,
            x402_version: row.x402_version,
            authorization: &row.signed_authorization,
        }
    }
}

/// The chain (or a stored record) could not be read: nothing is decided on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct Unread(pub String);

impl Unread {
    pub fn of(e: impl std::fmt::Display) -> Self {
        Self(e.to_string())
    }
}

/// The scheme-specific columns of a new intent.
#[derive(Debug, Clone)]
pub(crate) struct Columns {
    pub scheme: String,
    pub network: String,
    pub asset: String,
    pub amount: Amount,
    pub pay_to: String,
    pub payer: String,
    pub valid_after: i64,
    pub valid_before: i64,
}

/// A new payment a scheme signed: the attempt, the intent's columns, and the exact parts the
/// ledger seals (the request as sent, the header, the terms and context as signed).
pub(crate) struct Signing<S> {
    pub attempt: Attempt<S>,
    pub columns: Columns,
    pub exact: Exact,
    /// A batch-settlement voucher's lane write, committed with the intent (None: other schemes).
    pub lane: Option<crate::payments::lanes::LaneStep>,
}

/// A recorded payment signed again (same nonce, new validity), with what its intent becomes.
pub(crate) struct Resigned<S> {
    pub attempt: Attempt<S>,
    pub amount: Amount,
    pub valid_after: i64,
    pub valid_before: i64,
}

/// What moved on the chain under a payment: the proven transaction (None: not found) and,
/// for a charge that may be lower than signed (`upto`), what moved.
#[derive(Debug, Clone, Default)]
pub(crate) struct Landed {
    pub tx: Option<String>,
    pub charged: Option<U256>,
}

/// The chain's verdict on a recorded payment, for a takeover or a reused key.
#[derive(Debug, Clone)]
pub(crate) enum Fate {
    /// It moved money: never pay again.
    Landed(Landed),
    /// Unused and still valid: it may be sent again as recorded (it moves money at most once).
    Live,
    /// Unused, but it may still land and cannot be sent again now: nothing is signed (503).
    Wait(&'static str),
    /// It can never land: it may be signed again with the same nonce.
    Dead,
}

/// What the chain confirms after a served answer.
#[derive(Debug, Clone)]
pub(crate) struct Confirmed {
    pub status: PaymentStatus,
    pub tx: Option<String>,
    /// Where the chain and the upstream's claim disagree, or what could not be read.
    pub note: Option<String>,
    pub charged: Option<U256>,
    /// What the upstream said it charged (`upto`), beside what the chain shows.
    pub claimed_amount: Option<String>,
}

/// What an answer to a paid request is, to a scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The upstream served the call (maybe claiming a settlement).
    Served,
    /// The upstream refused the payment (402, or a scheme's own refusal status).
    Refused,
    /// A 402 carrying a settlement claim and no answer (EVM `settlement_pending`).
    SettlementClaim,
}

/// What `reconcile` reads of a recorded payment nobody owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It moved money.
    Used,
    /// Unused; it can never move money once its `validBefore` (plus a margin) has passed.
    Unused,
    /// It can still land (Solana: its blockhash has not expired, or its failure is not final).
    MayLand,
    /// It can never land.
    NeverLands,
}

/// The chain readers of the schemes, in a call ([`Chains::of`]) and in `reconcile`.
#[derive(Clone, Copy)]
pub(crate) struct Chains<'a> {
    pub evm: &'a crate::x402::Chain,
    pub solana: Option<&'a crate::chains::solana::SolanaRpcs>,
}

impl<'a> Chains<'a> {
    /// The router's chain readers.
    pub fn of(state: &'a crate::state::AppState) -> Self {
        Self { evm: &state.chain, solana: state.solana.as_deref().map(|s| &*s.rpcs) }
    }
}

/// One payment scheme. Its methods are the mechanics of one step of the walk; the walk decides
/// the order, writes the ledger and stops for the operator.
pub(crate) trait Scheme: Sync {
    /// The record a signature of this scheme leaves (the ledger's `signed_authorization`).
    type Signed: Clone + Send + Sync + serde::Serialize;
    /// The option of a 402 this scheme chose to pay.
    type Choice: Send + Sync;
    /// Chain reads a new payment of this scheme needs, started beside the choice (so they cost
    /// no round trip of their own on the paid path).
    type Prepared: Send;

    // --- a new payment ---

    /// Whether the 402 offers anything this scheme could pay.
    fn offered(&self, pc: &PaidCall<'_>, required: &PaymentRequired) -> bool;

    /// The reads to start beside the choice.
    fn prepare(&self, pc: &PaidCall<'_>) -> impl Future<Output = Self::Prepared> + Send;

    /// The cheapest option the agent's limits, the router's configuration and `max_amount`
    /// allow, or why none.
    fn choose(
        &self,
        pc: &PaidCall<'_>,
        required: &PaymentRequired,
    ) -> impl Future<Output = Result<Result<Self::Choice, Declined>, Error>> + Send;

    /// Signs a new payment of `choice` with the request's nonce (nothing leaves yet).
    fn sign(
        &self,
        pc: &PaidCall<'_>,
        required: &PaymentRequired,
        choice: &Self::Choice,
        prepared: Self::Prepared,
    ) -> impl Future<Output = Result<Result<Signing<Self::Signed>, Stop>, Error>> + Send;

    /// Whether a payment of this scheme may be paid ahead on known terms (`ahead.rs`).
    fn pays_ahead(&self) -> bool;

    /// The upstream's 402 to a payment ahead asked other terms: signs them with the same nonce
    /// when that can move money at most once (the same nonce domain), with whether the amount
    /// changed. `None`: a refusal (nothing signed).
    fn sign_changed_terms(
        &self,
        pc: &PaidCall<'_>,
        first: (&PaymentRequired, &Self::Choice, &Attempt<Self::Signed>),
        asked: (&PaymentRequired, &Self::Choice),
    ) -> impl Future<Output = Result<Option<Signing<Self::Signed>>, Error>> + Send;

    /// The terms of `choice` as an operator approves them (`crate::approvals`).
    fn terms(&self, choice: &Self::Choice) -> crate::approvals::Terms;

    /// The amount of a choice.
    fn amount(&self, choice: &Self::Choice) -> Amount;

    // --- a recorded payment ---

    /// Decodes the row's signed record.
    ///
    /// # Errors
    /// [`DecodeError`] when it cannot be read.
    fn decode(&self, row: RowRef<'_>) -> Result<Recorded<Self::Signed>, DecodeError>;

    /// Why a recorded payment may no longer be sent or signed again as the router is configured
    /// now (its asset, its amount under the agent's current cap), if it may not.
    fn still_payable(
        &self,
        pc: &PaidCall<'_>,
        recorded: &Recorded<Self::Signed>,
        exact: &Exact,
        spend: &crate::payments::Spend,
    ) -> Result<Option<Declined>, Error>;

    /// Signs a recorded payment that can never land again, with its nonce (new validity).
    fn sign_again(
        &self,
        pc: &PaidCall<'_>,
        recorded: &Recorded<Self::Signed>,
        exact: &Exact,
    ) -> impl Future<Output = Result<Resigned<Self::Signed>, Error>> + Send;

    // --- the chain ---

    /// Whether a payment that left moved money (proven, lowering an `upto` reservation to what
    /// moved). `Err`: the chain could not say.
    fn landed(
        &self,
        pc: &PaidCall<'_>,
        attempt: &Attempt<Self::Signed>,
    ) -> impl Future<Output = Result<Option<Landed>, Unread>> + Send;

    /// The chain's verdict on a recorded payment, for a takeover.
    ///
    /// # Errors
    /// [`Error`] (503) when the chain cannot say: nothing is decided or signed.
    fn fate(
        &self,
        pc: &PaidCall<'_>,
        recorded: &Recorded<Self::Signed>,
    ) -> impl Future<Output = Result<Fate, Error>> + Send;

    /// What the chain confirms of a served answer (its settlement claim `claim`, if any).
    fn confirm(
        &self,
        pc: &PaidCall<'_>,
        attempt: &Attempt<Self::Signed>,
        claim: Option<&SettlementResponse>,
    ) -> impl Future<Output = Confirmed> + Send;

    /// How `crate::recovery` proves a re-sent answer of this payment (it cannot sign).
    fn proof<'a>(&self, chains: &Chains<'a>, signed: &'a Self::Signed) -> Option<crate::recovery::Proof<'a>>;

    /// `reconcile`'s reading of a recorded payment nobody owns (its record checked against
    /// its row: one that disagrees is not trusted).
    fn verdict(&self, chains: &Chains<'_>, row: RowRef<'_>) -> impl Future<Output = Result<Verdict, Unread>> + Send;

    /// What a spent payment's settling transaction moved, for a charge still unproven (`upto`,
    /// or terms signed again): `None` when it cannot be read now (the maximum stays charged).
    /// `Err`: the stored record is unreadable. By default none: a scheme whose payments move
    /// exactly what they sign (Solana) or whose charge is not on the chain (a voucher).
    fn proven_charge(
        &self,
        _chains: &Chains<'_>,
        _row: RowRef<'_>,
    ) -> impl Future<Output = Result<Option<Amount>, Unread>> + Send {
        async { Ok(None) }
    }

    /// What the transaction `tx` moved out of the payer's wallet for a payment whose terms were
    /// signed again (the larger amount stays charged until this is read). By default never
    /// read: only a scheme that signs changed terms in one nonce domain needs it.
    fn moved_by(
        &self,
        _pc: &PaidCall<'_>,
        _signed: &Self::Signed,
        _tx: &str,
    ) -> impl Future<Output = Option<U256>> + Send {
        async { None }
    }

    // --- answers ---

    /// What an answer to a paid request is.
    fn classify(&self, resp: &UpstreamResponse) -> Answer;

    /// Whether an answer to a payment ahead may ask other terms, to be signed with
    /// [`Self::sign_changed_terms`] (`ahead.rs`). By default: a refusal.
    fn reprices(&self, resp: &UpstreamResponse) -> bool {
        resp.status == 402 && self.classify(resp) == Answer::Refused
    }

    /// A refusal of this scheme's own (e.g. a Permit2 allowance the wallet has not given): its
    /// code and the operator's instructions, when the payment did not move. By default none.
    fn refusal(&self, _signed: &Self::Signed, _reasons: &crate::x402::wire::RefusalReasons) -> Option<(Code, String)> {
        None
    }

    /// The outcome of a 402 with a settlement claim ([`Answer::SettlementClaim`]).
    fn settlement_claim(
        &self,
        pc: &PaidCall<'_>,
        attempt: &Attempt<Self::Signed>,
        resp: UpstreamResponse,
    ) -> impl Future<Output = crate::relay::Outcome> + Send;

    /// Why a payment that left and is not seen on the chain may still move money.
    fn unseen(&self) -> &'static str;

    /// Whether a lost answer of this scheme's payment may be re-accessed by signing in as the
    /// payer (Sign-In-With-X).
    fn reaccesses(&self) -> bool;

    // --- showing and counting ---

    /// The `payment` object of a payment of this scheme.
    fn view(
        &self,
        version: X402Version,
        nonce: &str,
        signed: &Self::Signed,
        shown: (PaymentStatus, Option<&str>, Option<U256>),
    ) -> PaymentView;

    /// The network, asset and amount `x402_router_paid_amount_total` counts for a payment that
    /// moved money (`charged`: what the chain shows moved, when it may be less than signed).
    fn paid(&self, signed: &Self::Signed, charged: Option<U256>) -> (String, String, U256);
}

/// The stored authorization of a signed record (the ledger's `signed_authorization`).
///
/// # Errors
/// [`Error::Internal`] when it does not serialize.
pub(crate) fn stored<S: serde::Serialize>(signed: &S) -> Result<Value, Error> {
    serde_json::to_value(signed).map_err(|e| Error::Internal(e.into()))
}

/// The cheapest of a 402's `options` that `refusal` lets pass, with its raw entry; otherwise
/// the code of the refusal that got furthest (its rank) and every option's reason, each named
/// `"{label} option {i}"`. The choice every scheme's `choose` makes once its options are read.
pub(crate) fn cheapest_allowed<T: Clone, A: Ord>(
    options: &[(T, &Value)],
    label: &str,
    amount: impl Fn(&T) -> A,
    mut refusal: impl FnMut(&T) -> Option<(u8, Code, String)>,
) -> Result<(T, Value), Declined> {
    let mut best: Option<(&T, &Value)> = None;
    // Why each option was refused, with how far it got (the 402's code is the furthest one's).
    let mut refusals: Vec<(u8, Code, String)> = Vec::new();
    for (i, (terms, raw)) in options.iter().enumerate() {
        match refusal(terms) {
            Some((rank, code, why)) => refusals.push((rank, code, format!("{label} option {i}: {why}"))),
            None if best.is_none_or(|(b, _)| amount(terms) < amount(b)) => best = Some((terms, *raw)),
            None => {}
        }
    }
    best.map(|(t, r)| (t.clone(), r.clone())).ok_or_else(|| {
        let code = refusals.iter().max_by_key(|r| r.0).map_or(Code::PaymentUnsupported, |r| r.1);
        (code, refusals.into_iter().map(|r| r.2).collect::<Vec<_>>().join("; "))
    })
}
