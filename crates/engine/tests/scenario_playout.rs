//! Playout at every device phase: a real sender, link and receiver in virtual time, 48 kHz
//! stereo, 120-frame packets played in 64-frame device periods, with the device's first
//! period placed at 16 phases across one period against the sender's packets and a few
//! amounts of link jitter (50–300 µs).
//!
//! Bit-exact (no drift correction), the output is white noise compared to what was sent by
//! alignment ([`netjam_engine::align`]): it must be the input from its first frame in one
//! segment, except where the receiver's discontinuity log has an entry, and the log must
//! own up to every join the alignment finds. With drift correction the output is resampled
//! and cannot be compared sample by sample; there the log's counts are bounded, with a
//! sender whose clock is 100 ppm off either way.
//!
//! Every run prints its figures (`--nocapture`).

mod common;

use common::Session;
use netjam_engine::align::{align, AlignOptions, Alignment};
use netjam_engine::discontinuity::{Discontinuity, DiscontinuityTotals};
use netjam_engine::jitter::JitterStats;
use netjam_engine::link::{JitterDist, LinkConfig};
use netjam_engine::synth::{Synth, SynthKind};
use netjam_engine::time::frames_to_ns;
use netjam_engine::wire::{AudioFormat, Codec};

const RATE: u32 = 48_000;
const PACKET: u32 = 120;
const PERIOD: usize = 64;
const PHASES: u64 = 16;
const SECONDS: u64 = 30;
/// Discontinuities before this much output are the start-up's (the estimator learning
/// the jitter); the bounds below count what follows.
const WARM_UP_S: f64 = 2.0;

fn format() -> AudioFormat {
    AudioFormat::new(Codec::L16, RATE, 2).expect("format")
}

fn link(jitter_ns: u64) -> LinkConfig {
    LinkConfig {
        delay_ns: 19_000_000,
        jitter_ns,
        jitter_dist: JitterDist::Uniform,
        ..LinkConfig::ideal()
    }
}

fn quantize(x: f32) -> f32 {
    (x * 32768.0).round().clamp(-32768.0, 32767.0) / 32768.0
}

struct Outcome {
    stats: JitterStats,
    log: Vec<Discontinuity>,
    /// Bit-exact runs only.
    alignment: Option<Alignment>,
}

impl Outcome {
    fn totals(&self) -> DiscontinuityTotals {
        self.stats.discontinuities
    }

    /// Logged discontinuities that began after the warm-up.
    fn after_warm_up(&self) -> usize {
        let from = (WARM_UP_S * RATE as f64) as u64;
        self.log.iter().filter(|d| d.output_frame >= from).count()
    }
}

fn session(jitter_ns: u64, phase: u64, drift: bool, ppm: f64, seed: u64) -> Outcome {
    let mut s = Session::new(format(), PACKET, 0, link(jitter_ns), seed);
    s.synth = Synth::new(SynthKind::Noise, RATE, 2, seed);
    s.period = PERIOD;
    s.sender_ppm = ppm;
    s.receiver.set_drift_correction(drift);
    let period_ns = frames_to_ns(PERIOD as u64, RATE);
    s.set_play_phase(phase * period_ns / PHASES);
    s.run(SECONDS * 1_000_000_000);
    let stats = s.receiver.stats().jitter_buffer;
    let log: Vec<Discontinuity> = s.receiver.recent_discontinuities().copied().collect();
    assert_eq!(
        log.len() as u64,
        stats.discontinuities.events,
        "the log holds every entry of a short run"
    );
    let alignment = (!drift).then(|| {
        let sent: Vec<f32> = s.sent.iter().map(|x| quantize(*x)).collect();
        align(&sent, &s.played, 2, AlignOptions::default())
    });
    Outcome {
        stats,
        log,
        alignment,
    }
}

/// The bit-exact checks: one segment from frame 0 except where the log says otherwise,
/// and every join found is in the log, near where the log put it.
fn check_bit_exact(o: &Outcome, label: &str) {
    let a = o.alignment.as_ref().expect("alignment");
    let t = o.totals();
    let first = a
        .segments
        .first()
        .unwrap_or_else(|| panic!("{label}: nothing matched\n{a}"));
    if o.log.is_empty() {
        assert_eq!(
            (a.segments.len(), first.in_start, a.head_unmatched),
            (1, 0, 0),
            "{label}: nothing logged, so the output is the input whole\n{a}"
        );
    }
    // The stream starts with the first frame sent, unless the log has the start.
    let logged_at_start = o
        .log
        .first()
        .is_some_and(|d| d.output_frame <= (a.idle + PACKET as usize) as u64);
    assert!(
        (first.in_start == 0 && a.head_unmatched == 0) || logged_at_start,
        "{label}: playout started at input frame {} ({} unmatched)\n{a}",
        first.in_start,
        a.head_unmatched
    );
    assert!(
        t.events >= a.discontinuities() as u64,
        "{label}: alignment finds {} discontinuities, the stats count {t:?}\n{a}",
        a.discontinuities()
    );
    // Each join lies in or right after a logged stretch (a concealed stretch that
    // happens to match nothing at its edges moves the join by a few frames).
    for j in &a.joins {
        let start = j.at_out - j.out_gap;
        let owned = o.log.iter().any(|d| {
            let from = d.output_frame.saturating_sub(PERIOD as u64);
            let to = d.output_frame + d.frames.max(1) + PERIOD as u64;
            (from..=to).contains(&(start as u64))
        });
        assert!(
            owned,
            "{label}: join {j:?} is in no logged stretch: {:?}\n{a}",
            o.log
        );
    }
    assert_eq!(a.repeated_frames(), 0, "{label}: nothing is played twice\n{a}");
}

fn report(label: &str, o: &Outcome) {
    let t = o.totals();
    let found = o.alignment.as_ref().map_or(String::from("-"), |a| {
        format!("{} ({} seg)", a.discontinuities(), a.segments.len())
    });
    eprintln!(
        "{label}: logged {} (after {WARM_UP_S} s: {}) [concealed {} inserted {} skipped {}; loss {} late {} growth {} shrink {}], \
         found by alignment {found}; target {:.2} ms, added latency mean {:.2} ms max {:.2} ms",
        t.events,
        o.after_warm_up(),
        t.concealed_events,
        t.inserted_events,
        t.skipped_events,
        t.loss,
        t.late,
        t.growth,
        t.shrink,
        o.stats.target_ms,
        o.stats.added_latency_ms,
        o.stats.added_latency_max_ms,
    );
}

/// 16 phases at 300 µs of jitter, bit-exact: at most two discontinuities per 30 s after
/// the warm-up, every one of them logged.
#[test]
fn bit_exact_playout_is_whole_at_every_device_phase() {
    let mut worst = 0;
    let mut total = 0;
    for phase in 0..PHASES {
        let label = format!("bit-exact, jitter 300 us, phase {phase:>2}/{PHASES}");
        let o = session(300_000, phase, false, 0.0, 100 + phase);
        report(&label, &o);
        check_bit_exact(&o, &label);
        worst = worst.max(o.after_warm_up());
        total += o.totals().events;
    }
    eprintln!("bit-exact, 300 us: worst phase {worst} discontinuities after warm-up, {total} logged in all");
    assert!(
        worst <= 2,
        "at most 2 discontinuities per 30 s after warm-up, worst phase had {worst}"
    );
}

/// Less jitter, a few phases each: the same checks, and no more discontinuities than at
/// 300 µs.
#[test]
fn bit_exact_playout_at_low_jitter() {
    for jitter in [50_000u64, 150_000] {
        for phase in [5, 11] {
            let label = format!(
                "bit-exact, jitter {} us, phase {phase:>2}/{PHASES}",
                jitter / 1000
            );
            let o = session(jitter, phase, false, 0.0, 200 + phase + jitter / 1000);
            report(&label, &o);
            check_bit_exact(&o, &label);
            assert!(o.after_warm_up() <= 2, "{label}: {:?}", o.log);
        }
    }
}

/// Drift correction on, sender 100 ppm fast and slow, a sweep of phases: the resampler
/// holds the buffer; what the log records after the warm-up is bounded as above.
#[test]
fn drift_corrected_playout_at_every_device_phase() {
    let mut worst = 0;
    for ppm in [100.0, -100.0] {
        for phase in (0..PHASES).step_by(4).map(|p| p + 2) {
            let label =
                format!("drift-corrected, sender {ppm:+} ppm, jitter 300 us, phase {phase:>2}/{PHASES}");
            let o = session(300_000, phase, true, ppm, 300 + phase);
            report(&label, &o);
            let measured = o.stats.drift.estimator.ratio_ppm;
            eprintln!(
                "    estimated {measured:?} ppm, loop {:+.1} ppm",
                o.stats.drift.correction_ppm
            );
            worst = worst.max(o.after_warm_up());
            assert!(o.after_warm_up() <= 2, "{label}: {:?}", o.log);
            // The sender's clock is found.
            let m = measured.unwrap_or_else(|| panic!("{label}: no ratio estimated"));
            assert!((m - ppm).abs() < 5.0, "{label}: estimated {m} ppm");
        }
    }
    eprintln!("drift-corrected, 300 us: worst phase {worst} discontinuities after warm-up");
}
