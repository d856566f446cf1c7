//! Fuzzing entry point for the room protocol's control messages: [`control_any`] decodes
//! one input, checks that what decodes encodes back to bytes that decode the same, and
//! gives it to a server with a seated member of a password room (from that member and
//! from a stranger) and to a seated client with a password change under way. The
//! `room_control` target of the `fuzz/` crate calls it, and the unit test below runs it over
//! random and mutated messages of every kind so the normal test suite exercises the same
//! paths. [`channel_any`] does the same through the control channel (`room_channel`
//! target): the input as it came, as the ciphertext of a sealed message and as a
//! handshake message, to a keyed server and a client seated through it. Any panic reached
//! from here is a bug, never a fault of the input.

use std::net::SocketAddr;

use super::msg::{
    Control, Join, Rejoin, Rekey, Roster, RosterKind, Welcome, HELLO_PAD, MAX_CONTROL_LEN, MAX_ENS_LEN,
};
use super::secure::{StaticKey, HANDSHAKE, SEALED};
use super::{auth, ClientConfig, RoomClient, Server, ServerConfig, PROTOCOL_VERSION};
use netjam_osc::{encode_message, Arg};

const MS: u64 = 1_000_000;

fn member() -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 1], 5000))
}

fn stranger() -> SocketAddr {
    SocketAddr::from(([10, 0, 0, 66], 1))
}

/// A server and a client seated in it through the real protocol, the client asking to
/// change the password. The room key is fixed (no Argon2 run per input).
fn seated() -> (Server, RoomClient) {
    seated_with(false)
}

/// [`seated`], with the control channel on when `sealed`.
fn seated_with(sealed: bool) -> (Server, RoomClient) {
    let mut s = Server::new(ServerConfig::default(), [9; 32]);
    let mut cfg = ClientConfig::new("band", "Ana", "pw", 77);
    cfg.room_key = Some([7; 32]);
    if sealed {
        s.set_static_key(StaticKey::from_private([4; 32]));
        cfg.secure = true;
    }
    let mut c = RoomClient::new(cfg, 0);
    let mut buf = [0u8; MAX_ENS_LEN];
    for step in 0..10u64 {
        while let Some(n) = c.poll_transmit(&mut buf) {
            let _ = s.handle_datagram(step * MS, member(), &buf[..n]);
        }
        while let Some((_, n)) = s.poll_transmit(&mut buf) {
            c.handle_datagram(step * MS, &buf[..n]);
        }
    }
    assert!(c.seat().is_some(), "seated");
    c.rekey(10 * MS, [8; 32]);
    while c.poll_transmit(&mut buf).is_some() {}
    (s, c)
}

/// Decodes `data`, round-trips what decodes, and feeds it to a server and a client.
/// Never panics unless the code under test has a bug.
pub fn control_any(data: &[u8]) {
    // A hello's padding is written as zeros up to a limit, whatever it held: the one
    // message that does not read back as it came.
    if let Ok(m) = Control::decode(data).map_err(|_| ()).and_then(|m| match m {
        Control::Hello { .. } => Err(()),
        m => Ok(m),
    }) {
        let mut buf = [0u8; MAX_ENS_LEN + 64];
        if let Ok(n) = m.encode(&mut buf) {
            assert_eq!(Control::decode(&buf[..n]), Ok(m), "{m:?} reads back");
        }
    }
    let (mut s, mut c) = seated();
    let mut buf = [0u8; MAX_ENS_LEN];
    for (at, from) in [(20 * MS, member()), (21 * MS, stranger())] {
        let _ = s.handle_datagram(at, from, data);
        let mut to_stranger = 0;
        while let Some((dst, n)) = s.poll_transmit(&mut buf) {
            if dst == stranger() {
                to_stranger += n;
            }
        }
        assert!(
            to_stranger <= data.len().max(1) * 2 + 64,
            "a reply to a stranger out of proportion"
        );
        s.handle_timeout(at + MS);
    }
    c.handle_datagram(22 * MS, data);
    c.handle_timeout(23 * MS);
    while c.poll_transmit(&mut buf).is_some() {}
    while let Some(e) = c.poll_event() {
        // The key changes only through an answer authenticated with the request's keys,
        // which no input here can make without them.
        if let super::RoomEvent::Epoch { key, .. } = e {
            assert!(
                !auth::ct_eq(&key, &[8; 32]),
                "a password change taken from an unproven answer"
            );
        }
    }
}

/// Feeds `data` to a keyed server (from its member and from a stranger) and to a client
/// seated through the channel: as it came, as the ciphertext of a `/netjam/sealed` and as
/// the message of a `/netjam/hs`. Nothing may panic, a stranger gets no more than it sent
/// back (no handshake answer without its cookie), and nothing unauthenticated seats,
/// re-keys or changes the pinned key.
pub fn channel_any(data: &[u8]) {
    let (mut s, mut c) = seated_with(true);
    while c.poll_event().is_some() {}
    let pinned = c.server_key();
    assert!(pinned.is_some() && c.channel_open(), "seated through the channel");
    let nonce = data.first().map_or(0, |&b| i64::from(b));
    let mut sealed = [0u8; MAX_ENS_LEN + 128];
    let mut hs = [0u8; MAX_ENS_LEN + 128];
    let args = [Arg::Int(PROTOCOL_VERSION), Arg::Long(nonce), Arg::Blob(data)];
    let ns = encode_message(&mut sealed, SEALED, &args).unwrap_or(0);
    let hs_args = [Arg::Int(PROTOCOL_VERSION), Arg::Int(1), Arg::Blob(data)];
    let nh = encode_message(&mut hs, HANDSHAKE, &hs_args).unwrap_or(0);
    let members = s.stats().members;
    let mut buf = [0u8; MAX_ENS_LEN + 128];
    for input in [data, &sealed[..ns], &hs[..nh]] {
        for (at, from) in [(20 * MS, member()), (21 * MS, stranger())] {
            let _ = s.handle_datagram(at, from, input);
            let mut to_stranger = 0;
            while let Some((dst, n)) = s.poll_transmit(&mut buf) {
                if dst == stranger() {
                    to_stranger += n;
                }
            }
            assert!(
                to_stranger <= input.len(),
                "a reply to a stranger longer than its cause"
            );
            s.handle_timeout(at + MS);
        }
        c.handle_datagram(22 * MS, input);
        c.handle_timeout(23 * MS);
        while c.poll_transmit(&mut buf).is_some() {}
    }
    assert_eq!(s.stats().members, members, "seated by unauthenticated bytes");
    assert_eq!(c.server_key(), pinned, "the pinned key moved");
    while let Some(e) = c.poll_event() {
        assert!(
            !matches!(
                e,
                super::RoomEvent::Epoch { .. } | super::RoomEvent::ServerKey { .. }
            ),
            "{e:?} from unauthenticated bytes"
        );
    }
}

/// One well-formed message of every kind this protocol has, encoded: seeds to cut and
/// mutate (the unit test below, the hostile-input tests, a fuzzer's corpus).
pub fn seeds() -> Vec<Vec<u8>> {
    let (c, n, t) = ([1u8; 32], [2u8; 16], [3u8; 16]);
    let msgs = [
        Control::Hello { pad: HELLO_PAD },
        Control::Challenge {
            cookie: &c,
            server_nonce: &n,
        },
        Control::Join(Join {
            cookie: &c,
            room: "band",
            name: "Mallory",
            client_nonce: &n,
            authenticator: &c,
            ssrc: 77,
            packets_per_s: 750,
            bytes_per_s: 200_000,
            create_key: &c,
            key_agreement: &[],
            hosts: &[],
            sample_rate: 0,
        }),
        Control::Rejoin(Rejoin {
            cookie: &c,
            member_id: 1,
            token: &t,
            client_nonce: &n,
            authenticator: &c,
            key_agreement: &[],
            hosts: &[],
        }),
        Control::Welcome(Welcome {
            member_id: 1,
            ssrc: 5,
            token: &t,
            keepalive_ms: 0,
            timeout_ms: u32::MAX,
            key_agreement: &[1, 2, 3],
        }),
        Control::Refused { code: 99, text: "x" },
        Control::Roster(Roster {
            seq: u32::MAX,
            kind: RosterKind::Joined,
            member_id: 0,
            name: "",
            ssrc: 0,
        }),
        Control::Ack { seq: u32::MAX },
        Control::Rename { name: "\u{7}bell" },
        Control::Rekey(Rekey {
            epoch: 1,
            nonce: &n,
            wrapped: &c,
            mac: &c,
        }),
        Control::Rekeyed {
            epoch: 1,
            status: 0,
            mac: &t,
        },
        Control::Rekeyed {
            epoch: 7,
            status: 3,
            mac: &[],
        },
        Control::Epoch {
            seq: 1,
            epoch: 2,
            by: 3,
        },
        Control::Keepalive,
        Control::Leave,
        Control::Rebind,
    ];
    msgs.iter()
        .map(|m| {
            let mut b = vec![0u8; MAX_CONTROL_LEN];
            let len = m.encode(&mut b).unwrap_or(0);
            b.truncate(len);
            b
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_and_mutated_control_messages_never_panic() {
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let seeds = seeds();
        for d in &seeds {
            control_any(d);
        }
        for i in 0..3_000u64 {
            let mut d = seeds[(i as usize) % seeds.len()].clone();
            match next() % 4 {
                0 => {
                    let len = (next() % 200) as usize;
                    d = (0..len).map(|_| next() as u8).collect();
                }
                1 => {
                    let at = (next() as usize) % d.len();
                    d[at] ^= 1 << (next() % 8);
                }
                2 => d.truncate((next() as usize) % (d.len() + 1)),
                _ => {
                    let at = (next() as usize) % d.len();
                    d[at] = next() as u8;
                }
            }
            control_any(&d);
        }
    }

    #[test]
    fn random_and_mutated_bytes_through_the_channel_never_panic() {
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let seeds = seeds();
        for i in 0..300u64 {
            let mut d = seeds[(i as usize) % seeds.len()].clone();
            if next() % 2 == 0 {
                let len = (next() % 120) as usize;
                d = (0..len).map(|_| next() as u8).collect();
            } else if !d.is_empty() {
                let at = (next() as usize) % d.len();
                d[at] ^= 1 << (next() % 8);
            }
            channel_any(&d);
        }
    }
}
