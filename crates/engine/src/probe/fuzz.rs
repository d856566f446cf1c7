//! Fuzzing entry point for the probe format, the reflector and the probe statistics.
//!
//! [`probe_any`] cuts one input into datagrams and feeds them, from a handful of source
//! addresses and at advancing times, to a reflector without and with a shared secret, to
//! every probe parser, and (for parsed replies) to [`ProbeStats`]. It asserts the
//! reflector's promises: it never panics, and a reply is never longer than its request.
//! The unit tests run it over random and mutated valid packets, so the normal test suite
//! exercises the same paths a fuzzer would; a `probe_reflect` target in the `fuzz/` crate
//! can call it directly.

use std::net::SocketAddr;

use super::packet::{self, ProbeKey, ProbeRequest};
use super::reflector::{Action, Reflector, ReflectorConfig};
use super::stats::ProbeStats;

/// Feed `data` to every probe code path. Never panics unless there is a bug.
pub fn probe_any(data: &[u8]) {
    let key = ProbeKey::new(b"fuzz");
    let config = ReflectorConfig {
        rate_limit_pps: 50,
        max_sessions: 4,
        max_rtp_sources: 4,
        token_epoch_ns: 1_000_000,
        ..ReflectorConfig::default()
    };
    let mut open = Reflector::new(config.clone(), [1; 32], None);
    let mut closed = Reflector::new(config, [2; 32], Some(key.clone()));
    let mut stats = ProbeStats::new(16);
    let mut now = 0u64;
    let mut rest = data;
    let mut buf = [0u8; 512];
    // Framing: one byte of length, one byte of source and time step, then the datagram.
    while rest.len() >= 2 {
        let len = (rest[0] as usize).min(rest.len() - 2);
        let meta = rest[1];
        let dgram = &rest[2..2 + len];
        rest = &rest[2 + len..];
        now = now.saturating_add((meta as u64 >> 2) * 100_000);
        let from = SocketAddr::from(([10, 0, 0, meta & 3], 4000));
        for r in [&mut open, &mut closed] {
            buf[..len].copy_from_slice(dgram);
            if let Action::Reply { len: out } = r.handle(now, now, meta & 4 != 0, from, &mut buf, len) {
                assert!(out <= len, "reply of {out} bytes to a request of {len}");
            }
        }
        let _ = packet::classify(dgram);
        let _ = packet::parse_header(dgram);
        let _ = packet::parse_probe(dgram, Some(&key));
        let _ = packet::parse_hello_reply(dgram, None);
        for k in [None, Some(&key)] {
            if let Ok(reply) = packet::parse_probe_reply(dgram, u32::from_be_bytes([0, 0, 0, meta]), k) {
                stats.on_sent(reply.seq, reply.t1_ns);
                stats.on_reply(now, &reply, false);
            }
        }
    }
    let _ = stats.summary(None);
    let _ = stats.live();
}

/// Valid packets of every kind, framed for [`probe_any`], as a starting corpus.
pub fn seed_inputs() -> Vec<Vec<u8>> {
    let key = ProbeKey::new(b"fuzz");
    let mut out = Vec::new();
    for k in [None, Some(&key)] {
        let mut hello = [0u8; packet::HELLO_LEN];
        if let Ok(n) = packet::write_hello(&mut hello, 7, k) {
            let mut v = vec![n as u8, 0];
            v.extend_from_slice(&hello[..n]);
            let mut probe = [0u8; 80];
            let req = ProbeRequest {
                session: 7,
                seq: 1,
                t1_ns: 5,
                token: [0; 8],
            };
            if let Ok(m) = packet::write_probe(&mut probe, 80, &req, k) {
                v.extend_from_slice(&[m as u8, 4]);
                v.extend_from_slice(&probe[..m]);
            }
            out.push(v);
        }
    }
    out.push(vec![14, 1, 0x80, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9, 1, 2]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SimRng;

    #[test]
    fn random_and_mutated_inputs() {
        let mut rng = SimRng::new(2024);
        let seeds = seed_inputs();
        for i in 0..3000 {
            let mut input = seeds[i % seeds.len()].clone();
            for _ in 0..(rng.next_u64() % 8) {
                if input.is_empty() {
                    break;
                }
                let at = (rng.next_u64() as usize) % input.len();
                input[at] = rng.next_u64() as u8;
            }
            if rng.chance(0.3) {
                let extra = (rng.next_u64() % 300) as usize;
                input.extend((0..extra).map(|_| rng.next_u64() as u8));
            }
            probe_any(&input);
        }
    }
}
