//! Device time that never became audio, found against the system clock.
//!
//! A capture device's frame clock is the sender's media clock: every RTP timestamp counts
//! the frames it delivered. A device that loses time without saying so — an audio server
//! that drops cycles and counts on from where it stopped (JACK's dummy driver on a busy or
//! virtual machine does this), a timer that loses ticks — makes that clock fall behind
//! real time. The far side then sees this sender's packets come later and later against
//! their timestamps: a path that never stops getting slower. Its jitter estimate chases the
//! ramp, its drift corrector runs into its limit, and latency climbs to the buffer's
//! ceiling and stays there.
//!
//! [`SlipGuard`] keeps the media clock on real time instead. Each period it compares when
//! the period started (the system clock) with where the frames accounted so far place it.
//! That residual moves slowly with the device's honest drift (a sound card runs within a
//! few hundred ppm of nominal) and jumps when the device lost time. The guard keeps a
//! baseline that follows the residual down at once and up by at most [`MAX_DRIFT`] of the
//! elapsed time. A residual more than half a period and [`SLACK_NS`] above the baseline is a
//! late wake-up until it has stayed there for [`HOLD_NS`] (an audio server that catches up after
//! a stall runs its cycles back to back and is back within a few periods); then the
//! smallest excess of that stretch is declared lost: the stream's timeline moves on by as
//! many frames ([`crate::sender::Sender::skip_frames`]), and the far side conceals a gap
//! instead of stretching its latency.
//!
//! The same residual says when each period started ([`SlipGuard::cycle_start_ns`]): the
//! system time where the frames accounted so far place it, moved by the least residual of
//! the last [`FLOOR_PERIODS`] periods. That is the lower envelope of the wake-ups, so a late
//! wake-up does not move it and a device's drift does; a device that loses less time than
//! a loss declared (a JACK server back from an xrun a fraction of a period off) moves it by
//! a step within those periods, where the baseline would climb to it at [`MAX_DRIFT`] for
//! seconds and read as a clock running that much slow. An audio server's own estimate of
//! its cycle start is no better: JACK's delay-locked loop, freshly started, walks a
//! millisecond away from the wake-ups over its first two seconds (0.5 ‰ of the time), and
//! a player whose device time walks so sees its playout's phase and its device's clock
//! move where nothing moved.
//!
//! Written here rather than taken from a crate because it runs in the device callback
//! (a few integers, no allocation) and is specific to how this project stamps its media.

use crate::time::frames_to_ns;

/// How fast the baseline may rise: the most a device's clock may honestly fall behind the
/// system clock (sound cards run within ±200 ppm; this leaves room). What a slipping device
/// loses below this rate stays in the stream as drift, well inside what the far side's drift
/// corrector follows (±0.1 %).
pub const MAX_DRIFT: f64 = 0.0005;
/// Excess beyond half a period that may be lost time. Half, not a whole one: a server that
/// drops a single cycle and counts on (JACK's dummy driver on a busy machine does, with no
/// xrun in its frame clock) leaves an excess of one period and the wake-up's lateness, and
/// unseen it reads at the far side as a path a period longer.
pub const SLACK_NS: i64 = 500_000;
/// How long the excess must stand before it counts as lost.
pub const HOLD_NS: u64 = 20_000_000;
/// Periods whose least residual places the period's start (21 ms of 64-frame periods).
pub const FLOOR_PERIODS: usize = 16;

/// Finds device time lost between periods (see the module docs).
#[derive(Debug, Clone)]
pub struct SlipGuard {
    rate: u32,
    /// System time of the first period.
    origin_ns: Option<u64>,
    /// Frames accounted for since `origin_ns`: delivered and skipped.
    frames: u64,
    base: i64,
    last_ns: u64,
    /// Since when the residual stands above the baseline, and its smallest value since.
    above: Option<(u64, i64)>,
    /// The start of the last period passed to [`Self::on_period`] on the system clock.
    cycle_start_ns: Option<u64>,
    /// The last [`FLOOR_PERIODS`] residuals (after any loss declared), newest at `next - 1`.
    recent: [i64; FLOOR_PERIODS],
    next: usize,
}

impl SlipGuard {
    pub fn new(rate: u32) -> Self {
        Self {
            rate: rate.max(1),
            origin_ns: None,
            frames: 0,
            base: 0,
            last_ns: 0,
            above: None,
            cycle_start_ns: None,
            recent: [0; FLOOR_PERIODS],
            next: 0,
        }
    }

    /// When the period last passed to [`Self::on_period`] started, on the system clock:
    /// where the frames accounted before it place it, on the floor of the last
    /// [`FLOOR_PERIODS`] wake-ups (so never later than its wake-up, and late wake-ups do not
    /// move it). `None` before the first period.
    pub fn cycle_start_ns(&self) -> Option<u64> {
        self.cycle_start_ns
    }

    /// The device skipped `frames` frames and said so (they are skipped already).
    pub fn account_skipped(&mut self, frames: u64) {
        if self.origin_ns.is_some() {
            self.frames += frames;
        }
    }

    /// The device's own frame clock says it skipped `frames` frames before the period of
    /// `period` frames starting at `start_ns` (JACK's clock moved on by more than a
    /// period): how many of them the system clock confirms, in whole periods, for the
    /// stream's timeline to skip. A server that really missed cycles started this period
    /// that much late against the frames accounted so far; one whose clock jumped while its
    /// cycles ran on time (JACK's dummy driver after an xrun, on a busy machine) did not,
    /// and a skip there would put the stream's timeline ahead of the audio: the far side
    /// would conceal a gap the audio never had and play a period later until it catches
    /// up. Time lost that this leaves unconfirmed still shows in the residual and is
    /// declared after [`HOLD_NS`], as any uncounted loss is. Before the first period
    /// there is nothing to check against: all of it. Realtime-safe.
    pub fn confirm_skipped(&self, start_ns: u64, frames: u64, period: u64) -> u64 {
        let Some(origin) = self.origin_ns else {
            return frames;
        };
        let residual = start_ns as i64 - origin as i64 - frames_to_ns(self.frames, self.rate) as i64;
        let excess = residual - self.base;
        let period_ns = frames_to_ns(period.max(1), self.rate) as i64;
        let periods = ((excess + period_ns / 2).max(0) / period_ns) as u64;
        (periods * period.max(1)).min(frames)
    }

    /// A period of `frames` frames starts at `start_ns` on the system clock; returns the
    /// frames of device time lost before it, for the stream's timeline to skip (0 almost
    /// always). Realtime-safe: no allocation, no lock.
    pub fn on_period(&mut self, start_ns: u64, frames: u64) -> u64 {
        let Some(origin) = self.origin_ns else {
            self.origin_ns = Some(start_ns);
            self.last_ns = start_ns;
            self.frames = frames;
            self.cycle_start_ns = Some(start_ns);
            self.recent = [0; FLOOR_PERIODS];
            return 0;
        };
        let residual = start_ns as i64 - origin as i64 - frames_to_ns(self.frames, self.rate) as i64;
        let elapsed = start_ns.saturating_sub(self.last_ns);
        self.last_ns = start_ns;
        let rise = (elapsed as f64 * MAX_DRIFT) as i64;
        self.base = (self.base + rise).min(residual);
        let threshold = frames_to_ns(frames, self.rate) as i64 / 2 + SLACK_NS;
        let mut lost = 0;
        if residual - self.base > threshold {
            let (since, min) = match self.above {
                Some((since, min)) => (since, min.min(residual)),
                None => (start_ns, residual),
            };
            self.above = Some((since, min));
            if start_ns.saturating_sub(since) >= HOLD_NS {
                lost = (min - self.base) as u64 * u64::from(self.rate) / 1_000_000_000;
                self.above = None;
            }
        } else {
            self.above = None;
        }
        self.frames += lost;
        let residual = residual - frames_to_ns(lost, self.rate) as i64;
        if lost > 0 {
            // The periods before were placed on the old count: start the floor again.
            self.recent = [residual; FLOOR_PERIODS];
        }
        self.recent[self.next] = residual;
        self.next = (self.next + 1) % FLOOR_PERIODS;
        let floor = self.recent.iter().copied().min().unwrap_or(residual);
        let placed = origin as i64 + frames_to_ns(self.frames, self.rate) as i64 + floor;
        self.cycle_start_ns = Some(placed.clamp(0, start_ns as i64) as u64);
        self.frames += frames;
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: u32 = 48_000;
    const P: u64 = 64;

    /// Drive the guard for `seconds` with a device running `ppm` off nominal whose clock
    /// loses `lose_ns` at the periods `lose_at` says, and whose wake-ups are late by what
    /// `late` says; returns frames declared lost, in how many slips, and the largest residual
    /// left over.
    fn drive(
        seconds: f64,
        ppm: f64,
        lose_at: impl Fn(u64) -> u64,
        late: impl Fn(u64) -> u64,
    ) -> (u64, u64, i64) {
        let mut g = SlipGuard::new(RATE);
        let period_ns = frames_to_ns(P, RATE) as f64 / (1.0 + ppm * 1e-6);
        let periods = (seconds * 1e9 / period_ns) as u64;
        let mut lost_time = 0u64;
        let mut skipped = 0u64;
        let mut slips = 0u64;
        let mut worst = 0i64;
        for k in 0..periods {
            lost_time += lose_at(k);
            let start = 1_000_000_000 + (k as f64 * period_ns) as u64 + lost_time;
            let lost = g.on_period(start + late(k), P);
            skipped += lost;
            slips += u64::from(lost > 0);
            // Media time against real time: how far the stream's clock fell behind.
            let media_ns = frames_to_ns(k * P + skipped, RATE) as i64;
            worst = worst.max((start - 1_000_000_000) as i64 - media_ns);
        }
        (skipped, slips, worst)
    }

    /// A frame clock's jump is taken only as far as the system clock saw the time pass: a
    /// cycle really missed (the next one starts a period late), all of it; a jump while the
    /// cycles ran on time, or a wake-up late by less than half a period, none; two missed
    /// of three claimed, two.
    #[test]
    fn a_frame_clock_jump_is_skipped_only_as_far_as_real_time_passed() {
        let period_ns = frames_to_ns(P, RATE);
        let mut g = SlipGuard::new(RATE);
        assert_eq!(
            g.confirm_skipped(1_000, 64, P),
            64,
            "nothing to check against yet"
        );
        let mut start = 1_000_000_000;
        for _ in 0..100 {
            g.on_period(start, P);
            start += period_ns;
        }
        assert_eq!(g.confirm_skipped(start, P, P), 0, "cycles on time");
        assert_eq!(g.confirm_skipped(start + 600_000, P, P), 0, "a late wake-up");
        assert_eq!(g.confirm_skipped(start + period_ns, P, P), P, "a missed cycle");
        assert_eq!(
            g.confirm_skipped(start + period_ns + 300_000, P, P),
            P,
            "a missed cycle, late"
        );
        assert_eq!(
            g.confirm_skipped(start + 2 * period_ns, 3 * P, P),
            2 * P,
            "two of three"
        );
        assert_eq!(
            g.confirm_skipped(start + 5 * period_ns, P, P),
            P,
            "no more than claimed"
        );
        // Confirming changes nothing: the guard goes on as before.
        assert_eq!(g.on_period(start, P), 0);
    }

    #[test]
    fn an_honest_device_loses_nothing_even_with_late_wake_ups() {
        // ±500 ppm, and a wake-up up to 4 ms late every 300 periods: never a slip.
        for ppm in [-500.0, 0.0, 500.0] {
            let (skipped, slips, _) = drive(600.0, ppm, |_| 0, |k| if k % 300 == 7 { 4_000_000 } else { 0 });
            assert_eq!((skipped, slips), (0, 0), "{ppm} ppm");
        }
        // Two late periods in a row, each by three periods: still only late.
        let (skipped, _, _) = drive(60.0, 0.0, |_| 0, |k| if k % 1000 < 2 { 4_000_000 } else { 0 });
        assert_eq!(skipped, 0);
    }

    #[test]
    fn time_the_device_lost_is_skipped_within_a_window() {
        // One stall of 20 ms with no catch-up: about 960 frames skipped, once.
        let (skipped, slips, worst) = drive(10.0, 0.0, |k| if k == 3000 { 20_000_000 } else { 0 }, |_| 0);
        assert_eq!(slips, 1);
        assert!((955..=965).contains(&skipped), "{skipped}");
        assert!(worst <= 20_000_000, "{worst}");
    }

    #[test]
    fn a_device_two_percent_slow_stays_within_two_periods_of_real_time() {
        // Every 10th period loses a fifth of a period: 2 % of the time never delivered.
        let lose = frames_to_ns(P, RATE) / 5;
        let (skipped, slips, worst) = drive(60.0, 0.0, |k| if k % 10 == 9 { lose } else { 0 }, |_| 0);
        let periods = 60 * RATE as u64 / P;
        let lost_frames = periods / 10 * P / 5;
        assert!(slips > 100, "{slips}");
        // All but what the baseline may take for drift (0.05 % of the time, a fortieth here).
        assert!(
            skipped as f64 > lost_frames as f64 * 0.92,
            "{skipped} of {lost_frames}"
        );
        // Each slip is declared after the excess stood for the hold; what the baseline took
        // for drift stays behind too.
        let bound = 2 * frames_to_ns(P, RATE) as i64
            + SLACK_NS
            + (HOLD_NS as f64 * 0.02) as i64
            + (60e9 * MAX_DRIFT) as i64;
        assert!(worst < bound, "{worst} > {bound}");
    }

    #[test]
    fn a_server_that_catches_up_after_a_stall_loses_nothing() {
        // 15 ms without a cycle, then the missed cycles back to back, 0.1 ms apart.
        let mut g = SlipGuard::new(RATE);
        let period = frames_to_ns(P, RATE);
        let mut total = 0;
        let mut t = 0;
        for k in 0..3000u64 {
            let due = k * period;
            if (1000..1012).contains(&k) {
                t = t.max(1000 * period + 15_000_000) + 100_000;
            } else {
                t = t.max(due);
            }
            total += g.on_period(t, P);
        }
        assert_eq!(total, 0);
    }

    #[test]
    fn one_period_lost_is_skipped_once() {
        // A JACK dummy server on a busy machine drops one cycle and counts on (its wake-ups
        // then stand 1.4 ms later for good), with wake-ups late by up to 0.6 ms throughout
        // (the bench's JACK servers: 0.23 ms on average, 0.33 ms spread).
        let period = frames_to_ns(P, RATE);
        for seed in 0..8u64 {
            let late = move |k: u64| (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed) % 600_000;
            let (skipped, slips, _) = drive(10.0, 0.0, |k| if k == 3000 { period } else { 0 }, late);
            assert_eq!(slips, 1, "seed {seed}: {skipped} frames in {slips} slips");
            assert!((64..=64 + 29).contains(&skipped), "seed {seed}: {skipped} frames");
        }
    }

    #[test]
    fn the_cycle_start_is_the_floor_of_the_wake_ups_and_follows_the_device_clock() {
        // Wake-ups late by up to 0.1 ms, one in ten by up to 0.6 ms and a few by 3 ms (the
        // bench's JACK servers wake 8-55 µs after this floor on average), a device up to
        // 300 ppm off, and one period lost unseen at 6 s: after the first second the cycle
        // start stays within 0.1 ms of the period's true start and never after its wake-up.
        // For the guard's hold after the loss it cannot tell the loss from late wake-ups and
        // stays a period early.
        for ppm in [-300.0, 0.0, 300.0] {
            let mut g = SlipGuard::new(RATE);
            let period_ns = frames_to_ns(P, RATE) as f64 / (1.0 + ppm * 1e-6);
            let mut worst = 0i64;
            let mut lost_time = 0u64;
            let mut skipped = 0u64;
            let lose_at = (6.0e9 / period_ns) as u64;
            let hold = (HOLD_NS as f64 / period_ns) as u64 + 2;
            for k in 0..(10.0e9 / period_ns) as u64 {
                if k == lose_at {
                    lost_time += period_ns as u64;
                }
                let start = 1_000_000_000 + (k as f64 * period_ns) as u64 + lost_time;
                let h = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
                let late = match h % 500 {
                    3 => 3_000_000,
                    0..=49 => h % 600_000,
                    _ => h % 100_000,
                };
                skipped += g.on_period(start + late, P);
                let at = g.cycle_start_ns().unwrap();
                assert!(at <= start + late, "{ppm} ppm, period {k}: after the wake-up");
                if k as f64 * period_ns > 1e9 && !(lose_at..lose_at + hold).contains(&k) {
                    worst = worst.max((at as i64 - start as i64).abs());
                }
            }
            eprintln!("{ppm} ppm: worst {worst} ns");
            assert!(worst < 100_000, "{ppm} ppm: {worst} ns from the true start");
            // A period, less what the baseline took for drift or late wake-ups (rounded down).
            assert!(
                (60..=64 + 29).contains(&skipped),
                "{ppm} ppm: {skipped} frames skipped"
            );
        }
    }

    #[test]
    fn a_device_that_loses_less_than_a_declared_loss_moves_the_cycle_start_by_a_step() {
        // 0.5 ms lost unseen at 3 s: too little to declare (nothing is skipped), but the
        // period's start follows within the floor's periods, not at the baseline's 500 ppm.
        let mut g = SlipGuard::new(RATE);
        let period = frames_to_ns(P, RATE);
        let mut worst_after = 0i64;
        let mut skipped = 0;
        for k in 0..4000u64 {
            let start = 1_000_000_000 + k * period + if k >= 2250 { 500_000 } else { 0 };
            let late = (k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) % 50_000;
            skipped += g.on_period(start + late, P);
            let err = (g.cycle_start_ns().unwrap() as i64 - start as i64).abs();
            if k >= 2250 + FLOOR_PERIODS as u64 {
                worst_after = worst_after.max(err);
            }
        }
        assert_eq!(skipped, 0);
        assert!(
            worst_after < 50_000,
            "{worst_after} ns from the true start after the step"
        );
    }

    #[test]
    fn cycles_the_device_reported_are_not_counted_twice() {
        let mut g = SlipGuard::new(RATE);
        let period = frames_to_ns(P, RATE);
        let mut t = 0;
        let mut total = 0;
        for k in 0..2000u64 {
            if k == 1000 {
                // The server dropped ten cycles and said so.
                t += 10 * period;
                g.account_skipped(10 * P);
            }
            total += g.on_period(t, P);
            t += period;
        }
        assert_eq!(total, 0);
    }
}
