//! A compressed stream end to end, with a stand-in codec: packets are framed like Opus (a
//! CELT TOC byte of the packet's duration) and carry float samples, so what is played can
//! be compared exactly with what was sent. The decoder records every call, so the tests
//! see that it is fed in order, once per packet, and asked to conceal only what never came
//! in time — across 64-frame device periods and 2.5 ms packets, jitter, reordering, loss
//! and RFC 2198 redundancy.

mod common;

use std::sync::{Arc, Mutex};

use common::Session;
use netjam_engine::codec::{opus_packet_frames, CodecError, DecoderFactory, FrameDecoder, FrameEncoder};
use netjam_engine::link::{LinkConfig, LossModel};
use netjam_engine::wire::{decode, encode, AudioFormat, Codec};

/// TOC byte of a CELT-only packet of `frames` frames at 48 kHz (configs 16..19).
fn toc(frames: usize) -> u8 {
    let config = match frames {
        120 => 16,
        240 => 17,
        480 => 18,
        _ => 19,
    };
    config << 3
}

#[derive(Debug)]
struct FloatEncoder {
    channels: usize,
}

impl FrameEncoder for FloatEncoder {
    fn encode(&mut self, pcm: &[f32], out: &mut [u8]) -> Result<usize, CodecError> {
        let frames = pcm.len() / self.channels;
        if out.len() < 1 + pcm.len() * 4 {
            return Err(CodecError::BufferTooSmall);
        }
        out[0] = toc(frames);
        Ok(1 + encode(Codec::F32, pcm, &mut out[1..]))
    }
    fn lookahead_frames(&self) -> u32 {
        0
    }
}

/// What the decoder was asked to do, in order: `Some(first frame's first sample)` for a
/// packet, `None` for concealment of that many frames.
#[derive(Debug, Default)]
struct Log {
    calls: Vec<(Option<f32>, usize)>,
}

#[derive(Debug)]
struct FloatDecoder {
    channels: usize,
    log: Arc<Mutex<Log>>,
}

impl FrameDecoder for FloatDecoder {
    fn decode(&mut self, packet: Option<&[u8]>, out: &mut [f32]) -> Result<usize, CodecError> {
        let mut log = self.log.lock().expect("log");
        match packet {
            Some(p) => {
                let frames = opus_packet_frames(p).map_err(|_| CodecError::Rejected(-4))? as usize;
                let n = decode(Codec::F32, &p[1..], &mut out[..frames * self.channels]);
                log.calls.push((Some(out[0]), frames));
                Ok(n / self.channels)
            }
            None => {
                // Concealment: a recognisable constant.
                out.fill(0.125);
                log.calls.push((None, out.len() / self.channels));
                Ok(out.len() / self.channels)
            }
        }
    }
    fn reset(&mut self) {}
}

#[derive(Debug, Default)]
struct Factory {
    log: Arc<Mutex<Log>>,
}

impl DecoderFactory for Factory {
    fn decoder(&self, format: AudioFormat) -> Result<Box<dyn FrameDecoder>, String> {
        Ok(Box::new(FloatDecoder {
            channels: format.channels as usize,
            log: self.log.clone(),
        }))
    }
}

fn session(link: LinkConfig, redundancy: usize, seed: u64) -> (Session, Arc<Mutex<Log>>) {
    let format = AudioFormat::new(Codec::Opus, 48_000, 2).expect("format");
    let factory = Factory::default();
    let log = factory.log.clone();
    let s = Session::coded(
        format,
        120,
        redundancy,
        link,
        seed,
        Some(Box::new(FloatEncoder { channels: 2 })),
        Some(Arc::new(factory)),
    );
    (s, log)
}

fn link(jitter_ns: u64, reorder: f64, loss: LossModel) -> LinkConfig {
    LinkConfig {
        delay_ns: 19_000_000,
        jitter_ns,
        reorder,
        loss,
        ..LinkConfig::ideal()
    }
}

/// Decoded packets come in strictly increasing media order, one per packet, and never
/// overlap a concealed stretch: each call starts where the previous one ended.
fn assert_in_order(log: &Log, sent: &[f32]) {
    let mut at = None::<usize>;
    for (first, frames) in &log.calls {
        if let Some(x) = first {
            // Find the packet's frame index in what was sent, from its first sample.
            let start = at.unwrap_or(0);
            let found = (start..sent.len() / 2)
                .find(|&f| sent[f * 2] == *x)
                .unwrap_or_else(|| panic!("decoded a packet not in order after frame {start}"));
            if let Some(a) = at {
                assert_eq!(found, a, "a decode did not continue where the last call ended");
            }
            at = Some(found + frames);
        } else if let Some(a) = at {
            at = Some(a + frames);
        }
    }
}

#[test]
fn a_clean_link_plays_every_frame_exactly_with_64_frame_periods_and_2_5_ms_packets() {
    let (mut s, log) = session(link(0, 0.0, LossModel::None), 0, 41);
    s.run(3_000_000_000);
    let st = s.receiver.stats();
    assert!(s.alignment().is_some(), "what was sent plays bit-exact: {st:?}");
    assert_eq!(st.jitter_buffer.concealed_frames, 0, "{st:?}");
    assert_eq!(st.decoder.decoded_packets, st.received, "{st:?}");
    assert_in_order(&log.lock().expect("log"), &s.sent);
}

#[test]
fn reordered_packets_are_decoded_in_order_and_nothing_is_concealed() {
    let (mut s, log) = session(link(1_000_000, 0.1, LossModel::None), 0, 42);
    s.run(5_000_000_000);
    let st = s.receiver.stats();
    assert!(st.reordered > 20, "the link reordered: {st:?}");
    assert!(s.alignment().is_some(), "{st:?}");
    assert_eq!(st.decoder.late_packets, 0, "{st:?}");
    assert_in_order(&log.lock().expect("log"), &s.sent);
}

#[test]
fn loss_is_concealed_by_the_decoder_in_order_never_by_the_buffer() {
    let (mut s, log) = session(link(300_000, 0.0, LossModel::bursty(0.02, 2.0)), 0, 43);
    s.run(10_000_000_000);
    let st = s.receiver.stats();
    let lost = s.up.stats().lost;
    assert!(lost > 50, "lost {lost}");
    // Every lost packet's 120 frames were concealed by the decoder; a loss at the very
    // end may not have been due yet.
    let c = st.decoder.concealed_frames;
    assert!(
        c >= (lost - 2) * 120 && c <= lost * 120,
        "concealed {c} for {lost} lost: {st:?}"
    );
    // The buffer's own concealer runs only while playout waits for a grown target
    // (inserted frames), never for a lost packet.
    let jb = &st.jitter_buffer;
    assert_eq!(jb.concealed_frames, c + jb.inserted_frames, "{st:?}");
    assert!(jb.discontinuities.inserted_events <= 2, "{st:?}");
    let log = log.lock().expect("log");
    assert_in_order(&log, &s.sent);
    // The played stream carries the decoder's concealment where packets were lost.
    let concealed = s.played.iter().filter(|&&x| x == 0.125).count() as u64;
    assert!(
        concealed >= (lost - 2) * 120 * 2,
        "{concealed} samples of concealment played"
    );
}

#[test]
fn redundancy_rebuilds_isolated_losses_before_the_decoder_needs_them() {
    let (mut s, log) = session(link(300_000, 0.0, LossModel::Bernoulli { p: 0.02 }), 1, 44);
    s.run(10_000_000_000);
    let st = s.receiver.stats();
    let lost = s.up.stats().lost;
    assert!(lost > 50, "lost {lost}");
    // Only back-to-back losses (2 % of losses) defeat one redundant copy.
    assert!(
        st.decoder.concealment_events <= lost / 10,
        "{} concealments for {lost} lost: {st:?}",
        st.decoder.concealment_events
    );
    let jb = &st.jitter_buffer;
    assert_eq!(
        jb.concealed_frames,
        st.decoder.concealed_frames + jb.inserted_frames,
        "{st:?}"
    );
    assert!(jb.discontinuities.inserted_events <= 2, "{st:?}");
    assert_in_order(&log.lock().expect("log"), &s.sent);
}

/// The far side's device losing a packet's time four times, 1.5 s apart, with its slip
/// guard on: each loss leaves a gap in the coded stream's media time. The receiver finds
/// it from the packets' TOC bytes before decoding, as it does for linear PCM: the late
/// packets before it leave the delay estimate and playout jumps as far as it waited for
/// them, and the latency is where it was before the losses, bit-exact and resampled.
/// Resampled, before the gaps were found: no jump, and the target grown for the late
/// packets held (2.02 ms of added latency after, against 1.85 before; now 1.90).
#[test]
fn a_far_device_losing_time_leaves_gaps_a_coded_stream_finds_and_pays_once() {
    let mut failures = Vec::new();
    for drift in [false, true] {
        let (mut s, log) = session(link(0, 0.0, LossModel::None), 0, 45);
        s.receiver.set_drift_correction(drift);
        let mut at = 2_000_000_000u64;
        s.capture_lost = Some(Box::new(move |due| {
            if due >= at && at <= 6_500_000_000 {
                at += 1_500_000_000;
                2_500_000
            } else {
                0
            }
        }));
        s.slip = Some(netjam_engine::slip::SlipGuard::new(48_000));
        s.run(1_900_000_000);
        let before = s.receiver.stats().jitter_buffer.added_latency_recent_ms;
        s.run(7_100_000_000);
        let st = s.receiver.stats();
        let jb = &st.jitter_buffer;
        let skipped = s.sender.stats().skipped_frames;
        assert_eq!(s.lost.len(), 4, "the device lost time four times");
        assert!(
            (4 * 110..=4 * 240).contains(&skipped),
            "the guard skipped {skipped} frames"
        );
        let line = format!(
            "drift {drift}: the sender skipped {skipped} frames; the receiver found {} gaps of {} frames; \
             added latency {before:.2} ms before, {:.2} ms after; {} concealments ({} of far gaps, {} losses), {} waits, {} jumps; \
             the decoder concealed {} frames, {} packets came after it had",
            jb.sender_gaps,
            jb.sender_gap_frames,
            jb.added_latency_recent_ms,
            jb.concealment_events,
            jb.discontinuities.sender_gap_concealed,
            jb.discontinuities.loss,
            jb.discontinuities.inserted_events,
            jb.discontinuities.sender_lost,
            st.decoder.concealed_frames,
            st.decoder.late_packets,
        );
        eprintln!("{line}");
        // Resampled, each gap is jumped as far as playout waited for the late packets
        // before it (two of them, come too late for the decoder, which concealed them).
        // Bit-exact, each gap is concealed, and said to be the far device's.
        let d = &jb.discontinuities;
        let jumps_wrong = if drift {
            d.sender_lost != 4 || st.decoder.late_packets > 12
        } else {
            d.sender_lost != 0 || d.sender_gap_concealed != 4 || d.loss != 0 || st.decoder.late_packets != 0
        };
        if jb.sender_gaps != 4
            || jb.sender_gap_frames != skipped
            || jb.added_latency_recent_ms > before + 0.5
            || jumps_wrong
        {
            failures.push(line);
        }
        assert_in_order(&log.lock().expect("log"), &s.sent);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
