//! Opus through libopus, opened at run time like libjack: netjam builds without Opus's
//! headers, and only `--codec opus` (or an Opus stream arriving) needs the library
//! (see [`crate::dl`] for where it is looked for).
//!
//! The encoder runs in the restricted-low-delay application (CELT only: 2.5 ms of
//! look-ahead instead of 6.5 ms), as music at constant bitrate, so packets have a steady
//! size the link can be measured for. Encoding and decoding run on the audio thread:
//! libopus allocates nothing after `*_create` (its scratch space is on the stack).

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::OnceLock;

use netjam_engine::codec::{CodecError, DecoderFactory, FrameDecoder, FrameEncoder, OPUS_FRAME_SIZES};
use netjam_engine::wire::AudioFormat;

use crate::dl::{cstr_lossy, Library, LIBOPUS};

const APPLICATION_RESTRICTED_LOWDELAY: c_int = 2051;
const SET_BITRATE: c_int = 4002;
const SET_VBR: c_int = 4006;
const SET_COMPLEXITY: c_int = 4010;
const SET_SIGNAL: c_int = 4024;
const GET_LOOKAHEAD: c_int = 4027;
const RESET_STATE: c_int = 4028;
const SIGNAL_MUSIC: c_int = 3002;

type Encoder = c_void;
type Decoder = c_void;

/// The libopus functions netjam uses.
#[derive(Debug)]
struct OpusApi {
    encoder_create: unsafe extern "C" fn(i32, c_int, c_int, *mut c_int) -> *mut Encoder,
    encode_float: unsafe extern "C" fn(*mut Encoder, *const f32, c_int, *mut u8, i32) -> i32,
    encoder_ctl: unsafe extern "C" fn(*mut Encoder, c_int, ...) -> c_int,
    encoder_destroy: unsafe extern "C" fn(*mut Encoder),
    decoder_create: unsafe extern "C" fn(i32, c_int, *mut c_int) -> *mut Decoder,
    decode_float: unsafe extern "C" fn(*mut Decoder, *const u8, i32, *mut f32, c_int, c_int) -> c_int,
    decoder_ctl: unsafe extern "C" fn(*mut Decoder, c_int, ...) -> c_int,
    decoder_destroy: unsafe extern "C" fn(*mut Decoder),
    strerror: unsafe extern "C" fn(c_int) -> *const std::ffi::c_char,
    version: unsafe extern "C" fn() -> *const std::ffi::c_char,
}

impl OpusApi {
    // Each transmute's target is the declared type of the field it initializes.
    #[allow(clippy::missing_transmute_annotations)]
    fn load() -> Result<Self, String> {
        let lib = Library::open(&LIBOPUS)?;
        macro_rules! f {
            ($name:literal) => {
                // SAFETY: the symbol comes from libopus, whose C declaration of this function
                // matches the field's type (see opus/opus.h); the library stays loaded forever.
                unsafe { std::mem::transmute::<*mut c_void, _>(lib.sym($name)?) }
            };
        }
        Ok(Self {
            encoder_create: f!(c"opus_encoder_create"),
            encode_float: f!(c"opus_encode_float"),
            encoder_ctl: f!(c"opus_encoder_ctl"),
            encoder_destroy: f!(c"opus_encoder_destroy"),
            decoder_create: f!(c"opus_decoder_create"),
            decode_float: f!(c"opus_decode_float"),
            decoder_ctl: f!(c"opus_decoder_ctl"),
            decoder_destroy: f!(c"opus_decoder_destroy"),
            strerror: f!(c"opus_strerror"),
            version: f!(c"opus_get_version_string"),
        })
    }

    fn get() -> Result<&'static Self, OpusError> {
        static API: OnceLock<Result<OpusApi, String>> = OnceLock::new();
        API.get_or_init(Self::load)
            .as_ref()
            .map_err(|e| OpusError::LibraryMissing(e.clone()))
    }

    fn error_text(&self, code: c_int) -> String {
        // SAFETY: opus_strerror returns a static NUL-terminated string for any code.
        unsafe { cstr_lossy((self.strerror)(code)) }
    }
}

/// Why Opus could not be used.
#[derive(Debug, thiserror::Error)]
pub enum OpusError {
    #[error("{0}; or use --codec l16/l24")]
    LibraryMissing(String),
    #[error("libopus refused the {what}: {why}")]
    Refused { what: &'static str, why: String },
    #[error("opus frames are 2.5, 5, 10 or 20 ms, not {0} ms")]
    FrameSize(f64),
    #[error("opus complexity is 0 to 10, not {0}")]
    Complexity(u8),
    #[error("opus bitrate {0} kbit/s is out of range: use 6 to 510 per stream")]
    Bitrate(u32),
}

/// libopus's version, if it is installed.
pub fn version() -> Option<String> {
    let api = OpusApi::get().ok()?;
    // SAFETY: opus_get_version_string returns a static NUL-terminated string.
    Some(unsafe { cstr_lossy((api.version)()) })
}

/// Default bitrate per channel, kbit/s: transparent for most music at 2.5 ms frames.
pub const DEFAULT_KBPS_PER_CHANNEL: u32 = 96;

/// The stream bitrate `--bitrate` gives, or the default for `channels`, kbit/s.
pub fn bitrate_kbps(asked: Option<u32>, channels: u16) -> u32 {
    asked.unwrap_or(DEFAULT_KBPS_PER_CHANNEL * u32::from(channels))
}

/// How the encoder runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OpusSettings {
    /// Frames per packet at 48 kHz (120, 240, 480 or 960).
    pub frames: u32,
    /// Bits per second for the whole stream.
    pub bitrate: u32,
    /// 0 (fastest) to 10 (best).
    pub complexity: u8,
}

impl OpusSettings {
    /// Checked settings: `frame_ms` 2.5, 5, 10 or 20; `kbps` 6..=510; `complexity` 0..=10.
    pub fn new(frame_ms: f64, kbps: u32, complexity: u8) -> Result<Self, OpusError> {
        let frames = OPUS_FRAME_SIZES
            .into_iter()
            .find(|&f| (f64::from(f) / 48.0 - frame_ms).abs() < 1e-6)
            .ok_or(OpusError::FrameSize(frame_ms))?;
        if !(6..=510).contains(&kbps) {
            return Err(OpusError::Bitrate(kbps));
        }
        if complexity > 10 {
            return Err(OpusError::Complexity(complexity));
        }
        Ok(Self {
            frames,
            bitrate: kbps * 1000,
            complexity,
        })
    }
}

/// A libopus encoder (restricted low delay, music, constant bitrate).
#[derive(Debug)]
pub struct OpusEncoder {
    api: &'static OpusApi,
    raw: NonNull<Encoder>,
    channels: usize,
    frames: usize,
    lookahead: u32,
}

// SAFETY: the encoder state is owned by this value alone and used by one thread at a time.
unsafe impl Send for OpusEncoder {}

impl OpusEncoder {
    pub fn new(format: AudioFormat, settings: OpusSettings) -> Result<Self, OpusError> {
        let api = OpusApi::get()?;
        let mut err: c_int = 0;
        // SAFETY: valid rate/channels/application and a valid error out-pointer.
        let raw = unsafe {
            (api.encoder_create)(
                48_000,
                c_int::from(format.channels),
                APPLICATION_RESTRICTED_LOWDELAY,
                &mut err,
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| OpusError::Refused {
            what: "encoder",
            why: api.error_text(err),
        })?;
        let mut enc = Self {
            api,
            raw,
            channels: usize::from(format.channels),
            frames: settings.frames as usize,
            lookahead: 0,
        };
        let ctl = |request: c_int, value: c_int, what: &'static str| -> Result<(), OpusError> {
            // SAFETY: a live encoder and a setter request that takes one opus_int32.
            let r = unsafe { (api.encoder_ctl)(enc.raw.as_ptr(), request, value) };
            if r < 0 {
                return Err(OpusError::Refused {
                    what,
                    why: api.error_text(r),
                });
            }
            Ok(())
        };
        ctl(SET_BITRATE, settings.bitrate as c_int, "bitrate")?;
        ctl(SET_VBR, 0, "constant bitrate")?;
        ctl(SET_COMPLEXITY, c_int::from(settings.complexity), "complexity")?;
        ctl(SET_SIGNAL, SIGNAL_MUSIC, "music signal type")?;
        let mut lookahead: i32 = 0;
        // SAFETY: a live encoder and a getter request that writes one opus_int32.
        unsafe { (api.encoder_ctl)(enc.raw.as_ptr(), GET_LOOKAHEAD, &mut lookahead as *mut i32) };
        enc.lookahead = lookahead.max(0) as u32;
        Ok(enc)
    }

    /// Count `frames` (at 48 kHz) of an edge resampler in front of the encoder as part of
    /// the delay it reports, so the latency budget includes it.
    pub fn with_edge_delay(mut self, frames: u32) -> Self {
        self.lookahead += frames;
        self
    }
}

impl Drop for OpusEncoder {
    fn drop(&mut self) {
        // SAFETY: the encoder was created by opus_encoder_create and is dropped once.
        unsafe { (self.api.encoder_destroy)(self.raw.as_ptr()) };
    }
}

impl FrameEncoder for OpusEncoder {
    fn encode(&mut self, pcm: &[f32], out: &mut [u8]) -> Result<usize, CodecError> {
        let api = self.api;
        if pcm.len() < self.frames * self.channels {
            return Err(CodecError::BufferTooSmall);
        }
        let max = i32::try_from(out.len()).unwrap_or(i32::MAX);
        // SAFETY: `pcm` holds `frames × channels` samples and `out` has `max` bytes.
        let n = unsafe {
            (api.encode_float)(
                self.raw.as_ptr(),
                pcm.as_ptr(),
                self.frames as c_int,
                out.as_mut_ptr(),
                max,
            )
        };
        usize::try_from(n).map_err(|_| CodecError::Rejected(n))
    }

    fn lookahead_frames(&self) -> u32 {
        self.lookahead
    }
}

/// A libopus decoder.
#[derive(Debug)]
pub struct OpusDecoder {
    api: &'static OpusApi,
    raw: NonNull<Decoder>,
    channels: usize,
}

// SAFETY: the decoder state is owned by this value alone and used by one thread at a time.
unsafe impl Send for OpusDecoder {}

impl OpusDecoder {
    pub fn new(format: AudioFormat) -> Result<Self, OpusError> {
        let api = OpusApi::get()?;
        let mut err: c_int = 0;
        // SAFETY: valid rate/channels and a valid error out-pointer.
        let raw = unsafe { (api.decoder_create)(48_000, c_int::from(format.channels), &mut err) };
        let raw = NonNull::new(raw).ok_or_else(|| OpusError::Refused {
            what: "decoder",
            why: api.error_text(err),
        })?;
        Ok(Self {
            api,
            raw,
            channels: usize::from(format.channels),
        })
    }
}

impl Drop for OpusDecoder {
    fn drop(&mut self) {
        // SAFETY: the decoder was created by opus_decoder_create and is dropped once.
        unsafe { (self.api.decoder_destroy)(self.raw.as_ptr()) };
    }
}

impl FrameDecoder for OpusDecoder {
    fn decode(&mut self, packet: Option<&[u8]>, out: &mut [f32]) -> Result<usize, CodecError> {
        let api = self.api;
        let frames = c_int::try_from(out.len() / self.channels).unwrap_or(c_int::MAX);
        let (data, len) = match packet {
            Some(p) => (
                p.as_ptr(),
                i32::try_from(p.len()).map_err(|_| CodecError::BufferTooSmall)?,
            ),
            // Lost: the decoder conceals `frames` frames.
            None => (std::ptr::null(), 0),
        };
        // SAFETY: `data` holds `len` bytes (or is NULL for concealment) and `out` has room
        // for `frames × channels` samples.
        let n = unsafe { (api.decode_float)(self.raw.as_ptr(), data, len, out.as_mut_ptr(), frames, 0) };
        usize::try_from(n).map_err(|_| CodecError::Rejected(n))
    }

    fn reset(&mut self) {
        // SAFETY: a live decoder; OPUS_RESET_STATE takes no argument.
        unsafe { (self.api.decoder_ctl)(self.raw.as_ptr(), RESET_STATE) };
    }
}

/// Makes libopus decoders for the receiver.
#[derive(Debug, Default, Clone, Copy)]
pub struct OpusDecoders;

impl DecoderFactory for OpusDecoders {
    fn decoder(&self, format: AudioFormat) -> Result<Box<dyn FrameDecoder>, String> {
        OpusDecoder::new(format)
            .map(|d| Box::new(d) as Box<dyn FrameDecoder>)
            .map_err(|e| e.to_string())
    }
}

/// The decoders a receiver gets: libopus's when it is installed (checked once).
pub fn decoders() -> Option<std::sync::Arc<dyn DecoderFactory>> {
    OpusApi::get().ok()?;
    Some(std::sync::Arc::new(OpusDecoders))
}

#[cfg(test)]
mod tests {
    use super::*;
    use netjam_engine::wire::Codec;

    fn format(channels: u16) -> AudioFormat {
        AudioFormat::new(Codec::Opus, 48_000, channels).expect("format")
    }

    fn sine(frames: usize, channels: usize, start: usize) -> Vec<f32> {
        (0..frames * channels)
            .map(|i| {
                let t = (start + i / channels) as f32 / 48_000.0;
                0.5 * (std::f32::consts::TAU * 1000.0 * t).sin()
            })
            .collect()
    }

    /// Signal-to-noise ratio of `got` against `want`, dB.
    fn snr_db(want: &[f32], got: &[f32]) -> f64 {
        let (mut s, mut n) = (0.0f64, 0.0f64);
        for (a, b) in want.iter().zip(got) {
            s += f64::from(*a).powi(2);
            n += f64::from(a - b).powi(2);
        }
        10.0 * (s / n.max(1e-20)).log10()
    }

    #[test]
    fn settings_are_checked_with_messages_that_say_what_works() {
        assert_eq!(OpusSettings::new(2.5, 128, 5).expect("valid").frames, 120);
        assert_eq!(OpusSettings::new(20.0, 64, 0).expect("valid").frames, 960);
        assert!(OpusSettings::new(3.0, 128, 5)
            .expect_err("3 ms")
            .to_string()
            .contains("2.5, 5, 10 or 20"));
        assert!(OpusSettings::new(2.5, 5, 5).is_err());
        assert!(OpusSettings::new(2.5, 128, 11).is_err());
    }

    #[test]
    fn a_sine_survives_encoding_at_every_frame_size_and_the_lookahead_is_2_5_ms() {
        assert!(version().is_some(), "libopus is not installed: run scripts/deps");
        for ms in [2.5, 5.0, 10.0, 20.0] {
            for channels in [1usize, 2] {
                let settings = OpusSettings::new(ms, 64 * channels as u32, 5).expect("settings");
                let f = settings.frames as usize;
                let mut enc = OpusEncoder::new(format(channels as u16), settings).expect("encoder");
                assert_eq!(enc.lookahead_frames(), 120, "restricted low delay: 2.5 ms");
                let mut dec = OpusDecoder::new(format(channels as u16)).expect("decoder");
                let mut sent = Vec::new();
                let mut got = Vec::new();
                let mut packet = [0u8; 1275];
                let mut out = vec![0f32; f * channels];
                for k in 0..(48_000 / f) {
                    let pcm = sine(f, channels, k * f);
                    let n = enc.encode(&pcm, &mut packet).expect("encode");
                    assert!(n > 0 && n <= 1275);
                    assert_eq!(
                        netjam_engine::codec::opus_packet_frames(&packet[..n]),
                        Ok(f as u32)
                    );
                    assert_eq!(dec.decode(Some(&packet[..n]), &mut out).expect("decode"), f);
                    sent.extend_from_slice(&pcm);
                    got.extend_from_slice(&out);
                }
                // Align by the codec's delay (the look-ahead), skip the start.
                let d = 120 * channels;
                let snr = snr_db(
                    &sent[4800 * channels..sent.len() - d],
                    &got[4800 * channels + d..],
                );
                assert!(snr > 20.0, "{ms} ms, {channels} ch: SNR {snr:.1} dB");
            }
        }
    }

    #[test]
    fn the_decoder_conceals_a_lost_packet_with_signal_not_silence() {
        assert!(version().is_some(), "libopus is not installed: run scripts/deps");
        let settings = OpusSettings::new(2.5, 96, 5).expect("settings");
        let mut enc = OpusEncoder::new(format(1), settings).expect("encoder");
        let mut dec = OpusDecoder::new(format(1)).expect("decoder");
        let mut packet = [0u8; 1275];
        let mut out = [0f32; 120];
        for k in 0..100 {
            let n = enc.encode(&sine(120, 1, k * 120), &mut packet).expect("encode");
            dec.decode(Some(&packet[..n]), &mut out).expect("decode");
        }
        assert_eq!(dec.decode(None, &mut out).expect("conceal"), 120);
        let rms = (out.iter().map(|x| x * x).sum::<f32>() / 120.0).sqrt();
        assert!(rms > 0.1, "concealment continues the tone: rms {rms}");
        // Garbage is rejected with an error, not a crash.
        assert!(dec.decode(Some(&[0xff, 0xff, 0xff]), &mut out).is_err());
        dec.reset();
    }
}
