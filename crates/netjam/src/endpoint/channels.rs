//! Channel maps: which device channels a stream sends (`--inputs`) and where what you hear
//! plays (`--outputs`).
//!
//! A player with an 18-input interface sends inputs 1–2 (`--inputs 1,2`, or `1-2`) and hears
//! the room on outputs 3–4 (`--outputs 3-4`), instead of opening and streaming every channel.
//! Channels are numbered from 1, as interfaces label them. A [`ChannelMap`] is parsed and
//! checked against the device once, at start; [`ChannelMap::gather`] and
//! [`ChannelMap::scatter`] then move interleaved frames between the device's channels and
//! the stream's on the audio thread. Those two never allocate, lock or block, and never
//! panic on a short buffer: they work on whole frames of the slices they are given.
//!
//! [`PickedSource`] applies `--inputs` to a file or pipe (not realtime).

use super::FrameSource;

/// Most channels a map may name (far more than any interface has).
pub const MAX_CHANNEL: u16 = 1024;

/// Which way a map points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapSide {
    /// `--inputs`: device channels captured and sent.
    Inputs,
    /// `--outputs`: device channels what you hear plays on.
    Outputs,
}

impl MapSide {
    pub fn flag(self) -> &'static str {
        match self {
            MapSide::Inputs => "--inputs",
            MapSide::Outputs => "--outputs",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            MapSide::Inputs => "inputs",
            MapSide::Outputs => "outputs",
        }
    }
}

/// Why a channel list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelMapError {
    #[error("{flag} is empty: name channels from 1, e.g. {flag} 1,2 or {flag} 3-4")]
    Empty { flag: &'static str },
    #[error("{flag} {text:?}: {why}; write channels from 1 as a list and ranges, e.g. {flag} 1,3-4")]
    Syntax {
        flag: &'static str,
        text: String,
        why: String,
    },
    #[error("{flag}: channels are numbered from 1, as the interface labels them (0 is not a channel)")]
    Zero { flag: &'static str },
    #[error("{flag}: channel {channel} is named twice; name each channel once")]
    Duplicate { flag: &'static str, channel: u16 },
    #[error("{flag} {channel}: {what} has {offered} {noun}{range}")]
    TooHigh {
        flag: &'static str,
        channel: u16,
        what: String,
        offered: u16,
        noun: &'static str,
        range: String,
    },
}

/// Device channels in stream order (see the module docs). Channel `k` of the stream is
/// device channel `picks[k]` (0-based inside, 1-based to the user).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelMap {
    side: MapSide,
    picks: Vec<u16>,
}

impl ChannelMap {
    /// Parse `1,2`, `3-4` or `1,3-5` (spaces allowed).
    pub fn parse(side: MapSide, text: &str) -> Result<Self, ChannelMapError> {
        let flag = side.flag();
        let syntax = |why: String| ChannelMapError::Syntax {
            flag,
            text: text.to_string(),
            why,
        };
        let number = |s: &str| -> Result<u16, ChannelMapError> {
            let s = s.trim();
            let n: u32 = s
                .parse()
                .map_err(|_| syntax(format!("{s:?} is not a channel number")))?;
            if n == 0 {
                return Err(ChannelMapError::Zero { flag });
            }
            if n > u32::from(MAX_CHANNEL) {
                return Err(syntax(format!("{n} is beyond channel {MAX_CHANNEL}")));
            }
            Ok(n as u16)
        };
        if text.trim().is_empty() {
            return Err(ChannelMapError::Empty { flag });
        }
        let mut picks = Vec::new();
        for part in text.split(',') {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => {
                    let n = number(part)?;
                    (n, n)
                }
            };
            if hi < lo {
                return Err(syntax(format!("the range {lo}-{hi} runs backwards")));
            }
            for channel in lo..=hi {
                if picks.contains(&(channel - 1)) {
                    return Err(ChannelMapError::Duplicate { flag, channel });
                }
                picks.push(channel - 1);
            }
        }
        Ok(Self { side, picks })
    }

    /// Channels 1..=n in order: what a device without a map does.
    pub fn identity(side: MapSide, n: u16) -> Self {
        Self {
            side,
            picks: (0..n).collect(),
        }
    }

    pub fn side(&self) -> MapSide {
        self.side
    }

    /// Channels of the stream (how many the map names).
    pub fn len(&self) -> usize {
        self.picks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.picks.is_empty()
    }

    /// The device channels, 0-based, in stream order.
    pub fn picks(&self) -> &[u16] {
        &self.picks
    }

    /// The highest channel named, 1-based: the device must have at least this many.
    pub fn highest(&self) -> u16 {
        self.picks.iter().max().map_or(0, |&c| c + 1)
    }

    /// Refuse a map that names a channel beyond the `offered` ones of `what` (e.g. "this
    /// device", "the JACK server's physical capture ports").
    pub fn check(&self, offered: u16, what: &str) -> Result<(), ChannelMapError> {
        let highest = self.highest();
        if highest <= offered {
            return Ok(());
        }
        Err(ChannelMapError::TooHigh {
            flag: self.side.flag(),
            channel: highest,
            what: what.to_string(),
            offered,
            noun: self.side.noun(),
            range: match offered {
                0 => String::new(),
                1 => " (1)".into(),
                n => format!(" (1-{n})"),
            },
        })
    }

    /// The samples of `device` (interleaved, `device_channels` a frame) that the stream
    /// takes, frame by frame in stream order; a channel the device lacks reads as `silence`.
    /// Allocates nothing.
    pub fn gathered<'a, T: Copy>(
        &'a self,
        device: &'a [T],
        device_channels: usize,
        silence: T,
    ) -> impl Iterator<Item = T> + 'a {
        let dc = device_channels.max(1);
        device.chunks_exact(dc).flat_map(move |frame| {
            self.picks
                .iter()
                .map(move |&c| frame.get(c as usize).copied().unwrap_or(silence))
        })
    }

    /// Gather: the picked channels of `device` (interleaved, `device_channels` a frame) into
    /// `stream` (interleaved, [`ChannelMap::len`] a frame), converted by `conv`. Runs over the
    /// frames both hold and returns how many. Realtime-safe.
    pub fn gather<T: Copy>(
        &self,
        device: &[T],
        device_channels: usize,
        stream: &mut [f32],
        conv: impl Fn(T) -> f32,
    ) -> usize {
        let (dc, sc) = (device_channels.max(1), self.picks.len().max(1));
        let frames = (device.len() / dc).min(stream.len() / sc);
        for (src, dst) in device
            .chunks_exact(dc)
            .zip(stream.chunks_exact_mut(sc))
            .take(frames)
        {
            for (x, &c) in dst.iter_mut().zip(&self.picks) {
                *x = src.get(c as usize).map_or(0.0, |&s| conv(s));
            }
        }
        frames
    }

    /// Scatter: `stream` (interleaved, [`ChannelMap::len`] a frame) onto the picked channels
    /// of `device` (interleaved, `device_channels` a frame), converted by `conv`; every other
    /// device channel gets `silence`. Runs over the frames both hold and returns how many.
    /// Realtime-safe.
    pub fn scatter<T: Copy>(
        &self,
        stream: &[f32],
        device: &mut [T],
        device_channels: usize,
        silence: T,
        conv: impl Fn(f32) -> T,
    ) -> usize {
        let (dc, sc) = (device_channels.max(1), self.picks.len().max(1));
        let frames = (device.len() / dc).min(stream.len() / sc);
        for (src, dst) in stream
            .chunks_exact(sc)
            .zip(device.chunks_exact_mut(dc))
            .take(frames)
        {
            dst.fill(silence);
            for (&x, &c) in src.iter().zip(&self.picks) {
                if let Some(d) = dst.get_mut(c as usize) {
                    *d = conv(x);
                }
            }
        }
        frames
    }
}

impl std::fmt::Display for ChannelMap {
    /// `1,3-5`: runs of consecutive channels as ranges.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut i = 0;
        let p = &self.picks;
        while i < p.len() {
            let mut j = i;
            while j + 1 < p.len() && p[j + 1] == p[j] + 1 {
                j += 1;
            }
            if i > 0 {
                f.write_str(",")?;
            }
            if j > i {
                write!(f, "{}-{}", p[i] + 1, p[j] + 1)?;
            } else {
                write!(f, "{}", p[i] + 1)?;
            }
            i = j + 1;
        }
        Ok(())
    }
}

/// A [`FrameSource`] that passes on only the channels of `inner` an `--inputs` map picks.
pub struct PickedSource {
    inner: Box<dyn FrameSource>,
    map: ChannelMap,
    buf: Vec<f32>,
}

impl std::fmt::Debug for PickedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PickedSource")
            .field("map", &self.map)
            .finish_non_exhaustive()
    }
}

impl PickedSource {
    /// Refuses a map naming a channel `inner` lacks; `what` names the source for the error.
    pub fn new(inner: Box<dyn FrameSource>, map: ChannelMap, what: &str) -> Result<Self, ChannelMapError> {
        map.check(inner.channels(), what)?;
        Ok(Self {
            inner,
            map,
            buf: Vec::new(),
        })
    }
}

impl FrameSource for PickedSource {
    fn rate(&self) -> u32 {
        self.inner.rate()
    }

    fn channels(&self) -> u16 {
        self.map.len() as u16
    }

    fn read(&mut self, out: &mut [f32]) -> anyhow::Result<usize> {
        let (ic, oc) = (usize::from(self.inner.channels()).max(1), self.map.len().max(1));
        let frames = out.len() / oc;
        // Sized on the first read of a given length (a file source, not the audio thread).
        self.buf.resize(frames * ic, 0.0);
        let got = self.inner.read(&mut self.buf)?;
        Ok(self.map.gather(&self.buf[..got * ic], ic, out, |x| x))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(s: &str) -> Result<ChannelMap, ChannelMapError> {
        ChannelMap::parse(MapSide::Inputs, s)
    }

    #[test]
    fn lists_and_ranges_parse_one_based_in_the_order_given() {
        assert_eq!(inputs("1,2").expect("ok").picks(), [0, 1]);
        assert_eq!(inputs("3-4").expect("ok").picks(), [2, 3]);
        assert_eq!(inputs(" 1, 3-5 ").expect("ok").picks(), [0, 2, 3, 4]);
        assert_eq!(inputs("4,1").expect("ok").picks(), [3, 0]);
        assert_eq!(inputs("7").expect("ok").highest(), 7);
        assert_eq!(inputs("1,3-5,8").expect("ok").to_string(), "1,3-5,8");
        assert_eq!(inputs("4,1").expect("ok").to_string(), "4,1");
    }

    #[test]
    fn zero_duplicates_and_nonsense_are_refused_with_the_flag_named() {
        assert_eq!(inputs("0,1"), Err(ChannelMapError::Zero { flag: "--inputs" }));
        assert_eq!(
            ChannelMap::parse(MapSide::Outputs, "1-3,2"),
            Err(ChannelMapError::Duplicate {
                flag: "--outputs",
                channel: 2
            })
        );
        assert_eq!(inputs(" "), Err(ChannelMapError::Empty { flag: "--inputs" }));
        for bad in ["a", "1,", "1-", "4-3", "-1", "99999", "1..2"] {
            let e = inputs(bad).expect_err(bad).to_string();
            assert!(e.starts_with("--inputs"), "{bad}: {e}");
        }
        let e = inputs("4-3").expect_err("backwards").to_string();
        assert!(e.contains("runs backwards"), "{e}");
    }

    #[test]
    fn a_channel_beyond_the_device_names_what_the_device_offers() {
        let m = inputs("1,19").expect("ok");
        assert_eq!(
            m.check(18, "this device").expect_err("19 > 18").to_string(),
            "--inputs 19: this device has 18 inputs (1-18)"
        );
        assert!(m.check(19, "this device").is_ok());
        let out = ChannelMap::parse(MapSide::Outputs, "3-4").expect("ok");
        assert_eq!(
            out.check(2, "the sound card").expect_err("4 > 2").to_string(),
            "--outputs 4: the sound card has 2 outputs (1-2)"
        );
    }

    #[test]
    fn gather_takes_the_picked_device_channels_in_stream_order() {
        // 3 frames of a 4-channel device: sample = 10 * frame + channel.
        let device: Vec<i16> = (0..3).flat_map(|f| (0..4).map(move |c| 10 * f + c)).collect();
        let m = inputs("4,2").expect("ok");
        let mut stream = [f32::NAN; 6];
        assert_eq!(m.gather(&device, 4, &mut stream, f32::from), 3);
        assert_eq!(stream, [3.0, 1.0, 13.0, 11.0, 23.0, 21.0]);
        let it: Vec<i16> = m.gathered(&device, 4, 0).collect();
        assert_eq!(it, [3, 1, 13, 11, 23, 21]);
        // A short stream buffer bounds the frames; a channel the device lacks is silence.
        let mut short = [f32::NAN; 4];
        assert_eq!(
            inputs("1,9")
                .expect("ok")
                .gather(&device, 4, &mut short, f32::from),
            2
        );
        assert_eq!(short, [0.0, 0.0, 10.0, 0.0]);
    }

    #[test]
    fn scatter_puts_the_stream_on_the_picked_outputs_and_silences_the_rest() {
        let m = ChannelMap::parse(MapSide::Outputs, "3-4").expect("ok");
        let stream = [0.5, -0.5, 0.25, -0.25];
        let mut device = [9.0f32; 12];
        assert_eq!(m.scatter(&stream, &mut device, 6, 0.0, |x| x), 2);
        assert_eq!(
            device,
            [0.0, 0.0, 0.5, -0.5, 0.0, 0.0, 0.0, 0.0, 0.25, -0.25, 0.0, 0.0]
        );
        let identity = ChannelMap::identity(MapSide::Outputs, 2);
        let mut same = [0.0f32; 4];
        identity.scatter(&stream, &mut same, 2, 0.0, |x| x);
        assert_eq!(same, stream);
    }

    #[test]
    fn a_picked_source_passes_on_only_the_chosen_channels() {
        struct Counting(f32);
        impl FrameSource for Counting {
            fn rate(&self) -> u32 {
                48_000
            }
            fn channels(&self) -> u16 {
                4
            }
            fn read(&mut self, out: &mut [f32]) -> anyhow::Result<usize> {
                for x in out.iter_mut() {
                    *x = self.0;
                    self.0 += 1.0;
                }
                Ok(out.len() / 4)
            }
        }
        let err =
            PickedSource::new(Box::new(Counting(0.0)), inputs("5").expect("ok"), "x.wav").expect_err("5 > 4");
        assert_eq!(err.to_string(), "--inputs 5: x.wav has 4 inputs (1-4)");
        let mut s =
            PickedSource::new(Box::new(Counting(0.0)), inputs("2-3").expect("ok"), "x.wav").expect("fits");
        assert_eq!(s.channels(), 2);
        let mut out = [0.0; 4];
        assert_eq!(s.read(&mut out).expect("read"), 2);
        assert_eq!(out, [1.0, 2.0, 5.0, 6.0]);
    }
}
