//! The ensemble through a rooms server, between real processes on loopback: the room is
//! the ensemble and the server its clock reference. Three `netjam ensemble join --server`
//! members that know only the server and the ensemble's name find each other, a message
//! reaches the member offering its service and no other, a timed message fires on every
//! member together, the clock agrees with the server's, a killed member's services
//! disappear; and two `netjam jam --room --ensemble` players click on the same beat,
//! and on the same bar after `netjam ensemble tempo --server` changes the tempo.
//!
//! Every process here shares the machine's monotonic clock, which is also the server's
//! ensemble time, so the true clock offset is zero and a firing or a click is a true
//! time. Figures are printed (run with `--nocapture`); the asserted bounds hold on a
//! loaded 2-core machine. Every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod ensemble_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ensemble_support::{ens_ns, field, messages, nearest, onset_times, spawn, tmp, Band, Proc, NETJAM};

const SERVICES: [&str; 3] = ["keys", "bass", "drums"];
const MS: f64 = 1e6;

fn ms(ns: u64) -> f64 {
    ns as f64 / MS
}

/// One message to every member's service timed 0.3 s ahead: the spread of the firings
/// on the shared monotonic clock.
fn timed_round(band: &Band, members: &[Proc], round: usize) -> u64 {
    let tag = format!("/go{round}");
    let mut args = vec![format!("/{}{tag}", SERVICES[0])];
    for s in &SERVICES[1..] {
        args.push("--also".into());
        args.push(format!("/{s}{tag}"));
    }
    args.extend(["--at".into(), "+0.3s".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    band.send(&args);
    let mut monos = Vec::new();
    for m in members {
        let l = m.wait_for("timed message", |l| l.contains(&format!("{tag} ")));
        let (at, fired) = (ens_ns(&field(&l, "at=")), ens_ns(&field(&l, "ens=")));
        assert!(fired >= at, "fired early by its own clock: {l}");
        monos.push(field(&l, "mono=").parse::<u64>().unwrap());
    }
    monos.iter().max().unwrap() - monos.iter().min().unwrap()
}

#[test]
fn three_members_through_a_rooms_server_route_fire_together_and_lose_a_killed_one() {
    let (_server, addr) = common::room_server("120", Duration::from_secs(15));
    let band = Band::in_room(0, addr);
    let t0 = Instant::now();
    let mut members = band.start(&SERVICES);
    println!(
        "three members found each other through the server and locked onto its clock in {:?}",
        t0.elapsed()
    );
    for m in &members {
        assert!(
            m.lines().iter().any(|l| l == "clock-locked server"),
            "{:?}",
            m.lines()
        );
    }
    // A message reaches its service's provider and nobody else.
    band.send(&["/bass/cutoff", "f:440", "s:warm"]);
    let got = members[1].wait_for("the message at bass", |l| l.contains("/bass/cutoff"));
    assert!(got.contains("f:440 s:warm"), "{got}");
    band.send(&["/keys/x", "1", "--also", "/drums/x"]);
    members[0].wait_for("keys message", |l| l.contains("/keys/x"));
    members[2].wait_for("drums message", |l| l.contains("/drums/x"));
    for k in [0, 2] {
        assert!(
            messages(&members[k], "/bass/").is_empty(),
            "{:?}",
            members[k].lines()
        );
    }
    assert!(messages(&members[1], "/keys/").is_empty());

    // A timed message fires on all three together.
    let mut spreads: Vec<u64> = (0..5).map(|r| timed_round(&band, &members, r)).collect();
    spreads.sort_unstable();
    println!(
        "timed message on three members through the server, 5 rounds: spread median {:.3} ms, max {:.3} ms",
        ms(spreads[2]),
        ms(spreads[4])
    );
    // Firing together is the clock's work; each member's wake-up is the machine's. With the
    // whole suite and two busy loops on two cores the median spread was 1.46 ms once and
    // 0.79 ms the next time, so the bound is the one ensemble_four keeps for the same figure.
    assert!(spreads[2] < 5_000_000, "median spread {spreads:?}");
    assert!(spreads[4] < 50_000_000, "spreads {spreads:?}");

    // The clock: the server's monotonic clock is the true ensemble time here, so the
    // offset a member reports is its error.
    let out = Command::new(NETJAM)
        .args([
            "ensemble",
            "clock",
            &band.name,
            "--count",
            "8",
            "--interval",
            "0.5",
        ])
        .args(band.net())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    let locked: Vec<&str> = text.lines().filter(|l| l.contains("locked=true")).collect();
    assert!(locked.len() >= 4, "{text}");
    let mut errors: Vec<f64> = locked
        .iter()
        .map(|l| field(l, "offset_ms=").parse::<f64>().unwrap().abs())
        .collect();
    errors.sort_by(f64::total_cmp);
    let bound: f64 = field(locked.last().unwrap(), "error_bound_ms=").parse().unwrap();
    println!(
        "clock through the server on loopback: |error| median {:.4} ms, max {:.4} ms over {} readings; error bound said {bound:.4} ms",
        errors[errors.len() / 2],
        errors.last().unwrap(),
        errors.len()
    );
    assert!(text.contains("reference=server"), "{text}");
    assert!(*errors.last().unwrap() < 1.0, "{text}");

    // list: the three, reached through the server.
    let out = Command::new(NETJAM)
        .args(["ensemble", "list", &band.name, "--wait", "2"])
        .args(band.net())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("members 3"), "{text}");
    assert!(text.contains("clock-reference server"), "{text}");
    assert!(text.contains("via-server:"), "{text}");
    let bass = members[1].id();
    assert!(text.contains(&format!("service bass provider={bass}")), "{text}");

    // A killed member's services disappear from the others' tables.
    members[1].child.kill().unwrap();
    let killed = Instant::now();
    for k in [0, 2] {
        members[k].wait_for("the killed member leaving", |l| {
            l.starts_with(&format!("left {bass} timed-out")) && l.contains("services=bass")
        });
    }
    println!(
        "a killed member's services withdrawn after {:?}",
        killed.elapsed()
    );
    let out = Command::new(NETJAM)
        .args(["ensemble", "send", &band.name, "/bass/x", "1", "--wait", "1"])
        .args(band.net())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a send to the killed member's service succeeded"
    );
    members.remove(1);
}

/// The band's ensemble secret: ana gives it as a flag, bo in the environment.
const SECRET: &str = "rehearsal 4";

fn player(server: &str, room: &str, name: &str, out: &Path) -> Proc {
    let mut c = Command::new(NETJAM);
    c.args(["jam", "--server", server, "--room", room, "--name", name])
        .args(["--silence", "--duration", "15", "--output", out.to_str().unwrap()])
        .args(["--ensemble", "--tempo", "120"])
        .env("NETJAM_NO_REALTIME", "1")
        .env_remove("NETJAM_ENSEMBLE_SECRET");
    if name == "ana" {
        c.args(["--ensemble-secret", SECRET]);
    } else {
        c.env("NETJAM_ENSEMBLE_SECRET", SECRET);
    }
    spawn(&mut c)
}

/// The two players share an ensemble secret (given two ways); a member without it cannot
/// change their tempo, one with it can.
#[test]
fn two_room_players_click_on_the_same_beat_and_change_tempo_on_the_same_bar() {
    let (server_proc, addr) = common::room_server("60", Duration::from_secs(15));
    let room = format!("beat-{}", std::process::id());
    let server = addr.to_string();
    let (wa, wb) = (tmp("ensroom", "a.wav"), tmp("ensroom", "b.wav"));
    let mut a = player(&server, &room, "ana", &wa);
    let mut b = player(&server, &room, "bo", &wb);
    let within = Duration::from_secs(15);
    for p in [&a, &b] {
        p.wait_err("clock lock", within, |l| l.contains("clock locked"));
        p.wait_err("the tempo", within, |l| l.contains(": 120 BPM from beat 0"));
    }
    // Each player's ensemble member rides on its seat: the room seats the two players and
    // no one else (a seat of its own per member made four).
    let seated: Vec<String> = server_proc
        .drain_lines()
        .into_iter()
        .filter(|l| l.contains(&format!("room {room}: ")))
        .collect();
    let last = seated.last().expect("the server said who is in the room");
    let names: Vec<&str> = last
        .split_once(&format!("room {room}: "))
        .map(|(_, names)| names.trim().split(", ").collect())
        .unwrap_or_default();
    assert!(
        names.len() == 2 && names.contains(&"ana") && names.contains(&"bo"),
        "the room's seats: {seated:?}"
    );
    // A member with another secret asks for 60 BPM: nobody hears it.
    let _ = Command::new(NETJAM)
        .args(["ensemble", "tempo", &room, "60", "--bar", "4", "--wait", "3"])
        .args(["--server", &server, "--secret", "not ours"])
        .env_remove("NETJAM_ENSEMBLE_SECRET")
        .output()
        .unwrap();
    // A third member with the secret, through the server, changes the tempo on the next
    // bar of four.
    let out = Command::new(NETJAM)
        .args(["ensemble", "tempo", &room, "90", "--bar", "4", "--wait", "10"])
        .args(["--server", &server, "--secret", SECRET])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "netjam ensemble tempo: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let change_beat: f64 = field(&said, "beat=").parse().unwrap();
    let change_ns = ens_ns(&field(&said, "from=")) as f64;
    assert_eq!(change_beat % 4.0, 0.0, "{said}");
    for p in [&a, &b] {
        p.wait_err("the change", within, |l| {
            assert!(
                !l.contains(": 60 BPM"),
                "a member without the secret set the tempo: {l}"
            );
            l.contains(&format!(": 90 BPM from beat {change_beat} "))
        });
    }
    let start = Instant::now();
    for p in [&mut a, &mut b] {
        while p.child.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < Duration::from_secs(30), "a player did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (ta, tb) = (onset_times(&a, &wa), onset_times(&b, &wb));
    // Both clicking: the later first onset to the earlier last one.
    let lo = ta[0].max(tb[0]);
    let hi = ta.last().unwrap().min(*tb.last().unwrap());
    let mut deltas = Vec::new();
    for &t in ta.iter().filter(|t| **t >= lo - MS && **t <= hi + MS) {
        let d = (nearest(&tb, t) - t).abs();
        assert!(
            d < 2.0 * MS,
            "a click at {t} ns has none within 2 ms on the other player ({d} ns)"
        );
        deltas.push(d);
    }
    assert!(
        deltas.len() >= 8,
        "only {} clicks in common: {ta:?} {tb:?}",
        deltas.len()
    );
    deltas.sort_by(f64::total_cmp);
    println!(
        "{} clicks heard by both room players: onsets apart median {:.3} ms, max {:.3} ms",
        deltas.len(),
        deltas[deltas.len() / 2] / MS,
        deltas.last().unwrap() / MS
    );
    // The ensemble time is the server's monotonic clock, so before the change beat k is
    // at k × 0.5 s of it; the change lands on its bar, and the beats after it are 2/3 s apart.
    for (who, t) in [("a", &ta), ("b", &tb)] {
        for &x in t.iter().filter(|x| **x < change_ns - MS) {
            let off = (x + 250.0 * MS).rem_euclid(500.0 * MS) - 250.0 * MS;
            assert!(
                off.abs() < 2.0 * MS,
                "player {who}: a click {:.3} ms off the beat",
                off / MS
            );
        }
        let after: Vec<f64> = t.iter().copied().filter(|x| *x >= change_ns - 2.0 * MS).collect();
        assert!(
            after.len() >= 3,
            "player {who}: {} clicks after the change",
            after.len()
        );
        assert!(
            (after[0] - change_ns).abs() < 2.0 * MS,
            "player {who}: the first 90 BPM click is {:.3} ms from its beat",
            (after[0] - change_ns) / MS
        );
        for w in after.windows(2) {
            let gap = w[1] - w[0];
            assert!(
                (gap - 2e9 / 3.0).abs() < 2.0 * MS,
                "player {who}: a 90 BPM beat {:.3} ms long",
                gap / MS
            );
        }
    }
}

/// The clock through the server over an emulated long link: a member in this process
/// reaches the server only through `netjam impair` (19 ms one way, 1.5 ms normal jitter
/// both ways), and its true error is its ensemble time minus the machine's monotonic
/// clock (the server's). Prints the time to lock, from when on the error stayed within
/// 0.5 ms, p50/p99/max of the error from 30 s after the lock (as the LAN bench in
/// `ensemble_clock_impair` does) and the member's own bound:
/// `cargo test --release -p netjam --test ensemble_room -- --ignored --nocapture`
/// (`NETJAM_BENCH_SECS` sets its length after the lock, default 90 s).
#[test]
#[ignore]
fn bench_clock_error_through_the_server_over_19_ms() {
    use netjam::ensemble::{mono_ns, Node, NodeConfig, RoomReach};
    let secs: u64 = std::env::var("NETJAM_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(90);
    let (_server, addr) = common::room_server(&(secs + 60).to_string(), Duration::from_secs(15));
    let (_link, link) = common::impair(
        addr,
        &["--delay", "19", "--jitter", "1.5", "--jitter-dist", "normal"],
    );
    let started = mono_ns();
    let mut node = Node::start(NodeConfig {
        ensemble: format!("far-{}", std::process::id()),
        id: 7,
        services: Vec::new(),
        taps: Vec::new(),
        discovery: netjam_ensemble::discovery::Discovery::local(1),
        bind_ip: "127.0.0.1".parse().unwrap(),
        osc_bridge: None,
        room: Some(RoomReach {
            server: link,
            front: netjam::room_client::FrontDoors::new(link, &[]),
            room: format!("far-{}", std::process::id()),
            name: "far".into(),
            password: String::new(),
            join_timeout_ns: 10_000_000_000,
            seat: None,
        }),
    })
    .unwrap();
    let locked = loop {
        node.run(Some(mono_ns() + 10_000_000), |_, _| true);
        if node.member_ref().clock_stats().is_some_and(|s| s.locked) {
            break mono_ns();
        }
        assert!(
            mono_ns() - started < 30_000_000_000,
            "no lock through impair within 30 s"
        );
    };
    let mut errors = Vec::new();
    let mut next = mono_ns();
    while next < locked + secs * 1_000_000_000 {
        next += 10_000_000;
        node.run(Some(next), |_, _| true);
        let now = mono_ns();
        if let Some(e) = node.member_ref().ensemble_time(now) {
            errors.push((now - locked, (e as i64 - now as i64).unsigned_abs()));
        }
    }
    let st = node.member_ref().clock_stats().unwrap();
    node.leave();
    let settled = errors
        .iter()
        .rposition(|(_, e)| *e > 500_000)
        .and_then(|i| errors.get(i + 1))
        .map_or(0.0, |(t, _)| *t as f64 / 1e9);
    let mut late: Vec<u64> = errors
        .iter()
        .filter(|(t, _)| *t >= 30_000_000_000)
        .map(|(_, e)| *e)
        .collect();
    if late.is_empty() {
        late = errors.iter().map(|(_, e)| *e).collect();
    }
    late.sort_unstable();
    let p = |q: f64| late[((late.len() - 1) as f64 * q).round() as usize] as f64 / MS;
    println!(
        "clock through the server over impair 19 ms ± 1.5 ms: locked {:.2} s after start, within 0.5 ms for good from {settled:.1} s after the lock; error from 30 s after the lock p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms ({secs} s run); bound {:.3} ms, min rtt {:.2} ms",
        (locked - started) as f64 / 1e9,
        p(0.5),
        p(0.99),
        p(1.0),
        st.error_bound_ns as f64 / MS,
        st.min_rtt_ns as f64 / MS
    );
}
