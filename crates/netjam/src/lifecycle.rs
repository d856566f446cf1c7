//! The life of a running stream, from its network threads to its final counters.
//!
//! `send`, `recv` and `jam` all run the same way: the network threads ([`NetIo`]) around a
//! socket, an audio thread running an [`Endpoint`] with a [`Process`], snapshots handed to
//! the caller while it runs, and an orderly stop (the audio thread first, a last RTCP BYE,
//! then the network threads once they have flushed). [`Running`] is that sequence, so the
//! command line, a future `jam --server` and the tests start and stop a stream the same
//! way. Also here: what a stream says about who sends it ([`cname`], [`fresh_seed`],
//! [`wall_offset_ns`]).
//!
//! This module never prints and never parses flags: it reports through callbacks and
//! return values, and the caller decides what the user sees.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use netjam_engine::receiver::Receiver;
use netjam_engine::wire::AudioFormat;

use crate::clock;
use crate::endpoint::{Endpoint, PeriodStats, Process, StopReason};
use crate::session::{spawn_audio, AudioLink, NetIo, Snapshot, MAX_DATAGRAM};

/// How often [`Running::watch`] looks for snapshots.
const WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// How long the send thread gets to send a last BYE before the network threads stop.
const BYE_GRACE: Duration = Duration::from_millis(20);

/// Unix time minus the monotonic clock, in ns.
pub fn wall_offset_ns() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    unix - clock::now_ns() as i64
}

/// A seed that differs between runs (for SSRCs and RTCP timing).
pub fn fresh_seed() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ ((std::process::id() as u64) << 32)
}

/// RTCP CNAME: user@host.
pub fn cname() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "netjam".into());
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    format!("{user}@{host}")
}

/// The wildcard address of the same family as `peer`, port 0.
pub fn any_for(peer: SocketAddr) -> SocketAddr {
    if peer.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    }
}

/// Feed `receiver` the datagrams arriving on `link` until a stream shows its format (or it
/// was given), `stop` is set (then `None`), polling every 2 ms. `on_unknown_format` is
/// called once if RTP arrives that does not say its format. Returns the format and when the
/// first packet of that stream arrived.
pub fn await_format(
    receiver: &mut Receiver,
    link: &mut AudioLink,
    stop: &AtomicBool,
    mut on_unknown_format: impl FnMut(),
) -> Option<(AudioFormat, Option<u64>)> {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut hinted = false;
    let mut first_at = None;
    loop {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        while let Some((at, kind, len)) = link.from_net.pop(&mut buf) {
            receiver.on_packet(at, kind, &buf[..len]);
            if receiver.output_format().is_some() {
                first_at.get_or_insert(at);
            }
        }
        if let Some(f) = receiver.output_format() {
            return Some((f, first_at));
        }
        if receiver.stats().unknown_format > 0 && !hinted {
            hinted = true;
            on_unknown_format();
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The audio thread's result: the process back, why the endpoint stopped, its periods.
type AudioResult<P> = anyhow::Result<(P, StopReason, PeriodStats)>;

/// A stream running: its network threads and its audio thread.
#[derive(Debug)]
pub struct Running<P> {
    io: NetIo,
    audio: JoinHandle<AudioResult<P>>,
}

/// A stream that has stopped.
#[derive(Debug)]
pub struct Stopped<P> {
    /// The process, with its final counters.
    pub process: P,
    pub periods: PeriodStats,
    /// Datagrams dropped because the ring to the audio thread was full.
    pub rx_overflow: u64,
}

impl<P: Process + 'static> Running<P> {
    /// Run `endpoint` with `process` on an audio thread named `name`, beside the network
    /// threads `io`, until the endpoint ends or `stop` is set.
    pub fn start(
        name: &str,
        io: NetIo,
        endpoint: Box<dyn Endpoint>,
        process: P,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<Self> {
        let audio = spawn_audio(name, endpoint, process, stop)?;
        Ok(Self { io, audio })
    }

    /// The address the network threads send from and listen on.
    pub fn local_addr(&self) -> SocketAddr {
        self.io.local
    }

    /// Until the audio thread ends, hand every snapshot from `snaps` to `on_snapshot`
    /// (looking about ten times a second).
    pub fn watch<S>(&self, snaps: &mut rtrb::Consumer<Snapshot<S>>, on_snapshot: impl FnMut(Snapshot<S>)) {
        self.watch_every(WATCH_INTERVAL, snaps, on_snapshot);
    }

    /// As [`Running::watch`], looking every `interval` (a page's meters want each
    /// snapshot as it comes).
    pub fn watch_every<S>(
        &self,
        interval: Duration,
        snaps: &mut rtrb::Consumer<Snapshot<S>>,
        mut on_snapshot: impl FnMut(Snapshot<S>),
    ) {
        while !self.audio.is_finished() {
            std::thread::sleep(interval);
            while let Ok(s) = snaps.pop() {
                on_snapshot(s);
            }
        }
    }

    /// Join the audio thread and stop the network threads.
    pub fn stop(self) -> anyhow::Result<Stopped<P>> {
        self.stop_with(None::<fn(&mut P, u64)>)
    }

    /// Join the audio thread, let `bye` queue its last packets (an RTCP BYE) at the time
    /// now, give the send thread a moment to send them, and stop the network threads.
    pub fn stop_with_bye(self, bye: impl FnOnce(&mut P, u64)) -> anyhow::Result<Stopped<P>> {
        self.stop_with(Some(bye))
    }

    fn stop_with(self, bye: Option<impl FnOnce(&mut P, u64)>) -> anyhow::Result<Stopped<P>> {
        let (mut process, _, periods) = self
            .audio
            .join()
            .map_err(|_| anyhow::anyhow!("the audio thread panicked"))??;
        if let Some(bye) = bye {
            bye(&mut process, clock::now_ns());
            std::thread::sleep(BYE_GRACE);
        }
        let rx_overflow = self.io.rx_overflow.load(Ordering::Relaxed);
        self.io.shutdown();
        Ok(Stopped {
            process,
            periods,
            rx_overflow,
        })
    }
}
