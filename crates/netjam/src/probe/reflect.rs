//! The reflector loop: echo audio and probe packets back to their sender.
//!
//! A thin shell around the engine's [`Reflector`]: one socket, one thread, kernel receive
//! timestamps where the platform has them. It reads a datagram, asks the reflector what to
//! do, and sends the answer (if any) straight back. All the rules — tokens, rate limits,
//! replay windows, never replying with more bytes than arrived — live in the engine; this
//! module decides nothing about a packet itself, and never prints.

use std::io::Read;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use netjam_engine::probe::{Action, ProbeKey, Reflector, ReflectorConfig, ReflectorStats};

use crate::clock;
use crate::transport::{TimestampSource, UdpTransport};

/// Random bytes for the token secret, from the OS.
pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut out = [0u8; N];
    let from_os = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut out));
    if from_os.is_err() {
        // No /dev/urandom: fall back on the randomly keyed std hasher.
        use std::hash::{BuildHasher, Hasher};
        for (i, chunk) in out.chunks_mut(8).enumerate() {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(i as u64 ^ clock::now_ns());
            let v = h.finish().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
    out
}

/// Serve on `transport` until `stop` is set or the monotonic time passes `deadline_ns`.
/// `tick` is called about once a second with the counters.
pub fn serve(
    transport: &UdpTransport,
    reflector: &mut Reflector,
    stop: &AtomicBool,
    deadline_ns: Option<u64>,
    mut tick: impl FnMut(&ReflectorStats),
) -> anyhow::Result<ReflectorStats> {
    transport
        .set_read_timeout(Some(Duration::from_millis(50)))
        .context("setting the socket's read timeout")?;
    let mut buf = vec![0u8; 65_536];
    let mut next_tick = clock::now_ns() + 1_000_000_000;
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let now = clock::now_ns();
        if deadline_ns.is_some_and(|d| now >= d) {
            break;
        }
        if now >= next_tick {
            tick(&reflector.stats());
            next_tick = now + 1_000_000_000;
        }
        let rx = match transport.recv(&mut buf) {
            Ok(Some(rx)) => rx,
            Ok(None) => continue,
            // A datagram error (e.g. an ICMP error queued on the socket) is not fatal.
            Err(e) => {
                tracing::debug!("receive error: {e}");
                continue;
            }
        };
        let kernel = rx.source == TimestampSource::Kernel;
        let now = clock::now_ns();
        if let Action::Reply { len } = reflector.handle(now, rx.at_ns, kernel, rx.from, &mut buf, rx.len) {
            if let Err(e) = transport.send_to(&buf[..len], rx.from) {
                tracing::debug!("send to {} failed: {e}", rx.from);
            }
        }
    }
    Ok(reflector.stats())
}

/// A reflector running on its own thread (for tests and benchmarks).
#[derive(Debug)]
pub struct ReflectorHandle {
    addr: SocketAddr,
    timestamps: TimestampSource,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<anyhow::Result<ReflectorStats>>,
}

impl ReflectorHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn timestamp_source(&self) -> TimestampSource {
        self.timestamps
    }

    /// Stop the reflector and return its counters.
    pub fn stop(self) -> anyhow::Result<ReflectorStats> {
        self.stop.store(true, Ordering::Relaxed);
        match self.thread.join() {
            Ok(r) => r,
            Err(_) => anyhow::bail!("reflector thread panicked"),
        }
    }
}

/// Start a reflector on `listen` in a background thread.
pub fn spawn(
    listen: SocketAddr,
    config: ReflectorConfig,
    secret: Option<&str>,
) -> anyhow::Result<ReflectorHandle> {
    let transport = UdpTransport::bind(listen).with_context(|| format!("binding {listen}"))?;
    let addr = transport.local_addr()?;
    let timestamps = transport.timestamp_source();
    let key = secret.map(|s| ProbeKey::new(s.as_bytes()));
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let thread = std::thread::Builder::new()
        .name("netjam-reflect".into())
        .spawn(move || {
            let mut reflector = Reflector::new(config, random_bytes(), key);
            serve(&transport, &mut reflector, &stop2, None, |_| {})
        })?;
    Ok(ReflectorHandle {
        addr,
        timestamps,
        stop,
        thread,
    })
}
