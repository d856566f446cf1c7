//! The rooms server's I/O shell: one UDP socket, one forwarding thread, around the
//! sans-IO [`netjam_engine::room::Server`].
//!
//! ```text
//!  recvmmsg (kernel stamps) --> Server::handle_datagram --> Verdict::Forward(dests)
//!        ^                                                        |
//!        |          sendmmsg: each received buffer to its N destinations, no copies
//!        +--------------------------------------------------------+
//!  between batches: Server::handle_timeout when due, control replies (Server::poll_transmit)
//! ```
//!
//! The thread never decodes audio and never copies a forwarded payload. Every
//! destination the core handed out is returned through [`Server::sent`] once its send
//! was tried, so the core's per-destination queue accounting stays true. A send the
//! kernel refuses or that would block is dropped and counted: a forwarding server that
//! waits on one destination delays every other one.
//!
//! The time each forwarded packet spends inside the server (kernel receive stamp to the
//! return of the `sendmmsg` that sent it) is kept in a histogram and reported as
//! p50/p99/p99.9 in [`ServerReport`].
//!
//! Never here: room logic, policing or authentication (the core's), blocking on a
//! destination, allocation per packet.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use netjam_engine::room::msg::MAX_CONTROL_LEN;
use netjam_engine::room::{DestId, MemberStats, Server, ServerConfig, ServerStats, Verdict};

use crate::clock;
use crate::transport::UdpTransport;
use crate::udp_batch::{RecvBatch, SendBatch, Transmit};

/// The port `netjam server` listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 4464;
/// Datagrams taken per `recvmmsg`.
const BATCH: usize = 64;
/// Largest datagram forwarded (a jumbo frame); longer ones are counted and dropped.
const MAX_DATAGRAM: usize = 9_000;
/// How often the shell wakes without traffic, to run the core's timers.
const IDLE_WAKE: Duration = Duration::from_millis(10);
/// How often the published snapshot is refreshed.
const PUBLISH_NS: u64 = 250_000_000;

/// The shell's own counters.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct ShellStats {
    /// Datagrams received.
    pub received: u64,
    /// `recvmmsg` calls that returned datagrams.
    pub batches: u64,
    /// Datagrams longer than the largest forwarded, dropped.
    pub truncated: u64,
    /// Forwarded copies the kernel took.
    pub sent: u64,
    /// Forwarded copies the kernel refused (unreachable destination and the like).
    pub send_failed: u64,
    /// Forwarded copies dropped because the socket's send buffer was full.
    pub send_would_block: u64,
    /// Control replies sent.
    pub control_sent: u64,
    /// Control replies the kernel refused.
    pub control_failed: u64,
}

/// Time inside the server per forwarded packet, from its kernel receive stamp to the
/// return of the system call that sent it.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DelayFigures {
    /// Forwarded packets measured.
    pub packets: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

/// What a running server reports.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ServerReport {
    pub listen: Option<SocketAddr>,
    /// Seconds since the server started.
    pub uptime_s: f64,
    pub server: ServerStats,
    pub shell: ShellStats,
    pub delay: DelayFigures,
    pub members: Vec<MemberStats>,
}

/// A log-scale histogram of nanosecond delays: 8 sub-bins per octave, 0.1 µs .. ~1 s.
#[derive(Debug, Clone)]
struct DelayHistogram {
    bins: [u64; Self::BINS],
    count: u64,
    max_ns: u64,
}

impl DelayHistogram {
    const SUB: u32 = 8;
    const BINS: usize = 8 * 34;

    fn new() -> Self {
        Self {
            bins: [0; Self::BINS],
            count: 0,
            max_ns: 0,
        }
    }

    fn bin(ns: u64) -> usize {
        let v = ns.max(1);
        let octave = 63 - v.leading_zeros();
        // The top three bits below the leading one pick the sub-bin.
        let sub = if octave >= 3 {
            ((v >> (octave - 3)) & 7) as u32
        } else {
            ((v << (3 - octave)) & 7) as u32
        };
        ((octave * Self::SUB + sub) as usize).min(Self::BINS - 1)
    }

    /// The lower edge of a bin, in ns.
    fn edge(bin: usize) -> f64 {
        let octave = (bin as u32) / Self::SUB;
        let sub = (bin as u32) % Self::SUB;
        2f64.powi(octave as i32) * (1.0 + f64::from(sub) / 8.0)
    }

    #[inline]
    fn record(&mut self, ns: u64, n: u64) {
        self.bins[Self::bin(ns)] += n;
        self.count += n;
        self.max_ns = self.max_ns.max(ns);
    }

    fn quantile_us(&self, q: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let want = ((self.count as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &b) in self.bins.iter().enumerate() {
            seen += b;
            if seen >= want {
                // The middle of the bin (an eighth of an octave wide: within 6 %).
                return (Self::edge(i) + Self::edge(i + 1)) / 2.0 / 1e3;
            }
        }
        self.max_ns as f64 / 1e3
    }

    fn figures(&self) -> DelayFigures {
        DelayFigures {
            packets: self.count,
            p50_us: self.quantile_us(0.5),
            p99_us: self.quantile_us(0.99),
            p999_us: self.quantile_us(0.999),
            max_us: self.max_ns as f64 / 1e3,
        }
    }
}

/// A running server: its thread and the latest report.
#[derive(Debug)]
pub struct ServerHandle {
    pub local: SocketAddr,
    stop: Arc<AtomicBool>,
    report: Arc<Mutex<ServerReport>>,
    thread: Option<JoinHandle<anyhow::Result<ServerReport>>>,
}

impl ServerHandle {
    /// The report as of the last refresh (at most a quarter of a second old).
    pub fn report(&self) -> ServerReport {
        self.report.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Whether the forwarding thread has stopped (an error, or [`ServerHandle::stop`]).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().map_or(true, |t| t.is_finished())
    }

    /// Stops the thread and returns its final report.
    pub fn stop(mut self) -> anyhow::Result<ServerReport> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| anyhow::anyhow!("the forwarding thread panicked"))?,
            None => Ok(self.report()),
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A fresh secret for the server's cookies and tokens, from the operating system.
pub fn fresh_secret() -> anyhow::Result<[u8; 32]> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret)
        .map_err(|e| anyhow::anyhow!("no randomness from the operating system: {e}"))?;
    Ok(secret)
}

/// Binds `listen` and starts forwarding.
pub fn spawn(listen: SocketAddr, config: ServerConfig) -> anyhow::Result<ServerHandle> {
    let socket = UdpTransport::bind(listen).with_context(|| {
        format!("cannot listen on {listen}: is another server using it? Pick another with --listen")
    })?;
    socket.set_read_timeout(Some(IDLE_WAKE))?;
    let local = socket.local_addr()?;
    let core = Server::new(config, fresh_secret()?);
    let stop = Arc::new(AtomicBool::new(false));
    let report = Arc::new(Mutex::new(ServerReport {
        listen: Some(local),
        ..ServerReport::default()
    }));
    let thread = {
        let (stop, report) = (stop.clone(), report.clone());
        std::thread::Builder::new()
            .name("netjam-server".into())
            .spawn(move || forward(socket, core, &stop, &report))?
    };
    Ok(ServerHandle {
        local,
        stop,
        report,
        thread: Some(thread),
    })
}

fn forward(
    socket: UdpTransport,
    mut core: Server,
    stop: &AtomicBool,
    published: &Mutex<ServerReport>,
) -> anyhow::Result<ServerReport> {
    crate::rt::promote_current_thread(crate::rt::NETWORK_PRIORITY);
    let local = socket.local_addr().ok();
    let started = clock::now_ns();
    let mut batch = RecvBatch::new(BATCH, MAX_DATAGRAM);
    let mut sender = SendBatch::new(BATCH * 8);
    let fan_out = core.config().max_members_per_room.max(1);
    let mut transmits: Vec<Transmit> = Vec::with_capacity(BATCH * fan_out);
    let mut ids: Vec<DestId> = Vec::with_capacity(BATCH * fan_out);
    // When each payload of the batch arrived, and how many copies of it were sent.
    let mut arrivals: Vec<(u64, u64)> = Vec::with_capacity(BATCH);
    let mut control = vec![0u8; MAX_CONTROL_LEN];
    let mut shell = ShellStats::default();
    let mut delays = DelayHistogram::new();
    let mut next_publish = started;
    let report = |core: &Server, shell: &ShellStats, delays: &DelayHistogram| ServerReport {
        listen: local,
        uptime_s: clock::now_ns().saturating_sub(started) as f64 / 1e9,
        server: core.stats(),
        shell: *shell,
        delay: delays.figures(),
        members: core.member_stats(),
    };
    while !stop.load(Ordering::Relaxed) {
        let n = match batch.recv(&socket) {
            Ok(n) => n,
            Err(e) => {
                // ICMP errors from a member that went away surface here on some systems.
                tracing::debug!("server receive: {e}");
                0
            }
        };
        if n > 0 {
            shell.batches += 1;
            shell.received += n as u64;
        }
        transmits.clear();
        ids.clear();
        arrivals.clear();
        for i in 0..n {
            let d = batch.get(i);
            let copies_before = transmits.len();
            if d.truncated {
                shell.truncated += 1;
            } else if let Verdict::Forward(dests) = core.handle_datagram(d.at_ns, d.from, d.bytes) {
                for dest in dests {
                    transmits.push(Transmit {
                        dst: dest.addr,
                        payload: i,
                    });
                    ids.push(dest.id);
                }
            }
            arrivals.push((d.at_ns, (transmits.len() - copies_before) as u64));
        }
        if !transmits.is_empty() {
            let flushed = sender.flush(&socket, &batch, &transmits);
            let done = clock::now_ns();
            shell.sent += flushed.sent as u64;
            shell.send_failed += flushed.failed as u64;
            shell.send_would_block += (transmits.len() - flushed.sent - flushed.failed) as u64;
            for &id in &ids {
                core.sent(id);
            }
            for &(at, copies) in &arrivals {
                if copies > 0 {
                    delays.record(done.saturating_sub(at), 1);
                }
            }
        }
        let now = clock::now_ns();
        if core.poll_timeout().is_some_and(|t| t <= now) {
            core.handle_timeout(now);
        }
        while let Some((dst, len)) = core.poll_transmit(&mut control) {
            match socket.send_to(&control[..len], dst) {
                Ok(_) => shell.control_sent += 1,
                Err(e) => {
                    tracing::debug!("server reply to {dst}: {e}");
                    shell.control_failed += 1;
                }
            }
        }
        if now >= next_publish {
            next_publish = now + PUBLISH_NS;
            if let Ok(mut r) = published.lock() {
                *r = report(&core, &shell, &delays);
            }
        }
    }
    let last = report(&core, &shell, &delays);
    if let Ok(mut r) = published.lock() {
        *r = last.clone();
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles_land_in_the_right_bin() {
        let mut h = DelayHistogram::new();
        for us in 1..=1000u64 {
            h.record(us * 1000, 1);
        }
        let f = h.figures();
        assert!((470.0..=530.0).contains(&f.p50_us), "{f:?}");
        assert!((930.0..=1060.0).contains(&f.p99_us), "{f:?}");
        assert_eq!(f.max_us, 1000.0);
        assert_eq!(f.packets, 1000);
    }

    #[test]
    fn histogram_bins_are_monotonic() {
        let mut last = 0;
        for ns in (1..10_000_000u64).step_by(997) {
            let b = DelayHistogram::bin(ns);
            assert!(b >= last, "bin of {ns} went back");
            assert!(
                DelayHistogram::edge(b) <= ns as f64 * 1.0001,
                "{ns} below its bin's edge"
            );
            last = b;
        }
    }
}
