//! A sender and a receiver in one process over loopback UDP, optionally through a
//! [`LinkEmulator`]: the demo and the latency benchmarks run exactly this.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use netjam_engine::delay::BufferMode;
use netjam_engine::link::LinkConfig;
use netjam_engine::receiver::{Receiver, ReceiverConfig, ReceiverStats};
use netjam_engine::sender::{Sender, SenderConfig, SenderStats};
use netjam_engine::synth::SynthKind;
use netjam_engine::wire::AudioFormat;

use crate::endpoint::paced::PacedEndpoint;
use crate::endpoint::synth::SynthSource;
use crate::endpoint::wav::WavSink;
use crate::endpoint::{FrameSink, PeriodStats};
use crate::link_emulator::{EmulatorEvents, EmulatorStats, LinkEmulator};
use crate::series::BoundedSeries;
use crate::session::{interrupt_flag, spawn_audio, NetIo, Peer, RecvProcess, SendProcess, Snapshot};
use crate::transport::UdpTransport;

/// What to run.
#[derive(Debug, Clone)]
pub struct LoopbackOptions {
    pub format: AudioFormat,
    pub frames_per_packet: u32,
    pub redundancy: usize,
    pub buffer: BufferMode,
    /// Frames per playout period.
    pub period: u32,
    /// The emulated link, or `None` for plain loopback.
    pub link: Option<LinkConfig>,
    /// Scripted events on the emulated link (from the sender's first packet).
    pub events: EmulatorEvents,
    pub seed: u64,
    pub duration_s: f64,
    pub source: SynthKind,
    /// Write what was played here.
    pub output: Option<PathBuf>,
    pub sender_name: String,
    pub receiver_name: String,
    /// Follow the sender's clock by resampling.
    pub drift_correction: bool,
}

/// What happened.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoopbackReport {
    pub receiver: ReceiverStats,
    pub sender: SenderStats,
    pub link: Option<EmulatorStats>,
    pub playout: PeriodStats,
    pub series: BoundedSeries<Snapshot<ReceiverStats>>,
}

/// Run the session; `on_snapshot` sees the receiver's snapshots about ten times a second.
pub fn run_loopback(
    o: &LoopbackOptions,
    mut on_snapshot: impl FnMut(&Snapshot<ReceiverStats>),
) -> anyhow::Result<LoopbackReport> {
    let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();
    let format = o.format;
    let recv_socket = UdpTransport::bind(loopback)?;
    let recv_addr = recv_socket.local_addr()?;
    let emulator = match &o.link {
        Some(link) => Some(LinkEmulator::start(
            loopback,
            recv_addr,
            link.clone(),
            link.clone(),
            o.events.clone(),
            o.seed,
        )?),
        None => None,
    };
    let send_to = emulator.as_ref().map_or(recv_addr, |r| r.local_addr());
    let (recv_io, recv_link) = NetIo::start(recv_socket, Peer::Learned)?;
    let (send_io, send_link) = NetIo::start(UdpTransport::bind(loopback)?, Peer::Fixed(send_to))?;

    let mut receiver = Receiver::new(ReceiverConfig {
        buffer: o.buffer,
        fixed_format: None,
        max_channels: format.channels as usize,
        max_redundancy_wait: 8,
        seed: o.seed ^ 0x5eed,
        cname: format!("{}@loopback", o.receiver_name.to_lowercase()),
        name: Some(o.receiver_name.clone()),
        decoders: None,
    });
    receiver.set_output_format(format);
    receiver.set_drift_correction(o.drift_correction);
    let sender = Sender::new(SenderConfig {
        format,
        frames_per_packet: o.frames_per_packet,
        redundancy: o.redundancy,
        seed: o.seed,
        cname: format!("{}@loopback", o.sender_name.to_lowercase()),
        name: Some(o.sender_name.clone()),
        wall_offset_ns: crate::lifecycle::wall_offset_ns(),
    })?;

    let stop = interrupt_flag();
    let frames_total = (o.duration_s * format.rate as f64) as u64;
    let (recv_proc, mut snaps) = RecvProcess::new(receiver, recv_link, format.rate);
    let sink: Option<Box<dyn FrameSink>> = match &o.output {
        Some(path) => Some(Box::new(WavSink::create(
            path,
            format.rate,
            format.channels,
            format.codec,
        )?)),
        None => None,
    };
    let recv_ep = Box::new(
        PacedEndpoint::new(format.rate, o.period, None, format.channels, sink).with_limit(Some(frames_total)),
    );
    let recv_audio = spawn_audio("netjam-rx-audio", recv_ep, recv_proc, stop.clone())?;

    let (send_proc, _send_snaps) = SendProcess::new(sender, send_link, format.rate);
    let source = Box::new(SynthSource::new(o.source, format.rate, format.channels, o.seed));
    // The sender runs a little longer so the last played periods are real audio.
    let limit = frames_total + format.rate as u64 / 5;
    let send_ep = Box::new(
        PacedEndpoint::new(format.rate, o.frames_per_packet, Some(source), 0, None).with_limit(Some(limit)),
    );
    let send_audio = spawn_audio("netjam-tx-audio", send_ep, send_proc, stop.clone())?;

    let mut series = BoundedSeries::default();
    while !recv_audio.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        while let Ok(s) = snaps.pop() {
            on_snapshot(&s);
            series.push(s);
        }
    }
    let (recv_proc, _, playout) = recv_audio
        .join()
        .map_err(|_| anyhow::anyhow!("the receiving audio thread panicked"))??;
    let interrupted = stop.swap(true, Ordering::Relaxed);
    let (send_proc, _, _) = send_audio
        .join()
        .map_err(|_| anyhow::anyhow!("the sending audio thread panicked"))??;
    stop.store(interrupted, Ordering::Relaxed);
    recv_io.shutdown();
    send_io.shutdown();
    Ok(LoopbackReport {
        receiver: recv_proc.receiver.stats(),
        sender: send_proc.sender.stats(),
        link: emulator.map(|r| r.stop()),
        playout,
        series,
    })
}
