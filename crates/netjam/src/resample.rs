//! [`EdgeResampler`]: converts a device's sample rate to and from Opus's 48 kHz at the
//! edges of the stream, so a player whose interface runs at 44.1 kHz (or any rate netjam
//! carries) can still send and hear Opus.
//!
//! It wraps `rubato`'s windowed-sinc resampler with a short filter (its delay is a fraction
//! of a millisecond, reported by [`EdgeResampler::delay_ns`] so the latency budget counts
//! it) and takes and gives interleaved frames in any amounts. Every buffer is reserved in
//! [`EdgeResampler::new`]: `push` and `pop` never allocate, lock or block, so they may run
//! on the audio thread. It must never be built there.

use crate::endpoint::{FrameSource, Process};
use rubato::{Resampler, SincFixedIn, SincInterpolationParameters, SincInterpolationType, WindowFunction};

/// The rate Opus runs at (RFC 7587).
pub const OPUS_RATE: u32 = 48_000;

/// Length of the sinc filter, in input frames: its delay is half of it.
const SINC_LEN: usize = 64;

/// Why an edge resampler cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ResampleError {
    #[error("cannot resample {from} Hz to {to} Hz for {channels} channels: {reason}")]
    Construction {
        from: u32,
        to: u32,
        channels: usize,
        reason: String,
    },
}

/// See the module docs.
pub struct EdgeResampler {
    inner: SincFixedIn<f32>,
    from: u32,
    to: u32,
    channels: usize,
    /// Input frames per call of the inner resampler.
    chunk: usize,
    /// Per channel, the input gathered for the next call.
    input: Vec<Vec<f32>>,
    filled: usize,
    /// Per channel, what the last call produced.
    output: Vec<Vec<f32>>,
    /// Interleaved frames waiting to be popped, a ring of `fifo.len() / channels` frames.
    fifo: Vec<f32>,
    head: usize,
    queued: usize,
    /// Frames dropped because `pop` was not called often enough (the ring was full).
    overflowed: u64,
}

impl std::fmt::Debug for EdgeResampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeResampler")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("channels", &self.channels)
            .field("chunk", &self.chunk)
            .finish_non_exhaustive()
    }
}

impl EdgeResampler {
    /// Convert `channels` interleaved channels from `from` Hz to `to` Hz, taking the input
    /// `chunk` frames at a time (the caller's period: smaller is less delay). Allocates.
    pub fn new(from: u32, to: u32, channels: usize, chunk: usize) -> Result<Self, ResampleError> {
        let err = |reason: String| ResampleError::Construction {
            from,
            to,
            channels,
            reason,
        };
        if channels == 0 || chunk == 0 || from == 0 || to == 0 {
            return Err(err("rates, channels and chunk must be positive".into()));
        }
        let params = SincInterpolationParameters {
            sinc_len: SINC_LEN,
            f_cutoff: rubato::calculate_cutoff(SINC_LEN, WindowFunction::BlackmanHarris2),
            interpolation: SincInterpolationType::Linear,
            oversampling_factor: 128,
            window: WindowFunction::BlackmanHarris2,
        };
        let inner = SincFixedIn::<f32>::new(to as f64 / from as f64, 1.0, params, chunk, channels)
            .map_err(|e| err(e.to_string()))?;
        let out_max = inner.output_frames_max();
        // Room for a few calls' output, so a consumer that pops once per period of its own
        // never loses frames to the ring.
        let fifo_frames = 4 * (out_max + chunk * to as usize / from as usize + 1);
        Ok(Self {
            from,
            to,
            channels,
            chunk,
            input: vec![vec![0.0; chunk]; channels],
            filled: 0,
            output: vec![vec![0.0; out_max]; channels],
            fifo: vec![0.0; fifo_frames * channels],
            head: 0,
            queued: 0,
            overflowed: 0,
            inner,
        })
    }

    pub fn channels(&self) -> usize {
        self.channels
    }

    /// The rates converted between.
    pub fn rates(&self) -> (u32, u32) {
        (self.from, self.to)
    }

    /// What the filter delays the signal by (half its length), in ns: the whole delay when
    /// the input comes in whole chunks and the output is taken as it is made.
    pub fn filter_delay_ns(&self) -> u64 {
        self.inner.output_delay() as u64 * 1_000_000_000 / self.to as u64
    }

    /// What the resampler delays the signal by at most when input comes in any amounts:
    /// the filter plus a chunk gathered, in ns.
    pub fn delay_ns(&self) -> u64 {
        self.filter_delay_ns() + self.chunk as u64 * 1_000_000_000 / self.from as u64
    }

    /// Queue `frames` of silence ahead of what comes out, so a consumer that pops whole
    /// periods while the input arrives in chunks of another size never runs dry. Call it
    /// before the first `push`; the delay it adds is the caller's to count.
    pub fn prime(&mut self, frames: usize) {
        let ch = self.channels;
        let cap = self.fifo.len() / ch;
        let n = frames.min(cap - self.queued);
        for i in 0..n {
            let at = (self.head + self.queued + i) % cap;
            self.fifo[at * ch..(at + 1) * ch].fill(0.0);
        }
        self.queued += n;
    }

    /// Frames waiting to be popped.
    pub fn available(&self) -> usize {
        self.queued
    }

    /// Frames lost because the output was not popped in time.
    pub fn overflowed(&self) -> u64 {
        self.overflowed
    }

    /// Feed interleaved frames at the input rate (a trailing partial frame is ignored).
    /// Allocation-free.
    pub fn push(&mut self, interleaved: &[f32]) {
        let ch = self.channels;
        for frame in interleaved.chunks_exact(ch) {
            for (c, &x) in frame.iter().enumerate() {
                self.input[c][self.filled] = x;
            }
            self.filled += 1;
            if self.filled == self.chunk {
                self.filled = 0;
                self.run_chunk();
            }
        }
    }

    fn run_chunk(&mut self) {
        let Ok((_, produced)) = self
            .inner
            .process_into_buffer(&self.input, &mut self.output, None)
        else {
            return;
        };
        let ch = self.channels;
        let cap = self.fifo.len() / ch;
        for i in 0..produced {
            if self.queued == cap {
                // Drop the oldest frame: the consumer fell behind.
                self.head = (self.head + 1) % cap;
                self.queued -= 1;
                self.overflowed += 1;
            }
            let at = (self.head + self.queued) % cap;
            for c in 0..ch {
                self.fifo[at * ch + c] = self.output[c][i];
            }
            self.queued += 1;
        }
    }

    /// Take up to `out.len() / channels` frames at the output rate into `out`; returns the
    /// frames written. Allocation-free.
    pub fn pop(&mut self, out: &mut [f32]) -> usize {
        let ch = self.channels;
        let cap = self.fifo.len() / ch;
        let n = (out.len() / ch).min(self.queued);
        for i in 0..n {
            let at = (self.head + i) % cap;
            out[i * ch..(i + 1) * ch].copy_from_slice(&self.fifo[at * ch..(at + 1) * ch]);
        }
        self.head = (self.head + n) % cap;
        self.queued -= n;
        n
    }
}

/// A [`Process`] that runs at Opus's 48 kHz on a device at another rate: what the device
/// captures is resampled up before the process sees it, and what the process plays is
/// resampled back to the device's rate (the other direction is primed with a period and a
/// chunk of silence so the device never waits on it). Without edges it passes every call
/// straight through. Realtime-safe: every buffer is reserved in [`EdgeProcess::new`].
pub struct EdgeProcess<P> {
    inner: P,
    edges: Option<Edges>,
}

struct Edges {
    device_rate: u32,
    up: EdgeResampler,
    down: EdgeResampler,
    inner_in: Vec<f32>,
    inner_out: Vec<f32>,
    in_ch: usize,
    out_ch: usize,
    primed_frames: usize,
    period: usize,
    underruns: u64,
}

impl<P> std::fmt::Debug for EdgeProcess<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeProcess")
            .field("resampling", &self.edges.as_ref().map(|e| e.up.rates()))
            .finish_non_exhaustive()
    }
}

/// Frames of the process's 48 kHz side reserved per device period: the up edge yields at
/// most this many per call (a period's worth plus one filter chunk's rounding).
fn inner_frames(period: usize, device_rate: u32) -> usize {
    2 * (period * OPUS_RATE as usize / device_rate.max(1) as usize + 1) + 64
}

impl<P> EdgeProcess<P> {
    /// `inner` as it is, on a device at 48 kHz.
    pub fn passthrough(inner: P) -> Self {
        Self { inner, edges: None }
    }

    /// `inner` at 48 kHz on a device at `device_rate` with `period`-frame callbacks,
    /// capturing `in_ch` and playing `out_ch` channels. Allocates.
    pub fn new(
        inner: P,
        device_rate: u32,
        period: usize,
        in_ch: usize,
        out_ch: usize,
    ) -> Result<Self, ResampleError> {
        if device_rate == OPUS_RATE {
            return Ok(Self::passthrough(inner));
        }
        let up = EdgeResampler::new(device_rate, OPUS_RATE, in_ch, period)?;
        let inner_chunk = period * OPUS_RATE as usize / device_rate as usize;
        let mut down = EdgeResampler::new(OPUS_RATE, device_rate, out_ch, inner_chunk.max(1))?;
        let primed_frames = period + down.inner.output_frames_max();
        down.prime(primed_frames);
        let frames = inner_frames(period, device_rate);
        Ok(Self {
            inner,
            edges: Some(Edges {
                device_rate,
                up,
                down,
                inner_in: vec![0.0; frames * in_ch],
                inner_out: vec![0.0; frames * out_ch],
                in_ch,
                out_ch,
                primed_frames,
                period,
                underruns: 0,
            }),
        })
    }

    pub fn inner(&self) -> &P {
        &self.inner
    }

    pub fn inner_mut(&mut self) -> &mut P {
        &mut self.inner
    }

    pub fn into_inner(self) -> P {
        self.inner
    }

    /// What each edge delays the signal by, in ns: (captured to sent, received to played);
    /// (0, 0) without edges. Capture takes whole periods as its chunks, so only its filter
    /// delays; the played side adds the silence it was primed with beyond one period.
    pub fn delay_ns(&self) -> (u64, u64) {
        self.edges.as_ref().map_or((0, 0), |e| {
            let queued = e.primed_frames.saturating_sub(e.period) as u64;
            let queued_ns = queued * 1_000_000_000 / u64::from(e.device_rate);
            (e.up.filter_delay_ns(), e.down.filter_delay_ns() + queued_ns)
        })
    }

    /// Device periods the played side could not fill completely (silence made up the rest).
    pub fn underruns(&self) -> u64 {
        self.edges.as_ref().map_or(0, |e| e.underruns)
    }
}

impl<P: Process> Process for EdgeProcess<P> {
    fn process(&mut self, now_ns: u64, input: &[f32], output: &mut [f32]) {
        let Some(e) = self.edges.as_mut() else {
            self.inner.process(now_ns, input, output);
            return;
        };
        e.up.push(input);
        let n = e.up.pop(&mut e.inner_in);
        // As many frames played as captured: both sides keep the process's 48 kHz clock.
        let inner_out = &mut e.inner_out[..n * e.out_ch];
        self.inner.process(now_ns, &e.inner_in[..n * e.in_ch], inner_out);
        e.down.push(inner_out);
        let got = e.down.pop(output);
        if got * e.out_ch < output.len() {
            output[got * e.out_ch..].fill(0.0);
            e.underruns += 1;
        }
    }

    /// Passed through on a device at 48 kHz. Behind the edges the extra ports would need
    /// resamplers of their own, so they play silence (a room refuses `--member-ports` there).
    fn extra_outputs(&mut self, frames: usize, outputs: &mut [f32]) {
        match self.edges {
            None => self.inner.extra_outputs(frames, outputs),
            Some(_) => outputs.fill(0.0),
        }
    }

    fn skipped(&mut self, frames: u64) {
        let scale = |f: u64, rate: u32| f * u64::from(OPUS_RATE) / u64::from(rate.max(1));
        match &self.edges {
            Some(e) => self.inner.skipped(scale(frames, e.device_rate)),
            None => self.inner.skipped(frames),
        }
    }
}

/// A file, pipe or test signal at any rate read as Opus's 48 kHz: the sending edge of
/// `netjam send --codec opus` (not realtime: it reads its source on the paced thread).
pub struct ResampledSource {
    inner: Box<dyn FrameSource>,
    resampler: EdgeResampler,
    scratch: Vec<f32>,
    ended: bool,
}

impl std::fmt::Debug for ResampledSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResampledSource")
            .field("resampler", &self.resampler)
            .finish_non_exhaustive()
    }
}

impl ResampledSource {
    /// Read `inner` at `rate`, `chunk` frames of it at a time.
    pub fn new(inner: Box<dyn FrameSource>, rate: u32, chunk: usize) -> Result<Self, ResampleError> {
        let channels = usize::from(inner.channels());
        let resampler = EdgeResampler::new(inner.rate(), rate, channels, chunk)?;
        Ok(Self {
            inner,
            resampler,
            scratch: vec![0.0; chunk * channels],
            ended: false,
        })
    }

    /// The resampler's delay, in ns.
    pub fn delay_ns(&self) -> u64 {
        self.resampler.delay_ns()
    }

    /// The source's own rate.
    pub fn source_rate(&self) -> u32 {
        self.inner.rate()
    }
}

impl FrameSource for ResampledSource {
    fn rate(&self) -> u32 {
        self.resampler.rates().1
    }

    fn channels(&self) -> u16 {
        self.inner.channels()
    }

    fn read(&mut self, out: &mut [f32]) -> anyhow::Result<usize> {
        let ch = self.resampler.channels();
        let want = out.len() / ch;
        while self.resampler.available() < want && !self.ended {
            let got = self.inner.read(&mut self.scratch)?;
            if got == 0 {
                // Push the filter's tail out with silence, once.
                self.ended = true;
                self.scratch.fill(0.0);
                self.resampler.push(&self.scratch);
                self.resampler.push(&self.scratch);
            } else {
                self.resampler.push(&self.scratch[..got * ch]);
            }
        }
        Ok(self.resampler.pop(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frequency of a mono signal from its zero crossings.
    fn pitch(x: &[f32], rate: u32) -> f64 {
        let crossings: Vec<usize> = (1..x.len()).filter(|&i| x[i - 1] < 0.0 && x[i] >= 0.0).collect();
        let (first, last) = (crossings[0], crossings[crossings.len() - 1]);
        (crossings.len() - 1) as f64 * rate as f64 / (last - first) as f64
    }

    #[test]
    fn a_tone_keeps_its_pitch_both_ways() {
        for (from, to) in [
            (44_100, 48_000),
            (48_000, 44_100),
            (96_000, 48_000),
            (8_000, 48_000),
        ] {
            let mut r = EdgeResampler::new(from, to, 2, 64).unwrap();
            let frames = from as usize; // one second
            let x: Vec<f32> = (0..frames)
                .flat_map(|i| {
                    let v =
                        (2.0 * std::f64::consts::PI * 1_000.0 * i as f64 / from as f64).sin() as f32 * 0.5;
                    [v, -v]
                })
                .collect();
            let mut y = vec![0.0; 2 * (to as usize + 1_000)];
            let mut got = 0;
            for block in x.chunks(2 * 100) {
                r.push(block);
                got += r.pop(&mut y[2 * got..]);
            }
            let left: Vec<f32> = y[..2 * got].iter().step_by(2).copied().collect();
            // Skip the filter's start-up.
            let hz = pitch(&left[to as usize / 10..], to);
            assert!((hz - 1_000.0).abs() < 1.0, "{from} -> {to}: {hz} Hz");
            // About one second came out (less the frames still in the filter and chunk).
            let short = to as i64 - got as i64;
            assert!(
                (0..2 * 64 * to as i64 / from as i64 + 64).contains(&short),
                "{from} -> {to}: {got} frames"
            );
            assert_eq!(r.overflowed(), 0);
            // The delay is the 64-frame chunk plus half the filter, counted at the input rate.
            let bound = (64 + SINC_LEN as u64 / 2 + 1) * 1_000_000_000 / from as u64;
            assert!(r.delay_ns() <= bound, "{from} -> {to}: {} ns", r.delay_ns());
        }
    }

    /// Plays back what it captures, at 48 kHz.
    struct Echo;

    impl Process for Echo {
        fn process(&mut self, _now_ns: u64, input: &[f32], output: &mut [f32]) {
            output.copy_from_slice(input);
        }
    }

    #[test]
    fn a_process_at_48_khz_runs_on_a_44_1_khz_device_at_pitch_and_on_time() {
        const RATE: u32 = 44_100;
        const PERIOD: usize = 64;
        let mut p = EdgeProcess::new(Echo, RATE, PERIOD, 1, 1).unwrap();
        let (capture_ns, play_ns) = p.delay_ns();
        // A tone that starts after 0.1 s, played for a second in 64-frame periods.
        let frames = RATE as usize + PERIOD;
        let onset = RATE as usize / 10;
        let x: Vec<f32> = (0..frames)
            .map(|i| {
                if i < onset {
                    0.0
                } else {
                    (2.0 * std::f64::consts::PI * 1_000.0 * i as f64 / RATE as f64).sin() as f32 * 0.5
                }
            })
            .collect();
        let mut y = vec![0.0f32; frames];
        for (inp, out) in x.chunks_exact(PERIOD).zip(y.chunks_exact_mut(PERIOD)) {
            p.process(0, inp, out);
        }
        assert_eq!(p.underruns(), 0, "the played side never ran dry");
        let heard = y.iter().position(|v| v.abs() > 0.05).unwrap();
        let lag_ns = (heard - onset) as u64 * 1_000_000_000 / RATE as u64;
        // The onset comes back when the two edges' reported delays say, to within the
        // 0.05 threshold's rise time and a device frame.
        let reported = capture_ns + play_ns;
        assert!(
            lag_ns.abs_diff(reported) < 500_000,
            "heard after {lag_ns} ns; edges say {capture_ns} + {play_ns}"
        );
        let hz = pitch(&y[heard + 4_410..], RATE);
        assert!((hz - 1_000.0).abs() < 1.0, "{hz} Hz");
        eprintln!(
            "44.1 kHz edges: capture {capture_ns} ns + play {play_ns} ns; onset heard after {lag_ns} ns"
        );
    }

    /// Fills its extra ports with ones.
    struct Ports;

    impl Process for Ports {
        fn process(&mut self, _now_ns: u64, _input: &[f32], output: &mut [f32]) {
            output.fill(0.0);
        }

        fn extra_outputs(&mut self, _frames: usize, outputs: &mut [f32]) {
            outputs.fill(1.0);
        }
    }

    #[test]
    fn extra_ports_pass_through_at_48_khz_and_are_silent_behind_the_edges() {
        let mut ports = [0.5f32; 4 * 64];
        let mut straight = EdgeProcess::passthrough(Ports);
        straight.extra_outputs(64, &mut ports);
        assert!(ports.iter().all(|&x| x == 1.0), "the process's own ports");
        let mut edged = EdgeProcess::new(Ports, 44_100, 64, 1, 1).unwrap();
        edged.extra_outputs(64, &mut ports);
        assert!(
            ports.iter().all(|&x| x == 0.0),
            "never 48 kHz samples on a 44.1 kHz port"
        );
    }

    #[test]
    fn bad_settings_are_errors() {
        assert!(EdgeResampler::new(0, 48_000, 2, 64).is_err());
        assert!(EdgeResampler::new(44_100, 48_000, 0, 64).is_err());
    }
}
