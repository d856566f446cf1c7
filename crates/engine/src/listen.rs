//! A listener's measure of a few steady tones: what an ear would notice in a played stream.
//!
//! Benches and tests play known steady tones through netjam and judge what came out the way
//! a listener would: [`listen`] cuts a mono signal into windows of [`WINDOW_SECONDS`] (hop
//! half a window) after the first [`Tones::skip_seconds`], and in each one reads
//!
//! - each tone's **pitch**: the peak of the Hann-windowed spectrum within ±[`SEARCH_BAND`]
//!   of its nominal frequency, as an error in cents;
//! - each tone's **level**, in dB relative to a full-scale sine;
//! - the **residual**: what is left once every present tone, at the frequency found, has
//!   been fitted away by least squares (DC plus a sine and a cosine per tone), relative to
//!   the window's power. A steady tone leaves nothing; a splice, a concealment burst, noise,
//!   clipping or a pitch step leaves a residual above [`GLITCH_RESIDUAL_DB`], and the window
//!   is a **glitch window**. A window whose mean power is below [`SILENT_POWER`] (−80 dBFS)
//!   is silent: nothing to hear where a tone should be, so a glitch too.
//!
//! Its [`ListenSummary`] keeps the worst pitch error and when, the glitch windows, and each
//! tone's median level relative to the loudest present tone (an absent tone should be far
//! below it: it is the player's own tone leaking back, or a wrong stream).
//!
//! The peak is found by evaluating the windowed spectrum (a DTFT, by Goertzel's recurrence)
//! directly at arbitrary frequencies: a grid of half a bin across the search band, then
//! successive parabolas through three points around the best, their spacing shrunk tenfold
//! each time, down to a thousandth of a bin. This finds the spectrum's true maximum to a
//! millionth of a cent with no FFT and no dependency, and costs a few dozen passes over a
//! window per tone, since only the narrow band around each tone is ever evaluated. A
//! zero-padded FFT is quantized to its bin spacing (a 2^20-point FFT at 48 kHz: 0.05 Hz, 0.2
//! cents at 440 Hz) and parabolic interpolation between its bins is biased; neither limits
//! this measure.
//!
//! It is analysis code for tests, benches and reports: it allocates freely and must never be
//! called from realtime code. It judges only steady tones; music or noise as the signal
//! reads as one long glitch.

use std::f64::consts::PI;
use std::fmt;

use serde::Serialize;
use thiserror::Error;

/// Length of one analysis window, in seconds; windows start every half window.
pub const WINDOW_SECONDS: f64 = 0.2;
/// A tone's peak is looked for within this fraction of its nominal frequency either side.
pub const SEARCH_BAND: f64 = 0.03;
/// A present tone that reads this far (dB) below its own median level in a window is not
/// there (a member who left, a stream that stopped): the peak found in its search band is
/// some other sound, so it has no pitch to judge in that window (its level still counts).
pub const GONE_DB: f64 = 20.0;
/// A window whose residual is above this (dB relative to the window's power) is a glitch.
pub const GLITCH_RESIDUAL_DB: f64 = -30.0;
/// A window whose mean power (a full-scale square wave is 1) is below this is silent:
/// −80 dBFS.
pub const SILENT_POWER: f64 = 1e-8;
/// The lowest sample rate measured: a window must hold a few hundred samples.
pub const MIN_RATE: u32 = 1000;
/// Windows the signal must hold after the skipped start.
const MIN_WINDOWS: usize = 3;
/// Levels and residuals never read below this floor (dB), so silence stays finite.
const FLOOR_DB: f64 = -200.0;

/// Why a signal cannot be measured.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ListenError {
    #[error("no samples to listen to")]
    Empty,
    #[error("sample rate {rate} Hz is too low to measure (at least {MIN_RATE} Hz)")]
    RateTooLow { rate: u32 },
    #[error("no present tone given: name at least one tone that must be heard")]
    NoPresentTones,
    #[error("tone {hz} Hz cannot be measured at {rate} Hz (it must be above 0 and below Nyquist)")]
    ToneOutOfRange { hz: f64, rate: u32 },
    #[error("cannot skip {seconds} s: give a finite, non-negative time")]
    BadSkip { seconds: f64 },
    #[error("sample {index} is not a finite number")]
    NotFinite { index: usize },
    #[error("{seconds:.2} s after the skipped start is too short: at least {needed:.2} s needed")]
    TooShort { seconds: f64, needed: f64 },
    #[error("silent throughout ({windows} windows below -80 dBFS)")]
    SilentThroughout { windows: usize },
}

/// The tones a listener expects: those that must be heard, those that must not, and how
/// much of the start to skip (a stream's first moments, before playout settles).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tones {
    /// Frequencies (Hz) that must be heard, steady.
    pub present: Vec<f64>,
    /// Frequencies (Hz) that must not be heard.
    pub absent: Vec<f64>,
    /// Seconds at the start left out of the measure.
    pub skip_seconds: f64,
}

impl Tones {
    /// These tones must be heard; nothing is absent and nothing skipped.
    pub fn present(hz: &[f64]) -> Self {
        Self {
            present: hz.to_vec(),
            absent: Vec::new(),
            skip_seconds: 0.0,
        }
    }

    /// And these must not be heard.
    pub fn absent(mut self, hz: &[f64]) -> Self {
        self.absent = hz.to_vec();
        self
    }

    /// And the first `seconds` are left out.
    pub fn skip(mut self, seconds: f64) -> Self {
        self.skip_seconds = seconds;
        self
    }
}

/// One tone as read in one window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ToneReading {
    /// The frequency expected (Hz).
    pub nominal_hz: f64,
    /// Where the spectrum peaks within the search band (Hz).
    pub found_hz: f64,
    /// `found_hz` relative to `nominal_hz`, in cents.
    pub cents: f64,
    /// The peak's level, in dB relative to a full-scale sine.
    pub level_db: f64,
}

/// What one window holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowReading {
    /// Where the window starts, in seconds from the start of the signal.
    pub start_seconds: f64,
    /// Mean power in dB (a full-scale square wave is 0 dB).
    pub power_db: f64,
    /// The present tones, in the order given; empty when the window is silent.
    pub present: Vec<ToneReading>,
    /// The absent tones, in the order given; empty when the window is silent.
    pub absent: Vec<ToneReading>,
    /// What is left once the present tones are fitted away, in dB relative to the window's
    /// power; None when the window is silent.
    pub residual_db: Option<f64>,
}

impl WindowReading {
    /// Below [`SILENT_POWER`]: nothing to hear.
    pub fn is_silent(&self) -> bool {
        self.residual_db.is_none()
    }

    /// Silent, or a residual above [`GLITCH_RESIDUAL_DB`].
    pub fn is_glitch(&self) -> bool {
        self.residual_db.map_or(true, |r| r > GLITCH_RESIDUAL_DB)
    }
}

/// A glitch window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Glitch {
    /// Where the window starts, in seconds from the start of the signal.
    pub at_seconds: f64,
    /// Its residual (dB); None when the window is silent.
    pub residual_db: Option<f64>,
}

/// A tone's level over the whole measure.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ToneLevel {
    pub hz: f64,
    /// Median over the windows that are not silent, in dB relative to a full-scale sine.
    pub median_db: f64,
    /// `median_db` relative to the loudest present tone's.
    pub relative_db: f64,
}

/// The measure in a few numbers; `Display` prints it on one line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ListenSummary {
    /// Windows measured.
    pub windows: usize,
    /// Of those, how many were silent.
    pub silent_windows: usize,
    /// The largest pitch error of any present tone in any window (cents, signed).
    pub worst_cents: f64,
    /// When the window holding it starts (seconds from the start of the signal).
    pub worst_cents_at_seconds: f64,
    /// Every glitch window, in time order.
    pub glitches: Vec<Glitch>,
    /// The present tones' levels, in the order given.
    pub present: Vec<ToneLevel>,
    /// The absent tones' levels, in the order given.
    pub absent: Vec<ToneLevel>,
}

impl ListenSummary {
    /// How many windows glitched (silent ones included).
    pub fn glitch_windows(&self) -> usize {
        self.glitches.len()
    }

    /// The quietest present tone relative to the loudest (0 with one tone).
    pub fn weakest_present_db(&self) -> f64 {
        self.present.iter().map(|t| t.relative_db).fold(0.0, f64::min)
    }

    /// The loudest absent tone relative to the loudest present tone; None if no tone is
    /// absent.
    pub fn loudest_absent_db(&self) -> Option<f64> {
        self.absent.iter().map(|t| t.relative_db).reduce(f64::max)
    }
}

/// Glitch windows printed in the one-line summary; more are marked "...".
const GLITCHES_SHOWN: usize = 6;

impl fmt::Display for ListenSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tones")?;
        for t in &self.present {
            write!(f, " {}:{:+.0}dB", t.hz, t.relative_db)?;
        }
        if !self.absent.is_empty() {
            f.write_str(" absent")?;
            for t in &self.absent {
                write!(f, " {}:{:+.0}dB", t.hz, t.relative_db)?;
            }
        }
        write!(
            f,
            "; pitch worst {:+.1} cents at {:.1} s; {} glitch windows",
            self.worst_cents,
            self.worst_cents_at_seconds,
            self.glitches.len()
        )?;
        if !self.glitches.is_empty() {
            f.write_str(" (")?;
            for (i, g) in self.glitches.iter().take(GLITCHES_SHOWN).enumerate() {
                if i > 0 {
                    f.write_str(" ")?;
                }
                match g.residual_db {
                    Some(r) => write!(f, "{:.1}s:{r:+.0}dB", g.at_seconds)?,
                    None => write!(f, "{:.1}s:silent", g.at_seconds)?,
                }
            }
            if self.glitches.len() > GLITCHES_SHOWN {
                f.write_str(" ...")?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// Every window's reading and their summary.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Listening {
    pub windows: Vec<WindowReading>,
    pub summary: ListenSummary,
}

impl Listening {
    /// The largest pitch error of any present tone in a window without a glitch (cents,
    /// signed; 0 when every window glitched): how far out of tune the sound is where it is
    /// whole. A glitch window has no pitch worth reading (a splice moves the spectrum's
    /// peak); it is counted in [`ListenSummary::glitches`] instead.
    pub fn worst_clean_cents(&self) -> f64 {
        self.windows
            .iter()
            .filter(|w| !w.is_glitch())
            .flat_map(|w| &w.present)
            .map(|t| t.cents)
            .fold(0.0, |worst, c| if c.abs() > worst.abs() { c } else { worst })
    }
}

/// Measures `tones` in `samples` (mono, at `rate` Hz, full scale ±1), window by window.
///
/// Windows are [`WINDOW_SECONDS`] long, one every half window from
/// [`Tones::skip_seconds`]; the last one ends before the signal does.
pub fn listen(samples: &[f32], rate: u32, tones: &Tones) -> Result<Listening, ListenError> {
    check(samples, rate, tones)?;
    let r = f64::from(rate);
    let win = (WINDOW_SECONDS * r) as usize;
    let hop = win / 2;
    let start = (tones.skip_seconds * r) as usize;
    let left = samples.len().saturating_sub(start);
    if left < win * MIN_WINDOWS {
        return Err(ListenError::TooShort {
            seconds: left as f64 / r,
            needed: (win * MIN_WINDOWS) as f64 / r,
        });
    }
    let mut window = Window::new(win, rate, tones.present.len());
    let windows: Vec<WindowReading> = (start..samples.len() - win)
        .step_by(hop)
        .map(|s0| window.read(&samples[s0..s0 + win], s0 as f64 / r, tones))
        .collect();
    let summary = summarize(&windows, tones)?;
    Ok(Listening { windows, summary })
}

fn check(samples: &[f32], rate: u32, tones: &Tones) -> Result<(), ListenError> {
    if rate < MIN_RATE {
        return Err(ListenError::RateTooLow { rate });
    }
    if samples.is_empty() {
        return Err(ListenError::Empty);
    }
    if tones.present.is_empty() {
        return Err(ListenError::NoPresentTones);
    }
    let top = f64::from(rate) / 2.0 / (1.0 + SEARCH_BAND);
    if let Some(&hz) = tones
        .present
        .iter()
        .chain(&tones.absent)
        .find(|hz| !(**hz > 0.0 && **hz < top))
    {
        return Err(ListenError::ToneOutOfRange { hz, rate });
    }
    if !(tones.skip_seconds >= 0.0 && tones.skip_seconds.is_finite()) {
        return Err(ListenError::BadSkip {
            seconds: tones.skip_seconds,
        });
    }
    if let Some(index) = samples.iter().position(|x| !x.is_finite()) {
        return Err(ListenError::NotFinite { index });
    }
    Ok(())
}

fn summarize(windows: &[WindowReading], tones: &Tones) -> Result<ListenSummary, ListenError> {
    let heard: Vec<&WindowReading> = windows.iter().filter(|w| !w.is_silent()).collect();
    if heard.is_empty() {
        return Err(ListenError::SilentThroughout {
            windows: windows.len(),
        });
    }
    let medians = |pick: fn(&WindowReading) -> &[ToneReading], n: usize| -> Vec<f64> {
        (0..n)
            .map(|i| median(heard.iter().map(|w| pick(w)[i].level_db).collect()))
            .collect()
    };
    let present = medians(|w| w.present.as_slice(), tones.present.len());
    let absent = medians(|w| w.absent.as_slice(), tones.absent.len());
    let (mut worst_cents, mut worst_cents_at_seconds) = (0.0f64, 0.0);
    for w in &heard {
        for (t, median_db) in w.present.iter().zip(&present) {
            if t.level_db > median_db - GONE_DB && t.cents.abs() > worst_cents.abs() {
                (worst_cents, worst_cents_at_seconds) = (t.cents, w.start_seconds);
            }
        }
    }
    let glitches = windows
        .iter()
        .filter(|w| w.is_glitch())
        .map(|w| Glitch {
            at_seconds: w.start_seconds,
            residual_db: w.residual_db,
        })
        .collect();
    let top = present.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let levels = |hz: &[f64], db: Vec<f64>| -> Vec<ToneLevel> {
        hz.iter()
            .zip(db)
            .map(|(&hz, median_db)| ToneLevel {
                hz,
                median_db,
                relative_db: median_db - top,
            })
            .collect()
    };
    Ok(ListenSummary {
        windows: windows.len(),
        silent_windows: windows.len() - heard.len(),
        worst_cents,
        worst_cents_at_seconds,
        glitches,
        present: levels(&tones.present, present),
        absent: levels(&tones.absent, absent),
    })
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => FLOOR_DB,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn to_db(power_ratio: f64) -> f64 {
    (10.0 * power_ratio.log10()).max(FLOOR_DB)
}

/// One window's buffers, reused from window to window.
#[derive(Debug)]
struct Window {
    rate: f64,
    hann: Vec<f64>,
    /// Sum of the Hann window: a sine of amplitude A peaks at A·sum/2.
    hann_sum: f64,
    /// The window's samples.
    x: Vec<f64>,
    /// The samples times the Hann window.
    xw: Vec<f64>,
    /// The least-squares fit's columns, one window long each: DC, then a sine and a cosine
    /// per present tone.
    columns: Vec<Vec<f64>>,
}

impl Window {
    fn new(len: usize, rate: u32, present: usize) -> Self {
        // Symmetric Hann, zero at both ends.
        let span = (len.max(2) - 1) as f64;
        let hann: Vec<f64> = (0..len)
            .map(|n| 0.5 - 0.5 * (2.0 * PI * n as f64 / span).cos())
            .collect();
        let hann_sum = hann.iter().sum();
        Self {
            rate: f64::from(rate),
            hann,
            hann_sum,
            x: vec![0.0; len],
            xw: vec![0.0; len],
            columns: vec![vec![0.0; len]; 1 + 2 * present],
        }
    }

    fn read(&mut self, samples: &[f32], start_seconds: f64, tones: &Tones) -> WindowReading {
        for (x, &s) in self.x.iter_mut().zip(samples) {
            *x = f64::from(s);
        }
        let power = self.x.iter().map(|v| v * v).sum::<f64>() / self.x.len() as f64;
        let power_db = to_db(power);
        if power < SILENT_POWER {
            return WindowReading {
                start_seconds,
                power_db,
                present: Vec::new(),
                absent: Vec::new(),
                residual_db: None,
            };
        }
        for ((xw, x), w) in self.xw.iter_mut().zip(&self.x).zip(&self.hann) {
            *xw = x * w;
        }
        let present: Vec<ToneReading> = tones.present.iter().map(|&hz| self.tone(hz)).collect();
        let absent = tones.absent.iter().map(|&hz| self.tone(hz)).collect();
        let residual = self.residual(&present) / power;
        WindowReading {
            start_seconds,
            power_db,
            present,
            absent,
            residual_db: Some(to_db(residual)),
        }
    }

    /// The spectrum's peak within the search band around `nominal`.
    fn tone(&self, nominal: f64) -> ToneReading {
        let (lo, hi) = (nominal * (1.0 - SEARCH_BAND), nominal * (1.0 + SEARCH_BAND));
        // Half a bin: the grid's best point lies on the main lobe of the band's highest peak.
        let step = self.rate / (2.0 * self.xw.len() as f64);
        let n = ((hi - lo) / step).ceil() as usize;
        let grid: Vec<f64> = (0..=n).map(|i| (lo + i as f64 * step).min(hi)).collect();
        let mut db = vec![0.0; grid.len()];
        for (f, p) in grid.chunks(4).zip(db.chunks_mut(4)) {
            let mut lane = [f[0]; 4];
            lane[..f.len()].copy_from_slice(f);
            let got = self.powers_db(lane);
            p.copy_from_slice(&got[..p.len()]);
        }
        let best = (0..grid.len())
            .max_by(|&a, &b| db[a].total_cmp(&db[b]))
            .unwrap_or(0);
        let near = |i: usize| i.min(grid.len() - 1);
        // Three points around the best, then successive parabolas, a tenth the spacing each.
        let (i0, i2) = match best {
            0 => (0, near(2)),
            b if b + 1 == grid.len() => (b.saturating_sub(2), b),
            b => (b - 1, b + 1),
        };
        let mut points = [
            (grid[i0], db[i0]),
            (grid[(i0 + i2) / 2], db[(i0 + i2) / 2]),
            (grid[i2], db[i2]),
        ];
        let (mut peak_hz, mut peak_db) = (grid[best], db[best]);
        let mut spacing = step;
        for _ in 0..3 {
            let vertex = parabola_vertex(points, peak_hz, spacing).clamp(lo, hi);
            spacing /= 10.0;
            let at = [(vertex - spacing).max(lo), vertex, (vertex + spacing).min(hi)];
            let at = if at[0] == at[1] {
                [lo, lo + spacing, lo + 2.0 * spacing]
            } else if at[1] == at[2] {
                [hi - 2.0 * spacing, hi - spacing, hi]
            } else {
                at
            };
            let got = self.powers_db([at[0], at[1], at[2], at[1]]);
            points = [(at[0], got[0]), (at[1], got[1]), (at[2], got[2])];
            (peak_hz, peak_db) = points
                .into_iter()
                .fold((peak_hz, peak_db), |b, p| if p.1 > b.1 { p } else { b });
        }
        let found_hz = parabola_vertex(points, peak_hz, spacing).clamp(lo, hi);
        // Power of the peak relative to that of a full-scale sine's (sum/2 squared).
        let full = (self.hann_sum / 2.0).powi(2);
        ToneReading {
            nominal_hz: nominal,
            found_hz,
            cents: 1200.0 * (found_hz / nominal).log2(),
            level_db: (peak_db - 10.0 * full.log10()).max(FLOOR_DB),
        }
    }

    /// |X(f)|² of the windowed samples at four frequencies, in dB, by Goertzel's recurrence
    /// (four at once, so the four chains overlap).
    fn powers_db(&self, hz: [f64; 4]) -> [f64; 4] {
        let k = hz.map(|f| 2.0 * (2.0 * PI * f / self.rate).cos());
        let (mut s1, mut s2) = ([0.0f64; 4], [0.0f64; 4]);
        for &v in &self.xw {
            for j in 0..4 {
                let s0 = v + k[j] * s1[j] - s2[j];
                s2[j] = s1[j];
                s1[j] = s0;
            }
        }
        std::array::from_fn(|j| {
            let p = s1[j] * s1[j] + s2[j] * s2[j] - k[j] * s1[j] * s2[j];
            10.0 * p.max(1e-300).log10()
        })
    }

    /// Mean square of what is left once DC and a sine and cosine at each present tone's
    /// found frequency are fitted to the window by least squares.
    fn residual(&mut self, present: &[ToneReading]) -> f64 {
        let len = self.x.len();
        self.columns[0].fill(1.0);
        for (i, t) in present.iter().enumerate() {
            // The phasor turns by w each sample; the recurrence stays accurate to ~1e-12
            // over a window.
            let w = 2.0 * PI * t.found_hz / self.rate;
            let (sw, cw) = w.sin_cos();
            let (mut s, mut c) = (0.0f64, 1.0f64);
            let (sin, rest) = self.columns[1 + 2 * i..].split_at_mut(1);
            for n in 0..len {
                sin[0][n] = s;
                rest[0][n] = c;
                (s, c) = (s * cw + c * sw, c * cw - s * sw);
            }
        }
        let m = 1 + 2 * present.len();
        let cols = &self.columns[..m];
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let gram: Vec<Vec<f64>> = (0..m)
            .map(|i| (0..m).map(|j| dot(&cols[i], &cols[j])).collect())
            .collect();
        let rhs: Vec<f64> = cols.iter().map(|c| dot(c, &self.x)).collect();
        let coef = solve_least_squares(&gram, &rhs);
        let mut sum = 0.0;
        for n in 0..len {
            let fit: f64 = cols.iter().zip(&coef).map(|(c, a)| c[n] * a).sum();
            let e = self.x[n] - fit;
            sum += e * e;
        }
        sum / len as f64
    }
}

/// The vertex of the parabola through three (x, y) points; `fallback` when they do not
/// bend down. It moves at most `reach` beyond the outer points.
fn parabola_vertex(p: [(f64, f64); 3], fallback: f64, reach: f64) -> f64 {
    let [(a, fa), (b, fb), (c, fc)] = p;
    let num = (b - a).powi(2) * (fb - fc) - (b - c).powi(2) * (fb - fa);
    let den = (b - a) * (fb - fc) - (b - c) * (fb - fa);
    // Concave down: the middle point lies above the chord.
    let chord = fa + (fc - fa) * (b - a) / (c - a);
    let bends_down = den.abs() > 0.0 && fb > chord && c > a;
    if !bends_down {
        return fallback;
    }
    let v = b - 0.5 * num / den;
    if v.is_finite() {
        v.clamp(a - reach, c + reach)
    } else {
        fallback
    }
}

/// Solves the normal equations `gram · x = rhs` (symmetric, positive semi-definite) by
/// Cholesky; a column that depends on earlier ones (two tones found at one frequency)
/// gets coefficient 0, which leaves the least-squares residual unchanged.
fn solve_least_squares(gram: &[Vec<f64>], rhs: &[f64]) -> Vec<f64> {
    let m = rhs.len();
    let mut l = vec![vec![0.0; m]; m];
    let mut kept = vec![false; m];
    for j in 0..m {
        let d = gram[j][j] - (0..j).map(|k| l[j][k] * l[j][k]).sum::<f64>();
        let independent = d > 1e-12 * gram[j][j];
        if !independent {
            continue;
        }
        kept[j] = true;
        let ljj = d.sqrt();
        l[j][j] = ljj;
        for i in j + 1..m {
            let s = gram[i][j] - (0..j).map(|k| l[i][k] * l[j][k]).sum::<f64>();
            l[i][j] = s / ljj;
        }
    }
    let mut z = vec![0.0; m];
    for i in 0..m {
        if kept[i] {
            z[i] = (rhs[i] - (0..i).map(|k| l[i][k] * z[k]).sum::<f64>()) / l[i][i];
        }
    }
    let mut x = vec![0.0; m];
    for i in (0..m).rev() {
        if kept[i] {
            x[i] = (z[i] - (i + 1..m).map(|k| l[k][i] * x[k]).sum::<f64>()) / l[i][i];
        }
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: u32 = 48_000;

    /// A sine whose frequency at each sample is `hz(t)`, phase accumulated (no jumps).
    fn glide(seconds: f64, amp: f64, hz: impl Fn(f64) -> f64) -> Vec<f32> {
        let r = f64::from(RATE);
        let mut phase = 0.0f64;
        (0..(seconds * r) as usize)
            .map(|n| {
                let v = amp * phase.sin();
                phase = (phase + 2.0 * PI * hz(n as f64 / r) / r) % (2.0 * PI);
                v as f32
            })
            .collect()
    }

    fn sine(hz: f64, amp: f64, seconds: f64) -> Vec<f32> {
        glide(seconds, amp, |_| hz)
    }

    fn glitch_times(l: &Listening) -> Vec<f64> {
        l.summary.glitches.iter().map(|g| g.at_seconds).collect()
    }

    /// Every glitch window holds `at`, and there is at least one.
    fn glitches_only_at(l: &Listening, at: f64) {
        let times = glitch_times(l);
        assert!(!times.is_empty(), "no glitch at {at} s: {}", l.summary);
        assert!(
            times.iter().all(|&s| s <= at && at < s + WINDOW_SECONDS),
            "glitches away from {at} s: {}",
            l.summary
        );
    }

    #[test]
    fn a_pure_tone_reads_its_pitch_and_never_glitches() {
        let l = listen(&sine(440.0, 0.5, 3.0), RATE, &Tones::present(&[440.0])).unwrap();
        assert_eq!(l.summary.glitch_windows(), 0, "{}", l.summary);
        assert!(l.summary.worst_cents.abs() < 0.05, "{}", l.summary);
        assert_eq!(l.summary.windows, 28);
        let t = l.windows[3].present[0];
        assert!((t.level_db - 20.0 * 0.5f64.log10()).abs() < 0.01, "{t:?}");
        assert!(l.windows.iter().all(|w| w.residual_db < Some(-100.0)));
    }

    #[test]
    fn a_tone_that_stops_has_no_pitch_where_it_is_gone() {
        // A tone that plays 2 s and stops, beside one that plays on (a member who leaves a
        // room): where it is gone, the peak of its search band is the edge of the band,
        // 1200 log2(0.97) = -52.7 cents, or the other tone's skirt; that is no pitch error.
        let mut x = sine(440.0, 0.25, 4.0);
        for (i, v) in sine(660.0, 0.25, 4.0).iter().enumerate() {
            x[i] += if i < 2 * RATE as usize { *v } else { 0.0 };
        }
        let l = listen(&x, RATE, &Tones::present(&[440.0, 660.0])).unwrap();
        let gone = l.windows.iter().filter(|w| w.start_seconds > 2.1).count();
        assert!(gone > 10, "{gone} windows after the stop");
        // (The window across the stop reads a tenth of a cent.)
        assert!(l.summary.worst_cents.abs() < 0.5, "{}", l.summary);
    }

    #[test]
    fn a_tone_five_cents_sharp_reads_five_cents() {
        let hz = 440.0 * 2f64.powf(5.0 / 1200.0);
        let l = listen(&sine(hz, 0.5, 3.0), RATE, &Tones::present(&[440.0])).unwrap();
        assert!((l.summary.worst_cents - 5.0).abs() < 0.1, "{}", l.summary);
        assert!(l.windows.iter().all(|w| (w.present[0].cents - 5.0).abs() < 0.1));
        assert_eq!(l.summary.glitch_windows(), 0, "{}", l.summary);
        assert!(
            (l.worst_clean_cents() - 5.0).abs() < 0.1,
            "{}",
            l.worst_clean_cents()
        );
    }

    #[test]
    fn a_splice_glitches_the_windows_that_hold_it_and_no_others() {
        let at = 1.53;
        let r = f64::from(RATE);
        let x: Vec<f32> = (0..3 * RATE as usize)
            .map(|n| {
                let t = n as f64 / r;
                let jump = if t >= at { PI / 2.0 } else { 0.0 };
                (0.5 * (2.0 * PI * 440.0 * t + jump).sin()) as f32
            })
            .collect();
        let l = listen(&x, RATE, &Tones::present(&[440.0])).unwrap();
        glitches_only_at(&l, at);
        // The splice moves the peak in the windows that hold it; where the tone is whole it
        // reads true.
        assert!(l.worst_clean_cents().abs() < 0.1, "{}", l.worst_clean_cents());
    }

    #[test]
    fn five_milliseconds_of_silence_glitch_where_they_are() {
        let mut x = sine(440.0, 0.5, 3.0);
        let from = (2.05 * f64::from(RATE)) as usize;
        x[from..from + 240].fill(0.0);
        let l = listen(&x, RATE, &Tones::present(&[440.0])).unwrap();
        glitches_only_at(&l, 2.05);
    }

    #[test]
    fn silent_windows_count_as_glitches() {
        let mut x = sine(440.0, 0.5, 3.0);
        x[RATE as usize..RATE as usize * 3 / 2].fill(0.0);
        let l = listen(&x, RATE, &Tones::present(&[440.0])).unwrap();
        assert_eq!(l.summary.silent_windows, 4, "{}", l.summary);
        assert!(l.summary.to_string().contains("1.1s:silent"), "{}", l.summary);
        // Silent windows neither pull the tone's level down nor read a pitch.
        assert!(l.summary.present[0].median_db > -6.1, "{}", l.summary);
        assert!(l
            .windows
            .iter()
            .filter(|w| w.is_silent())
            .all(|w| w.present.is_empty()));
    }

    #[test]
    fn playing_half_a_percent_fast_reads_as_a_pitch_bend() {
        // What resampling faster to give latency back sounds like: 0.4 s at 1.005 times the
        // pitch, 8.64 cents sharp.
        let x = glide(3.0, 0.5, |t| {
            if (1.0..1.4).contains(&t) {
                440.0 * 1.005
            } else {
                440.0
            }
        });
        let l = listen(&x, RATE, &Tones::present(&[440.0])).unwrap();
        let cents = 1200.0 * 1.005f64.log2();
        assert!((l.summary.worst_cents - cents).abs() < 0.1, "{}", l.summary);
        assert!(
            (1.0..=1.2).contains(&l.summary.worst_cents_at_seconds),
            "{}",
            l.summary
        );
        for w in l
            .windows
            .iter()
            .filter(|w| (1.0..=1.2).contains(&w.start_seconds))
        {
            assert!((w.present[0].cents - cents).abs() < 0.1, "{w:?}");
        }
    }

    #[test]
    fn a_clipped_chord_glitches_every_window() {
        let (a, b) = (sine(440.0, 0.6, 2.0), sine(660.0, 0.6, 2.0));
        let x: Vec<f32> = a.iter().zip(&b).map(|(a, b)| (a + b).clamp(-0.5, 0.5)).collect();
        let l = listen(&x, RATE, &Tones::present(&[440.0, 660.0])).unwrap();
        assert_eq!(l.summary.glitch_windows(), l.summary.windows, "{}", l.summary);
    }

    #[test]
    fn an_absent_tone_reads_far_below_two_present_ones() {
        let (a, b) = (sine(440.0, 0.4, 3.0), sine(660.0, 0.4, 3.0));
        let x: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + b).collect();
        let tones = Tones::present(&[440.0, 660.0]).absent(&[550.0]).skip(0.5);
        let l = listen(&x, RATE, &tones).unwrap();
        let s = &l.summary;
        assert_eq!(s.glitch_windows(), 0, "{s}");
        assert!(s.weakest_present_db() > -0.1, "{s}");
        assert!(s.loudest_absent_db() < Some(-60.0), "{s}");
        assert!(s.worst_cents.abs() < 0.05, "{s}");
        assert!(l.windows[0].start_seconds == 0.5);
    }

    #[test]
    fn noise_twenty_db_down_glitches_every_window() {
        let (a, b) = (sine(440.0, 0.4, 3.0), sine(660.0, 0.4, 3.0));
        // Uniform noise of RMS 0.04, 20 dB below the chord's 0.4.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut noise = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            ((seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 0.04 * 12f64.sqrt()
        };
        let x: Vec<f32> = a
            .iter()
            .zip(&b)
            .map(|(a, b)| (f64::from(a + b) + noise()) as f32)
            .collect();
        let tones = Tones::present(&[440.0, 660.0]).absent(&[550.0]);
        let l = listen(&x, RATE, &tones).unwrap();
        assert_eq!(l.summary.glitch_windows(), l.summary.windows, "{}", l.summary);
        for g in &l.summary.glitches {
            let r = g.residual_db.unwrap();
            assert!((-21.0..-19.0).contains(&r), "{}", l.summary);
        }
    }

    #[test]
    fn bad_input_is_a_typed_error() {
        let tone = sine(440.0, 0.5, 2.0);
        let a4 = Tones::present(&[440.0]);
        assert_eq!(listen(&[], RATE, &a4), Err(ListenError::Empty));
        assert_eq!(listen(&tone, 0, &a4), Err(ListenError::RateTooLow { rate: 0 }));
        assert_eq!(
            listen(&tone, RATE, &Tones::present(&[])),
            Err(ListenError::NoPresentTones)
        );
        assert!(matches!(
            listen(&tone[..20_000], RATE, &a4),
            Err(ListenError::TooShort { .. })
        ));
        assert!(matches!(
            listen(&tone, RATE, &a4.clone().skip(1.6)),
            Err(ListenError::TooShort { .. })
        ));
        assert!(matches!(
            listen(&tone, RATE, &a4.clone().skip(1e300)),
            Err(ListenError::TooShort { .. })
        ));
        let mut nan = tone.clone();
        nan[1234] = f32::NAN;
        assert_eq!(
            listen(&nan, RATE, &a4),
            Err(ListenError::NotFinite { index: 1234 })
        );
        nan[1234] = f32::INFINITY;
        assert_eq!(
            listen(&nan, RATE, &a4),
            Err(ListenError::NotFinite { index: 1234 })
        );
        for hz in [0.0, -1.0, 24_000.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                listen(&tone, RATE, &Tones::present(&[hz])),
                Err(ListenError::ToneOutOfRange { .. })
            ));
            assert!(matches!(
                listen(&tone, RATE, &a4.clone().absent(&[hz])),
                Err(ListenError::ToneOutOfRange { .. })
            ));
        }
        for s in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                listen(&tone, RATE, &a4.clone().skip(s)),
                Err(ListenError::BadSkip { .. })
            ));
        }
        assert_eq!(
            listen(&vec![0.0; 96_000], RATE, &a4),
            Err(ListenError::SilentThroughout { windows: 18 })
        );
    }

    #[test]
    fn odd_tones_and_rates_never_panic() {
        let x = sine(440.0, 0.5, 2.0);
        for rate in [MIN_RATE, 8000, 44_100, 96_000] {
            let top = f64::from(rate) / 2.07;
            for hz in [0.01, 1.0, 20.0, 440.0, 3000.0, top].map(|hz: f64| hz.min(top)) {
                let tones = Tones::present(&[hz, hz]).absent(&[hz]);
                let got = listen(&x, rate, &tones);
                assert!(got.is_ok(), "{rate} Hz, tone {hz}: {got:?}");
            }
        }
        // A tone at the edge of the band is found at the edge.
        let l = listen(&x, RATE, &Tones::present(&[400.0])).unwrap();
        assert!((l.windows[0].present[0].found_hz - 412.0).abs() < 1e-9);
    }

    #[test]
    fn the_summary_prints_on_one_line_and_serializes() {
        let at = |at_seconds, residual_db| Glitch {
            at_seconds,
            residual_db,
        };
        let s = ListenSummary {
            windows: 50,
            silent_windows: 1,
            worst_cents: 3.46,
            worst_cents_at_seconds: 3.5,
            glitches: vec![
                at(3.4, Some(-19.2)),
                at(4.0, Some(-21.0)),
                at(4.1, None),
                at(4.2, Some(-3.0)),
                at(4.3, Some(-3.0)),
                at(4.4, Some(-3.0)),
                at(4.5, Some(-3.0)),
            ],
            present: vec![ToneLevel {
                hz: 660.0,
                median_db: -6.0,
                relative_db: 0.0,
            }],
            absent: vec![ToneLevel {
                hz: 440.5,
                median_db: -113.0,
                relative_db: -107.0,
            }],
        };
        assert_eq!(
            s.to_string(),
            "tones 660:+0dB absent 440.5:-107dB; pitch worst +3.5 cents at 3.5 s; 7 glitch windows \
             (3.4s:-19dB 4.0s:-21dB 4.1s:silent 4.2s:-3dB 4.3s:-3dB 4.4s:-3dB ...)"
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["glitches"][2]["residual_db"], serde_json::Value::Null);
        assert_eq!(json["absent"][0]["relative_db"], -107.0);
    }
}
