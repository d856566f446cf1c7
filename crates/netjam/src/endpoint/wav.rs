//! WAV files in and out (PCM 16/24/32-bit integer and 32-bit float).

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use hound::{SampleFormat as HoundFormat, WavReader, WavSpec, WavWriter};

use super::{FrameSink, FrameSource};
use netjam_engine::wire::Codec;

/// Reads a WAV file as frames in [-1, 1].
pub struct WavSource {
    reader: WavReader<std::io::BufReader<File>>,
    spec: WavSpec,
}

impl std::fmt::Debug for WavSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WavSource").field("spec", &self.spec).finish()
    }
}

impl WavSource {
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let reader = WavReader::open(path).with_context(|| {
            format!(
                "cannot read {} as a WAV file: give a PCM or float WAV",
                path.display()
            )
        })?;
        let spec = reader.spec();
        match (spec.sample_format, spec.bits_per_sample) {
            (HoundFormat::Int, 8 | 16 | 24 | 32) | (HoundFormat::Float, 32) => {}
            (f, b) => bail!(
                "{}: {b}-bit {f:?} samples are not supported: use 16/24/32-bit PCM or 32-bit float",
                path.display()
            ),
        }
        Ok(Self { reader, spec })
    }

    /// The codec that carries this file without loss.
    pub fn lossless_codec(&self) -> Codec {
        match (self.spec.sample_format, self.spec.bits_per_sample) {
            (HoundFormat::Int, 8 | 16) => Codec::L16,
            (HoundFormat::Int, 24) => Codec::L24,
            _ => Codec::F32,
        }
    }
}

impl FrameSource for WavSource {
    fn rate(&self) -> u32 {
        self.spec.sample_rate
    }

    fn channels(&self) -> u16 {
        self.spec.channels
    }

    fn read(&mut self, out: &mut [f32]) -> anyhow::Result<usize> {
        let ch = self.spec.channels as usize;
        let want = out.len() / ch * ch;
        let mut n = 0;
        match self.spec.sample_format {
            HoundFormat::Float => {
                for (slot, s) in out[..want].iter_mut().zip(self.reader.samples::<f32>()) {
                    *slot = s.context("the WAV file is damaged")?;
                    n += 1;
                }
            }
            HoundFormat::Int => {
                let scale = 1.0 / (1u64 << (self.spec.bits_per_sample - 1)) as f64;
                for (slot, s) in out[..want].iter_mut().zip(self.reader.samples::<i32>()) {
                    *slot = (s.context("the WAV file is damaged")? as f64 * scale) as f32;
                    n += 1;
                }
            }
        }
        Ok(n / ch)
    }
}

/// The first channel of a WAV file, in [-1, 1], and its sample rate: a recorded output as
/// [`netjam_engine::listen::listen`] measures it.
pub fn read_first_channel(path: &Path) -> anyhow::Result<(Vec<f32>, u32)> {
    let mut source = WavSource::open(path)?;
    let channels = usize::from(source.channels()).max(1);
    let mut frames = vec![0.0f32; 4096 * channels];
    let mut first = Vec::new();
    loop {
        let n = source
            .read(&mut frames)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        first.extend(frames[..n * channels].iter().step_by(channels));
    }
    Ok((first, source.rate()))
}

/// Writes frames to a WAV file whose sample format matches a codec (L16 → 16-bit PCM,
/// L24 → 24-bit PCM, F32 → 32-bit float), so what arrived is stored without change; Opus
/// decodes to float, stored as 32-bit float.
pub struct WavSink {
    writer: Option<WavWriter<BufWriter<File>>>,
    spec: WavSpec,
    path: PathBuf,
}

impl std::fmt::Debug for WavSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WavSink")
            .field("path", &self.path)
            .field("spec", &self.spec)
            .finish()
    }
}

impl WavSink {
    pub fn create(path: &Path, rate: u32, channels: u16, codec: Codec) -> anyhow::Result<Self> {
        let (sample_format, bits_per_sample) = match codec {
            Codec::L16 => (HoundFormat::Int, 16),
            Codec::L24 => (HoundFormat::Int, 24),
            Codec::F32 | Codec::Opus => (HoundFormat::Float, 32),
        };
        let spec = WavSpec {
            channels,
            sample_rate: rate,
            bits_per_sample,
            sample_format,
        };
        let writer = WavWriter::create(path, spec).with_context(|| {
            format!(
                "cannot create {}: check the directory exists and is writable",
                path.display()
            )
        })?;
        Ok(Self {
            writer: Some(writer),
            spec,
            path: path.to_owned(),
        })
    }
}

impl FrameSink for WavSink {
    fn write(&mut self, frames: &[f32]) -> anyhow::Result<()> {
        let Some(w) = self.writer.as_mut() else {
            return Ok(());
        };
        let ctx = || format!("writing {}", self.path.display());
        match self.spec.sample_format {
            HoundFormat::Float => {
                for x in frames {
                    w.write_sample(*x).with_context(ctx)?;
                }
            }
            HoundFormat::Int => {
                let full = (1i64 << (self.spec.bits_per_sample - 1)) as f32;
                for x in frames {
                    let v = (x * full).round().clamp(-full, full - 1.0) as i32;
                    w.write_sample(v).with_context(ctx)?;
                }
            }
        }
        Ok(())
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        if let Some(w) = self.writer.take() {
            w.finalize()
                .with_context(|| format!("finishing {}", self.path.display()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_channel_of_a_stereo_file_reads_back() {
        let path = std::env::temp_dir().join(format!("netjam-wav-first-{}.wav", std::process::id()));
        let mut sink = WavSink::create(&path, 44_100, 2, Codec::L24).unwrap();
        let frames: Vec<f32> = (0..10_000).flat_map(|i| [i as f32 / 20_000.0, -0.5]).collect();
        sink.write(&frames).unwrap();
        sink.finish().unwrap();
        let (first, rate) = read_first_channel(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!((first.len(), rate), (10_000, 44_100));
        for (i, x) in first.iter().enumerate() {
            assert!((x - i as f32 / 20_000.0).abs() < 1e-6, "{i}: {x}");
        }
        assert!(read_first_channel(&path).is_err());
    }
}
