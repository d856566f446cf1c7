//! The Redis room directory against a real `redis-server` started by the test:
//!
//! * two servers racing to claim one room: exactly one wins, both are told the same holder,
//!   in every one of 100 races (two threads, released together);
//! * a lease not renewed expires and the room can be claimed elsewhere; one renewed lives on;
//! * only the holder of the current claim (its epoch) can renew or release it: a server
//!   whose lease ran out, or an earlier incarnation at the same address, cannot;
//! * Redis restarted empty: the next renewal takes the claims back;
//! * a Redis that does not answer is said at open, with what to do.

mod common;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use common::redis::RedisServer;
use netjam::room_directory::{OpenError, RedisDirectory};
use netjam_engine::room::RoomDirectory;

#[test]
fn of_two_servers_racing_for_a_room_exactly_one_wins_every_time() {
    let redis = RedisServer::start();
    const RACES: usize = 100;
    let barrier = Arc::new(Barrier::new(2));
    let racer = |me: &'static str| {
        let (url, barrier) = (redis.url(), barrier.clone());
        thread::spawn(move || {
            let mut d = RedisDirectory::open(&url).expect("open");
            (0..RACES)
                .map(|i| {
                    barrier.wait();
                    let room = format!("race-{i}");
                    let holder = d.claim(&room, me, 0).expect("claim");
                    (holder, d.epoch(&room))
                })
                .collect::<Vec<_>>()
        })
    };
    let (a, b) = (racer("a:1"), racer("b:1"));
    let (a, b) = (a.join().expect("a"), b.join().expect("b"));
    let mut d = RedisDirectory::open(&redis.url()).expect("open");
    let mut wins = [0usize; 2];
    for (i, ((ha, ea), (hb, eb))) in a.iter().zip(&b).enumerate() {
        assert_eq!(ha, hb, "race {i}: a was told {ha}, b {hb}");
        let a_won = ha == "a:1";
        assert!(a_won || ha == "b:1", "race {i}: holder {ha}");
        // Exactly the winner holds a claim, with an epoch.
        assert_eq!(ea.is_some(), a_won, "race {i}: a's epoch {ea:?}");
        assert_eq!(eb.is_some(), !a_won, "race {i}: b's epoch {eb:?}");
        assert_eq!(
            d.lookup(&format!("race-{i}"), 0).expect("lookup").as_deref(),
            Some(ha.as_str())
        );
        wins[usize::from(!a_won)] += 1;
    }
    eprintln!("of {RACES} races a won {}, b won {}", wins[0], wins[1]);
    assert_eq!(wins[0] + wins[1], RACES);
}

#[test]
fn a_lease_not_renewed_expires_and_a_renewed_one_lives() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(1000);
    let mut a = RedisDirectory::open_with_lease(&redis.url(), lease).expect("open");
    let mut b = RedisDirectory::open_with_lease(&redis.url(), lease).expect("open");
    assert_eq!(a.claim("kept", "a:1", 0).unwrap(), "a:1");
    assert_eq!(a.claim("dropped", "a:1", 0).unwrap(), "a:1");
    // "dropped" is forgotten by a (as if its server had died); "kept" is renewed.
    a.forget("dropped");
    let until = Instant::now() + 3 * lease;
    while Instant::now() < until {
        a.renew("a:1", 0).unwrap();
        thread::sleep(lease / 5);
    }
    assert_eq!(
        b.claim("kept", "b:1", 0).unwrap(),
        "a:1",
        "a renewed lease was lost"
    );
    assert_eq!(
        b.lookup("dropped", 0).unwrap(),
        None,
        "an unrenewed lease outlived 3 lease times"
    );
    assert_eq!(b.claim("dropped", "b:1", 0).unwrap(), "b:1");
    assert!(a.take_lost().is_empty());
}

#[test]
fn only_the_current_holder_renews_or_releases() {
    let redis = RedisServer::start();
    let lease = Duration::from_millis(500);
    let mut a = RedisDirectory::open_with_lease(&redis.url(), lease).expect("open");
    let mut b = RedisDirectory::open_with_lease(&redis.url(), lease).expect("open");
    assert_eq!(a.claim("band", "a:1", 0).unwrap(), "a:1");
    assert_eq!(a.claim("duo", "a:1", 0).unwrap(), "a:1");
    // Not b's to give up.
    b.release("band", "b:1").unwrap();
    assert_eq!(b.lookup("band", 0).unwrap().as_deref(), Some("a:1"));
    // a stalls past its leases; b claims both rooms; a wakes up.
    thread::sleep(lease * 3);
    assert_eq!(b.claim("band", "b:1", 0).unwrap(), "b:1");
    assert_eq!(b.claim("duo", "b:1", 0).unwrap(), "b:1");
    let b_epoch = b.epoch("band").expect("b's epoch");
    assert!(b_epoch > a.epoch("band").expect("a still thinks it holds band"));
    a.release("band", "a:1").unwrap();
    assert_eq!(
        b.lookup("band", 0).unwrap().as_deref(),
        Some("b:1"),
        "a stale release deleted b's claim"
    );
    a.renew("a:1", 0).unwrap();
    assert_eq!(a.take_lost(), [("duo".to_owned(), "b:1".to_owned())]);
    assert_eq!(a.epoch("duo"), None);
    assert_eq!(
        b.lookup("duo", 0).unwrap().as_deref(),
        Some("b:1"),
        "a stale renewal took b's claim"
    );
    b.release("duo", "b:1").unwrap();

    // A server restarted at the same address takes its room over with a new epoch; the
    // old incarnation can no longer touch it.
    let mut b2 = RedisDirectory::open_with_lease(&redis.url(), lease).expect("open");
    assert_eq!(b2.claim("band", "b:1", 0).unwrap(), "b:1");
    assert!(b2.epoch("band").expect("b2's epoch") > b_epoch);
    b.release("band", "b:1").unwrap();
    assert_eq!(a.lookup("band", 0).unwrap().as_deref(), Some("b:1"));
    b2.renew("b:1", 0).unwrap();
    assert!(b2.take_lost().is_empty());
    b2.release("band", "b:1").unwrap();
    assert_eq!(
        a.lookup("band", 0).unwrap(),
        None,
        "the holder's release did not free the room"
    );
}

#[test]
fn after_redis_restarts_empty_the_next_renewal_takes_the_claims_back() {
    let mut redis = RedisServer::start();
    let mut a = RedisDirectory::open(&redis.url()).expect("open");
    assert_eq!(a.claim("band", "a:1", 0).unwrap(), "a:1");
    redis.restart();
    let mut b = RedisDirectory::open(&redis.url()).expect("open");
    assert_eq!(b.lookup("band", 0).unwrap(), None);
    // The first call after the restart may fail on the old connection; the next one
    // connects again.
    if a.renew("a:1", 0).is_err() {
        a.renew("a:1", 0).unwrap();
    }
    assert_eq!(b.claim("band", "b:1", 0).unwrap(), "a:1");
}

#[test]
fn a_redis_that_does_not_answer_is_said_at_open() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    redis.stop();
    match RedisDirectory::open(&url) {
        Err(e @ OpenError::Unreachable { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&url) && text.contains("redis-server"), "{text}");
        }
        other => panic!("{other:?}"),
    }
    match RedisDirectory::open("redis//nowhere") {
        Err(e @ OpenError::BadUrl { .. }) => assert!(e.to_string().contains("redis://HOST:PORT")),
        other => panic!("{other:?}"),
    }
}

/// The calls a server makes to Redis: two to open a room, one a second to renew however
/// many it holds, one to close one. Counted, not timed; the figures per second at 100
/// rooms are printed.
#[test]
fn a_hundred_rooms_cost_one_call_a_second_to_keep() {
    const ROOMS: u64 = 100;
    let redis = RedisServer::start();
    let mut d = RedisDirectory::open(&redis.url()).expect("open");
    let opened = d.ops();
    for i in 0..ROOMS {
        assert_eq!(d.claim(&format!("room-{i}"), "a:1", 0).unwrap(), "a:1");
    }
    let to_open = d.ops() - opened;
    assert_eq!(to_open, 2 * ROOMS, "calls to open {ROOMS} rooms");
    let before = d.ops();
    const RENEWALS: u64 = 5;
    let started = Instant::now();
    for _ in 0..RENEWALS {
        d.renew("a:1", 0).unwrap();
    }
    let renew_s = started.elapsed().as_secs_f64() / RENEWALS as f64;
    assert_eq!(
        d.ops() - before,
        RENEWALS,
        "calls for {RENEWALS} renewals of {ROOMS} rooms"
    );
    assert!(d.take_lost().is_empty());
    let before = d.ops();
    for i in 0..ROOMS {
        d.release(&format!("room-{i}"), "a:1").unwrap();
    }
    assert_eq!(d.ops() - before, ROOMS);
    eprintln!(
        "{ROOMS} rooms: {to_open} calls to open them, then 1 call a second to keep them (one renewal of all {ROOMS} took {:.2} ms here), {ROOMS} to close them",
        renew_s * 1e3
    );
}
