//! Test support: how a played signal is made of stretches of the signal that was sent.
//!
//! A listener hears every splice, insertion and skip, so tests that judge playout compare
//! what was played to what was sent by alignment instead of trusting counters: [`align`]
//! finds, for each stretch of the output, the input frames it reproduces (sample-exactly, or
//! within a tolerance for lossy codecs), and classifies what lies between two such
//! segments: output that matches nothing (inserted or concealed audio) and input that was
//! never played (skipped) or played twice (repeated). Silence before the stream starts is
//! reported apart, as idle, and so is what follows the last matched segment.
//!
//! It works best on noise: every window of noise occurs once, so a match is unambiguous.
//! A window of [`AlignOptions::window`] frames is looked up among the input's windows, and
//! a match is then extended frame by frame both ways; where extension breaks, the search
//! starts again.
//!
//! This module lives in the engine (hidden from its docs) so that both the engine's tests
//! and the netjam binary's integration tests can use one copy. It allocates freely and is
//! never to be called from realtime code.

/// What [`align`] is told.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AlignOptions {
    /// Frames of output looked up at once to find where a segment starts.
    pub window: usize,
    /// Largest difference of a sample from its input counterpart that still matches (0:
    /// bit-exact apart from the sign of zero).
    pub tolerance: f32,
}

impl Default for AlignOptions {
    fn default() -> Self {
        Self {
            window: 32,
            tolerance: 0.0,
        }
    }
}

/// Output frames `out_start..out_start + len` reproduce input frames `in_start..in_start +
/// len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub out_start: usize,
    pub in_start: usize,
    pub len: usize,
}

impl Segment {
    pub fn out_end(&self) -> usize {
        self.out_start + self.len
    }
    pub fn in_end(&self) -> usize {
        self.in_start + self.len
    }
}

/// What lies between two consecutive segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join {
    /// Output frame where the later segment starts.
    pub at_out: usize,
    /// Output frames between the segments that match no input.
    pub out_gap: usize,
    /// Where the input resumes against where it left off: positive when frames were not
    /// played, negative when frames were played again.
    pub in_jump: i64,
}

impl Join {
    /// Output that stands in for input frames never played: a concealed stretch, or the
    /// cross-fade over a skip.
    pub fn concealed(&self) -> usize {
        self.out_gap.min(self.in_jump.max(0) as usize)
    }
    /// Output added without input being lost: an inserted stretch.
    pub fn inserted(&self) -> usize {
        self.out_gap - self.concealed()
    }
    /// Input dropped beyond what concealed output stands in for.
    pub fn skipped(&self) -> usize {
        self.in_jump.max(0) as usize - self.concealed()
    }
    /// Input played a second time.
    pub fn repeated(&self) -> usize {
        (-self.in_jump).max(0) as usize
    }
}

/// How the output is made of the input (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Alignment {
    pub channels: usize,
    pub input_frames: usize,
    pub output_frames: usize,
    /// Silent output frames before the first segment.
    pub idle: usize,
    /// Output frames after the idle ones and before the first segment that match nothing.
    pub head_unmatched: usize,
    pub segments: Vec<Segment>,
    /// One per pair of consecutive segments.
    pub joins: Vec<Join>,
    /// Output frames after the last segment (whatever they are: silence, a fade).
    pub tail: usize,
}

impl Alignment {
    pub fn inserted_frames(&self) -> usize {
        self.joins.iter().map(Join::inserted).sum()
    }
    pub fn concealed_frames(&self) -> usize {
        self.joins.iter().map(Join::concealed).sum()
    }
    pub fn skipped_frames(&self) -> usize {
        self.joins.iter().map(Join::skipped).sum()
    }
    pub fn repeated_frames(&self) -> usize {
        self.joins.iter().map(Join::repeated).sum()
    }
    /// Input frames before the first one played.
    pub fn missing_head(&self) -> usize {
        self.segments.first().map_or(self.input_frames, |s| s.in_start)
    }
    /// Input frames after the last one played.
    pub fn missing_tail(&self) -> usize {
        self.segments
            .last()
            .map_or(0, |s| self.input_frames.saturating_sub(s.in_end()))
    }
    /// Places where a listener hears the stream jump: every join between segments, plus a
    /// stream that starts after its first frame or with unmatched output.
    pub fn discontinuities(&self) -> usize {
        let start = usize::from(self.missing_head() > 0 || self.head_unmatched > 0);
        self.joins.len() + start
    }
}

impl std::fmt::Display for Alignment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} output frames from {} input frames ({} ch): idle {}, unmatched head {}, {} segment(s), tail {}",
            self.output_frames,
            self.input_frames,
            self.channels,
            self.idle,
            self.head_unmatched,
            self.segments.len(),
            self.tail
        )?;
        writeln!(
            f,
            "input missing at the start {}, at the end {}; inserted {}, concealed {}, skipped {}, repeated {}",
            self.missing_head(),
            self.missing_tail(),
            self.inserted_frames(),
            self.concealed_frames(),
            self.skipped_frames(),
            self.repeated_frames()
        )?;
        // The joins grouped by shape (output gap, input jump), most frequent first.
        let mut kinds: Vec<((usize, i64), usize)> = Vec::new();
        for j in &self.joins {
            match kinds.iter_mut().find(|k| k.0 == (j.out_gap, j.in_jump)) {
                Some(k) => k.1 += 1,
                None => kinds.push(((j.out_gap, j.in_jump), 1)),
            }
        }
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        if !kinds.is_empty() {
            write!(f, "joins (out gap/in jump x times):")?;
            for ((gap, jump), n) in kinds {
                write!(f, " {gap}/{jump:+} x{n}")?;
            }
            writeln!(f)?;
        }
        const SHOWN: usize = 40;
        for (i, s) in self.segments.iter().enumerate().take(SHOWN) {
            write!(
                f,
                "  out {:>8} <- in {:>8} len {:>8}",
                s.out_start, s.in_start, s.len
            )?;
            match i.checked_sub(1).and_then(|j| self.joins.get(j)) {
                Some(j) => writeln!(f, "   (after out gap {}, in jump {:+})", j.out_gap, j.in_jump)?,
                None => writeln!(f)?,
            }
        }
        if self.segments.len() > SHOWN {
            writeln!(f, "  ... {} more", self.segments.len() - SHOWN)?;
        }
        Ok(())
    }
}

/// `i16` samples as `f32` in -1..1, exactly (as the engine converts L16).
pub fn i16_to_f32(samples: &[i16]) -> Vec<f32> {
    samples.iter().map(|&s| f32::from(s) / 32_768.0).collect()
}

/// Align `output` against `input` (both interleaved with `channels`); see the module docs.
pub fn align(input: &[f32], output: &[f32], channels: usize, opts: AlignOptions) -> Alignment {
    let ch = channels.max(1);
    let w = opts.window.max(1);
    let tol = opts.tolerance.max(0.0);
    let in_frames = input.len() / ch;
    let out_frames = output.len() / ch;
    fn frame(s: &[f32], ch: usize, i: usize) -> &[f32] {
        &s[i * ch..(i + 1) * ch]
    }
    let same = |o: usize, i: usize| -> bool {
        frame(output, ch, o)
            .iter()
            .zip(frame(input, ch, i))
            .all(|(a, b)| (a - b).abs() <= tol)
    };
    let silent = |s: &[f32], i: usize| frame(s, ch, i).iter().all(|x| x.abs() <= tol);
    let key = |s: &[f32], at: usize| window_key(&s[at * ch..(at + w) * ch], tol);

    // Every input window that is not silence, sorted by key.
    let mut index: Vec<(u64, usize)> = (0..(in_frames + 1).saturating_sub(w))
        .filter(|&i| !(i..i + w).all(|k| silent(input, k)))
        .map(|i| (key(input, i), i))
        .collect();
    index.sort_unstable();

    let mut segments: Vec<Segment> = Vec::new();
    let mut p = 0;
    while p + w <= out_frames {
        let k = key(output, p);
        let first = index.partition_point(|e| e.0 < k);
        // Where the input would continue from the last segment: preferred among equals.
        let expected = segments.last().map(|s| s.in_end() + (p - s.out_end()));
        let found = index[first..]
            .iter()
            .take_while(|e| e.0 == k)
            .take(256)
            .map(|e| e.1)
            .filter(|&q| (0..w).all(|d| same(p + d, q + d)))
            .min_by_key(|&q| expected.map_or(q, |e| q.abs_diff(e)));
        let Some(mut q) = found else {
            p += 1;
            continue;
        };
        let floor = segments.last().map_or(0, Segment::out_end);
        let mut start = p;
        while start > floor && q > 0 && same(start - 1, q - 1) {
            start -= 1;
            q -= 1;
        }
        let mut end = p + w;
        while end < out_frames && q + (end - start) < in_frames && same(end, q + (end - start)) {
            end += 1;
        }
        segments.push(Segment {
            out_start: start,
            in_start: q,
            len: end - start,
        });
        p = end;
    }

    let joins = segments
        .windows(2)
        .map(|s| Join {
            at_out: s[1].out_start,
            out_gap: s[1].out_start - s[0].out_end(),
            in_jump: s[1].in_start as i64 - s[0].in_end() as i64,
        })
        .collect();
    let head = segments.first().map_or(out_frames, |s| s.out_start);
    let idle = (0..head).take_while(|&i| silent(output, i)).count();
    Alignment {
        channels: ch,
        input_frames: in_frames,
        output_frames: out_frames,
        idle,
        head_unmatched: head - idle,
        tail: segments.last().map_or(0, |s| out_frames - s.out_end()),
        segments,
        joins,
    }
}

/// A key that equal windows share: the exact bits, or with a tolerance only the signs (a
/// lossy codec moves a sample across zero only where it is within the tolerance of zero,
/// which is rare in noise; a window that differs is simply not found, and the search moves
/// on by one frame).
fn window_key(samples: &[f32], tol: f32) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in samples {
        let v = if tol > 0.0 {
            u64::from(x > 0.0)
        } else if x == 0.0 {
            0
        } else {
            u64::from(x.to_bits())
        };
        h = (h ^ v).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SimRng;

    const CH: usize = 2;

    fn noise(frames: usize, seed: u64) -> Vec<f32> {
        let mut r = SimRng::new(seed);
        (0..frames * CH).map(|_| r.unit() as f32 * 2.0 - 1.0).collect()
    }

    fn frames(s: &[f32], from: usize, to: usize) -> &[f32] {
        &s[from * CH..to * CH]
    }

    fn run(input: &[f32], output: &[f32]) -> Alignment {
        align(input, output, CH, AlignOptions::default())
    }

    #[test]
    fn an_untouched_copy_is_one_segment() {
        let input = noise(5000, 1);
        let a = run(&input, &input);
        assert_eq!(
            a.segments,
            [Segment {
                out_start: 0,
                in_start: 0,
                len: 5000
            }]
        );
        assert_eq!((a.idle, a.tail, a.discontinuities()), (0, 0, 0));
        assert_eq!((a.missing_head(), a.missing_tail()), (0, 0));
    }

    #[test]
    fn a_splice_of_13_frames_is_two_segments_and_13_skipped() {
        let input = noise(5000, 2);
        let output = [frames(&input, 0, 1000), frames(&input, 1013, 5000)].concat();
        let a = run(&input, &output);
        assert_eq!(a.segments.len(), 2, "{a}");
        assert_eq!(a.segments[1].out_start, 1000);
        assert_eq!(a.segments[1].in_start, 1013);
        assert_eq!(a.joins[0].in_jump, 13);
        assert_eq!(
            (a.skipped_frames(), a.inserted_frames(), a.concealed_frames()),
            (13, 0, 0)
        );
        assert_eq!(a.discontinuities(), 1);
    }

    #[test]
    fn an_inserted_block_of_64_frames_is_found() {
        let input = noise(5000, 3);
        let other = noise(64, 99);
        let output = [frames(&input, 0, 2000), &other, frames(&input, 2000, 5000)].concat();
        let a = run(&input, &output);
        assert_eq!(a.segments.len(), 2, "{a}");
        assert_eq!(a.joins[0].out_gap, 64);
        assert_eq!(
            (a.inserted_frames(), a.skipped_frames(), a.concealed_frames()),
            (64, 0, 0)
        );
        assert_eq!(a.segments[1].in_start, 2000);
    }

    #[test]
    fn a_skipped_block_is_found() {
        let input = noise(5000, 4);
        let output = [frames(&input, 0, 700), frames(&input, 956, 5000)].concat();
        let a = run(&input, &output);
        assert_eq!(a.skipped_frames(), 256, "{a}");
        assert_eq!(a.inserted_frames(), 0);
    }

    #[test]
    fn a_repeated_block_is_found() {
        let input = noise(5000, 5);
        let output = [frames(&input, 0, 3000), frames(&input, 2900, 5000)].concat();
        let a = run(&input, &output);
        assert_eq!(a.repeated_frames(), 100, "{a}");
        assert_eq!(a.segments[1].in_start, 2900);
    }

    #[test]
    fn leading_silence_is_idle_not_a_segment() {
        let input = noise(5000, 6);
        let output = [&vec![0.0; 480 * CH][..], &input[..]].concat();
        let a = run(&input, &output);
        assert_eq!(a.idle, 480);
        assert_eq!(a.head_unmatched, 0);
        assert_eq!(a.segments.len(), 1);
        assert_eq!(a.discontinuities(), 0);
    }

    #[test]
    fn a_dropped_start_is_missing_input_and_a_discontinuity() {
        let input = noise(5000, 7);
        let output = [&vec![0.0; 100 * CH][..], frames(&input, 600, 5000)].concat();
        let a = run(&input, &output);
        assert_eq!((a.idle, a.missing_head()), (100, 600), "{a}");
        assert_eq!(a.discontinuities(), 1);
    }

    #[test]
    fn a_concealed_stretch_stands_in_for_the_frames_it_replaced() {
        let input = noise(5000, 8);
        // A fading stand-in that matches nothing, over input frames 1500..1700.
        let stand_in: Vec<f32> = frames(&input, 1300, 1500)
            .iter()
            .enumerate()
            .map(|(i, x)| x * 0.5 * (1.0 - i as f32 / 400.0))
            .collect();
        let output = [frames(&input, 0, 1500), &stand_in, frames(&input, 1700, 5000)].concat();
        let a = run(&input, &output);
        assert_eq!(a.segments.len(), 2, "{a}");
        assert_eq!(
            (a.concealed_frames(), a.inserted_frames(), a.skipped_frames()),
            (200, 0, 0)
        );
        assert_eq!(a.tail, 0);
    }

    #[test]
    fn a_silent_tail_after_the_last_frame_is_reported_apart() {
        let input = noise(3000, 9);
        let output = [&input[..], &vec![0.0; 1000 * CH][..]].concat();
        let a = run(&input, &output);
        assert_eq!((a.segments.len(), a.tail, a.missing_tail()), (1, 1000, 0), "{a}");
    }

    #[test]
    fn a_lossy_copy_matches_within_the_tolerance() {
        let input = noise(5000, 10);
        let mut r = SimRng::new(11);
        let lossy: Vec<f32> = [frames(&input, 0, 2500), frames(&input, 2517, 5000)]
            .concat()
            .iter()
            .map(|x| x + (r.unit() as f32 - 0.5) * 2e-3)
            .collect();
        let opts = AlignOptions {
            tolerance: 1e-3,
            ..AlignOptions::default()
        };
        let a = align(&input, &lossy, CH, opts);
        assert_eq!(a.segments.len(), 2, "{a}");
        assert_eq!((a.segments[1].out_start, a.segments[1].in_start), (2500, 2517));
        // Not within a tighter tolerance.
        let strict = align(&input, &lossy, CH, AlignOptions::default());
        assert!(strict.segments.is_empty(), "{strict}");
    }
}
