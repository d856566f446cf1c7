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
}

/// Why an endpoint stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The input ran out (end of file or pipe).
    EndOfInput,
    /// Someone set the stop flag (a duration elapsed, Ctrl-C).
    Stopped,
}

/// Timing of the periods an endpoint ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct PeriodStats {
    pub periods: u64,
    /// Periods whose callback started later than a whole period after its deadline.
    pub missed_deadlines: u64,
    /// Mean and worst lateness of the callback's start, µs.
    pub wake_late_mean_us: f64,
    pub wake_late_max_us: f64,
    /// Mean and worst time spent in `process`, µs.
    pub callback_mean_us: f64,
    pub callback_max_us: f64,
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
