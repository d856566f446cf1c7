//! A private room's keys, all from its name and password: the join proof the rooms server
//! checks, and the media key it never sees, from which every sender's SFrame key comes.
//!
//! ```text
//! salt      = SHA-256("netjam-room-salt-v1" ‖ 0x00 ‖ lowercase(room))
//! secret    = Argon2id(password, salt; RoomKdf)                    32 bytes
//! prk       = HKDF-Extract(salt = "netjam-room-secret-v1", secret)
//! join      = HKDF-Expand(prk, "netjam join proof v1", 32)          given to the server
//! media     = HKDF-Expand(prk, "netjam media key v1", 32)           never leaves a member
//! base(KID) = HKDF-SHA256(salt = none, media, "netjam sframe" ‖ KID BE64, 32)
//! KID       = epoch << 32 | SSRC
//! ```
//!
//! The join proof and the media key are two HKDF outputs under different labels: knowing
//! one tells nothing of the other without the secret, and the secret costs an Argon2id run
//! per password guess. What a server holding the join proof can still do is guess
//! passwords offline at that price; a weak password stays weak. Every member holds the
//! media key, so members can seal under each other's KIDs: SFrame here keeps the server
//! and the path out, not one member from impersonating another.
//!
//! The epoch is the password's generation: a new password gives a new secret, and a new
//! epoch gives every sender a new KID, so a receiver never confuses the two.
//!
//! The KID names the sender by its SSRC, which every player draws at random when it
//! starts, rather than by the member id the server hands out: member ids count from 1
//! again whenever a server restarts, so the same room and password would give the same
//! sender key to a new player, whose counter starts at 0 again, and reuse its keystream.
//! With a random 32-bit SSRC that takes two players of the same room and password
//! drawing the same one. The price is the KID's length: four bytes, so a packet gains
//! 1 + 4 + 3 + 10 = 18 bytes in epoch 0 (19 later) where a one-byte member number would
//! have kept it to 15.
//!
//! Deriving the secret is slow on purpose (about a quarter of a second on a phone-class
//! core with [`RoomKdf::ROOM`]) and allocates Argon2's memory: it must never run on the
//! audio or network threads. Nothing here reads a clock or a random source.

use argon2::{Algorithm, Argon2, Params, Version};
use hkdf::Hkdf;
use sha2::{Digest, Sha256};

use super::sframe::{SframeOpener, SframeSealer};

/// Bytes of the room secret, the join proof, the media key and each sender's base key.
pub const KEY_LEN: usize = 32;

/// Why the room secret could not be derived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Argon2id refused its parameters or inputs (a password over 4 GiB, say).
    #[error("Argon2id: {0}")]
    Argon2(argon2::Error),
}

/// Argon2id's cost parameters for the room secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoomKdf {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Passes over the memory.
    pub passes: u32,
    /// Lanes.
    pub lanes: u32,
}

impl RoomKdf {
    /// The parameters every member of a private room uses: 32 MiB, 2 passes, 1 lane.
    /// One core of the development machine (an AMD EPYC, shared) takes 50 to 66 ms
    /// (`cargo bench -p netjam-engine --bench sframe`); a phone-class core is roughly four
    /// times slower at Argon2 (an estimate, not measured here), about a quarter of a
    /// second. Memory rather than passes carries the cost because memory is what guessing
    /// hardware lacks. Changing them changes every key: it is a protocol version change.
    pub const ROOM: RoomKdf = RoomKdf {
        memory_kib: 32 * 1024,
        passes: 2,
        lanes: 1,
    };
}

/// The room's salt: its name case-folded (lowercase), so "Band" and "band" share keys.
pub fn room_salt(room: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"netjam-room-salt-v1");
    h.update([0u8]);
    h.update(room.to_lowercase().as_bytes());
    h.finalize().into()
}

/// The key ID of the media sent with SSRC `ssrc` in `epoch` (the password's generation).
pub fn kid(epoch: u32, ssrc: u32) -> u64 {
    (u64::from(epoch) << 32) | u64::from(ssrc)
}

/// The secret every member of a private room derives from its name and password.
#[derive(Clone)]
pub struct RoomSecret {
    prk: Hkdf<Sha256>,
}

impl std::fmt::Debug for RoomSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RoomSecret(..)")
    }
}

impl RoomSecret {
    /// Derives the secret with [`RoomKdf::ROOM`]. Slow on purpose.
    pub fn derive(room: &str, password: &str) -> Result<Self, KeyError> {
        Self::derive_with(room, password, RoomKdf::ROOM)
    }

    /// Derives the secret with other Argon2id parameters (tests use cheap ones).
    pub fn derive_with(room: &str, password: &str, kdf: RoomKdf) -> Result<Self, KeyError> {
        let params =
            Params::new(kdf.memory_kib, kdf.passes, kdf.lanes, Some(KEY_LEN)).map_err(KeyError::Argon2)?;
        let mut secret = [0u8; KEY_LEN];
        Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
            .hash_password_into(password.as_bytes(), &room_salt(room), &mut secret)
            .map_err(KeyError::Argon2)?;
        let prk = Hkdf::<Sha256>::new(Some(b"netjam-room-secret-v1"), &secret);
        secret = [0; KEY_LEN];
        std::hint::black_box(&secret);
        Ok(Self { prk })
    }

    fn expand(&self, label: &[u8]) -> [u8; KEY_LEN] {
        let mut out = [0u8; KEY_LEN];
        // 32 bytes is far below HKDF-SHA256's limit of 8160.
        let ok = self.prk.expand(label, &mut out);
        debug_assert!(ok.is_ok());
        out
    }

    /// The join proof: what the rooms server is given to check members against.
    pub fn join_proof(&self) -> [u8; KEY_LEN] {
        self.expand(b"netjam join proof v1")
    }

    /// The media key: never sent anywhere.
    pub fn media_key(&self) -> MediaKey {
        MediaKey(self.expand(b"netjam media key v1"))
    }
}

/// The room's media key, from which each sender's SFrame base key comes. Copied into
/// the audio thread's command ring when the password changes; never printed or
/// serialized (both show only that it is one), compared in constant time.
#[derive(Clone, Copy)]
pub struct MediaKey([u8; KEY_LEN]);

impl PartialEq for MediaKey {
    fn eq(&self, other: &Self) -> bool {
        crate::room::auth::ct_eq(&self.0, &other.0)
    }
}

impl serde::Serialize for MediaKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("MediaKey(..)")
    }
}

impl std::fmt::Debug for MediaKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MediaKey(..)")
    }
}

impl MediaKey {
    /// The SFrame base key of the sender with key ID `kid`.
    pub fn sender_base_key(&self, kid: u64) -> [u8; KEY_LEN] {
        let hk = Hkdf::<Sha256>::new(None, &self.0);
        let mut out = [0u8; KEY_LEN];
        let ok = hk.expand_multi_info(&[b"netjam sframe", &kid.to_be_bytes()], &mut out);
        debug_assert!(ok.is_ok());
        out
    }

    /// A sealer for this member's own media under `kid`.
    pub fn sealer(&self, kid: u64) -> SframeSealer {
        SframeSealer::new(kid, &self.sender_base_key(kid))
    }

    /// Installs the key for another member's `kid` in `opener`; returns the KID it evicted.
    pub fn install(&self, opener: &mut SframeOpener, kid: u64) -> Option<u64> {
        opener.install(kid, &self.sender_base_key(kid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::privacy::sframe::SframeError;

    /// Cheap parameters: the derivation's shape is under test, not its cost.
    const CHEAP: RoomKdf = RoomKdf {
        memory_kib: 64,
        passes: 1,
        lanes: 1,
    };

    fn secret(room: &str, password: &str) -> RoomSecret {
        RoomSecret::derive_with(room, password, CHEAP).expect("derive")
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn passwords_and_rooms_give_different_keys() {
        let a = secret("band", "pw1");
        let b = secret("band", "pw2");
        let c = secret("other", "pw1");
        let joins = [a.join_proof(), b.join_proof(), c.join_proof()];
        let medias = [a.media_key().0, b.media_key().0, c.media_key().0];
        for i in 0..3 {
            for j in 0..3 {
                if i != j {
                    assert_ne!(joins[i], joins[j]);
                    assert_ne!(medias[i], medias[j]);
                }
                assert_ne!(joins[i], medias[j]);
            }
        }
        // Same inputs, same keys; the room name is case-folded.
        assert_eq!(secret("Band", "pw1").join_proof(), a.join_proof());
        assert_eq!(secret("BAND", "pw1").media_key().0, a.media_key().0);
        // The password is not.
        assert_ne!(secret("band", "PW1").join_proof(), a.join_proof());
    }

    #[test]
    fn join_proof_opens_no_media() {
        let s = secret("band", "pw");
        let media = s.media_key();
        let k = kid(1, 2);
        let mut sealer = media.sealer(k);
        let mut out = [0u8; 64];
        let n = sealer.seal(b"", b"music", &mut out).expect("seal");

        // Someone holding only the join proof, using it wherever a key could go.
        let join = s.join_proof();
        for guess in [MediaKey(join).sender_base_key(k), join] {
            assert_ne!(media.sender_base_key(k), guess);
            let mut o = SframeOpener::new();
            o.install(k, &guess);
            let mut f = out;
            assert_eq!(o.open(b"", &mut f[..n]).map(|x| x.ctr), Err(SframeError::Forged));
        }
        // A member with the media key opens it.
        let mut o = SframeOpener::new();
        media.install(&mut o, k);
        assert_eq!(
            o.open(b"", &mut out[..n]).map(|x| x.plaintext.to_vec()),
            Ok(b"music".to_vec())
        );
    }

    #[test]
    fn senders_and_epochs_get_their_own_keys() {
        let m = secret("band", "pw").media_key();
        assert_eq!(kid(0, 3), 3);
        assert_eq!(kid(2, 0x8000_0003), 0x2_8000_0003);
        let keys: Vec<_> = [kid(0, 0), kid(0, 1), kid(1, 0), kid(1, 1)]
            .iter()
            .map(|&k| m.sender_base_key(k))
            .collect();
        for i in 0..keys.len() {
            for j in i + 1..keys.len() {
                assert_ne!(keys[i], keys[j]);
            }
        }
    }

    /// The derivation is part of the protocol: these bytes change only with a version.
    /// They agree with an independent Argon2id and HKDF (OpenSSL through Python).
    #[test]
    fn derivation_is_pinned() {
        let s = secret("Band", "correct horse");
        assert_eq!(hex(&room_salt("Band")), hex(&room_salt("band")));
        assert_eq!(
            hex(&s.join_proof()),
            "fd845b1ace1ac9e41ecb522df7edd734e0132b1480800fdadb51b89eea70faa9"
        );
        assert_eq!(
            hex(&s.media_key().sender_base_key(kid(1, 2))),
            "e183ed0dbcb474537fc91de0116e0c29dbedf49679eb9810c8908555543cb469"
        );
    }

    #[test]
    fn bad_parameters_are_errors() {
        let kdf = RoomKdf {
            memory_kib: 1,
            passes: 1,
            lanes: 1,
        };
        assert!(matches!(
            RoomSecret::derive_with("r", "p", kdf),
            Err(KeyError::Argon2(_))
        ));
    }
}
