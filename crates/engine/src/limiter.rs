//! The mix's output limiter: keeps what the listener hears inside full scale however many
//! loud members are summed, without look-ahead (it adds no latency) and without pumping.
//!
//! One gain for all channels (linked, so the stereo image never moves), from each frame's
//! peak `p` (the largest |sample| of the frame):
//!
//! * the static curve is the identity up to the knee ([`KNEE`], −3 dBFS) and bends softly
//!   above it towards the ceiling ([`CEILING`], −0.1 dBFS), which it never reaches:
//!   `y = K + (C − K)·(1 − e^(−(p − K)/(C − K)))`, slope 1 at the knee; the gain the frame
//!   needs is `y / p`;
//! * attack is instantaneous: the applied gain is never above the gain the current frame
//!   needs, so no output sample ever exceeds the ceiling (|x·g| ≤ p·y/p = y < C; the float
//!   rounding of the two products is a few parts in 10⁷, far inside the 1.2 % between
//!   the ceiling and full scale);
//! * release waits until no frame of the last [`HOLD_MS`] (up to one block more) needed
//!   less gain, then moves towards the gain that window needs with a [`RELEASE_MS`] time
//!   constant, aimed 1 % past it so that it lands on it exactly (from −6 dB in about
//!   four time constants). A steady mix repeats its peaks well within the hold, so its gain stays
//!   constant: the gain does not ride the waveform, which is what would put
//!   intermodulation products (a member's tone moved by the other members' beat) into
//!   the mix.
//!
//! A mix whose frames all stay at or below the knee, with the gain back at exactly 1, is
//! left untouched (bit-exact). A frame holding a sample that is not a finite number is
//! played as silence.
//!
//! It counts its work ([`LimiterStats`]): the gain reduction now, the most since the last
//! [`Limiter::take_stats`], and the frames it changed.
//!
//! Realtime: its state is a few numbers and a fixed array; it never allocates, locks or
//! blocks, and costs a compare per sample while the mix is below the knee.

/// Where the soft knee starts, linear (−3 dBFS).
pub const KNEE: f32 = 0.707_945_8;
/// What the curve approaches and never reaches, linear (−0.1 dBFS).
pub const CEILING: f32 = 0.988_553_1;
/// How long the gain holds after the frame that needed it, ms.
pub const HOLD_MS: u32 = 250;
/// Time constant of the release after the hold, ms.
pub const RELEASE_MS: f32 = 150.0;

/// Blocks the hold window is kept in (a minimum per block).
const BLOCKS: usize = 8;
/// The release aims this far past its target (relative) and stops on it, so it arrives
/// in a few time constants instead of creeping towards it for ever.
const OVERSHOOT: f32 = 0.01;

/// What the limiter did.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LimiterStats {
    /// Gain reduction at the end of the last period, dB (0: passing unchanged).
    pub reduction_db: f32,
    /// The most gain reduction since the last reading, dB.
    pub max_reduction_db: f32,
    /// Frames played with a gain below 1, since the start.
    pub limited_frames: u64,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Limiter {
    /// The gain applied now.
    gain: f32,
    /// The least gain each of the last [`BLOCKS`] full blocks needed, as a ring.
    blocks: [f32; BLOCKS],
    next_block: usize,
    /// Their minimum.
    held: f32,
    /// The least gain the block being filled needed so far, and its frames.
    current: f32,
    filled: u32,
    block_frames: u32,
    /// Per-frame step of the release (1 − e^(−1/τ)).
    release: f32,
    least_gain: f32,
    limited_frames: u64,
}

impl Limiter {
    /// A limiter for a stream at `rate` frames per second.
    pub fn new(rate: u32) -> Self {
        Self::with_timing(rate, HOLD_MS, RELEASE_MS)
    }

    /// With another hold and release (ms) than the defaults.
    pub fn with_timing(rate: u32, hold_ms: u32, release_ms: f32) -> Self {
        let rate = rate.max(1);
        let hold_frames = u64::from(rate) * u64::from(hold_ms) / 1000;
        let block_frames = (hold_frames / BLOCKS as u64).max(1) as u32;
        let tau = f64::from(release_ms) / 1000.0 * f64::from(rate);
        Self {
            gain: 1.0,
            blocks: [1.0; BLOCKS],
            next_block: 0,
            held: 1.0,
            current: 1.0,
            filled: 0,
            block_frames,
            release: (1.0 - (-1.0 / tau.max(1.0)).exp()) as f32,
            least_gain: 1.0,
            limited_frames: 0,
        }
    }

    /// The gain a frame whose peak is `p` needs (1 at or below the knee).
    #[inline]
    pub fn needed_gain(p: f32) -> f32 {
        if p <= KNEE {
            return 1.0;
        }
        let span = CEILING - KNEE;
        let y = KNEE + span * (1.0 - (-(p - KNEE) / span).exp());
        (y / p).min(1.0)
    }

    /// Limit `out` (`channels` interleaved) in place.
    pub fn process(&mut self, out: &mut [f32], channels: usize) {
        for frame in out.chunks_mut(channels.max(1)) {
            let mut peak = 0.0f32;
            let mut finite = true;
            for x in frame.iter() {
                finite &= x.is_finite();
                peak = peak.max(x.abs());
            }
            if !finite {
                frame.fill(0.0);
                peak = 0.0;
            }
            if peak <= KNEE && self.gain == 1.0 && self.held == 1.0 && self.current == 1.0 {
                // The bit-exact path: nothing to do, nothing to remember.
                self.tick_block(1.0);
                continue;
            }
            let needed = Self::needed_gain(peak);
            self.tick_block(needed);
            let target = self.held.min(self.current).min(needed);
            if target <= self.gain {
                self.gain = target;
            } else {
                let aim = target * (1.0 + OVERSHOOT);
                // Never above the target, so never above what this frame needs (the
                // ceiling's proof).
                self.gain = (self.gain + (aim - self.gain) * self.release).min(target);
            }
            if self.gain < 1.0 {
                for x in frame.iter_mut() {
                    *x *= self.gain;
                }
                self.limited_frames += 1;
                self.least_gain = self.least_gain.min(self.gain);
            }
        }
    }

    /// Count one frame that needed `needed` into the hold window.
    #[inline]
    fn tick_block(&mut self, needed: f32) {
        self.current = self.current.min(needed);
        self.filled += 1;
        if self.filled >= self.block_frames {
            self.blocks[self.next_block] = self.current;
            self.next_block = (self.next_block + 1) % BLOCKS;
            self.held = self.blocks.iter().copied().fold(1.0, f32::min);
            self.current = 1.0;
            self.filled = 0;
        }
    }

    /// The gain applied now, linear.
    pub fn gain(&self) -> f32 {
        self.gain
    }

    /// What it did: the reduction now, the most since the last call, frames limited.
    pub fn take_stats(&mut self) -> LimiterStats {
        let s = LimiterStats {
            reduction_db: reduction_db(self.gain),
            max_reduction_db: reduction_db(self.least_gain),
            limited_frames: self.limited_frames,
        };
        self.least_gain = self.gain;
        s
    }
}

fn reduction_db(gain: f32) -> f32 {
    if gain >= 1.0 {
        0.0
    } else {
        -crate::mixer::amplitude_db(gain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_curve_is_identity_to_the_knee_and_stays_under_the_ceiling() {
        assert_eq!(Limiter::needed_gain(0.0), 1.0);
        assert_eq!(Limiter::needed_gain(KNEE), 1.0);
        let mut last_y = 0.0;
        for k in 0..=100_000 {
            let p = KNEE + k as f32 * 1e-3;
            let y = p * Limiter::needed_gain(p);
            assert!(y < CEILING * (1.0 + 1e-6), "{p}: {y}");
            assert!(y >= last_y - 1e-6, "monotonic at {p}");
            last_y = y;
        }
        // Slope 1 at the knee: just above it, almost nothing is taken.
        assert!(Limiter::needed_gain(KNEE * 1.001) > 0.9999);
        assert!(Limiter::needed_gain(f32::MAX) >= 0.0);
    }

    #[test]
    fn no_sample_ever_exceeds_full_scale_and_the_image_stays() {
        // Loud noise-like material in bursts, left twice the right.
        let mut l = Limiter::new(48_000);
        let mut seed = 1u32;
        let mut worst = 0.0f32;
        for period in 0..2_000 {
            let loud = if period % 50 < 20 { 60.0 } else { 0.3 };
            let mut buf = [0.0f32; 128];
            for f in buf.chunks_exact_mut(2) {
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let x = (seed >> 8) as f32 / (1 << 24) as f32 * 2.0 - 1.0;
                f[0] = x * loud;
                f[1] = x * loud / 2.0;
            }
            let before = buf;
            l.process(&mut buf, 2);
            for (f, b) in buf.chunks_exact(2).zip(before.chunks_exact(2)) {
                worst = worst.max(f[0].abs()).max(f[1].abs());
                if b[0] != 0.0 {
                    assert!((f[1] / f[0] - 0.5).abs() < 1e-6, "linked");
                }
            }
        }
        assert!(worst <= CEILING * (1.0 + 1e-6), "{worst}");
        // Not a number is silence, infinity too.
        let mut buf = [f32::NAN, 0.5, f32::INFINITY, 0.5];
        l.process(&mut buf, 2);
        assert_eq!(buf, [0.0; 4]);
    }
}
