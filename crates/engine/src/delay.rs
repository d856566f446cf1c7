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
//! A *delay peak* — a packet far later than the recent jitter (a stalled route, a Wi-Fi
//! retry storm), and the burst of packets that drains right behind it — is kept out of the
//! histograms and remembered as an event instead. How peaks count is the
//! [`LatencyPolicy`]: `Tight` covers a peak only when peaks recur and forgets them soon
//! after the last one (twice their spacing), so one stall costs a dropout but no lasting
//! latency and a burst of jitter gives its latency back about a second after its end; `Safe` covers every peak
//! up to [`SAFE_PEAK_MAX_NS`] for ten seconds and gives latency back slowly.
//!
//! `Tight` also caps the target by the largest PDV (peaks aside) of the recent past, a
//! memory kept in blocks of 125 ms that adapts to what it has seen. Hiccups that recur a
//! second or so apart (a busy machine, a periodic Wi-Fi scan) each disturb a block or two,
//! and the whole memory (0.75–0.875 s) holds their cover through the gaps between them. A
//! *dense burst* — half a second or more in which every block was disturbed (a packet due
//! or arriving in it later than twice the quiet level plus 1 ms), then 0.375–0.5 s in which
//! none was — is over: it is forgotten at once, its blocks stop capping and its peaks stop
//! being covered, so a second of Wi-Fi-like bursts or a bandwidth collapse gives its
//! latency back within a second of its end instead of after the whole memory and twice
//! the peaks' spacing. The trade: a burst that comes back after that much quiet meets a
//! buffer already shrunk, where the fixed memory would still have covered it.
//!
//! Realtime: fixed-size arrays only; no allocation after construction.

/// Histogram resolution: 0.1 ms per bin.
const BIN_NS: u64 = 100_000;
/// Bins: up to 250 ms of PDV (larger values land in the last bin).
const BINS: usize = 2500;
/// Bins per group; group sums let a quantile be found by scanning ~100 cells, not 2500.
const GROUP: usize = 50;
const GROUPS: usize = BINS / GROUP;
/// A packet is a delay peak when its PDV exceeds twice the recent quantile plus this.
const PEAK_FLOOR_NS: u64 = 5_000_000;
/// Peaks closer together than this are one event (a stall and its drain, a retry storm).
const PEAK_MERGE_NS: u64 = 100_000_000;
/// Peak events remembered.
const PEAKS: usize = 16;
/// Packets the histograms must have seen before anything is called a peak.
const PEAK_WARMUP: u64 = 50;
/// Under `Tight` the target never exceeds the largest PDV (not a peak) of the recent past,
/// kept per block of this length in a ring of [`RECENT_BLOCKS`] (one second): the cap
/// covers the current block and the six before it ([`CAP_BLOCKS`], 0.75–0.875 s).
const RECENT_BLOCK_NS: u64 = 125_000_000;
const RECENT_BLOCKS: usize = 8;
const CAP_BLOCKS: usize = 7;
/// A *dense burst* is forgotten once it has ended: when the last [`QUIET_BLOCKS`] complete
/// blocks were quiet and at least [`DENSE_BLOCKS`] of the older ones were disturbed — a
/// packet due or arriving in the block (a peak too) later than twice the quiet level (the
/// quiet blocks' largest PDV) plus [`DISTURBED_FLOOR_NS`] — the older blocks are lowered to
/// the quiet level and the peaks seen so far stop counting. The cap's memory is then the
/// quiet 0.375–0.5 s. A hiccup that comes alone, or once a second or so, disturbs one
/// block (two or three if it is long or straddles a boundary): the memory stays whole and
/// the cover stays up between recurrences.
const QUIET_BLOCKS: usize = 3;
const DENSE_BLOCKS: usize = 4;
const DISTURBED_FLOOR_NS: u64 = 1_000_000;
/// Under `Tight`, recurring peaks stay covered twice their mean spacing after the last one,
/// at least this long (and at most the policy's memory), and the target then falls this
/// fast: a burst of jitter, whose peaks come tens of milliseconds apart, costs its latency
/// back within a second of its end, while peaks that recur every second or so (a busy
/// machine, a periodic Wi-Fi scan) stay covered instead of being met by a shrunk buffer.
const TIGHT_PEAK_HOLD_NS: u64 = 250_000_000;
/// Peaks recur at a height when another is at least this fraction of it (1/2): a busy
/// machine's hiccups vary in height and are covered at their top, but one stall among
/// hiccups a tenth its height is not.
const RECUR_RATIO: u64 = 2;
const TIGHT_SHRINK_NS_PER_S: u64 = 1_000_000_000;
/// The largest peak `Safe` covers; anything later is a stall, left to concealment.
pub const SAFE_PEAK_MAX_NS: u64 = 60_000_000;

/// How readily the buffer trades latency for fewer dropouts. Under `Tight`, the height a
/// recurring series of peaks is covered at is one that recurred (the highest with another
/// at least half as high): a stall among hiccups is not held as latency.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LatencyPolicy {
    /// Cover the recent jitter at most (the histograms' quantile, but never more than the
    /// largest delay variation of the last 0.75–0.875 s, or of the last 0.375–0.5 s once a
    /// dense burst has ended: see the module docs); cover delay peaks only when they
    /// recur (two within 1.5 s), and only for twice their spacing after the last one (a
    /// quarter second to 1.5 s) or until such a burst ends; give latency back within about
    /// a second of a transient.
    #[default]
    Tight,
    /// Cover every delay peak up to 60 ms for ten seconds after it and give latency back at
    /// 2 ms per second: fewer dropouts on links with irregular bursts, more latency after each.
    Safe,
}

impl LatencyPolicy {
    /// How long a peak event counts, how many must be remembered before they are covered,
    /// how high a peak may be to be covered, how fast the target falls (ns per s), and how
    /// long the cover is held after the last peak.
    fn rules(self) -> (u64, usize, u64, u64, u64) {
        match self {
            LatencyPolicy::Tight => (
                1_500_000_000,
                2,
                u64::MAX,
                TIGHT_SHRINK_NS_PER_S,
                TIGHT_PEAK_HOLD_NS,
            ),
            LatencyPolicy::Safe => (10_000_000_000, 1, SAFE_PEAK_MAX_NS, 2_000_000, u64::MAX),
        }
    }
}

impl std::str::FromStr for LatencyPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tight" => Ok(LatencyPolicy::Tight),
            "safe" => Ok(LatencyPolicy::Safe),
            other => Err(format!("latency policy {other:?}: use tight or safe")),
        }
    }
}

/// One block of the `Tight` cap's memory (see [`RECENT_BLOCK_NS`]).
#[derive(Debug, Clone, Copy, Default)]
struct RecentBlock {
    /// Largest PDV of the packets that were not peaks: what the cap covers.
    cap_ns: u64,
    /// Largest PDV of the packets due in it or arriving in it, peaks too: how disturbed it was.
    max_ns: u64,
    /// Packets seen in it.
    packets: u32,
}

/// One delay peak: its last packet and its height (largest PDV).
#[derive(Debug, Clone, Copy, Default)]
struct Peak {
    last_ns: u64,
    height_ns: u64,
}

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
    /// Times the stored weights were renormalised (a weight stored before cannot be taken
    /// back after).
    epoch: u32,
}

/// Where one packet's weight went in a [`DecayingHistogram`], to take it back.
#[derive(Debug, Clone, Copy, Default)]
struct Added {
    bin: usize,
    stored: f64,
    epoch: u32,
}

impl DecayingHistogram {
    fn new() -> Self {
        Self {
            bins: Box::new([0.0; BINS]),
            groups: [0.0; GROUPS],
            scale: 1.0,
            total: 0.0,
            keep: 1.0,
            epoch: 0,
        }
    }

    /// Forget every weight (the memory setting is kept). Allocation-free.
    fn clear(&mut self) {
        self.bins.iter_mut().for_each(|w| *w = 0.0);
        self.groups = [0.0; GROUPS];
        self.scale = 1.0;
        self.total = 0.0;
    }

    /// Remember about `packets` packets.
    fn set_memory(&mut self, packets: f64) {
        self.keep = 1.0 - 1.0 / packets.max(8.0);
    }

    fn add(&mut self, pdv_ns: u64) -> Added {
        let bin = ((pdv_ns / BIN_NS) as usize).min(BINS - 1);
        let inc = 1.0 - self.keep;
        self.scale *= self.keep;
        self.total = self.total * self.keep + inc;
        if self.scale < 1e-100 {
            for w in self.bins.iter_mut().chain(self.groups.iter_mut()) {
                *w *= self.scale;
            }
            self.scale = 1.0;
            self.epoch = self.epoch.wrapping_add(1);
        }
        let stored = inc / self.scale;
        self.bins[bin] += stored;
        self.groups[bin / GROUP] += stored;
        Added {
            bin,
            stored,
            epoch: self.epoch,
        }
    }

    /// Takes back what [`Self::add`] added, as much of it as has not decayed yet.
    fn take_back(&mut self, a: Added) {
        if a.epoch != self.epoch || a.stored <= 0.0 {
            return;
        }
        let stored = a.stored.min(self.bins[a.bin]);
        self.bins[a.bin] -= stored;
        self.groups[a.bin / GROUP] = (self.groups[a.bin / GROUP] - stored).max(0.0);
        self.total = (self.total - stored * self.scale).max(0.0);
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
    policy: LatencyPolicy,
    /// Recent peak events, a ring; `peaks_n` counts all ever seen.
    peaks: [Peak; PEAKS],
    peaks_n: u64,
    /// Under `Tight`, peaks that ended by this time belong to a dense burst that is over and
    /// are no longer covered (see [`QUIET_BLOCKS`]).
    peaks_forgotten_ns: u64,
    /// Packets spaced closer than this after a peak packet belong to it (its drain).
    burst_gap_ns: u64,
    packets: u64,
    /// The `Tight` cap's memory, newest (current) block first.
    recent: [RecentBlock; RECENT_BLOCKS],
    recent_block_start_ns: u64,
    /// The newest packets, newest at `undo_next - 1`: what each added, to take back those
    /// a sender's lost time made late (see [`DelayEstimator::sender_skipped`]).
    undo: [Undo; UNDO_PACKETS],
    undo_next: usize,
}

/// One packet's mark on the histograms and the target.
#[derive(Debug, Clone, Copy, Default)]
struct Undo {
    arrival_ns: u64,
    pdv_ns: u64,
    /// Where it went in the histograms (`None`: a peak, kept out of them).
    added: Option<(Added, Added)>,
    /// The target before it.
    target_before_ns: u64,
}

/// Packets remembered to be taken back: more than a sender's slip guard holds a loss
/// before declaring it (20 ms) at any packet rate up to 1,500 a second.
const UNDO_PACKETS: usize = 64;
/// Only packets this recent are taken back.
const UNDO_WINDOW_NS: u64 = 100_000_000;

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
            policy: LatencyPolicy::default(),
            peaks: [Peak::default(); PEAKS],
            peaks_n: 0,
            peaks_forgotten_ns: 0,
            burst_gap_ns: 0,
            packets: 0,
            recent: [RecentBlock::default(); RECENT_BLOCKS],
            recent_block_start_ns: 0,
            undo: [Undo::default(); UNDO_PACKETS],
            undo_next: 0,
        };
        s.set_policy(LatencyPolicy::default());
        s.set_packet_rate(packets_per_second);
        s.target_ns = s.floor_ns();
        s
    }

    /// Adjust the histogram's memory to a packet rate.
    pub fn set_packet_rate(&mut self, packets_per_second: f64) {
        self.long.set_memory(packets_per_second * 4.0);
        self.short.set_memory(packets_per_second / 3.0);
        self.burst_gap_ns = (500_000_000.0 / packets_per_second.max(1.0)) as u64;
    }

    /// Choose how peaks count and how fast the target falls.
    pub fn set_policy(&mut self, policy: LatencyPolicy) {
        if policy != self.policy {
            // Only `Tight` forgets a burst's peaks: `Safe` counts every one remembered.
            self.peaks_forgotten_ns = 0;
        }
        self.policy = policy;
        self.shrink_ns_per_s = policy.rules().3;
    }

    pub fn policy(&self) -> LatencyPolicy {
        self.policy
    }

    /// Delay peak events seen so far (see the module docs).
    pub fn peak_events(&self) -> u64 {
        self.peaks_n
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

    /// Forget everything learned (jitter history, peaks, base delay), as if new; the mode,
    /// policy and packet rate are kept. Allocation-free.
    pub fn clear(&mut self) {
        self.long.clear();
        self.short.clear();
        self.min_cur = i64::MAX;
        self.min_prev = i64::MAX;
        self.block_start_ns = 0;
        self.last_update_ns = 0;
        self.last_pdv_ns = 0;
        self.max_pdv_ns = 0;
        self.peaks = [Peak::default(); PEAKS];
        self.peaks_n = 0;
        self.peaks_forgotten_ns = 0;
        self.packets = 0;
        self.recent = [RecentBlock::default(); RECENT_BLOCKS];
        self.recent_block_start_ns = 0;
        self.undo = [Undo::default(); UNDO_PACKETS];
        self.target_ns = self.floor_ns();
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

    /// The cover a playout that follows the phase of device periods keeps before it waits
    /// a whole period more, in ns. Under [`LatencyPolicy::Tight`] that is the jitter the
    /// target covers without its margin: a period (1.3 ms at 64 frames) is far more than the
    /// margin insures, so a phase that leaves the covered jitter but not the margin is
    /// taken, not waited out. Under `Safe`, and with a fixed buffer, it is the target.
    pub fn phase_cover_ns(&self) -> u64 {
        match (self.mode, self.policy) {
            (
                BufferMode::Auto {
                    margin_ns, min_ns, ..
                },
                LatencyPolicy::Tight,
            ) => self.target_ns.saturating_sub(margin_ns).max(min_ns),
            _ => self.target_ns,
        }
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
        self.packets += 1;
        self.roll_recent(arrival_ns);
        let peak = self.on_peak(arrival_ns, pdv);
        // The packet was due `pdv` ago: every block since then was disturbed by it.
        let into_block = arrival_ns.saturating_sub(self.recent_block_start_ns);
        let back = pdv.saturating_sub(into_block).div_ceil(RECENT_BLOCK_NS);
        for b in self
            .recent
            .iter_mut()
            .take(back.saturating_add(1).min(RECENT_BLOCKS as u64) as usize)
        {
            b.max_ns = b.max_ns.max(pdv);
        }
        let b = &mut self.recent[0];
        b.packets = b.packets.saturating_add(1);
        let added = (!peak).then(|| {
            b.cap_ns = b.cap_ns.max(pdv);
            (self.long.add(pdv), self.short.add(pdv))
        });
        self.undo[self.undo_next] = Undo {
            arrival_ns,
            pdv_ns: pdv,
            added,
            target_before_ns: self.target_ns,
        };
        self.undo_next = (self.undo_next + 1) % UNDO_PACKETS;
        self.update_target(arrival_ns);
        pdv
    }

    /// The sender's stream skipped `lost_ns` of media time (its device lost that time),
    /// found at `now_ns`: the newest packets that came at least half that late, back to the
    /// first that did not, were late for the sender's own reason, not the path's. They are
    /// taken out of the histograms, and the target falls back to what it was before them
    /// if they raised it (it grows again at once if what is left wants more). Returns how
    /// many were taken back. Realtime-safe.
    pub fn sender_skipped(&mut self, now_ns: u64, lost_ns: u64) -> usize {
        let mut taken = 0;
        let mut target_before = None;
        for k in 1..=UNDO_PACKETS {
            let i = (self.undo_next + UNDO_PACKETS - k) % UNDO_PACKETS;
            let u = self.undo[i];
            if u.arrival_ns == 0 || u.arrival_ns + UNDO_WINDOW_NS < now_ns || u.pdv_ns < lost_ns / 2 {
                break;
            }
            if let Some((long, short)) = u.added {
                self.long.take_back(long);
                self.short.take_back(short);
            }
            self.undo[i] = Undo::default();
            target_before = Some(u.target_before_ns);
            taken += 1;
        }
        if let Some(before) = target_before {
            if before < self.target_ns {
                self.target_ns = before;
            }
            self.update_target(now_ns);
        }
        taken
    }

    /// Start a new block of the cap's memory when the current one is over (empty blocks for
    /// any that passed without a packet), then forget a dense burst that has ended.
    fn roll_recent(&mut self, now_ns: u64) {
        let elapsed = now_ns.saturating_sub(self.recent_block_start_ns);
        if elapsed < RECENT_BLOCK_NS {
            return;
        }
        let n = (elapsed / RECENT_BLOCK_NS).min(RECENT_BLOCKS as u64) as usize;
        self.recent.copy_within(..RECENT_BLOCKS - n, n);
        self.recent[..n].fill(RecentBlock::default());
        self.recent_block_start_ns = now_ns - elapsed % RECENT_BLOCK_NS;
        if self.policy == LatencyPolicy::Tight {
            self.forget_an_ended_burst(now_ns);
        }
    }

    /// See [`QUIET_BLOCKS`]: the complete blocks right behind the current one are quiet and
    /// most of the older ones were disturbed, so the burst is over: the older blocks are
    /// lowered to the quiet level, and the peaks seen so far no longer count.
    fn forget_an_ended_burst(&mut self, now_ns: u64) {
        let (quiet, older) = self.recent[1..].split_at_mut(QUIET_BLOCKS);
        if quiet.iter().any(|b| b.packets == 0) {
            return;
        }
        let level = quiet.iter().map(|b| b.max_ns).max().unwrap_or(0);
        let floor = level.saturating_mul(2).saturating_add(DISTURBED_FLOOR_NS);
        if older.iter().filter(|b| b.max_ns > floor).count() < DENSE_BLOCKS {
            return;
        }
        for b in older {
            b.cap_ns = b.cap_ns.min(level);
            b.max_ns = b.max_ns.min(level);
        }
        self.peaks_forgotten_ns = now_ns;
    }

    /// Whether this packet is (part of) a delay peak, which is then recorded instead of
    /// entering the histograms: far above the recent jitter, or arriving right behind a
    /// peak packet (the drain of a stalled queue).
    fn on_peak(&mut self, arrival_ns: u64, pdv: u64) -> bool {
        if self.packets <= PEAK_WARMUP || matches!(self.mode, BufferMode::Fixed { .. }) {
            return false;
        }
        let q = match self.mode {
            BufferMode::Auto { quantile, .. } => self.pdv_quantile_ns(quantile),
            BufferMode::Fixed { .. } => 0,
        };
        let last = self.peaks[((self.peaks_n + PEAKS as u64 - 1) % PEAKS as u64) as usize];
        let draining = self.peaks_n > 0 && arrival_ns.saturating_sub(last.last_ns) < self.burst_gap_ns;
        if pdv <= 2 * q + PEAK_FLOOR_NS && !draining {
            return false;
        }
        if self.peaks_n > 0 && arrival_ns.saturating_sub(last.last_ns) < PEAK_MERGE_NS {
            let i = ((self.peaks_n - 1) % PEAKS as u64) as usize;
            self.peaks[i].last_ns = arrival_ns;
            self.peaks[i].height_ns = self.peaks[i].height_ns.max(pdv);
        } else {
            self.peaks[(self.peaks_n % PEAKS as u64) as usize] = Peak {
                last_ns: arrival_ns,
                height_ns: pdv,
            };
            self.peaks_n += 1;
        }
        true
    }

    /// The peak height the policy covers now (0 when none).
    fn peak_cover_ns(&self, now_ns: u64) -> u64 {
        let (memory_ns, count, max_height, _, hold_min_ns) = self.policy.rules();
        let live = || {
            self.peaks[..self.peaks_n.min(PEAKS as u64) as usize]
                .iter()
                .filter(move |p| p.height_ns <= max_height && p.last_ns > self.peaks_forgotten_ns)
        };
        let Some(last) = live().map(|p| p.last_ns).max() else {
            return 0;
        };
        // Whether the last peak was a recurrence: `count` peaks within the memory before it.
        let series = live().filter(|p| p.last_ns + memory_ns > last);
        let (n, first) = series.fold((0usize, u64::MAX), |(n, f), p| (n + 1, f.min(p.last_ns)));
        if n < count {
            return 0;
        }
        // Covered for twice their mean spacing after the last one (see TIGHT_PEAK_HOLD_NS).
        let spacing = if n >= 2 {
            (last - first) / (n as u64 - 1)
        } else {
            memory_ns
        };
        let hold_ns = spacing
            .saturating_mul(2)
            .clamp(hold_min_ns.min(memory_ns), memory_ns);
        if now_ns.saturating_sub(last) >= hold_ns {
            return 0;
        }
        // The height covered is one that recurred: the highest of the series that made the
        // last peak a recurrence with another at least half as high (or, none such, the
        // lowest). One stall beside a few hiccups is a stall, not a height to keep: covering
        // it would hold its whole length as latency for as long as the hiccups go on.
        let mut heights = [0u64; PEAKS];
        let mut k = 0;
        for p in live().filter(|p| p.last_ns + memory_ns > last) {
            heights[k] = p.height_ns;
            k += 1;
        }
        let heights = &mut heights[..k];
        heights.sort_unstable_by(|a, b| b.cmp(a));
        if count <= 1 {
            return heights.first().copied().unwrap_or(0);
        }
        heights
            .windows(2)
            .find(|w| w[1].saturating_mul(RECUR_RATIO) >= w[0])
            .map_or_else(|| heights.last().copied().unwrap_or(0), |w| w[0])
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
                let mut covered = self.pdv_quantile_ns(quantile);
                if self.policy == LatencyPolicy::Tight {
                    // One histogram bin above the largest recent variation.
                    let recent = self.recent[..CAP_BLOCKS]
                        .iter()
                        .map(|b| b.cap_ns)
                        .max()
                        .unwrap_or(0);
                    covered = covered.min(recent / BIN_NS * BIN_NS + BIN_NS);
                }
                let jitter = covered.max(self.peak_cover_ns(now_ns));
                let want = (jitter + margin_ns).clamp(min_ns, max_ns.max(min_ns));
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
    fn safe_grows_at_once_and_shrinks_slowly() {
        let mut d = DelayEstimator::new(auto(), 750.0);
        d.set_policy(LatencyPolicy::Safe);
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
        // The peak stays covered for ten calm seconds.
        for _ in 0..7400 {
            t += step;
            d.on_packet(t, 10 * MS as i64);
        }
        assert_eq!(d.target_ns(), high);
        // Then the target falls by at most ~2 ms a second.
        for _ in 0..750 {
            t += step;
            d.on_packet(t, 10 * MS as i64);
        }
        let after = d.target_ns();
        assert!(
            after < high && high - after <= 2_100_000,
            "high {high} after {after}"
        );
        // After twenty calm seconds it is back near the calm target.
        for _ in 0..15_000 {
            t += step;
            d.on_packet(t, 10 * MS as i64);
        }
        assert!(d.target_ns() < 2 * MS, "recovered {}", d.target_ns());
    }

    /// Calm packets every 1.33 ms from `t` for `n` packets; returns the time after.
    fn calm(d: &mut DelayEstimator, mut t: u64, n: usize, r: &mut SimRng) -> u64 {
        for _ in 0..n {
            t += 1_333_333;
            d.on_packet(t, 10 * MS as i64 + (r.unit() * 0.2 * MS as f64) as i64);
        }
        t
    }

    /// A 200 ms stall: nothing, then the backlog drains at once, latest first in delay.
    fn stall(d: &mut DelayEstimator, t: u64) -> u64 {
        let end = t + 200 * MS;
        for k in 0..150u64 {
            let sent = t + k * 1_333_333;
            d.on_packet(end + k * 1000, 10 * MS as i64 + (end - sent) as i64);
        }
        end + 150_000
    }

    #[test]
    fn tight_ignores_an_isolated_stall_and_recovers_within_a_second() {
        let mut d = DelayEstimator::new(auto(), 750.0);
        let mut r = SimRng::new(9);
        let t = calm(&mut d, 0, 3000, &mut r);
        let before = d.target_ns();
        let t = stall(&mut d, t);
        assert_eq!(d.peak_events(), 1);
        // At once, and a second later, the target is where it was.
        assert!(d.target_ns() <= before + 200_000, "{} vs {before}", d.target_ns());
        calm(&mut d, t, 750, &mut r);
        assert!(d.target_ns() <= before + 200_000, "{} vs {before}", d.target_ns());
    }

    /// Packets a far device's lost time made late (a period, 1.33 ms, for the 20 ms its
    /// slip guard holds a loss) grow the target; the gap that follows takes them back, and
    /// the target and the quantile are what they were. Packets late for the path's own
    /// reasons before them stay.
    #[test]
    fn a_senders_lost_time_is_taken_back_out_of_the_estimate() {
        for policy in [LatencyPolicy::Tight, LatencyPolicy::Safe] {
            let mut d = DelayEstimator::new(auto(), 750.0);
            d.set_policy(policy);
            let mut r = SimRng::new(12);
            let mut t = calm(&mut d, 0, 3000, &mut r);
            let (before, q_before) = (d.target_ns(), d.pdv_quantile_ns(0.99));
            for _ in 0..15 {
                t += 1_333_333;
                d.on_packet(
                    t,
                    10 * MS as i64 + 1_333_333 + (r.unit() * 0.2 * MS as f64) as i64,
                );
            }
            let grown = d.target_ns();
            assert!(grown > before + 1_000_000, "{policy:?}: {grown} vs {before}");
            assert_eq!(d.sender_skipped(t, 1_333_333), 15, "{policy:?}");
            assert!(
                d.target_ns() <= before + 100_000,
                "{policy:?}: {} vs {before}",
                d.target_ns()
            );
            assert!(d.pdv_quantile_ns(0.99) <= q_before + 100_000, "{policy:?}");
            // Nothing late left to take back: a second gap takes nothing.
            assert_eq!(d.sender_skipped(t, 1_333_333), 0, "{policy:?}");
        }
    }

    #[test]
    fn tight_covers_peaks_that_recur_and_forgets_them() {
        let mut d = DelayEstimator::new(auto(), 750.0);
        let mut r = SimRng::new(10);
        let mut t = calm(&mut d, 0, 3000, &mut r);
        // A 30 ms peak alone is not covered; a second one a second later is, at once.
        t += 1_333_333;
        d.on_packet(t, 40 * MS as i64);
        assert!(d.target_ns() < MS, "one peak {}", d.target_ns());
        t = calm(&mut d, t, 750, &mut r) + 1_333_333;
        d.on_packet(t, 40 * MS as i64);
        assert!(d.target_ns() >= 30 * MS, "covered {}", d.target_ns());
        // Three calm seconds later they are forgotten and the target is back within 1 ms.
        calm(&mut d, t, 2250, &mut r);
        assert!(d.target_ns() < MS, "forgotten {}", d.target_ns());
    }

    #[test]
    fn tight_covers_the_hiccups_around_a_stall_not_the_stall() {
        let mut d = DelayEstimator::new(auto(), 750.0);
        let mut r = SimRng::new(12);
        let mut t = calm(&mut d, 0, 3000, &mut r);
        t = stall(&mut d, t);
        // Hiccups of 8 ms half a second apart after it: they recur, and are covered at
        // their own height, not at the stall's.
        for _ in 0..3 {
            t = calm(&mut d, t, 375, &mut r) + 1_333_333;
            d.on_packet(t, 18 * MS as i64);
        }
        assert!(
            d.target_ns() >= 7 * MS,
            "the hiccups are covered: {}",
            d.target_ns()
        );
        assert!(d.target_ns() <= 12 * MS, "the stall is not: {}", d.target_ns());
    }

    #[test]
    fn tight_covers_hiccups_of_varying_height_at_their_top() {
        let mut d = DelayEstimator::new(auto(), 750.0);
        let mut r = SimRng::new(13);
        let mut t = calm(&mut d, 0, 3000, &mut r);
        // A busy machine: hiccups of 20, 30 and 25 ms, 0.3 s apart.
        for late in [30, 40, 35] {
            t = calm(&mut d, t, 225, &mut r) + 1_333_333;
            d.on_packet(t, late * MS as i64);
        }
        assert!(d.target_ns() >= 29 * MS, "covered at the top: {}", d.target_ns());
    }

    #[test]
    fn safe_covers_a_single_peak_but_not_a_stall() {
        let mut d = DelayEstimator::new(auto(), 750.0);
        d.set_policy(LatencyPolicy::Safe);
        let mut r = SimRng::new(11);
        let t = calm(&mut d, 0, 3000, &mut r);
        let t = stall(&mut d, t);
        assert!(
            d.target_ns() < 2 * MS,
            "a 200 ms stall is not covered: {}",
            d.target_ns()
        );
        let t = calm(&mut d, t, 200, &mut r);
        d.on_packet(t + 1_333_333, 30 * MS as i64);
        assert!(d.target_ns() >= 20 * MS, "a 20 ms peak is: {}", d.target_ns());
    }

    #[test]
    fn policies_parse() {
        assert_eq!("Tight".parse::<LatencyPolicy>(), Ok(LatencyPolicy::Tight));
        assert_eq!("safe".parse::<LatencyPolicy>(), Ok(LatencyPolicy::Safe));
        assert!("fast"
            .parse::<LatencyPolicy>()
            .unwrap_err()
            .contains("tight or safe"));
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

    /// 750 packets/s on a quiet path (PDV under 0.1 ms) for `seconds`, with a 7 ms late
    /// packet wherever `peak(t)` says; returns the target at each packet.
    fn tight_run(seconds: u64, peak: impl Fn(u64) -> bool) -> Vec<(u64, u64)> {
        tight_series(seconds, 9, |t, _| peak(t).then_some(7 * MS))
    }

    /// 750 packets/s for `seconds`: PDV `late(t, rng)` where it says, else under 0.1 ms;
    /// returns the target at each packet.
    fn tight_series(
        seconds: u64,
        seed: u64,
        mut late: impl FnMut(u64, &mut SimRng) -> Option<u64>,
    ) -> Vec<(u64, u64)> {
        let mut d = DelayEstimator::new(auto(), 750.0);
        let mut r = SimRng::new(seed);
        (0..seconds * 750)
            .map(|i| {
                let t = i * 1_333_333;
                let pdv = late(t, &mut r).unwrap_or_else(|| (r.unit() * 0.1 * MS as f64) as u64);
                d.on_packet(t, 10 * MS as i64 + pdv as i64);
                (t, d.target_ns())
            })
            .collect()
    }

    #[test]
    fn tight_keeps_covering_peaks_that_recur_every_second() {
        // A peak packet every 0.9 s from 2 s on: once two have come, the buffer covers them
        // through every gap, rather than shrinking and meeting the next one too shallow.
        let at = |t: u64| t >= 2_000_000_000 && (t - 2_000_000_000) % 900_000_000 < 1_333_333;
        let targets = tight_run(12, at);
        let low = targets
            .iter()
            .filter(|(t, _)| *t > 3_000_000_000)
            .map(|&(_, target)| target)
            .min()
            .unwrap_or(0);
        assert!(
            low >= 7 * MS,
            "the target fell to {low} ns between recurring peaks"
        );
    }

    #[test]
    fn tight_gives_a_burst_of_peaks_back_within_half_a_second() {
        // Peaks 120 ms apart for a second, then none: covered during the burst, back to
        // the quiet level within 0.5 s of the last one.
        let at = |t: u64| (2_000_000_000..3_000_000_000).contains(&t) && t % 120_000_000 < 1_333_333;
        let targets = tight_run(6, at);
        let during = targets
            .iter()
            .find(|(t, _)| *t == 2_800_000_000 / 1_333_333 * 1_333_333);
        assert!(
            during.is_some_and(|&(_, x)| x >= 7 * MS),
            "not covered in the burst: {during:?}"
        );
        let last_peak = (2_000_000_000..3_000_000_000u64)
            .step_by(1_333_333)
            .filter(|&t| at(t))
            .max()
            .expect("peaks");
        let back = targets
            .iter()
            .find(|(t, x)| *t > last_peak && *x < MS)
            .map(|(t, _)| t - last_peak);
        assert!(
            back.is_some_and(|ns| ns <= 500_000_000),
            "back to the quiet target {back:?} ns after the last peak"
        );
    }

    /// 750 packets/s for `seconds` on a quiet path (PDV under 0.1 ms) except where
    /// `jitter(t)` is true: there PDV is uniform in [0, `late`); returns the target at each packet.
    fn tight_jitter_run(seconds: u64, late: u64, jitter: impl Fn(u64) -> bool) -> Vec<(u64, u64)> {
        tight_series(seconds, 12, |t, r| {
            jitter(t).then(|| (r.unit() * late as f64) as u64)
        })
    }

    #[test]
    fn tight_forgets_a_dense_burst_soon_after_its_end() {
        // A second of 0-6 ms jitter on every packet (not peaks: the histograms follow it),
        // then quiet: covered during the burst, back under 1 ms within 0.6 s of its end,
        // where the whole memory would have held it 0.75 s or more.
        let end = 3_000_000_000;
        let targets = tight_jitter_run(6, 6 * MS, |t| (2_000_000_000..end).contains(&t));
        let during = targets.iter().find(|(t, _)| *t >= 2_900_000_000).map(|&(_, x)| x);
        assert!(
            during.is_some_and(|x| x >= 5 * MS),
            "not covered in the burst: {during:?}"
        );
        let back = targets
            .iter()
            .filter(|(t, _)| *t >= end)
            .find(|(_, x)| *x < MS)
            .map(|(t, _)| t - end);
        assert!(
            back.is_some_and(|ns| ns <= 600_000_000),
            "back under 1 ms {back:?} ns after the burst"
        );
    }

    #[test]
    fn tight_keeps_covering_jitter_that_recurs_more_often_than_its_memory() {
        // 60 ms of 0-6 ms jitter every 0.6 s (a busy machine): each spell disturbs one block
        // or two, never the half second of a dense burst, so the cover is never forgotten
        // and the target stays up through every gap once the spells have begun.
        let at = |t: u64| t >= 2_000_000_000 && (t - 2_000_000_000) % 600_000_000 < 60_000_000;
        let targets = tight_jitter_run(10, 6 * MS, at);
        let low = targets
            .iter()
            .filter(|(t, _)| *t > 2_100_000_000)
            .map(|&(_, x)| x)
            .min()
            .unwrap_or(0);
        assert!(
            low >= 4 * MS,
            "the target fell to {low} ns between spells of jitter"
        );
    }
}
