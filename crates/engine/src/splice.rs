//! Where a stream can be cut or stretched without bending its pitch.
//!
//! Playout moves its latency in two ways: it drops audio to give latency back (a catch-up,
//! time the device lost) and it plays audio twice or a continuation of it to take latency
//! on (waiting for a grown target). Done by resampling faster or slower, either is heard as
//! a pitch bend (0.5 % is 8.7 cents, and a string player hears 10); done as a cut of an
//! arbitrary length, a steady tone jumps in phase, which a listener hears as a click and a
//! 200 ms analysis window reads as a pitch error. [`SpliceFinder`] finds a length that a
//! steady signal does not notice: the lag, within a range the caller allows, at which the
//! signal best repeats itself, by normalised cross-correlation of a short window (as
//! WSOLA, and WebRTC's NetEQ in its accelerate and preemptive-expand operations, do). A
//! steady tone repeats at every whole number of its periods, a chord at every common
//! period, so cutting or inserting exactly that keeps the phase of every partial.
//!
//! The answer says what the signal was like:
//! * [`SpliceKind::Aligned`]: a lag where the signal repeats to within a phase error of
//!   about 1.6 % of a cycle (correlation ≥ [`ALIGNED`]): cut or insert exactly that;
//! * [`SpliceKind::Quiet`]: nothing above −60 dBFS: any length is inaudible;
//! * [`SpliceKind::Noise`]: nothing in the range repeats even roughly (correlation below
//!   [`NOISE`]): a noise-like stretch, where a cross-faded cut of any length is as good as
//!   any other;
//! * [`SpliceKind::Weak`]: periodic, but no lag in the range matches (a tone whose period
//!   is longer than the range): the best lag is returned, and the caller decides whether a
//!   splice is worth it now or can wait for a better moment.
//!
//! The search is written here rather than taken from a crate because it runs on the audio
//! thread: it works in a buffer reserved in [`SpliceFinder::new`], reads the signal through
//! a closure (the caller's ring), never allocates, locks or blocks, and costs about
//! `range × window` multiply-adds (480 × 128 at 48 kHz: tens of microseconds, once per
//! splice).

/// Correlation at or above which a lag counts as aligned: a phase error of about 0.016
/// cycles, which moves a 100 Hz tone's pitch read over 200 ms by 1.4 cents and a 440 Hz
/// tone's by 0.3.
pub const ALIGNED: f32 = 0.995;
/// Correlation below which nothing in the range repeats: noise-like.
pub const NOISE: f32 = 0.6;
/// Lags whose correlation is within this of the best count as equally good, so the
/// caller's preference (longer or shorter) decides among the periods of a steady tone.
const TIE: f32 = 0.002;
/// Mean square below which a stretch is quiet (−60 dBFS).
const QUIET_MS: f32 = 1e-6;

/// Which side of the anchor the reference window lies on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// The reference is `x[0..w]` and a lag `n` compares it with `x[n..n + w]`: a cut of
    /// `n` frames from the anchor on (audio ahead of playout).
    Ahead,
    /// The reference is `x[-w..0]` and a lag `n` compares it with `x[-n - w..-n]`: a
    /// repetition of the `n` frames before the anchor (audio already played).
    Behind,
}

/// Which of equally good lags to take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefer {
    Longer,
    Shorter,
}

/// What the signal around a splice was like (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpliceKind {
    Aligned,
    Quiet,
    Noise,
    Weak,
}

/// A splice length and what it rests on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Splice {
    pub frames: u64,
    pub kind: SpliceKind,
    /// The normalised correlation at `frames` (1.0 for quiet stretches).
    pub score: f32,
}

impl Splice {
    /// Whether cutting or inserting `frames` keeps a steady signal's phase, or there is no
    /// phase to keep.
    pub fn is_clean(&self) -> bool {
        self.kind != SpliceKind::Weak
    }
}

/// The search window at `rate`: 128 frames at 48 kHz (2.7 ms), at least 32.
pub fn window_frames(rate: u32) -> usize {
    (rate as usize / 375).max(32)
}

/// The shortest cut that keeps a phase at `rate`: 1 ms. A shorter lag of a low tone
/// correlates with the tone itself (a 100 Hz tone one frame later scores 0.9999) without
/// being a period of it.
pub fn min_period_frames(rate: u32) -> u64 {
    (rate as u64 / 1000).max(8)
}

/// The longest period searched for at `rate`: 10 ms (100 Hz).
pub fn max_period_frames(rate: u32) -> u64 {
    (rate as u64 / 100).max(64)
}

/// See the module docs. The default reserves nothing (and so can answer nothing).
#[derive(Debug, Clone, Default)]
pub struct SpliceFinder {
    /// Mono signal of the stretch searched, reserved for the largest one.
    buf: Vec<f32>,
}

impl SpliceFinder {
    /// Reserve for searches of up to `max_frames` (twice the window plus the width of the
    /// range of lags).
    pub fn new(max_frames: usize) -> Self {
        Self {
            buf: vec![0.0; max_frames.max(64)],
        }
    }

    /// The most frames a search can span (twice the window plus the width of the range).
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Find the lag in `lo..=hi` where the signal best repeats over a window of `w` frames
    /// on the `dir` side of the anchor. `frame(i)` gives the mono value at offset `i` from
    /// the anchor, or `None` where there is no audio (then there is no answer). Only the
    /// reference and the frames the candidates cover are read, so a lag may be far larger
    /// than what was reserved; `None` when the range is empty or wider than was reserved.
    pub fn find(
        &mut self,
        mut frame: impl FnMut(i64) -> Option<f32>,
        w: usize,
        lo: u64,
        hi: u64,
        dir: Direction,
        prefer: Prefer,
    ) -> Option<Splice> {
        if w == 0 || hi < lo || lo == 0 {
            return None;
        }
        let range = (hi - lo) as usize;
        let span = 2 * w + range;
        if span > self.buf.len() {
            return None;
        }
        // buf[..w]: the reference; buf[w..]: the stretch every candidate lies in, so the
        // candidate for lag `n` is buf[start(n)..start(n) + w].
        let (ref_at, region_at) = match dir {
            Direction::Ahead => (0i64, lo as i64),
            Direction::Behind => (-(w as i64), -(hi as i64) - w as i64),
        };
        for k in 0..w {
            let v = frame(ref_at + k as i64)?;
            self.buf[k] = if v.is_finite() { v } else { 0.0 };
        }
        for k in 0..w + range {
            let v = frame(region_at + k as i64)?;
            self.buf[w + k] = if v.is_finite() { v } else { 0.0 };
        }
        let buf = &self.buf[..span];
        let reference = &buf[..w];
        let start = |n: u64| match dir {
            Direction::Ahead => w + (n - lo) as usize,
            Direction::Behind => w + (hi - n) as usize,
        };
        let loudest = buf.iter().map(|v| v * v).sum::<f32>() / span as f32;
        let preferred = match prefer {
            Prefer::Longer => hi,
            Prefer::Shorter => lo,
        };
        if loudest < QUIET_MS {
            return Some(Splice {
                frames: preferred,
                kind: SpliceKind::Quiet,
                score: 1.0,
            });
        }
        let e_ref: f32 = reference.iter().map(|v| v * v).sum();
        let score = |n: u64| -> f32 {
            let c = &buf[start(n)..start(n) + w];
            let (mut xy, mut yy) = (0.0f32, 0.0f32);
            for (a, b) in reference.iter().zip(c) {
                xy += a * b;
                yy += b * b;
            }
            let d = (e_ref * yy).sqrt();
            if d > 0.0 {
                xy / d
            } else {
                0.0
            }
        };
        let mut best = (lo, f32::NEG_INFINITY);
        for n in lo..=hi {
            let s = score(n);
            if s > best.1 {
                best = (n, s);
            }
        }
        if best.1 < NOISE {
            return Some(Splice {
                frames: preferred,
                kind: SpliceKind::Noise,
                score: best.1,
            });
        }
        // Among lags as good as the best, the one the caller prefers.
        let mut pick = best;
        let order: &mut dyn Iterator<Item = u64> = match prefer {
            Prefer::Longer => &mut (lo..=hi).rev(),
            Prefer::Shorter => &mut (lo..=hi),
        };
        for n in order {
            let s = score(n);
            if s >= best.1 - TIE {
                pick = (n, s);
                break;
            }
        }
        Some(Splice {
            frames: pick.0,
            kind: if pick.1 >= ALIGNED {
                SpliceKind::Aligned
            } else {
                SpliceKind::Weak
            },
            score: pick.1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: u32 = 48_000;

    fn tone(freqs: &[f64], n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                freqs
                    .iter()
                    .map(|f| (2.0 * std::f64::consts::PI * f * i as f64 / RATE as f64).sin() * 0.3)
                    .sum::<f64>() as f32
            })
            .collect()
    }

    /// The phase error, in cycles of `f`, of cutting `n` frames.
    fn phase_error(f: f64, n: u64) -> f64 {
        let c = f * n as f64 / RATE as f64;
        (c - c.round()).abs()
    }

    fn find_ahead(x: &[f32], lo: u64, hi: u64, prefer: Prefer) -> Option<Splice> {
        let mut f = SpliceFinder::new(4096);
        f.find(
            |i| x.get(i as usize).copied(),
            window_frames(RATE),
            lo,
            hi,
            Direction::Ahead,
            prefer,
        )
    }

    #[test]
    fn a_steady_tone_is_cut_by_whole_periods() {
        for f in [110.0, 220.0, 440.0, 660.0, 1000.0, 2500.0] {
            let x = tone(&[f], 4000);
            let s = find_ahead(&x, 300, 700, Prefer::Longer).expect("answer");
            assert_eq!(s.kind, SpliceKind::Aligned, "{f} Hz: {s:?}");
            assert!(phase_error(f, s.frames) < 0.016, "{f} Hz: {s:?}");
            // One of the longest clean lags in the range: at most two periods short of 700.
            assert!(
                700 - s.frames <= 2 * (RATE as f64 / f) as u64 + 1,
                "{f} Hz: {s:?}"
            );
        }
    }

    #[test]
    fn a_chord_is_cut_at_a_common_period() {
        // 440 + 660 Hz repeat every 1/220 s (218.2 frames).
        let x = tone(&[440.0, 660.0], 4000);
        let s = find_ahead(&x, 100, 600, Prefer::Longer).expect("answer");
        assert_eq!(s.kind, SpliceKind::Aligned, "{s:?}");
        assert!(phase_error(220.0, s.frames) < 0.016, "{s:?}");
    }

    #[test]
    fn a_tone_longer_than_the_range_is_weak_and_shorter_preference_works_behind() {
        // 100 Hz (480 frames) cannot be cut cleanly by 60..200 frames.
        let x = tone(&[100.0], 4000);
        let s = find_ahead(&x, 60, 200, Prefer::Longer).expect("answer");
        assert_eq!(s.kind, SpliceKind::Weak, "{s:?}");
        // Behind the anchor, the shortest clean repetition of at least 150 frames of 440 Hz
        // is two periods (218.2 frames).
        let y = tone(&[440.0], 3000);
        let mut f = SpliceFinder::new(4096);
        let anchor = 2500i64;
        let s = f
            .find(
                |i| y.get((anchor + i) as usize).copied(),
                window_frames(RATE),
                150,
                600,
                Direction::Behind,
                Prefer::Shorter,
            )
            .expect("answer");
        assert_eq!(s.kind, SpliceKind::Aligned, "{s:?}");
        assert!((217..=219).contains(&s.frames), "{s:?}");
    }

    #[test]
    fn noise_and_silence_take_the_preferred_end() {
        let mut rng = crate::rng::SimRng::new(7);
        let x: Vec<f32> = (0..4000).map(|_| (rng.unit() as f32 - 0.5) * 0.5).collect();
        let s = find_ahead(&x, 100, 500, Prefer::Longer).expect("answer");
        assert_eq!((s.kind, s.frames), (SpliceKind::Noise, 500), "{s:?}");
        let q = vec![0.0f32; 4000];
        let s = find_ahead(&q, 100, 500, Prefer::Shorter).expect("answer");
        assert_eq!((s.kind, s.frames), (SpliceKind::Quiet, 100), "{s:?}");
    }

    #[test]
    fn missing_audio_an_empty_range_or_too_long_a_stretch_has_no_answer() {
        let x = tone(&[440.0], 300);
        assert!(find_ahead(&x, 100, 500, Prefer::Longer).is_none());
        let x = tone(&[440.0], 4000);
        assert!(find_ahead(&x, 500, 100, Prefer::Longer).is_none());
        assert!(find_ahead(&x, 0, 100, Prefer::Longer).is_none());
        let mut f = SpliceFinder::new(256);
        assert!(f
            .find(
                |i| x.get(i as usize).copied(),
                128,
                100,
                200,
                Direction::Ahead,
                Prefer::Longer
            )
            .is_none());
        // A lag far beyond what was reserved is fine while the range is narrow.
        assert!(f
            .find(
                |i| x.get(i as usize).copied(),
                64,
                3000,
                3100,
                Direction::Ahead,
                Prefer::Longer
            )
            .is_some());
        // Not-a-number samples read as silence, never a panic.
        let nan = vec![f32::NAN; 4000];
        assert!(find_ahead(&nan, 100, 500, Prefer::Longer).is_some());
    }
}
