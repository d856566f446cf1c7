//! Hostile input at the room port: random bytes, truncated and mutated control messages,
//! RTP/RTCP of every shape. The server and the client count and drop; a panic here is a
//! bug in netjam, never bad input. Nothing from an address that never proved itself is
//! forwarded, and no reply to it is longer than what it sent.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use netjam_engine::room::msg::{Control, HELLO_PAD, MAX_CONTROL_LEN};
use netjam_engine::room::{ClientConfig, RoomClient, Server, ServerConfig, Verdict};
use proptest::prelude::*;

const MS: u64 = 1_000_000;

fn member_addr() -> SocketAddr {
    "10.0.0.1:5000".parse().expect("addr")
}

/// A server with one seated member (seated through the real protocol).
fn server_with_member() -> (Server, u32) {
    let mut s = Server::new(ServerConfig::default(), [9; 32]);
    let mut c = RoomClient::new(ClientConfig::new("band", "Ana", "", 77), 0);
    let mut buf = [0u8; MAX_CONTROL_LEN];
    for step in 0..10u64 {
        while let Some(n) = c.poll_transmit(&mut buf) {
            let _ = s.handle_datagram(step * MS, member_addr(), &buf[..n]);
        }
        while let Some((_, n)) = s.poll_transmit(&mut buf) {
            c.handle_datagram(step * MS, &buf[..n]);
        }
    }
    let (_, ssrc) = c.seat().expect("seated");
    (s, ssrc)
}

fn valid_messages() -> Vec<Vec<u8>> {
    netjam_engine::room::fuzz::seeds()
}

#[test]
fn truncated_and_bit_flipped_control_never_panics_nor_forwards() {
    let (mut s, _) = server_with_member();
    let mut c = RoomClient::new(ClientConfig::new("band", "Bo", "", 1), 0);
    let stranger: SocketAddr = "10.0.0.66:1".parse().expect("addr");
    let mut buf = [0u8; MAX_CONTROL_LEN];
    let mut from = 0usize;
    let mut to = 0usize;
    for m in valid_messages() {
        for cut in 0..=m.len() {
            for who in [member_addr(), stranger] {
                let v = s.handle_datagram(cut as u64, who, &m[..cut]);
                assert!(!matches!(v, Verdict::Forward(d) if !d.is_empty()));
                if who == stranger {
                    from += cut;
                }
            }
            c.handle_datagram(cut as u64, &m[..cut]);
        }
        for bit in 0..m.len() * 8 {
            let mut f = m.clone();
            f[bit / 8] ^= 1 << (bit % 8);
            let _ = s.handle_datagram(1, stranger, &f);
            from += f.len();
            c.handle_datagram(1, &f);
        }
        while let Some((dst, n)) = s.poll_transmit(&mut buf) {
            if dst == stranger {
                to += n;
            }
        }
        while c.poll_transmit(&mut buf).is_some() {}
        s.handle_timeout(2);
        c.handle_timeout(2);
    }
    assert!(to <= from, "{to} > {from}");
    // The member itself may have left (a valid leave); no stranger ever got a seat.
    assert!(s.member_stats().iter().all(|m| m.addr == member_addr()));
    assert!(s.stats().joins == 1);
}

#[test]
fn a_hello_of_another_protocol_version_is_refused_saying_so_within_its_size() {
    use netjam_engine::room::msg::PROTOCOL_VERSION;
    use netjam_engine::room::RefuseCode;
    use netjam_osc::{encode_message, Arg};
    let mut s = Server::new(ServerConfig::default(), [9; 32]);
    let stranger: SocketAddr = "10.0.0.9:5000".parse().expect("addr");
    let pad = [0u8; HELLO_PAD];
    let mut hello = [0u8; MAX_CONTROL_LEN];
    let mut buf = [0u8; MAX_CONTROL_LEN];
    // Version 1 (whose joins a version-2 server cannot read), and one not yet made.
    for v in [1, PROTOCOL_VERSION + 1] {
        let n = encode_message(&mut hello, "/netjam/hello", &[Arg::Int(v), Arg::Blob(&pad)]).expect("hello");
        assert!(matches!(
            s.handle_datagram(0, stranger, &hello[..n]),
            Verdict::Drop(_)
        ));
        let (to, m) = s.poll_transmit(&mut buf).expect("an answer");
        assert_eq!(to, stranger);
        assert!(m <= n, "a refusal of {m} bytes to a hello of {n}");
        match Control::decode(&buf[..m]) {
            Ok(Control::Refused { code, .. }) => assert_eq!(code, RefuseCode::BadVersion as i32),
            other => panic!("version {v}: {other:?}"),
        }
    }
}

fn drain(s: &mut Server, stranger: SocketAddr, to: &mut usize) {
    let mut buf = [0u8; MAX_CONTROL_LEN];
    while let Some((dst, n)) = s.poll_transmit(&mut buf) {
        if dst == stranger {
            *to += n;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_datagrams_are_counted_and_dropped(packets in proptest::collection::vec(
        proptest::collection::vec(any::<u8>(), 0..300), 1..40),
        first in proptest::sample::select(vec![0x80u8, 0x81, 0xBF, b'/', b'#', 0x00, 0xFF]),
    ) {
        let (mut s, ssrc) = server_with_member();
        let stranger: SocketAddr = "10.0.0.66:1".parse().expect("addr");
        let mut from = 0usize;
        let mut to = 0usize;
        let mut by_reason: BTreeMap<String, u32> = BTreeMap::new();
        for (k, mut p) in packets.into_iter().enumerate() {
            if let Some(b) = p.first_mut() {
                *b = first;
            }
            from += p.len();
            match s.handle_datagram(k as u64 * MS, stranger, &p) {
                Verdict::Forward(d) => prop_assert!(d.is_empty(), "forwarded from a stranger"),
                v => *by_reason.entry(format!("{v:?}")).or_default() += 1,
            }
            // The member sending garbage forwards only packets carrying its own SSRC.
            if let Verdict::Forward(_) = s.handle_datagram(k as u64 * MS, member_addr(), &p) {
                let is_rtcp = p.get(1).is_some_and(|t| (200..=207).contains(t));
                let at = if is_rtcp { 4 } else { 8 };
                prop_assert_eq!(p.get(at..at + 4), Some(&ssrc.to_be_bytes()[..]));
            }
            drain(&mut s, stranger, &mut to);
        }
        s.handle_timeout(u64::MAX / 2);
        prop_assert!(to <= from);
    }

    #[test]
    fn random_bytes_never_confuse_a_client(packets in proptest::collection::vec(
        proptest::collection::vec(any::<u8>(), 0..200), 1..40)) {
        let mut c = RoomClient::new(ClientConfig::new("band", "Bo", "", 1), 0);
        let mut buf = [0u8; MAX_CONTROL_LEN];
        for (k, p) in packets.iter().enumerate() {
            c.handle_datagram(k as u64, p);
            c.handle_timeout(k as u64 * 100 * MS);
            while c.poll_transmit(&mut buf).is_some() {}
            while c.poll_event().is_some() {}
        }
        prop_assert!(c.seat().is_none());
    }
}
