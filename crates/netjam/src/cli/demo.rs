//! `netjam demo`: a Seattle–Vermont jam in one process, no sound card needed.
//!
//! Synthetic music → sender → loopback UDP → a [`LinkRelay`] with the Seattle–Vermont
//! link profile → receiver → WAV file. It ends with the latency budget, measured stage by
//! stage, and the quality figures.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use netjam_engine::link::LinkConfig;
use netjam_engine::receiver::{Receiver, ReceiverConfig, ReceiverStats};
use netjam_engine::sender::{Sender, SenderConfig, SenderStats};
use netjam_engine::synth::SynthKind;
use netjam_engine::wire::{AudioFormat, Codec};

use super::common::{cname, wall_offset_ns, BufferArg};
use super::stream::write_json;
use crate::endpoint::paced::PacedEndpoint;
use crate::endpoint::synth::SynthSource;
use crate::endpoint::wav::WavSink;
use crate::endpoint::PeriodStats;
use crate::relay::{LinkRelay, RelayStats};
use crate::session::{interrupt_flag, spawn_audio, NetIo, Peer, RecvProcess, SendProcess, Snapshot};
use crate::status::{recv_line, StatusLine};
use crate::transport::UdpTransport;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Seconds of music to play.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Where to write what the far end heard.
    #[arg(long, default_value = "netjam-demo.wav", value_name = "FILE.wav")]
    pub output: PathBuf,
    /// Write the budget, the statistics and their time series as JSON.
    #[arg(long, value_name = "FILE")]
    pub stats_json: Option<PathBuf>,
    /// Frames per packet.
    #[arg(long, default_value_t = 64)]
    pub frames: u32,
    /// Previous packets carried again in each packet (RFC 2198).
    #[arg(long, default_value_t = 1)]
    pub redundancy: usize,
    /// Jitter buffer: auto, frames, or milliseconds.
    #[arg(long, default_value = "auto")]
    pub buffer: BufferArg,
    /// Seed of the link emulator (same seed, same impairments).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// Mouth-to-ear latency, one way, by stage (ms).
#[derive(Debug, serde::Serialize)]
pub struct Budget {
    pub packetization_ms: f64,
    pub network_ms: f64,
    pub jitter_buffer_ms: f64,
    pub concealment_ms: f64,
    pub total_ms: f64,
    pub light_in_vacuum_ms: f64,
    pub light_in_fibre_ms: f64,
}

#[derive(Debug, serde::Serialize)]
struct DemoReport {
    format: AudioFormat,
    frames_per_packet: u32,
    redundancy: usize,
    link: LinkConfig,
    budget: Budget,
    receiver: ReceiverStats,
    sender: SenderStats,
    relay: RelayStats,
    playout_periods: PeriodStats,
    series: Vec<Snapshot<ReceiverStats>>,
}

pub fn run_demo(a: DemoArgs) -> anyhow::Result<()> {
    let format = AudioFormat::new(Codec::L16, 48_000, 2)?;
    let link = LinkConfig::seattle_vermont();
    let loopback: SocketAddr = ([127, 0, 0, 1], 0).into();

    let recv_socket = UdpTransport::bind(loopback)?;
    let recv_addr = recv_socket.local_addr()?;
    let relay = LinkRelay::start(loopback, recv_addr, link.clone(), link.clone(), a.seed)?;
    let (recv_io, recv_link) = NetIo::start(recv_socket, Peer::Learned)?;
    let (send_io, send_link) = NetIo::start(UdpTransport::bind(loopback)?, Peer::Fixed(relay.local_addr()))?;

    let mut receiver = Receiver::new(ReceiverConfig {
        buffer: a.buffer.mode(format.rate),
        fixed_format: None,
        max_channels: 2,
        max_redundancy_wait: 8,
        seed: a.seed ^ 0x5eed,
        cname: "vermont@netjam-demo".into(),
        name: Some("Vermont".into()),
    });
    receiver.set_output_format(format);
    let sender = Sender::new(SenderConfig {
        format,
        frames_per_packet: a.frames,
        redundancy: a.redundancy,
        seed: a.seed,
        cname: cname(),
        name: Some("Seattle".into()),
        wall_offset_ns: wall_offset_ns(),
    })?;

    println!(
        "netjam demo: {format}, {} frames per packet ({:.2} ms), redundancy {}",
        a.frames,
        a.frames as f64 * 1000.0 / 48_000.0,
        a.redundancy
    );
    println!(
        "link: Seattle → Vermont, {:.1} ms one way, {:.1} ms jitter, {:.1} % loss in bursts — emulated on loopback",
        link.delay_ns as f64 / 1e6,
        link.jitter_ns as f64 / 1e6,
        link.loss.mean_rate() * 100.0
    );
    let stop = interrupt_flag();
    let frames_total = (a.duration * format.rate as f64) as u64;
    let (recv_proc, mut snaps) = RecvProcess::new(receiver, recv_link, format.rate);
    let sink = Box::new(WavSink::create(
        &a.output,
        format.rate,
        format.channels,
        format.codec,
    )?);
    let recv_ep = Box::new(
        PacedEndpoint::new(format.rate, 64, None, format.channels, Some(sink)).with_limit(Some(frames_total)),
    );
    let recv_audio = spawn_audio("netjam-demo-rx", recv_ep, recv_proc, stop.clone())?;

    let (send_proc, _send_snaps) = SendProcess::new(sender, send_link, format.rate);
    let music = Box::new(SynthSource::new(
        SynthKind::Music { bpm: 112.0 },
        format.rate,
        format.channels,
        a.seed,
    ));
    // The sender runs a little longer so the last played periods are real audio.
    let send_ep = Box::new(
        PacedEndpoint::new(format.rate, a.frames, Some(music), 0, None)
            .with_limit(Some(frames_total + format.rate as u64 / 5)),
    );
    let send_audio = spawn_audio("netjam-demo-tx", send_ep, send_proc, stop.clone())?;

    let mut status = StatusLine::new();
    let mut series = Vec::new();
    while !recv_audio.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        while let Ok(s) = snaps.pop() {
            status.show(&recv_line(&s));
            series.push(s);
        }
    }
    status.finish();
    let (recv_proc, _, playout) = recv_audio
        .join()
        .map_err(|_| anyhow::anyhow!("the receiving audio thread panicked"))??;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (send_proc, _, _) = send_audio
        .join()
        .map_err(|_| anyhow::anyhow!("the sending audio thread panicked"))??;
    stop.store(false, std::sync::atomic::Ordering::Relaxed);
    recv_io.shutdown();
    send_io.shutdown();
    let relay_stats = relay.stop();
    let rx = recv_proc.receiver.stats();
    let tx = send_proc.sender.stats();
    let jb = rx.jitter_buffer;

    let budget = Budget {
        packetization_ms: a.frames as f64 * 1000.0 / format.rate as f64,
        network_ms: relay_stats.up.delay_mean_ms,
        jitter_buffer_ms: jb.added_latency_ms,
        concealment_ms: 0.0,
        total_ms: 0.0,
        light_in_vacuum_ms: 12.5,
        light_in_fibre_ms: 18.8,
    };
    let budget = Budget {
        total_ms: budget.packetization_ms + budget.network_ms + budget.jitter_buffer_ms,
        ..budget
    };
    println!();
    println!("Latency budget, one way, mouth to ear (measured):");
    println!(
        "  packetization   {:>6.2} ms   {} frames at {} Hz",
        budget.packetization_ms, a.frames, format.rate
    );
    println!(
        "  network         {:>6.2} ms   mean one-way delay through the emulated link",
        budget.network_ms
    );
    println!(
        "  jitter buffer   {:>6.2} ms   mean wait from arrival to playout (target {:.2} ms on top of a {:.2} ms period; PDV p99 {:.2} ms)",
        budget.jitter_buffer_ms, jb.target_ms, 64.0 * 1000.0 / format.rate as f64, jb.pdv_p99_ms
    );
    println!(
        "  concealment     {:>6.2} ms   (fills gaps in place; adds no delay)",
        budget.concealment_ms
    );
    println!(
        "  total           {:>6.2} ms   (light alone: {:.1} ms in vacuum, {:.1} ms in fibre)",
        budget.total_ms, budget.light_in_vacuum_ms, budget.light_in_fibre_ms
    );
    println!(
        "  netjam adds     {:>6.2} ms   on top of the wire",
        budget.packetization_ms + budget.jitter_buffer_ms
    );
    println!();
    println!("Quality:");
    let lost_on_link = relay_stats.up.link.lost + relay_stats.up.link.queue_dropped;
    println!(
        "  packets         {} sent, {} received, {} lost on the link",
        tx.packets, rx.received, lost_on_link
    );
    println!(
        "  recovered       {} frames rebuilt from redundancy before they were due",
        jb.recovered_frames
    );
    println!(
        "  concealed       {} frames in {} gaps ({:.3} % of the audio); {} late, {} duplicate, {} reordered",
        jb.concealed_frames,
        jb.concealment_events,
        100.0 * jb.concealed_frames as f64 / jb.played_frames.max(1) as f64,
        jb.late_packets,
        jb.duplicate_packets,
        rx.reordered
    );
    println!(
        "  rtt (RTCP)      {}",
        tx.rtt_ms.map_or("not measured".into(), |r| format!("{r:.2} ms"))
    );
    println!(
        "  playout         {} periods, {} missed deadlines, worst wake-up {:.0} µs late",
        playout.periods, playout.missed_deadlines, playout.wake_late_max_us
    );
    println!("  wrote           {}", a.output.display());
    if let Some(path) = &a.stats_json {
        let report = DemoReport {
            format,
            frames_per_packet: a.frames,
            redundancy: a.redundancy,
            link,
            budget,
            receiver: rx,
            sender: tx,
            relay: relay_stats,
            playout_periods: playout,
            series,
        };
        write_json(path, &report)?;
        println!("  statistics      {}", path.display());
    }
    Ok(())
}
