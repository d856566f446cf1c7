//! `--delay-to-beat`: each remote player heard exactly one beat (or bar) after they played,
//! in time with the ensemble's shared beat, the way NINJAM makes long distances playable.
//!
//! The sender ties its stream's media time to ensemble time: its audio thread publishes a
//! [`StreamMark`] (this RTP timestamp was captured at that ensemble time) and its ensemble
//! thread sends the latest one, four times a second, to every other player's `jam…`
//! service. At the receiver, the frame about to be heard (the jitter buffer's playout
//! timestamp) thus has a capture time in ensemble time, and the time it will sound is
//! the period's ensemble time plus the device's output latency. [`DelayLine`] adds
//! what is missing to make the two one beat apart, after the receiver: playout itself is
//! left alone. A stream that already arrives later than a beat plays as it comes, and
//! the status line says so.
//!
//! [`DelayLine::process`] runs on the audio thread: it never allocates, locks or blocks
//! (its ring is reserved in [`DelayLine::new`]).

use netjam_ensemble::publish::Words;

/// This stream's RTP timestamp `rtp_ts` was captured at ensemble time `ensemble_ns`, at
/// `rate` frames a second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamMark {
    pub ssrc: u32,
    pub rtp_ts: u32,
    pub ensemble_ns: u64,
    pub rate: u32,
}

impl Words for StreamMark {
    type Packed = [u64; 3];
    fn pack(&self) -> [u64; 3] {
        [
            (u64::from(self.ssrc) << 32) | u64::from(self.rtp_ts),
            self.ensemble_ns,
            u64::from(self.rate),
        ]
    }
    fn unpack(w: &[u64; 3]) -> Self {
        Self {
            ssrc: (w[0] >> 32) as u32,
            rtp_ts: w[0] as u32,
            ensemble_ns: w[1],
            rate: w[2] as u32,
        }
    }
}

impl StreamMark {
    /// The ensemble time (ns) at which frame `rtp_ts` of this stream was captured, taking
    /// the timestamp within ±2^31 frames of the mark's.
    pub fn capture_ns(&self, rtp_ts: u32) -> i128 {
        let frames = i128::from(rtp_ts.wrapping_sub(self.rtp_ts) as i32);
        i128::from(self.ensemble_ns) + frames * 1_000_000_000 / i128::from(self.rate.max(1))
    }
}

/// What the jam's process tells the beat about its streams (absent by default).
pub trait Streams {
    /// The stream sent: (SSRC, the RTP timestamp of the next frame given to it, rate).
    fn sent(&self) -> Option<(u32, u32, u32)> {
        None
    }
    /// The stream heard: (SSRC, RTP timestamp of the next period's first output frame).
    fn heard(&self) -> Option<(u32, u32)> {
        None
    }
}

impl Streams for crate::session::JamProcess {
    fn sent(&self) -> Option<(u32, u32, u32)> {
        let sender = self.media().sender();
        Some((sender.ssrc(), sender.next_rtp_timestamp(), sender.format().rate))
    }
    fn heard(&self) -> Option<(u32, u32)> {
        self.heard()?.next_output_ts()
    }
}

/// A room's players: the click only (`--delay-to-beat` is refused with `--room`).
impl Streams for crate::session::RoomProcess {}

impl<P: Streams> Streams for crate::resample::EdgeProcess<P> {
    fn sent(&self) -> Option<(u32, u32, u32)> {
        self.inner().sent()
    }
    fn heard(&self) -> Option<(u32, u32)> {
        self.inner().heard()
    }
}

/// Where a delayed stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayState {
    /// No stream heard yet, or its capture times not known yet.
    Waiting,
    /// Heard one beat (or bar) after it was played: `added_ns` on top of the way.
    OnBeat { added_ns: u64 },
    /// It arrives `way_ns` after it was played, later than the `want_ns` asked for:
    /// heard as it comes.
    Late { way_ns: u64, want_ns: u64 },
}

impl DelayState {
    /// As one word for an atomic: 0 waiting, `2·added + 2` on the beat, `2·way + 1` late
    /// (the wanted delay travels apart).
    pub fn to_word(self) -> u64 {
        match self {
            DelayState::Waiting => 0,
            DelayState::OnBeat { added_ns } => added_ns.saturating_mul(2).saturating_add(2),
            DelayState::Late { way_ns, .. } => way_ns.saturating_mul(2).saturating_add(1),
        }
    }

    pub fn from_word(w: u64, want_ns: u64) -> Self {
        match w {
            0 => DelayState::Waiting,
            w if w % 2 == 0 => DelayState::OnBeat {
                added_ns: (w - 2) / 2,
            },
            w => DelayState::Late {
                way_ns: (w - 1) / 2,
                want_ns,
            },
        }
    }

    /// For the status line.
    pub fn text(self, unit: &str) -> String {
        match self {
            DelayState::Waiting => format!("delay to the {unit}: waiting for the stream's times"),
            DelayState::OnBeat { added_ns } => {
                format!("heard a {unit} late (+{:.1} ms)", added_ns as f64 / 1e6)
            }
            DelayState::Late { way_ns, want_ns } => format!(
                "heard {:.1} ms late, more than a {unit} ({:.1} ms): not delayed",
                way_ns as f64 / 1e6,
                want_ns as f64 / 1e6
            ),
        }
    }
}

/// Keep the delay unless it is off by more than this (a quarter of a millisecond): a
/// stream on a steady link is delayed by one constant amount, never nudged period by period.
const TOLERANCE_NS: u64 = 250_000;

/// A delay line after the receiver, sized once (see the module docs).
#[derive(Debug)]
pub struct DelayLine {
    ring: Box<[f32]>,
    frames: usize,
    channels: usize,
    rate: u32,
    write: usize,
    /// The delay in force, frames.
    delay: usize,
}

impl DelayLine {
    /// Up to `max_ns` of delay at `rate` on `channels` interleaved channels.
    pub fn new(rate: u32, channels: usize, max_ns: u64) -> Self {
        let channels = channels.max(1);
        let frames = (netjam_engine::time::ns_to_frames(max_ns, rate) as usize).max(1) + 1;
        Self {
            ring: vec![0.0; frames * channels].into_boxed_slice(),
            frames,
            channels,
            rate,
            write: 0,
            delay: 0,
        }
    }

    /// The delay now, frames.
    pub fn delay_frames(&self) -> usize {
        self.delay
    }

    /// Delay `out` (a period of interleaved frames) so that it sounds `want_ns` after it
    /// was captured, given that without this line it would sound `way_ns` after (the
    /// capture → sound delay of the frame after the period). Returns where that leaves
    /// the stream; a stream with no known way plays through with the delay it had.
    pub fn process(&mut self, out: &mut [f32], way_ns: Option<i128>, want_ns: u64) -> DelayState {
        let state = match way_ns {
            None => DelayState::Waiting,
            Some(way) => {
                let extra = i128::from(want_ns) - way;
                let max = netjam_engine::time::frames_to_ns((self.frames - 1) as u64, self.rate);
                if extra < 0 || extra > i128::from(max) {
                    self.delay = 0;
                    DelayState::Late {
                        way_ns: way.max(0) as u64,
                        want_ns,
                    }
                } else {
                    let now = netjam_engine::time::frames_to_ns(self.delay as u64, self.rate);
                    if (extra - i128::from(now)).unsigned_abs() > u128::from(TOLERANCE_NS) {
                        let f = (extra as f64 * f64::from(self.rate) / 1e9).round() as usize;
                        self.delay = f.min(self.frames - 1);
                    }
                    DelayState::OnBeat {
                        added_ns: netjam_engine::time::frames_to_ns(self.delay as u64, self.rate),
                    }
                }
            }
        };
        let ch = self.channels;
        for frame in out.chunks_exact_mut(ch) {
            let w = self.write * ch;
            self.ring[w..w + ch].copy_from_slice(frame);
            let r = (self.write + self.frames - self.delay) % self.frames * ch;
            frame.copy_from_slice(&self.ring[r..r + ch]);
            self.write = (self.write + 1) % self.frames;
        }
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_mark_maps_timestamps_either_side_and_across_the_wrap() {
        let m = StreamMark {
            ssrc: 7,
            rtp_ts: u32::MAX - 47,
            ensemble_ns: 10_000 * MS,
            rate: 48_000,
        };
        assert_eq!(StreamMark::unpack(&m.pack()), m);
        // 48 frames later wraps to 0: 1 ms later.
        assert_eq!(m.capture_ns(0), i128::from(10_001 * MS));
        assert_eq!(m.capture_ns(u32::MAX - 95), i128::from(9_999 * MS));
    }

    #[test]
    fn the_line_adds_what_the_way_lacks_and_holds_it_within_the_tolerance() {
        let mut d = DelayLine::new(1_000, 1, 2_000 * MS);
        let mut heard = Vec::new();
        // An impulse at frame 0; the way is 120 ms, 500 ms are wanted: 380 frames added.
        for p in 0..100usize {
            let mut out = [0f32; 10];
            if p == 0 {
                out[0] = 1.0;
            }
            // The way wobbles by less than the tolerance: the delay stays.
            let way = (120 * MS + (p as u64 % 3) * 100_000) as i128;
            let s = d.process(&mut out, Some(way), 500 * MS);
            assert_eq!(s, DelayState::OnBeat { added_ns: 380 * MS });
            heard.extend_from_slice(&out);
        }
        assert_eq!(heard.iter().position(|x| *x == 1.0), Some(380));
        assert_eq!(heard.iter().filter(|x| **x != 0.0).count(), 1);
        // A way longer than what is wanted: played as it comes.
        let mut out = [0.5f32; 10];
        let s = d.process(&mut out, Some(600 * MS as i128), 500 * MS);
        assert_eq!(
            s,
            DelayState::Late {
                way_ns: 600 * MS,
                want_ns: 500 * MS
            }
        );
        assert_eq!(out, [0.5; 10]);
        assert_eq!(DelayState::from_word(s.to_word(), 500 * MS), s);
        let on = DelayState::OnBeat { added_ns: 380 * MS };
        assert_eq!(DelayState::from_word(on.to_word(), 0), on);
        assert_eq!(DelayState::from_word(0, 0), DelayState::Waiting);
    }
}
