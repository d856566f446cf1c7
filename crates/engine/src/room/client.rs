//! The client's side of the room protocol: [`RoomClient`], a sans-IO state machine.
//!
//! It says hello, answers the challenge with a join (or a rejoin when it already holds a
//! seat), creates the room when the server says it does not exist, sends keep-alives,
//! acknowledges roster events and hands them on in order, and says hello again when its
//! address changed or the server sends a rebind hint. Every request is retried with
//! backoff until answered.
//!
//! A server that shares a room directory with others may answer a join with
//! `/netjam/redirect`: the client reports [`RoomEvent::Redirected`] and waits until the
//! caller sends to the server named and says so with [`RoomClient::server_changed`]; it
//! then says hello there. The caller also calls `server_changed` when it goes back to the
//! server it was first told to use (the one redirected to stopped answering).
//!
//! A seated client told [`RefuseCode::Replaced`] (a newer join of its name came from its
//! address) reports [`RoomEvent::Refused`] and stops, so two copies of one player never
//! take the seat from each other in turn.
//!
//! It hands on `/netjam/peer` (how to reach another member directly) in roster order, and
//! the server's `/netjam/routed`; it declares the caller's host addresses in the join, and
//! measures the round trip to the server (hello → challenge, join → welcome, keep-alive →
//! echo) for the direct paths' comparison.
//!
//! With [`ClientConfig::secure`] every control message but the hello travels in the
//! Noise channel ([`super::secure`]): the challenge's cookie starts a handshake, the join
//! waits until it is done and goes sealed, and so does everything after it. The server's
//! static key is checked against [`ClientConfig::server_key`] (pinned); a first key is
//! reported as [`RoomEvent::ServerKey`] for the caller to pin, another one than pinned as
//! [`RoomEvent::ServerKeyChanged`], and the client stops. In clear it takes only what a
//! server sends before a channel exists: the challenge, a rebind hint, a refusal of its
//! protocol version.
//!
//! Calling loop (like [`Server`](super::Server)): feed every datagram that came from the
//! server and starts with `/` to [`RoomClient::handle_datagram`]; call
//! [`RoomClient::handle_timeout`] at [`RoomClient::poll_timeout`]; after each call drain
//! [`RoomClient::poll_transmit`] (send to the server) and [`RoomClient::poll_event`].
//! It never opens a socket or reads a clock, never sends the password, and never panics
//! on what the server sends.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;

use sha2::{Digest, Sha256};

use super::auth;
use super::msg::{
    decode_addrs, encode_addrs, fold_name, Control, Join, RefuseCode, Rejoin, Rekey, RekeyStatus, RosterKind,
    COOKIE_LEN, HELLO_PAD, MAX_ADDRS_LEN, MAX_CONTROL_LEN, MAX_HOSTS, MAX_WIRE_LEN, NONCE_LEN,
    PAIR_TOKEN_LEN, REKEY_NONCE_LEN, ROOM_KEY_LEN, TOKEN_LEN,
};
use super::secure::{self, SecureClient, SecureError, KEY_LEN};

/// What a [`RoomClient`] asks for.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Room name.
    pub room: String,
    /// This member's name.
    pub name: String,
    /// Room password ("" for none). Only a key derived from it is ever used.
    pub password: String,
    /// The room key when the caller has it already ([`auth::room_key`] of the room and
    /// password: with a password it costs an Argon2id run); `None` derives it.
    pub room_key: Option<[u8; ROOM_KEY_LEN]>,
    /// The SSRC this client would like to send with.
    pub ssrc: u32,
    /// Declared media rate: packets per second.
    pub packets_per_s: u32,
    /// Declared media rate: bytes per second.
    pub bytes_per_s: u32,
    /// Seed of the client nonces (random bytes from the caller; fixed in tests).
    pub nonce_seed: [u8; 16],
    /// First retry interval of an unanswered request; doubles up to `retry_max_ns`.
    pub retry_initial_ns: u64,
    /// Longest retry interval.
    pub retry_max_ns: u64,
    /// Silence from the server after which [`RoomEvent::Lost`] is reported before a seat
    /// is held (once seated, the server's timeout applies).
    pub lost_after_ns: u64,
    /// This client's own addresses (its socket's local addresses), declared in the join
    /// so that members behind the same router can reach it directly; at most
    /// [`MAX_HOSTS`] are sent.
    pub hosts: Vec<SocketAddr>,
    /// The sample rate this player sends and mixes at, Hz, declared in the join so that a
    /// server refuses it at once in a room whose players' rate it cannot convert; 0 says
    /// nothing.
    pub sample_rate: u32,
    /// Control travels in the Noise channel (the server has a static key, as every
    /// `netjam server` does); `false` speaks the protocol in clear, to a server core
    /// without a key.
    pub secure: bool,
    /// The server's static key as pinned before (`None`: the first key shown is taken and
    /// reported with [`RoomEvent::ServerKey`]).
    pub server_key: Option<[u8; KEY_LEN]>,
}

impl ClientConfig {
    /// Defaults for everything but the room, the name and the password.
    pub fn new(room: &str, name: &str, password: &str, ssrc: u32) -> Self {
        Self {
            room: room.to_owned(),
            name: name.to_owned(),
            password: password.to_owned(),
            room_key: None,
            ssrc,
            packets_per_s: 750,
            bytes_per_s: 750 * 300,
            nonce_seed: [0; 16],
            retry_initial_ns: 250_000_000,
            retry_max_ns: 1_000_000_000,
            lost_after_ns: 5_000_000_000,
            hosts: Vec::new(),
            sample_rate: 0,
            secure: false,
            server_key: None,
        }
    }
}

/// One roster event, in the order the server sent them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RosterEntry {
    /// The server's sequence number for this client.
    pub seq: u32,
    /// What happened.
    pub kind: RosterKind,
    /// Whom it is about.
    pub member_id: u32,
    /// Its (new) name.
    pub name: String,
    /// Its SSRC: the receiver for this member is keyed by it.
    pub ssrc: u32,
}

/// How to reach another member directly (`/netjam/peer`), in roster order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerEntry {
    /// The server's sequence number for this client (shared with the roster).
    pub seq: u32,
    /// The other member.
    pub member_id: u32,
    /// Where the server sees it (its router's public address), if the server said.
    pub observed: Option<SocketAddr>,
    /// The host addresses it declared.
    pub hosts: [Option<SocketAddr>; MAX_HOSTS],
    /// The pair's token: probes between the two carry an authenticator made with it.
    pub token: [u8; PAIR_TOKEN_LEN],
}

/// What a [`RoomClient`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoomEvent {
    /// The client holds a seat: send media with `ssrc` (which may differ from the one
    /// asked for). `rejoined`: the same seat as before, from a new address.
    Joined {
        /// Member id.
        member_id: u32,
        /// The SSRC to send with.
        ssrc: u32,
        /// Kept the previous seat.
        rejoined: bool,
    },
    /// A roster event about another member.
    Roster(RosterEntry),
    /// How to reach another member directly (after its `Joined`, and again when either
    /// of the two took its seat back from a new address).
    Peer(PeerEntry),
    /// The server applied the route list `seq` (`/netjam/routed`).
    Routed {
        /// The list's sequence number.
        seq: u32,
    },
    /// The server refused; the client stops.
    Refused {
        /// The code, if known to this version.
        code: Option<RefuseCode>,
        /// The server's text.
        reason: String,
    },
    /// The server stopped answering; the client keeps trying.
    Lost,
    /// Seal and open media in `epoch` with the keys of the password whose room key is
    /// `key`: after the seat's first `/netjam/epoch`, a password change this client asked
    /// for or took ([`RoomClient::rekey`]), or a fresh seat (epoch 0 again).
    Epoch {
        /// The room's media epoch.
        epoch: u32,
        /// The room key (join proof) of the password in force.
        key: [u8; ROOM_KEY_LEN],
    },
    /// Another member changed the room's password (`by`, a member id) into `epoch`: who
    /// takes it is heard no more until this player takes it too ([`RoomClient::rekey`]
    /// with the new password's key).
    PasswordChanged {
        /// The room's new epoch.
        epoch: u32,
        /// Who changed it.
        by: u32,
    },
    /// A [`RoomClient::rekey`] did not go through: the keys stay as they were.
    RekeyRefused {
        /// What the server said, if it answered.
        status: Option<RekeyStatus>,
        /// Why, in words for the player.
        reason: &'static str,
    },
    /// The room lives on another server (`host:port`): send to it from now on and call
    /// [`RoomClient::server_changed`]; until then the client waits.
    Redirected {
        /// The server the room lives on, as it advertises itself.
        server: String,
    },
    /// The control channel is open with a server whose key was not pinned: pin `key` for
    /// it, so that another key is refused next time.
    ServerKey {
        /// The server's static public key.
        key: [u8; KEY_LEN],
    },
    /// The server showed another key than the one pinned for it; the client stops. Either
    /// its operator changed the key (forget the old one) or someone is in the way.
    ServerKeyChanged {
        /// Fingerprint of the key pinned.
        pinned: String,
        /// Fingerprint of the key shown.
        offered: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Hello,
    Join {
        cookie: [u8; COOKIE_LEN],
        server_nonce: [u8; NONCE_LEN],
        create: bool,
        attempts: u32,
    },
    Rejoin {
        cookie: [u8; COOKIE_LEN],
        server_nonce: [u8; NONCE_LEN],
        attempts: u32,
    },
    Joined,
    /// Told to join elsewhere; waiting for the caller to switch servers.
    Redirected,
    Refused,
    Left,
}

#[derive(Debug, Clone, Copy)]
struct Seat {
    member_id: u32,
    ssrc: u32,
    token: [u8; TOKEN_LEN],
}

/// A password change or taking under way.
#[derive(Debug, Clone)]
struct PendingRekey {
    epoch: u32,
    nonce: [u8; REKEY_NONCE_LEN],
    key: [u8; ROOM_KEY_LEN],
    keys: auth::RekeyKeys,
    attempts: u32,
    at: u64,
}

/// Unanswered `/netjam/rekey`s after which the client gives up and says so.
const REKEY_ATTEMPTS: u32 = 6;

/// How far ahead of the next expected roster event one may arrive and be kept.
const REORDER_WINDOW: u32 = 64;
/// Unanswered joins after which the cookie may be stale: say hello again.
const JOIN_ATTEMPTS: u32 = 4;
/// Redirects followed without taking a seat before the client gives up (two servers
/// that each believe the other hosts the room would otherwise bounce it for ever).
pub const MAX_REDIRECTS: u32 = 8;

/// The client's join state machine. See the module docs for the calling loop.
#[derive(Debug)]
pub struct RoomClient {
    cfg: ClientConfig,
    key: [u8; ROOM_KEY_LEN],
    phase: Phase,
    seat: Option<Seat>,
    client_nonce: [u8; NONCE_LEN],
    nonce_counter: u64,
    /// `client_nonce` was drawn for a join no welcome has answered yet: every retry of
    /// that join carries it, even after a new hello, so the server tells a retry (same
    /// nonce) from this player restarted on the same port (another one).
    join_nonce: bool,
    attempt_at: u64,
    backoff: u64,
    last_heard: u64,
    lost_reported: bool,
    keepalive_ns: u64,
    timeout_ns: u64,
    next_keepalive: u64,
    expected: u32,
    reorder: BTreeMap<u32, RoomEvent>,
    transmit: VecDeque<Vec<u8>>,
    events: VecDeque<RoomEvent>,
    ignored: u64,
    /// When the last hello, join or rejoin, and keep-alive went out (for the round trip).
    asked_at: u64,
    keepalive_at: u64,
    server_rtt_ns: Option<u64>,
    /// Redirects followed since the last seat (one to a server that never answered does
    /// not count: a dead server's rooms stay in the directory until their leases end).
    redirects: u32,
    /// Whether anything came from the server since the caller last changed servers.
    heard_since_change: bool,
    /// The room is to be listed publicly ([`RoomClient::set_public`]), and whether the
    /// server it sits on said it is.
    public: bool,
    public_acked: bool,
    /// The media epoch of `key`, as far as this client knows.
    epoch: u32,
    /// Another member changed the password into this epoch, and this client has not
    /// taken the new one.
    behind: Option<u32>,
    rekey: Option<PendingRekey>,
    /// The control channel ([`ClientConfig::secure`]).
    channel: Option<SecureClient>,
    /// Control messages waiting for the channel to open.
    held: Vec<Vec<u8>>,
}

/// Control messages held while a handshake is under way; more are dropped (each is
/// retried by its own timer).
const HELD_MAX: usize = 32;

impl RoomClient {
    /// A client that says hello at `now_ns`.
    pub fn new(config: ClientConfig, now_ns: u64) -> Self {
        let key = config
            .room_key
            .unwrap_or_else(|| auth::room_key(&config.room, &config.password));
        let mut c = Self {
            backoff: config.retry_initial_ns,
            cfg: config,
            key,
            phase: Phase::Hello,
            seat: None,
            client_nonce: [0; NONCE_LEN],
            nonce_counter: 0,
            join_nonce: false,
            attempt_at: now_ns,
            last_heard: now_ns,
            lost_reported: false,
            keepalive_ns: 1_000_000_000,
            timeout_ns: 5_000_000_000,
            next_keepalive: u64::MAX,
            expected: 1,
            reorder: BTreeMap::new(),
            transmit: VecDeque::new(),
            events: VecDeque::new(),
            ignored: 0,
            asked_at: now_ns,
            keepalive_at: 0,
            server_rtt_ns: None,
            redirects: 0,
            heard_since_change: false,
            public: false,
            public_acked: false,
            epoch: 0,
            behind: None,
            rekey: None,
            channel: None,
            held: Vec::new(),
        };
        if c.cfg.secure {
            c.channel = Some(SecureClient::new(c.cfg.server_key));
        }
        c.hello(now_ns);
        c
    }

    /// The seat held: (member id, SSRC to send with).
    pub fn seat(&self) -> Option<(u32, u32)> {
        (self.phase == Phase::Joined)
            .then_some(self.seat.map(|s| (s.member_id, s.ssrc)))
            .flatten()
    }

    /// The round trip to the server: the latest of hello → challenge, join → welcome or
    /// keep-alive → echo, in nanoseconds (an answer to an earlier retry can make it short).
    pub fn server_rtt_ns(&self) -> Option<u64> {
        self.server_rtt_ns
    }

    fn rtt_sample(&mut self, now: u64, since: u64) {
        if since > 0 && now >= since {
            self.server_rtt_ns = Some(now - since);
        }
    }

    fn hosts_blob(&self) -> ([u8; MAX_ADDRS_LEN], usize) {
        let mut b = [0u8; MAX_ADDRS_LEN];
        let n = encode_addrs(&self.cfg.hosts, &mut b);
        (b, n)
    }

    /// Datagrams from the server this client could not use (malformed, other version,
    /// unexpected in its state).
    pub fn ignored(&self) -> u64 {
        self.ignored
    }

    /// A nonce never given before by this client: SHA-256 of the seed and a counter.
    fn next_nonce(&mut self) -> [u8; NONCE_LEN] {
        self.nonce_counter += 1;
        let mut h = Sha256::new();
        h.update(self.cfg.nonce_seed);
        h.update(self.nonce_counter.to_be_bytes());
        let d = h.finalize();
        let mut out = [0u8; NONCE_LEN];
        out.copy_from_slice(&d[..NONCE_LEN]);
        out
    }

    fn fresh_nonce(&mut self) {
        self.client_nonce = self.next_nonce();
    }

    fn send(&mut self, msg: &Control<'_>) {
        let mut buf = vec![0u8; MAX_CONTROL_LEN];
        if let Ok(n) = msg.encode(&mut buf) {
            buf.truncate(n);
            self.push(buf);
        }
    }

    /// Queues one control message: sealed when the channel is open, held until it is
    /// when a handshake is under way, as it is without a channel.
    fn push(&mut self, plain: Vec<u8>) {
        match self.channel.as_mut() {
            None => self.transmit.push_back(plain),
            Some(ch) if ch.is_open() => {
                let mut out = vec![0u8; MAX_WIRE_LEN];
                if let Ok(n) = ch.seal(&plain, &mut out) {
                    out.truncate(n);
                    self.transmit.push_back(out);
                }
            }
            Some(_) => {
                if self.held.len() < HELD_MAX {
                    self.held.push(plain);
                }
            }
        }
    }

    /// Starts a handshake with the server's `cookie` (after a challenge, or again when a
    /// join went unanswered before the channel opened): what was held for the last one
    /// is dropped, the caller queues its request again.
    fn start_channel(&mut self, cookie: &[u8; COOKIE_LEN]) {
        let Some(ch) = self.channel.as_mut() else { return };
        self.held.clear();
        let mut out = vec![0u8; MAX_WIRE_LEN];
        if let Ok(n) = ch.start(cookie, &mut out) {
            out.truncate(n);
            self.transmit.push_back(out);
        }
    }

    /// Sends a control message the caller built (a route list) the way this client sends
    /// its own: sealed in the channel when there is one.
    pub fn send_control(&mut self, bytes: &[u8]) {
        self.push(bytes.to_vec());
    }

    /// The key to expect from the server from now on (call before
    /// [`RoomClient::server_changed`] when going to another server): `None` takes the
    /// first one shown.
    pub fn set_server_key(&mut self, key: Option<[u8; KEY_LEN]>) {
        self.cfg.server_key = key;
        if self.cfg.secure {
            self.channel = Some(SecureClient::new(key));
            self.held.clear();
        }
    }

    /// The server's key, once the channel has been open (or as pinned).
    pub fn server_key(&self) -> Option<[u8; KEY_LEN]> {
        self.cfg.server_key
    }

    /// Whether control travels sealed just now.
    pub fn channel_open(&self) -> bool {
        self.channel.as_ref().is_some_and(SecureClient::is_open)
    }

    fn hello(&mut self, now: u64) {
        self.phase = Phase::Hello;
        self.asked_at = now;
        // Always in clear: the hello asks for the cookie a handshake needs.
        let mut buf = vec![0u8; MAX_CONTROL_LEN];
        if let Ok(n) = (Control::Hello { pad: HELLO_PAD }).encode(&mut buf) {
            buf.truncate(n);
            self.transmit.push_back(buf);
        }
        self.arm_retry(now);
    }

    fn arm_retry(&mut self, now: u64) {
        self.attempt_at = now + self.backoff;
        self.backoff = (self.backoff * 2).min(self.cfg.retry_max_ns);
    }

    fn reset_backoff(&mut self) {
        self.backoff = self.cfg.retry_initial_ns;
    }

    fn send_join(&mut self, cookie: &[u8; COOKIE_LEN], server_nonce: &[u8; NONCE_LEN], create: bool) {
        let auth = auth::join_authenticator(
            &self.key,
            server_nonce,
            &self.client_nonce,
            &self.cfg.room,
            &self.cfg.name,
        );
        let key = self.key;
        let (hosts, hn) = self.hosts_blob();
        let j = Join {
            cookie,
            room: &self.cfg.room,
            name: &self.cfg.name,
            client_nonce: &self.client_nonce,
            authenticator: &auth,
            ssrc: self.cfg.ssrc,
            packets_per_s: self.cfg.packets_per_s,
            bytes_per_s: self.cfg.bytes_per_s,
            create_key: if create { &key } else { &[] },
            key_agreement: &[],
            hosts: &hosts[..hn],
            sample_rate: self.cfg.sample_rate,
        };
        let mut buf = vec![0u8; MAX_CONTROL_LEN];
        if let Ok(n) = Control::Join(j).encode(&mut buf) {
            buf.truncate(n);
            self.push(buf);
        }
    }

    fn send_rejoin(&mut self, cookie: &[u8; COOKIE_LEN], server_nonce: &[u8; NONCE_LEN]) {
        let Some(seat) = self.seat else { return };
        let auth = auth::rejoin_authenticator(
            &self.key,
            server_nonce,
            &self.client_nonce,
            seat.member_id,
            &seat.token,
        );
        let nonce = self.client_nonce;
        let (hosts, hn) = self.hosts_blob();
        let r = Rejoin {
            cookie,
            member_id: seat.member_id,
            token: &seat.token,
            client_nonce: &nonce,
            authenticator: &auth,
            key_agreement: &[],
            hosts: &hosts[..hn],
        };
        self.send(&Control::Rejoin(r));
    }

    /// Takes one datagram that came from the server.
    pub fn handle_datagram(&mut self, now_ns: u64, bytes: &[u8]) {
        let Some(ch) = self.channel.as_mut() else {
            return self.handle_control(now_ns, bytes, true);
        };
        if secure::is_handshake(bytes) {
            return self.channel_answer(now_ns, bytes);
        }
        if !secure::is_sealed(bytes) {
            return self.handle_control(now_ns, bytes, false);
        }
        let mut plain = [0u8; MAX_WIRE_LEN];
        match ch.open(now_ns, bytes, &mut plain) {
            Ok(p) => {
                let n = p.len();
                self.handle_control(now_ns, &plain[..n], true);
            }
            Err(_) => self.ignored += 1,
        }
    }

    /// The server's answer to the handshake: the channel opens and what waited for it
    /// goes, sealed.
    fn channel_answer(&mut self, now: u64, bytes: &[u8]) {
        let Some(ch) = self.channel.as_mut() else { return };
        match ch.finish(now, bytes) {
            Ok(key) => {
                if self.cfg.server_key.is_none() {
                    self.cfg.server_key = Some(key);
                    self.events.push_back(RoomEvent::ServerKey { key });
                }
                self.last_heard = now;
                self.heard_since_change = true;
                for m in std::mem::take(&mut self.held) {
                    self.push(m);
                }
            }
            Err(SecureError::KeyChanged { pinned, offered }) => {
                self.phase = Phase::Refused;
                self.held.clear();
                self.events
                    .push_back(RoomEvent::ServerKeyChanged { pinned, offered });
            }
            // A late or repeated answer, or one altered on the way: the next retry
            // shakes hands again.
            Err(_) => self.ignored += 1,
        }
    }

    /// One control message: opened from the channel or without one (`trusted`), or as it
    /// came in clear, where only what a server sends before a channel exists is taken.
    fn handle_control(&mut self, now_ns: u64, bytes: &[u8], trusted: bool) {
        let Ok(msg) = Control::decode(bytes) else {
            self.ignored += 1;
            return;
        };
        // In clear, only what a server sends before a channel exists: its challenge, a
        // rebind hint, and a refusal of this protocol version.
        let clear_ok = match msg {
            Control::Challenge { .. } | Control::Rebind => true,
            Control::Refused { code, .. } => code == RefuseCode::BadVersion as i32,
            _ => false,
        };
        if !trusted && !clear_ok {
            self.ignored += 1;
            return;
        }
        self.last_heard = now_ns;
        self.lost_reported = false;
        self.heard_since_change = true;
        match (msg, self.phase) {
            (_, Phase::Refused | Phase::Left) => self.ignored += 1,
            (Control::Challenge { cookie, server_nonce }, Phase::Hello) => {
                self.rtt_sample(now_ns, self.asked_at);
                self.asked_at = now_ns;
                self.reset_backoff();
                self.start_channel(cookie);
                if self.seat.is_some() {
                    self.fresh_nonce();
                    self.send_rejoin(cookie, server_nonce);
                    self.phase = Phase::Rejoin {
                        cookie: *cookie,
                        server_nonce: *server_nonce,
                        attempts: 1,
                    };
                } else {
                    if !self.join_nonce {
                        self.fresh_nonce();
                        self.join_nonce = true;
                    }
                    self.send_join(cookie, server_nonce, false);
                    self.phase = Phase::Join {
                        cookie: *cookie,
                        server_nonce: *server_nonce,
                        create: false,
                        attempts: 1,
                    };
                }
                self.arm_retry(now_ns);
            }
            (Control::Welcome(w), Phase::Join { .. } | Phase::Rejoin { .. }) => {
                self.rtt_sample(now_ns, self.asked_at);
                let rejoined = self.seat.is_some_and(|s| s.member_id == w.member_id);
                if !rejoined {
                    self.expected = 1;
                    self.reorder.clear();
                }
                self.seat = Some(Seat {
                    member_id: w.member_id,
                    ssrc: w.ssrc,
                    token: *w.token,
                });
                self.phase = Phase::Joined;
                self.join_nonce = false;
                self.redirects = 0;
                // A fresh seat elsewhere (after a redirect) asks for the SSRC the stream
                // already sends with.
                self.cfg.ssrc = w.ssrc;
                self.reset_backoff();
                self.keepalive_ns = u64::from(w.keepalive_ms.clamp(50, 60_000)) * 1_000_000;
                self.timeout_ns = u64::from(w.timeout_ms.clamp(200, 600_000)) * 1_000_000;
                self.next_keepalive = now_ns + self.keepalive_ns;
                if self.public {
                    // A new seat (perhaps on another server): list the room there too.
                    self.public_acked = false;
                    self.send(&Control::Public);
                }
                self.events.push_back(RoomEvent::Joined {
                    member_id: w.member_id,
                    ssrc: w.ssrc,
                    rejoined,
                });
                if !rejoined && self.epoch != 0 {
                    // A fresh seat: the room was made anew (a server restarted, the room
                    // moved) with this client's key, in epoch 0; a later epoch comes in a
                    // `/netjam/epoch`.
                    self.epoch = 0;
                    self.behind = None;
                    self.events.push_back(RoomEvent::Epoch {
                        epoch: 0,
                        key: self.key,
                    });
                }
            }
            (
                Control::Refused { code, text },
                Phase::Join {
                    cookie,
                    server_nonce,
                    create,
                    ..
                },
            ) => match RefuseCode::from_i32(code) {
                Some(RefuseCode::NoSuchRoom) if !create => {
                    self.send_join(&cookie, &server_nonce, true);
                    self.phase = Phase::Join {
                        cookie,
                        server_nonce,
                        create: true,
                        attempts: 1,
                    };
                    self.reset_backoff();
                    self.arm_retry(now_ns);
                }
                Some(RefuseCode::BadCookie) => self.hello(now_ns),
                c => self.refused(c, text),
            },
            (
                Control::Refused { code, text },
                Phase::Rejoin {
                    cookie, server_nonce, ..
                },
            ) => {
                match RefuseCode::from_i32(code) {
                    Some(RefuseCode::UnknownMember) => {
                        // The seat is gone (timed out): join afresh with the same cookie.
                        self.seat = None;
                        self.send_join(&cookie, &server_nonce, false);
                        self.phase = Phase::Join {
                            cookie,
                            server_nonce,
                            create: false,
                            attempts: 1,
                        };
                        self.reset_backoff();
                        self.arm_retry(now_ns);
                    }
                    Some(RefuseCode::BadCookie) => self.hello(now_ns),
                    c => self.refused(c, text),
                }
            }
            // Seated: the room moved to another server (its claim there is newer); the seat
            // is asked for there, and taken afresh when that server does not know it.
            (Control::Redirect { room, server }, Phase::Joined)
                if fold_name(room) == fold_name(&self.cfg.room) =>
            {
                self.phase = Phase::Redirected;
                self.events.push_back(RoomEvent::Redirected {
                    server: server.to_owned(),
                });
            }
            (Control::Redirect { room, server }, Phase::Join { .. })
                if fold_name(room) == fold_name(&self.cfg.room) =>
            {
                self.redirects += 1;
                if self.redirects > MAX_REDIRECTS {
                    self.refused(None, "redirected too many times without a seat");
                } else {
                    self.phase = Phase::Redirected;
                    self.events.push_back(RoomEvent::Redirected {
                        server: server.to_owned(),
                    });
                }
            }
            (Control::Refused { code, .. }, Phase::Hello) if code == RefuseCode::BadVersion as i32 => {
                self.refused(Some(RefuseCode::BadVersion), RefuseCode::BadVersion.text());
            }
            (Control::Roster(r), _) if self.seat.is_some() => {
                let entry = RosterEntry {
                    seq: r.seq,
                    kind: r.kind,
                    member_id: r.member_id,
                    name: r.name.to_owned(),
                    ssrc: r.ssrc,
                };
                self.in_order(r.seq, RoomEvent::Roster(entry));
            }
            (Control::Peer(p), _) if self.seat.is_some() => {
                let entry = PeerEntry {
                    seq: p.seq,
                    member_id: p.member_id,
                    observed: decode_addrs(p.observed)[0],
                    hosts: decode_addrs(p.hosts),
                    token: *p.token,
                };
                self.in_order(p.seq, RoomEvent::Peer(entry));
            }
            (Control::Epoch { seq, epoch, by }, _) if self.seat.is_some() => {
                let event = if by == 0 {
                    // The room's epoch when this seat was given: the key that took the
                    // seat is the room's in it.
                    self.epoch = epoch;
                    self.behind = None;
                    RoomEvent::Epoch { epoch, key: self.key }
                } else {
                    self.behind = Some(epoch);
                    RoomEvent::PasswordChanged { epoch, by }
                };
                self.in_order(seq, event);
            }
            (Control::Rekeyed { epoch, status, mac }, Phase::Joined) => self.rekeyed(epoch, status, mac),
            (Control::Refused { code, text }, Phase::Joined) if code == RefuseCode::Replaced as i32 => {
                // This player's name joined again from this address: that one has the seat.
                self.seat = None;
                self.refused(Some(RefuseCode::Replaced), text);
            }
            (Control::Routed { seq }, Phase::Joined) => self.events.push_back(RoomEvent::Routed { seq }),
            (Control::Rebind, Phase::Joined) => self.hello(now_ns),
            (Control::Public, Phase::Joined) => self.public_acked = true,
            (Control::Keepalive, _) => {
                self.rtt_sample(now_ns, self.keepalive_at);
                self.keepalive_at = 0;
            }
            _ => self.ignored += 1,
        }
    }

    /// Hands on a reliable event (roster or peer) in the server's order, and acknowledges.
    fn in_order(&mut self, seq: u32, event: RoomEvent) {
        if seq == self.expected {
            self.events.push_back(event);
            self.expected = self.expected.wrapping_add(1);
            while let Some(e) = self.reorder.remove(&self.expected) {
                self.events.push_back(e);
                self.expected = self.expected.wrapping_add(1);
            }
        } else if seq > self.expected && seq - self.expected < REORDER_WINDOW {
            self.reorder.insert(seq, event);
        }
        let seq = self.expected.wrapping_sub(1);
        self.send(&Control::Ack { seq });
    }

    fn rekeyed(&mut self, epoch: u32, status: i32, mac: &[u8]) {
        let Some(p) = &self.rekey else {
            self.ignored += 1;
            return;
        };
        let status = RekeyStatus::from_i32(status);
        let proven = auth::ct_eq(&p.keys.answer_mac(epoch, status.map_or(-1, |s| s as i32)), mac);
        let event = match status {
            Some(RekeyStatus::Unproven) if mac.is_empty() => RoomEvent::RekeyRefused {
                status,
                reason: "the server no longer takes the password this player has: the room's password changed more than once since",
            },
            _ if !proven => {
                self.ignored += 1;
                return;
            }
            Some(RekeyStatus::Done) => {
                self.key = p.key;
                self.epoch = epoch;
                self.behind = None;
                RoomEvent::Epoch { epoch, key: p.key }
            }
            Some(RekeyStatus::NotTheNewPassword) => RoomEvent::RekeyRefused {
                status,
                reason: "that is not the room's new password",
            },
            Some(RekeyStatus::Stale) => {
                if epoch > self.epoch {
                    self.behind = Some(epoch);
                }
                RoomEvent::RekeyRefused {
                    status,
                    reason: "the room's password changed meanwhile: ask the band for the new one",
                }
            }
            _ => RoomEvent::RekeyRefused {
                status: None,
                reason: "the server answered in a way this version does not know",
            },
        };
        self.rekey = None;
        self.events.push_back(event);
    }

    fn send_rekey(&mut self, now: u64) {
        let (initial, max) = (self.cfg.retry_initial_ns, self.cfg.retry_max_ns);
        let Some(p) = &mut self.rekey else { return };
        let (wrapped, mac) = p.keys.wrap(p.epoch, &p.nonce, &p.key);
        let mut buf = vec![0u8; MAX_CONTROL_LEN];
        let n = Control::Rekey(Rekey {
            epoch: p.epoch,
            nonce: &p.nonce,
            wrapped: &wrapped,
            mac: &mac,
        })
        .encode(&mut buf);
        p.attempts += 1;
        p.at = now + initial.saturating_mul(1 << p.attempts.min(4)).min(max);
        if let Ok(n) = n {
            buf.truncate(n);
            self.push(buf);
        }
    }

    /// Gives the server the room key of a password (`key`, [`auth::room_key`] of the room
    /// and it) with the key this client has as proof: when another member changed the
    /// password and this client has not taken it ([`RoomEvent::PasswordChanged`]), it
    /// takes it if `key` is the new password's; otherwise it changes the room's password
    /// to `key`'s. Answered with [`RoomEvent::Epoch`] (seal in it from now on) or
    /// [`RoomEvent::RekeyRefused`]. The key crosses the network only encrypted.
    pub fn rekey(&mut self, now_ns: u64, key: [u8; ROOM_KEY_LEN]) {
        if self.phase != Phase::Joined {
            self.events.push_back(RoomEvent::RekeyRefused {
                status: None,
                reason: "this player holds no seat just now: try again once it does",
            });
            return;
        }
        let epoch = match self.behind {
            Some(e) if e != self.epoch => e,
            _ => self.epoch.wrapping_add(1),
        };
        let nonce = self.next_nonce();
        self.rekey = Some(PendingRekey {
            epoch,
            nonce,
            key,
            keys: auth::RekeyKeys::new(&self.key, &self.cfg.room, epoch, &nonce),
            attempts: 0,
            at: now_ns,
        });
        self.send_rekey(now_ns);
    }

    /// The media epoch of the key this client holds.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    fn refused(&mut self, code: Option<RefuseCode>, text: &str) {
        self.phase = Phase::Refused;
        self.events.push_back(RoomEvent::Refused {
            code,
            reason: text.chars().take(super::msg::MAX_REASON_LEN).collect(),
        });
    }

    /// Runs the timers due at `now_ns`: retries, keep-alives and loss of the server.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        match self.phase {
            Phase::Refused | Phase::Left | Phase::Redirected => {}
            Phase::Joined => {
                if self.rekey.as_ref().is_some_and(|p| now_ns >= p.at) {
                    if self.rekey.as_ref().is_some_and(|p| p.attempts >= REKEY_ATTEMPTS) {
                        self.rekey = None;
                        self.events.push_back(RoomEvent::RekeyRefused {
                            status: None,
                            reason: "the server did not answer the password change (a netjam server older than this player?)",
                        });
                    } else {
                        self.send_rekey(now_ns);
                    }
                }
                if now_ns >= self.last_heard.saturating_add(self.timeout_ns) {
                    // The server no longer answers: report it, then try to take the seat
                    // back (it may have restarted: the rejoin then falls back to a join).
                    self.events.push_back(RoomEvent::Lost);
                    self.lost_reported = true;
                    self.reset_backoff();
                    self.hello(now_ns);
                } else if now_ns >= self.next_keepalive {
                    if self.public && !self.public_acked {
                        self.send(&Control::Public);
                    }
                    self.send(&Control::Keepalive);
                    self.keepalive_at = now_ns;
                    self.next_keepalive = now_ns + self.keepalive_ns;
                }
            }
            Phase::Hello | Phase::Join { .. } | Phase::Rejoin { .. } => {
                if !self.lost_reported && now_ns >= self.last_heard.saturating_add(self.cfg.lost_after_ns) {
                    self.lost_reported = true;
                    self.events.push_back(RoomEvent::Lost);
                }
                if now_ns < self.attempt_at {
                    return;
                }
                match self.phase {
                    Phase::Join {
                        cookie,
                        server_nonce,
                        create,
                        attempts,
                    } if attempts < JOIN_ATTEMPTS => {
                        if !self.channel_open() {
                            self.start_channel(&cookie);
                        }
                        self.send_join(&cookie, &server_nonce, create);
                        self.asked_at = now_ns;
                        self.phase = Phase::Join {
                            cookie,
                            server_nonce,
                            create,
                            attempts: attempts + 1,
                        };
                        self.arm_retry(now_ns);
                    }
                    Phase::Rejoin {
                        cookie,
                        server_nonce,
                        attempts,
                    } if attempts < JOIN_ATTEMPTS => {
                        if !self.channel_open() {
                            self.start_channel(&cookie);
                        }
                        self.send_rejoin(&cookie, &server_nonce);
                        self.asked_at = now_ns;
                        self.phase = Phase::Rejoin {
                            cookie,
                            server_nonce,
                            attempts: attempts + 1,
                        };
                        self.arm_retry(now_ns);
                    }
                    _ => self.hello(now_ns),
                }
            }
        }
    }

    /// When [`RoomClient::handle_timeout`] must be called next (`None` once refused or left).
    pub fn poll_timeout(&self) -> Option<u64> {
        match self.phase {
            Phase::Refused | Phase::Left | Phase::Redirected => None,
            Phase::Joined => Some(
                self.next_keepalive
                    .min(self.last_heard.saturating_add(self.timeout_ns))
                    .min(self.rekey.as_ref().map_or(u64::MAX, |p| p.at)),
            ),
            _ => {
                let lost = if self.lost_reported {
                    u64::MAX
                } else {
                    self.last_heard.saturating_add(self.cfg.lost_after_ns)
                };
                Some(self.attempt_at.min(lost))
            }
        }
    }

    /// The next datagram to send to the server: written into `buf`, its length returned.
    /// A `buf` of [`MAX_WIRE_LEN`] bytes always suffices; a shorter one that cannot
    /// hold the datagram loses it.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<usize> {
        loop {
            let b = self.transmit.pop_front()?;
            if let Some(out) = buf.get_mut(..b.len()) {
                out.copy_from_slice(&b);
                return Some(b.len());
            }
        }
    }

    /// The next event, in the order they happened.
    pub fn poll_event(&mut self) -> Option<RoomEvent> {
        self.events.pop_front()
    }

    /// The local address changed (a new network, a NAT rebinding the caller noticed):
    /// say hello from the new address and take the seat back.
    pub fn address_changed(&mut self, now_ns: u64) {
        if matches!(
            self.phase,
            Phase::Joined | Phase::Rejoin { .. } | Phase::Join { .. } | Phase::Hello
        ) {
            self.reset_backoff();
            self.hello(now_ns);
        }
    }

    /// The caller sends to another server from now on: the one a
    /// [`RoomEvent::Redirected`] named, or back to the one it was first told to use. Says
    /// hello there; a seat held elsewhere is asked back with a rejoin (refused as unknown,
    /// it becomes a fresh join). Nothing happens once refused or left.
    pub fn server_changed(&mut self, now_ns: u64) {
        if matches!(self.phase, Phase::Refused | Phase::Left) {
            return;
        }
        if !self.heard_since_change && self.phase != Phase::Redirected {
            // Leaving a server that never answered: the redirect to it does not count.
            self.redirects = self.redirects.saturating_sub(1);
        }
        self.heard_since_change = false;
        self.last_heard = now_ns;
        self.lost_reported = false;
        self.reset_backoff();
        self.hello(now_ns);
    }

    /// Asks that the room be listed publicly (`netjam rooms`): sent now if seated, again
    /// with each keep-alive until the server confirms, and again on every new seat.
    pub fn set_public(&mut self) {
        self.public = true;
        if self.phase == Phase::Joined && !self.public_acked {
            self.send(&Control::Public);
        }
    }

    /// Whether the server confirmed that the room is listed publicly.
    pub fn is_public(&self) -> bool {
        self.public_acked
    }

    /// Leaves the room (one `/netjam/leave`; a lost one ends as a timeout at the server).
    pub fn leave(&mut self, _now_ns: u64) {
        if self.phase == Phase::Joined {
            self.send(&Control::Leave);
        }
        self.phase = Phase::Left;
    }

    /// Asks the server to tell the others this member's new name.
    pub fn rename(&mut self, name: &str) {
        self.cfg.name = name.to_owned();
        if self.phase == Phase::Joined {
            self.send(&Control::Rename { name });
        }
    }
}
