//! `impair`'s link emulator: UDP from clients to a forward target and back, through two
//! engine [`LinkModel`]s, each packet released at its delivery time, with scripted link
//! events counted from the first client packet.
//!
//! Two receive threads feed the models and one scheduler thread releases packets, so a
//! burst in one direction never delays the other's releases by a receive. Memory is
//! bounded ([`MAX_IN_FLIGHT`] per direction). Every delay, loss and reordering comes from
//! the engine's sans-IO model; this module never prints.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::Context;
use netjam_engine::link::{LinkConfig, LinkModel, LinkStats};
use serde::Serialize;

use crate::clock;
use crate::link_emulator::EmulatorEvents;
use crate::transport::UdpTransport;

/// Counters of an impair run.
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

/// Most packets the emulator holds per direction; beyond this it drops, so a flood into a
/// long emulated delay cannot grow memory without bound.
pub const MAX_IN_FLIGHT: usize = 65_536;

struct Links {
    up: LinkModel<Vec<u8>>,
    down: LinkModel<(Vec<u8>, SocketAddr)>,
    stats: ImpairStats,
}

/// An impair link emulator running in background threads.
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

    /// Stop and return the counters.
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

/// Start carrying traffic from `listen` to `forward` through links `up` and `down`.
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
