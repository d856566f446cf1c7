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
//! The receive thread timestamps each datagram as it arrives and hands it to the audio
//! thread, which feeds the engine and plays. Packets the engine produces go to the send
//! thread, which the audio thread wakes with `unpark` (a futex wake that never blocks) so
//! nothing waits for a poll interval. Statistics come back as snapshots through a ring.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle, Thread};
use std::time::Duration;

use netjam_engine::receiver::{Receiver, ReceiverStats};
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
    pub local: SocketAddr,
    threads: Vec<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl NetIo {
    /// Start the receive and send threads on `socket`.
    pub fn start(socket: UdpTransport, peer: Peer) -> anyhow::Result<(Self, AudioLink)> {
        let local = socket.local_addr()?;
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        let socket = Arc::new(socket);
        let stop = Arc::new(AtomicBool::new(false));
        let learned: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(match peer {
            Peer::Fixed(a) => Some(a),
            Peer::Learned => None,
        }));
        let (to_audio, from_net) = packet_ring(RING_BYTES);
        let (to_net, mut from_audio) = packet_ring(RING_BYTES);
        let rx_overflow = Arc::new(std::sync::atomic::AtomicU64::new(0));

        let rx = {
            let (socket, stop, learned, overflow) =
                (socket.clone(), stop.clone(), learned.clone(), rx_overflow.clone());
            let mut to_audio = to_audio;
            thread::Builder::new().name("netjam-rx".into()).spawn(move || {
                crate::rt::promote_current_thread(crate::rt::NETWORK_PRIORITY);
                let mut buf = vec![0u8; MAX_DATAGRAM];
                while !stop.load(Ordering::Relaxed) {
                    match socket.recv(&mut buf) {
                        Ok(Some(r)) => {
                            if matches!(peer, Peer::Learned) && classify(&buf[..r.len]) == PacketKind::Rtp {
                                if let Ok(mut l) = learned.lock() {
                                    *l = Some(r.from);
                                }
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
            let (socket, stop) = (socket.clone(), stop.clone());
            thread::Builder::new().name("netjam-tx".into()).spawn(move || {
                crate::rt::promote_current_thread(crate::rt::NETWORK_PRIORITY);
                let mut buf = vec![0u8; MAX_DATAGRAM];
                loop {
                    let mut sent_any = false;
                    while let Some((_, len)) = from_audio.pop(&mut buf) {
                        sent_any = true;
                        let to = learned.lock().ok().and_then(|l| *l);
                        if let (Some(to), true) = (to, len > 0) {
                            if let Err(e) = socket.send_to(&buf[..len], to) {
                                tracing::debug!("send to {to}: {e}");
                            }
                        }
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
        let (tx, rx) = rtrb::RingBuffer::new(256);
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
                peak_dbfs: 20.0 * self.peak.max(1e-6).log10(),
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
    /// What is sent: the input plus, when measuring, the meter's burst.
    outgoing: Vec<f32>,
}

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
            outgoing,
        };
        (p, rx)
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
        jam_stats(&self.sender, &self.receiver, &self.meter)
    }
}

fn jam_stats(sender: &Sender, receiver: &Receiver, meter: &RoundTripMeter) -> JamStats {
    let (found, lost) = meter.counts();
    let rate = sender.format().rate as f64;
    JamStats {
        sent: sender.stats(),
        heard: receiver.stats(),
        round_trip_ms: meter.last_rtt_frames().map(|f| f as f64 * 1000.0 / rate),
        round_trip_found: found,
        round_trip_lost: lost,
    }
}

impl Process for JamProcess {
    fn skipped(&mut self, frames: u64) {
        self.sender.skip_frames(frames);
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
            self.meter.on_incoming(output, heard_channels);
        }
        let gain = f32::from_bits(self.gain.load(Ordering::Relaxed));
        if gain != 1.0 {
            output.iter_mut().for_each(|x| *x *= gain);
        }
        if let Some(n) = self.receiver.poll_rtcp(now_ns, &mut net.rtcp) {
            net.send_rtcp(now_ns, n);
        }
        net.waker.unpark();
        let (sender, receiver, meter) = (&self.sender, &self.receiver, &self.meter);
        self.publisher
            .tick(output.len() / heard_channels.max(1), output, || {
                jam_stats(sender, receiver, meter)
            });
    }
}
