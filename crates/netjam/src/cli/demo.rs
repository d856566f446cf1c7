//! `netjam demo`: a Seattle–Vermont jam in one process, no sound card needed.
//!
//! Synthetic music → sender → loopback UDP → a [`LinkEmulator`](crate::link_emulator::LinkEmulator) with the Seattle–Vermont
//! link profile → receiver → WAV file. It ends with the latency budget, measured stage by
//! stage, and the quality figures.

use std::path::PathBuf;

use clap::Args;
use netjam_engine::link::LinkConfig;
use netjam_engine::receiver::ReceiverStats;
use netjam_engine::sender::SenderStats;
use netjam_engine::synth::SynthKind;
use netjam_engine::wire::{AudioFormat, Codec};

use super::common::{check_outputs, EventArgs};
use crate::endpoint::PeriodStats;
use crate::link_emulator::EmulatorStats;
use crate::loopback::{run_loopback, LoopbackOptions};
use crate::series::BoundedSeries;
use crate::session::Snapshot;
use crate::shell::write_json;
use crate::shell::BufferSize;
use crate::status::{recv_line, StatusLine};

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
    pub buffer: BufferSize,
    /// Seed of the link emulator (same seed, same impairments).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Play without following the sender's clock (no resampling).
    #[arg(long)]
    pub no_drift_correction: bool,
    /// A scripted link event, e.g. 4s:stall=200ms (repeatable; syntax as `netjam impair
    /// --event`, times from the first packet).
    #[arg(long = "event", value_name = "SPEC")]
    pub events: Vec<String>,
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
    link_emulator: EmulatorStats,
    playout_periods: PeriodStats,
    series: BoundedSeries<Snapshot<ReceiverStats>>,
}

pub fn run_demo(a: DemoArgs) -> anyhow::Result<()> {
    check_outputs([
        (Some(a.output.as_path()), "--output"),
        (a.stats_json.as_deref(), "--stats-json"),
    ])?;
    let events = EventArgs::parse(&a.events, &[])?;
    let format = AudioFormat::new(Codec::L16, 48_000, 2)?;
    let link = LinkConfig::seattle_vermont();
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
    for line in events.describe() {
        println!("event: {line} (from the first packet)");
    }
    let options = LoopbackOptions {
        format,
        frames_per_packet: a.frames,
        redundancy: a.redundancy,
        buffer: a.buffer.mode(format.rate),
        period: 64,
        link: Some(link.clone()),
        events: events.emulator_events(),
        seed: a.seed,
        duration_s: a.duration,
        source: SynthKind::Music { bpm: 112.0 },
        output: Some(a.output.clone()),
        sender_name: "Seattle".into(),
        receiver_name: "Vermont".into(),
        drift_correction: !a.no_drift_correction,
    };
    let mut status = StatusLine::new();
    let report = run_loopback(&options, |s| status.show(&recv_line(s)))?;
    status.finish();
    let link_stats = report.link.unwrap_or_default();
    let (rx, tx, playout) = (report.receiver, report.sender, report.playout);
    let jb = rx.jitter_buffer;

    let budget = Budget {
        packetization_ms: a.frames as f64 * 1000.0 / format.rate as f64,
        network_ms: link_stats.up.delay_mean_ms,
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
    let lost_on_link = link_stats.up.link.lost + link_stats.up.link.queue_dropped;
    println!(
        "  packets         {} sent, {} received, {} lost on the link (the sender plays on 0.2 s past the end, so its last packets are not heard)",
        tx.packets, rx.received, lost_on_link
    );
    println!(
        "  recovered       {} frames rebuilt from redundancy before they were due",
        jb.recovered_frames
    );
    println!("  playout         {}", crate::status::discontinuity_text(&jb));
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
            link_emulator: link_stats,
            playout_periods: playout,
            series: report.series,
        };
        write_json(path, &report)?;
        println!("  statistics      {}", path.display());
    }
    Ok(())
}
