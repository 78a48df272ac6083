//! Terms that changed between a payment ahead and the upstream's `402` to it: signed again
//! with the **same nonce**, only in the same nonce domain (network, token, scheme, transfer
//! method), so the token (or Permit2) lets at most one of the two authorizations move money.

use crate::relay::Error;
use crate::relay::pay::call::PaidCall;
use crate::relay::pay::scheme::{Attempt, Signing};
use crate::x402::{self, PaymentRequired, Requirement, SignedPayment};

use super::sponsor::Sponsor;

/// The terms `asked` (chosen `chosen`) signed with the nonce of `first` (paid ahead on
/// `paid_terms`), when they differ from what was paid, lie in its nonce domain, and the first
/// authorization is not used. `None`: nothing signed (the 402 is a refusal).
///
/// # Errors
/// [`Error`] for a broken invariant.
pub(super) async fn sign_changed_terms(
    pc: &PaidCall<'_>,
    (paid_required, paid_terms, first): (&PaymentRequired, &Requirement, &Attempt<SignedPayment>),
    (asked, chosen): (&PaymentRequired, &Requirement),
) -> Result<Option<Signing<SignedPayment>>, Error> {
    if asked.version != paid_required.version
        || chosen.raw_json() == paid_terms.raw_json()
        || !same_nonce_domain(paid_terms, chosen)
    {
        return Ok(None);
    }
    // Used already (or unreadable): the refusal path asks the chain again and says so.
    if !matches!(super::confirm::chain_used(pc.state, &first.signed).await, Ok(false)) {
        return Ok(None);
    }
    // A permit sent with the first authorization may still be submitted: the second carries
    // the same one (never a second permit at the same token nonce), when it covers the new
    // price; otherwise no permit at all (the facilitator's 412 names the operator's command).
    let sponsor = match super::sponsor::recorded(&first.header.1) {
        Some((p, info)) if p.amount >= chosen.amount().as_u256() => Sponsor::Reuse(info),
        Some(_) => Sponsor::No,
        None => match super::sponsor::plan(pc.state, asked.extensions.as_ref(), chosen).await? {
            Ok(sponsor) => sponsor,
            Err(_) => return Ok(None),
        },
    };
    let context = pc.context_of(asked)?;
    let Ok(second) = super::sign::sign(pc.state, asked.version, chosen, &context, first.signed.nonce(), &sponsor)
    else {
        return Ok(None);
    };
    let second = Attempt { id: first.id, ..second };
    Ok(Some(super::sign::signing(pc, (asked, chosen), &context, second)?))
}

/// Whether an authorization of `b` would share `a`'s nonce space: the same network, token,
/// scheme and transfer method (EIP-3009 nonces live in the token, Permit2's in Permit2).
fn same_nonce_domain(a: &Requirement, b: &Requirement) -> bool {
    a.network() == b.network()
        && a.asset() == b.asset()
        && a.scheme() == b.scheme()
        && x402::permit2::scheme_of(a).is_some() == x402::permit2::scheme_of(b).is_some()
}
