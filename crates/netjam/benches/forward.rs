//! Forwarding benchmark for the rooms server: how many packets one core forwards, and how
//! long each packet spends inside the forwarder; prints its figures.
//!
//! A load generator (its own thread and one socket per member, on loopback) plays R rooms
//! of 8 members, each sending 276-byte RTP-shaped packets (a send timestamp inside) at
//! 750 packets/s, or as fast as it can for the throughput run. A forwarder on one socket
//! receives them with `recvmmsg` (kernel receive stamps) and sends each to the 7 other
//! members of its room with `sendmmsg`, through `netjam::udp_batch`.
//!
//! What decides where a packet goes is a [`ForwardCore`]. The bare forwarder's core is a
//! static table (rooms known in advance, nothing else) and stands for the machine's limit.
//! To measure netjam's rooms server, implement `ForwardCore` for it (seeded with the same
//! rooms through its `make` function) and add a `measure_core` line in `main`: the shell,
//! the load and the figures stay the same, so the only difference between rows is the core.
//!
//! The delay is taken inside the forwarder: from the kernel's receive stamp (so the wait
//! in the socket's queue counts) to the moment the `sendmmsg` carrying the packet's last
//! copy has returned.
//!
//! Runs (each after a one-second warm-up):
//! 1. realistic load: R rooms × 8 members × 750 packets/s;
//! 2. with `--flood`: the same, with one member sending 50× its rate (the others' p99 is
//!    printed next to run 1's);
//! 3. throughput: every member sends as fast as the generator can.
//!
//! `cargo bench -p netjam --bench forward [-- --seconds S --rooms R --flood]`, or the
//! environment variables `NETJAM_FWD_SECONDS`, `NETJAM_FWD_ROOMS`, `NETJAM_FWD_FLOOD=1`.
//! Defaults: 8 s per run, 5 rooms (30,000 packets/s in, 210,000 out: a load a loaded
//! 2-core machine holds; 10 rooms is 60,000 in, 420,000 out). The default takes about
//! 20 s (30 s with `--flood`). A run where the forwarder could not keep up says so.
//!
//! The forwarder and the paced generator ask for `SCHED_FIFO` as netjam's network
//! threads do (the flat-out generator does not, so it cannot lock the machine out).
//!
//! The generator is pinned to core 0 and the forwarder to core 1 where the system allows
//! it. On a 2-core machine they share the machine with each other's kernel work (loopback
//! delivers a packet in the sender's context) and with anything else that runs.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use netjam::clock;
use netjam::rt::RtStatus;
use netjam::transport::UdpTransport;
use netjam::udp_batch::{RecvBatch, SendBatch, Transmit};

const MEMBERS_PER_ROOM: usize = 8;
const PACKET_BYTES: usize = 276;
const MEMBER_PPS: u64 = 750;
const FLOOD_FACTOR: u64 = 50;
const RECV_BATCH: usize = 64;
const WARMUP: Duration = Duration::from_secs(1);

/// What decides where a forwarded packet goes: the only part that differs between the
/// bare forwarder and netjam's rooms server in this benchmark.
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

/// Phases every thread follows, set by `main`.
const WARMING: u8 = 0;
const MEASURING: u8 = 1;
const STOPPED: u8 = 2;

#[derive(Clone, Copy, PartialEq)]
enum Load {
    /// Every member at `MEMBER_PPS`; with a flooder at `FLOOD_FACTOR` × that.
    Paced { flood: bool },
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
    let pinned = pin_to_core(1);
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
                cpu0 = thread_cpu_ns();
            }
            if now_phase == STOPPED {
                report.wall_ns = clock::now_ns() - wall0;
                report.cpu_ns = thread_cpu_ns().zip(cpu0).map(|(b, a)| b - a);
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

fn generate(members: &[UdpTransport], to: SocketAddr, load: Load, phase: &AtomicU8) -> GeneratorReport {
    let pinned = pin_to_core(0);
    // Paced members sleep between packets and keep their timing under load; a flat-out
    // generator stays at normal priority so it cannot lock the rest of the machine out.
    let realtime = match load {
        Load::Paced { .. } => netjam::rt::promote_current_thread(netjam::rt::NETWORK_PRIORITY - 1),
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
    // Members start spread over one interval, as independent players would.
    let mut due: Vec<u64> = (0..m).map(|i| start + i * interval / m).collect();
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
                    fill_packet(&mut buf, seq[i], i as u32, clock::now_ns());
                    if s.send_to(&buf, to).is_ok() && seen == MEASURING {
                        sent += 1;
                    }
                }
            }
            Load::Paced { .. } => {
                let now = clock::now_ns();
                let mut next = u64::MAX;
                for (i, s) in members.iter().enumerate() {
                    while due[i] <= now {
                        seq[i] = seq[i].wrapping_add(1);
                        fill_packet(&mut buf, seq[i], i as u32, clock::now_ns());
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

struct RunResult {
    fwd: ForwarderReport,
    gen: GeneratorReport,
}

/// One run: set up rooms and sockets, run generator and forwarder, return their reports.
fn run<C: ForwardCore>(
    make_core: fn(&[Vec<SocketAddr>]) -> C,
    rooms: usize,
    load: Load,
    seconds: f64,
) -> RunResult {
    let forwarder = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    forwarder
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let to = forwarder.local_addr().unwrap();
    let members: Vec<UdpTransport> = (0..rooms * MEMBERS_PER_ROOM)
        .map(|_| {
            let s = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            // Nobody reads the members' sockets: a small queue fills once and then the
            // kernel drops at the member, as it would on a saturated far end.
            let _ = socket2::SockRef::from(s.socket()).set_recv_buffer_size(64 * 1024);
            s
        })
        .collect();
    let addrs: Vec<SocketAddr> = members.iter().map(|s| s.local_addr().unwrap()).collect();
    let table: Vec<Vec<SocketAddr>> = addrs
        .chunks(MEMBERS_PER_ROOM)
        .map(<[SocketAddr]>::to_vec)
        .collect();
    let flooder = matches!(load, Load::Paced { flood: true }).then_some(addrs[0]);
    let core = make_core(&table);
    let phase = Arc::new(AtomicU8::new(WARMING));

    let fwd = {
        let phase = phase.clone();
        std::thread::Builder::new()
            .name("forwarder".into())
            .spawn(move || forward(core, &forwarder, &phase, flooder))
            .unwrap()
    };
    let gen = {
        let phase = phase.clone();
        std::thread::Builder::new()
            .name("generator".into())
            .spawn(move || generate(&members, to, load, &phase))
            .unwrap()
    };
    std::thread::sleep(WARMUP);
    phase.store(MEASURING, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs_f64(seconds));
    phase.store(STOPPED, Ordering::Relaxed);
    RunResult {
        fwd: fwd.join().unwrap(),
        gen: gen.join().unwrap(),
    }
}

fn us(ns: Option<u64>) -> String {
    ns.map_or_else(|| "-".into(), |v| format!("{:.1}", v as f64 / 1000.0))
}

fn print_run(core: &str, label: &str, r: &RunResult) {
    let f = &r.fwd;
    let secs = f.wall_ns as f64 / 1e9;
    let gen_secs = r.gen.wall_ns as f64 / 1e9;
    let cpu = f.cpu_ns.map(|c| c as f64 / 1e9);
    println!("-- {core}: {label} --");
    println!(
        "scheduling: forwarder {}, generator {}",
        describe(&f.realtime),
        describe(&r.gen.realtime)
    );
    println!(
        "generator sent {:>9.0} pkt/s{}; forwarder received {:>9.0} pkt/s ({:.1} % of sent), sent {:>9.0} pkt/s \
         (refused {}, left unsent {}), {:.1} datagrams per recvmmsg",
        r.gen.sent as f64 / gen_secs,
        if r.gen.pinned { " (core 0)" } else { "" },
        f.received as f64 / secs,
        100.0 * f.received as f64 / r.gen.sent.max(1) as f64,
        f.sent as f64 / secs,
        f.refused,
        f.unsent,
        f.received as f64 / f.batches.max(1) as f64,
    );
    if let Some(cpu) = cpu {
        println!(
            "forwarder thread busy {:.0} % of its core{}; per busy core-second: {:.0} received, {:.0} sent",
            100.0 * cpu / secs,
            if f.pinned { " (core 1)" } else { "" },
            f.received as f64 / cpu,
            f.sent as f64 / cpu,
        );
    }
    if f.received * 100 < r.gen.sent * 99 {
        println!(
            "SATURATED: the forwarder fell behind the load ({:.1} % of what was sent reached it); its delays are \
             mostly the wait in its full socket queue",
            100.0 * f.received as f64 / r.gen.sent.max(1) as f64
        );
    }
    let h = &f.others;
    println!(
        "delay inside the forwarder{} (µs): p50 {}  p99 {}  p99.9 {}  max {}  ({} packets)",
        if f.flooder.total > 0 {
            ", other members"
        } else {
            ""
        },
        us(h.quantile(0.5)),
        us(h.quantile(0.99)),
        us(h.quantile(0.999)),
        us((h.total > 0).then_some(h.max)),
        h.total,
    );
    if f.flooder.total > 0 {
        let h = &f.flooder;
        println!(
            "delay inside the forwarder, flooding member (µs): p50 {}  p99 {}  p99.9 {}  ({} packets)",
            us(h.quantile(0.5)),
            us(h.quantile(0.99)),
            us(h.quantile(0.999)),
            h.total,
        );
    }
}

fn describe(s: &RtStatus) -> String {
    match s {
        RtStatus::Realtime { priority } => format!("SCHED_FIFO {priority}"),
        RtStatus::Normal { reason } => format!("normal ({reason})"),
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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let seconds: f64 = arg_or_env(&args, "--seconds", "NETJAM_FWD_SECONDS").unwrap_or(8.0);
    let rooms: usize = arg_or_env(&args, "--rooms", "NETJAM_FWD_ROOMS")
        .unwrap_or(5)
        .max(1);
    let flood = args.iter().any(|a| a == "--flood")
        || std::env::var("NETJAM_FWD_FLOOD").is_ok_and(|v| v != "0" && !v.is_empty());

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
    // Every core is measured with the same shell and load: netjam's rooms server gets a
    // line here, e.g. `measure_core("netjam rooms server", RoomsCore::with_static_rooms, &opts);`
    measure_core("bare forwarder (static rooms)", StaticRooms::new, &opts);
}

struct Options {
    rooms: usize,
    seconds: f64,
    flood: bool,
}

/// All runs for one core, printed under `name`.
fn measure_core<C: ForwardCore>(name: &str, make: fn(&[Vec<SocketAddr>]) -> C, opts: &Options) {
    let Options {
        rooms,
        seconds,
        flood,
    } = *opts;
    let paced = run(make, rooms, Load::Paced { flood: false }, seconds);
    print_run(name, &format!("{rooms} rooms × 8 × {MEMBER_PPS} pkt/s"), &paced);
    if flood {
        let flooded = run(make, rooms, Load::Paced { flood: true }, seconds);
        print_run(
            name,
            &format!(
                "same, one member flooding at {FLOOD_FACTOR}× ({} pkt/s)",
                MEMBER_PPS * FLOOD_FACTOR
            ),
            &flooded,
        );
        println!(
            "others' delay p99 (µs): {} without flood, {} with flood; p99.9 {} / {}",
            us(paced.fwd.others.quantile(0.99)),
            us(flooded.fwd.others.quantile(0.99)),
            us(paced.fwd.others.quantile(0.999)),
            us(flooded.fwd.others.quantile(0.999)),
        );
    }
    let flat = run(make, rooms, Load::Flat, seconds);
    print_run(
        name,
        &format!("throughput: {rooms} rooms × 8 members sending as fast as the generator can"),
        &flat,
    );
}

fn load_average() -> Option<String> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// Pin the calling thread to `core` (Linux); false where that is not possible.
#[cfg(target_os = "linux")]
fn pin_to_core(core: usize) -> bool {
    // SAFETY: `set` is a zeroed cpu_set_t (a valid empty set) that CPU_SET fills within its
    // bounds (`core` is checked against CPU_SETSIZE); sched_setaffinity(0, …) applies it to
    // the calling thread and only reads `set`, which outlives the call.
    unsafe {
        if core >= libc::CPU_SETSIZE as usize {
            return false;
        }
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn pin_to_core(_core: usize) -> bool {
    false
}

/// CPU time the calling thread has used, in ns.
#[cfg(unix)]
fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec that outlives the call, which only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(not(unix))]
fn thread_cpu_ns() -> Option<u64> {
    None
}
