//! The player's shell: the device and the audio thread around its process, opened and
//! closed the same way for a two-player jam (`jam --peer`) and a room (`jam --room`).
//!
//! What a player's session does once its network side is set up, in order:
//! [`start_recording`] on the process (with `--record`), [`start_player`] (the device's
//! edge resamplers and the ensemble's click around the process, the endpoint opened, the
//! audio thread started), [`DeviceMonitors::on_snapshot`] for each snapshot while it runs,
//! [`stop_player`], then [`finish_recording`] and [`DeviceMonitors::report`]. The command
//! line parses the flags into [`DeviceSettings`] and prints what comes back; this module
//! says on stderr what the device and the recording do, as every mode says it alike.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use netjam_engine::delay::BufferMode;
use netjam_engine::time::frames_to_ns;
use netjam_engine::wire::AudioFormat;

use crate::endpoint::card;
#[cfg(feature = "cpal")]
use crate::endpoint::card::CardMonitor;
use crate::endpoint::channels::ChannelMap;
use crate::endpoint::jack::{JackEndpoint, JackMonitor};
use crate::endpoint::paced::PacedEndpoint;
use crate::endpoint::raw::RawSink;
use crate::endpoint::wav::WavSink;
use crate::endpoint::{Endpoint, FrameSink, FrameSource, PeriodStats, Realtime, SampleFormat, StreamSpec};
use crate::ensemble::beat::{BeatClicks, JamBeat};
use crate::lifecycle::Running;
use crate::record::{RecordSummary, RecordWriter};
use crate::resample::EdgeProcess;
use crate::session::{NetIo, PlayerProcess};
use crate::status::StatusLine;
use crate::transport::UdpTransport;

/// The audio side a player opened before its network: a JACK client, a sound card or a
/// source played in real time (a file, stdin, a synthesizer).
#[derive(Default)]
pub struct PlayerDevice {
    pub jack: Option<JackEndpoint>,
    pub card: Option<card::Card>,
    pub source: Option<Box<dyn FrameSource>>,
}

impl std::fmt::Debug for PlayerDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlayerDevice")
            .field("jack", &self.jack.is_some())
            .field("card", &self.card.is_some())
            .field("source", &self.source.is_some())
            .finish()
    }
}

impl PlayerDevice {
    /// The device's rate, period and channels; `None` for a source, which runs at the
    /// stream's format.
    pub fn spec(&self) -> Option<StreamSpec> {
        self.jack
            .as_ref()
            .map(|j| j.spec())
            .or(self.card.as_ref().map(|c| c.spec()))
    }
}

/// Where what you hear goes when no device plays it.
#[derive(Debug, Clone, Default)]
pub enum HeardTo {
    /// Nowhere (a device plays it, or nothing does).
    #[default]
    Nowhere,
    /// A WAV file in the stream's format.
    File(PathBuf),
    /// Raw samples on stdout.
    Stdout(SampleFormat),
}

/// A jitter buffer's size as a player gives it: `auto`, a number of frames, or
/// milliseconds (`--buffer auto | N | Nms`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BufferSize {
    Auto,
    Frames(u32),
    Ms(f64),
}

impl std::str::FromStr for BufferSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(BufferSize::Auto);
        }
        let bad =
            || format!("--buffer {s:?}: use auto, a number of frames (e.g. 128) or milliseconds (e.g. 3ms)");
        if let Some(ms) = s.strip_suffix("ms") {
            let v: f64 = ms.trim().parse().map_err(|_| bad())?;
            if !(0.0..=200.0).contains(&v) {
                return Err(format!("--buffer {s}: use 0 to 200 ms"));
            }
            return Ok(BufferSize::Ms(v));
        }
        s.parse().map(BufferSize::Frames).map_err(|_| bad())
    }
}

impl BufferSize {
    pub fn mode(self, rate: u32) -> BufferMode {
        match self {
            BufferSize::Auto => BufferMode::default(),
            BufferSize::Frames(f) => BufferMode::Fixed {
                ns: frames_to_ns(f as u64, rate),
            },
            BufferSize::Ms(ms) => BufferMode::Fixed {
                ns: (ms * 1e6) as u64,
            },
        }
    }
}

/// What every player asks for besides where it plays: a two-player jam's and a room's.
#[derive(Debug)]
pub struct PlayerAsk {
    /// The audio half, built for the device's rate and channels.
    pub media: netjam_engine::player::MediaConfig,
    pub latency: netjam_engine::delay::LatencyPolicy,
    pub master_gain_db: f32,
    /// Hear yourself through netjam too.
    pub monitor: bool,
    /// Measure the mouth-to-ear round trip in band.
    pub measure_round_trip: bool,
    /// Where OSC control listens.
    pub osc: Option<SocketAddr>,
    /// Record a multitrack into this directory.
    pub record: Option<PathBuf>,
    /// The ensemble's click.
    pub click: crate::ensemble::click::ClickAsk,
    pub device: DeviceSettings,
    /// Where the final statistics and their series go.
    pub stats_json: Option<PathBuf>,
}

/// How the player's device runs, as the flags say.
#[derive(Debug, Clone, Default)]
pub struct DeviceSettings {
    /// Frames a packet (and a source's period).
    pub frames: u32,
    /// JACK's ports are left unconnected.
    pub no_connect: bool,
    /// The device channels sent (`--inputs`) and played (`--outputs`), when not all.
    pub inputs: Option<ChannelMap>,
    pub outputs: Option<ChannelMap>,
    pub heard_to: HeardTo,
    /// Stop after this long, in seconds of the device's clock.
    pub duration_s: Option<f64>,
    /// What the edge resamplers' delay is counted in, for the line that says it.
    pub edge_counted: String,
}

/// The ensemble's click in what you hear.
#[derive(Debug)]
pub struct Click<'a> {
    pub beat: Option<&'a mut JamBeat>,
    pub gain_db: f32,
    /// A delay line this long for `--delay-to-beat`.
    pub delay_max_ns: Option<u64>,
}

/// The process as the audio thread runs it: the player's, inside the device's edge
/// resamplers, inside the ensemble's click.
pub type DeviceProcess<R> = BeatClicks<EdgeProcess<PlayerProcess<R>>>;

/// A player whose audio thread runs.
#[derive(Debug)]
pub struct StartedPlayer<R: Copy + Send + 'static> {
    pub running: Running<DeviceProcess<R>>,
    pub monitors: DeviceMonitors,
    /// The resampler from the stream to the device on the way to your ears, ms (0 when
    /// the device runs at the stream's rate).
    pub hear_edge_ms: f64,
}

/// Bind the stream's socket, saying what to do if the address is taken.
pub fn bind(listen: SocketAddr) -> anyhow::Result<UdpTransport> {
    UdpTransport::bind(listen).with_context(|| {
        format!("cannot listen on {listen}: is another program using it? Pick another with --listen")
    })
}

/// What you hear: your own format, on as many channels as the device plays (an --outputs
/// map can name more or fewer than --inputs sends).
pub fn heard_format(format: AudioFormat, device_spec: Option<StreamSpec>) -> AudioFormat {
    match device_spec {
        Some(spec) => AudioFormat {
            channels: spec.output_channels,
            ..format
        },
        None => format,
    }
}

/// Run `process` on the player's device: wrapped in edge resamplers when the device's rate
/// is not the stream's `format` (Opus at 48 kHz on a device at another rate), with the
/// ensemble's click mixed in, beside the network threads `io`, until the device ends or
/// `stop` is set. `announce` is called with the socket's address once everything is open,
/// just before the audio starts: the line a caller waits for.
pub fn start_player<R>(
    process: PlayerProcess<R>,
    device: PlayerDevice,
    settings: &DeviceSettings,
    (io, format): (NetIo, AudioFormat),
    click: Click<'_>,
    stop: Arc<AtomicBool>,
    announce: impl FnOnce(SocketAddr),
) -> anyhow::Result<StartedPlayer<R>>
where
    R: Copy + Send + 'static,
    PlayerProcess<R>: crate::ensemble::beat_delay::Streams,
{
    let spec = device.spec();
    // The device's own rate: its frames, periods and the --duration limit count in it.
    let device_rate = spec.map_or(format.rate, |s| s.rate);
    let heard = heard_format(format, spec);
    let process = device_edges(process, spec, format.rate, &settings.edge_counted)?;
    let hear_edge_ms = process.delay_ns().1 as f64 / 1e6;
    let process = BeatClicks::new(
        process,
        click.beat,
        device_rate,
        heard.channels.into(),
        click.gain_db,
        click.delay_max_ns,
    );
    let sink = heard_sink(&settings.heard_to, heard)?;
    let limit = settings.duration_s.map(|d| (d * f64::from(device_rate)) as u64);
    let (endpoint, monitors) = open_endpoint(device, settings, format, sink, limit)?;
    announce(io.local);
    let running = Running::start("netjam-audio", io, endpoint, process, stop)?;
    Ok(StartedPlayer {
        running,
        monitors: DeviceMonitors {
            rate: device_rate,
            ..monitors
        },
        hear_edge_ms,
    })
}

/// The process as the device runs it: wrapped in edge resamplers when the device's rate is
/// not the stream's, saying on stderr what they add, `counted` telling where that delay is
/// counted; passed straight through otherwise.
fn device_edges<P>(
    process: P,
    device_spec: Option<StreamSpec>,
    stream_rate: u32,
    counted: &str,
) -> anyhow::Result<EdgeProcess<P>> {
    let Some(spec) = device_spec.filter(|s| s.rate != stream_rate) else {
        return Ok(EdgeProcess::passthrough(process));
    };
    let p = EdgeProcess::new(
        process,
        spec.rate,
        spec.period as usize,
        spec.input_channels.into(),
        spec.output_channels.into(),
    )?;
    let (capture, play) = p.delay_ns();
    eprintln!(
        "netjam: resampling the device's {} Hz to and from Opus's {stream_rate} Hz adds {:.2} ms sending and {:.2} ms hearing {counted}",
        spec.rate,
        capture as f64 / 1e6,
        play as f64 / 1e6
    );
    Ok(p)
}

/// Where what you hear goes when no device plays it: a file or stdout.
fn heard_sink(to: &HeardTo, format: AudioFormat) -> anyhow::Result<Option<Box<dyn FrameSink>>> {
    Ok(match to {
        HeardTo::File(path) => Some(Box::new(WavSink::create(
            path,
            format.rate,
            format.channels,
            format.codec,
        )?)),
        HeardTo::Stdout(f) => Some(Box::new(RawSink::new(std::io::stdout(), *f))),
        HeardTo::Nowhere => None,
    })
}

/// The endpoint that runs the stream, and the monitors of its device; says which device.
fn open_endpoint(
    device: PlayerDevice,
    s: &DeviceSettings,
    format: AudioFormat,
    sink: Option<Box<dyn FrameSink>>,
    limit: Option<u64>,
) -> anyhow::Result<(Box<dyn Endpoint>, DeviceMonitors)> {
    let mut monitors = DeviceMonitors::default();
    let endpoint: Box<dyn Endpoint> = match device {
        PlayerDevice {
            jack: None,
            card: Some(c),
            ..
        } => {
            eprintln!("netjam: sound card {}", c.describe());
            monitors.card = Some(c.monitor());
            c.into_endpoint(limit)
        }
        PlayerDevice { jack: Some(j), .. } => {
            let name = j.client_name().to_string();
            let spec = j.spec();
            let on = |map: &Option<ChannelMap>, n: u16| match map {
                _ if s.no_connect => " (not connected: --no-connect)".to_string(),
                Some(m) => format!(" (connected to physical ports {m})"),
                None => format!(" (connected to physical ports 1-{n})"),
            };
            eprintln!(
                "netjam: JACK client {name}: {} Hz, {}-frame periods; {name}:send_1..{} are sent{}, {name}:receive_1..{} play what you hear{}",
                format.rate,
                spec.period,
                spec.input_channels,
                on(&s.inputs, spec.input_channels),
                spec.output_channels,
                on(&s.outputs, spec.output_channels),
            );
            monitors.jack = Some((name, j.monitor(), spec));
            Box::new(j.with_limit(limit))
        }
        PlayerDevice {
            source: Some(source), ..
        } => Box::new(
            PacedEndpoint::new(format.rate, s.frames, Some(source), format.channels, sink).with_limit(limit),
        ),
        _ => bail!("no audio source"),
    };
    monitors.frames = s.frames;
    Ok((endpoint, monitors))
}

/// What the player watches of its device while it runs: JACK's or the sound card's
/// monitor.
#[derive(Debug, Default)]
pub struct DeviceMonitors {
    jack: Option<(String, JackMonitor, StreamSpec)>,
    card: Option<card::Monitor>,
    /// Whether the line on realtime scheduling was said.
    realtime_told: bool,
    /// The device's rate and the stream's frames a packet.
    rate: u32,
    frames: u32,
}

impl DeviceMonitors {
    /// Once a snapshot: append the device's xruns (and time JACK lost) to the status
    /// `line`, say once whether the device runs realtime, and tell the ensemble's click
    /// (`beat`) the device's latencies. The click sounds on the beat: it is rendered
    /// earlier by what JACK says its ports' playback latency is, or the sound card's host
    /// (files and stdout play at once); what is sent is placed in ensemble time by JACK's
    /// capture latency.
    pub fn on_snapshot(&mut self, line: &mut String, status: &mut StatusLine, beat: Option<&JamBeat>) {
        if let Some((_, monitor, spec)) = &self.jack {
            if !self.realtime_told && monitor.realtime() != Realtime::Unknown {
                status.finish();
                eprintln!("netjam: JACK callback: {}", monitor.realtime());
                self.realtime_told = true;
            }
            line.push_str(&format!("  xruns {}", monitor.xruns()));
            let (slipped, _) = monitor.slipped();
            if slipped > 0 {
                line.push_str(&format!(
                    "  lost time {:.0} ms",
                    slipped as f64 * 1e3 / f64::from(spec.rate.max(1))
                ));
            }
            if let Some(b) = beat {
                let s = &b.shared;
                s.output_latency_frames
                    .store(monitor.output_latency_frames(), Ordering::Relaxed);
                s.input_latency_frames
                    .store(monitor.input_latency_frames(), Ordering::Relaxed);
            }
        }
        if let Some(monitor) = &self.card {
            if !self.realtime_told {
                if let Some(told) = monitor.realtime_line() {
                    status.finish();
                    eprintln!("netjam: {told}");
                    self.realtime_told = true;
                }
            }
            line.push_str(&format!("  xruns {}", monitor.xruns()));
            if let Some(b) = beat {
                b.shared
                    .output_latency_frames
                    .store(monitor.output_latency_frames(self.rate), Ordering::Relaxed);
            }
        }
    }

    /// The device's rate, Hz.
    pub fn rate(&self) -> u32 {
        self.rate
    }

    /// The device's own buffering each way where netjam knows it: a period each way for
    /// JACK, ms; `None` for a sound card or a source.
    pub fn jack_period_ms(&self) -> Option<f64> {
        self.jack
            .as_ref()
            .map(|(_, _, spec)| f64::from(spec.period) * 1e3 / f64::from(self.rate.max(1)))
    }

    /// How the device ran, said once at the end.
    pub fn report(self, periods: &PeriodStats) -> DeviceReport {
        let jack = self
            .jack
            .map(|(client, monitor, spec)| jack_report(client, &monitor, spec, periods));
        let device = self.card.map(|m| m.report(self.rate, self.frames, periods));
        DeviceReport { jack, device }
    }
}

/// How the device ran.
#[derive(Debug, serde::Serialize)]
pub struct DeviceReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jack: Option<JackReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<card::Report>,
}

impl DeviceReport {
    /// The device's own buffering where netjam knows it (a period each way for JACK; the
    /// callbacks each way plus the capture-to-playback cushion for a sound card), in
    /// frames.
    pub fn device_frames(&self) -> Option<f64> {
        match (&self.jack, &self.device) {
            (Some(j), _) => Some(2.0 * f64::from(j.period)),
            (None, Some(d)) => Some(d.device_frames() as f64),
            (None, None) => None,
        }
    }
}

/// How the JACK side ran.
#[derive(Debug, serde::Serialize)]
pub struct JackReport {
    pub client: String,
    pub rate: u32,
    pub period: u32,
    pub realtime: bool,
    pub realtime_priority: Option<i32>,
    pub xruns: u64,
    /// Frames of the server's time that passed without cycles it counted: the stream's
    /// timeline skipped them (see `netjam_engine::slip`).
    pub slipped_frames: u64,
    /// In how many slips.
    pub slips: u64,
    /// Frames JACK's frame clock jumped by while its cycles ran on time: not skipped, the
    /// audio ran on (see `netjam_engine::slip::SlipGuard::confirm_skipped`).
    pub clock_jump_frames: u64,
    /// In how many jumps.
    pub clock_jumps: u64,
}

/// JACK's report, said on stderr.
fn jack_report(client: String, monitor: &JackMonitor, spec: StreamSpec, periods: &PeriodStats) -> JackReport {
    let realtime = monitor.realtime();
    eprintln!(
        "netjam: JACK: {} periods, {} missed deadlines ({} xruns), callback {:.1} µs mean, {:.1} µs worst; {realtime}",
        periods.periods,
        periods.missed_deadlines,
        monitor.xruns(),
        periods.callback_mean_us,
        periods.callback_max_us
    );
    let (slipped, slips) = monitor.slipped();
    if slipped > 0 {
        eprintln!(
            "netjam: JACK's clock lost {:.1} ms against the system clock in {slips} slips without counting it (a server that missed cycles); the stream skipped as much, so the far side heard gaps, not a clock falling behind",
            slipped as f64 * 1e3 / f64::from(spec.rate.max(1))
        );
    }
    let (jumped, jumps) = monitor.unconfirmed();
    if jumped > 0 {
        eprintln!(
            "netjam: JACK's clock jumped {:.1} ms in {jumps} jumps while its cycles ran on time (after xruns); the stream did not skip them: no audio was lost there",
            jumped as f64 * 1e3 / f64::from(spec.rate.max(1))
        );
    }
    JackReport {
        client,
        rate: spec.rate,
        period: spec.period,
        realtime: matches!(realtime, Realtime::Yes { .. }),
        realtime_priority: match realtime {
            Realtime::Yes { priority } => Some(priority),
            _ => None,
        },
        xruns: monitor.xruns(),
        slipped_frames: slipped,
        slips,
        clock_jump_frames: jumped,
        clock_jumps: jumps,
    }
}

/// Start recording into `dir` (when given: `--record`) on the player's audio half: its tap
/// goes to `process`, the writer that files what it queues comes back. `names` names a
/// member's file when its track starts; `tracks` says in the start-up line which files
/// there are beside the mix and you. Both a jam and a room start their recording here.
pub fn start_recording<R>(
    dir: Option<&std::path::Path>,
    process: &mut PlayerProcess<R>,
    (rate, mix_channels, you_channels): (u32, u16, u16),
    names: Box<dyn Fn(netjam_engine::members::MemberId) -> Option<String> + Send>,
    tracks: &str,
) -> anyhow::Result<Option<RecordWriter>> {
    let Some(dir) = dir else { return Ok(None) };
    let (tap, writer) = crate::record::start(crate::record::RecordConfig {
        dir: dir.to_path_buf(),
        rate,
        mix_channels,
        you_channels,
        names,
    })?;
    process.set_recorder(tap);
    eprintln!(
        "netjam: recording into {}: mix.wav, you.wav and {tracks} (32-bit float, sample-aligned)",
        dir.display()
    );
    Ok(Some(writer))
}

/// The status line's word on a recording under way.
pub fn recording_status(w: &RecordWriter, rate: u32) -> String {
    let mut text = format!("  rec {:.0}s", w.written_frames() as f64 / f64::from(rate.max(1)));
    if w.dropped_blocks() > 0 {
        text.push_str(&format!(" ({} periods dropped)", w.dropped_blocks()));
    }
    text
}

/// Stop the player's audio thread (its last packets and a BYE sent), then the ensemble's
/// beat, and say if the resampler to the device ran short. The player's audio half comes
/// back, with the device periods' figures.
pub fn stop_player<R>(
    running: Running<DeviceProcess<R>>,
    beat: Option<&mut JamBeat>,
) -> anyhow::Result<(PlayerProcess<R>, PeriodStats)>
where
    R: Copy + Send + 'static,
    PlayerProcess<R>: crate::ensemble::beat_delay::Streams,
{
    let stopped = running.stop_with_bye(|p, now| p.inner_mut().finish(now))?;
    if let Some(b) = beat {
        b.stop();
    }
    let edge_underruns = stopped.process.underruns();
    if edge_underruns > 0 {
        eprintln!(
            "netjam: the resampler to the device ran short in {edge_underruns} periods (silence filled them)"
        );
    }
    Ok((stopped.process.into_process().into_inner(), stopped.periods))
}

/// Once the audio thread has stopped and its tap is dropped: write what is queued, close
/// the files and say what was recorded.
pub fn finish_recording(writer: Option<RecordWriter>) -> anyhow::Result<Option<RecordSummary>> {
    let Some(w) = writer else { return Ok(None) };
    let r = w.finish()?;
    eprintln!(
        "netjam: recorded {:.2} s ({} frames) into {}: {}",
        r.seconds(),
        r.frames,
        r.dir.display(),
        r.files
            .iter()
            .map(|f| f
                .path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if r.dropped_blocks > 0 {
        eprintln!(
            "netjam: the recording fell behind: {} periods ({} frames) dropped, silence in their place in every file",
            r.dropped_blocks, r.dropped_frames
        );
    }
    if let Some(e) = &r.error {
        eprintln!("netjam: the recording stopped early: {e}");
    }
    Ok(Some(r))
}

/// Write `value` as pretty JSON to `path`.
pub fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
