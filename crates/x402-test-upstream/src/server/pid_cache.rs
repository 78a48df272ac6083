//! The payment-identifier response cache of `/v2/pid` (the extension's section "Recovering a
//! Lost Response"), in process memory: this is a fixture.
//!
//! - The id is looked up *before* the payment is verified (a re-send fails verification once
//!   its payment settled), so the entry is bound to the exact request: method, URL, the
//!   caller's credentials (`Authorization`, `Cookie`, `X-Api-Key`), body and the payment
//!   header's bytes. Anything else with that id is 409.
//! - While the original is being handled: 503 with `Retry-After: 1`; the re-send is not
//!   processed.
//! - Once handled: the stored answer, as sent, including `PAYMENT-RESPONSE`.
//! - A request refused before settling (402) or dropped leaves no entry.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use actix_web::HttpResponse;
use actix_web::http::StatusCode;
use actix_web::http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use serde_json::json;

use crate::wire;

/// An answer as it was sent.
#[derive(Clone, Debug)]
pub(super) struct StoredAnswer {
    pub(super) status: StatusCode,
    pub(super) body: Vec<u8>,
    /// The `PAYMENT-RESPONSE` header, if the answer carried one.
    pub(super) settlement: Option<String>,
}

impl StoredAnswer {
    pub(super) fn response(&self) -> HttpResponse {
        let mut r = HttpResponse::build(self.status);
        r.insert_header((CONTENT_TYPE, "application/json"));
        if let Some(s) = &self.settlement {
            r.insert_header((wire::PAYMENT_RESPONSE, s.clone()));
            r.insert_header((CACHE_CONTROL, "private"));
        }
        r.body(self.body.clone())
    }
}

#[derive(Debug)]
enum Entry {
    InFlight { binding: Vec<u8> },
    Done { binding: Vec<u8>, answer: StoredAnswer },
}

/// What to do with a request that carries a payment id.
pub(super) enum Lookup {
    /// First sight of the id: handle it (then [`PidCache::finish`] or [`PidCache::forget`]).
    Handle,
    /// Answer this without handling the request.
    Answer(HttpResponse, Hit),
}

/// Which kind of cached answer was given (for the counters).
pub(super) enum Hit {
    Replay,
    InFlight,
    Conflict,
}

#[derive(Clone, Default)]
pub(super) struct PidCache {
    entries: Arc<Mutex<HashMap<String, Entry>>>,
}

/// The exact request an id is bound to.
pub(super) fn binding(method: &str, uri: &str, credentials: &[u8], body: &[u8], payment_header: &[u8]) -> Vec<u8> {
    let mut b =
        Vec::with_capacity(method.len() + uri.len() + credentials.len() + body.len() + payment_header.len() + 40);
    for part in [method.as_bytes(), uri.as_bytes(), credentials, body, payment_header] {
        b.extend_from_slice(&(part.len() as u64).to_be_bytes());
        b.extend_from_slice(part);
    }
    b
}

impl PidCache {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Looks `id` up for a request bound to `binding`; a new id is marked in flight.
    /// `always_conflict`: a hostile cache that refuses every re-send.
    pub(super) fn lookup(&self, id: &str, binding: Vec<u8>, always_conflict: bool) -> Lookup {
        let mut entries = self.lock();
        let conflict = || {
            let body = json!({ "error": "payment_identifier_conflict" });
            Lookup::Answer(HttpResponse::Conflict().json(body), Hit::Conflict)
        };
        match entries.get(id) {
            None => {
                entries.insert(id.to_owned(), Entry::InFlight { binding });
                Lookup::Handle
            }
            Some(_) if always_conflict => conflict(),
            Some(Entry::InFlight { binding: b } | Entry::Done { binding: b, .. }) if *b != binding => conflict(),
            Some(Entry::InFlight { .. }) => {
                let body = json!({ "error": "the original request with this payment identifier is still in flight" });
                Lookup::Answer(
                    HttpResponse::ServiceUnavailable().insert_header((RETRY_AFTER, "1")).json(body),
                    Hit::InFlight,
                )
            }
            Some(Entry::Done { answer, .. }) => Lookup::Answer(answer.response(), Hit::Replay),
        }
    }

    /// Stores the answer of a handled request.
    pub(super) fn finish(&self, id: &str, answer: StoredAnswer) {
        let mut entries = self.lock();
        if let Some(Entry::InFlight { binding }) = entries.remove(id) {
            entries.insert(id.to_owned(), Entry::Done { binding, answer });
        }
    }

    /// Forgets a request that was refused or dropped before settling.
    pub(super) fn forget(&self, id: &str) {
        self.lock().remove(id);
    }
}
