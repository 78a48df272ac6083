//! The registry of payment schemes: the one place that names them (`evm/`, `svm/`) and says
//! which one pays a 402 and which one a ledger row belongs to. Everything else reaches a
//! scheme through [`Scheme`].
//!
//! Order: batch-settlement first, when the operator enabled it (`X402_SCHEMES`) and the 402
//! offers an option of it that may be paid (a voucher costs no settlement wait); then EVM, the
//! router's default scheme (its choice answers every 402, a decline naming why); Solana pays
//! only when no EVM option may be paid and the 402 offers a Solana one. A row belongs to
//! batch-settlement when its stored record says so, to Solana when its network is a `solana:`
//! one.

use serde_json::Value;

use super::batch::Batch;
use super::evm::Evm;
use super::scheme::{Chains, RowRef, Scheme, Unread, Verdict};
use super::svm::Svm;
use super::{PaidCall, Resume, declined};
use crate::money::Amount;
use crate::payments::PaymentStatus;
use crate::payments::sealed::Opened;
use crate::payments::store::PaymentRow;
use crate::recovery::Recovery;
use crate::relay::view::{DecodeError, PaymentView};
use crate::relay::{Error, Outcome};
use crate::upstream::{UpstreamClient, UpstreamResponse};
use crate::x402::PaymentRequired;

/// Pays a 402 with the first scheme that may pay it (an intent this request recorded earlier
/// is resumed instead: never a second payment).
///
/// # Errors
/// [`Error`] when nothing may be recorded.
pub(super) async fn pay(
    pc: &PaidCall<'_>,
    required: &PaymentRequired,
    first: UpstreamResponse,
) -> Result<Outcome, Error> {
    if Batch.offered(pc, required)
        && let Ok(choice) = Batch.choose(pc, required).await?
    {
        if let Some(intent) = pc.earlier_intent().await? {
            return pc.resume(intent, Resume::KeyReused).await;
        }
        return pc.pay_with(&Batch, (required, &choice, ()), first).await;
    }
    // The agent's limits, an intent of an earlier attempt and the chain's reads: at once.
    let (chosen, existing, prepared) = tokio::join!(Evm.choose(pc, required), pc.earlier_intent(), Evm.prepare(pc));
    let accepts = || Value::Array(required.raw_accepts.clone());
    match chosen? {
        Ok(choice) => {
            // This very request was paid for under this key before (the key expired and was
            // reused for the same request): never a second payment; resume it instead.
            if let Some(intent) = existing? {
                return pc.resume(intent, Resume::KeyReused).await;
            }
            pc.pay_with(&Evm, (required, &choice, prepared), first).await
        }
        Err(_) if Svm.offered(pc, required) => {
            if let Some(intent) = existing? {
                return pc.resume(intent, Resume::KeyReused).await;
            }
            match Svm.choose(pc, required).await? {
                Ok(choice) => pc.pay_with(&Svm, (required, &choice, ()), first).await,
                Err((code, why)) => Ok(declined(pc.state, code, Some(first), &why, accepts())),
            }
        }
        Err((code, why)) => Ok(declined(pc.state, code, Some(first), &why, accepts())),
    }
}

/// Pays known terms with the first request, with the first scheme that pays ahead and may pay
/// them (in the order of [`pay`]). `None`: nothing was signed or sent (the caller probes unpaid instead).
///
/// # Errors
/// [`Error`] when nothing may be recorded.
pub(super) async fn pay_ahead(pc: &PaidCall<'_>, required: &PaymentRequired) -> Result<Option<Outcome>, Error> {
    debug_assert!(Evm.pays_ahead() && !Svm.pays_ahead() && Batch.pays_ahead());
    // A voucher first, as on a live 402: on the lane the router holds for it, whose state
    // (what the server charged) the ledger knows.
    if Batch.offered(pc, required) {
        let (chosen, existing) = tokio::join!(Batch.choose(pc, required), pc.earlier_intent());
        if let Ok(choice) = chosen? {
            return pc.pay_ahead_with(&Batch, (required, &choice, ()), existing?).await;
        }
    }
    let (chosen, existing, prepared) = tokio::join!(Evm.choose(pc, required), pc.earlier_intent(), Evm.prepare(pc));
    let Ok(choice) = chosen? else {
        return Ok(None);
    };
    pc.pay_ahead_with(&Evm, (required, &choice, prepared), existing?).await
}

/// Whether `row` is a Solana payment.
fn is_svm(network: &str) -> bool {
    crate::chains::solana::is_solana_network(network)
}

/// Whether `stored` (a row's `signed_authorization`) is a batch-settlement voucher.
fn is_batch(stored: &Value) -> bool {
    Batch::owns(stored)
}

/// Resumes a recorded intent with its scheme.
///
/// # Errors
/// [`Error`] when the chain cannot say (nothing decided or paid).
pub(super) async fn resume(pc: &PaidCall<'_>, row: PaymentRow, mode: Resume) -> Result<Outcome, Error> {
    if is_batch(&row.signed_authorization) {
        pc.resume_with(&Batch, row, mode).await
    } else if is_svm(&row.network) {
        pc.resume_with(&Svm, row, mode).await
    } else {
        pc.resume_with(&Evm, row, mode).await
    }
}

/// The `payment` object of a recorded intent of any scheme, in `status`.
///
/// # Errors
/// [`DecodeError`] when the row cannot be read.
pub(crate) fn view_of_row(
    row: &PaymentRow,
    status: PaymentStatus,
    tx: Option<&str>,
) -> Result<PaymentView, DecodeError> {
    fn view<S: Scheme>(
        s: &S,
        row: &PaymentRow,
        status: PaymentStatus,
        tx: Option<&str>,
    ) -> Result<PaymentView, DecodeError> {
        let r = s.decode(RowRef::of(row))?;
        Ok(s.view(r.version, &r.nonce, &r.signed, (status, tx, None)))
    }
    if is_batch(&row.signed_authorization) {
        view(&Batch, row, status, tx)
    } else if is_svm(&row.network) {
        view(&Svm, row, status, tx)
    } else {
        view(&Evm, row, status, tx)
    }
}

/// `reconcile`'s reading of a recorded intent of any scheme.
///
/// # Errors
/// Why the chain (or the row) could not be read: the intent is left as it is.
pub(crate) async fn verdict(chains: &Chains<'_>, row: RowRef<'_>) -> Result<Verdict, Unread> {
    if is_batch(row.authorization) {
        Batch.verdict(chains, row).await
    } else if is_svm(row.network) {
        Svm.verdict(chains, row).await
    } else {
        Evm.verdict(chains, row).await
    }
}

/// What a spent intent's settling transaction moved, for a charge still unproven.
///
/// # Errors
/// Why the stored record cannot be read.
pub(crate) async fn proven_charge(chains: &Chains<'_>, row: RowRef<'_>) -> Result<Option<Amount>, Unread> {
    if is_batch(row.authorization) {
        Batch.proven_charge(chains, row).await
    } else if is_svm(row.network) {
        Svm.proven_charge(chains, row).await
    } else {
        Evm.proven_charge(chains, row).await
    }
}

/// Asks the upstream of a settled intent of any scheme for its lost answer again
/// (`crate::recovery`, which cannot sign), proven by that scheme's chain.
///
/// # Errors
/// Why the intent's record or its chain cannot be had (nothing was sent).
pub(crate) async fn recover(
    chains: &Chains<'_>,
    upstream: &UpstreamClient,
    (row, opened): (&PaymentRow, &Opened),
    deadline: std::time::Instant,
) -> Result<Recovery, &'static str> {
    async fn with<S: Scheme>(
        s: &S,
        chains: &Chains<'_>,
        upstream: &UpstreamClient,
        (row, opened): (&PaymentRow, &Opened),
        deadline: std::time::Instant,
    ) -> Result<Recovery, &'static str> {
        let recorded = s.decode(RowRef::of(row)).map_err(|_| "the stored payment is unreadable")?;
        let proof = s.proof(chains, &recorded.signed).ok_or("no RPC URL for the payment's network")?;
        Ok(crate::recovery::recover(upstream, proof, (row, opened), deadline).await)
    }
    if is_batch(&row.signed_authorization) {
        with(&Batch, chains, upstream, (row, opened), deadline).await
    } else if is_svm(&row.network) {
        with(&Svm, chains, upstream, (row, opened), deadline).await
    } else {
        with(&Evm, chains, upstream, (row, opened), deadline).await
    }
}

/// Batch-settlement channels as the rest of the router reaches them: reading one on the chain
/// and closing it (`admin`, `reconcile`, the close route). The one door into `batch/` past the
/// scheme seam (checked by `structure::a_scheme_is_a_folder_only_the_registry_names`).
pub mod channels {
    pub use super::super::batch::channel::ChannelError;
    pub(crate) use super::super::batch::channel::{Reading, is_final, lane_of, read, voucher_verdict};
    pub use super::super::batch::close::Closer;
    pub(crate) use super::super::batch::close::{Withdraw, refund, withdraw};
}
