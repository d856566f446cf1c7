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
//! A room client ([`RoomProcess`]) sends once (to the room's server) and hears every other
//! member through a receiver of its own, mixed on the audio thread; the control side
//! steers it with [`RoomCommand`]s through a ring.
//!
//! The receive thread timestamps each datagram as it arrives and hands it to the audio
//! thread, which feeds the engine and plays. Packets the engine produces go to the send
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

use netjam_engine::limiter::LimiterStats;
use netjam_engine::members::{MemberId, MemberReceivers, MembersConfig, MembersStats};
use netjam_engine::mixer::{Level, Mixer, StripParams};
use netjam_engine::nat::direct::RouteTable;
use netjam_engine::receiver::{Receiver, ReceiverConfig, ReceiverStats};
use netjam_engine::roundtrip::RoundTripMeter;
use netjam_engine::sender::{Sender, SenderStats};
use netjam_engine::wire::{classify, PacketKind};

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
                crate::rt::promote_current_thread(crate::rt::NETWORK_PRIORITY);
                let mut buf = vec![0u8; MAX_DATAGRAM];
                // This thread's first load sets up its lock-free read slots: now, not on
                // the first packet.
                let _ = route.peer();
                while !stop.load(Ordering::Relaxed) {
                    match socket.recv(&mut buf) {
                        Ok(Some(r)) => {
                            if let Some(control) = &control {
                                // Control comes from the peer the route names now (a room
                                // client moves it when its room moves to another server).
                                let control_from = route.peer();
                                // STUN answers from the server (asked again after a
                                // rejoin) go to the control thread too.
                                if Some(r.from) == control_from
                                    && netjam_engine::room::demux(&buf[..r.len])
                                        == netjam_engine::room::Demux::Stun
                                {
                                    if control
                                        .try_send((r.at_ns, r.from, buf[..r.len].to_vec()))
                                        .is_err()
                                    {
                                        control_dropped.fetch_add(1, Ordering::Relaxed);
                                    }
                                    continue;
                                }
                                if buf[..r.len].first() == Some(&b'/') {
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
                            if matches!(peer, Peer::Learned) && classify(&buf[..r.len]) == PacketKind::Rtp {
                                route.learn_peer(r.from);
                            }
                            // The playout clock cares when the audio thread can have the
                            // packet, so this thread's own wake-up delay counts as delay
                            // variation the buffer must cover (the kernel's time is earlier).
                            let available = crate::clock::now_ns().max(r.at_ns);
                            if !to_audio.push(available, &buf[..r.len]) {
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
                crate::rt::promote_current_thread(crate::rt::NETWORK_PRIORITY);
                let mut buf = vec![0u8; MAX_DATAGRAM];
                // This thread's first load sets up its lock-free read slots: now, not on
                // the first packet.
                let _ = route.table();
                loop {
                    let mut sent_any = false;
                    while let Some((_, len)) = from_audio.pop(&mut buf) {
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

/// Publishes snapshots about ten times a second without blocking the audio thread.
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
        Self::with_capacity(rate, 256)
    }

    /// Room for `capacity` snapshots not yet taken (for large ones).
    fn with_capacity(rate: u32, capacity: usize) -> (Self, rtrb::Consumer<Snapshot<S>>) {
        let (tx, rx) = rtrb::RingBuffer::new(capacity);
        (
            Self {
                tx,
                frames: 0,
                since: 0,
                every: rate as u64 / 10,
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
    /// A private room's sealing of what is sent and opening of what is heard.
    seal: Option<crate::sealed::MediaSeal>,
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
            seal: None,
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
        let (to_net, overflow, seal) = (&mut self.to_net, &mut self.tx_overflow, &mut self.seal);
        sender.push_frames(now_ns, input, |p| {
            let p = match seal {
                Some(seal) => match seal.seal(p) {
                    Some(sealed) => sealed,
                    None => return,
                },
                None => p,
            };
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
        while let Some((at, len)) = net.from_net.pop(&mut net.rx_buf) {
            if classify(&net.rx_buf[..len]) == PacketKind::Rtcp {
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
        while let Some((at, len)) = net.from_net.pop(&mut net.rx_buf) {
            self.receiver.on_datagram(at, &net.rx_buf[..len]);
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

/// What a jam's audio thread publishes: both halves, and the in-band round trip.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct JamStats {
    pub sent: SenderStats,
    pub heard: ReceiverStats,
    /// The in-band mouth-to-ear round trip when measuring (see
    /// [`JamProcess::measure_round_trip`]), ms.
    pub round_trip_ms: Option<f64>,
    /// Bursts the round-trip meter found, and lost.
    pub round_trip_found: u64,
    pub round_trip_lost: u64,
    /// How long the packet heard when the last round trip was measured had waited in the
    /// jitter buffer, so the stages of that round trip can be set beside it, ms.
    pub round_trip_buffer_ms: Option<f64>,
}

/// The audio-thread side of `netjam jam`: send what you play, hear what they play, on one
/// socket. RTCP from the peer goes to both halves (its SR to the receiver, its RR to the
/// sender), so both RTT and the far side's view of our stream are measured.
pub struct JamProcess {
    pub sender: Sender,
    pub receiver: Receiver,
    net: NetSide,
    /// f32 bits of the linear gain applied to what is heard; 0 mutes.
    gain: Arc<std::sync::atomic::AtomicU32>,
    publisher: Publisher<JamStats>,
    meter: RoundTripMeter,
    measuring: bool,
    /// The buffer's wait when the meter last found its burst.
    buffer_at_round_trip_ms: Option<f64>,
    /// What is sent: the input plus, when measuring, the meter's burst.
    outgoing: Vec<f32>,
    record: Option<crate::record::RecordTap>,
}

/// The member id of the other player's track when a two-player jam is recorded.
pub const PEER_TRACK: MemberId = 1;

impl std::fmt::Debug for JamProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JamProcess")
            .field("sender", &self.sender)
            .field("receiver", &self.receiver)
            .finish_non_exhaustive()
    }
}

impl JamProcess {
    /// `gain` holds the f32 bits of the linear gain for what is heard (changeable live).
    pub fn new(
        sender: Sender,
        receiver: Receiver,
        link: AudioLink,
        gain: Arc<std::sync::atomic::AtomicU32>,
    ) -> (Self, rtrb::Consumer<Snapshot<JamStats>>) {
        let format = sender.format();
        let (publisher, rx) = Publisher::new(format.rate);
        let outgoing = vec![0.0; netjam_engine::jitter::MAX_PERIOD * format.channels as usize];
        let meter = RoundTripMeter::new(format.rate as u64, format.rate as u64 / 2);
        let p = Self {
            sender,
            receiver,
            net: NetSide::new(link),
            gain,
            publisher,
            meter,
            measuring: false,
            buffer_at_round_trip_ms: None,
            outgoing,
            record: None,
        };
        (p, rx)
    }

    /// Record your input, what you hear and the other player (as member [`PEER_TRACK`],
    /// before your gain and mute) from the next period on (see [`crate::record`]); set
    /// before the stream starts.
    pub fn set_recorder(&mut self, tap: crate::record::RecordTap) {
        self.record = Some(tap);
    }

    /// The recording's tap, taken back once the stream stopped (dropping it ends the writer).
    pub fn take_recorder(&mut self) -> Option<crate::record::RecordTap> {
        self.record.take()
    }

    /// Measure the mouth-to-ear round trip in band: once a second a short quiet burst goes
    /// out on the first channel and is looked for in what comes back. Meaningful when the
    /// far end loops the audio back (`netjam reflect`, or a player monitoring through).
    pub fn measure_round_trip(&mut self, on: bool) {
        self.measuring = on;
    }

    /// Send a final report and BYE.
    pub fn finish(&mut self, now_ns: u64) {
        self.net.bye(&mut self.sender, now_ns);
    }

    /// Packets refused by a full ring.
    pub fn tx_overflow(&self) -> u64 {
        self.net.tx_overflow
    }

    /// Both halves' statistics and the round trip.
    pub fn stats(&self) -> JamStats {
        jam_stats(
            &self.sender,
            &self.receiver,
            &self.meter,
            self.buffer_at_round_trip_ms,
        )
    }
}

fn jam_stats(
    sender: &Sender,
    receiver: &Receiver,
    meter: &RoundTripMeter,
    buffer_at_round_trip_ms: Option<f64>,
) -> JamStats {
    let (found, lost) = meter.counts();
    let rate = sender.format().rate as f64;
    JamStats {
        sent: sender.stats(),
        heard: receiver.stats(),
        round_trip_ms: meter.last_rtt_frames().map(|f| f as f64 * 1000.0 / rate),
        round_trip_found: found,
        round_trip_lost: lost,
        round_trip_buffer_ms: buffer_at_round_trip_ms,
    }
}

impl Process for JamProcess {
    fn skipped(&mut self, frames: u64) {
        self.sender.skip_frames(frames);
        self.receiver.device_skipped(frames);
        if let Some(tap) = &mut self.record {
            tap.skipped(frames);
        }
    }

    fn process(&mut self, now_ns: u64, input: &[f32], output: &mut [f32]) {
        let net = &mut self.net;
        while let Some((at, len)) = net.from_net.pop(&mut net.rx_buf) {
            let bytes = &net.rx_buf[..len];
            if classify(bytes) == PacketKind::Rtcp {
                self.sender.on_rtcp(at, bytes);
            }
            self.receiver.on_datagram(at, bytes);
        }
        let channels = self.sender.format().channels as usize;
        if self.measuring && input.len() <= self.outgoing.len() {
            let outgoing = &mut self.outgoing[..input.len()];
            outgoing.copy_from_slice(input);
            self.meter.on_outgoing(outgoing, channels);
            net.send_frames(&mut self.sender, now_ns, outgoing);
        } else {
            net.send_frames(&mut self.sender, now_ns, input);
        }
        self.receiver.play(now_ns, output);
        let heard_channels = self.receiver.output_format().map_or(1, |f| f.channels as usize);
        if self.measuring {
            // Before the gain: muting the other player must not blind the meter.
            let found = self.meter.counts().0;
            self.meter.on_incoming(output, heard_channels);
            if self.meter.counts().0 != found {
                self.buffer_at_round_trip_ms = self.receiver.last_residence_ms();
            }
        }
        let gain = f32::from_bits(self.gain.load(Ordering::Relaxed));
        if let Some(tap) = &mut self.record {
            let frames = output.len() / heard_channels.max(1);
            tap.record_peer(frames, input, output, heard_channels, gain, PEER_TRACK);
        }
        if gain != 1.0 {
            output.iter_mut().for_each(|x| *x *= gain);
        }
        if let Some(n) = self.receiver.poll_rtcp(now_ns, &mut net.rtcp) {
            net.send_rtcp(now_ns, n);
        }
        net.waker.unpark();
        let (sender, receiver, meter) = (&self.sender, &self.receiver, &self.meter);
        let buffered = self.buffer_at_round_trip_ms;
        self.publisher
            .tick(output.len() / heard_channels.max(1), output, || {
                jam_stats(sender, receiver, meter, buffered)
            });
    }
}

/// Port `c` of `per_seat` for one seat: what the member there rendered (interleaved, its
/// own channel count), or silence (see [`RoomProcess::set_member_ports`]).
fn member_port(heard: Option<(&[f32], usize)>, per_seat: usize, c: usize, port: &mut [f32]) {
    let Some((audio, channels)) = heard.filter(|(_, ch)| *ch > 0) else {
        port.fill(0.0);
        return;
    };
    let frames = port.len().min(audio.len() / channels);
    if channels == 1 {
        port[..frames].copy_from_slice(&audio[..frames]);
    } else if per_seat == 1 {
        let scale = 1.0 / channels as f32;
        for (x, frame) in port.iter_mut().zip(audio.chunks_exact(channels)) {
            *x = frame.iter().sum::<f32>() * scale;
        }
    } else if c < channels {
        for (x, frame) in port.iter_mut().zip(audio.chunks_exact(channels)) {
            *x = frame[c];
        }
    } else {
        port[..frames].fill(0.0);
    }
    port[frames..].fill(0.0);
}

/// Frames of send scratch reserved per channel (longer periods are sent in parts).
const SEND_SCRATCH_FRAMES: usize = 4096;

/// A send gain in dB, or silence when muted.
fn send_linear(db: f32, mute: bool) -> f32 {
    netjam_engine::mixer::fader_gain(db.min(12.0), mute || db.is_nan())
}

/// The most members a room client hears at once (the size of [`RoomStats::members`]).
pub const MAX_ROOM_MEMBERS: usize = netjam_engine::room::ROOM_SEATS;
/// Commands that may wait for the audio thread.
const ROOM_COMMANDS: usize = 256;
/// Room snapshots that may wait for the control side (each is a few kB).
const ROOM_SNAPSHOTS: usize = 32;

/// A change for a room's audio thread (see [`RoomProcess`]). Members are named by the
/// control side's ids; a member's mix settings apply once it is assigned, so send
/// `Assign` first (the ring keeps the order).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum RoomCommand {
    /// Hear `ssrc` as `member`, at unity gain, centred, unmuted.
    Assign {
        ssrc: u32,
        member: MemberId,
    },
    /// Stop hearing `ssrc`; its slot falls silent and is free.
    Release {
        ssrc: u32,
    },
    /// A member's gain in dB (−∞ is silence; at most +12).
    Gain {
        member: MemberId,
        db: f32,
    },
    /// A member's pan, −1 (left) ..= 1 (right).
    Pan {
        member: MemberId,
        pan: f32,
    },
    Mute {
        member: MemberId,
        mute: bool,
    },
    /// Your own signal in your ears (the local monitor, never through the network).
    MonitorGain {
        db: f32,
    },
    MonitorPan {
        pan: f32,
    },
    MonitorMute {
        mute: bool,
    },
    /// Gain on the whole mix you hear, before its limiter, in dB (ramped like a member's;
    /// −∞ is silence; at most +12).
    MasterGain {
        db: f32,
    },
    /// Gain on what you send, in dB (ramped over the next period; −∞ is silence).
    SendGain {
        db: f32,
    },
    /// Send silence (the stream keeps flowing, so the others' buffers stay primed).
    SendMute {
        mute: bool,
    },
    /// Every member's buffer policy.
    Latency {
        policy: netjam_engine::delay::LatencyPolicy,
    },
    /// Pause (`false`) or resume the recording set with [`RoomProcess::set_recorder`].
    Record {
        on: bool,
    },
    /// `member` sits at control seat `seat` (0..[`MAX_ROOM_MEMBERS`]), whose per-member
    /// ports carry its audio (see [`RoomProcess::set_member_ports`]); a member has one seat,
    /// a seat one member. Send after its `Assign`; a `Release` frees the seat.
    Seat {
        member: MemberId,
        seat: u16,
    },
}

/// How a [`RoomProcess`] is set up.
#[derive(Debug, Clone)]
pub struct RoomConfig {
    /// Members heard at once (1..=[`MAX_ROOM_MEMBERS`]).
    pub capacity: usize,
    /// Channels of the output (device) the mix is played into.
    pub out_channels: usize,
    /// Every member's receiver is made from this (`max_channels`: the most a member may
    /// send; `buffer`, `decoders` as for `jam`).
    pub receiver: ReceiverConfig,
    /// Follow each member's clock by resampling.
    pub drift_correction: bool,
    /// Hear any SSRC that arrives, up to `capacity`, without an `Assign` (peer-to-peer or
    /// tests; a room leaves it off so that only the roster is heard).
    pub admit_unknown: bool,
}

impl RoomConfig {
    /// `capacity` members of up to two channels each, into `out_channels`; drift
    /// correction on, unknown SSRCs dropped.
    pub fn new(capacity: usize, out_channels: usize) -> Self {
        Self {
            capacity,
            out_channels,
            receiver: ReceiverConfig::new(2),
            drift_correction: true,
            admit_unknown: false,
        }
    }
}

/// One member as the audio thread last saw it.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct RoomMemberStats {
    /// Whether the slot is held (the rest is meaningful only then).
    pub active: bool,
    pub ssrc: u32,
    pub member: MemberId,
    /// Its mix settings.
    pub mix: StripParams,
    /// What it sent since the last snapshot, before its gain.
    pub level: Level,
    pub heard: ReceiverStats,
    /// Round trip to this member through the server, from its reports on your stream; ms.
    pub rtt_ms: Option<f64>,
}

/// What a room's audio thread publishes: what you send, and each member you hear.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct RoomStats {
    pub sent: SenderStats,
    pub routing: MembersStats,
    /// By slot; see [`RoomStats::active_members`].
    pub members: [RoomMemberStats; MAX_ROOM_MEMBERS],
    /// Your own signal since the last snapshot, before the monitor gain.
    pub monitor: Level,
    pub monitor_mix: StripParams,
    /// Linear gain on the whole mix, before the limiter.
    pub master_gain: f32,
    /// What the mix's output limiter did (its most gain reduction is since the last
    /// snapshot).
    pub limiter: LimiterStats,
    /// Commands applied, and those refused (no free slot, or no such member or SSRC).
    pub commands: u64,
    pub command_errors: u64,
    /// The in-band mouth-to-ear round trip through the room when measuring (see
    /// [`RoomProcess::measure_round_trip`]), ms.
    pub round_trip_ms: Option<f64>,
    /// Bursts the round-trip meter found, and lost.
    pub round_trip_found: u64,
    pub round_trip_lost: u64,
    /// A private room's SFrame stage (`None`: the room has no password).
    pub sframe: Option<crate::sealed::SealStats>,
}

impl RoomStats {
    /// The members heard.
    pub fn active_members(&self) -> impl Iterator<Item = &RoomMemberStats> {
        self.members.iter().filter(|m| m.active)
    }
}

/// The audio-thread side of a room client: send what you play through one [`Sender`]
/// (to the room's server), hear every other member through a receiver of its own, mixed
/// with per-member gain, pan and mute, plus your own signal as a local monitor, through a
/// master gain and the mix's output limiter (so what you hear never exceeds full scale).
///
/// Built from library code:
///
/// ```no_run
/// # fn main() -> anyhow::Result<()> {
/// use netjam::session::{NetIo, Peer, RoomCommand, RoomConfig, RoomProcess};
/// use netjam::transport::UdpTransport;
/// use netjam_engine::sender::{Sender, SenderConfig};
/// use netjam_engine::wire::{AudioFormat, Codec};
///
/// let server = "192.0.2.1:4464".parse()?;
/// let socket = UdpTransport::bind("0.0.0.0:0".parse()?)?;
/// let (io, link) = NetIo::start(socket, Peer::Fixed(server))?;
/// let format = AudioFormat::new(Codec::L16, 48_000, 1)?;
/// let sender = Sender::new(SenderConfig::new(format, 64))?;
/// let (room, mut snapshots, mut commands) = RoomProcess::new(sender, link, RoomConfig::new(8, 2));
/// // The roster says who is in the room (ssrc, member id):
/// let _ = commands.push(RoomCommand::Assign { ssrc: 0x1234_5678, member: 1 });
/// let _ = commands.push(RoomCommand::Gain { member: 1, db: -6.0 });
/// // Run it on the device: `spawn_audio("netjam-audio", endpoint, room, stop)`; read
/// // `snapshots.pop()` for the status line; at the end `room.finish(now)` and `io.shutdown()`.
/// # let _ = (room, snapshots.pop(), io);
/// # Ok(()) }
/// ```
///
/// RTCP from the room goes to the sender (other members' reports about your stream) and
/// to the member it comes from (its sender reports); every member's receiver reports under
/// the sender's SSRC, so the room sees one SSRC per player.
pub struct RoomProcess {
    pub sender: Sender,
    members: MemberReceivers,
    mixer: Mixer,
    out_channels: usize,
    net: NetSide,
    commands: rtrb::Consumer<RoomCommand>,
    commands_applied: u64,
    command_errors: u64,
    publisher: Publisher<RoomStats>,
    /// Linear gain on what is sent now, and where the ramp is going.
    send_gain: f32,
    send_target: f32,
    send_db: f32,
    send_mute: bool,
    /// What is sent when the gain is not unity (reserved at start; longer periods go in parts).
    send_scratch: Vec<f32>,
    /// The multitrack recording's audio-thread half, if recording.
    record: Option<crate::record::RecordTap>,
    /// Who sits at each control seat (from [`RoomCommand::Seat`]).
    seats: [Option<MemberId>; MAX_ROOM_MEMBERS],
    /// Ports per seat that [`Process::extra_outputs`] fills (0: none).
    member_ports: usize,
    meter: RoundTripMeter,
    measuring: bool,
    /// What is sent while measuring: the input plus the meter's burst (reserved at start).
    measure_scratch: Vec<f32>,
}

impl std::fmt::Debug for RoomProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoomProcess")
            .field("sender", &self.sender)
            .field("members", &self.members)
            .finish_non_exhaustive()
    }
}

impl RoomProcess {
    /// Reserve everything for `config` (the only allocation). Returns the process, the
    /// snapshots it publishes about ten times a second, and the command ring's producer
    /// (for the control thread: OSC, the roster).
    pub fn new(
        sender: Sender,
        link: AudioLink,
        config: RoomConfig,
    ) -> (
        Self,
        rtrb::Consumer<Snapshot<RoomStats>>,
        rtrb::Producer<RoomCommand>,
    ) {
        let rate = sender.format().rate;
        let channels_in = sender.format().channels;
        let capacity = config.capacity.clamp(1, MAX_ROOM_MEMBERS);
        let out_channels = config.out_channels.max(1);
        let mut members = MemberReceivers::new(MembersConfig {
            capacity,
            receiver: config.receiver,
            rate,
            admit_unknown: config.admit_unknown,
        });
        members.set_reporter_ssrc(sender.ssrc());
        members.set_drift_correction(config.drift_correction);
        let (publisher, snapshots) = Publisher::with_capacity(rate, ROOM_SNAPSHOTS);
        let (commands_tx, commands) = rtrb::RingBuffer::new(ROOM_COMMANDS);
        let p = Self {
            sender,
            members,
            mixer: Mixer::new(capacity, out_channels, rate),
            out_channels,
            net: NetSide::new(link),
            commands,
            commands_applied: 0,
            command_errors: 0,
            publisher,
            send_gain: 1.0,
            send_target: 1.0,
            send_db: 0.0,
            send_mute: false,
            send_scratch: vec![0.0; SEND_SCRATCH_FRAMES * usize::from(channels_in.max(1))],
            record: None,
            seats: [None; MAX_ROOM_MEMBERS],
            member_ports: 0,
            meter: RoundTripMeter::new(u64::from(rate), u64::from(rate) / 2),
            measuring: false,
            measure_scratch: vec![0.0; netjam_engine::jitter::MAX_PERIOD * usize::from(channels_in.max(1))],
        };
        (p, snapshots, commands_tx)
    }

    /// Measure the mouth-to-ear round trip through the room in band: once a second a short
    /// quiet burst goes out on the first channel of what you send and is looked for in the
    /// first channel of the members' mix (before your own monitor is added). It comes back
    /// when another member sends you what they hear (a player monitoring through): the
    /// figure is then your device, the server both ways, their jitter buffer and device,
    /// and yours. A member muted in your mix blinds it.
    pub fn measure_round_trip(&mut self, on: bool) {
        self.measuring = on;
    }

    /// The members' receivers (statistics, events).
    pub fn members(&self) -> &MemberReceivers {
        &self.members
    }

    /// The members' receivers, to set them up before the stream starts (buffer policy).
    pub fn members_mut(&mut self) -> &mut MemberReceivers {
        &mut self.members
    }

    /// Send what `input` holds through the send gain: as it is at unity, else scaled
    /// (ramping from the last gain to the new one over the period) in reserved parts.
    fn send_input(&mut self, now_ns: u64, input: &[f32]) {
        if self.send_gain == 1.0 && self.send_target == 1.0 {
            self.net.send_frames(&mut self.sender, now_ns, input);
            return;
        }
        let channels = usize::from(self.sender.format().channels.max(1));
        let frames = input.len() / channels;
        let (from, to) = (self.send_gain, self.send_target);
        let part = self.send_scratch.len();
        let mut done = 0;
        for chunk in input.chunks(part) {
            let out = &mut self.send_scratch[..chunk.len()];
            for (k, (o, x)) in out.iter_mut().zip(chunk).enumerate() {
                let frame = (done + k) / channels;
                let g = from + (to - from) * (frame + 1) as f32 / frames.max(1) as f32;
                *o = x * g;
            }
            done += chunk.len();
            self.net
                .send_frames(&mut self.sender, now_ns, &self.send_scratch[..chunk.len()]);
        }
        self.send_gain = to;
    }

    pub fn mixer(&self) -> &Mixer {
        &self.mixer
    }

    /// Record every member, the mix and your input from the next period on (see
    /// [`crate::record`]); set before the stream starts.
    pub fn set_recorder(&mut self, tap: crate::record::RecordTap) {
        self.record = Some(tap);
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
        self.net.bye(&mut self.sender, now_ns);
    }

    /// Packets refused by a full ring.
    pub fn tx_overflow(&self) -> u64 {
        self.net.tx_overflow
    }

    /// Make this a private room's player: seal what it sends and open what it hears with
    /// `seal` (see [`crate::sealed`]); set before the stream starts, before any `Assign`.
    /// A member's packets that do not open are dropped and counted.
    pub fn set_seal(&mut self, seal: crate::sealed::MediaSeal) {
        self.net.seal = Some(seal);
    }

    /// Fill `channels` extra output ports per control seat ([`MAX_ROOM_MEMBERS`] seats,
    /// seat by seat: seat s, channel c is port `s × channels + c`) through
    /// [`Process::extra_outputs`]: the member at the seat as its receiver rendered it (before
    /// your gain, pan and mute, like the recording), silence where nobody sits. A mono
    /// member is on every port of its seat, a stereo one on a single port as the mean of
    /// its channels; otherwise port c carries channel c (silence past its last).
    pub fn set_member_ports(&mut self, channels: usize) {
        self.member_ports = channels;
    }

    /// The member at each control seat, as the audio thread knows it.
    pub fn seats(&self) -> &[Option<MemberId>; MAX_ROOM_MEMBERS] {
        &self.seats
    }

    /// Apply one command (what [`Process::process`] does with each it finds on the ring).
    pub fn apply(&mut self, command: RoomCommand) {
        let ok = match command {
            RoomCommand::Assign { ssrc, member } => {
                let new = self.members.slot_of(ssrc).is_none()
                    || self.members.slot_of_member(member) != self.members.slot_of(ssrc);
                match self.members.assign(ssrc, member) {
                    Ok(slot) => {
                        if new {
                            self.mixer.reset_strip(slot);
                        }
                        if let Some(seal) = &mut self.net.seal {
                            seal.assign(slot, ssrc);
                        }
                        true
                    }
                    Err(_) => false,
                }
            }
            RoomCommand::Release { ssrc } => {
                if let Some(owner) = self.members.slot_of(ssrc).and_then(|s| self.members.owner(s)) {
                    for seat in &mut self.seats {
                        if *seat == Some(owner.member) {
                            *seat = None;
                        }
                    }
                }
                self.members.release(ssrc).is_some()
            }
            RoomCommand::Seat { member, seat } => match self.seats.get_mut(usize::from(seat)) {
                Some(at) => {
                    *at = Some(member);
                    for (s, other) in self.seats.iter_mut().enumerate() {
                        if s != usize::from(seat) && *other == Some(member) {
                            *other = None;
                        }
                    }
                    true
                }
                None => false,
            },
            RoomCommand::Gain { member, db } => self.with_member(member, |m, s| m.set_gain_db(s, db)),
            RoomCommand::Pan { member, pan } => self.with_member(member, |m, s| m.set_pan(s, pan)),
            RoomCommand::Mute { member, mute } => self.with_member(member, |m, s| m.set_mute(s, mute)),
            RoomCommand::MonitorGain { db } => {
                self.mixer.set_monitor_gain_db(db);
                true
            }
            RoomCommand::MonitorPan { pan } => {
                self.mixer.set_monitor_pan(pan);
                true
            }
            RoomCommand::SendGain { db } => {
                self.send_db = db;
                self.send_target = send_linear(db, self.send_mute);
                true
            }
            RoomCommand::SendMute { mute } => {
                self.send_mute = mute;
                self.send_target = send_linear(self.send_db, mute);
                true
            }
            RoomCommand::Latency { policy } => {
                self.members.set_latency_policy(policy);
                true
            }
            RoomCommand::MonitorMute { mute } => {
                self.mixer.set_monitor_mute(mute);
                true
            }
            RoomCommand::MasterGain { db } => {
                self.mixer.set_master_gain_db(db);
                true
            }
            RoomCommand::Record { on } => match &mut self.record {
                Some(tap) => {
                    tap.set_armed(on);
                    true
                }
                None => false,
            },
        };
        if ok {
            self.commands_applied += 1;
        } else {
            self.command_errors += 1;
        }
    }

    fn with_member(&mut self, member: MemberId, f: impl FnOnce(&mut Mixer, usize)) -> bool {
        match self.members.slot_of_member(member) {
            Some(slot) => {
                f(&mut self.mixer, slot);
                true
            }
            None => false,
        }
    }

    /// Everything a snapshot holds, taking the meters' readings (allocation-free).
    pub fn take_stats(&mut self) -> RoomStats {
        let mut s = room_stats(
            &self.sender,
            &self.members,
            &mut self.mixer,
            &self.meter,
            self.commands_applied,
            self.command_errors,
        );
        s.sframe = self.net.seal.as_ref().map(|seal| seal.stats());
        s
    }
}

fn room_stats(
    sender: &Sender,
    members: &MemberReceivers,
    mixer: &mut Mixer,
    meter: &RoundTripMeter,
    commands: u64,
    command_errors: u64,
) -> RoomStats {
    let (found, lost) = meter.counts();
    let rate = f64::from(sender.format().rate);
    let mut s = RoomStats {
        sent: sender.stats(),
        routing: members.stats(),
        monitor: mixer.take_monitor_level(),
        monitor_mix: mixer.monitor_params(),
        master_gain: mixer.master_gain(),
        limiter: mixer.take_limiter(),
        commands,
        command_errors,
        round_trip_ms: meter.last_rtt_frames().map(|f| f as f64 * 1000.0 / rate),
        round_trip_found: found,
        round_trip_lost: lost,
        ..RoomStats::default()
    };
    for (slot, m) in s.members.iter_mut().enumerate().take(members.capacity()) {
        let level = mixer.take_level(slot);
        if let Some((owner, heard)) = members.member_stats(slot) {
            *m = RoomMemberStats {
                active: true,
                ssrc: owner.ssrc,
                member: owner.member,
                mix: mixer.params(slot).unwrap_or_default(),
                level,
                heard,
                rtt_ms: sender.rtt_to_ms(owner.ssrc),
            };
        }
    }
    s
}

impl Process for RoomProcess {
    fn skipped(&mut self, frames: u64) {
        self.sender.skip_frames(frames);
        self.members.device_skipped(frames);
        if let Some(tap) = &mut self.record {
            tap.skipped(frames);
        }
    }

    fn extra_outputs(&mut self, frames: usize, outputs: &mut [f32]) {
        let per_seat = self.member_ports;
        if per_seat == 0 || frames == 0 {
            outputs.fill(0.0);
            return;
        }
        let mut ports = outputs.chunks_exact_mut(frames);
        for seat in 0..MAX_ROOM_MEMBERS {
            let heard = self.seats[seat]
                .and_then(|m| self.members.slot_of_member(m))
                .and_then(|slot| self.members.output(slot));
            for c in 0..per_seat {
                let Some(port) = ports.next() else { return };
                member_port(heard, per_seat, c, port);
            }
        }
        for port in ports {
            port.fill(0.0);
        }
    }

    fn process(&mut self, now_ns: u64, input: &[f32], output: &mut [f32]) {
        // Commands first: a member assigned now is heard from this period's packets on.
        while let Ok(command) = self.commands.pop() {
            self.apply(command);
        }
        let net = &mut self.net;
        while let Some((at, len)) = net.from_net.pop(&mut net.rx_buf) {
            let kind = classify(&net.rx_buf[..len]);
            let len = match (&mut net.seal, kind) {
                // A private room: a member's packet is heard only if it opens.
                (Some(seal), PacketKind::Rtp) => {
                    let ssrc = net
                        .rx_buf
                        .get(8..12)
                        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                    match seal.open(ssrc.and_then(|s| self.members.slot_of(s)), &mut net.rx_buf[..len]) {
                        Some(n) => n,
                        None => continue,
                    }
                }
                _ => len,
            };
            let bytes = &net.rx_buf[..len];
            if kind == PacketKind::Rtcp {
                self.sender.on_rtcp(at, bytes);
            }
            self.members.receive(at, bytes);
        }
        let in_channels = self.sender.format().channels as usize;
        if self.measuring && input.len() <= self.measure_scratch.len() {
            // Taken and put back: no allocation.
            let mut scratch = std::mem::take(&mut self.measure_scratch);
            let outgoing = &mut scratch[..input.len()];
            outgoing.copy_from_slice(input);
            self.meter.on_outgoing(outgoing, in_channels);
            self.send_input(now_ns, outgoing);
            self.measure_scratch = scratch;
        } else {
            self.send_input(now_ns, input);
        }
        let net = &mut self.net;
        let frames = output.len() / self.out_channels;
        self.members.render(now_ns, frames);
        self.mixer.begin(output);
        for slot in 0..self.members.capacity() {
            if let Some((heard, channels)) = self.members.output(slot) {
                self.mixer.add(slot, heard, channels, output);
            }
        }
        if self.measuring {
            // The members' mix, before your own monitor is added.
            self.meter.on_incoming(output, self.out_channels);
        }
        self.mixer.add_monitor(input, in_channels, output);
        self.mixer.finish(output);
        if let Some(tap) = &mut self.record {
            tap.record(frames, input, output, &self.members);
        }
        while let Some(n) = self.members.poll_rtcp(now_ns, &mut net.rtcp) {
            net.send_rtcp(now_ns, n);
        }
        // Stream starts and goodbyes are in each member's counters; the roster, not the
        // media, decides who is in the room.
        while self.members.poll_event().is_some() {}
        net.waker.unpark();
        let (sender, members, mixer, meter) = (&self.sender, &self.members, &mut self.mixer, &self.meter);
        let (applied, errors) = (self.commands_applied, self.command_errors);
        let sframe = self.net.seal.as_ref().map(|seal| seal.stats());
        self.publisher.tick(frames, output, || RoomStats {
            sframe,
            ..room_stats(sender, members, mixer, meter, applied, errors)
        });
    }
}

#[cfg(test)]
mod member_port_tests {
    use super::member_port;

    #[test]
    fn a_seats_ports_carry_its_members_channels() {
        let mut port = [9.0f32; 3];
        // Nobody: silence.
        member_port(None, 2, 0, &mut port);
        assert_eq!(port, [0.0; 3]);
        // Mono on every port of the seat.
        member_port(Some((&[0.1, 0.2, 0.3], 1)), 2, 1, &mut port);
        assert_eq!(port, [0.1, 0.2, 0.3]);
        let stereo: &[f32] = &[0.1, -0.1, 0.2, -0.2, 0.3, -0.3];
        member_port(Some((stereo, 2)), 2, 1, &mut port);
        assert_eq!(port, [-0.1, -0.2, -0.3]);
        // Stereo on a single port: the mean of its channels.
        member_port(Some((&[0.5, 0.1, 0.2, 0.2, 0.0, 1.0], 2)), 1, 0, &mut port);
        assert_eq!(port, [0.3, 0.2, 0.5]);
        // Stereo on a seat of three ports: the third is silent.
        member_port(Some((stereo, 2)), 3, 2, &mut port);
        assert_eq!(port, [0.0; 3]);
        // A short block is padded with silence.
        member_port(Some((&[0.7], 1)), 1, 0, &mut port);
        assert_eq!(port, [0.7, 0.0, 0.0]);
    }
}
