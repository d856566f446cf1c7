//! Packetization advice: which frames-per-packet gives the lowest mouth-to-ear latency on a
//! measured link.
//!
//! `netjam sweep` pings the link with the packet sizes and rates an audio stream of the
//! given format would use at each candidate frames-per-packet (plus a few extra rates for
//! context) and hands the results here. The expected latency of a candidate is, for the
//! worse of the two directions:
//!
//! ```text
//! packet time (frames / sample rate)       the sender waits for a packet's worth of audio
//! + jitter buffer (PDV p99, RFC 5481)       playout waits for 99 % of packets to arrive
//! + minimum one-way delay (estimated)       the wire itself
//! ```
//!
//! Candidates whose loss exceeds the limit are set aside. Pure functions, no I/O.

use serde::{Deserialize, Serialize};

use super::stats::ProbeSummary;

/// Bytes of an RTP header.
pub const RTP_HEADER_LEN: usize = 12;
/// Bytes of netjam's audio format header extension.
pub const FORMAT_EXTENSION_LEN: usize = 8;
/// The frames-per-packet values considered.
pub const FRAMES_PER_PACKET: [u32; 6] = [16, 32, 64, 128, 256, 512];
/// Extra packet rates measured for context (packets per second).
pub const EXTRA_RATES: [f64; 2] = [50.0, 8000.0];
/// Largest probe size the sweep sends for the extra rates (keeps them below a typical MTU).
pub const EXTRA_MAX_SIZE: usize = 1200;

/// Sample encoding of the audio stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SampleFormat {
    L16,
    L24,
    F32,
    /// Opus at a constant bitrate (kbit/s for the whole stream).
    Opus {
        kbps: u32,
    },
}

impl SampleFormat {
    /// Bytes per sample of one channel; 0 for Opus, whose size follows its bitrate.
    pub fn bytes(self) -> usize {
        match self {
            SampleFormat::L16 => 2,
            SampleFormat::L24 => 3,
            SampleFormat::F32 => 4,
            SampleFormat::Opus { .. } => 0,
        }
    }
}

/// The audio stream a sweep plans for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AudioFormat {
    pub sample: SampleFormat,
    pub rate_hz: u32,
    pub channels: u16,
}

impl AudioFormat {
    /// UDP payload size of one packet of `frames` frames.
    pub fn packet_size(&self, frames: u32) -> usize {
        let audio = match self.sample {
            SampleFormat::Opus { kbps } => {
                let bits = u64::from(kbps) * 1000 * u64::from(frames) / u64::from(self.rate_hz.max(1));
                bits.div_ceil(8) as usize
            }
            s => frames as usize * self.channels as usize * s.bytes(),
        };
        RTP_HEADER_LEN + FORMAT_EXTENSION_LEN + audio
    }

    /// The frames-per-packet values a sender of this format can use: 16 to 512 for PCM,
    /// Opus's 2.5, 5, 10 and 20 ms frames for Opus.
    pub fn candidate_frames(&self) -> &'static [u32] {
        match self.sample {
            SampleFormat::Opus { .. } => &crate::codec::OPUS_FRAME_SIZES,
            _ => &FRAMES_PER_PACKET,
        }
    }

    /// Delay the codec adds on top of the packet time, ms (Opus's look-ahead in its
    /// restricted-low-delay mode).
    pub fn codec_delay_ms(&self) -> f64 {
        match self.sample {
            SampleFormat::Opus { .. } => 2.5,
            _ => 0.0,
        }
    }

    /// Packet time of `frames` frames in milliseconds.
    pub fn packet_time_ms(&self, frames: u32) -> f64 {
        frames as f64 * 1000.0 / self.rate_hz.max(1) as f64
    }
}

/// One point of the sweep grid.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    /// Frames per packet, for the candidates; `None` for extra context rates.
    pub frames: Option<u32>,
    pub packet_rate: f64,
    pub size_bytes: usize,
}

/// The grid for `format`: one point per candidate frames-per-packet, then the extra rates
/// (with the size an audio packet at that rate would have, capped at [`EXTRA_MAX_SIZE`]).
/// Points are ordered by packet rate.
pub fn sweep_grid(format: &AudioFormat) -> Vec<SweepPoint> {
    let rate = format.rate_hz.max(1) as f64;
    let mut pts: Vec<SweepPoint> = format
        .candidate_frames()
        .iter()
        .map(|&f| SweepPoint {
            frames: Some(f),
            packet_rate: rate / f as f64,
            size_bytes: format.packet_size(f),
        })
        .collect();
    for r in EXTRA_RATES {
        if pts.iter().any(|p| (p.packet_rate - r).abs() < 1.0) {
            continue;
        }
        let frames = (rate / r).round().max(1.0) as u32;
        pts.push(SweepPoint {
            frames: None,
            packet_rate: r,
            size_bytes: format.packet_size(frames).min(EXTRA_MAX_SIZE),
        });
    }
    pts.sort_by(|a, b| a.packet_rate.total_cmp(&b.packet_rate));
    pts
}

/// What was measured at one point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PointResult {
    pub point: SweepPoint,
    pub rtt_median_ms: f64,
    pub send_min_ms: f64,
    pub receive_min_ms: f64,
    pub send_pdv_p99_ms: f64,
    pub receive_pdv_p99_ms: f64,
    pub send_loss_pct: f64,
    pub receive_loss_pct: f64,
    pub loss_pct: f64,
    pub received: u64,
}

impl PointResult {
    /// Take the figures a recommendation needs from a ping summary.
    pub fn from_summary(point: SweepPoint, s: &ProbeSummary) -> Self {
        Self {
            point,
            rtt_median_ms: s.round_trip.delay.median_ms,
            send_min_ms: s.send.delay.min_ms,
            receive_min_ms: s.receive.delay.min_ms,
            send_pdv_p99_ms: s.send.pdv.p99_ms,
            receive_pdv_p99_ms: s.receive.pdv.p99_ms,
            send_loss_pct: s.send.loss_pct,
            receive_loss_pct: s.receive.loss_pct,
            loss_pct: s.loss_pct,
            received: s.received,
        }
    }
}

/// The expected latency of one candidate.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub frames: u32,
    pub packet_rate: f64,
    pub size_bytes: usize,
    pub packet_time_ms: f64,
    pub jitter_buffer_ms: f64,
    pub one_way_ms: f64,
    pub expected_ms: f64,
    /// The worse direction's loss.
    pub loss_pct: f64,
    pub within_loss_limit: bool,
}

/// The advice of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recommendation {
    /// The chosen candidate, if any point was measured at all.
    pub best: Option<Candidate>,
    /// Every candidate, by frames per packet.
    pub candidates: Vec<Candidate>,
    pub loss_limit_pct: f64,
    /// One sentence with the numbers.
    pub reason: String,
}

fn candidate(format: &AudioFormat, r: &PointResult, loss_limit_pct: f64) -> Option<Candidate> {
    let frames = r.point.frames?;
    if r.received == 0 {
        return None;
    }
    let packet_time = format.packet_time_ms(frames);
    let up = r.send_min_ms + r.send_pdv_p99_ms;
    let down = r.receive_min_ms + r.receive_pdv_p99_ms;
    let (one_way, jb) = if up >= down {
        (r.send_min_ms, r.send_pdv_p99_ms)
    } else {
        (r.receive_min_ms, r.receive_pdv_p99_ms)
    };
    let loss = r.send_loss_pct.max(r.receive_loss_pct).max(0.0);
    Some(Candidate {
        frames,
        packet_rate: r.point.packet_rate,
        size_bytes: r.point.size_bytes,
        packet_time_ms: packet_time,
        jitter_buffer_ms: jb.max(0.0),
        one_way_ms: one_way.max(0.0),
        expected_ms: packet_time + format.codec_delay_ms() + jb.max(0.0) + one_way.max(0.0),
        loss_pct: loss,
        within_loss_limit: loss <= loss_limit_pct,
    })
}

/// Choose the frames-per-packet with the lowest expected mouth-to-ear latency among those
/// within `loss_limit_pct`; ties go to the larger packet (fewer packets per second).
pub fn recommend(format: &AudioFormat, results: &[PointResult], loss_limit_pct: f64) -> Recommendation {
    let mut candidates: Vec<Candidate> = results
        .iter()
        .filter_map(|r| candidate(format, r, loss_limit_pct))
        .collect();
    candidates.sort_by_key(|c| c.frames);
    let better = |a: &&Candidate, b: &&Candidate| {
        a.expected_ms
            .total_cmp(&b.expected_ms)
            .then(b.frames.cmp(&a.frames))
    };
    let within = candidates
        .iter()
        .filter(|c| c.within_loss_limit)
        .min_by(better)
        .copied();
    let best = within.or_else(|| {
        candidates
            .iter()
            .min_by(|a, b| a.loss_pct.total_cmp(&b.loss_pct).then(better(a, b)))
            .copied()
    });
    let reason = match (&best, within.is_some()) {
        (None, _) => "no point of the sweep got any reply, so there is nothing to recommend".to_string(),
        (Some(c), ok) => {
            let mut s = format!(
                "use {} frames per packet ({:.2} ms, {:.0} packets/s, {} bytes): expected mouth-to-ear \
                 {:.2} ms = {:.2} ms packet + {:.2} ms jitter buffer (PDV p99) + {:.2} ms one-way (estimate), \
                 with {:.2} % loss",
                c.frames,
                c.packet_time_ms,
                c.packet_rate,
                c.size_bytes,
                c.expected_ms,
                c.packet_time_ms,
                c.jitter_buffer_ms,
                c.one_way_ms,
                c.loss_pct
            );
            if ok {
                s.push_str(&format!(" (limit {} %)", loss_limit_pct));
            } else {
                s.push_str(&format!(
                    ", the least of all points, but above the {} % limit: no packetization meets it",
                    loss_limit_pct
                ));
            }
            // Why not the next smaller packet (or, for the smallest, the next larger)?
            if let Some(larger) = candidates
                .iter()
                .find(|o| o.frames > c.frames)
                .filter(|_| !candidates.iter().any(|o| o.frames < c.frames))
            {
                s.push_str(&format!(
                    "; {} frames would give {:.2} ms",
                    larger.frames, larger.expected_ms
                ));
            }
            if let Some(smaller) = candidates.iter().rev().find(|o| o.frames < c.frames) {
                if !smaller.within_loss_limit {
                    s.push_str(&format!(
                        "; {} frames lost {:.2} %, over the limit",
                        smaller.frames, smaller.loss_pct
                    ));
                } else {
                    s.push_str(&format!(
                        "; {} frames would give {:.2} ms because its jitter buffer needs {:.2} ms",
                        smaller.frames, smaller.expected_ms, smaller.jitter_buffer_ms
                    ));
                }
            }
            s
        }
    };
    Recommendation {
        best,
        candidates,
        loss_limit_pct,
        reason,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn fmt() -> AudioFormat {
        AudioFormat {
            sample: SampleFormat::L16,
            rate_hz: 48_000,
            channels: 2,
        }
    }

    #[test]
    fn opus_candidates_are_its_frame_sizes_with_packets_sized_by_bitrate() {
        let f = AudioFormat {
            sample: SampleFormat::Opus { kbps: 192 },
            rate_hz: 48_000,
            channels: 2,
        };
        let frames: Vec<_> = sweep_grid(&f).iter().filter_map(|p| p.frames).collect();
        assert_eq!(frames, [960, 480, 240, 120]);
        // 192 kbit/s for 2.5 ms = 60 bytes of audio after the RTP header and extension.
        assert_eq!(f.packet_size(120), RTP_HEADER_LEN + FORMAT_EXTENSION_LEN + 60);
        assert_eq!(f.codec_delay_ms(), 2.5);
    }

    fn result(frames: u32, one_way: f64, pdv_p99: f64, loss: f64) -> PointResult {
        let f = fmt();
        PointResult {
            point: SweepPoint {
                frames: Some(frames),
                packet_rate: 48_000.0 / frames as f64,
                size_bytes: f.packet_size(frames),
            },
            rtt_median_ms: 2.0 * one_way,
            send_min_ms: one_way,
            receive_min_ms: one_way,
            send_pdv_p99_ms: pdv_p99,
            receive_pdv_p99_ms: pdv_p99 / 2.0,
            send_loss_pct: loss,
            receive_loss_pct: 0.0,
            loss_pct: loss,
            received: 1000,
        }
    }

    #[test]
    fn grid_follows_the_audio_format() {
        let g = sweep_grid(&fmt());
        let c: Vec<_> = g.iter().filter(|p| p.frames.is_some()).collect();
        assert_eq!(c.len(), 6);
        let p64 = g.iter().find(|p| p.frames == Some(64)).unwrap();
        assert_eq!(p64.size_bytes, 12 + 8 + 64 * 2 * 2);
        assert!((p64.packet_rate - 750.0).abs() < 1e-9);
        assert!(g.iter().any(|p| p.frames.is_none() && p.packet_rate == 50.0));
        assert!(g.iter().any(|p| p.frames.is_none() && p.packet_rate == 8000.0));
        assert!(g.windows(2).all(|w| w[0].packet_rate <= w[1].packet_rate));
        let l24 = AudioFormat {
            sample: SampleFormat::L24,
            rate_hz: 44_100,
            channels: 1,
        };
        assert_eq!(l24.packet_size(128), 20 + 384);
    }

    #[test]
    fn picks_lowest_latency_within_the_loss_limit() {
        // 16 frames: 0.33 ms packet but 5 % loss; 32: 0.67 + 3.0 + 19 = 22.67;
        // 64: 1.33 + 1.0 + 19 = 21.33; 128: 2.67 + 0.5 + 19 = 22.17.
        let rs = [
            result(16, 19.0, 0.2, 5.0),
            result(32, 19.0, 3.0, 0.0),
            result(64, 19.0, 1.0, 0.1),
            result(128, 19.0, 0.5, 0.0),
        ];
        let r = recommend(&fmt(), &rs, 1.0);
        let b = r.best.unwrap();
        assert_eq!(b.frames, 64);
        assert!((b.expected_ms - (64.0 / 48.0 + 1.0 + 19.0)).abs() < 1e-9);
        assert!(r.reason.contains("64 frames"), "{}", r.reason);
        assert!(r.reason.contains("21.33"), "{}", r.reason);
        assert!(r.reason.contains("32 frames would give 22.67"), "{}", r.reason);
        assert!(!r.candidates[0].within_loss_limit);
    }

    #[test]
    fn smaller_packets_win_on_a_clean_link_and_loss_limit_is_explained() {
        let rs = [result(16, 19.0, 0.1, 2.0), result(32, 19.0, 0.1, 0.0)];
        let r = recommend(&fmt(), &rs, 1.0);
        assert_eq!(r.best.unwrap().frames, 32);
        assert!(r.reason.contains("16 frames lost 2.00 %"), "{}", r.reason);
        let r = recommend(&fmt(), &rs, 5.0);
        assert_eq!(r.best.unwrap().frames, 16);
        assert!(r.reason.contains("32 frames would give 19.77"), "{}", r.reason);
    }

    #[test]
    fn nothing_meets_the_limit_or_nothing_measured() {
        let rs = [result(16, 19.0, 0.1, 9.0), result(32, 19.0, 0.1, 3.0)];
        let r = recommend(&fmt(), &rs, 1.0);
        assert_eq!(r.best.unwrap().frames, 32);
        assert!(r.reason.contains("no packetization meets it"), "{}", r.reason);
        let r = recommend(&fmt(), &[], 1.0);
        assert!(r.best.is_none());
    }
}
