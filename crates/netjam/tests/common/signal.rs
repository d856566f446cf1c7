//! Reading back what netjam (or GStreamer) played, and measuring the tone in it.

use std::path::Path;

/// The rate every test plays at.
pub const RATE: f64 = 48_000.0;
/// 2.5 ms at [`RATE`]: one low-delay Opus packet, the window of [`sliding_rms`].
pub const WINDOW: usize = 120;

/// A WAV file as one vector of samples (-1..1) per channel.
#[derive(Debug)]
pub struct Audio {
    pub rate: u32,
    pub channels: Vec<Vec<f64>>,
}

pub fn read_wav(path: &Path) -> Audio {
    let mut r = hound::WavReader::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let spec = r.spec();
    let all: Vec<f64> = match spec.sample_format {
        hound::SampleFormat::Float => r
            .samples::<f32>()
            .map(|s| f64::from(s.expect("sample")))
            .collect(),
        hound::SampleFormat::Int => {
            let scale = f64::from(1u32 << (spec.bits_per_sample - 1));
            r.samples::<i32>()
                .map(|s| f64::from(s.expect("sample")) / scale)
                .collect()
        }
    };
    let ch = usize::from(spec.channels);
    let channels = (0..ch)
        .map(|c| all.iter().skip(c).step_by(ch).copied().collect())
        .collect();
    Audio {
        rate: spec.sample_rate,
        channels,
    }
}

/// The first channel of a WAV file.
pub fn read_channel0(path: &Path) -> Vec<f64> {
    read_wav(path).channels.into_iter().next().unwrap_or_default()
}

/// Power of `x` at `hz` (Goertzel).
pub fn goertzel(x: &[f64], hz: f64) -> f64 {
    let k = 2.0 * (2.0 * std::f64::consts::PI * hz / RATE).cos();
    let (mut s1, mut s2) = (0.0, 0.0);
    for &v in x {
        let s0 = v + k * s1 - s2;
        s2 = s1;
        s1 = s0;
    }
    s1 * s1 + s2 * s2 - k * s1 * s2
}

/// The strongest frequency between 50 Hz and 10 kHz, to 5 Hz.
pub fn dominant_hz(x: &[f64]) -> f64 {
    (10..=2000)
        .map(|k| f64::from(k) * 5.0)
        .map(|hz| (hz, goertzel(x, hz)))
        .fold((0.0, 0.0), |best, c| if c.1 > best.1 { c } else { best })
        .0
}

/// RMS of every 2.5 ms window of `x`, one starting at each sample (so a silent stretch of
/// 2.5 ms or more shows as a window of RMS 0 wherever it lies).
pub fn sliding_rms(x: &[f64]) -> Vec<f64> {
    let mut sum = vec![0.0; x.len() + 1];
    for (i, v) in x.iter().enumerate() {
        sum[i + 1] = sum[i] + v * v;
    }
    (0..x.len().saturating_sub(WINDOW - 1))
        .map(|i| ((sum[i + WINDOW] - sum[i]).max(0.0) / WINDOW as f64).sqrt())
        .collect()
}

/// The quietest of [`sliding_rms`]`(x)` and where its window starts, in samples.
pub fn quietest_window(x: &[f64]) -> (f64, usize) {
    quietest(&sliding_rms(x))
}

/// The smallest of `rms` and its index (the first if several are).
pub fn quietest(rms: &[f64]) -> (f64, usize) {
    rms.iter()
        .enumerate()
        .map(|(i, &r)| (r, i))
        .fold((f64::INFINITY, 0), |m, w| if w.0 < m.0 { w } else { m })
}

/// Writes a mono 16-bit WAV of a sine at `hz` and amplitude `amp` (0..1), `seconds` long, at
/// [`RATE`].
pub fn write_tone(path: &Path, hz: f64, amp: f64, seconds: f64) {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: RATE as u32,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).expect("create wav");
    for n in 0..(seconds * RATE) as usize {
        let v = amp * (2.0 * std::f64::consts::PI * hz * n as f64 / RATE).sin();
        w.write_sample((v * 32767.0).round() as i16).expect("write wav");
    }
    w.finalize().expect("finalize wav");
}

/// The amplitude of the sine at `hz` in `block`, through a Hann window (a sine of
/// amplitude A reads A).
pub fn tone_amp(block: &[f64], hz: f64) -> f64 {
    let n = block.len();
    let w = |i: usize| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / (n - 1) as f64).cos();
    let windowed: Vec<f64> = block.iter().enumerate().map(|(i, v)| v * w(i)).collect();
    let sum_w: f64 = (0..n).map(w).sum();
    2.0 * goertzel(&windowed, hz).max(0.0).sqrt() / sum_w
}
