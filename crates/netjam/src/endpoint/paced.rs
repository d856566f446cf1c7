//! [`PacedEndpoint`]: a stand-in device clock for files, pipes and synthetic sources.
//!
//! A thread wakes on absolute deadlines one period apart (so a late wake-up never shifts
//! the schedule), reads a period from the source, calls the [`Process`], and writes what it
//! played to the sink. The source and sink run on this thread too: files are not realtime,
//! but the `Process` sees exactly what a sound card's callback would.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{Endpoint, FrameSink, FrameSource, PeriodStats, PeriodTimer, Process, StopReason, StreamSpec};
use crate::clock;
use netjam_engine::time::frames_to_ns;

/// See the module docs.
pub struct PacedEndpoint {
    spec: StreamSpec,
    source: Option<Box<dyn FrameSource>>,
    sink: Option<Box<dyn FrameSink>>,
    /// Stop after this many frames (a `--duration`).
    limit_frames: Option<u64>,
    /// The clock's origin on the monotonic clock, when it is not the moment `run` starts.
    origin_ns: Option<u64>,
}

impl std::fmt::Debug for PacedEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacedEndpoint")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl PacedEndpoint {
    /// A clock of `period` frames at `rate` that captures from `source` (if any) and plays
    /// `output_channels` into `sink` (if any).
    pub fn new(
        rate: u32,
        period: u32,
        source: Option<Box<dyn FrameSource>>,
        output_channels: u16,
        sink: Option<Box<dyn FrameSink>>,
    ) -> Self {
        let input_channels = source.as_ref().map_or(0, |s| s.channels());
        Self {
            spec: StreamSpec {
                rate,
                input_channels,
                output_channels,
                period,
            },
            source,
            sink,
            limit_frames: None,
            origin_ns: None,
        }
    }

    /// Count periods from `origin_ns` (a moment already past, such as a stream's first
    /// packet) instead of from the start of `run`: a file or a pipe has no clock of its
    /// own, so its periods can be placed on the stream's, and a late start of this thread
    /// is made up by running the first periods back to back rather than playing late.
    pub fn with_origin(mut self, origin_ns: Option<u64>) -> Self {
        self.origin_ns = origin_ns;
        self
    }

    /// Stop after `frames` frames.
    pub fn with_limit(mut self, frames: Option<u64>) -> Self {
        self.limit_frames = frames;
        self
    }
}

impl Endpoint for PacedEndpoint {
    fn spec(&self) -> StreamSpec {
        self.spec
    }

    fn run(
        mut self: Box<Self>,
        process: &mut dyn Process,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<(StopReason, PeriodStats)> {
        let s = self.spec;
        let period = s.period as usize;
        let mut input = vec![0.0f32; period * s.input_channels as usize];
        let mut output = vec![0.0f32; period * s.output_channels as usize];
        let period_ns = frames_to_ns(s.period as u64, s.rate);
        let realtime = matches!(
            crate::rt::promote_current_thread(crate::rt::AUDIO_PRIORITY),
            crate::rt::RtStatus::Realtime { .. }
        );
        let mut timer = PeriodTimer::default();
        timer.set_realtime(realtime);
        if realtime {
            if let Err(e) = crate::rt::lock_memory() {
                tracing::info!("memory not locked: {e}");
            }
        }
        let start = self.origin_ns.unwrap_or_else(clock::now_ns);
        let mut periods = 0u64;
        let mut frames_done = 0u64;
        let reason = loop {
            if stop.load(Ordering::Relaxed) {
                break StopReason::Stopped;
            }
            if self.limit_frames.is_some_and(|l| frames_done >= l) {
                break StopReason::Stopped;
            }
            let mut got = period;
            if let Some(src) = self.source.as_mut() {
                got = src.read(&mut input)?;
                if got == 0 {
                    break StopReason::EndOfInput;
                }
                input[got * s.input_channels as usize..].fill(0.0);
            }
            // The period is handed over once it has been "captured": at its end.
            let deadline = start + (periods + 1) * period_ns;
            clock::sleep_until_ns(deadline);
            let woke = clock::now_ns();
            // Like a sound card's period timestamp, the callback is given the nominal time
            // of the period, so a late wake-up of this thread does not look like network delay.
            process.process(deadline, &input, &mut output);
            timer.record(woke.saturating_sub(deadline), clock::now_ns() - woke, period_ns);
            periods += 1;
            if let Some(sink) = self.sink.as_mut() {
                sink.write(&output[..got * s.output_channels as usize])?;
            }
            frames_done += got as u64;
        };
        if let Some(sink) = self.sink.as_mut() {
            sink.finish()?;
        }
        Ok((reason, timer.stats()))
    }
}
