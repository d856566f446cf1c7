//! Measured honesty: ping through impair through reflect on loopback, with known
//! impairments, must report what was emulated (within stated tolerances).

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::BIN;
use netjam::probe::impair::{spawn_impair, ImpairStats};
use netjam::probe::ping::{ping, PingConfig, PingOutcome};
use netjam::probe::reflect;
use netjam_engine::link::{JitterDist, LinkConfig, LossModel};
use netjam_engine::probe::ReflectorConfig;

const MS: u64 = 1_000_000;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn link(delay_ms: u64, jitter_ms: u64, loss: f64) -> LinkConfig {
    LinkConfig {
        delay_ns: delay_ms * MS,
        jitter_ns: jitter_ms * MS,
        jitter_dist: JitterDist::Uniform,
        loss: if loss > 0.0 {
            LossModel::Bernoulli { p: loss }
        } else {
            LossModel::None
        },
        ..LinkConfig::ideal()
    }
}

/// `rate` probes a second of `size` bytes for `secs` seconds, and `wait_ms` for the last
/// replies; to be sent by [`ping_through`].
fn probes(rate: f64, size: usize, secs: u64, wait_ms: u64) -> PingConfig {
    let mut cfg = PingConfig::new(loopback(), rate, size, Duration::from_secs(secs));
    cfg.wait_after = Some(Duration::from_millis(wait_ms));
    cfg
}

/// Ping with `probes` through `spawn_impair` with links `up` and `down` and `seed` to an
/// in-process reflector: what ping found, and what the emulator did.
fn ping_through(
    up: LinkConfig,
    down: LinkConfig,
    seed: u64,
    mut probes: PingConfig,
) -> (PingOutcome, ImpairStats) {
    let r = reflect::spawn(loopback(), ReflectorConfig::default(), None).unwrap();
    let imp = spawn_impair(loopback(), r.local_addr(), up, down, seed).unwrap();
    probes.target = imp.local_addr();
    let out = ping(&probes).unwrap();
    let emulated = imp.stop();
    r.stop().unwrap();
    (out, emulated)
}

/// Binomial 99.9 % interval (normal approximation) for `n` trials at probability `p`, in
/// percent.
fn binomial_interval_pct(p: f64, n: u64) -> (f64, f64) {
    let sd = (p * (1.0 - p) / n as f64).sqrt();
    (100.0 * (p - 3.29 * sd).max(0.0), 100.0 * (p + 3.29 * sd))
}

/// The real binary, end to end: 20 ms each way ± 2 ms uniform jitter gives a median
/// round trip of 40 ± 1 ms and one-way estimates of 20 ± 1.5 ms.
#[test]
fn cli_delay_and_jitter_come_out_right() {
    let (reflect, reflector) = common::reflect("6");
    let (impair, target) = common::impair(
        reflector,
        &["--delay", "20", "--jitter", "2", "--seed", "7", "--duration", "6"],
    );
    let json = std::env::temp_dir().join(format!("netjam-probe-test-{}.json", std::process::id()));
    let out = Command::new(BIN)
        .args(["ping", &target.to_string(), "--rate", "200", "--duration", "2"])
        .args(["--wait", "300", "--json", json.to_str().unwrap()])
        .output()
        .unwrap();
    drop((reflect, impair));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("round trip"), "{text}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let s = &v["summary"];
    let median = s["round_trip"]["delay"]["median_ms"].as_f64().unwrap();
    assert!((39.0..=41.0).contains(&median), "median RTT {median} ms\n{text}");
    for dir in ["send", "receive"] {
        let m = s[dir]["delay"]["median_ms"].as_f64().unwrap();
        assert!((18.5..=21.5).contains(&m), "{dir} median {m} ms\n{text}");
        // Uniform ±2 ms: PDV p99 near 4 ms; the upper bound leaves room for a busy machine.
        let p99 = s[dir]["pdv"]["p99_ms"].as_f64().unwrap();
        assert!((2.0..=10.0).contains(&p99), "{dir} PDV p99 {p99}\n{text}");
    }
    assert_eq!(s["lost"].as_u64(), Some(0), "{text}");
    assert!(["kernel", "monotonic"].contains(&v["timestamps"].as_str().unwrap()));
}

/// 1 % loss on the way up only: the loss figure lies inside its binomial interval, is
/// reported as up loss, and equals what the emulator dropped.
#[test]
fn up_only_loss_is_reported_as_up_loss() {
    let (out, emulated) = ping_through(link(5, 0, 0.01), link(5, 0, 0.0), 11, probes(1000.0, 64, 2, 200));
    let s = &out.report.summary;
    let (lo, hi) = binomial_interval_pct(0.01, s.sent);
    assert!(
        (lo..=hi).contains(&s.loss_pct),
        "loss {} % outside [{lo}, {hi}]",
        s.loss_pct
    );
    assert_eq!(s.receive.lost, 0, "{s:?}");
    // Everything lost went missing on the way up, as the emulator dropped it (the emulator
    // may also have dropped a handshake hello, which the ping retries).
    assert_eq!(s.send.lost + s.lost_direction_unknown, s.lost);
    assert!(
        s.lost <= emulated.up.lost && emulated.up.lost <= s.lost + 2,
        "{s:?} {emulated:?}"
    );
}

/// 2 % loss on the way down only is reported as down loss.
#[test]
fn down_only_loss_is_reported_as_down_loss() {
    let (out, emulated) = ping_through(link(2, 0, 0.0), link(2, 0, 0.02), 5, probes(1000.0, 64, 1, 200));
    let s = &out.report.summary;
    let (lo, hi) = binomial_interval_pct(0.02, s.sent);
    assert!(
        (lo..=hi).contains(&s.loss_pct),
        "loss {} % outside [{lo}, {hi}]",
        s.loss_pct
    );
    assert_eq!(s.send.lost, 0, "{s:?}");
    assert_eq!(s.receive.lost + s.lost_direction_unknown, s.lost);
    assert!(
        s.lost <= emulated.down.lost && emulated.down.lost <= s.lost + 2,
        "{s:?} {emulated:?}"
    );
}

/// Asymmetric delay: 30 ms up, 10 ms down. The minimum-filter offset estimate assumes
/// symmetry, so one-way estimates come out near 20/20 while the round trip stays right;
/// this documents the limit of clock-free one-way estimates.
#[test]
fn asymmetric_delay_keeps_the_round_trip_and_duplicates_are_counted() {
    let mut down = link(10, 0, 0.0);
    down.duplicate = 0.05;
    let (out, emulated) = ping_through(link(30, 0, 0.0), down, 3, probes(200.0, 64, 1, 200));
    let s = &out.report.summary;
    assert!((39.0..=41.5).contains(&s.round_trip.delay.median_ms), "{s:?}");
    assert!((s.send.delay.median_ms - s.receive.delay.median_ms).abs() < 2.0);
    assert_eq!(s.duplicates, emulated.down.duplicated, "{emulated:?}");
    assert!(s.duplicates > 0);
}

/// The same seed drops the same probes: two runs through `impair` with seed 5 lose the
/// same sequence numbers.
#[test]
fn same_seed_loses_the_same_probes() {
    let lost_seqs = || {
        let (out, _) = ping_through(link(1, 0, 0.03), link(1, 0, 0.0), 5, probes(500.0, 64, 1, 100));
        let lost: Vec<usize> = out
            .stats
            .records()
            .iter()
            .enumerate()
            .filter(|(_, r)| r.reply.is_none())
            .map(|(i, _)| i)
            .collect();
        lost
    };
    let a = lost_seqs();
    let b = lost_seqs();
    assert!(!a.is_empty());
    assert_eq!(a, b);
}

/// Soak: five minutes of the Seattle–Vermont profile at 750 probes/s (64-frame stereo L16
/// at 48 kHz). Run on purpose with `--ignored`.
#[test]
#[ignore]
fn soak_seattle_vermont_five_minutes() {
    let profile = LinkConfig::seattle_vermont();
    let (out, e) = ping_through(profile.clone(), profile, 1, probes(750.0, 276, 300, 500));
    let s = &out.report.summary;
    assert!((37.0..=40.0).contains(&s.round_trip.delay.median_ms), "{s:?}");
    // Bursts (mean length 2) make losses correlated; counting a quarter of the packets as
    // independent trials keeps the interval honest.
    let (lo, hi) = binomial_interval_pct(0.005, e.up.offered / 4);
    assert!((lo..=hi).contains(&s.send.loss_pct), "{s:?}");
    assert!((lo..=hi).contains(&s.receive.loss_pct), "{s:?}");
}
