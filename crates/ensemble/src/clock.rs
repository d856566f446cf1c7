//! One clock for the ensemble: a sans-IO estimator of the reference's time.
//!
//! A member ([`ClockClient`]) sends probes to the reference ([`ClockServer`]), which
//! answers with its receive and send times. From each exchange (t1 member send, t2
//! reference receive, t3 reference send, t4 member receive):
//! `rtt = (t4 − t1) − (t3 − t2)` and `offset = ((t2 − t1) + (t3 − t4)) / 2`.
//!
//! The client keeps a window of recent exchanges and fits a straight line, offset against
//! local time, through the ones with the smallest round trips (their offsets are least
//! disturbed by queueing): its level is the offset now, its slope the rate (the relative
//! frequency error of the two clocks). The exported ensemble time never jumps: it follows
//! the estimate by running at the estimated rate plus a slew bounded by
//! [`ClockConfig::max_slew_ppm`]. It steps once, at the first lock, and again only if it
//! is ever off by more than [`ClockConfig::step_threshold_ns`].
//!
//! Driving it (str0m/quinn style): call [`ClockClient::poll_transmit`] until it returns
//! `None` and send each probe; feed answers to [`ClockClient::handle_reply`]; call again
//! no later than [`ClockClient::poll_timeout`]. After a change, publish
//! [`ClockClient::segment`] through a [`ClockPublisher`] for the audio thread.
//!
//! Time is a monotonic nanosecond count passed in by the caller: the member's local clock
//! in the client, the reference clock in the server. This module never reads a clock,
//! sleeps or touches a socket; the client allocates only in [`ClockClient::new`].

mod share;
mod wire;

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

pub use share::{clock_share, ClockPublisher, ClockReader, ClockSegment};
pub use wire::{ProbeError, ProbeReply, ProbeRequest, PING_ADDRESS, PING_LEN, PONG_ADDRESS, PONG_LEN};

/// Settings of a [`ClockClient`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClockConfig {
    /// Time between probes. Probes are 32 bytes (answers 48), so ten a second cost little
    /// and give the fit enough points to average jitter down.
    pub probe_interval_ns: u64,
    /// An answer later than this after its probe is treated as lost.
    pub probe_timeout_ns: u64,
    /// Exchanges kept (the window spans `window × probe_interval`).
    pub window: usize,
    /// Fraction (0..1] of the window, those with the smallest round trips, that the fit uses.
    pub keep_fraction: f64,
    /// Exchanges needed before the first lock.
    pub lock_after: usize,
    /// The rate is fitted only once the kept exchanges span at least this long; before,
    /// it is taken as zero.
    pub min_rate_span_ns: u64,
    /// Largest believable rate error of the two clocks (the fit is clamped to it).
    pub max_rate_ppm: f64,
    /// Largest slew: how far the exported time's rate may differ from the estimated rate.
    pub max_slew_ppm: f64,
    /// Time constant of the slew: an error of `e` is corrected at `e / slew_time` (within
    /// the bound).
    pub slew_time_ns: u64,
    /// An error larger than this is stepped rather than slewed.
    pub step_threshold_ns: u64,
}

impl Default for ClockConfig {
    fn default() -> Self {
        Self {
            probe_interval_ns: 100_000_000,
            probe_timeout_ns: 2_000_000_000,
            window: 512,
            keep_fraction: 0.5,
            lock_after: 5,
            min_rate_span_ns: 2_000_000_000,
            max_rate_ppm: 1_000.0,
            max_slew_ppm: 500.0,
            slew_time_ns: 4_000_000_000,
            step_threshold_ns: 50_000_000,
        }
    }
}

/// A snapshot of the client's estimate.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct ClockStats {
    /// Estimated reference time minus local time, at the last update.
    pub offset_ns: i64,
    /// Estimated rate of the reference clock relative to the local clock, in ppm.
    pub rate_ppm: f64,
    /// The exported time's rate minus the estimated rate, in ppm (within ±`max_slew_ppm`).
    pub slew_ppm: f64,
    /// Exported ensemble time minus the estimate, at the last update.
    pub slew_remaining_ns: i64,
    /// Bound on the exported time's error: half the largest round trip the fit used, plus
    /// the slew still to go. It holds for paths whose two directions differ by less than
    /// their round trip; a constant asymmetry of the path is invisible to any round-trip
    /// method and shifts the estimate by half of it.
    pub error_bound_ns: u64,
    /// Smallest round trip in the window.
    pub min_rtt_ns: u64,
    pub locked: bool,
    /// Answers accepted.
    pub exchanges: u64,
    pub probes_sent: u64,
    /// Answers rejected: unknown, duplicate, late or inconsistent.
    pub replies_rejected: u64,
    /// Times the exported time stepped (the first lock counts as one).
    pub steps: u64,
}

#[derive(Debug, Clone, Copy)]
struct Exchange {
    /// Local time of the exchange's middle, (t1 + t4) / 2.
    local_ns: u64,
    offset_ns: i64,
    rtt_ns: u64,
}

/// Probes in flight, by `id % OUTSTANDING`.
const OUTSTANDING: usize = 32;

/// The member's side: estimates the reference clock and exports a continuous,
/// monotonic ensemble time. Allocates only when created.
#[derive(Debug)]
pub struct ClockClient {
    config: ClockConfig,
    next_probe_ns: Option<u64>,
    next_id: u32,
    outstanding: [Option<(u32, u64)>; OUTSTANDING],
    window: VecDeque<Exchange>,
    scratch: Vec<Exchange>,
    /// The estimate: offset at `fit_local_ns` and rate (reference ns per local ns − 1).
    fit_local_ns: u64,
    fit_offset_ns: f64,
    fit_rate: f64,
    fit_bound_ns: u64,
    segment: Option<ClockSegment>,
    stats: ClockStats,
}

impl ClockClient {
    pub fn new(config: ClockConfig) -> Self {
        let window = config.window.max(1);
        Self {
            next_probe_ns: None,
            next_id: 0,
            outstanding: [None; OUTSTANDING],
            window: VecDeque::with_capacity(window),
            scratch: Vec::with_capacity(window),
            fit_local_ns: 0,
            fit_offset_ns: 0.0,
            fit_rate: 0.0,
            fit_bound_ns: 0,
            segment: None,
            stats: ClockStats::default(),
            config: ClockConfig { window, ..config },
        }
    }

    pub fn config(&self) -> &ClockConfig {
        &self.config
    }

    /// The next probe to send, if one is due at local time `now`. Call until `None`.
    /// Also re-aims the slew at the current estimate, so the exported time keeps
    /// converging while answers are lost.
    pub fn poll_transmit(&mut self, now: u64) -> Option<ProbeRequest> {
        let due = *self.next_probe_ns.get_or_insert(now);
        if now < due {
            return None;
        }
        // Whole intervals missed (a caller that slept) are skipped, not sent in a burst.
        let iv = self.config.probe_interval_ns.max(1);
        self.next_probe_ns = Some(due + ((now - due) / iv + 1) * iv);
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        self.outstanding[id as usize % OUTSTANDING] = Some((id, now));
        self.stats.probes_sent += 1;
        if self.segment.is_some() {
            self.steer(now);
        }
        Some(ProbeRequest { id, t1_ns: now })
    }

    /// When [`ClockClient::poll_transmit`] must be called next (local time).
    pub fn poll_timeout(&self) -> Option<u64> {
        Some(self.next_probe_ns.unwrap_or(0))
    }

    /// Take the reference's answer, received at local time `now`. Answers that match no
    /// probe in flight (unknown, duplicated, forged), come too late or are inconsistent
    /// are counted and ignored; returns whether it was used.
    pub fn handle_reply(&mut self, now: u64, reply: &ProbeReply) -> bool {
        let slot = &mut self.outstanding[reply.id as usize % OUTSTANDING];
        let fresh = *slot == Some((reply.id, reply.t1_ns))
            && now >= reply.t1_ns
            && now - reply.t1_ns <= self.config.probe_timeout_ns
            && reply.t3_ns >= reply.t2_ns
            && reply.t3_ns - reply.t2_ns <= now - reply.t1_ns;
        if !fresh {
            self.stats.replies_rejected += 1;
            return false;
        }
        *slot = None;
        let (t1, t2, t3, t4) = (
            reply.t1_ns as i128,
            reply.t2_ns as i128,
            reply.t3_ns as i128,
            now as i128,
        );
        let rtt = ((t4 - t1) - (t3 - t2)) as u64;
        let offset = ((t2 - t1) + (t3 - t4)) / 2;
        let Ok(offset_ns) = i64::try_from(offset) else {
            self.stats.replies_rejected += 1;
            return false;
        };
        if self.window.len() == self.config.window {
            self.window.pop_front();
        }
        self.window.push_back(Exchange {
            local_ns: reply.t1_ns + (now - reply.t1_ns) / 2,
            offset_ns,
            rtt_ns: rtt,
        });
        self.stats.exchanges += 1;
        if self.window.len() >= self.config.lock_after.max(1) {
            self.fit();
            self.steer(now);
        }
        true
    }

    /// Fit offset against local time through the kept (smallest-RTT) exchanges.
    fn fit(&mut self) {
        self.scratch.clear();
        self.scratch.extend(self.window.iter().copied());
        let n = self.scratch.len();
        let keep = ((n as f64 * self.config.keep_fraction).ceil() as usize).clamp(n.min(3), n);
        if keep < n {
            self.scratch.select_nth_unstable_by_key(keep - 1, |e| e.rtt_ns);
            self.scratch.truncate(keep);
        }
        let kept = &self.scratch;
        let Some(last) = self.window.back() else {
            return;
        };
        let x0 = last.local_ns;
        let y0 = last.offset_ns;
        let k = kept.len() as f64;
        let (mut sx, mut sy) = (0.0, 0.0);
        for e in kept {
            sx += e.local_ns as f64 - x0 as f64;
            sy += (e.offset_ns - y0) as f64;
        }
        let (mx, my) = (sx / k, sy / k);
        let (mut sxx, mut sxy) = (0.0, 0.0);
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        let mut max_rtt = 0u64;
        for e in kept {
            let dx = e.local_ns as f64 - x0 as f64 - mx;
            sxx += dx * dx;
            sxy += dx * ((e.offset_ns - y0) as f64 - my);
            lo = lo.min(e.local_ns);
            hi = hi.max(e.local_ns);
            max_rtt = max_rtt.max(e.rtt_ns);
        }
        let max_rate = self.config.max_rate_ppm * 1e-6;
        let rate = if hi - lo >= self.config.min_rate_span_ns && sxx > 0.0 {
            (sxy / sxx).clamp(-max_rate, max_rate)
        } else {
            0.0
        };
        self.fit_local_ns = x0;
        self.fit_offset_ns = y0 as f64 + my - rate * mx;
        self.fit_rate = rate;
        self.fit_bound_ns = max_rtt / 2;
        self.stats.min_rtt_ns = self.window.iter().map(|e| e.rtt_ns).min().unwrap_or(0);
    }

    /// The estimated reference time at local time `local`.
    fn estimate(&self, local: u64) -> f64 {
        let dx = local as f64 - self.fit_local_ns as f64;
        local as f64 + self.fit_offset_ns + self.fit_rate * dx
    }

    /// Start a new segment at `now`: continuous with the old one, aimed at the estimate.
    fn steer(&mut self, now: u64) {
        if self.stats.exchanges == 0 || self.window.len() < self.config.lock_after.max(1) {
            return;
        }
        let target = self.estimate(now);
        let here = self.segment.map(|s| s.map(now));
        let step = match here {
            None => true,
            Some(e) => (target - e as f64).abs() > self.config.step_threshold_ns as f64,
        };
        let (origin, slew) = match (step, here) {
            (false, Some(e)) => {
                let err = target - e as f64;
                let max = self.config.max_slew_ppm * 1e-6;
                let slew = (err / self.config.slew_time_ns.max(1) as f64).clamp(-max, max);
                (e, slew)
            }
            _ => {
                self.stats.steps += 1;
                (target.round().max(0.0) as u64, 0.0)
            }
        };
        self.segment = Some(ClockSegment {
            local_origin_ns: now,
            ensemble_origin_ns: origin,
            rate: self.fit_rate + slew,
        });
        let remaining = origin as f64 - target;
        self.stats.offset_ns = (target - now as f64).round() as i64;
        self.stats.rate_ppm = self.fit_rate * 1e6;
        self.stats.slew_ppm = slew * 1e6;
        self.stats.slew_remaining_ns = remaining.round() as i64;
        self.stats.error_bound_ns = self.fit_bound_ns + remaining.abs().ceil() as u64;
        self.stats.locked = true;
    }

    /// The exported ensemble time at local time `now_local`; `None` until the first lock.
    pub fn ensemble_time(&self, now_local: u64) -> Option<u64> {
        self.segment.map(|s| s.map(now_local))
    }

    /// The mapping in force, to publish for the audio thread; `None` until the first lock.
    /// It changes on [`ClockClient::handle_reply`] and [`ClockClient::poll_transmit`].
    pub fn segment(&self) -> Option<ClockSegment> {
        self.segment
    }

    pub fn stats(&self) -> ClockStats {
        self.stats
    }
}

/// The reference's side: answers probes with its own clock. Stateless apart from counts.
#[derive(Debug, Default)]
pub struct ClockServer {
    answered: u64,
}

impl ClockServer {
    pub fn new() -> Self {
        Self::default()
    }

    /// The answer to `request`, received and answered at reference time `now`.
    pub fn answer(&mut self, now: u64, request: &ProbeRequest) -> ProbeReply {
        self.answer_at(now, now, request)
    }

    /// The answer to `request` received at `received_ns` and sent at `sent_ns` (when the
    /// shell knows both, e.g. a kernel receive timestamp).
    pub fn answer_at(&mut self, received_ns: u64, sent_ns: u64, request: &ProbeRequest) -> ProbeReply {
        self.answered += 1;
        ProbeReply {
            id: request.id,
            t1_ns: request.t1_ns,
            t2_ns: received_ns,
            t3_ns: sent_ns.max(received_ns),
        }
    }

    /// Probes answered so far.
    pub fn answered(&self) -> u64 {
        self.answered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn one_exchange_gives_rtt_and_offset() {
        let mut c = ClockClient::new(ClockConfig {
            lock_after: 1,
            ..ClockConfig::default()
        });
        let mut s = ClockServer::new();
        let req = c.poll_transmit(1_000 * MS).unwrap();
        assert_eq!(c.poll_transmit(1_000 * MS), None);
        // Reference is 5 s ahead; 10 ms up, 2 ms in the server, 20 ms down.
        let rep = s.answer_at(5_000 * MS + 1_010 * MS, 5_000 * MS + 1_012 * MS, &req);
        assert!(c.handle_reply(1_032 * MS, &rep));
        let st = c.stats();
        assert_eq!(st.min_rtt_ns, 30 * MS);
        // ((10 + 5000) + (5000 − 20)) / 2 = 4995 ms: half the asymmetry is invisible.
        assert_eq!(st.offset_ns, 4_995 * MS as i64);
        assert_eq!(st.error_bound_ns, 15 * MS);
        assert_eq!(c.ensemble_time(1_032 * MS), Some(6_027 * MS));
        assert!(st.locked);
        assert_eq!(st.steps, 1);
        // The same answer again, or one for no probe, is ignored.
        assert!(!c.handle_reply(1_033 * MS, &rep));
        assert!(!c.handle_reply(1_033 * MS, &ProbeReply { id: 9, ..rep }));
        assert_eq!(c.stats().replies_rejected, 2);
    }

    #[test]
    fn probes_follow_the_interval_and_missed_ones_are_skipped() {
        let mut c = ClockClient::new(ClockConfig::default());
        assert!(c.poll_transmit(0).is_some());
        assert_eq!(c.poll_timeout(), Some(100 * MS));
        assert_eq!(c.poll_transmit(99 * MS), None);
        assert_eq!(c.poll_transmit(100 * MS).map(|p| p.id), Some(1));
        assert_eq!(c.poll_transmit(1_050 * MS).map(|p| p.id), Some(2));
        assert_eq!(c.poll_transmit(1_050 * MS), None);
        assert_eq!(c.poll_timeout(), Some(1_100 * MS));
    }

    #[test]
    fn nothing_is_exported_before_the_lock() {
        let mut c = ClockClient::new(ClockConfig::default());
        let mut s = ClockServer::new();
        for k in 0..4u64 {
            let req = c.poll_transmit(k * 100 * MS).unwrap();
            let rep = s.answer(k * 100 * MS + 7 * MS, &req);
            assert!(c.handle_reply(k * 100 * MS + 10 * MS, &rep));
            assert_eq!(c.ensemble_time(k * 100 * MS + 10 * MS), None);
            assert!(!c.stats().locked);
        }
    }
}
