//! Forwarding benchmark for the rooms server: how many packets one core forwards, and how
//! long each packet spends inside the forwarder, for netjam's server next to a bare
//! batched forwarder in the same run; prints its figures and one table comparing them.
//!
//! A load generator (its own thread and one socket per member, on loopback) plays R rooms
//! of 8 members, each sending 276-byte RTP packets (a send timestamp inside) at 750
//! packets/s, or as fast as it can for the throughput run. Two forwarders take that load
//! in turn, each on one socket pinned to core 1:
//!
//! * **the bare forwarder**, the machine's limit: `recvmmsg` a batch (kernel receive
//!   stamps), look each source up in a static table of rooms known in advance, `sendmmsg`
//!   each packet to the 7 other members of its room through `netjam::udp_batch`. Nothing
//!   else: no join, no policing. What decides where a packet goes is a [`ForwardCore`],
//!   so another core plugs into the same shell with one `measure_core` line.
//! * **netjam's server** as it ships: `netjam::server::spawn_with` (the shell `netjam
//!   server` runs, only pinned to core 1). Every member first joins through the room
//!   protocol: its socket runs a `RoomClient` handshake (hello, challenge, join, welcome,
//!   roster acknowledgements) against the server until it holds a seat and has heard of
//!   its 7 room-mates, then sends its media with the SSRC the welcome assigned. Media
//!   counts as liveness, so no keep-alives are needed while it runs. Its figures come
//!   from the server's own `ServerReport` (counters, thread CPU time, time inside).
//!
//! The delay is taken inside the forwarder: from the kernel's receive stamp (so the wait
//! in the socket's queue counts) to the return of the `sendmmsg` carrying the packet's
//! last copy. The bare forwarder's histogram has about 3 % resolution, the server's 6 %.
//!
//! Runs (each after a one-second warm-up, which the figures leave out):
//! 1. realistic load: R rooms × 8 members × 750 packets/s, bare and server;
//! 2. the same with one member sending 50× its declared rate, server (with `--flood`
//!    also bare, which cannot police: the flood goes through to its room);
//! 3. throughput: every member sends as fast as the generator can (the server's members
//!    declare a rate above that, so the server forwards rather than polices), bare and
//!    server.
//!
//! Then the comparison table: packets per busy core-second flat out (the goal is the
//! server at ≥ 80 % of the bare forwarder), p50/p99/p99.9 at the realistic load, and the
//! others' p99 with and without the flood. `--batch-sweep` runs instead the server with
//! other receive batches and send flush sizes (`ShellConfig`), at the realistic load, at
//! the same load with every member sending at the same instants, and flat out, to choose the shipped setting (about 150 s).
//!
//! `cargo bench -p netjam --bench forward [-- --seconds S --rooms R --flood
//! --only bare|server --batch-sweep]`, or the environment variables
//! `NETJAM_FWD_SECONDS`, `NETJAM_FWD_ROOMS`, `NETJAM_FWD_FLOOD=1`. Defaults: 5 s per run,
//! 5 rooms (30,000 packets/s in, 210,000 out: a load a loaded 2-core machine holds; 10
//! rooms is 60,000 in, 420,000 out). The default takes about 35 s. A run where the
//! forwarder could not keep up says so.
//!
//! The forwarders and the paced generator ask for `SCHED_FIFO` as netjam's network
//! threads do (the flat-out generator does not, so it cannot lock the machine out).
//!
//! The generator is pinned to core 0 and the forwarder to core 1 where the system allows
//! it. On a 2-core machine they share the machine with each other's kernel work (loopback
//! delivers a packet in the sender's context, so the forwarder's core also pays for
//! delivering every copy into the members' sockets) and with anything else that runs.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use netjam::clock;
use netjam::rt::RtStatus;
use netjam::server::{ServerReport, ShellConfig};
use netjam::transport::UdpTransport;
use netjam::udp_batch::{RecvBatch, SendBatch, Transmit};
use netjam_engine::room::msg::MAX_CONTROL_LEN;
use netjam_engine::room::{ClientConfig, RoomClient, RoomEvent, RosterKind, ServerConfig};

const MEMBERS_PER_ROOM: usize = 8;
const PACKET_BYTES: usize = 276;
const MEMBER_PPS: u64 = 750;
const FLOOD_FACTOR: u64 = 50;
const RECV_BATCH: usize = 64;
const WARMUP: Duration = Duration::from_secs(1);
/// The rate members declare for the flat-out run: above what the generator reaches, so
/// the server's token buckets let everything through and the run measures forwarding.
const FLAT_DECLARED_PPS: u32 = 50_000;
/// How long the members may take to join and hear of each other.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// What decides where a forwarded packet goes: the only part that differs between
/// cores plugged into the bench's own shell.
trait ForwardCore: Send + 'static {
    /// A datagram arrived from `src` (kernel receive stamp `now_ns`, on the
    /// `clock::now_ns` scale). The core may rewrite `bytes` in place and pushes every
    /// destination the datagram must go to onto `dsts` (empty on entry).
    fn on_datagram(&mut self, now_ns: u64, src: SocketAddr, bytes: &mut [u8], dsts: &mut Vec<SocketAddr>);
}

/// The bare forwarder's core: rooms known statically, every packet to the room's others.
struct StaticRooms {
    member_room: HashMap<SocketAddr, usize>,
    rooms: Vec<Vec<SocketAddr>>,
}

impl StaticRooms {
    fn new(rooms: &[Vec<SocketAddr>]) -> Self {
        let member_room = rooms
            .iter()
            .enumerate()
            .flat_map(|(r, members)| members.iter().map(move |m| (*m, r)))
            .collect();
        Self {
            member_room,
            rooms: rooms.to_vec(),
        }
    }
}

impl ForwardCore for StaticRooms {
    fn on_datagram(&mut self, _now_ns: u64, src: SocketAddr, _bytes: &mut [u8], dsts: &mut Vec<SocketAddr>) {
        if let Some(&room) = self.member_room.get(&src) {
            dsts.extend(self.rooms[room].iter().filter(|m| **m != src));
        }
    }
}

/// Log-linear histogram of nanosecond values: exact below 64 ns, then 32 steps per
/// power of two (about 3 % resolution). Fixed size, no allocation when recording.
struct Histogram {
    counts: Vec<u64>,
    total: u64,
    max: u64,
}

impl Histogram {
    const SUB: u32 = 32;

    fn new() -> Self {
        Self {
            counts: vec![0; 64 + 58 * Self::SUB as usize + Self::SUB as usize],
            total: 0,
            max: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < 64 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= 6
        let sub = (v >> (e - 5)) & (Self::SUB as u64 - 1);
        64 + ((e - 6) * Self::SUB) as usize + sub as usize
    }

    /// Upper edge of bucket `i`.
    fn value(i: usize) -> u64 {
        if i < 64 {
            return i as u64;
        }
        let e = (i - 64) as u32 / Self::SUB + 6;
        let sub = (i - 64) as u64 % Self::SUB as u64;
        ((Self::SUB as u64 + sub + 1) << (e - 5)) - 1
    }

    fn record(&mut self, v: u64) {
        self.counts[Self::index(v)] += 1;
        self.total += 1;
        self.max = self.max.max(v);
    }

    fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Self::value(i).min(self.max));
            }
        }
        Some(self.max)
    }
}

/// Phases every thread follows, set by the run.
const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOPPED: u8 = 2;

#[derive(Clone, Copy, PartialEq)]
enum Load {
    /// Every member at `MEMBER_PPS`; with a flooder at `FLOOD_FACTOR` × that.
    Paced { flood: bool },
    /// Every member at `MEMBER_PPS`, all sending at the same instants: a burst of one
    /// packet per member every period, the worst case for batching (sweep only).
    Aligned,
    /// Every member as fast as the generator goes.
    Flat,
}

struct ForwarderReport {
    received: u64,
    sent: u64,
    refused: u64,
    unsent: u64,
    batches: u64,
    wall_ns: u64,
    cpu_ns: Option<u64>,
    others: Histogram,
    flooder: Histogram,
    pinned: bool,
    realtime: RtStatus,
}

struct GeneratorReport {
    sent: u64,
    wall_ns: u64,
    pinned: bool,
    realtime: RtStatus,
}

/// The forwarding shell: receive a batch, ask the core where each datagram goes, send all
/// copies of the batch with as few `sendmmsg` calls as the header capacity allows.
fn forward<C: ForwardCore>(
    mut core: C,
    socket: &UdpTransport,
    phase: &AtomicU8,
    flooder: Option<SocketAddr>,
) -> ForwarderReport {
    let pinned = netjam::rt::pin_current_thread(1);
    let realtime = netjam::rt::promote_current_thread(netjam::rt::NETWORK_PRIORITY);
    let mut rx = RecvBatch::new(RECV_BATCH, 1500);
    let mut tx = SendBatch::new(RECV_BATCH * MEMBERS_PER_ROOM);
    let mut transmits: Vec<Transmit> = Vec::with_capacity(RECV_BATCH * MEMBERS_PER_ROOM * 2);
    let mut dsts: Vec<SocketAddr> = Vec::with_capacity(64);
    let mut report = ForwarderReport {
        received: 0,
        sent: 0,
        refused: 0,
        unsent: 0,
        batches: 0,
        wall_ns: 0,
        cpu_ns: None,
        others: Histogram::new(),
        flooder: Histogram::new(),
        pinned,
        realtime,
    };
    let mut seen = WARMING;
    let (mut wall0, mut cpu0) = (0, None);
    loop {
        let now_phase = phase.load(Ordering::Relaxed);
        if now_phase != seen {
            if now_phase >= MEASURING && seen == WARMING {
                wall0 = clock::now_ns();
                cpu0 = netjam::rt::thread_cpu_ns();
            }
            if now_phase == STOPPED {
                report.wall_ns = clock::now_ns() - wall0;
                report.cpu_ns = netjam::rt::thread_cpu_ns().zip(cpu0).map(|(b, a)| b - a);
                break;
            }
            seen = now_phase;
        }
        let n = match rx.recv(socket) {
            Ok(n) => n,
            Err(e) => panic!("forwarder receive failed: {e}"),
        };
        if n == 0 {
            continue;
        }
        transmits.clear();
        for i in 0..n {
            let d = rx.get(i);
            let (from, at) = (d.from, d.at_ns);
            dsts.clear();
            core.on_datagram(at, from, rx.bytes_mut(i), &mut dsts);
            transmits.extend(dsts.iter().map(|&dst| Transmit { dst, payload: i }));
        }
        let done = tx.flush(socket, &rx, &transmits);
        let sent_at = clock::now_ns();
        if seen == MEASURING {
            report.received += n as u64;
            report.sent += done.sent as u64;
            report.refused += done.failed as u64;
            report.unsent += (transmits.len() - done.sent - done.failed) as u64;
            report.batches += 1;
            for d in rx.iter() {
                let delay = sent_at.saturating_sub(d.at_ns);
                if Some(d.from) == flooder {
                    report.flooder.record(delay);
                } else {
                    report.others.record(delay);
                }
            }
        }
    }
    report
}

/// An RTP-shaped packet: version 2, payload type 96, sequence, timestamp, SSRC, then the
/// send time (monotonic ns) at the start of the payload.
fn fill_packet(buf: &mut [u8; PACKET_BYTES], seq: u16, ssrc: u32, now_ns: u64) {
    buf[0] = 0x80;
    buf[1] = 96;
    buf[2..4].copy_from_slice(&seq.to_be_bytes());
    buf[4..8].copy_from_slice(&(u32::from(seq) * 64).to_be_bytes());
    buf[8..12].copy_from_slice(&ssrc.to_be_bytes());
    buf[12..20].copy_from_slice(&now_ns.to_be_bytes());
}

/// Sends the load from `members` (member `i` with SSRC `ssrcs[i]`; member 0 floods when
/// the load says so) to `to` until the phase says stop.
fn generate(
    members: &[UdpTransport],
    ssrcs: &[u32],
    to: SocketAddr,
    load: Load,
    phase: &AtomicU8,
) -> GeneratorReport {
    let pinned = netjam::rt::pin_current_thread(0);
    // Paced members sleep between packets and keep their timing under load; a flat-out
    // generator stays at normal priority so it cannot lock the rest of the machine out.
    let realtime = match load {
        Load::Paced { .. } | Load::Aligned => {
            netjam::rt::promote_current_thread(netjam::rt::NETWORK_PRIORITY - 1)
        }
        Load::Flat => RtStatus::Normal {
            reason: "flat-out load".into(),
        },
    };
    let m = members.len() as u64;
    let interval = 1_000_000_000 / MEMBER_PPS;
    let mut intervals = vec![interval; members.len()];
    if load == (Load::Paced { flood: true }) {
        intervals[0] = interval / FLOOD_FACTOR;
    }
    let start = clock::now_ns();
    // Members start spread over one interval, as independent players would (or all at
    // once for the aligned load).
    let spread = if load == Load::Aligned { 0 } else { interval };
    let mut due: Vec<u64> = (0..m).map(|i| start + i * spread / m).collect();
    let mut seq = vec![0u16; members.len()];
    let mut buf = [0u8; PACKET_BYTES];
    let mut sent = 0u64;
    let mut wall0 = 0;
    let mut seen = WARMING;
    loop {
        let p = phase.load(Ordering::Relaxed);
        if p != seen {
            if p == MEASURING {
                wall0 = clock::now_ns();
            }
            if p == STOPPED {
                break;
            }
            seen = p;
        }
        match load {
            Load::Flat => {
                for (i, s) in members.iter().enumerate() {
                    seq[i] = seq[i].wrapping_add(1);
                    fill_packet(&mut buf, seq[i], ssrcs[i], clock::now_ns());
                    if s.send_to(&buf, to).is_ok() && seen == MEASURING {
                        sent += 1;
                    }
                }
            }
            Load::Paced { .. } | Load::Aligned => {
                let now = clock::now_ns();
                let mut next = u64::MAX;
                for (i, s) in members.iter().enumerate() {
                    while due[i] <= now {
                        seq[i] = seq[i].wrapping_add(1);
                        fill_packet(&mut buf, seq[i], ssrcs[i], clock::now_ns());
                        if s.send_to(&buf, to).is_ok() && seen == MEASURING {
                            sent += 1;
                        }
                        due[i] += intervals[i];
                    }
                    next = next.min(due[i]);
                }
                let wait = next.saturating_sub(clock::now_ns());
                if wait > 20_000 {
                    std::thread::sleep(Duration::from_nanos(wait));
                }
            }
        }
    }
    GeneratorReport {
        sent,
        wall_ns: clock::now_ns().saturating_sub(wall0),
        pinned,
        realtime,
    }
}

/// One socket per member on loopback, and their addresses grouped into rooms.
fn member_sockets(rooms: usize) -> (Vec<UdpTransport>, Vec<Vec<SocketAddr>>) {
    let members: Vec<UdpTransport> = (0..rooms * MEMBERS_PER_ROOM)
        .map(|_| {
            let s = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            // Nobody reads the members' sockets under load: a small queue fills once and
            // then the kernel drops at the member, as it would on a saturated far end.
            let _ = socket2::SockRef::from(s.socket()).set_recv_buffer_size(64 * 1024);
            s
        })
        .collect();
    let table = members
        .iter()
        .map(|s| s.local_addr().unwrap())
        .collect::<Vec<_>>()
        .chunks(MEMBERS_PER_ROOM)
        .map(<[SocketAddr]>::to_vec)
        .collect();
    (members, table)
}

/// Runs the generator for warm-up plus `seconds`, calling `at_measure` when the measured
/// window starts; returns once the generator has stopped.
fn drive_load(
    members: Vec<UdpTransport>,
    ssrcs: Vec<u32>,
    to: SocketAddr,
    load: Load,
    seconds: f64,
    phase: &Arc<AtomicU8>,
    at_measure: impl FnOnce(),
) -> GeneratorReport {
    let gen = {
        let phase = phase.clone();
        std::thread::Builder::new()
            .name("generator".into())
            .spawn(move || generate(&members, &ssrcs, to, load, &phase))
            .unwrap()
    };
    std::thread::sleep(WARMUP);
    phase.store(MEASURING, Ordering::Relaxed);
    at_measure();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    phase.store(STOPPED, Ordering::Relaxed);
    gen.join().unwrap()
}

/// One run of the bare forwarder (a core in the bench's shell).
fn run_bare<C: ForwardCore>(
    make_core: fn(&[Vec<SocketAddr>]) -> C,
    rooms: usize,
    load: Load,
    seconds: f64,
) -> Figures {
    let forwarder = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    forwarder
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let to = forwarder.local_addr().unwrap();
    let (members, table) = member_sockets(rooms);
    let flooder = matches!(load, Load::Paced { flood: true }).then_some(table[0][0]);
    let ssrcs = (0..members.len() as u32).collect();
    let core = make_core(&table);
    let phase = Arc::new(AtomicU8::new(WARMING));
    let fwd = {
        let phase = phase.clone();
        std::thread::Builder::new()
            .name("forwarder".into())
            .spawn(move || forward(core, &forwarder, &phase, flooder))
            .unwrap()
    };
    let gen = drive_load(members, ssrcs, to, load, seconds, &phase, || {});
    Figures::from_bare(&fwd.join().unwrap(), &gen)
}

/// Joins every member through the room protocol: one [`RoomClient`] per member socket,
/// pumped until each holds a seat and has heard of its 7 room-mates (acknowledging the
/// roster events, so the server has nothing left to retransmit). Returns the SSRC each
/// member was assigned, and how long joining took.
fn join_members(members: &[UdpTransport], server: SocketAddr, declared_pps: u32) -> (Vec<u32>, Duration) {
    let started = std::time::Instant::now();
    let t0 = clock::now_ns();
    let mut clients: Vec<RoomClient> = (0..members.len())
        .map(|i| {
            let room = format!("bench-{}", i / MEMBERS_PER_ROOM);
            let name = format!("member-{}", i % MEMBERS_PER_ROOM);
            // Every member asks for SSRC 1: the server resolves the collisions.
            let mut cfg = ClientConfig::new(&room, &name, "", 1);
            cfg.packets_per_s = declared_pps;
            cfg.bytes_per_s = declared_pps.saturating_mul(PACKET_BYTES as u32);
            cfg.nonce_seed = (i as u128).to_be_bytes();
            cfg.retry_initial_ns = 20_000_000;
            cfg.retry_max_ns = 200_000_000;
            cfg.secure = true;
            RoomClient::new(cfg, t0)
        })
        .collect();
    for s in members {
        s.socket().set_nonblocking(true).unwrap();
    }
    let mut ssrcs: Vec<Option<u32>> = vec![None; members.len()];
    let mut heard = vec![0usize; members.len()];
    let mut rx = [0u8; 2048];
    let mut tx = vec![0u8; MAX_CONTROL_LEN];
    loop {
        let now = clock::now_ns();
        for (i, (c, s)) in clients.iter_mut().zip(members).enumerate() {
            while let Ok((len, from)) = s.socket().recv_from(&mut rx) {
                if from == server && rx[..len].first() == Some(&b'/') {
                    c.handle_datagram(now, &rx[..len]);
                }
            }
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
            while let Some(len) = c.poll_transmit(&mut tx) {
                let _ = s.send_to(&tx[..len], server);
            }
            while let Some(ev) = c.poll_event() {
                match ev {
                    RoomEvent::Joined { ssrc, .. } => ssrcs[i] = Some(ssrc),
                    RoomEvent::Roster(e) if e.kind == RosterKind::Joined => heard[i] += 1,
                    RoomEvent::Refused { code, reason } => {
                        panic!("the server refused member {i}: {code:?} {reason}")
                    }
                    _ => {}
                }
            }
        }
        if ssrcs.iter().all(Option::is_some) && heard.iter().all(|&h| h >= MEMBERS_PER_ROOM - 1) {
            break;
        }
        assert!(
            started.elapsed() < JOIN_TIMEOUT,
            "members did not all join within {JOIN_TIMEOUT:?}: {} seated, {} heard of all room-mates",
            ssrcs.iter().filter(|s| s.is_some()).count(),
            heard.iter().filter(|&&h| h >= MEMBERS_PER_ROOM - 1).count()
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    for s in members {
        s.socket().set_nonblocking(false).unwrap();
    }
    (ssrcs.into_iter().map(Option::unwrap).collect(), started.elapsed())
}

/// What a server run saw.
struct ServerRun {
    figures: Figures,
    joined_in: Duration,
}

/// One run of netjam's server as it ships (only pinned to core 1 and batched as `shell`
/// says), with members that joined through the room protocol.
fn run_server(rooms: usize, load: Load, seconds: f64, shell: ShellConfig) -> ServerRun {
    let config = ServerConfig {
        max_packets_per_s: FLAT_DECLARED_PPS,
        max_bytes_per_s: FLAT_DECLARED_PPS * PACKET_BYTES as u32,
        ..ServerConfig::default()
    };
    let server = netjam::server::spawn_with("127.0.0.1:0".parse().unwrap(), config, shell).unwrap();
    let to = server.local;
    let (members, table) = member_sockets(rooms);
    let declared = match load {
        Load::Paced { .. } | Load::Aligned => MEMBER_PPS as u32,
        Load::Flat => FLAT_DECLARED_PPS,
    };
    let (ssrcs, joined_in) = join_members(&members, to, declared);
    let flooder = matches!(load, Load::Paced { flood: true }).then_some(table[0][0]);
    let phase = Arc::new(AtomicU8::new(WARMING));
    let mut start = None;
    let gen = drive_load(members, ssrcs, to, load, seconds, &phase, || {
        server.restart_delay_figures();
        start = Some(server.report());
    });
    let end = server.stop().unwrap();
    ServerRun {
        figures: Figures::from_server(&start.unwrap(), &end, &gen, flooder),
        joined_in,
    }
}

/// A run's figures, whichever forwarder made them.
struct Figures {
    gen_sent: u64,
    gen_secs: f64,
    gen_pinned: bool,
    gen_sched: String,
    fwd_sched: String,
    fwd_pinned: bool,
    received: u64,
    sent: u64,
    /// Copies the kernel refused, copies left unsent because the socket would block.
    refused: u64,
    unsent: u64,
    batches: u64,
    secs: f64,
    cpu_s: Option<f64>,
    /// Delays in µs: p50, p99, p99.9, max, and how many packets.
    delay: Option<[f64; 4]>,
    packets: u64,
    /// Bare forwarder with a flooder: the flooder's own delays.
    flooder_delay: Option<([f64; 4], u64)>,
    /// Server with a flooder: (flooder's policed, others' policed, flooder's forwarded).
    policed: Option<(u64, u64, u64)>,
    /// Server: others' policed packets (a paced member over its rate by timing jitter).
    others_policed: Option<u64>,
}

impl Figures {
    fn from_bare(f: &ForwarderReport, g: &GeneratorReport) -> Self {
        let us = |h: &Histogram, q: f64| h.quantile(q).map_or(0.0, |v| v as f64 / 1e3);
        let four = |h: &Histogram| [us(h, 0.5), us(h, 0.99), us(h, 0.999), h.max as f64 / 1e3];
        Self {
            gen_sent: g.sent,
            gen_secs: g.wall_ns as f64 / 1e9,
            gen_pinned: g.pinned,
            gen_sched: describe(&g.realtime),
            fwd_sched: describe(&f.realtime),
            fwd_pinned: f.pinned,
            received: f.received,
            sent: f.sent,
            refused: f.refused,
            unsent: f.unsent,
            batches: f.batches,
            secs: f.wall_ns as f64 / 1e9,
            cpu_s: f.cpu_ns.map(|c| c as f64 / 1e9),
            delay: (f.others.total > 0).then(|| four(&f.others)),
            packets: f.others.total,
            flooder_delay: (f.flooder.total > 0).then(|| (four(&f.flooder), f.flooder.total)),
            policed: None,
            others_policed: None,
        }
    }

    fn from_server(
        a: &ServerReport,
        b: &ServerReport,
        g: &GeneratorReport,
        flooder: Option<SocketAddr>,
    ) -> Self {
        let policed = |r: &ServerReport, pick: &dyn Fn(SocketAddr) -> bool| {
            r.members
                .iter()
                .filter(|m| pick(m.addr))
                .map(|m| m.policed_drops)
                .sum::<u64>()
        };
        let forwarded = |r: &ServerReport, who: SocketAddr| {
            r.members
                .iter()
                .filter(|m| m.addr == who)
                .map(|m| m.forwarded)
                .sum::<u64>()
        };
        let is_flooder = |addr: SocketAddr| Some(addr) == flooder;
        let is_other = |addr: SocketAddr| Some(addr) != flooder;
        let d = &b.delay;
        let cpu = b.shell.cpu_s - a.shell.cpu_s;
        Self {
            gen_sent: g.sent,
            gen_secs: g.wall_ns as f64 / 1e9,
            gen_pinned: g.pinned,
            gen_sched: describe(&g.realtime),
            fwd_sched: b
                .shell
                .realtime_priority
                .map_or_else(|| "normal".into(), |p| format!("SCHED_FIFO {p}")),
            fwd_pinned: b.shell.pinned_cpu.is_some(),
            received: b.shell.received - a.shell.received,
            sent: b.shell.sent - a.shell.sent,
            refused: b.shell.send_failed - a.shell.send_failed,
            unsent: b.shell.send_would_block - a.shell.send_would_block,
            batches: b.shell.batches - a.shell.batches,
            secs: b.uptime_s - a.uptime_s,
            cpu_s: (cpu > 0.0).then_some(cpu),
            delay: (d.packets > 0).then_some([d.p50_us, d.p99_us, d.p999_us, d.max_us]),
            packets: d.packets,
            flooder_delay: None,
            policed: flooder.map(|f| {
                (
                    policed(b, &is_flooder) - policed(a, &is_flooder),
                    policed(b, &is_other) - policed(a, &is_other),
                    forwarded(b, f) - forwarded(a, f),
                )
            }),
            others_policed: Some(policed(b, &is_other) - policed(a, &is_other)),
        }
    }

    fn received_per_cpu(&self) -> Option<f64> {
        self.cpu_s.map(|c| self.received as f64 / c)
    }

    fn sent_per_cpu(&self) -> Option<f64> {
        self.cpu_s.map(|c| self.sent as f64 / c)
    }

    /// What reached the forwarder, as a share of what the generator sent (rates, as
    /// the two count over slightly different windows).
    fn reached(&self) -> f64 {
        let gen = self.gen_sent as f64 / self.gen_secs.max(1e-9);
        (self.received as f64 / self.secs.max(1e-9)) / gen.max(1.0)
    }

    fn saturated(&self) -> bool {
        self.reached() < 0.99
    }
}

fn us(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

fn print_run(core: &str, label: &str, f: &Figures) {
    println!("-- {core}: {label} --");
    println!("scheduling: forwarder {}, generator {}", f.fwd_sched, f.gen_sched);
    println!(
        "generator sent {:>9.0} pkt/s{}; forwarder received {:>9.0} pkt/s ({:.1} % of sent), sent {:>9.0} pkt/s \
         (refused {}, left unsent {}), {:.1} datagrams per recvmmsg",
        f.gen_sent as f64 / f.gen_secs,
        if f.gen_pinned { " (core 0)" } else { "" },
        f.received as f64 / f.secs,
        100.0 * f.reached().min(1.0),
        f.sent as f64 / f.secs,
        f.refused,
        f.unsent,
        f.received as f64 / f.batches.max(1) as f64,
    );
    if let Some(cpu) = f.cpu_s {
        println!(
            "forwarder thread busy {:.0} % of its core{}; per busy core-second: {:.0} received, {:.0} sent",
            100.0 * cpu / f.secs,
            if f.fwd_pinned { " (core 1)" } else { "" },
            f.received as f64 / cpu,
            f.sent as f64 / cpu,
        );
    }
    if f.saturated() {
        println!(
            "SATURATED: the forwarder fell behind the load ({:.1} % of what was sent reached it); its delays are \
             mostly the wait in its full socket queue",
            100.0 * f.reached()
        );
    }
    let d = f.delay;
    let which = if f.flooder_delay.is_some() {
        ", other members"
    } else if f.policed.is_some() {
        ", every forwarded packet"
    } else {
        ""
    };
    println!(
        "delay inside the forwarder{which} (µs): p50 {}  p99 {}  p99.9 {}  max {}  ({} packets)",
        us(d.map(|d| d[0])),
        us(d.map(|d| d[1])),
        us(d.map(|d| d[2])),
        us(d.map(|d| d[3])),
        f.packets,
    );
    if let Some((d, n)) = f.flooder_delay {
        println!(
            "delay inside the forwarder, flooding member (µs): p50 {:.1}  p99 {:.1}  p99.9 {:.1}  ({n} packets): \
             not policed, its whole flood was fanned out",
            d[0], d[1], d[2]
        );
    }
    if let Some((flooder, others, admitted)) = f.policed {
        println!(
            "policed before fan-out: flooding member {flooder} packets ({:.0}/s), other members {others}; the \
             flooder's {admitted} admitted packets ({:.1} % of those forwarded) are in the delay figures above",
            flooder as f64 / f.secs,
            100.0 * admitted as f64 / f.packets.max(1) as f64,
        );
    } else if let Some(others) = f.others_policed.filter(|&o| o > 0) {
        println!("policed: {others} packets of members sending at their declared rate (timing jitter above the bucket)");
    }
}

fn describe(s: &RtStatus) -> String {
    match s {
        RtStatus::Realtime { priority } => format!("SCHED_FIFO {priority}"),
        RtStatus::Normal { reason } => format!("normal ({reason})"),
        other => other.to_string(),
    }
}

fn arg_or_env<T: std::str::FromStr>(args: &[String], flag: &str, env: &str) -> Option<T> {
    let from_args = args
        .iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok());
    from_args.or_else(|| std::env::var(env).ok().and_then(|v| v.parse().ok()))
}

/// The shell the server ships with, pinned to core 1 like the bare forwarder.
fn server_shell() -> ShellConfig {
    ShellConfig {
        cpu: Some(1),
        ..ShellConfig::default()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: f64 = arg_or_env(&args, "--seconds", "NETJAM_FWD_SECONDS").unwrap_or(5.0);
    let rooms: usize = arg_or_env(&args, "--rooms", "NETJAM_FWD_ROOMS")
        .unwrap_or(5)
        .max(1);
    let flood = args.iter().any(|a| a == "--flood")
        || std::env::var("NETJAM_FWD_FLOOD").is_ok_and(|v| v != "0" && !v.is_empty());
    let only: Option<String> = arg_or_env(&args, "--only", "NETJAM_FWD_ONLY");
    let (bare, server) = match only.as_deref() {
        Some("bare") => (true, false),
        Some("server") => (false, true),
        _ => (true, true),
    };
    let sweep = args.iter().any(|a| a == "--batch-sweep");
    let (bare, server) = if sweep { (false, false) } else { (bare, server) };

    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("== forwarding: {rooms} rooms × {MEMBERS_PER_ROOM} members, {PACKET_BYTES}-byte packets, 7-way fan-out, loopback ==");
    println!(
        "{cores} cores: the load generator (pinned to core 0) and the forwarder (pinned to core 1) share them, \
         and loopback delivery runs in each sender's context; other jobs on the machine are not stopped{}",
        load_average().map_or_else(String::new, |l| format!(" (load average at start: {l})")),
    );
    println!("delay = kernel receive stamp -> return of the sendmmsg carrying the packet's last copy; {seconds} s per run after {} s warm-up", WARMUP.as_secs());
    let opts = Options {
        rooms,
        seconds,
        flood,
    };
    let bare_runs = bare.then(|| measure_core("bare forwarder (static rooms)", StaticRooms::new, &opts));
    let server_runs = server.then(|| measure_server(&opts));
    if let (Some(b), Some(s)) = (&bare_runs, &server_runs) {
        print_comparison(b, s);
    }
    if sweep {
        batch_sweep(&opts);
    }
}

struct Options {
    rooms: usize,
    seconds: f64,
    flood: bool,
}

/// The runs of one forwarder.
struct Runs {
    paced: Figures,
    flooded: Option<Figures>,
    flat: Figures,
}

/// All runs for one core in the bench's shell, printed under `name`.
fn measure_core<C: ForwardCore>(name: &str, make: fn(&[Vec<SocketAddr>]) -> C, opts: &Options) -> Runs {
    let Options {
        rooms,
        seconds,
        flood,
    } = *opts;
    let paced = run_bare(make, rooms, Load::Paced { flood: false }, seconds);
    print_run(name, &format!("{rooms} rooms × 8 × {MEMBER_PPS} pkt/s"), &paced);
    let flooded = flood.then(|| {
        let f = run_bare(make, rooms, Load::Paced { flood: true }, seconds);
        print_run(name, &flood_label(), &f);
        f
    });
    let flat = run_bare(make, rooms, Load::Flat, seconds);
    print_run(name, &flat_label(rooms), &flat);
    Runs { paced, flooded, flat }
}

/// All runs of netjam's server.
fn measure_server(opts: &Options) -> Runs {
    let name = "netjam server";
    let Options { rooms, seconds, .. } = *opts;
    let paced = run_server(rooms, Load::Paced { flood: false }, seconds, server_shell());
    print_run(
        name,
        &format!("{rooms} rooms × 8 × {MEMBER_PPS} pkt/s"),
        &paced.figures,
    );
    println!(
        "({} members joined through the room protocol in {:.0} ms)",
        rooms * MEMBERS_PER_ROOM,
        paced.joined_in.as_secs_f64() * 1e3
    );
    let flooded = run_server(rooms, Load::Paced { flood: true }, seconds, server_shell());
    print_run(name, &flood_label(), &flooded.figures);
    let flat = run_server(rooms, Load::Flat, seconds, server_shell());
    print_run(name, &flat_label(rooms), &flat.figures);
    Runs {
        paced: paced.figures,
        flooded: Some(flooded.figures),
        flat: flat.figures,
    }
}

fn flood_label() -> String {
    format!(
        "same, one member flooding at {FLOOD_FACTOR}× its declared rate ({} pkt/s)",
        MEMBER_PPS * FLOOD_FACTOR
    )
}

fn flat_label(rooms: usize) -> String {
    format!("throughput: {rooms} rooms × 8 members sending as fast as the generator can")
}

fn cell(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

fn delays(f: &Figures) -> String {
    f.delay.map_or_else(
        || "-".into(),
        |d| format!("{:.1} / {:.1} / {:.1}", d[0], d[1], d[2]),
    )
}

fn print_comparison(bare: &Runs, server: &Runs) {
    let ratio = |s: Option<f64>, b: Option<f64>| match (s, b) {
        (Some(s), Some(b)) if b > 0.0 => format!("{:.0} %", 100.0 * s / b),
        _ => "-".into(),
    };
    println!();
    println!(
        "== netjam server next to the bare forwarder (same load, same run; both take 64 datagrams per recvmmsg, \
         the bare forwarder sends each batch in one go, the server every {} copies) ==",
        ShellConfig::default().flush_after
    );
    println!(
        "{:<46} {:>22} {:>22} {:>12}",
        "", "bare forwarder", "netjam server", "server/bare"
    );
    let (b, s) = (&bare.flat, &server.flat);
    println!(
        "{:<46} {:>22} {:>22} {:>12}",
        "flat out: received per busy core-second",
        cell(b.received_per_cpu()),
        cell(s.received_per_cpu()),
        ratio(s.received_per_cpu(), b.received_per_cpu())
    );
    println!(
        "{:<46} {:>22} {:>22} {:>12}",
        "flat out: copies sent per busy core-second",
        cell(b.sent_per_cpu()),
        cell(s.sent_per_cpu()),
        ratio(s.sent_per_cpu(), b.sent_per_cpu())
    );
    println!(
        "{:<46} {:>22} {:>22}",
        "flat out: copies sent per second (wall)",
        format!("{:.0}", b.sent as f64 / b.secs),
        format!("{:.0}", s.sent as f64 / s.secs),
    );
    let (b, s) = (&bare.paced, &server.paced);
    println!(
        "{:<46} {:>22} {:>22}",
        "750 pkt/s per member: p50 / p99 / p99.9 µs",
        delays(b),
        delays(s)
    );
    if let Some(sf) = &server.flooded {
        let bare_flood = bare.flooded.as_ref().map_or_else(
            || "not policed".into(),
            |f| {
                format!(
                    "{} -> {} (unpoliced)",
                    us(b.delay.map(|d| d[1])),
                    us(f.delay.map(|d| d[1]))
                )
            },
        );
        println!(
            "{:<46} {:>22} {:>22}",
            "others' p99 µs, without -> with a 50× flood",
            bare_flood,
            format!("{} -> {}", us(s.delay.map(|d| d[1])), us(sf.delay.map(|d| d[1]))),
        );
        if let Some((flooder, _, _)) = sf.policed {
            println!(
                "{:<46} {:>22} {:>22}",
                "flooder's packets policed before fan-out", "- (cannot police)", flooder
            );
        }
    }
    let got = server
        .flat
        .received_per_cpu()
        .zip(bare.flat.received_per_cpu())
        .map(|(s, b)| s / b);
    match got {
        Some(r) if r >= 0.8 => println!(
            "goal (server ≥ 80 % of bare per busy core-second): met ({:.0} %)",
            r * 100.0
        ),
        Some(r) => println!(
            "goal (server ≥ 80 % of bare per busy core-second): NOT MET ({:.0} %)",
            r * 100.0
        ),
        None => {
            println!("goal (server ≥ 80 % of bare per busy core-second): not measured (no thread CPU time)")
        }
    }
    let p99 = server.paced.delay.map(|d| d[1]);
    match p99 {
        Some(p) if p < 50.0 => println!("goal (p99 < 50 µs at 750 pkt/s per member): met ({p:.1} µs)"),
        Some(p) => println!(
            "goal (p99 < 50 µs at 750 pkt/s per member): NOT MET ({p:.1} µs; the bare forwarder's: {} µs)",
            us(bare.paced.delay.map(|d| d[1]))
        ),
        None => {}
    }
}

/// The server with other batch settings: realistic load, the same load aligned (every
/// member's packet due at the same instant, so batches form), flat out. The
/// settings are interleaved over `SWEEP_ROUNDS` rounds, so a burst of other work on the
/// machine lands on one row rather than on one setting.
fn batch_sweep(opts: &Options) {
    const SWEEP_ROUNDS: usize = 2;
    let settings: [(&str, usize, usize); 5] = [
        ("recv 64, one send per batch", 64, usize::MAX),
        ("recv 16, one send per batch", 16, usize::MAX),
        ("recv 64, flush every 64 copies", 64, 64),
        ("recv 64, flush every 128 copies", 64, 128),
        ("recv 64, flush every 256 copies", 64, 256),
    ];
    println!();
    println!(
        "== batch sweep, netjam server, {} rooms: paced, paced with every member sending at the same instants \
         (aligned), flat out; {SWEEP_ROUNDS} rounds ==",
        opts.rooms
    );
    println!(
        "{:<34} {:>24} {:>28} {:>12} {:>12} {:>10}",
        "setting", "paced p50/p99/p99.9", "aligned p50/p99/p99.9", "recv/core-s", "sent/core-s", "flat p99"
    );
    for _ in 0..SWEEP_ROUNDS {
        for (label, recv_batch, flush_after) in settings {
            let shell = ShellConfig {
                recv_batch,
                flush_after,
                ..server_shell()
            };
            let paced = run_server(
                opts.rooms,
                Load::Paced { flood: false },
                opts.seconds,
                shell.clone(),
            )
            .figures;
            let busy = run_server(opts.rooms, Load::Aligned, opts.seconds, shell.clone()).figures;
            let flat = run_server(opts.rooms, Load::Flat, opts.seconds, shell).figures;
            println!(
                "{:<34} {:>24} {:>28} {:>12} {:>12} {:>10}",
                label,
                format!(
                    "{}{}",
                    delays(&paced),
                    if paced.saturated() { " SAT" } else { "" }
                ),
                format!("{}{}", delays(&busy), if busy.saturated() { " SAT" } else { "" }),
                cell(flat.received_per_cpu()),
                cell(flat.sent_per_cpu()),
                us(flat.delay.map(|d| d[1])),
            );
        }
    }
}

fn load_average() -> Option<String> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}
