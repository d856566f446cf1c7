//! A stream at another sample rate than the device that plays it: 44.1 kHz into 48 kHz and
//! back is converted by the drift corrector's resampler and heard in tune, whole; a rate
//! too far to convert is refused and said so.

mod common;

use common::Session;
use netjam_engine::link::{JitterDist, LinkConfig};
use netjam_engine::listen::{listen, Tones};
use netjam_engine::receiver::ReceiverEvent;
use netjam_engine::wire::{AudioFormat, Codec};

const TONE_HZ: f64 = 1000.0;

/// A sender at `stream_rate` playing a steady tone to a device at `device_rate`, over
/// 10 ms ± 300 µs, for `secs` seconds.
fn converted(stream_rate: u32, device_rate: u32, secs: u64) -> Session {
    let format = AudioFormat::new(Codec::L24, stream_rate, 2).expect("format");
    let link = LinkConfig {
        delay_ns: 10_000_000,
        jitter_ns: 300_000,
        jitter_dist: JitterDist::Uniform,
        ..LinkConfig::ideal()
    };
    let mut s = Session::new(format, 64, 0, link, 7);
    s.device_rate = Some(device_rate);
    s.receiver.set_output_rate(device_rate);
    s.receiver.set_drift_correction(true);
    let mut n = 0u64;
    s.source = Some(Box::new(move |out: &mut [f32]| {
        for f in out.chunks_exact_mut(2) {
            let x = (std::f64::consts::TAU * TONE_HZ * n as f64 / stream_rate as f64).sin() as f32 * 0.5;
            f.fill(x);
            n += 1;
        }
    }));
    s.run(secs * 1_000_000_000);
    s
}

#[test]
fn a_stream_at_44_1_khz_is_heard_in_tune_on_a_48_khz_device_and_back() {
    for (stream_rate, device_rate) in [(44_100, 48_000), (48_000, 44_100), (88_200, 96_000)] {
        let s = converted(stream_rate, device_rate, 20);
        let left: Vec<f32> = s.played.iter().step_by(2).copied().collect();
        // The device played its own rate: 20 s of it, within a period.
        let want = 20 * device_rate as usize;
        assert!(
            left.len().abs_diff(want) <= 64,
            "{stream_rate} -> {device_rate}: {} frames played, want {want}",
            left.len()
        );
        let heard = listen(
            &left,
            device_rate,
            &Tones::present(&[TONE_HZ]).absent(&[TONE_HZ * 1.1]).skip(3.0),
        )
        .expect("a tone to listen to");
        let st = s.receiver.stats();
        let jb = st.jitter_buffer;
        eprintln!(
            "{stream_rate} Hz stream on a {device_rate} Hz device: {}; added latency {:.2} ms; discontinuities {:?}",
            heard.summary, jb.added_latency_ms, jb.discontinuities
        );
        assert!(
            s.events.iter().any(
                |e| matches!(e, ReceiverEvent::Converting { rate, output_rate, .. }
                if *rate == stream_rate && *output_rate == device_rate)
            ),
            "{stream_rate} -> {device_rate}: the conversion is announced: {:?}",
            s.events
        );
        assert_eq!(
            st.rate_mismatch, 0,
            "{stream_rate} -> {device_rate}: nothing refused"
        );
        // In tune: the clocks are nominal, so the tone is where it was sent, to the cent.
        assert!(
            heard.summary.worst_cents.abs() < 0.5,
            "{stream_rate} -> {device_rate}: {}",
            heard.summary
        );
        // Whole: no window with a splice, a concealment or a level step after settling.
        assert_eq!(
            heard.summary.glitch_windows(),
            0,
            "{stream_rate} -> {device_rate}: {}",
            heard.summary
        );
        assert!(
            (heard.summary.present[0].median_db - (-6.02)).abs() < 0.5,
            "{stream_rate} -> {device_rate}: level {}",
            heard.summary
        );
        // A period and the target on top of the link, as for any resampled stream that
        // cannot follow the packets' phase, and a converter's delay.
        assert!(
            jb.added_latency_ms < 4.0,
            "{stream_rate} -> {device_rate}: {:.2} ms added",
            jb.added_latency_ms
        );
    }
}

#[test]
fn a_rate_too_far_to_convert_is_refused_and_said_so() {
    let s = converted(96_000, 48_000, 2);
    let st = s.receiver.stats();
    assert!(st.rate_mismatch > 0, "{st:?}");
    assert!(
        s.events.iter().any(|e| matches!(
            e,
            ReceiverEvent::RateMismatch {
                rate: 96_000,
                output_rate: 48_000,
                ..
            }
        )),
        "{:?}",
        s.events
    );
    assert!(s.played.iter().all(|&x| x == 0.0), "nothing of it plays");
}
