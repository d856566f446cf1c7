//! The room protocol's cryptography: stateless return-routability cookies, server nonces,
//! session tokens, room keys and join/rejoin authenticators, all HMAC-SHA256 / SHA-256
//! except a password room's key, which is Argon2id and HKDF (see [`room_key`]).
//!
//! Nothing here keeps state or reads a clock or a random source: the server's secret and
//! the time are passed in, so the same inputs always give the same bytes (tests are
//! seeded). Comparisons of secrets are constant time. Constructions are specified in
//! `docs/protocol.md`; changing any of them is a protocol version change.

use std::net::{IpAddr, SocketAddr};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::msg::{
    fold_name, AUTH_LEN, COOKIE_LEN, NONCE_LEN, PAIR_TOKEN_LEN, PROBE_MAC_LEN, REKEYED_MAC_LEN,
    REKEY_MAC_LEN, REKEY_NONCE_LEN, ROOM_KEY_LEN, TOKEN_LEN,
};

type HmacSha256 = Hmac<Sha256>;

/// Length of one cookie time slot: a cookie is accepted in the slot it was made in and
/// the next one, so it lives between 10 and 20 seconds.
pub const COOKIE_SLOT_NS: u64 = 10_000_000_000;

fn mac(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; `new_from_slice` cannot fail for HMAC.
    match <HmacSha256 as Mac>::new_from_slice(key) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC accepts keys of every length"),
    }
}

/// 18 bytes naming an address: the IPv6 form (IPv4 mapped) and the port, big-endian.
fn addr_bytes(a: SocketAddr) -> [u8; 18] {
    let ip = match a.ip() {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    };
    let mut out = [0u8; 18];
    out[..16].copy_from_slice(&ip.octets());
    out[16..].copy_from_slice(&a.port().to_be_bytes());
    out
}

/// The cookie for `addr` in time slot `slot`:
/// HMAC-SHA256(secret, "netjam-cookie-v1" ‖ addr (16-byte IPv6, port BE16) ‖ slot BE64).
pub fn cookie(secret: &[u8; 32], addr: SocketAddr, slot: u64) -> [u8; COOKIE_LEN] {
    let mut m = mac(secret);
    m.update(b"netjam-cookie-v1");
    m.update(&addr_bytes(addr));
    m.update(&slot.to_be_bytes());
    m.finalize().into_bytes().into()
}

/// The time slot `now_ns` falls in.
pub fn slot(now_ns: u64) -> u64 {
    now_ns / COOKIE_SLOT_NS
}

/// Whether `c` is the cookie for `addr` in the current or the previous slot.
pub fn cookie_valid(secret: &[u8; 32], addr: SocketAddr, now_ns: u64, c: &[u8; COOKIE_LEN]) -> bool {
    let s = slot(now_ns);
    ct_eq(&cookie(secret, addr, s), c) | (s > 0 && ct_eq(&cookie(secret, addr, s - 1), c))
}

/// The server nonce that goes with a cookie: the first 16 bytes of
/// HMAC-SHA256(secret, "netjam-nonce-v1" ‖ cookie). Derived, so the server keeps no state
/// between challenge and join.
pub fn server_nonce(secret: &[u8; 32], cookie: &[u8; COOKIE_LEN]) -> [u8; NONCE_LEN] {
    let mut m = mac(secret);
    m.update(b"netjam-nonce-v1");
    m.update(cookie);
    let full = m.finalize().into_bytes();
    let mut out = [0u8; NONCE_LEN];
    out.copy_from_slice(&full[..NONCE_LEN]);
    out
}

/// A member's session token: the first 16 bytes of
/// HMAC-SHA256(secret, "netjam-token-v1" ‖ member id BE32 ‖ join count BE64).
pub fn session_token(secret: &[u8; 32], member_id: u32, serial: u64) -> [u8; TOKEN_LEN] {
    let mut m = mac(secret);
    m.update(b"netjam-token-v1");
    m.update(&member_id.to_be_bytes());
    m.update(&serial.to_be_bytes());
    let full = m.finalize().into_bytes();
    let mut out = [0u8; TOKEN_LEN];
    out.copy_from_slice(&full[..TOKEN_LEN]);
    out
}

/// The room key, which the creator gives the server and every join proves knowledge of.
///
/// With a password it is the join proof of [`crate::privacy::RoomSecret`] (Argon2id, then
/// HKDF): the server, and anyone who sees the creator's join, must pay an Argon2id run per
/// password guess, and learn nothing of the media key the same secret gives the members.
/// Slow on purpose (tens of milliseconds here): call it on a control thread. A room
/// without a password has SHA-256("netjam-room-v1" ‖ folded room ‖ 0x00), the room name
/// folded by [`fold_name`] (so every spelling of one room has its one key): there is
/// nothing to guess.
pub fn room_key(room: &str, password: &str) -> [u8; ROOM_KEY_LEN] {
    if !password.is_empty() {
        // Argon2id refuses only a password over 4 GiB, which no command line can carry;
        // such a one falls back to the fast construction below, password included.
        if let Ok(secret) = crate::privacy::RoomSecret::derive(room, password) {
            return secret.join_proof();
        }
    }
    let mut h = Sha256::new();
    h.update(b"netjam-room-v1");
    h.update(fold_name(room).as_bytes());
    h.update([0u8]);
    h.update(password.as_bytes());
    h.finalize().into()
}

/// The join authenticator: HMAC-SHA256(room key, server nonce ‖ client nonce ‖ room ‖
/// 0x00 ‖ name).
pub fn join_authenticator(
    key: &[u8; ROOM_KEY_LEN],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    room: &str,
    name: &str,
) -> [u8; AUTH_LEN] {
    let mut m = mac(key);
    m.update(server_nonce);
    m.update(client_nonce);
    m.update(room.as_bytes());
    m.update(&[0]);
    m.update(name.as_bytes());
    m.finalize().into_bytes().into()
}

/// The rejoin authenticator: HMAC-SHA256(room key, "rejoin" ‖ server nonce ‖ client nonce
/// ‖ member id BE32 ‖ session token).
pub fn rejoin_authenticator(
    key: &[u8; ROOM_KEY_LEN],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    member_id: u32,
    token: &[u8; TOKEN_LEN],
) -> [u8; AUTH_LEN] {
    let mut m = mac(key);
    m.update(b"rejoin");
    m.update(server_nonce);
    m.update(client_nonce);
    m.update(&member_id.to_be_bytes());
    m.update(token);
    m.finalize().into_bytes().into()
}

/// A pair's direct-path token: the first 16 bytes of HMAC-SHA256(secret, "netjam-pair-v1"
/// ‖ lower member id BE32 ‖ higher member id BE32 ‖ serial BE64). The serial is fresh for
/// every pairing, so a token is new each time two members meet or one takes its seat back,
/// and nobody without the server's secret can tell it in advance.
pub fn pair_token(secret: &[u8; 32], a: u32, b: u32, serial: u64) -> [u8; PAIR_TOKEN_LEN] {
    let mut m = mac(secret);
    m.update(b"netjam-pair-v1");
    m.update(&a.min(b).to_be_bytes());
    m.update(&a.max(b).to_be_bytes());
    m.update(&serial.to_be_bytes());
    let full = m.finalize().into_bytes();
    let mut out = [0u8; PAIR_TOKEN_LEN];
    out.copy_from_slice(&full[..PAIR_TOKEN_LEN]);
    out
}

/// A probe's authenticator: the first 16 bytes of HMAC-SHA256(pair token, "netjam-probe-v1"
/// ‖ from BE32 ‖ to BE32 ‖ seq BE32 ‖ kind BE32 ‖ server round trip µs BE32 ‖ hold µs
/// BE32), `fields` in that order after the token. Never allocates.
pub fn probe_mac(token: &[u8; PAIR_TOKEN_LEN], fields: [u32; 6]) -> [u8; PROBE_MAC_LEN] {
    let mut m = mac(token);
    m.update(b"netjam-probe-v1");
    for w in fields {
        m.update(&w.to_be_bytes());
    }
    let full = m.finalize().into_bytes();
    let mut out = [0u8; PROBE_MAC_LEN];
    out.copy_from_slice(&full[..PROBE_MAC_LEN]);
    out
}

/// The keys of one `/netjam/rekey`: AES-256-CTR's and HMAC-SHA256's, both from
/// HKDF-SHA256(salt = "netjam-rekey-v1", ikm = room key, info = folded room ‖ 0x00 ‖
/// epoch BE32 ‖ nonce, 64 bytes). Fresh for every nonce, so the counter starts at zero.
#[derive(Clone)]
pub struct RekeyKeys {
    enc: [u8; 32],
    mac: [u8; 32],
}

impl std::fmt::Debug for RekeyKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RekeyKeys(..)")
    }
}

impl RekeyKeys {
    /// The keys a request under room key `key` for `epoch` with `nonce` uses.
    pub fn new(key: &[u8; ROOM_KEY_LEN], room: &str, epoch: u32, nonce: &[u8; REKEY_NONCE_LEN]) -> Self {
        let hk = hkdf::Hkdf::<Sha256>::new(Some(b"netjam-rekey-v1"), key);
        let folded = fold_name(room);
        let mut okm = [0u8; 64];
        // 64 bytes is far below HKDF-SHA256's limit of 8160.
        let ok = hk.expand_multi_info(&[folded.as_bytes(), &[0], &epoch.to_be_bytes(), nonce], &mut okm);
        debug_assert!(ok.is_ok());
        let mut enc = [0u8; 32];
        let mut mac = [0u8; 32];
        enc.copy_from_slice(&okm[..32]);
        mac.copy_from_slice(&okm[32..]);
        Self { enc, mac }
    }

    fn apply(&self, bytes: &mut [u8; ROOM_KEY_LEN]) {
        use ctr::cipher::{KeyIvInit, StreamCipher};
        let mut c = ctr::Ctr128BE::<aes::Aes256>::new(&self.enc.into(), &[0u8; 16].into());
        c.apply_keystream(bytes);
    }

    fn request_mac(
        &self,
        epoch: u32,
        nonce: &[u8; REKEY_NONCE_LEN],
        wrapped: &[u8; ROOM_KEY_LEN],
    ) -> [u8; REKEY_MAC_LEN] {
        let mut m = mac(&self.mac);
        m.update(b"netjam-rekey-v1");
        m.update(&epoch.to_be_bytes());
        m.update(nonce);
        m.update(wrapped);
        m.finalize().into_bytes().into()
    }

    /// `new_key` wrapped for the request: (AES-256-CTR of it, HMAC-SHA256(mac key,
    /// "netjam-rekey-v1" ‖ epoch BE32 ‖ nonce ‖ wrapped)).
    pub fn wrap(
        &self,
        epoch: u32,
        nonce: &[u8; REKEY_NONCE_LEN],
        new_key: &[u8; ROOM_KEY_LEN],
    ) -> ([u8; ROOM_KEY_LEN], [u8; REKEY_MAC_LEN]) {
        let mut wrapped = *new_key;
        self.apply(&mut wrapped);
        let tag = self.request_mac(epoch, nonce, &wrapped);
        (wrapped, tag)
    }

    /// The key a request carries, when its authenticator is these keys' (constant time).
    pub fn unwrap(
        &self,
        epoch: u32,
        nonce: &[u8; REKEY_NONCE_LEN],
        wrapped: &[u8; ROOM_KEY_LEN],
        tag: &[u8; REKEY_MAC_LEN],
    ) -> Option<[u8; ROOM_KEY_LEN]> {
        if !ct_eq(&self.request_mac(epoch, nonce, wrapped), tag) {
            return None;
        }
        let mut key = *wrapped;
        self.apply(&mut key);
        Some(key)
    }

    /// The answer's authenticator: the first 16 bytes of HMAC-SHA256(mac key,
    /// "netjam-rekeyed-v1" ‖ epoch BE32 ‖ status BE32).
    pub fn answer_mac(&self, epoch: u32, status: i32) -> [u8; REKEYED_MAC_LEN] {
        let mut m = mac(&self.mac);
        m.update(b"netjam-rekeyed-v1");
        m.update(&epoch.to_be_bytes());
        m.update(&status.to_be_bytes());
        let full = m.finalize().into_bytes();
        let mut out = [0u8; REKEYED_MAC_LEN];
        out.copy_from_slice(&full[..REKEYED_MAC_LEN]);
        out
    }
}

/// Constant-time equality of two byte strings of the same length.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_is_bound_to_address_and_slot() {
        let s = [1u8; 32];
        let a: SocketAddr = "192.0.2.1:4464".parse().unwrap();
        let b: SocketAddr = "192.0.2.1:4465".parse().unwrap();
        let now = 55 * COOKIE_SLOT_NS + 3;
        let c = cookie(&s, a, slot(now));
        assert!(cookie_valid(&s, a, now, &c));
        assert!(cookie_valid(&s, a, now + COOKIE_SLOT_NS, &c));
        assert!(!cookie_valid(&s, a, now + 2 * COOKIE_SLOT_NS, &c));
        assert!(!cookie_valid(&s, b, now, &c));
        assert!(!cookie_valid(&[2u8; 32], a, now, &c));
    }

    #[test]
    fn authenticator_depends_on_password() {
        let n = [0u8; 16];
        let a = join_authenticator(&room_key("r", "pw"), &n, &n, "r", "ana");
        let b = join_authenticator(&room_key("r", "px"), &n, &n, "r", "ana");
        let c = join_authenticator(&room_key("r", "pw"), &n, &n, "r", "ann");
        assert_ne!(a, b);
        assert_ne!(a, c);
        // The room name and the password are separated: ("ab","c") ≠ ("a","bc").
        assert_ne!(room_key("ab", "c"), room_key("a", "bc"));
        assert_eq!(room_key("Friday", "pw"), room_key("friday", "pw"));
    }

    #[test]
    fn a_rekey_opens_only_under_its_key_room_epoch_and_nonce_and_never_altered() {
        let (old, new) = ([1u8; 32], [2u8; 32]);
        let nonce = [3u8; REKEY_NONCE_LEN];
        let k = RekeyKeys::new(&old, "Band", 4, &nonce);
        let (wrapped, tag) = k.wrap(4, &nonce, &new);
        assert_ne!(wrapped, new, "the new key never crosses in clear");
        // The room's spelling does not matter; everything else does.
        assert_eq!(
            RekeyKeys::new(&old, "band", 4, &nonce).unwrap(4, &nonce, &wrapped, &tag),
            Some(new)
        );
        assert_eq!(
            RekeyKeys::new(&new, "band", 4, &nonce).unwrap(4, &nonce, &wrapped, &tag),
            None
        );
        assert_eq!(
            RekeyKeys::new(&old, "other", 4, &nonce).unwrap(4, &nonce, &wrapped, &tag),
            None
        );
        assert_eq!(k.unwrap(5, &nonce, &wrapped, &tag), None);
        assert_eq!(k.unwrap(4, &[4; REKEY_NONCE_LEN], &wrapped, &tag), None);
        for i in 0..32 {
            let mut w = wrapped;
            w[i] ^= 1;
            assert_eq!(k.unwrap(4, &nonce, &w, &tag), None, "byte {i} altered");
        }
        // Another nonce, another keystream.
        let n2 = [9u8; REKEY_NONCE_LEN];
        assert_ne!(RekeyKeys::new(&old, "band", 4, &n2).wrap(4, &n2, &new).0, wrapped);
        assert_ne!(k.answer_mac(4, 0), k.answer_mac(4, 1));
    }

    #[test]
    fn a_password_room_key_is_the_argon2id_join_proof() {
        let secret = crate::privacy::RoomSecret::derive("r", "pw").expect("derive");
        assert_eq!(room_key("r", "pw"), secret.join_proof());
        // Not the fast hash a server could run guesses through.
        let mut h = Sha256::new();
        h.update(b"netjam-room-v1");
        h.update(b"r");
        h.update([0u8]);
        h.update(b"pw");
        assert_ne!(room_key("r", "pw"), <[u8; 32]>::from(h.finalize()));
    }
}
