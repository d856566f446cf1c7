//! The OSC control surface of a running netjam: every parameter a player changes while
//! playing (each member's gain, pan and mute, the own send and local monitor, the buffer
//! policy, redundancy, recording) is an OSC address, and so is every read-only figure
//! (each member's name and statistics, the whole stats snapshot, the roster).
//!
//! A control thread ([`ControlServer::spawn`]) listens on one UDP port and dispatches
//! each datagram through a `netjam-osc` [`netjam_osc::Tree`] whose ports all carry
//! metadata (argument types, range, unit, description), answered on `/_meta ,s PATH`.
//! * A member's seat is addressed by its name too: a lone message to `/member/NAME/PORT`
//!   (NAME whatever the case) is the seat's `/memberSEAT/PORT`, and its replies come back
//!   under the name.
//! * A query (a message without arguments) replies to its sender with the current value,
//!   from the concrete address (`/member*/gain` gets one reply per member).
//! * A set checks its value, then hands a typed [`ControlCommand`] to a [`CommandSink`]:
//!   for a room client, the producer end of a pre-sized `rtrb` ring ([`command_ring`])
//!   whose consumer the audio thread pops at the start of each period. A set replies
//!   nothing when it was taken.
//! * Anything refused (a value out of range, a full ring, an unknown address, wrong
//!   argument types, a malformed packet) replies `/error ,ss ADDRESS REASON`, is counted
//!   in [`ControlCounters`], and pushes no command.
//!
//! The owner of the audio side keeps what the control thread answers up to date through
//! [`ControlHandle::update`] ([`ControlState`]: roster names, statistics); the values a
//! set changes are recorded by the control thread itself once the command was taken, so a
//! query right after a set already answers the new value.
//!
//! This module must never run on the audio thread and never make the audio thread wait:
//! the audio side only ever pops [`ControlCommand`]s (plain `Copy` values) from a ring,
//! which neither allocates nor locks. The [`Mutex`] around [`ControlState`] is shared by
//! the control thread and the owner's non-realtime thread only.

pub mod jam;
pub mod room;
pub mod server;
mod tree;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::Context;
use netjam_engine::delay::LatencyPolicy;
use netjam_engine::room::msg::fold_name;
use netjam_osc::{encode_message, Arg, Outbox, Packet, Route, Tree};

/// Seats a room client's tree offers (`/member0` … `/member15`).
pub const MAX_MEMBERS: u16 = netjam_engine::room::ROOM_SEATS as u16;
/// Lowest gain a fader reaches, dB (mute is its own switch).
pub const GAIN_MIN_DB: f32 = -60.0;
/// Highest gain, dB: enough to lift a quiet player without making clipping easy.
pub const GAIN_MAX_DB: f32 = 12.0;
/// Most earlier packets carried again in each packet (RFC 2198 blocks the sender allows).
pub const MAX_REDUNDANCY: u8 = netjam_engine::wire::red::MAX_RED_BLOCKS as u8;
/// Commands the ring of [`command_ring`] holds when the caller has no better figure: far
/// more than one period's worth of OSC a player or a controller sends.
pub const DEFAULT_RING: usize = 256;

/// How often the control thread looks at its stop flag while no datagram arrives.
const POLL: Duration = Duration::from_millis(50);
/// Largest datagram taken (the UDP limit) and room for the replies to one datagram.
const DATAGRAM: usize = 65_536;

/// One parameter change, from the control thread to the audio thread. Plain data: it is
/// copied through the ring, never allocated.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ControlCommand {
    /// The gain of one member in your mix, dB ([`GAIN_MIN_DB`] to [`GAIN_MAX_DB`]).
    MemberGain { member: u16, db: f32 },
    /// Where one member sits in your stereo mix: −1 left, 0 centre, 1 right.
    MemberPan { member: u16, pan: f32 },
    /// Whether one member is silent in your mix.
    MemberMute { member: u16, mute: bool },
    /// Whether one member is soloed: while any is, only the soloed ones are heard.
    MemberSolo { member: u16, solo: bool },
    /// The gain of what you send, dB.
    SendGain(f32),
    /// Whether you send silence.
    SendMute(bool),
    /// The gain of your own signal heard locally, dB.
    MonitorGain(f32),
    /// Whether you hear yourself locally.
    MonitorMute(bool),
    /// The gain of the whole mix you hear (before its limiter), dB.
    MasterGain(f32),
    /// The jitter buffers' latency policy.
    Latency(LatencyPolicy),
    /// Earlier packets carried again in each packet (0 to [`MAX_REDUNDANCY`]).
    Redundancy(u8),
    /// Whether the session is being recorded.
    Record(bool),
}

/// Linear amplitude of a gain in dB (0 when muted): what an audio thread multiplies by.
pub use netjam_engine::mixer::fader_gain as linear_gain;

/// A gain and a mute switch.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Level {
    pub gain_db: f32,
    pub mute: bool,
}

/// One member's figures as the owner last published them.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct MemberStats {
    /// Estimated one-way latency from that member to you, mouth to ear, ms; None until
    /// measured.
    pub latency_ms: Option<f32>,
    /// Packets of theirs that never arrived.
    pub lost: u64,
    /// Times concealment filled a gap in their stream.
    pub concealed: u64,
    /// Audio held in their jitter buffer, ms.
    pub buffer_ms: f32,
}

/// One seat of the roster.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct MemberState {
    /// The member's name; None while nobody sits there.
    pub name: Option<String>,
    pub gain_db: f32,
    pub pan: f32,
    pub mute: bool,
    pub solo: bool,
    pub stats: MemberStats,
}

/// Everything the control thread answers queries from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ControlState {
    /// One entry per seat of the tree (`/member0` …).
    pub members: Vec<MemberState>,
    pub send: Level,
    pub monitor: Level,
    /// The gain of the whole mix you hear, dB.
    pub master_gain_db: f32,
    pub latency: LatencyPolicy,
    pub redundancy: u8,
    pub record: bool,
    /// The latest statistics snapshot as JSON (answered on `/stats`).
    pub stats_json: String,
}

impl ControlState {
    /// Defaults for `surface`: unity gains, nothing muted, centred, the tight policy.
    pub fn new(surface: &Surface) -> Self {
        ControlState {
            members: vec![MemberState::default(); surface.members as usize],
            send: Level::default(),
            monitor: Level::default(),
            master_gain_db: 0.0,
            latency: LatencyPolicy::Tight,
            redundancy: 0,
            record: false,
            stats_json: "{}".into(),
        }
    }
}

/// Which ports a tree has: a room client offers them all; today's two-player `jam` only
/// what it can honour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Surface {
    /// Seats `/member0` … `/member{members-1}` (gain, mute, name, stats), 1 to [`MAX_MEMBERS`].
    pub members: u16,
    /// `/member#N/pan`.
    pub pan: bool,
    /// `/member#N/solo`.
    pub solo: bool,
    /// `/send/gain`, `/send/mute`.
    pub send: bool,
    /// `/monitor/gain`, `/monitor/mute`.
    pub monitor: bool,
    /// `/master/gain`.
    pub master: bool,
    /// `/buffer/latency`.
    pub latency: bool,
    /// `/redundancy`.
    pub redundancy: bool,
    /// `/record`.
    pub record: bool,
    /// `/password ,s` (a private room's new password; see
    /// [`ControlServer::spawn_with_passwords`]).
    pub password: bool,
}

impl Surface {
    /// Every port, with [`MAX_MEMBERS`] seats: a room client.
    pub fn room() -> Self {
        Surface {
            members: MAX_MEMBERS,
            pan: true,
            solo: true,
            send: true,
            monitor: true,
            master: true,
            latency: true,
            redundancy: true,
            record: true,
            password: false,
        }
    }
}

/// Where the control thread delivers the commands it accepted.
pub trait CommandSink: Send {
    /// Delivers `command` without blocking; hands it back when there is no room.
    fn deliver(&mut self, command: ControlCommand) -> Result<(), ControlCommand>;
}

impl CommandSink for rtrb::Producer<ControlCommand> {
    fn deliver(&mut self, command: ControlCommand) -> Result<(), ControlCommand> {
        self.push(command).map_err(|rtrb::PushError::Full(c)| c)
    }
}

/// The audio thread's end of the command ring: `while let Ok(c) = rx.pop() { … }` at the
/// start of each period (no allocation, no lock).
pub type CommandRx = rtrb::Consumer<ControlCommand>;

/// A ring of `capacity` commands, allocated here, once: give the producer to
/// [`ControlServer::spawn`] and the consumer to the audio thread.
pub fn command_ring(capacity: usize) -> (rtrb::Producer<ControlCommand>, CommandRx) {
    rtrb::RingBuffer::new(capacity)
}

/// What the control thread saw since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct ControlCounters {
    /// Datagrams received.
    pub datagrams: u64,
    /// Datagrams that were not OSC.
    pub malformed: u64,
    /// Messages that reached no port.
    pub unmatched: u64,
    /// Messages whose arguments no port at their address takes.
    pub wrong_types: u64,
    /// Queries answered.
    pub queries: u64,
    /// Commands delivered to the audio side.
    pub commands: u64,
    /// Sets refused for their value (out of range, unknown name).
    pub refused: u64,
    /// Sets refused because the command ring was full.
    pub ring_full: u64,
    /// Replies that could not be sent or did not fit.
    pub reply_failures: u64,
}

#[derive(Debug, Default)]
struct Counters {
    datagrams: AtomicU64,
    malformed: AtomicU64,
    unmatched: AtomicU64,
    wrong_types: AtomicU64,
    queries: AtomicU64,
    commands: AtomicU64,
    refused: AtomicU64,
    ring_full: AtomicU64,
    reply_failures: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self) -> ControlCounters {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ControlCounters {
            datagrams: g(&self.datagrams),
            malformed: g(&self.malformed),
            unmatched: g(&self.unmatched),
            wrong_types: g(&self.wrong_types),
            queries: g(&self.queries),
            commands: g(&self.commands),
            refused: g(&self.refused),
            ring_full: g(&self.ring_full),
            reply_failures: g(&self.reply_failures),
        }
    }
}

/// What the control thread and the owner share.
#[derive(Debug)]
struct Shared {
    state: Mutex<ControlState>,
    counters: Counters,
    stop: AtomicBool,
}

/// What a serving loop shares with the owner of its control thread: the counters and the
/// stop flag. Each surface (a room client's, jam's, the rooms server's) keeps them beside
/// whatever its queries answer from.
trait Served: Send + Sync + 'static {
    fn counters(&self) -> &Counters;
    /// Set to stop the serving loop (it looks at least once a poll interval).
    fn stop_flag(&self) -> &AtomicBool;
    fn stopped(&self) -> bool {
        self.stop_flag().load(Ordering::Relaxed)
    }
    /// The seat of the member named `name` (whatever the case), for `/member/NAME/...`;
    /// `None` on a surface without members.
    fn seat_named(&self, _name: &str) -> Option<u16> {
        None
    }
}

impl Served for Shared {
    fn counters(&self) -> &Counters {
        &self.counters
    }
    fn stop_flag(&self) -> &AtomicBool {
        &self.stop
    }
    fn seat_named(&self, name: &str) -> Option<u16> {
        let name = fold_name(name);
        let state = self.state();
        let seat = state
            .members
            .iter()
            .position(|m| m.name.as_deref().is_some_and(|n| fold_name(n) == name))?;
        u16::try_from(seat).ok()
    }
}

/// How a member is addressed by name: `/member/NAME/PORT` is `/memberSEAT/PORT` for the
/// seat NAME sits at.
const BY_NAME: &str = "/member/";

/// A message addressed by name, readdressed to its seat.
struct ByName {
    /// The same message to `/memberSEAT/PORT`.
    packet: Vec<u8>,
    /// `/memberSEAT/` and `/member/NAME/`: replies go back under the name.
    seat_prefix: String,
    name_prefix: String,
}

/// A lone message to `/member/NAME/PORT` readdressed to NAME's seat, or why it cannot be
/// (no member of that name). `None`: not addressed by name.
fn by_name(packet: &[u8], seat_named: impl Fn(&str) -> Option<u16>) -> Option<Result<ByName, String>> {
    let Ok(Packet::Message(m)) = Packet::decode(packet) else {
        return None;
    };
    let rest = m.address().strip_prefix(BY_NAME)?;
    let (name, port) = rest.split_once('/')?;
    let Some(seat) = seat_named(name) else {
        return Some(Err(format!(
            "no member named {name:?} in the room: '/roster' lists who is here"
        )));
    };
    let seat_prefix = format!("/member{seat}/");
    let args: Vec<Arg<'_>> = m.args().collect();
    let mut buf = vec![0u8; packet.len() + 16];
    let n = encode_message(&mut buf, &format!("{seat_prefix}{port}"), &args).ok()?;
    buf.truncate(n);
    Some(Ok(ByName {
        packet: buf,
        seat_prefix,
        name_prefix: format!("{BY_NAME}{name}/"),
    }))
}

/// [`respond`], with members addressed by name as well as by seat (see [`by_name`]):
/// replies to a message sent by name come back under the name.
fn respond_named<C>(
    tree: &Tree<C>,
    ctx: &mut C,
    served: &impl Served,
    packet: &[u8],
    scratch: &mut [u8],
    mut send: impl FnMut(&[u8]) -> bool,
) {
    let counters = served.counters();
    match by_name(packet, |n| served.seat_named(n)) {
        None => respond(tree, ctx, counters, packet, scratch, send),
        Some(Err(why)) => {
            bump(&counters.datagrams);
            bump(&counters.unmatched);
            let address = match Packet::decode(packet) {
                Ok(Packet::Message(m)) => m.address().to_owned(),
                _ => String::new(),
            };
            let mut buf = [0u8; 1024];
            let sent = encode_message(&mut buf, "/error", &[Arg::Str(&address), Arg::Str(&why)])
                .is_ok_and(|len| send(&buf[..len]));
            if !sent {
                bump(&counters.reply_failures);
            }
        }
        Some(Ok(ByName {
            packet: seat_packet,
            seat_prefix,
            name_prefix,
        })) => {
            respond(tree, ctx, counters, &seat_packet, scratch, |reply| {
                let renamed = netjam_osc::Message::decode(reply).ok().and_then(|m| {
                    let address = m.address();
                    let tail = address.strip_prefix(seat_prefix.as_str())?;
                    let args: Vec<Arg<'_>> = m.args().collect();
                    let mut buf = vec![0u8; reply.len() + name_prefix.len()];
                    let n = encode_message(&mut buf, &format!("{name_prefix}{tail}"), &args).ok()?;
                    buf.truncate(n);
                    Some(buf)
                });
                send(renamed.as_deref().unwrap_or(reply))
            });
        }
    }
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, ControlState> {
        // A panic while holding the lock leaves plain values behind: keep answering.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The state the tree's handlers work on.
struct Ctx {
    shared: Arc<Shared>,
    sink: Box<dyn CommandSink>,
    /// Where `/password` hands a new password (to the room thread, which derives its keys).
    passwords: Option<std::sync::mpsc::Sender<String>>,
}

/// Builds the tree and serves it; see [`ControlServer::spawn`].
#[derive(Debug)]
pub struct ControlServer;

impl ControlServer {
    /// Binds `bind` and starts the control thread serving `surface`, answering from
    /// `initial` (which must have one member per seat) and delivering commands to `sink`.
    pub fn spawn(
        bind: SocketAddr,
        surface: Surface,
        initial: ControlState,
        sink: impl CommandSink + 'static,
    ) -> anyhow::Result<ControlHandle> {
        Self::spawn_inner(bind, surface, initial, sink, None)
    }

    /// [`ControlServer::spawn`], with `/password ,s NEW` handing each new password to
    /// `passwords` (give the surface `password: true`). The password goes no further than
    /// this process: its receiver derives the keys.
    pub fn spawn_with_passwords(
        bind: SocketAddr,
        surface: Surface,
        initial: ControlState,
        sink: impl CommandSink + 'static,
        passwords: std::sync::mpsc::Sender<String>,
    ) -> anyhow::Result<ControlHandle> {
        Self::spawn_inner(bind, surface, initial, sink, Some(passwords))
    }

    fn spawn_inner(
        bind: SocketAddr,
        surface: Surface,
        initial: ControlState,
        sink: impl CommandSink + 'static,
        passwords: Option<std::sync::mpsc::Sender<String>>,
    ) -> anyhow::Result<ControlHandle> {
        anyhow::ensure!(
            (1..=MAX_MEMBERS).contains(&surface.members) && initial.members.len() == surface.members as usize,
            "the control surface needs 1 to {MAX_MEMBERS} seats, and one member state per seat"
        );
        let tree = tree::build(&surface).context("the OSC control tree is malformed")?;
        let (socket, local) = listen(bind)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(initial),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
        });
        let ctx = Ctx {
            shared: shared.clone(),
            sink: Box::new(sink),
            passwords,
        };
        Ok(ControlHandle {
            running: Running::spawn(socket, local, tree, ctx, shared)?,
        })
    }
}

/// A control thread serving `S`, as its owner holds it: what they share, the address it
/// listens on, and the thread, stopped and joined when this is dropped. Both surfaces'
/// handles (a player's, the rooms server's) are one of these.
#[derive(Debug)]
struct Running<S: Served> {
    shared: Arc<S>,
    local: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl<S: Served> Running<S> {
    /// Starts the thread serving `tree` (its handlers working on `ctx`) on `socket`, which
    /// is bound to `local`.
    fn spawn<C: Send + 'static>(
        socket: UdpSocket,
        local: SocketAddr,
        tree: Tree<C>,
        ctx: C,
        shared: Arc<S>,
    ) -> anyhow::Result<Self> {
        let served = shared.clone();
        let thread = std::thread::Builder::new()
            .name("netjam-osc".into())
            .spawn(move || serve(socket, tree, ctx, served))
            .context("cannot start the OSC control thread")?;
        Ok(Self {
            shared,
            local,
            thread: Some(thread),
        })
    }

    /// What the control thread saw so far.
    fn counters(&self) -> ControlCounters {
        self.shared.counters().snapshot()
    }

    /// Stops the control thread and waits for it (at most one poll interval).
    fn stop(&mut self) {
        self.shared.stop_flag().store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl<S: Served> Drop for Running<S> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The owner's side of a running control thread; dropping it stops the thread.
#[derive(Debug)]
pub struct ControlHandle {
    running: Running<Shared>,
}

impl ControlHandle {
    /// The address the control thread listens on (the port chosen when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.running.local
    }

    /// Changes what queries answer (publish statistics, seat or rename members). Holds a
    /// lock the control thread also takes: never call it from the audio thread.
    pub fn update<R>(&self, f: impl FnOnce(&mut ControlState) -> R) -> R {
        f(&mut self.running.shared.state())
    }

    /// A copy of the current state.
    pub fn state(&self) -> ControlState {
        self.running.shared.state().clone()
    }

    /// What the control thread saw so far.
    pub fn counters(&self) -> ControlCounters {
        self.running.counters()
    }

    /// Stops the control thread and waits for it (at most one poll interval).
    pub fn shutdown(mut self) {
        self.running.stop();
    }
}

/// The control thread's socket, bound to `bind`, and the address it got.
fn listen(bind: SocketAddr) -> anyhow::Result<(UdpSocket, SocketAddr)> {
    let socket = UdpSocket::bind(bind).with_context(|| {
        format!("cannot listen for OSC on {bind}: is another program (or another netjam) using that port? Pick another with --osc PORT")
    })?;
    socket
        .set_read_timeout(Some(POLL))
        .context("cannot set the OSC socket's timeout")?;
    let local = socket.local_addr().context("the OSC socket has no address")?;
    Ok((socket, local))
}

/// The control thread: one datagram at a time until told to stop.
fn serve<C, S: Served>(socket: UdpSocket, tree: Tree<C>, mut ctx: C, shared: Arc<S>) {
    let mut packet = vec![0u8; DATAGRAM];
    let mut scratch = vec![0u8; DATAGRAM];
    while !shared.stopped() {
        let (n, from) = match socket.recv_from(&mut packet) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            // An ICMP error from an earlier reply (the sender went away) and the like.
            Err(e) => {
                tracing::debug!("OSC control socket: {e}");
                continue;
            }
        };
        respond_named(&tree, &mut ctx, &*shared, &packet[..n], &mut scratch, |reply| {
            socket.send_to(reply, from).is_ok()
        });
    }
}

/// Dispatches one datagram and hands each reply to `send` (false: it could not be sent).
/// A message that reached no port, or none with its argument types, and a datagram that
/// is not OSC get one `/error ,ss ADDRESS REASON`.
fn respond<C>(
    tree: &Tree<C>,
    ctx: &mut C,
    counters: &Counters,
    packet: &[u8],
    scratch: &mut [u8],
    mut send: impl FnMut(&[u8]) -> bool,
) {
    bump(&counters.datagrams);
    let mut out = Outbox::new(scratch);
    let problem = match tree.dispatch(ctx, packet, &mut out) {
        Err(e) => {
            bump(&counters.malformed);
            Some((String::new(), format!("not an OSC packet: {e}")))
        }
        Ok(s) if s.handled > 0 => None,
        Ok(s) => {
            // Only a lone message is answered: a bundle's parts have no single address.
            let address = match Packet::decode(packet) {
                Ok(Packet::Message(m)) => Some(m.address().to_owned()),
                _ => None,
            };
            if s.type_mismatch > 0 {
                bump(&counters.wrong_types);
                address.map(|a| {
                    let why =
                        format!("wrong arguments: '/_meta ,s {a}' lists the types it takes (none to query)");
                    (a, why)
                })
            } else if s.unmatched > 0 {
                bump(&counters.unmatched);
                address.map(|a| (a, "no such address: '/_meta ,s PATH' describes a port".to_owned()))
            } else {
                None
            }
        }
    };
    for (route, msg) in out.entries() {
        if route == Route::Reply && !send(msg) {
            bump(&counters.reply_failures);
        }
    }
    if out.dropped() > 0 {
        counters
            .reply_failures
            .fetch_add(u64::from(out.dropped()), Ordering::Relaxed);
    }
    if let Some((address, why)) = problem {
        let mut buf = [0u8; 1024];
        let sent = encode_message(&mut buf, "/error", &[Arg::Str(&address), Arg::Str(&why)])
            .is_ok_and(|len| send(&buf[..len]));
        if !sent {
            bump(&counters.reply_failures);
        }
    }
}

#[cfg(test)]
mod tests;
