//! `netjam jam`: full duplex with one other player on one UDP socket.
//!
//! Send what you play, hear what they play. Against `netjam reflect` on the far side it is
//! a self-test: you hear your own round trip, and RTCP measures it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU32;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use netjam_engine::receiver::{Receiver, ReceiverConfig};

use super::common::{cname, fresh_seed, resolve, BufferArg};
use super::stream::{write_json, SourceArgs, WireArgs};
use crate::clock;
use crate::endpoint::paced::PacedEndpoint;
use crate::endpoint::raw::RawSink;
use crate::endpoint::wav::WavSink;
use crate::endpoint::{FrameSink, PeriodStats, SampleFormat};
use crate::session::{interrupt_flag, spawn_audio, JamProcess, JamStats, NetIo, Peer, Snapshot};
use crate::status::{meter, StatusLine};
use crate::transport::UdpTransport;

#[derive(Debug, Args)]
pub struct JamArgs {
    /// The other player (or a `netjam reflect`): HOST:PORT.
    #[arg(long)]
    pub peer: String,
    /// Local address to send from and listen on; the other player sends here.
    #[arg(long, default_value = "0.0.0.0:4464")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub wire: WireArgs,
    /// Write what you hear to a WAV file.
    #[arg(long, value_name = "FILE.wav")]
    pub output: Option<PathBuf>,
    /// Write what you hear to stdout as raw PCM (layout from --out-format).
    #[arg(long, conflicts_with = "output")]
    pub stdout: bool,
    #[arg(long, value_enum, default_value = "s16le")]
    pub out_format: SampleFormat,
    /// Jitter buffer: auto, a number of frames, or milliseconds (e.g. 3ms).
    #[arg(long, default_value = "auto")]
    pub buffer: BufferArg,
    /// Gain on what you hear, in dB.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub gain: f32,
    /// Start with the other player muted.
    #[arg(long)]
    pub mute: bool,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Write the final statistics and their time series as JSON.
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
}

#[derive(Debug, serde::Serialize)]
struct JamReport {
    stats: JamStats,
    periods: PeriodStats,
    series: Vec<Snapshot<JamStats>>,
}

fn jam_line(s: &Snapshot<JamStats>) -> String {
    let (t, r) = (&s.stats.sent, &s.stats.heard);
    let jb = &r.jitter_buffer;
    format!(
        "{:>7.1}s  sent {:>7}  heard {:>7}  lost {:>4}  rtt {}  buffer {:>5.2}/{:>5.2} ms  conceal {:>4}  {}",
        s.t_s,
        t.packets,
        r.received,
        r.lost,
        t.rtt_ms.map_or("  -  ".into(), |x| format!("{x:5.1} ms")),
        jb.depth_ms,
        jb.target_ms,
        jb.concealment_events,
        meter(s.peak_dbfs)
    )
}

pub fn run_jam(a: JamArgs) -> anyhow::Result<()> {
    let peer = resolve(&a.peer)?;
    let (source, default_codec) = a.source.open()?;
    let sender = a.wire.sender(source.as_ref(), default_codec)?;
    let format = sender.format();
    let mut receiver = Receiver::new(ReceiverConfig {
        buffer: a.buffer.mode(format.rate),
        fixed_format: None,
        max_channels: 64,
        max_redundancy_wait: 8,
        seed: fresh_seed(),
        cname: cname(),
        name: a.wire.name.clone(),
    });
    // What you hear plays in your own format (a sound card's, later).
    receiver.set_output_format(format);
    let socket = UdpTransport::bind(a.listen).with_context(|| {
        format!(
            "cannot listen on {}: is another program using it? Pick another with --listen",
            a.listen
        )
    })?;
    let (io, link) = NetIo::start(socket, Peer::Fixed(peer))?;
    let gain = if a.mute { 0.0 } else { 10f32.powf(a.gain / 20.0) };
    let gain = Arc::new(AtomicU32::new(gain.to_bits()));
    let (process, mut snaps) = JamProcess::new(sender, receiver, link, gain);
    let sink: Option<Box<dyn FrameSink>> = match (&a.output, a.stdout) {
        (Some(path), _) => Some(Box::new(WavSink::create(
            path,
            format.rate,
            format.channels,
            format.codec,
        )?)),
        (None, true) => Some(Box::new(RawSink::new(std::io::stdout(), a.out_format))),
        (None, false) => None,
    };
    let limit = a.duration.map(|d| (d * format.rate as f64) as u64);
    let endpoint = Box::new(
        PacedEndpoint::new(format.rate, a.wire.frames, Some(source), format.channels, sink).with_limit(limit),
    );
    eprintln!(
        "netjam: jamming with {peer} from {} ({format}, {} frames per packet)",
        io.local, a.wire.frames
    );
    let stop = interrupt_flag();
    let audio = spawn_audio("netjam-audio", endpoint, process, stop)?;
    let mut status = StatusLine::new();
    let mut series = Vec::new();
    while !audio.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        while let Ok(s) = snaps.pop() {
            status.show(&jam_line(&s));
            series.push(s);
        }
    }
    status.finish();
    let (mut process, _, periods) = audio
        .join()
        .map_err(|_| anyhow::anyhow!("the audio thread panicked"))??;
    process.finish(clock::now_ns());
    std::thread::sleep(Duration::from_millis(20));
    io.shutdown();
    let stats = JamStats {
        sent: process.sender.stats(),
        heard: process.receiver.stats(),
    };
    let jb = &stats.heard.jitter_buffer;
    eprintln!(
        "netjam: sent {} packets, heard {} (lost {}, concealed {} frames); rtt {}; buffer target {:.2} ms, added latency {:.2} ms",
        stats.sent.packets,
        stats.heard.received,
        stats.heard.lost,
        jb.concealed_frames,
        stats.sent.rtt_ms.map_or("not measured".into(), |r| format!("{r:.2} ms")),
        jb.target_ms,
        jb.added_latency_ms
    );
    if let Some(path) = &a.stats_json {
        write_json(
            path,
            &JamReport {
                stats,
                periods,
                series,
            },
        )?;
    }
    Ok(())
}
