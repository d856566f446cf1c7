//! `netjam ping`, `netjam sweep` and `netjam impair`: their flags, live lines and tables
//! around the library in [`crate::probe`].

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use netjam_engine::link::{JitterDist, LinkConfig, LossModel};
use netjam_engine::probe::recommend::PointResult;
use netjam_engine::probe::stats::PathStats;
use netjam_engine::probe::{sweep_grid, AudioFormat, SampleFormat};

use super::common::{check_outputs, EventArgs};
use crate::clock;
use crate::probe::impair::spawn_impair_with_events;
use crate::probe::ping::{ping_with_progress, write_csv, PingConfig, PingReport};
use crate::probe::sweep::{sweep, sweep_svg};
use crate::transport::TimestampSource;

use super::common::resolve;

fn ts_name(s: TimestampSource) -> &'static str {
    match s {
        TimestampSource::Kernel => "kernel",
        TimestampSource::Monotonic => "monotonic",
    }
}

// ---------------------------------------------------------------------------------------
// ping

#[derive(Debug, Args)]
pub struct PingArgs {
    /// The reflector, HOST:PORT (`netjam reflect` running there).
    pub target: String,
    /// Probes per second.
    #[arg(long, default_value_t = 100.0)]
    pub rate: f64,
    /// UDP payload bytes per probe (at least 48, 64 with --secret).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Seconds of sending.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Shared secret of the reflector.
    #[arg(long)]
    pub secret: Option<String>,
    /// Write the full result as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one line per probe as CSV.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Milliseconds to wait for replies after the last probe (default: three times the late
    /// threshold max(1 s, 4 × median RTT); it stops early once every probe is answered).
    #[arg(long)]
    pub wait: Option<f64>,
}

fn path_row(name: &str, p: &PathStats) -> String {
    let d = &p.delay;
    format!(
        "{name:<12}{:>9.3}{:>9.3}{:>9.3}{:>9.3}{:>9.3}{:>9.3}",
        d.min_ms, d.mean_ms, d.median_ms, d.p95_ms, d.p99_ms, d.max_ms
    )
}

fn variation_row(name: &str, p: &PathStats) -> String {
    format!(
        "{name:<12}{:>9.3}{:>9.3}{:>9.3}{:>9.3}{:>9.3}{:>7} ({:>6.2} %){:>6}",
        p.ipdv.mean_abs_ms,
        p.ipdv.p99_abs_ms,
        p.pdv.p99_ms,
        p.pdv.p999_ms,
        p.jitter_rfc3550_ms,
        p.lost,
        p.loss_pct,
        p.reordered
    )
}

/// The summary table `netjam ping` prints.
pub fn format_summary(r: &PingReport) -> String {
    let s = &r.summary;
    let mut o = String::new();
    o.push_str(&format!(
        "netjam ping {}: {} probes of {} bytes at {}/s; timestamps: {} here, {} at the reflector\n",
        r.target,
        s.sent,
        r.size_bytes,
        r.rate_pps,
        ts_name(r.timestamps),
        ts_name(r.reflector_timestamps)
    ));
    o.push_str(&format!(
        "{:<12}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}   (ms)\n",
        "delay", "min", "mean", "median", "p95", "p99", "max"
    ));
    o.push_str(&(path_row("round trip", &s.round_trip) + "\n"));
    o.push_str(&(path_row("send*", &s.send) + "\n"));
    o.push_str(&(path_row("receive*", &s.receive) + "\n"));
    o.push_str(&format!(
        "{:<12}{:>9}{:>9}{:>9}{:>9}{:>9}{:>18}{:>6}\n",
        "variation", "IPDV|x|", "IPDVp99", "PDVp99", "PDVp99.9", "RFC3550", "lost", "reord"
    ));
    o.push_str(&(variation_row("round trip", &s.round_trip) + "\n"));
    o.push_str(&(variation_row("send*", &s.send) + "\n"));
    o.push_str(&(variation_row("receive*", &s.receive) + "\n"));
    o.push_str(&format!(
        "* one-way figures are estimates: clock offset (reflector - here) {:.3} ms by minimum filter, skew {:.1} ppm\n",
        s.clock.offset_ms, s.clock.skew_ppm
    ));
    o.push_str(&format!(
        "sent {}  received {}  lost {} ({:.2} %; {} up, {} down, {} unknown)  duplicates {}  late {} (> {:.0} ms)  \
         refused by reflector {}\n",
        s.sent,
        s.received,
        s.lost,
        s.loss_pct,
        s.send.lost,
        s.receive.lost,
        s.lost_direction_unknown,
        s.duplicates,
        s.late,
        s.late_after_ms,
        s.refused_by_reflector
    ));
    o.push_str(&format!(
        "reflector hold: median {:.3} ms, p99 {:.3} ms; sender schedule slip max {:.3} ms\n",
        s.reflector_hold.median_ms, s.reflector_hold.p99_ms, r.max_schedule_slip_ms
    ));
    let peak = s.rtt_histogram.iter().map(|b| b.count).max().unwrap_or(0).max(1);
    if !s.rtt_histogram.is_empty() {
        o.push_str("round-trip histogram (ms):\n");
    }
    for b in &s.rtt_histogram {
        let bar = "#".repeat(((b.count * 40).div_ceil(peak)) as usize);
        o.push_str(&format!(
            "  {:>9.3} - {:>9.3} {:>8} {bar}\n",
            b.lo_ms, b.hi_ms, b.count
        ));
    }
    o
}

pub fn run_ping(a: PingArgs) -> anyhow::Result<()> {
    check_outputs([(a.json.as_deref(), "--json"), (a.csv.as_deref(), "--csv")])?;
    let target = resolve(&a.target)?;
    if !(a.duration > 0.0 && a.duration.is_finite()) {
        bail!("--duration must be a positive number of seconds");
    }
    let cfg = PingConfig {
        target,
        rate_pps: a.rate,
        size: a.size,
        duration: Duration::from_secs_f64(a.duration),
        secret: a.secret.clone(),
        wait_after: a.wait.map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1e3)),
    };
    let live = std::io::stderr().is_terminal();
    let out = ping_with_progress(&cfg, |l| {
        if live {
            let mut e = std::io::stderr();
            let _ = write!(
                e,
                "\r\x1b[2Ksent {}  received {}  loss {:.2} %  rtt {:.3} ms (min {:.3})  jitter {:.3} ms",
                l.sent, l.received, l.loss_pct, l.last_rtt_ms, l.min_rtt_ms, l.jitter_ms
            );
            let _ = e.flush();
        }
    })?;
    if live {
        eprintln!();
    }
    print!("{}", format_summary(&out.report));
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&out.report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.csv {
        write_csv(p, &out.stats)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// sweep

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CodecArg {
    L16,
    L24,
    F32,
    Opus,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// The reflector, HOST:PORT.
    pub target: String,
    #[arg(long, value_enum, default_value = "l16")]
    pub codec: CodecArg,
    /// Opus: the stream's bitrate in kbit/s, which sets its packet sizes (default: 96 per channel).
    #[arg(long, value_name = "KBPS")]
    pub bitrate: Option<u32>,
    /// Audio sample rate in Hz.
    #[arg(long, default_value_t = 48_000)]
    pub rate: u32,
    #[arg(long, default_value_t = 2)]
    pub channels: u16,
    #[arg(long = "seconds-per-point", default_value_t = 5.0)]
    pub seconds_per_point: f64,
    /// Shared secret of the reflector.
    #[arg(long)]
    pub secret: Option<String>,
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw latency and loss against packet rate as an SVG image.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Highest acceptable loss in percent.
    #[arg(long = "loss-limit", default_value_t = 1.0)]
    pub loss_limit: f64,
}

fn sweep_row(r: &PointResult, format: &AudioFormat) -> String {
    let frames = r.point.frames.map_or("-".to_string(), |f| f.to_string());
    let latency = r.point.frames.map_or("-".to_string(), |f| {
        let up = r.send_min_ms + r.send_pdv_p99_ms;
        let down = r.receive_min_ms + r.receive_pdv_p99_ms;
        format!("{:.2}", format.packet_time_ms(f) + up.max(down))
    });
    format!(
        "{frames:>7}{:>9.1}{:>7}{:>9.3}{:>9.3}{:>9.3}{:>8.2}{:>8.2}{:>9}",
        r.point.packet_rate,
        r.point.size_bytes,
        r.rtt_median_ms,
        r.send_pdv_p99_ms,
        r.receive_pdv_p99_ms,
        r.send_loss_pct,
        r.receive_loss_pct,
        latency
    )
}

const SWEEP_HEADER: &str = " frames   pkts/s  bytes  rtt med  PDV99up  PDV99dn  loss up  loss dn  expect(ms)";

pub fn run_sweep(a: SweepArgs) -> anyhow::Result<()> {
    check_outputs([(a.json.as_deref(), "--json"), (a.plot.as_deref(), "--plot")])?;
    let target = resolve(&a.target)?;
    let format = AudioFormat {
        sample: match a.codec {
            CodecArg::L16 => SampleFormat::L16,
            CodecArg::L24 => SampleFormat::L24,
            CodecArg::F32 => SampleFormat::F32,
            CodecArg::Opus => SampleFormat::Opus {
                kbps: crate::opus::bitrate_kbps(a.bitrate, a.channels),
            },
        },
        rate_hz: a.rate,
        channels: a.channels,
    };
    if a.rate == 0 || a.channels == 0 {
        bail!("--rate and --channels must be positive");
    }
    let grid = sweep_grid(&format);
    eprintln!(
        "netjam sweep {target}: {} points of {:.1} s each",
        grid.len(),
        a.seconds_per_point
    );
    println!("{SWEEP_HEADER}");
    let report = sweep(
        target,
        format,
        a.seconds_per_point,
        a.secret.clone(),
        a.loss_limit,
        |_, r| {
            println!("{}", sweep_row(r, &format));
        },
    )?;
    println!("recommendation: {}", report.recommendation.reason);
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if let Some(p) = &a.plot {
        std::fs::write(p, sweep_svg(&report)).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// impair

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum JitterDistArg {
    Uniform,
    Normal,
    Pareto,
}

#[derive(Debug, Args)]
pub struct ImpairArgs {
    /// Where clients send.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Where their packets go.
    #[arg(long)]
    pub forward: String,
    /// One-way delay in ms (both directions).
    #[arg(long, default_value_t = 0.0)]
    pub delay: f64,
    /// Jitter in ms (both directions).
    #[arg(long, default_value_t = 0.0)]
    pub jitter: f64,
    #[arg(long = "jitter-dist", value_enum, default_value = "uniform")]
    pub jitter_dist: JitterDistArg,
    /// Loss in percent (both directions).
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Mean loss burst length in packets; above 1 gives Gilbert–Elliott loss.
    #[arg(long)]
    pub burst: Option<f64>,
    /// Percent of packets held back behind later ones.
    #[arg(long, default_value_t = 0.0)]
    pub reorder: f64,
    /// Percent of packets delivered twice.
    #[arg(long, default_value_t = 0.0)]
    pub duplicate: f64,
    /// Bandwidth cap in kbit/s.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Queue in bytes in front of the bandwidth cap.
    #[arg(long, default_value_t = 64 * 1024)]
    pub queue: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    #[arg(long = "up-delay")]
    pub up_delay: Option<f64>,
    #[arg(long = "down-delay")]
    pub down_delay: Option<f64>,
    #[arg(long = "up-jitter")]
    pub up_jitter: Option<f64>,
    #[arg(long = "down-jitter")]
    pub down_jitter: Option<f64>,
    #[arg(long = "up-loss")]
    pub up_loss: Option<f64>,
    #[arg(long = "down-loss")]
    pub down_loss: Option<f64>,
    #[arg(long = "up-burst")]
    pub up_burst: Option<f64>,
    #[arg(long = "down-burst")]
    pub down_burst: Option<f64>,
    #[arg(long = "up-reorder")]
    pub up_reorder: Option<f64>,
    #[arg(long = "down-reorder")]
    pub down_reorder: Option<f64>,
    #[arg(long = "up-duplicate")]
    pub up_duplicate: Option<f64>,
    #[arg(long = "down-duplicate")]
    pub down_duplicate: Option<f64>,
    /// A scripted link event, times from the first client packet (repeatable):
    /// 5s:stall=200ms, 10s:delay=-10ms, 3s:jitter=30ms/2s, 8s:rate=256kbit/1s,
    /// 4s:loss=20%/500ms. Both directions unless prefixed with up: or down:.
    #[arg(long = "event", value_name = "SPEC")]
    pub events: Vec<String>,
    /// A file of event specs, one per line (# comments and blank lines allowed; repeatable).
    #[arg(long = "events", value_name = "FILE")]
    pub event_files: Vec<PathBuf>,
}

fn ms_to_ns(ms: f64) -> u64 {
    (ms.max(0.0) * 1e6) as u64
}

impl ImpairArgs {
    /// The link settings of one direction (`up`: client to forward target).
    pub fn link_config(&self, up: bool) -> LinkConfig {
        let pick = |both: f64, u: Option<f64>, d: Option<f64>| {
            if up {
                u.unwrap_or(both)
            } else {
                d.unwrap_or(both)
            }
        };
        let loss_pct = pick(self.loss, self.up_loss, self.down_loss);
        let burst = if up {
            self.up_burst.or(self.burst)
        } else {
            self.down_burst.or(self.burst)
        };
        LinkConfig {
            delay_ns: ms_to_ns(pick(self.delay, self.up_delay, self.down_delay)),
            jitter_ns: ms_to_ns(pick(self.jitter, self.up_jitter, self.down_jitter)),
            jitter_dist: match self.jitter_dist {
                JitterDistArg::Uniform => JitterDist::Uniform,
                JitterDistArg::Normal => JitterDist::Normal,
                JitterDistArg::Pareto => JitterDist::Pareto,
            },
            loss: LossModel::bursty(loss_pct / 100.0, burst.unwrap_or(1.0)),
            reorder: pick(self.reorder, self.up_reorder, self.down_reorder).clamp(0.0, 100.0) / 100.0,
            duplicate: pick(self.duplicate, self.up_duplicate, self.down_duplicate).clamp(0.0, 100.0) / 100.0,
            rate_bps: self.rate.map(|k| k.saturating_mul(1000)),
            queue_bytes: self.queue,
        }
    }
}

pub fn run_impair(a: ImpairArgs) -> anyhow::Result<()> {
    // A bad schedule is refused before anything is bound.
    let events = EventArgs::parse(&a.events, &a.event_files)?;
    let forward = resolve(&a.forward)?;
    let up = a.link_config(true);
    let down = a.link_config(false);
    let h = spawn_impair_with_events(
        a.listen,
        forward,
        up.clone(),
        down.clone(),
        events.emulator_events(),
        a.seed,
    )?;
    eprintln!(
        "netjam impair: {} -> {forward}\n  up:   {}\n  down: {}",
        h.local_addr(),
        serde_json::to_string(&up)?,
        serde_json::to_string(&down)?
    );
    if !events.is_empty() {
        eprintln!("netjam impair: scripted link events, times from the first client packet:");
        for line in events.describe() {
            eprintln!("  {line}");
        }
    }
    let transitions = events.transitions();
    let mut next_transition = 0;
    let deadline = a.duration.map(|d| clock::now_ns() + (d.max(0.0) * 1e9) as u64);
    let live = std::io::stderr().is_terminal();
    let tick_ns: u64 = if deadline.is_some() || !transitions.is_empty() {
        20_000_000
    } else {
        500_000_000
    };
    let mut origin = None;
    while !matches!(deadline, Some(d) if clock::now_ns() >= d) {
        let now = clock::now_ns();
        let mut wake = now + tick_ns;
        if let (Some(o), Some(t)) = (origin, transitions.get(next_transition)) {
            wake = wake.min(o + t.at_ns);
        }
        if let Some(d) = deadline {
            wake = wake.min(d);
        }
        std::thread::sleep(Duration::from_nanos(wake.saturating_sub(now)));
        if origin.is_none() && !transitions.is_empty() {
            origin = h.stats().event_origin_ns;
        }
        if let Some(o) = origin {
            let now = clock::now_ns();
            while let Some(t) = transitions.get(next_transition).filter(|t| o + t.at_ns <= now) {
                let (dirs, e) = events.events()[t.event];
                let what = match (t.begins, e.end_ns()) {
                    (true, None) => "takes effect",
                    (true, Some(_)) => "begins",
                    (false, _) => "ends",
                };
                eprintln!(
                    "{}netjam impair: {:.3} s: event {what}: {e} ({})",
                    if live { "\r\x1b[2K" } else { "" },
                    t.at_ns as f64 / 1e9,
                    dirs.name()
                );
                next_transition += 1;
            }
        }
        if live {
            let s = h.stats();
            let mut e = std::io::stderr();
            let _ = write!(
                e,
                "\r\x1b[2Kup: {} in, {} out, {} lost, {} queue-dropped   down: {} in, {} out, {} lost",
                s.up.offered,
                s.up.delivered,
                s.up.lost,
                s.up.queue_dropped,
                s.down.offered,
                s.down.delivered,
                s.down.lost
            );
            let _ = e.flush();
        }
    }
    let s = h.stop();
    if live {
        eprintln!();
    }
    eprintln!("netjam impair: {}", serde_json::to_string(&s)?);
    Ok(())
}
