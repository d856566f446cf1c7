//! The receiving half of a stream: datagrams in, steady frames and RTCP reports out.
//!
//! [`Receiver`] accepts RTP and RTCP on one port (RFC 5761). It learns the stream's format
//! from netjam's format extension, or takes it from configuration for plain RTP from other
//! programs (GStreamer, ffmpeg). It follows the sender across restarts (a new SSRC or a
//! sequence jump) without being restarted itself, rebuilds lost packets from RFC 2198
//! redundancy, and feeds the [`JitterBuffer`]. About once a second it writes an RTCP
//! receiver report (loss, RFC 3550 jitter, LSR/DLSR for the sender's RTT) with SDES.
//!
//! Every datagram may be hostile: anything malformed is counted and dropped; nothing
//! panics and nothing grows. Sans-IO and realtime-safe after construction.

use std::sync::Arc;

use crate::codec::{opus_packet_frames, DecodeStats, DecoderFactory};
use crate::delay::BufferMode;
use crate::jitter::{JitterBuffer, JitterStats};
use crate::rng::SimRng;
use crate::time::frames_to_ns;
use crate::wire::red::parse_red;
use crate::wire::rtcp::{parse_rtcp, write_receiver_report, write_sdes, ReceptionStats, RtcpPacket};
use crate::wire::{
    classify, decode, parse_format_extension, parse_rtp, AudioFormat, PacketKind, SeqExtender,
    TimestampExtender, RED_PAYLOAD_TYPE,
};

/// Largest decoded packet, in samples: 1024 frames × 64 channels.
const MAX_SAMPLES: usize = 1024 * 64;
/// A sequence step larger than this (either way) means the sender restarted.
const SEQ_JUMP: i64 = 3000;
/// A source silent this long may be replaced by the first packet of another.
const SOURCE_TIMEOUT_NS: u64 = 200_000_000;

/// How the receiver is set up.
#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    pub buffer: BufferMode,
    /// The format of plain RTP that carries no format extension (from `--codec/--rate/
    /// --channels` or an SDP file). With it, packets of other payload types are dropped.
    pub fixed_format: Option<(AudioFormat, u8)>,
    /// Channels to reserve for (1..=64).
    pub max_channels: usize,
    /// With RFC 2198 redundancy of N, the buffer waits min(N, this) packet times longer so
    /// lost packets are rebuilt rather than concealed. 0 never waits for redundancy.
    pub max_redundancy_wait: usize,
    pub seed: u64,
    pub cname: String,
    pub name: Option<String>,
    /// Makes decoders for compressed streams (Opus); without one they are counted as
    /// undecodable and an event says so.
    pub decoders: Option<Arc<dyn DecoderFactory>>,
}

impl ReceiverConfig {
    /// An adaptive buffer, formats learned from the stream, up to `max_channels`, waiting
    /// for up to 8 redundant copies; seed 0, CNAME `netjam`, no name. Override fields as
    /// needed: `ReceiverConfig { seed: 7, ..ReceiverConfig::new(2) }`.
    pub fn new(max_channels: usize) -> Self {
        Self {
            buffer: BufferMode::default(),
            fixed_format: None,
            max_channels,
            max_redundancy_wait: 8,
            seed: 0,
            cname: "netjam".into(),
            name: None,
            decoders: None,
        }
    }
}

/// Something the I/O shell may want to tell the user about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiverEvent {
    /// A stream began (or a sender restarted) with this format.
    StreamStarted {
        ssrc: u32,
        format: AudioFormat,
        restart: bool,
    },
    /// The sender said goodbye.
    Bye { ssrc: u32 },
    /// A stream arrived at a rate too far from the output's to convert (see
    /// [`crate::drift::converts`]); it is ignored.
    RateMismatch { ssrc: u32, rate: u32, output_rate: u32 },
    /// A stream at another rate than the output's is converted to it.
    Converting { ssrc: u32, rate: u32, output_rate: u32 },
    /// RTP arrived whose format is unknown (no extension and no configured format).
    UnknownFormat { payload_type: u8 },
    /// A compressed stream arrived that this receiver has no decoder for.
    NoDecoder { ssrc: u32, format: AudioFormat },
}

/// Counters of everything the receiver saw, plus the jitter buffer's.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ReceiverStats {
    pub datagrams: u64,
    pub received: u64,
    /// Packets the sender sent that never arrived (RFC 3550 cumulative lost).
    pub lost: i64,
    pub reordered: u64,
    pub malformed: u64,
    pub unknown_format: u64,
    pub wrong_payload_type: u64,
    pub rate_mismatch: u64,
    pub not_rtp: u64,
    pub rtcp_received: u64,
    pub rtcp_malformed: u64,
    pub rtcp_sent: u64,
    pub stream_starts: u64,
    /// Packets of another stream held on probation while the current one was live.
    pub probation: u64,
    /// RFC 3550 interarrival jitter, ms.
    pub jitter_ms: f64,
    pub format: Option<AudioFormat>,
    pub ssrc: Option<u32>,
    /// Packets of a compressed stream that could not be decoded (no decoder).
    pub undecodable: u64,
    /// The decoder's side of a compressed stream: packets decoded, frames it concealed.
    pub decoder: DecodeStats,
    pub jitter_buffer: JitterStats,
}

#[derive(Debug)]
struct Source {
    ssrc: u32,
    format: AudioFormat,
    seq: SeqExtender,
    ts: TimestampExtender,
    reception: ReceptionStats,
    /// Middle 32 bits of the last SR's NTP time and when it arrived.
    last_sr: Option<(u32, u64)>,
    last_arrival_ns: u64,
    /// The newest packet in sequence: its extended sequence number and the media time
    /// just after its frames (to find the gaps a sender skips, see
    /// [`JitterBuffer::sender_skipped`]).
    newest: Option<(u64, u64)>,
}

/// The longest gap between consecutive packets taken for time the far side's device lost
/// (longer: a paused or restarted stream, which the buffer handles as such).
const MAX_SENDER_GAP_NS: u64 = 100_000_000;

/// See the module docs.
#[derive(Debug)]
pub struct Receiver {
    config: ReceiverConfig,
    ssrc: u32,
    jb: JitterBuffer,
    source: Option<Source>,
    /// A would-be new stream (SSRC, sequence number) on probation while the current one
    /// is live: it takes over with its next consecutive packet, so one stray or forged
    /// packet never interrupts the music.
    candidate: Option<(u32, u16)>,
    output: Option<AudioFormat>,
    /// Set by [`Receiver::set_output_rate`]: the rate is fixed, the channels follow each stream.
    output_rate: Option<u32>,
    decoded: Vec<f32>,
    play_buf: Vec<f32>,
    events: [Option<ReceiverEvent>; 8],
    next_rtcp_ns: Option<u64>,
    rng: SimRng,
    stats: ReceiverStats,
}

impl Receiver {
    pub fn new(config: ReceiverConfig) -> Self {
        let max_ch = config.max_channels.clamp(1, 64);
        let mut rng = SimRng::new(config.seed);
        Self {
            ssrc: rng.next_u64() as u32,
            jb: JitterBuffer::new(config.buffer, 48_000, 2.min(max_ch), max_ch),
            source: None,
            candidate: None,
            output: None,
            output_rate: None,
            decoded: vec![0.0; MAX_SAMPLES],
            play_buf: vec![0.0; 4096 * max_ch],
            events: [None; 8],
            next_rtcp_ns: None,
            rng,
            stats: ReceiverStats::default(),
            config,
        }
    }

    /// The format frames are played in: the first stream's, fixed from then on.
    pub fn output_format(&self) -> Option<AudioFormat> {
        self.output
    }

    /// Fix the output format before any stream arrives (e.g. a sound card's).
    pub fn set_output_format(&mut self, format: AudioFormat) {
        self.output = Some(format);
    }

    /// Play at `rate` (streams at a rate the resampler converts are converted to it, others
    /// refused) in each stream's own channel count: a mixer that takes every member's stream
    /// as it comes (see [`crate::members::MemberReceivers`]) sets this instead of a whole
    /// output format.
    pub fn set_output_rate(&mut self, rate: u32) {
        self.output_rate = Some(rate);
        self.output = None;
    }

    /// Report (RTCP RR and SDES) under `ssrc` rather than the random one chosen at
    /// construction: a client that also sends reports under its sender's SSRC, as RFC 3550
    /// asks of a participant, so a room sees one SSRC per player.
    pub fn set_ssrc(&mut self, ssrc: u32) {
        self.ssrc = ssrc;
    }

    /// Forget the stream and everything counted about it, as if new, keeping the settings
    /// (output format or rate, buffer mode, drift correction, SSRC): what plays next is
    /// silence until another stream starts, and nothing of the previous one can be heard
    /// or concealed from. For a receiver handed to another sender. Allocation-free (a
    /// compressed stream's decoder is kept until the next stream replaces it).
    pub fn clear(&mut self) {
        self.source = None;
        self.candidate = None;
        if self.output_rate.is_some() {
            self.output = None;
        }
        self.events = [None; 8];
        self.next_rtcp_ns = None;
        self.stats = ReceiverStats::default();
        self.jb.clear();
    }

    /// Follow the sender's clock by resampling (see [`JitterBuffer::set_drift_correction`]).
    pub fn set_drift_correction(&mut self, on: bool) {
        self.jb.set_drift_correction(on);
    }

    pub fn set_buffer_mode(&mut self, mode: BufferMode) {
        self.jb.set_mode(mode);
    }

    /// How readily the adaptive buffer trades latency for fewer dropouts.
    pub fn set_latency_policy(&mut self, policy: crate::delay::LatencyPolicy) {
        self.jb.set_latency_policy(policy);
    }

    /// The most recent concealed, inserted and skipped stretches, oldest first.
    pub fn recent_discontinuities(&self) -> impl Iterator<Item = &crate::discontinuity::Discontinuity> {
        self.jb.recent_discontinuities()
    }

    /// How long the packet played last waited in the jitter buffer, ms.
    pub fn last_residence_ms(&self) -> Option<f64> {
        self.jb.last_residence_ms()
    }

    pub fn stats(&self) -> ReceiverStats {
        let mut s = self.stats;
        s.jitter_buffer = self.jb.stats();
        s.decoder = self.jb.decode_stats();
        if let Some(src) = &self.source {
            s.lost = src.reception.lost();
            s.jitter_ms = src.reception.jitter_ns() as f64 / 1e6;
            s.format = Some(src.format);
            s.ssrc = Some(src.ssrc);
        }
        s
    }

    /// Take the oldest pending event.
    pub fn poll_event(&mut self) -> Option<ReceiverEvent> {
        let first = self.events.iter().position(|e| e.is_some())?;
        let ev = self.events[first].take();
        self.events[first..].rotate_left(1);
        ev
    }

    fn push_event(&mut self, ev: ReceiverEvent) {
        if let Some(slot) = self.events.iter_mut().find(|e| e.is_none()) {
            *slot = Some(ev);
        }
    }

    /// Take one datagram that arrived at `now_ns`, sorting it first (a caller whose socket
    /// sorted it already calls [`Receiver::on_packet`]).
    pub fn on_datagram(&mut self, now_ns: u64, bytes: &[u8]) {
        self.on_packet(now_ns, classify(bytes), bytes);
    }

    /// Take one datagram that arrived at `now_ns`, of the `kind` the socket found
    /// ([`crate::room::demux`] or [`crate::wire::classify`]; the parsers still check it).
    pub fn on_packet(&mut self, now_ns: u64, kind: PacketKind, bytes: &[u8]) {
        self.stats.datagrams += 1;
        match kind {
            PacketKind::Rtp => self.on_rtp(now_ns, bytes),
            PacketKind::Rtcp => self.on_rtcp(now_ns, bytes),
            PacketKind::Other => self.stats.not_rtp += 1,
        }
    }

    fn on_rtp(&mut self, now_ns: u64, bytes: &[u8]) {
        let Ok(pkt) = parse_rtp(bytes) else {
            self.stats.malformed += 1;
            return;
        };
        let h = pkt.header;
        let announced = match pkt.extension.as_ref().and_then(parse_format_extension) {
            Some(Ok(f)) => Some(f),
            Some(Err(_)) => {
                self.stats.malformed += 1;
                return;
            }
            None => None,
        };
        let red = h.payload_type == RED_PAYLOAD_TYPE;
        let format = match (announced, self.config.fixed_format) {
            (Some(f), _) => f,
            (None, Some((f, pt))) => {
                if h.payload_type != pt && !red {
                    self.stats.wrong_payload_type += 1;
                    return;
                }
                f
            }
            (None, None) => {
                if self.stats.unknown_format == 0 {
                    self.push_event(ReceiverEvent::UnknownFormat {
                        payload_type: h.payload_type,
                    });
                }
                self.stats.unknown_format += 1;
                return;
            }
        };
        let output_rate = self.output_rate.or(self.output.map(|f| f.rate));
        if let Some(output_rate) = output_rate {
            if !crate::drift::converts(format.rate, output_rate) {
                if self.stats.rate_mismatch == 0 {
                    self.push_event(ReceiverEvent::RateMismatch {
                        ssrc: h.ssrc,
                        rate: format.rate,
                        output_rate,
                    });
                }
                self.stats.rate_mismatch += 1;
                return;
            }
        }
        // A new sender, a new format or a sequence jump: start the stream over — at once if
        // the current source has gone quiet, after two consecutive packets otherwise.
        let restart = match &mut self.source {
            None => true,
            Some(src) => {
                let changed = if src.ssrc != h.ssrc || src.format != format {
                    true
                } else {
                    let highest = src.seq.highest().unwrap_or(0) as i64;
                    let mut probe = src.seq;
                    let ext = probe.extend(h.sequence) as i64;
                    (ext - highest).abs() > SEQ_JUMP
                };
                if !changed {
                    false
                } else if now_ns.saturating_sub(src.last_arrival_ns) > SOURCE_TIMEOUT_NS
                    || self.candidate == Some((h.ssrc, h.sequence.wrapping_sub(1)))
                {
                    true
                } else {
                    self.candidate = Some((h.ssrc, h.sequence));
                    self.stats.probation += 1;
                    return;
                }
            }
        };
        if restart {
            let was_playing = self.source.is_some();
            self.source = Some(Source {
                ssrc: h.ssrc,
                format,
                seq: SeqExtender::new(),
                ts: TimestampExtender::new(),
                reception: ReceptionStats::new(format.rate),
                last_sr: None,
                last_arrival_ns: now_ns,
                newest: None,
            });
            self.candidate = None;
            if self.output.is_none() || self.output_rate.is_some() {
                self.output = Some(AudioFormat {
                    rate: self.output_rate.unwrap_or(format.rate),
                    ..format
                });
            }
            let device_rate = output_rate.filter(|&r| r != format.rate);
            self.jb.set_output_rate(device_rate);
            self.jb.reset(format.rate, format.channels as usize);
            if let Some(output_rate) = device_rate {
                self.push_event(ReceiverEvent::Converting {
                    ssrc: h.ssrc,
                    rate: format.rate,
                    output_rate,
                });
            }
            if format.codec.is_pcm() {
                self.jb.set_decoder(None, 1);
            } else {
                self.start_decoder(h.ssrc, format);
            }
            self.stats.stream_starts += 1;
            self.push_event(ReceiverEvent::StreamStarted {
                ssrc: h.ssrc,
                format,
                restart: was_playing,
            });
        }
        let Some(src) = self.source.as_mut() else { return };
        src.last_arrival_ns = now_ns;
        let highest_before = src.seq.highest();
        let ext_seq = src.seq.extend(h.sequence);
        let ext_ts = src.ts.extend(h.timestamp);
        src.reception.on_packet(ext_seq, h.timestamp, now_ns);
        if highest_before.is_some_and(|hb| ext_seq < hb) {
            self.stats.reordered += 1;
        }
        self.stats.received += 1;
        if !format.codec.is_pcm() {
            self.on_coded(now_ns, ext_seq, ext_ts, red, pkt.payload, format.rate);
            return;
        }
        let ch = format.channels as usize;
        if red {
            let Ok(red) = parse_red(pkt.payload) else {
                self.stats.malformed += 1;
                return;
            };
            let primary = red.primary();
            let n = decode(format.codec, primary.data, &mut self.decoded);
            let n = n - n % ch;
            self.note_sender_gap(now_ns, ext_seq, ext_ts, (n / ch) as u64, format.rate);
            // Wait for the redundant copies: N blocks cover a burst of N lost packets. A
            // stream's first packets carry fewer blocks than it will, so RED means at least one.
            let packet_ns = frames_to_ns((n / ch) as u64, format.rate);
            let blocks = red.redundant().len().max(1).min(self.config.max_redundancy_wait);
            self.jb.set_redundancy_wait_ns(packet_ns * blocks as u64);
            self.jb.insert(now_ns, ext_ts, &self.decoded[..n], true);
            for block in red.redundant() {
                let ts = ext_ts.saturating_sub(block.timestamp_offset as u64);
                let n = decode(format.codec, block.data, &mut self.decoded);
                let n = n - n % ch;
                self.jb.insert(now_ns, ts, &self.decoded[..n], false);
            }
        } else {
            let n = decode(format.codec, pkt.payload, &mut self.decoded);
            let n = n - n % ch;
            self.note_sender_gap(now_ns, ext_seq, ext_ts, (n / ch) as u64, format.rate);
            self.jb.insert(now_ns, ext_ts, &self.decoded[..n], true);
        }
    }

    /// A packet of `frames` frames at `ext_ts` with sequence number `ext_seq`: when it
    /// follows the newest one in sequence but not in media time, the sender skipped the
    /// frames between (its device lost that time), and the buffer is told.
    fn note_sender_gap(&mut self, now_ns: u64, ext_seq: u64, ext_ts: u64, frames: u64, rate: u32) {
        let Some(src) = self.source.as_mut() else { return };
        if let Some((seq, end)) = src.newest {
            if ext_seq <= seq {
                return;
            }
            let max = crate::time::ns_to_frames(MAX_SENDER_GAP_NS, rate);
            if ext_seq == seq + 1 && ext_ts > end && ext_ts - end <= max {
                self.jb.sender_skipped(now_ns, end, ext_ts - end);
            }
        }
        src.newest = Some((ext_seq, ext_ts + frames));
    }

    /// A decoder for a stream that starts in a compressed `format` (made once per stream
    /// start; the only allocation after construction).
    fn start_decoder(&mut self, ssrc: u32, format: AudioFormat) {
        let decoder = self.config.decoders.as_ref().and_then(|f| f.decoder(format).ok());
        if decoder.is_none() {
            self.push_event(ReceiverEvent::NoDecoder { ssrc, format });
        }
        self.jb.set_decoder(decoder, format.channels as usize);
    }

    /// A compressed packet (or an RFC 2198 packet of them): account its timing now, decode
    /// it in order through the queue.
    fn on_coded(&mut self, now_ns: u64, ext_seq: u64, ext_ts: u64, red: bool, payload: &[u8], rate: u32) {
        if !self.jb.has_decoder() {
            self.stats.undecodable += 1;
            return;
        }
        let (primary, blocks) = if red {
            let Ok(red) = parse_red(payload) else {
                self.stats.malformed += 1;
                return;
            };
            (red.primary().data, Some(red))
        } else {
            (payload, None)
        };
        let Ok(frames) = opus_packet_frames(primary) else {
            self.stats.malformed += 1;
            return;
        };
        if let Some(red) = &blocks {
            let packet_ns = frames_to_ns(u64::from(frames), rate);
            let n = red.redundant().len().max(1).min(self.config.max_redundancy_wait);
            self.jb.set_redundancy_wait_ns(packet_ns * n as u64);
        }
        // The packet's length is in its TOC byte: a gap before it in media time is found
        // as for linear PCM, before decoding.
        self.note_sender_gap(now_ns, ext_seq, ext_ts, u64::from(frames), rate);
        // A re-lock here also resets the decoding queue.
        self.jb.observe(now_ns, ext_ts, u64::from(frames));
        // Older copies first, so that the primary finds the stream decoded up to itself.
        if let Some(red) = &blocks {
            for block in red.redundant() {
                let ts = ext_ts.saturating_sub(u64::from(block.timestamp_offset));
                self.jb.push_coded(now_ns, ts, block.data, false);
            }
        }
        self.jb.push_coded(now_ns, ext_ts, primary, true);
    }

    fn on_rtcp(&mut self, now_ns: u64, bytes: &[u8]) {
        self.stats.rtcp_received += 1;
        for packet in parse_rtcp(bytes) {
            match packet {
                Ok(RtcpPacket::SenderReport { ssrc, info, .. }) => {
                    if let Some(src) = self.source.as_mut().filter(|s| s.ssrc == ssrc) {
                        src.last_sr = Some((info.ntp.middle32(), now_ns));
                    }
                }
                Ok(RtcpPacket::Bye { ssrcs, .. }) => {
                    for chunk in ssrcs.chunks_exact(4) {
                        let ssrc = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                        if self.source.as_ref().is_some_and(|s| s.ssrc == ssrc) {
                            self.push_event(ReceiverEvent::Bye { ssrc });
                        }
                    }
                }
                Ok(_) => {}
                Err(_) => {
                    self.stats.rtcp_malformed += 1;
                    break;
                }
            }
        }
    }

    /// The stream heard (its SSRC) and the RTP timestamp of the frame the next period's
    /// first output frame plays (see [`JitterBuffer::next_output_ts`]); `None` before
    /// playout starts. Read only.
    pub fn next_output_ts(&self) -> Option<(u32, u32)> {
        let ssrc = self.source.as_ref()?.ssrc;
        self.jb.next_output_ts().map(|ts| (ssrc, ts as u32))
    }

    /// The output device lost `frames` frames of time since the last period: the audio
    /// due meanwhile is dropped at the next [`Self::play`] (see
    /// [`JitterBuffer::device_skipped`]). Realtime-safe.
    pub fn device_skipped(&mut self, frames: u64) {
        self.jb.device_skipped(frames);
    }

    /// Fill `out` (interleaved in the output format's channels) with the frames due now.
    pub fn play(&mut self, now_ns: u64, out: &mut [f32]) {
        let out_ch = self.output.map_or(1, |f| f.channels as usize);
        let in_ch = self.jb.channels();
        if in_ch == out_ch {
            self.jb.play(now_ns, out);
            return;
        }
        // Map channels: copy what both have, silence the rest.
        let frames = out.len() / out_ch;
        let frames = frames.min(self.play_buf.len() / in_ch);
        let mut buf = std::mem::take(&mut self.play_buf);
        self.jb.play(now_ns, &mut buf[..frames * in_ch]);
        for f in 0..frames {
            for c in 0..out_ch {
                out[f * out_ch + c] = if c < in_ch { buf[f * in_ch + c] } else { 0.0 };
            }
        }
        self.play_buf = buf;
    }

    /// The latest time (monotonic ns, as given to [`Receiver::poll_rtcp`]) at which
    /// `poll_rtcp` must be called next: the next receiver report is due then (it is sent if
    /// a stream is being received). Before the first call the answer is 0, "now": that call
    /// starts the report timer. A caller without an audio clock (a server) sleeps until
    /// this time, calls `poll_rtcp`, and asks again. Playout, and with it the detection of
    /// a paused stream, is no timer of the receiver: it runs in [`Receiver::play`], paced by
    /// whoever plays.
    pub fn poll_timeout(&self) -> Option<u64> {
        Some(self.next_rtcp_ns.unwrap_or(0))
    }

    /// When a report is due, write RR + SDES into `out` and return its length; call it no
    /// later than [`Receiver::poll_timeout`].
    pub fn poll_rtcp(&mut self, now_ns: u64, out: &mut [u8]) -> Option<usize> {
        let due = *self.next_rtcp_ns.get_or_insert(now_ns + 500_000_000);
        if now_ns < due {
            return None;
        }
        self.next_rtcp_ns = Some(now_ns + (self.rng.uniform(0.5, 1.5) * 1e9) as u64);
        let src = self.source.as_mut()?;
        let (lsr, dlsr) = match src.last_sr {
            Some((lsr, at)) => (
                lsr,
                ((now_ns.saturating_sub(at)) as u128 * 65_536 / 1_000_000_000) as u32,
            ),
            None => (0, 0),
        };
        let block = src.reception.report_block(src.ssrc, lsr, dlsr);
        let a = write_receiver_report(self.ssrc, &[block], out).ok()?;
        let b = write_sdes(
            self.ssrc,
            &self.config.cname,
            self.config.name.as_deref(),
            &mut out[a..],
        )
        .ok()?;
        self.stats.rtcp_sent += 1;
        Some(a + b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sender::{Sender, SenderConfig};
    use crate::wire::Codec;

    #[test]
    fn poll_timeout_is_when_the_next_report_becomes_due() {
        let format = AudioFormat::new(Codec::L16, 48_000, 1).expect("format");
        let mut sender = Sender::new(SenderConfig::new(format, 64)).expect("sender");
        let mut r = Receiver::new(ReceiverConfig::new(1));
        let mut out = [0u8; 1500];
        assert_eq!(r.poll_timeout(), Some(0), "the first call is due at once");
        assert_eq!(r.poll_rtcp(0, &mut out), None, "it starts the timer");
        // Virtual time: packets every 1.33 ms, and a report exactly when one is asked for.
        let mut packets = Vec::new();
        let mut reports = 0;
        let mut due = r.poll_timeout().expect("a report timer");
        assert_eq!(due, 500_000_000, "the first report comes half a second in");
        let mut now = 0;
        while reports < 10 {
            now += 1_333_333;
            if now >= due {
                assert_eq!(r.poll_rtcp(due - 1, &mut out), None, "not due 1 ns early");
                assert!(r.poll_rtcp(due, &mut out).is_some(), "due at {due}");
                reports += 1;
                let next = r.poll_timeout().expect("the next report");
                assert!(
                    (due + 500_000_000..=due + 1_500_000_000).contains(&next),
                    "{next} is not 0.5 to 1.5 s after {due}"
                );
                due = next;
            }
            sender.push_frames(now, &[0.0; 64], |p| packets.push(p.to_vec()));
            for p in packets.drain(..) {
                r.on_datagram(now, &p);
            }
        }
        assert_eq!(r.stats().rtcp_sent, 10);
    }
}
