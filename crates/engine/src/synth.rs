//! Synthetic sources: a sine, a click track at a tempo, white noise, and a music-like
//! signal (plucked-string chords over a pulse) for the demo.
//!
//! Pure signal generators: deterministic for a seed, no I/O, no allocation after
//! construction, so they can run on an audio thread and be regenerated for comparison.

use crate::rng::SimRng;

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SynthKind {
    Sine {
        hz: f64,
    },
    /// A short 1 kHz click on every beat, accented on the first of four.
    Clicks {
        bpm: f64,
    },
    Noise,
    /// Plucked-string chords (Karplus–Strong) with a click pulse: something that sounds
    /// like music and has transients, so concealment artifacts are easy to hear.
    Music {
        bpm: f64,
    },
}

/// A generator of interleaved frames; every channel carries the same signal, slightly
/// panned for `Music`.
#[derive(Debug)]
pub struct Synth {
    kind: SynthKind,
    rate: f64,
    channels: usize,
    n: u64,
    gain: f32,
    rng: SimRng,
    strings: Vec<KsString>,
}

#[derive(Debug)]
struct KsString {
    line: Vec<f32>,
    len: usize,
    pos: usize,
    pan: f32,
}

/// Pitches (MIDI notes) of a four-chord progression, four notes each.
const CHORDS: [[u8; 4]; 4] = [
    [48, 55, 64, 67],
    [45, 52, 60, 64],
    [41, 48, 57, 60],
    [43, 50, 59, 62],
];

impl Synth {
    pub fn new(kind: SynthKind, rate: u32, channels: usize, seed: u64) -> Self {
        let rate_f = rate as f64;
        let strings = match kind {
            SynthKind::Music { .. } => (0..4)
                .map(|i| KsString {
                    // Room for the lowest note used (MIDI 36 = 65 Hz).
                    line: vec![0.0; (rate_f / 60.0) as usize + 2],
                    len: 0,
                    pos: 0,
                    pan: [-0.6, -0.2, 0.2, 0.6][i],
                })
                .collect(),
            _ => Vec::new(),
        };
        Self {
            kind,
            rate: rate_f,
            channels: channels.max(1),
            n: 0,
            gain: 0.5,
            rng: SimRng::new(seed),
            strings,
        }
    }

    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Frames generated so far.
    pub fn position(&self) -> u64 {
        self.n
    }

    /// Fill `out` (interleaved) with the next frames.
    pub fn fill(&mut self, out: &mut [f32]) {
        let ch = self.channels;
        for frame in out.chunks_exact_mut(ch) {
            match self.kind {
                SynthKind::Music { bpm } => {
                    let (l, r) = self.music_frame(bpm);
                    for (c, x) in frame.iter_mut().enumerate() {
                        *x = if c % 2 == 0 { l } else { r };
                    }
                }
                _ => {
                    let v = self.mono_frame();
                    frame.iter_mut().for_each(|x| *x = v);
                }
            }
            self.n += 1;
        }
    }

    fn mono_frame(&mut self) -> f32 {
        let t = self.n as f64 / self.rate;
        match self.kind {
            SynthKind::Sine { hz } => self.gain * (2.0 * std::f64::consts::PI * hz * t).sin() as f32,
            SynthKind::Clicks { bpm } => self.click(bpm, t),
            SynthKind::Noise => self.gain * (self.rng.unit() as f32 * 2.0 - 1.0),
            SynthKind::Music { .. } => 0.0,
        }
    }

    fn click(&self, bpm: f64, t: f64) -> f32 {
        let beat = 60.0 / bpm.max(1.0);
        let k = (t / beat).floor();
        let into = t - k * beat;
        if into >= 0.010 {
            return 0.0;
        }
        let accent = if (k as i64) % 4 == 0 { 1.0 } else { 0.6 };
        let env = (1.0 - into / 0.010) as f32;
        self.gain * accent * env * (2.0 * std::f64::consts::PI * 1000.0 * into).sin() as f32
    }

    fn music_frame(&mut self, bpm: f64) -> (f32, f32) {
        let beat_frames = (self.rate * 60.0 / bpm.max(1.0)) as u64;
        if self.n % beat_frames.max(1) == 0 {
            // Strum the chord of this bar on every beat.
            let bar = (self.n / beat_frames.max(1) / 4) as usize % CHORDS.len();
            let chord = CHORDS[bar];
            for (s, note) in self.strings.iter_mut().zip(chord) {
                let hz = 440.0 * 2f64.powf((note as f64 - 69.0) / 12.0);
                s.len = ((self.rate / hz) as usize).clamp(2, s.line.len());
                s.pos = 0;
                for x in &mut s.line[..s.len] {
                    *x = self.rng.unit() as f32 * 2.0 - 1.0;
                }
            }
        }
        let (mut l, mut r) = (0.0f32, 0.0f32);
        for s in &mut self.strings {
            if s.len < 2 {
                continue;
            }
            let next = (s.pos + 1) % s.len;
            let y = s.line[s.pos];
            s.line[s.pos] = 0.498 * (y + s.line[next]);
            s.pos = next;
            l += y * (1.0 - s.pan) * 0.5;
            r += y * (1.0 + s.pan) * 0.5;
        }
        let pulse = self.click(bpm, self.n as f64 / self.rate) * 0.5;
        (0.3 * l + pulse, 0.3 * r + pulse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sine_has_its_frequency_and_level() {
        let mut s = Synth::new(SynthKind::Sine { hz: 1000.0 }, 48_000, 2, 1);
        let mut buf = vec![0.0; 2 * 48_000];
        s.fill(&mut buf);
        let ch0: Vec<f32> = buf.iter().step_by(2).copied().collect();
        let crossings = ch0.windows(2).filter(|w| w[0] <= 0.0 && w[1] > 0.0).count();
        assert!((999..=1001).contains(&crossings), "{crossings}");
        let peak = ch0.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!((peak - 0.5).abs() < 1e-3);
        assert_eq!(buf[0], buf[1]);
    }

    #[test]
    fn clicks_fall_on_the_beat() {
        let mut s = Synth::new(SynthKind::Clicks { bpm: 120.0 }, 48_000, 1, 1);
        let mut buf = vec![0.0; 48_000 * 2];
        s.fill(&mut buf);
        // Energy only in the first 10 ms of each half second.
        for (i, x) in buf.iter().enumerate() {
            let into = i % 24_000;
            if into >= 480 {
                assert_eq!(*x, 0.0, "frame {i}");
            }
        }
        assert!(buf[..480].iter().any(|x| x.abs() > 0.1));
    }

    #[test]
    fn music_is_deterministic_bounded_and_not_silent() {
        let mut a = Synth::new(SynthKind::Music { bpm: 100.0 }, 48_000, 2, 9);
        let mut b = Synth::new(SynthKind::Music { bpm: 100.0 }, 48_000, 2, 9);
        let mut x = vec![0.0; 2 * 96_000];
        let mut y = vec![0.0; 2 * 96_000];
        a.fill(&mut x);
        b.fill(&mut y);
        assert_eq!(x, y);
        assert!(x.iter().all(|v| v.abs() <= 1.0));
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt();
        assert!(rms > 0.02, "rms {rms}");
        assert_ne!(
            x[0..96_000].iter().step_by(2).sum::<f32>(),
            x[1..96_000].iter().step_by(2).sum::<f32>()
        );
    }
}
