//! The link emulator: a sans-IO model of one direction of a network path.
//!
//! [`LinkModel`] takes packets at a caller-given time and hands them back at the time the
//! emulated path would deliver them: fixed delay, jitter (uniform, normal or Pareto-tailed),
//! Bernoulli or Gilbert–Elliott (bursty) loss, explicit reordering, duplication, and a
//! bandwidth cap with a bounded queue. The same model drives the demo, the scenario tests
//! and `netjam impair`; identical seeds give identical impairments.
//!
//! A [`LinkSchedule`] of scripted [`LinkEvent`]s (stalls, delay steps, jitter bursts, rate
//! collapses, loss bursts; see [`events`]) makes the path change while it runs. Event times
//! count from the model's event origin: the time given to the first [`LinkModel::send`],
//! unless [`LinkModel::set_event_origin`] named one before.
//!
//! It never reads a clock or sleeps: time is a monotonic nanosecond count passed in. The
//! schedule is built before the run; applying it to a packet never allocates.

pub mod events;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::rng::SimRng;

pub use events::{
    spec_lines, EventSpecError, LinkEvent, LinkEventKind, LinkSchedule, ScheduleError, Transition,
};

/// Shape of the random delay added on top of the base delay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum JitterDist {
    /// Uniform in `[-jitter, +jitter]` around the base delay.
    #[default]
    Uniform,
    /// Normal with standard deviation `jitter`.
    Normal,
    /// Positive heavy tail (Lomax, shape 2.5) with mean `jitter`: mostly near the base
    /// delay, occasionally far later, as on a congested home uplink.
    Pareto,
}

/// How packets are lost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LossModel {
    /// Nothing is lost at random.
    #[default]
    None,
    /// Each packet lost independently with probability `p`.
    Bernoulli { p: f64 },
    /// Two-state Gilbert–Elliott chain: `p_gb` is the chance to go from good to bad per
    /// packet, `p_bg` from bad to good; packets are lost with `loss_good` / `loss_bad`.
    GilbertElliott {
        p_gb: f64,
        p_bg: f64,
        loss_good: f64,
        loss_bad: f64,
    },
}

impl LossModel {
    /// Loss with long-run rate `rate` (0..1) in bursts of mean length `mean_burst` packets.
    /// A mean burst of 1 or less is plain Bernoulli loss.
    pub fn bursty(rate: f64, mean_burst: f64) -> Self {
        let rate = rate.clamp(0.0, 1.0);
        if rate <= 0.0 {
            return LossModel::None;
        }
        if mean_burst <= 1.0 || rate >= 1.0 {
            return LossModel::Bernoulli { p: rate };
        }
        let p_bg = 1.0 / mean_burst;
        let p_gb = (rate * p_bg / (1.0 - rate)).min(1.0);
        LossModel::GilbertElliott {
            p_gb,
            p_bg,
            loss_good: 0.0,
            loss_bad: 1.0,
        }
    }

    /// The long-run fraction of packets this model loses.
    pub fn mean_rate(&self) -> f64 {
        match *self {
            LossModel::None => 0.0,
            LossModel::Bernoulli { p } => p,
            LossModel::GilbertElliott {
                p_gb,
                p_bg,
                loss_good,
                loss_bad,
            } => {
                if p_gb + p_bg <= 0.0 {
                    return loss_good;
                }
                let bad = p_gb / (p_gb + p_bg);
                bad * loss_bad + (1.0 - bad) * loss_good
            }
        }
    }
}

/// Settings of one direction of an emulated path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkConfig {
    /// Base one-way delay in nanoseconds.
    pub delay_ns: u64,
    /// Jitter scale in nanoseconds (see [`JitterDist`]).
    pub jitter_ns: u64,
    pub jitter_dist: JitterDist,
    pub loss: LossModel,
    /// Probability (0..1) that a packet is held back past its successors.
    pub reorder: f64,
    /// Probability (0..1) that a packet is delivered twice.
    pub duplicate: f64,
    /// Bandwidth cap in bits per second; `None` for unlimited.
    pub rate_bps: Option<u64>,
    /// Bytes that may wait for the capped link before new packets are tail-dropped.
    pub queue_bytes: usize,
}

impl Default for LinkConfig {
    fn default() -> Self {
        Self {
            delay_ns: 0,
            jitter_ns: 0,
            jitter_dist: JitterDist::Uniform,
            loss: LossModel::None,
            reorder: 0.0,
            duplicate: 0.0,
            rate_bps: None,
            queue_bytes: 64 * 1024,
        }
    }
}

impl LinkConfig {
    /// A perfect link that delivers every packet at once.
    pub fn ideal() -> Self {
        Self::default()
    }

    /// Seattle to Burlington, Vermont over a good consumer path: 19 ms one way (fibre),
    /// 1.5 ms of normal jitter, 0.5 % loss in bursts of mean length 2.
    pub fn seattle_vermont() -> Self {
        Self {
            delay_ns: 19_000_000,
            jitter_ns: 1_500_000,
            jitter_dist: JitterDist::Normal,
            loss: LossModel::bursty(0.005, 2.0),
            ..Self::default()
        }
    }
}

/// Counters of what the model did to the packets it was given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkStats {
    pub offered: u64,
    pub delivered: u64,
    pub lost: u64,
    pub queue_dropped: u64,
    pub duplicated: u64,
    pub reordered: u64,
    /// Packets whose arrival a scheduled stall put off.
    pub stalled: u64,
}

#[derive(Debug)]
struct InFlight<P> {
    at_ns: u64,
    order: u64,
    payload: P,
}

impl<P> PartialEq for InFlight<P> {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ns, self.order) == (other.at_ns, other.order)
    }
}
impl<P> Eq for InFlight<P> {}
impl<P> PartialOrd for InFlight<P> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<P> Ord for InFlight<P> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at_ns, self.order).cmp(&(other.at_ns, other.order))
    }
}

/// Entries the serialisation queue is sized for: the byte limit in packets of 16 bytes.
fn queue_entries(config: &LinkConfig) -> usize {
    config.queue_bytes / 16 + 16
}

/// One direction of an emulated path carrying payloads of type `P` (bytes, or bytes with
/// an address). Feed it with [`LinkModel::send`], drain it with [`LinkModel::poll`], and
/// sleep until [`LinkModel::next_delivery`].
#[derive(Debug)]
pub struct LinkModel<P> {
    config: LinkConfig,
    rng: SimRng,
    in_flight: BinaryHeap<Reverse<InFlight<P>>>,
    order: u64,
    /// Latest scheduled arrival of an in-order packet: jitter alone never reorders.
    last_arrival_ns: u64,
    /// When the capped link finishes serialising what it already holds.
    link_free_ns: u64,
    /// Packets waiting for (or in) serialisation on a capped link: when each leaves, and its
    /// size; `queued_bytes` is their sum.
    queue: VecDeque<(u64, usize)>,
    queued_bytes: usize,
    schedule: LinkSchedule,
    /// Where event times count from; set by the first send if not given.
    origin_ns: Option<u64>,
    ge_bad: bool,
    stats: LinkStats,
}

impl<P: Clone> LinkModel<P> {
    pub fn new(config: LinkConfig, seed: u64) -> Self {
        let entries = queue_entries(&config);
        Self {
            config,
            rng: SimRng::new(seed),
            in_flight: BinaryHeap::new(),
            order: 0,
            last_arrival_ns: 0,
            link_free_ns: 0,
            queue: VecDeque::with_capacity(entries),
            queued_bytes: 0,
            schedule: LinkSchedule::default(),
            origin_ns: None,
            ge_bad: false,
            stats: LinkStats::default(),
        }
    }

    pub fn config(&self) -> &LinkConfig {
        &self.config
    }

    /// Change the settings from now on; packets already in flight keep their times.
    pub fn set_config(&mut self, config: LinkConfig) {
        let want = queue_entries(&config);
        self.queue.reserve(want.saturating_sub(self.queue.len()));
        self.config = config;
    }

    pub fn stats(&self) -> LinkStats {
        self.stats
    }

    /// Apply `schedule` (built before the run) to the packets sent from now on.
    pub fn set_schedule(&mut self, schedule: LinkSchedule) {
        self.schedule = schedule;
    }

    /// The model with `schedule` applied.
    pub fn with_schedule(mut self, schedule: LinkSchedule) -> Self {
        self.schedule = schedule;
        self
    }

    pub fn schedule(&self) -> &LinkSchedule {
        &self.schedule
    }

    /// Count event times from `origin_ns` instead of from the first packet (e.g. to give
    /// both directions of an emulated link one time line). Packets sent before it see no events.
    pub fn set_event_origin(&mut self, origin_ns: u64) {
        self.origin_ns = Some(origin_ns);
    }

    /// Where event times count from, once known.
    pub fn event_origin(&self) -> Option<u64> {
        self.origin_ns
    }

    /// Packets in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn lose(&mut self) -> bool {
        match self.config.loss {
            LossModel::None => false,
            LossModel::Bernoulli { p } => self.rng.chance(p),
            LossModel::GilbertElliott {
                p_gb,
                p_bg,
                loss_good,
                loss_bad,
            } => {
                // Transition first, then draw the loss in the new state.
                if self.ge_bad {
                    if self.rng.chance(p_bg) {
                        self.ge_bad = false;
                    }
                } else if self.rng.chance(p_gb) {
                    self.ge_bad = true;
                }
                self.rng.chance(if self.ge_bad { loss_bad } else { loss_good })
            }
        }
    }

    fn jitter_ns(&mut self) -> i64 {
        let j = self.config.jitter_ns as f64;
        if j <= 0.0 {
            return 0;
        }
        let x = match self.config.jitter_dist {
            JitterDist::Uniform => self.rng.uniform(-j, j),
            JitterDist::Normal => self.rng.normal() * j,
            JitterDist::Pareto => self.pareto(j),
        };
        x as i64
    }

    /// Lomax (Pareto II, shape 2.5) with mean `mean`: positive, heavy-tailed.
    fn pareto(&mut self, mean: f64) -> f64 {
        const SHAPE: f64 = 2.5;
        let scale = mean * (SHAPE - 1.0);
        let u = 1.0 - self.rng.unit();
        scale * (u.powf(-1.0 / SHAPE) - 1.0)
    }

    /// When `size_bytes` that start serialising at `start_ns` have left, under the caps in
    /// force as time goes on (the configured one and scripted rate events): a backlog built
    /// up during a collapse drains at the restored rate once it ends, as a real bottleneck's
    /// queue does, instead of keeping the departure times it got at the low rate.
    fn serialised_at(&self, origin: u64, start_ns: u64, size_bytes: usize) -> u64 {
        // Work left in bit-nanoseconds per second: a rate of r bit/s does r of it per ns.
        let mut left = size_bytes as u128 * 8 * 1_000_000_000;
        let mut t = start_ns;
        loop {
            let rel = t.saturating_sub(origin);
            let event_cap = if self.schedule.is_empty() {
                None
            } else {
                self.schedule.effects_at(rel).rate_bps
            };
            let cap = match (self.config.rate_bps.filter(|r| *r > 0), event_cap) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            // Uncapped: what waits leaves at once.
            let Some(rate) = cap.filter(|r| *r > 0) else {
                return t;
            };
            let done = t.saturating_add(left.div_ceil(rate as u128).min(u64::MAX as u128) as u64);
            match self.schedule.next_change_after(rel).map(|c| origin + c) {
                Some(change) if change < done => {
                    left -= rate as u128 * (change - t) as u128;
                    t = change;
                }
                _ => return done,
            }
        }
    }

    /// Offer a packet of `size_bytes` to the link at `now_ns`. Returns `false` if it was
    /// lost or dropped (it will never be delivered).
    pub fn send(&mut self, now_ns: u64, payload: P, size_bytes: usize) -> bool {
        self.stats.offered += 1;
        let origin = *self.origin_ns.get_or_insert(now_ns);
        let fx = match now_ns.checked_sub(origin) {
            Some(t) if !self.schedule.is_empty() => self.schedule.effects_at(t),
            _ => events::Effects::default(),
        };
        // Bandwidth cap: the packet waits behind what the link already holds.
        let mut depart_ns = now_ns;
        let cap = match (self.config.rate_bps.filter(|r| *r > 0), fx.rate_bps) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        while let Some(&(left_ns, size)) = self.queue.front() {
            if left_ns > now_ns {
                break;
            }
            self.queue.pop_front();
            self.queued_bytes -= size;
        }
        if cap.is_some() || self.link_free_ns > now_ns {
            // A queue of tiny packets is bounded by its entries too, so it never reallocates.
            if self.queued_bytes + size_bytes > self.config.queue_bytes
                || self.queue.len() == self.queue.capacity()
            {
                self.stats.queue_dropped += 1;
                return false;
            }
            let free = self.link_free_ns.max(now_ns);
            depart_ns = self.serialised_at(origin, free, size_bytes);
            self.link_free_ns = depart_ns;
            self.queue.push_back((depart_ns, size_bytes));
            self.queued_bytes += size_bytes;
        }
        // The base chain is drawn first so a loss burst never shifts its state.
        if self.lose() || self.rng.chance(fx.loss_p) {
            self.stats.lost += 1;
            return false;
        }
        let delay_ns = self.config.delay_ns.saturating_add_signed(fx.delay_step_ns);
        let base = depart_ns + delay_ns;
        let mut jitter = self.jitter_ns();
        if fx.jitter_mean_ns > 0 {
            jitter = jitter.saturating_add(self.pareto(fx.jitter_mean_ns as f64) as i64);
        }
        let mut arrival = base.saturating_add_signed(jitter).max(depart_ns);
        let own_arrival = arrival;
        let reordered = self.rng.chance(self.config.reorder);
        if reordered {
            // Held back behind at least the next packet or two.
            let hold = self.config.jitter_ns.max(1_000_000) * 2;
            arrival = arrival.max(self.last_arrival_ns) + hold;
            self.stats.reordered += 1;
        } else {
            // A fallen delay never lets a packet overtake: the path stays FIFO.
            arrival = arrival.max(self.last_arrival_ns);
        }
        if let Some(t) = arrival.checked_sub(origin).filter(|_| !self.schedule.is_empty()) {
            let held = self.schedule.after_stalls(t);
            arrival = origin + held;
            // Counted if a stall moved it, or moved the packet it now waits behind.
            let moved_own = own_arrival
                .checked_sub(origin)
                .is_some_and(|own| self.schedule.after_stalls(own) != own);
            if held != t || moved_own {
                self.stats.stalled += 1;
            }
        }
        if !reordered {
            self.last_arrival_ns = arrival;
        }
        if self.rng.chance(self.config.duplicate) {
            self.stats.duplicated += 1;
            self.push(arrival, payload.clone());
        }
        self.push(arrival, payload);
        true
    }

    fn push(&mut self, at_ns: u64, payload: P) {
        self.order += 1;
        self.in_flight.push(Reverse(InFlight {
            at_ns,
            order: self.order,
            payload,
        }));
    }

    /// The time the next packet arrives, if any is in flight.
    pub fn next_delivery(&self) -> Option<u64> {
        self.in_flight.peek().map(|Reverse(p)| p.at_ns)
    }

    /// The latest time at which [`LinkModel::poll`] must be called next: the arrival of
    /// the next packet in flight (scripted events act on packets as they are sent, so they
    /// add no timer of their own). `None` while nothing is in flight.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.next_delivery()
    }

    /// Take one packet whose arrival time is at or before `now_ns`, with that arrival time.
    /// Call until it returns `None`, no later than [`LinkModel::poll_timeout`].
    pub fn poll(&mut self, now_ns: u64) -> Option<(u64, P)> {
        if self.next_delivery()? > now_ns {
            return None;
        }
        let Reverse(p) = self.in_flight.pop()?;
        self.stats.delivered += 1;
        Some((p.at_ns, p.payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn run(config: LinkConfig, seed: u64, n: u64, interval: u64) -> (LinkModel<u64>, Vec<(u64, u64)>) {
        let mut link = LinkModel::new(config, seed);
        let mut out = Vec::new();
        for i in 0..n {
            let now = i * interval;
            link.send(now, i, 100);
            while let Some(p) = link.poll(now) {
                out.push(p);
            }
        }
        while let Some(p) = link.poll(u64::MAX) {
            out.push(p);
        }
        (link, out)
    }

    #[test]
    fn fixed_delay_delivers_everything_in_order_exactly_late() {
        let cfg = LinkConfig {
            delay_ns: 20 * MS,
            ..LinkConfig::ideal()
        };
        let (_, out) = run(cfg, 1, 100, MS);
        assert_eq!(out.len(), 100);
        for (i, (at, id)) in out.iter().enumerate() {
            assert_eq!(*id, i as u64);
            assert_eq!(*at, i as u64 * MS + 20 * MS);
        }
    }

    #[test]
    fn uniform_jitter_stays_in_bounds_and_never_reorders() {
        let cfg = LinkConfig {
            delay_ns: 20 * MS,
            jitter_ns: 2 * MS,
            ..LinkConfig::ideal()
        };
        let (_, out) = run(cfg, 3, 5000, MS);
        assert_eq!(out.len(), 5000);
        let mut last = 0;
        for (at, id) in &out {
            assert!(*id >= last, "reordered without reorder setting");
            last = *id;
            let d = at - id * MS;
            assert!((18 * MS..=22 * MS + 2 * MS).contains(&d), "delay {d}");
        }
    }

    #[test]
    fn bernoulli_loss_rate_is_close_to_setting() {
        let cfg = LinkConfig {
            loss: LossModel::Bernoulli { p: 0.01 },
            ..LinkConfig::ideal()
        };
        let (link, out) = run(cfg, 11, 100_000, 1000);
        let lost = 100_000 - out.len() as u64;
        assert_eq!(link.stats().lost, lost);
        // 1 % of 100k: sd ~31; allow 5 sd.
        assert!((845..=1155).contains(&lost), "lost {lost}");
    }

    #[test]
    fn gilbert_elliott_gives_the_rate_in_bursts() {
        let model = LossModel::bursty(0.02, 4.0);
        assert!((model.mean_rate() - 0.02).abs() < 1e-12);
        let cfg = LinkConfig {
            loss: model,
            ..LinkConfig::ideal()
        };
        let (_, out) = run(cfg, 5, 200_000, 1000);
        let mut got = vec![false; 200_000];
        for (_, id) in &out {
            got[*id as usize] = true;
        }
        let lost = got.iter().filter(|g| !**g).count();
        let bursts = got.windows(2).filter(|w| w[0] && !w[1]).count().max(1);
        let rate = lost as f64 / 200_000.0;
        let mean_burst = lost as f64 / bursts as f64;
        assert!((0.017..0.023).contains(&rate), "rate {rate}");
        assert!((3.4..4.6).contains(&mean_burst), "burst {mean_burst}");
    }

    #[test]
    fn reorder_and_duplicate_are_counted_and_happen() {
        let cfg = LinkConfig {
            delay_ns: 5 * MS,
            reorder: 0.05,
            duplicate: 0.02,
            ..LinkConfig::ideal()
        };
        let (link, out) = run(cfg, 9, 10_000, MS);
        let s = link.stats();
        assert_eq!(out.len() as u64, 10_000 + s.duplicated);
        assert!(s.reordered > 350 && s.reordered < 650, "{s:?}");
        let inversions = out.windows(2).filter(|w| w[1].1 < w[0].1).count();
        assert!(inversions > 300, "inversions {inversions}");
    }

    #[test]
    fn rate_cap_serialises_and_tail_drops_past_the_queue() {
        // 1 Mbit/s, 1000-byte packets take 8 ms each; offered every 1 ms; queue 10 kB.
        let cfg = LinkConfig {
            rate_bps: Some(1_000_000),
            queue_bytes: 10_000,
            ..LinkConfig::ideal()
        };
        let mut link = LinkModel::new(cfg, 1);
        for i in 0..1000u64 {
            link.send(i * MS, i, 1000);
        }
        while link.poll(u64::MAX).is_some() {}
        let s = link.stats();
        assert!(s.queue_dropped > 800, "{s:?}");
        // Throughput is the cap: ~125 packets/s over ~1 s plus drain.
        assert!((120..=140).contains(&s.delivered), "{s:?}");
    }

    #[test]
    fn poll_timeout_is_when_the_next_packet_arrives() {
        let config = LinkConfig {
            delay_ns: 20 * MS,
            jitter_ns: 5 * MS,
            loss: LossModel::bursty(0.05, 2.0),
            reorder: 0.1,
            duplicate: 0.05,
            ..LinkConfig::default()
        };
        let mut link = LinkModel::new(config, 9).with_schedule(sched("1s:stall=100ms\n2s:delay=+10ms"));
        assert_eq!(link.poll_timeout(), None, "nothing in flight");
        // Virtual time: send every 2 ms for 3 s; whenever the clock passes the timeout,
        // poll exactly at it (never earlier, never later).
        let mut delivered = 0;
        for i in 0..1500u64 {
            let now = i * 2 * MS;
            while let Some(due) = link.poll_timeout().filter(|&t| t <= now) {
                if due > 0 {
                    assert!(link.poll(due - 1).is_none(), "nothing arrives before {due}");
                }
                let (at, _) = link.poll(due).expect("a packet arrives at the timeout");
                assert_eq!(at, due);
                delivered += 1;
            }
            link.send(now, i, 200);
        }
        while let Some(due) = link.poll_timeout() {
            assert!(link.poll(due - 1).is_none(), "nothing arrives before {due}");
            assert_eq!(link.poll(due).map(|p| p.0), Some(due));
            delivered += 1;
        }
        assert_eq!(delivered, link.stats().delivered);
        assert!(delivered > 1300, "{:?}", link.stats());
    }

    fn sched(text: &str) -> LinkSchedule {
        LinkSchedule::parse(text).expect("schedule parses")
    }

    /// `n` packets of `size` bytes every `interval` from time 0, each polled as soon as due:
    /// (delivered at, id) in delivery order, and the model.
    fn run_events(
        config: LinkConfig,
        schedule: &str,
        seed: u64,
        n: u64,
        interval: u64,
        size: usize,
    ) -> (LinkModel<u64>, Vec<(u64, u64)>) {
        let mut link = LinkModel::new(config, seed).with_schedule(sched(schedule));
        let mut out = Vec::new();
        for i in 0..n {
            let now = i * interval;
            while let Some(p) = link.poll(now) {
                out.push(p);
            }
            link.send(now, i, size);
        }
        while let Some(p) = link.poll(u64::MAX) {
            out.push(p);
        }
        (link, out)
    }

    fn assert_fifo(out: &[(u64, u64)]) {
        for w in out.windows(2) {
            assert!(w[1].1 > w[0].1, "packet {} delivered after {}", w[1].1, w[0].1);
            assert!(w[1].0 >= w[0].0, "delivery times go back at packet {}", w[1].1);
        }
    }

    #[test]
    fn a_stall_delivers_nothing_inside_and_releases_the_held_packets_at_its_end_in_order() {
        let cfg = LinkConfig {
            delay_ns: 20 * MS,
            ..LinkConfig::ideal()
        };
        let (link, out) = run_events(cfg, "300ms:stall=200ms", 1, 1000, MS, 100);
        assert_eq!(out.len(), 1000, "a stall loses nothing");
        assert_fifo(&out);
        for (at, id) in &out {
            assert!(
                !(300 * MS..500 * MS).contains(at),
                "packet {id} delivered at {at} inside the stall"
            );
            let undisturbed = id * MS + 20 * MS;
            if (300 * MS..500 * MS).contains(&undisturbed) {
                assert_eq!(*at, 500 * MS, "held packet {id} not released at the stall's end");
            } else {
                assert_eq!(*at, undisturbed, "packet {id} outside the stall was moved");
            }
        }
        // Sent 280..=479 ms: 200 packets, including those in flight when the stall began.
        assert_eq!(link.stats().stalled, 200);
        // Polling inside the stall gives nothing even though packets are due by send time.
        let mut link = LinkModel::new(
            LinkConfig {
                delay_ns: 20 * MS,
                ..LinkConfig::ideal()
            },
            1,
        )
        .with_schedule(sched("300ms:stall=200ms"));
        for i in 0..450 {
            link.send(i * MS, i, 100);
        }
        assert_eq!(link.poll(499 * MS).map(|p| p.1), Some(0));
        while link.poll(499 * MS).is_some() {}
        assert_eq!(link.next_delivery(), Some(500 * MS));
    }

    #[test]
    fn a_delay_step_up_shifts_later_deliveries_by_the_step() {
        let cfg = LinkConfig {
            delay_ns: 20 * MS,
            ..LinkConfig::ideal()
        };
        let (_, out) = run_events(cfg, "100ms:delay=+15ms", 1, 300, MS, 100);
        assert_eq!(out.len(), 300);
        assert_fifo(&out);
        for (at, id) in &out {
            let step = if *id >= 100 { 15 * MS } else { 0 };
            assert_eq!(*at, id * MS + 20 * MS + step, "packet {id}");
        }
    }

    #[test]
    fn a_delay_step_down_keeps_the_path_fifo() {
        let cfg = LinkConfig {
            delay_ns: 50 * MS,
            ..LinkConfig::ideal()
        };
        let (_, out) = run_events(cfg, "100ms:delay=-30ms", 1, 300, MS, 100);
        assert_eq!(out.len(), 300);
        assert_fifo(&out);
        for (at, id) in &out {
            let sent = id * MS;
            // The last packet on the old route arrives at 99 + 50 ms; the new route's
            // packets queue behind it until their own 20 ms delay is later.
            let want = if *id < 100 {
                sent + 50 * MS
            } else {
                (sent + 20 * MS).max(149 * MS)
            };
            assert_eq!(*at, want, "packet {id}");
        }
        // Steps below zero stop at zero delay.
        let (_, out) = run_events(
            LinkConfig::ideal(),
            "10ms:delay=+5ms\n20ms:delay=-1s",
            1,
            40,
            MS,
            100,
        );
        assert!(out.iter().filter(|p| p.1 >= 25).all(|(at, id)| *at == id * MS));
    }

    #[test]
    fn a_jitter_burst_adds_heavy_tailed_delay_of_the_given_mean_only_inside_it() {
        // One packet a second, so the FIFO clamp never links two packets' delays.
        let cfg = LinkConfig {
            delay_ns: 20 * MS,
            ..LinkConfig::ideal()
        };
        let s = 1000 * MS;
        let (_, out) = run_events(cfg.clone(), "100s:jitter=30ms/4000s", 7, 4200, s, 100);
        assert_eq!(out.len(), 4200);
        assert_fifo(&out);
        let extra: Vec<f64> = out
            .iter()
            .map(|(at, id)| (at - id * s - 20 * MS) as f64 / MS as f64)
            .collect();
        assert!(
            extra[..100].iter().chain(&extra[4100..]).all(|e| *e == 0.0),
            "jitter outside the burst"
        );
        let burst = &extra[100..4100];
        let mean = burst.iter().sum::<f64>() / burst.len() as f64;
        // Lomax with shape 2.5 and mean 30 ms has sd 67 ms: the mean of 4000 is 30 ± 1.1 ms.
        assert!((25.0..35.0).contains(&mean), "mean extra {mean:.1} ms");
        let median = {
            let mut b = burst.to_vec();
            b.sort_by(f64::total_cmp);
            b[b.len() / 2]
        };
        let max = burst.iter().copied().fold(0.0, f64::max);
        assert!(
            median < mean,
            "heavy tail: median {median:.1} ms, mean {mean:.1} ms"
        );
        assert!(max > 8.0 * mean, "heavy tail: max {max:.1} ms, mean {mean:.1} ms");
        // Deterministic for a seed.
        let (_, again) = run_events(cfg.clone(), "100s:jitter=30ms/4000s", 7, 4200, s, 100);
        let (_, other) = run_events(cfg, "100s:jitter=30ms/4000s", 8, 4200, s, 100);
        assert_eq!(out, again);
        assert_ne!(out, other);
    }

    #[test]
    fn a_rate_collapse_serialises_at_the_low_rate_drops_past_the_queue_and_drains_when_it_ends() {
        // 1000-byte packets every 10 ms (800 kbit/s) on an uncapped link; 256 kbit/s for 1 s
        // from 1 s, when a packet takes 31.25 ms; 10 kB queue.
        let cfg = LinkConfig {
            queue_bytes: 10_000,
            ..LinkConfig::ideal()
        };
        let (link, out) = run_events(cfg, "1s:rate=256kbit/1s", 1, 300, 10 * MS, 1000);
        assert_fifo(&out);
        let s = link.stats();
        let tx_ns = 31_250_000;
        let sent_in = |lo: u64, hi: u64| {
            out.iter()
                .filter(move |(_, id)| (lo..hi).contains(&(id * 10 * MS)))
        };
        assert!(
            sent_in(0, 1000 * MS).all(|(at, id)| *at == id * 10 * MS),
            "delayed before the collapse"
        );
        let during: Vec<u64> = sent_in(1000 * MS, 2000 * MS).map(|p| p.0).collect();
        // 1 s at 256 kbit/s carries 32 packets; the queue holds about 10 more at the end.
        assert!(
            (32..=44).contains(&during.len()),
            "{} delivered from the collapse",
            during.len()
        );
        assert!(
            during
                .windows(2)
                .filter(|w| w[1] < 2000 * MS)
                .all(|w| w[1] - w[0] >= tx_ns),
            "faster than the cap while it held"
        );
        assert_eq!(s.queue_dropped, 100 - during.len() as u64, "{s:?}");
        // The backlog (≤ 10 kB) leaves at once when the uncapped link comes back, as a
        // real bottleneck's queue does, and nothing sent after the end is delayed.
        let backlog: Vec<u64> = sent_in(1000 * MS, 2000 * MS)
            .map(|p| p.0)
            .filter(|&at| at >= 2000 * MS)
            .collect();
        assert!(!backlog.is_empty(), "a backlog at the end");
        assert!(
            backlog.iter().all(|&at| at == 2000 * MS),
            "backlog kept the low rate: {backlog:?}"
        );
        assert!(
            sent_in(2000 * MS, 3000 * MS).all(|(at, id)| *at == id * 10 * MS),
            "still delayed after"
        );
    }

    #[test]
    fn a_loss_burst_loses_at_its_rate_only_inside_it() {
        let (link, out) = run_events(LinkConfig::ideal(), "1s:loss=20%/2s", 3, 4000, MS, 100);
        let mut got = vec![false; 4000];
        for (_, id) in &out {
            got[*id as usize] = true;
        }
        let lost_outside = got[..1000].iter().chain(&got[3000..]).filter(|g| !**g).count();
        let lost_inside = got[1000..3000].iter().filter(|g| !**g).count();
        assert_eq!(lost_outside, 0);
        // 20 % of 2000: sd 18; allow 5 sd.
        assert!((310..=490).contains(&lost_inside), "lost {lost_inside}");
        assert_eq!(link.stats().lost, lost_inside as u64);
    }

    #[test]
    fn event_times_count_from_the_first_packet_or_the_given_origin() {
        let cfg = LinkConfig::ideal();
        let mut first = LinkModel::new(cfg.clone(), 1).with_schedule(sched("1s:stall=200ms"));
        let mut origin = LinkModel::new(cfg, 1).with_schedule(sched("1s:stall=200ms"));
        origin.set_event_origin(0);
        for link in [&mut first, &mut origin] {
            link.send(5000 * MS, 0, 100);
            link.send(6100 * MS, 1, 100);
        }
        assert_eq!(first.event_origin(), Some(5000 * MS));
        let times =
            |l: &mut LinkModel<u64>| std::iter::from_fn(|| l.poll(u64::MAX).map(|p| p.0)).collect::<Vec<_>>();
        assert_eq!(times(&mut first), [5000 * MS, 6200 * MS]);
        assert_eq!(times(&mut origin), [5000 * MS, 6100 * MS]);
    }

    #[test]
    fn a_schedule_whose_events_have_not_come_changes_nothing() {
        let cfg = LinkConfig {
            reorder: 0.05,
            duplicate: 0.02,
            jitter_dist: JitterDist::Pareto,
            jitter_ns: 2 * MS,
            rate_bps: Some(2_000_000),
            ..LinkConfig::seattle_vermont()
        };
        let (_, plain) = run(cfg.clone(), 42, 20_000, MS);
        let (_, later) = run_events(
            cfg,
            "1000s:stall=1s\n1000s:jitter=9ms/1s\n1000s:loss=50%/1s\n1000s:rate=1kbit/1s\n1000s:delay=+1s",
            42,
            20_000,
            MS,
            100,
        );
        assert_eq!(plain, later);
    }

    #[test]
    fn same_seed_same_impairments() {
        let cfg = LinkConfig::seattle_vermont();
        let (_, a) = run(cfg.clone(), 42, 20_000, MS);
        let (_, b) = run(cfg.clone(), 42, 20_000, MS);
        let (_, c) = run(cfg, 43, 20_000, MS);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
