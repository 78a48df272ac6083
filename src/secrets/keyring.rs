//! The keys that seal secrets at rest: AES-256-GCM (aws-lc-rs), a random 96-bit nonce per
//! sealing, the caller's context and the key id as associated data.
//!
//! `SECRETS_KEY_FILE` lists the keys, one per line, `<key id> <64 hex digits>` (`#` starts a
//! comment): the **first** seals, every one listed opens. Rotation is adding a new first line
//! and keeping the old one until no row is sealed under it (docs/operations.md, "Secrets at
//! rest"). Without the file, one key is derived from the wallet key (sha256 over a label and
//! the key, like the nonce secret), id [`DERIVED_KEY_ID`]; it is also kept, to open only,
//! beside the file's keys, so rows sealed before a key file was set still open.
//!
//! Nothing here prints a key: errors name line numbers and key ids, never a line's text.

use aws_lc_rs::aead::{AES_256_GCM, Aad, NONCE_LEN, Nonce, RandomizedNonceKey};

/// The id of the key derived from the wallet key (reserved: a key file may not use it).
pub const DERIVED_KEY_ID: &str = "wallet";
/// Longest key id.
const MAX_ID_LEN: usize = 64;
/// Bytes of an AES-256 key.
const KEY_LEN: usize = 32;
/// Bytes of the GCM tag.
const TAG_LEN: usize = 16;

/// A key file that cannot be used (never quoting the file's text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    #[error("line {0}: expected `<key id> <64 hex digits>`")]
    Malformed(usize),
    #[error("line {0}: a key id is 1 to 64 of A-Z, a-z, 0-9, `.`, `_`, `-`")]
    BadId(usize),
    #[error("line {0}: the key id {1:?} is reserved for the key derived from the wallet key")]
    Reserved(usize, String),
    #[error("line {0}: the key id {1:?} is listed twice")]
    Duplicate(usize, String),
    #[error("lists no key")]
    Empty,
    #[error("the AES-256-GCM implementation refused a key")]
    Unusable,
}

/// Why sealed bytes do not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsealed {
    #[error("sealed under the key {0:?}, which SECRETS_KEY_FILE does not list")]
    UnknownKey(String),
    #[error("the sealed bytes do not authenticate (altered, or sealed for another row)")]
    Forged,
}

/// Sealing failed: the system's random source gave nothing (practically never).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot seal: no random nonce")]
pub struct SealError;

struct Key {
    id: String,
    aead: RandomizedNonceKey,
}

/// The keys: the first seals, all open.
pub struct Keyring {
    keys: Vec<Key>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Keyring").field("ids", &ids).finish()
    }
}

/// The key derived from the wallet key: sha256 over a label and the key.
fn derived_key(wallet_key: &[u8]) -> [u8; KEY_LEN] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"x402-router/secrets-at-rest/v1\0");
    h.update(wallet_key);
    h.finalize().into()
}

/// An AES-256-GCM key (aws-lc refuses 32 bytes only if the library itself is unusable).
fn key(id: &str, bytes: &[u8]) -> Result<Key, KeyringError> {
    let aead = RandomizedNonceKey::new(&AES_256_GCM, bytes).map_err(|_| KeyringError::Unusable)?;
    Ok(Key { id: id.to_owned(), aead })
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl Keyring {
    /// Only the key derived from the wallet key (no `SECRETS_KEY_FILE`).
    ///
    /// # Errors
    /// [`KeyringError::Unusable`] (a broken crypto library).
    pub fn derived(wallet_key: &[u8]) -> Result<Self, KeyringError> {
        Ok(Self { keys: vec![key(DERIVED_KEY_ID, &derived_key(wallet_key))?] })
    }

    /// The keys of a key file's text (the first seals), and the derived key to open only.
    ///
    /// # Errors
    /// [`KeyringError`] naming the line.
    pub fn from_file_text(text: &str, wallet_key: &[u8]) -> Result<Self, KeyringError> {
        let mut keys: Vec<Key> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(id), Some(hex), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(KeyringError::Malformed(n));
            };
            if !valid_id(id) {
                return Err(KeyringError::BadId(n));
            }
            if id == DERIVED_KEY_ID {
                return Err(KeyringError::Reserved(n, id.to_owned()));
            }
            if keys.iter().any(|k| k.id == id) {
                return Err(KeyringError::Duplicate(n, id.to_owned()));
            }
            let bytes =
                alloy::hex::decode(hex).ok().filter(|b| b.len() == KEY_LEN).ok_or(KeyringError::Malformed(n))?;
            keys.push(key(id, &bytes)?);
        }
        if keys.is_empty() {
            return Err(KeyringError::Empty);
        }
        keys.push(key(DERIVED_KEY_ID, &derived_key(wallet_key))?);
        Ok(Self { keys })
    }

    /// The id of the key that seals.
    pub fn current_id(&self) -> &str {
        self.keys.first().map_or(DERIVED_KEY_ID, |k| k.id.as_str())
    }

    /// Every key id, the sealing one first.
    pub fn ids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.id.as_str())
    }

    /// Seals `plaintext` under the current key, bound to `context`: the key id and
    /// `nonce ‖ ciphertext ‖ tag`.
    ///
    /// # Errors
    /// [`SealError`] when no random nonce could be drawn.
    pub fn seal(&self, context: &[u8], plaintext: &[u8]) -> Result<(String, Vec<u8>), SealError> {
        let Some(key) = self.keys.first() else { return Err(SealError) };
        let mut in_out = plaintext.to_vec();
        let nonce =
            key.aead.seal_in_place_append_tag(Aad::from(aad(context, &key.id)), &mut in_out).map_err(|_| SealError)?;
        let mut out = Vec::with_capacity(NONCE_LEN + in_out.len());
        out.extend_from_slice(nonce.as_ref());
        out.extend_from_slice(&in_out);
        Ok((key.id.clone(), out))
    }

    /// Opens bytes [`Self::seal`] made under `key_id` for `context`.
    ///
    /// # Errors
    /// [`Unsealed`]: an unlisted key, or bytes that do not authenticate.
    pub fn open(&self, key_id: &str, context: &[u8], sealed: &[u8]) -> Result<Vec<u8>, Unsealed> {
        let key = self.keys.iter().find(|k| k.id == key_id).ok_or_else(|| Unsealed::UnknownKey(key_id.to_owned()))?;
        if sealed.len() < NONCE_LEN + TAG_LEN {
            return Err(Unsealed::Forged);
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Unsealed::Forged)?;
        let mut in_out = ciphertext.to_vec();
        let plain = key
            .aead
            .open_in_place(nonce, Aad::from(aad(context, key_id)), &mut in_out)
            .map_err(|_| Unsealed::Forged)?;
        Ok(plain.to_vec())
    }
}

/// The associated data: the caller's context, a 0x00 byte and the key id.
fn aad(context: &[u8], key_id: &str) -> Vec<u8> {
    let mut a = Vec::with_capacity(context.len() + 1 + key_id.len());
    a.extend_from_slice(context);
    a.push(0);
    a.extend_from_slice(key_id.as_bytes());
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    const WALLET: &[u8] = b"wallet key bytes";
    const K1: &str = "0101010101010101010101010101010101010101010101010101010101010101";
    const K2: &str = "0202020202020202020202020202020202020202020202020202020202020202";

    #[test]
    fn the_first_key_seals_and_every_listed_key_opens() {
        let old = Keyring::from_file_text(&format!("k1 {K1}\n"), WALLET).unwrap();
        let (id, sealed) = old.seal(b"row 1", b"Authorization: Bearer s3cr3t").unwrap();
        assert_eq!(id, "k1");
        assert!(!sealed.windows(6).any(|w| w == b"s3cr3t"));
        let rotated = Keyring::from_file_text(&format!("# rotated\nk2 {K2}\nk1 {K1} # old\n"), WALLET).unwrap();
        assert_eq!(rotated.current_id(), "k2");
        assert_eq!(rotated.ids().collect::<Vec<_>>(), ["k2", "k1", DERIVED_KEY_ID]);
        assert_eq!(rotated.open("k1", b"row 1", &sealed).unwrap(), b"Authorization: Bearer s3cr3t");
        // Another row's context, another key id, a flipped bit: nothing opens.
        assert_eq!(rotated.open("k1", b"row 2", &sealed), Err(Unsealed::Forged));
        assert_eq!(rotated.open("k2", b"row 1", &sealed), Err(Unsealed::Forged));
        let mut flipped = sealed.clone();
        flipped[NONCE_LEN] ^= 1;
        assert_eq!(rotated.open("k1", b"row 1", &flipped), Err(Unsealed::Forged));
        let dropped = Keyring::from_file_text(&format!("k2 {K2}\n"), WALLET).unwrap();
        assert_eq!(dropped.open("k1", b"row 1", &sealed), Err(Unsealed::UnknownKey("k1".into())));
    }

    #[test]
    fn the_derived_key_seals_without_a_file_and_still_opens_with_one() {
        let derived = Keyring::derived(WALLET).unwrap();
        assert_eq!(derived.current_id(), DERIVED_KEY_ID);
        let (id, sealed) = derived.seal(b"c", b"x").unwrap();
        let with_file = Keyring::from_file_text(&format!("k1 {K1}"), WALLET).unwrap();
        assert_eq!(with_file.open(&id, b"c", &sealed).unwrap(), b"x");
        assert!(Keyring::derived(b"another wallet").unwrap().open(&id, b"c", &sealed).is_err());
        // Two sealings of the same bytes differ (random nonces).
        assert_ne!(derived.seal(b"c", b"x").unwrap().1, sealed);
    }

    #[test]
    fn a_bad_key_file_names_the_line_and_never_its_text() {
        let cases = [
            ("", KeyringError::Empty),
            ("# only a comment\n", KeyringError::Empty),
            ("k1\n", KeyringError::Malformed(1)),
            (&format!("k1 {K1} extra"), KeyringError::Malformed(1)),
            ("\nk1 0102", KeyringError::Malformed(2)),
            (&format!("k1 {}zz", &K1[2..]), KeyringError::Malformed(1)),
            (&format!("bad/id {K1}"), KeyringError::BadId(1)),
            (&format!("wallet {K1}"), KeyringError::Reserved(1, "wallet".into())),
            (&format!("k1 {K1}\nk1 {K2}"), KeyringError::Duplicate(2, "k1".into())),
        ];
        for (text, want) in cases {
            let got = Keyring::from_file_text(text, WALLET).unwrap_err();
            assert_eq!(got, want, "{text:?}");
            assert!(!got.to_string().contains("0101"), "{got}");
        }
        let debug = format!("{:?}", Keyring::from_file_text(&format!("k1 {K1}"), WALLET).unwrap());
        assert!(debug.contains("k1") && !debug.contains("0101"), "{debug}");
    }
}
