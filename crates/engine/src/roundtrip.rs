//! In-band round-trip measurement: the real mouth-to-ear round trip of the audio itself.
//!
//! Once a second [`RoundTripMeter`] adds a short, known pseudo-random burst to the audio
//! going out (one channel, about −24 dBFS, 128 frames), and looks for it in the audio
//! coming back by a sliding normalised correlation of first differences: differencing
//! takes music (whose energy is mostly low) down by tens of dB and the white burst up by
//! 3 dB, so the burst is found under playing much louder than itself. When the far end loops the audio back
//! (`netjam reflect`, or a player monitoring through), the frames between sending the
//! burst and hearing it are the full round trip: device buffers, packetization, network,
//! jitter buffer and any resampling — the figure a musician feels, next to the network RTT
//! that RTCP measures.
//!
//! Sans-IO and realtime-safe: fixed arrays only; N multiply-adds per received frame.

use crate::rng::SimRng;

/// Frames in the burst.
pub const BURST: usize = 128;
/// Amplitude of the burst (≈ −24 dBFS).
const LEVEL: f32 = 0.063;
/// A match needs this normalised correlation (1 = identical shape).
const THRESHOLD: f32 = 0.6;

/// See the module docs.
#[derive(Debug)]
pub struct RoundTripMeter {
    pattern: [f32; BURST],
    /// First differences of the pattern, and their energy.
    pattern_diff: [f32; BURST],
    pattern_energy: f32,
    /// First differences of the last `BURST` received frames of the measured channel.
    recent: [f32; BURST],
    previous: f32,
    head: usize,
    /// Frames sent and received so far (both sides of the callback share one clock).
    sent_frames: u64,
    received_frames: u64,
    every_frames: u64,
    /// Frame index at which the burst in flight started.
    in_flight: Option<u64>,
    /// Next pattern index to add while a burst is going out.
    injecting: Option<usize>,
    /// Give up on a burst after this many frames.
    timeout_frames: u64,
    best: f32,
    best_end: u64,
    last_rtt_frames: Option<u64>,
    measured: u64,
    missed: u64,
}

impl RoundTripMeter {
    /// Measure about every `every_frames` frames, giving up after `timeout_frames`.
    pub fn new(every_frames: u64, timeout_frames: u64) -> Self {
        let mut rng = SimRng::new(0x6e6a_7274);
        let mut pattern = [0.0f32; BURST];
        for p in pattern.iter_mut() {
            *p = if rng.next_u64() & 1 == 0 { LEVEL } else { -LEVEL };
        }
        let mut pattern_diff = [0.0f32; BURST];
        for k in 0..BURST {
            pattern_diff[k] = pattern[k] - if k > 0 { pattern[k - 1] } else { 0.0 };
        }
        let pattern_energy = pattern_diff.iter().map(|x| x * x).sum();
        Self {
            pattern,
            pattern_diff,
            pattern_energy,
            recent: [0.0; BURST],
            previous: 0.0,
            head: 0,
            sent_frames: 0,
            received_frames: 0,
            every_frames: every_frames.max(BURST as u64 * 4),
            in_flight: None,
            injecting: None,
            timeout_frames,
            best: 0.0,
            best_end: 0,
            last_rtt_frames: None,
            measured: 0,
            missed: 0,
        }
    }

    /// The last measured round trip, in frames.
    pub fn last_rtt_frames(&self) -> Option<u64> {
        self.last_rtt_frames
    }

    /// Bursts found and bursts lost.
    pub fn counts(&self) -> (u64, u64) {
        (self.measured, self.missed)
    }

    /// Add the burst to channel 0 of the outgoing interleaved `input` when one is due (a
    /// burst longer than a period continues into the next ones).
    pub fn on_outgoing(&mut self, input: &mut [f32], channels: usize) {
        let ch = channels.max(1);
        let frames = (input.len() / ch) as u64;
        let start = self.sent_frames;
        self.sent_frames += frames;
        if self.in_flight.is_none() && self.injecting.is_none() && start % self.every_frames < frames {
            self.injecting = Some(0);
            self.in_flight = Some(start);
            self.best = 0.0;
        }
        if let Some(mut pos) = self.injecting {
            for frame in input.chunks_exact_mut(ch) {
                if pos >= BURST {
                    break;
                }
                frame[0] = (frame[0] + self.pattern[pos]).clamp(-1.0, 1.0);
                pos += 1;
            }
            self.injecting = (pos < BURST).then_some(pos);
        }
    }

    /// Look for the burst in channel 0 of the interleaved audio coming back.
    pub fn on_incoming(&mut self, output: &[f32], channels: usize) {
        let ch = channels.max(1);
        for frame in output.chunks_exact(ch) {
            self.recent[self.head] = frame[0] - self.previous;
            self.previous = frame[0];
            self.head = (self.head + 1) % BURST;
            self.received_frames += 1;
            let Some(sent) = self.in_flight else { continue };
            if self.received_frames < sent + BURST as u64 {
                continue;
            }
            // Normalised correlation of the last BURST frames with the pattern.
            let (mut dot, mut energy) = (0.0f32, 0.0f32);
            for (k, p) in self.pattern_diff.iter().enumerate() {
                let x = self.recent[(self.head + k) % BURST];
                dot += p * x;
                energy += x * x;
            }
            let score = if energy > 0.0 {
                dot / (energy * self.pattern_energy).sqrt()
            } else {
                0.0
            };
            if score > self.best {
                self.best = score;
                self.best_end = self.received_frames;
            }
            // Once past a peak above the threshold (or out of time), settle.
            let past_peak = self.best >= THRESHOLD && self.received_frames > self.best_end + BURST as u64;
            if past_peak {
                self.last_rtt_frames = Some(self.best_end - BURST as u64 - sent);
                self.measured += 1;
                self.in_flight = None;
            } else if self.received_frames > sent + self.timeout_frames {
                self.missed += 1;
                self.in_flight = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop-back of `delay` frames with some music-like signal mixed in on the way.
    fn run(delay: usize, noise: f32) -> RoundTripMeter {
        let mut m = RoundTripMeter::new(48_000, 24_000);
        let mut line = vec![0.0f32; delay + 48_000 * 4];
        let mut rng = SimRng::new(1);
        let period = 64;
        for k in 0..(48_000 * 3 / period) {
            let mut block = vec![0.0f32; period * 2];
            for (i, f) in block.chunks_exact_mut(2).enumerate() {
                let t = (k * period + i) as f32 / 48_000.0;
                f[0] = noise * (2.0 * std::f32::consts::PI * 220.0 * t).sin()
                    + noise * 0.3 * (rng.unit() as f32 - 0.5);
                f[1] = f[0];
            }
            m.on_outgoing(&mut block, 2);
            for (i, f) in block.chunks_exact(2).enumerate() {
                line[k * period + i + delay] = f[0];
            }
            let back: Vec<f32> = (0..period).flat_map(|i| [line[k * period + i]; 2]).collect();
            m.on_incoming(&back, 2);
        }
        m
    }

    #[test]
    fn finds_the_round_trip_exactly_on_a_clean_loop() {
        for delay in [1usize, 64, 193, 1000, 9000] {
            let m = run(delay, 0.0);
            assert_eq!(m.last_rtt_frames(), Some(delay as u64), "delay {delay}");
            assert_eq!(m.counts().1, 0);
        }
    }

    #[test]
    fn finds_it_under_music_louder_than_the_burst() {
        let m = run(777, 0.3);
        assert_eq!(m.last_rtt_frames(), Some(777));
        assert!(m.counts().0 >= 2);
    }

    #[test]
    fn a_lost_burst_times_out_and_measuring_goes_on() {
        let mut m = RoundTripMeter::new(4_800, 2_400);
        let mut block = vec![0.0f32; 128];
        for _ in 0..200 {
            m.on_outgoing(&mut block, 2);
            m.on_incoming(&[0.0; 128], 2); // nothing comes back
            block.fill(0.0);
        }
        assert!(m.counts().1 >= 3);
        assert_eq!(m.last_rtt_frames(), None);
    }
}
