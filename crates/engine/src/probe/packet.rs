//! The probe packet format spoken between `netjam ping` and `netjam reflect`.
//!
//! Every probe packet starts with the ASCII magic `NJP` and a version byte. `N` is 0x4E,
//! whose top two bits are `01`, so a probe is never mistaken for RTP or RTCP (version bits
//! `10`) arriving on the same port. All integers are big-endian.
//!
//! ```text
//! common header (8 bytes)
//!   0..3   "NJP"            3      version (1)
//!   4      kind             5      flags (bit 0: authenticated, bit 1: reflector used kernel timestamps)
//!   6..8   reserved (0); in probe replies: probes the reflector refused under its
//!          rate limit in this session (saturating)
//! hello         8..12 session id, then padding; at least as long as its reply
//! hello reply   8..12 session id, 12..20 token, 20..24 token lifetime (ms)
//! probe/reply   8..12 session id, 12..16 sequence number, 16..24 sender's send time (ns),
//!               24..32 token, 32..40 reflector receive time (ns), 40..44 reflector hold
//!               time (ns), 44..48 probes the reflector has received in this session,
//!               then padding
//! authenticated packets end with a 16-byte HMAC-SHA256 tag over everything before it
//! ```
//!
//! A probe reply has exactly the length of its probe (the request reserves room for the
//! reflector's fields), so a reflector never amplifies. Parsers borrow, never allocate and
//! return a typed [`ProbeError`] for every malformed input.

use std::net::SocketAddr;

use hmac::digest::generic_array::GenericArray;
use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::wire::rtp::PacketKind;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// The first three bytes of every probe packet.
pub const MAGIC: [u8; 3] = *b"NJP";
/// The probe format version this code speaks.
pub const VERSION: u8 = 1;
/// Length of the common header.
pub const HEADER_LEN: usize = 8;
/// Length of an authentication tag (truncated HMAC-SHA256).
pub const TAG_LEN: usize = 16;
/// Length of a token.
pub const TOKEN_LEN: usize = 8;
/// Length of a hello reply without a tag.
pub const HELLO_REPLY_LEN: usize = 24;
/// Length of a hello request as sent by [`write_hello`]: comfortably longer than its reply.
pub const HELLO_LEN: usize = 64;
/// Smallest probe without a tag.
pub const PROBE_MIN_LEN: usize = 48;
/// Largest probe this code writes or accepts (a UDP payload that fits an Ethernet MTU is
/// recommended; loopback tests may go up to this).
pub const PROBE_MAX_LEN: usize = 9000;

/// Flag: the packet ends with an authentication tag.
pub const FLAG_AUTH: u8 = 0x01;
/// Flag (replies): the reflector's receive time came from the kernel.
pub const FLAG_KERNEL_TS: u8 = 0x02;

/// What a datagram on the reflector's port is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DatagramKind {
    /// Starts with the probe magic.
    Probe,
    /// RTP (version 2, payload type outside the RTCP range).
    Rtp,
    /// RTCP (version 2, packet type 192..=223, RFC 5761).
    Rtcp,
    /// Anything else.
    Other,
}

/// Tell probe, RTP and RTCP datagrams apart by their first bytes: the probe magic, else
/// [`crate::wire::rtp::classify`] (RFC 5761), requiring a full fixed header (12 bytes for
/// RTP, 8 for RTCP) before calling anything RTP.
pub fn classify(buf: &[u8]) -> DatagramKind {
    if buf.len() >= 3 && buf[..3] == MAGIC {
        return DatagramKind::Probe;
    }
    match crate::wire::rtp::classify(buf) {
        PacketKind::Rtp if buf.len() >= 12 => DatagramKind::Rtp,
        PacketKind::Rtcp if buf.len() >= 8 => DatagramKind::Rtcp,
        _ => DatagramKind::Other,
    }
}

/// Kinds of probe packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    HelloReply = 2,
    Probe = 3,
    ProbeReply = 4,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Kind::Hello,
            2 => Kind::HelloReply,
            3 => Kind::Probe,
            4 => Kind::ProbeReply,
            _ => return None,
        })
    }
}

/// Why a probe packet was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ProbeError {
    #[error("packet too short for its kind")]
    Truncated,
    #[error("packet too long")]
    TooLong,
    #[error("not a probe packet (bad magic)")]
    BadMagic,
    #[error("unsupported probe version {0}")]
    UnsupportedVersion(u8),
    #[error("unknown probe packet kind {0}")]
    UnknownKind(u8),
    #[error("unexpected probe packet kind")]
    UnexpectedKind,
    #[error("authentication tag missing")]
    MissingTag,
    #[error("authentication tag wrong")]
    BadTag,
    #[error("reply belongs to another session")]
    WrongSession,
    #[error("requested size is below the minimum")]
    SizeTooSmall,
}

/// A shared secret, keyed once, that authenticates probe packets (HMAC-SHA256).
#[derive(Clone)]
pub struct ProbeKey {
    mac: HmacSha256,
}

impl std::fmt::Debug for ProbeKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProbeKey(..)")
    }
}

impl ProbeKey {
    /// Key from a shared secret of any length.
    pub fn new(secret: &[u8]) -> Self {
        // HMAC pads short keys with zeros and hashes long ones to one block; doing that
        // here makes keying infallible.
        let mut block = [0u8; 64];
        if secret.len() <= block.len() {
            block[..secret.len()].copy_from_slice(secret);
        } else {
            block[..32].copy_from_slice(&Sha256::digest(secret));
        }
        let mac = <HmacSha256 as KeyInit>::new(GenericArray::from_slice(&block));
        Self { mac }
    }

    fn tag(&self, data: &[u8]) -> [u8; TAG_LEN] {
        let mut m = self.mac.clone();
        m.update(data);
        let full = m.finalize().into_bytes();
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(&full[..TAG_LEN]);
        out
    }

    fn verify(&self, data: &[u8], tag: &[u8]) -> bool {
        let mut m = self.mac.clone();
        m.update(data);
        m.verify_truncated_left(tag).is_ok()
    }
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// The common header of a probe packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub flags: u8,
    pub session: u32,
}

/// Parse the common header and the session id (bytes 8..12, present in every kind).
pub fn parse_header(buf: &[u8]) -> Result<Header, ProbeError> {
    if buf.len() < 3 || buf[..3] != MAGIC {
        return Err(ProbeError::BadMagic);
    }
    if buf.len() < 12 {
        return Err(ProbeError::Truncated);
    }
    if buf[3] != VERSION {
        return Err(ProbeError::UnsupportedVersion(buf[3]));
    }
    if buf.len() > PROBE_MAX_LEN {
        return Err(ProbeError::TooLong);
    }
    let kind = Kind::from_u8(buf[4]).ok_or(ProbeError::UnknownKind(buf[4]))?;
    Ok(Header {
        kind,
        flags: buf[5],
        session: get_u32(buf, 8),
    })
}

fn write_header(buf: &mut [u8], kind: Kind, flags: u8, session: u32) {
    buf[..3].copy_from_slice(&MAGIC);
    buf[3] = VERSION;
    buf[4] = kind as u8;
    buf[5] = flags;
    buf[6] = 0;
    buf[7] = 0;
    put_u32(buf, 8, session);
}

/// Check the tag of `buf` (if `key` is given) and return the body without the tag.
/// Without a key, a tag present on the packet is ignored and stripped.
pub fn check_auth<'a>(buf: &'a [u8], key: Option<&ProbeKey>) -> Result<&'a [u8], ProbeError> {
    let authed = buf.len() > 5 && buf[5] & FLAG_AUTH != 0;
    match (key, authed) {
        (Some(_), false) => Err(ProbeError::MissingTag),
        (_, true) if buf.len() < HEADER_LEN + TAG_LEN => Err(ProbeError::Truncated),
        (Some(k), true) => {
            let (body, tag) = buf.split_at(buf.len() - TAG_LEN);
            if k.verify(body, tag) {
                Ok(body)
            } else {
                Err(ProbeError::BadTag)
            }
        }
        (None, true) => Ok(&buf[..buf.len() - TAG_LEN]),
        (None, false) => Ok(buf),
    }
}

/// Append the tag over `buf[..body_len]` at `body_len`; returns the total length.
fn seal(buf: &mut [u8], body_len: usize, key: Option<&ProbeKey>) -> usize {
    match key {
        Some(k) => {
            let tag = k.tag(&buf[..body_len]);
            buf[body_len..body_len + TAG_LEN].copy_from_slice(&tag);
            body_len + TAG_LEN
        }
        None => body_len,
    }
}

fn auth_flag(key: Option<&ProbeKey>) -> u8 {
    if key.is_some() {
        FLAG_AUTH
    } else {
        0
    }
}

/// Write a hello into `buf` (at least [`HELLO_LEN`] bytes); returns its length.
pub fn write_hello(buf: &mut [u8], session: u32, key: Option<&ProbeKey>) -> Result<usize, ProbeError> {
    if buf.len() < HELLO_LEN {
        return Err(ProbeError::Truncated);
    }
    let body = HELLO_LEN - if key.is_some() { TAG_LEN } else { 0 };
    buf[..body].fill(0);
    write_header(buf, Kind::Hello, auth_flag(key), session);
    Ok(seal(buf, body, key))
}

/// A reflector's answer to a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HelloReply {
    pub session: u32,
    pub token: [u8; TOKEN_LEN],
    /// How long the token stays valid, at least.
    pub valid_ms: u32,
}

/// Length of a hello reply on the wire.
pub fn hello_reply_len(key: Option<&ProbeKey>) -> usize {
    HELLO_REPLY_LEN + if key.is_some() { TAG_LEN } else { 0 }
}

/// Write a hello reply; `buf` must hold [`hello_reply_len`] bytes.
pub fn write_hello_reply(
    buf: &mut [u8],
    reply: &HelloReply,
    key: Option<&ProbeKey>,
) -> Result<usize, ProbeError> {
    if buf.len() < hello_reply_len(key) {
        return Err(ProbeError::Truncated);
    }
    write_header(buf, Kind::HelloReply, auth_flag(key), reply.session);
    buf[12..20].copy_from_slice(&reply.token);
    put_u32(buf, 20, reply.valid_ms);
    Ok(seal(buf, HELLO_REPLY_LEN, key))
}

/// Parse a hello reply, checking its tag when a key is given.
pub fn parse_hello_reply(buf: &[u8], key: Option<&ProbeKey>) -> Result<HelloReply, ProbeError> {
    let h = parse_header(buf)?;
    if h.kind != Kind::HelloReply {
        return Err(ProbeError::UnexpectedKind);
    }
    let body = check_auth(buf, key)?;
    if body.len() < HELLO_REPLY_LEN {
        return Err(ProbeError::Truncated);
    }
    let mut token = [0u8; TOKEN_LEN];
    token.copy_from_slice(&body[12..20]);
    Ok(HelloReply {
        session: h.session,
        token,
        valid_ms: get_u32(body, 20),
    })
}

/// The smallest probe size for the given authentication.
pub fn probe_min_len(key: Option<&ProbeKey>) -> usize {
    PROBE_MIN_LEN + if key.is_some() { TAG_LEN } else { 0 }
}

/// What the sender puts in a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeRequest {
    pub session: u32,
    pub seq: u32,
    /// Sender's send time on its own clock (ns).
    pub t1_ns: u64,
    pub token: [u8; TOKEN_LEN],
}

/// Write a probe of exactly `size` bytes into `buf`; returns `size`.
pub fn write_probe(
    buf: &mut [u8],
    size: usize,
    req: &ProbeRequest,
    key: Option<&ProbeKey>,
) -> Result<usize, ProbeError> {
    if size < probe_min_len(key) {
        return Err(ProbeError::SizeTooSmall);
    }
    if size > PROBE_MAX_LEN {
        return Err(ProbeError::TooLong);
    }
    if buf.len() < size {
        return Err(ProbeError::Truncated);
    }
    let body = size - if key.is_some() { TAG_LEN } else { 0 };
    write_header(buf, Kind::Probe, auth_flag(key), req.session);
    put_u32(buf, 12, req.seq);
    put_u64(buf, 16, req.t1_ns);
    buf[24..32].copy_from_slice(&req.token);
    buf[32..body].fill(0);
    Ok(seal(buf, body, key))
}

/// Parse a probe (reflector side), checking its tag when a key is given.
pub fn parse_probe(buf: &[u8], key: Option<&ProbeKey>) -> Result<ProbeRequest, ProbeError> {
    let h = parse_header(buf)?;
    if h.kind != Kind::Probe {
        return Err(ProbeError::UnexpectedKind);
    }
    let body = check_auth(buf, key)?;
    if body.len() < PROBE_MIN_LEN {
        return Err(ProbeError::Truncated);
    }
    let mut token = [0u8; TOKEN_LEN];
    token.copy_from_slice(&body[24..32]);
    Ok(ProbeRequest {
        session: h.session,
        seq: get_u32(body, 12),
        t1_ns: get_u64(body, 16),
        token,
    })
}

/// What the reflector adds to a probe when it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReflectorFields {
    /// Reflector's receive time on its own clock (ns).
    pub t2_ns: u64,
    /// Time the reflector held the probe, receive to send (ns, saturating).
    pub hold_ns: u32,
    /// Probes the reflector has accepted in this session, this one included.
    pub received: u32,
    /// Probes the reflector refused under its rate limit in this session.
    pub refused: u16,
    /// The reflector's receive time came from the kernel.
    pub kernel_ts: bool,
}

/// Turn a validated probe in `buf` into its reply in place (same length). The packet must
/// have passed [`parse_probe`] with the same key presence.
pub fn write_probe_reply(
    buf: &mut [u8],
    fields: &ReflectorFields,
    key: Option<&ProbeKey>,
) -> Result<usize, ProbeError> {
    let len = buf.len();
    let body = len
        .checked_sub(if key.is_some() { TAG_LEN } else { 0 })
        .ok_or(ProbeError::Truncated)?;
    if body < PROBE_MIN_LEN {
        return Err(ProbeError::Truncated);
    }
    let mut flags = auth_flag(key);
    if fields.kernel_ts {
        flags |= FLAG_KERNEL_TS;
    }
    buf[4] = Kind::ProbeReply as u8;
    buf[5] = flags;
    buf[6..8].copy_from_slice(&fields.refused.to_be_bytes());
    put_u64(buf, 32, fields.t2_ns);
    put_u32(buf, 40, fields.hold_ns);
    put_u32(buf, 44, fields.received);
    Ok(seal(buf, body, key))
}

/// A reply to one probe, as the sender sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeReply {
    pub session: u32,
    pub seq: u32,
    pub t1_ns: u64,
    pub t2_ns: u64,
    pub hold_ns: u32,
    pub received: u32,
    pub refused: u16,
    pub reflector_kernel_ts: bool,
}

/// Parse a probe reply (sender side) for `session`, checking its tag when a key is given.
pub fn parse_probe_reply(buf: &[u8], session: u32, key: Option<&ProbeKey>) -> Result<ProbeReply, ProbeError> {
    let h = parse_header(buf)?;
    if h.kind != Kind::ProbeReply {
        return Err(ProbeError::UnexpectedKind);
    }
    let body = check_auth(buf, key)?;
    if body.len() < PROBE_MIN_LEN {
        return Err(ProbeError::Truncated);
    }
    if h.session != session {
        return Err(ProbeError::WrongSession);
    }
    Ok(ProbeReply {
        session: h.session,
        seq: get_u32(body, 12),
        t1_ns: get_u64(body, 16),
        t2_ns: get_u64(body, 32),
        hold_ns: get_u32(body, 40),
        received: get_u32(body, 44),
        refused: u16::from_be_bytes([body[6], body[7]]),
        reflector_kernel_ts: h.flags & FLAG_KERNEL_TS != 0,
    })
}

/// Bytes that identify a source address for tokens: 16 address bytes (IPv4 mapped) and
/// the port.
pub fn addr_bytes(addr: &SocketAddr) -> [u8; 18] {
    let mut out = [0u8; 18];
    let ip = match addr {
        SocketAddr::V4(a) => a.ip().to_ipv6_mapped(),
        SocketAddr::V6(a) => *a.ip(),
    };
    out[..16].copy_from_slice(&ip.octets());
    out[16..].copy_from_slice(&addr.port().to_be_bytes());
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn req() -> ProbeRequest {
        ProbeRequest {
            session: 0xDEAD_BEEF,
            seq: 7,
            t1_ns: 123_456_789,
            token: [1, 2, 3, 4, 5, 6, 7, 8],
        }
    }

    #[test]
    fn probe_magic_is_never_rtp() {
        let mut b = [0u8; 64];
        let n = write_probe(&mut b, 64, &req(), None).unwrap();
        assert_eq!(classify(&b[..n]), DatagramKind::Probe);
        assert_ne!(b[0] >> 6, 2);
        let mut rtp = [0u8; 20];
        rtp[0] = 0x80;
        rtp[1] = 96;
        assert_eq!(classify(&rtp), DatagramKind::Rtp);
        rtp[1] = 200;
        assert_eq!(classify(&rtp), DatagramKind::Rtcp);
        assert_eq!(classify(&[0x80, 96, 0]), DatagramKind::Other);
        assert_eq!(classify(&[]), DatagramKind::Other);
    }

    #[test]
    fn probe_round_trips_with_and_without_key() {
        for key in [None, Some(ProbeKey::new(b"s3cret"))] {
            let k = key.as_ref();
            let mut b = vec![0u8; 200];
            let n = write_probe(&mut b, 100, &req(), k).unwrap();
            assert_eq!(n, 100);
            assert_eq!(parse_probe(&b[..n], k).unwrap(), req());
            let f = ReflectorFields {
                t2_ns: 99,
                hold_ns: 5,
                received: 3,
                refused: 2,
                kernel_ts: true,
            };
            assert_eq!(write_probe_reply(&mut b[..n], &f, k).unwrap(), n);
            let r = parse_probe_reply(&b[..n], req().session, k).unwrap();
            assert_eq!(
                (r.seq, r.t1_ns, r.t2_ns, r.hold_ns, r.received),
                (7, 123_456_789, 99, 5, 3)
            );
            assert_eq!(r.refused, 2);
            assert!(r.reflector_kernel_ts);
            assert_eq!(parse_probe_reply(&b[..n], 1, k), Err(ProbeError::WrongSession));
        }
    }

    #[test]
    fn key_is_standard_hmac_sha256() {
        for secret in [&b""[..], b"abc", &[7u8; 64], &[7u8; 100]] {
            let k = ProbeKey::new(secret);
            let mut m = <HmacSha256 as Mac>::new_from_slice(secret).unwrap();
            m.update(b"payload");
            assert_eq!(k.tag(b"payload")[..], m.finalize().into_bytes()[..TAG_LEN]);
        }
    }

    #[test]
    fn tags_are_checked() {
        let key = ProbeKey::new(b"right");
        let other = ProbeKey::new(b"wrong");
        let mut b = [0u8; 64];
        let n = write_probe(&mut b, 64, &req(), Some(&key)).unwrap();
        assert_eq!(parse_probe(&b[..n], Some(&other)), Err(ProbeError::BadTag));
        b[20] ^= 1;
        assert_eq!(parse_probe(&b[..n], Some(&key)), Err(ProbeError::BadTag));
        let n = write_probe(&mut b, 64, &req(), None).unwrap();
        assert_eq!(parse_probe(&b[..n], Some(&key)), Err(ProbeError::MissingTag));
    }

    #[test]
    fn hello_is_longer_than_its_reply() {
        for key in [None, Some(ProbeKey::new(b"k"))] {
            let k = key.as_ref();
            let mut b = [0u8; 128];
            let n = write_hello(&mut b, 5, k).unwrap();
            assert!(n >= hello_reply_len(k));
            let h = parse_header(&b[..n]).unwrap();
            assert_eq!((h.kind, h.session), (Kind::Hello, 5));
            let r = HelloReply {
                session: 5,
                token: [9; 8],
                valid_ms: 1000,
            };
            let m = write_hello_reply(&mut b, &r, k).unwrap();
            assert_eq!(parse_hello_reply(&b[..m], k).unwrap(), r);
        }
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let key = ProbeKey::new(b"k");
        let mut b = [0u8; 64];
        let n = write_probe(&mut b, 64, &req(), Some(&key)).unwrap();
        for cut in 0..n {
            assert!(parse_probe(&b[..cut], Some(&key)).is_err());
            assert!(parse_probe_reply(&b[..cut], 1, None).is_err());
            assert!(parse_hello_reply(&b[..cut], None).is_err());
        }
        let mut b = [0u8; 48];
        let n = write_probe(&mut b, 48, &req(), None).unwrap();
        for cut in 0..n {
            assert!(parse_probe(&b[..cut], None).is_err(), "cut {cut}");
        }
        assert_eq!(
            write_probe(&mut b, 47, &req(), None),
            Err(ProbeError::SizeTooSmall)
        );
    }
}
