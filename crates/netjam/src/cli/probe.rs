//! `netjam ping`, `netjam sweep` and `netjam impair`: the I/O shells of link measurement.
//!
//! `ping` sends isochronous probes to a `netjam reflect` from one sender thread (scheduled
//! on absolute times, so a late wake-up never shifts the schedule) and takes the replies on
//! a receiver thread on the same socket; every timestamp is on [`clock::now_ns`]. The
//! statistics are the engine's [`ProbeStats`]. `sweep` runs `ping` over the packet sizes and
//! rates an audio stream would use and asks the engine for a packetization. `impair` relays
//! UDP through two engine [`LinkModel`]s, releasing packets at their delivery times, with
//! scripted link events (`--event`, `--events`) counted from the first client packet.

use std::io::{IsTerminal, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use netjam_engine::link::{JitterDist, LinkConfig, LinkModel, LinkStats, LossModel};
use netjam_engine::probe::packet::{self, Kind, ProbeKey, ProbeRequest, HELLO_LEN, PROBE_MAX_LEN};
use netjam_engine::probe::recommend::PointResult;
use netjam_engine::probe::stats::PathStats;
use netjam_engine::probe::{
    recommend, sweep_grid, AudioFormat, ProbeStats, ProbeSummary, Recommendation, SampleFormat, SweepPoint,
};
use serde::Serialize;

use super::common::{check_outputs, EventArgs};
use crate::clock;
use crate::link_emulator::EmulatorEvents;
use crate::transport::{TimestampSource, UdpTransport};

const NS: f64 = 1e9;

fn resolve(target: &str) -> anyhow::Result<SocketAddr> {
    target
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {target}; give HOST:PORT"))?
        .next()
        .with_context(|| format!("{target} resolves to no address"))
}

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

/// Settings of one ping run.
#[derive(Debug, Clone)]
pub struct PingConfig {
    pub target: SocketAddr,
    pub rate_pps: f64,
    pub size: usize,
    pub duration: Duration,
    pub secret: Option<String>,
    /// How long to wait for replies after the last probe; `None` for three late thresholds.
    pub wait_after: Option<Duration>,
    /// Print a live status line to stderr.
    pub live: bool,
}

impl PingConfig {
    pub fn new(target: SocketAddr, rate_pps: f64, size: usize, duration: Duration) -> Self {
        Self {
            target,
            rate_pps,
            size,
            duration,
            secret: None,
            wait_after: None,
            live: false,
        }
    }
}

/// What a ping run found, for JSON.
#[derive(Debug, Clone, Serialize)]
pub struct PingReport {
    pub target: SocketAddr,
    pub rate_pps: f64,
    pub size_bytes: usize,
    pub duration_s: f64,
    pub session: u32,
    /// Where this side's receive timestamps came from.
    pub timestamps: TimestampSource,
    /// Where the reflector's came from (`kernel` if it said so on every reply).
    pub reflector_timestamps: TimestampSource,
    pub send_errors: u64,
    /// The sender's worst lateness against its schedule.
    pub max_schedule_slip_ms: f64,
    /// Probes per second actually sent (first to last send).
    pub achieved_rate_pps: f64,
    pub summary: ProbeSummary,
}

/// A finished ping run: the report and the per-probe statistics.
#[derive(Debug)]
pub struct PingOutcome {
    pub report: PingReport,
    pub stats: ProbeStats,
}

/// Most probes one run may plan (bounds memory: about 64 bytes per probe).
pub const MAX_PROBES: u64 = 5_000_000;

fn handshake(
    sock: &UdpTransport,
    target: SocketAddr,
    session: u32,
    key: Option<&ProbeKey>,
) -> anyhow::Result<packet::HelloReply> {
    let mut out = [0u8; HELLO_LEN];
    let mut buf = [0u8; 2048];
    let n = packet::write_hello(&mut out, session, key)?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    for _ in 0..8 {
        sock.send_to(&out[..n], target)
            .with_context(|| format!("sending to {target}"))?;
        let until = clock::now_ns() + 300_000_000;
        while clock::now_ns() < until {
            let Some(rx) = sock.recv(&mut buf)? else {
                continue;
            };
            if rx.from != target {
                continue;
            }
            if let Ok(h) = packet::parse_hello_reply(&buf[..rx.len], key) {
                if h.session == session {
                    return Ok(h);
                }
            }
        }
    }
    bail!(
        "no answer from a reflector at {target}: is `netjam reflect` running there, reachable through \
         firewalls, and is --secret the same on both sides?"
    )
}

fn token_u64(t: [u8; 8]) -> u64 {
    u64::from_be_bytes(t)
}

/// Wait until `due_ns`: sleep coarsely, spin only the last part of a short stretch so that
/// very high probe rates do not occupy a core.
fn wait_until(due_ns: u64, spin_ns: u64) {
    loop {
        let now = clock::now_ns();
        if now >= due_ns {
            return;
        }
        let left = due_ns - now;
        if left > spin_ns {
            std::thread::sleep(Duration::from_nanos(left - spin_ns));
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Run one ping.
pub fn ping(cfg: &PingConfig) -> anyhow::Result<PingOutcome> {
    if !(cfg.rate_pps > 0.0 && cfg.rate_pps.is_finite()) {
        bail!("--rate must be a positive number of probes per second");
    }
    let key = cfg.secret.as_deref().map(|s| ProbeKey::new(s.as_bytes()));
    let min = packet::probe_min_len(key.as_ref());
    let size = cfg.size.clamp(min, PROBE_MAX_LEN);
    if size != cfg.size {
        tracing::warn!(
            "probe size {} adjusted to {size} (allowed {min}..={PROBE_MAX_LEN})",
            cfg.size
        );
    }
    let total = (cfg.rate_pps * cfg.duration.as_secs_f64()).ceil() as u64;
    if total > MAX_PROBES {
        bail!("{total} probes is more than one run may send ({MAX_PROBES}); lower --rate or --duration");
    }
    let total = total.max(1);
    let bind: SocketAddr = if cfg.target.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let sock = Arc::new(UdpTransport::bind(bind).context("binding a local UDP socket")?);
    let session = u32::from_be_bytes(super::reflect::random_bytes());
    let hello = handshake(&sock, cfg.target, session, key.as_ref())?;
    let token = Arc::new(AtomicU64::new(token_u64(hello.token)));
    let refresh_ns = (hello.valid_ms as u64 * 1_000_000 / 2).max(1_000_000_000);

    let stats = Arc::new(Mutex::new(ProbeStats::new(total as usize)));
    let sending_done = Arc::new(AtomicBool::new(false));
    let last_send_ns = Arc::new(AtomicU64::new(0));
    let reflector_kernel = Arc::new(AtomicU64::new(0));
    let interval_ns = NS / cfg.rate_pps;
    let start_ns = clock::now_ns() + 20_000_000;
    let target = cfg.target;

    // Receiver.
    let receiver = {
        let sock = sock.clone();
        let stats = stats.clone();
        let token = token.clone();
        let done = sending_done.clone();
        let last_send = last_send_ns.clone();
        let key = key.clone();
        let reflector_kernel = reflector_kernel.clone();
        let wait_after = cfg.wait_after;
        // Whatever happens to the sender, the receiver gives up a minute after the schedule
        // (plus any explicit wait) ends.
        let hard_deadline = start_ns
            .saturating_add((total as f64 * interval_ns) as u64)
            .saturating_add(wait_after.map_or(0, |d| d.as_nanos() as u64))
            .saturating_add(60_000_000_000);
        std::thread::Builder::new()
            .name("netjam-ping-rx".into())
            .spawn(move || -> anyhow::Result<()> {
                let mut buf = vec![0u8; 65_536];
                let mut wait_ns: Option<u64> = wait_after.map(|d| d.as_nanos() as u64);
                loop {
                    if clock::now_ns() >= hard_deadline {
                        break;
                    }
                    if done.load(Ordering::Acquire) {
                        let stats_now = stats.lock().map_err(|_| anyhow::anyhow!("stats lock poisoned"))?;
                        if stats_now.all_answered() {
                            break;
                        }
                        // Listen three late thresholds past the last probe, so late replies
                        // are seen and counted rather than taken for lost.
                        let w = *wait_ns
                            .get_or_insert_with(|| stats_now.default_late_after_ns().saturating_mul(3));
                        drop(stats_now);
                        if clock::now_ns() >= last_send.load(Ordering::Acquire).saturating_add(w) {
                            break;
                        }
                    }
                    let rx = match sock.recv(&mut buf) {
                        Ok(Some(rx)) => rx,
                        Ok(None) => continue,
                        // An error queued on the socket (e.g. an ICMP report) is not the
                        // end of the run; back off briefly so it cannot spin.
                        Err(e) => {
                            tracing::debug!("receive error: {e}");
                            std::thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                    };
                    if rx.from != target {
                        continue;
                    }
                    let pkt = &buf[..rx.len];
                    match packet::parse_header(pkt).map(|h| h.kind) {
                        Ok(Kind::ProbeReply) => {
                            if let Ok(r) = packet::parse_probe_reply(pkt, session, key.as_ref()) {
                                let kernel = rx.source == TimestampSource::Kernel;
                                if r.reflector_kernel_ts {
                                    reflector_kernel.fetch_add(1, Ordering::Relaxed);
                                }
                                if let Ok(mut s) = stats.lock() {
                                    s.on_reply(rx.at_ns, &r, kernel);
                                }
                            }
                        }
                        Ok(Kind::HelloReply) => {
                            if let Ok(h) = packet::parse_hello_reply(pkt, key.as_ref()) {
                                if h.session == session {
                                    token.store(token_u64(h.token), Ordering::Release);
                                }
                            }
                        }
                        _ => {}
                    }
                }
                Ok(())
            })?
    };

    // Sender.
    let send_errors = Arc::new(AtomicU64::new(0));
    let max_slip = Arc::new(AtomicU64::new(0));
    let sender = {
        let sock = sock.clone();
        let stats = stats.clone();
        let token = token.clone();
        let key = key.clone();
        let done = sending_done.clone();
        let last_send = last_send_ns.clone();
        let send_errors = send_errors.clone();
        let max_slip = max_slip.clone();
        std::thread::Builder::new()
            .name("netjam-ping-tx".into())
            .spawn(move || {
                let mut buf = vec![0u8; size];
                let mut hello = [0u8; HELLO_LEN];
                let spin_ns = (interval_ns / 4.0).min(150_000.0) as u64;
                let mut next_refresh = start_ns + refresh_ns;
                for seq in 0..total {
                    let due = start_ns + (seq as f64 * interval_ns) as u64;
                    wait_until(due, spin_ns);
                    if due >= next_refresh {
                        if let Ok(n) = packet::write_hello(&mut hello, session, key.as_ref()) {
                            let _ = sock.send_to(&hello[..n], target);
                        }
                        next_refresh += refresh_ns;
                    }
                    let t1 = clock::now_ns();
                    max_slip.fetch_max(t1.saturating_sub(due), Ordering::Relaxed);
                    let req = ProbeRequest {
                        session,
                        seq: seq as u32,
                        t1_ns: t1,
                        token: token.load(Ordering::Acquire).to_be_bytes(),
                    };
                    let Ok(n) = packet::write_probe(&mut buf, size, &req, key.as_ref()) else {
                        continue;
                    };
                    if sock.send_to(&buf[..n], target).is_err() {
                        send_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    if let Ok(mut s) = stats.lock() {
                        s.on_sent(seq as u32, t1);
                    }
                    last_send.store(clock::now_ns(), Ordering::Release);
                }
                done.store(true, Ordering::Release);
            })?
    };

    // Live line.
    let live = cfg.live && std::io::stderr().is_terminal();
    while !(sender.is_finished() && receiver.is_finished()) {
        std::thread::sleep(Duration::from_millis(if live { 250 } else { 20 }));
        if live {
            if let Ok(s) = stats.lock() {
                let l = s.live();
                let mut e = std::io::stderr();
                let _ = write!(
                    e,
                    "\r\x1b[2Ksent {}  received {}  loss {:.2} %  rtt {:.3} ms (min {:.3})  jitter {:.3} ms",
                    l.sent, l.received, l.loss_pct, l.last_rtt_ms, l.min_rtt_ms, l.jitter_ms
                );
                let _ = e.flush();
            }
        }
    }
    if live {
        eprintln!();
    }
    if sender.join().is_err() {
        bail!("ping sender thread panicked");
    }
    match receiver.join() {
        Ok(r) => r.context("receiving replies")?,
        Err(_) => bail!("ping receiver thread panicked"),
    }
    let stats = match Arc::try_unwrap(stats) {
        Ok(m) => m
            .into_inner()
            .map_err(|_| anyhow::anyhow!("stats lock poisoned"))?,
        Err(a) => a
            .lock()
            .map_err(|_| anyhow::anyhow!("stats lock poisoned"))?
            .clone(),
    };
    let summary = stats.summary(None);
    let sent_times = stats.records().iter().filter(|r| r.sent).map(|r| r.t1_ns);
    let (first, last) = sent_times.fold((u64::MAX, 0), |(a, b), t| (a.min(t), b.max(t)));
    let achieved_rate_pps = if last > first {
        (summary.sent.saturating_sub(1)) as f64 * NS / (last - first) as f64
    } else {
        0.0
    };
    let refl_kernel = reflector_kernel.load(Ordering::Relaxed);
    let report = PingReport {
        target: cfg.target,
        rate_pps: cfg.rate_pps,
        size_bytes: size,
        duration_s: cfg.duration.as_secs_f64(),
        session,
        timestamps: sock.timestamp_source(),
        reflector_timestamps: if refl_kernel > 0 && refl_kernel >= summary.received {
            TimestampSource::Kernel
        } else {
            TimestampSource::Monotonic
        },
        send_errors: send_errors.load(Ordering::Relaxed),
        max_schedule_slip_ms: max_slip.load(Ordering::Relaxed) as f64 / 1e6,
        achieved_rate_pps,
        summary,
    };
    Ok(PingOutcome { report, stats })
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

/// Per-probe CSV: one line per sequence number.
pub fn write_csv(path: &std::path::Path, stats: &ProbeStats) -> anyhow::Result<()> {
    let clock = stats.clock_model();
    let mut out =
        String::from("seq,t1_ns,t2_ns,hold_ns,t4_ns,rtt_ms,send_ms_est,receive_ms_est,duplicates,status\n");
    for (seq, r) in stats.records().iter().enumerate() {
        match r.reply {
            Some(x) => {
                let rtt = r.rtt_ns().unwrap_or(0) as f64 / 1e6;
                let up = clock.send_ns(r).unwrap_or(0) as f64 / 1e6;
                let down = clock.receive_ns(r).unwrap_or(0) as f64 / 1e6;
                out.push_str(&format!(
                    "{seq},{},{},{},{},{rtt:.6},{up:.6},{down:.6},{},received\n",
                    r.t1_ns, x.t2_ns, x.hold_ns, x.t4_ns, r.duplicates
                ));
            }
            None => out.push_str(&format!("{seq},{},,,,,,,0,lost\n", r.t1_ns)),
        }
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
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
        live: true,
    };
    let out = ping(&cfg)?;
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

/// A finished sweep.
#[derive(Debug, Clone, Serialize)]
pub struct SweepReport {
    pub target: SocketAddr,
    pub format: AudioFormat,
    pub seconds_per_point: f64,
    pub points: Vec<PointResult>,
    pub recommendation: Recommendation,
}

/// Ping every point of the grid for `format` and recommend a packetization.
pub fn sweep(
    target: SocketAddr,
    format: AudioFormat,
    seconds_per_point: f64,
    secret: Option<String>,
    loss_limit_pct: f64,
    mut progress: impl FnMut(&SweepPoint, &PointResult),
) -> anyhow::Result<SweepReport> {
    let mut points = Vec::new();
    let min_size = packet::probe_min_len(secret.as_deref().map(|s| ProbeKey::new(s.as_bytes())).as_ref());
    for mut p in sweep_grid(&format) {
        // The smallest audio packets can be shorter than a probe; measure those at the
        // probe minimum and say so in the point's size.
        p.size_bytes = p.size_bytes.max(min_size);
        let cfg = PingConfig {
            target,
            rate_pps: p.packet_rate,
            size: p.size_bytes,
            duration: Duration::from_secs_f64(seconds_per_point.max(0.05)),
            secret: secret.clone(),
            wait_after: Some(Duration::from_millis(500)),
            live: false,
        };
        let out = ping(&cfg).with_context(|| format!("pinging at {:.0} packets/s", p.packet_rate))?;
        let r = PointResult::from_summary(p, &out.report.summary);
        progress(&p, &r);
        points.push(r);
    }
    let recommendation = recommend(&format, &points, loss_limit_pct);
    Ok(SweepReport {
        target,
        format,
        seconds_per_point,
        points,
        recommendation,
    })
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

/// An SVG plot of expected latency (left axis) and loss (right axis) against packet rate.
pub fn sweep_svg(report: &SweepReport) -> String {
    let (w, h, l, r, t, b) = (720.0, 420.0, 70.0, 70.0, 40.0, 60.0);
    let pts = &report.points;
    let fmt = &report.format;
    let lat: Vec<(f64, f64)> = pts
        .iter()
        .filter_map(|p| {
            let f = p.point.frames?;
            let up = p.send_min_ms + p.send_pdv_p99_ms;
            let down = p.receive_min_ms + p.receive_pdv_p99_ms;
            Some((p.point.packet_rate, fmt.packet_time_ms(f) + up.max(down)))
        })
        .collect();
    let loss: Vec<(f64, f64)> = pts
        .iter()
        .map(|p| (p.point.packet_rate, p.send_loss_pct.max(p.receive_loss_pct)))
        .collect();
    let xmin = pts
        .iter()
        .map(|p| p.point.packet_rate)
        .fold(f64::INFINITY, f64::min)
        .max(1.0);
    let xmax = pts
        .iter()
        .map(|p| p.point.packet_rate)
        .fold(1.0, f64::max)
        .max(xmin * 1.01);
    let ymax = lat.iter().map(|p| p.1).fold(1.0, f64::max) * 1.15;
    let lmax = loss
        .iter()
        .map(|p| p.1)
        .fold(report.recommendation.loss_limit_pct, f64::max)
        .max(1.0)
        * 1.15;
    let x = |v: f64| l + (v.ln() - xmin.ln()) / (xmax.ln() - xmin.ln()) * (w - l - r);
    let y = |v: f64| h - b - v / ymax * (h - t - b);
    let yl = |v: f64| h - b - v / lmax * (h - t - b);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" \
         font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    s.push_str(&format!(
        "<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">netjam sweep {}: expected mouth-to-ear \
         latency and loss</text>\n",
        w / 2.0,
        report.target
    ));
    s.push_str(&format!(
        "<line x1=\"{l}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" \
         y2=\"{}\" stroke=\"black\"/>\n<line x1=\"{}\" y1=\"{t}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n",
        h - b,
        w - r,
        h - b,
        h - b,
        w - r,
        w - r,
        h - b
    ));
    for p in pts {
        let px = x(p.point.packet_rate);
        s.push_str(&format!(
            "<line x1=\"{px:.1}\" y1=\"{}\" x2=\"{px:.1}\" y2=\"{}\" stroke=\"black\"/><text x=\"{px:.1}\" \
             y=\"{}\" text-anchor=\"middle\">{:.0}</text>\n",
            h - b,
            h - b + 5.0,
            h - b + 18.0,
            p.point.packet_rate
        ));
    }
    for i in 0..=4 {
        let v = ymax * i as f64 / 4.0;
        let vl = lmax * i as f64 / 4.0;
        s.push_str(&format!(
            "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#1f5fbf\">{v:.1}</text><text x=\"{}\" \
             y=\"{:.1}\" fill=\"#c0392b\">{vl:.2}</text>\n",
            l - 6.0,
            y(v) + 4.0,
            w - r + 6.0,
            yl(vl) + 4.0
        ));
    }
    s.push_str(&format!(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">packets per second (log scale)</text>\n<text x=\"16\" \
         y=\"{}\" fill=\"#1f5fbf\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">expected latency \
         (ms)</text>\n<text x=\"{}\" y=\"{}\" fill=\"#c0392b\" transform=\"rotate(90 {} {})\" \
         text-anchor=\"middle\">loss (%)</text>\n",
        (l + w - r) / 2.0,
        h - 20.0,
        h / 2.0,
        h / 2.0,
        w - 16.0,
        h / 2.0,
        w - 16.0,
        h / 2.0
    ));
    let poly = |pts: &[(f64, f64)], f: &dyn Fn(f64) -> f64| {
        pts.iter()
            .map(|(a, v)| format!("{:.1},{:.1}", x(*a), f(*v)))
            .collect::<Vec<_>>()
            .join(" ")
    };
    s.push_str(&format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#1f5fbf\" stroke-width=\"2\"/>\n",
        poly(&lat, &y)
    ));
    s.push_str(&format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#c0392b\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/>\n",
        poly(&loss, &yl)
    ));
    for (a, v) in &lat {
        s.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#1f5fbf\"/>\n",
            x(*a),
            y(*v)
        ));
    }
    if let Some(best) = &report.recommendation.best {
        s.push_str(&format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"7\" fill=\"none\" stroke=\"green\" stroke-width=\"2\"/>\n<text \
             x=\"{:.1}\" y=\"{:.1}\" fill=\"green\">{} frames</text>\n",
            x(best.packet_rate),
            y(best.expected_ms),
            x(best.packet_rate) + 9.0,
            y(best.expected_ms) - 9.0,
            best.frames
        ));
    }
    s.push_str(&format!(
        "<line x1=\"{l}\" y1=\"{:.1}\" x2=\"{}\" y2=\"{:.1}\" stroke=\"#c0392b\" stroke-opacity=\"0.4\"/>\n",
        yl(report.recommendation.loss_limit_pct),
        w - r,
        yl(report.recommendation.loss_limit_pct)
    ));
    s.push_str(&format!(
        "<line x1=\"{}\" y1=\"52\" x2=\"{}\" y2=\"52\" stroke=\"#1f5fbf\" stroke-width=\"2\"/><text x=\"{}\" \
         y=\"56\">expected latency, ms (left)</text>\n<line x1=\"{}\" y1=\"68\" x2=\"{}\" y2=\"68\" \
         stroke=\"#c0392b\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/><text x=\"{}\" y=\"72\">loss of the worse \
         direction, % (right); faint line: limit</text>\n",
        l + 10.0,
        l + 40.0,
        l + 46.0,
        l + 10.0,
        l + 40.0,
        l + 46.0
    ));
    s.push_str("</svg>\n");
    s
}

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

/// Counters of a relay run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ImpairStats {
    pub up: LinkStats,
    pub down: LinkStats,
    /// Replies that arrived before any client had sent.
    pub down_without_client: u64,
    /// Packets dropped because [`MAX_IN_FLIGHT`] were already held in one direction.
    pub overflow_dropped: u64,
    /// Worst lateness of a release against its delivery time.
    pub max_release_slip_ns: u64,
    /// When the first client packet arrived (clock ns): scripted events count from here.
    #[serde(skip)]
    pub event_origin_ns: Option<u64>,
}

/// Most packets the relay holds per direction; beyond this it drops, so a flood into a
/// long emulated delay cannot grow memory without bound.
pub const MAX_IN_FLIGHT: usize = 65_536;

struct Links {
    up: LinkModel<Vec<u8>>,
    down: LinkModel<(Vec<u8>, SocketAddr)>,
    stats: ImpairStats,
}

/// A relay running in background threads.
#[derive(Debug)]
pub struct ImpairHandle {
    listen_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    shared: Arc<(Mutex<LinksDebug>, Condvar)>,
}

/// The links behind a mutex (a newtype so the handle can derive `Debug`).
pub struct LinksDebug(Links);

impl std::fmt::Debug for LinksDebug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Links").field("stats", &self.0.stats).finish()
    }
}

impl ImpairHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    pub fn stats(&self) -> ImpairStats {
        match self.shared.0.lock() {
            Ok(l) => ImpairStats {
                up: l.0.up.stats(),
                down: l.0.down.stats(),
                event_origin_ns: l.0.up.event_origin(),
                ..l.0.stats
            },
            Err(_) => ImpairStats::default(),
        }
    }

    /// Stop relaying and return the counters.
    pub fn stop(self) -> ImpairStats {
        self.stop.store(true, Ordering::Relaxed);
        self.shared.1.notify_all();
        let s = self.stats();
        for t in self.threads {
            let _ = t.join();
        }
        s
    }
}

/// Start relaying from `listen` to `forward` through links `up` and `down`.
pub fn spawn_impair(
    listen: SocketAddr,
    forward: SocketAddr,
    up: LinkConfig,
    down: LinkConfig,
    seed: u64,
) -> anyhow::Result<ImpairHandle> {
    spawn_impair_with_events(listen, forward, up, down, EmulatorEvents::default(), seed)
}

/// [`spawn_impair`] with scripted `events` in each direction, counted from the first
/// packet a client sends.
pub fn spawn_impair_with_events(
    listen: SocketAddr,
    forward: SocketAddr,
    up: LinkConfig,
    down: LinkConfig,
    events: EmulatorEvents,
    seed: u64,
) -> anyhow::Result<ImpairHandle> {
    let front = Arc::new(UdpTransport::bind(listen).with_context(|| format!("cannot listen on {listen}"))?);
    let back_bind: SocketAddr = if forward.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let back = Arc::new(UdpTransport::bind(back_bind).context("binding the forwarding socket")?);
    front.set_read_timeout(Some(Duration::from_millis(50)))?;
    back.set_read_timeout(Some(Duration::from_millis(50)))?;
    let listen_addr = front.local_addr()?;
    let shared = Arc::new((
        Mutex::new(LinksDebug(Links {
            up: LinkModel::new(up, seed).with_schedule(events.up),
            down: LinkModel::new(down, seed ^ 0x5DEE_CE66_D1CE_F00D).with_schedule(events.down),
            stats: ImpairStats::default(),
        })),
        Condvar::new(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let client: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
    let mut threads = Vec::new();

    // Client -> forward target.
    {
        let (front, shared, stop, client) = (front.clone(), shared.clone(), stop.clone(), client.clone());
        threads.push(
            std::thread::Builder::new()
                .name("impair-up".into())
                .spawn(move || {
                    let mut buf = vec![0u8; 65_536];
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(Some(rx)) = front.recv(&mut buf) else {
                            continue;
                        };
                        if let Ok(mut c) = client.lock() {
                            *c = Some(rx.from);
                        }
                        if let Ok(mut l) = shared.0.lock() {
                            if l.0.up.event_origin().is_none() {
                                // One time line for both directions' events.
                                l.0.up.set_event_origin(rx.at_ns);
                                l.0.down.set_event_origin(rx.at_ns);
                            }
                            if l.0.up.in_flight() >= MAX_IN_FLIGHT {
                                l.0.stats.overflow_dropped += 1;
                            } else {
                                l.0.up.send(rx.at_ns, buf[..rx.len].to_vec(), rx.len);
                            }
                        }
                        shared.1.notify_one();
                    }
                })?,
        );
    }
    // Forward target -> client.
    {
        let (back, shared, stop, client) = (back.clone(), shared.clone(), stop.clone(), client.clone());
        threads.push(
            std::thread::Builder::new()
                .name("impair-down".into())
                .spawn(move || {
                    let mut buf = vec![0u8; 65_536];
                    while !stop.load(Ordering::Relaxed) {
                        let Ok(Some(rx)) = back.recv(&mut buf) else {
                            continue;
                        };
                        if rx.from != forward {
                            continue;
                        }
                        let to = client.lock().ok().and_then(|c| *c);
                        if let Ok(mut l) = shared.0.lock() {
                            match to {
                                Some(_) if l.0.down.in_flight() >= MAX_IN_FLIGHT => {
                                    l.0.stats.overflow_dropped += 1
                                }
                                Some(to) => {
                                    l.0.down.send(rx.at_ns, (buf[..rx.len].to_vec(), to), rx.len);
                                }
                                None => l.0.stats.down_without_client += 1,
                            }
                        }
                        shared.1.notify_one();
                    }
                })?,
        );
    }
    // Scheduler: release packets at their delivery times.
    {
        let (front, back, shared, stop) = (front.clone(), back.clone(), shared.clone(), stop.clone());
        threads.push(
            std::thread::Builder::new()
                .name("impair-sched".into())
                .spawn(move || {
                    const SPIN_NS: u64 = 200_000;
                    let (lock, cv) = &*shared;
                    let Ok(mut guard) = lock.lock() else {
                        return;
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let now = clock::now_ns();
                        let mut due_up = Vec::new();
                        let mut due_down = Vec::new();
                        while let Some((at, p)) = guard.0.up.poll(now) {
                            due_up.push((at, p));
                        }
                        while let Some((at, p)) = guard.0.down.poll(now) {
                            due_down.push((at, p));
                        }
                        if !due_up.is_empty() || !due_down.is_empty() {
                            drop(guard);
                            let mut slip = 0;
                            for (at, p) in due_up {
                                let _ = back.send_to(&p, forward);
                                slip = slip.max(clock::now_ns().saturating_sub(at));
                            }
                            for (at, (p, to)) in due_down {
                                let _ = front.send_to(&p, to);
                                slip = slip.max(clock::now_ns().saturating_sub(at));
                            }
                            let Ok(g) = lock.lock() else {
                                return;
                            };
                            guard = g;
                            guard.0.stats.max_release_slip_ns = guard.0.stats.max_release_slip_ns.max(slip);
                            continue;
                        }
                        let next = [guard.0.up.next_delivery(), guard.0.down.next_delivery()]
                            .into_iter()
                            .flatten()
                            .min();
                        match next {
                            Some(t) if t <= now + SPIN_NS => {
                                // Close: release the lock and sleep (spinning) to the exact time.
                                drop(guard);
                                clock::sleep_until_ns(t);
                                let Ok(g) = lock.lock() else {
                                    return;
                                };
                                guard = g;
                            }
                            Some(t) => {
                                let wait = Duration::from_nanos(t - now - SPIN_NS);
                                let Ok((g, _)) = cv.wait_timeout(guard, wait) else {
                                    return;
                                };
                                guard = g;
                            }
                            None => {
                                let Ok((g, _)) = cv.wait_timeout(guard, Duration::from_millis(50)) else {
                                    return;
                                };
                                guard = g;
                            }
                        }
                    }
                })?,
        );
    }
    Ok(ImpairHandle {
        listen_addr,
        stop,
        threads,
        shared,
    })
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
