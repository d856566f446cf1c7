//! [`LinkEmulator`]: carries UDP traffic through an emulated path, on one socket and one
//! thread (the demo and the loopback benchmarks run it in process).
//!
//! Datagrams from a client arriving at the emulator's socket go to `forward` through the
//! "up" [`LinkModel`]; datagrams coming back from `forward` go to the client that last
//! sent, through the "down" model. The emulator holds each packet until the model's delivery
//! time, waking on absolute deadlines (the last stretch spun) so the emulated delay is
//! what reaches the wire. Scripted link events ([`EmulatorEvents`]) count from the first
//! packet a client sends, in both directions. It never decides anything itself: every
//! delay, loss and reordering comes from the engine's sans-IO [`LinkModel`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use netjam_engine::link::{LinkConfig, LinkModel, LinkSchedule, LinkStats};

use crate::clock;
use crate::transport::UdpTransport;

/// One direction's counters and the delay its packets actually had inside the emulator.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct DirectionStats {
    pub link: LinkStats,
    /// Mean and max of (sent on − received), ms.
    pub delay_mean_ms: f64,
    pub delay_max_ms: f64,
    #[serde(skip)]
    delay_sum_ns: u128,
    #[serde(skip)]
    delay_count: u64,
}

/// Both directions.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct EmulatorStats {
    pub up: DirectionStats,
    pub down: DirectionStats,
}

/// Scripted events of each direction (`up`: from the client).
#[derive(Debug, Clone, Default)]
pub struct EmulatorEvents {
    pub up: LinkSchedule,
    pub down: LinkSchedule,
}

/// A running emulator; stops when dropped or [`LinkEmulator::stop`]ped.
#[derive(Debug)]
pub struct LinkEmulator {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    stats: Arc<Mutex<EmulatorStats>>,
    thread: Option<JoinHandle<()>>,
}

type Held = (u64, Vec<u8>);

impl LinkEmulator {
    /// Bind `listen` and carry traffic to and from `forward` through `up` and `down`, with `events`.
    pub fn start(
        listen: SocketAddr,
        forward: SocketAddr,
        up: LinkConfig,
        down: LinkConfig,
        events: EmulatorEvents,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let socket = UdpTransport::bind(listen)?;
        let local = socket.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(EmulatorStats::default()));
        let thread = {
            let (stop, stats) = (stop.clone(), stats.clone());
            std::thread::Builder::new()
                .name("netjam-link".into())
                .spawn(move || {
                    let mut up: LinkModel<Held> = LinkModel::new(up, seed).with_schedule(events.up);
                    let mut down: LinkModel<Held> =
                        LinkModel::new(down, seed.wrapping_add(1)).with_schedule(events.down);
                    let mut client: Option<SocketAddr> = None;
                    let mut buf = vec![0u8; 65_536];
                    let mut local_stats = EmulatorStats::default();
                    let mut last_publish = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let now = clock::now_ns();
                        while let Some((_, (recv_at, bytes))) = up.poll(now) {
                            let _ = socket.send_to(&bytes, forward);
                            note(&mut local_stats.up, recv_at, clock::now_ns());
                        }
                        if let Some(c) = client {
                            while let Some((_, (recv_at, bytes))) = down.poll(now) {
                                let _ = socket.send_to(&bytes, c);
                                note(&mut local_stats.down, recv_at, clock::now_ns());
                            }
                        }
                        let next = up.next_delivery().into_iter().chain(down.next_delivery()).min();
                        let wait = next.map_or(20_000_000, |n| n.saturating_sub(now)).min(20_000_000);
                        if wait < 300_000 {
                            if let Some(n) = next {
                                clock::sleep_until_ns(n);
                            }
                            continue;
                        }
                        let _ = socket.set_read_timeout(Some(Duration::from_nanos(wait - 200_000)));
                        if let Ok(Some(r)) = socket.recv(&mut buf) {
                            let data = buf[..r.len].to_vec();
                            if r.from == forward {
                                down.send(r.at_ns, (r.at_ns, data), r.len);
                            } else {
                                client = Some(r.from);
                                if up.event_origin().is_none() {
                                    up.set_event_origin(r.at_ns);
                                    down.set_event_origin(r.at_ns);
                                }
                                up.send(r.at_ns, (r.at_ns, data), r.len);
                            }
                        }
                        if now >= last_publish + 100_000_000 {
                            last_publish = now;
                            local_stats.up.link = up.stats();
                            local_stats.down.link = down.stats();
                            if let Ok(mut s) = stats.lock() {
                                *s = local_stats;
                            }
                        }
                    }
                    local_stats.up.link = up.stats();
                    local_stats.down.link = down.stats();
                    if let Ok(mut s) = stats.lock() {
                        *s = local_stats;
                    }
                })?
        };
        Ok(Self {
            local,
            stop,
            stats,
            thread: Some(thread),
        })
    }

    /// The address clients send to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn stats(&self) -> EmulatorStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Stop and return the final counters.
    pub fn stop(mut self) -> EmulatorStats {
        self.halt();
        self.stats()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for LinkEmulator {
    fn drop(&mut self) {
        self.halt();
    }
}

fn note(d: &mut DirectionStats, recv_at: u64, sent_at: u64) {
    let delay = sent_at.saturating_sub(recv_at);
    d.delay_sum_ns += delay as u128;
    d.delay_count += 1;
    d.delay_mean_ms = d.delay_sum_ns as f64 / d.delay_count as f64 / 1e6;
    d.delay_max_ms = d.delay_max_ms.max(delay as f64 / 1e6);
}
