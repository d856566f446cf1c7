//! One-way streams: `netjam send` plays a source in real time to a receiver, `netjam recv`
//! plays what arrives into a file or stdout, each on its own clock. This module runs them
//! in the shell ([`crate::lifecycle::Running`]) and says what happens: the status line,
//! the closing figures and the JSON report. What to do comes in a [`SendPlay`] or a
//! [`RecvPlay`], parsed by the commands.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use netjam_engine::delay::LatencyPolicy;
use netjam_engine::discontinuity::Discontinuity;
use netjam_engine::receiver::{Receiver, ReceiverStats};
use netjam_engine::sender::Sender;
use netjam_engine::wire::AudioFormat;

use crate::endpoint::paced::PacedEndpoint;
use crate::endpoint::{FrameSink, FrameSource, PeriodStats};
use crate::lifecycle::{any_for, await_format, Running};
use crate::series::BoundedSeries;
use crate::session::{interrupt_flag, NetIo, Peer, RecvProcess, SendProcess, Snapshot};
use crate::shell::{write_json, BufferSize};
use crate::status::{recv_line, send_line, StatusLine};
use crate::transport::UdpTransport;

/// What `netjam send` asked for: a source opened and the sender built for it.
#[allow(missing_debug_implementations)] // the source and the sink are trait objects
pub struct SendPlay {
    pub to: SocketAddr,
    /// The address to send from (any, of `to`'s family, unless given).
    pub bind: Option<SocketAddr>,
    pub source: Box<dyn FrameSource>,
    pub sender: Sender,
    /// Frames a packet, and the source's period.
    pub frames: u32,
    /// Stop after this many seconds.
    pub duration_s: Option<f64>,
    pub stats_json: Option<PathBuf>,
}

/// What `netjam send --stats-json` writes.
#[derive(Debug, serde::Serialize)]
struct SendReport {
    format: AudioFormat,
    frames_per_packet: u32,
    stats: netjam_engine::sender::SenderStats,
    periods: PeriodStats,
    threads: Vec<crate::rt::ThreadRt>,
}

/// Sends until the source ends, the duration is up, or Ctrl-C; then says BYE, what was
/// sent, and writes the report.
pub fn send(a: SendPlay) -> anyhow::Result<()> {
    let SendPlay {
        to, source, sender, ..
    } = a;
    let format = sender.format();
    let socket = UdpTransport::bind(a.bind.unwrap_or_else(|| any_for(to)))
        .context("opening a UDP socket to send from")?;
    crate::rt::set_period_ns(netjam_engine::time::frames_to_ns(a.frames.into(), format.rate));
    let (io, link) = NetIo::start(socket, Peer::Fixed(to))?;
    let (process, mut snaps) = SendProcess::new(sender, link, format.rate);
    let limit = a.duration_s.map(|d| (d * format.rate as f64) as u64);
    let endpoint =
        Box::new(PacedEndpoint::new(format.rate, a.frames, Some(source), 0, None).with_limit(limit));
    let stop = interrupt_flag();
    eprintln!(
        "netjam: sending {format} in {} to {to}",
        crate::status::packets_text(&process.sender)
    );
    let running = Running::start("netjam-audio", io, endpoint, process, stop)?;
    let mut status = StatusLine::new();
    running.watch(&mut snaps, |s| status.show(&send_line(&s)));
    status.finish();
    let stopped = running.stop_with_bye(|p, now| p.finish(now))?;
    let (process, periods) = (stopped.process, stopped.periods);
    let s = process.sender.stats();
    eprintln!(
        "netjam: sent {} packets ({} frames){}",
        s.packets,
        s.frames,
        s.rtt_ms
            .map_or(String::new(), |r| format!(", last rtt {r:.1} ms"))
    );
    if periods.missed_deadlines > 0 {
        eprintln!(
            "netjam: the sending thread started {} of {} periods late (worst {:.1} ms): those packets left late",
            periods.missed_deadlines,
            periods.periods,
            periods.wake_late_max_us / 1e3
        );
    }
    if let Some(line) = crate::rt::report_line() {
        eprintln!("netjam: {line}");
    }
    if let Some(path) = &a.stats_json {
        let report = SendReport {
            format,
            frames_per_packet: a.frames,
            stats: s,
            periods,
            threads: crate::rt::threads(),
        };
        write_json(path, &report)?;
    }
    Ok(())
}

/// What `netjam recv` asked for: the receiver built, and where what it plays goes.
#[allow(missing_debug_implementations)] // the source and the sink are trait objects
pub struct RecvPlay {
    pub listen: SocketAddr,
    pub receiver: Receiver,
    /// The jitter buffer's mode for the stream's rate, once it is known.
    pub buffer: BufferSize,
    pub latency: LatencyPolicy,
    pub drift_correction: bool,
    /// Opens the sink for the stream's format once it is known.
    pub sink: Box<dyn FnOnce(AudioFormat) -> anyhow::Result<Box<dyn FrameSink>>>,
    /// Frames a playout period.
    pub period: u32,
    /// Stop after this many seconds of playout.
    pub duration_s: Option<f64>,
    pub stats_json: Option<PathBuf>,
}

/// The statistics file of `netjam recv`.
#[derive(Debug, serde::Serialize)]
pub struct RecvReport {
    pub format: Option<AudioFormat>,
    pub stats: ReceiverStats,
    pub periods: PeriodStats,
    pub dropped_by_full_ring: u64,
    /// The most recent concealed, inserted and skipped stretches, located in the output.
    pub discontinuities: Vec<Discontinuity>,
    pub series: BoundedSeries<Snapshot<ReceiverStats>>,
    /// What scheduling each of netjam's own threads got.
    pub threads: Vec<crate::rt::ThreadRt>,
}

/// Receives until the duration of playout is up or Ctrl-C (before any stream comes,
/// Ctrl-C ends it quietly); then says what was heard and writes the report.
pub fn recv(a: RecvPlay) -> anyhow::Result<()> {
    let RecvPlay {
        mut receiver, sink, ..
    } = a;
    receiver.set_latency_policy(a.latency);
    let socket = UdpTransport::bind(a.listen)
        .with_context(|| format!("cannot listen on {}: is another program using it?", a.listen))?;
    let (io, mut link) = NetIo::start(socket, Peer::Learned)?;
    let stop = interrupt_flag();
    eprintln!("netjam: listening on {}", io.local);
    // Until the first stream shows its format (or it was given), feed packets from here.
    let Some((format, first_at)) = await_format(&mut receiver, &mut link, &stop, || {
        eprintln!("netjam: RTP is arriving without netjam's format: give --codec, --rate and --channels, or --sdp FILE");
    }) else {
        io.shutdown();
        return Ok(());
    };
    let (mut process, mut snaps) = RecvProcess::new(receiver, link, format.rate);
    process.receiver.set_buffer_mode(a.buffer.mode(format.rate));
    process.receiver.set_drift_correction(a.drift_correction);
    eprintln!("netjam: receiving {format}");
    let sink = sink(format)?;
    let limit = a.duration_s.map(|d| (d * format.rate as f64) as u64);
    crate::rt::set_period_ns(netjam_engine::time::frames_to_ns(a.period.into(), format.rate));
    let endpoint = Box::new(
        PacedEndpoint::new(format.rate, a.period, None, format.channels, Some(sink))
            .with_limit(limit)
            .with_origin(first_at),
    );
    let running = Running::start("netjam-audio", io, endpoint, process, stop)?;
    let mut status = StatusLine::new();
    let mut series = BoundedSeries::default();
    let mut last_starts = 1;
    running.watch(&mut snaps, |s| {
        if s.stats.stream_starts > last_starts {
            status.finish();
            eprintln!("netjam: the sender restarted; following the new stream");
            last_starts = s.stats.stream_starts;
        }
        status.show(&recv_line(&s));
        series.push(s);
    });
    status.finish();
    let stopped = running.stop()?;
    let (process, periods, dropped) = (stopped.process, stopped.periods, stopped.rx_overflow);
    let stats = process.receiver.stats();
    print_recv_summary(&stats);
    if let Some(line) = crate::rt::report_line() {
        eprintln!("netjam: {line}");
    }
    if let Some(path) = &a.stats_json {
        let report = RecvReport {
            format: Some(format),
            stats,
            periods,
            dropped_by_full_ring: dropped,
            discontinuities: process.receiver.recent_discontinuities().copied().collect(),
            series,
            threads: crate::rt::threads(),
        };
        write_json(path, &report)?;
    }
    Ok(())
}

fn print_recv_summary(s: &ReceiverStats) {
    let jb = &s.jitter_buffer;
    eprintln!(
        "netjam: received {} packets, lost {}, late {}, duplicate {}, reordered {}, malformed {}; {}; recovered {} frames from redundancy; buffer target {:.2} ms, added latency {:.2} ms (max {:.2})",
        s.received, s.lost, jb.late_packets, jb.duplicate_packets, s.reordered, s.malformed,
        crate::status::discontinuity_text(jb), jb.recovered_frames, jb.target_ms, jb.added_latency_ms, jb.added_latency_max_ms
    );
}
