//! The receiver with drift correction on follows a sender whose clock runs 200 ppm fast
//! without inserting or skipping a single period; with it off, the same session needs
//! those fallbacks to hold the buffer.

mod common;

use common::Session;
use netjam_engine::link::{JitterDist, LinkConfig};
use netjam_engine::wire::{AudioFormat, Codec};

fn run(ppm: f64, correct: bool) -> netjam_engine::jitter::JitterStats {
    let format = AudioFormat::new(Codec::F32, 48_000, 2).expect("format");
    let link = LinkConfig {
        delay_ns: 10_000_000,
        jitter_ns: 300_000,
        jitter_dist: JitterDist::Uniform,
        ..LinkConfig::ideal()
    };
    let mut s = Session::new(format, 64, 0, link, 41);
    s.sender_ppm = ppm;
    s.receiver.set_drift_correction(correct);
    // Let the estimator lock and the loop settle, then count what happens after.
    s.run(40_000_000_000);
    let settled = s.receiver.stats().jitter_buffer;
    s.run(80_000_000_000);
    let end = s.receiver.stats().jitter_buffer;
    netjam_engine::jitter::JitterStats {
        inserted_frames: end.inserted_frames - settled.inserted_frames,
        skipped_frames: end.skipped_frames - settled.skipped_frames,
        concealed_frames: end.concealed_frames - settled.concealed_frames,
        ..end
    }
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
