//! Audio endpoints: where frames come from and go to.
//!
//! An [`Endpoint`] owns a clock and calls a [`Process`] once per period with the frames it
//! captured and a buffer for the frames to play — exactly the shape of a sound-card
//! callback. Sound devices (JACK, ALSA, CoreAudio, WASAPI) implement [`Endpoint`] the same
//! way, so the engine never knows what is on the other side. Files, pipes and synthetic
//! sources are driven by [`paced::PacedEndpoint`], which stands in for a device clock by
//! waking on absolute deadlines, so they play in real time rather than as fast as possible.
//!
//! [`Process::process`] runs on the audio thread: it must not allocate, lock or block.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub mod card;
pub mod channels;
#[cfg(feature = "cpal")]
pub mod cpal;
pub mod jack;
pub mod paced;
pub mod raw;
pub mod synth;
pub mod wav;

/// Sample rate, channel count and period of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamSpec {
    pub rate: u32,
    /// Channels captured (0 when the endpoint captures nothing).
    pub input_channels: u16,
    /// Channels played (0 when the endpoint plays nothing).
    pub output_channels: u16,
    /// Frames per callback.
    pub period: u32,
}

/// The realtime side of a stream, called once per period.
pub trait Process: Send {
    /// `input` holds `period × input_channels` captured samples and `output` takes
    /// `period × output_channels` samples to play, both interleaved in [-1, 1].
    /// `now_ns` is the period's start on the monotonic clock. Must not allocate, lock or block.
    fn process(&mut self, now_ns: u64, input: &[f32], output: &mut [f32]);

    /// The device skipped `frames` frames since the last period (a server that dropped
    /// cycles): nothing was captured or played for them. Called before the next
    /// [`Self::process`]; the same realtime rules apply.
    fn skipped(&mut self, frames: u64) {
        let _ = frames;
    }

    /// Fill the extra output ports the endpoint offers besides `output` (JACK's per-member
    /// ports), called right after [`Self::process`] in the same period: `outputs` holds
    /// `outputs.len() / frames` ports of `frames` samples each, one port after the other.
    /// Only endpoints that registered such ports call it. The default plays silence. The
    /// same realtime rules apply.
    fn extra_outputs(&mut self, frames: usize, outputs: &mut [f32]) {
        let _ = frames;
        outputs.fill(0.0);
    }
}

/// Why an endpoint stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The input ran out (end of file or pipe).
    EndOfInput,
    /// Someone set the stop flag (a duration elapsed, Ctrl-C).
    Stopped,
}

/// Buckets of [`PeriodStats::callback_histogram`]: bucket k counts callbacks that took
/// less than 2^k µs (the last bucket takes the rest).
pub const HISTOGRAM_BUCKETS: usize = 16;

/// Whether an endpoint's callback thread runs at realtime priority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Realtime {
    /// SCHED_FIFO or SCHED_RR at this priority.
    Yes { priority: i32 },
    /// An ordinary time-shared thread; `advice` says how to get realtime rights.
    No { advice: &'static str },
    /// A thread the platform's audio system schedules itself (CoreAudio, WASAPI, JACK on
    /// Windows), whose policy netjam neither sets nor reads; `what` says what it gets.
    System { what: &'static str },
    /// The first callback has not run yet.
    Unknown,
}

impl Realtime {
    /// From the scheduling `policy` and `priority` a callback saw (`policy` < 0: not yet).
    pub fn from_policy(policy: i32, priority: i32, advice: &'static str) -> Self {
        #[cfg(unix)]
        let fifo_or_rr = policy == libc::SCHED_FIFO || policy == libc::SCHED_RR;
        #[cfg(not(unix))]
        let fifo_or_rr = false;
        if policy < 0 {
            Realtime::Unknown
        } else if fifo_or_rr {
            Realtime::Yes { priority }
        } else {
            Realtime::No { advice }
        }
    }
}

impl std::fmt::Display for Realtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Realtime::Yes { priority } => write!(f, "realtime (priority {priority})"),
            Realtime::No { advice } => write!(f, "NOT realtime ({advice})"),
            Realtime::System { what } => write!(f, "{what}"),
            Realtime::Unknown => write!(f, "realtime: not known yet"),
        }
    }
}

/// Timing of the periods an endpoint ran, as a realtime OS would report it.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct PeriodStats {
    pub periods: u64,
    /// Periods whose callback started later than a whole period after its deadline.
    pub missed_deadlines: u64,
    /// Lateness of the callback's start, µs: mean, standard deviation, worst.
    pub wake_late_mean_us: f64,
    pub wake_late_std_us: f64,
    pub wake_late_max_us: f64,
    /// Time spent in `process`, µs: mean, standard deviation, worst.
    pub callback_mean_us: f64,
    pub callback_std_us: f64,
    pub callback_max_us: f64,
    /// Callback durations in power-of-two µs buckets.
    pub callback_histogram: [u64; HISTOGRAM_BUCKETS],
    /// Whether the audio thread ran under realtime scheduling.
    pub realtime: bool,
    /// The last periods whose callback started more than a period late, oldest first, so
    /// a glitch heard at a moment can be matched with the thread that missed it.
    pub late_wakes: LateWakes,
}

/// One callback that started more than a period after its deadline.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct LateWake {
    /// Which period (0 = the first), so `period × frames` is where in the stream it fell.
    pub period: u64,
    pub late_us: f64,
}

/// The last [`LATE_WAKES`] late callbacks, in a fixed array (no allocation on the audio
/// thread); serialized oldest first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LateWakes {
    log: [LateWake; LATE_WAKES],
    /// How many were recorded in all (the log keeps the last [`LATE_WAKES`]).
    total: u64,
}

/// How many late callbacks [`LateWakes`] keeps.
pub const LATE_WAKES: usize = 64;

impl Default for LateWakes {
    fn default() -> Self {
        Self {
            log: [LateWake::default(); LATE_WAKES],
            total: 0,
        }
    }
}

impl LateWakes {
    fn push(&mut self, w: LateWake) {
        self.log[(self.total % LATE_WAKES as u64) as usize] = w;
        self.total += 1;
    }

    /// The kept late callbacks, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &LateWake> {
        let kept = self.total.min(LATE_WAKES as u64) as usize;
        let first = (self.total as usize).wrapping_sub(kept);
        (0..kept).map(move |i| &self.log[(first + i) % LATE_WAKES])
    }
}

impl serde::Serialize for LateWakes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// Accumulates [`PeriodStats`] without allocating (for endpoints' callback threads).
#[derive(Debug, Default, Clone, Copy)]
pub struct PeriodTimer {
    stats: PeriodStats,
    late_sum: f64,
    late_sq: f64,
    cb_sum: f64,
    cb_sq: f64,
}

impl PeriodTimer {
    /// Record one period: how late it started and how long `process` took, in ns, against
    /// a period of `period_ns`.
    pub fn record(&mut self, late_ns: u64, took_ns: u64, period_ns: u64) {
        let s = &mut self.stats;
        s.periods += 1;
        if late_ns > period_ns || took_ns > period_ns {
            s.missed_deadlines += 1;
        }
        if late_ns > period_ns {
            s.late_wakes.push(LateWake {
                period: s.periods - 1,
                late_us: late_ns as f64 / 1e3,
            });
        }
        let (late, took) = (late_ns as f64 / 1e3, took_ns as f64 / 1e3);
        self.late_sum += late;
        self.late_sq += late * late;
        self.cb_sum += took;
        self.cb_sq += took * took;
        s.wake_late_max_us = s.wake_late_max_us.max(late);
        s.callback_max_us = s.callback_max_us.max(took);
        let bucket = (64 - (took_ns / 1000).leading_zeros() as usize).min(HISTOGRAM_BUCKETS - 1);
        s.callback_histogram[bucket] += 1;
    }

    pub fn set_realtime(&mut self, realtime: bool) {
        self.stats.realtime = realtime;
    }

    /// The figures so far.
    pub fn stats(&self) -> PeriodStats {
        let mut s = self.stats;
        let n = s.periods.max(1) as f64;
        let std = |sum: f64, sq: f64| (sq / n - (sum / n).powi(2)).max(0.0).sqrt();
        s.wake_late_mean_us = self.late_sum / n;
        s.wake_late_std_us = std(self.late_sum, self.late_sq);
        s.callback_mean_us = self.cb_sum / n;
        s.callback_std_us = std(self.cb_sum, self.cb_sq);
        s
    }
}

/// A clocked audio endpoint (see the module docs).
pub trait Endpoint: Send {
    fn spec(&self) -> StreamSpec;
    /// Call `process` once per period until the input ends or `stop` is set; blocks.
    fn run(
        self: Box<Self>,
        process: &mut dyn Process,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<(StopReason, PeriodStats)>;
}

/// A non-realtime source of frames for [`paced::PacedEndpoint`].
pub trait FrameSource: Send {
    fn rate(&self) -> u32;
    fn channels(&self) -> u16;
    /// Fill `out` with whole frames; return the frames written (0 at the end).
    fn read(&mut self, out: &mut [f32]) -> anyhow::Result<usize>;
}

/// A non-realtime sink of frames for [`paced::PacedEndpoint`].
pub trait FrameSink: Send {
    fn write(&mut self, frames: &[f32]) -> anyhow::Result<()>;
    /// Flush and close (e.g. write a WAV header's final sizes).
    fn finish(&mut self) -> anyhow::Result<()>;
}

/// How raw PCM samples are laid out on stdin/stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SampleFormat {
    /// Signed 16-bit little-endian (sox: -e signed -b 16 -L).
    S16le,
    /// Signed 24-bit little-endian, packed in 3 bytes.
    S24le,
    /// Signed 32-bit little-endian.
    S32le,
    /// 32-bit float little-endian.
    F32le,
}

impl SampleFormat {
    pub fn bytes(self) -> usize {
        match self {
            SampleFormat::S16le => 2,
            SampleFormat::S24le => 3,
            SampleFormat::S32le | SampleFormat::F32le => 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_wakes_keep_the_last_ones_oldest_first() {
        let mut t = PeriodTimer::default();
        let period = 1_333_333;
        for i in 0..200u64 {
            // Every third period wakes two periods late; the others on time.
            let late = if i % 3 == 0 { 2 * period } else { 1000 };
            t.record(late, 10_000, period);
        }
        let s = t.stats();
        assert_eq!(s.missed_deadlines, 67);
        let kept: Vec<u64> = s.late_wakes.iter().map(|w| w.period).collect();
        assert_eq!(kept.len(), LATE_WAKES);
        assert_eq!(kept.first(), Some(&(3 * (67 - LATE_WAKES as u64))));
        assert_eq!(kept.last(), Some(&198));
        assert!(kept.windows(2).all(|w| w[1] == w[0] + 3));
        let json = serde_json::to_value(s).expect("json");
        assert_eq!(json["late_wakes"][0]["late_us"], 2.0 * period as f64 / 1e3);
    }
}
