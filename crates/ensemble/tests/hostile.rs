//! Hostile datagrams against one member, in virtual time: garbage, every truncation and
//! random corruptions of every message, a flood of members beyond the table's cap, service lists with too
//! many or too long names, reliable messages from members the table refused. The member
//! never panics, the caps hold, each refusal is counted, and once the flood stops the
//! member serves a real member again (the forged ones time out).
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;

use common::{MS, S};
use netjam_ensemble::table::{MAX_MEMBERS, MAX_SERVICES, MAX_SERVICE_LEN};
use netjam_ensemble::wire::{encode_vec, Data, ServiceList, Wire, HELLO_SYNCED, MSG_RELIABLE};
use netjam_ensemble::{Dest, Event, Member, MemberConfig};
use netjam_osc::Arg;

/// A small seeded generator, so a failure repeats.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn forged(i: u64) -> SocketAddr {
    SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 14640))
}

fn drain(m: &mut Member) -> Vec<Event> {
    while m.poll_transmit().is_some() {}
    std::iter::from_fn(|| m.poll_event()).collect()
}

fn hello(id: u64, version: u32) -> Vec<u8> {
    Wire::Hello {
        ensemble: "band",
        id,
        version,
        flags: HELLO_SYNCED,
    }
    .encode()
    .unwrap()
}

fn services(id: u64, version: u32, services: Vec<String>) -> Vec<u8> {
    Wire::Services {
        id,
        version,
        list: ServiceList {
            services,
            taps: Vec::new(),
        },
    }
    .encode()
    .unwrap()
}

#[test]
fn garbage_and_truncations_are_counted_and_never_panic() {
    let mut m = Member::new(MemberConfig::new("band", 100), 0);
    m.offer("synth").unwrap();
    m.handle_timeout(0);
    drain(&mut m);
    let from: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let payload = encode_vec("/synth/x", &[Arg::Int(1)]).unwrap();
    let valid = [
        hello(7, 1),
        services(7, 1, vec!["a".into(), "b".into()]),
        Wire::Data(Data {
            from: 7,
            to: 100,
            seq: 1,
            base: 1,
            flags: MSG_RELIABLE,
            time_ns: 5,
            payload: &payload,
        })
        .encode()
        .unwrap(),
        Wire::Ack {
            from: 7,
            to: 100,
            next: 3,
            got: 2,
        }
        .encode()
        .unwrap(),
    ];
    let mut n = 0u64;
    for v in &valid {
        for cut in 0..v.len() {
            m.handle(MS, from, &v[..cut]);
            n += 1;
        }
    }
    // Random bytes, some behind an ensemble address so they reach the decoders.
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    let prefixes: [&[u8]; 6] = [
        b"",
        b"/_ens/svc\0\0\0",
        b"/_ens/msg\0\0\0",
        b"/_ens/hello\0",
        b"#bundle\0",
        b"/_ens/",
    ];
    for k in 0..20_000u64 {
        let mut b = prefixes[(k % 6) as usize].to_vec();
        let len = (rng.next() % 600) as usize;
        b.extend((0..len).map(|_| rng.next() as u8));
        m.handle(2 * MS, from, &b);
        n += 1;
    }
    // Valid messages with a few bytes changed: some decode, with values nobody sent.
    for v in &valid {
        for _ in 0..2_000 {
            let mut b = v.clone();
            for _ in 0..1 + rng.next() % 3 {
                let at = (rng.next() % b.len() as u64) as usize;
                b[at] = rng.next() as u8;
            }
            m.handle(3 * MS, from, &b);
            n += 1;
        }
    }
    drain(&mut m);
    let st = m.stats();
    println!("{n} hostile datagrams: {st:?}");
    assert!(st.rejected > 15_000, "{st:?}");
    assert!(m.table().len() <= MAX_MEMBERS);
    // Still offering its service.
    assert_eq!(m.table().provider("synth"), Some(100));
}

#[test]
fn a_flood_of_members_and_oversized_lists_cannot_break_the_caps() {
    let me: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let real: SocketAddr = "127.0.0.1:2".parse().unwrap();
    let mut a = Member::new(MemberConfig::new("band", 100), 0);
    a.offer("synth").unwrap();
    a.handle_timeout(0);
    drain(&mut a);

    // 200 forged members say hello: the table stops at its cap.
    let flood = 200u64;
    for i in 0..flood {
        a.handle(10 * MS, forged(i), &hello(1_000 + i, 1));
    }
    drain(&mut a);
    assert_eq!(a.table().len(), MAX_MEMBERS);
    let st = a.stats();
    assert_eq!(st.refused_members, flood - (MAX_MEMBERS as u64 - 1), "{st:?}");

    // An admitted one announces too many services, then names far too long: refused,
    // it offers nothing.
    let many: Vec<String> = (0..MAX_SERVICES * 4).map(|i| format!("s{i}")).collect();
    a.handle(20 * MS, forged(0), &services(1_000, 1, many));
    a.handle(20 * MS, forged(1), &services(1_001, 1, vec!["x".repeat(10_000)]));
    let just_over: Vec<String> = (0..=MAX_SERVICES).map(|i| format!("t{i}")).collect();
    a.handle(20 * MS, forged(2), &services(1_002, 1, just_over));
    a.handle(
        20 * MS,
        forged(3),
        &services(1_003, 1, vec!["y".repeat(MAX_SERVICE_LEN + 1)]),
    );
    drain(&mut a);
    let st = a.stats();
    assert_eq!(st.refused_lists, 4, "{st:?}");
    let rows = a.table().services();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].service, "synth");

    // A refused member's reliable messages open no stream and deliver nothing.
    let payload = encode_vec("/synth/x", &[Arg::Int(1)]).unwrap();
    for seq in 1..=50u32 {
        let d = Wire::Data(Data {
            from: 5_000 + seq as u64,
            to: 100,
            seq,
            base: 1,
            flags: MSG_RELIABLE,
            time_ns: 0,
            payload: &payload,
        })
        .encode()
        .unwrap();
        a.handle(30 * MS, forged(300 + seq as u64), &d);
    }
    let events = drain(&mut a);
    assert!(
        !events.iter().any(|e| matches!(e, Event::Message(_))),
        "{events:?}"
    );
    assert_eq!(a.stats().refused_unknown, 50);

    // The flood stops; the forged members time out; a real member joins and its
    // message reaches the synth.
    let mut b = Member::new(MemberConfig::new("band", 50), 0);
    let mut now = 30 * MS;
    let mut delivered = false;
    let mut sent = false;
    while now < 10 * S && !delivered {
        now += 10 * MS;
        for m in [&mut a, &mut b] {
            if m.poll_timeout() <= now {
                m.handle_timeout(now);
            }
        }
        // Carry datagrams both ways (discovery reaches the other member).
        let to_b: Vec<Vec<u8>> = std::iter::from_fn(|| a.poll_transmit())
            .filter(|t| t.to == Dest::Discovery || t.to == Dest::Peer(real))
            .map(|t| t.bytes)
            .collect();
        let to_a: Vec<Vec<u8>> = std::iter::from_fn(|| b.poll_transmit())
            .filter(|t| t.to == Dest::Discovery || t.to == Dest::Peer(me))
            .map(|t| t.bytes)
            .collect();
        for p in to_b {
            b.handle(now, me, &p);
        }
        for p in to_a {
            a.handle(now, real, &p);
        }
        while b.poll_event().is_some() {}
        if !sent && b.table().provider("synth") == Some(100) {
            sent = b.send_args(now, "/synth/gate", &[Arg::Int(1)], 0, true).is_ok();
        }
        while let Some(e) = a.poll_event() {
            if let Event::Message(d) = e {
                assert_eq!(d.service, "synth");
                delivered = true;
            }
        }
    }
    assert!(
        delivered,
        "the real member's message never arrived; {:?}",
        a.stats()
    );
    assert!(
        a.table().len() <= 2,
        "forged members still held: {}",
        a.table().len()
    );
}
