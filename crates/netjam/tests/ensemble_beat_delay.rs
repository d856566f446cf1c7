//! `--delay-to-beat` between real processes on loopback: two `netjam jam --ensemble`
//! players at 120 BPM, each the other's peer. A plays a file of short tone bursts; B
//! plays silence, hears A one beat late (`--delay-to-beat beat`) and writes what it hears
//! to a file.
//!
//! Each player says where the first frame it played and heard lies on the machine's
//! monotonic clock, which every process here shares (and from which the ensemble's time
//! was started), so a burst's capture time at A and its onset in B's file are true
//! times: once B knows A's stream's times, every burst must be heard 500 ms ± 1 ms after
//! A played it. The files are paced by the nominal period times, so load moves neither
//! side's frames; only the two ensemble clocks' agreement and the delay's quarter
//! millisecond of tolerance do (B's fixed 20 ms buffer keeps a packet made late by load
//! from being concealed at a burst's start, which would move its onset by a packet).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ensemble_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ensemble_support::{free_port, spawn, tmp, Band, Proc, NETJAM};

const RATE: u32 = 48_000;
/// A burst every 1.1 s (not a whole number of beats, so a burst heard a beat late is never
/// mistaken for a later one played on time), 10 ms of 1 kHz.
const EVERY: u64 = 52_800;
const BURST: u64 = 480;
const SECONDS: u64 = 14;
const BEAT_MS: f64 = 500.0;
const BOUND_MS: f64 = 1.0;

fn write_bursts(path: &Path) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: RATE,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    for i in 0..SECONDS * u64::from(RATE) {
        let t = i % EVERY;
        let v = if t < BURST {
            0.5 * (std::f64::consts::TAU * 1_000.0 * t as f64 / f64::from(RATE)).sin()
        } else {
            0.0
        };
        w.write_sample((v * 32_767.0) as i16).unwrap();
    }
    w.finalize().unwrap();
}

fn player(band: &Band, listen: u16, peer: u16, source: &[&str], extra: &[&str]) -> Proc {
    let mut c = Command::new(NETJAM);
    c.arg("jam")
        .args(source)
        .args(["--listen", &format!("127.0.0.1:{listen}")])
        .args(["--peer", &format!("127.0.0.1:{peer}")])
        .args([
            "--ensemble",
            &band.name,
            "--ensemble-local",
            "--ensemble-port",
            &band.port,
        ])
        // The click is not what is measured.
        .args(["--tempo", "120", "--click-gain", "-200"])
        .args(extra);
    spawn(&mut c)
}

/// Burst onsets in a WAV file as frames (see [`ensemble_support::onsets`]).
fn onsets(path: &Path) -> Vec<u64> {
    let (rate, found) = ensemble_support::onsets(path);
    assert_eq!(rate, RATE);
    found
}

/// Where the player's first frame lies on the monotonic clock (ns).
fn first_frame(p: &Proc) -> f64 {
    let l = p.wait_err("first frame", Duration::from_secs(1), |l| {
        l.contains("first frame heard")
    });
    l.split_whitespace().rev().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_remote_player_is_heard_one_beat_after_they_played() {
    let band = Band::new(0);
    let (pa, pb) = (free_port(), free_port());
    let (bursts, heard) = (tmp("beat-delay", "bursts.wav"), tmp("beat-delay", "heard.wav"));
    write_bursts(&bursts);
    let mut a = player(&band, pa, pb, &["--input", bursts.to_str().unwrap()], &[]);
    let mut b = player(
        &band,
        pb,
        pa,
        &["--silence", "--duration", &SECONDS.to_string()],
        // A late packet concealed at a burst's start would move its onset by a packet:
        // the beat is long, so B can afford a generous buffer.
        &[
            "--output",
            heard.to_str().unwrap(),
            "--delay-to-beat",
            "beat",
            "--buffer",
            "20ms",
        ],
    );
    let within = Duration::from_secs(15);
    b.wait_err("the delay to the beat", within, |l| {
        l.contains("netjam: heard a beat late")
    });
    let start = Instant::now();
    for p in [&mut a, &mut b] {
        while p.child.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < Duration::from_secs(30), "a player did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let late_lines: Vec<String> = b
        .err_lines()
        .into_iter()
        .filter(|l| l.contains("more than a beat"))
        .collect();
    assert!(late_lines.is_empty(), "on loopback: {late_lines:?}");
    let (fa, fb) = (first_frame(&a), first_frame(&b));
    // Each onset B heard against the latest burst A played before it.
    let delays: Vec<f64> = onsets(&heard)
        .iter()
        .map(|&f| {
            let tb = fb + f as f64 * 1e9 / f64::from(RATE);
            let k = ((tb - fa) * f64::from(RATE) / 1e9).max(0.0) as u64 / EVERY * EVERY;
            let ta = fa + k as f64 * 1e9 / f64::from(RATE);
            (tb - ta) / 1e6
        })
        .collect();
    println!("A's bursts as B heard them, ms after A played them: {delays:.3?}");
    // Before B knows A's stream's times it hears A as it comes (a few ms); from then on,
    // every burst a beat late.
    let from = delays
        .iter()
        .position(|d| *d > BEAT_MS / 2.0)
        .unwrap_or_else(|| panic!("no burst heard a beat late: {delays:.3?}"));
    assert!(
        delays[..from].iter().all(|d| *d < 50.0),
        "before the delay: {delays:.3?}"
    );
    let on_beat = &delays[from..];
    assert!(on_beat.len() >= 6, "only {} bursts a beat late", on_beat.len());
    let worst = on_beat.iter().map(|d| (d - BEAT_MS).abs()).fold(0.0, f64::max);
    let mut sorted = on_beat.to_vec();
    sorted.sort_by(f64::total_cmp);
    println!(
        "{} bursts heard a beat late: median {:.3} ms after they were played, worst {worst:.3} ms off 500 ms",
        on_beat.len(),
        sorted[sorted.len() / 2]
    );
    assert!(
        worst < BOUND_MS,
        "a burst {worst:.3} ms off the beat: {delays:.3?}"
    );
    let _ = std::fs::remove_file(&bursts);
    let _ = std::fs::remove_file(&heard);
}
