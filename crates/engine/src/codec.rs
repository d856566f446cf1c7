//! Compressed codecs (Opus): the encoder and decoder interface, packet durations, and the
//! [`DecodeQueue`] that feeds a stateful decoder in order and lets it conceal what is lost.
//!
//! Linear PCM is converted sample by sample ([`crate::wire::encode`]); a codec like Opus
//! keeps state from packet to packet, so its packets must be decoded once each, in order,
//! and a lost one must be concealed by the decoder itself (its packet-loss concealment
//! continues the signal it knows and hands over smoothly to the next packet). Packets
//! arrive out of order and late, so decoding cannot simply happen on arrival:
//!
//! * a packet that continues the decoded stream is decoded at once, and so is every held
//!   packet it unblocks;
//! * a packet after a gap is held;
//! * when the jitter buffer reads frames nobody has delivered, at the moment they are
//!   played, the decoder conceals exactly that gap ([`DecodeQueue::conceal_until`]), and
//!   decoding goes on from the next held packet. A packet arriving after its gap was
//!   concealed is late.
//!
//! The queue hands decoded audio to a sink (the jitter buffer, which owns the queue):
//! `sink(arrival_ns, ts, frames)`, with `arrival_ns` `None` for concealment.
//!
//! The codec itself lives outside this crate (the engine does no FFI): an I/O shell passes
//! a [`FrameEncoder`] to the sender and a [`DecoderFactory`] to the receiver. Realtime:
//! the queue reserves everything at construction; a decoder is made when a stream of a new
//! format starts.

use crate::wire::AudioFormat;

/// Frames per Opus packet netjam sends at 48 kHz: 2.5, 5, 10 and 20 ms.
pub const OPUS_FRAME_SIZES: [u32; 4] = [120, 240, 480, 960];
/// Longest Opus packet in frames at 48 kHz (120 ms, RFC 6716 section 3.2.5).
pub const OPUS_MAX_FRAMES: u32 = 5760;
/// Largest compressed packet the queue holds, in bytes.
pub const MAX_CODED_PACKET: usize = 1500;
/// Packets the queue holds ahead of the decoding point.
const SLOTS: usize = 64;
const EMPTY: u64 = u64::MAX;

/// Why a codec call failed. Realtime-safe: carries no heap data.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum CodecError {
    #[error("the codec rejected the packet (code {0})")]
    Rejected(i32),
    #[error("the buffer is too small for the packet")]
    BufferTooSmall,
}

/// Encodes one packet of frames at a time (stateful).
pub trait FrameEncoder: Send + std::fmt::Debug {
    /// Encode `pcm` (one packet of interleaved frames) into `out`; return the bytes written.
    fn encode(&mut self, pcm: &[f32], out: &mut [u8]) -> Result<usize, CodecError>;
    /// Frames of look-ahead the encoder adds to the latency.
    fn lookahead_frames(&self) -> u32;
}

/// Decodes packets in order, and conceals lost ones (stateful).
pub trait FrameDecoder: Send + std::fmt::Debug {
    /// Decode `packet` into `out` (interleaved, with room for the packet's frames), or,
    /// when `packet` is `None`, conceal `out.len() / channels` frames. Returns the frames
    /// written.
    fn decode(&mut self, packet: Option<&[u8]>, out: &mut [f32]) -> Result<usize, CodecError>;
    /// Forget the stream (a new one starts).
    fn reset(&mut self);
}

/// Makes decoders for the receiver when a stream of a compressed format starts.
pub trait DecoderFactory: Send + Sync + std::fmt::Debug {
    /// A decoder for `format`, or why there is none (e.g. the codec library is missing).
    fn decoder(&self, format: AudioFormat) -> Result<Box<dyn FrameDecoder>, String>;
}

/// Why a payload is not an Opus packet.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum OpusPacketError {
    #[error("an empty Opus packet")]
    Empty,
    #[error("an Opus packet with an invalid frame count")]
    FrameCount,
    #[error("an Opus packet longer than 120 ms")]
    TooLong,
}

/// Frames (at 48 kHz) an Opus packet decodes to, from its TOC byte and frame count
/// (RFC 6716 section 3.1). Checks only the framing; the decoder validates the rest.
pub fn opus_packet_frames(packet: &[u8]) -> Result<u32, OpusPacketError> {
    let toc = *packet.first().ok_or(OpusPacketError::Empty)?;
    let config = usize::from(toc >> 3);
    let per_frame = match config {
        0..=11 => [480, 960, 1920, 2880][config % 4],
        12..=15 => [480, 960][config % 2],
        _ => [120, 240, 480, 960][config % 4],
    };
    let count = match toc & 3 {
        0 => 1,
        1 | 2 => 2,
        _ => {
            let m = u32::from(*packet.get(1).ok_or(OpusPacketError::FrameCount)? & 0x3f);
            if m == 0 {
                return Err(OpusPacketError::FrameCount);
            }
            m
        }
    };
    let frames = per_frame * count;
    if frames > OPUS_MAX_FRAMES {
        return Err(OpusPacketError::TooLong);
    }
    Ok(frames)
}

/// What the queue did.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct DecodeStats {
    pub decoded_packets: u64,
    /// Frames the decoder concealed, and in how many gaps.
    pub concealed_frames: u64,
    pub concealment_events: u64,
    /// Packets the decoder rejected (concealed instead).
    pub decode_errors: u64,
    /// Packets (or redundant copies) that came after their frames were decoded or concealed.
    pub late_packets: u64,
    /// Packets that were not Opus, too large, or too far ahead to hold.
    pub dropped_packets: u64,
}

/// See the module docs.
#[derive(Debug)]
pub struct DecodeQueue {
    decoder: Option<Box<dyn FrameDecoder>>,
    channels: usize,
    slot_ts: [u64; SLOTS],
    slot_frames: [u32; SLOTS],
    slot_len: [usize; SLOTS],
    slot_arrival: [u64; SLOTS],
    bytes: Vec<u8>,
    /// Media time of the next frame to decode.
    next_ts: Option<u64>,
    /// Frames of the last packet decoded: the size of a concealed step when nothing later
    /// is known.
    last_frames: u32,
    in_gap: bool,
    pcm: Vec<f32>,
    stats: DecodeStats,
}

impl Default for DecodeQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl DecodeQueue {
    /// An empty queue with no decoder (see [`Self::set_decoder`]).
    pub fn new() -> Self {
        Self {
            decoder: None,
            channels: 1,
            slot_ts: [EMPTY; SLOTS],
            slot_frames: [0; SLOTS],
            slot_len: [0; SLOTS],
            slot_arrival: [0; SLOTS],
            bytes: vec![0; SLOTS * MAX_CODED_PACKET],
            next_ts: None,
            last_frames: OPUS_FRAME_SIZES[0],
            in_gap: false,
            pcm: vec![0.0; OPUS_MAX_FRAMES as usize * 2],
            stats: DecodeStats::default(),
        }
    }

    /// Decode with `decoder`, `channels` wide (1 or 2), from a fresh start.
    pub fn set_decoder(&mut self, decoder: Option<Box<dyn FrameDecoder>>, channels: usize) {
        self.decoder = decoder;
        self.channels = channels.clamp(1, 2);
        self.reset();
    }

    pub fn has_decoder(&self) -> bool {
        self.decoder.is_some()
    }

    /// Forget held packets and the decoder's state (the stream restarted or re-locked).
    pub fn reset(&mut self) {
        self.slot_ts = [EMPTY; SLOTS];
        self.next_ts = None;
        self.in_gap = false;
        if let Some(d) = self.decoder.as_mut() {
            d.reset();
        }
    }

    /// [`Self::reset`], and zero the counters too (the decoder is kept until replaced).
    pub fn clear(&mut self) {
        self.reset();
        self.stats = DecodeStats::default();
    }

    pub fn stats(&self) -> DecodeStats {
        self.stats
    }

    /// Take `packet`, whose first frame has media time `ts`, received at `now_ns`.
    /// `primary` packets may start the stream; redundant copies only fill gaps. Decodes
    /// whatever is now in order into `jb`.
    pub fn push(
        &mut self,
        sink: &mut impl FnMut(Option<u64>, u64, &[f32]),
        now_ns: u64,
        ts: u64,
        packet: &[u8],
        primary: bool,
    ) {
        let frames = match opus_packet_frames(packet) {
            Ok(f) if packet.len() <= MAX_CODED_PACKET => f,
            _ => {
                self.stats.dropped_packets += 1;
                return;
            }
        };
        let next = match self.next_ts {
            Some(n) => n,
            None if primary => {
                self.next_ts = Some(ts);
                ts
            }
            None => return,
        };
        // Entirely decoded or concealed already: late. A packet that overlaps the decoded
        // stream but reaches past it (a sender whose timestamps are not on a grid of whole
        // packets, as GStreamer's first Opus packets are) is decoded for what is new.
        if ts + u64::from(frames) <= next {
            if primary {
                self.stats.late_packets += 1;
            }
            return;
        }
        if self.find(ts).is_some() {
            return;
        }
        // Hold it in a free slot, or in place of the one furthest ahead if that is later.
        let slot = match self.slot_ts.iter().position(|&t| t == EMPTY) {
            Some(s) => s,
            None => {
                let (s, &far) = self
                    .slot_ts
                    .iter()
                    .enumerate()
                    .max_by_key(|(_, &t)| t)
                    .unwrap_or((0, &EMPTY));
                if far <= ts {
                    self.stats.dropped_packets += 1;
                    return;
                }
                self.stats.dropped_packets += 1;
                s
            }
        };
        self.slot_ts[slot] = ts;
        self.slot_frames[slot] = frames;
        self.slot_len[slot] = packet.len();
        self.slot_arrival[slot] = now_ns;
        self.bytes[slot * MAX_CODED_PACKET..slot * MAX_CODED_PACKET + packet.len()].copy_from_slice(packet);
        self.drain(sink);
    }

    /// Conceal with the decoder every frame before `horizon` that has not arrived, decoding
    /// held packets after each gap: called when the jitter buffer plays up to `horizon`.
    pub fn conceal_until(&mut self, sink: &mut impl FnMut(Option<u64>, u64, &[f32]), horizon: u64) {
        let Some(mut next) = self.next_ts else { return };
        while next < horizon && self.decoder.is_some() {
            // The gap runs to the next held packet, or one packet's length when none is.
            let held = self
                .slot_ts
                .iter()
                .copied()
                .filter(|&t| t != EMPTY && t > next)
                .min();
            let gap = held.map_or(u64::from(self.last_frames), |t| t - next);
            // The decoder conceals in whole 2.5 ms steps, never past a held packet: a gap
            // shorter than a step (timestamps off the grid) is left to the jitter buffer's
            // own concealment and decoding goes on from the held packet.
            let step = match held {
                Some(t) if gap < 120 => {
                    self.next_ts = Some(t);
                    self.drain(sink);
                    next = self.next_ts.unwrap_or(t);
                    continue;
                }
                Some(_) => gap.min(u64::from(OPUS_MAX_FRAMES / 2)) / 120 * 120,
                None => gap.clamp(1, u64::from(OPUS_MAX_FRAMES / 2)).div_ceil(120) * 120,
            };
            let ch = self.channels;
            let n = step as usize;
            let Some(decoder) = self.decoder.as_mut() else {
                return;
            };
            let out = &mut self.pcm[..n * ch];
            match decoder.decode(None, out) {
                Ok(done) => sink(None, next, &out[..done.min(n) * ch]),
                Err(_) => {
                    self.stats.decode_errors += 1;
                    return;
                }
            }
            if !self.in_gap {
                self.stats.concealment_events += 1;
                self.in_gap = true;
            }
            self.stats.concealed_frames += step;
            next += step;
            self.next_ts = Some(next);
            // Held packets the concealment ran past can no longer be decoded.
            for (t, f) in self.slot_ts.iter_mut().zip(self.slot_frames) {
                if *t != EMPTY && *t + u64::from(f) <= next {
                    *t = EMPTY;
                    self.stats.late_packets += 1;
                }
            }
            self.drain(sink);
            next = self.next_ts.unwrap_or(next);
        }
    }

    fn find(&self, ts: u64) -> Option<usize> {
        self.slot_ts.iter().position(|&t| t == ts)
    }

    /// The held packet that continues the stream at `next`: the earliest that starts at or
    /// before it and reaches past it.
    fn continuing(&self, next: u64) -> Option<usize> {
        (0..SLOTS)
            .filter(|&s| {
                let t = self.slot_ts[s];
                t != EMPTY && t <= next && t + u64::from(self.slot_frames[s]) > next
            })
            .min_by_key(|&s| self.slot_ts[s])
    }

    /// Decode held packets while the next one is there.
    fn drain(&mut self, sink: &mut impl FnMut(Option<u64>, u64, &[f32])) {
        while let Some(next) = self.next_ts {
            let Some(slot) = self.continuing(next) else {
                return;
            };
            let ts = self.slot_ts[slot];
            self.slot_ts[slot] = EMPTY;
            let frames = self.slot_frames[slot];
            let ch = self.channels;
            let Some(decoder) = self.decoder.as_mut() else {
                return;
            };
            let packet = &self.bytes[slot * MAX_CODED_PACKET..slot * MAX_CODED_PACKET + self.slot_len[slot]];
            let out = &mut self.pcm[..frames as usize * ch];
            let decoded = match decoder.decode(Some(packet), out) {
                Ok(n) if n == frames as usize => Some(n),
                _ => decoder.decode(None, out).ok(),
            };
            match decoded {
                Some(n) => {
                    // Frames before `next` are already there; the sink keeps those.
                    sink(
                        Some(self.slot_arrival[slot]),
                        ts,
                        &out[..n.min(frames as usize) * ch],
                    );
                    self.stats.decoded_packets += 1;
                }
                None => self.stats.decode_errors += 1,
            }
            self.in_gap = false;
            self.last_frames = frames;
            self.next_ts = Some(ts + u64::from(frames));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delay::BufferMode;
    use crate::jitter::JitterBuffer;

    #[test]
    fn opus_durations_follow_the_toc_byte() {
        // CELT-only configs 16..31: 2.5, 5, 10, 20 ms.
        assert_eq!(opus_packet_frames(&[16 << 3]), Ok(120));
        assert_eq!(opus_packet_frames(&[(17 << 3) | 1]), Ok(480));
        assert_eq!(opus_packet_frames(&[31 << 3, 0]), Ok(960));
        // SILK 60 ms, two frames (code 2) = 120 ms; hybrid 10 ms.
        assert_eq!(opus_packet_frames(&[(3 << 3) | 2]), Ok(5760));
        assert_eq!(opus_packet_frames(&[12 << 3]), Ok(480));
        // Code 3: the count byte; 0 frames is invalid, over 120 ms is too long.
        assert_eq!(opus_packet_frames(&[(16 << 3) | 3, 5]), Ok(600));
        assert_eq!(
            opus_packet_frames(&[(16 << 3) | 3, 0]),
            Err(OpusPacketError::FrameCount)
        );
        assert_eq!(
            opus_packet_frames(&[(16 << 3) | 3]),
            Err(OpusPacketError::FrameCount)
        );
        assert_eq!(
            opus_packet_frames(&[(3 << 3) | 3, 3]),
            Err(OpusPacketError::TooLong)
        );
        assert_eq!(opus_packet_frames(&[]), Err(OpusPacketError::Empty));
    }

    /// A decoder that writes the packet's payload byte into every sample, and -1 when
    /// concealing.
    #[derive(Debug, Default)]
    struct Marker;

    impl FrameDecoder for Marker {
        fn decode(&mut self, packet: Option<&[u8]>, out: &mut [f32]) -> Result<usize, CodecError> {
            let v = packet.map_or(-1.0, |p| f32::from(p[1]));
            let frames = match packet {
                Some(p) => opus_packet_frames(p).map_err(|_| CodecError::Rejected(-4))? as usize,
                None => out.len(),
            };
            out[..frames].fill(v);
            Ok(frames)
        }
        fn reset(&mut self) {}
    }

    /// What the queue handed on: (arrival, ts, frames, first sample).
    type Got = Vec<(Option<u64>, u64, usize, f32)>;

    fn queue() -> DecodeQueue {
        let mut q = DecodeQueue::new();
        q.set_decoder(Some(Box::new(Marker)), 1);
        q
    }

    fn sink(got: &mut Got) -> impl FnMut(Option<u64>, u64, &[f32]) + '_ {
        |a, ts, d| got.push((a, ts, d.len(), d[0]))
    }

    /// A 2.5 ms CELT packet whose payload byte is `mark`.
    fn pkt(mark: u8) -> [u8; 2] {
        [16 << 3, mark]
    }

    #[test]
    fn in_order_packets_are_decoded_on_arrival_and_held_ones_after_the_gap_fills() {
        let (mut q, mut got) = (queue(), Got::new());
        q.push(&mut sink(&mut got), 5, 1000, &pkt(1), true);
        q.push(&mut sink(&mut got), 6, 1240, &pkt(3), true);
        assert_eq!(got, [(Some(5), 1000, 120, 1.0)]);
        q.push(&mut sink(&mut got), 7, 1120, &pkt(2), true);
        assert_eq!(got[1..], [(Some(7), 1120, 120, 2.0), (Some(6), 1240, 120, 3.0)]);
        assert_eq!(q.stats().concealed_frames, 0);
        // A packet already decoded is late.
        q.push(&mut sink(&mut got), 8, 1120, &pkt(9), true);
        assert_eq!(q.stats().late_packets, 1);
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn a_gap_is_concealed_only_up_to_the_horizon_then_held_packets_decode() {
        let (mut q, mut got) = (queue(), Got::new());
        for (i, ts) in [0u64, 120, 360].into_iter().enumerate() {
            q.push(&mut sink(&mut got), 0, ts, &pkt(i as u8 + 1), true);
        }
        q.conceal_until(&mut sink(&mut got), 240);
        assert_eq!(q.stats().concealed_frames, 0, "nothing missing before 240");
        q.conceal_until(&mut sink(&mut got), 241);
        assert_eq!(got[2..], [(None, 240, 120, -1.0), (Some(0), 360, 120, 3.0)]);
        assert_eq!(q.stats().concealment_events, 1);
        // The lost packet arriving now is late.
        q.push(&mut sink(&mut got), 0, 240, &pkt(7), true);
        assert_eq!(q.stats().late_packets, 1);
    }

    #[test]
    fn with_nothing_held_the_decoder_conceals_one_packet_length_at_a_time() {
        let (mut q, mut got) = (queue(), Got::new());
        q.push(&mut sink(&mut got), 0, 0, &[17 << 3, 1], true); // 5 ms
        q.conceal_until(&mut sink(&mut got), 250);
        assert_eq!(q.stats().concealed_frames, 240);
        q.conceal_until(&mut sink(&mut got), 1000);
        assert_eq!(q.stats().concealed_frames, 960);
        assert_eq!(q.stats().concealment_events, 1);
    }

    #[test]
    fn redundant_copies_fill_gaps_but_never_start_a_stream() {
        let (mut q, mut got) = (queue(), Got::new());
        q.push(&mut sink(&mut got), 0, 0, &pkt(1), false);
        assert!(got.is_empty());
        q.push(&mut sink(&mut got), 0, 120, &pkt(2), true);
        q.push(&mut sink(&mut got), 0, 360, &pkt(4), true);
        q.push(&mut sink(&mut got), 0, 240, &pkt(3), false);
        assert_eq!(q.stats().decoded_packets, 3);
        assert_eq!(q.stats().concealed_frames, 0);
    }

    #[test]
    fn garbage_and_a_full_queue_are_counted_not_fatal() {
        let (mut q, mut got) = (queue(), Got::new());
        q.push(&mut sink(&mut got), 0, 0, &[], true);
        q.push(&mut sink(&mut got), 0, 0, &[(16 << 3) | 3, 0], true);
        q.push(&mut sink(&mut got), 0, 0, &[0u8; MAX_CODED_PACKET + 1], true);
        assert_eq!(q.stats().dropped_packets, 3);
        q.push(&mut sink(&mut got), 0, 0, &pkt(1), true);
        // A gap at 120, then more packets than slots: the furthest ones give way.
        for k in 2..(SLOTS as u64 + 10) {
            q.push(&mut sink(&mut got), 0, k * 120, &pkt(1), true);
        }
        assert_eq!(q.stats().dropped_packets, 3 + 8);
        q.conceal_until(&mut sink(&mut got), 240);
        assert_eq!(q.stats().decoded_packets, 1 + SLOTS as u64);
    }

    #[test]
    fn timestamps_off_the_packet_grid_keep_decoding() {
        // As GStreamer's opusenc sends 20 ms packets: the second starts 312 frames (its
        // look-ahead) early, then every packet follows on 960 frames later.
        let (mut q, mut got) = (queue(), Got::new());
        let p20 = |mark: u8| [19u8 << 3, mark];
        q.push(&mut sink(&mut got), 0, 0, &p20(1), true);
        q.push(&mut sink(&mut got), 0, 648, &p20(2), true);
        q.push(&mut sink(&mut got), 0, 1608, &p20(3), true);
        assert_eq!(q.stats().decoded_packets, 3, "{:?}", q.stats());
        assert_eq!(q.stats().late_packets, 0);
        // A lost packet then one off the grid: concealment stops short of the held packet
        // (whole 2.5 ms steps) and decoding goes on from it.
        q.push(&mut sink(&mut got), 0, 3600, &p20(5), true);
        q.conceal_until(&mut sink(&mut got), 3700);
        assert_eq!(
            q.stats().concealed_frames,
            960,
            "1032 missing: 960 concealed, 72 left: {got:?}"
        );
        assert_eq!(q.stats().decoded_packets, 4, "{got:?}");
        assert_eq!(got.last().map(|g| (g.1, g.3)), Some((3600, 5.0)));
    }

    #[test]
    fn reset_forgets_the_stream() {
        let (mut q, mut got) = (queue(), Got::new());
        q.push(&mut sink(&mut got), 0, 0, &pkt(1), true);
        q.push(&mut sink(&mut got), 0, 240, &pkt(1), true);
        q.reset();
        q.conceal_until(&mut sink(&mut got), 10_000);
        assert_eq!(
            q.stats().concealed_frames,
            0,
            "nothing to conceal before a new stream"
        );
        q.push(&mut sink(&mut got), 0, 50_000, &pkt(1), true);
        assert_eq!(q.stats().decoded_packets, 2);
    }

    #[test]
    fn the_jitter_buffer_plays_decoded_audio_and_the_decoders_concealment_when_due() {
        let mut jb = JitterBuffer::new(BufferMode::Fixed { ns: 0 }, 48_000, 1, 1);
        jb.set_decoder(Some(Box::new(Marker)), 1);
        for (i, ts) in [0u64, 120, 360].into_iter().enumerate() {
            let at = (ts + 120) * 1_000_000_000 / 48_000;
            jb.observe(at, ts, 120);
            jb.push_coded(at, ts, &pkt(i as u8 + 1), true);
        }
        // Playout of 60-frame periods from one and a half periods after the first packet's
        // arrival (a compressed stream waits half a period more).
        let mut marks = Vec::new();
        for k in 0..8u64 {
            let mut out = [0f32; 60];
            jb.play(2_500_000 + 1_875_000 + k * 1_250_000, &mut out);
            marks.push(out[30]);
        }
        assert_eq!(marks, [1.0, 1.0, 2.0, 2.0, -1.0, -1.0, 3.0, 3.0]);
        assert_eq!(jb.decode_stats().concealed_frames, 120);
        assert_eq!(
            jb.stats().concealed_frames,
            120,
            "the buffer's own concealer never ran"
        );
    }
}
