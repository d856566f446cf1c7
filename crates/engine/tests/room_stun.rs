//! STUN Binding on the rooms server's port: a request is answered with the address it
//! came from, members or not; the answer is never more than 12 bytes longer than its
//! request and comes out of the global budget for unproven addresses, so forged-source
//! requests cannot turn the server into an amplifier; every other STUN message is counted
//! and dropped. A panic here is a bug in netjam, never bad input.

use std::net::SocketAddr;

use netjam_engine::nat::stun::{
    self, parse_binding_success, write_binding_request, TransactionId, REQUEST_LEN,
};
use netjam_engine::room::msg::MAX_CONTROL_LEN;
use netjam_engine::room::server::STUN_GROWTH;
use netjam_engine::room::{demux, Demux, DropReason, Server, ServerConfig, Verdict};
use proptest::prelude::*;

const MS: u64 = 1_000_000;

fn txid(i: u32) -> TransactionId {
    let mut t = [7u8; 12];
    t[..4].copy_from_slice(&i.to_be_bytes());
    t
}

fn request(i: u32) -> Vec<u8> {
    let mut b = vec![0u8; REQUEST_LEN];
    write_binding_request(&txid(i), &mut b).expect("request");
    b
}

/// A bare 20-byte Binding request with no attribute, as many STUN clients send.
fn bare_request(i: u32) -> Vec<u8> {
    let mut b = vec![0x00, 0x01, 0x00, 0x00, 0x21, 0x12, 0xa4, 0x42];
    b.extend_from_slice(&txid(i));
    b
}

fn answers(s: &mut Server) -> Vec<(SocketAddr, Vec<u8>)> {
    let mut buf = [0u8; MAX_CONTROL_LEN];
    let mut out = Vec::new();
    while let Some((dst, n)) = s.poll_transmit(&mut buf) {
        out.push((dst, buf[..n].to_vec()));
    }
    out
}

#[test]
fn a_binding_request_is_answered_with_the_address_it_came_from() {
    let mut s = Server::new(ServerConfig::default(), [1; 32]);
    for (i, src) in [
        "198.51.100.7:40123",
        "[2001:db8::5]:6000",
        "[::ffff:203.0.113.9]:9",
    ]
    .iter()
    .enumerate()
    {
        let src: SocketAddr = src.parse().expect("addr");
        let req = request(i as u32);
        assert_eq!(demux(&req), Demux::Stun);
        assert_eq!(s.handle_datagram(i as u64 * MS, src, &req), Verdict::Control);
        let out = answers(&mut s);
        assert_eq!(out.len(), 1, "one answer to {src}");
        let (dst, bytes) = &out[0];
        assert_eq!(dst, &src);
        assert!(bytes.len() <= req.len() + STUN_GROWTH, "{} bytes", bytes.len());
        let mapped = parse_binding_success(bytes, &txid(i as u32)).expect("a success response");
        let want = match src.ip() {
            std::net::IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map_or(src, |v4| SocketAddr::new(v4.into(), src.port())),
            _ => src,
        };
        assert_eq!(mapped, want);
    }
    assert_eq!(s.stats().stun_answered, 3);
}

#[test]
fn an_answer_longer_than_its_request_plus_12_bytes_is_not_sent() {
    let mut s = Server::new(ServerConfig::default(), [1; 32]);
    // IPv4 answer to a bare request: 32 bytes for 20, allowed.
    s.handle_datagram(0, "192.0.2.1:1000".parse().expect("addr"), &bare_request(1));
    assert_eq!(answers(&mut s).len(), 1);
    // IPv6 answer (44 bytes) to a bare 20-byte request: withheld.
    s.handle_datagram(MS, "[2001:db8::1]:1000".parse().expect("addr"), &bare_request(2));
    assert!(answers(&mut s).is_empty());
    let st = s.stats();
    assert_eq!((st.stun_answered, st.stun_suppressed), (1, 1), "{st:?}");
}

#[test]
fn a_flood_of_requests_gets_no_more_answers_than_the_unproven_budget() {
    let cfg = ServerConfig::default();
    let budget = u64::from(cfg.unproven_replies_per_s);
    let mut s = Server::new(cfg, [1; 32]);
    let victim: SocketAddr = "192.0.2.99:53".parse().expect("addr");
    let (mut sent_bytes, mut answered_bytes) = (0usize, 0usize);
    // 5000 requests in one second from a forged source.
    for i in 0..5000u32 {
        let req = bare_request(i);
        sent_bytes += req.len();
        s.handle_datagram(u64::from(i) * 200_000, victim, &req);
        answered_bytes += answers(&mut s).iter().map(|a| a.1.len()).sum::<usize>();
    }
    let st = s.stats();
    assert!(
        st.stun_answered <= 2 * budget,
        "{} answers in one second: the budget is {budget}/s with a burst of as many",
        st.stun_answered
    );
    assert!(st.stun_answered >= budget / 2, "the budget answers some: {st:?}");
    assert_eq!(st.stun_answered + st.stun_suppressed, 5000);
    assert!(
        answered_bytes < sent_bytes / 5,
        "{answered_bytes} bytes out for {sent_bytes} in"
    );
}

#[test]
fn other_stun_messages_are_counted_and_dropped() {
    let mut s = Server::new(ServerConfig::default(), [1; 32]);
    let src: SocketAddr = "192.0.2.1:1000".parse().expect("addr");
    // A success response (someone reflecting one at us), an indication, a request with a
    // comprehension-required attribute (RFC 5780 CHANGE-REQUEST).
    let mut resp = [0u8; 64];
    let n = stun::write_binding_success(&txid(1), src, &mut resp).expect("resp");
    let mut indication = bare_request(2);
    indication[1] = 0x11;
    let mut change = bare_request(3);
    change[3] = 8;
    change.extend_from_slice(&[0x00, 0x03, 0x00, 0x04, 0, 0, 0, 4]);
    for m in [&resp[..n], &indication, &change] {
        assert_eq!(s.handle_datagram(0, src, m), Verdict::Drop(DropReason::Stun));
    }
    // Zero and one first bytes without the cookie are junk, as before.
    assert_eq!(
        s.handle_datagram(0, src, &[0u8; 40]),
        Verdict::Drop(DropReason::Junk)
    );
    assert!(answers(&mut s).is_empty());
    let st = s.stats();
    assert_eq!((st.stun_dropped, st.junk, st.stun_answered), (3, 1, 0), "{st:?}");
}

proptest! {
    /// Any bytes after a STUN header: no panic, and no answer longer than allowed.
    #[test]
    fn any_stun_shaped_datagram_is_safe(tail in proptest::collection::vec(any::<u8>(), 0..80), len in 0u16..100, first in 0u8..2) {
        let mut b = vec![first, 0x01, 0, 0, 0x21, 0x12, 0xa4, 0x42];
        b[2..4].copy_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&txid(5));
        b.extend_from_slice(&tail);
        let mut s = Server::new(ServerConfig::default(), [1; 32]);
        let _ = s.handle_datagram(0, "192.0.2.1:1".parse().expect("addr"), &b);
        for (_, a) in answers(&mut s) {
            prop_assert!(a.len() <= b.len() + STUN_GROWTH);
        }
    }
}
