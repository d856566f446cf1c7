//! `netjam send`, `netjam recv` and `netjam sdp`: their flags, the source or receiver they
//! name, and the SDP text; the streams run in [`crate::stream_play`].

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use netjam_engine::delay::LatencyPolicy;
use netjam_engine::receiver::{Receiver, ReceiverConfig};
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::synth::SynthKind;
use netjam_engine::wire::sdp::{parse_sdp, write_sdp, SdpStream};
use netjam_engine::wire::{AudioFormat, Codec};

use super::common::{check_outputs, resolve};
use crate::endpoint::channels::{ChannelMap, MapSide, PickedSource};
use crate::endpoint::raw::{RawSink, RawSource};
use crate::endpoint::synth::SynthSource;
use crate::endpoint::wav::{WavSink, WavSource};
use crate::endpoint::{FrameSource, SampleFormat};
use crate::lifecycle::{cname, fresh_seed, wall_offset_ns};
use crate::opus::{OpusEncoder, OpusSettings};
use crate::resample::ResampledSource;
use crate::shell::BufferSize;
use crate::stream_play::{RecvPlay, SendPlay};

fn parse_codec(s: &str) -> Result<Codec, String> {
    Codec::from_name(s).map_err(|e| e.to_string())
}

/// Where the audio to send comes from.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["input", "stdin", "sine", "clicks", "noise", "silence"])))]
pub struct SourceArgs {
    /// A WAV file to send (played in real time).
    #[arg(long, value_name = "FILE.wav")]
    pub input: Option<PathBuf>,
    /// Read raw interleaved PCM from stdin (layout from --sample-format, --rate, --channels).
    #[arg(long)]
    pub stdin: bool,
    /// Send a sine tone of this frequency.
    #[arg(long, value_name = "HZ")]
    pub sine: Option<f64>,
    /// Send a click track at this tempo.
    #[arg(long, value_name = "BPM")]
    pub clicks: Option<f64>,
    /// Send white noise.
    #[arg(long)]
    pub noise: bool,
    /// Send silence (just listen).
    #[arg(long)]
    pub silence: bool,
    /// Sample rate, 8000 to 192000 Hz (default: the WAV's, else 48000).
    #[arg(long)]
    pub rate: Option<u32>,
    /// Channels (default: the WAV's, else 2).
    #[arg(long)]
    pub channels: Option<u16>,
    /// Layout of raw PCM on stdin (default: s16le).
    #[arg(long, value_enum)]
    pub sample_format: Option<SampleFormat>,
    /// Send only these channels of the device, file or stdin, numbered from 1 as the
    /// interface labels them: `1,2`, `3-4`, `1,3-5`. The stream carries one channel per
    /// channel named (default: all of them).
    #[arg(long, value_name = "LIST", value_parser = parse_inputs)]
    pub inputs: Option<ChannelMap>,
}

/// `--inputs LIST` for clap.
pub fn parse_inputs(s: &str) -> Result<ChannelMap, String> {
    ChannelMap::parse(MapSide::Inputs, s).map_err(|e| e.to_string())
}

/// `--outputs LIST` for clap.
pub fn parse_outputs(s: &str) -> Result<ChannelMap, String> {
    ChannelMap::parse(MapSide::Outputs, s).map_err(|e| e.to_string())
}

impl SourceArgs {
    /// Refuse a flag that only raw PCM on stdin reads, when the audio comes from elsewhere.
    pub fn refuse_stray(&self) -> anyhow::Result<()> {
        if self.sample_format.is_some() && !self.stdin {
            bail!(
                "--sample-format sets the layout of raw PCM read with --stdin: add --stdin, or leave it out (a WAV file \
                 and a device say their own format)"
            );
        }
        Ok(())
    }

    /// Open the source, keeping only the channels `--inputs` names; also returns the codec
    /// that carries it without loss.
    pub fn open(&self) -> anyhow::Result<(Box<dyn FrameSource>, Codec)> {
        let (source, codec) = self.open_all()?;
        let Some(map) = &self.inputs else {
            return Ok((source, codec));
        };
        let what = match &self.input {
            Some(path) => path.display().to_string(),
            None if self.stdin => "stdin (--channels)".to_string(),
            None => "the test signal (--channels)".to_string(),
        };
        let picked = PickedSource::new(source, map.clone(), &what)?;
        Ok((Box::new(picked), codec))
    }

    /// The source with all its channels.
    fn open_all(&self) -> anyhow::Result<(Box<dyn FrameSource>, Codec)> {
        if let Some(path) = &self.input {
            let wav = WavSource::open(path)?;
            let codec = wav.lossless_codec();
            if self.rate.is_some_and(|r| r != wav.rate())
                || self.channels.is_some_and(|c| c != wav.channels())
            {
                bail!(
                    "{} is {} Hz, {} channels: leave out --rate/--channels for a WAV input (netjam does not resample files)",
                    path.display(),
                    wav.rate(),
                    wav.channels()
                );
            }
            return Ok((Box::new(wav), codec));
        }
        let rate = self.rate.unwrap_or(48_000);
        let channels = self.channels.unwrap_or(2);
        if self.stdin {
            return Ok((
                Box::new(RawSource::new(
                    std::io::stdin(),
                    self.sample_format.unwrap_or(SampleFormat::S16le),
                    rate,
                    channels,
                )),
                Codec::L16,
            ));
        }
        let kind = if let Some(hz) = self.sine {
            SynthKind::Sine { hz }
        } else if let Some(bpm) = self.clicks {
            SynthKind::Clicks { bpm }
        } else if self.silence {
            SynthKind::Sine { hz: 0.0 }
        } else {
            SynthKind::Noise
        };
        Ok((
            Box::new(SynthSource::new(kind, rate, channels, fresh_seed())),
            Codec::L16,
        ))
    }
}

/// How audio is packetized on the wire.
#[derive(Debug, Args)]
pub struct WireArgs {
    /// Encoding on the wire: l16, l24, f32 or opus (default: lossless for the input, else l16).
    #[arg(long, value_parser = parse_codec)]
    pub codec: Option<Codec>,
    /// Frames per period, and per packet for l16/l24/f32 (16..=1024).
    #[arg(long, default_value_t = 64)]
    pub frames: u32,
    /// Opus: milliseconds of audio per packet: 2.5, 5, 10 or 20 (default: 2.5).
    #[arg(long, value_name = "MS")]
    pub opus_frame: Option<f64>,
    /// Opus: bitrate of the stream in kbit/s (default: 96 per channel).
    #[arg(long, value_name = "KBPS")]
    pub bitrate: Option<u32>,
    /// Opus: encoder complexity, 0 (least CPU) to 10 (best quality) (default: 5).
    #[arg(long)]
    pub complexity: Option<u8>,
    /// Each packet also carries the previous N packets (RFC 2198), 0..=8.
    #[arg(long, default_value_t = 0)]
    pub redundancy: usize,
    /// Your name, shown to the other side. In a room it is yours alone (whatever the
    /// case): a second player joining under it is refused, while netjam restarted on the
    /// same computer under it takes your seat back at once.
    #[arg(long)]
    pub name: Option<String>,
}

/// Opus packets of 2.5 ms unless `--opus-frame` says otherwise: the lowest latency it has.
const DEFAULT_OPUS_FRAME_MS: f64 = 2.5;
/// Opus's encoder complexity unless `--complexity` says otherwise.
const DEFAULT_OPUS_COMPLEXITY: u8 = 5;

impl WireArgs {
    /// Refuse the Opus settings when the stream is not Opus: before anything opens, never
    /// silently ignored.
    pub fn refuse_stray(&self) -> anyhow::Result<()> {
        if self.codec == Some(Codec::Opus) {
            return Ok(());
        }
        for (given, flag) in [
            (self.bitrate.is_some(), "--bitrate"),
            (self.opus_frame.is_some(), "--opus-frame"),
            (self.complexity.is_some(), "--complexity"),
        ] {
            if given {
                bail!("{flag} applies to --codec opus; l16/l24/f32 send every sample as it is: add --codec opus, or leave out {flag}");
            }
        }
        Ok(())
    }

    /// A sender for `source`'s audio.
    pub fn sender(&self, source: &dyn FrameSource, default_codec: Codec) -> anyhow::Result<Sender> {
        self.sender_after_edge(source, default_codec, 0)
    }

    /// [`WireArgs::sender`] for a source that passes an edge resampler first, whose delay
    /// (`edge_delay_ns`) the codec delay then includes.
    pub fn sender_after_edge(
        &self,
        source: &dyn FrameSource,
        default_codec: Codec,
        edge_delay_ns: u64,
    ) -> anyhow::Result<Sender> {
        let format = AudioFormat::new(
            self.codec.unwrap_or(default_codec),
            source.rate(),
            source.channels(),
        )?;
        let config = SenderConfig {
            format,
            frames_per_packet: self.frames,
            redundancy: self.redundancy,
            seed: fresh_seed(),
            cname: cname(),
            name: self.name.clone(),
            wall_offset_ns: wall_offset_ns(),
        };
        let sender = if format.codec == Codec::Opus {
            let kbps = crate::opus::bitrate_kbps(self.bitrate, format.channels);
            let settings = OpusSettings::new(
                self.opus_frame.unwrap_or(DEFAULT_OPUS_FRAME_MS),
                kbps,
                self.complexity.unwrap_or(DEFAULT_OPUS_COMPLEXITY),
            )?;
            let edge_frames = (edge_delay_ns * u64::from(crate::resample::OPUS_RATE) / 1_000_000_000) as u32;
            let encoder = OpusEncoder::new(format, settings)?.with_edge_delay(edge_frames);
            Sender::with_encoder(
                SenderConfig {
                    frames_per_packet: settings.frames,
                    ..config
                },
                Some(Box::new(encoder)),
            )?
        } else {
            self.refuse_stray()?;
            Sender::new(config)?
        };
        if sender.max_packet_bytes() > netjam_engine::sender::MTU_PAYLOAD {
            eprintln!(
                "netjam: warning: packets of {} bytes exceed a 1500-byte MTU and will be fragmented; fewer --frames or channels avoid that",
                sender.max_packet_bytes()
            );
        }
        Ok(sender)
    }
}

/// Send audio to a netjam receiver (or anything that speaks RTP).
#[derive(Debug, Args)]
pub struct SendArgs {
    /// Where to send: HOST:PORT of `netjam recv`, `netjam reflect` or another RTP receiver.
    #[arg(long)]
    pub to: String,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub wire: WireArgs,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Local address to send from.
    #[arg(long)]
    pub bind: Option<SocketAddr>,
    /// Write the sender's statistics and its clock thread's timing (every period that
    /// started late, and where in the stream) as JSON to this file at the end.
    #[arg(long, value_name = "FILE.json")]
    pub stats_json: Option<PathBuf>,
}

pub fn run_send(a: SendArgs) -> anyhow::Result<()> {
    a.source.refuse_stray()?;
    a.wire.refuse_stray()?;
    check_outputs([(a.stats_json.as_deref(), "--stats-json")])?;
    let to = resolve(&a.to)?;
    let (mut source, default_codec) = a.source.open()?;
    // Opus runs at 48 kHz: a source at another rate passes an edge resampler first.
    let mut edge_delay_ns = 0;
    if a.wire.codec == Some(Codec::Opus) && source.rate() != crate::resample::OPUS_RATE {
        let from = source.rate();
        let resampled = ResampledSource::new(source, crate::resample::OPUS_RATE, a.wire.frames as usize)?;
        edge_delay_ns = resampled.delay_ns();
        eprintln!(
            "netjam: resampling {from} Hz to Opus's 48000 Hz (adds {:.2} ms, counted in the codec delay)",
            edge_delay_ns as f64 / 1e6
        );
        source = Box::new(resampled);
    }
    let sender = a
        .wire
        .sender_after_edge(source.as_ref(), default_codec, edge_delay_ns)?;
    crate::stream_play::send(SendPlay {
        to,
        bind: a.bind,
        source,
        sender,
        frames: a.wire.frames,
        duration_s: a.duration,
        stats_json: a.stats_json,
    })
}

/// Receive a stream and play it into a WAV file or stdout.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("sink").required(true).args(["output", "stdout"])))]
pub struct RecvArgs {
    /// Address to listen on, e.g. 0.0.0.0:4464.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Write what is played to this WAV file.
    #[arg(long, value_name = "FILE.wav")]
    pub output: Option<PathBuf>,
    /// Write raw interleaved PCM to stdout (layout from --sample-format).
    #[arg(long)]
    pub stdout: bool,
    /// Stop after this many seconds of playout.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Jitter buffer: auto, a number of frames, or milliseconds (e.g. 3ms).
    #[arg(long, default_value = "auto")]
    pub buffer: BufferSize,
    /// With an auto buffer: tight gives latency back within a second of a transient and
    /// ignores one-off delay peaks; safe covers delay peaks up to 60 ms for ten seconds.
    #[arg(long, default_value = "tight")]
    pub latency: LatencyPolicy,
    /// Write the final statistics and their time series as JSON.
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
    /// For plain RTP without netjam's format extension: the codec.
    #[arg(long, value_parser = parse_codec)]
    pub codec: Option<Codec>,
    /// For plain RTP: the sample rate.
    #[arg(long)]
    pub rate: Option<u32>,
    /// For plain RTP: the channel count.
    #[arg(long)]
    pub channels: Option<u16>,
    /// For plain RTP: the payload type (default: the usual one for the format).
    #[arg(long)]
    pub pt: Option<u8>,
    /// For plain RTP: take codec, rate, channels and payload type from an SDP file.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["codec", "rate", "channels"])]
    pub sdp: Option<PathBuf>,
    /// Frames per playout period (the stand-in for a sound card's buffer).
    #[arg(long, default_value_t = 64)]
    pub period: u32,
    /// Layout of raw PCM on stdout (default: s16le).
    #[arg(long, value_enum)]
    pub sample_format: Option<SampleFormat>,
    /// Follow the sender's clock by resampling instead of inserting or skipping a period
    /// now and then (off by default here: a file then receives the stream bit-exact).
    #[arg(long)]
    pub drift_correction: bool,
}

fn fixed_format(a: &RecvArgs) -> anyhow::Result<Option<(AudioFormat, u8)>> {
    if let Some(path) = &a.sdp {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let s = parse_sdp(&text)
            .with_context(|| format!("{} is not an SDP netjam can receive", path.display()))?;
        return Ok(Some((s.format, s.payload_type)));
    }
    if a.codec.is_none() && a.rate.is_none() && a.channels.is_none() {
        return Ok(None);
    }
    let (Some(codec), Some(rate), Some(channels)) = (a.codec, a.rate, a.channels) else {
        bail!("for plain RTP give all of --codec, --rate and --channels (or --sdp FILE)");
    };
    let f = AudioFormat::new(codec, rate, channels)?;
    Ok(Some((f, a.pt.unwrap_or(f.payload_type()))))
}

pub fn run_recv(a: RecvArgs) -> anyhow::Result<()> {
    if a.sample_format.is_some() && a.output.is_some() {
        bail!("--sample-format sets the layout of raw PCM written with --stdout; a WAV file (--output) keeps the stream's own format: leave out --sample-format, or use --stdout");
    }
    check_outputs([
        (a.output.as_deref(), "--output"),
        (a.stats_json.as_deref(), "--stats-json"),
    ])?;
    let fixed = fixed_format(&a)?;
    let receiver = Receiver::new(ReceiverConfig {
        buffer: a.buffer.mode(fixed.map_or(48_000, |f| f.0.rate)),
        fixed_format: fixed,
        max_channels: 64,
        max_redundancy_wait: 8,
        seed: fresh_seed(),
        cname: cname(),
        name: None,
        decoders: crate::opus::decoders(),
    });
    let (output, sample_format) = (a.output.clone(), a.sample_format);
    crate::stream_play::recv(RecvPlay {
        listen: a.listen,
        receiver,
        buffer: a.buffer,
        latency: a.latency,
        drift_correction: a.drift_correction,
        sink: Box::new(move |format| {
            Ok(match output {
                Some(path) => Box::new(WavSink::create(
                    &path,
                    format.rate,
                    format.channels,
                    format.codec,
                )?),
                None => Box::new(RawSink::new(
                    std::io::stdout(),
                    sample_format.unwrap_or(SampleFormat::S16le),
                )),
            })
        }),
        period: a.period,
        duration_s: a.duration,
        stats_json: a.stats_json,
    })
}

/// Print an SDP description of a stream so GStreamer or ffmpeg can receive it.
#[derive(Debug, Args)]
pub struct SdpArgs {
    #[arg(long, value_parser = parse_codec, default_value = "l16")]
    pub codec: Codec,
    #[arg(long, default_value_t = 48_000)]
    pub rate: u32,
    #[arg(long, default_value_t = 2)]
    pub channels: u16,
    /// The port the stream arrives on.
    #[arg(long)]
    pub port: u16,
    /// The address the stream is sent to.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: std::net::IpAddr,
    /// Frames per packet (sets a=ptime).
    #[arg(long)]
    pub frames: Option<u32>,
}

pub fn run_sdp(a: SdpArgs) -> anyhow::Result<()> {
    let format = AudioFormat::new(a.codec, a.rate, a.channels)?;
    let s = SdpStream {
        format,
        payload_type: format.payload_type(),
        address: a.address,
        port: a.port,
        frames_per_packet: a.frames,
    };
    print!("{}", write_sdp(&s, "netjam"));
    Ok(())
}
