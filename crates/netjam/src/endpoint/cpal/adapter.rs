//! The pieces between a sound card's callbacks and netjam's [`Process`](super::super::Process): sample conversion,
//! the [`PeriodAdapter`] (callbacks of any size to periods of exactly `period` frames), the
//! [`InputBridge`] (input callback to output callback through a lock-free ring) and the
//! [`CallbackClock`] (callback wake-ups to a steady schedule). Plain state machines with no
//! device in sight, so their tests feed them callbacks of any size; everything they hold is
//! reserved at construction, and they never allocate, lock, block or log.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::super::channels::{ChannelMap, MapSide};

// ---------------------------------------------------------------------------------------
// Sample conversion

/// A device sample type the endpoint converts to and from f32 in [-1, 1].
pub trait DeviceSample: cpal::SizedSample + Send + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl DeviceSample for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl DeviceSample for i16 {
    fn to_f32(self) -> f32 {
        self as f32 / 32_768.0
    }
    fn from_f32(x: f32) -> Self {
        (x * 32_768.0).round().clamp(-32_768.0, 32_767.0) as i16
    }
}

impl DeviceSample for i32 {
    fn to_f32(self) -> f32 {
        (self as f64 / 2_147_483_648.0) as f32
    }
    fn from_f32(x: f32) -> Self {
        (x as f64 * 2_147_483_648.0)
            .round()
            .clamp(-2_147_483_648.0, 2_147_483_647.0) as i32
    }
}

// ---------------------------------------------------------------------------------------
// Period adapter

/// How much latency a [`PeriodAdapter`] adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdapterLatency {
    /// Learn it from the first callback of n frames: `period - gcd(n, period)`, which is
    /// exactly enough while callbacks keep that size (0 when n is a multiple of the period).
    /// If a callback of another size then finds too little processed audio, the shortfall
    /// is played as silence and added to the latency, which never exceeds `period - 1`.
    Learn,
    /// This many frames from the start; `period - 1` or more never runs short.
    Frames(usize),
}

/// Runs a period-sized process over callbacks of any size (see the module docs).
///
/// Output frame `k` of the callbacks is the process's output frame `k - latency_frames()`;
/// the first `latency_frames()` frames are silence. All memory is reserved by [`Self::new`].
#[derive(Debug)]
pub struct PeriodAdapter {
    period: usize,
    in_channels: usize,
    out_channels: usize,
    /// The period being gathered, and how many frames of it are in.
    input: Vec<f32>,
    filled: usize,
    /// Where the process writes one period.
    output: Vec<f32>,
    /// Processed frames not played yet, oldest first.
    fifo: Vec<f32>,
    queued: usize,
    mode: AdapterLatency,
    latency: usize,
    started: bool,
    underruns: u64,
}

pub(super) fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl PeriodAdapter {
    pub fn new(period: usize, in_channels: usize, out_channels: usize, mode: AdapterLatency) -> Self {
        let period = period.max(1);
        let most = match mode {
            AdapterLatency::Learn => period - 1,
            AdapterLatency::Frames(n) => n.max(period - 1),
        };
        Self {
            period,
            in_channels,
            out_channels,
            input: vec![0.0; period * in_channels],
            filled: 0,
            output: vec![0.0; period * out_channels],
            fifo: vec![0.0; (most + period) * out_channels],
            queued: 0,
            mode,
            latency: 0,
            started: false,
            underruns: 0,
        }
    }

    /// Frames between a process output frame and the callback frame that plays it.
    pub fn latency_frames(&self) -> usize {
        self.latency
    }

    /// Callbacks that found too little processed audio (each added its shortfall to the latency).
    pub fn underruns(&self) -> u64 {
        self.underruns
    }

    /// One device callback of `frames` frames: `input` holds `frames × in_channels` samples
    /// and `output` takes `frames × out_channels`. `run(first, input, output)` is called for
    /// each complete period, where `first` is the index in this callback's input of the
    /// period's first frame (negative when it began in an earlier callback).
    pub fn callback(
        &mut self,
        frames: usize,
        input: &[f32],
        output: &mut [f32],
        mut run: impl FnMut(i64, &[f32], &mut [f32]),
    ) {
        let (ci, co, p) = (self.in_channels, self.out_channels, self.period);
        debug_assert_eq!(input.len(), frames * ci);
        debug_assert_eq!(output.len(), frames * co);
        if !self.started {
            self.started = true;
            self.latency = match self.mode {
                AdapterLatency::Learn if frames > 0 => p - gcd(frames, p),
                AdapterLatency::Learn => p - 1,
                AdapterLatency::Frames(n) => n,
            };
            self.fifo[..self.latency * co].fill(0.0);
            self.queued = self.latency;
        }
        let (mut done_in, mut done_out) = (0, 0);
        loop {
            done_out += self.drain(&mut output[done_out * co..]);
            if done_in == frames {
                break;
            }
            let take = (p - self.filled).min(frames - done_in);
            self.input[self.filled * ci..(self.filled + take) * ci]
                .copy_from_slice(&input[done_in * ci..(done_in + take) * ci]);
            self.filled += take;
            done_in += take;
            if self.filled == p {
                self.filled = 0;
                run(done_in as i64 - p as i64, &self.input, &mut self.output);
                let at = self.queued * co;
                self.fifo[at..at + p * co].copy_from_slice(&self.output);
                self.queued += p;
            }
        }
        if done_out < frames {
            output[done_out * co..].fill(0.0);
            self.latency += frames - done_out;
            self.underruns += 1;
        }
    }

    /// Move queued frames to `out` (as many as fit); returns the frames moved.
    pub(super) fn drain(&mut self, out: &mut [f32]) -> usize {
        let co = self.out_channels;
        let room = out.len().checked_div(co).unwrap_or(usize::MAX);
        let n = self.queued.min(room);
        if n == 0 {
            return 0;
        }
        out[..n * co].copy_from_slice(&self.fifo[..n * co]);
        self.fifo.copy_within(n * co..self.queued * co, 0);
        self.queued -= n;
        n
    }
}

// ---------------------------------------------------------------------------------------
// Input bridge

/// What the input callback reports to the bridge, shared through atomics.
#[derive(Debug, Default)]
pub struct InputCounters {
    /// The largest input callback seen, in frames.
    pub max_block: AtomicUsize,
    /// Input callbacks whose frames did not all fit in the ring (the excess was dropped).
    pub overflows: AtomicU64,
}

/// The input callback's end of the bridge: converts and pushes, never blocks.
#[derive(Debug)]
pub struct InputFeeder {
    ring: rtrb::Producer<f32>,
    channels: usize,
    /// The device's channels a frame and the ones the stream takes (all, in order, by default).
    device_channels: usize,
    map: ChannelMap,
    counters: Arc<InputCounters>,
}

impl InputFeeder {
    /// Take the channels `map` picks out of `device_channels`-channel device frames (the
    /// map's length must be the bridge's channels).
    pub fn with_map(mut self, map: ChannelMap, device_channels: usize) -> Self {
        debug_assert_eq!(map.len(), self.channels);
        self.map = map;
        self.device_channels = device_channels;
        self
    }

    /// Push one callback's interleaved samples (whole device frames).
    pub fn push<T: DeviceSample>(&mut self, data: &[T]) {
        let frames = data.len() / self.device_channels.max(1);
        self.counters.max_block.fetch_max(frames, Ordering::Relaxed);
        let fit = (self.ring.slots() / self.channels.max(1)).min(frames);
        if fit < frames {
            self.counters.overflows.fetch_add(1, Ordering::Relaxed);
        }
        let data = &data[..fit * self.device_channels];
        if let Ok(chunk) = self.ring.write_chunk_uninit(fit * self.channels) {
            chunk.fill_from_iter(
                self.map
                    .gathered(data, self.device_channels, T::EQUILIBRIUM)
                    .map(|x| x.to_f32()),
            );
        }
    }
}

/// The output callback's end of the bridge (see the module docs).
#[derive(Debug)]
pub struct InputBridge {
    ring: rtrb::Consumer<f32>,
    channels: usize,
    counters: Arc<InputCounters>,
    priming: bool,
    /// Extra cushion learned from underruns, frames.
    extra: usize,
    /// The level the bridge settles at when it starts, frames.
    target: usize,
    underruns: u64,
    dropped: u64,
    /// Pulls served since the bridge first primed.
    pulls: u64,
}

/// Pulls after the first priming during which an underrun is the playback stream's start-up
/// burst rather than a cushion too small.
pub(super) const STARTUP_PULLS: u64 = 8;

impl InputBridge {
    /// A bridge for `channels`-channel frames and its feeder, with room for `capacity` frames.
    pub fn new(channels: usize, capacity: usize) -> (InputFeeder, Self) {
        let (tx, rx) = rtrb::RingBuffer::new(capacity * channels.max(1));
        let counters = Arc::new(InputCounters::default());
        let feeder = InputFeeder {
            ring: tx,
            channels,
            device_channels: channels,
            map: ChannelMap::identity(MapSide::Inputs, channels as u16),
            counters: counters.clone(),
        };
        let bridge = Self {
            ring: rx,
            channels,
            counters,
            priming: true,
            extra: 0,
            target: 0,
            underruns: 0,
            dropped: 0,
            pulls: 0,
        };
        (feeder, bridge)
    }

    /// Frames waiting in the ring.
    pub fn level(&self) -> usize {
        self.ring.slots() / self.channels.max(1)
    }

    /// The cushion the bridge keeps, in frames: its share of the round trip through the device.
    pub fn target(&self) -> usize {
        self.target
    }

    /// Pulls that found too few frames (played as silence, then the cushion grew).
    pub fn underruns(&self) -> u64 {
        self.underruns
    }

    /// Frames thrown away to bring the level back to the cushion (clock drift between
    /// two devices, or a stalled output thread).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Fill `dst` (whole frames) with the oldest captured frames, or silence while priming.
    pub fn pull(&mut self, dst: &mut [f32]) {
        let ch = self.channels.max(1);
        let n = dst.len() / ch;
        let block = self.counters.max_block.load(Ordering::Relaxed);
        let capacity = self.ring.buffer().capacity() / ch;
        let threshold = (n + block + self.extra).min(capacity.saturating_sub(n));
        let level = self.level();
        if self.priming {
            if block == 0 || level < threshold {
                dst.fill(0.0);
                return;
            }
            self.skip(level - threshold);
            self.target = threshold;
            self.priming = false;
        } else if level < n {
            self.read(&mut dst[..level * ch]);
            dst[level * ch..].fill(0.0);
            // A playback stream starts by filling its whole buffer in a burst of callbacks,
            // which empties the ring once; only later underruns mean the cushion is too small.
            if self.pulls >= STARTUP_PULLS {
                self.underruns += 1;
                self.extra = (self.extra + n - level).min(capacity / 4);
            }
            self.priming = true;
            return;
        } else if level > threshold + 2 * n.max(block) {
            let excess = level - threshold;
            self.skip(excess);
            self.dropped += excess as u64;
        }
        self.pulls += 1;
        self.read(dst);
    }

    pub(super) fn read(&mut self, dst: &mut [f32]) {
        if let Ok(chunk) = self.ring.read_chunk(dst.len()) {
            let (a, b) = chunk.as_slices();
            dst[..a.len()].copy_from_slice(a);
            dst[a.len()..].copy_from_slice(b);
            chunk.commit_all();
        }
    }

    pub(super) fn skip(&mut self, frames: usize) {
        if let Ok(chunk) = self.ring.read_chunk(frames * self.channels.max(1)) {
            chunk.commit_all();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Callback clock

/// Turns callback wake-ups into a steady schedule: each callback is expected a whole
/// buffer after the previous one. An early callback re-anchors the schedule; a late one
/// pulls it forward by 1/64 of its lateness, so a device clock slower than the monotonic
/// clock is followed instead of counting as ever later.
#[derive(Debug, Clone, Copy)]
pub struct CallbackClock {
    rate: u32,
    anchor_ns: u64,
    anchor_frames: u64,
    frames: u64,
    started: bool,
}

impl CallbackClock {
    pub fn new(rate: u32) -> Self {
        Self {
            rate,
            anchor_ns: 0,
            anchor_frames: 0,
            frames: 0,
            started: false,
        }
    }

    /// A callback of `frames` frames woke at `woke_ns`: returns when it was due and how late
    /// it woke, ns.
    pub fn tick(&mut self, woke_ns: u64, frames: usize) -> (u64, u64) {
        let due = if self.started {
            self.anchor_ns + netjam_engine::time::frames_to_ns(self.frames - self.anchor_frames, self.rate)
        } else {
            woke_ns
        };
        self.started = true;
        let result = if woke_ns <= due {
            self.anchor_ns = woke_ns;
            self.anchor_frames = self.frames;
            (woke_ns, 0)
        } else {
            let late = woke_ns - due;
            self.anchor_ns += late / 64;
            (due, late)
        };
        self.frames += frames as u64;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distinct, exactly representable samples: frame f, channel c of a stream.
    fn sample(f: usize, c: usize) -> f32 {
        ((f * 7 + c * 3) % 65_536) as f32 / 65_536.0 - 0.5
    }

    fn frames(from: usize, n: usize, ch: usize) -> Vec<f32> {
        (from..from + n)
            .flat_map(|f| (0..ch).map(move |c| sample(f, c)))
            .collect()
    }

    /// A small deterministic generator for callback sizes.
    fn sizes(seed: u64, count: usize, most: usize) -> Vec<usize> {
        let mut x = seed;
        (0..count)
            .map(|_| {
                x = x
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                1 + (x >> 33) as usize % most
            })
            .collect()
    }

    /// Push the stream through `adapter` in callbacks of `sizes`, with a process that copies
    /// input to output and checks each period's first-frame index. Returns the output.
    fn run_adapter(adapter: &mut PeriodAdapter, sizes: &[usize], ch: usize, period: usize) -> Vec<f32> {
        let mut out_all = Vec::new();
        let mut at = 0;
        let mut periods = 0;
        for &n in sizes {
            let input = frames(at, n, ch);
            let mut output = vec![f32::NAN; n * ch];
            adapter.callback(n, &input, &mut output, |first, i, o| {
                // The period starts where the stream is a whole number of periods in.
                assert_eq!(at as i64 + first, (periods * period) as i64);
                assert_eq!(i.len(), period * ch);
                o.copy_from_slice(i);
                periods += 1;
            });
            at += n;
            out_all.extend_from_slice(&output);
        }
        assert_eq!(periods, at / period, "every complete period ran once");
        out_all
    }

    fn assert_delayed(out: &[f32], ch: usize, latency: usize) {
        let total = out.len() / ch;
        for f in 0..total {
            for c in 0..ch {
                let want = if f < latency { 0.0 } else { sample(f - latency, c) };
                assert_eq!(
                    out[f * ch + c].to_bits(),
                    want.to_bits(),
                    "frame {f} channel {c} with latency {latency}"
                );
            }
        }
    }

    #[test]
    fn constant_callback_sizes_pass_through_bit_exact_with_the_stated_latency() {
        for period in [16, 64, 96] {
            for n in 1..=3 * period {
                let mut a = PeriodAdapter::new(period, 2, 2, AdapterLatency::Learn);
                let out = run_adapter(&mut a, &vec![n; 40.max(4 * period / n)], 2, period);
                let latency = period - gcd(n, period);
                assert_eq!(a.latency_frames(), latency, "period {period}, callbacks of {n}");
                assert_eq!(a.underruns(), 0, "period {period}, callbacks of {n}");
                assert_delayed(&out, 2, latency);
            }
        }
    }

    #[test]
    fn whole_periods_add_no_latency() {
        let mut a = PeriodAdapter::new(64, 1, 1, AdapterLatency::Learn);
        let out = run_adapter(&mut a, &[128; 10], 1, 64);
        assert_eq!(a.latency_frames(), 0);
        assert_delayed(&out, 1, 0);
    }

    #[test]
    fn odd_callback_sizes_never_run_short_with_a_period_less_one() {
        for seed in 1..20 {
            let period = 64;
            let sizes = sizes(seed, 300, 3 * period);
            let mut a = PeriodAdapter::new(period, 2, 3, AdapterLatency::Frames(period - 1));
            // Two input channels, three output channels: the process writes channel 2 as 0.
            let mut at = 0;
            let mut out = Vec::new();
            for &n in &sizes {
                let input = frames(at, n, 2);
                let mut output = vec![f32::NAN; n * 3];
                a.callback(n, &input, &mut output, |_, i, o| {
                    for (f, frame) in o.chunks_mut(3).enumerate() {
                        frame[0] = i[f * 2];
                        frame[1] = i[f * 2 + 1];
                        frame[2] = 0.0;
                    }
                });
                at += n;
                out.extend_from_slice(&output);
            }
            assert_eq!(a.underruns(), 0, "seed {seed}");
            assert_eq!(a.latency_frames(), period - 1);
            for f in 0..at {
                for c in 0..2 {
                    let want = if f < period - 1 {
                        0.0
                    } else {
                        sample(f - (period - 1), c)
                    };
                    assert_eq!(out[f * 3 + c].to_bits(), want.to_bits(), "seed {seed} frame {f}");
                }
                assert_eq!(out[f * 3 + 2], 0.0);
            }
        }
    }

    #[test]
    fn learned_latency_grows_only_as_needed_and_stays_exact_after() {
        for seed in 1..20 {
            let period = 48;
            let sizes = sizes(seed, 400, 3 * period);
            let mut a = PeriodAdapter::new(period, 1, 1, AdapterLatency::Learn);
            let mut at = 0;
            let mut out = Vec::new();
            let mut last_change = 0;
            let mut latency = None;
            for &n in &sizes {
                let input = frames(at, n, 1);
                let mut output = vec![f32::NAN; n];
                a.callback(n, &input, &mut output, |_, i, o| o.copy_from_slice(i));
                if latency != Some(a.latency_frames()) {
                    latency = Some(a.latency_frames());
                    last_change = at + n;
                }
                at += n;
                out.extend_from_slice(&output);
            }
            let latency = a.latency_frames();
            assert!(latency < period, "seed {seed}: latency {latency}");
            // After the last time it grew, output is input delayed by the final latency.
            for (f, x) in out.iter().enumerate().skip(last_change) {
                let want = if f < latency { 0.0 } else { sample(f - latency, 0) };
                assert_eq!(x.to_bits(), want.to_bits(), "seed {seed} frame {f}");
            }
        }
    }

    #[test]
    fn one_sided_adapters_run_every_period() {
        let mut periods = 0;
        let mut a = PeriodAdapter::new(64, 0, 2, AdapterLatency::Learn);
        for n in [100, 28, 64, 1, 63] {
            let mut out = vec![f32::NAN; n * 2];
            a.callback(n, &[], &mut out, |_, i, o| {
                assert!(i.is_empty());
                o.fill(0.25);
                periods += 1;
            });
            assert!(out.iter().all(|x| *x == 0.0 || *x == 0.25));
        }
        assert_eq!(periods, 256 / 64);
        let mut seen = Vec::new();
        let mut a = PeriodAdapter::new(64, 1, 0, AdapterLatency::Learn);
        let mut at = 0;
        for n in [100, 28, 64, 1, 63] {
            a.callback(n, &frames(at, n, 1), &mut [], |_, i, o| {
                assert!(o.is_empty());
                seen.extend_from_slice(i);
            });
            at += n;
        }
        assert_eq!(seen, frames(0, 256, 1));
    }

    #[test]
    fn bridge_passes_frames_in_order_and_keeps_its_cushion() {
        let (mut feeder, mut bridge) = InputBridge::new(2, 1024);
        let mut pushed = 0;
        let mut got = Vec::new();
        // Input callbacks of 96 frames, output callbacks of 64: the same clock, different sizes.
        for step in 0..3000 {
            if step % 3 == 0 {
                feeder.push(&frames(pushed, 96, 2));
                pushed += 96;
            }
            if step % 2 == 0 {
                let mut dst = vec![f32::NAN; 64 * 2];
                bridge.pull(&mut dst);
                got.extend_from_slice(&dst);
            }
        }
        assert_eq!(bridge.underruns(), 0);
        assert_eq!(bridge.dropped(), 0);
        assert_eq!(bridge.target(), 64 + 96);
        // After priming (silence), the frames come in order, each exactly once.
        let start = got.iter().position(|x| *x != 0.0).expect("audio came through") / 2;
        let first = (0..pushed)
            .find(|&f| sample(f, 0) == got[start * 2])
            .expect("a pushed frame");
        for (k, frame) in got[start * 2..].chunks(2).enumerate() {
            assert_eq!(frame, &frames(first + k, 1, 2)[..], "frame {k}");
        }
    }

    #[test]
    fn bridge_grows_its_cushion_after_a_late_input() {
        let (mut feeder, mut bridge) = InputBridge::new(1, 4096);
        let mut pushed = 0;
        let mut push = |feeder: &mut InputFeeder, n: usize| {
            feeder.push(&frames(pushed, n, 1));
            pushed += n;
        };
        let pull = |bridge: &mut InputBridge| {
            let mut dst = vec![0.0; 64];
            bridge.pull(&mut dst);
        };
        for _ in 0..20 {
            push(&mut feeder, 64);
            pull(&mut bridge);
        }
        let before = bridge.target();
        // The input thread stalls for three periods, then catches up.
        for _ in 0..3 {
            pull(&mut bridge);
        }
        for _ in 0..3 {
            push(&mut feeder, 64);
        }
        assert_eq!(bridge.underruns(), 1);
        for _ in 0..20 {
            push(&mut feeder, 64);
            pull(&mut bridge);
        }
        assert!(bridge.target() > before, "{} vs {before}", bridge.target());
        assert_eq!(bridge.underruns(), 1);
    }

    #[test]
    fn a_full_ring_drops_input_and_counts_it() {
        let (mut feeder, bridge) = InputBridge::new(2, 100);
        feeder.push(&frames(0, 80, 2));
        feeder.push(&frames(80, 80, 2));
        assert_eq!(bridge.level(), 100);
        assert_eq!(bridge.counters.overflows.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn integer_samples_survive_the_round_trip_through_f32() {
        for x in [i16::MIN, -12_345, -1, 0, 1, 777, i16::MAX] {
            assert_eq!(i16::from_f32(x.to_f32()), x);
        }
        for x in [i32::MIN, -123_456_768, -256, 0, 256, 8_388_352, i32::MAX - 127] {
            // f32 holds 24 bits: a 32-bit sample keeps its top 24.
            assert_eq!(i32::from_f32(x.to_f32()) >> 8, x >> 8, "{x}");
        }
        assert_eq!(i16::from_f32(1.5), i16::MAX);
        assert_eq!(i16::from_f32(-1.5), i16::MIN);
        assert_eq!(i32::from_f32(1.0), i32::MAX);
        assert_eq!(f32::from_f32(0.123).to_bits(), 0.123f32.to_bits());
    }

    #[test]
    fn callback_clock_measures_lateness_against_the_schedule() {
        let mut c = CallbackClock::new(48_000);
        let period = 1_333_333; // 64 frames
        assert_eq!(c.tick(1_000_000, 64), (1_000_000, 0));
        assert_eq!(c.tick(1_000_000 + period, 64).1, 0);
        // 100 µs late.
        let (due, late) = c.tick(1_000_000 + 2 * period + 100_000, 64);
        assert_eq!(late, 100_000);
        assert_eq!(due, 1_000_000 + 2 * period);
        // Early: re-anchored, not late.
        assert_eq!(c.tick(1_000_000 + 3 * period - 50_000, 64).1, 0);
        assert_eq!(c.tick(1_000_000 + 4 * period - 50_000, 64).1, 0);
    }
}
