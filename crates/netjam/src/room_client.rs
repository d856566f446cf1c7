//! Joining a room and staying in it: the I/O shell around the sans-IO
//! [`netjam_engine::player::Session`], which decides from the first hello on.
//!
//! ```text
//!   join(): the session's hello -> challenge -> join -> welcome (redirects, silent front
//!           doors), on the stream's own socket, before any audio
//!   control thread:  OSC from the server and the other members' probes (handed over by
//!                    the receive thread) -> Session -> datagrams to send, commands for the
//!                    audio thread's ring, events: the send thread's server and route table,
//!                    a redirect to resolve, a server key to pin
//!                    OSC control surface commands -> Session -> the same ring (one producer)
//! ```
//!
//! The seat is taken before the audio starts, so the sender uses the SSRC the server
//! assigned from its first packet on. Afterwards one thread runs the same session: it
//! decides (what the server's messages mean for the roster, when a silent server is given
//! up for the next front door, which direct paths carry media; see its docs) and this shell does
//! what needs the world: the socket, the clock, resolving a redirect's name, pinning a
//! server's key in the player's known servers ([`KnownServers`]) the first time and
//! stopping with what to do when a server shows another, deriving a new password's keys
//! (Argon2id, slow on purpose), and publishing the roster for the views. That thread is
//! also the single producer of the audio thread's command ring.
//!
//! Never here: audio, blocking the audio thread, or trusting a datagram that did not come
//! from the server (probes from elsewhere are authenticated by the pair's token).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::bail;
use netjam_engine::room::msg::MAX_CONTROL_LEN;
use netjam_engine::room::{ClientConfig, RefuseCode, RoomClient, RoomEvent};

use crate::clock;
use crate::ensemble::SeatInbox;
use crate::keys::KnownServers;
use crate::transport::UdpTransport;
pub use netjam_engine::player::FrontDoors;
use netjam_engine::player::{Command, Mixes, ReflexiveQuery, Roster, Session, SessionEvent, SessionStart};
use netjam_engine::privacy::MediaKey;

/// A datagram from the server's address that starts with `/` (or a probe from anyone):
/// when it arrived, where from, its bytes.
pub type ControlDatagram = (u64, SocketAddr, Vec<u8>);
/// How a direct-path probe starts; the receive thread hands these over from any address.
pub const PROBE_PREFIX: &[u8] = b"/netjam/probe";
/// Control datagrams that may wait for the control thread; more are dropped.
pub const CONTROL_QUEUE: usize = 256;

/// How to take a seat.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub server: SocketAddr,
    pub room: String,
    pub name: String,
    pub password: String,
    /// The room key when already derived from the password (see
    /// [`netjam_engine::room::ClientConfig::room_key`]); `None` derives it.
    pub room_key: Option<[u8; 32]>,
    /// The SSRC the sender would like (the server may assign another).
    pub ssrc: u32,
    /// Declared media rate.
    pub packets_per_s: u32,
    pub bytes_per_s: u32,
    /// How long to keep trying before giving up.
    pub timeout: Duration,
    /// This player's own addresses, declared so that members behind the same router can
    /// reach it directly.
    pub hosts: Vec<SocketAddr>,
    /// The sample rate this player sends and mixes at (0: not said), so that a room whose
    /// rate cannot be converted to it refuses the join at once.
    pub sample_rate: u32,
    /// Other rooms servers to ask, in order, when `server` does not answer (servers
    /// sharing a room directory: see [`FrontDoors`]).
    pub also: Vec<SocketAddr>,
    /// The servers' keys this player pinned ([`KnownServers::from_env`]).
    pub known: KnownServers,
    /// What the seat does once taken.
    pub setup: SeatSetup,
}

/// What a seat does once taken (the session's part of a join).
#[derive(Debug, Clone)]
pub struct SeatSetup {
    /// Punch direct paths to other members (`jam --via-server` says no).
    pub direct: bool,
    /// List the room publicly (`jam --public`), on whichever server it is.
    pub public: bool,
    /// Mix settings by member name to apply as members are seated (`jam --mix`).
    pub mixes: Mixes,
    /// A private room's media key (its join proof is [`JoinRequest::room_key`]).
    pub media_key: Option<MediaKey>,
}

impl Default for SeatSetup {
    fn default() -> Self {
        Self {
            direct: true,
            public: false,
            mixes: Mixes::default(),
            media_key: None,
        }
    }
}

/// A seat taken: the session that holds it.
#[derive(Debug)]
pub struct Seated {
    /// Seated on [`Session::server`], its roster holding what came with the welcome.
    pub session: Session,
    /// The server that redirected the join there, if one did (as it named it).
    pub redirected: Option<String>,
    /// From the first hello to the welcome (redirects followed included).
    pub took: Duration,
    pub member_id: u32,
    /// Send with this SSRC.
    pub ssrc: u32,
    /// The servers' keys this player pinned.
    pub known: KnownServers,
}

/// Bytes that must not repeat (nonce seeds, STUN transaction ids): random, or where the
/// system has no randomness to give, the clock and the process id, which are unique enough.
fn unique_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    if getrandom::fill(&mut b).is_err() {
        let t = clock::now_ns() ^ (u64::from(std::process::id()) << 32);
        let t = t.to_le_bytes();
        let n = N.min(t.len());
        b[..n].copy_from_slice(&t[..n]);
    }
    b
}

fn nonce_seed() -> [u8; 16] {
    unique_bytes()
}

/// Asks the rooms server where it sees this socket, and `stun` too if given, from now.
pub fn ask_reflexive(room_server: SocketAddr, stun: Option<SocketAddr>) -> ReflexiveQuery {
    ReflexiveQuery::new(
        room_server,
        stun,
        clock::now_ns(),
        [unique_bytes(), unique_bytes()],
    )
}

/// Sends what `ask` has due and waits on `socket` for the answers still missing, for at
/// most `bound`; datagrams that are not answers are dropped (the audio has not started).
pub fn finish_reflexive(ask: &mut ReflexiveQuery, socket: &UdpTransport, bound: Duration) {
    let deadline = Instant::now() + bound;
    let mut buf = [0u8; 2048];
    loop {
        let now = clock::now_ns();
        while let Some((to, n)) = ask.poll_transmit(now, &mut buf) {
            if let Err(e) = socket.send_to(&buf[..n], to) {
                tracing::debug!("STUN request to {to}: {e}");
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if ask.done(now) || left.is_zero() {
            return;
        }
        let wait = ask
            .poll_timeout(now)
            .map_or(left, |t| Duration::from_nanos(t.saturating_sub(now)))
            .clamp(Duration::from_millis(1), left.max(Duration::from_millis(1)));
        if socket.set_read_timeout(Some(wait)).is_err() {
            return;
        }
        if let Ok(Some(got)) = socket.recv(&mut buf) {
            ask.handle_datagram(got.at_ns, got.from, &buf[..got.len]);
        }
    }
}

fn refusal_text(code: Option<RefuseCode>, reason: &str, r: &JoinRequest) -> String {
    let what = match code {
        Some(RefuseCode::WrongPassword) => format!(
            "room {:?} has another password: ask whoever opened it, and pass it with --password",
            r.room
        ),
        Some(RefuseCode::RoomFull) => format!("room {:?} is full", r.room),
        Some(RefuseCode::RateTooHigh) => {
            "the server does not admit this much audio per player: send fewer channels, a larger --frames, or --codec opus".into()
        }
        Some(RefuseCode::BadVersion) => "the server speaks another protocol version: use the same netjam version as the server".into(),
        Some(RefuseCode::NameTaken) => format!(
            "room {:?} already has a player named {:?} on another computer: pick another --name (or `name` in the settings file)",
            r.room, r.name
        ),
        Some(RefuseCode::BadRequest) => "the server refused the name or room (1-64 printable characters each)".into(),
        Some(RefuseCode::ServerFull) => "the server is full: try again later or another server".into(),
        Some(RefuseCode::DirectoryUnavailable) => format!(
            "the server cannot reach the room directory it shares with other servers, so it opens no new room now (rooms already playing go on): try room {:?} again in a moment",
            r.room
        ),
        Some(RefuseCode::RateUnconvertible) => {
            // The server names the room's rate in its text ("the room plays at 48000 Hz, ...").
            let room_rate = reason
                .split("plays at ")
                .nth(1)
                .and_then(|t| t.split(' ').next())
                .and_then(|n| n.parse::<u32>().ok());
            let run_at = room_rate.map_or_else(
                || "the room's rate".to_string(),
                |hz| format!("{hz} Hz (`--rate {hz}`, or your device's settings)"),
            );
            format!(
                "room {:?} plays at {}, and your audio runs at {} Hz: netjam converts only between rates within 10 % of each other (44.1 and 48 kHz, 88.2 and 96 kHz); run at {run_at}",
                r.room,
                room_rate.map_or_else(|| "another rate".to_string(), |hz| format!("{hz} Hz")),
                r.sample_rate
            )
        }
        _ => "the server refused to seat you".into(),
    };
    format!("{what} (server said: {reason})")
}

/// How long a server a redirect named may stay silent before the client asks the front
/// door again (see [`netjam_engine::player::session::REDIRECT_PATIENCE_NS`]).
pub const REDIRECT_PATIENCE: Duration =
    Duration::from_nanos(netjam_engine::player::session::REDIRECT_PATIENCE_NS);

/// What the shell does with a control channel's key event: a first key is pinned for
/// `server` and said; another key than pinned is the error to stop with.
pub fn server_key_event(e: &RoomEvent, server: SocketAddr, known: &KnownServers) -> Result<(), String> {
    match e {
        RoomEvent::ServerKey { key } => {
            let fp = netjam_engine::room::secure::fingerprint(key);
            match known.pin(server, key) {
                Ok(Some(file)) => eprintln!(
                    "netjam: the rooms server at {server} shows the key {fp}, now pinned in {} (compare it with what its operator sees)",
                    file.display()
                ),
                Ok(None) => eprintln!("netjam: the rooms server at {server} shows the key {fp}"),
                Err(e) => eprintln!(
                    "netjam: the rooms server at {server} shows the key {fp}; it could not be pinned ({e:#}), so it is taken again next time"
                ),
            }
            Ok(())
        }
        RoomEvent::ServerKeyChanged { pinned, offered } => {
            Err(known.changed_message(server, pinned, offered))
        }
        _ => Ok(()),
    }
}

/// Tells `client` to talk to `server` from now on, with the key pinned for it.
pub fn switch_server(client: &mut RoomClient, server: SocketAddr, known: &KnownServers, now_ns: u64) {
    client.set_server_key(known.get(server));
    client.server_changed(now_ns);
}

/// The address a redirect names (`host:port`), of the socket's family if it has both.
pub fn resolve_redirect(server: &str, like: SocketAddr) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    let all: Vec<SocketAddr> = server
        .to_socket_addrs()
        .map_err(|e| {
            anyhow::anyhow!("the rooms server sent this player to {server:?}, which does not resolve: {e}")
        })?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4() == like.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| {
            anyhow::anyhow!("the rooms server sent this player to {server:?}, which resolves to no address")
        })
}

/// Takes a seat on `socket` (the one the stream will use, so the server learns the
/// address media will come from). Blocks until seated, refused or `r.timeout`. A
/// redirect (the room lives on another server) is followed at once; the seat says where
/// it was taken.
pub fn join(socket: &UdpTransport, r: &JoinRequest) -> anyhow::Result<Seated> {
    join_asking(socket, r, None)
}

/// [`join`], asking `ask`'s STUN questions on the same socket meanwhile (their answers
/// are taken out of the join's traffic; those still missing when seated are left to
/// [`finish_reflexive`]).
pub fn join_asking(
    socket: &UdpTransport,
    r: &JoinRequest,
    mut ask: Option<&mut ReflexiveQuery>,
) -> anyhow::Result<Seated> {
    let mut config = ClientConfig::new(&r.room, &r.name, &r.password, r.ssrc);
    config.room_key = r.room_key;
    config.packets_per_s = r.packets_per_s.max(1);
    config.bytes_per_s = r.bytes_per_s.max(1);
    config.nonce_seed = nonce_seed();
    config.hosts.clone_from(&r.hosts);
    config.sample_rate = r.sample_rate;
    config.secure = true;
    config.server_key = r.known.get(r.server);
    let began = Instant::now();
    let front = FrontDoors::new(r.server, &r.also);
    let pinned = front
        .all()
        .iter()
        .filter_map(|&a| r.known.get(a).map(|k| (a, k)))
        .collect();
    let mut session = Session::new(SessionStart {
        client: RoomClient::new(config, clock::now_ns()),
        front,
        room: r.room.clone(),
        ssrc: r.ssrc,
        direct: r.setup.direct,
        public: r.setup.public,
        mixes: r.setup.mixes.clone(),
        private: r.room_key.zip(r.setup.media_key),
        pinned,
        stun_seed: unique_bytes(),
        now_ns: clock::now_ns(),
    });
    let deadline = Instant::now() + r.timeout;
    let mut buf = vec![0u8; MAX_CONTROL_LEN.max(2048)];
    let mut others = 0u64;
    // The server asked now, and whether the next switch is a redirect being followed.
    let mut asking = r.server;
    let mut following = false;
    let mut seat: Option<(u32, u32, Option<String>, Duration)> = None;
    let mut early_until = None;
    loop {
        let now_ns = clock::now_ns();
        if let Some(q) = ask.as_deref_mut() {
            while let Some((to, n)) = q.poll_transmit(now_ns, &mut buf) {
                if let Err(e) = socket.send_to(&buf[..n], to) {
                    tracing::debug!("join: STUN request to {to}: {e}");
                }
            }
        }
        session.handle_timeout(now_ns);
        while let Some(e) = session.poll_event() {
            match e {
                SessionEvent::Seated {
                    member_id,
                    ssrc,
                    redirected,
                } => {
                    seat = Some((member_id, ssrc, redirected, began.elapsed()));
                    // Roster events sent together with the welcome may already be queued.
                    early_until = Some(Instant::now() + EARLY_ROSTER);
                }
                SessionEvent::Refused { code, reason } => bail!(refusal_text(code, &reason, r)),
                SessionEvent::Key(server, e) => {
                    if let Err(msg) = server_key_event(&e, server, &r.known) {
                        bail!(msg)
                    }
                }
                SessionEvent::Redirect(to) => {
                    let a = resolve_redirect(&to, session.front().current())?;
                    following = true;
                    session.redirect_to(clock::now_ns(), a, r.known.get(a));
                }
                SessionEvent::ServerIs(a) => {
                    if !std::mem::take(&mut following) {
                        eprintln!("netjam: no answer from the rooms server at {asking}: asking {a}");
                    }
                    asking = a;
                }
                SessionEvent::Routes | SessionEvent::SsrcChanged { .. } | SessionEvent::Changed => {}
            }
        }
        while let Some((to, n)) = session.poll_transmit(clock::now_ns(), &mut buf) {
            if let Err(e) = socket.send_to(&buf[..n], to) {
                tracing::debug!("join: send to {to}: {e}");
            }
        }
        let now = Instant::now();
        if let (Some(until), Some((member_id, ssrc, redirected, took))) = (early_until, &seat) {
            if now >= until {
                return Ok(Seated {
                    took: *took,
                    member_id: *member_id,
                    ssrc: *ssrc,
                    redirected: redirected.clone(),
                    session,
                    known: r.known.clone(),
                });
            }
        } else if now >= deadline {
            bail!(
                "no answer from the rooms server at {} after {:.0} s{}: is `netjam server` running there, and does its firewall let UDP port {} in?",
                r.server,
                r.timeout.as_secs_f64(),
                if others > 0 { format!(" ({others} datagrams from elsewhere ignored)") } else { String::new() },
                r.server.port()
            );
        }
        // Once seated, only the few roster events that came with the welcome are waited
        // for: the other members' audio already flows to the seat, so a quiet socket
        // would never come.
        let until = early_until.unwrap_or(deadline);
        let now_ns = clock::now_ns();
        let stun_at = ask.as_deref().and_then(|q| q.poll_timeout(now_ns));
        let wait_ns = session
            .poll_timeout(now_ns)
            .into_iter()
            .chain(stun_at)
            .min()
            .map_or(50_000_000, |t| t.saturating_sub(now_ns))
            .clamp(1_000_000, 50_000_000);
        let wait = Duration::from_nanos(wait_ns).min(until.saturating_duration_since(now));
        socket.set_read_timeout(Some(wait.max(Duration::from_millis(1))))?;
        match socket.recv(&mut buf) {
            Ok(Some(got))
                if ask
                    .as_deref_mut()
                    .is_some_and(|q| q.handle_datagram(got.at_ns, got.from, &buf[..got.len])) => {}
            Ok(Some(got)) if got.from == session.server() => {
                session.handle_datagram(got.at_ns, got.from, &buf[..got.len]);
            }
            Ok(Some(_)) if seat.is_some() => {}
            Ok(Some(_)) => others += 1,
            Ok(None) => {}
            Err(e) => tracing::debug!("join: receive: {e}"),
        }
    }
}

/// The public rooms a rooms server knows (every server's, when it shares a directory):
/// hello, challenge, `/netjam/list` with the cookie, and the `/netjam/listed` answers up
/// to `/netjam/listend`, asked again until answered or `timeout`. A room listed without
/// a server is on the server asked.
pub fn list_rooms(
    server: SocketAddr,
    timeout: Duration,
) -> anyhow::Result<Vec<netjam_engine::room::ListedRoom>> {
    use netjam_engine::room::msg::{Control, HELLO_PAD};
    let socket = UdpTransport::bind(crate::lifecycle::any_for(server))?;
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; MAX_CONTROL_LEN.max(2048)];
    let mut out = Vec::new();
    let mut cookie: Option<[u8; netjam_engine::room::msg::COOKIE_LEN]> = None;
    let mut asked_at: Option<Instant> = None;
    while Instant::now() < deadline {
        if asked_at.map_or(true, |t| t.elapsed() >= Duration::from_millis(500)) {
            // (Again) from the start of the exchange: a lost datagram costs half a second.
            out.clear();
            let msg = match &cookie {
                Some(c) => Control::List { cookie: c },
                None => Control::Hello { pad: HELLO_PAD },
            };
            let n = msg.encode(&mut buf)?;
            socket.send_to(&buf[..n], server)?;
            asked_at = Some(Instant::now());
        }
        socket.set_read_timeout(Some(Duration::from_millis(50)))?;
        let Ok(Some(got)) = socket.recv(&mut buf) else {
            continue;
        };
        if got.from != server {
            continue;
        }
        match Control::decode(&buf[..got.len]) {
            Ok(Control::Challenge { cookie: c, .. }) if cookie.is_none() => {
                cookie = Some(*c);
                asked_at = None;
            }
            Ok(Control::Listed {
                room,
                server: at,
                members,
                region,
            }) => out.push(netjam_engine::room::ListedRoom {
                room: room.to_owned(),
                server: if at.is_empty() {
                    server.to_string()
                } else {
                    at.to_owned()
                },
                members,
                region: region.to_owned(),
            }),
            Ok(Control::ListEnd { count }) if count as usize == out.len() => return Ok(out),
            Ok(Control::Refused { code, .. }) if code == RefuseCode::BadCookie as i32 => {
                cookie = None;
                asked_at = None;
            }
            _ => {}
        }
    }
    bail!(
        "no list from the rooms server at {server} within {:.0} s: is `netjam server` (this version or newer) running there, and does its firewall let UDP port {} in?",
        timeout.as_secs_f64(),
        server.port()
    )
}

/// How long to collect the roster events that follow a welcome before the audio starts
/// (the rest arrive through the control thread).
const EARLY_ROSTER: Duration = Duration::from_millis(20);

/// The control thread of a seated client.
#[derive(Debug)]
pub struct RoomLink {
    pub roster: Arc<Mutex<Roster>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RoomLink {
    /// A copy of the roster as it stands.
    pub fn roster(&self) -> Roster {
        self.roster.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Leave the room (one `/netjam/leave`) and stop the thread.
    pub fn leave(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RoomLink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Where the control thread's commands come from besides the roster.
pub trait CommandSource: Send + 'static {
    /// The next command, if one waits.
    fn next(&mut self, roster: &Roster) -> Option<Command>;
}

impl CommandSource for () {
    fn next(&mut self, _: &Roster) -> Option<Command> {
        None
    }
}

impl<T: CommandSource> CommandSource for Option<T> {
    fn next(&mut self, roster: &Roster) -> Option<Command> {
        self.as_mut().and_then(|s| s.next(roster))
    }
}

/// Two surfaces at once (OSC and the page): the first's waiting commands, then the
/// second's.
impl<A: CommandSource, B: CommandSource> CommandSource for (A, B) {
    fn next(&mut self, roster: &Roster) -> Option<Command> {
        self.0.next(roster).or_else(|| self.1.next(roster))
    }
}

/// Where the control thread sends and what it steers.
pub struct RoomWires<S> {
    /// Sends one datagram to an address on the stream's socket.
    pub send: S,
    /// The send thread's route table ([`crate::session::NetIo::route`]).
    pub route: Arc<crate::session::SendRoute>,
    /// An ensemble member riding on this seat (`jam --room R --ensemble`): what the server
    /// relays for it goes there, and it hears where the room's server is.
    pub ensemble: Option<crate::ensemble::SeatInbox>,
    /// A private room's new passwords (OSC's `/password`, the page).
    pub passwords: Option<mpsc::Receiver<String>>,
}

impl<S> std::fmt::Debug for RoomWires<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoomWires")
            .field("ensemble", &self.ensemble.is_some())
            .finish_non_exhaustive()
    }
}

/// Starts the control thread for a seated client.
///
/// `control` receives the server's OSC datagrams and the other members' probes from the
/// stream's receive thread; `wires.send` sends one datagram on the stream's socket;
/// `commands` is the audio thread's ring, of which this thread becomes the only producer;
/// `extra` are commands from elsewhere (the OSC surface) passed on in order.
pub fn spawn<S: Fn(&[u8], SocketAddr) + Send + 'static>(
    seated: Seated,
    wires: RoomWires<S>,
    control: mpsc::Receiver<ControlDatagram>,
    mut commands: rtrb::Producer<Command>,
    mut extra: impl CommandSource,
) -> anyhow::Result<RoomLink> {
    let Seated {
        mut session, known, ..
    } = seated;
    let RoomWires {
        send,
        route,
        ensemble,
        passwords,
    } = wires;
    let shared = Arc::new(Mutex::new(session.roster().clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (shared, stop) = (shared.clone(), stop.clone());
        std::thread::Builder::new().name("netjam-room".into()).spawn(move || {
            let mut buf = vec![0u8; MAX_CONTROL_LEN.max(2048)];
            let take = |session: &mut Session, (at, from, bytes): ControlDatagram| {
                match ensemble.as_ref() {
                    Some(e) if from == session.server() && SeatInbox::wants(&bytes) => {
                        session.heard_server(at);
                        e.deliver(at, from, &bytes);
                    }
                    _ => session.handle_datagram(at, from, &bytes),
                }
            };
            // What the session asks of the world; true when the roster changed.
            let do_event = |session: &mut Session, e: SessionEvent| {
                match e {
                    SessionEvent::ServerIs(a) => {
                        route.set_peer(a);
                        if let Some(e) = &ensemble {
                            e.server_is(a);
                        }
                    }
                    SessionEvent::Routes => route.set_table(session.route_table()),
                    SessionEvent::Redirect(to) => match resolve_redirect(&to, session.server()) {
                        Ok(a) => session.redirect_to(clock::now_ns(), a, known.get(a)),
                        Err(e) => tracing::warn!("{e:#}"),
                    },
                    SessionEvent::Key(server, e) => {
                        if let Err(msg) = server_key_event(&e, server, &known) {
                            eprintln!("netjam: {msg}");
                            session.refuse(msg);
                        }
                    }
                    SessionEvent::SsrcChanged { was, now } => tracing::warn!(
                        "the server seated this player again with SSRC {now:08x} instead of {was:08x}; restart to be heard"
                    ),
                    SessionEvent::Changed => return true,
                    // The join's own: the seat is taken before this thread starts.
                    SessionEvent::Seated { .. } | SessionEvent::Refused { .. } => {}
                }
                false
            };
            while !stop.load(Ordering::Relaxed) {
                let now = clock::now_ns();
                // Wake for the session's timers, and often enough that an OSC fader moves
                // within a few milliseconds.
                let wait = session
                    .poll_timeout(now)
                    .map_or(5_000_000, |t| t.saturating_sub(now))
                    .min(5_000_000);
                match control.recv_timeout(Duration::from_nanos(wait)) {
                    Ok(d) => {
                        take(&mut session, d);
                        while let Ok(d) = control.try_recv() {
                            take(&mut session, d);
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
                while let Some(password) = passwords.as_ref().and_then(|p| p.try_recv().ok()) {
                    // Argon2id: tens of milliseconds of this thread, on purpose.
                    match netjam_engine::privacy::RoomSecret::derive(&session.roster().room, &password) {
                        Ok(s) => session.change_password(clock::now_ns(), s.join_proof(), s.media_key()),
                        Err(e) => session.password_note(format!(
                            "the password was not changed: its keys cannot be derived ({e}): try another"
                        )),
                    }
                }
                session.handle_timeout(clock::now_ns());
                let mut changed = false;
                // Events before sending (a new server, a redirect followed), and again after:
                // a changed route table takes effect once the route lists have gone.
                while let Some(e) = session.poll_event() {
                    changed |= do_event(&mut session, e);
                }
                while let Some((to, n)) = session.poll_transmit(clock::now_ns(), &mut buf) {
                    send(&buf[..n], to);
                }
                while let Some(e) = session.poll_event() {
                    changed |= do_event(&mut session, e);
                }
                while let Some(c) = extra.next(session.roster()) {
                    session.command(c);
                }
                while let Some(c) = session.poll_command() {
                    if let Err(rtrb::PushError::Full(c)) = commands.push(c) {
                        session.roster_mut().commands_dropped += 1;
                        if let Command::Rekey { epoch, .. } = c {
                            session.password_note(format!(
                                "the audio thread was too busy to take the keys of epoch {epoch}: set the password again"
                            ));
                        }
                        changed = true;
                    }
                }
                if changed {
                    if let Ok(mut s) = shared.lock() {
                        let dropped = s.control_dropped;
                        *s = session.roster().clone();
                        s.control_dropped = dropped;
                    }
                }
            }
            // Media goes only to the server from here on (and stops soon).
            session.leave(clock::now_ns());
            while let Some(e) = session.poll_event() {
                if e == SessionEvent::Routes {
                    route.set_table(session.route_table());
                }
            }
            while let Some((to, n)) = session.poll_transmit(clock::now_ns(), &mut buf) {
                send(&buf[..n], to);
            }
        })?
    };
    Ok(RoomLink {
        roster: shared,
        stop,
        thread: Some(thread),
    })
}
