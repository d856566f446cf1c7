//! The shared secret in virtual time: members holding the same secret find each other
//! and route messages; a member without it, and one with another secret, are ignored by
//! them (and counted), and do not see them either.
#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;

use common::{MS, S};
use netjam_ensemble::auth::Secret;
use netjam_ensemble::{Dest, Event, Member, MemberConfig};
use netjam_osc::Arg;

fn member(id: u64, service: &str, secret: Option<&[u8]>) -> Member {
    let mut c = MemberConfig::new("band", id);
    c.secret = secret.map(|s| Secret::new(s).unwrap());
    let mut m = Member::new(c, 0);
    m.offer(service).unwrap();
    m
}

fn addr(k: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 14640 + k as u16))
}

#[test]
fn only_members_with_the_same_secret_meet() {
    let mut ms = [
        member(10, "a", Some(b"green room")),
        member(20, "b", Some(b"green room")),
        member(30, "c", None),
        member(40, "d", Some(b"other room")),
    ];
    let mut got = Vec::new();
    let mut sent = false;
    let mut now = 0;
    while now < 4 * S {
        now += 5 * MS;
        let mut wire: Vec<(usize, usize, Vec<u8>)> = Vec::new();
        for (k, m) in ms.iter_mut().enumerate() {
            if m.poll_timeout() <= now {
                m.handle_timeout(now);
            }
            while let Some(t) = m.poll_transmit() {
                for j in 0..4 {
                    if j != k && (t.to == Dest::Discovery || t.to == Dest::Peer(addr(j))) {
                        wire.push((k, j, t.bytes.clone()));
                    }
                }
            }
        }
        for (from, to, b) in wire {
            ms[to].handle(now, addr(from), &b);
        }
        if !sent && now > 2 * S {
            sent = ms[0].send_args(now, "/b/gate", &[Arg::Int(1)], 0, true).is_ok();
        }
        for m in ms.iter_mut() {
            while let Some(e) = m.poll_event() {
                if let Event::Message(d) = e {
                    got.push((m.id(), d.service));
                }
            }
        }
    }
    let ids = |m: &Member| {
        let mut v: Vec<u64> = m.table().members().map(|x| x.id).collect();
        v.sort();
        v
    };
    assert_eq!(ids(&ms[0]), vec![10, 20]);
    assert_eq!(ids(&ms[1]), vec![10, 20]);
    assert_eq!(ids(&ms[2]), vec![30]);
    assert_eq!(ids(&ms[3]), vec![40]);
    assert!(sent, "a could not send to b");
    assert_eq!(got, vec![(20, "b".to_string())]);
    // The sealed members counted what they refused; the bare one could not read theirs.
    for k in [0, 1, 3] {
        assert!(ms[k].stats().unauthenticated > 0, "{:?}", ms[k].stats());
    }
    assert_eq!(ms[2].stats().unauthenticated, 0);
    assert!(ms[2].stats().rejected > 0, "{:?}", ms[2].stats());
    assert!(ms[2].table().provider("a").is_none());
}

#[test]
fn a_best_effort_message_sent_again_by_someone_on_the_path_is_taken_once() {
    let mut ms = [
        member(10, "a", Some(b"green room")),
        member(20, "b", Some(b"green room")),
    ];
    let mut got = 0;
    let mut captured: Vec<Vec<u8>> = Vec::new();
    let mut sent = false;
    let mut now = 0;
    while now < 4 * S {
        now += 5 * MS;
        let mut wire: Vec<(usize, usize, Vec<u8>)> = Vec::new();
        for (k, m) in ms.iter_mut().enumerate() {
            if m.poll_timeout() <= now {
                m.handle_timeout(now);
            }
            while let Some(t) = m.poll_transmit() {
                let j = 1 - k;
                if t.to == Dest::Discovery || t.to == Dest::Peer(addr(j)) {
                    if k == 0 && t.bytes.windows(7).any(|w| w == b"/b/gate") {
                        captured.push(t.bytes.clone());
                    }
                    wire.push((k, j, t.bytes));
                }
            }
        }
        // What the path captured comes again, twice, a little later.
        if now > 3 * S {
            for b in captured.drain(..) {
                wire.push((0, 1, b.clone()));
                wire.push((0, 1, b));
            }
        }
        for (from, to, b) in wire {
            ms[to].handle(now, addr(from), &b);
        }
        if !sent && now > 2 * S {
            // Best effort: nothing below drops a duplicate but the seal's counter.
            sent = ms[0].send_args(now, "/b/gate", &[Arg::Int(1)], 0, false).is_ok();
        }
        while let Some(e) = ms[1].poll_event() {
            if matches!(e, Event::Message(_)) {
                got += 1;
            }
        }
    }
    assert!(sent);
    assert_eq!(got, 1, "{:?}", ms[1].stats());
    assert!(ms[1].stats().replayed >= 2, "{:?}", ms[1].stats());
    assert_eq!(ms[1].stats().unauthenticated, 0);
}
