//! Latency given back after the path gets 2 ms shorter, with drift correction on, for a
//! signal without a period (a chord of five unrelated partials, like a dense mix or JACK's
//! `jack_iodelay` test signal) and for a held note (a 440 Hz sine).
//!
//! The excess, 2 ms, is shorter than a 440 Hz period (2.27 ms): no cut of at most the
//! excess keeps the note's phase, so the note's excess is drained by the resampler at the
//! pitch limit (0.87 cents) over seconds, moving into that bend and out of it slowly enough
//! that no 200 ms window hears a step of pitch. Where the shorter path also frees a period
//! of the arrivals' phase (playout follows it), the excess can hold a whole period of the
//! note, and that is cut at once, keeping the phase. The chord has no phase to keep and no cleaner
//! cut coming: it is cut (cross-faded) within a few shrink windows, so its latency is back
//! within a second. Real process, virtual time: a sender, a link and a receiver at
//! 48 kHz, 64-frame packets and periods, 10 ms ± 100 µs. Each case prints its figures
//! (`--nocapture`).

mod common;

use common::{CaptureSource, Session};
use netjam_engine::delay::LatencyPolicy;
use netjam_engine::link::{JitterDist, LinkConfig, LinkSchedule};
use netjam_engine::listen::{listen, ListenSummary, Tones};
use netjam_engine::wire::{AudioFormat, Codec};

const RATE: u32 = 48_000;
const EVENT_AT_NS: u64 = 4_000_000_000;
const END_NS: u64 = 10_000_000_000;
/// Back: the playout error the drift loop sees (smoothed) stays within this.
const BACK_MS: f64 = 0.5;
/// A chord's latency is back within this after the step.
const CHORD_BACK_NS: u64 = 1_000_000_000;

/// A sum of sines at `hz` (amplitude 0.08 each), phases spread.
fn partials(hz: &'static [f64]) -> CaptureSource {
    let mut n = 0u64;
    Box::new(move |out: &mut [f32]| {
        for x in out.iter_mut() {
            let t = n as f64 / RATE as f64;
            *x = hz
                .iter()
                .enumerate()
                .map(|(k, f)| 0.08 * (2.0 * std::f64::consts::PI * f * t + k as f64 * 1.3).sin())
                .sum::<f64>() as f32;
            n += 1;
        }
    })
}

const CHORD: &[f64] = &[211.3, 523.9, 1187.3, 2011.9, 3307.1];
/// A held A4 with its third harmonic: the harmonic shows a step of pitch that the
/// fundamental alone hides (a 200 ms window hears it in proportion to the frequency).
const NOTE: &[f64] = &[440.0, 1320.0];

/// From the step until the playout error stays within [`BACK_MS`] (`None`: not by the end),
/// the frames skipped after the step, the largest drift correction seen after it (ppm), and
/// what was played.
fn run(source: CaptureSource, seed: u64) -> (Option<u64>, u64, f64, Vec<f32>) {
    let format = AudioFormat::new(Codec::F32, RATE, 1).expect("format");
    let link = LinkConfig {
        delay_ns: 10_000_000,
        jitter_ns: 100_000,
        jitter_dist: JitterDist::Uniform,
        ..LinkConfig::ideal()
    };
    let mut s = Session::new(format, 64, 0, link, seed);
    s.receiver.set_output_format(format);
    s.receiver.set_drift_correction(true);
    s.receiver.set_latency_policy(LatencyPolicy::Tight);
    s.up.set_schedule(LinkSchedule::parse("4s:delay=-2ms").expect("event spec"));
    s.up.set_event_origin(0);
    s.source = Some(source);
    s.run(EVENT_AT_NS);
    let skipped_before = s.receiver.stats().jitter_buffer.skipped_frames;
    let mut last_off = None;
    let mut max_ppm = 0.0f64;
    while s.now < END_NS {
        s.run(20_000_000);
        let jb = s.receiver.stats().jitter_buffer;
        if jb.drift.depth_error_ms.abs() > BACK_MS {
            last_off = Some(s.now);
        }
        max_ppm = max_ppm.max(jb.drift.correction_ppm.abs());
    }
    let skipped = s.receiver.stats().jitter_buffer.skipped_frames - skipped_before;
    let back = match last_off {
        None => Some(0),
        Some(t) if t + 1_000_000_000 < END_NS => Some(t - EVENT_AT_NS),
        Some(_) => None,
    };
    (back, skipped, max_ppm, std::mem::take(&mut s.played))
}

fn ms(ns: Option<u64>) -> String {
    ns.map_or("not by the end".into(), |ns| format!("{:.2} s", ns as f64 / 1e9))
}

#[test]
fn a_chord_is_cut_back_to_its_latency_at_once() {
    for seed in [1, 2, 3] {
        let (back, skipped, ppm, _) = run(partials(CHORD), seed);
        println!(
            "chord, seed {seed}: back after {}, {skipped} frames cut, correction up to {ppm:.0} ppm",
            ms(back)
        );
        assert!(
            back.is_some_and(|ns| ns <= CHORD_BACK_NS),
            "seed {seed}: a chord's 2 ms excess is back after {} (at most {} s)",
            ms(back),
            CHORD_BACK_NS as f64 / 1e9
        );
        assert!(
            skipped >= 48,
            "seed {seed}: the excess was cut ({skipped} frames)"
        );
    }
}

#[test]
fn a_held_note_is_drained_by_the_resampler_within_its_pitch_limit() {
    let (back, skipped, ppm, played) = run(partials(NOTE), 1);
    // The note as a listener hears it from 2 s on, the step and the drain included.
    let heard: ListenSummary = listen(&played, RATE, &Tones::present(NOTE).skip(2.0))
        .expect("listen")
        .summary;
    println!(
        "440 Hz, seed 1: back after {}, {skipped} frames cut, correction up to {ppm:.0} ppm; \
         pitch worst {:+.2} cents, {} glitch windows of {}",
        ms(back),
        heard.worst_cents,
        heard.glitch_windows(),
        heard.windows
    );
    // The drain bends the note by under a cent, and moves into that bend and out of it
    // slowly enough that no 200 ms window hears a step of pitch (a step to the limit reads
    // as a residual of -25 dB).
    assert!(heard.worst_cents.abs() <= 1.0, "{heard:?}");
    assert_eq!(heard.glitch_windows(), 0, "{heard:?}");
    // No cut shorter than the note's period keeps its phase: what is cut is whole periods
    // (109.09 frames), where the shorter path freed a period of the arrivals' phase beside
    // the 2 ms, or nothing, and the correction stays within 0.87 cents.
    let periods = skipped as f64 / (RATE as f64 / 440.0);
    assert!(
        (periods - periods.round()).abs() * (RATE as f64 / 440.0) <= 2.0,
        "a 440 Hz note was cut {skipped} frames, not whole periods"
    );
    assert!(ppm <= 500.0 + 1.0, "correction {ppm:.0} ppm bends the note");
    assert!(back.is_some(), "the resampler drains the excess by the end");
}
