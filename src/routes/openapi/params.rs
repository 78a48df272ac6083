//! Schemas of query parameters the `params(...)` of `#[utoipa::path]` cannot state (a
//! default, an enum of strings): a parameter names one as `inline(Option<Limit<50>>)`.

use utoipa::PartialSchema;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};

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
