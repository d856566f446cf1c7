//! STUN Binding (RFC 8489), the part netjam needs: a client asks "what address do you see
//! me at?", a server answers with XOR-MAPPED-ADDRESS. The rooms server answers on its
//! media port (so the mapping it reports is the one the player's audio uses), and a client
//! can ask any public STUN server the same question.
//!
//! Written here rather than taken from a crate: the STUN crates on crates.io (`stun-rs`,
//! `stun_codec`, `stun-types`, `faster-stun`) build messages into `Vec`s or `BytesMut`, bring
//! attribute registries, integrity and TURN with them, and would be the engine's first
//! dependency outside hashing and serde, for what is a 20-byte header and one 12- or
//! 24-byte attribute. These functions write into the caller's buffer and read the caller's
//! bytes, never allocate, never panic on any input, and are tested against coturn's
//! `turnutils_stunclient` (`crates/netjam/tests/nat_rooms.rs`).
//!
//! Not here, on purpose: MESSAGE-INTEGRITY, FINGERPRINT checks, ALTERNATE-SERVER, error
//! responses, RFC 5780 behaviour discovery, TURN. A request carrying a
//! comprehension-required attribute this module does not know is refused (not answered):
//! RFC 8489 asks for a 420 error there, which would make an unproven address's reply
//! longer than a plain answer for no gain to netjam's players.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The magic cookie every RFC 5389/8489 message carries at bytes 4..8.
pub const MAGIC_COOKIE: u32 = 0x2112_A442;
/// The fixed header: type, length, cookie, transaction id.
pub const HEADER_LEN: usize = 20;
/// Message type of a Binding request.
pub const BINDING_REQUEST: u16 = 0x0001;
/// Message type of a Binding success response.
pub const BINDING_SUCCESS: u16 = 0x0101;
/// Attribute type of MAPPED-ADDRESS (RFC 3489's, still sent by old servers).
const MAPPED_ADDRESS: u16 = 0x0001;
/// Attribute type of XOR-MAPPED-ADDRESS.
const XOR_MAPPED_ADDRESS: u16 = 0x0020;
/// Attribute type of SOFTWARE.
const SOFTWARE: u16 = 0x8022;
/// What netjam's requests carry in SOFTWARE: it also makes a request 32 bytes, so a
/// server that answers no more than it was sent plus 12 bytes can answer it even for an
/// IPv6 address (a 44-byte answer).
const SOFTWARE_TEXT: &[u8; 6] = b"netjam";
/// Length of netjam's Binding request.
pub const REQUEST_LEN: usize = HEADER_LEN + 4 + 8;
/// The longest Binding success response written here (IPv6).
pub const MAX_SUCCESS_LEN: usize = HEADER_LEN + 4 + 20;

/// A STUN transaction id.
pub type TransactionId = [u8; 12];

/// Why bytes are not the STUN message asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StunError {
    /// Too short, top bits set, no magic cookie, or a length field that does not match.
    #[error("not a STUN message")]
    NotStun,
    /// A STUN message of another type than expected.
    #[error("STUN message type {0:#06x} where another was expected")]
    UnexpectedType(u16),
    /// An attribute runs past the end of the message or is malformed.
    #[error("malformed STUN attribute {0:#06x}")]
    BadAttribute(u16),
    /// A comprehension-required attribute this implementation does not know.
    #[error("unknown comprehension-required STUN attribute {0:#06x}")]
    UnknownRequired(u16),
    /// A response to another transaction.
    #[error("STUN response to another transaction")]
    WrongTransaction,
    /// A success response without a (XOR-)MAPPED-ADDRESS.
    #[error("STUN success response without a mapped address")]
    NoMappedAddress,
    /// The caller's buffer is too small for the message.
    #[error("buffer too small for the STUN message")]
    BufferTooSmall,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|w| u16::from_be_bytes([w[0], w[1]]))
}

/// Whether `b` looks like a STUN message (RFC 8489 §6): at least a header, the two top
/// bits zero, the magic cookie, and a length field that is a multiple of 4 and matches.
/// Cheap enough to call on any datagram whose first byte is 0 or 1.
#[inline]
pub fn is_stun(b: &[u8]) -> bool {
    header(b).is_ok()
}

/// The message type, transaction id and attribute bytes of a well-formed STUN message.
fn header(b: &[u8]) -> Result<(u16, TransactionId, &[u8]), StunError> {
    if b.len() < HEADER_LEN || b[0] & 0xC0 != 0 {
        return Err(StunError::NotStun);
    }
    let cookie = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
    let len = usize::from(u16::from_be_bytes([b[2], b[3]]));
    if cookie != MAGIC_COOKIE || len % 4 != 0 || HEADER_LEN + len != b.len() {
        return Err(StunError::NotStun);
    }
    let kind = u16::from_be_bytes([b[0], b[1]]);
    let mut txid = [0u8; 12];
    txid.copy_from_slice(&b[8..HEADER_LEN]);
    Ok((kind, txid, &b[HEADER_LEN..]))
}

/// Each attribute of `attrs` as (type, value), or the first error.
fn attributes(attrs: &[u8]) -> impl Iterator<Item = Result<(u16, &[u8]), StunError>> {
    let mut at = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || at >= attrs.len() {
            return None;
        }
        let (Some(kind), Some(len)) = (be16(attrs, at), be16(attrs, at + 2)) else {
            failed = true;
            return Some(Err(StunError::BadAttribute(0)));
        };
        let start = at + 4;
        let end = start + usize::from(len);
        let Some(value) = attrs.get(start..end) else {
            failed = true;
            return Some(Err(StunError::BadAttribute(kind)));
        };
        at = start + usize::from(len).div_ceil(4) * 4;
        Some(Ok((kind, value)))
    })
}

/// The transaction id of a Binding request, if `b` is one this module can answer.
pub fn parse_binding_request(b: &[u8]) -> Result<TransactionId, StunError> {
    let (kind, txid, attrs) = header(b)?;
    if kind != BINDING_REQUEST {
        return Err(StunError::UnexpectedType(kind));
    }
    for a in attributes(attrs) {
        let (kind, _) = a?;
        // 0x0000..=0x7FFF are comprehension-required; none is needed for a Binding.
        if kind < 0x8000 {
            return Err(StunError::UnknownRequired(kind));
        }
    }
    Ok(txid)
}

/// Writes netjam's Binding request (header and SOFTWARE, [`REQUEST_LEN`] bytes) into
/// `buf` and returns its length.
pub fn write_binding_request(txid: &TransactionId, buf: &mut [u8]) -> Result<usize, StunError> {
    let out = buf.get_mut(..REQUEST_LEN).ok_or(StunError::BufferTooSmall)?;
    write_header(out, BINDING_REQUEST, REQUEST_LEN - HEADER_LEN, txid);
    out[20..22].copy_from_slice(&SOFTWARE.to_be_bytes());
    out[22..24].copy_from_slice(&(SOFTWARE_TEXT.len() as u16).to_be_bytes());
    out[24..30].copy_from_slice(SOFTWARE_TEXT);
    out[30..32].fill(0);
    Ok(REQUEST_LEN)
}

fn write_header(out: &mut [u8], kind: u16, len: usize, txid: &TransactionId) {
    out[0..2].copy_from_slice(&kind.to_be_bytes());
    out[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    out[4..8].copy_from_slice(&MAGIC_COOKIE.to_be_bytes());
    out[8..20].copy_from_slice(txid);
}

/// The address as the family it really is (an IPv4 address seen by a dual-stack socket
/// as `::ffff:a.b.c.d` is IPv4).
fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), addr.port()),
            None => addr,
        },
        IpAddr::V4(_) => addr,
    }
}

/// Length of the Binding success response [`write_binding_success`] writes for `mapped`:
/// 32 bytes for IPv4, 44 for IPv6.
pub fn success_len(mapped: SocketAddr) -> usize {
    match canonical(mapped) {
        SocketAddr::V4(_) => HEADER_LEN + 4 + 8,
        SocketAddr::V6(_) => HEADER_LEN + 4 + 20,
    }
}

/// Writes a Binding success response to transaction `txid` carrying `mapped` as
/// XOR-MAPPED-ADDRESS into `buf` and returns its length ([`success_len`]).
pub fn write_binding_success(
    txid: &TransactionId,
    mapped: SocketAddr,
    buf: &mut [u8],
) -> Result<usize, StunError> {
    let mapped = canonical(mapped);
    let n = success_len(mapped);
    let out = buf.get_mut(..n).ok_or(StunError::BufferTooSmall)?;
    write_header(out, BINDING_SUCCESS, n - HEADER_LEN, txid);
    out[20..22].copy_from_slice(&XOR_MAPPED_ADDRESS.to_be_bytes());
    out[22..24].copy_from_slice(&((n - HEADER_LEN - 4) as u16).to_be_bytes());
    out[24] = 0;
    let cookie = MAGIC_COOKIE.to_be_bytes();
    let port = mapped.port() ^ (MAGIC_COOKIE >> 16) as u16;
    out[26..28].copy_from_slice(&port.to_be_bytes());
    match mapped.ip() {
        IpAddr::V4(v4) => {
            out[25] = 0x01;
            for (i, o) in v4.octets().iter().enumerate() {
                out[28 + i] = o ^ cookie[i];
            }
        }
        IpAddr::V6(v6) => {
            out[25] = 0x02;
            let key = xor_key(txid);
            for (i, o) in v6.octets().iter().enumerate() {
                out[28 + i] = o ^ key[i];
            }
        }
    }
    Ok(n)
}

/// The magic cookie followed by the transaction id: what an IPv6 address is XORed with.
fn xor_key(txid: &TransactionId) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..4].copy_from_slice(&MAGIC_COOKIE.to_be_bytes());
    key[4..].copy_from_slice(txid);
    key
}

/// Reads a (XOR-)MAPPED-ADDRESS value.
fn read_address(value: &[u8], xor: bool, txid: &TransactionId, kind: u16) -> Result<SocketAddr, StunError> {
    let bad = StunError::BadAttribute(kind);
    let (Some(&family), Some(port)) = (value.get(1), be16(value, 2)) else {
        return Err(bad);
    };
    let key = xor_key(txid);
    let port = if xor {
        port ^ (MAGIC_COOKIE >> 16) as u16
    } else {
        port
    };
    let ip = match (family, value.len()) {
        (0x01, 8) => {
            let mut o = [0u8; 4];
            for (i, b) in o.iter_mut().enumerate() {
                *b = value[4 + i] ^ if xor { key[i] } else { 0 };
            }
            IpAddr::V4(Ipv4Addr::from(o))
        }
        (0x02, 20) => {
            let mut o = [0u8; 16];
            for (i, b) in o.iter_mut().enumerate() {
                *b = value[4 + i] ^ if xor { key[i] } else { 0 };
            }
            IpAddr::V6(Ipv6Addr::from(o))
        }
        _ => return Err(bad),
    };
    Ok(SocketAddr::new(ip, port))
}

/// The transaction id of a Binding success response, without checking the rest: lets a
/// client with several questions out find which one `b` answers.
pub fn success_transaction(b: &[u8]) -> Option<TransactionId> {
    match header(b) {
        Ok((BINDING_SUCCESS, txid, _)) => Some(txid),
        _ => None,
    }
}

/// The mapped address in a Binding success response to `txid`: XOR-MAPPED-ADDRESS, or
/// MAPPED-ADDRESS from a server that sends only that.
pub fn parse_binding_success(b: &[u8], txid: &TransactionId) -> Result<SocketAddr, StunError> {
    let (kind, got, attrs) = header(b)?;
    if kind != BINDING_SUCCESS {
        return Err(StunError::UnexpectedType(kind));
    }
    if &got != txid {
        return Err(StunError::WrongTransaction);
    }
    let mut plain = None;
    for a in attributes(attrs) {
        let (kind, value) = a?;
        match kind {
            XOR_MAPPED_ADDRESS => return read_address(value, true, txid, kind),
            MAPPED_ADDRESS if plain.is_none() => plain = Some(read_address(value, false, txid, kind)?),
            _ => {}
        }
    }
    plain.ok_or(StunError::NoMappedAddress)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TXID: TransactionId = [
        0xB7, 0xE7, 0xA7, 0x01, 0xBC, 0x34, 0xD6, 0x86, 0xFA, 0x87, 0xDF, 0xAE,
    ];

    /// RFC 5769 §2.2's IPv4 response, its XOR-MAPPED-ADDRESS as the RFC writes it
    /// (192.0.2.1:32853 XORed), without the integrity attributes we do not check.
    #[test]
    fn reads_the_rfc_5769_ipv4_mapped_address() {
        let mut b = vec![0x01, 0x01, 0x00, 0x0c, 0x21, 0x12, 0xa4, 0x42];
        b.extend_from_slice(&TXID);
        b.extend_from_slice(&[
            0x00, 0x20, 0x00, 0x08, 0x00, 0x01, 0xa1, 0x47, 0xe1, 0x12, 0xa6, 0x43,
        ]);
        let want: SocketAddr = "192.0.2.1:32853".parse().unwrap();
        assert_eq!(parse_binding_success(&b, &TXID), Ok(want));
        let mut ours = [0u8; 64];
        let n = write_binding_success(&TXID, want, &mut ours).unwrap();
        assert_eq!(&ours[..n], &b[..], "we write what the RFC shows");
    }

    /// RFC 5769 §2.3's IPv6 mapped address.
    #[test]
    fn reads_the_rfc_5769_ipv6_mapped_address() {
        let mut b = vec![0x01, 0x01, 0x00, 0x18, 0x21, 0x12, 0xa4, 0x42];
        b.extend_from_slice(&TXID);
        b.extend_from_slice(&[
            0x00, 0x20, 0x00, 0x14, 0x00, 0x02, 0xa1, 0x47, 0x01, 0x13, 0xa9, 0xfa, 0xa5, 0xd3, 0xf1, 0x79,
            0xbc, 0x25, 0xf4, 0xb5, 0xbe, 0xd2, 0xb9, 0xd9,
        ]);
        let want: SocketAddr = "[2001:db8:1234:5678:11:2233:4455:6677]:32853".parse().unwrap();
        assert_eq!(parse_binding_success(&b, &TXID), Ok(want));
        let mut ours = [0u8; 64];
        let n = write_binding_success(&TXID, want, &mut ours).unwrap();
        assert_eq!(&ours[..n], &b[..]);
        assert_eq!(n, MAX_SUCCESS_LEN);
    }

    #[test]
    fn a_request_round_trips_and_an_ipv4_mapped_v6_source_answers_as_ipv4() {
        let mut req = [0u8; REQUEST_LEN];
        assert_eq!(write_binding_request(&TXID, &mut req), Ok(REQUEST_LEN));
        assert!(is_stun(&req));
        assert_eq!(parse_binding_request(&req), Ok(TXID));
        let seen: SocketAddr = "[::ffff:10.99.0.11]:40001".parse().unwrap();
        let mut resp = [0u8; 64];
        let n = write_binding_success(&TXID, seen, &mut resp).unwrap();
        assert_eq!(n, 32);
        assert!(n <= REQUEST_LEN + 12);
        assert_eq!(
            parse_binding_success(&resp[..n], &TXID),
            Ok("10.99.0.11:40001".parse().unwrap())
        );
        assert_eq!(success_transaction(&resp[..n]), Some(TXID));
        let other = [9u8; 12];
        assert_eq!(
            parse_binding_success(&resp[..n], &other),
            Err(StunError::WrongTransaction)
        );
    }

    #[test]
    fn refuses_what_it_cannot_answer() {
        let mut req = [0u8; REQUEST_LEN];
        write_binding_request(&TXID, &mut req).unwrap();
        // A comprehension-required attribute (CHANGE-REQUEST, RFC 5780).
        let mut change = req;
        change[20..22].copy_from_slice(&0x0003u16.to_be_bytes());
        assert_eq!(parse_binding_request(&change), Err(StunError::UnknownRequired(3)));
        // Length field not matching, no cookie, top bits set, too short.
        let mut long = req.to_vec();
        long.extend_from_slice(&[0; 4]);
        assert_eq!(parse_binding_request(&long), Err(StunError::NotStun));
        let mut nocookie = req;
        nocookie[4] ^= 1;
        assert!(!is_stun(&nocookie));
        let mut rtp = req;
        rtp[0] = 0x80;
        assert!(!is_stun(&rtp));
        assert!(!is_stun(&req[..19]));
        // An attribute running past the end.
        let mut past = req;
        past[22..24].copy_from_slice(&40u16.to_be_bytes());
        assert_eq!(
            parse_binding_request(&past),
            Err(StunError::BadAttribute(SOFTWARE))
        );
        // A success response is not a request, and a buffer too small is said.
        let mut resp = [0u8; 64];
        let n = write_binding_success(&TXID, "1.2.3.4:5".parse().unwrap(), &mut resp).unwrap();
        assert_eq!(
            parse_binding_request(&resp[..n]),
            Err(StunError::UnexpectedType(BINDING_SUCCESS))
        );
        assert_eq!(
            write_binding_success(&TXID, "1.2.3.4:5".parse().unwrap(), &mut [0u8; 31]),
            Err(StunError::BufferTooSmall)
        );
    }

    #[test]
    fn no_input_panics() {
        // Every prefix and every single-byte corruption of valid messages.
        let mut req = [0u8; REQUEST_LEN];
        write_binding_request(&TXID, &mut req).unwrap();
        let mut resp = [0u8; 64];
        let n = write_binding_success(&TXID, "[2001:db8::1]:9".parse().unwrap(), &mut resp).unwrap();
        for msg in [&req[..], &resp[..n]] {
            for cut in 0..=msg.len() {
                let _ = parse_binding_request(&msg[..cut]);
                let _ = parse_binding_success(&msg[..cut], &TXID);
            }
            for at in 0..msg.len() {
                for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                    let mut m = msg.to_vec();
                    m[at] = v;
                    let _ = parse_binding_request(&m);
                    let _ = parse_binding_success(&m, &TXID);
                    let _ = success_transaction(&m);
                }
            }
        }
    }
}
