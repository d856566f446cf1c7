//! The adaptive playout-delay estimator behind the jitter buffer.
//!
//! For every packet it sees `transit = local_media_time(arrival) - rtp_timestamp`. The
//! smallest recent transit is the path's base delay; each packet's excess over it is its
//! packet delay variation (PDV, RFC 5481). PDV goes into a histogram with a forgetting
//! factor (recent seconds weigh most), and the target buffer is a high quantile of it plus
//! a margin — in milliseconds, not whole packets. The target grows at once when the
//! quantile rises and shrinks slowly when it falls, as WebRTC's NetEQ and JackTrip's
//! auto queue do, so a burst of jitter is covered immediately and a quiet spell does not
//! gamble the buffer away.
//!
//! Realtime: fixed-size arrays only; no allocation after construction.

/// Histogram resolution: 0.1 ms per bin.
const BIN_NS: u64 = 100_000;
/// Bins: up to 250 ms of PDV (larger values land in the last bin).
const BINS: usize = 2500;
/// Bins per group; group sums let a quantile be found by scanning ~100 cells, not 2500.
const GROUP: usize = 50;
const GROUPS: usize = BINS / GROUP;

/// How the buffer target is chosen.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "mode", rename_all = "lowercase")]
pub enum BufferMode {
    /// A quantile of measured PDV plus a margin, adapting continuously.
    Auto {
        /// The quantile of PDV to cover (e.g. 0.995).
        quantile: f64,
        /// Added on top, in nanoseconds.
        margin_ns: u64,
        /// Never below this (ns).
        min_ns: u64,
        /// Never above this (ns).
        max_ns: u64,
    },
    /// A fixed amount of buffering on top of the fastest packet, in nanoseconds.
    Fixed { ns: u64 },
}

impl Default for BufferMode {
    fn default() -> Self {
        BufferMode::Auto {
            quantile: 0.995,
            margin_ns: 250_000,
            min_ns: 0,
            max_ns: 200_000_000,
        }
    }
}

/// A histogram of PDV whose old weight decays by a constant factor per packet.
#[derive(Debug)]
struct DecayingHistogram {
    /// Stored weights; a bin's real weight is `bins[i] * scale` (decay without touching every bin).
    bins: Box<[f64; BINS]>,
    groups: [f64; GROUPS],
    scale: f64,
    total: f64,
    keep: f64,
}

impl DecayingHistogram {
    fn new() -> Self {
        Self {
            bins: Box::new([0.0; BINS]),
            groups: [0.0; GROUPS],
            scale: 1.0,
            total: 0.0,
            keep: 1.0,
        }
    }

    /// Remember about `packets` packets.
    fn set_memory(&mut self, packets: f64) {
        self.keep = 1.0 - 1.0 / packets.max(8.0);
    }

    fn add(&mut self, pdv_ns: u64) {
        let bin = ((pdv_ns / BIN_NS) as usize).min(BINS - 1);
        let inc = 1.0 - self.keep;
        self.scale *= self.keep;
        self.total = self.total * self.keep + inc;
        if self.scale < 1e-100 {
            for w in self.bins.iter_mut().chain(self.groups.iter_mut()) {
                *w *= self.scale;
            }
            self.scale = 1.0;
        }
        self.bins[bin] += inc / self.scale;
        self.groups[bin / GROUP] += inc / self.scale;
    }

    /// Upper edge of the bin holding the `q` quantile, in ns (0 when empty).
    fn quantile_ns(&self, q: f64) -> u64 {
        if self.total <= 0.0 {
            return 0;
        }
        let want = q.clamp(0.0, 1.0) * self.total / self.scale;
        let mut acc = 0.0;
        for (g, gw) in self.groups.iter().enumerate() {
            if acc + gw < want {
                acc += gw;
                continue;
            }
            for (i, w) in self.bins[g * GROUP..(g + 1) * GROUP].iter().enumerate() {
                acc += w;
                if acc >= want {
                    return (g * GROUP + i) as u64 * BIN_NS + BIN_NS;
                }
            }
            return ((g + 1) * GROUP) as u64 * BIN_NS;
        }
        BINS as u64 * BIN_NS
    }
}

/// Tracks base transit, PDV distribution and the current target (see module docs).
#[derive(Debug)]
pub struct DelayEstimator {
    mode: BufferMode,
    /// About four seconds of packets: the steady picture.
    long: DecayingHistogram,
    /// About a third of a second: notices a new burst of lateness within a few packets.
    short: DecayingHistogram,
    /// Windowed minimum of transit (ns on a shared arbitrary origin): current and previous block.
    min_cur: i64,
    min_prev: i64,
    block_start_ns: u64,
    block_ns: u64,
    target_ns: u64,
    last_update_ns: u64,
    /// How fast the target may fall: ns of target per second of wall time.
    shrink_ns_per_s: u64,
    last_pdv_ns: u64,
    max_pdv_ns: u64,
}

impl DelayEstimator {
    /// `packets_per_second` sets the memory of the histogram (about four seconds of packets).
    pub fn new(mode: BufferMode, packets_per_second: f64) -> Self {
        let mut s = Self {
            mode,
            long: DecayingHistogram::new(),
            short: DecayingHistogram::new(),
            min_cur: i64::MAX,
            min_prev: i64::MAX,
            block_start_ns: 0,
            block_ns: 2_000_000_000,
            target_ns: 0,
            last_update_ns: 0,
            shrink_ns_per_s: 1_000_000,
            last_pdv_ns: 0,
            max_pdv_ns: 0,
        };
        s.set_packet_rate(packets_per_second);
        s.target_ns = s.floor_ns();
        s
    }

    /// Adjust the histogram's memory to a packet rate.
    pub fn set_packet_rate(&mut self, packets_per_second: f64) {
        self.long.set_memory(packets_per_second * 4.0);
        self.short.set_memory(packets_per_second / 3.0);
    }

    pub fn mode(&self) -> BufferMode {
        self.mode
    }

    pub fn set_mode(&mut self, mode: BufferMode) {
        self.mode = mode;
        self.target_ns = self.target_ns.max(self.floor_ns());
        if let BufferMode::Fixed { ns } = mode {
            self.target_ns = ns;
        }
    }

    fn floor_ns(&self) -> u64 {
        match self.mode {
            BufferMode::Auto {
                min_ns, margin_ns, ..
            } => min_ns.max(margin_ns),
            BufferMode::Fixed { ns } => ns,
        }
    }

    /// Forget the base delay (a new stream or path), keeping the jitter history.
    pub fn rebase(&mut self) {
        self.min_cur = i64::MAX;
        self.min_prev = i64::MAX;
    }

    /// The smallest recent transit (ns), if any packet was seen.
    pub fn base_transit_ns(&self) -> Option<i64> {
        let m = self.min_cur.min(self.min_prev);
        (m != i64::MAX).then_some(m)
    }

    /// Target buffering on top of the base transit, in ns.
    pub fn target_ns(&self) -> u64 {
        self.target_ns
    }

    /// PDV of the last packet (ns).
    pub fn last_pdv_ns(&self) -> u64 {
        self.last_pdv_ns
    }

    /// Largest PDV seen (ns).
    pub fn max_pdv_ns(&self) -> u64 {
        self.max_pdv_ns
    }

    /// The `q` quantile of recent PDV, in ns: the larger of the long-memory and the
    /// short-memory histograms' quantiles.
    pub fn pdv_quantile_ns(&self, q: f64) -> u64 {
        self.long.quantile_ns(q).max(self.short.quantile_ns(q))
    }

    /// Record a packet that arrived at `arrival_ns` with `transit_ns` (arrival in media time
    /// minus its timestamp, both in ns on any fixed origin). Returns its PDV in ns.
    pub fn on_packet(&mut self, arrival_ns: u64, transit_ns: i64) -> u64 {
        if arrival_ns >= self.block_start_ns + self.block_ns || self.min_cur == i64::MAX {
            if self.min_cur != i64::MAX {
                self.min_prev = self.min_cur;
            }
            self.min_cur = i64::MAX;
            self.block_start_ns = arrival_ns;
        }
        self.min_cur = self.min_cur.min(transit_ns);
        let base = self.min_cur.min(self.min_prev);
        let pdv = (transit_ns - base).max(0) as u64;
        self.last_pdv_ns = pdv;
        self.max_pdv_ns = self.max_pdv_ns.max(pdv);
        self.long.add(pdv);
        self.short.add(pdv);
        self.update_target(arrival_ns);
        pdv
    }

    fn update_target(&mut self, now_ns: u64) {
        let elapsed = now_ns.saturating_sub(self.last_update_ns);
        self.last_update_ns = now_ns;
        match self.mode {
            BufferMode::Fixed { ns } => self.target_ns = ns,
            BufferMode::Auto {
                quantile,
                margin_ns,
                min_ns,
                max_ns,
            } => {
                let want = (self.pdv_quantile_ns(quantile) + margin_ns).clamp(min_ns, max_ns.max(min_ns));
                if want >= self.target_ns {
                    self.target_ns = want; // grow at once
                } else {
                    let step = (elapsed as u128 * self.shrink_ns_per_s as u128 / 1_000_000_000) as u64;
                    self.target_ns = self.target_ns.saturating_sub(step.max(1)).max(want);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SimRng;

    const MS: u64 = 1_000_000;

    fn auto() -> BufferMode {
        BufferMode::Auto {
            quantile: 0.99,
            margin_ns: 250_000,
            min_ns: 0,
            max_ns: 200 * MS,
        }
    }

    #[test]
    fn clean_link_target_is_the_margin() {
        let mut d = DelayEstimator::new(auto(), 750.0);
        for i in 0..3000u64 {
            d.on_packet(i * 1_333_333, 19 * MS as i64);
        }
        assert_eq!(d.base_transit_ns(), Some(19 * MS as i64));
        assert_eq!(d.pdv_quantile_ns(0.99), BIN_NS);
        assert_eq!(d.target_ns(), BIN_NS + 250_000);
    }

    #[test]
    fn target_covers_the_quantile_of_uniform_jitter() {
        // PDV uniform in [0, 4 ms): the 99 % quantile is 3.96 ms.
        let mut d = DelayEstimator::new(auto(), 750.0);
        let mut r = SimRng::new(3);
        for i in 0..20_000u64 {
            let pdv = (r.unit() * 4.0 * MS as f64) as i64;
            d.on_packet(i * 1_333_333, 10 * MS as i64 + pdv);
        }
        let q = d.pdv_quantile_ns(0.99);
        assert!((3_850_000..=4_100_000).contains(&q), "q99 {q}");
        let t = d.target_ns();
        assert!(
            (q + 250_000..=q + 250_000 + 200_000).contains(&t),
            "target {t} q {q}"
        );
    }

    #[test]
    fn grows_at_once_and_shrinks_slowly() {
        let mut d = DelayEstimator::new(auto(), 750.0);
        let mut r = SimRng::new(5);
        let mut t = 0u64;
        let step = 1_333_333;
        for _ in 0..3000 {
            t += step;
            d.on_packet(t, 10 * MS as i64 + (r.unit() * 0.2 * MS as f64) as i64);
        }
        let calm = d.target_ns();
        assert!(calm < MS, "calm target {calm}");
        // A burst of 8 ms late packets: within 10 packets the target is above 8 ms.
        for _ in 0..10 {
            t += step;
            d.on_packet(t, 18 * MS as i64);
        }
        assert!(d.target_ns() >= 8 * MS, "after burst {}", d.target_ns());
        let high = d.target_ns();
        // Calm again for one second: the target has fallen by at most ~1 ms.
        for _ in 0..750 {
            t += step;
            d.on_packet(t, 10 * MS as i64);
        }
        let after = d.target_ns();
        assert!(
            after < high && high - after <= 1_100_000,
            "high {high} after {after}"
        );
        // After twenty calm seconds it is back near the calm target.
        for _ in 0..15_000 {
            t += step;
            d.on_packet(t, 10 * MS as i64);
        }
        assert!(d.target_ns() < 2 * MS, "recovered {}", d.target_ns());
    }

    #[test]
    fn fixed_mode_ignores_jitter() {
        let mut d = DelayEstimator::new(BufferMode::Fixed { ns: 3 * MS }, 750.0);
        for i in 0..100u64 {
            d.on_packet(i * MS, (i % 7) as i64 * MS as i64);
        }
        assert_eq!(d.target_ns(), 3 * MS);
    }

    #[test]
    fn base_transit_follows_a_path_change_within_two_blocks() {
        let mut d = DelayEstimator::new(auto(), 100.0);
        for i in 0..100u64 {
            d.on_packet(i * 10 * MS, 5 * MS as i64);
        }
        // Path gets 3 ms longer at t = 1 s; after at most two 2-second blocks the base follows.
        for i in 100..600u64 {
            d.on_packet(i * 10 * MS, 8 * MS as i64);
        }
        assert_eq!(d.base_transit_ns(), Some(8 * MS as i64));
    }
}
