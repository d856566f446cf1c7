//! A long `netjam jam` against `netjam reflect` on loopback with `--stats-json`, watching
//! the jam's resident memory: after the first half it must stay flat. Ignored by default;
//! run on purpose, for as long as you like (default an hour):
//!
//! `NETJAM_SOAK_SECS=600 cargo test --release -p netjam --test soak_jam -- --ignored --nocapture`

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{reflect, tmp_dir, Proc, BIN};

/// Resident memory of process `pid`, in KiB (VmRSS in /proc/PID/status).
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
#[ignore = "a soak: runs for NETJAM_SOAK_SECS (default 3600 s)"]
fn jam_memory_stays_flat_over_a_long_session() {
    let secs: u64 = std::env::var("NETJAM_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3600);
    assert!(secs >= 20, "NETJAM_SOAK_SECS={secs}: use at least 20 s");
    let dir = tmp_dir("soak");
    let json = dir.join("jam.json");
    let (_reflect, reflector) = reflect(&(secs + 30).to_string());
    let mut jam = Proc::spawn(
        Command::new(BIN)
            .args(["jam", "--peer", &reflector.to_string(), "--listen", "127.0.0.1:0"])
            .args(["--noise", "--duration", &secs.to_string()])
            .args(["--stats-json", json.to_str().expect("path")])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "netjam jam",
    );
    let pid = jam.child.id();
    let start = Instant::now();
    let every = Duration::from_secs((secs / 60).clamp(2, 10));
    let mut samples: Vec<(f64, u64)> = Vec::new();
    while jam.running() {
        if let Some(kib) = rss_kib(pid) {
            samples.push((start.elapsed().as_secs_f64(), kib));
        }
        // Sample on a fixed grid; the wait also notices the jam ending.
        if jam.wait_until(every).is_some() {
            break;
        }
    }
    let status = jam.wait_for(Duration::from_secs(30));
    assert!(status.success(), "netjam jam failed: {status}");
    let size = std::fs::metadata(&json).expect("stats file").len();
    let line: Vec<String> = samples.iter().map(|(t, k)| format!("{t:.0}s {k}")).collect();
    eprintln!("jam RSS (KiB) over {secs} s: {}", line.join(", "));
    eprintln!("stats JSON: {size} bytes");
    // Drop the last sample: the process may be writing its report.
    let during: Vec<(f64, u64)> = samples
        .iter()
        .copied()
        .filter(|(t, _)| *t < secs as f64 - 2.0)
        .collect();
    assert!(during.len() >= 4, "too few samples: {samples:?}");
    let half = secs as f64 / 2.0;
    let (t0, at_half) = *during
        .iter()
        .find(|(t, _)| *t >= half)
        .expect("a sample after half time");
    let (t1, at_end) = *during.last().expect("samples");
    let (low, high) = during
        .iter()
        .filter(|(t, _)| *t >= t0)
        .fold((u64::MAX, 0), |(lo, hi), (_, k)| (lo.min(*k), hi.max(*k)));
    // A little slack for the allocator's own rounding, plus 1 KiB a second: a leak of a
    // few KiB a second (a growing statistics series) fails.
    let bound = 128 + (t1 - t0) as u64;
    assert!(
        high - low <= bound,
        "RSS went from {at_half} KiB at {t0:.0} s to {at_end} KiB at {t1:.0} s (range {low}..{high} KiB, bound {bound} KiB growth)"
    );
    // The statistics file is bounded too: a thousand snapshots at most.
    assert!(size < 8 << 20, "stats JSON of {size} bytes");
}
