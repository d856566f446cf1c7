//! Every place where playout departs from the sender's stream, counted and located.
//!
//! A listener hears a discontinuity wherever the output is not the next frame of the
//! stream: a stretch of concealment, an inserted stretch (playout waited), a skipped
//! stretch (playout caught up). [`DiscontinuityLog`] records each one with what it was, why,
//! how long, at which media time and at which frame of the output, so a test comparing the
//! output with the input can check the stats against what it finds, and a musician can see
//! why a click happened. Contiguous stretches of the same kind and cause are one entry.
//!
//! Realtime: a fixed ring of the most recent entries plus totals; `record` never allocates.

use serde::Serialize;

/// Entries kept (the totals count every one).
pub const LOG_CAPACITY: usize = 256;

/// What playout did to the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DiscontinuityKind {
    /// Frames that never arrived in time, continued by the concealer in their place: the
    /// stream's timeline is kept.
    Concealed,
    /// Frames played while the stream waits: the timeline moves later by as many.
    Inserted,
    /// Frames of the stream not played: the timeline moves earlier by as many.
    Skipped,
}

/// Why it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DiscontinuityCause {
    /// A packet was lost (later audio had arrived).
    Loss,
    /// Nothing had arrived when the frames were due (late, or lost at the head).
    Late,
    /// The buffer's target grew: playout waits for audio that would otherwise come late.
    Growth,
    /// The buffer held more than its target for a while: playout catches up.
    Shrink,
    /// The stream re-locked on a new timeline (a restarted sender, a resumed pause).
    Relock,
    /// The stream stopped arriving for longer than a dropout (the sender paused or ended,
    /// or the path stalled): what played from its last frame on, until silence.
    Pause,
    /// This side's own audio device missed its deadlines and lost time (JACK dropped
    /// cycles, or its server stood still): the far audio due meanwhile was dropped, so
    /// playout stays on time.
    DeviceLost,
    /// The far side's device lost time and its stream skipped it (consecutive packets a
    /// gap apart in media time): playout had waited for the packets it made late already,
    /// so it jumped over as much of the gap as it was late, instead of playing it too
    /// (skipped); what it did not jump over is concealed (concealed).
    SenderLost,
}

/// One discontinuity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Discontinuity {
    pub kind: DiscontinuityKind,
    pub cause: DiscontinuityCause,
    /// Output frames it lasted (for a skip: stream frames dropped).
    pub frames: u64,
    /// The stream's media time (extended RTP timestamp) where it began.
    pub media_ts: u64,
    /// The output frame (counted from the first frame played) where it began.
    pub output_frame: u64,
}

/// Totals by kind, in events and frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DiscontinuityTotals {
    /// Every entry: what a listener can find in the output.
    pub events: u64,
    pub concealed_events: u64,
    pub inserted_events: u64,
    pub skipped_events: u64,
    pub loss: u64,
    pub late: u64,
    pub growth: u64,
    pub shrink: u64,
    pub relock: u64,
    pub pause: u64,
    pub device_lost: u64,
    /// Frames skipped because the device lost that time (the events are `device_lost`).
    pub device_lost_frames: u64,
    /// Gaps the far side's lost time left in its stream, jumped over.
    pub sender_lost: u64,
    /// Gaps the far side's lost time left in its stream, concealed where playout did not
    /// jump over them (on a clean path, what would otherwise read as a loss).
    pub sender_gap_concealed: u64,
}

/// The recent entries and the totals.
#[derive(Debug, Clone)]
pub struct DiscontinuityLog {
    ring: [Option<Discontinuity>; LOG_CAPACITY],
    next: usize,
    totals: DiscontinuityTotals,
    /// The output frame where the newest stretch that moved playout off its timeline (late
    /// audio, a grown target, a re-lock) ended.
    disturbed_until: Option<u64>,
}

impl Default for DiscontinuityLog {
    fn default() -> Self {
        Self {
            ring: [None; LOG_CAPACITY],
            next: 0,
            totals: DiscontinuityTotals::default(),
            disturbed_until: None,
        }
    }
}

impl DiscontinuityLog {
    /// Record `frames` of `kind` for `cause` at `media_ts` / `output_frame`. When it continues
    /// the previous entry (same kind and cause, starting where that one ended in the output;
    /// or, inserted, at the same media time: a wait that runs on into the next period with
    /// nothing played between, however a resampled period counted its frames), the entry
    /// grows instead.
    pub fn record(
        &mut self,
        kind: DiscontinuityKind,
        cause: DiscontinuityCause,
        frames: u64,
        media_ts: u64,
        output_frame: u64,
    ) {
        if frames == 0 {
            return;
        }
        if matches!(
            cause,
            DiscontinuityCause::Late | DiscontinuityCause::Growth | DiscontinuityCause::Relock
        ) {
            self.disturbed_until = Some(output_frame + frames);
        }
        let last = (self.next + LOG_CAPACITY - 1) % LOG_CAPACITY;
        if let Some(prev) = self.ring[last].as_mut() {
            let same = kind != DiscontinuityKind::Skipped && prev.kind == kind && prev.cause == cause;
            let contiguous = same && prev.output_frame + prev.frames == output_frame;
            let waits_on = same
                && kind == DiscontinuityKind::Inserted
                && prev.media_ts == media_ts
                && (prev.output_frame..=prev.output_frame + prev.frames).contains(&output_frame);
            if contiguous || waits_on {
                prev.frames += frames;
                if cause == DiscontinuityCause::DeviceLost {
                    self.totals.device_lost_frames += frames;
                }
                return;
            }
        }
        self.ring[self.next] = Some(Discontinuity {
            kind,
            cause,
            frames,
            media_ts,
            output_frame,
        });
        self.next = (self.next + 1) % LOG_CAPACITY;
        let t = &mut self.totals;
        t.events += 1;
        match kind {
            DiscontinuityKind::Concealed => t.concealed_events += 1,
            DiscontinuityKind::Inserted => t.inserted_events += 1,
            DiscontinuityKind::Skipped => t.skipped_events += 1,
        }
        match cause {
            DiscontinuityCause::Loss => t.loss += 1,
            DiscontinuityCause::Late => t.late += 1,
            DiscontinuityCause::Growth => t.growth += 1,
            DiscontinuityCause::Shrink => t.shrink += 1,
            DiscontinuityCause::Relock => t.relock += 1,
            DiscontinuityCause::Pause => t.pause += 1,
            DiscontinuityCause::DeviceLost => {
                t.device_lost += 1;
                t.device_lost_frames += frames;
            }
            DiscontinuityCause::SenderLost if kind == DiscontinuityKind::Concealed => {
                t.sender_gap_concealed += 1
            }
            DiscontinuityCause::SenderLost => t.sender_lost += 1,
        }
    }

    /// Playout went back to media time `media_ts` (see the jitter buffer's stall): the
    /// newest entry, audio concealed as late from there up to output frame `end`, was
    /// inserted while the stream waited, not concealed in its place. Returns false (and
    /// changes nothing) when the newest entry is not that.
    pub fn waited_for_late(&mut self, media_ts: u64, end: u64) -> bool {
        let last = (self.next + LOG_CAPACITY - 1) % LOG_CAPACITY;
        let Some(e) = self.ring[last] else { return false };
        let late = e.kind == DiscontinuityKind::Concealed && e.cause == DiscontinuityCause::Late;
        if !late || e.media_ts != media_ts || e.output_frame + e.frames != end {
            return false;
        }
        self.ring[last] = None;
        self.uncount(e);
        self.next = last;
        self.record(
            DiscontinuityKind::Inserted,
            DiscontinuityCause::Late,
            e.frames,
            e.media_ts,
            e.output_frame,
        );
        true
    }

    /// The stream has paused: the newest entries that began at or after `end` (the frame
    /// after the last one that arrived) were its pause, not a late packet or a grown target.
    /// They become one entry, as a listener hears one gap — with the pause already marked
    /// there, if the same pause was marked before (a wait that went on past the moment the
    /// stream counted as paused).
    pub fn mark_pause(&mut self, end: u64) {
        let mut first = None;
        let mut frames = 0;
        for k in 1..=LOG_CAPACITY {
            let i = (self.next + LOG_CAPACITY - k) % LOG_CAPACITY;
            let Some(e) = self.ring[i] else { break };
            let pausing = matches!(
                e.cause,
                DiscontinuityCause::Late | DiscontinuityCause::Growth | DiscontinuityCause::Pause
            );
            if e.media_ts < end || e.kind == DiscontinuityKind::Skipped || !pausing {
                break;
            }
            first = Some((i, k));
            frames += e.frames;
        }
        let Some((oldest, count)) = first else { return };
        let Some(start) = self.ring[oldest] else { return };
        for k in 1..=count {
            let i = (self.next + LOG_CAPACITY - k) % LOG_CAPACITY;
            if let Some(e) = self.ring[i].take() {
                self.uncount(e);
            }
        }
        self.next = oldest;
        self.record(
            start.kind,
            DiscontinuityCause::Pause,
            frames,
            start.media_ts,
            start.output_frame,
        );
    }

    /// Take `e` out of the totals.
    fn uncount(&mut self, e: Discontinuity) {
        let t = &mut self.totals;
        t.events -= 1;
        match e.kind {
            DiscontinuityKind::Concealed => t.concealed_events -= 1,
            DiscontinuityKind::Inserted => t.inserted_events -= 1,
            DiscontinuityKind::Skipped => t.skipped_events -= 1,
        }
        match e.cause {
            DiscontinuityCause::Loss => t.loss -= 1,
            DiscontinuityCause::Late => t.late -= 1,
            DiscontinuityCause::Growth => t.growth -= 1,
            DiscontinuityCause::Shrink => t.shrink -= 1,
            DiscontinuityCause::Relock => t.relock -= 1,
            DiscontinuityCause::Pause => t.pause -= 1,
            DiscontinuityCause::DeviceLost => {
                t.device_lost -= 1;
                t.device_lost_frames -= e.frames;
            }
            DiscontinuityCause::SenderLost if e.kind == DiscontinuityKind::Concealed => {
                t.sender_gap_concealed -= 1
            }
            DiscontinuityCause::SenderLost => t.sender_lost -= 1,
        }
    }

    /// The output frame where the newest late, grown or re-locked stretch ended: playout
    /// was moved off its timeline there (`None`: never).
    pub fn disturbed_until(&self) -> Option<u64> {
        self.disturbed_until
    }

    pub fn totals(&self) -> DiscontinuityTotals {
        self.totals
    }

    /// The most recent entries (at most [`LOG_CAPACITY`]), oldest first.
    pub fn recent(&self) -> impl Iterator<Item = &Discontinuity> {
        let (newer, older) = self.ring.split_at(self.next);
        older.iter().chain(newer.iter()).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DiscontinuityCause::*;
    use DiscontinuityKind::*;

    /// A wait that runs on into the next period is one entry, wherever the resampled
    /// period placed its first part; a wait at another media time, or one after audio
    /// played, is another.
    #[test]
    fn a_wait_that_runs_on_is_one_entry() {
        let mut log = DiscontinuityLog::default();
        log.record(Inserted, Growth, 1, 5000, 1000);
        log.record(Inserted, Growth, 5, 5000, 1000); // the same wait, the next period
        log.record(Inserted, Growth, 3, 5000, 1006); // the same wait still
        log.record(Inserted, Growth, 4, 5000, 1200); // played audio between: another
        log.record(Inserted, Growth, 4, 5100, 1300); // another media time: another
        log.record(Inserted, Late, 2, 5100, 1304); // another cause
        let t = log.totals();
        assert_eq!((t.events, t.inserted_events, t.growth, t.late), (4, 4, 3, 1));
        let first = log.recent().next().copied().expect("an entry");
        assert_eq!((first.frames, first.output_frame), (9, 1000));
    }

    #[test]
    fn contiguous_stretches_are_one_entry_and_others_are_not() {
        let mut log = DiscontinuityLog::default();
        log.record(Concealed, Loss, 64, 1000, 500);
        log.record(Concealed, Loss, 64, 1064, 564); // continues it
        log.record(Concealed, Late, 10, 1128, 628); // another cause
        log.record(Inserted, Growth, 64, 2000, 1000);
        log.record(Skipped, Shrink, 30, 3000, 2000);
        log.record(Skipped, Shrink, 30, 3100, 2000); // skips never merge
        log.record(Concealed, Loss, 0, 4000, 3000); // nothing
        let t = log.totals();
        assert_eq!(t.events, 5);
        assert_eq!(
            (t.concealed_events, t.inserted_events, t.skipped_events),
            (2, 1, 2)
        );
        assert_eq!((t.loss, t.late, t.growth, t.shrink), (1, 1, 1, 2));
        let first = log.recent().next().copied().expect("an entry");
        assert_eq!(
            (first.frames, first.media_ts, first.output_frame),
            (128, 1000, 500)
        );
    }

    #[test]
    fn only_stretches_that_moved_playout_mark_it_disturbed() {
        let mut log = DiscontinuityLog::default();
        log.record(DiscontinuityKind::Concealed, DiscontinuityCause::Loss, 64, 0, 100);
        log.record(DiscontinuityKind::Skipped, DiscontinuityCause::Shrink, 64, 0, 200);
        assert_eq!(log.disturbed_until(), None);
        log.record(
            DiscontinuityKind::Inserted,
            DiscontinuityCause::Growth,
            64,
            0,
            300,
        );
        // A stretch that continues grows the entry, and the disturbance with it.
        log.record(
            DiscontinuityKind::Inserted,
            DiscontinuityCause::Growth,
            36,
            0,
            364,
        );
        assert_eq!(log.disturbed_until(), Some(400));
        log.record(DiscontinuityKind::Concealed, DiscontinuityCause::Late, 10, 0, 500);
        log.record(DiscontinuityKind::Skipped, DiscontinuityCause::Shrink, 64, 0, 600);
        assert_eq!(log.disturbed_until(), Some(510));
        log.record(
            DiscontinuityKind::Inserted,
            DiscontinuityCause::Relock,
            20,
            0,
            700,
        );
        assert_eq!(log.disturbed_until(), Some(720));
    }

    #[test]
    fn what_played_after_the_last_frame_becomes_a_pause() {
        let mut log = DiscontinuityLog::default();
        log.record(Concealed, Late, 64, 1000, 500);
        log.record(Inserted, Growth, 20, 5000, 4000);
        log.record(Concealed, Late, 900, 5000, 4020);
        log.mark_pause(5000);
        let t = log.totals();
        assert_eq!((t.events, t.late, t.growth, t.pause), (2, 1, 0, 1));
        assert_eq!((t.concealed_events, t.inserted_events), (1, 1));
        let last = log.recent().last().copied().expect("an entry");
        assert_eq!(
            (last.kind, last.cause, last.frames, last.output_frame),
            (Inserted, Pause, 920, 4000)
        );
        // Marking again changes nothing.
        log.mark_pause(5000);
        assert_eq!(log.totals(), t);
        // A wait that goes on after the pause was marked is the same pause.
        log.record(Inserted, Growth, 64, 5000, 4920);
        log.mark_pause(5000);
        assert_eq!(log.totals(), t);
        let last = log.recent().last().copied().expect("an entry");
        assert_eq!((last.cause, last.frames, last.output_frame), (Pause, 984, 4000));
        // A stream that resumed and paused again has paused twice.
        log.record(Concealed, Late, 100, 9000, 8000);
        log.mark_pause(9000);
        assert_eq!(log.totals().pause, 2);
    }

    #[test]
    fn the_ring_keeps_the_newest_in_order() {
        let mut log = DiscontinuityLog::default();
        for i in 0..(LOG_CAPACITY as u64 + 10) {
            log.record(Concealed, Loss, 1, i * 100, i * 100);
        }
        let ts: Vec<u64> = log.recent().map(|d| d.media_ts).collect();
        assert_eq!(ts.len(), LOG_CAPACITY);
        assert_eq!(ts[0], 1000);
        assert!(ts.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(log.totals().events, LOG_CAPACITY as u64 + 10);
    }

    #[test]
    fn frames_the_device_lost_are_totalled_past_the_ring() {
        let mut log = DiscontinuityLog::default();
        log.record(Skipped, DeviceLost, 4800, 0, 0);
        for i in 0..(LOG_CAPACITY as u64 + 10) {
            log.record(Skipped, DeviceLost, 64, 10_000 + i * 100, 10_000 + i * 100);
        }
        log.record(Concealed, Loss, 64, 1_000_000, 1_000_000);
        let t = log.totals();
        assert_eq!(t.device_lost, LOG_CAPACITY as u64 + 11);
        assert_eq!(t.device_lost_frames, 4800 + 64 * (LOG_CAPACITY as u64 + 10));
        let in_ring: u64 = log
            .recent()
            .filter(|d| d.cause == DeviceLost)
            .map(|d| d.frames)
            .sum();
        assert!(in_ring < t.device_lost_frames);
    }
}
