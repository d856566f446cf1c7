//! The listener's own mix: every member's stream summed with its gain, pan and mute, plus
//! the player's own signal (the local monitor), which never goes through the network.
//!
//! [`Mixer`] has one strip per member slot (the slots of
//! [`crate::members::MemberReceivers`]) and one for the monitor. Each period the caller
//! zeroes the output ([`Mixer::begin`]), adds each member's frames ([`Mixer::add`]) and the
//! monitor's ([`Mixer::add_monitor`]). A member's frames may have any channel count:
//!
//! * mono into a stereo (or wider) output is panned with the equal-power law (centre is
//!   −3 dB in each of the first two channels);
//! * stereo into stereo (or wider): pan is a balance (centre leaves both sides alone);
//! * as many channels as the output: channel to channel;
//! * into a mono output: the channels are averaged;
//! * otherwise the channels both have are copied, the rest dropped or left silent.
//!
//! Solo: while any member is soloed, only the soloed members are heard (the monitor, your
//! own signal, stays as it is set).
//!
//! Gain, pan, mute and solo never click: the per-channel gains they make move to a new value in a
//! linear ramp ([`Mixer::set_ramp_frames`], 10 ms by default) that ends exactly on it, so
//! unity gain passes audio bit-exactly and a mute is exact silence. A strip whose gain is
//! zero and at rest is skipped. Each strip meters what it is given, before its gain (so a
//! muted member still shows signal): peak and RMS since the last [`Mixer::take_level`].
//!
//! The period ends with [`Mixer::finish`]: the sum goes through the master gain (ramped
//! like a strip's, [`Mixer::set_master_gain`]) and then the output limiter
//! ([`crate::limiter`]), so no sample played exceeds full scale however many loud members
//! are summed. A mix that stays at or below −3 dBFS with the master at 0 dB leaves
//! `finish` bit-exactly as it came; [`Mixer::take_limiter`] reads what the limiter did.
//!
//! Realtime: everything is reserved in [`Mixer::new`]; parameter changes are plain method
//! calls on the audio thread (the caller takes them off a lock-free queue). Nothing here
//! allocates, locks or blocks.

use crate::limiter::{Limiter, LimiterStats};

/// Loudest gain accepted, linear (+12 dB).
pub const MAX_GAIN: f32 = 3.981_071_7;

/// A strip's settings.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct StripParams {
    /// Linear gain, 0..=[`MAX_GAIN`].
    pub gain: f32,
    /// −1 (left) ..= 1 (right).
    pub pan: f32,
    pub mute: bool,
    /// Soloed: while any member is, only the soloed ones are heard (the monitor, your own
    /// signal, is never silenced by a solo).
    pub solo: bool,
}

impl Default for StripParams {
    fn default() -> Self {
        Self {
            gain: 1.0,
            pan: 0.0,
            mute: false,
            solo: false,
        }
    }
}

/// A meter reading, linear full scale (1.0 = 0 dBFS).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Level {
    pub peak: f32,
    pub rms: f32,
}

impl Level {
    pub fn peak_dbfs(&self) -> f32 {
        amplitude_db(self.peak)
    }
    pub fn rms_dbfs(&self) -> f32 {
        amplitude_db(self.rms)
    }
}

/// An amplitude (or a linear gain) in dB, floored at -120 dB: the one conversion every
/// meter, gain read-out and statistic uses.
pub fn amplitude_db(x: f32) -> f32 {
    20.0 * x.max(1e-6).log10()
}

/// A decibel figure as a linear gain (−∞ dB is 0): the one conversion every fader uses.
pub fn db_to_gain(db: f32) -> f32 {
    if db == f32::NEG_INFINITY {
        0.0
    } else {
        10f32.powf(db / 20.0)
    }
}

/// A fader's linear gain: 0 when muted, else `db` as a gain.
pub fn fader_gain(db: f32, mute: bool) -> f32 {
    if mute {
        0.0
    } else {
        db_to_gain(db)
    }
}

/// A value moving linearly to its target over a fixed number of samples.
#[derive(Debug, Clone, Copy)]
struct Ramp {
    current: f32,
    target: f32,
    step: f32,
    left: u32,
}

impl Ramp {
    fn at(value: f32) -> Self {
        Self {
            current: value,
            target: value,
            step: 0.0,
            left: 0,
        }
    }

    fn set(&mut self, target: f32, frames: u32) {
        if target == self.target {
            return;
        }
        self.target = target;
        if frames == 0 {
            self.current = target;
            self.left = 0;
        } else {
            self.step = (target - self.current) / frames as f32;
            self.left = frames;
        }
    }

    #[inline]
    fn next(&mut self) -> f32 {
        if self.left > 0 {
            self.left -= 1;
            self.current = if self.left == 0 {
                self.target
            } else {
                self.current + self.step
            };
        }
        self.current
    }

    fn silent_at_rest(&self) -> bool {
        self.left == 0 && self.current == 0.0
    }
}

/// How a strip's channels reach the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Mono into the first two channels, panned.
    MonoPanned,
    /// Stereo into the first two channels, balanced.
    StereoBalanced,
    /// Averaged into one channel.
    Downmix,
    /// Channel `c` into channel `c` for the channels both have.
    Direct,
}

fn layout(input: usize, output: usize) -> Layout {
    match (input, output) {
        (1, o) if o >= 2 => Layout::MonoPanned,
        (2, o) if o >= 2 => Layout::StereoBalanced,
        (i, 1) if i > 1 => Layout::Downmix,
        _ => Layout::Direct,
    }
}

#[derive(Debug, Clone, Copy)]
struct Strip {
    params: StripParams,
    /// Gains of the first and second output channel (the first is used alone unless
    /// panned or balanced).
    gains: [Ramp; 2],
    /// Jump to the targets at the next block (a new member: nothing to ramp from).
    snap: bool,
    peak: f32,
    sum_sq: f64,
    samples: u64,
}

impl Strip {
    fn new() -> Self {
        Self {
            params: StripParams::default(),
            gains: [Ramp::at(0.0); 2],
            snap: true,
            peak: 0.0,
            sum_sq: 0.0,
            samples: 0,
        }
    }

    /// The gains the settings ask for in `layout`; `soloing`: some other strip is soloed.
    fn targets(&self, layout: Layout, soloing: bool) -> [f32; 2] {
        let p = self.params;
        let g = if p.mute || (soloing && !p.solo) {
            0.0
        } else {
            p.gain
        };
        match layout {
            Layout::MonoPanned => {
                let theta = (p.pan + 1.0) * std::f32::consts::FRAC_PI_4;
                // At the extremes exactly 0 and g, not cos's rounding.
                let (l, r) = match p.pan {
                    x if x <= -1.0 => (1.0, 0.0),
                    x if x >= 1.0 => (0.0, 1.0),
                    _ => (theta.cos(), theta.sin()),
                };
                [g * l, g * r]
            }
            Layout::StereoBalanced => [g * (1.0 - p.pan).min(1.0), g * (1.0 + p.pan).min(1.0)],
            Layout::Downmix | Layout::Direct => [g, g],
        }
    }

    fn meter(&mut self, input: &[f32]) {
        for &x in input {
            self.peak = self.peak.max(x.abs());
            self.sum_sq += f64::from(x) * f64::from(x);
        }
        self.samples += input.len() as u64;
    }

    fn take_level(&mut self) -> Level {
        let rms = if self.samples > 0 {
            (self.sum_sq / self.samples as f64).sqrt() as f32
        } else {
            0.0
        };
        let level = Level { peak: self.peak, rms };
        self.peak = 0.0;
        self.sum_sq = 0.0;
        self.samples = 0;
        level
    }

    /// Add `input` (`in_ch` interleaved) into `out` (`out_ch` interleaved).
    fn add(&mut self, input: &[f32], in_ch: usize, out: &mut [f32], out_ch: usize, ramp: u32, soloing: bool) {
        if in_ch == 0 || out_ch == 0 {
            return;
        }
        let frames = (input.len() / in_ch).min(out.len() / out_ch);
        let input = &input[..frames * in_ch];
        self.meter(input);
        let layout = layout(in_ch, out_ch);
        let [l, r] = self.targets(layout, soloing);
        let ramp = if std::mem::take(&mut self.snap) { 0 } else { ramp };
        self.gains[0].set(l, ramp);
        self.gains[1].set(r, ramp);
        if self.gains.iter().all(Ramp::silent_at_rest) {
            return;
        }
        let [g0, g1] = &mut self.gains;
        match layout {
            Layout::MonoPanned => {
                for (x, o) in input.iter().zip(out.chunks_exact_mut(out_ch)) {
                    o[0] += x * g0.next();
                    o[1] += x * g1.next();
                }
            }
            Layout::StereoBalanced => {
                for (x, o) in input.chunks_exact(2).zip(out.chunks_exact_mut(out_ch)) {
                    o[0] += x[0] * g0.next();
                    o[1] += x[1] * g1.next();
                }
            }
            Layout::Downmix => {
                let scale = 1.0 / in_ch as f32;
                for (x, o) in input.chunks_exact(in_ch).zip(out.iter_mut()) {
                    let sum: f32 = x.iter().sum();
                    *o += sum * scale * g0.next();
                    g1.next();
                }
            }
            Layout::Direct => {
                let n = in_ch.min(out_ch);
                for (x, o) in input.chunks_exact(in_ch).zip(out.chunks_exact_mut(out_ch)) {
                    let g = g0.next();
                    g1.next();
                    for c in 0..n {
                        o[c] += x[c] * g;
                    }
                }
            }
        }
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Mixer {
    strips: Vec<Strip>,
    monitor: Strip,
    out_channels: usize,
    ramp_frames: u32,
    /// Linear gain on the whole mix, before the limiter, and its ramp.
    master: f32,
    master_ramp: Ramp,
    limiter: Limiter,
    /// Some strip is soloed.
    soloing: bool,
}

impl Mixer {
    /// Strips for `members` slots and the monitor, into `out_channels` at `rate` (which sets
    /// the 10 ms ramp). Members start at unity gain, centre, unmuted; the monitor too.
    pub fn new(members: usize, out_channels: usize, rate: u32) -> Self {
        Self {
            strips: vec![Strip::new(); members],
            monitor: Strip::new(),
            out_channels: out_channels.max(1),
            ramp_frames: rate / 100,
            master: 1.0,
            master_ramp: Ramp::at(1.0),
            limiter: Limiter::new(rate),
            soloing: false,
        }
    }

    pub fn out_channels(&self) -> usize {
        self.out_channels
    }

    pub fn members(&self) -> usize {
        self.strips.len()
    }

    /// How many frames a change of gain, pan or mute takes.
    pub fn set_ramp_frames(&mut self, frames: u32) {
        self.ramp_frames = frames;
    }

    pub fn ramp_frames(&self) -> u32 {
        self.ramp_frames
    }

    /// Linear gain of member `slot` (clamped to 0..=[`MAX_GAIN`]; not a number is ignored).
    pub fn set_gain(&mut self, slot: usize, gain: f32) {
        if let Some(s) = self.strips.get_mut(slot) {
            set_gain(&mut s.params, gain);
        }
    }

    /// Gain of member `slot` in dB (−∞ is silence).
    pub fn set_gain_db(&mut self, slot: usize, db: f32) {
        self.set_gain(slot, db_to_gain(db));
    }

    /// Pan of member `slot`, −1 (left) ..= 1 (right); not a number is ignored.
    pub fn set_pan(&mut self, slot: usize, pan: f32) {
        if let Some(s) = self.strips.get_mut(slot) {
            set_pan(&mut s.params, pan);
        }
    }

    pub fn set_mute(&mut self, slot: usize, mute: bool) {
        if let Some(s) = self.strips.get_mut(slot) {
            s.params.mute = mute;
        }
    }

    /// Solo member `slot`: while any member is soloed, the others fall silent (ramped like a
    /// mute); the monitor is never silenced by a solo.
    pub fn set_solo(&mut self, slot: usize, solo: bool) {
        if let Some(s) = self.strips.get_mut(slot) {
            s.params.solo = solo;
        }
        self.soloing = self.strips.iter().any(|s| s.params.solo);
    }

    /// Member `slot`'s settings.
    pub fn params(&self, slot: usize) -> Option<StripParams> {
        self.strips.get(slot).map(|s| s.params)
    }

    /// A slot handed to a new member: default settings, taken at once (no ramp from the
    /// previous member's), meter cleared.
    pub fn reset_strip(&mut self, slot: usize) {
        if let Some(s) = self.strips.get_mut(slot) {
            *s = Strip::new();
        }
        self.soloing = self.strips.iter().any(|s| s.params.solo);
    }

    pub fn set_monitor_gain(&mut self, gain: f32) {
        set_gain(&mut self.monitor.params, gain);
    }

    pub fn set_monitor_gain_db(&mut self, db: f32) {
        self.set_monitor_gain(db_to_gain(db));
    }

    pub fn set_monitor_pan(&mut self, pan: f32) {
        set_pan(&mut self.monitor.params, pan);
    }

    pub fn set_monitor_mute(&mut self, mute: bool) {
        self.monitor.params.mute = mute;
    }

    pub fn monitor_params(&self) -> StripParams {
        self.monitor.params
    }

    /// Linear gain on the whole mix, before the limiter (clamped to 0..=[`MAX_GAIN`]; not a
    /// number is ignored); it ramps like a strip's gain.
    pub fn set_master_gain(&mut self, gain: f32) {
        if !gain.is_nan() {
            self.master = gain.clamp(0.0, MAX_GAIN);
        }
    }

    /// The master gain in dB (−∞ is silence).
    pub fn set_master_gain_db(&mut self, db: f32) {
        self.set_master_gain(db_to_gain(db));
    }

    /// The master gain, linear.
    pub fn master_gain(&self) -> f32 {
        self.master
    }

    /// Start a period: silence `out`.
    pub fn begin(&mut self, out: &mut [f32]) {
        out.fill(0.0);
    }

    /// Add member `slot`'s frames (`channels` interleaved) into `out`.
    pub fn add(&mut self, slot: usize, input: &[f32], channels: usize, out: &mut [f32]) {
        let (ramp, out_ch, soloing) = (self.ramp_frames, self.out_channels, self.soloing);
        if let Some(s) = self.strips.get_mut(slot) {
            s.add(input, channels, out, out_ch, ramp, soloing);
        }
    }

    /// Add the player's own signal (`channels` interleaved) into `out`.
    pub fn add_monitor(&mut self, input: &[f32], channels: usize, out: &mut [f32]) {
        self.monitor
            .add(input, channels, out, self.out_channels, self.ramp_frames, false);
    }

    /// End a period, after every [`Mixer::add`] and [`Mixer::add_monitor`]: the master
    /// gain, then the limiter, in place.
    pub fn finish(&mut self, out: &mut [f32]) {
        let ch = self.out_channels;
        self.master_ramp.set(self.master, self.ramp_frames);
        if self.master_ramp.left > 0 || self.master_ramp.current != 1.0 {
            for frame in out.chunks_mut(ch) {
                let g = self.master_ramp.next();
                for x in frame {
                    *x *= g;
                }
            }
        }
        self.limiter.process(out, ch);
    }

    /// What the limiter did since the last call (see [`LimiterStats`]).
    pub fn take_limiter(&mut self) -> LimiterStats {
        self.limiter.take_stats()
    }

    /// Member `slot`'s level since the last call (before its gain).
    pub fn take_level(&mut self, slot: usize) -> Level {
        self.strips
            .get_mut(slot)
            .map_or_else(Level::default, Strip::take_level)
    }

    /// The monitor's level since the last call (before its gain).
    pub fn take_monitor_level(&mut self) -> Level {
        self.monitor.take_level()
    }
}

fn set_gain(p: &mut StripParams, gain: f32) {
    if !gain.is_nan() {
        p.gain = gain.clamp(0.0, MAX_GAIN);
    }
}

fn set_pan(p: &mut StripParams, pan: f32) {
    if !pan.is_nan() {
        p.pan = pan.clamp(-1.0, 1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sine(frames: usize, freq: f32, amp: f32) -> Vec<f32> {
        (0..frames)
            .map(|i| amp * (2.0 * std::f32::consts::PI * freq * i as f32 / 48_000.0).sin())
            .collect()
    }

    fn max_step(x: &[f32], ch: usize, c: usize) -> f32 {
        x.chunks_exact(ch)
            .map(|f| f[c])
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| (w[1] - w[0]).abs())
            .fold(0.0, f32::max)
    }

    /// Mix `input` (mono) through slot 0 in periods of 64, applying `change` before period
    /// `at`.
    fn run(mixer: &mut Mixer, input: &[f32], at: usize, change: impl Fn(&mut Mixer)) -> Vec<f32> {
        let ch = mixer.out_channels();
        let mut out = vec![0.0; input.len() * ch];
        for (k, (i, o)) in input.chunks(64).zip(out.chunks_mut(64 * ch)).enumerate() {
            if k == at {
                change(mixer);
            }
            mixer.begin(o);
            mixer.add(0, i, 1, o);
            mixer.finish(o);
        }
        out
    }

    #[test]
    fn a_solo_silences_the_others_and_never_the_monitor() {
        // Three members and the monitor, each a constant, into a mono output.
        let mut m = Mixer::new(3, 1, 48_000);
        let levels = [0.01f32, 0.02, 0.04];
        let monitor = 0.08f32;
        let period = |m: &mut Mixer| {
            let mut out = [0.0f32; 64];
            // Periods past the ramp.
            for _ in 0..10 {
                m.begin(&mut out);
                for (slot, x) in levels.iter().enumerate() {
                    m.add(slot, &[*x; 64], 1, &mut out);
                }
                m.add_monitor(&[monitor; 64], 1, &mut out);
                m.finish(&mut out);
            }
            out[63]
        };
        let near = |got: f32, want: f32| (got - want).abs() < 1e-6;
        assert!(near(period(&mut m), 0.15));
        m.set_solo(1, true);
        assert!(near(period(&mut m), 0.02 + monitor), "{}", period(&mut m));
        m.set_solo(2, true);
        assert!(near(period(&mut m), 0.06 + monitor));
        // A soloed member that is also muted is silent; the solo still holds the others.
        m.set_mute(2, true);
        assert!(near(period(&mut m), 0.02 + monitor));
        m.set_mute(2, false);
        // The soloed member leaves: its slot's solo goes with it.
        m.reset_strip(1);
        assert!(near(period(&mut m), 0.04 + monitor));
        m.set_solo(2, false);
        assert!(near(period(&mut m), 0.15));
        assert_eq!(m.params(2).map(|p| p.solo), Some(false));
    }

    #[test]
    fn unity_passes_bit_exact_and_mute_is_exact_silence() {
        let input = sine(48_000, 440.0, 0.5);
        let mut m = Mixer::new(1, 1, 48_000);
        let out = run(&mut m, &input, 100, |m| m.set_mute(0, true));
        assert_eq!(&out[..6400], &input[..6400]);
        let ramp_end = 6400 + m.ramp_frames() as usize;
        assert!(out[ramp_end..].iter().all(|x| *x == 0.0));
        assert!(out[6400..ramp_end].iter().any(|x| *x != 0.0), "muted with a ramp");
    }

    #[test]
    fn a_gain_step_never_clicks() {
        // A low tone: its own largest step is small, so a click would stand out.
        let input = sine(48_000, 100.0, 0.9);
        let own = max_step(&input, 1, 0);
        for (from, to) in [(1.0, 0.0), (0.0, 1.0), (0.1, MAX_GAIN), (1.0, 0.5)] {
            let mut m = Mixer::new(1, 1, 48_000);
            m.set_gain(0, from);
            let out = run(&mut m, &input, 100, |m| m.set_gain(0, to));
            // The signal's own steps scaled by the larger gain, plus the ramp's share.
            let bound = own * from.max(to) + (to - from).abs() * 0.9 / m.ramp_frames() as f32 + 1e-6;
            let step = max_step(&out, 1, 0);
            assert!(step <= bound, "{from}->{to}: step {step} > {bound}");
            // Without the ramp the same change jumps (the test can fail).
            let mut hard = Mixer::new(1, 1, 48_000);
            hard.set_ramp_frames(0);
            hard.set_gain(0, from);
            let out = run(&mut hard, &input, 100, |m| m.set_gain(0, to));
            assert!(
                max_step(&out, 1, 0) > bound,
                "{from}->{to}: a hard step is a click"
            );
        }
    }

    #[test]
    fn equal_power_pan_is_minus_3_db_at_centre() {
        let input = sine(4_800, 440.0, 0.5);
        let mut m = Mixer::new(1, 2, 48_000);
        let out = run(&mut m, &input, usize::MAX, |_| {});
        for c in 0..2 {
            let side: Vec<f32> = out.iter().skip(c).step_by(2).copied().collect();
            let ratio = rms(&side) / rms(&input);
            let db = 20.0 * ratio.log10();
            assert!((db + 3.0103).abs() < 0.001, "channel {c}: {db} dB");
        }
        // Hard left: all of it on the left, nothing on the right.
        let mut m = Mixer::new(1, 2, 48_000);
        m.set_pan(0, -1.0);
        let out = run(&mut m, &input, usize::MAX, |_| {});
        let (l, r): (Vec<f32>, Vec<f32>) = out.chunks_exact(2).map(|f| (f[0], f[1])).unzip();
        assert_eq!(l, input);
        assert!(r.iter().all(|x| *x == 0.0));
        // Power is constant across the pan.
        for pan in [-0.5, 0.25, 0.9] {
            let mut m = Mixer::new(1, 2, 48_000);
            m.set_pan(0, pan);
            let out = run(&mut m, &input, usize::MAX, |_| {});
            let power: f32 =
                out.iter().map(|x| x * x).sum::<f32>() / input.iter().map(|x| x * x).sum::<f32>();
            assert!((power - 1.0).abs() < 1e-4, "pan {pan}: power {power}");
        }
    }

    fn rms(x: &[f32]) -> f32 {
        (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32).sqrt()
    }

    #[test]
    fn layouts_and_the_monitor_sum_into_the_output() {
        let mut m = Mixer::new(2, 2, 48_000);
        let stereo = [0.5, -0.25, 0.5, -0.25];
        let mono = [0.125, 0.125];
        let own = [0.0625, 0.0625, 0.0625, 0.0625];
        let mut out = [1.0; 4];
        m.begin(&mut out);
        m.add(0, &stereo, 2, &mut out);
        m.add(1, &mono, 1, &mut out);
        m.add_monitor(&own, 2, &mut out);
        let c = std::f32::consts::FRAC_1_SQRT_2 * 0.125;
        let want = [0.5 + c + 0.0625, -0.25 + c + 0.0625];
        for f in out.chunks_exact(2) {
            assert!(
                (f[0] - want[0]).abs() < 1e-6 && (f[1] - want[1]).abs() < 1e-6,
                "{out:?}"
            );
        }
        // Into mono, stereo is averaged.
        let mut m = Mixer::new(1, 1, 48_000);
        let mut out = [0.0; 2];
        m.add(0, &stereo, 2, &mut out);
        assert_eq!(out, [0.125, 0.125]);
        // A member with more channels than the output keeps the ones the output has.
        let mut m = Mixer::new(1, 2, 48_000);
        let mut out = [0.0; 2];
        m.add(0, &[0.1, 0.2, 0.3, 0.4], 4, &mut out);
        assert_eq!(out, [0.1, 0.2]);
    }

    #[test]
    fn meters_read_what_the_member_sends_before_its_gain() {
        let input = sine(4_800, 1_000.0, 0.5);
        let mut m = Mixer::new(1, 2, 48_000);
        m.set_mute(0, true);
        let _ = run(&mut m, &input, usize::MAX, |_| {});
        let level = m.take_level(0);
        assert!((level.peak - 0.5).abs() < 1e-3, "{level:?}");
        assert!((level.rms - 0.5 / 2f32.sqrt()).abs() < 1e-3, "{level:?}");
        assert_eq!(m.take_level(0), Level::default(), "taken");
        assert!((db_to_gain(-6.0) - 0.501).abs() < 1e-3);
        assert_eq!(db_to_gain(f32::NEG_INFINITY), 0.0);
    }

    /// `frames` of a sine at a whole number of hertz starting `start` turns into its cycle,
    /// its phase exact at every sample.
    fn tone(frames: usize, hz: u32, amp: f64, start: f64) -> Vec<f32> {
        (0..frames as u64)
            .map(|i| {
                let turn = (u64::from(hz) * i % 48_000) as f64 / 48_000.0 + start;
                (amp * (std::f64::consts::TAU * turn).sin()) as f32
            })
            .collect()
    }

    /// Amplitude of the `hz` component of `x` (a whole second or more at 48 kHz; the last
    /// whole second is used, so every whole-hertz tone falls on its own bin).
    fn amplitude_at(x: &[f32], hz: u32) -> f64 {
        let x = &x[x.len() - 48_000..];
        let (mut re, mut im) = (0.0f64, 0.0f64);
        for (i, v) in x.iter().enumerate() {
            let turn = (u64::from(hz) * i as u64 % 48_000) as f64 / 48_000.0;
            let (s, c) = (std::f64::consts::TAU * turn).sin_cos();
            re += f64::from(*v) * c;
            im -= f64::from(*v) * s;
        }
        2.0 * re.hypot(im) / x.len() as f64
    }

    fn db(x: f64) -> f64 {
        20.0 * x.max(1e-12).log10()
    }

    /// The plain sum (before `finish`) and what `finish` makes of it, left channel; the
    /// mixer; the limiter's gain after each period.
    type Mixed = (Vec<f32>, Vec<f32>, Mixer, Vec<f32>);

    /// The mix of a stereo member per tone at `amp`, each at `gain`, in periods of 64 over
    /// `seconds`.
    fn mix_tones(tones: &[u32], amp: f64, gain: f32, seconds: usize) -> Mixed {
        let frames = 48_000 * seconds;
        // Each member starts at a phase of its own, as players do.
        let inputs: Vec<Vec<f32>> = tones
            .iter()
            .enumerate()
            .map(|(k, &hz)| {
                tone(frames, hz, amp, k as f64 * 0.137)
                    .iter()
                    .flat_map(|x| [*x, *x])
                    .collect()
            })
            .collect();
        let mut m = Mixer::new(tones.len(), 2, 48_000);
        for slot in 0..tones.len() {
            m.set_gain(slot, gain);
        }
        let (mut plain, mut limited) = (vec![0.0; frames * 2], vec![0.0; frames * 2]);
        let mut gains = Vec::with_capacity(frames / 64);
        for k in 0..frames / 64 {
            let span = k * 128..(k + 1) * 128;
            let o = &mut limited[span.clone()];
            m.begin(o);
            for (slot, input) in inputs.iter().enumerate() {
                m.add(slot, &input[span.clone()], 2, o);
            }
            plain[span.clone()].copy_from_slice(o);
            m.finish(o);
            gains.push(m.limiter.gain());
        }
        let left = |x: Vec<f32>| x.iter().step_by(2).copied().collect::<Vec<_>>();
        (left(plain), left(limited), m, gains)
    }

    #[test]
    fn a_mix_below_the_knee_passes_bit_exact_and_counts_nothing() {
        // Two members whose sum peaks at −3.1 dBFS.
        let (plain, limited, mut m, _) = mix_tones(&[330, 550], 0.35, 1.0, 1);
        assert!(plain.iter().fold(0.0f32, |a, x| a.max(x.abs())) < 0.7);
        assert_eq!(plain, limited);
        assert_eq!(m.take_limiter(), LimiterStats::default());
    }

    /// The listener plays 440 Hz; the members play other tones of the 110 Hz series, so
    /// every intermodulation product of their sum falls on a tone of the series, 440 Hz
    /// among them where both odd and even multiples of 110 Hz are played. (330, 550 and
    /// 770 Hz alone are odd multiples: their sum is half-wave symmetric, and no symmetric
    /// distortion of it, clipping included, makes an even multiple such as 440 Hz.)
    const OWN: u32 = 440;
    const MEMBER_TONES: [&[u32]; 4] = [
        &[220, 330],
        &[330, 550, 770],
        &[220, 330, 550, 660],
        &[220, 330, 550, 660, 770, 880, 990, 1100],
    ];

    #[test]
    fn many_members_at_minus_6_dbfs_never_clip_nor_put_a_tone_on_the_listeners_own() {
        for tones in MEMBER_TONES {
            let n = tones.len();
            let (plain, limited, mut m, _) = mix_tones(tones, 0.5, 1.0, 3);
            let over = |x: &[f32]| x.iter().filter(|v| v.abs() > 1.0).count();
            let loudest = |x: &[f32]| tones.iter().map(|&hz| amplitude_at(x, hz)).fold(0.0, f64::max);
            let own_db = |x: &[f32]| db(amplitude_at(x, OWN) / loudest(x));
            // The plain sum as a device would play it: clipped at full scale.
            let clipped: Vec<f32> = plain.iter().map(|x| x.clamp(-1.0, 1.0)).collect();
            let stats = m.take_limiter();
            println!(
                "{n} members at -6 dBFS: plain sum {:.2} % of samples over full scale, own tone {:.1} dB when clipped; limited: {} over, own tone {:.1} dB, peak {:.3}, gain reduction {:.2} dB (most {:.2})",
                100.0 * over(&plain) as f64 / plain.len() as f64,
                own_db(&clipped),
                over(&limited),
                own_db(&limited),
                limited.iter().fold(0.0f32, |a, x| a.max(x.abs())),
                stats.reduction_db,
                stats.max_reduction_db,
            );
            assert_eq!(over(&limited), 0, "{n} members");
            assert!(
                own_db(&limited) < -60.0,
                "{n} members: {:.1} dB",
                own_db(&limited)
            );
            if n >= 4 {
                // The test can fail: clipping does put a tone there.
                assert!(over(&plain) > 0 && own_db(&clipped) > -60.0, "{n} members");
            }
            assert!(stats.limited_frames > 0 && stats.max_reduction_db > 0.0);
        }
    }

    #[test]
    fn the_gain_of_a_steady_mix_stays_put() {
        // Four members, tones unrelated to each other: the sum's peaks never repeat
        // exactly, so the gain cannot stay exactly constant; it must stay nearly so, and
        // what its slow movement adds (sidebands close to each tone) must stay quiet.
        let tones = [197, 293, 587, 739];
        let (_, limited, _, gains) = mix_tones(&tones, 0.5, 1.0, 4);
        let last = &gains[gains.len() - 48_000 / 64..];
        let lo = last.iter().copied().fold(f32::MAX, f32::min);
        let hi = last.iter().copied().fold(0.0, f32::max);
        let ripple = db(f64::from(hi / lo));
        let loudest = tones
            .iter()
            .map(|&hz| amplitude_at(&limited, hz))
            .fold(0.0, f64::max);
        let (hz, worst) = (100..1_500)
            .step_by(3)
            .filter(|hz| tones.iter().all(|t| t.abs_diff(*hz) >= 10))
            .map(|hz| (hz, db(amplitude_at(&limited, hz) / loudest)))
            .fold((0, f64::MIN), |a, b| if b.1 > a.1 { b } else { a });
        println!(
            "four unrelated tones at -6 dBFS, last second: gain {:.2}..{:.2} dB (ripple {ripple:.3} dB); loudest absent tone 10 Hz or more from a member: {worst:.1} dB at {hz} Hz",
            db(f64::from(lo)),
            db(f64::from(hi))
        );
        assert!(ripple < 1.0, "{ripple} dB");
        assert!(worst < -50.0, "{worst} dB at {hz} Hz");
    }

    #[test]
    fn loud_gains_on_many_members_never_exceed_full_scale() {
        let (_, limited, _, _) = mix_tones(MEMBER_TONES[3], 1.0, MAX_GAIN, 1);
        let peak = limited.iter().fold(0.0f32, |a, x| a.max(x.abs()));
        assert!(peak <= 1.0, "{peak}");
        // And the monitor on top, the master at its loudest, stepped.
        let mut m = Mixer::new(16, 2, 48_000);
        let loud = tone(64, 1_000, 1.0, 0.0);
        let mut worst = 0.0f32;
        for k in 0..1_000 {
            if k % 100 == 0 {
                m.set_master_gain(if k % 200 == 0 { MAX_GAIN } else { 0.25 });
            }
            let mut out = [0.0f32; 128];
            m.begin(&mut out);
            for slot in 0..16 {
                m.set_gain(slot, MAX_GAIN);
                m.add(slot, &loud, 1, &mut out);
            }
            m.add_monitor(&loud, 1, &mut out);
            m.finish(&mut out);
            worst = out.iter().fold(worst, |a, x| a.max(x.abs()));
        }
        assert!(worst <= 1.0, "{worst}");
    }

    #[test]
    fn a_master_gain_change_never_clicks() {
        let input = sine(48_000, 100.0, 0.5);
        let own = max_step(&input, 1, 0);
        for (from, to) in [(1.0, 0.0), (0.0, 1.0), (1.0, MAX_GAIN), (MAX_GAIN, 0.5)] {
            let mut m = Mixer::new(1, 1, 48_000);
            m.set_master_gain(from);
            let out = run(&mut m, &input, 100, |m| m.set_master_gain(to));
            let bound = own * from.max(to) + (to - from).abs() * 0.5 / m.ramp_frames() as f32 + 1e-6;
            let step = max_step(&out, 1, 0);
            assert!(step <= bound, "{from}->{to}: step {step} > {bound}");
            assert!(out.iter().all(|x| x.abs() <= 1.0));
            if to == 0.0 || from == 0.0 {
                let mut hard = Mixer::new(1, 1, 48_000);
                hard.set_ramp_frames(0);
                hard.set_master_gain(from);
                let out = run(&mut hard, &input, 100, |m| m.set_master_gain(to));
                assert!(
                    max_step(&out, 1, 0) > bound,
                    "{from}->{to}: a hard step is a click"
                );
            }
        }
        let mut m = Mixer::new(1, 1, 48_000);
        m.set_master_gain_db(-6.0);
        m.set_master_gain(f32::NAN);
        assert!((m.master_gain() - 0.501).abs() < 1e-3);
        m.set_master_gain(100.0);
        assert_eq!(m.master_gain(), MAX_GAIN);
    }

    #[test]
    fn the_limiters_counters_move_when_it_works() {
        let mut m = Mixer::new(1, 1, 48_000);
        let quiet = sine(4_800, 440.0, 0.5);
        let _ = run(&mut m, &quiet, usize::MAX, |_| {});
        assert_eq!(m.take_limiter(), LimiterStats::default());
        // +12 dB on the member: about 6 dB over the ceiling.
        m.set_gain(0, MAX_GAIN);
        let _ = run(&mut m, &quiet, usize::MAX, |_| {});
        let loud = m.take_limiter();
        assert!(loud.max_reduction_db > 5.0 && loud.reduction_db > 5.0, "{loud:?}");
        assert!(loud.limited_frames > 4_000, "{loud:?}");
        // Back to unity: the gain comes back to exactly 1 within a second, and the reading
        // says so; the frames counted stay counted.
        m.set_gain(0, 1.0);
        let back = (0..48_000 / 64).position(|_| {
            let _ = run(&mut m, &quiet[..64], usize::MAX, |_| {});
            m.limiter.gain() == 1.0
        });
        let back_ms = back.map(|p| (p + 1) as f64 * 64.0 / 48.0);
        println!(
            "release from {:.1} dB to unity: {back_ms:?} ms",
            loud.reduction_db
        );
        assert!(back_ms.is_some_and(|ms| ms < 1_000.0), "{back_ms:?}");
        let after = m.take_limiter();
        assert_eq!(after.reduction_db, 0.0, "{after:?}");
        assert!(after.max_reduction_db > 0.0 && after.limited_frames > loud.limited_frames);
        let _ = run(&mut m, &quiet, usize::MAX, |_| {});
        let quiet_again = m.take_limiter();
        assert_eq!(quiet_again.max_reduction_db, 0.0);
        assert_eq!(quiet_again.limited_frames, after.limited_frames);
    }
}
