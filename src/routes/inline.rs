//! Schemas `#[utoipa::path]` cannot state by itself (a parameter's default or enum of
//! strings, a `const` header, a choice of `Error_<code>` bodies): an operation names one as
//! `inline(Option<Limit<50>>)`, `body = inline(Conflict)`.

use utoipa::PartialSchema;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::{Ref, RefOr};

use crate::codes::Code;
use crate::payments::PaymentStatus;

/// `limit`: rows per page, 1–500, default `DEFAULT`.
pub struct Limit<const DEFAULT: u16>;

impl<const DEFAULT: u16> PartialSchema for Limit<DEFAULT> {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(1))
            .maximum(Some(500))
            .default(Some(DEFAULT.into()))
            .into()
    }
}

/// `limit` of `GET /discovery`: resources per page, 1–100, default 20.
pub struct DiscoveryLimit;

impl PartialSchema for DiscoveryLimit {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(1))
            .maximum(Some(100))
            .default(Some(20.into()))
            .into()
    }
}

/// `older_than_secs` of `status=stuck`: at least 0, default 120.
pub struct OlderThanSecs;

impl PartialSchema for OlderThanSecs {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .minimum(Some(0))
            .default(Some(crate::audit::DEFAULT_STUCK_SECS.into()))
            .into()
    }
}

/// `status` of `/audit/payments`: a ledger status or one of the two derived filters.
pub struct PaymentStatusFilter;

impl PartialSchema for PaymentStatusFilter {
    fn schema() -> RefOr<Schema> {
        let statuses = PaymentStatus::ALL.iter().map(|s| s.as_str()).chain(["paid_not_served", "stuck"]);
        ObjectBuilder::new().schema_type(Type::String).enum_values(Some(statuses)).into()
    }
}

/// `X-Idempotent-Replay`: only ever `true` (an `enum` of one: utoipa's builder has no `const`).
pub struct ReplayTrue;

impl PartialSchema for ReplayTrue {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["true"])).into()
    }
}

/// `Retry-After`: whole seconds (no `int64` format, which `i64` would add).
pub struct Seconds;

impl PartialSchema for Seconds {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::Integer).into()
    }
}

impl utoipa::ToSchema for Seconds {}

/// Any JSON object (a JSON-RPC message).
pub struct JsonObject;

impl PartialSchema for JsonObject {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::Object).into()
    }
}

impl utoipa::ToSchema for JsonObject {}

/// `Error_<code>` of one code, or one of several.
fn errors(codes: &[Code]) -> RefOr<Schema> {
    let refs: Vec<Ref> = codes.iter().map(|c| Ref::from_schema_name(format!("Error_{}", c.as_str()))).collect();
    match <[Ref; 1]>::try_from(refs) {
        Ok([one]) => RefOr::Ref(one),
        Err(refs) => refs.into_iter().fold(OneOfBuilder::new(), OneOfBuilder::item).into(),
    }
}

macro_rules! errors {
    ($($(#[$doc:meta])* $name:ident => [$($code:ident),+];)*) => {$(
        $(#[$doc])*
        pub struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                errors(&[$(Code::$code),+])
            }
        }

        impl utoipa::ToSchema for $name {}
    )*};
}

errors! {
    /// 400 of `/route`.
    RouteBadRequest => [BadRequest, IdempotencyKeyRequired];
    /// 403 of `/route`.
    RouteForbidden => [AgentDisabled, UpstreamNotAllowed, ApprovalDenied, ApprovalExpired];
    /// 202 of `/route`: a payment waiting for an operator.
    RouteHeld => [ApprovalPending];
    /// 409 of `/route`.
    RouteConflict => [IdempotencyKeyReused, IdempotencyKeyInFlight, Superseded, AlreadyPaid];
    /// 413.
    PayloadTooLarge => [PayloadTooLarge];
    /// 429.
    RateLimited => [RateLimited];
    /// 409 of a confirmation of a proposed change (the two-person rule).
    ChangeConflict => [ChangeStale, ChangeDecided];
    /// 403 of a confirmation: a viewer's token or an agent key, or the change's proposer.
    ConfirmForbidden => [OperatorOnly, OwnChange];
    /// 403 of an approval: not an admin, or (the two-person rule) the bootstrap token.
    ApproveForbidden => [OperatorOnly, OwnChange];
    /// 503 of `/route`.
    RouteUnavailable => [DatabaseUnavailable, PaymentNetworkUnavailable, PaymentsPaused];
}

/// `Amount`: atomic units of an asset as the router writes them ([`crate::x402::Amount`]
/// serializes as a decimal string).
pub struct Amount;

impl PartialSchema for Amount {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[0-9]+$"))
            .description(Some("Atomic units of the asset, decimal."))
            .examples(["10000"])
            .into()
    }
}

impl utoipa::ToSchema for Amount {}

/// `Address`: an EVM or a Solana address as the router reads and writes it.
pub struct Address;

impl PartialSchema for Address {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^(0x[0-9a-fA-F]{40}|[1-9A-HJ-NP-Za-km-z]{32,44})$"))
            .description(Some(
                "EVM address (EIP-55 checksummed when the router writes it), or a Solana address (base58, case-sensitive) on `solana:` networks.",
            ))
            .into()
    }
}

impl utoipa::ToSchema for Address {}
