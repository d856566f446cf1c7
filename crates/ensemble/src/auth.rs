//! An optional shared secret for an ensemble: every datagram a member sends is sealed in
//! `/_ens/auth ,bhhb` — the datagram itself, the sender's origin (its member id), its
//! counter (one more for every datagram it seals), and the first 16 bytes of the
//! HMAC-SHA256 of origin, counter and datagram under the secret. A member holding the
//! secret takes only datagrams whose tag checks out (in constant time) and whose counter it
//! has not taken from that origin before ([`ReplayGuard`]). Members without the secret, or
//! with another one, are thus ignored, and counted; so is a datagram sent again.
//!
//! What it gives: nobody without the secret can join, forge a member, offer services or
//! send messages, nor replay what a member sent (best-effort messages included). What it
//! does not: the content is not hidden (it is still OSC anyone on the path can read); and
//! a member that starts after a datagram was captured has seen nothing of its origin yet,
//! so it takes one replay of that datagram if it arrives before the origin's newer ones
//! (after them it is older than the window, or already seen).
//!
//! Plain functions on bytes: no clock, no socket. Sealing allocates the sealed copy.

use hmac::{Hmac, Mac};
use netjam_osc::{encode_message, message_len, Arg, Message};
use netjam_sframe::ReplayWindow;
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
    #[error("datagram already taken from its sender, or older than the replay window")]
    Replayed,
}

/// What a sealed datagram carries besides the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sealed<'a> {
    /// The datagram.
    pub datagram: &'a [u8],
    /// Who sealed it (the sender's member id).
    pub origin: u64,
    /// Its place in everything that sender sealed.
    pub counter: u64,
}

/// Counters a [`ReplayGuard`] remembers behind an origin's highest.
pub const REPLAY_WINDOW: u64 = netjam_sframe::REPLAY_WINDOW;
/// Origins a [`ReplayGuard`] remembers (the longest silent is forgotten beyond).
pub const REPLAY_ORIGINS: usize = 256;

/// Which counters were taken from each origin: a replay window per origin; anything older
/// than its window is refused.
#[derive(Debug, Default)]
pub struct ReplayGuard {
    /// origin → (its window, when it was last used).
    origins: std::collections::HashMap<u64, (ReplayWindow, u64)>,
    uses: u64,
}

impl ReplayGuard {
    /// Takes `counter` from `origin` if it is new; refuses it if taken before or older
    /// than the window.
    pub fn check(&mut self, origin: u64, counter: u64) -> Result<(), AuthError> {
        self.uses += 1;
        if !self.origins.contains_key(&origin) && self.origins.len() >= REPLAY_ORIGINS {
            if let Some(oldest) = self.origins.iter().min_by_key(|(_, v)| v.1).map(|(k, _)| *k) {
                self.origins.remove(&oldest);
            }
        }
        let (window, used) = self.origins.entry(origin).or_default();
        *used = self.uses;
        if !window.fresh(counter) {
            return Err(AuthError::Replayed);
        }
        window.mark(counter);
        Ok(())
    }
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

    fn tag(&self, origin: u64, counter: u64, datagram: &[u8]) -> [u8; TAG_LEN] {
        let full = self
            .mac
            .clone()
            .chain_update(origin.to_be_bytes())
            .chain_update(counter.to_be_bytes())
            .chain_update(datagram)
            .finalize()
            .into_bytes();
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&full[..TAG_LEN]);
        t
    }

    /// `datagram` sealed by `origin` as its `counter`-th: `/_ens/auth ,bhhb datagram origin
    /// counter tag`. A sender never seals two datagrams with one counter.
    pub fn seal(&self, origin: u64, counter: u64, datagram: &[u8]) -> Vec<u8> {
        let tag = self.tag(origin, counter, datagram);
        let args = [
            Arg::Blob(datagram),
            Arg::Long(origin as i64),
            Arg::Long(counter as i64),
            Arg::Blob(&tag),
        ];
        let mut v = vec![0u8; message_len(AUTH, &args)];
        match encode_message(&mut v, AUTH, &args) {
            Ok(n) => v.truncate(n),
            // Only a datagram too large for a blob fails: it could not be sent anyway.
            Err(_) => v.clear(),
        }
        v
    }

    /// What a sealed datagram carries, if its tag checks out (replays are the caller's
    /// [`ReplayGuard`]'s to refuse).
    pub fn open<'a>(&self, sealed: &'a [u8]) -> Result<Sealed<'a>, AuthError> {
        if !sealed.starts_with(AUTH.as_bytes()) {
            return Err(AuthError::NotSealed);
        }
        let m = Message::decode(sealed).map_err(|_| AuthError::NotSealed)?;
        let (
            Some(Arg::Blob(inner)),
            Some(Arg::Long(origin)),
            Some(Arg::Long(counter)),
            Some(Arg::Blob(tag)),
            true,
        ) = (
            m.arg(0),
            m.arg(1),
            m.arg(2),
            m.arg(3),
            m.address() == AUTH && m.type_tags() == "bhhb",
        )
        else {
            return Err(AuthError::NotSealed);
        };
        if tag.len() != TAG_LEN {
            return Err(AuthError::BadTag);
        }
        let (origin, counter) = (origin as u64, counter as u64);
        self.mac
            .clone()
            .chain_update(origin.to_be_bytes())
            .chain_update(counter.to_be_bytes())
            .chain_update(inner)
            .verify_truncated_left(tag)
            .map_err(|_| AuthError::BadTag)?;
        Ok(Sealed {
            datagram: inner,
            origin,
            counter,
        })
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
        let sealed = s.seal(7, 1, &hello);
        assert!(sealed.starts_with(AUTH.as_bytes()));
        assert_eq!(
            s.open(&sealed).unwrap(),
            Sealed {
                datagram: &hello[..],
                origin: 7,
                counter: 1
            }
        );
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

    #[test]
    fn a_counter_is_taken_once_per_origin_within_the_window_and_never_older() {
        let mut g = ReplayGuard::default();
        assert_eq!(g.check(1, 10), Ok(()));
        assert_eq!(g.check(1, 10), Err(AuthError::Replayed));
        // Another origin has counters of its own.
        assert_eq!(g.check(2, 10), Ok(()));
        // Late but new: taken once.
        assert_eq!(g.check(1, 12), Ok(()));
        assert_eq!(g.check(1, 11), Ok(()));
        assert_eq!(g.check(1, 11), Err(AuthError::Replayed));
        assert_eq!(g.check(1, 12), Err(AuthError::Replayed));
        // A jump past the window forgets what is behind it: older than the window is refused.
        assert_eq!(g.check(1, 12 + REPLAY_WINDOW + 5), Ok(()));
        assert_eq!(g.check(1, 13), Err(AuthError::Replayed));
        assert_eq!(g.check(1, 12 + REPLAY_WINDOW + 4), Ok(()));
        assert_eq!(g.check(1, 12 + REPLAY_WINDOW + 4), Err(AuthError::Replayed));
        // Remembering is bounded: the longest silent origin goes first.
        for o in 100..100 + REPLAY_ORIGINS as u64 {
            assert_eq!(g.check(o, 0), Ok(()));
        }
        assert!(g.origins.len() <= REPLAY_ORIGINS);
        assert!(!g.origins.contains_key(&2));
    }
}
