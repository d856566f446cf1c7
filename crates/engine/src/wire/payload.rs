//! Audio formats and linear PCM sample conversion for RTP payloads.
//!
//! [`AudioFormat`] names what a stream carries (codec, sample rate, channel count) and
//! knows the RTP payload type, frame size and the conversions between media time (a frame
//! index, i.e. an RTP timestamp step) and wall time (nanoseconds).
//!
//! [`encode`] and [`decode`] convert interleaved `f32` samples to and from the network's
//! big-endian integer or float formats: L16 (RFC 3551), L24 (RFC 3190) and netjam's own
//! 32-bit float. They run on the audio thread, so they must never allocate, lock or panic,
//! whatever the lengths of the slices they are given. Opus is not linear PCM: both return 0
//! for it (see [`crate::codec`]).

use serde::{Deserialize, Serialize};

/// RTP payload type of RFC 2198 redundant audio (dynamic range; announced in SDP).
pub const RED_PAYLOAD_TYPE: u8 = 99;

/// The lowest sample rate netjam carries, in Hz.
pub const MIN_RATE: u32 = 8_000;
/// The highest sample rate netjam carries, in Hz.
pub const MAX_RATE: u32 = 192_000;

/// Rates with a one-nibble code in netjam's RTP format extension (index + 1 is the code);
/// any other rate from [`MIN_RATE`] to [`MAX_RATE`] is written out in full after
/// [`RATE_CODE_EXPLICIT`].
const CODED_RATES: [u32; 12] = [
    44_100, 48_000, 96_000, 8_000, 11_025, 16_000, 22_050, 24_000, 32_000, 88_200, 176_400, 192_000,
];

/// Rate code saying that the rate follows as three big-endian bytes.
pub const RATE_CODE_EXPLICIT: u8 = 15;

/// Largest channel count netjam carries.
pub const MAX_CHANNELS: u16 = 64;

/// Sample encoding of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// 16-bit signed big-endian linear PCM (RFC 3551 section 4.5.11).
    L16,
    /// 24-bit signed big-endian linear PCM (RFC 3190).
    L24,
    /// 32-bit IEEE 754 big-endian float. Not an RTP standard: netjam-to-netjam only.
    F32,
    /// Opus (RFC 6716) in RTP per RFC 7587: 48 kHz, one or two channels, compressed. The
    /// encoder and decoder are stateful and live outside the wire format (see
    /// [`crate::codec`]); [`encode`] and [`decode`] do not apply to it.
    Opus,
}

impl Codec {
    /// Bytes one sample of one channel takes on the wire; 0 for Opus, whose packets vary.
    pub fn bytes_per_sample(self) -> usize {
        match self {
            Codec::L16 => 2,
            Codec::L24 => 3,
            Codec::F32 => 4,
            Codec::Opus => 0,
        }
    }

    /// Whether samples are carried as they are (linear PCM) rather than compressed.
    pub fn is_pcm(self) -> bool {
        self != Codec::Opus
    }

    /// Parses `l16`, `l24`, `f32` or `opus`, in any letter case (the names used on the
    /// command line and over OSC).
    pub fn from_name(name: &str) -> Result<Codec, FormatError> {
        [Codec::L16, Codec::L24, Codec::F32, Codec::Opus]
            .into_iter()
            .find(|c| c.to_string().eq_ignore_ascii_case(name))
            .ok_or_else(|| FormatError::UnknownCodec(name.chars().take(32).collect()))
    }

    /// The encoding name used in an SDP `a=rtpmap` line.
    ///
    /// `L16` and `L24` are the registered names. 32-bit float has no registered RTP name,
    /// so netjam uses the experimental-style `X-NJ-F32`; other tools (GStreamer, ffmpeg)
    /// will not play it — use L16 or L24 for interoperability.
    pub fn sdp_name(self) -> &'static str {
        match self {
            Codec::L16 => "L16",
            Codec::L24 => "L24",
            Codec::F32 => "X-NJ-F32",
            Codec::Opus => "opus",
        }
    }

    /// Looks up a codec by its SDP encoding name (case-insensitive).
    pub fn from_sdp_name(name: &str) -> Option<Codec> {
        [Codec::L16, Codec::L24, Codec::F32, Codec::Opus]
            .into_iter()
            .find(|c| c.sdp_name().eq_ignore_ascii_case(name))
    }

    /// Code of this codec in netjam's RTP format extension (see
    /// [`crate::wire::rtp::format_extension`]).
    pub fn wire_code(self) -> u8 {
        match self {
            Codec::L16 => 1,
            Codec::L24 => 2,
            Codec::F32 => 3,
            Codec::Opus => 4,
        }
    }

    /// Inverse of [`Codec::wire_code`].
    pub fn from_wire_code(code: u8) -> Result<Codec, FormatError> {
        match code {
            1 => Ok(Codec::L16),
            2 => Ok(Codec::L24),
            3 => Ok(Codec::F32),
            4 => Ok(Codec::Opus),
            other => Err(FormatError::UnknownCodecCode(other)),
        }
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Codec::L16 => "l16",
            Codec::L24 => "l24",
            Codec::F32 => "f32",
            Codec::Opus => "opus",
        })
    }
}

/// Why a format is not one netjam can carry.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum FormatError {
    #[error("unknown codec {0:?}: netjam supports l16, l24, f32 and opus")]
    UnknownCodec(String),
    #[error("sample rate {0} Hz is not supported: netjam carries 8000 to 192000 Hz")]
    UnsupportedRate(u32),
    #[error("{0} channels is not supported: use 1 to 64 channels")]
    UnsupportedChannels(u16),
    #[error("the stream announces codec code {0}, which this netjam does not know: upgrade netjam or have the sender use l16, l24, f32 or opus")]
    UnknownCodecCode(u8),
    #[error("the stream announces sample-rate code {0}, which this netjam does not know: upgrade netjam or have the sender use 44100, 48000 or 96000 Hz")]
    UnknownRateCode(u8),
    #[error(
        "opus runs at 48000 Hz only (RFC 7587), not {0} Hz: use --rate 48000, or l16/l24 at other rates"
    )]
    OpusRate(u32),
    #[error("opus carries 1 or 2 channels (RFC 7587), not {0}: use l16 or l24 for more channels")]
    OpusChannels(u16),
    #[error("the stream's format extension element is {len} bytes long, too short for what it announces (2 bytes, or 5 with a rate written out)")]
    BadFormatElement { len: usize },
}

/// What a stream carries: sample encoding, sample rate and interleaved channel count.
///
/// Build it with [`AudioFormat::new`], which checks the values are ones netjam supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AudioFormat {
    pub codec: Codec,
    /// Frames per second (Hz); also the RTP clock rate.
    pub rate: u32,
    pub channels: u16,
}

impl AudioFormat {
    /// A checked format: `rate` must be 8000 to 192000 Hz (Opus: 48000) and `channels` 1
    /// to 64.
    pub fn new(codec: Codec, rate: u32, channels: u16) -> Result<Self, FormatError> {
        if !(MIN_RATE..=MAX_RATE).contains(&rate) {
            return Err(FormatError::UnsupportedRate(rate));
        }
        if channels == 0 || channels > MAX_CHANNELS {
            return Err(FormatError::UnsupportedChannels(channels));
        }
        if codec == Codec::Opus {
            if rate != 48_000 {
                return Err(FormatError::OpusRate(rate));
            }
            if channels > 2 {
                return Err(FormatError::OpusChannels(channels));
            }
        }
        Ok(Self {
            codec,
            rate,
            channels,
        })
    }

    /// Checks a format that may have been built field by field (e.g. deserialized).
    pub fn validate(&self) -> Result<(), FormatError> {
        Self::new(self.codec, self.rate, self.channels).map(|_| ())
    }

    /// Bytes one frame (one sample of every channel) takes on the wire.
    pub fn bytes_per_frame(&self) -> usize {
        self.codec.bytes_per_sample() * usize::from(self.channels)
    }

    /// Payload bytes of a packet carrying `frames` frames.
    pub fn bytes_for_frames(&self, frames: u32) -> usize {
        self.bytes_per_frame().saturating_mul(frames as usize)
    }

    /// The RTP payload type for this format: the static types of RFC 3551 where one exists
    /// (10 for L16/44100/stereo, 11 for L16/44100/mono), otherwise a dynamic type that
    /// SDP announces (L16 = 96, L24 = 97, F32 = 98, Opus = 100; RED is 99).
    pub fn payload_type(&self) -> u8 {
        match (self.codec, self.rate, self.channels) {
            (Codec::L16, 44_100, 2) => 10,
            (Codec::L16, 44_100, 1) => 11,
            (Codec::L16, _, _) => 96,
            (Codec::L24, _, _) => 97,
            (Codec::F32, _, _) => 98,
            (Codec::Opus, _, _) => 100,
        }
    }

    /// Code of the sample rate in netjam's RTP format extension; None for a rate written
    /// out in full (after [`RATE_CODE_EXPLICIT`]).
    pub fn rate_code(&self) -> Option<u8> {
        CODED_RATES
            .iter()
            .position(|&r| r == self.rate)
            .map(|i| i as u8 + 1)
    }

    /// Inverse of [`AudioFormat::rate_code`] (not for [`RATE_CODE_EXPLICIT`], whose rate
    /// is in the element itself).
    pub fn rate_from_code(code: u8) -> Result<u32, FormatError> {
        match code {
            1..=12 => Ok(CODED_RATES[usize::from(code) - 1]),
            other => Err(FormatError::UnknownRateCode(other)),
        }
    }

    /// Wall-clock duration in nanoseconds of `frames` frames of media time, rounded to the
    /// nearest nanosecond (e.g. 32 frames at 48 kHz = 666,667 ns).
    pub fn ns_per_frames(&self, frames: u32) -> u64 {
        self.frames_to_ns(u64::from(frames))
    }

    /// Wall-clock duration in nanoseconds of `frames` frames of media time, rounded to the
    /// nearest nanosecond; saturates at `u64::MAX`.
    pub fn frames_to_ns(&self, frames: u64) -> u64 {
        let rate = u128::from(self.rate.max(1));
        let ns = (u128::from(frames) * 1_000_000_000 + rate / 2) / rate;
        u64::try_from(ns).unwrap_or(u64::MAX)
    }

    /// Whole frames of media time that fit in `ns` nanoseconds of wall time (rounded down).
    pub fn frames_per_ns(&self, ns: u64) -> u64 {
        let frames = u128::from(ns) * u128::from(self.rate) / 1_000_000_000;
        u64::try_from(frames).unwrap_or(u64::MAX)
    }
}

impl std::fmt::Display for AudioFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}ch", self.codec, self.rate, self.channels)
    }
}

const L16_SCALE: f32 = 32_768.0;
const L24_SCALE: f32 = 8_388_608.0;

/// Encodes interleaved samples (nominally in `[-1, 1]`) into `out`, big-endian.
///
/// Returns the bytes written: as many whole samples as fit in `out`. Integer codecs scale
/// by 2^15 (L16) or 2^23 (L24), round to nearest, and clamp, so `i / 2^15` encodes back to
/// exactly `i`; NaN encodes as 0. F32 copies the IEEE bits unchanged, NaN payloads included.
pub fn encode(codec: Codec, samples: &[f32], out: &mut [u8]) -> usize {
    let width = codec.bytes_per_sample();
    let mut written = 0;
    match codec {
        Codec::L16 => {
            for (x, o) in samples.iter().zip(out.chunks_exact_mut(2)) {
                let v = (x * L16_SCALE).round().clamp(-32_768.0, 32_767.0) as i16;
                o.copy_from_slice(&v.to_be_bytes());
                written += width;
            }
        }
        Codec::L24 => {
            for (x, o) in samples.iter().zip(out.chunks_exact_mut(3)) {
                let v = (x * L24_SCALE).round().clamp(-8_388_608.0, 8_388_607.0) as i32;
                let b = v.to_be_bytes();
                o.copy_from_slice(&b[1..4]);
                written += width;
            }
        }
        Codec::F32 => {
            for (x, o) in samples.iter().zip(out.chunks_exact_mut(4)) {
                o.copy_from_slice(&x.to_bits().to_be_bytes());
                written += width;
            }
        }
        Codec::Opus => {}
    }
    written
}

/// Decodes big-endian samples from `bytes` into interleaved `f32` in `out`.
///
/// Returns the samples written: as many whole samples as `bytes` holds and `out` has room
/// for; a trailing partial sample is ignored. L16 divides by 2^15, L24 by 2^23; F32 copies
/// the IEEE bits unchanged.
pub fn decode(codec: Codec, bytes: &[u8], out: &mut [f32]) -> usize {
    let mut written = 0;
    match codec {
        Codec::L16 => {
            for (b, o) in bytes.chunks_exact(2).zip(out.iter_mut()) {
                *o = f32::from(i16::from_be_bytes([b[0], b[1]])) / L16_SCALE;
                written += 1;
            }
        }
        Codec::L24 => {
            for (b, o) in bytes.chunks_exact(3).zip(out.iter_mut()) {
                // Place the 24 bits at the top of an i32 and shift back to sign-extend.
                let v = i32::from_be_bytes([b[0], b[1], b[2], 0]) >> 8;
                *o = v as f32 / L24_SCALE;
                written += 1;
            }
        }
        Codec::F32 => {
            for (b, o) in bytes.chunks_exact(4).zip(out.iter_mut()) {
                *o = f32::from_bits(u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                written += 1;
            }
        }
        Codec::Opus => {}
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SimRng;

    #[test]
    fn every_i16_round_trips_bit_exact_through_f32() {
        let mut bytes = [0u8; 2];
        let mut back = [0f32; 1];
        for i in i16::MIN..=i16::MAX {
            let x = f32::from(i) / 32_768.0;
            assert_eq!(encode(Codec::L16, &[x], &mut bytes), 2);
            assert_eq!(bytes, i.to_be_bytes(), "encode {i}");
            assert_eq!(decode(Codec::L16, &bytes, &mut back), 1);
            assert_eq!(back[0].to_bits(), x.to_bits(), "decode {i}");
        }
    }

    #[test]
    fn a_sweep_of_i24_round_trips_bit_exact() {
        let mut bytes = [0u8; 3];
        let mut back = [0f32; 1];
        let check = |i: i32, bytes: &mut [u8; 3], back: &mut [f32; 1]| {
            let x = i as f32 / 8_388_608.0;
            assert_eq!(encode(Codec::L24, &[x], bytes), 3);
            assert_eq!(bytes[..], i.to_be_bytes()[1..], "encode {i}");
            assert_eq!(decode(Codec::L24, bytes, back), 1);
            assert_eq!(back[0].to_bits(), x.to_bits(), "decode {i}");
        };
        // Every 97th value across the whole range, plus the edges and around zero.
        let mut i = -8_388_608;
        while i <= 8_388_607 {
            check(i, &mut bytes, &mut back);
            i += 97;
        }
        for i in (-8_388_608..-8_388_500)
            .chain(-300..300)
            .chain(8_388_500..=8_388_607)
        {
            check(i, &mut bytes, &mut back);
        }
    }

    #[test]
    fn arbitrary_f32_bit_patterns_round_trip_including_nan_payloads() {
        let mut rng = SimRng::new(32);
        let mut samples = [0f32; 256];
        let mut bytes = [0u8; 1024];
        let mut back = [0f32; 256];
        for _ in 0..200 {
            for s in samples.iter_mut() {
                *s = f32::from_bits(rng.next_u64() as u32);
            }
            samples[0] = f32::from_bits(0x7fc0_1234); // quiet NaN with payload
            samples[1] = f32::from_bits(0xff80_0001); // signalling NaN, negative
            assert_eq!(encode(Codec::F32, &samples, &mut bytes), 1024);
            assert_eq!(
                bytes[8..12],
                samples[2].to_bits().to_be_bytes(),
                "big-endian IEEE bits"
            );
            assert_eq!(decode(Codec::F32, &bytes, &mut back), 256);
            for (a, b) in samples.iter().zip(back.iter()) {
                assert_eq!(a.to_bits(), b.to_bits());
            }
        }
    }

    #[test]
    fn out_of_range_and_nan_samples_clamp() {
        let mut bytes = [0u8; 12];
        let n = encode(
            Codec::L16,
            &[1.0, -1.0, 7.5, -7.5, f32::NAN, f32::INFINITY],
            &mut bytes,
        );
        assert_eq!(n, 12);
        assert_eq!(
            bytes,
            [0x7f, 0xff, 0x80, 0x00, 0x7f, 0xff, 0x80, 0x00, 0, 0, 0x7f, 0xff]
        );
        let mut bytes = [0u8; 9];
        encode(Codec::L24, &[1.0, -2.0, f32::NEG_INFINITY], &mut bytes);
        assert_eq!(bytes, [0x7f, 0xff, 0xff, 0x80, 0, 0, 0x80, 0, 0]);
    }

    #[test]
    fn short_buffers_convert_whole_samples_only() {
        let mut out = [0u8; 5];
        assert_eq!(encode(Codec::L16, &[0.5, 0.5, 0.5], &mut out), 4);
        assert_eq!(encode(Codec::L24, &[0.5, 0.5], &mut out), 3);
        assert_eq!(encode(Codec::F32, &[0.5; 4], &mut out), 4);
        assert_eq!(encode(Codec::F32, &[0.5; 4], &mut []), 0);
        let mut samples = [0f32; 8];
        assert_eq!(decode(Codec::L16, &[0, 1, 2], &mut samples), 1);
        assert_eq!(decode(Codec::L24, &[0, 1, 2, 3, 4], &mut samples), 1);
        assert_eq!(decode(Codec::F32, &[0; 7], &mut samples), 1);
        assert_eq!(decode(Codec::L16, &[0; 100], &mut samples[..3]), 3);
    }

    #[test]
    fn format_validation_names_what_is_allowed() {
        assert!(AudioFormat::new(Codec::L24, 48_000, 2).is_ok());
        for rate in [8_000, 22_050, 44_100, 47_999, 192_000] {
            assert!(AudioFormat::new(Codec::L16, rate, 2).is_ok(), "{rate}");
        }
        for rate in [0, 7_999, 192_001, 384_000] {
            let e = AudioFormat::new(Codec::L16, rate, 2).expect_err("invalid");
            assert_eq!(e, FormatError::UnsupportedRate(rate));
            assert!(e.to_string().contains("8000 to 192000"), "{e}");
        }
        let e = AudioFormat::new(Codec::L16, 48_000, 0).expect_err("invalid");
        assert!(e.to_string().contains("1 to 64"));
        assert!(AudioFormat::new(Codec::L16, 48_000, 65).is_err());
        assert!(AudioFormat::new(Codec::L16, 48_000, 64).is_ok());
        assert!(AudioFormat::new(Codec::Opus, 48_000, 2).is_ok());
        assert_eq!(
            AudioFormat::new(Codec::Opus, 44_100, 2),
            Err(FormatError::OpusRate(44_100))
        );
        assert_eq!(
            AudioFormat::new(Codec::Opus, 48_000, 3),
            Err(FormatError::OpusChannels(3))
        );
    }

    #[test]
    fn codec_names() {
        assert_eq!(Codec::from_name("L16"), Ok(Codec::L16));
        assert_eq!(Codec::from_name("l24"), Ok(Codec::L24));
        assert_eq!(Codec::from_name("F32"), Ok(Codec::F32));
        assert_eq!(Codec::from_name("Opus"), Ok(Codec::Opus));
        let e = Codec::from_name("mp3").expect_err("invalid");
        assert!(e.to_string().contains("l16, l24, f32 and opus"));
        for c in [Codec::L16, Codec::L24, Codec::F32, Codec::Opus] {
            assert_eq!(Codec::from_sdp_name(c.sdp_name()), Some(c));
            assert_eq!(Codec::from_wire_code(c.wire_code()), Ok(c));
        }
        assert_eq!(serde_json::to_string(&Codec::L24).expect("serialize"), "\"l24\"");
    }

    #[test]
    fn payload_types_follow_rfc_3551_static_assignments() {
        let f = |c, r, ch| AudioFormat::new(c, r, ch).expect("valid").payload_type();
        assert_eq!(f(Codec::L16, 44_100, 2), 10);
        assert_eq!(f(Codec::L16, 44_100, 1), 11);
        assert_eq!(f(Codec::L16, 48_000, 2), 96);
        assert_eq!(f(Codec::L16, 44_100, 4), 96);
        assert_eq!(f(Codec::L24, 44_100, 2), 97);
        assert_eq!(f(Codec::F32, 96_000, 8), 98);
        assert_ne!(RED_PAYLOAD_TYPE, 98);
    }

    #[test]
    fn media_and_wall_time_conversions() {
        let f = AudioFormat::new(Codec::L24, 48_000, 2).expect("valid");
        assert_eq!(f.bytes_per_frame(), 6);
        assert_eq!(f.bytes_for_frames(32), 192);
        assert_eq!(f.ns_per_frames(48_000), 1_000_000_000);
        assert_eq!(f.ns_per_frames(32), 666_667);
        assert_eq!(f.frames_per_ns(666_667), 32);
        assert_eq!(f.frames_per_ns(1_000_000), 48);
        let f = AudioFormat::new(Codec::L16, 44_100, 1).expect("valid");
        assert_eq!(f.ns_per_frames(441), 10_000_000);
        assert_eq!(f.frames_to_ns(u64::MAX), u64::MAX);
    }
}
