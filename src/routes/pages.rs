//! The keyset-paginated bodies (`{"<rows>": [...], "next_cursor": "…" | null}`): served by
//! the handlers and described by the OpenAPI document from the same types. The cursor comes
//! first so that the members stay in name order, as before.

use serde::Serialize;
use utoipa::ToSchema;

use crate::audit::store::PaymentView;
use crate::operators::events::OperatorEvent;
use crate::receipts::Receipt;

/// A page of receipts (`GET /receipts`, `GET /audit/receipts`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ReceiptPage)]
pub struct ReceiptPage {
    /// `null` on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
    pub receipts: Vec<Receipt>,
}

/// A page of payment intents (`GET /audit/payments`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = PaymentPage)]
pub struct PaymentPage {
    /// `null` on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
    pub payments: Vec<PaymentView>,
}

/// A page of operator events (`GET /audit/operator-events`).
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = OperatorEventPage)]
pub struct OperatorEventPage {
    pub events: Vec<OperatorEvent>,
    /// `null` on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
}
