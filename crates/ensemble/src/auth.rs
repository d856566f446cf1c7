//! An optional shared secret for an ensemble: every datagram a member sends is sealed in
//! `/_ens/auth ,bb` — the datagram itself, and the first 16 bytes of its HMAC-SHA256
//! under the secret — and a member holding the secret takes only datagrams whose tag
//! checks out (in constant time). Members without the secret, or with another one, are
//! thus ignored, and counted.
//!
//! What it gives: nobody without the secret can join, forge a member, offer services or
//! send messages. What it does not: the content is not hidden (it is still OSC anyone on
//! the path can read), and a datagram captured on the path can be sent again (replayed)
//! by whoever captured it; reliable messages drop their replays as duplicates, best-effort
//! ones do not.
//!
//! Plain functions on bytes: no clock, no socket. Sealing allocates the sealed copy.

use hmac::{Hmac, Mac};
use netjam_osc::{encode_message, message_len, Arg, Message};
use sha2::Sha256;

/// The address of a sealed datagram.
pub const AUTH: &str = "/_ens/auth";
/// Bytes of the HMAC-SHA256 kept as the tag (128 bits, as RFC 2104 allows for a
/// truncated tag of at least half the hash).
pub const TAG_LEN: usize = 16;

/// Why a datagram was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("the ensemble secret is empty: give at least one byte")]
    EmptySecret,
    #[error("datagram is not sealed with an ensemble secret")]
    NotSealed,
    #[error("datagram's seal does not match this ensemble's secret")]
    BadTag,
}

/// The ensemble's shared secret, keyed once.
#[derive(Clone)]
pub struct Secret {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("Secret(..)")
    }
}

impl Secret {
    pub fn new(secret: &[u8]) -> Result<Self, AuthError> {
        if secret.is_empty() {
            return Err(AuthError::EmptySecret);
        }
        let mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| AuthError::EmptySecret)?;
        Ok(Self { mac })
    }

    fn tag(&self, datagram: &[u8]) -> [u8; TAG_LEN] {
        let full = self.mac.clone().chain_update(datagram).finalize().into_bytes();
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&full[..TAG_LEN]);
        t
    }

    /// `datagram` sealed: `/_ens/auth ,bb datagram tag`.
    pub fn seal(&self, datagram: &[u8]) -> Vec<u8> {
        let tag = self.tag(datagram);
        let args = [Arg::Blob(datagram), Arg::Blob(&tag)];
        let mut v = vec![0u8; message_len(AUTH, &args)];
        match encode_message(&mut v, AUTH, &args) {
            Ok(n) => v.truncate(n),
            // Only a datagram too large for a blob fails: it could not be sent anyway.
            Err(_) => v.clear(),
        }
        v
    }

    /// The datagram inside a sealed one, if its tag checks out.
    pub fn open<'a>(&self, sealed: &'a [u8]) -> Result<&'a [u8], AuthError> {
        if !sealed.starts_with(AUTH.as_bytes()) {
            return Err(AuthError::NotSealed);
        }
        let m = Message::decode(sealed).map_err(|_| AuthError::NotSealed)?;
        let (Some(Arg::Blob(inner)), Some(Arg::Blob(tag)), true) =
            (m.arg(0), m.arg(1), m.address() == AUTH && m.type_tags() == "bb")
        else {
            return Err(AuthError::NotSealed);
        };
        if tag.len() != TAG_LEN {
            return Err(AuthError::BadTag);
        }
        self.mac
            .clone()
            .chain_update(inner)
            .verify_truncated_left(tag)
            .map_err(|_| AuthError::BadTag)?;
        Ok(inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Wire;

    #[test]
    fn sealed_datagrams_open_only_with_the_same_secret_and_unchanged() {
        let s = Secret::new(b"rehearsal room 4").unwrap();
        let hello = Wire::Bye { id: 7 }.encode().unwrap();
        let sealed = s.seal(&hello);
        assert!(sealed.starts_with(AUTH.as_bytes()));
        assert_eq!(s.open(&sealed).unwrap(), &hello[..]);
        // Another secret, the bare datagram, any changed byte, any truncation: refused.
        let other = Secret::new(b"rehearsal room 5").unwrap();
        assert_eq!(other.open(&sealed), Err(AuthError::BadTag));
        assert_eq!(s.open(&hello), Err(AuthError::NotSealed));
        for i in 0..sealed.len() {
            let mut b = sealed.clone();
            b[i] ^= 0x01;
            assert!(s.open(&b).is_err(), "byte {i} changed and still taken");
        }
        for cut in 0..sealed.len() {
            assert!(s.open(&sealed[..cut]).is_err(), "cut at {cut} taken");
        }
        assert_eq!(Secret::new(b"").unwrap_err(), AuthError::EmptySecret);
        assert_eq!(format!("{s:?}"), "Secret(..)");
    }
}
