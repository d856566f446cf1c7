//! The ping client: isochronous probes to a `netjam reflect`, replies timed on one clock.
//!
//! One sender thread sends probes on absolute times (a late wake-up never shifts the
//! schedule) and one receiver thread takes the replies on the same socket; every timestamp
//! is on [`clock::now_ns`]. The statistics are the engine's [`ProbeStats`]. This module
//! never prints: the caller gets the running figures through a callback and the result as
//! a [`PingOutcome`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use netjam_engine::probe::packet::{self, Kind, ProbeKey, ProbeRequest, HELLO_LEN, PROBE_MAX_LEN};
use netjam_engine::probe::stats::LiveStats;
use netjam_engine::probe::{ProbeStats, ProbeSummary};
use serde::Serialize;

use crate::clock;
use crate::transport::{TimestampSource, UdpTransport};

const NS: f64 = 1e9;

/// How often [`ping_with_progress`] reports the running figures.
const PROGRESS_NS: u64 = 250_000_000;

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

/// Run one ping.
pub fn ping(cfg: &PingConfig) -> anyhow::Result<PingOutcome> {
    ping_with_progress(cfg, |_| {})
}

/// Run one ping; `progress` sees the running figures about four times a second.
pub fn ping_with_progress(
    cfg: &PingConfig,
    mut progress: impl FnMut(&LiveStats),
) -> anyhow::Result<PingOutcome> {
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
                    // Spin only the last part of a short stretch: high probe rates must not occupy a core.
                    clock::sleep_until_spinning(due, spin_ns);
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

    // Progress.
    let mut next_progress = clock::now_ns() + PROGRESS_NS;
    while !(sender.is_finished() && receiver.is_finished()) {
        std::thread::sleep(Duration::from_millis(20));
        let now = clock::now_ns();
        if now >= next_progress {
            next_progress = now + PROGRESS_NS;
            let live = stats.lock().map(|s| s.live());
            if let Ok(l) = live {
                progress(&l);
            }
        }
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
