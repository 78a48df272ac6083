//! An intent's exact parts ([`Exact`]) sealed for its ledger row, and opened again.
//!
//! The plaintext is a small binary record (a version tag, then each part as a 4-byte length
//! and its bytes, optional parts behind a presence byte), sealed with the row's identity
//! (agent and payment id) as associated data: sealed bytes copied into another row do not
//! open there.

use uuid::Uuid;

use super::{Keyring, Redaction, SealError};
use crate::payments::sealed::{Exact, Kept, Opened, Sealed, Shown};
use crate::payments::store::{PaymentRow, SentRequest};

/// The version tag of the plaintext record.
const TAG: &[u8; 4] = b"x4s1";

/// The associated data of one row's sealed parts.
fn context(agent_id: Uuid, id: Uuid) -> Vec<u8> {
    let mut c = b"x402-router/payments.sealed/v1\0".to_vec();
    c.extend_from_slice(agent_id.as_bytes());
    c.extend_from_slice(id.as_bytes());
    c
}

/// Seals `exact` for the row `(agent_id, id)` under the current key.
///
/// # Errors
/// [`SealError`] (no random nonce).
pub fn seal(keyring: &Keyring, agent_id: Uuid, id: Uuid, exact: &Exact) -> Result<Sealed, SealError> {
    let (key_id, bytes) = keyring.seal(&context(agent_id, id), &encode(exact))?;
    Ok(Sealed { key_id, bytes })
}

/// What the row shows of `exact`: the URL and the copies of the 402's terms, context and
/// extensions, secret query parameters redacted.
pub fn shown(redaction: &Redaction, exact: &Exact) -> Shown {
    let json = |bytes: &[u8]| {
        serde_json::from_slice::<serde_json::Value>(bytes).map(|v| redaction.json(&v)).unwrap_or_default()
    };
    Shown {
        request_method: exact.request.as_ref().map(|r| r.method.clone()),
        request_url: exact.request.as_ref().map(|r| redaction.text(&r.url).into_owned()),
        requirement: json(&exact.requirement_json),
        context: json(&exact.context_json),
        advertised_extensions: exact.advertised_extensions.as_deref().map(|b| redaction.json_bytes(b)),
    }
}

/// `exact` as the row `(agent_id, id)` keeps it: sealed, and shown.
///
/// # Errors
/// [`SealError`] (no random nonce).
pub fn keep(
    (keyring, redaction): (&Keyring, &Redaction),
    agent_id: Uuid,
    id: Uuid,
    exact: &Exact,
) -> Result<Kept, SealError> {
    Ok(Kept { sealed: seal(keyring, agent_id, id, exact)?, shown: shown(redaction, exact) })
}

/// Opens the row's sealed parts.
pub fn open(keyring: &Keyring, row: &PaymentRow) -> Opened {
    let (Some(bytes), Some(key_id)) = (&row.sealed, &row.sealed_key_id) else {
        return Opened::Dropped;
    };
    match keyring.open(key_id, &context(row.agent_id, row.id), bytes) {
        Ok(plain) => match decode(&plain) {
            Some(exact) => Opened::Exact(Box::new(exact)),
            None => Opened::Unreadable("the sealed record is not one this version reads".into()),
        },
        Err(e) => Opened::Unreadable(e.to_string()),
    }
}

fn put(out: &mut Vec<u8>, part: &[u8]) {
    // Every part is bounded far below 4 GiB (request and response limits).
    out.extend_from_slice(&u32::try_from(part.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(part);
}

fn put_opt(out: &mut Vec<u8>, part: Option<&[u8]>) {
    match part {
        None => out.push(0),
        Some(p) => {
            out.push(1);
            put(out, p);
        }
    }
}

/// The plaintext record of `exact`.
fn encode(exact: &Exact) -> Vec<u8> {
    let mut out = TAG.to_vec();
    match &exact.request {
        None => out.push(0),
        Some(r) => {
            out.push(1);
            put(&mut out, r.method.as_bytes());
            put(&mut out, r.url.as_bytes());
            put(&mut out, &r.headers);
            put_opt(&mut out, r.body.as_deref());
        }
    }
    put(&mut out, exact.header_value.as_bytes());
    put(&mut out, &exact.requirement_json);
    put(&mut out, &exact.context_json);
    put_opt(&mut out, exact.advertised_extensions.as_deref());
    out
}

/// Reads a plaintext record back.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<Vec<u8>> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head.to_vec())
    }

    fn part(&mut self) -> Option<Vec<u8>> {
        let len = self.take(4)?;
        let len = u32::from_be_bytes(len.try_into().ok()?);
        self.take(usize::try_from(len).ok()?)
    }

    fn present(&mut self) -> Option<bool> {
        match self.take(1)?.first()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }

    fn opt(&mut self) -> Option<Option<Vec<u8>>> {
        if self.present()? { self.part().map(Some) } else { Some(None) }
    }

    fn text(&mut self) -> Option<String> {
        String::from_utf8(self.part()?).ok()
    }
}

fn decode(plain: &[u8]) -> Option<Exact> {
    let rest = plain.strip_prefix(TAG.as_slice())?;
    let mut r = Reader(rest);
    let request = if r.present()? {
        Some(SentRequest { method: r.text()?, url: r.text()?, headers: r.part()?, body: r.opt()? })
    } else {
        None
    };
    let exact = Exact {
        request,
        header_value: r.text()?,
        requirement_json: r.part()?,
        context_json: r.part()?,
        advertised_extensions: r.opt()?,
    };
    r.0.is_empty().then_some(exact)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(body: Option<&[u8]>) -> Exact {
        Exact {
            request: Some(SentRequest {
                method: "POST".into(),
                url: "http://u.test/p?api_key=s3cr3t-q&n=1".into(),
                headers: br#"[["authorization","Bearer s3cr3t"]]"#.to_vec(),
                body: body.map(<[u8]>::to_vec),
            }),
            header_value: "eyJ4NDAyVmVyc2lvbiI6Mn0=".into(),
            requirement_json: br#"{"resource":"http://u.test/p?api_key=s3cr3t-q"}"#.to_vec(),
            context_json: br#"{"version":2,"resource":{"url":"http://u.test/p?api_key=s3cr3t-q"}}"#.to_vec(),
            advertised_extensions: Some(br#"{"payment-identifier":{}}"#.to_vec()),
        }
    }

    #[test]
    fn the_record_reads_back_exactly_and_nothing_else_does() {
        for e in [
            exact(Some(b"{\"secret\":\"s3cr3t-b\"}")),
            exact(Some(b"")),
            exact(None),
            Exact { request: None, ..exact(None) },
        ] {
            assert_eq!(decode(&encode(&e)), Some(e.clone()));
            let mut longer = encode(&e);
            longer.push(0);
            assert_eq!(decode(&longer), None);
            let bytes = encode(&e);
            assert_eq!(decode(&bytes[..bytes.len() - 1]), None);
        }
        assert_eq!(decode(b"x4s2"), None);
    }

    #[test]
    fn a_sealed_intent_opens_only_in_its_own_row_and_shows_no_secret() {
        let keyring = Keyring::derived(b"w").unwrap();
        let (agent, id) = (Uuid::new_v4(), Uuid::new_v4());
        let e = exact(None);
        let kept = keep((&keyring, &Redaction::default()), agent, id, &e).unwrap();
        assert!(!kept.sealed.bytes.windows(6).any(|w| w == b"s3cr3t"));
        let shown = format!(
            "{:?} {}",
            kept.shown,
            String::from_utf8_lossy(kept.shown.advertised_extensions.as_deref().unwrap())
        );
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert_eq!(kept.shown.request_url.as_deref(), Some("http://u.test/p?api_key=REDACTED&n=1"));
        assert_eq!(kept.shown.context["resource"]["url"], "http://u.test/p?api_key=REDACTED");
        let opened = keyring.open(&kept.sealed.key_id, &context(agent, id), &kept.sealed.bytes).unwrap();
        assert_eq!(decode(&opened), Some(e));
        assert!(keyring.open(&kept.sealed.key_id, &context(agent, Uuid::new_v4()), &kept.sealed.bytes).is_err());
    }
}
