//! A clean link: every codec and channel count arrives bit-exact, in order, with the
//! receiver adding about one period plus its target on top of the wire.

mod common;

use common::Session;
use netjam_engine::drift::RESAMPLER_DELAY_FRAMES;
use netjam_engine::jitter::BIT_EXACT_MIN_TARGET_NS;
use netjam_engine::link::LinkConfig;
use netjam_engine::wire::{AudioFormat, Codec};

fn quantize(codec: Codec, x: f32) -> f32 {
    match codec {
        Codec::L16 => (x * 32768.0).round().clamp(-32768.0, 32767.0) / 32768.0,
        Codec::L24 => (x * 8_388_608.0).round().clamp(-8_388_608.0, 8_388_607.0) / 8_388_608.0,
        Codec::F32 | Codec::Opus => x,
    }
}

#[test]
fn every_codec_and_channel_count_is_bit_exact_after_lock() {
    for codec in [Codec::L16, Codec::L24, Codec::F32] {
        for channels in [1u16, 2, 8] {
            let format = AudioFormat::new(codec, 48_000, channels).expect("format");
            let link = LinkConfig {
                delay_ns: 19_000_000,
                ..LinkConfig::ideal()
            };
            let mut s = Session::new(format, 64, 0, link, 7);
            s.run(1_000_000_000);
            let ch = channels as usize;
            for x in s.sent.iter_mut() {
                *x = quantize(codec, *x);
            }
            let offset = s
                .alignment()
                .unwrap_or_else(|| panic!("{codec} x{channels}: sent audio not found"));
            // From the first played frame of the stream on, every frame equals the sent one.
            let start = s
                .played
                .chunks(ch)
                .position(|f| f.iter().any(|x| *x != 0.0))
                .expect("audio");
            let sent_start = start - offset;
            let n = s.played.len() / ch - start;
            assert_eq!(
                &s.played[start * ch..],
                &s.sent[sent_start * ch..(sent_start + n) * ch],
                "{codec} x{channels}"
            );
            let st = s.receiver.stats();
            assert_eq!(st.jitter_buffer.concealment_events, 0, "{st:?}");
            assert_eq!(st.lost, 0);
            assert_eq!(st.format, Some(format));
        }
    }
}

#[test]
fn added_latency_is_about_one_period_plus_the_target_and_rtcp_measures_the_round_trip() {
    let format = AudioFormat::new(Codec::L16, 48_000, 2).expect("format");
    let link = LinkConfig {
        delay_ns: 19_000_000,
        ..LinkConfig::ideal()
    };
    // With drift correction (as `jam` plays): one packet (1.33 ms), the resampler's delay
    // and at most 0.5 ms of target.
    let mut d = Session::new(format, 64, 0, link.clone(), 1);
    d.receiver.set_drift_correction(true);
    d.run(5_000_000_000);
    let jb = d.receiver.stats().jitter_buffer;
    let resampler_ms = RESAMPLER_DELAY_FRAMES as f64 * 1e3 / 48_000.0;
    assert!(jb.added_latency_ms <= 1.334 + resampler_ms + 0.5, "{jb:?}");
    // Bit-exact (as `recv` plays by default): one packet plus its floor of cover.
    let mut s = Session::new(format, 64, 0, link, 1);
    s.run(5_000_000_000);
    let st = s.receiver.stats();
    let floor_ms = BIT_EXACT_MIN_TARGET_NS as f64 / 1e6;
    assert!(
        st.jitter_buffer.added_latency_ms <= 1.334 + floor_ms + 0.1,
        "{:?}",
        st.jitter_buffer
    );
    assert!(st.jitter_buffer.target_ms >= floor_ms, "{:?}", st.jitter_buffer);
    let tx = s.sender.stats();
    let rtt = tx.rtt_ms.expect("rtt from receiver reports");
    assert!((rtt - 38.0).abs() < 0.2, "rtt {rtt}");
    assert_eq!(tx.remote_cumulative_lost, Some(0));
    assert!(s.sender.stats().rtcp_received >= 3);
}
