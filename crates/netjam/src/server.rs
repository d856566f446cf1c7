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
//! An ensemble's clock probe from a member ([`Verdict::ClockProbe`]) is answered at once
//! with the machine's `CLOCK_MONOTONIC` (its kernel receive stamp as t2, the time of the
//! answer as t3): the server is the clock reference of every ensemble in its rooms. The
//! answer is written into a buffer on the stack; nothing is allocated for it.
//!
//! With a room directory ([`spawn_with_directory`]), the core's requests go to the
//! directory thread ([`crate::room_directory`]) over a channel and its answers are taken
//! between batches with `try_recv`: the forwarding thread never waits for Redis. The
//! directory thread wakes it with an empty datagram after each answer (no player sends
//! one; it is counted as `wakes` and not handed to the core).
//!
//! Never here: room logic, policing or authentication (the core's), blocking on a
//! destination or on the directory, allocation per packet.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use netjam_engine::room::msg::MAX_ENS_LEN;
use netjam_engine::room::secure::{fingerprint, SecureStats, StaticKey};
use netjam_engine::room::{DestId, MemberStats, Server, ServerConfig, ServerStats, Verdict};
use netjam_ensemble::clock::{ClockServer, ProbeRequest, PONG_LEN};

use crate::clock;
use crate::transport::UdpTransport;
use crate::udp_batch::{RecvBatch, SendBatch, Transmit};

/// The port `netjam server` listens on unless told otherwise.
pub const DEFAULT_PORT: u16 = 4464;
/// Datagrams taken per `recvmmsg` (see [`ShellConfig`]).
const BATCH: usize = 64;
/// Pending copies that trigger a `sendmmsg` (see [`ShellConfig`] for why this value).
const FLUSH_AFTER: usize = 64;
/// Largest datagram forwarded (a jumbo frame); longer ones are counted and dropped.
const MAX_DATAGRAM: usize = 9_000;
/// How often the shell wakes without traffic, to run the core's timers.
const IDLE_WAKE: Duration = Duration::from_millis(10);
/// How often the published snapshot is refreshed.
const PUBLISH_NS: u64 = 250_000_000;
/// A gap between two passes of the loop longer than this (they come at least every
/// [`IDLE_WAKE`]) is time the process did not run: stopped, a machine that hung or was
/// suspended. The core is told, so that its members are not dropped for its own silence.
const STALL_NS: u64 = 1_000_000_000;

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
    /// Ensemble clock probes answered.
    pub clock_answered: u64,
    /// Empty datagrams taken as a wake-up (the directory thread's, after an answer) and
    /// not handed to the core.
    pub wakes: u64,
    /// Times the forwarding thread did not run for more than a second (stopped, or a
    /// machine that hung).
    pub stalls: u64,
    /// How long those stalls lasted in all, in seconds.
    pub stalled_s: f64,
    /// CPU time the forwarding thread has used, in seconds (0 where the system does not say).
    pub cpu_s: f64,
    /// The CPU the forwarding thread is pinned to, if it asked and the system allowed it.
    pub pinned_cpu: Option<usize>,
    /// Its `SCHED_FIFO` priority, if it got realtime scheduling.
    pub realtime_priority: Option<i32>,
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
    /// The control channel: handshakes, messages opened, and what was refused (altered,
    /// replayed, from an address with no session).
    pub channel: Option<SecureStats>,
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

/// Where the forwarding thread publishes its report: an `Arc` swapped under a lock that
/// readers hold only long enough to clone the `Arc`, and that the forwarding thread only
/// ever tries (a busy lock postpones its publication to its next pass; it never waits).
type Published = Arc<Mutex<Arc<ServerReport>>>;

/// A reader of a running server's latest report, for another thread (the OSC control
/// thread): cheap to clone, and reading never makes the forwarding thread wait.
#[derive(Debug, Clone)]
pub struct ReportReader(Published);

impl ReportReader {
    /// The report as of the last refresh (at most a quarter of a second old, a little more
    /// while readers keep the lock busy).
    pub fn latest(&self) -> Arc<ServerReport> {
        match self.0.lock() {
            Ok(r) => r.clone(),
            // A panic while holding the lock leaves a whole report behind: keep reading it.
            Err(e) => e.into_inner().clone(),
        }
    }
}

/// A running server: its thread and the latest report.
#[derive(Debug)]
pub struct ServerHandle {
    pub local: SocketAddr,
    /// The fingerprint of the server's static key, which its players pin.
    pub fingerprint: String,
    stop: Arc<AtomicBool>,
    restart: Arc<AtomicBool>,
    report: Published,
    thread: Option<JoinHandle<anyhow::Result<ServerReport>>>,
}

impl ServerHandle {
    /// The report as of the last refresh (at most a quarter of a second old).
    pub fn report(&self) -> ServerReport {
        ServerReport::clone(&self.reader().latest())
    }

    /// A reader of the latest report for another thread.
    pub fn reader(&self) -> ReportReader {
        ReportReader(self.report.clone())
    }

    /// Starts the time-inside-the-server figures afresh (from the forwarding thread's next
    /// pass, within 10 ms): a caller that measures a window, such as a benchmark
    /// after its warm-up, leaves out what came before. Counters are not reset.
    pub fn restart_delay_figures(&self) {
        self.restart.store(true, Ordering::Relaxed);
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

/// How the forwarding thread batches and where it runs. [`ShellConfig::default`] is what
/// `netjam server` ships.
///
/// Batching trades system calls for delay: sending every copy of a received batch in one
/// `sendmmsg` makes the first datagram of the batch, the one that has waited longest,
/// wait further while the core decides the rest and the kernel sends every copy queued
/// before its own (up to 64 datagrams × the fan-out). `flush_after` bounds that wait:
/// once that many copies are pending (checked after each datagram, so a datagram's copies
/// always leave together) they are sent, oldest first.
///
/// Chosen with `cargo bench -p netjam --bench forward -- --batch-sweep` (rooms of 8,
/// 7-way fan-out, loopback, a 2-core machine busy with other builds): a receive batch of
/// 64 sent whole, a receive batch of 16 sent whole, and flushes every 64, 128 or 256
/// copies forwarded the same packets per busy core-second within the run-to-run spread
/// (about 2 %). Where batches form (every member of 5 rooms sending at the same instants)
/// the median time inside the server was about 690 µs sent whole, 620 µs with a
/// receive batch of 16, 480–510 µs flushing every 64 or 128 copies and back at 690 µs
/// every 256. The p99 at 750 packets/s per member was set by the machine's other work in
/// every setting, not by the batch. So the shell keeps a receive batch of 64 (one
/// `recvmmsg` per 64 datagrams when busy) and flushes every 64 copies (9 datagrams of a
/// room of 8): one system call still carries dozens of copies, and no datagram waits for
/// more than about 9 others' copies before its own go out.
#[derive(Debug, Clone)]
pub struct ShellConfig {
    /// Datagrams taken per `recvmmsg` (at least 1).
    pub recv_batch: usize,
    /// Send the pending copies once at least this many are waiting (at least 1;
    /// `usize::MAX`: once per receive batch).
    pub flush_after: usize,
    /// Pin the forwarding thread to this CPU (Linux only; ignored, and reported as not
    /// pinned, where the system refuses). `None`: wherever the scheduler puts it.
    pub cpu: Option<usize>,
    /// `SCHED_FIFO` priority asked for the forwarding thread (see [`crate::rt`]).
    pub priority: i32,
    /// The static key of the control channel (`netjam server` keeps one in a file,
    /// [`crate::keys`]); `None`: a key made for this run.
    pub static_key: Option<StaticKey>,
}

impl Default for ShellConfig {
    fn default() -> Self {
        Self {
            recv_batch: BATCH,
            flush_after: FLUSH_AFTER,
            cpu: None,
            priority: crate::rt::NETWORK_PRIORITY,
            static_key: None,
        }
    }
}

/// Binds `listen` and starts forwarding with the shipped [`ShellConfig`].
pub fn spawn(listen: SocketAddr, config: ServerConfig) -> anyhow::Result<ServerHandle> {
    spawn_with(listen, config, ShellConfig::default())
}

/// Binds `listen` and starts forwarding, batching and scheduled as `shell` says.
pub fn spawn_with(
    listen: SocketAddr,
    config: ServerConfig,
    shell: ShellConfig,
) -> anyhow::Result<ServerHandle> {
    let socket = bind(listen)?;
    spawn_on(socket, config, shell, None)
}

/// Binds `listen` for [`spawn_on`] (a server that must know its port before it starts,
/// to advertise it in a room directory).
pub fn bind(listen: SocketAddr) -> anyhow::Result<UdpTransport> {
    UdpTransport::bind(listen).with_context(|| {
        format!("cannot listen on {listen}: is another server using it? Pick another with --listen")
    })
}

/// Starts forwarding on a bound socket ([`bind`]) with the shipped [`ShellConfig`].
pub fn spawn_on_socket(socket: UdpTransport, config: ServerConfig) -> anyhow::Result<ServerHandle> {
    spawn_on(socket, config, ShellConfig::default(), None)
}

/// Starts forwarding on a bound socket, sharing rooms with other servers through
/// `directory` when given (the core's [`ServerConfig::directory`] is set to match).
pub fn spawn_with_directory(
    socket: UdpTransport,
    config: ServerConfig,
    shell: ShellConfig,
    directory: crate::room_directory::DirectoryLink,
) -> anyhow::Result<ServerHandle> {
    spawn_on(socket, config, shell, Some(directory))
}

/// Starts forwarding on a bound socket, batching, scheduled and keyed as `shell` says,
/// sharing rooms through `directory` when given.
pub fn spawn_on(
    socket: UdpTransport,
    mut config: ServerConfig,
    shell: ShellConfig,
    directory: Option<crate::room_directory::DirectoryLink>,
) -> anyhow::Result<ServerHandle> {
    config.directory = directory.is_some();
    socket.set_read_timeout(Some(IDLE_WAKE))?;
    let local = socket.local_addr()?;
    let mut core = Server::new(config, fresh_secret()?);
    let key = match shell.static_key.clone() {
        Some(k) => k,
        None => StaticKey::generate().map_err(|e| anyhow::anyhow!("cannot make a server key: {e}"))?,
    };
    let fingerprint = fingerprint(key.public());
    core.set_static_key(key);
    let stop = Arc::new(AtomicBool::new(false));
    let restart = Arc::new(AtomicBool::new(false));
    let report = Arc::new(Mutex::new(Arc::new(ServerReport {
        listen: Some(local),
        ..ServerReport::default()
    })));
    let thread = {
        let (stop, restart, report) = (stop.clone(), restart.clone(), report.clone());
        std::thread::Builder::new()
            .name("netjam-server".into())
            .spawn(move || forward(socket, core, &shell, directory.as_ref(), &stop, &restart, &report))?
    };
    Ok(ServerHandle {
        local,
        fingerprint,
        stop,
        restart,
        report,
        thread: Some(thread),
    })
}

/// Copies waiting for `sendmmsg`, with what is needed to account for them once sent.
struct Pending {
    transmits: Vec<Transmit>,
    ids: Vec<DestId>,
    /// Receive stamps of the datagrams whose copies are pending.
    arrivals: Vec<u64>,
}

impl Pending {
    fn with_capacity(copies: usize, datagrams: usize) -> Self {
        Self {
            transmits: Vec::with_capacity(copies),
            ids: Vec::with_capacity(copies),
            arrivals: Vec::with_capacity(datagrams),
        }
    }

    /// Sends every pending copy, returns their queue slots to the core, and records each
    /// datagram's time inside the server (its stamp to the return of the last send).
    fn flush(
        &mut self,
        socket: &UdpTransport,
        sender: &mut SendBatch,
        batch: &RecvBatch,
        core: &mut Server,
        shell: &mut ShellStats,
        delays: &mut DelayHistogram,
    ) {
        if self.transmits.is_empty() {
            return;
        }
        let flushed = sender.flush(socket, batch, &self.transmits);
        let done = clock::now_ns();
        shell.sent += flushed.sent as u64;
        shell.send_failed += flushed.failed as u64;
        shell.send_would_block += (self.transmits.len() - flushed.sent - flushed.failed) as u64;
        for &id in &self.ids {
            core.sent(id);
        }
        for &at in &self.arrivals {
            delays.record(done.saturating_sub(at), 1);
        }
        self.transmits.clear();
        self.ids.clear();
        self.arrivals.clear();
    }
}

fn forward(
    socket: UdpTransport,
    mut core: Server,
    cfg: &ShellConfig,
    directory: Option<&crate::room_directory::DirectoryLink>,
    stop: &AtomicBool,
    restart: &AtomicBool,
    published: &Mutex<Arc<ServerReport>>,
) -> anyhow::Result<ServerReport> {
    let mut shell = ShellStats {
        pinned_cpu: cfg.cpu.filter(|&c| crate::rt::pin_current_thread(c)),
        ..ShellStats::default()
    };
    if let crate::rt::RtStatus::Realtime { priority } = crate::rt::promote_current_thread(cfg.priority) {
        shell.realtime_priority = Some(priority);
    }
    let local = socket.local_addr().ok();
    let started = clock::now_ns();
    let cpu_start = crate::rt::thread_cpu_ns();
    let recv_batch = cfg.recv_batch.max(1);
    let flush_after = cfg.flush_after.max(1);
    let mut batch = RecvBatch::new(recv_batch, MAX_DATAGRAM);
    let fan_out = core.config().max_members_per_room.max(1);
    // A datagram's copies always leave together, so one flush holds at most
    // `flush_after - 1 + fan_out` copies, and never more than a whole batch's.
    let most = (flush_after.saturating_add(fan_out)).min(recv_batch * fan_out);
    let mut sender = SendBatch::new(most);
    let mut pending = Pending::with_capacity(most, recv_batch);
    // Control replies and relayed ensemble datagrams (the largest message of the protocol).
    let mut control = vec![0u8; MAX_ENS_LEN];
    let mut clock_server = ClockServer::new();
    // Receive stamps are on the process clock; the ensemble clock is CLOCK_MONOTONIC.
    let mono_offset = crate::ensemble::mono_ns() as i64 - clock::now_ns() as i64;
    let mut delays = DelayHistogram::new();
    let mut next_publish = started;
    let report = |core: &Server, shell: &ShellStats, delays: &DelayHistogram| {
        let mut shell = *shell;
        shell.cpu_s = crate::rt::thread_cpu_ns()
            .zip(cpu_start)
            .map_or(0.0, |(now, then)| now.saturating_sub(then) as f64 / 1e9);
        ServerReport {
            listen: local,
            uptime_s: clock::now_ns().saturating_sub(started) as f64 / 1e9,
            server: core.stats(),
            shell,
            delay: delays.figures(),
            members: core.member_stats(),
            channel: core.secure_stats(),
        }
    };
    let mut last_pass = clock::now_ns();
    while !stop.load(Ordering::Relaxed) {
        if restart.load(Ordering::Relaxed) {
            restart.store(false, Ordering::Relaxed);
            delays = DelayHistogram::new();
        }
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
        for i in 0..n {
            let d = batch.get(i);
            if d.truncated {
                shell.truncated += 1;
                continue;
            }
            if d.bytes.is_empty() {
                // A wake-up: what woke the thread is taken below, after the batch.
                shell.wakes += 1;
                continue;
            }
            // Drops are counted by the core, per member and per cause; nothing is logged per
            // packet (a flood must not turn into a flood of log lines).
            let verdict = core.handle_datagram(d.at_ns, d.from, d.bytes);
            if matches!(verdict, Verdict::ClockProbe) {
                if let Ok(req) = ProbeRequest::decode(d.bytes) {
                    let received = (d.at_ns as i64 + mono_offset).max(0) as u64;
                    let reply = clock_server.answer_at(received, crate::ensemble::mono_ns(), &req);
                    let mut buf = [0u8; PONG_LEN];
                    if let Ok(n) = reply.encode(&mut buf) {
                        if socket.send_to(&buf[..n], d.from).is_ok() {
                            shell.clock_answered += 1;
                        }
                    }
                }
                continue;
            }
            if let Verdict::Forward(dests) = verdict {
                if dests.is_empty() {
                    continue;
                }
                for dest in dests {
                    pending.transmits.push(Transmit {
                        dst: dest.addr,
                        payload: i,
                    });
                    pending.ids.push(dest.id);
                }
                pending.arrivals.push(d.at_ns);
                if pending.transmits.len() >= flush_after {
                    pending.flush(&socket, &mut sender, &batch, &mut core, &mut shell, &mut delays);
                }
            }
        }
        pending.flush(&socket, &mut sender, &batch, &mut core, &mut shell, &mut delays);
        let now = clock::now_ns();
        let gap = now.saturating_sub(last_pass);
        last_pass = now;
        if gap > STALL_NS {
            shell.stalls += 1;
            shell.stalled_s += gap as f64 / 1e9;
            tracing::warn!(
                "the server did not run for {:.1} s (stopped, or its machine hung): its players keep their seats",
                gap as f64 / 1e9
            );
            core.stalled(now, gap);
        }
        if core.poll_timeout().is_some_and(|t| t <= now) {
            core.handle_timeout(now);
        }
        if let Some(d) = directory {
            while let Ok((room, placement)) = d.answers.try_recv() {
                core.placed(now, &room, placement);
            }
            while let Ok(listing) = d.listings.try_recv() {
                core.set_listing(listing);
            }
            while let Some(r) = core.poll_directory() {
                // An unbounded channel: sending never waits (a gone thread is said by
                // the command line, which watches it).
                let _ = d.requests.send(r);
            }
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
            // A lock a reader holds is tried again on the next pass (within the idle
            // wake), never waited for.
            if let Ok(mut r) = published.try_lock() {
                *r = Arc::new(report(&core, &shell, &delays));
                next_publish = now + PUBLISH_NS;
            }
        }
    }
    let last = report(&core, &shell, &delays);
    if let Ok(mut r) = published.lock() {
        *r = Arc::new(last.clone());
    }
    Ok(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shell that flushes after every datagram and takes 4 per `recvmmsg` still sends
    /// every copy, never back to its sender, and times every forwarded datagram.
    #[test]
    fn a_small_batch_and_flush_forward_every_copy() {
        use crate::room_client::{join, JoinRequest};
        crate::rt::disable();
        let shell = ShellConfig {
            recv_batch: 4,
            flush_after: 1,
            ..ShellConfig::default()
        };
        let server = spawn_with("127.0.0.1:0".parse().unwrap(), ServerConfig::default(), shell).unwrap();
        const MEMBERS: usize = 3;
        const PACKETS: usize = 10;
        let members: Vec<(UdpTransport, u32)> = (0..MEMBERS)
            .map(|i| {
                let s = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
                let seated = join(
                    &s,
                    &JoinRequest {
                        server: server.local,
                        room: "batch".into(),
                        name: format!("m{i}"),
                        password: String::new(),
                        room_key: None,
                        ssrc: 7,
                        packets_per_s: 750,
                        bytes_per_s: 750 * 300,
                        timeout: Duration::from_secs(10),
                        hosts: Vec::new(),
                        sample_rate: 0,
                        also: Vec::new(),
                        known: crate::keys::KnownServers::from_env(),
                        setup: Default::default(),
                    },
                )
                .unwrap();
                (s, seated.ssrc)
            })
            .collect();
        for (s, ssrc) in &members {
            for seq in 0..PACKETS as u16 {
                let mut p = [0u8; 40];
                p[0] = 0x80;
                p[1] = 96;
                p[2..4].copy_from_slice(&seq.to_be_bytes());
                p[8..12].copy_from_slice(&ssrc.to_be_bytes());
                s.send_to(&p, server.local).unwrap();
            }
        }
        for (s, own) in &members {
            s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let mut heard = 0;
            let mut buf = [0u8; 2048];
            while heard < (MEMBERS - 1) * PACKETS && std::time::Instant::now() < deadline {
                if let Ok(Some(got)) = s.recv(&mut buf) {
                    if got.len >= 12 && buf[0] == 0x80 {
                        assert_ne!(&buf[8..12], &own.to_be_bytes(), "a member heard itself");
                        heard += 1;
                    }
                }
            }
            assert_eq!(
                heard,
                (MEMBERS - 1) * PACKETS,
                "copies heard by the member sending {own}"
            );
        }
        let r = server.stop().unwrap();
        assert_eq!(
            r.shell.sent,
            (MEMBERS * (MEMBERS - 1) * PACKETS) as u64,
            "{:?}",
            r.shell
        );
        assert_eq!(r.delay.packets, (MEMBERS * PACKETS) as u64, "{:?}", r.delay);
    }

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
