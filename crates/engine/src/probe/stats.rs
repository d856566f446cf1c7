//! Statistics of a probe run: what `netjam ping` measures and reports.
//!
//! [`ProbeStats`] is fed the send time of every probe and every reply with its arrival
//! time, all on the sender's monotonic clock; the reply carries the reflector's receive time
//! on the reflector's clock, how long the reflector held the probe, and how many probes of
//! this session it had received. From these it derives, per packet `i`:
//!
//! - round-trip time `rtt = t4 − t1 − hold`;
//! - raw one-way transit `up = t2 − t1` and `down = t4 − t3` (with `t3 = t2 + hold`), each
//!   off by the unknown clock offset θ between the hosts. θ is **estimated** from the probes
//!   themselves with a minimum filter, `θ = (min up − min down) / 2`, which assumes the
//!   fastest packets took equally long each way; one-way delays are reported as estimates.
//!   Two hosts' clocks also run at slightly different rates (tens of ppm: a millisecond a
//!   minute), which would show up as a delay ramp in one direction and a fall in the other,
//!   so the skew is estimated first by a least-squares line through the per-window minima
//!   of both raw transits and taken out before the offset;
//! - IPDV (RFC 3393, RFC 5481 §4.1): `D(i) − D(i−1)` for consecutive sequence numbers
//!   both received (the offset cancels, so IPDV and PDV need no synchronised clocks);
//! - PDV (RFC 5481 §4.2): `D(i) − min D`;
//! - RFC 3550 §6.4.1 interarrival jitter, `J += (|D(i−1,i)| − J) / 16`, in arrival order;
//! - loss split by direction: the reflector's count tells how many probes reached it, so
//!   probes that never reached it were lost on the way up and the rest on the way down;
//! - reordering (RFC 4737: a packet whose sequence number is below one already seen),
//!   duplicates and late packets (round trip above a threshold).
//!
//! Percentiles use the nearest-rank method (the value at rank ⌈p·n⌉ of the sorted sample),
//! so the median of an even-sized sample is the lower middle value.
//!
//! Memory is fixed at construction: one record per probe the caller plans to send.

use serde::{Deserialize, Serialize};

use super::packet::ProbeReply;

/// What the sender knows about one probe.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeRecord {
    /// Send time on the sender's clock; 0 until sent.
    pub t1_ns: u64,
    pub sent: bool,
    pub reply: Option<ReplyTimes>,
    /// Further copies of the reply that arrived.
    pub duplicates: u16,
}

/// The times of a reply.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyTimes {
    /// Reflector's receive time on its own clock.
    pub t2_ns: u64,
    pub hold_ns: u32,
    /// Arrival at the sender, on the sender's clock.
    pub t4_ns: u64,
    /// Probes the reflector had received in this session when it answered.
    pub reflector_received: u32,
    /// Position in arrival order.
    pub arrival: u32,
    /// The arrival time came from the kernel.
    pub kernel_ts: bool,
}

impl ProbeRecord {
    /// Round-trip time without the reflector's hold time.
    pub fn rtt_ns(&self) -> Option<i64> {
        self.reply
            .map(|r| (r.t4_ns.wrapping_sub(self.t1_ns) as i64).saturating_sub(r.hold_ns as i64))
    }

    /// Raw up transit `t2 − t1` (includes the clock offset).
    pub fn up_raw_ns(&self) -> Option<i64> {
        self.reply.map(|r| r.t2_ns.wrapping_sub(self.t1_ns) as i64)
    }

    /// Raw down transit `t4 − t3` (includes minus the clock offset).
    pub fn down_raw_ns(&self) -> Option<i64> {
        self.reply
            .map(|r| r.t4_ns.wrapping_sub(r.t2_ns.wrapping_add(r.hold_ns as u64)) as i64)
    }
}

/// What became of a reply handed to [`ProbeStats::on_reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyOutcome {
    First,
    Duplicate,
    /// For a probe never sent, or with a send time that is not ours: ignored.
    Unknown,
}

/// A cheap running view for a live status line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveStats {
    pub sent: u64,
    pub received: u64,
    pub loss_pct: f64,
    pub last_rtt_ms: f64,
    pub min_rtt_ms: f64,
    pub jitter_ms: f64,
}

/// Distribution of a delay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DelayStats {
    pub count: u64,
    pub min_ms: f64,
    pub mean_ms: f64,
    pub median_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// Inter-packet delay variation (RFC 3393 / RFC 5481 §4.1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct IpdvStats {
    pub pairs: u64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub mean_abs_ms: f64,
    pub p99_abs_ms: f64,
}

/// Packet delay variation against the minimum delay (RFC 5481 §4.2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PdvStats {
    pub mean_ms: f64,
    pub median_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
}

/// Everything measured on one path: round trip, send (up) or receive (down).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PathStats {
    pub delay: DelayStats,
    pub ipdv: IpdvStats,
    pub pdv: PdvStats,
    /// RFC 3550 interarrival jitter at the end of the run.
    pub jitter_rfc3550_ms: f64,
    pub lost: u64,
    pub loss_pct: f64,
    pub reordered: u64,
}

/// One histogram bin.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HistogramBin {
    pub lo_ms: f64,
    pub hi_ms: f64,
    pub count: u64,
}

/// How the clock offset between sender and reflector was estimated.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClockEstimate {
    /// Reflector clock minus sender clock, estimated (at the first probe).
    pub offset_ms: f64,
    /// How much faster the reflector's clock runs, estimated, in parts per million (0 when
    /// the run is under 10 s or the jitter hides it).
    pub skew_ppm: f64,
    /// Always true: one-way delays rest on the estimate.
    pub one_way_delays_are_estimates: bool,
    pub method: String,
}

/// The full result of a probe run (a serde snapshot).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeSummary {
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub loss_pct: f64,
    /// Lost with no later reply to tell the direction (at the end of the run).
    pub lost_direction_unknown: u64,
    pub duplicates: u64,
    /// Replies whose round trip exceeded `late_after_ms`: counted as received (not lost),
    /// but too late for any jitter buffer.
    pub late: u64,
    pub late_after_ms: f64,
    pub unknown_replies: u64,
    /// Probes the reflector refused under its rate limit (they count as lost on the way up).
    pub refused_by_reflector: u64,
    pub round_trip: PathStats,
    /// Sender to reflector (one-way figures are estimates).
    pub send: PathStats,
    /// Reflector to sender (one-way figures are estimates).
    pub receive: PathStats,
    pub clock: ClockEstimate,
    pub reflector_hold: DelayStats,
    pub rtt_histogram: Vec<HistogramBin>,
    /// Replies whose arrival time came from the kernel.
    pub kernel_timestamps: u64,
    /// Replies on which the reflector used kernel receive timestamps.
    pub reflector_kernel_timestamps: u64,
}

/// Statistics of one probe run. See the module docs.
#[derive(Debug, Clone)]
pub struct ProbeStats {
    records: Vec<ProbeRecord>,
    sent: u64,
    received: u64,
    duplicates: u64,
    unknown: u64,
    reflector_kernel: u64,
    kernel: u64,
    refused: u16,
    last_rtt_ns: Option<i64>,
    min_rtt_ns: Option<i64>,
    jitter_ns: f64,
}

const NS_PER_MS: f64 = 1e6;

fn ms(ns: f64) -> f64 {
    ns / NS_PER_MS
}

/// Nearest-rank percentile of a sorted, non-empty slice.
fn nearest_rank(sorted: &[i64], p: f64) -> i64 {
    let n = sorted.len();
    let rank = (p * n as f64).ceil() as usize;
    sorted[rank.clamp(1, n) - 1]
}

fn delay_stats(values: &mut [i64]) -> DelayStats {
    if values.is_empty() {
        return DelayStats::default();
    }
    values.sort_unstable();
    let sum: f64 = values.iter().map(|v| *v as f64).sum();
    DelayStats {
        count: values.len() as u64,
        min_ms: ms(values[0] as f64),
        mean_ms: ms(sum / values.len() as f64),
        median_ms: ms(nearest_rank(values, 0.5) as f64),
        p95_ms: ms(nearest_rank(values, 0.95) as f64),
        p99_ms: ms(nearest_rank(values, 0.99) as f64),
        max_ms: ms(values[values.len() - 1] as f64),
    }
}

fn pdv_stats(sorted: &[i64]) -> PdvStats {
    let Some(&min) = sorted.first() else {
        return PdvStats::default();
    };
    let n = sorted.len() as f64;
    let sum: f64 = sorted.iter().map(|v| v.saturating_sub(min) as f64).sum();
    PdvStats {
        mean_ms: ms(sum / n),
        median_ms: ms(nearest_rank(sorted, 0.5).saturating_sub(min) as f64),
        p99_ms: ms(nearest_rank(sorted, 0.99).saturating_sub(min) as f64),
        p999_ms: ms(nearest_rank(sorted, 0.999).saturating_sub(min) as f64),
        max_ms: ms(sorted[sorted.len() - 1].saturating_sub(min) as f64),
    }
}

fn ipdv_stats(diffs: &mut [i64]) -> IpdvStats {
    if diffs.is_empty() {
        return IpdvStats::default();
    }
    let n = diffs.len();
    let min = diffs.iter().copied().min().unwrap_or(0);
    let max = diffs.iter().copied().max().unwrap_or(0);
    let mut abs: Vec<i64> = diffs.iter().map(|d| d.saturating_abs()).collect();
    abs.sort_unstable();
    let sum: f64 = abs.iter().map(|v| *v as f64).sum();
    IpdvStats {
        pairs: n as u64,
        min_ms: ms(min as f64),
        max_ms: ms(max as f64),
        mean_abs_ms: ms(sum / n as f64),
        p99_abs_ms: ms(nearest_rank(&abs, 0.99) as f64),
    }
}

/// RFC 3550 jitter over transit times given in arrival order.
fn rfc3550_jitter(transits_in_arrival_order: impl Iterator<Item = i64>) -> f64 {
    let mut j = 0.0f64;
    let mut prev: Option<i64> = None;
    for t in transits_in_arrival_order {
        if let Some(p) = prev {
            let d = t.saturating_sub(p).saturating_abs() as f64;
            j += (d - j) / 16.0;
        }
        prev = Some(t);
    }
    j
}

/// Count RFC 4737 reordered packets: values (in arrival order) below one already seen.
fn reordered(order_keys: impl Iterator<Item = i64>) -> u64 {
    let mut max: Option<i64> = None;
    let mut n = 0;
    for k in order_keys {
        match max {
            Some(m) if k < m => n += 1,
            _ => max = Some(k),
        }
    }
    n
}

fn histogram(sorted: &[i64]) -> Vec<HistogramBin> {
    let (Some(&lo), Some(&hi)) = (sorted.first(), sorted.last()) else {
        return Vec::new();
    };
    // Bin width from the 1-2-5 series so that at most 30 bins cover the range.
    let span = hi.saturating_sub(lo).max(1) as f64;
    let mut width = 1_000.0f64; // 1 µs
    'outer: loop {
        for m in [1.0, 2.0, 5.0] {
            if span / (width * m) <= 30.0 {
                width *= m;
                break 'outer;
            }
        }
        width *= 10.0;
    }
    let start = (lo as f64 / width).floor() * width;
    let bins = (((hi as f64 - start) / width).floor() as usize + 1).min(64);
    let mut counts = vec![0u64; bins];
    for v in sorted {
        let i = (((*v as f64 - start) / width).floor() as usize).min(bins - 1);
        counts[i] += 1;
    }
    counts
        .into_iter()
        .enumerate()
        .map(|(i, count)| HistogramBin {
            lo_ms: ms(start + i as f64 * width),
            hi_ms: ms(start + (i + 1) as f64 * width),
            count,
        })
        .collect()
}

impl ProbeStats {
    /// Room for `capacity` probes (sequence numbers `0..capacity`); later ones are ignored.
    pub fn new(capacity: usize) -> Self {
        Self {
            records: vec![ProbeRecord::default(); capacity],
            sent: 0,
            received: 0,
            duplicates: 0,
            unknown: 0,
            reflector_kernel: 0,
            kernel: 0,
            refused: 0,
            last_rtt_ns: None,
            min_rtt_ns: None,
            jitter_ns: 0.0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.records.len()
    }

    /// Every record, indexed by sequence number.
    pub fn records(&self) -> &[ProbeRecord] {
        &self.records[..(self.sent as usize).min(self.records.len())]
    }

    /// Probe `seq` was sent at `t1_ns`.
    pub fn on_sent(&mut self, seq: u32, t1_ns: u64) {
        let Some(r) = self.records.get_mut(seq as usize) else {
            return;
        };
        if !r.sent {
            r.sent = true;
            r.t1_ns = t1_ns;
        }
        self.sent = self.sent.max(seq as u64 + 1);
    }

    /// A reply arrived at `t4_ns` (`kernel_ts`: that time came from the kernel).
    pub fn on_reply(&mut self, t4_ns: u64, reply: &ProbeReply, kernel_ts: bool) -> ReplyOutcome {
        let seq = reply.seq;
        let Some(r) = self.records.get_mut(seq as usize) else {
            self.unknown += 1;
            return ReplyOutcome::Unknown;
        };
        if r.sent && r.t1_ns != reply.t1_ns {
            self.unknown += 1;
            return ReplyOutcome::Unknown;
        }
        if r.reply.is_some() {
            r.duplicates = r.duplicates.saturating_add(1);
            self.duplicates += 1;
            return ReplyOutcome::Duplicate;
        }
        if !r.sent {
            // The reply overtook the sender's bookkeeping; the echoed time is our own.
            r.sent = true;
            r.t1_ns = reply.t1_ns;
            self.sent = self.sent.max(seq as u64 + 1);
        }
        r.reply = Some(ReplyTimes {
            t2_ns: reply.t2_ns,
            hold_ns: reply.hold_ns,
            t4_ns,
            reflector_received: reply.received,
            arrival: self.received.min(u32::MAX as u64) as u32,
            kernel_ts,
        });
        let rtt = r.rtt_ns().unwrap_or(0);
        self.received += 1;
        self.refused = self.refused.max(reply.refused);
        if reply.reflector_kernel_ts {
            self.reflector_kernel += 1;
        }
        if kernel_ts {
            self.kernel += 1;
        }
        if let Some(prev) = self.last_rtt_ns {
            let d = rtt.saturating_sub(prev).saturating_abs() as f64;
            self.jitter_ns += (d - self.jitter_ns) / 16.0;
        }
        self.last_rtt_ns = Some(rtt);
        self.min_rtt_ns = Some(self.min_rtt_ns.map_or(rtt, |m| m.min(rtt)));
        ReplyOutcome::First
    }

    pub fn sent(&self) -> u64 {
        self.sent
    }

    pub fn received(&self) -> u64 {
        self.received
    }

    /// True when every probe sent so far has been answered.
    pub fn all_answered(&self) -> bool {
        self.received >= self.sent
    }

    /// Running figures for a status line.
    pub fn live(&self) -> LiveStats {
        let loss = if self.sent > 0 {
            100.0 * self.sent.saturating_sub(self.received) as f64 / self.sent as f64
        } else {
            0.0
        };
        LiveStats {
            sent: self.sent,
            received: self.received,
            loss_pct: loss,
            last_rtt_ms: ms(self.last_rtt_ns.unwrap_or(0) as f64),
            min_rtt_ms: ms(self.min_rtt_ns.unwrap_or(0) as f64),
            jitter_ms: ms(self.jitter_ns),
        }
    }

    /// The median round-trip time so far, if any reply arrived.
    pub fn median_rtt_ns(&self) -> Option<i64> {
        let mut v: Vec<i64> = self.records().iter().filter_map(|r| r.rtt_ns()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_unstable();
        Some(nearest_rank(&v, 0.5))
    }

    /// The default late threshold: the larger of 1 s and four median round trips.
    pub fn default_late_after_ns(&self) -> u64 {
        let m = self.median_rtt_ns().unwrap_or(0).max(0) as u64;
        m.saturating_mul(4).max(1_000_000_000)
    }

    /// Compute every figure. `late_after_ns`: round trips above it count as late
    /// (`None`: [`ProbeStats::default_late_after_ns`]).
    pub fn summary(&self, late_after_ns: Option<u64>) -> ProbeSummary {
        let recs = self.records();
        let got: Vec<(u32, &ProbeRecord)> = recs
            .iter()
            .enumerate()
            .filter(|(_, r)| r.reply.is_some())
            .map(|(i, r)| (i as u32, r))
            .collect();

        // Clock skew, then offset by minimum filter.
        let clock = self.clock_model();
        let send_of = |r: &ProbeRecord| clock.send_ns(r);
        let recv_of = |r: &ProbeRecord| clock.receive_ns(r);

        // Arrival order at the sender.
        let mut by_arrival: Vec<(u32, &ProbeRecord)> = got.clone();
        by_arrival.sort_by_key(|(_, r)| r.reply.map(|x| x.arrival).unwrap_or(0));
        // Arrival order at the reflector.
        let mut by_t2: Vec<(u32, &ProbeRecord)> = got.clone();
        by_t2.sort_by_key(|(s, r)| (r.reply.map(|x| x.t2_ns).unwrap_or(0), *s));

        let path = |f: &dyn Fn(&ProbeRecord) -> Option<i64>, order: &[(u32, &ProbeRecord)]| {
            let mut vals: Vec<i64> = got.iter().filter_map(|(_, r)| f(r)).collect();
            let delay = delay_stats(&mut vals);
            let pdv = pdv_stats(&vals);
            let mut diffs: Vec<i64> = got
                .windows(2)
                .filter(|w| w[1].0 == w[0].0.wrapping_add(1))
                .filter_map(|w| Some(f(w[1].1)?.saturating_sub(f(w[0].1)?)))
                .collect();
            let ipdv = ipdv_stats(&mut diffs);
            let jitter = rfc3550_jitter(order.iter().filter_map(|(_, r)| f(r)));
            PathStats {
                delay,
                ipdv,
                pdv,
                jitter_rfc3550_ms: ms(jitter),
                ..PathStats::default()
            }
        };

        let mut round_trip = path(&|r: &ProbeRecord| r.rtt_ns(), &by_arrival);
        let mut send = path(&send_of, &by_t2);
        let mut receive = path(&recv_of, &by_arrival);

        // Loss by direction.
        let sent = self.sent;
        let received = self.received;
        let lost = sent.saturating_sub(received);
        let s_max = got.last().map(|(s, _)| *s as u64 + 1).unwrap_or(0);
        let c_max = got
            .iter()
            .filter_map(|(_, r)| r.reply.map(|x| x.reflector_received as u64))
            .max()
            .unwrap_or(0)
            .min(s_max);
        let up_lost = s_max - c_max;
        let down_lost = s_max.saturating_sub(received).saturating_sub(up_lost);
        let unknown_dir = sent.saturating_sub(s_max);
        let pct = |a: u64, b: u64| if b > 0 { 100.0 * a as f64 / b as f64 } else { 0.0 };
        round_trip.lost = lost;
        round_trip.loss_pct = pct(lost, sent);
        send.lost = up_lost;
        send.loss_pct = pct(up_lost, s_max);
        receive.lost = down_lost;
        receive.loss_pct = pct(down_lost, c_max);

        // Reordering.
        round_trip.reordered = reordered(by_arrival.iter().map(|(s, _)| *s as i64));
        send.reordered = reordered(by_t2.iter().map(|(s, _)| *s as i64));
        receive.reordered = reordered(
            by_arrival
                .iter()
                .filter_map(|(_, r)| r.reply.map(|x| x.t2_ns.wrapping_add(x.hold_ns as u64) as i64)),
        );

        let late_after = late_after_ns.unwrap_or_else(|| self.default_late_after_ns());
        let late = got
            .iter()
            .filter(|(_, r)| r.rtt_ns().unwrap_or(0) > late_after as i64)
            .count() as u64;

        let mut rtts: Vec<i64> = got.iter().filter_map(|(_, r)| r.rtt_ns()).collect();
        rtts.sort_unstable();
        let mut holds: Vec<i64> = got
            .iter()
            .filter_map(|(_, r)| r.reply.map(|x| x.hold_ns as i64))
            .collect();

        ProbeSummary {
            sent,
            received,
            lost,
            loss_pct: pct(lost, sent),
            lost_direction_unknown: unknown_dir,
            duplicates: self.duplicates,
            late,
            late_after_ms: ms(late_after as f64),
            unknown_replies: self.unknown,
            refused_by_reflector: self.refused as u64,
            round_trip,
            send,
            receive,
            clock: ClockEstimate {
                offset_ms: ms(clock.theta as f64),
                skew_ppm: clock.skew * 1e6,
                one_way_delays_are_estimates: true,
                method: "skew: least squares through per-window minima; offset: minimum filter \
                         (min(t2-t1) - min(t4-t3)) / 2"
                    .to_string(),
            },
            reflector_hold: delay_stats(&mut holds),
            rtt_histogram: histogram(&rtts),
            kernel_timestamps: self.kernel,
            reflector_kernel_timestamps: self.reflector_kernel,
        }
    }

    /// Estimate the reflector's clock against ours from the replies: skew from the slope of
    /// the per-window minimum transits, then the offset by minimum filter.
    pub fn clock_model(&self) -> ClockModel {
        let got: Vec<&ProbeRecord> = self.records().iter().filter(|r| r.reply.is_some()).collect();
        let t0 = got.iter().map(|r| r.t1_ns).min().unwrap_or(0);
        let up: Vec<(u64, i64)> = got
            .iter()
            .filter_map(|r| Some((r.t1_ns, r.up_raw_ns()?)))
            .collect();
        let down: Vec<(u64, i64)> = got
            .iter()
            .filter_map(|r| Some((r.t1_ns, r.down_raw_ns()?)))
            .collect();
        let skew = match (min_envelope_slope(&up, t0), min_envelope_slope(&down, t0)) {
            (Some((a, sa)), Some((b, sb))) => {
                let skew = (a - b) / 2.0;
                let se = (sa * sa + sb * sb).sqrt() / 2.0;
                // Correct only a skew the data clearly shows; beyond 500 ppm it is not a
                // clock difference but a path change, and is left alone.
                if skew.abs() > 3.0 * se && skew.abs() <= 500e-6 {
                    skew
                } else {
                    0.0
                }
            }
            _ => 0.0,
        };
        let mut model = ClockModel { theta: 0, skew, t0 };
        let min_up = got.iter().filter_map(|r| model.up_deskewed(r)).min().unwrap_or(0);
        let min_down = got
            .iter()
            .filter_map(|r| model.down_deskewed(r))
            .min()
            .unwrap_or(0);
        model.theta = ((min_up as i128 - min_down as i128) / 2) as i64;
        model
    }

    /// The clock offset estimate (reflector minus sender at the first probe, ns).
    pub fn clock_offset_ns(&self) -> i64 {
        self.clock_model().theta
    }
}

/// The estimated relation between the reflector's clock and ours.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClockModel {
    /// Offset at `t0`, ns.
    pub theta: i64,
    /// Rate difference (reflector runs `skew` ns per ns faster).
    pub skew: f64,
    /// Our time of the first answered probe.
    pub t0: u64,
}

impl ClockModel {
    fn drift_ns(&self, r: &ProbeRecord) -> i64 {
        (self.skew * r.t1_ns.saturating_sub(self.t0) as f64) as i64
    }

    fn up_deskewed(&self, r: &ProbeRecord) -> Option<i64> {
        Some(r.up_raw_ns()?.saturating_sub(self.drift_ns(r)))
    }

    fn down_deskewed(&self, r: &ProbeRecord) -> Option<i64> {
        Some(r.down_raw_ns()?.saturating_add(self.drift_ns(r)))
    }

    /// Estimated one-way delay sender to reflector.
    pub fn send_ns(&self, r: &ProbeRecord) -> Option<i64> {
        Some(self.up_deskewed(r)?.saturating_sub(self.theta))
    }

    /// Estimated one-way delay reflector to sender.
    pub fn receive_ns(&self, r: &ProbeRecord) -> Option<i64> {
        Some(self.down_deskewed(r)?.saturating_add(self.theta))
    }
}

/// Slope (ns per ns) and its standard error of a least-squares line through the minimum
/// of each of sixteen time windows; `None` when the run is under 10 s (drift then stays
/// far below the jitter) or fewer than six windows have data.
fn min_envelope_slope(points: &[(u64, i64)], t0: u64) -> Option<(f64, f64)> {
    const WINDOWS: usize = 16;
    let end = points.iter().map(|p| p.0).max()?;
    let span = end.saturating_sub(t0);
    if span < 10_000_000_000 {
        return None;
    }
    let mut mins: [Option<(u64, i64)>; WINDOWS] = [None; WINDOWS];
    for &(t, v) in points {
        let w =
            ((t.saturating_sub(t0) as u128 * WINDOWS as u128 / (span as u128 + 1)) as usize).min(WINDOWS - 1);
        if !matches!(mins[w], Some((_, m)) if m <= v) {
            mins[w] = Some((t, v));
        }
    }
    let pts: Vec<(f64, f64)> = mins
        .iter()
        .flatten()
        .map(|(t, v)| (t.saturating_sub(t0) as f64, *v as f64))
        .collect();
    if pts.len() < 6 {
        return None;
    }
    let n = pts.len() as f64;
    let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
    let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = pts.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let rss: f64 = pts.iter().map(|p| (p.1 - my - slope * (p.0 - mx)).powi(2)).sum();
    let se = (rss / (n - 2.0) / sxx).sqrt();
    Some((slope, se))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn reply(seq: u32, t1: u64, t2: u64, hold: u32, received: u32) -> ProbeReply {
        ProbeReply {
            session: 1,
            seq,
            t1_ns: t1,
            t2_ns: t2,
            hold_ns: hold,
            received,
            refused: 0,
            reflector_kernel_ts: false,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    /// Reflector clock 100 ms ahead; up delays 10, 12, 11, lost, 10, 10 ms; down delays
    /// 10, 10, 14, –, lost, 10 ms; hold 1 ms. Every figure below is worked by hand.
    fn worked_example() -> ProbeStats {
        let mut s = ProbeStats::new(16);
        for seq in 0..6u32 {
            s.on_sent(seq, seq as u64 * 20 * MS);
        }
        // (seq, t1, t2, t4, reflector count)
        let rows = [
            (0u32, 0, 110, 21, 1),
            (1, 20, 132, 43, 2),
            (2, 40, 151, 66, 3),
            (5, 100, 210, 121, 5),
        ];
        for (seq, t1, t2, t4, c) in rows {
            let r = reply(seq, t1 * MS, t2 * MS, MS as u32, c);
            assert_eq!(s.on_reply(t4 * MS, &r, false), ReplyOutcome::First);
        }
        s
    }

    #[test]
    fn worked_example_round_trip() {
        let s = worked_example().summary(None);
        assert_eq!((s.sent, s.received, s.lost), (6, 4, 2));
        // RTTs 20, 22, 25, 20.
        let d = s.round_trip.delay;
        assert!(close(d.min_ms, 20.0) && close(d.max_ms, 25.0) && close(d.mean_ms, 21.75));
        assert!(
            close(d.median_ms, 20.0),
            "nearest rank of [20,20,22,25] at 0.5 is 20"
        );
        assert!(close(d.p95_ms, 25.0));
        // IPDV over consecutive pairs (0,1) and (1,2): +2, +3.
        let i = s.round_trip.ipdv;
        assert_eq!(i.pairs, 2);
        assert!(close(i.min_ms, 2.0) && close(i.max_ms, 3.0) && close(i.mean_abs_ms, 2.5));
        // PDV: 0, 2, 5, 0.
        assert!(close(s.round_trip.pdv.p99_ms, 5.0) && close(s.round_trip.pdv.mean_ms, 1.75));
        // RFC 3550: |2|/16 = 0.125; + (3 - 0.125)/16; + (5 - that)/16.
        let j1 = 2.0 / 16.0;
        let j2 = j1 + (3.0 - j1) / 16.0;
        let j3 = j2 + (5.0 - j2) / 16.0;
        assert!(
            close(s.round_trip.jitter_rfc3550_ms, j3),
            "{}",
            s.round_trip.jitter_rfc3550_ms
        );
        assert!(close(j3, 0.59814453125));
    }

    #[test]
    fn worked_example_one_way_and_loss_by_direction() {
        let s = worked_example().summary(None);
        assert!(close(s.clock.offset_ms, 100.0));
        let up = s.send.delay;
        assert!(close(up.min_ms, 10.0) && close(up.max_ms, 12.0) && close(up.mean_ms, 10.75));
        let down = s.receive.delay;
        assert!(close(down.min_ms, 10.0) && close(down.max_ms, 14.0) && close(down.mean_ms, 11.0));
        // Send IPDV +2, -1; receive IPDV 0, +4.
        assert!(close(s.send.ipdv.min_ms, -1.0) && close(s.send.ipdv.max_ms, 2.0));
        assert!(close(s.receive.ipdv.max_ms, 4.0) && close(s.receive.ipdv.mean_abs_ms, 2.0));
        // Seq 3 never reached the reflector (count 5 after seq 5), seq 4 did but its reply
        // was lost.
        assert_eq!((s.send.lost, s.receive.lost, s.lost_direction_unknown), (1, 1, 0));
        assert!(close(s.send.loss_pct, 100.0 / 6.0) && close(s.receive.loss_pct, 20.0));
    }

    #[test]
    fn duplicates_reordering_late_and_unknown() {
        let mut s = ProbeStats::new(8);
        for seq in 0..5u32 {
            s.on_sent(seq, seq as u64 * MS);
        }
        let r = |seq: u32, c: u32| reply(seq, seq as u64 * MS, seq as u64 * MS + 5 * MS, 0, c);
        // Up order 0,2,1 (reflector counts 1,2,3), then 3 and 4 (4 and 5).
        assert_eq!(s.on_reply(10 * MS, &r(0, 1), true), ReplyOutcome::First);
        assert_eq!(s.on_reply(12 * MS, &r(2, 2), true), ReplyOutcome::First);
        assert_eq!(s.on_reply(13 * MS, &r(1, 3), true), ReplyOutcome::First);
        assert_eq!(s.on_reply(14 * MS, &r(1, 3), true), ReplyOutcome::Duplicate);
        assert_eq!(s.on_reply(2000 * MS, &r(3, 4), false), ReplyOutcome::First);
        assert_eq!(s.on_reply(20 * MS, &r(9, 9), false), ReplyOutcome::Unknown);
        let mut forged = r(4, 5);
        forged.t1_ns += 1;
        assert_eq!(s.on_reply(20 * MS, &forged, false), ReplyOutcome::Unknown);
        let sum = s.summary(None);
        assert_eq!(sum.duplicates, 1);
        assert_eq!(sum.round_trip.reordered, 1);
        assert_eq!(sum.unknown_replies, 2);
        assert_eq!(sum.late, 1, "2 s round trip is past the 1 s floor");
        assert_eq!(sum.kernel_timestamps, 3);
        assert_eq!((sum.lost, sum.lost_direction_unknown), (1, 1));
    }

    #[test]
    fn nearest_rank_and_histogram() {
        let v: Vec<i64> = (1..=1000).collect();
        assert_eq!(nearest_rank(&v, 0.99), 990);
        assert_eq!(nearest_rank(&v, 0.999), 999);
        assert_eq!(nearest_rank(&v, 0.5), 500);
        assert_eq!(nearest_rank(&[7], 0.0), 7);
        let ns: Vec<i64> = (0..100).map(|i| 20 * MS as i64 + i * 10_000).collect();
        let h = histogram(&ns);
        assert_eq!(h.iter().map(|b| b.count).sum::<u64>(), 100);
        assert!(h.len() <= 31 && h[0].lo_ms <= 20.0);
    }

    /// Reflector clock 50 ppm fast and 100 ms ahead; 10 ms each way plus up to 1 ms of
    /// uniform jitter, over 20 s. Without skew correction the drift (1 ms over the run)
    /// would double the one-way PDV.
    #[test]
    fn clock_skew_is_estimated_and_removed() {
        let skew = 50e-6;
        let mut rng = crate::rng::SimRng::new(5);
        let mut s = ProbeStats::new(2000);
        for seq in 0..2000u32 {
            let t1 = 1_000 * MS + seq as u64 * 10 * MS;
            let up = 10.0 * MS as f64 + rng.uniform(0.0, 1.0) * MS as f64;
            let down = 10.0 * MS as f64 + rng.uniform(0.0, 1.0) * MS as f64;
            let reflector = |t: f64| (t * (1.0 + skew) + 100.0 * MS as f64) as u64;
            let t2 = reflector(t1 as f64 + up);
            let t4 = (t1 as f64 + up + 0.5 * MS as f64 + down) as u64;
            s.on_sent(seq, t1);
            let hold = (0.5 * MS as f64 * (1.0 + skew)) as u32;
            s.on_reply(t4, &reply(seq, t1, t2, hold, seq + 1), false);
        }
        let sum = s.summary(None);
        assert!(
            (sum.clock.skew_ppm - 50.0).abs() < 3.0,
            "skew {}",
            sum.clock.skew_ppm
        );
        for p in [&sum.send, &sum.receive] {
            assert!(p.pdv.p99_ms < 1.1, "PDV p99 {} ms", p.pdv.p99_ms);
            assert!((p.delay.min_ms - 10.0).abs() < 0.2, "min {}", p.delay.min_ms);
        }
        // Round trip is unaffected either way: 20 to 22 ms.
        assert!(sum.round_trip.delay.min_ms >= 19.9 && sum.round_trip.delay.max_ms <= 22.1);
    }

    /// Same clock on both sides, heavy normal jitter: no skew is invented.
    #[test]
    fn jitter_alone_does_not_look_like_skew() {
        let mut rng = crate::rng::SimRng::new(8);
        let mut s = ProbeStats::new(15_000);
        for seq in 0..15_000u32 {
            let t1 = seq as u64 * MS;
            let up = (19.0 + 1.5 * rng.normal()).max(0.0) * MS as f64;
            let down = (19.0 + 1.5 * rng.normal()).max(0.0) * MS as f64;
            let t2 = t1 + up as u64;
            let t4 = t2 + down as u64;
            s.on_sent(seq, t1);
            s.on_reply(t4, &reply(seq, t1, t2, 0, seq + 1), false);
        }
        let sum = s.summary(None);
        assert!(sum.clock.skew_ppm.abs() < 20.0, "skew {}", sum.clock.skew_ppm);
    }

    #[test]
    fn arbitrary_replies_never_panic() {
        let mut rng = crate::rng::SimRng::new(99);
        let mut s = ProbeStats::new(64);
        for i in 0..5000u64 {
            let pick = |r: &mut crate::rng::SimRng| match r.next_u64() % 4 {
                0 => 0,
                1 => u64::MAX,
                2 => i64::MAX as u64 + 1,
                _ => r.next_u64(),
            };
            let seq = (rng.next_u64() % 80) as u32;
            if i % 2 == 0 {
                s.on_sent(seq, pick(&mut rng));
            }
            let r = ProbeReply {
                session: 1,
                seq,
                t1_ns: pick(&mut rng),
                t2_ns: pick(&mut rng),
                hold_ns: rng.next_u64() as u32,
                received: rng.next_u64() as u32,
                refused: rng.next_u64() as u16,
                reflector_kernel_ts: false,
            };
            s.on_reply(pick(&mut rng), &r, false);
        }
        let _ = s.live();
        let _ = s.summary(None);
    }

    #[test]
    fn empty_and_out_of_range_input_is_harmless() {
        let mut s = ProbeStats::new(2);
        let sum = s.summary(None);
        assert_eq!(sum.sent, 0);
        s.on_sent(u32::MAX, 1);
        assert_eq!(
            s.on_reply(0, &reply(u32::MAX, 1, 0, u32::MAX, u32::MAX), false),
            ReplyOutcome::Unknown
        );
        s.on_sent(0, u64::MAX);
        s.on_reply(0, &reply(0, u64::MAX, 0, u32::MAX, u32::MAX), false);
        let _ = s.summary(Some(0));
    }
}
