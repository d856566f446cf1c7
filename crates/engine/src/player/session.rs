//! The player's control half in a room, from its first hello: the room client, the direct
//! paths to the other members, the question of where the server sees this player after a
//! rejoin, the roster and the servers the room may move between.
//!
//! [`Session`] decides everything about the seat: which datagram goes where, when a silent
//! server is given up for the next front door (before the seat as after it), where a
//! redirect leads, what a rejoin or a move does to the roster, which commands the audio
//! half gets, and when the send thread's route table changes. It starts unseated: the join
//! (hello, challenge, join, redirects) is its first phase, ended by
//! [`SessionEvent::Seated`] or [`SessionEvent::Refused`]. Like the rest of the player's core it reads no clock and
//! touches no socket, thread or file: the shell hands it the time and the datagrams,
//! sends what [`Session::poll_transmit`] returns, and does what [`Session::poll_event`]
//! asks for that needs the outside world (resolving a redirect's name, pinning a server's
//! key in a file, deriving a password's keys).
//!
//! The run loop, on a control thread (the join runs the same loop until seated, then the
//! shell starts the audio and goes on with the same session):
//!
//! ```text
//! loop {
//!     wait for a datagram until session.poll_timeout(now) (or a few ms, for faders)
//!     session.handle_datagram(at, from, bytes)      // each that arrived
//!     session.handle_timeout(now)
//!     while let Some(e) = session.poll_event() { seated, refused, server, redirect, key, … }
//!     while let Some((to, n)) = session.poll_transmit(now, &mut buf) { send }
//!     while let Some(e) = session.poll_event() { the route table, … }
//!     while let Some(c) = session.poll_command() { the audio thread's ring }
//! }
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

use crate::nat::direct::{DirectConfig, DirectPaths, PathEvent, PathInfo, PathState, RouteTable, Target};
use crate::privacy::MediaKey;
use crate::room::{RefuseCode, RoomClient, RoomEvent, RosterKind};

use super::{Command, ReflexiveQuery, RoomMove, Roster};

/// How long a server a redirect named may stay silent before the player goes back to the
/// server it was told to use and asks again (a dead server's rooms stay in the directory
/// until their leases run out; the server asked then claims the room itself), ns.
pub const REDIRECT_PATIENCE_NS: u64 = 1_000_000_000;

/// How often the roster's path figures (round trips) are refreshed when nothing else
/// changed, ns.
const PATHS_REFRESH_NS: u64 = 250_000_000;

/// Most passwords asked for at once (the oldest is forgotten beyond).
const PENDING_PASSWORDS: usize = 4;

/// A server key (the public half of its static key).
pub type ServerKey = [u8; 32];

/// The rooms servers the player named (`--server A,B`), in order, and the one it asks now:
/// the front doors of a service whose servers share a room directory. When the one asked
/// stays silent for [`REDIRECT_PATIENCE_NS`] (before a seat) or stops answering (after
/// one), the player asks the next, so a band still plays when the server it named is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrontDoors {
    doors: Vec<SocketAddr>,
    at: usize,
}

impl FrontDoors {
    /// `first`, then `others` in order.
    pub fn new(first: SocketAddr, others: &[SocketAddr]) -> Self {
        let mut doors = vec![first];
        doors.extend(others.iter().copied().filter(|a| *a != first));
        Self { doors, at: 0 }
    }

    /// The front door asked now.
    pub fn current(&self) -> SocketAddr {
        self.doors[self.at]
    }

    /// Whether there is another door to try.
    pub fn several(&self) -> bool {
        self.doors.len() > 1
    }

    /// Moves on to the next door (after the last, the first again) and returns it.
    pub fn advance(&mut self) -> SocketAddr {
        self.at = (self.at + 1) % self.doors.len();
        self.current()
    }

    /// Every door, in order.
    pub fn all(&self) -> &[SocketAddr] {
        &self.doors
    }
}

/// How a session starts: an unseated client and what to do once seated.
#[derive(Debug)]
pub struct SessionStart {
    /// The client, as made: it says hello to `front.current()` first, with the key pinned
    /// for that server in its config.
    pub client: RoomClient,
    /// The servers named, the first of them asked first.
    pub front: FrontDoors,
    /// The room's name as given.
    pub room: String,
    /// The SSRC the sender uses (the seat may come with another: see
    /// [`SessionEvent::Seated`]).
    pub ssrc: u32,
    /// Whether to punch direct paths to other members (`jam --via-server` says no).
    pub direct: bool,
    /// List the room publicly (`jam --public`).
    pub public: bool,
    /// Mix settings by member name to apply as members are seated (`jam --mix`).
    pub mixes: super::Mixes,
    /// A private room's join proof and media key in force.
    pub private: Option<([u8; 32], MediaKey)>,
    /// Keys pinned for servers the session may switch to (the front doors): a switch uses
    /// the one pinned for where it goes.
    pub pinned: BTreeMap<SocketAddr, ServerKey>,
    /// Random bytes from which the STUN questions' transaction ids are derived (the core
    /// has no source of randomness of its own).
    pub stun_seed: [u8; 32],
    pub now_ns: u64,
}

/// Something the player is told, once, as it happens (the status line's event lines).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Notice {
    /// The server stopped answering; the session keeps asking (and members on a direct
    /// path are still heard).
    ServerLost { server: SocketAddr },
    /// The same server answers again, after this long without a word from it.
    ServerBack { server: SocketAddr, silence_s: f64 },
    /// The room is on another server now.
    Moved(RoomMove),
    /// After a rejoin the server sees this player at another public address.
    SeenAt { addr: SocketAddr },
    /// Who else is in the room now, by name, in seat order (empty: nobody).
    Members { room: String, names: Vec<String> },
    /// Media to a member now goes straight to it, or through the server (and why).
    Path {
        member: String,
        was: Option<PathState>,
        path: PathInfo,
    },
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::ServerLost { server } => write!(
                f,
                "the rooms server at {server} stopped answering; asking again (members on a direct path are still heard)"
            ),
            Notice::ServerBack { server, silence_s } => write!(
                f,
                "the rooms server at {server} answers again after {silence_s:.1} s; playing on"
            ),
            Notice::Moved(m) if m.handed_over => write!(
                f,
                "the room moved to {} (its server handed it over: another server holds it now) after {:.1} s of silence; playing on",
                m.to, m.silence_s
            ),
            Notice::Moved(m) => write!(
                f,
                "the room moved to {} after {:.1} s of silence (its server stopped answering); playing on",
                m.to, m.silence_s
            ),
            Notice::SeenAt { addr } => write!(f, "the server now sees you at {addr}"),
            Notice::Members { room, names } if names.is_empty() => {
                write!(f, "room {room}: nobody else is here yet")
            }
            Notice::Members { room, names } => write!(f, "room {room}: {}", names.join(", ")),
            Notice::Path { member, was, path } => {
                let ms = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
                let (direct, relay) = (ms(path.direct_rtt_ms), ms(path.relay_rtt_ms));
                match path.state {
                    PathState::Direct => write!(
                        f,
                        "direct path to {member} at {}: RTT {direct} ms, through the server {relay} ms",
                        path.addr.map_or("-".into(), |a| a.to_string()),
                    ),
                    PathState::Relayed if path.slower => write!(
                        f,
                        "the direct path to {member} answers but is slower (RTT {direct} ms, through the server {relay} ms): through the server{}",
                        if *was == Some(PathState::Direct) { " again" } else { "" }
                    ),
                    PathState::Relayed if *was == Some(PathState::Direct) => write!(
                        f,
                        "the direct path to {member} stopped answering: through the server again, RTT {relay} ms"
                    ),
                    PathState::Relayed if path.direct_rtt_ms.is_some() => write!(
                        f,
                        "no direct path to {member}: its probes were answered (RTT {direct} ms) but the path did not hold: through the server, RTT {relay} ms"
                    ),
                    PathState::Relayed => write!(
                        f,
                        "no direct path to {member}: its addresses did not answer the probes (a router or firewall between you drops them): through the server, RTT {relay} ms"
                    ),
                    PathState::Punching => write!(f, "looking for a direct path to {member}"),
                }
            }
        }
    }
}

/// What the shell does for the session.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    /// The first seat is taken, on [`Session::server`]: start the audio, sending with
    /// `ssrc`. `redirected` is the name of the server the room's redirect led to, if one did.
    Seated {
        member_id: u32,
        ssrc: u32,
        redirected: Option<String>,
    },
    /// The join was refused before a seat was taken: say why and stop. (A seat refused
    /// later is in the roster: [`Roster::refused`].)
    Refused {
        code: Option<RefuseCode>,
        reason: String,
    },
    /// Talk to this server from now on: the send thread's peer, and an ensemble on the seat.
    ServerIs(SocketAddr),
    /// The send thread's route table changed: [`Session::route_table`].
    Routes,
    /// The room lives on another server, by this name: resolve it and call
    /// [`Session::redirect_to`] (with the key pinned for the address), or say why not.
    Redirect(String),
    /// The server at this address showed its key for the first time (pin it, say it), or
    /// another key than the one pinned (stop: say it, and call [`Session::refuse`]).
    Key(SocketAddr, RoomEvent),
    /// The seat was taken again with another SSRC than the sender's: the player must
    /// restart to be heard.
    SsrcChanged { was: u32, now: u32 },
    /// The roster changed: copy it for the views.
    Changed,
}

/// The player's control half (see the module docs).
#[derive(Debug)]
pub struct Session {
    client: RoomClient,
    paths: DirectPaths,
    roster: Roster,
    front: FrontDoors,
    server: SocketAddr,
    ssrc: u32,
    direct: bool,
    pinned: BTreeMap<SocketAddr, ServerKey>,
    /// Asked again after a rejoin: where the server sees us now.
    stun: Option<ReflexiveQuery>,
    /// Their transaction ids: SHA-256 of the seed and a count, so none repeats and none
    /// can be guessed without the seed (RFC 8489 section 5).
    stun_seed: [u8; 32],
    stun_asked: u64,
    /// When the server was last heard from, and when it was switched to.
    heard_at: u64,
    switched_at: u64,
    /// Silence began here (the old server's last word) while the room is moving.
    moving_since: Option<u64>,
    /// The move under way was a redirect from the room's server, not its silence.
    handed_over: bool,
    /// Before the first seat: the name the last redirect gave (said when seated there).
    redirected: Option<String>,
    /// Since when (its last word), and which server has been silent, while one is.
    lost: Option<(u64, SocketAddr)>,
    /// Each member's path as last told.
    paths_told: BTreeMap<u32, PathState>,
    /// Who else is in the room, as last told.
    members_told: Vec<String>,
    table: RouteTable,
    refreshed: u64,
    /// A private room's keys in force, and those of passwords asked for, newest last.
    private: Option<([u8; 32], MediaKey)>,
    pending: Vec<([u8; 32], MediaKey)>,
    /// Another member changed the password and this player has not taken it yet.
    behind: bool,
    commands: VecDeque<Command>,
    events: VecDeque<SessionEvent>,
    changed: bool,
}

impl Session {
    /// An unseated session: its client's hello goes to the first front door.
    pub fn new(s: SessionStart) -> Self {
        let SessionStart {
            mut client,
            front,
            room,
            ssrc,
            direct,
            public,
            mixes,
            private,
            pinned,
            stun_seed,
            now_ns,
        } = s;
        if public {
            client.set_public();
        }
        let server = front.current();
        Session {
            client,
            paths: DirectPaths::new(DirectConfig::default(), 0),
            roster: Roster {
                room,
                mixes,
                ..Roster::default()
            },
            front,
            server,
            ssrc,
            direct,
            pinned,
            stun: None,
            stun_seed,
            stun_asked: 0,
            // Nothing heard yet: a first server that never answers is given up for the
            // next front door as a redirect's silent server is.
            heard_at: 0,
            switched_at: now_ns,
            moving_since: None,
            handed_over: false,
            redirected: None,
            lost: None,
            paths_told: BTreeMap::new(),
            members_told: Vec::new(),
            table: RouteTable::default(),
            refreshed: now_ns,
            private,
            pending: Vec::new(),
            behind: false,
            commands: VecDeque::new(),
            events: VecDeque::new(),
            changed: true,
        }
    }

    /// Whether the first seat has been taken.
    pub fn seated(&self) -> bool {
        self.roster.me.is_some()
    }

    /// The front doors, at the one asked now.
    pub fn front(&self) -> &FrontDoors {
        &self.front
    }

    /// The server talked to now.
    pub fn server(&self) -> SocketAddr {
        self.server
    }

    /// Where media goes: straight to members with a working direct path, the rest through
    /// the server.
    pub fn route_table(&self) -> RouteTable {
        self.table
    }

    /// The roster as it stands.
    pub fn roster(&self) -> &Roster {
        &self.roster
    }

    /// Counters the shell keeps in the roster (commands its ring refused, control
    /// datagrams it dropped).
    pub fn roster_mut(&mut self) -> &mut Roster {
        &mut self.roster
    }

    /// Something from the room's server arrived at `at_ns` that another part of the player
    /// took (an ensemble's relayed message): the server is alive.
    pub fn heard_server(&mut self, at_ns: u64) {
        self.heard_at = self.heard_at.max(at_ns);
    }

    /// A datagram from `from`: a member's probe, the server's control, or a STUN answer.
    pub fn handle_datagram(&mut self, at_ns: u64, from: SocketAddr, bytes: &[u8]) {
        if from != self.server {
            self.paths.handle_probe(at_ns, from, bytes);
        } else if bytes.first() == Some(&b'/') {
            self.heard_at = at_ns;
            self.client.handle_datagram(at_ns, bytes);
        } else if let Some(q) = &mut self.stun {
            q.handle_datagram(at_ns, from, bytes);
        }
    }

    /// A new password's keys, derived by the shell (slow on purpose): asked of the server.
    pub fn change_password(&mut self, now_ns: u64, proof: [u8; 32], media: MediaKey) {
        if self.pending.len() >= PENDING_PASSWORDS {
            self.pending.remove(0);
        }
        self.pending.push((proof, media));
        self.client.rekey(now_ns, proof);
        self.changed = true;
    }

    /// Says a password could not be used (its keys could not be derived).
    pub fn password_note(&mut self, note: String) {
        self.roster.password_notes.push(note);
        self.changed = true;
    }

    /// The redirect's name resolved to `server` (with the key pinned for it, if any).
    pub fn redirect_to(&mut self, now_ns: u64, server: SocketAddr, key: Option<ServerKey>) {
        if let Some(k) = key {
            self.pinned.insert(server, k);
        }
        if self.roster.me.is_some() && self.moving_since.is_none() {
            // Seated: the room's server hands the room over to another (it lost the
            // room's claim to it).
            self.moving_since = Some(now_ns);
            self.handed_over = true;
        }
        self.switch(now_ns, server);
    }

    /// The shell refused what the server showed (another key than pinned): stop.
    pub fn refuse(&mut self, why: String) {
        self.roster.refused = Some(why);
        self.roster.lost = true;
        self.changed = true;
    }

    /// The next deadline for [`Session::handle_timeout`].
    pub fn poll_timeout(&self, now_ns: u64) -> Option<u64> {
        let patience = self
            .waiting_on_silence()
            .then_some(self.switched_at + REDIRECT_PATIENCE_NS);
        self.client
            .poll_timeout()
            .into_iter()
            .chain(self.paths.poll_timeout())
            .chain(self.stun.as_ref().and_then(|q| q.poll_timeout(now_ns)))
            .chain(patience)
            .chain(Some(self.refreshed + PATHS_REFRESH_NS))
            .min()
    }

    /// A server the session switched to and that has not answered, with somewhere else
    /// to ask.
    fn waiting_on_silence(&self) -> bool {
        (self.server != self.front.current() || self.front.several())
            && self.client.seat().is_none()
            && self.heard_at < self.switched_at
    }

    /// Everything due at `now_ns`: timers, the client's events, the paths' events.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        if self.waiting_on_silence() && now_ns.saturating_sub(self.switched_at) >= REDIRECT_PATIENCE_NS {
            // Sent to a server that does not answer: ask the front door again, or the
            // next one when the front door is the silent one.
            let next = if self.server == self.front.current() {
                self.front.advance()
            } else {
                self.front.current()
            };
            self.redirected = None;
            self.switch(now_ns, next);
        }
        if self.client.poll_timeout().is_some_and(|t| t <= now_ns) {
            self.client.handle_timeout(now_ns);
        }
        while let Some(e) = self.client.poll_event() {
            self.changed = true;
            self.on_room_event(now_ns, e);
        }
        if let Some(q) = &self.stun {
            if q.done(now_ns) {
                if let Some(a) = q.report().server_sees {
                    // Said when it changed; a first answer is no news.
                    if self.roster.server_sees.is_some_and(|was| was != a) {
                        self.roster.notices.push(Notice::SeenAt { addr: a });
                    }
                    self.roster.server_sees = Some(a);
                    self.changed = true;
                }
                self.stun = None;
            }
        }
        if let Some(rtt) = self.client.server_rtt_ns() {
            self.paths.set_server_rtt(rtt);
        }
        if self.paths.poll_timeout().is_some_and(|t| t <= now_ns) {
            self.paths.handle_timeout(now_ns);
        }
        while let Some(e) = self.paths.poll_event() {
            self.changed = true;
            let (PathEvent::Direct { member_id, .. } | PathEvent::Relayed { member_id, .. }) = e;
            self.tell_path(member_id);
        }
        if self.changed || now_ns.saturating_sub(self.refreshed) >= PATHS_REFRESH_NS {
            self.refreshed = now_ns;
            self.changed = true;
            self.roster.paths = self.paths.paths().map(|p| (p.member_id, p)).collect();
            self.roster.server_rtt_ms = self.client.server_rtt_ns().map(|r| r as f64 / 1e6);
            self.roster.direct = self.paths.stats();
        }
        if std::mem::take(&mut self.changed) {
            self.tell_members();
            self.events.push_back(SessionEvent::Changed);
        }
    }

    /// Says who else is in the room, if that changed since it was last said (all of one
    /// batch of roster events at once: a move's fresh seat and the members that come
    /// with it are one line, not "nobody" and then everyone).
    fn tell_members(&mut self) {
        if self.roster.me.is_none() {
            return;
        }
        let names: Vec<String> = self.roster.members.values().map(|m| m.name.clone()).collect();
        if names != self.members_told {
            self.members_told.clone_from(&names);
            self.roster.notices.push(Notice::Members {
                room: self.roster.room.clone(),
                names,
            });
        }
    }

    /// The next datagram to send and where, written into `buf` (at least
    /// [`crate::room::msg::MAX_WIRE_LEN`] bytes): the client's control first, then the STUN
    /// question, then route lists and probes. Once there is nothing left to send, a changed
    /// route table is an event ([`SessionEvent::Routes`]): the server hears of a dead path
    /// before the send thread's next packet goes back through it.
    pub fn poll_transmit(&mut self, now_ns: u64, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        let next = self.next_transmit(now_ns, buf);
        if next.is_none() {
            let t = self.paths.route_table();
            if t != self.table {
                self.table = t;
                self.events.push_back(SessionEvent::Routes);
            }
        }
        next
    }

    fn next_transmit(&mut self, now_ns: u64, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        if let Some(n) = self.client.poll_transmit(buf) {
            return Some((self.server, n));
        }
        if let Some(x) = self.stun.as_mut().and_then(|q| q.poll_transmit(now_ns, buf)) {
            return Some(x);
        }
        loop {
            match self.paths.poll_transmit(now_ns, buf)? {
                // Sealed like the client's own control.
                (Target::Server, n) => {
                    self.client.send_control(&buf[..n]);
                    if let Some(m) = self.client.poll_transmit(buf) {
                        return Some((self.server, m));
                    }
                }
                (Target::Addr(a), n) => return Some((a, n)),
            }
        }
    }

    /// The next thing for the shell to do.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    /// The next command for the audio half.
    pub fn poll_command(&mut self) -> Option<Command> {
        self.commands.pop_front()
    }

    /// A command from a control surface (OSC, the page): kept in the roster's mixes, and
    /// passed to the audio half in order.
    pub fn command(&mut self, c: Command) {
        self.roster.remember(&c);
        self.commands.push_back(c);
    }

    /// Leave the room: one `/netjam/leave` (then send what [`Session::poll_transmit`]
    /// gives). Media goes only to the server from here on.
    pub fn leave(&mut self, now_ns: u64) {
        self.table = RouteTable::default();
        self.events.push_back(SessionEvent::Routes);
        self.client.leave(now_ns);
    }

    /// A transaction id never used before.
    fn stun_id(&mut self) -> [u8; 12] {
        use sha2::{Digest, Sha256};
        self.stun_asked += 1;
        let d = Sha256::new()
            .chain_update(self.stun_seed)
            .chain_update(self.stun_asked.to_le_bytes())
            .finalize();
        let mut id = [0u8; 12];
        id.copy_from_slice(&d[..12]);
        id
    }

    /// Talk to `server` from now on, with the key pinned for it.
    fn switch(&mut self, now_ns: u64, server: SocketAddr) {
        self.server = server;
        self.switched_at = now_ns;
        self.events.push_back(SessionEvent::ServerIs(server));
        self.client.set_server_key(self.pinned.get(&server).copied());
        self.client.server_changed(now_ns);
    }

    fn on_room_event(&mut self, now_ns: u64, e: RoomEvent) {
        if self.private.is_some() {
            if let Some(note) = self.password_event(&e) {
                self.roster.password_notes.push(note);
            }
        }
        match e {
            RoomEvent::Peer(p) if self.direct => self.paths.set_peer(now_ns, &p),
            RoomEvent::Peer(_) => {}
            RoomEvent::Routed { seq } => self.paths.routed(seq),
            RoomEvent::Roster(entry) => {
                if matches!(entry.kind, RosterKind::Left | RosterKind::Timeout) {
                    self.paths.remove_peer(now_ns, entry.member_id);
                    self.roster.paths.remove(&entry.member_id);
                    self.paths_told.remove(&entry.member_id);
                }
                self.commands.extend(self.roster.commands_for(&entry));
                self.found(now_ns);
            }
            RoomEvent::Joined { member_id, ssrc, .. } if !self.seated() => {
                self.first_seat(now_ns, member_id, ssrc)
            }
            RoomEvent::Joined {
                member_id,
                ssrc,
                rejoined,
            } => {
                if rejoined {
                    self.roster.rejoins += 1;
                } else {
                    // A fresh seat (on another server, or this one restarted): the members
                    // come again with new ids.
                    for m in self.roster.members.keys().copied().collect::<Vec<_>>() {
                        self.paths.remove_peer(now_ns, m);
                    }
                    self.commands.extend(self.roster.forget_members());
                }
                if let Some(since) = self.moving_since.take() {
                    let m = RoomMove {
                        to: self.server,
                        silence_s: now_ns.saturating_sub(since) as f64 / 1e9,
                        handed_over: std::mem::take(&mut self.handed_over),
                    };
                    self.roster.moves += 1;
                    self.roster.last_move = Some(m.clone());
                    // Seated again where it was: the server came back, the room did not move.
                    if self.lost.take().is_some_and(|(_, s)| s == m.to) {
                        self.roster.notices.push(Notice::ServerBack {
                            server: m.to,
                            silence_s: m.silence_s,
                        });
                    } else {
                        self.roster.notices.push(Notice::Moved(m));
                    }
                }
                self.found(now_ns);
                self.roster.server = Some(self.server);
                self.roster.server_key = self
                    .client
                    .server_key()
                    .map(|k| crate::room::secure::fingerprint(&k));
                if ssrc != self.ssrc {
                    // A fresh seat after the server forgot us: its SSRC is in the welcome,
                    // but the sender cannot change mid-stream.
                    self.events.push_back(SessionEvent::SsrcChanged {
                        was: self.ssrc,
                        now: ssrc,
                    });
                }
                self.roster.me = Some((member_id, ssrc));
                self.paths.set_me(now_ns, member_id);
                let id = self.stun_id();
                self.stun = Some(ReflexiveQuery::new(self.server, None, now_ns, [id, id]));
            }
            // Before a seat the silence is the session's own patience (above).
            RoomEvent::Lost if !self.seated() => {}
            RoomEvent::Lost => {
                self.roster.lost = true;
                if self.lost.is_none() {
                    self.lost = Some((self.heard_at, self.server));
                    self.roster
                        .notices
                        .push(Notice::ServerLost { server: self.server });
                }
                if self.moving_since.is_none() {
                    self.moving_since = Some(self.heard_at);
                }
                if self.server != self.front.current() || self.front.several() {
                    // The room's server went silent: the front door knows (or decides)
                    // where the room lives now; when the front door itself went silent,
                    // the next one named does.
                    let next = if self.server == self.front.current() {
                        self.front.advance()
                    } else {
                        self.front.current()
                    };
                    self.switch(now_ns, next);
                }
            }
            RoomEvent::Redirected { server } => {
                if !self.seated() {
                    self.redirected = Some(server.clone());
                }
                self.events.push_back(SessionEvent::Redirect(server));
            }
            RoomEvent::Epoch { .. } | RoomEvent::PasswordChanged { .. } | RoomEvent::RekeyRefused { .. } => {}
            e @ (RoomEvent::ServerKey { .. } | RoomEvent::ServerKeyChanged { .. }) => {
                if let RoomEvent::ServerKey { key } = &e {
                    self.pinned.insert(self.server, *key);
                }
                self.events.push_back(SessionEvent::Key(self.server, e));
            }
            RoomEvent::Refused { code, reason } if !self.seated() => {
                self.roster.refused = Some(reason.clone());
                self.events.push_back(SessionEvent::Refused { code, reason });
            }
            RoomEvent::Refused { code, reason } => {
                self.roster.replaced = code == Some(RefuseCode::Replaced);
                self.roster.refused = Some(reason);
                self.roster.lost = true;
            }
        }
    }

    /// The join ends: the roster, the paths and a private room's keys start from this seat.
    fn first_seat(&mut self, now_ns: u64, member_id: u32, ssrc: u32) {
        self.ssrc = ssrc;
        self.roster.me = Some((member_id, ssrc));
        self.roster.server = Some(self.server);
        self.roster.server_key = self
            .client
            .server_key()
            .map(|k| crate::room::secure::fingerprint(&k));
        self.paths.set_me(now_ns, member_id);
        if let Some((_, media)) = self.private {
            if self.client.epoch() != 0 {
                // The room's password changed before this player sat down: its seat's epoch.
                self.commands.push_back(Command::Rekey {
                    epoch: self.client.epoch(),
                    key: media,
                });
            }
        }
        self.events.push_back(SessionEvent::Seated {
            member_id,
            ssrc,
            redirected: self.redirected.take(),
        });
    }

    /// Says where media to `member_id` goes, if that changed since it was last said.
    fn tell_path(&mut self, member_id: u32) {
        let Some(path) = self.paths.path(member_id) else {
            return;
        };
        if path.state == PathState::Punching {
            return;
        }
        let was = self.paths_told.insert(member_id, path.state);
        if was == Some(path.state) {
            return;
        }
        let member = self
            .roster
            .members
            .get(&member_id)
            .map_or_else(|| format!("member {member_id}"), |m| m.name.clone());
        self.roster.notices.push(Notice::Path { member, was, path });
    }

    /// The server answered (a roster entry, a seat): a silence that did not end in a move
    /// ends here.
    fn found(&mut self, now_ns: u64) {
        self.roster.lost = false;
        if let Some((since, server)) = self.lost.take() {
            // It kept the seat: nothing moved.
            self.moving_since = None;
            self.roster.notices.push(Notice::ServerBack {
                server,
                silence_s: now_ns.saturating_sub(since) as f64 / 1e9,
            });
        }
    }

    /// A private room's part in a password change: when the server answers with an epoch,
    /// the audio half gets the keys to seal and open in it. Returns what to tell the player.
    fn password_event(&mut self, e: &RoomEvent) -> Option<String> {
        let (proof, media) = self.private.as_mut()?;
        match e {
            RoomEvent::Epoch { epoch, key } => {
                let took = key != proof;
                let m = if took {
                    self.pending
                        .iter()
                        .rev()
                        .find(|(k, _)| k == key)
                        .map(|(_, m)| *m)?
                } else {
                    *media
                };
                (*proof, *media) = (*key, m);
                self.pending.clear();
                self.commands.push_back(Command::Rekey {
                    epoch: *epoch,
                    key: m,
                });
                let was_behind = std::mem::take(&mut self.behind);
                let room = &self.roster.room;
                took.then(|| {
                    if was_behind {
                        format!("you took room {room:?}'s new password (epoch {epoch}): you hear the members who have it, and they hear you")
                    } else {
                        format!("you changed room {room:?}'s password (epoch {epoch}): members hear you again as they take it; tell it to the band, and whoever does not have it hears nothing from now on")
                    }
                })
            }
            RoomEvent::PasswordChanged { by, .. } => {
                self.behind = true;
                let who = self
                    .roster
                    .members
                    .get(by)
                    .map_or_else(|| format!("member {by}"), |m| m.name.clone());
                Some(format!(
                    "{who} changed room {:?}'s password: until you take the new one (OSC /password ,s NEW) you hear nobody who has it and they do not hear you",
                    self.roster.room
                ))
            }
            RoomEvent::RekeyRefused { reason, .. } => Some(format!("the password was not changed: {reason}")),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(state: PathState, direct: Option<f64>, relay: Option<f64>, slower: bool) -> PathInfo {
        PathInfo {
            member_id: 1,
            state,
            addr: None,
            direct_rtt_ms: direct,
            relay_rtt_ms: relay,
            direct_count: 0,
            died: 0,
            slower,
            failures: 0,
        }
    }

    fn line(was: Option<PathState>, path: PathInfo) -> String {
        Notice::Path {
            member: "bo".into(),
            was,
            path,
        }
        .to_string()
    }

    #[test]
    fn each_path_reason_is_said_only_when_it_is_the_reason() {
        let relayed = |d, s| {
            line(
                Some(PathState::Punching),
                info(PathState::Relayed, d, Some(1.5), s),
            )
        };
        // Answered, faster than the server, but not held: not called slower.
        let l = relayed(Some(0.09), false);
        assert!(!l.contains("slower") && l.contains("did not hold"), "{l}");
        // Slower: said with both figures.
        let l = relayed(Some(3.0), true);
        assert!(
            l.contains("slower") && l.contains("3.00") && l.contains("1.50"),
            "{l}"
        );
        // Never answered.
        let l = relayed(None, false);
        assert!(l.contains("did not answer") && !l.contains("slower"), "{l}");
        let died = line(
            Some(PathState::Direct),
            info(PathState::Relayed, Some(0.1), Some(1.5), false),
        );
        assert!(died.contains("stopped answering"), "{died}");
    }
}
