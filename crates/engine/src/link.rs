//! The link emulator: a sans-IO model of one direction of a network path.
//!
//! [`LinkModel`] takes packets at a caller-given time and hands them back at the time the
//! emulated path would deliver them: fixed delay, jitter (uniform, normal or Pareto-tailed),
//! Bernoulli or Gilbert–Elliott (bursty) loss, explicit reordering, duplication, and a
//! bandwidth cap with a bounded queue. The same model drives the demo, the scenario tests
//! and `netjam impair`; identical seeds give identical impairments.
//!
//! It never reads a clock or sleeps: time is a monotonic nanosecond count passed in.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use crate::rng::SimRng;

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
    ge_bad: bool,
    stats: LinkStats,
}

impl<P: Clone> LinkModel<P> {
    pub fn new(config: LinkConfig, seed: u64) -> Self {
        Self {
            config,
            rng: SimRng::new(seed),
            in_flight: BinaryHeap::new(),
            order: 0,
            last_arrival_ns: 0,
            link_free_ns: 0,
            ge_bad: false,
            stats: LinkStats::default(),
        }
    }

    pub fn config(&self) -> &LinkConfig {
        &self.config
    }

    /// Change the settings from now on; packets already in flight keep their times.
    pub fn set_config(&mut self, config: LinkConfig) {
        self.config = config;
    }

    pub fn stats(&self) -> LinkStats {
        self.stats
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
            JitterDist::Pareto => {
                const SHAPE: f64 = 2.5;
                let scale = j * (SHAPE - 1.0);
                let u = 1.0 - self.rng.unit();
                scale * (u.powf(-1.0 / SHAPE) - 1.0)
            }
        };
        x as i64
    }

    /// Offer a packet of `size_bytes` to the link at `now_ns`. Returns `false` if it was
    /// lost or dropped (it will never be delivered).
    pub fn send(&mut self, now_ns: u64, payload: P, size_bytes: usize) -> bool {
        self.stats.offered += 1;
        // Bandwidth cap: the packet waits behind what the link already holds.
        let mut depart_ns = now_ns;
        if let Some(rate) = self.config.rate_bps.filter(|r| *r > 0) {
            let free = self.link_free_ns.max(now_ns);
            let backlog_bytes = ((free - now_ns) as u128 * rate as u128 / 8 / 1_000_000_000) as usize;
            if backlog_bytes + size_bytes > self.config.queue_bytes {
                self.stats.queue_dropped += 1;
                return false;
            }
            let tx_ns = (size_bytes as u128 * 8 * 1_000_000_000 / rate as u128) as u64;
            self.link_free_ns = free + tx_ns;
            depart_ns = self.link_free_ns;
        }
        if self.lose() {
            self.stats.lost += 1;
            return false;
        }
        let base = depart_ns + self.config.delay_ns;
        let mut arrival = base.saturating_add_signed(self.jitter_ns()).max(depart_ns);
        if self.rng.chance(self.config.reorder) {
            // Held back behind at least the next packet or two.
            let hold = self.config.jitter_ns.max(1_000_000) * 2;
            arrival = arrival.max(self.last_arrival_ns) + hold;
            self.stats.reordered += 1;
        } else {
            arrival = arrival.max(self.last_arrival_ns);
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

    /// Take one packet whose arrival time is at or before `now_ns`, with that arrival time.
    /// Call until it returns `None`.
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
    fn same_seed_same_impairments() {
        let cfg = LinkConfig::seattle_vermont();
        let (_, a) = run(cfg.clone(), 42, 20_000, MS);
        let (_, b) = run(cfg.clone(), 42, 20_000, MS);
        let (_, c) = run(cfg, 43, 20_000, MS);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
