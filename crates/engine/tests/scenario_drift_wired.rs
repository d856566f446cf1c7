//! The receiver with drift correction on follows a sender whose clock runs 200 ppm fast
//! without inserting or skipping a single period; with it off, the same session needs
//! those fallbacks to hold the buffer. And what following a drifting clock costs in pitch.

mod common;

use common::Session;
use netjam_engine::jitter::JitterStats;
use netjam_engine::link::{JitterDist, LinkConfig};
use netjam_engine::wire::{AudioFormat, Codec};

/// A session whose sender's clock runs `ppm` fast, over 10 ms ± 300 µs.
fn drifting(ppm: f64, correct: bool, seed: u64) -> Session {
    let format = AudioFormat::new(Codec::F32, 48_000, 2).expect("format");
    let link = LinkConfig {
        delay_ns: 10_000_000,
        jitter_ns: 300_000,
        jitter_dist: JitterDist::Uniform,
        ..LinkConfig::ideal()
    };
    let mut s = Session::new(format, 64, 0, link, seed);
    s.sender_ppm = ppm;
    s.receiver.set_drift_correction(correct);
    s
}

/// `end`, with what was inserted, skipped and concealed counted from `settled` on.
fn since(settled: &JitterStats, end: JitterStats) -> JitterStats {
    JitterStats {
        inserted_frames: end.inserted_frames - settled.inserted_frames,
        skipped_frames: end.skipped_frames - settled.skipped_frames,
        concealed_frames: end.concealed_frames - settled.concealed_frames,
        ..end
    }
}

fn run(ppm: f64, correct: bool) -> JitterStats {
    let mut s = drifting(ppm, correct, 41);
    // Let the estimator lock and the loop settle, then count what happens after.
    s.run(40_000_000_000);
    let settled = s.receiver.stats().jitter_buffer;
    s.run(80_000_000_000);
    since(&settled, s.receiver.stats().jitter_buffer)
}

#[test]
fn a_fast_sender_is_followed_by_resampling_not_by_dropping_audio() {
    for ppm in [200.0, -200.0] {
        let on = run(ppm, true);
        assert_eq!(
            (on.inserted_frames, on.skipped_frames, on.concealed_frames),
            (0, 0, 0),
            "{ppm} ppm, corrected: {on:?}"
        );
        let measured = on
            .drift
            .estimator
            .ratio_ppm
            .unwrap_or_else(|| panic!("ratio estimated: {on:?}"));
        assert!((measured - ppm).abs() < 5.0, "estimated {measured} ppm for {ppm}");
        // The buffer holds its target within a packet.
        assert!(on.drift.depth_error_ms.abs() < 1.34, "{on:?}");
        let off = run(ppm, false);
        assert!(
            off.inserted_frames + off.skipped_frames > 0,
            "{ppm} ppm without correction needs fallbacks: {off:?}"
        );
    }
}

/// The pitch a listener hears of a steady 1 kHz tone from a sender whose clock drifts
/// `ppm` against the device, over `secs` seconds after 40 s of settling: per 20 ms window
/// (Hann-weighted, demodulated at the tone), the deviation in cents from the median.
fn pitch_trace(ppm: f64, secs: u64, seed: u64) -> (Vec<f64>, JitterStats) {
    const TONE_HZ: f64 = 1000.0;
    const WINDOW: usize = 960;
    let mut s = drifting(ppm, true, seed);
    let mut n = 0u64;
    s.source = Some(Box::new(move |out: &mut [f32]| {
        for f in out.chunks_exact_mut(2) {
            let x = (std::f64::consts::TAU * TONE_HZ * n as f64 / 48_000.0).sin() as f32 * 0.5;
            f.fill(x);
            n += 1;
        }
    }));
    s.run(40_000_000_000);
    let settled = s.receiver.stats().jitter_buffer;
    let from = s.played.len() / 2;
    s.run(secs * 1_000_000_000);
    let stats = since(&settled, s.receiver.stats().jitter_buffer);
    let left: Vec<f64> = s.played[from * 2..]
        .iter()
        .step_by(2)
        .map(|&x| x as f64)
        .collect();
    let w = std::f64::consts::TAU * TONE_HZ / 48_000.0;
    let phases: Vec<f64> = left
        .chunks_exact(WINDOW)
        .enumerate()
        .map(|(k, c)| {
            let (mut re, mut im) = (0.0, 0.0);
            for (i, &x) in c.iter().enumerate() {
                let hann = 0.5 - 0.5 * (std::f64::consts::TAU * i as f64 / WINDOW as f64).cos();
                let t = (k * WINDOW + i) as f64;
                re += x * hann * (w * t).cos();
                im -= x * hann * (w * t).sin();
            }
            im.atan2(re)
        })
        .collect();
    let window_s = WINDOW as f64 / 48_000.0;
    let hz: Vec<f64> = phases
        .windows(2)
        .map(|p| {
            let d =
                (p[1] - p[0] + std::f64::consts::PI).rem_euclid(std::f64::consts::TAU) - std::f64::consts::PI;
            TONE_HZ + d / (std::f64::consts::TAU * window_s)
        })
        .collect();
    let mut sorted = hz.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let cents = hz.iter().map(|f| 1200.0 * (f / median).log2()).collect();
    (cents, stats)
}

/// Drifting clocks walk the packets' phase against the device's periods, and playout
/// slides a whole period now and then to follow it, never faster than keeps the pitch
/// within a cent of the sender's (300 ppm, or three times the walk). What a listener hears
/// of a steady tone: how far its pitch moves, and how much of the time it moves.
#[test]
fn a_drifting_sender_is_heard_at_a_steady_pitch() {
    for (ppm, seed) in [(50.0, 51), (-50.0, 52), (200.0, 53)] {
        let (cents, st) = pitch_trace(ppm, 60, seed);
        let worst = cents.iter().fold(0.0f64, |m, c| m.max(c.abs()));
        let off = |limit: f64| cents.iter().filter(|c| c.abs() > limit).count() as f64 / cents.len() as f64;
        // Excursions: runs of windows more than 1 cent off.
        let glides = cents
            .windows(2)
            .filter(|w| w[0].abs() <= 1.0 && w[1].abs() > 1.0)
            .count();
        eprintln!(
            "{ppm:+} ppm: worst {worst:.2} cents; off by more than 0.5 cent {:.1} % of the time, 1 cent {:.1} %, 3 cents {:.1} %; {glides} excursions past 1 cent in 60 s; {st:?}",
            100.0 * off(0.5),
            100.0 * off(1.0),
            100.0 * off(3.0),
        );
        assert_eq!(
            (st.inserted_frames, st.skipped_frames, st.concealed_frames),
            (0, 0, 0),
            "{ppm} ppm: {st:?}"
        );
        // A slide is at most 600 ppm off the clock (1.04 cents; 300 ppm, 0.52 cents, for
        // clocks within 100 ppm); playing faster to give latency back would be 8.7 cents.
        assert!(worst < 1.25, "{ppm} ppm: {worst:.2} cents");
        assert!(
            off(1.0) < 0.02,
            "{ppm} ppm: more than a cent off {:.1} % of the time",
            100.0 * off(1.0)
        );
    }
}
