//! Raw interleaved PCM on stdin and stdout, with the layout given on the command line, so
//! `sox ... -t raw - | netjam send --stdin` and `netjam recv --stdout | play -t raw ...`
//! pipelines work.

use std::io::{Read, Write};

use anyhow::Context;

use super::{FrameSink, FrameSource, SampleFormat};

fn to_f32(fmt: SampleFormat, b: &[u8]) -> f32 {
    match fmt {
        SampleFormat::S16le => i16::from_le_bytes([b[0], b[1]]) as f32 / 32_768.0,
        SampleFormat::S24le => {
            let v = i32::from_le_bytes([0, b[0], b[1], b[2]]) >> 8;
            v as f32 / 8_388_608.0
        }
        SampleFormat::S32le => (i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64 / 2_147_483_648.0) as f32,
        SampleFormat::F32le => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
    }
}

fn from_f32(fmt: SampleFormat, x: f32, out: &mut Vec<u8>) {
    match fmt {
        SampleFormat::S16le => {
            out.extend_from_slice(&((x * 32_768.0).round().clamp(-32_768.0, 32_767.0) as i16).to_le_bytes())
        }
        SampleFormat::S24le => {
            let v = (x * 8_388_608.0).round().clamp(-8_388_608.0, 8_388_607.0) as i32;
            out.extend_from_slice(&v.to_le_bytes()[..3]);
        }
        SampleFormat::S32le => {
            let v = (x as f64 * 2_147_483_648.0)
                .round()
                .clamp(-2_147_483_648.0, 2_147_483_647.0) as i32;
            out.extend_from_slice(&v.to_le_bytes());
        }
        SampleFormat::F32le => out.extend_from_slice(&x.to_le_bytes()),
    }
}

/// Frames from a byte stream (stdin).
pub struct RawSource<R> {
    input: R,
    format: SampleFormat,
    rate: u32,
    channels: u16,
    bytes: Vec<u8>,
}

impl<R> std::fmt::Debug for RawSource<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawSource")
            .field("format", &self.format)
            .field("rate", &self.rate)
            .finish_non_exhaustive()
    }
}

impl<R: Read + Send> RawSource<R> {
    pub fn new(input: R, format: SampleFormat, rate: u32, channels: u16) -> Self {
        Self {
            input,
            format,
            rate,
            channels,
            bytes: Vec::new(),
        }
    }
}

impl<R: Read + Send> FrameSource for RawSource<R> {
    fn rate(&self) -> u32 {
        self.rate
    }
    fn channels(&self) -> u16 {
        self.channels
    }
    fn read(&mut self, out: &mut [f32]) -> anyhow::Result<usize> {
        let bps = self.format.bytes();
        let frame_bytes = bps * self.channels as usize;
        let want = out.len() / self.channels as usize * frame_bytes;
        self.bytes.resize(want, 0);
        // Read whole frames; a short read at the end drops a trailing partial frame.
        let mut got = 0;
        while got < want {
            match self
                .input
                .read(&mut self.bytes[got..])
                .context("reading audio from stdin")?
            {
                0 => break,
                n => got += n,
            }
        }
        let frames = got / frame_bytes;
        for (i, b) in self.bytes[..frames * frame_bytes].chunks_exact(bps).enumerate() {
            out[i] = to_f32(self.format, b);
        }
        Ok(frames)
    }
}

/// Frames to a byte stream (stdout), flushed every period so a pipe sees them at once.
pub struct RawSink<W> {
    output: W,
    format: SampleFormat,
    bytes: Vec<u8>,
}

impl<W> std::fmt::Debug for RawSink<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawSink")
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

impl<W: Write + Send> RawSink<W> {
    pub fn new(output: W, format: SampleFormat) -> Self {
        Self {
            output,
            format,
            bytes: Vec::new(),
        }
    }
}

impl<W: Write + Send> FrameSink for RawSink<W> {
    fn write(&mut self, frames: &[f32]) -> anyhow::Result<()> {
        self.bytes.clear();
        for x in frames {
            from_f32(self.format, *x, &mut self.bytes);
        }
        self.output
            .write_all(&self.bytes)
            .context("writing audio to stdout (is the reader still running?)")?;
        self.output.flush().context("flushing stdout")?;
        Ok(())
    }
    fn finish(&mut self) -> anyhow::Result<()> {
        self.output.flush().context("flushing stdout")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_layout_round_trips() {
        for fmt in [
            SampleFormat::S16le,
            SampleFormat::S24le,
            SampleFormat::S32le,
            SampleFormat::F32le,
        ] {
            let samples: Vec<f32> = (0..64).map(|i| ((i * 37 % 64) as f32 - 32.0) / 32.0).collect();
            let mut sink = RawSink::new(Vec::new(), fmt);
            sink.write(&samples).expect("write");
            let mut src = RawSource::new(&sink.output[..], fmt, 48_000, 2);
            let mut back = vec![0.0; 64];
            assert_eq!(src.read(&mut back).expect("read"), 32);
            for (a, b) in samples.iter().zip(&back) {
                assert!(
                    (a.clamp(-1.0, 1.0 - 1.0 / 32768.0) - b).abs() < 1.0 / 32768.0 + 1e-7,
                    "{fmt:?} {a} {b}"
                );
            }
        }
    }

    #[test]
    fn a_trailing_partial_frame_is_dropped() {
        let bytes = [0u8, 0, 0, 64, 1]; // one stereo s16 frame + one stray byte
        let mut src = RawSource::new(&bytes[..], SampleFormat::S16le, 48_000, 2);
        let mut out = vec![0.0; 8];
        assert_eq!(src.read(&mut out).expect("read"), 1);
        assert_eq!(out[1], 0.5);
    }
}
