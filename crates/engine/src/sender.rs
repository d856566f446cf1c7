//! The sending half of a stream: frames in, RTP and RTCP packets out.
//!
//! [`Sender`] packetizes interleaved frames into RTP packets of a fixed number of frames,
//! optionally carrying the previous packets again as RFC 2198 redundancy so a receiver
//! can rebuild a lost packet from the next one. Every packet carries netjam's format
//! extension, so a netjam receiver learns codec, rate and channels by itself. About once a
//! second it produces an RTCP sender report with SDES (CNAME and name); receiver reports
//! coming back give the round-trip time and the far side's loss and jitter.
//!
//! Against a reflector (which sends everything back unchanged, RTCP included) our own
//! sender report returns: then the round trip is the time from sending that report to its
//! return, and the reports of our own receiver coming back are not used for it (their
//! LSR/DLSR would span the loop twice).
//!
//! Sans-IO and realtime-safe: buffers are reserved in [`Sender::new`]; `push_frames`,
//! `poll_rtcp` and `on_rtcp` never allocate, lock or block. Time is passed in.

use crate::codec::{FrameEncoder, OPUS_FRAME_SIZES};
use crate::rng::SimRng;
use crate::time::frames_to_ns;
use crate::wire::red::{write_red, RedBlock, MAX_RED_BLOCKS};
use crate::wire::rtcp::{
    parse_rtcp, rtt_ns, write_bye, write_sdes, write_sender_report, NtpTime, RtcpPacket, SenderInfo,
};
use crate::wire::{encode, format_extension, write_rtp, AudioFormat, RtpHeader, RED_PAYLOAD_TYPE};

/// Largest UDP payload over IPv4.
pub const MAX_DATAGRAM: usize = 65_507;
/// Largest UDP payload that crosses a 1500-byte Ethernet MTU without fragmentation.
pub const MTU_PAYLOAD: usize = 1_472;
/// Frames per packet netjam accepts.
pub const FRAMES_PER_PACKET: std::ops::RangeInclusive<u32> = 16..=1024;
/// Largest RFC 2198 block.
const RED_BLOCK_MAX: usize = crate::wire::red::MAX_RED_BLOCK_LEN;
/// Header room: RTP header, format extension, RED headers.
/// Largest Opus packet netjam sends (one frame, RFC 6716 section 3.2.1).
const MAX_OPUS_PACKET: usize = 1275;
const HEADER_ROOM: usize = 12 + 4 + 8 + 4 * MAX_RED_BLOCKS + 1;

/// Why a sender cannot be built with these settings; each says what to change.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum SenderError {
    #[error("{0} frames per packet is out of range: use 16 to 1024")]
    FramesOutOfRange(u32),
    #[error("redundancy {0} is too high: use 0 to {MAX_RED_BLOCKS}")]
    RedundancyTooHigh(usize),
    #[error("a packet would be {bytes} bytes, more than UDP can carry ({MAX_DATAGRAM}): use fewer frames per packet, fewer channels or less redundancy")]
    PacketTooLarge { bytes: usize },
    #[error("opus sends 120, 240, 480 or 960 frames per packet (2.5, 5, 10 or 20 ms), not {0}: use --frames 120 for the lowest delay")]
    OpusFrames(u32),
    #[error("opus needs an encoder (libopus): install it (Debian: apt install libopus0), or use l16/l24")]
    NoEncoder,
    #[error("redundancy needs each packet's audio to fit in {RED_BLOCK_MAX} bytes (RFC 2198), but it is {bytes}: use fewer frames per packet, fewer channels or a smaller codec")]
    RedundantBlockTooLarge { bytes: usize },
}

/// Everything a sender is configured with.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    pub format: AudioFormat,
    pub frames_per_packet: u32,
    /// How many previous packets each packet carries again (0 = none).
    pub redundancy: usize,
    /// Seeds SSRC, first sequence number and first timestamp (RFC 3550 wants them random).
    pub seed: u64,
    /// RTCP CNAME (e.g. user@host).
    pub cname: String,
    /// A human name for the player, sent in SDES.
    pub name: Option<String>,
    /// Unix time minus the monotonic clock, in ns, for RTCP's wall-clock fields.
    pub wall_offset_ns: i64,
}

impl SenderConfig {
    /// `format` in packets of `frames_per_packet`, without redundancy; seed 0, CNAME
    /// `netjam`, no name, wall clock equal to the monotonic one. Override fields as needed:
    /// `SenderConfig { redundancy: 1, ..SenderConfig::new(format, 64) }`.
    pub fn new(format: AudioFormat, frames_per_packet: u32) -> Self {
        Self {
            format,
            frames_per_packet,
            redundancy: 0,
            seed: 0,
            cname: "netjam".into(),
            name: None,
            wall_offset_ns: 0,
        }
    }
}

/// Counters of what the sender did and what the far side reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SenderStats {
    pub packets: u64,
    pub bytes: u64,
    pub frames: u64,
    /// Packets the encoder failed on (not sent; the receiver conceals them).
    pub encode_errors: u64,
    /// Frames the device never captured (skipped cycles), left as a gap in the timeline.
    pub skipped_frames: u64,
    /// Delay the encoder adds on top of packetization (Opus's look-ahead), ms.
    pub codec_delay_ms: f64,
    pub rtcp_sent: u64,
    pub rtcp_received: u64,
    pub rtcp_malformed: u64,
    /// Round-trip time from the last receiver report (LSR/DLSR), or, against a
    /// reflector, from our own last sender report coming back; ms.
    pub rtt_ms: Option<f64>,
    /// The least of the last few round trips (`RECENT_RTTS`, about as many seconds): the
    /// path's own share, without a stall of either host at the moment of one report; ms.
    pub rtt_floor_ms: Option<f64>,
    /// Our own sender reports that came back (a reflector on the path).
    pub rtcp_echoes: u64,
    /// The far side's view: fraction lost in the last interval (0..1), cumulative lost,
    /// RFC 3550 interarrival jitter (ms).
    pub remote_fraction_lost: Option<f64>,
    pub remote_cumulative_lost: Option<i64>,
    pub remote_jitter_ms: Option<f64>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Sender {
    config: SenderConfig,
    ssrc: u32,
    seq: u16,
    /// Timestamp of the next packet's first frame.
    ts: u32,
    /// Frames waiting to fill a packet.
    pending: Vec<f32>,
    pending_frames: usize,
    /// Encoded payloads of the last packets, newest last, for redundancy.
    history: Vec<u8>,
    history_len: Vec<usize>,
    history_count: usize,
    payload_bytes: usize,
    packet: Vec<u8>,
    primary: Vec<u8>,
    first: bool,
    encoder: Option<Box<dyn FrameEncoder>>,
    next_rtcp_ns: Option<u64>,
    /// The last sender reports sent: their NTP time and the monotonic time they left.
    sent_reports: [(NtpTime, u64); SENT_REPORTS],
    sent_report_count: usize,
    rng: SimRng,
    stats: SenderStats,
    /// The round trip to each receiver that reported on us: (its SSRC, ns), most recent
    /// reporters kept (a room's members each report).
    reporter_rtts: [(u32, u64); REPORTERS],
    /// The last round trips measured, ns (0: none yet), written in turn.
    recent_rtts: [u64; RECENT_RTTS],
    recent_rtt_count: usize,
}

/// Round trips kept for [`SenderStats::rtt_floor_ms`]: reports go out about once a second.
const RECENT_RTTS: usize = 8;

/// Receivers whose round trips are kept apart (the most members a room client hears).
const REPORTERS: usize = 16;

/// How many sent reports are remembered to recognise one coming back (a report goes out
/// about once a second, so this covers several seconds of round trip).
const SENT_REPORTS: usize = 8;

impl Sender {
    pub fn new(config: SenderConfig) -> Result<Self, SenderError> {
        Self::with_encoder(config, None)
    }

    /// A sender of a compressed format (Opus), encoding with `encoder`.
    pub fn with_encoder(
        config: SenderConfig,
        encoder: Option<Box<dyn FrameEncoder>>,
    ) -> Result<Self, SenderError> {
        let f = config.frames_per_packet;
        if !FRAMES_PER_PACKET.contains(&f) {
            return Err(SenderError::FramesOutOfRange(f));
        }
        if config.redundancy > MAX_RED_BLOCKS {
            return Err(SenderError::RedundancyTooHigh(config.redundancy));
        }
        let coded = !config.format.codec.is_pcm();
        if coded && !OPUS_FRAME_SIZES.contains(&f) {
            return Err(SenderError::OpusFrames(f));
        }
        if coded && encoder.is_none() {
            return Err(SenderError::NoEncoder);
        }
        // A compressed packet is at most one Opus frame's 1275 bytes, and fits a redundant
        // block when redundancy is on (the encoder is held to that).
        let payload_bytes = match (coded, config.redundancy > 0) {
            (false, _) => config.format.bytes_for_frames(f),
            (true, false) => MAX_OPUS_PACKET,
            (true, true) => RED_BLOCK_MAX,
        };
        if config.redundancy > 0 && payload_bytes > RED_BLOCK_MAX {
            return Err(SenderError::RedundantBlockTooLarge { bytes: payload_bytes });
        }
        let total = HEADER_ROOM + payload_bytes * (1 + config.redundancy);
        if total > MAX_DATAGRAM {
            return Err(SenderError::PacketTooLarge { bytes: total });
        }
        let mut rng = SimRng::new(config.seed);
        let ssrc = rng.next_u64() as u32;
        let seq = rng.next_u64() as u16;
        let ts = rng.next_u64() as u32;
        let ch = config.format.channels as usize;
        Ok(Self {
            ssrc,
            seq,
            ts,
            pending: vec![0.0; f as usize * ch],
            pending_frames: 0,
            history: vec![0; payload_bytes * config.redundancy.max(1)],
            history_len: vec![0; config.redundancy.max(1)],
            history_count: 0,
            payload_bytes,
            packet: vec![0; total],
            primary: vec![0; payload_bytes],
            first: true,
            encoder: if coded { encoder } else { None },
            next_rtcp_ns: None,
            sent_reports: [(NtpTime(0), 0); SENT_REPORTS],
            sent_report_count: 0,
            rng,
            stats: SenderStats::default(),
            reporter_rtts: [(0, 0); REPORTERS],
            recent_rtts: [0; RECENT_RTTS],
            recent_rtt_count: 0,
            config,
        })
    }

    pub fn ssrc(&self) -> u32 {
        self.ssrc
    }

    /// Send as `ssrc` from now on: a rooms server that found the seeded SSRC taken in the
    /// room assigns another. Call it before the first packet; a later change looks like a
    /// new stream to every receiver.
    pub fn set_ssrc(&mut self, ssrc: u32) {
        self.ssrc = ssrc;
    }

    pub fn format(&self) -> AudioFormat {
        self.config.format
    }

    pub fn frames_per_packet(&self) -> u32 {
        self.config.frames_per_packet
    }

    /// Bytes of the largest packet this sender emits.
    pub fn max_packet_bytes(&self) -> usize {
        self.packet.len()
    }

    /// Wall time one packet's audio spans.
    /// Frames of delay the encoder adds on top of packetization (its look-ahead).
    pub fn codec_delay_frames(&self) -> u32 {
        self.encoder.as_ref().map_or(0, |e| e.lookahead_frames())
    }

    pub fn packet_ns(&self) -> u64 {
        frames_to_ns(self.config.frames_per_packet as u64, self.config.format.rate)
    }

    pub fn stats(&self) -> SenderStats {
        let mut s = self.stats;
        s.codec_delay_ms = f64::from(self.codec_delay_frames()) * 1e3 / f64::from(self.config.format.rate);
        s.rtt_floor_ms = self.recent_rtts[..self.recent_rtt_count.min(RECENT_RTTS)]
            .iter()
            .min()
            .map(|&r| r as f64 / 1e6);
        s
    }

    /// A round trip measured now: the latest, and one of the recent ones the floor is taken of.
    fn note_rtt(&mut self, rtt_ns: u64) {
        self.stats.rtt_ms = Some(rtt_ns as f64 / 1e6);
        self.recent_rtts[self.recent_rtt_count % RECENT_RTTS] = rtt_ns;
        self.recent_rtt_count += 1;
    }

    /// The device captured nothing for `frames` frames (it skipped cycles): the stream's
    /// timeline moves on by as many, with the frames of an unfinished packet, so the
    /// receiver sees a gap to conceal rather than a sender whose clock fell behind.
    pub fn skip_frames(&mut self, frames: u64) {
        let gap = frames + self.pending_frames as u64;
        self.ts = self.ts.wrapping_add(gap as u32);
        self.pending_frames = 0;
        self.stats.skipped_frames += gap;
    }

    /// Feed interleaved frames captured just before `now_ns`; every complete packet is
    /// handed to `emit` as RTP bytes, in order.
    pub fn push_frames(&mut self, now_ns: u64, frames: &[f32], mut emit: impl FnMut(&[u8])) {
        let _ = now_ns;
        let ch = self.config.format.channels as usize;
        let per_packet = self.config.frames_per_packet as usize;
        let mut input = &frames[..frames.len() - frames.len() % ch];
        while !input.is_empty() {
            let room = per_packet - self.pending_frames;
            let take = room.min(input.len() / ch);
            let dst = self.pending_frames * ch;
            self.pending[dst..dst + take * ch].copy_from_slice(&input[..take * ch]);
            self.pending_frames += take;
            input = &input[take * ch..];
            if self.pending_frames == per_packet {
                let len = self.build_packet();
                if len > 0 {
                    emit(&self.packet[..len]);
                }
                self.pending_frames = 0;
            }
        }
    }

    fn build_packet(&mut self) -> usize {
        let fmt = self.config.format;
        let n = match self.encoder.as_mut() {
            None => encode(fmt.codec, &self.pending, &mut self.primary),
            Some(e) => match e.encode(&self.pending, &mut self.primary) {
                Ok(n) if n > 0 => n,
                _ => {
                    // Nothing to send: the receiver conceals the gap in the timeline.
                    self.stats.encode_errors += 1;
                    self.ts = self.ts.wrapping_add(self.config.frames_per_packet);
                    return 0;
                }
            },
        };
        debug_assert!(!fmt.codec.is_pcm() || n == self.payload_bytes);
        let red = self.config.redundancy > 0;
        let header = RtpHeader {
            marker: self.first,
            payload_type: if red { RED_PAYLOAD_TYPE } else { fmt.payload_type() },
            sequence: self.seq,
            timestamp: self.ts,
            ssrc: self.ssrc,
        };
        let mut ext_buf = [0u8; 8];
        let ext = format_extension(&fmt, &mut ext_buf);
        let payload_len = if red { self.red_len(n) } else { n };
        // Sizes were checked in `new`, so the buffer always fits.
        let Ok(hlen) = write_rtp(&header, Some(ext), payload_len, &mut self.packet) else {
            return 0;
        };
        let written = if red {
            let mut blocks = [RedBlock {
                payload_type: 0,
                timestamp_offset: 0,
                data: &[],
            }; MAX_RED_BLOCKS];
            let count = self.history_count;
            let f = self.config.frames_per_packet;
            for (i, b) in blocks.iter_mut().take(count).enumerate() {
                // Oldest first: history slot i holds the packet (count - i) packets ago.
                let age = count - i;
                let slot = self.history_slot(age);
                let len = self.history_len[slot];
                *b = RedBlock {
                    payload_type: fmt.payload_type(),
                    timestamp_offset: (age as u32 * f) as u16,
                    data: &self.history[slot * self.payload_bytes..slot * self.payload_bytes + len],
                };
            }
            write_red(
                fmt.payload_type(),
                &self.primary[..n],
                &blocks[..count],
                &mut self.packet[hlen..],
            )
            .unwrap_or(0)
        } else {
            self.packet[hlen..hlen + n].copy_from_slice(&self.primary[..n]);
            n
        };
        if red {
            self.remember_primary(n);
        }
        self.first = false;
        self.seq = self.seq.wrapping_add(1);
        self.ts = self.ts.wrapping_add(self.config.frames_per_packet);
        self.stats.packets += 1;
        self.stats.frames += self.config.frames_per_packet as u64;
        self.stats.bytes += (hlen + written) as u64;
        hlen + written
    }

    fn red_len(&self, primary: usize) -> usize {
        let blocks: usize = (1..=self.history_count)
            .map(|age| self.history_len[self.history_slot(age)])
            .sum();
        4 * self.history_count + 1 + blocks + primary
    }

    /// Ring slot of the packet `age` packets ago (1 = the previous one).
    fn history_slot(&self, age: usize) -> usize {
        let n = self.config.redundancy;
        (self.stats.packets as usize + n - age) % n
    }

    fn remember_primary(&mut self, n: usize) {
        let slot = self.stats.packets as usize % self.config.redundancy;
        let at = slot * self.payload_bytes;
        self.history[at..at + n].copy_from_slice(&self.primary[..n]);
        self.history_len[slot] = n;
        self.history_count = (self.history_count + 1).min(self.config.redundancy);
    }

    fn ntp(&self, now_ns: u64) -> NtpTime {
        NtpTime::from_unix_ns((now_ns as i64 + self.config.wall_offset_ns).max(0) as u64)
    }

    /// The RTP timestamp the next frame given to [`Sender::push_frames`] will carry, for
    /// callers that map the stream's media time to another clock (the ensemble's).
    pub fn next_rtp_timestamp(&self) -> u32 {
        self.rtp_now()
    }

    /// The RTP timestamp of the newest captured frame (for the sender report).
    fn rtp_now(&self) -> u32 {
        self.ts.wrapping_add(self.pending_frames as u32)
    }

    /// The latest time (monotonic ns, as given to [`Sender::poll_rtcp`]) at which
    /// `poll_rtcp` must be called next: the next sender report is due then. `None` while
    /// there is nothing to report (no packet sent yet: [`Sender::push_frames`] is what
    /// starts the stream). A time already past means now. A caller without an audio clock
    /// (a server) sleeps until this time, calls `poll_rtcp`, and asks again.
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.stats.packets == 0 {
            return None;
        }
        Some(self.next_rtcp_ns.unwrap_or(0))
    }

    /// When an RTCP report is due, write SR + SDES into `out` and return its length.
    /// Reports go out about once a second (randomised ±50 % as RFC 3550 asks); call it no
    /// later than [`Sender::poll_timeout`].
    pub fn poll_rtcp(&mut self, now_ns: u64, out: &mut [u8]) -> Option<usize> {
        let due = *self.next_rtcp_ns.get_or_insert(now_ns);
        if now_ns < due || self.stats.packets == 0 {
            return None;
        }
        self.next_rtcp_ns = Some(now_ns + (self.rng.uniform(0.5, 1.5) * 1e9) as u64);
        let len = self.write_report(now_ns, out)?;
        self.stats.rtcp_sent += 1;
        Some(len)
    }

    fn write_report(&mut self, now_ns: u64, out: &mut [u8]) -> Option<usize> {
        let ntp = self.ntp(now_ns);
        self.sent_reports[self.sent_report_count % SENT_REPORTS] = (ntp, now_ns);
        self.sent_report_count += 1;
        let info = SenderInfo {
            ntp,
            rtp_timestamp: self.rtp_now(),
            packet_count: self.stats.packets as u32,
            octet_count: self.stats.bytes as u32,
        };
        let a = write_sender_report(self.ssrc, &info, &[], out).ok()?;
        let b = write_sdes(
            self.ssrc,
            &self.config.cname,
            self.config.name.as_deref(),
            &mut out[a..],
        )
        .ok()?;
        Some(a + b)
    }

    /// A final SR + BYE for a clean stop.
    pub fn bye(&mut self, now_ns: u64, out: &mut [u8]) -> Option<usize> {
        let a = self.write_report(now_ns, out)?;
        let b = write_bye(self.ssrc, Some("stopped"), &mut out[a..]).ok()?;
        self.stats.rtcp_sent += 1;
        Some(a + b)
    }

    /// When the sender report with NTP time `ntp` left, if it is one of ours.
    fn sent_report(&self, ntp: NtpTime) -> Option<u64> {
        self.sent_reports[..self.sent_report_count.min(SENT_REPORTS)]
            .iter()
            .find(|(t, _)| *t == ntp)
            .map(|(_, at)| *at)
    }

    /// The round trip to the receiver that reports as `reporter` (in a room: that member,
    /// through the server), from its last report on us; ms.
    pub fn rtt_to_ms(&self, reporter: u32) -> Option<f64> {
        self.reporter_rtts
            .iter()
            .find(|(ssrc, rtt)| *ssrc == reporter && *rtt > 0)
            .map(|(_, rtt)| *rtt as f64 / 1e6)
    }

    fn note_reporter_rtt(&mut self, reporter: u32, rtt_ns: u64) {
        let rtt_ns = rtt_ns.max(1);
        let slot = match self
            .reporter_rtts
            .iter()
            .position(|(s, r)| *s == reporter && *r > 0)
        {
            Some(i) => i,
            None => {
                // A new reporter takes the place of the first empty one, else the oldest.
                let i = self.reporter_rtts.iter().position(|(_, r)| *r == 0).unwrap_or(0);
                if self.reporter_rtts[i].1 > 0 {
                    self.reporter_rtts.rotate_left(1);
                    REPORTERS - 1
                } else {
                    i
                }
            }
        };
        self.reporter_rtts[slot] = (reporter, rtt_ns);
    }

    /// Take an RTCP packet from the receiver: report blocks about our SSRC give RTT,
    /// loss and jitter. Our own sender report coming back (a reflector) gives RTT directly.
    pub fn on_rtcp(&mut self, now_ns: u64, bytes: &[u8]) {
        self.stats.rtcp_received += 1;
        let arrival = self.ntp(now_ns).middle32();
        for packet in parse_rtcp(bytes) {
            let (reporter, reports) = match packet {
                Ok(RtcpPacket::ReceiverReport { ssrc, reports }) => (ssrc, reports),
                Ok(RtcpPacket::SenderReport { ssrc, info, reports }) => {
                    if ssrc == self.ssrc {
                        if let Some(sent) = self.sent_report(info.ntp) {
                            if let Some(rtt) = now_ns.checked_sub(sent) {
                                self.stats.rtcp_echoes += 1;
                                self.note_rtt(rtt);
                            }
                        }
                    }
                    (ssrc, reports)
                }
                Ok(_) => continue,
                Err(_) => {
                    self.stats.rtcp_malformed += 1;
                    break;
                }
            };
            for block in reports {
                if block.ssrc != self.ssrc {
                    continue;
                }
                // Once our reports come back by themselves, the report blocks about us are
                // our own receiver's, and their LSR/DLSR would count the loop twice.
                if self.stats.rtcp_echoes == 0 {
                    if let Some(rtt) = rtt_ns(arrival, block.lsr, block.dlsr) {
                        self.note_rtt(rtt);
                        self.note_reporter_rtt(reporter, rtt);
                    }
                }
                self.stats.remote_fraction_lost = Some(block.fraction_lost as f64 / 256.0);
                self.stats.remote_cumulative_lost = Some(block.cumulative_lost as i64);
                self.stats.remote_jitter_ms =
                    Some(block.jitter as f64 * 1000.0 / self.config.format.rate as f64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Codec;

    fn sender() -> Sender {
        let format = AudioFormat::new(Codec::L16, 48_000, 1).expect("format");
        Sender::new(SenderConfig::new(format, 64)).expect("sender")
    }

    /// RTP timestamps of the packets `frames` make.
    fn stamps(s: &mut Sender, frames: usize) -> Vec<u32> {
        let mut ts = Vec::new();
        s.push_frames(0, &vec![0.0; frames], |p| {
            ts.push(crate::wire::parse_rtp(p).expect("rtp").header.timestamp);
        });
        ts
    }

    #[test]
    fn frames_never_captured_leave_a_gap_in_the_timeline() {
        let mut s = sender();
        let first = stamps(&mut s, 64)[0];
        // 32 frames of a packet, then a dropped cycle of 64: the half packet goes with it.
        assert!(stamps(&mut s, 32).is_empty());
        s.skip_frames(64);
        let next = stamps(&mut s, 64);
        assert_eq!(next, [first.wrapping_add(64 + 32 + 64)]);
        assert_eq!(s.stats().skipped_frames, 96);
    }

    #[test]
    fn each_reporter_keeps_its_own_round_trip() {
        use crate::wire::rtcp::{write_receiver_report, ReportBlock};
        let mut s = sender();
        s.push_frames(0, &[0.0; 64], |_| {});
        let mut out = [0u8; 1500];
        let sent_at = 1_000_000_000;
        s.poll_rtcp(sent_at, &mut out).expect("a report is due");
        let lsr = s.ntp(sent_at).middle32();
        // Two members answer our report: one after 20 ms, one after 50 ms, each having
        // held it 5 ms (DLSR in 1/65536 s).
        let report = |reporter: u32, back_ns: u64, s: &mut Sender| {
            let block = ReportBlock {
                ssrc: s.ssrc(),
                fraction_lost: 0,
                cumulative_lost: 0,
                highest_seq: 0,
                jitter: 0,
                lsr,
                dlsr: (0.005 * 65_536.0) as u32,
            };
            let mut rr = [0u8; 64];
            let n = write_receiver_report(reporter, &[block], &mut rr).expect("fits");
            s.on_rtcp(sent_at + back_ns, &rr[..n]);
        };
        report(0xa, 20_000_000, &mut s);
        report(0xb, 50_000_000, &mut s);
        let near = s.rtt_to_ms(0xa).expect("a reported");
        let far = s.rtt_to_ms(0xb).expect("b reported");
        assert!((near - 15.0).abs() < 0.1, "{near}");
        assert!((far - 45.0).abs() < 0.1, "{far}");
        assert_eq!(s.rtt_to_ms(0xc), None);
        // More reporters than are kept: the oldest goes, the newest stays.
        for r in 0..20u32 {
            report(0x100 + r, 30_000_000, &mut s);
        }
        assert_eq!(s.rtt_to_ms(0xa), None);
        assert!(s.rtt_to_ms(0x100 + 19).is_some());
    }

    #[test]
    fn our_own_report_coming_back_gives_the_round_trip() {
        let mut s = sender();
        s.push_frames(0, &[0.0; 64], |_| {});
        let mut out = [0u8; 1500];
        let n = s.poll_rtcp(1_000_000, &mut out).expect("a report is due");
        s.on_rtcp(1_000_000 + 38_000_000, &out[..n]);
        assert_eq!(s.stats().rtt_ms, Some(38.0));
        assert_eq!(s.stats().rtcp_echoes, 1);
        // A later report held up 5 ms by a stall: the latest says so, the floor keeps the path's.
        let n = s
            .poll_rtcp(2_000_000_000, &mut out)
            .expect("the next report is due");
        s.on_rtcp(2_000_000_000 + 43_000_000, &out[..n]);
        assert_eq!(s.stats().rtt_ms, Some(43.0));
        assert_eq!(s.stats().rtt_floor_ms, Some(38.0));
    }

    #[test]
    fn a_report_with_our_ssrc_but_a_time_we_never_sent_is_not_an_echo() {
        let mut s = sender();
        s.push_frames(0, &[0.0; 64], |_| {});
        let mut out = [0u8; 1500];
        s.poll_rtcp(1_000_000, &mut out).expect("a report is due");
        let info = SenderInfo {
            ntp: NtpTime::from_unix_ns(5_000_000),
            ..SenderInfo::default()
        };
        let n = write_sender_report(s.ssrc(), &info, &[], &mut out).expect("fits");
        s.on_rtcp(40_000_000, &out[..n]);
        assert_eq!(s.stats().rtt_ms, None);
        assert_eq!(s.stats().rtcp_echoes, 0);
    }

    #[test]
    fn poll_timeout_is_when_the_next_report_becomes_due() {
        let mut s = sender();
        let mut out = [0u8; 1500];
        assert_eq!(
            s.poll_timeout(),
            None,
            "nothing to report before the first packet"
        );
        s.push_frames(0, &[0.0; 64], |_| {});
        let first = s.poll_timeout().expect("a report to send");
        assert!(first <= 1_000_000, "the first report is due at once");
        s.poll_rtcp(1_000_000, &mut out).expect("a report is due");
        // Virtual time: each report comes exactly at the time asked for, never before.
        let mut now = 1_000_000;
        for _ in 0..20 {
            let due = s.poll_timeout().expect("the next report");
            assert!(
                (now + 500_000_000..=now + 1_500_000_000).contains(&due),
                "{due} is not 0.5 to 1.5 s after {now}"
            );
            assert_eq!(s.poll_rtcp(due - 1, &mut out), None, "not due 1 ns early");
            assert_eq!(s.poll_timeout(), Some(due), "an early call does not move it");
            assert!(s.poll_rtcp(due, &mut out).is_some(), "due at {due}");
            now = due;
        }
        assert_eq!(s.stats().rtcp_sent, 21);
    }
}
