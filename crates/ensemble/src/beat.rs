//! A shared beat: tempo and beat phase as ensemble state, and a click on it.
//!
//! The beat is a function of ensemble time, piecewise linear: each [`TempoSegment`] says
//! `beat = start_beat + (t − start_ns) · bpm / 60 s` from its start on. A [`TempoMap`]
//! holds the segments a member knows; the one in force at `t` is the latest that started
//! at or before `t` (ties go to the larger setter id, so every member holding the same
//! segments agrees). A tempo with nothing before it starts at ensemble time 0, beat 0:
//! members that set the same tempo independently then click together without having
//! heard of each other. A change ([`TempoMap::change`]) starts on a whole beat (or bar)
//! of the map in force, far enough ahead to reach every member, so it takes effect on the
//! same beat everywhere.
//!
//! For the audio thread, [`tempo_share`] publishes a [`TempoView`] (the segment in force
//! and the next one) through the crate's lock-free publisher ([`crate::publish`]), read without locks, allocation or
//! waiting; [`ClickTrack`] writes a click at the frame each beat falls on, given the
//! period's start in ensemble time.
//!
//! This module never reads a clock or touches a socket; reading a view and rendering
//! clicks never allocate, lock or block (`tests/no_alloc.rs`).

use serde::Serialize;

use crate::publish::{self, Publisher, Reader, Words};

/// Nanoseconds per minute.
const MINUTE_NS: f64 = 60e9;

/// The slowest and fastest tempo a segment may have.
pub const MIN_BPM: f64 = 1.0;
pub const MAX_BPM: f64 = 1_000.0;

/// Segments a [`TempoMap`] keeps (the oldest are dropped first).
pub const MAX_SEGMENTS: usize = 16;

/// From `start_ns` (ensemble time) on, the beat runs at `bpm` from `start_beat`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TempoSegment {
    pub start_ns: u64,
    pub start_beat: f64,
    pub bpm: f64,
    /// The member that set it (breaks ties between segments starting together).
    pub by: u64,
}

impl TempoSegment {
    /// Whether the numbers make a tempo (finite, `MIN_BPM..=MAX_BPM`).
    pub fn is_valid(&self) -> bool {
        self.start_beat.is_finite() && self.bpm.is_finite() && (MIN_BPM..=MAX_BPM).contains(&self.bpm)
    }

    /// The beat at ensemble time `t_ns` on this segment's line.
    pub fn beat_at(&self, t_ns: u64) -> f64 {
        let dt = (t_ns as i128 - self.start_ns as i128) as f64;
        self.start_beat + dt * self.bpm / MINUTE_NS
    }

    /// The ensemble time (ns, fractional) at which this segment's line reaches `beat`.
    pub fn time_of(&self, beat: f64) -> f64 {
        self.start_ns as f64 + (beat - self.start_beat) * MINUTE_NS / self.bpm
    }

    /// Nanoseconds per beat.
    pub fn beat_ns(&self) -> f64 {
        MINUTE_NS / self.bpm
    }

    fn key(&self) -> (u64, u64) {
        (self.start_ns, self.by)
    }
}

/// The segment in force at some time and the one after it: all the audio thread needs
/// between two publications.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TempoView {
    pub current: Option<TempoSegment>,
    pub next: Option<TempoSegment>,
}

impl TempoView {
    fn segment_at(&self, t_ns: u64) -> Option<&TempoSegment> {
        match &self.next {
            Some(n) if t_ns >= n.start_ns => Some(n),
            _ => self.current.as_ref(),
        }
    }

    /// The beat at ensemble time `t_ns` (`None` before any tempo is in force).
    pub fn beat_at(&self, t_ns: u64) -> Option<f64> {
        self.segment_at(t_ns).map(|s| s.beat_at(t_ns))
    }

    /// The tempo in force at `t_ns`.
    pub fn bpm_at(&self, t_ns: u64) -> Option<f64> {
        self.segment_at(t_ns).map(|s| s.bpm)
    }

    /// When beat number `beat` falls (ensemble ns, fractional); `None` when no tempo is
    /// in force then, or the beat falls in none of the two segments' stretches (a change
    /// that did not start on a whole beat skips some).
    pub fn time_of_beat(&self, beat: f64) -> Option<f64> {
        let on_current = self.current.map(|c| c.time_of(beat));
        match (&self.next, on_current) {
            (Some(n), Some(t)) if t < n.start_ns as f64 => Some(t),
            (Some(n), _) => {
                let tn = n.time_of(beat);
                (tn >= n.start_ns as f64).then_some(tn)
            }
            (None, t) => t,
        }
    }
}

/// Why a tempo cannot be set.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum TempoError {
    #[error("{0} BPM is not a tempo: give {MIN_BPM}–{MAX_BPM}")]
    BadTempo(f64),
}

/// Every tempo segment a member knows, in order (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct TempoMap {
    segments: Vec<TempoSegment>,
}

impl TempoMap {
    pub fn new() -> Self {
        Self {
            segments: Vec::with_capacity(MAX_SEGMENTS + 1),
        }
    }

    pub fn segments(&self) -> &[TempoSegment] {
        &self.segments
    }

    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Adds a segment; false when it is invalid or already known (same start and setter).
    pub fn insert(&mut self, seg: TempoSegment) -> bool {
        if !seg.is_valid() {
            return false;
        }
        match self.segments.binary_search_by(|s| s.key().cmp(&seg.key())) {
            Ok(i) => {
                if self.segments[i] == seg {
                    return false;
                }
                self.segments[i] = seg;
            }
            Err(i) => self.segments.insert(i, seg),
        }
        if self.segments.len() > MAX_SEGMENTS {
            self.segments.remove(0);
        }
        true
    }

    fn index_at(&self, t_ns: u64) -> Option<usize> {
        let after = self.segments.partition_point(|s| s.start_ns <= t_ns);
        after.checked_sub(1)
    }

    /// The segment in force at ensemble time `t_ns`.
    pub fn at(&self, t_ns: u64) -> Option<&TempoSegment> {
        self.index_at(t_ns).map(|i| &self.segments[i])
    }

    /// The segments in force at `t_ns` and from then on (what a newcomer needs).
    pub fn from(&self, t_ns: u64) -> &[TempoSegment] {
        let i = self.index_at(t_ns).unwrap_or(0);
        &self.segments[i..]
    }

    /// The segment in force at `t_ns` and the next one.
    pub fn view(&self, t_ns: u64) -> TempoView {
        let i = self.index_at(t_ns);
        let next = i.map_or(0, |i| i + 1);
        TempoView {
            current: i.map(|i| self.segments[i]),
            next: self.segments.get(next).copied(),
        }
    }

    /// The beat at `t_ns`.
    pub fn beat_at(&self, t_ns: u64) -> Option<f64> {
        self.at(t_ns).map(|s| s.beat_at(t_ns))
    }

    /// A segment setting `bpm`, by member `by`, at ensemble time `now_ns`: with no tempo
    /// yet, from ensemble time 0, beat 0; otherwise on the first whole beat — the first
    /// beat of a bar when `beats_per_bar` is given — at least `lead_ns` ahead.
    pub fn change(
        &self,
        now_ns: u64,
        lead_ns: u64,
        bpm: f64,
        by: u64,
        beats_per_bar: Option<u32>,
    ) -> Result<TempoSegment, TempoError> {
        let seg = TempoSegment {
            start_ns: 0,
            start_beat: 0.0,
            bpm,
            by,
        };
        if !seg.is_valid() {
            return Err(TempoError::BadTempo(bpm));
        }
        let from = now_ns.saturating_add(lead_ns);
        // The view at `from` knows any change already planned before it.
        let view = self.view(from);
        let (Some(b), Some(_)) = (view.beat_at(from), view.current) else {
            return Ok(seg);
        };
        let unit = f64::from(beats_per_bar.unwrap_or(1).max(1));
        let mut beat = (b / unit).ceil() * unit;
        // A beat the map skips (or rounding) moves on to the next unit.
        let mut t = view.time_of_beat(beat);
        for _ in 0..4 {
            if matches!(t, Some(x) if x >= from as f64) {
                break;
            }
            beat += unit;
            t = view.time_of_beat(beat);
        }
        let t = t.unwrap_or(from as f64);
        Ok(TempoSegment {
            start_ns: t.ceil().max(0.0) as u64,
            start_beat: beat,
            bpm,
            by,
        })
    }
}

impl Words for TempoView {
    type Packed = [u64; 8];
    fn pack(&self) -> [u64; 8] {
        let (a, b) = (pack(self.current), pack(self.next));
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }
    fn unpack(w: &[u64; 8]) -> Self {
        Self {
            current: unpack(&w[..4]),
            next: unpack(&w[4..]),
        }
    }
}

/// The writing side (one per member; not `Clone`), on the network thread. The setter
/// ids are not carried.
pub type TempoPublisher = Publisher<TempoView>;

/// The reading side, for the audio thread (cheap to clone).
pub type TempoReader = Reader<TempoView>;

/// A publisher and a reader of one member's [`TempoView`].
pub fn tempo_share() -> (TempoPublisher, TempoReader) {
    publish::share()
}

fn pack(seg: Option<TempoSegment>) -> [u64; 4] {
    match seg {
        None => [0; 4],
        Some(s) => [1, s.start_ns, s.start_beat.to_bits(), s.bpm.to_bits()],
    }
}

fn unpack(w: &[u64]) -> Option<TempoSegment> {
    (w[0] == 1).then(|| TempoSegment {
        start_ns: w[1],
        start_beat: f64::from_bits(w[2]),
        bpm: f64::from_bits(w[3]),
        by: 0,
    })
}

impl Reader<TempoView> {
    /// The view in force, or `None` before the first publish (or, rarely, when the
    /// writer kept publishing over the slot while this read was under way).
    pub fn view(&self) -> Option<TempoView> {
        self.get()
    }
}

/// Most clicks started in one period (more are dropped: at 1000 BPM a beat is 60 ms).
const MAX_ONSETS: usize = 8;
/// A beat that fell this much before the period (between two periods whose ensemble
/// starts did not quite meet) still clicks, at the period's first frame.
const LATE_NS: f64 = 2e6;

/// A click on every beat, sample-accurate: [`ClickTrack::render`] adds a short tone
/// starting at the frame each beat falls on (higher on the first beat of a bar).
/// Allocates only in [`ClickTrack::new`].
#[derive(Debug)]
pub struct ClickTrack {
    rate: u32,
    beats_per_bar: u32,
    /// The beat clicked last.
    last_beat: Option<i64>,
    /// The click sounding now and how far into it.
    sounding: Option<(bool, usize)>,
    plain: Box<[f32]>,
    accent: Box<[f32]>,
}

/// A click that started in a period.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Onset {
    pub frame: u32,
    pub beat: i64,
    /// The beat's ensemble time (ns, fractional).
    pub time_ns: f64,
}

impl ClickTrack {
    /// Clicks at `rate` Hz, `level` peak (linear), the bar's first beat higher when
    /// `beats_per_bar` > 1.
    pub fn new(rate: u32, level: f32, beats_per_bar: u32) -> Self {
        let rate = rate.max(1);
        // 20 ms of a decaying tone: 1.6 kHz, 2.4 kHz on the bar; it starts at its peak so
        // its onset is the frame itself.
        let len = (rate as usize / 50).max(1);
        let tone = |hz: f32| -> Box<[f32]> {
            (0..len)
                .map(|i| {
                    let t = i as f32 / rate as f32;
                    level * (-t / 0.004).exp() * (std::f32::consts::TAU * hz * t).cos()
                })
                .collect()
        };
        Self {
            rate,
            beats_per_bar: beats_per_bar.max(1),
            last_beat: None,
            sounding: None,
            plain: tone(1_600.0),
            accent: tone(2_400.0),
        }
    }

    /// Adds the clicks of one period to `out` (`frames` interleaved frames of `channels`
    /// channels) whose first frame is at ensemble time `start_ns`, following `view`.
    /// Calls `on_onset` for every click started. Never allocates, locks or blocks.
    pub fn render(
        &mut self,
        view: &TempoView,
        start_ns: u64,
        frames: usize,
        channels: usize,
        out: &mut [f32],
        mut on_onset: impl FnMut(Onset),
    ) {
        let channels = channels.max(1);
        let frames = frames.min(out.len() / channels);
        let mut onsets = [(0usize, false); MAX_ONSETS];
        let mut n_onsets = 0;
        let frame_ns = 1e9 / f64::from(self.rate);
        let start = start_ns as f64;
        let end = start + frames as f64 * frame_ns;
        if let Some(b) = view.beat_at(start_ns) {
            let first = (b - 1e-9).ceil() as i64;
            // The first period starts with the beat after it.
            // A map that went back (a tempo set from elsewhere won) starts over too.
            let last = match self.last_beat {
                Some(l) if l <= first + 1 => l,
                _ => first - 1,
            };
            self.last_beat = Some(last);
            let mut n = if last < first {
                // The next beat after the last one clicked, if it only just went by.
                match view.time_of_beat((last + 1) as f64) {
                    Some(t) if t >= start - LATE_NS => last + 1,
                    _ => first,
                }
            } else {
                last + 1
            };
            while n_onsets < MAX_ONSETS {
                let Some(t) = view.time_of_beat(n as f64) else {
                    // Skipped by a change; try the next.
                    if n > first + 64 {
                        break;
                    }
                    n += 1;
                    continue;
                };
                // The frame nearest the beat; one nearer the next period's first frame is
                // left to it.
                let frame = ((t - start) / frame_ns).round().max(0.0);
                if t >= end || frame >= frames as f64 {
                    break;
                }
                let frame = frame as usize;
                let accent = self.beats_per_bar > 1 && n.rem_euclid(i64::from(self.beats_per_bar)) == 0;
                onsets[n_onsets] = (frame, accent);
                n_onsets += 1;
                on_onset(Onset {
                    frame: frame as u32,
                    beat: n,
                    time_ns: t,
                });
                self.last_beat = Some(n);
                n += 1;
            }
        }
        let mut next_onset = 0;
        for f in 0..frames {
            while next_onset < n_onsets && onsets[next_onset].0 == f {
                self.sounding = Some((onsets[next_onset].1, 0));
                next_onset += 1;
            }
            let Some((accent, pos)) = self.sounding else {
                if next_onset >= n_onsets {
                    break;
                }
                continue;
            };
            let tone = if accent { &self.accent } else { &self.plain };
            let Some(&v) = tone.get(pos) else {
                self.sounding = None;
                continue;
            };
            for s in &mut out[f * channels..(f + 1) * channels] {
                *s += v;
            }
            self.sounding = Some((accent, pos + 1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000 * MS;

    #[test]
    fn a_first_tempo_starts_at_the_epoch_and_a_change_on_the_next_beat() {
        let mut m = TempoMap::new();
        let first = m.change(1_234 * S + 17, 200 * MS, 120.0, 7, None).unwrap();
        assert_eq!((first.start_ns, first.start_beat), (0, 0.0));
        assert!(m.insert(first));
        assert!(!m.insert(first));
        // At 120 BPM beat k falls at k × 0.5 s. From 10.1 s with 0.2 s lead: beat 21 (10.5 s).
        let c = m.change(10_100 * MS, 200 * MS, 90.0, 9, None).unwrap();
        assert_eq!((c.start_ns, c.start_beat, c.bpm), (10_500 * MS, 21.0, 90.0));
        // On a bar of 4: beat 24 (12 s).
        let bar = m.change(10_100 * MS, 200 * MS, 90.0, 9, Some(4)).unwrap();
        assert_eq!((bar.start_ns, bar.start_beat), (12 * S, 24.0));
        assert!(m.insert(c));
        assert_eq!(m.beat_at(10_500 * MS), Some(21.0));
        // 90 BPM: a beat every 2/3 s.
        assert!((m.beat_at(11_500 * MS).unwrap() - 22.5).abs() < 1e-9);
        let v = m.view(10 * S);
        assert_eq!(v.current, Some(first));
        assert_eq!(v.next, Some(c));
        assert!((v.time_of_beat(23.0).unwrap() - 11_833_333_333.3).abs() < 1.0);
        assert!((v.time_of_beat(20.0).unwrap() - 10e9).abs() < 1.0);
        assert_eq!(m.change(0, 0, 0.5, 1, None), Err(TempoError::BadTempo(0.5)));
        assert!(!m.insert(TempoSegment { bpm: f64::NAN, ..c }));
    }

    #[test]
    fn members_holding_the_same_segments_agree_whatever_the_order() {
        let segs = [
            TempoSegment {
                start_ns: 0,
                start_beat: 0.0,
                bpm: 120.0,
                by: 3,
            },
            TempoSegment {
                start_ns: 0,
                start_beat: 0.0,
                bpm: 100.0,
                by: 5,
            },
            TempoSegment {
                start_ns: 4 * S,
                start_beat: 7.0,
                bpm: 140.0,
                by: 1,
            },
        ];
        let mut a = TempoMap::new();
        let mut b = TempoMap::new();
        for s in segs {
            a.insert(s);
        }
        for s in segs.iter().rev() {
            b.insert(*s);
        }
        for t in [0, S, 3 * S, 4 * S, 9 * S] {
            assert_eq!(a.beat_at(t), b.beat_at(t));
        }
        // The larger setter id wins a tie.
        assert_eq!(a.at(S).unwrap().bpm, 100.0);
        assert_eq!(a.from(5 * S).len(), 1);
        assert_eq!(a.from(S).len(), 2);
    }

    #[test]
    fn a_view_whose_first_segment_is_still_ahead_finds_its_beats() {
        let seg = TempoSegment {
            start_ns: 10 * S,
            start_beat: 3.0,
            bpm: 60.0,
            by: 1,
        };
        let mut m = TempoMap::new();
        m.insert(seg);
        let v = m.view(9 * S);
        assert_eq!((v.current, v.next), (None, Some(seg)));
        assert_eq!(v.beat_at(9 * S), None);
        assert_eq!(v.time_of_beat(2.0), None);
        assert_eq!(v.time_of_beat(4.0), Some(11e9));
    }

    #[test]
    fn the_map_keeps_a_bounded_history() {
        let mut m = TempoMap::new();
        for k in 0..40u64 {
            m.insert(TempoSegment {
                start_ns: k * S,
                start_beat: k as f64,
                bpm: 60.0,
                by: 1,
            });
        }
        assert_eq!(m.segments().len(), MAX_SEGMENTS);
        assert_eq!(m.at(39 * S).unwrap().start_ns, 39 * S);
    }

    #[test]
    fn a_view_read_is_the_one_published() {
        let (mut w, r) = tempo_share();
        assert_eq!(r.view(), None);
        let seg = TempoSegment {
            start_ns: 5,
            start_beat: 2.0,
            bpm: 97.0,
            by: 0,
        };
        w.publish(TempoView {
            current: Some(seg),
            next: None,
        });
        assert_eq!(
            r.view(),
            Some(TempoView {
                current: Some(seg),
                next: None
            })
        );
    }

    /// Onsets (absolute frame, beat) of a click track over `periods` periods of `frames`
    /// at 48 kHz, the first starting at ensemble time `t0`.
    fn onsets(view: &TempoView, t0: u64, frames: usize, periods: usize) -> Vec<(u64, i64, Vec<f32>)> {
        let mut c = ClickTrack::new(48_000, 0.5, 4);
        let mut out = vec![0f32; frames * 2];
        let mut got = Vec::new();
        for p in 0..periods {
            out.fill(0.0);
            let start = t0 + (p * frames) as u64 * S / 48_000;
            let mut here = Vec::new();
            c.render(view, start, frames, 2, &mut out, |o| here.push(o));
            for o in here {
                let f = (p * frames) as u64 + u64::from(o.frame);
                got.push((
                    f,
                    o.beat,
                    out[o.frame as usize * 2..o.frame as usize * 2 + 2].to_vec(),
                ));
            }
        }
        got
    }

    #[test]
    fn clicks_land_on_the_frame_of_each_beat() {
        let view = TempoView {
            current: Some(TempoSegment {
                start_ns: 0,
                start_beat: 0.0,
                bpm: 120.0,
                by: 0,
            }),
            next: Some(TempoSegment {
                start_ns: 3 * S,
                start_beat: 6.0,
                bpm: 90.0,
                by: 0,
            }),
        };
        // Start 10 ms before beat 2 (1 s), 64-frame periods, 5 s.
        let t0 = 990 * MS;
        let got = onsets(&view, t0, 64, 5 * 48_000 / 64);
        let beats: Vec<i64> = got.iter().map(|x| x.1).collect();
        assert_eq!(beats, (2..=10).collect::<Vec<_>>());
        for (frame, beat, samples) in &got {
            let t = view.time_of_beat(*beat as f64).unwrap();
            let want = ((t - t0 as f64) * 48_000.0 / 1e9).round() as u64;
            assert_eq!(*frame, want, "beat {beat}");
            // The click starts at its peak, on both channels.
            assert_eq!(samples, &[0.5, 0.5]);
        }
        // 1 s is frame 480 of the run; the 90 BPM beats after 3 s are 2/3 s apart.
        assert_eq!(got[0].0, 480);
        assert_eq!(got[5].0 - got[4].0, 32_000);
    }

    #[test]
    fn a_beat_between_two_periods_that_do_not_meet_still_clicks_once() {
        let view = TempoView {
            current: Some(TempoSegment {
                start_ns: 0,
                start_beat: 0.0,
                bpm: 60.0,
                by: 0,
            }),
            next: None,
        };
        let mut c = ClickTrack::new(48_000, 0.5, 1);
        let mut out = vec![0f32; 64];
        let mut n = 0;
        // A period ending 0.1 ms before beat 1, the next starting 0.5 ms after it.
        c.render(&view, S - 1_433_333, 64, 1, &mut out, |_| n += 1);
        c.render(&view, S + 500_000, 64, 1, &mut out, |o| {
            assert_eq!((o.frame, o.beat), (0, 1));
            n += 1
        });
        // Periods overlapping it again do not click it twice.
        c.render(&view, S - 100_000, 64, 1, &mut out, |_| n += 1);
        assert_eq!(n, 1);
    }
}
