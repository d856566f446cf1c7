//! Link-measurement benchmarks; prints its figures.
//!
//! 1. Receive timestamp resolution (kernel vs monotonic) and how late user space sees a
//!    datagram the kernel has already stamped.
//! 2. The reflector's own added delay (receive to send), median and p99, on loopback.
//! 3. The highest probe rate ping + reflect sustain on loopback without loss (stepped).
//! 4. Accuracy: measured vs emulated delay and loss through `impair`.
//!
//! Run with `cargo bench -p netjam --bench probe`; it takes well under two minutes.

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::time::Duration;

use netjam::clock;
use netjam::probe::impair::spawn_impair;
use netjam::probe::ping::{ping, PingConfig};
use netjam::probe::reflect;
use netjam::transport::{TimestampSource, UdpTransport};
use netjam_engine::link::{JitterDist, LinkConfig, LossModel};
use netjam_engine::probe::ReflectorConfig;

const MS: u64 = 1_000_000;

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn timestamp_resolution() {
    println!("== receive timestamps ==");
    // Monotonic clock: smallest step between consecutive reads.
    let mut min_step = u64::MAX;
    let mut last = clock::now_ns();
    for _ in 0..200_000 {
        let t = clock::now_ns();
        if t > last {
            min_step = min_step.min(t - last);
        }
        last = t;
    }
    println!("monotonic clock: smallest observed step {min_step} ns");

    let rx = UdpTransport::bind(loopback()).unwrap();
    let tx = UdpTransport::bind(loopback()).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let to = rx.local_addr().unwrap();
    let source = rx.timestamp_source();
    let n = 2000;
    let sender = std::thread::spawn(move || {
        let start = clock::now_ns();
        for i in 0..n {
            clock::sleep_until_ns(start + i * 500_000);
            tx.send_to(&[0u8; 64], to).unwrap();
        }
    });
    let mut buf = [0u8; 128];
    let mut gaps = Vec::new();
    let mut stamps = Vec::new();
    while let Ok(Some(r)) = rx.recv(&mut buf) {
        let seen = clock::now_ns();
        if r.source == TimestampSource::Kernel {
            gaps.push(seen.saturating_sub(r.at_ns));
        }
        stamps.push(r.at_ns);
        if stamps.len() as u64 == n {
            break;
        }
    }
    sender.join().unwrap();
    let mut min_diff = u64::MAX;
    for w in stamps.windows(2) {
        if w[1] > w[0] {
            min_diff = min_diff.min(w[1] - w[0]);
        }
    }
    println!(
        "socket timestamps: {} ({} datagrams at 2000/s); stamps are integer ns, smallest gap seen {} ns",
        match source {
            TimestampSource::Kernel => "kernel (SO_TIMESTAMPNS, mapped onto the monotonic scale)",
            TimestampSource::Monotonic => "monotonic after recv",
        },
        stamps.len(),
        min_diff
    );
    if !gaps.is_empty() {
        gaps.sort_unstable();
        println!(
            "user space reads a datagram after its kernel stamp by: median {:.1} us, p99 {:.1} us, max {:.1} us \
             (the error a monotonic stamp would add)",
            pct(&gaps, 0.5) as f64 / 1e3,
            pct(&gaps, 0.99) as f64 / 1e3,
            gaps[gaps.len() - 1] as f64 / 1e3
        );
    }
    println!();
}

fn reflector_hold() {
    println!("== reflector added delay (loopback, 2000 probes/s for 2 s) ==");
    let r = reflect::spawn(loopback(), ReflectorConfig::default(), None).unwrap();
    let mut cfg = PingConfig::new(r.local_addr(), 2000.0, 64, Duration::from_secs(2));
    cfg.wait_after = Some(Duration::from_millis(200));
    let out = ping(&cfg).unwrap();
    r.stop().unwrap();
    let s = &out.report.summary;
    println!(
        "reflector hold (kernel receive stamp to just before send): median {:.1} us, p99 {:.1} us, max {:.1} us",
        s.reflector_hold.median_ms * 1e3,
        s.reflector_hold.p99_ms * 1e3,
        s.reflector_hold.max_ms * 1e3
    );
    println!(
        "round trip without hold: median {:.1} us, p99 {:.1} us; lost {}",
        s.round_trip.delay.median_ms * 1e3,
        s.round_trip.delay.p99_ms * 1e3,
        s.lost
    );
    println!();
}

fn max_rate() {
    println!("== highest loss-free probe rate, 64-byte probes, ping + reflect on loopback (1 s per step) ==");
    let r = reflect::spawn(
        loopback(),
        ReflectorConfig {
            rate_limit_pps: 1_000_000,
            ..ReflectorConfig::default()
        },
        None,
    )
    .unwrap();
    let mut best = 0.0;
    println!(
        "{:>10} {:>10} {:>9} {:>9} {:>8} {:>12} {:>12}",
        "rate/s", "achieved", "sent", "received", "lost", "rtt med us", "slip max ms"
    );
    for rate in [
        10_000.0, 20_000.0, 35_000.0, 50_000.0, 70_000.0, 100_000.0, 140_000.0, 200_000.0,
    ] {
        let mut cfg = PingConfig::new(r.local_addr(), rate, 64, Duration::from_secs(1));
        cfg.wait_after = Some(Duration::from_millis(300));
        let out = ping(&cfg).unwrap();
        let s = &out.report.summary;
        println!(
            "{:>10.0} {:>10.0} {:>9} {:>9} {:>8} {:>12.1} {:>12.3}",
            rate,
            out.report.achieved_rate_pps,
            s.sent,
            s.received,
            s.lost,
            s.round_trip.delay.median_ms * 1e3,
            out.report.max_schedule_slip_ms
        );
        // Loss-free, and the sender really kept the rate (within 2 %).
        if s.lost > 0 || out.report.achieved_rate_pps < 0.98 * rate {
            break;
        }
        best = rate;
    }
    r.stop().unwrap();
    println!("highest rate sent on schedule without loss: {best:.0} probes/s");
    println!();
}

fn link(delay_ms: f64, jitter_ms: f64, dist: JitterDist, loss: LossModel) -> LinkConfig {
    LinkConfig {
        delay_ns: (delay_ms * MS as f64) as u64,
        jitter_ns: (jitter_ms * MS as f64) as u64,
        jitter_dist: dist,
        loss,
        ..LinkConfig::ideal()
    }
}

fn accuracy() {
    println!("== accuracy through impair (500 probes/s for 3 s each) ==");
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "emulated (each way)",
        "rtt set",
        "rtt med",
        "up med",
        "down med",
        "up loss",
        "meas up",
        "dn loss",
        "meas dn"
    );
    let cases: Vec<(&str, LinkConfig, LinkConfig)> = vec![
        (
            "10 ms",
            link(10.0, 0.0, JitterDist::Uniform, LossModel::None),
            link(10.0, 0.0, JitterDist::Uniform, LossModel::None),
        ),
        (
            "20 ms ±2 uniform",
            link(20.0, 2.0, JitterDist::Uniform, LossModel::None),
            link(20.0, 2.0, JitterDist::Uniform, LossModel::None),
        ),
        (
            "19 ms σ1.5 normal, 0.5 % burst 2",
            link(19.0, 1.5, JitterDist::Normal, LossModel::bursty(0.005, 2.0)),
            link(19.0, 1.5, JitterDist::Normal, LossModel::bursty(0.005, 2.0)),
        ),
        (
            "15 ms, 2 % loss up only",
            link(15.0, 0.0, JitterDist::Uniform, LossModel::Bernoulli { p: 0.02 }),
            link(15.0, 0.0, JitterDist::Uniform, LossModel::None),
        ),
        (
            "25 up / 5 down ms (asymmetric)",
            link(25.0, 0.0, JitterDist::Uniform, LossModel::None),
            link(5.0, 0.0, JitterDist::Uniform, LossModel::None),
        ),
    ];
    for (name, up, down) in cases {
        let r = reflect::spawn(loopback(), ReflectorConfig::default(), None).unwrap();
        let rtt_set = (up.delay_ns + down.delay_ns) as f64 / 1e6;
        let imp = spawn_impair(loopback(), r.local_addr(), up, down, 42).unwrap();
        let mut cfg = PingConfig::new(imp.local_addr(), 500.0, 64, Duration::from_secs(3));
        cfg.wait_after = Some(Duration::from_millis(300));
        let out = ping(&cfg).unwrap();
        let e = imp.stop();
        r.stop().unwrap();
        let s = &out.report.summary;
        let up_set = 100.0 * e.up.lost as f64 / e.up.offered.max(1) as f64;
        let down_set = 100.0 * e.down.lost as f64 / e.down.offered.max(1) as f64;
        println!(
            "{:<34} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>8.2}% {:>8.2}% {:>8.2}% {:>8.2}%",
            name,
            rtt_set,
            s.round_trip.delay.median_ms,
            s.send.delay.median_ms,
            s.receive.delay.median_ms,
            up_set,
            s.send.loss_pct,
            down_set,
            s.receive.loss_pct
        );
    }
    println!("(rtt set: emulated base delay both ways; one-way medians are minimum-filter estimates, which");
    println!(" assume symmetric minimum delay; up/down loss: emulator's own drop rate vs measured)");
}

fn main() {
    // `cargo bench` passes --bench; a filter argument is not supported here.
    let t = std::time::Instant::now();
    timestamp_resolution();
    reflector_hold();
    max_rate();
    accuracy();
    println!("\nprobe bench finished in {:.1} s", t.elapsed().as_secs_f64());
}
