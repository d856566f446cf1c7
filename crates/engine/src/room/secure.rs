//! The room protocol's control channel: Noise (`Noise_NX_25519_ChaChaPoly_BLAKE2s`, through
//! the `snow` crate) between a player and the rooms server, so that joins, tokens, the
//! roster and pair tokens cross the network only encrypted and authenticated, and a
//! player knows it talks to the server it talked to before.
//!
//! NX: the player is anonymous (a room's password, not a key, admits it), the server
//! proves its static key in the handshake's second message. The player pins that key on
//! first use and refuses a server that shows another one ([`SecureError::KeyChanged`],
//! with both keys' [`fingerprint`]s), as SSH does.
//!
//! ```text
//! C → S  /netjam/hello                   (clear; unchanged)
//! S → C  /netjam/challenge cookie        (clear; unchanged: proves C's address)
//! C → S  /netjam/hs ,iib v, id, NX msg 1 e; payload: the cookie
//! S → C  /netjam/hs ,iib v, id, NX msg 2 e, ee, s, es; payload empty (the same id)
//! both   /netjam/sealed ,ihb v, n, c     a control message, ChaCha20-Poly1305 at nonce n
//! ```
//!
//! The server does its Diffie-Hellman work only for a first message whose cookie is valid
//! for its source address ([`SecureServer::accept`] asks the caller), so a forged source
//! costs it a hash, not a handshake, and never gets an answer. The client numbers its
//! handshakes and the server's answer carries the number it answers, so a late answer to
//! an earlier handshake is told apart and leaves the one under way to finish
//! ([`SecureError::Stale`]). Transport messages carry
//! their nonce (UDP loses and reorders): each side counts from 0 and a receiver takes a
//! nonce once, within the last [`netjam_sframe::REPLAY_WINDOW`]
//! ([`netjam_sframe::ReplayWindow`]). A session belongs to an address; a player whose
//! address changed says hello and shakes hands again from the new one.
//!
//! Sans-IO like the rest of the room protocol: no socket, no clock (callers pass the
//! time). The ephemeral keys come from the operating system's random source through
//! `snow`, as they must: a predictable ephemeral key would give the session away.
//! Nothing here runs on the audio thread: the control channel is the room thread's and the
//! forwarding thread's.

use std::collections::HashMap;
use std::net::SocketAddr;

use netjam_osc::{encode_message, Arg, Message};
use netjam_sframe::ReplayWindow;
use sha2::{Digest, Sha256};
use snow::{Builder, HandshakeState, StatelessTransportState};

use super::msg::{COOKIE_LEN, PROTOCOL_VERSION};

/// The Noise protocol name: pattern, curve, cipher and hash.
pub const NOISE: &str = "Noise_NX_25519_ChaChaPoly_BLAKE2s";
/// The address of a handshake message.
pub const HANDSHAKE: &str = "/netjam/hs";
/// The address of a sealed control message.
pub const SEALED: &str = "/netjam/sealed";
/// Bytes ChaCha20-Poly1305 adds to each control message.
pub const TAG_LEN: usize = 16;
/// Bytes of a key.
pub const KEY_LEN: usize = 32;
/// Sessions a server keeps by default (one per seated player; beyond, the longest idle
/// one goes).
pub const DEFAULT_SESSIONS: usize = 4096;

/// Why a handshake or a control message was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecureError {
    /// Not a handshake or sealed message of this version, or cut short.
    #[error("not a well-formed /netjam/hs or /netjam/sealed message")]
    Malformed,
    /// The first handshake message carried a cookie not valid for its source.
    #[error("the handshake's cookie is not valid for its source address")]
    BadCookie,
    /// A handshake answer to an earlier handshake of this client (late, or repeated): the
    /// one under way goes on.
    #[error("a late answer to an earlier handshake")]
    Stale,
    /// The handshake failed (another protocol, altered in transit).
    #[error("the Noise handshake failed: {0}")]
    Handshake(String),
    /// A sealed message from an address with no session, or a second message before the
    /// first.
    #[error("no secure session with this address")]
    NoSession,
    /// A sealed message whose tag does not verify: altered, or from another session.
    #[error("a control message did not verify: altered on the way, or from another session")]
    Forged,
    /// A sealed message whose nonce was taken before, or is older than the window.
    #[error("a control message came again (replayed), or too late")]
    Replayed,
    /// The message does not fit the buffer given.
    #[error("the message does not fit the buffer")]
    TooLarge,
    /// The server showed another static key than the one pinned for it.
    #[error("the rooms server's key is {offered}, not {pinned} as it was before: if its operator changed it, forget the old one; otherwise someone is in the way")]
    KeyChanged {
        /// Fingerprint of the key pinned.
        pinned: String,
        /// Fingerprint of the key shown.
        offered: String,
    },
}

/// A short, readable name for a static key: the first 8 bytes of its SHA-256, in hex
/// groups of four (`1a2b-3c4d-5e6f-7a8b`).
pub fn fingerprint(public: &[u8; KEY_LEN]) -> String {
    let d = Sha256::digest(public);
    d[..8]
        .chunks(2)
        .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
        .collect::<Vec<_>>()
        .join("-")
}

/// A rooms server's static key pair.
#[derive(Clone)]
pub struct StaticKey {
    private: [u8; KEY_LEN],
    public: [u8; KEY_LEN],
}

impl std::fmt::Debug for StaticKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StaticKey({})", fingerprint(&self.public))
    }
}

impl StaticKey {
    /// A new key pair from the operating system's random source.
    pub fn generate() -> Result<Self, SecureError> {
        let k = builder()?
            .generate_keypair()
            .map_err(|e| SecureError::Handshake(e.to_string()))?;
        let mut private = [0u8; KEY_LEN];
        private.copy_from_slice(&k.private);
        Ok(Self::from_private(private))
    }

    /// The key pair of a private key (X25519: the public key is computed).
    pub fn from_private(private: [u8; KEY_LEN]) -> Self {
        let public = curve25519_dalek::MontgomeryPoint::mul_base_clamped(private).to_bytes();
        Self { private, public }
    }

    /// The private key, to keep (in a file only its owner reads).
    pub fn private(&self) -> &[u8; KEY_LEN] {
        &self.private
    }

    /// The public key, which players pin.
    pub fn public(&self) -> &[u8; KEY_LEN] {
        &self.public
    }
}

fn builder() -> Result<Builder<'static>, SecureError> {
    let params = NOISE
        .parse()
        .map_err(|e: snow::Error| SecureError::Handshake(e.to_string()))?;
    Ok(Builder::new(params))
}

fn noise(e: snow::Error) -> SecureError {
    SecureError::Handshake(e.to_string())
}

/// Encodes `/netjam/hs ,iib version, id, message` into `out`.
fn handshake_datagram(id: u32, message: &[u8], out: &mut [u8]) -> Result<usize, SecureError> {
    encode_message(
        out,
        HANDSHAKE,
        &[
            Arg::Int(PROTOCOL_VERSION),
            Arg::Int(id as i32),
            Arg::Blob(message),
        ],
    )
    .map_err(|_| SecureError::TooLarge)
}

/// The handshake's number and the Noise message inside a `/netjam/hs`.
fn handshake_message(bytes: &[u8]) -> Result<(u32, &[u8]), SecureError> {
    if !is_handshake(bytes) {
        return Err(SecureError::Malformed);
    }
    let m = Message::decode(bytes).map_err(|_| SecureError::Malformed)?;
    match (m.address(), m.type_tags(), m.arg(0), m.arg(1), m.arg(2)) {
        (HANDSHAKE, "iib", Some(Arg::Int(PROTOCOL_VERSION)), Some(Arg::Int(id)), Some(Arg::Blob(b))) => {
            Ok((id as u32, b))
        }
        _ => Err(SecureError::Malformed),
    }
}

/// Whether `bytes` is addressed as a handshake message (its address only).
pub fn is_handshake(bytes: &[u8]) -> bool {
    bytes.starts_with(HANDSHAKE.as_bytes()) && bytes.get(HANDSHAKE.len()) == Some(&0)
}

/// Whether `bytes` is addressed as a sealed control message (its address only).
pub fn is_sealed(bytes: &[u8]) -> bool {
    bytes.starts_with(SEALED.as_bytes()) && bytes.get(SEALED.len()) == Some(&0)
}

/// One side's transport: the keys, the next nonce to send, the nonces taken.
struct Session {
    transport: StatelessTransportState,
    next: u64,
    taken: ReplayWindow,
    used_ns: u64,
}

impl Session {
    fn new(transport: StatelessTransportState, now_ns: u64) -> Self {
        Self {
            transport,
            next: 0,
            taken: ReplayWindow::default(),
            used_ns: now_ns,
        }
    }

    /// `/netjam/sealed ,ihb version, nonce, ciphertext` of `plaintext` into `out`.
    fn seal(&mut self, plaintext: &[u8], out: &mut [u8]) -> Result<usize, SecureError> {
        // The ciphertext is written first at the end of `out`, then the message around it.
        let mut sealed = [0u8; super::msg::MAX_ENS_LEN + TAG_LEN];
        let sealed = sealed
            .get_mut(..plaintext.len() + TAG_LEN)
            .ok_or(SecureError::TooLarge)?;
        let nonce = self.next;
        let n = self
            .transport
            .write_message(nonce, plaintext, sealed)
            .map_err(|_| SecureError::TooLarge)?;
        self.next += 1;
        encode_message(
            out,
            SEALED,
            &[
                Arg::Int(PROTOCOL_VERSION),
                Arg::Long(nonce as i64),
                Arg::Blob(&sealed[..n]),
            ],
        )
        .map_err(|_| SecureError::TooLarge)
    }

    /// The control message inside a `/netjam/sealed`, written into `out`.
    fn open<'o>(&mut self, now_ns: u64, bytes: &[u8], out: &'o mut [u8]) -> Result<&'o [u8], SecureError> {
        let (nonce, sealed) = sealed_parts(bytes)?;
        if !self.taken.fresh(nonce) {
            return Err(SecureError::Replayed);
        }
        let out = out.get_mut(..sealed.len()).ok_or(SecureError::TooLarge)?;
        let n = self
            .transport
            .read_message(nonce, sealed, out)
            .map_err(|_| SecureError::Forged)?;
        self.taken.mark(nonce);
        self.used_ns = now_ns;
        Ok(&out[..n])
    }
}

/// The nonce and ciphertext of a `/netjam/sealed`.
fn sealed_parts(bytes: &[u8]) -> Result<(u64, &[u8]), SecureError> {
    if !is_sealed(bytes) {
        return Err(SecureError::Malformed);
    }
    let m = Message::decode(bytes).map_err(|_| SecureError::Malformed)?;
    match (m.address(), m.type_tags(), m.arg(0), m.arg(1), m.arg(2)) {
        (SEALED, "ihb", Some(Arg::Int(PROTOCOL_VERSION)), Some(Arg::Long(n)), Some(Arg::Blob(c)))
            if c.len() >= TAG_LEN =>
        {
            Ok((n as u64, c))
        }
        _ => Err(SecureError::Malformed),
    }
}

/// What a [`SecureServer`] did, since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SecureStats {
    /// Handshakes completed.
    pub handshakes: u64,
    /// First messages refused: malformed, a cookie not valid for their source, or a
    /// failed handshake.
    pub handshakes_refused: u64,
    /// Control messages opened.
    pub opened: u64,
    /// Sealed messages from an address with no session.
    pub no_session: u64,
    /// Sealed messages whose tag did not verify (altered).
    pub forged: u64,
    /// Sealed messages taken before, or older than the window.
    pub replayed: u64,
    /// Sessions dropped to make room for newer ones.
    pub evicted: u64,
}

/// The server's side: one session per player address.
pub struct SecureServer {
    key: StaticKey,
    sessions: HashMap<SocketAddr, Session>,
    most: usize,
    stats: SecureStats,
}

impl std::fmt::Debug for SecureServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecureServer")
            .field("key", &self.key)
            .field("sessions", &self.sessions.len())
            .field("stats", &self.stats)
            .finish()
    }
}

impl SecureServer {
    /// A server with `key` keeping at most `most` sessions (at least one).
    pub fn new(key: StaticKey, most: usize) -> Self {
        Self {
            key,
            sessions: HashMap::new(),
            most: most.max(1),
            stats: SecureStats::default(),
        }
    }

    /// The server's public key.
    pub fn public(&self) -> &[u8; KEY_LEN] {
        self.key.public()
    }

    /// Answers a first handshake message from `src` into `out` when `cookie_ok` says its
    /// cookie is valid for `src`; the session replaces any earlier one of that address.
    pub fn accept(
        &mut self,
        now_ns: u64,
        src: SocketAddr,
        bytes: &[u8],
        cookie_ok: impl FnOnce(&[u8; COOKIE_LEN]) -> bool,
        out: &mut [u8],
    ) -> Result<usize, SecureError> {
        let r = self.accept_inner(now_ns, src, bytes, cookie_ok, out);
        match &r {
            Ok(_) => self.stats.handshakes += 1,
            Err(_) => self.stats.handshakes_refused += 1,
        }
        r
    }

    fn accept_inner(
        &mut self,
        now_ns: u64,
        src: SocketAddr,
        bytes: &[u8],
        cookie_ok: impl FnOnce(&[u8; COOKIE_LEN]) -> bool,
        out: &mut [u8],
    ) -> Result<usize, SecureError> {
        let (id, first) = handshake_message(bytes)?;
        // e (32 bytes), then the cookie in clear (NX's first payload is not encrypted).
        let cookie: &[u8; COOKIE_LEN] = first
            .get(KEY_LEN..)
            .and_then(|c| c.try_into().ok())
            .ok_or(SecureError::Malformed)?;
        if !cookie_ok(cookie) {
            return Err(SecureError::BadCookie);
        }
        let mut hs = builder()?
            .local_private_key(self.key.private())
            .build_responder()
            .map_err(noise)?;
        let mut payload = [0u8; 256];
        hs.read_message(first, &mut payload).map_err(noise)?;
        let mut second = [0u8; 256];
        let n = hs.write_message(&[], &mut second).map_err(noise)?;
        let transport = hs.into_stateless_transport_mode().map_err(noise)?;
        let len = handshake_datagram(id, &second[..n], out)?;
        if !self.sessions.contains_key(&src) && self.sessions.len() >= self.most {
            if let Some(idle) = self
                .sessions
                .iter()
                .min_by_key(|(_, s)| s.used_ns)
                .map(|(a, _)| *a)
            {
                self.sessions.remove(&idle);
                self.stats.evicted += 1;
            }
        }
        self.sessions.insert(src, Session::new(transport, now_ns));
        Ok(len)
    }

    /// The control message inside a `/netjam/sealed` from `src`, written into `out`.
    pub fn open<'o>(
        &mut self,
        now_ns: u64,
        src: SocketAddr,
        bytes: &[u8],
        out: &'o mut [u8],
    ) -> Result<&'o [u8], SecureError> {
        let Some(s) = self.sessions.get_mut(&src) else {
            self.stats.no_session += 1;
            return Err(SecureError::NoSession);
        };
        let r = s.open(now_ns, bytes, out);
        match &r {
            Ok(_) => self.stats.opened += 1,
            Err(SecureError::Forged) => self.stats.forged += 1,
            Err(SecureError::Replayed) => self.stats.replayed += 1,
            Err(_) => {}
        }
        r
    }

    /// `plaintext` sealed for `dst` into `out`; [`SecureError::NoSession`] when it has none
    /// (the caller decides whether the message may go in clear).
    pub fn seal(&mut self, dst: SocketAddr, plaintext: &[u8], out: &mut [u8]) -> Result<usize, SecureError> {
        self.sessions
            .get_mut(&dst)
            .ok_or(SecureError::NoSession)?
            .seal(plaintext, out)
    }

    /// Whether `addr` has a session.
    pub fn has(&self, addr: SocketAddr) -> bool {
        self.sessions.contains_key(&addr)
    }

    /// Drops the session of `addr` (its member left, or timed out).
    pub fn forget(&mut self, addr: SocketAddr) {
        self.sessions.remove(&addr);
    }

    /// What it did so far.
    pub fn stats(&self) -> SecureStats {
        self.stats
    }
}

/// The player's side: a handshake under way, then a session with the server it pinned.
pub struct SecureClient {
    pinned: Option<[u8; KEY_LEN]>,
    handshake: Option<HandshakeState>,
    /// The number of the last handshake started.
    attempt: u32,
    session: Option<Session>,
}

impl std::fmt::Debug for SecureClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecureClient")
            .field("pinned", &self.pinned.as_ref().map(fingerprint))
            .field("handshaking", &self.handshake.is_some())
            .field("open", &self.session.is_some())
            .finish()
    }
}

impl SecureClient {
    /// A client that takes only a server showing `pinned` (`None`: any key, first use;
    /// [`SecureClient::finish`] returns it to pin).
    pub fn new(pinned: Option<[u8; KEY_LEN]>) -> Self {
        Self {
            pinned,
            handshake: None,
            attempt: 0,
            session: None,
        }
    }

    /// Starts a handshake carrying `cookie` (the server's challenge to this address): the
    /// first message, into `out`. Any session before is over.
    pub fn start(&mut self, cookie: &[u8; COOKIE_LEN], out: &mut [u8]) -> Result<usize, SecureError> {
        self.session = None;
        let mut hs = builder()?.build_initiator().map_err(noise)?;
        let mut first = [0u8; 256];
        let n = hs.write_message(cookie, &mut first).map_err(noise)?;
        self.handshake = Some(hs);
        self.attempt = self.attempt.wrapping_add(1);
        handshake_datagram(self.attempt, &first[..n], out)
    }

    /// Takes the server's handshake answer: the session is open, and the server's static
    /// key is returned (to pin on first use). A key other than the pinned one is refused.
    pub fn finish(&mut self, now_ns: u64, bytes: &[u8]) -> Result<[u8; KEY_LEN], SecureError> {
        let (id, second) = handshake_message(bytes)?;
        if self.handshake.is_some() && id != self.attempt {
            return Err(SecureError::Stale);
        }
        let mut hs = self.handshake.take().ok_or(SecureError::NoSession)?;
        let mut payload = [0u8; 256];
        // A failed answer ends the handshake: the next attempt starts a new one.
        hs.read_message(second, &mut payload).map_err(noise)?;
        let key: [u8; KEY_LEN] = hs
            .get_remote_static()
            .and_then(|k| k.try_into().ok())
            .ok_or_else(|| SecureError::Handshake("no static key from the server".into()))?;
        if let Some(pinned) = self.pinned.filter(|p| p != &key) {
            return Err(SecureError::KeyChanged {
                pinned: fingerprint(&pinned),
                offered: fingerprint(&key),
            });
        }
        let transport = hs.into_stateless_transport_mode().map_err(noise)?;
        self.session = Some(Session::new(transport, now_ns));
        self.pinned = Some(key);
        Ok(key)
    }

    /// Whether a session is open.
    pub fn is_open(&self) -> bool {
        self.session.is_some()
    }

    /// `plaintext` sealed into `out`.
    pub fn seal(&mut self, plaintext: &[u8], out: &mut [u8]) -> Result<usize, SecureError> {
        self.session
            .as_mut()
            .ok_or(SecureError::NoSession)?
            .seal(plaintext, out)
    }

    /// The control message inside a `/netjam/sealed` from the server, into `out`.
    pub fn open<'o>(
        &mut self,
        now_ns: u64,
        bytes: &[u8],
        out: &'o mut [u8],
    ) -> Result<&'o [u8], SecureError> {
        self.session
            .as_mut()
            .ok_or(SecureError::NoSession)?
            .open(now_ns, bytes, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = super::super::msg::MAX_ENS_LEN + 64;

    fn addr(p: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], p))
    }

    /// A handshake between a fresh client and `server` for `src`, cookie accepted.
    fn shake(
        server: &mut SecureServer,
        client: &mut SecureClient,
        src: SocketAddr,
    ) -> Result<[u8; 32], SecureError> {
        let (mut a, mut b) = ([0u8; 256], [0u8; 256]);
        let n = client.start(&[5; COOKIE_LEN], &mut a)?;
        // Each handshake a moment after the last, so "longest idle" is one session.
        let at = 10 + u64::from(src.port());
        let m = server.accept(at, src, &a[..n], |c| c == &[5; COOKIE_LEN], &mut b)?;
        client.finish(2, &b[..m])
    }

    #[test]
    fn a_handshake_opens_both_ways_and_the_client_learns_the_servers_key() {
        let key = StaticKey::generate().expect("key");
        let public = *key.public();
        assert_eq!(StaticKey::from_private(*key.private()).public(), &public);
        let mut server = SecureServer::new(key, 8);
        let mut client = SecureClient::new(None);
        assert_eq!(shake(&mut server, &mut client, addr(1)), Ok(public));
        assert!(client.is_open() && server.has(addr(1)));
        let (mut wire, mut out) = ([0u8; MAX], [0u8; MAX]);
        for msg in [&b"/netjam/join secret token"[..], b"", &[7u8; 1400][..]] {
            let n = client.seal(msg, &mut wire).expect("seal");
            assert!(is_sealed(&wire[..n]));
            assert!(!wire[..n].windows(msg.len().max(1)).any(|w| w == msg) || msg.is_empty());
            assert_eq!(server.open(3, addr(1), &wire[..n], &mut out), Ok(msg));
            let n = server.seal(addr(1), msg, &mut wire).expect("seal");
            assert_eq!(client.open(4, &wire[..n], &mut out), Ok(msg));
        }
        // Another address has no session.
        let n = client.seal(b"x", &mut wire).expect("seal");
        assert_eq!(
            server.open(5, addr(2), &wire[..n], &mut out),
            Err(SecureError::NoSession)
        );
        assert_eq!(server.stats().handshakes, 1);
        assert_eq!(fingerprint(&public).len(), 19);
    }

    #[test]
    fn an_altered_or_repeated_message_is_refused_and_the_session_plays_on() {
        let mut server = SecureServer::new(StaticKey::generate().expect("key"), 8);
        let mut client = SecureClient::new(None);
        shake(&mut server, &mut client, addr(1)).expect("handshake");
        let (mut wire, mut out) = ([0u8; MAX], [0u8; MAX]);
        let n = client.seal(b"/netjam/leave", &mut wire).expect("seal");
        let sealed = wire[..n].to_vec();
        // Every byte of the ciphertext and tag (the last 4 + 13 + 16 bytes) matters.
        for i in n - 29..n {
            let mut b = sealed.clone();
            b[i] ^= 0x40;
            assert!(
                server.open(2, addr(1), &b, &mut out).is_err(),
                "byte {i} altered and taken"
            );
        }
        assert_eq!(
            server.open(3, addr(1), &sealed, &mut out),
            Ok(&b"/netjam/leave"[..])
        );
        assert_eq!(
            server.open(4, addr(1), &sealed, &mut out),
            Err(SecureError::Replayed)
        );
        // Later messages still open, in any order within the window.
        let n1 = client.seal(b"one", &mut wire).expect("seal");
        let first = wire[..n1].to_vec();
        let n2 = client.seal(b"two", &mut wire).expect("seal");
        assert_eq!(server.open(5, addr(1), &wire[..n2], &mut out), Ok(&b"two"[..]));
        assert_eq!(server.open(6, addr(1), &first, &mut out), Ok(&b"one"[..]));
        let s = server.stats();
        assert!(s.forged >= 16 && s.replayed == 1 && s.opened == 3, "{s:?}");
    }

    #[test]
    fn a_late_answer_to_an_earlier_handshake_leaves_the_one_under_way_to_finish() {
        let mut server = SecureServer::new(StaticKey::generate().expect("key"), 8);
        let mut client = SecureClient::new(None);
        let (mut a, mut b, mut c) = ([0u8; 256], [0u8; 256], [0u8; 256]);
        let cookie = |k: &[u8; COOKIE_LEN]| k == &[5; COOKIE_LEN];
        // The first try's answer is slow; the client starts again before it comes.
        let n = client.start(&[5; COOKIE_LEN], &mut a).expect("start");
        let late = server
            .accept(1, addr(1), &a[..n], cookie, &mut b)
            .expect("answer");
        let n = client.start(&[5; COOKIE_LEN], &mut a).expect("start again");
        let m = server
            .accept(2, addr(1), &a[..n], cookie, &mut c)
            .expect("answer again");
        assert_eq!(client.finish(3, &b[..late]), Err(SecureError::Stale));
        assert!(!client.is_open());
        assert!(client.finish(4, &c[..m]).is_ok(), "the one under way finishes");
        // And they talk.
        let (mut wire, mut out) = ([0u8; MAX], [0u8; MAX]);
        let k = client.seal(b"/netjam/keepalive", &mut wire).expect("seal");
        assert_eq!(
            server.open(5, addr(1), &wire[..k], &mut out),
            Ok(&b"/netjam/keepalive"[..])
        );
        // The late answer again, once open: not taken, the session stays.
        assert!(client.finish(6, &b[..late]).is_err());
        assert!(client.is_open());
    }

    #[test]
    fn a_server_with_another_key_is_refused_naming_both_fingerprints() {
        let (k1, k2) = (
            StaticKey::generate().expect("key"),
            StaticKey::generate().expect("key"),
        );
        let (p1, p2) = (*k1.public(), *k2.public());
        let mut client = SecureClient::new(Some(p1));
        assert_eq!(shake(&mut SecureServer::new(k1, 1), &mut client, addr(1)), Ok(p1));
        let mut client = SecureClient::new(Some(p1));
        let e = shake(&mut SecureServer::new(k2, 1), &mut client, addr(1)).expect_err("another key");
        assert_eq!(
            e,
            SecureError::KeyChanged {
                pinned: fingerprint(&p1),
                offered: fingerprint(&p2)
            }
        );
        assert!(!client.is_open());
        assert!(e.to_string().contains(&fingerprint(&p2)));
    }

    #[test]
    fn no_handshake_without_a_valid_cookie_and_sessions_are_bounded() {
        let mut server = SecureServer::new(StaticKey::generate().expect("key"), 2);
        let mut client = SecureClient::new(None);
        let (mut a, mut b) = ([0u8; 256], [0u8; 256]);
        let n = client.start(&[9; COOKIE_LEN], &mut a).expect("start");
        assert_eq!(
            server.accept(1, addr(1), &a[..n], |c| c == &[5; COOKIE_LEN], &mut b),
            Err(SecureError::BadCookie)
        );
        assert!(!server.has(addr(1)));
        for p in 1..=3 {
            shake(&mut server, &mut SecureClient::new(None), addr(p)).expect("handshake");
        }
        assert!(!server.has(addr(1)) && server.has(addr(2)) && server.has(addr(3)));
        assert_eq!(server.stats().evicted, 1);
        // A new handshake from an address replaces its session: the old keys open nothing.
        let mut old = SecureClient::new(None);
        shake(&mut server, &mut old, addr(3)).expect("handshake");
        let mut new = SecureClient::new(None);
        shake(&mut server, &mut new, addr(3)).expect("handshake");
        let (mut wire, mut out) = ([0u8; MAX], [0u8; MAX]);
        let n = old.seal(b"x", &mut wire).expect("seal");
        assert_eq!(
            server.open(9, addr(3), &wire[..n], &mut out),
            Err(SecureError::Forged)
        );
    }

    #[test]
    fn garbage_never_panics() {
        let mut server = SecureServer::new(StaticKey::generate().expect("key"), 4);
        let mut client = SecureClient::new(None);
        shake(&mut server, &mut client, addr(1)).expect("handshake");
        let (mut wire, mut out) = ([0u8; MAX], [0u8; MAX]);
        let n = client.seal(b"/netjam/keepalive", &mut wire).expect("seal");
        let mut x = 0x1234_5678_9abc_def1_u64;
        for i in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let mut b = wire[..n].to_vec();
            match i % 3 {
                0 => b.truncate((x as usize) % (n + 1)),
                1 => b[(x as usize) % n] ^= (x >> 8) as u8 | 1,
                _ => b = (0..(x % 200) as usize).map(|k| (x >> (k % 56)) as u8).collect(),
            }
            let _ = server.open(2, addr(1), &b, &mut out);
            let _ = client.open(2, &b, &mut out);
            let _ = server.accept(2, addr(7), &b, |_| true, &mut out);
            let _ = client.finish(2, &b);
        }
    }
}
