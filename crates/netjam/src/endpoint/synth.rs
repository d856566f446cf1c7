//! Synthetic sources (sine, click track, noise, music) as a [`FrameSource`].

use super::FrameSource;
use netjam_engine::synth::{Synth, SynthKind};

/// An endless synthetic signal.
#[derive(Debug)]
pub struct SynthSource {
    synth: Synth,
    rate: u32,
    channels: u16,
}

impl SynthSource {
    pub fn new(kind: SynthKind, rate: u32, channels: u16, seed: u64) -> Self {
        Self {
            synth: Synth::new(kind, rate, channels as usize, seed),
            rate,
            channels,
        }
    }
}

impl FrameSource for SynthSource {
    fn rate(&self) -> u32 {
        self.rate
    }
    fn channels(&self) -> u16 {
        self.channels
    }
    fn read(&mut self, out: &mut [f32]) -> anyhow::Result<usize> {
        self.synth.fill(out);
        Ok(out.len() / self.channels as usize)
    }
}
