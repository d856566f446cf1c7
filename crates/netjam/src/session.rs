//! Running a stream for real: the audio thread and the network threads around the
//! sans-IO [`Sender`] and [`Receiver`].
//!
//! ```text
//!  endpoint (device clock) --process()--> Sender/Receiver  (audio thread: no alloc, no locks)
//!                                  ^  |
//!                         PacketRx |  | PacketTx            (lock-free rings)
//!                                  |  v
//!             receive thread <--- UDP socket ---> send thread (parked until woken)
//! ```
//!
//! A player ([`PlayerProcess`]: a room client's [`RoomProcess`], a two-player jam's
//! [`JamProcess`]) runs the player's audio half ([`netjam_engine::player::Media`]): it sends
//! once (to the room's server, or to the other player) and hears every other member through
//! a receiver of its own, mixed on the audio thread; the control side steers it with
//! [`Command`]s through a ring. A two-player jam is a room of one other member: the same
//! media, mixer and commands, with only the snapshot it publishes ([`JamStats`]) its own.
//! `send` and `recv` ([`SendProcess`], [`RecvProcess`]) are one half each, with no mix.
//!
//! The receive thread timestamps each datagram as it arrives, sorts it once
//! ([`netjam_engine::room::demux`]: control and STUN to a room client's control thread,
//! the rest to the audio thread with its kind, RTP, RTCP or neither, in the ring record)
//! and hands it on; the audio thread feeds the engine by that kind and plays. Packets the engine produces go to the send
//! thread, which the audio thread wakes with `unpark` (a futex wake that never blocks) so
//! nothing waits for a poll interval. Statistics come back as snapshots through a ring.
//!
//! Where the send thread sends each packet ([`SendRoute`]: the peer, fixed or learned by
//! the receive thread, and a room's direct paths, set by the room client's control thread)
//! is read per packet without a lock. With a `Mutex` there, a control thread at ordinary
//! priority preempted while it held the lock would hold back every packet behind it, a
//! priority inversion on the media path. Readers `load` an [`arc_swap::ArcSwap`] instead:
//! lock-free (wait-free in the common case), and allocation-free once the thread's first
//! load has set up its slots; writers store a fresh `Arc`, so they allocate, and only when
//! the value changes, and they free what they replaced once no reader holds it, so the
//! send thread never frees either. The send path must never lock, block, allocate or free
//! per packet (`tests/no_alloc_send.rs` counts it).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, ArcSwapOption};
use std::thread::{self, JoinHandle, Thread};
use std::time::Duration;

use netjam_engine::nat::direct::RouteTable;
use netjam_engine::player::{Command, Media, MediaConfig, MediaReport, Transmit};
use netjam_engine::receiver::{Receiver, ReceiverStats};
use netjam_engine::room::{demux, Demux};
use netjam_engine::sender::{Sender, SenderStats};
use netjam_engine::wire::PacketKind;

use crate::endpoint::Process;
use crate::ring::{packet_ring, PacketRx, PacketTx};
use crate::transport::UdpTransport;

/// Largest datagram handled.
pub const MAX_DATAGRAM: usize = 65_536;
/// Bytes of packets that may wait between threads (about a second of 8-channel f32 audio).
const RING_BYTES: usize = 2 << 20;

/// Where the send thread sends.
#[derive(Debug, Clone, Copy)]
pub enum Peer {
    /// Always this address.
    Fixed(SocketAddr),
    /// The source of the last RTP packet received (a receiver answering its sender).
    Learned,
}

/// Where the send thread sends each packet: to the peer (unless the room's route table
/// says not to) and straight to every direct address in the table. Shared by the send
/// thread, which reads it per packet without locking or allocating, the receive thread,
/// which learns the peer (with [`Peer::Learned`]), and a room client's control thread,
/// which sets the table. See the module docs for why it is not a `Mutex`.
pub struct SendRoute {
    peer: ArcSwapOption<SocketAddr>,
    table: ArcSwap<RouteTable>,
    /// Replaced values a reader still held when they were replaced, kept until none does:
    /// the writer frees them, never the send thread (a free can take the allocator's lock).
    /// Only writers touch these.
    retired_peers: Mutex<Vec<Arc<SocketAddr>>>,
    retired_tables: Mutex<Vec<Arc<RouteTable>>>,
}

/// Keeps `old`, just replaced, until no reader holds it, and frees the retired values no
/// reader holds any more, here on the writer's thread. Once the swap has returned every
/// reader holding `old` holds a counted reference, so a count of one is the writer's alone.
fn retire<T>(retired: &Mutex<Vec<Arc<T>>>, old: Arc<T>) {
    let Ok(mut retired) = retired.lock() else {
        return;
    };
    retired.retain(|a| Arc::strong_count(a) > 1);
    if Arc::strong_count(&old) > 1 {
        retired.push(old);
    }
}

impl std::fmt::Debug for SendRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendRoute")
            .field("peer", &self.peer())
            .field("table", &self.table())
            .finish()
    }
}

impl SendRoute {
    /// To `peer` (none yet: nothing goes to a peer until one is learned), no direct paths.
    pub fn new(peer: Option<SocketAddr>) -> Self {
        Self {
            peer: ArcSwapOption::new(peer.map(Arc::new)),
            table: ArcSwap::from_pointee(RouteTable::default()),
            retired_peers: Mutex::new(Vec::new()),
            retired_tables: Mutex::new(Vec::new()),
        }
    }

    /// Where packets to the peer go now. Lock-free; allocation-free after this thread's
    /// first load.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer.load().as_deref().copied()
    }

    /// The peer is now `from` (the source of an RTP packet): the receive thread, for
    /// every packet. Lock-free and allocation-free while the address stays; allocates,
    /// and takes a lock only writers of the peer take, when it changes.
    pub fn learn_peer(&self, from: SocketAddr) {
        if self.peer() != Some(from) {
            if let Some(old) = self.peer.swap(Some(Arc::new(from))) {
                retire(&self.retired_peers, old);
            }
        }
    }

    /// Send to `peer` from now on: a room client's control thread, when its room moves to
    /// another server (control from that server then reaches it too). As
    /// [`SendRoute::learn_peer`].
    pub fn set_peer(&self, peer: SocketAddr) {
        self.learn_peer(peer);
    }

    /// The route table in force. Lock-free; allocation-free after this thread's first load.
    pub fn table(&self) -> RouteTable {
        **self.table.load()
    }

    /// Send by `table` from now on: a control thread. Allocates, and takes a lock only
    /// writers of the table take, when the table changes.
    pub fn set_table(&self, table: RouteTable) {
        if self.table() != table {
            let old = self.table.swap(Arc::new(table));
            retire(&self.retired_tables, old);
        }
    }

    /// Send `packet` on `socket` where the route says: the send thread's whole per-packet
    /// work. Never locks, blocks (the socket is a UDP socket), allocates or frees, once
    /// this thread has loaded the route once. Errors are logged at debug level and the
    /// packet goes on to the other addresses.
    pub fn send(&self, socket: &UdpTransport, packet: &[u8]) {
        // Copies, so no guard is held across the system calls.
        let (to, table) = (self.peer(), self.table());
        if let (Some(to), true) = (to, table.to_server) {
            if let Err(e) = socket.send_to(packet, to) {
                tracing::debug!("send to {to}: {e}");
            }
        }
        for to in table.direct() {
            if let Err(e) = socket.send_to(packet, to) {
                tracing::debug!("send to {to}: {e}");
            }
        }
    }
}

/// The audio thread's ends of the rings, and how to wake the send thread.
#[derive(Debug)]
pub struct AudioLink {
    pub to_net: PacketTx,
    pub from_net: PacketRx,
    pub waker: Thread,
}

/// The network side of a session: its threads.
#[derive(Debug)]
pub struct NetIo {
    waker: Thread,
    /// Datagrams dropped because the ring to the audio thread was full.
    pub rx_overflow: Arc<std::sync::atomic::AtomicU64>,
    /// Control datagrams dropped: not from the peer, or the control thread was behind.
    pub control_dropped: Arc<std::sync::atomic::AtomicU64>,
    /// The socket, for a control thread that sends on it too.
    pub socket: Arc<UdpTransport>,
    /// Where each outgoing packet goes besides (or instead of) the peer: a room client's
    /// control thread sets its table from its direct paths; by default only to the peer.
    pub route: Arc<SendRoute>,
    pub local: SocketAddr,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl NetIo {
    /// Start the receive and send threads on `socket`.
    pub fn start(socket: UdpTransport, peer: Peer) -> anyhow::Result<(Self, AudioLink)> {
        Self::start_with_control(socket, peer, None)
    }

    /// Like [`NetIo::start`], but OSC datagrams (first byte `/`) from the peer (as
    /// [`NetIo::route`] names it now: a room client moves it to another server), and
    /// direct-path probes (`/netjam/probe`) from anyone, go to `control` instead of the
    /// audio thread (a room client's control thread); when that channel is full they are
    /// dropped and counted in [`NetIo::control_dropped`]. The send thread sends each
    /// packet as [`NetIo::route`] says: to the peer unless the table says not to, and
    /// straight to every address it names.
    pub fn start_with_control(
        socket: UdpTransport,
        peer: Peer,
        control: Option<std::sync::mpsc::SyncSender<crate::room_client::ControlDatagram>>,
    ) -> anyhow::Result<(Self, AudioLink)> {
        let local = socket.local_addr()?;
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        let socket = Arc::new(socket);
        let socket_out = socket.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let route = Arc::new(SendRoute::new(match peer {
            Peer::Fixed(a) => Some(a),
            Peer::Learned => None,
        }));
        let (to_audio, from_net) = packet_ring(RING_BYTES);
        let (to_net, mut from_audio) = packet_ring(RING_BYTES);
        let rx_overflow = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let control_dropped = Arc::new(std::sync::atomic::AtomicU64::new(0));

        let rx = {
            let (socket, stop, route, overflow, control_dropped) = (
                socket.clone(),
                stop.clone(),
                route.clone(),
                rx_overflow.clone(),
                control_dropped.clone(),
            );
            let mut to_audio = to_audio;
            thread::Builder::new().name("netjam-rx".into()).spawn(move || {
                crate::rt::promote_current_thread(crate::rt::network_priority());
                let mut buf = vec![0u8; MAX_DATAGRAM];
                // This thread's first load sets up its lock-free read slots: now, not on
                // the first packet.
                let _ = route.peer();
                while !stop.load(Ordering::Relaxed) {
                    match socket.recv(&mut buf) {
                        Ok(Some(r)) => {
                            // Sorted here, once: the audio thread takes the kind with the bytes.
                            let sorted = demux(&buf[..r.len]);
                            if let Some(control) = &control {
                                // Control comes from the peer the route names now (a room
                                // client moves it when its room moves to another server).
                                let control_from = route.peer();
                                // STUN answers from the server (asked again after a
                                // rejoin) go to the control thread too.
                                if Some(r.from) == control_from && sorted == Demux::Stun {
                                    if control
                                        .try_send((r.at_ns, r.from, buf[..r.len].to_vec()))
                                        .is_err()
                                    {
                                        control_dropped.fetch_add(1, Ordering::Relaxed);
                                    }
                                    continue;
                                }
                                if sorted == Demux::Control {
                                    let wanted = Some(r.from) == control_from
                                        || buf[..r.len].starts_with(crate::room_client::PROBE_PREFIX);
                                    if wanted
                                        && control.try_send((r.at_ns, r.from, buf[..r.len].to_vec())).is_ok()
                                    {
                                        continue;
                                    }
                                    control_dropped.fetch_add(1, Ordering::Relaxed);
                                    continue;
                                }
                            }
                            let kind = sorted.media_kind();
                            if matches!(peer, Peer::Learned) && kind == PacketKind::Rtp {
                                route.learn_peer(r.from);
                            }
                            // The playout clock cares when the audio thread can have the
                            // packet, so this thread's own wake-up delay counts as delay
                            // variation the buffer must cover (the kernel's time is earlier).
                            let available = crate::clock::now_ns().max(r.at_ns);
                            if !to_audio.push_kind(available, kind, &buf[..r.len]) {
                                overflow.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Ok(None) => {}
                        Err(e) => {
                            // ICMP port-unreachable from a peer that is not up yet: keep going.
                            tracing::debug!("receive: {e}");
                            thread::sleep(Duration::from_millis(5));
                        }
                    }
                }
            })?
        };
        let tx = {
            let (socket, stop, route) = (socket.clone(), stop.clone(), route.clone());
            thread::Builder::new().name("netjam-tx".into()).spawn(move || {
                crate::rt::promote_current_thread(crate::rt::network_priority());
                let mut buf = vec![0u8; MAX_DATAGRAM];
                // This thread's first load sets up its lock-free read slots: now, not on
                // the first packet.
                let _ = route.table();
                loop {
                    let mut sent_any = false;
                    while let Some((_, _, len)) = from_audio.pop(&mut buf) {
                        sent_any = true;
                        if len == 0 {
                            continue;
                        }
                        route.send(&socket, &buf[..len]);
                    }
                    if stop.load(Ordering::Relaxed) && !sent_any {
                        break;
                    }
                    thread::park_timeout(Duration::from_millis(20));
                }
            })?
        };
        let waker = tx.thread().clone();
        let link = AudioLink {
            to_net,
            from_net,
            waker: waker.clone(),
        };
        Ok((
            Self {
                waker,
                rx_overflow,
                control_dropped,
                socket: socket_out,
                route,
                local,
                threads: vec![rx, tx],
                stop,
            },
            link,
        ))
    }

    /// Stop the threads after the send thread has flushed what is queued.
    pub fn shutdown(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.waker.unpark();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// What the audio thread publishes a few times a second.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Snapshot<S> {
    /// Seconds of audio processed.
    pub t_s: f64,
    /// Peak level of the last interval, dBFS.
    pub peak_dbfs: f32,
    pub stats: S,
}

/// Publishes snapshots (ten a second unless told) without blocking the audio thread.
struct Publisher<S> {
    tx: rtrb::Producer<Snapshot<S>>,
    frames: u64,
    since: u64,
    every: u64,
    rate: u32,
    peak: f32,
}

impl<S: Copy> Publisher<S> {
    fn new(rate: u32) -> (Self, rtrb::Consumer<Snapshot<S>>) {
        Self::with_capacity(rate, 256, 10)
    }

    /// Room for `capacity` snapshots not yet taken (for large ones), `per_second` of them.
    fn with_capacity(rate: u32, capacity: usize, per_second: u32) -> (Self, rtrb::Consumer<Snapshot<S>>) {
        let (tx, rx) = rtrb::RingBuffer::new(capacity);
        (
            Self {
                tx,
                frames: 0,
                since: 0,
                every: (rate / per_second.max(1)).max(1) as u64,
                rate,
                peak: 0.0,
            },
            rx,
        )
    }

    fn tick(&mut self, frames: usize, audio: &[f32], stats: impl FnOnce() -> S) {
        self.peak = audio.iter().fold(self.peak, |m, x| m.max(x.abs()));
        self.frames += frames as u64;
        self.since += frames as u64;
        if self.since >= self.every {
            self.since = 0;
            let snap = Snapshot {
                t_s: self.frames as f64 / self.rate as f64,
                peak_dbfs: netjam_engine::mixer::amplitude_db(self.peak),
                stats: stats(),
            };
            self.peak = 0.0;
            let _ = self.tx.push(snap);
        }
    }
}

/// The audio thread's network plumbing, shared by every kind of stream: the rings, the
/// send thread's waker and pre-allocated buffers.
struct NetSide {
    to_net: PacketTx,
    from_net: PacketRx,
    waker: Thread,
    rx_buf: Vec<u8>,
    rtcp: Vec<u8>,
    /// Packets refused by a full ring (the network thread fell behind).
    tx_overflow: u64,
}

impl NetSide {
    fn new(link: AudioLink) -> Self {
        Self {
            to_net: link.to_net,
            from_net: link.from_net,
            waker: link.waker,
            rx_buf: vec![0; MAX_DATAGRAM],
            rtcp: vec![0; 1500],
            tx_overflow: 0,
        }
    }

    /// Queue the first `len` bytes of the RTCP buffer.
    fn send_rtcp(&mut self, now_ns: u64, len: usize) {
        if !self.to_net.push(now_ns, &self.rtcp[..len]) {
            self.tx_overflow += 1;
        }
    }

    /// Write `sender`'s final report and BYE, and wake the send thread.
    fn bye(&mut self, sender: &mut Sender, now_ns: u64) {
        if let Some(n) = sender.bye(now_ns, &mut self.rtcp) {
            self.send_rtcp(now_ns, n);
            self.waker.unpark();
        }
    }

    /// Packetize `input` through `sender` onto the ring.
    fn send_frames(&mut self, sender: &mut Sender, now_ns: u64, input: &[f32]) {
        let (to_net, overflow) = (&mut self.to_net, &mut self.tx_overflow);
        sender.push_frames(now_ns, input, |p| {
            if !to_net.push(now_ns, p) {
                *overflow += 1;
            }
        });
        if let Some(n) = sender.poll_rtcp(now_ns, &mut self.rtcp) {
            self.send_rtcp(now_ns, n);
        }
    }
}

/// The audio-thread side of `netjam send`.
pub struct SendProcess {
    pub sender: Sender,
    net: NetSide,
    publisher: Publisher<SenderStats>,
}

impl std::fmt::Debug for SendProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendProcess")
            .field("sender", &self.sender)
            .finish_non_exhaustive()
    }
}

impl SendProcess {
    pub fn new(sender: Sender, link: AudioLink, rate: u32) -> (Self, rtrb::Consumer<Snapshot<SenderStats>>) {
        let (publisher, rx) = Publisher::new(rate);
        (
            Self {
                sender,
                net: NetSide::new(link),
                publisher,
            },
            rx,
        )
    }

    /// Send a final report and BYE.
    pub fn finish(&mut self, now_ns: u64) {
        self.net.bye(&mut self.sender, now_ns);
    }

    /// Packets refused by a full ring.
    pub fn tx_overflow(&self) -> u64 {
        self.net.tx_overflow
    }
}

impl Process for SendProcess {
    fn skipped(&mut self, frames: u64) {
        self.sender.skip_frames(frames);
    }

    fn process(&mut self, now_ns: u64, input: &[f32], _output: &mut [f32]) {
        let net = &mut self.net;
        while let Some((at, kind, len)) = net.from_net.pop(&mut net.rx_buf) {
            if kind == PacketKind::Rtcp {
                self.sender.on_rtcp(at, &net.rx_buf[..len]);
            }
        }
        net.send_frames(&mut self.sender, now_ns, input);
        net.waker.unpark();
        let ch = self.sender.format().channels as usize;
        let sender = &self.sender;
        self.publisher.tick(input.len() / ch, input, || sender.stats());
    }
}

/// The audio-thread side of `netjam recv`.
pub struct RecvProcess {
    pub receiver: Receiver,
    net: NetSide,
    publisher: Publisher<ReceiverStats>,
}

impl std::fmt::Debug for RecvProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvProcess")
            .field("receiver", &self.receiver)
            .finish_non_exhaustive()
    }
}

impl RecvProcess {
    /// `rate` is the output rate.
    pub fn new(
        receiver: Receiver,
        link: AudioLink,
        rate: u32,
    ) -> (Self, rtrb::Consumer<Snapshot<ReceiverStats>>) {
        let (publisher, rx) = Publisher::new(rate);
        (
            Self {
                receiver,
                net: NetSide::new(link),
                publisher,
            },
            rx,
        )
    }

    /// Feed everything queued so far into the receiver.
    pub fn drain(&mut self) {
        let net = &mut self.net;
        while let Some((at, kind, len)) = net.from_net.pop(&mut net.rx_buf) {
            self.receiver.on_packet(at, kind, &net.rx_buf[..len]);
        }
    }
}

impl Process for RecvProcess {
    fn skipped(&mut self, frames: u64) {
        self.receiver.device_skipped(frames);
    }

    fn process(&mut self, now_ns: u64, _input: &[f32], output: &mut [f32]) {
        self.drain();
        self.receiver.play(now_ns, output);
        if let Some(n) = self.receiver.poll_rtcp(now_ns, &mut self.net.rtcp) {
            self.net.send_rtcp(now_ns, n);
            self.net.waker.unpark();
        }
        let ch = self.receiver.output_format().map_or(1, |f| f.channels as usize);
        let receiver = &self.receiver;
        self.publisher
            .tick(output.len() / ch, output, || receiver.stats());
    }
}

/// A process-wide stop flag set by Ctrl-C (installed once).
pub fn interrupt_flag() -> Arc<AtomicBool> {
    static FLAG: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();
    FLAG.get_or_init(|| {
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        if let Err(e) = ctrlc::set_handler(move || f.store(true, Ordering::Relaxed)) {
            tracing::warn!("Ctrl-C will not stop cleanly: {e}");
        }
        flag
    })
    .clone()
}

/// Run `endpoint` with `process` on a new audio thread; the handle gives the process back.
pub fn spawn_audio<P: Process + 'static>(
    name: &str,
    endpoint: Box<dyn crate::endpoint::Endpoint>,
    mut process: P,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<JoinHandle<anyhow::Result<(P, crate::endpoint::StopReason, crate::endpoint::PeriodStats)>>>
{
    Ok(thread::Builder::new().name(name.into()).spawn(move || {
        let (reason, stats) = endpoint.run(&mut process, stop)?;
        Ok((process, reason, stats))
    })?)
}

/// The most members a room client hears at once (the size of [`MediaReport::members`]).
pub const MAX_ROOM_MEMBERS: usize = netjam_engine::room::ROOM_SEATS;
/// Commands that may wait for the audio thread.
const ROOM_COMMANDS: usize = 256;
/// Room snapshots that may wait for the control side (each is a few kB).
const ROOM_SNAPSHOTS: usize = 32;
/// Room snapshots a second: the page's meters move at this rate (the status line and
/// `--stats-json` take one in every 100 ms of them).
pub const ROOM_SNAPSHOTS_PER_S: u32 = 25;

impl Transmit for NetSide {
    fn transmit(&mut self, now_ns: u64, datagram: &[u8]) {
        if !self.to_net.push(now_ns, datagram) {
            self.tx_overflow += 1;
        }
    }
}

/// The member id of the other player in a two-player jam (its track when recorded, the
/// member its gain and mute name).
pub const PEER_TRACK: netjam_engine::members::MemberId = 1;

/// What a two-player jam's audio thread publishes: both halves, and the in-band round trip.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct JamStats {
    pub sent: SenderStats,
    pub heard: ReceiverStats,
    /// The in-band mouth-to-ear round trip when measuring (see
    /// [`Media::measure_round_trip`]), ms.
    pub round_trip_ms: Option<f64>,
    /// Bursts the round-trip meter found, and lost.
    pub round_trip_found: u64,
    pub round_trip_lost: u64,
    /// How long the packet heard when the last round trip was measured had waited in the
    /// jitter buffer, so the stages of that round trip can be set beside it, ms.
    pub round_trip_buffer_ms: Option<f64>,
}

impl JamStats {
    /// What `media` (a jam's, hearing [`PEER_TRACK`]) says now.
    fn of(media: &mut Media) -> Self {
        let round_trip = media.round_trip();
        JamStats {
            sent: media.sender().stats(),
            heard: media
                .members()
                .receiver(0)
                .map(Receiver::stats)
                .unwrap_or_default(),
            round_trip_ms: round_trip.ms,
            round_trip_found: round_trip.found,
            round_trip_lost: round_trip.lost,
            round_trip_buffer_ms: round_trip.buffer_ms,
        }
    }
}

/// The audio thread's shell around a player's [`Media`]: the rings to and from the network
/// threads, the command ring from the control side, the snapshots for the views (`R`: a
/// room's [`MediaReport`], or a two-player jam's [`JamStats`]), the multitrack recording's
/// tap and the per-seat output ports. What the player does with audio is all in [`Media`]:
/// a two-player jam is a room of one other member ([`MediaConfig::one_peer`]), mixed,
/// limited and steered by [`Command`]s like a room.
///
/// ```no_run
/// # fn main() -> anyhow::Result<()> {
/// use netjam::session::{NetIo, Peer, RoomProcess};
/// use netjam::transport::UdpTransport;
/// use netjam_engine::player::{Command, MediaConfig};
/// use netjam_engine::sender::{Sender, SenderConfig};
/// use netjam_engine::wire::{AudioFormat, Codec};
///
/// let server = "192.0.2.1:4464".parse()?;
/// let socket = UdpTransport::bind("0.0.0.0:0".parse()?)?;
/// let (io, link) = NetIo::start(socket, Peer::Fixed(server))?;
/// let format = AudioFormat::new(Codec::L16, 48_000, 1)?;
/// let sender = Sender::new(SenderConfig::new(format, 64))?;
/// let (room, mut snapshots, mut commands) = RoomProcess::new(sender, link, MediaConfig::new(8, 2));
/// // The roster says who is in the room (ssrc, member id):
/// let _ = commands.push(Command::Assign { ssrc: 0x1234_5678, member: 1 });
/// let _ = commands.push(Command::Gain { member: 1, db: -6.0 });
/// // Run it on the device: `spawn_audio("netjam-audio", endpoint, room, stop)`; read
/// // `snapshots.pop()` for the status line; at the end `room.finish(now)` and `io.shutdown()`.
/// # let _ = (room, snapshots.pop(), io);
/// # Ok(()) }
/// ```
///
/// RTCP from the room goes to the sender (other members' reports about your stream) and
/// to the member it comes from (its sender reports); every member's receiver reports under
/// the sender's SSRC, so the room sees one SSRC per player.
pub struct PlayerProcess<R> {
    media: Media,
    net: NetSide,
    commands: rtrb::Consumer<Command>,
    publisher: Publisher<R>,
    /// What a snapshot holds, taken from the media (allocation-free).
    report: fn(&mut Media) -> R,
    /// The multitrack recording's audio-thread half, if recording.
    record: Option<crate::record::RecordTap>,
    /// Ports per seat that [`Process::extra_outputs`] fills (0: none).
    member_ports: usize,
}

/// A room client's audio thread.
pub type RoomProcess = PlayerProcess<MediaReport>;
/// A two-player jam's audio thread: a room of one other player.
pub type JamProcess = PlayerProcess<JamStats>;

impl<R> std::fmt::Debug for PlayerProcess<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlayerProcess")
            .field("media", &self.media)
            .finish_non_exhaustive()
    }
}

impl RoomProcess {
    /// Reserve everything for `config` (the only allocation). Returns the process, the
    /// snapshots it publishes ([`ROOM_SNAPSHOTS_PER_S`] a second), and the command ring's producer
    /// (for the control thread: OSC, the roster).
    pub fn new(
        sender: Sender,
        link: AudioLink,
        config: MediaConfig,
    ) -> (
        Self,
        rtrb::Consumer<Snapshot<MediaReport>>,
        rtrb::Producer<Command>,
    ) {
        let rate = sender.format().rate;
        let (publisher, snapshots) = Publisher::with_capacity(rate, ROOM_SNAPSHOTS, ROOM_SNAPSHOTS_PER_S);
        PlayerProcess::with(sender, link, config, publisher, Media::report, snapshots)
    }

    /// Everything a snapshot holds, taking the meters' readings (allocation-free).
    pub fn report(&mut self) -> MediaReport {
        self.media.report()
    }
}

impl JamProcess {
    /// A two-player jam: `config` hears the one other player as member [`PEER_TRACK`]
    /// whatever it says ([`MediaConfig::one_peer`] is set here). Returns the process, its
    /// snapshots (ten a second) and the command ring's producer (OSC).
    pub fn new(
        sender: Sender,
        link: AudioLink,
        config: MediaConfig,
    ) -> (Self, rtrb::Consumer<Snapshot<JamStats>>, rtrb::Producer<Command>) {
        let config = MediaConfig {
            one_peer: Some(PEER_TRACK),
            capacity: 1,
            admit_unknown: false,
            ..config
        };
        let (publisher, snapshots) = Publisher::new(sender.format().rate);
        PlayerProcess::with(sender, link, config, publisher, JamStats::of, snapshots)
    }

    /// Both halves' statistics and the round trip.
    pub fn stats(&mut self) -> JamStats {
        JamStats::of(&mut self.media)
    }

    /// The other player's receiver.
    pub fn heard(&self) -> Option<&Receiver> {
        self.media.members().receiver(0)
    }
}

impl<R: Copy> PlayerProcess<R> {
    fn with<S>(
        sender: Sender,
        link: AudioLink,
        config: MediaConfig,
        publisher: Publisher<R>,
        report: fn(&mut Media) -> R,
        snapshots: S,
    ) -> (Self, S, rtrb::Producer<Command>) {
        let (commands_tx, commands) = rtrb::RingBuffer::new(ROOM_COMMANDS);
        let p = Self {
            media: Media::new(sender, config),
            net: NetSide::new(link),
            commands,
            publisher,
            report,
            record: None,
            member_ports: 0,
        };
        (p, snapshots, commands_tx)
    }
}

impl<R> PlayerProcess<R> {
    /// The player's audio half (set it up before the stream starts: seal, buffer policy,
    /// round-trip meter, a first mix).
    pub fn media(&self) -> &Media {
        &self.media
    }

    pub fn media_mut(&mut self) -> &mut Media {
        &mut self.media
    }

    /// Record every member, the mix and your input from the next period on (see
    /// [`crate::record`]); set before the stream starts. [`Command::Record`] pauses and
    /// resumes it.
    pub fn set_recorder(&mut self, tap: crate::record::RecordTap) {
        self.record = Some(tap);
        self.media.allow_recording();
    }

    /// Stop recording: the writer writes what was queued and sees the end.
    pub fn take_recorder(&mut self) -> Option<crate::record::RecordTap> {
        self.record.take()
    }

    /// The recording's audio-thread half, if recording.
    pub fn recorder(&self) -> Option<&crate::record::RecordTap> {
        self.record.as_ref()
    }

    /// Send a final report and BYE.
    pub fn finish(&mut self, now_ns: u64) {
        self.media.finish(now_ns, &mut self.net);
        self.net.waker.unpark();
    }

    /// Packets refused by a full ring.
    pub fn tx_overflow(&self) -> u64 {
        self.net.tx_overflow
    }

    /// Fill `channels` extra output ports per control seat through
    /// [`Process::extra_outputs`] (see [`Media::member_ports`]).
    pub fn set_member_ports(&mut self, channels: usize) {
        self.member_ports = channels;
    }
}

impl<R: Copy + Send> Process for PlayerProcess<R> {
    fn skipped(&mut self, frames: u64) {
        self.media.skipped(frames);
        if let Some(tap) = &mut self.record {
            tap.skipped(frames);
        }
    }

    fn extra_outputs(&mut self, frames: usize, outputs: &mut [f32]) {
        self.media.member_ports(frames, self.member_ports, outputs);
    }

    fn process(&mut self, now_ns: u64, input: &[f32], output: &mut [f32]) {
        // Commands first: a member assigned now is heard from this period's packets on.
        while let Ok(command) = self.commands.pop() {
            self.media.apply(command);
        }
        let net = &mut self.net;
        while let Some((at, kind, len)) = net.from_net.pop(&mut net.rx_buf) {
            self.media.handle(at, kind, &mut net.rx_buf[..len]);
        }
        self.media.process(now_ns, input, output, &mut self.net);
        let frames = output.len() / self.media.mixer().out_channels().max(1);
        if let Some(tap) = &mut self.record {
            tap.set_armed(self.media.recording() == Some(true));
            tap.record(frames, input, output, self.media.members());
        }
        self.net.waker.unpark();
        let (media, report) = (&mut self.media, self.report);
        self.publisher.tick(frames, output, || report(media));
    }
}
