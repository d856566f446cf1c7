//! The I/O shell around `netjam-ensemble`'s [`Member`]: one UDP socket on the first free
//! port of the discovery list, a thread per socket that timestamps what arrives, and a
//! loop that feeds the member, sends what it asks and sleeps until its next timeout.
//! Optionally an OSC bridge: a plain OSC UDP port whose messages are routed to services
//! (bundles at their time tags), and to whose senders the messages this member's
//! services receive are forwarded. Optionally a WebSocket bridge doing the same for web
//! pages ([`crate::ws_bridge`]).
//!
//! Through a rooms server (`--server`: the room is the ensemble) the node takes a seat
//! without media in the room named after the ensemble (the room protocol's
//! [`RoomClient`]) and carries every ensemble datagram to the server in a `/netjam/ens`
//! envelope: hellos to the whole room, everything else to one member, which the member
//! core sees at a *relay address* ([`relay_addr`]: the member's room id in the IPv6
//! discard prefix `100::/64`, never a real destination). So discovery through the server
//! is one more source of hellos and addresses for the same core, not a second membership
//! protocol. The clock reference is the server itself ([`MemberConfig::clock_server`]):
//! it answers `/_clock/ping` with its own `CLOCK_MONOTONIC`.
//!
//! A player in a room whose ensemble is that same room (`jam --room R --ensemble`) takes
//! one seat, not two: the node rides on the player's seat ([`SharedSeat`]). It sends its
//! envelopes and clock pings from the player's socket, and the player's room thread hands
//! it what the server relays back (`/netjam/ens`, `/_clock/pong`) and says where the room's
//! server is now.
//!
//! Why relay rather than use the room's direct paths: ensemble traffic is a few datagrams
//! a second whose timing comes from the ensemble clock (a timed message is sent ahead of
//! its time), not from how fast it crosses; the server path works behind every router
//! (port-randomising NATs included) the moment the seat is taken, while a direct path
//! needs punching per pair, can die and come back, and would have to share the audio
//! socket; and the server as the one clock reference means each member measures only its
//! own path to it, which relaying does not lengthen.
//!
//! Local time is the machine's `CLOCK_MONOTONIC` in nanoseconds, shared by every process
//! on the machine (so a test can compare when members on one machine acted). This module
//! holds no protocol logic: membership, clock and delivery live in the library.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use netjam_engine::room::msg::{Control, ENS_EVERYONE, MAX_ENS_LEN};
use netjam_engine::room::{ClientConfig, RoomClient, RoomEvent};
use netjam_ensemble::auth::Secret;
use netjam_ensemble::clock::PONG_ADDRESS;
use netjam_ensemble::discovery::Discovery;
use netjam_ensemble::{Dest, Event, Member, MemberConfig};
use netjam_osc::{Packet, TimeTag};

/// The relay address of room member `member_id`: what the member core knows a member
/// reached through the rooms server by (IPv6 discard prefix `100::/64`, RFC 6666, port 0).
pub fn relay_addr(member_id: u32) -> SocketAddr {
    let ip = Ipv6Addr::new(0x100, 0, 0, 0, 0, 0, (member_id >> 16) as u16, member_id as u16);
    SocketAddr::V6(SocketAddrV6::new(ip, 0, 0, 0))
}

/// The room member id behind a relay address, if it is one.
pub fn relayed_member(a: &SocketAddr) -> Option<u32> {
    match a {
        SocketAddr::V6(v6) if v6.port() == 0 => {
            let s = v6.ip().segments();
            (s[..6] == [0x100, 0, 0, 0, 0, 0]).then(|| (u32::from(s[6]) << 16) | u32::from(s[7]))
        }
        _ => None,
    }
}

/// An ensemble reached through a rooms server: the room of that name is the ensemble.
#[derive(Debug, Clone)]
pub struct RoomReach {
    /// The server to join now (where the room is, when the caller knows it).
    pub server: SocketAddr,
    /// The servers the player named: where to ask again when the room's server goes silent
    /// (the front door redirects to wherever the room lives next; when the front door is
    /// the silent one, the next one named is asked). Often just `server` itself.
    pub front: FrontDoors,
    /// The room (the ensemble's name unless told otherwise).
    pub room: String,
    /// This member's name in the room.
    pub name: String,
    pub password: String,
    /// How long to wait for a seat before giving up.
    pub join_timeout_ns: u64,
    /// The player's own seat in this room, when there is one: the node rides on it and
    /// takes none of its own (`server`, `name` and `password` are then the player's).
    pub seat: Option<SharedSeat>,
}

/// A player's seat, shared with an ensemble node in the same room (see the module docs).
/// Made before the player's room thread starts; [`SharedSeat::inbox`] goes to that thread.
#[derive(Clone)]
pub struct SharedSeat {
    socket: Arc<UdpSocket>,
    server: Arc<Mutex<SocketAddr>>,
    inbox: Sender<Input>,
    outlet: Arc<Mutex<Option<Receiver<Input>>>>,
}

impl std::fmt::Debug for SharedSeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedSeat")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl SharedSeat {
    /// A seat on `socket` (the player's, a clone of it) in the room at `server`.
    pub fn new(socket: &UdpSocket, server: SocketAddr) -> anyhow::Result<Self> {
        let socket = socket
            .try_clone()
            .context("cannot share the player's socket with the ensemble")?;
        let (inbox, outlet) = channel();
        Ok(Self {
            socket: Arc::new(socket),
            server: Arc::new(Mutex::new(server)),
            inbox,
            outlet: Arc::new(Mutex::new(Some(outlet))),
        })
    }

    /// The room thread's end: what the server relays for the ensemble, and where it is.
    pub fn inbox(&self) -> SeatInbox {
        SeatInbox {
            inbox: self.inbox.clone(),
            server: self.server.clone(),
        }
    }

    fn server(&self) -> SocketAddr {
        *self.server.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The player's room thread's end of a [`SharedSeat`].
#[derive(Debug, Clone)]
pub struct SeatInbox {
    inbox: Sender<Input>,
    server: Arc<Mutex<SocketAddr>>,
}

impl SeatInbox {
    /// Whether a datagram from the room's server is the ensemble's: a relayed envelope or
    /// a clock answer.
    pub fn wants(bytes: &[u8]) -> bool {
        bytes.starts_with(PONG_ADDRESS.as_bytes()) || Control::is_ens(bytes)
    }

    /// Hands the node a datagram from the server at `from`, which arrived at `at_ns` on
    /// [`crate::clock::now_ns`]'s clock (the node keeps [`mono_ns`]'s).
    pub fn deliver(&self, at_ns: u64, from: SocketAddr, bytes: &[u8]) {
        let now = mono_ns().saturating_sub(crate::clock::now_ns().saturating_sub(at_ns));
        let _ = self.inbox.send(Input::Packet {
            now,
            from,
            bytes: bytes.to_vec(),
            bridge: false,
        });
    }

    /// The room's server is now `server` (a redirect, or a move after a silence).
    pub fn server_is(&self, server: SocketAddr) {
        *self.server.lock().unwrap_or_else(|e| e.into_inner()) = server;
    }
}

impl RoomLink {
    /// Whether the seat is taken (a shared seat always is: the player took it first).
    fn seated(&self) -> bool {
        self.client.as_ref().map_or(true, |c| c.seat().is_some())
    }

    /// On a shared seat, the room's server is wherever the player's room thread says.
    fn follow(&mut self) {
        if let Some(s) = &self.shared {
            self.server = s.server();
        }
    }
}

/// Ensemble datagrams held until the seat is taken (the server drops them before).
const HELD_BEFORE_SEAT: usize = 64;

/// The room side of a node.
#[derive(Debug)]
struct RoomLink {
    /// The node's own seat without media; `None` when it rides on the player's
    /// (`shared`).
    client: Option<RoomClient>,
    shared: Option<SharedSeat>,
    server: SocketAddr,
    /// See [`RoomReach::front`].
    front: FrontDoors,
    held: Vec<(Dest, Vec<u8>)>,
    buf: Vec<u8>,
    /// The servers' keys the player pinned (its own seat's control is sealed).
    known: KnownServers,
}
use crate::keys::KnownServers;
use crate::room_client::{switch_server, FrontDoors};
use crate::ws_bridge::{WsBridge, WsBridgeStats, WsInput};

/// The machine-wide monotonic clock, in nanoseconds (on Unix: CLOCK_MONOTONIC, so two
/// processes on one machine read the same time; elsewhere the process's own monotonic
/// clock, which serves the ensemble as well since members only exchange differences).
#[cfg(unix)]
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on the
    // Unix platforms netjam builds for, and clock_gettime writes only into `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return crate::clock::now_ns();
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// See the Unix version.
#[cfg(not(unix))]
pub fn mono_ns() -> u64 {
    crate::clock::now_ns()
}

/// A random member id (never 0).
pub fn random_id() -> anyhow::Result<u64> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("cannot draw a random member id: {e}"))?;
    Ok(u64::from_le_bytes(b).max(1))
}

/// How a node joins.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub ensemble: String,
    pub id: u64,
    pub services: Vec<String>,
    /// (tappee, tapper) pairs.
    pub taps: Vec<(String, String)>,
    pub discovery: Discovery,
    /// Address the member socket binds (0.0.0.0 on a LAN, 127.0.0.1 for this machine).
    pub bind_ip: IpAddr,
    pub osc_bridge: Option<SocketAddr>,
    /// Through a rooms server instead of discovery on the local network.
    pub room: Option<RoomReach>,
}

enum Input {
    Packet {
        now: u64,
        from: SocketAddr,
        bytes: Vec<u8>,
        bridge: bool,
    },
    Ws(WsInput),
}

/// A running member with its sockets.
#[derive(Debug)]
pub struct Node {
    member: Member,
    socket: UdpSocket,
    local: SocketAddr,
    bridge: Option<(UdpSocket, SocketAddr)>,
    bridge_clients: Vec<SocketAddr>,
    targets: Vec<SocketAddr>,
    rx: Receiver<Input>,
    room: Option<RoomLink>,
    /// Why the rooms server refused the seat, until taken.
    refused: Option<String>,
    /// The room client held a seat at least once (its losses are said from then on).
    seated_once: bool,
    /// For bridges opened after the start.
    tx: Sender<Input>,
    ws: Option<WsBridge>,
    /// Datagrams that could not be sent (counted; the protocol recovers).
    pub send_errors: u64,
}

impl std::fmt::Debug for Input {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Input")
    }
}

fn spawn_receiver(socket: &UdpSocket, bridge: bool, tx: Sender<Input>) -> anyhow::Result<()> {
    let s = socket.try_clone().context("cannot clone the ensemble socket")?;
    std::thread::Builder::new()
        .name(if bridge { "ens-bridge" } else { "ens-recv" }.into())
        .spawn(move || {
            let mut buf = vec![0u8; 65_536];
            loop {
                match s.recv_from(&mut buf) {
                    Ok((n, from)) => {
                        let input = Input::Packet {
                            now: mono_ns(),
                            from,
                            bytes: buf[..n].to_vec(),
                            bridge,
                        };
                        if tx.send(input).is_err() {
                            return;
                        }
                    }
                    // ICMP errors from a closed discovery port surface here on Linux.
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        })
        .context("cannot start the ensemble receive thread")?;
    Ok(())
}

impl Node {
    /// Binds the first free discovery port, offers the services and starts listening.
    pub fn start(cfg: NodeConfig) -> anyhow::Result<Node> {
        Self::start_with(cfg, None)
    }

    /// [`Node::start`] for an ensemble with a shared secret: every datagram is sealed,
    /// and members without the secret are ignored (see `netjam_ensemble::auth`).
    pub fn start_with(cfg: NodeConfig, secret: Option<Secret>) -> anyhow::Result<Node> {
        if let Some(r) = cfg.room.clone() {
            if let Some(seat) = r.seat.clone() {
                return Self::start_on_seat(cfg, seat, secret);
            }
            return Self::start_in_room(cfg, r, secret);
        }
        let mut bound = None;
        for port in cfg.discovery.port_list() {
            if let Ok(s) = UdpSocket::bind(SocketAddr::new(cfg.bind_ip, port)) {
                bound = Some(s);
                break;
            }
        }
        let Some(socket) = bound else {
            bail!(
                "every ensemble discovery port ({}–{}) on {} is taken: stop a member on this machine, or use --discovery-port to pick another list",
                cfg.discovery.base_port,
                cfg.discovery.base_port as u32 + cfg.discovery.ports as u32 - 1,
                cfg.bind_ip
            );
        };
        if cfg.discovery.broadcast {
            socket.set_broadcast(true).context(
                "cannot enable broadcast on the ensemble socket (use --local to stay on this machine)",
            )?;
        }
        let targets = cfg.discovery.targets();
        Self::start_on(cfg, socket, targets, None, secret)
    }

    /// Rides on the player's seat (see the module docs): no seat of its own, no receive
    /// thread of its own; the player's room thread hands over what is the ensemble's.
    fn start_on_seat(cfg: NodeConfig, seat: SharedSeat, secret: Option<Secret>) -> anyhow::Result<Node> {
        let outlet = seat
            .outlet
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .context("the player's seat carries one ensemble member only")?;
        let socket = seat
            .socket
            .try_clone()
            .context("cannot share the player's socket with the ensemble")?;
        let server = seat.server();
        let inbox = seat.inbox.clone();
        let link = RoomLink {
            client: None,
            shared: Some(seat),
            server,
            front: FrontDoors::new(server, &[]),
            held: Vec::new(),
            buf: vec![0u8; MAX_ENS_LEN],
            known: KnownServers::from_env(),
        };
        let mut cfg = cfg;
        cfg.room = None;
        Self::start_on_channel(
            cfg,
            socket,
            Vec::new(),
            Some((link, server)),
            secret,
            Some((inbox, outlet)),
        )
    }

    /// Takes a seat without media in the room, then runs as on a LAN with every datagram
    /// through the server (see the module docs).
    fn start_in_room(cfg: NodeConfig, r: RoomReach, secret: Option<Secret>) -> anyhow::Result<Node> {
        let bind = crate::lifecycle::any_for(r.server);
        let socket = UdpSocket::bind(bind).with_context(|| format!("cannot open a UDP socket on {bind}"))?;
        let mut rc = ClientConfig::new(&r.room, &r.name, &r.password, 0);
        // A seat without media: the server relays ensemble datagrams only.
        rc.packets_per_s = 0;
        rc.bytes_per_s = 0;
        let mut seed = [0u8; 16];
        getrandom::fill(&mut seed).map_err(|e| anyhow::anyhow!("cannot draw a random nonce seed: {e}"))?;
        rc.nonce_seed = seed;
        let known = KnownServers::from_env();
        rc.secure = true;
        rc.server_key = known.get(r.server);
        let link = RoomLink {
            client: Some(RoomClient::new(rc, mono_ns())),
            shared: None,
            server: r.server,
            front: r.front,
            held: Vec::new(),
            buf: vec![0u8; MAX_ENS_LEN],
            known,
        };
        let mut cfg = cfg;
        cfg.room = None;
        let server = r.server;
        let mut node = Self::start_on(cfg, socket, Vec::new(), Some((link, server)), secret)?;
        // Wait for the seat, so a refusal or an unreachable server is said at once. A server
        // silent for a while before the seat is left, as the player's join leaves it: for the
        // front door after a redirect, for the next front door named when the front door is.
        let give_up = mono_ns() + r.join_timeout_ns;
        let patience = crate::room_client::REDIRECT_PATIENCE.as_nanos() as u64;
        let mut asking = (r.server, mono_ns());
        while node.room.as_ref().is_some_and(|l| !l.seated()) {
            if let Some(link) = node.room.as_mut() {
                let now = mono_ns();
                if link.server != asking.0 {
                    asking = (link.server, now);
                } else if now.saturating_sub(asking.1) >= patience
                    && (link.server != link.front.current() || link.front.several())
                {
                    let silent = link.server;
                    link.server = if silent == link.front.current() {
                        link.front.advance()
                    } else {
                        link.front.current()
                    };
                    eprintln!(
                        "netjam: ensemble: no answer from the rooms server at {silent}: asking {}",
                        link.server
                    );
                    if let Some(c) = link.client.as_mut() {
                        switch_server(c, link.server, &link.known, now);
                    }
                    asking = (link.server, now);
                }
            }
            if mono_ns() >= give_up {
                bail!(
                    "the rooms server at {} did not give a seat in room {:?} within {:.1} s: is `netjam server` running there, and UDP to it open?",
                    r.server,
                    r.room,
                    r.join_timeout_ns as f64 / 1e9
                );
            }
            node.step(Some(give_up.min(mono_ns() + 20_000_000)));
            if let Some(reason) = node.refused.take() {
                bail!(
                    "the rooms server at {} refused a seat in room {:?}: {reason}",
                    r.server,
                    r.room
                );
            }
        }
        Ok(node)
    }

    fn start_on(
        cfg: NodeConfig,
        socket: UdpSocket,
        targets: Vec<SocketAddr>,
        room: Option<(RoomLink, SocketAddr)>,
        secret: Option<Secret>,
    ) -> anyhow::Result<Node> {
        Self::start_on_channel(cfg, socket, targets, room, secret, None)
    }

    /// [`Node::start_on`] with the inputs' channel given (a shared seat: someone else
    /// receives on the socket), or made here with a receive thread on the socket.
    fn start_on_channel(
        cfg: NodeConfig,
        socket: UdpSocket,
        targets: Vec<SocketAddr>,
        room: Option<(RoomLink, SocketAddr)>,
        secret: Option<Secret>,
        inputs: Option<(Sender<Input>, Receiver<Input>)>,
    ) -> anyhow::Result<Node> {
        let local = socket.local_addr().context("ensemble socket address")?;
        let (tx, rx) = match inputs {
            Some(io) => io,
            None => {
                let (tx, rx) = channel();
                spawn_receiver(&socket, false, tx.clone())?;
                (tx, rx)
            }
        };
        let bridge = match cfg.osc_bridge {
            Some(addr) => {
                let b = UdpSocket::bind(addr)
                    .with_context(|| format!("cannot open the OSC bridge on {addr}: is the port free?"))?;
                let at = b.local_addr().context("OSC bridge address")?;
                spawn_receiver(&b, true, tx.clone())?;
                Some((b, at))
            }
            None => None,
        };
        let now = mono_ns();
        let mut mc = MemberConfig::new(&cfg.ensemble, cfg.id);
        mc.clock_server = room.as_ref().map(|(_, server)| *server);
        mc.secret = secret;
        let mut member = Member::new(mc, now);
        for s in &cfg.services {
            member
                .offer(s)
                .with_context(|| format!("cannot offer service {s:?}"))?;
        }
        for (a, b) in &cfg.taps {
            member
                .tap(a, b)
                .with_context(|| format!("cannot tap {a:?} into {b:?}"))?;
        }
        let mut node = Node {
            member,
            socket,
            local,
            bridge,
            bridge_clients: Vec::new(),
            targets,
            rx,
            room: room.map(|(l, _)| l),
            refused: None,
            seated_once: false,
            tx,
            ws: None,
            send_errors: 0,
        };
        node.member.handle_timeout(now);
        node.flush();
        Ok(node)
    }

    pub fn member(&mut self) -> &mut Member {
        &mut self.member
    }

    pub fn member_ref(&self) -> &Member {
        &self.member
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn bridge_addr(&self) -> Option<SocketAddr> {
        self.bridge.as_ref().map(|b| b.1)
    }

    /// Opens the WebSocket bridge on `addr` (see [`crate::ws_bridge`]), letting in
    /// browsers' pages from `origins` only (empty: any); returns the address it listens on.
    pub fn start_ws_bridge(&mut self, addr: SocketAddr, origins: Vec<String>) -> anyhow::Result<SocketAddr> {
        let ws = WsBridge::start(addr, origins, self.tx.clone(), Input::Ws)?;
        let at = ws.local_addr();
        self.ws = Some(ws);
        Ok(at)
    }

    /// The WebSocket bridge's counters, when it is open.
    pub fn ws_stats(&self) -> Option<WsBridgeStats> {
        self.ws.as_ref().map(WsBridge::stats)
    }

    /// Sends everything the member (and, in a room, the room client) has to send.
    pub fn flush(&mut self) {
        if let Some(link) = self.room.as_mut() {
            link.follow();
            while let Some(n) = link.client.as_mut().and_then(|c| c.poll_transmit(&mut link.buf)) {
                if self.socket.send_to(&link.buf[..n], link.server).is_err() {
                    self.send_errors += 1;
                }
            }
            if link.seated() {
                for (to, bytes) in std::mem::take(&mut link.held) {
                    if !Self::through_server(&self.socket, link, to, &bytes) {
                        self.send_errors += 1;
                    }
                }
            }
        }
        while let Some(t) = self.member.poll_transmit() {
            if let Some(link) = self.room.as_mut() {
                if !link.seated() {
                    if link.held.len() < HELD_BEFORE_SEAT {
                        link.held.push((t.to, t.bytes));
                    }
                } else if !Self::through_server(&self.socket, link, t.to, &t.bytes) {
                    self.send_errors += 1;
                }
                continue;
            }
            match t.to {
                Dest::Peer(a) => {
                    if self.socket.send_to(&t.bytes, a).is_err() {
                        self.send_errors += 1;
                    }
                }
                Dest::Discovery => {
                    for a in &self.targets {
                        if *a != self.local && self.socket.send_to(&t.bytes, a).is_err() {
                            self.send_errors += 1;
                        }
                    }
                }
            }
        }
    }

    /// One of the member's datagrams in a room: to every ensemble member of the room or to
    /// one (both in a `/netjam/ens`), or a clock probe straight to the server.
    fn through_server(socket: &UdpSocket, link: &mut RoomLink, to: Dest, bytes: &[u8]) -> bool {
        match to {
            Dest::Discovery => Self::envelope(socket, link, ENS_EVERYONE, bytes),
            Dest::Peer(a) => match relayed_member(&a) {
                Some(id) => Self::envelope(socket, link, id, bytes),
                None => socket.send_to(bytes, a).is_ok(),
            },
        }
    }

    /// One ensemble datagram to the server in a `/netjam/ens` for member `to`.
    fn envelope(socket: &UdpSocket, link: &mut RoomLink, to: u32, bytes: &[u8]) -> bool {
        let env = Control::Ens {
            member_id: to,
            payload: bytes,
        };
        match env.encode(&mut link.buf) {
            Ok(n) => socket.send_to(&link.buf[..n], link.server).is_ok(),
            Err(_) => false,
        }
    }

    /// A datagram from the rooms server: an ensemble datagram relayed from a member, a
    /// clock answer, or the room protocol's.
    fn server_datagram(&mut self, now: u64, from: SocketAddr, bytes: &[u8]) {
        if bytes.starts_with(PONG_ADDRESS.as_bytes()) {
            self.member.handle(now, from, bytes);
            return;
        }
        if let Ok(Control::Ens { member_id, payload }) = Control::decode(bytes) {
            self.member.handle(now, relay_addr(member_id), payload);
            return;
        }
        if let Some(c) = self.room.as_mut().and_then(|l| l.client.as_mut()) {
            c.handle_datagram(now, bytes);
        }
    }

    /// Room events: a refusal is kept for the caller; a redirect is followed at once; a
    /// room's server that goes silent is left for the one the player named, which knows
    /// (or decides) where the room lives now, and a silent front door for the next one
    /// named, as the player's own seat does.
    fn room_events(&mut self) {
        let Some(link) = self.room.as_mut() else { return };
        // A shared seat's events are the player's room thread's.
        let Some(client) = link.client.as_mut() else {
            return;
        };
        while let Some(ev) = client.poll_event() {
            match ev {
                RoomEvent::Refused { reason, .. } => self.refused = Some(reason),
                RoomEvent::Redirected { server } => {
                    match crate::room_client::resolve_redirect(&server, link.front.current()) {
                        Ok(to) => {
                            tracing::info!("ensemble: the room is on {to}; joining there");
                            link.server = to;
                            switch_server(client, to, &link.known, mono_ns());
                        }
                        Err(e) => tracing::warn!("ensemble: {e:#}"),
                    }
                }
                RoomEvent::Lost => {
                    // Before the first seat, the caller says it (with what to do) when it
                    // gives up.
                    if self.seated_once {
                        tracing::warn!("the rooms server at {} stopped answering", link.server);
                    }
                    if link.server != link.front.current() {
                        link.server = link.front.current();
                        switch_server(client, link.server, &link.known, mono_ns());
                    } else if link.front.several() {
                        link.server = link.front.advance();
                        switch_server(client, link.server, &link.known, mono_ns());
                    }
                }
                RoomEvent::Joined { .. } => self.seated_once = true,
                e @ (RoomEvent::ServerKey { .. } | RoomEvent::ServerKeyChanged { .. }) => {
                    if let Err(msg) = crate::room_client::server_key_event(&e, link.server, &link.known) {
                        self.refused = Some(msg);
                    }
                }
                _ => {}
            }
        }
    }

    /// When the node must next act (local time).
    fn wake_at(&self) -> u64 {
        let room = self
            .room
            .as_ref()
            .and_then(|l| l.client.as_ref())
            .and_then(RoomClient::poll_timeout)
            .unwrap_or(u64::MAX);
        self.member.poll_timeout().min(room)
    }

    /// Waits for one input (or the next timer, or `deadline`) and handles it.
    fn step(&mut self, deadline: Option<u64>) {
        let now = mono_ns();
        let wake = self.wake_at().min(deadline.unwrap_or(u64::MAX));
        let wait = wake.saturating_sub(now);
        if let Ok(Input::Packet { now, from, bytes, .. }) = self.rx.recv_timeout(Duration::from_nanos(wait)) {
            if let Some(l) = self.room.as_mut() {
                l.follow();
            }
            if self.room.as_ref().is_some_and(|l| l.server == from) {
                self.server_datagram(now, from, &bytes);
            }
        }
        self.timers(mono_ns());
        self.room_events();
        self.flush();
    }

    /// Runs the member's and the room client's timers that are due.
    fn timers(&mut self, now: u64) {
        if let Some(c) = self.room.as_mut().and_then(|l| l.client.as_mut()) {
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
        }
        if self.member.poll_timeout() <= now {
            self.member.handle_timeout(now);
        }
    }

    /// Runs until local time `deadline` (or for ever), handing each event to `on_event`;
    /// stops early when `on_event` returns `false`.
    pub fn run(&mut self, deadline: Option<u64>, mut on_event: impl FnMut(&mut Node, Event) -> bool) {
        loop {
            let now = mono_ns();
            if deadline.is_some_and(|d| now >= d) {
                return;
            }
            let wake = self.wake_at().min(deadline.unwrap_or(u64::MAX));
            // Sleep on the channel; spin the last 200 µs so timed messages fire on time.
            let wait = wake.saturating_sub(now);
            let mut input = None;
            if wait > 200_000 {
                match self.rx.recv_timeout(Duration::from_nanos(wait - 200_000)) {
                    Ok(i) => input = Some(i),
                    Err(RecvTimeoutError::Timeout) => {}
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            } else {
                while input.is_none() && mono_ns() < wake {
                    input = self.rx.try_recv().ok();
                    std::hint::spin_loop();
                }
            }
            match input {
                Some(Input::Packet {
                    now,
                    from,
                    bytes,
                    bridge: false,
                }) => {
                    if let Some(l) = self.room.as_mut() {
                        l.follow();
                    }
                    if self.room.as_ref().is_some_and(|l| l.server == from) {
                        self.server_datagram(now, from, &bytes);
                    } else if self.room.is_none() {
                        self.member.handle(now, from, &bytes);
                    }
                }
                Some(Input::Packet {
                    from,
                    bytes,
                    bridge: true,
                    ..
                }) => self.bridge_in(from, &bytes),
                Some(Input::Ws(i)) => {
                    let frame = self.ws.as_mut().and_then(|w| w.input(i));
                    if let Some((client, bytes)) = frame {
                        self.route_osc(&format_args!("web page {client}"), &bytes);
                        if let Some(w) = &self.ws {
                            w.taken();
                        }
                    }
                }
                None => {}
            }
            self.timers(mono_ns());
            self.room_events();
            self.flush();
            while let Some(ev) = self.member.poll_event() {
                if let Event::Message(d) = &ev {
                    self.bridge_out(&d.bytes);
                }
                if !on_event(self, ev) {
                    self.flush();
                    return;
                }
            }
            self.flush();
        }
    }

    /// A plain OSC packet arrived on the bridge: route each message to its service.
    fn bridge_in(&mut self, from: SocketAddr, bytes: &[u8]) {
        if !self.bridge_clients.contains(&from) {
            if self.bridge_clients.len() >= 16 {
                self.bridge_clients.remove(0);
            }
            self.bridge_clients.push(from);
        }
        self.route_osc(&from, bytes);
    }

    /// One OSC packet from a bridge: each message to its service, a bundle's at its time.
    fn route_osc(&mut self, from: &dyn std::fmt::Display, bytes: &[u8]) {
        let Ok(p) = Packet::decode(bytes) else {
            tracing::warn!("bridge: a malformed packet from {from} was dropped");
            return;
        };
        let now = mono_ns();
        let ens = self.member.ensemble_time(now);
        let mut out = Vec::new();
        p.for_each_message(|t, m| out.push((t, m.as_bytes().to_vec())));
        for (tag, m) in out {
            let time = match (tag, ens) {
                (t, Some(e)) if !t.is_immediate() && t != TimeTag(0) => {
                    // A time tag is wall time: the same distance ahead in ensemble time.
                    let wall_now = SystemTime::now();
                    let ahead = t.to_system_time().duration_since(wall_now).unwrap_or_default();
                    e + ahead.as_nanos() as u64
                }
                _ => 0,
            };
            if let Err(e) = self.member.send(now, &m, time, true) {
                tracing::warn!("bridge: message from {from} not routed: {e}");
            }
        }
    }

    fn bridge_out(&mut self, bytes: &[u8]) {
        if let Some((b, _)) = &self.bridge {
            for c in &self.bridge_clients {
                let _ = b.send_to(bytes, c);
            }
        }
        if let Some(w) = &mut self.ws {
            w.broadcast(bytes);
        }
    }

    /// Says bye and sends it (and gives up the seat in a room).
    pub fn leave(&mut self) {
        self.member.leave();
        self.flush();
        // A shared seat is the player's to give up.
        if let Some(c) = self.room.as_mut().and_then(|l| l.client.as_mut()) {
            c.leave(mono_ns());
        }
        self.flush();
    }

    /// Whether this node reaches its ensemble through a rooms server.
    pub fn in_room(&self) -> bool {
        self.room.is_some()
    }

    /// The services of `services` no member offers yet.
    pub fn missing<'a>(&self, services: &'a [String]) -> Vec<&'a String> {
        services
            .iter()
            .filter(|s| self.member.table().provider(s).is_none())
            .collect()
    }

    /// Whether this member keeps the ensemble's time: it is the clock reference, or its
    /// clock has locked to the reference's.
    pub fn synced(&self) -> bool {
        let m = &self.member;
        match (m.reference(), m.clock_stats()) {
            (Some(r), _) if r == m.id() => true,
            (Some(_), Some(st)) => st.locked,
            _ => false,
        }
    }

    /// Runs until this member keeps the ensemble's time or local time `until`; says
    /// whether it does.
    pub fn run_until_synced(&mut self, until: u64) -> bool {
        while !self.synced() && mono_ns() < until {
            self.run(Some((mono_ns() + SLICE_NS).min(until)), |_, _| true);
        }
        self.synced()
    }

    /// Sends what is queued and runs until every reliable message is acknowledged or
    /// local time `until`, then leaves; otherwise gives up without leaving and says how
    /// many were not acknowledged.
    pub fn leave_when_acknowledged(mut self, until: u64) -> Result<(), usize> {
        self.flush();
        while self.member.unacked() > 0 && mono_ns() < until {
            self.run(Some((mono_ns() + SLICE_NS).min(until)), |_, _| true);
        }
        match self.member.unacked() {
            0 => {
                self.leave();
                Ok(())
            }
            left => Err(left),
        }
    }
}

/// How long [`Node::run_until_synced`] and [`Node::leave_when_acknowledged`] run between
/// looks at what they wait for.
const SLICE_NS: u64 = 10_000_000;

/// The address to bind for a member: this machine only, or every interface.
pub fn bind_ip(local_only: bool) -> IpAddr {
    if local_only {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    }
}

pub mod beat_delay;
pub mod click;

/// The shared beat in a jam: the ensemble member runs on a thread of its own, and
/// [`BeatClicks`](beat::BeatClicks) mixes a click on the ensemble's beat into what the player hears (and,
/// with `--delay-to-beat`, delays what is heard to the beat: [`beat_delay`]).
pub mod beat {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::thread::JoinHandle;

    use anyhow::Context;
    use netjam_ensemble::beat::{ClickTrack, TempoReader};
    use netjam_ensemble::clock::ClockReader;
    use netjam_ensemble::publish::{self, Publisher, Reader};
    use netjam_ensemble::Event;
    use netjam_osc::{Arg, Message};

    use super::beat_delay::{DelayLine, StreamMark, Streams};
    use super::{mono_ns, Node, NodeConfig};
    use crate::endpoint::Process;

    const MS: u64 = 1_000_000;
    /// Beats in a bar of the click (its first is accented).
    pub const BEATS_PER_BAR: u32 = 4;

    /// What the audio thread tells the member's thread (all atomics).
    #[derive(Debug, Default)]
    pub struct BeatShared {
        /// CLOCK_MONOTONIC (ns) of the first frame of what is heard, plus one; 0 until
        /// the first period.
        pub first_frame_mono: AtomicU64,
        /// Clicks played.
        pub clicks: AtomicU64,
        /// Frames between a period leaving netjam and it sounding (the device's output
        /// latency, as its endpoint reports it; 0 for files): the click is rendered this
        /// much earlier, so it *sounds* on the beat.
        pub output_latency_frames: AtomicU64,
        /// Frames between a sound reaching the device and the period that holds it (the
        /// device's input latency; 0 for files): where the stream sent stands in
        /// ensemble time counts from when it was played.
        pub input_latency_frames: AtomicU64,
        /// `--delay-to-beat`: beats to hear the other players late by (0: off).
        pub delay_beats: AtomicU64,
        /// Where the delayed stream stands ([`DelayState::to_word`](super::beat_delay::DelayState::to_word))
        /// and the delay wanted, ns.
        pub delay_state: AtomicU64,
        pub delay_want_ns: AtomicU64,
        /// The SSRC of the stream heard, plus one (0: none).
        pub heard_ssrc: AtomicU64,
    }

    /// Wraps the jam's process (transparently: it dereferences to it) and adds a click
    /// on every beat of the ensemble to what is heard, at the frame the beat falls on.
    /// The period's start in ensemble time comes from the period's timestamp through the
    /// ensemble clock, plus the output latency ([`BeatShared::output_latency_frames`]):
    /// what is rendered now sounds that much later. Never allocates, locks or blocks in [`Process::process`].
    pub struct BeatClicks<P> {
        inner: P,
        beat: Option<Beat>,
    }

    /// What the clicks need; absent without an ensemble.
    struct Beat {
        clicks: ClickTrack,
        clock: ClockReader,
        tempo: TempoReader,
        /// CLOCK_MONOTONIC minus the process clock the endpoint stamps periods with.
        mono_offset: i64,
        channels: usize,
        rate: u32,
        shared: Arc<BeatShared>,
        /// Where this player's stream stands in ensemble time (to the ensemble thread),
        /// and where the stream heard stands (from it).
        sent: Publisher<StreamMark>,
        heard: Reader<StreamMark>,
        /// With `--delay-to-beat`.
        delay: Option<DelayLine>,
    }

    impl<P> std::fmt::Debug for BeatClicks<P> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("BeatClicks").finish_non_exhaustive()
        }
    }

    impl<P> BeatClicks<P> {
        /// Clicks at `rate` Hz on `channels` interleaved channels, `gain_db` below full
        /// scale, on `beat`'s ensemble (none without one: the process is left as it is).
        /// With `delay_max_ns`, reserves a delay line that long for `--delay-to-beat`.
        pub fn new(
            inner: P,
            beat: Option<&mut JamBeat>,
            rate: u32,
            channels: usize,
            gain_db: f32,
            delay_max_ns: Option<u64>,
        ) -> Self {
            match beat {
                Some(b) => {
                    let p = Self::with_readers(
                        inner,
                        b.clock.clone(),
                        b.tempo.clone(),
                        Arc::clone(&b.shared),
                        rate,
                        channels,
                        gain_db,
                    );
                    match b.marks.take() {
                        Some((sent, heard)) => p.with_marks(sent, heard, delay_max_ns),
                        None => p,
                    }
                }
                None => Self { inner, beat: None },
            }
        }

        /// As [`BeatClicks::new`], from the ensemble's readers themselves.
        pub fn with_readers(
            inner: P,
            clock: ClockReader,
            tempo: TempoReader,
            shared: Arc<BeatShared>,
            rate: u32,
            channels: usize,
            gain_db: f32,
        ) -> Self {
            let level = netjam_engine::mixer::db_to_gain(gain_db);
            let beat = Some(Beat {
                clicks: ClickTrack::new(rate, level, BEATS_PER_BAR),
                clock,
                tempo,
                mono_offset: mono_ns() as i64 - crate::clock::now_ns() as i64,
                channels: channels.max(1),
                rate: rate.max(1),
                shared,
                sent: publish::share().0,
                heard: publish::share().1,
                delay: None,
            });
            Self { inner, beat }
        }

        /// Publish where the stream sent stands through `sent`, read where the stream
        /// heard stands from `heard`, and with `delay_max_ns` reserve a delay line that
        /// long for `--delay-to-beat` ([`BeatShared::delay_beats`] turns it on).
        pub fn with_marks(
            mut self,
            sent: Publisher<StreamMark>,
            heard: Reader<StreamMark>,
            delay_max_ns: Option<u64>,
        ) -> Self {
            if let Some(b) = self.beat.as_mut() {
                b.sent = sent;
                b.heard = heard;
                b.delay = delay_max_ns.map(|max| DelayLine::new(b.rate, b.channels, max));
            }
            self
        }

        /// The wrapped process.
        pub fn into_process(self) -> P {
            self.inner
        }
    }

    impl<P> std::ops::Deref for BeatClicks<P> {
        type Target = P;
        fn deref(&self) -> &P {
            &self.inner
        }
    }

    impl<P> std::ops::DerefMut for BeatClicks<P> {
        fn deref_mut(&mut self) -> &mut P {
            &mut self.inner
        }
    }

    impl<P: Process + Streams> Process for BeatClicks<P> {
        fn process(&mut self, now_ns: u64, input: &[f32], output: &mut [f32]) {
            self.inner.process(now_ns, input, output);
            let Some(b) = self.beat.as_mut() else {
                return;
            };
            let mono = (now_ns as i64 + b.mono_offset).max(0) as u64;
            let _ =
                b.shared
                    .first_frame_mono
                    .compare_exchange(0, mono + 1, Ordering::Relaxed, Ordering::Relaxed);
            let (Some(start), Some(view)) = (b.clock.ensemble_ns(mono), b.tempo.view()) else {
                return;
            };
            let latency = shared_latency_ns(&b.shared, b.rate);
            let frames = output.len() / b.channels;
            let period_ns = netjam_engine::time::frames_to_ns(frames as u64, b.rate);
            // The next frame sent is captured one period after this one started, and was
            // played the input latency before that.
            if let Some((ssrc, rtp_ts, rate)) = self.inner.sent() {
                let input_frames = b.shared.input_latency_frames.load(Ordering::Relaxed);
                let input_ns = netjam_engine::time::frames_to_ns(input_frames, b.rate);
                b.sent.publish(StreamMark {
                    ssrc,
                    rtp_ts,
                    ensemble_ns: (start + period_ns).saturating_sub(input_ns),
                    rate,
                });
            }
            let beats = b.shared.delay_beats.load(Ordering::Relaxed);
            if let (Some(line), true) = (b.delay.as_mut(), beats > 0) {
                let heard = self.inner.heard();
                let ssrc_word = heard.map_or(0, |(s, _)| u64::from(s) + 1);
                b.shared.heard_ssrc.store(ssrc_word, Ordering::Relaxed);
                // The capture time of the frame after this period, and the wait wanted
                // for it: `beats` beats at the tempo it was played in.
                let capture = match (heard, b.heard.get()) {
                    (Some((ssrc, ts)), Some(m)) if m.ssrc == ssrc => Some(m.capture_ns(ts)),
                    _ => None,
                };
                let want = capture
                    .and_then(|c| view.bpm_at(c.max(0) as u64))
                    .map_or(0, |bpm| (beats as f64 * 60e9 / bpm) as u64);
                let way = capture.map(|c| i128::from(start + period_ns + latency) - c);
                let state = line.process(output, way.filter(|_| want > 0), want);
                b.shared.delay_state.store(state.to_word(), Ordering::Relaxed);
                b.shared.delay_want_ns.store(want, Ordering::Relaxed);
            }
            let shared = &b.shared;
            b.clicks
                .render(&view, start + latency, frames, b.channels, output, |_| {
                    shared.clicks.fetch_add(1, Ordering::Relaxed);
                });
        }

        fn skipped(&mut self, frames: u64) {
            self.inner.skipped(frames);
        }

        fn extra_outputs(&mut self, frames: usize, outputs: &mut [f32]) {
            self.inner.extra_outputs(frames, outputs);
        }
    }

    /// The output latency in ensemble nanoseconds (the ensemble clock's rate error is
    /// well below a frame over any device latency).
    fn shared_latency_ns(shared: &BeatShared, rate: u32) -> u64 {
        let frames = shared.output_latency_frames.load(Ordering::Relaxed);
        netjam_engine::time::frames_to_ns(frames, rate)
    }

    /// A member of an ensemble running beside a jam.
    #[derive(Debug)]
    pub struct JamBeat {
        pub clock: ClockReader,
        pub tempo: TempoReader,
        pub shared: Arc<BeatShared>,
        /// For the audio thread: where the stream sent stands (it publishes), where the
        /// stream heard stands (it reads); taken by [`BeatClicks::new`].
        marks: Option<(Publisher<StreamMark>, Reader<StreamMark>)>,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl JamBeat {
        /// Joins the ensemble; once its clock is known, sets `propose_bpm` if the ensemble
        /// has no tempo yet (it follows the one it has otherwise). Says on stderr what it
        /// joined, the tempo, and where the first frame heard lies on the machine's clock.
        pub fn start(
            cfg: NodeConfig,
            propose_bpm: Option<f64>,
            secret: Option<netjam_ensemble::auth::Secret>,
        ) -> anyhow::Result<Self> {
            let name = cfg.ensemble.clone();
            let node = Node::start_with(cfg, secret)?;
            let clock = node.member_ref().clock_reader();
            let tempo = node.member_ref().tempo_reader();
            let shared = Arc::new(BeatShared::default());
            let stop = Arc::new(AtomicBool::new(false));
            eprintln!(
                "netjam: ensemble {name}: member {:016x} on {}{}",
                node.member_ref().id(),
                node.local_addr(),
                if node.in_room() {
                    ", through the rooms server (its clock is the ensemble's)"
                } else {
                    ""
                }
            );
            let (stop_t, shared_t) = (stop.clone(), shared.clone());
            let (sent_w, sent_r) = publish::share();
            let (heard_w, heard_r) = publish::share();
            let marks = Marks {
                sent: sent_r,
                heard: heard_w,
                known: Vec::new(),
                published: None,
                next_send: 0,
            };
            let thread = std::thread::Builder::new()
                .name("ensemble".into())
                .spawn(move || run(node, name, propose_bpm, &stop_t, &shared_t, marks))
                .context("cannot start the ensemble thread")?;
            Ok(Self {
                clock,
                tempo,
                shared,
                marks: Some((sent_w, heard_r)),
                stop,
                thread: Some(thread),
            })
        }

        /// The tempo and the beat (fractional, from the tempo's origin) now, once the
        /// clock is locked and a tempo is in force.
        pub fn now(&self) -> Option<(f64, f64)> {
            let t = self.clock.ensemble_ns(mono_ns())?;
            let view = self.tempo.view()?;
            Some((view.bpm_at(t)?, view.beat_at(t)?))
        }

        /// Leaves the ensemble.
        pub fn stop(&mut self) {
            self.stop.store(true, Ordering::Relaxed);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    impl Drop for JamBeat {
        fn drop(&mut self) {
            self.stop();
        }
    }

    /// Every jam member offers this service; the others send it where their stream stands.
    fn jam_service(id: u64) -> String {
        format!("jam{id:016x}")
    }

    /// How often a member says where its stream stands.
    const MARK_EVERY_NS: u64 = 250 * MS;

    /// The ensemble thread's side of the stream marks.
    struct Marks {
        sent: Reader<StreamMark>,
        heard: Publisher<StreamMark>,
        /// The latest mark of each stream heard of (a few at most).
        known: Vec<StreamMark>,
        published: Option<StreamMark>,
        next_send: u64,
    }

    impl Marks {
        /// A mark from another member (`/jam…/mark ,iihi SSRC RTP_TS ENSEMBLE_NS RATE`).
        fn on_message(&mut self, bytes: &[u8]) {
            let Ok(m) = Message::decode(bytes) else { return };
            let mut a = m.args();
            let (Some(Arg::Int(ssrc)), Some(Arg::Int(ts)), Some(Arg::Long(e)), Some(Arg::Int(rate))) =
                (a.next(), a.next(), a.next(), a.next())
            else {
                return;
            };
            let mark = StreamMark {
                ssrc: ssrc as u32,
                rtp_ts: ts as u32,
                ensemble_ns: e.max(0) as u64,
                rate: rate.max(1) as u32,
            };
            match self.known.iter_mut().find(|k| k.ssrc == mark.ssrc) {
                Some(k) => *k = mark,
                None => {
                    if self.known.len() >= 8 {
                        self.known.remove(0);
                    }
                    self.known.push(mark);
                }
            }
        }

        /// Hand the audio thread the latest mark of the stream it hears.
        fn publish(&mut self, shared: &BeatShared) {
            let heard = shared.heard_ssrc.load(Ordering::Relaxed);
            let Some(m) = self
                .known
                .iter()
                .find(|k| heard != 0 && u64::from(k.ssrc) + 1 == heard)
            else {
                return;
            };
            if self.published != Some(*m) {
                self.heard.publish(*m);
                self.published = Some(*m);
            }
        }

        /// Tell every other jam member where this player's stream stands.
        fn send(&mut self, node: &mut Node, now: u64) {
            if now < self.next_send {
                return;
            }
            self.next_send = now + MARK_EVERY_NS;
            let Some(m) = self.sent.get() else { return };
            let me = node.member_ref().id();
            let own = jam_service(me);
            let to: Vec<String> = node
                .member_ref()
                .table()
                .services()
                .into_iter()
                .filter(|r| r.service.starts_with("jam") && r.service != own && r.provider != me)
                .map(|r| r.service)
                .collect();
            for service in to {
                let args = [
                    Arg::Int(m.ssrc as i32),
                    Arg::Int(m.rtp_ts as i32),
                    Arg::Long(m.ensemble_ns as i64),
                    Arg::Int(m.rate as i32),
                ];
                let _ = node
                    .member()
                    .send_args(now, &format!("/{service}/mark"), &args, 0, false);
            }
            node.flush();
        }
    }

    fn run(
        mut node: Node,
        name: String,
        propose: Option<f64>,
        stop: &AtomicBool,
        shared: &BeatShared,
        mut marks: Marks,
    ) {
        let own = jam_service(node.member_ref().id());
        if let Err(e) = node.member().offer(&own) {
            eprintln!("netjam: ensemble {name}: cannot offer {own}: {e}");
        }
        node.flush();
        let mut locked_at = None;
        let mut proposed = propose.is_none();
        let mut told_frame = false;
        let mut told_latency = 0;
        while !stop.load(Ordering::Relaxed) {
            node.run(Some(mono_ns() + 50 * MS), |_, ev| {
                if let Event::Message(d) = &ev {
                    if d.service == own {
                        marks.on_message(&d.bytes);
                    }
                }
                if let Event::Tempo(t) = ev {
                    eprintln!(
                        "netjam: ensemble {name}: {} BPM from beat {} (ensemble time {:.3} s)",
                        t.bpm,
                        t.start_beat,
                        t.start_ns as f64 / 1e9
                    );
                }
                true
            });
            let now = mono_ns();
            marks.publish(shared);
            marks.send(&mut node, now);
            if locked_at.is_none() && node.member_ref().ensemble_time(now).is_some() {
                locked_at = Some(now);
                eprintln!("netjam: ensemble {name}: clock locked");
            }
            // One more hello round after the lock, so the tempo others hold has arrived.
            if let (false, Some(l), Some(bpm)) = (proposed, locked_at, propose) {
                if now >= l + 600 * MS {
                    proposed = true;
                    let m = node.member();
                    let held = m.ensemble_time(now).and_then(|e| m.tempo().at(e).map(|s| s.bpm));
                    match held {
                        Some(b) if (b - bpm).abs() > 1e-9 => eprintln!(
                            "netjam: ensemble {name} plays at {b} BPM: following it (netjam ensemble tempo {name} {bpm} changes it)"
                        ),
                        Some(_) => {}
                        None => {
                            if let Err(e) = m.set_tempo(now, bpm, 300 * MS, None) {
                                eprintln!("netjam: ensemble {name}: cannot set the tempo: {e}");
                            }
                        }
                    }
                    node.flush();
                }
            }
            let latency = shared.output_latency_frames.load(Ordering::Relaxed);
            if latency != told_latency {
                told_latency = latency;
                eprintln!(
                    "netjam: ensemble {name}: the output latency is {latency} frames: the click is rendered that much early, to sound on the beat"
                );
            }
            let first = shared.first_frame_mono.load(Ordering::Relaxed);
            if !told_frame && first != 0 {
                told_frame = true;
                eprintln!(
                    "netjam: ensemble {name}: the first frame heard is at monotonic {} ns",
                    first - 1
                );
            }
        }
        node.leave();
    }

    #[cfg(test)]
    mod tests {
        use netjam_ensemble::beat::{tempo_share, TempoSegment, TempoView};
        use netjam_ensemble::clock::{clock_share, ClockSegment};

        use super::*;

        /// Plays silence.
        struct Quiet;

        impl Streams for Quiet {}

        impl Process for Quiet {
            fn process(&mut self, _now_ns: u64, _input: &[f32], output: &mut [f32]) {
                output.fill(0.0);
            }
        }

        /// The frame of the first click heard over one second of 64-frame periods at
        /// 48 kHz from ensemble time 0.99 s (120 BPM: beat 2 falls at 1 s, frame 480),
        /// with the device's output latency `latency` frames.
        fn first_click(latency: u64) -> usize {
            let (mut clock_w, clock) = clock_share();
            let (mut tempo_w, tempo) = tempo_share();
            // Ensemble time is the local clock.
            clock_w.publish(ClockSegment {
                local_origin_ns: 0,
                ensemble_origin_ns: 0,
                rate: 0.0,
            });
            tempo_w.publish(TempoView {
                current: Some(TempoSegment {
                    start_ns: 0,
                    start_beat: 0.0,
                    bpm: 120.0,
                    by: 1,
                }),
                next: None,
            });
            let shared = Arc::new(BeatShared::default());
            shared.output_latency_frames.store(latency, Ordering::Relaxed);
            let mut p = BeatClicks::with_readers(Quiet, clock, tempo, shared.clone(), 48_000, 2, 0.0);
            if let Some(b) = p.beat.as_mut() {
                b.mono_offset = 0;
            }
            let t0 = 990 * MS;
            let mut heard: Vec<f32> = Vec::new();
            let mut out = [0f32; 128];
            for k in 0..750u64 {
                let now = t0 + netjam_engine::time::frames_to_ns(64 * k, 48_000);
                p.process(now, &[], &mut out);
                heard.extend(out.iter().step_by(2));
            }
            assert_eq!(shared.clicks.load(Ordering::Relaxed), 2);
            heard.iter().position(|x| x.abs() > 0.5).expect("a click")
        }

        #[test]
        fn the_click_is_rendered_earlier_by_the_output_latency() {
            assert_eq!(first_click(0), 480);
            for latency in [37, 256, 300] {
                assert_eq!(first_click(latency), 480 - latency as usize, "latency {latency}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_seat_hands_the_node_its_datagrams_on_its_clock_and_follows_the_server() {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("socket");
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:4464".parse().unwrap(),
            "127.0.0.1:4465".parse().unwrap(),
        );
        let seat = SharedSeat::new(&socket, a).expect("seat");
        let inbox = seat.inbox();
        // What the ensemble takes from the server: its envelopes and the clock's answers.
        let mut env = [0u8; 64];
        let n = Control::Ens {
            member_id: 3,
            payload: b"hi",
        }
        .encode(&mut env)
        .expect("envelope");
        assert!(SeatInbox::wants(&env[..n]));
        assert!(SeatInbox::wants(PONG_ADDRESS.as_bytes()));
        assert!(!SeatInbox::wants(b"/netjam/ensemble\0\0\0\0,\0\0\0"));
        assert!(!SeatInbox::wants(b"/netjam/roster\0\0"));
        // Delivered with its arrival moved onto the node's clock.
        let at = crate::clock::now_ns();
        let (before, sent) = (mono_ns(), std::time::Instant::now());
        inbox.deliver(at, a, &env[..n]);
        let outlet = seat.outlet.lock().unwrap().take().expect("the node's end");
        match outlet.try_recv() {
            Ok(Input::Packet {
                now,
                from,
                bytes,
                bridge,
            }) => {
                assert_eq!((from, bytes.as_slice(), bridge), (a, &env[..n], false));
                let slack = sent.elapsed().as_nanos() as u64 + 1_000_000;
                assert!(
                    now <= before + slack && now + slack >= before,
                    "{now} vs {before}"
                );
            }
            _ => panic!("nothing delivered"),
        }
        // The room moved: the node sends where the room thread says.
        inbox.server_is(b);
        assert_eq!(seat.server(), b);
        // One node per seat.
        assert!(Node::start_on_seat(
            NodeConfig {
                ensemble: "e".into(),
                id: 1,
                services: Vec::new(),
                taps: Vec::new(),
                discovery: Discovery::local(1),
                bind_ip: bind_ip(true),
                osc_bridge: None,
                room: None,
            },
            seat,
            None
        )
        .is_err());
    }

    #[test]
    fn relay_addresses_carry_a_member_id_and_no_real_address_is_taken_for_one() {
        for id in [0, 1, 0xFFFF, 0x1_0000, u32::MAX] {
            assert_eq!(relayed_member(&relay_addr(id)), Some(id));
        }
        for real in [
            "127.0.0.1:0",
            "[::1]:0",
            "[100::5]:4464",
            "[2001:db8::1]:0",
            "10.0.0.1:14640",
        ] {
            assert_eq!(relayed_member(&real.parse().unwrap()), None, "{real}");
        }
    }
}
