//! How a routed call ended, and the one path from there to what is recorded: the answer
//! (HTTP status and envelope), the idempotency status, the receipt and the payment's final
//! state. Every constructor of an outcome is a variant here; [`Outcome::render`] is the only
//! place that decides status codes, envelopes and receipts, so every outcome of the same
//! kind gets them the same way.

use serde_json::Value;
use uuid::Uuid;

use super::envelope;
use super::request::RouteCall;
use super::view::PaymentView;
use crate::codes::Code;
use crate::idempotency::{Ownership, Status, Stored, canonical};
use crate::payments::Final;
use crate::receipts;
use crate::secrets::Redaction;
use crate::upstream::UpstreamResponse;

/// The payment part of an outcome: what the envelope shows, and what the ledger records.
#[derive(Debug, Clone)]
pub struct PaymentNote {
    /// The envelope's `payment` object.
    pub shown: PaymentView,
    /// The intent's final state (`None` when no intent was written in the ledger).
    pub ledger: Option<Final>,
}

/// A failed call: 502 (504 for timeouts), idempotency status `errored`.
#[derive(Debug)]
pub struct Failure {
    /// The machine-readable code of the error body.
    pub code: Code,
    pub timeout: bool,
    pub message: String,
    /// The upstream's answer known so far (e.g. the 402 that was not paid).
    pub upstream: Option<UpstreamResponse>,
    pub payment: Option<PaymentNote>,
    /// Reasons passed through unchanged beside the message (`invalidReason`, `errorReason`).
    pub reasons: Vec<(&'static str, String)>,
    /// Whether the call gets a receipt.
    pub receipt: bool,
}

impl Failure {
    /// A 502 with a receipt and nothing else known.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            timeout: false,
            message: message.into(),
            upstream: None,
            payment: None,
            reasons: vec![],
            receipt: true,
        }
    }

    pub fn timeout(mut self, timeout: bool) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn upstream(mut self, resp: UpstreamResponse) -> Self {
        self.upstream = Some(resp);
        self
    }

    pub fn payment(mut self, payment: Option<PaymentNote>) -> Self {
        self.payment = payment;
        self
    }

    pub fn reason(mut self, name: &'static str, value: Option<String>) -> Self {
        if let Some(v) = value {
            self.reasons.push((name, v));
        }
        self
    }

    pub fn without_receipt(mut self) -> Self {
        self.receipt = false;
        self
    }
}

/// How a routed call ended, before it is recorded.
#[derive(Debug)]
pub enum Outcome {
    /// The upstream answered (after payment, if any): < 500 ⇒ 200 + envelope, `completed`;
    /// ≥ 500 ⇒ 502 with the envelope fields, `errored`.
    Answered { resp: UpstreamResponse, payment: Option<PaymentNote> },
    /// The upstream asks for a payment the router will not make: 402, `completed`, nothing
    /// paid. `upstream` is the 402 itself when this attempt received it.
    Declined { code: Code, upstream: Option<UpstreamResponse>, reason: String, accepts: Value },
    /// The call failed: 502/504, `errored`.
    Failed(Failure),
    /// This very request was already paid under this key before the key expired (it was
    /// reused for the same request): 409, `errored`, nothing sent, no new receipt; the body
    /// points at the receipt recorded for the payment.
    AlreadyPaid { previous_receipt: Option<Uuid>, payment: PaymentView },
}

impl Outcome {
    /// The payment the outcome records, if any.
    pub fn payment(&self) -> Option<&PaymentNote> {
        match self {
            Self::Answered { payment, .. } => payment.as_ref(),
            Self::Failed(f) => f.payment.as_ref(),
            Self::Declined { .. } | Self::AlreadyPaid { .. } => None,
        }
    }
}

/// What the recording transaction writes for an outcome.
#[derive(Debug)]
pub struct Rendered {
    pub stored: Stored,
    pub receipt: Option<receipts::Draft>,
    pub payment: Option<Final>,
}

/// The idempotency status, HTTP status and envelope bytes of an upstream's answer (after a
/// payment, if any): < 500 ⇒ 200 + envelope; ≥ 500 ⇒ 502 with the envelope fields. The one
/// rendering of an answer, for `/route` and for the answers `reconcile` recovers.
pub fn answered(resp: &UpstreamResponse, payment: Option<&PaymentView>, receipt_id: Uuid) -> (Status, u16, Vec<u8>) {
    if resp.status < 500 {
        (Status::Completed, 200, envelope::envelope(resp, payment, receipt_id).to_bytes())
    } else {
        let msg = format!("upstream answered {}", resp.status);
        let body = envelope::error_envelope(Code::UpstreamFailed, &msg, Some(resp), payment, Some(receipt_id));
        (Status::Errored, 502, body.to_bytes())
    }
}

impl Outcome {
    /// Renders the answer, the receipt draft and the payment's final state. The receipt
    /// shows (and signs) the URL with its secret query parameters redacted, and so does any
    /// error the ledger keeps (`redaction`).
    pub fn render(self, own: &Ownership, call: &RouteCall, redaction: &Redaction) -> Rendered {
        // The router's own messages may quote an upstream's words (a 402 it could not read).
        let redacted = |m: String| redaction.text(&m).into_owned();
        let this = match self {
            Self::Failed(mut f) => {
                f.message = redacted(f.message);
                Self::Failed(f)
            }
            Self::Declined { code, upstream, reason, accepts } => {
                Self::Declined { code, upstream, reason: redacted(reason), accepts }
            }
            other => other,
        };
        let mut rendered = this.render_as_is(own, call, redaction);
        if let Some(fin) = rendered.payment.as_mut() {
            fin.error = fin.error.as_deref().map(|e| redaction.text(e).into_owned());
        }
        rendered
    }

    fn render_as_is(self, own: &Ownership, call: &RouteCall, redaction: &Redaction) -> Rendered {
        let receipt_id = Uuid::new_v4();
        let draft =
            |status: Status, upstream: Option<&UpstreamResponse>, payment: Option<&PaymentView>| receipts::Draft {
                id: receipt_id,
                agent_id: own.agent_id,
                idempotency_key: own.key.as_str().to_owned(),
                request_hash: call.request_hash.clone(),
                method: call.upstream.shown_method(),
                url: redaction.url(&call.upstream.url),
                upstream_status: upstream.map(|r| i32::from(r.status)),
                upstream_body_sha256: canonical::sha256_hex(upstream.map_or(&[][..], |r| &r.body[..])),
                payment: payment.map(PaymentView::to_value),
                outcome: status.as_str().to_owned(),
                trace_id: crate::telemetry::current_trace_id(),
            };
        match self {
            Self::Answered { resp, payment } => {
                let shown = payment.as_ref().map(|p| &p.shown);
                let (status, http_status, body) = answered(&resp, shown, receipt_id);
                let receipt = draft(status, Some(&resp), shown);
                Rendered {
                    stored: Stored { status, http_status, body, receipt_id: Some(receipt_id) },
                    receipt: Some(receipt),
                    payment: payment.and_then(|p| p.ledger),
                }
            }
            Self::Declined { code, upstream, reason, accepts } => {
                let status = Status::Completed;
                let body = envelope::Envelope::default()
                    .set("error", &reason)
                    .set("code", &code)
                    .set("accepts", &accepts)
                    .set("receipt_id", &receipt_id)
                    .to_bytes();
                Rendered {
                    stored: Stored { status, http_status: 402, body, receipt_id: Some(receipt_id) },
                    receipt: Some(draft(status, upstream.as_ref(), None)),
                    payment: None,
                }
            }
            Self::AlreadyPaid { previous_receipt, payment } => {
                let error = "this request was already paid under this Idempotency-Key (before the key expired); \
                             the router will not pay again. Its receipt is `previous_receipt_id`; use a new key \
                             to buy again";
                let body = envelope::Envelope::default()
                    .set("error", &error)
                    .set("code", &Code::AlreadyPaid)
                    .set("previous_receipt_id", &previous_receipt)
                    .set("payment", &payment)
                    .set("receipt_id", &Value::Null)
                    .to_bytes();
                Rendered {
                    stored: Stored { status: Status::Errored, http_status: 409, body, receipt_id: None },
                    receipt: None,
                    payment: None,
                }
            }
            Self::Failed(f) => {
                let status = Status::Errored;
                let http_status = if f.timeout { 504 } else { 502 };
                let id = f.receipt.then_some(receipt_id);
                let shown = f.payment.as_ref().map(|p| &p.shown);
                let mut body = envelope::error_envelope(f.code, &f.message, f.upstream.as_ref(), shown, id);
                for (name, value) in &f.reasons {
                    body.set(name, value);
                }
                let body = body.to_bytes();
                let receipt = f.receipt.then(|| draft(status, f.upstream.as_ref(), shown));
                Rendered {
                    stored: Stored { status, http_status, body, receipt_id: id },
                    receipt,
                    payment: f.payment.and_then(|p| p.ledger),
                }
            }
        }
    }
}
