//! One member of an ensemble, as a sans-IO state machine: membership and the service
//! table, the clock (which member is the reference, and following it), and delivery —
//! best effort, reliable and ordered per sender, timed on ensemble time — with taps.
//!
//! Driving it (the rule of str0m and quinn): feed every datagram to [`Member::handle`]
//! with the local time it arrived; call [`Member::handle_timeout`] when
//! [`Member::poll_timeout`] says; after either, and after [`Member::send`], drain
//! [`Member::poll_transmit`] (send each datagram: [`Dest::Discovery`] means "to every
//! discovery target", see [`crate::discovery`]) and [`Member::poll_event`]. Local time is
//! a monotonic nanosecond count chosen by the caller; the member id is a random number
//! the caller draws (this module never reads a clock or a random source, never touches a
//! socket).
//!
//! * **Membership.** A hello goes to the discovery targets and to every member known
//!   every [`MemberConfig::hello_interval_ns`], carrying the ensemble name, the member id and
//!   the version of its service list; a member heard for the first time gets a hello
//!   back at once. A member whose announced version differs from the list held is asked
//!   for its list (again at each hello, until it arrives), so tables converge after any
//!   loss. A member silent for [`MemberConfig::member_timeout_ns`] is dropped and its
//!   services withdrawn; one that leaves says bye. The table is capped (members, services
//!   and taps per member, name lengths: see [`crate::table`]); datagrams from a member
//!   it refused are dropped and counted in [`MemberStats`].
//!   With [`MemberConfig::secret`], every datagram is sealed and only sealed ones that
//!   check out are taken ([`crate::auth`]).
//! * **Clock.** Every member whose ensemble time is valid says so in its hellos; the one
//!   with the smallest id among them is the reference, and the others follow it with a
//!   [`ClockClient`]. A member that hears of nobody valid for
//!   [`MemberConfig::alone_wait_ns`] starts the ensemble time from its own clock if no
//!   member with a smaller id is known (members starting together thus agree on who
//!   starts it, and nobody has to re-lock). A
//!   reference answers probes with its *ensemble* time, so when the reference changes
//!   (it left, or a smaller id became valid) the new one continues the same time line
//!   and followers move by no more than its error.
//!   With [`MemberConfig::clock_server`] set (an ensemble that is a room on a rooms
//!   server) nobody is chosen: every member follows the clock that answers probes at that
//!   address, reported as reference [`SERVER_REFERENCE`]. The server is the one place
//!   every member of a room reaches, so each member measures only its own path to it, and
//!   members joining or leaving never move the time line.
//! * **Delivery.** [`Member::send`] takes one encoded OSC message whose address starts
//!   with a service (`/synth1/...`, or `!synth1/...` for a literal address), an ensemble
//!   time (0: now) and best-effort or reliable. The provider delivers it when its time
//!   comes: as an [`Event::Message`], or into an [`AudioInbox`] for services the audio
//!   thread serves. Services tapped by others copy each arriving message to the tappers,
//!   with the same time and reliability.
//! * **Beat.** [`Member::set_tempo`] plans a tempo change on a whole beat (or bar) ahead
//!   and sends it reliably to every member as a message timed for that beat; each member
//!   puts it in its [`TempoMap`] as it arrives, so the audio thread, reading the map
//!   through a [`TempoReader`], switches at the exact frame. A member heard for the first
//!   time is sent the segments in force and planned. See [`crate::beat`].

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;

use netjam_osc::schedule::Scheduler;
use netjam_osc::{Arg, Message, TimeTag};
use serde::Serialize;

use crate::address::{check_service, readdress, service_of, AddressError};
use crate::auth::Secret;
use crate::beat::{tempo_share, TempoError, TempoMap, TempoPublisher, TempoReader, TempoSegment, TempoView};
use crate::clock::{
    clock_share, ClockClient, ClockConfig, ClockPublisher, ClockReader, ClockSegment, ClockServer,
    ClockStats, ProbeReply, ProbeRequest, PING_ADDRESS, PONG_ADDRESS,
};
use crate::inbox::{audio_inbox, AudioInbox, AudioSender};
use crate::reliable::{Arrival, InStream, OutStream};
use crate::table::{newer, ServiceTable, MAX_SERVICES, MAX_TAPS};
use crate::wire::{
    encode_vec, Data, ServiceList, Wire, WireError, HELLO_REPLY, HELLO_SYNCED, MSG_RELIABLE, MSG_TAP_COPY,
    TEMPO,
};

const MS: u64 = 1_000_000;

/// The reference id that stands for [`MemberConfig::clock_server`] (member ids are never 0).
pub const SERVER_REFERENCE: u64 = 0;

/// Settings of a [`Member`].
#[derive(Debug, Clone)]
pub struct MemberConfig {
    /// The ensemble's name: members with the same name find each other.
    pub ensemble: String,
    /// This member's id: random, drawn by the caller (never 0).
    pub id: u64,
    pub hello_interval_ns: u64,
    /// A member not heard from for this long is dropped.
    pub member_timeout_ns: u64,
    /// With no member with a valid ensemble time heard for this long, start the time here.
    pub alone_wait_ns: u64,
    /// Least wait before retransmitting an unacknowledged reliable message; the wait
    /// follows the measured round trip above it (doubling on each retry, up to 8×).
    pub retransmit_ns: u64,
    pub clock: ClockConfig,
    /// Timed messages held for the network thread: how many, and how large.
    pub timed_slots: usize,
    pub timed_slot_bytes: usize,
    /// Follow the clock answering probes at this address (a rooms server) instead of
    /// choosing a member as the reference.
    pub clock_server: Option<SocketAddr>,
    /// The ensemble's shared secret: with one, every datagram sent is sealed and only
    /// sealed ones that check out are taken (see [`crate::auth`]).
    pub secret: Option<Secret>,
}

impl MemberConfig {
    pub fn new(ensemble: &str, id: u64) -> Self {
        Self {
            ensemble: ensemble.to_string(),
            id: id.max(1),
            hello_interval_ns: 500 * MS,
            member_timeout_ns: 3_000 * MS,
            alone_wait_ns: 1_500 * MS,
            retransmit_ns: 60 * MS,
            clock: ClockConfig::default(),
            timed_slots: 1024,
            timed_slot_bytes: 1536,
            clock_server: None,
            secret: None,
        }
    }
}

/// Where a datagram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dest {
    /// To every discovery target (the shell knows them).
    Discovery,
    Peer(SocketAddr),
}

/// A datagram to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub to: Dest,
    pub bytes: Vec<u8>,
}

/// A message delivered to one of this member's services.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub service: String,
    /// The sending member.
    pub from: u64,
    /// The time it was sent for (ensemble ns; 0: now).
    pub time_ns: u64,
    /// Ensemble time when it was delivered (`None` before this member has one).
    pub delivered_ns: Option<u64>,
    pub reliable: bool,
    /// A tap's copy.
    pub tap_copy: bool,
    /// The encoded OSC message.
    pub bytes: Vec<u8>,
}

/// What happened, for the caller.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    MemberJoined {
        id: u64,
    },
    MemberLeft {
        id: u64,
        /// Its services, now withdrawn (unless another member offers them too).
        services: Vec<String>,
        /// Dropped after silence rather than by its bye.
        timed_out: bool,
    },
    /// Some member's service list changed.
    ServicesChanged,
    /// The clock reference changed (`None`: none chosen yet).
    ClockReference {
        id: Option<u64>,
    },
    /// This member's clock locked onto the reference's (first estimate after a change).
    ClockLocked {
        reference: u64,
    },
    Message(Delivery),
    /// A tempo segment was set here or arrived (it starts at its own time).
    Tempo(TempoSegment),
}

/// Why a message could not be sent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Address(#[from] AddressError),
    #[error("no member of the ensemble offers the service {0:?}")]
    NoProvider(String),
    #[error("too many reliable messages to member {0:016x} are unacknowledged")]
    Backlogged(u64),
    #[error("not one OSC message: {0}")]
    NotAMessage(String),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("this member has no ensemble time yet")]
    NoClock,
    #[error(transparent)]
    Tempo(#[from] TempoError),
}

/// Counts, for the stats.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct MemberStats {
    pub sent: u64,
    pub delivered: u64,
    pub retransmits: u64,
    pub duplicates: u64,
    /// Datagrams that were not ensemble messages, or not for this member.
    pub rejected: u64,
    /// Timed messages delivered at once because the scheduler was full.
    pub timed_overflow: u64,
    pub tap_copies: u64,
    /// Datagrams from a newcomer not entered because the table was full (see
    /// [`crate::table`]).
    pub refused_members: u64,
    /// Service lists refused for breaking the table's caps.
    pub refused_lists: u64,
    /// Messages, queries and acknowledgements from a member the table does not hold
    /// (refused for room), dropped.
    pub refused_unknown: u64,
    /// With a secret: datagrams not sealed with it (members without it, or forged).
    pub unauthenticated: u64,
    /// With a secret: sealed datagrams taken before from their sender (replayed), or
    /// older than the replay window.
    pub replayed: u64,
}

#[derive(Debug)]
enum Role {
    /// Waiting to hear of a member with a valid time.
    Unsynced,
    Reference,
    Following {
        reference: u64,
        client: Box<ClockClient>,
        locked: bool,
    },
}

/// One member; see the module docs.
#[derive(Debug)]
pub struct Member {
    config: MemberConfig,
    /// When an unsynced member next checks whether to start the ensemble time.
    next_alone_ns: u64,
    table: ServiceTable,
    services: Vec<String>,
    taps: Vec<(String, String)>,
    version: u32,
    next_hello_ns: u64,
    role: Role,
    segment: Option<ClockSegment>,
    published: Option<ClockSegment>,
    publisher: ClockPublisher,
    reader: ClockReader,
    clock_server: ClockServer,
    /// Datagrams sealed so far (the next one's counter), and what was taken from whom.
    sealed: u64,
    replays: crate::auth::ReplayGuard,
    out_streams: HashMap<u64, OutStream>,
    in_streams: HashMap<u64, InStream>,
    scheduler: Scheduler,
    audio: BTreeMap<String, AudioSender>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Event>,
    stats: MemberStats,
    scratch: Vec<u8>,
    tempo: TempoMap,
    tempo_publisher: TempoPublisher,
    tempo_reader: TempoReader,
    tempo_published: Option<TempoView>,
}

impl Member {
    /// A member starting at local time `now`; its first hello is due at once.
    pub fn new(config: MemberConfig, now_ns: u64) -> Self {
        let (publisher, reader) = clock_share();
        let (tempo_publisher, tempo_reader) = tempo_share();
        let mut table = ServiceTable::new();
        table.insert(config.id, None, now_ns);
        table.set_services(config.id, 0, ServiceList::default());
        let mut events = VecDeque::new();
        let role = match config.clock_server {
            Some(_) => {
                events.push_back(Event::ClockReference {
                    id: Some(SERVER_REFERENCE),
                });
                Role::Following {
                    reference: SERVER_REFERENCE,
                    client: Box::new(ClockClient::new(config.clock.clone())),
                    locked: false,
                }
            }
            None => Role::Unsynced,
        };
        Self {
            next_alone_ns: now_ns + config.alone_wait_ns,
            table,
            services: Vec::new(),
            taps: Vec::new(),
            version: 0,
            next_hello_ns: now_ns,
            role,
            segment: None,
            published: None,
            publisher,
            reader,
            clock_server: ClockServer::new(),
            sealed: 0,
            replays: crate::auth::ReplayGuard::default(),
            out_streams: HashMap::new(),
            in_streams: HashMap::new(),
            scheduler: Scheduler::new(config.timed_slots, config.timed_slot_bytes + 12),
            audio: BTreeMap::new(),
            transmits: VecDeque::new(),
            events,
            stats: MemberStats::default(),
            scratch: Vec::new(),
            tempo: TempoMap::new(),
            tempo_publisher,
            tempo_reader,
            tempo_published: None,
            config,
        }
    }

    pub fn id(&self) -> u64 {
        self.config.id
    }

    pub fn config(&self) -> &MemberConfig {
        &self.config
    }

    pub fn table(&self) -> &ServiceTable {
        &self.table
    }

    pub fn stats(&self) -> MemberStats {
        let mut s = self.stats;
        s.retransmits = self.out_streams.values().map(|o| o.retransmits).sum();
        s.duplicates = self.in_streams.values().map(|i| i.duplicates).sum();
        let r = self.table.refusals();
        s.refused_members = r.members;
        s.refused_lists = r.lists;
        s
    }

    /// Offers `service` from this member.
    pub fn offer(&mut self, service: &str) -> Result<(), AddressError> {
        check_service(service)?;
        if !self.services.iter().any(|s| s == service) {
            if self.services.len() >= MAX_SERVICES {
                return Err(AddressError::TooMany(MAX_SERVICES));
            }
            self.services.push(service.to_string());
            self.services_changed();
        }
        Ok(())
    }

    /// Stops offering `service`.
    pub fn withdraw(&mut self, service: &str) {
        let before = self.services.len();
        self.services.retain(|s| s != service);
        if self.services.len() != before {
            self.services_changed();
        }
    }

    /// Copies every message that reaches `tappee` (offered anywhere in the ensemble) to
    /// `tapper` (usually a service of this member).
    pub fn tap(&mut self, tappee: &str, tapper: &str) -> Result<(), AddressError> {
        check_service(tappee)?;
        check_service(tapper)?;
        let t = (tappee.to_string(), tapper.to_string());
        if !self.taps.contains(&t) {
            if self.taps.len() >= MAX_TAPS {
                return Err(AddressError::TooMany(MAX_TAPS));
            }
            self.taps.push(t);
            self.services_changed();
        }
        Ok(())
    }

    /// From now on, messages for `service` (which this member offers) go to the returned
    /// inbox, for the audio thread to take when due, instead of [`Event::Message`].
    pub fn audio_inbox(&mut self, service: &str, slots: usize, slot_bytes: usize) -> AudioInbox {
        let (tx, rx) = audio_inbox(slots, slot_bytes);
        self.audio.insert(service.to_string(), tx);
        rx
    }

    /// Ensemble time for other threads (the audio thread): lock- and allocation-free.
    pub fn clock_reader(&self) -> ClockReader {
        self.reader.clone()
    }

    /// Ensemble time at local time `now` (`None` until this member has one).
    pub fn ensemble_time(&self, now_ns: u64) -> Option<u64> {
        self.segment.map(|s| s.map(now_ns))
    }

    /// The shared beat for other threads (the audio thread): lock- and allocation-free.
    pub fn tempo_reader(&self) -> TempoReader {
        self.tempo_reader.clone()
    }

    /// The tempo segments this member knows.
    pub fn tempo(&self) -> &TempoMap {
        &self.tempo
    }

    /// Sets the ensemble's tempo to `bpm`: with none yet, from ensemble time 0 and beat 0
    /// (members setting the same tempo independently agree); otherwise from the first
    /// whole beat — bar, with `beats_per_bar` — at least `lead_ns` ahead, so the message
    /// reaches every member before it takes effect. Sent reliably to every member known,
    /// timed for that beat. Returns the segment.
    pub fn set_tempo(
        &mut self,
        now_ns: u64,
        bpm: f64,
        lead_ns: u64,
        beats_per_bar: Option<u32>,
    ) -> Result<TempoSegment, SendError> {
        let ens = self.ensemble_time(now_ns).ok_or(SendError::NoClock)?;
        let seg = self
            .tempo
            .change(ens, lead_ns, bpm, self.config.id, beats_per_bar)?;
        let peers: Vec<(u64, SocketAddr)> = self
            .table
            .members()
            .filter(|m| m.id != self.config.id)
            .filter_map(|m| m.addr.map(|a| (m.id, a)))
            .collect();
        for (id, addr) in peers {
            self.send_tempo(now_ns, id, addr, &seg)?;
        }
        self.tempo_in(now_ns, seg);
        Ok(seg)
    }

    fn send_tempo(
        &mut self,
        now_ns: u64,
        to: u64,
        addr: SocketAddr,
        seg: &TempoSegment,
    ) -> Result<(), SendError> {
        let m = encode_vec(
            TEMPO,
            &[
                Arg::Long(seg.start_ns as i64),
                Arg::Double(seg.start_beat),
                Arg::Double(seg.bpm),
                Arg::Long(seg.by as i64),
            ],
        )?;
        self.send_data(now_ns, to, addr, &m, seg.start_ns.max(2), MSG_RELIABLE)
    }

    /// A tempo segment set here or arrived: into the map, out to the audio thread.
    fn tempo_in(&mut self, now_ns: u64, seg: TempoSegment) {
        if self.tempo.insert(seg) {
            self.events.push_back(Event::Tempo(seg));
            self.publish_tempo(now_ns);
        }
    }

    fn publish_tempo(&mut self, now_ns: u64) {
        let Some(ens) = self.ensemble_time(now_ns) else {
            return;
        };
        let view = self.tempo.view(ens);
        if (view.current.is_some() || view.next.is_some()) && self.tempo_published != Some(view) {
            self.tempo_publisher.publish(view);
            self.tempo_published = Some(view);
        }
    }

    /// The clock reference (`None` while unsynced; this member's own id when it is it).
    pub fn reference(&self) -> Option<u64> {
        match &self.role {
            Role::Unsynced => None,
            Role::Reference => Some(self.config.id),
            Role::Following { reference, .. } => Some(*reference),
        }
    }

    /// Where the reference answers clock probes.
    fn reference_addr(&self, reference: u64) -> Option<SocketAddr> {
        match self.config.clock_server {
            Some(a) if reference == SERVER_REFERENCE => Some(a),
            _ => self.table.member(reference).and_then(|m| m.addr),
        }
    }

    /// The estimate of the reference's clock, while following one.
    pub fn clock_stats(&self) -> Option<ClockStats> {
        match &self.role {
            Role::Following { client, .. } => Some(client.stats()),
            _ => None,
        }
    }

    /// Reliable messages sent and not yet acknowledged, to every member.
    pub fn unacked(&self) -> usize {
        self.out_streams.values().map(OutStream::in_flight).sum()
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let mut t = self.transmits.pop_front()?;
        // The rooms server answering clock probes holds no ensemble secret: those go bare.
        let to_server = self.config.clock_server.is_some_and(|a| t.to == Dest::Peer(a));
        if let Some(s) = self.config.secret.as_ref().filter(|_| !to_server) {
            t.bytes = s.seal(self.config.id, self.sealed, &t.bytes);
            self.sealed += 1;
        }
        Some(t)
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Says goodbye to the ensemble (call, drain [`Member::poll_transmit`], then drop).
    pub fn leave(&mut self) {
        if let Ok(bytes) = (Wire::Bye { id: self.config.id }).encode() {
            self.transmits.push_back(Transmit {
                to: Dest::Discovery,
                bytes: bytes.clone(),
            });
            for m in self.table.members() {
                if let Some(a) = m.addr {
                    self.transmits.push_back(Transmit {
                        to: Dest::Peer(a),
                        bytes: bytes.clone(),
                    });
                }
            }
        }
    }

    /// When [`Member::handle_timeout`] must be called next (local time).
    pub fn poll_timeout(&self) -> u64 {
        let mut t = self.next_hello_ns;
        if let Some(e) = self.table.next_expiry(self.config.member_timeout_ns) {
            t = t.min(e);
        }
        match &self.role {
            Role::Unsynced => t = t.min(self.next_alone_ns),
            Role::Following { client, .. } => {
                if let Some(c) = client.poll_timeout() {
                    t = t.min(c);
                }
            }
            Role::Reference => {}
        }
        for o in self.out_streams.values() {
            if let Some(d) = o.next_due() {
                t = t.min(d);
            }
        }
        if let (Some(due), Some(seg)) = (self.scheduler.next_due(), self.segment) {
            t = t.min(local_of(&seg, due.0));
        }
        // The audio thread's view holds two segments: publish again when the second
        // starts if a third is waiting.
        if let (Some(next), Some(seg)) = (self.tempo_published.and_then(|v| v.next), self.segment) {
            if self
                .tempo
                .segments()
                .last()
                .is_some_and(|l| l.start_ns > next.start_ns)
            {
                t = t.min(local_of(&seg, next.start_ns));
            }
        }
        t
    }

    /// Does whatever is due at local time `now`.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        if now_ns >= self.next_hello_ns {
            self.next_hello_ns = now_ns + self.config.hello_interval_ns;
            self.hello(Dest::Discovery, 0);
            // And to every member known, so one reached only through a unicast path (a
            // relay, another subnet: not among the discovery targets) stays known.
            let known: Vec<SocketAddr> = self
                .table
                .members()
                .filter(|m| m.id != self.config.id)
                .filter_map(|m| m.addr)
                .collect();
            for a in known {
                self.hello(Dest::Peer(a), 0);
            }
            // Keep asking for lists we do not have.
            let wanted: Vec<(u64, SocketAddr)> = self
                .table
                .members()
                .filter(|m| m.have != Some(m.announced))
                .filter_map(|m| m.addr.map(|a| (m.id, a)))
                .collect();
            for (id, a) in wanted {
                self.query(id, a);
            }
        }
        for id in self.table.silent(now_ns, self.config.member_timeout_ns) {
            self.drop_member(id, true);
        }
        self.choose_reference(now_ns);
        let reference_addr = self.reference().and_then(|r| self.reference_addr(r));
        if let Role::Following { client, .. } = &mut self.role {
            if let Some(addr) = reference_addr {
                let mut buf = [0u8; 64];
                while let Some(p) = client.poll_transmit(now_ns) {
                    if let Ok(n) = p.encode(&mut buf) {
                        self.transmits.push_back(Transmit {
                            to: Dest::Peer(addr),
                            bytes: buf[..n].to_vec(),
                        });
                    }
                }
            }
        }
        self.follow_segment();
        let rto = self.config.retransmit_ns;
        for (id, o) in self.out_streams.iter_mut() {
            let Some(addr) = self.table.member(*id).and_then(|m| m.addr) else {
                continue;
            };
            o.due(now_ns, rto, |b| {
                self.transmits.push_back(Transmit {
                    to: Dest::Peer(addr),
                    bytes: b.to_vec(),
                })
            });
        }
        self.drain_timed(now_ns);
        self.publish_tempo(now_ns);
    }

    /// Takes one datagram that arrived from `from` at local time `now`. Anything that is
    /// not a well-formed ensemble message for this member is counted and ignored.
    pub fn handle(&mut self, now_ns: u64, from: SocketAddr, bytes: &[u8]) {
        let from_server =
            self.config.clock_server == Some(from) && bytes.starts_with(PONG_ADDRESS.as_bytes());
        let bytes = match self.config.secret.as_ref().filter(|_| !from_server) {
            Some(s) => match s.open(bytes) {
                Ok(sealed) => {
                    if self.replays.check(sealed.origin, sealed.counter).is_err() {
                        self.stats.replayed += 1;
                        return;
                    }
                    sealed.datagram
                }
                Err(_) => {
                    self.stats.unauthenticated += 1;
                    return;
                }
            },
            None => bytes,
        };
        if bytes.starts_with(PING_ADDRESS.as_bytes()) {
            if let (Ok(req), Some(ens)) = (ProbeRequest::decode(bytes), self.ensemble_time(now_ns)) {
                let rep = self.clock_server.answer(ens, &req);
                let mut buf = [0u8; 64];
                if let Ok(n) = rep.encode(&mut buf) {
                    self.transmits.push_back(Transmit {
                        to: Dest::Peer(from),
                        bytes: buf[..n].to_vec(),
                    });
                }
            }
            return;
        }
        if bytes.starts_with(PONG_ADDRESS.as_bytes()) {
            let expected = self.reference().and_then(|r| self.reference_addr(r));
            if let (
                Ok(rep),
                Role::Following {
                    client, reference, ..
                },
            ) = (ProbeReply::decode(bytes), &mut self.role)
            {
                let r = *reference;
                if expected == Some(from) && client.handle_reply(now_ns, &rep) && r != SERVER_REFERENCE {
                    self.table.insert(r, Some(from), now_ns);
                }
                self.follow_segment();
            }
            return;
        }
        let w = match Wire::decode(bytes) {
            Ok(w) => w,
            Err(WireError::OverCap) => {
                self.table.count_refused_list();
                return;
            }
            Err(_) => {
                self.stats.rejected += 1;
                return;
            }
        };
        // Nobody else may speak with this member's id (it would take over its own entry).
        let claimed = match &w {
            Wire::ServicesQuery { from, .. } | Wire::Ack { from, .. } => Some(*from),
            Wire::Data(d) => Some(d.from),
            _ => None,
        };
        if claimed == Some(self.config.id) {
            self.stats.rejected += 1;
            return;
        }
        match w {
            Wire::Hello {
                ensemble,
                id,
                version,
                flags,
            } => {
                if ensemble != self.config.ensemble || id == self.config.id {
                    return;
                }
                if self.table.insert(id, Some(from), now_ns) {
                    self.events.push_back(Event::MemberJoined { id });
                    if flags & HELLO_REPLY == 0 {
                        self.hello(Dest::Peer(from), HELLO_REPLY);
                    }
                    // The beat in force and planned, for the newcomer.
                    let now_ens = self.ensemble_time(now_ns).unwrap_or(0);
                    let segs = self.tempo.from(now_ens).to_vec();
                    for seg in segs {
                        let _ = self.send_tempo(now_ns, id, from, &seg);
                    }
                }
                let mut ask = false;
                if let Some(m) = self.table.member_mut(id) {
                    m.synced = flags & HELLO_SYNCED != 0;
                    if newer(version, m.announced) || m.have.is_none() {
                        m.announced = version;
                    }
                    ask = m.have != Some(m.announced);
                }
                if ask {
                    self.query(id, from);
                }
                self.choose_reference(now_ns);
            }
            Wire::ServicesQuery { from: who, to } => {
                if to == self.config.id {
                    if !self.admit(who, from, now_ns) {
                        return;
                    }
                    self.send_services(Dest::Peer(from));
                }
            }
            Wire::Services { id, version, list } => {
                if id == self.config.id {
                    return;
                }
                self.table.insert(id, Some(from), now_ns);
                if self.table.set_services(id, version, list) {
                    self.events.push_back(Event::ServicesChanged);
                }
            }
            Wire::Bye { id } => {
                if id != self.config.id {
                    self.drop_member(id, false);
                    self.choose_reference(now_ns);
                }
            }
            Wire::Ack {
                from: who,
                to,
                next,
                got,
            } => {
                if to == self.config.id {
                    if !self.admit(who, from, now_ns) {
                        return;
                    }
                    if let Some(o) = self.out_streams.get_mut(&who) {
                        o.ack(now_ns, next, got);
                        // Room in the send window: queued messages go now.
                        o.due(now_ns, self.config.retransmit_ns, |b| {
                            self.transmits.push_back(Transmit {
                                to: Dest::Peer(from),
                                bytes: b.to_vec(),
                            })
                        });
                    }
                }
            }
            Wire::Data(d) => {
                if d.to != self.config.id {
                    self.stats.rejected += 1;
                    return;
                }
                // Only members the table holds get a reliable stream here, so the
                // streams are bounded by the table's cap.
                if !self.admit(d.from, from, now_ns) {
                    return;
                }
                if d.flags & MSG_RELIABLE == 0 {
                    self.accept(now_ns, d.from, d.flags, d.time_ns, d.payload);
                    return;
                }
                // Kept as [flags][time][message] if it must wait for a gap to fill.
                let mut held = Vec::with_capacity(12 + d.payload.len());
                held.extend_from_slice(&d.flags.to_be_bytes());
                held.extend_from_slice(&d.time_ns.to_be_bytes());
                held.extend_from_slice(d.payload);
                let stream = self.in_streams.entry(d.from).or_default();
                let arrival = stream.arrive(d.seq, d.base, &held);
                let ack = stream.ack();
                if let Ok(b) = (Wire::Ack {
                    from: self.config.id,
                    to: d.from,
                    next: ack,
                    got: d.seq,
                })
                .encode()
                {
                    self.transmits.push_back(Transmit {
                        to: Dest::Peer(from),
                        bytes: b,
                    });
                }
                if arrival == Arrival::Deliver {
                    self.accept(now_ns, d.from, d.flags, d.time_ns, d.payload);
                    // Early ones now in order.
                    while let Some(p) = self.in_streams.get_mut(&d.from).and_then(InStream::pop_ready) {
                        if let Some((head, msg)) = p.split_first_chunk::<12>() {
                            let flags = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
                            let mut t = [0u8; 8];
                            t.copy_from_slice(&head[4..]);
                            self.accept(now_ns, d.from, flags, u64::from_be_bytes(t), msg);
                        }
                    }
                }
            }
        }
    }

    /// Enters (or refreshes) member `id` heard at `from`; `false` (counted) when the
    /// table is full and does not hold it.
    fn admit(&mut self, id: u64, from: SocketAddr, now_ns: u64) -> bool {
        self.table.insert(id, Some(from), now_ns);
        let held = self.table.member(id).is_some();
        if !held {
            self.stats.refused_unknown += 1;
        }
        held
    }

    /// Sends one encoded OSC message to the service its address names, for ensemble time
    /// `time_ns` (0: now), reliably (acknowledged, in order) or best effort. Returns the
    /// member it went to (possibly this one).
    pub fn send(
        &mut self,
        now_ns: u64,
        message: &[u8],
        time_ns: u64,
        reliable: bool,
    ) -> Result<u64, SendError> {
        let flags = if reliable { MSG_RELIABLE } else { 0 };
        self.send_flags(now_ns, message, time_ns, flags)
    }

    /// [`Member::send`] building the message from an address and arguments.
    pub fn send_args(
        &mut self,
        now_ns: u64,
        address: &str,
        args: &[Arg<'_>],
        time_ns: u64,
        reliable: bool,
    ) -> Result<u64, SendError> {
        let m = encode_vec(address, args)?;
        self.send(now_ns, &m, time_ns, reliable)
    }

    fn send_flags(
        &mut self,
        now_ns: u64,
        message: &[u8],
        time_ns: u64,
        flags: u32,
    ) -> Result<u64, SendError> {
        let m = Message::decode(message).map_err(|e| SendError::NotAMessage(e.to_string()))?;
        let (service, _) = service_of(m.address())?;
        let provider = self
            .table
            .provider(service)
            .ok_or_else(|| SendError::NoProvider(service.to_string()))?;
        if provider == self.config.id {
            self.accept(now_ns, provider, flags, time_ns, message);
            return Ok(provider);
        }
        let addr = self
            .table
            .member(provider)
            .and_then(|m| m.addr)
            .ok_or_else(|| SendError::NoProvider(service.to_string()))?;
        self.send_data(now_ns, provider, addr, message, time_ns, flags)?;
        Ok(provider)
    }

    /// One message to member `provider` at `addr`, best effort or on its reliable stream.
    fn send_data(
        &mut self,
        now_ns: u64,
        provider: u64,
        addr: SocketAddr,
        message: &[u8],
        time_ns: u64,
        flags: u32,
    ) -> Result<(), SendError> {
        let mut data = Data {
            from: self.config.id,
            to: provider,
            seq: 0,
            base: 0,
            flags,
            time_ns,
            payload: message,
        };
        let bytes = if flags & MSG_RELIABLE != 0 {
            let stream = self.out_streams.entry(provider).or_default();
            let seq = stream.next_seq().ok_or(SendError::Backlogged(provider))?;
            data.seq = seq as u32;
            data.base = stream.base() as u32;
            let bytes = Wire::Data(data).encode()?;
            if !stream.sent(now_ns, self.config.retransmit_ns, bytes.clone()) {
                // Queued behind the send window; sent as acknowledgements come back.
                self.stats.sent += 1;
                return Ok(());
            }
            bytes
        } else {
            Wire::Data(data).encode()?
        };
        self.stats.sent += 1;
        self.transmits.push_back(Transmit {
            to: Dest::Peer(addr),
            bytes,
        });
        Ok(())
    }

    /// A message for one of this member's services arrived (or was sent locally).
    fn accept(&mut self, now_ns: u64, from: u64, flags: u32, time_ns: u64, payload: &[u8]) {
        let Ok(m) = Message::decode(payload) else {
            self.stats.rejected += 1;
            return;
        };
        if m.address() == TEMPO {
            // Ensemble state, not a service's message: into the map as it arrives (its
            // own start time says when it takes effect).
            let seg = match (m.arg(0), m.arg(1), m.arg(2), m.arg(3)) {
                (Some(Arg::Long(t)), Some(Arg::Double(b)), Some(Arg::Double(bpm)), Some(Arg::Long(by))) => {
                    Some(TempoSegment {
                        start_ns: t.max(0) as u64,
                        start_beat: b,
                        bpm,
                        by: by as u64,
                    })
                }
                _ => None,
            };
            match seg {
                Some(seg) if seg.is_valid() => self.tempo_in(now_ns, seg),
                _ => self.stats.rejected += 1,
            }
            return;
        }
        let Ok((service, _)) = service_of(m.address()) else {
            self.stats.rejected += 1;
            return;
        };
        if flags & MSG_TAP_COPY == 0 {
            let tappers = self.table.taps_of(service).to_vec();
            for tapper in tappers {
                let mut copy = Vec::new();
                readdress(&m, &tapper, &mut copy);
                let f = (flags & MSG_RELIABLE) | MSG_TAP_COPY;
                if self.send_flags(now_ns, &copy, time_ns, f).is_ok() {
                    self.stats.tap_copies += 1;
                }
            }
        }
        if let Some(tx) = self.audio.get_mut(service) {
            if tx.send(time_ns, payload).is_ok() {
                self.stats.delivered += 1;
            }
            return;
        }
        let ens = self.ensemble_time(now_ns).unwrap_or(0);
        if time_ns > ens && self.segment.is_some() {
            // Held: [from][flags][message], keyed on ensemble time.
            self.scratch.clear();
            self.scratch.extend_from_slice(&from.to_be_bytes());
            self.scratch.extend_from_slice(&flags.to_be_bytes());
            self.scratch.extend_from_slice(payload);
            let held = self
                .scheduler
                .offer(TimeTag(ens.max(2)), TimeTag(time_ns), &self.scratch, |_, _| {});
            if held.is_ok() {
                return;
            }
            self.stats.timed_overflow += 1;
        }
        let service = service.to_string();
        self.deliver(
            service,
            from,
            flags,
            time_ns,
            self.ensemble_time(now_ns),
            payload.to_vec(),
        );
    }

    fn deliver(
        &mut self,
        service: String,
        from: u64,
        flags: u32,
        time_ns: u64,
        at: Option<u64>,
        bytes: Vec<u8>,
    ) {
        self.stats.delivered += 1;
        self.events.push_back(Event::Message(Delivery {
            service,
            from,
            time_ns,
            delivered_ns: at,
            reliable: flags & MSG_RELIABLE != 0,
            tap_copy: flags & MSG_TAP_COPY != 0,
            bytes,
        }));
    }

    fn drain_timed(&mut self, now_ns: u64) {
        let Some(ens) = self.ensemble_time(now_ns) else {
            return;
        };
        let mut due = Vec::new();
        self.scheduler
            .drain_due(TimeTag(ens), |t, b| due.push((t.0, b.to_vec())));
        for (t, b) in due {
            let Some((head, msg)) = b.split_first_chunk::<12>() else {
                continue;
            };
            let mut from = [0u8; 8];
            from.copy_from_slice(&head[..8]);
            let flags = u32::from_be_bytes([head[8], head[9], head[10], head[11]]);
            let service = Message::decode(msg)
                .ok()
                .and_then(|m| service_of(m.address()).ok().map(|(s, _)| s.to_string()))
                .unwrap_or_default();
            self.deliver(
                service,
                u64::from_be_bytes(from),
                flags,
                t,
                Some(ens),
                msg.to_vec(),
            );
        }
    }

    fn hello(&mut self, to: Dest, flags: u32) {
        let synced = if self.segment.is_some() { HELLO_SYNCED } else { 0 };
        if let Ok(bytes) = (Wire::Hello {
            ensemble: &self.config.ensemble,
            id: self.config.id,
            version: self.version,
            flags: flags | synced,
        })
        .encode()
        {
            self.transmits.push_back(Transmit { to, bytes });
        }
    }

    fn query(&mut self, id: u64, addr: SocketAddr) {
        if let Ok(bytes) = (Wire::ServicesQuery {
            from: self.config.id,
            to: id,
        })
        .encode()
        {
            self.transmits.push_back(Transmit {
                to: Dest::Peer(addr),
                bytes,
            });
        }
    }

    fn list(&self) -> ServiceList {
        ServiceList {
            services: self.services.clone(),
            taps: self.taps.clone(),
        }
    }

    fn send_services(&mut self, to: Dest) {
        if let Ok(bytes) = (Wire::Services {
            id: self.config.id,
            version: self.version,
            list: self.list(),
        })
        .encode()
        {
            self.transmits.push_back(Transmit { to, bytes });
        }
    }

    fn services_changed(&mut self) {
        self.version = self.version.wrapping_add(1);
        let list = self.list();
        self.table.set_services(self.config.id, self.version, list);
        self.events.push_back(Event::ServicesChanged);
        // Push the new list to everyone known; the others learn it from the next hello.
        let peers: Vec<SocketAddr> = self.table.members().filter_map(|m| m.addr).collect();
        for a in peers {
            self.send_services(Dest::Peer(a));
        }
        self.next_hello_ns = 0;
    }

    fn drop_member(&mut self, id: u64, timed_out: bool) {
        if let Some(m) = self.table.remove(id) {
            self.out_streams.remove(&id);
            self.in_streams.remove(&id);
            self.events.push_back(Event::MemberLeft {
                id,
                services: m.list.services,
                timed_out,
            });
        }
    }

    /// The reference is the smallest id among members with a valid time (this one
    /// included); see the module docs.
    fn choose_reference(&mut self, now_ns: u64) {
        if self.config.clock_server.is_some() {
            return;
        }
        let me = self.config.id;
        let mine_valid = self.segment.is_some();
        let best = self
            .table
            .members()
            .filter(|m| if m.id == me { mine_valid } else { m.synced })
            .map(|m| m.id)
            .min();
        let current = self.reference();
        let next = match best {
            Some(id) => Some(id),
            None if now_ns >= self.next_alone_ns && self.table.members().any(|m| m.id < me) => {
                // A smaller id will start the time: look again later.
                self.next_alone_ns = now_ns + self.config.hello_interval_ns;
                None
            }
            None if now_ns >= self.next_alone_ns => {
                // Nobody has a time and no smaller id could start one: start it here.
                self.segment = Some(ClockSegment {
                    local_origin_ns: now_ns,
                    ensemble_origin_ns: now_ns,
                    rate: 0.0,
                });
                self.publish();
                Some(me)
            }
            None => None,
        };
        if next == current {
            return;
        }
        self.role = match next {
            None => Role::Unsynced,
            Some(id) if id == me => Role::Reference,
            Some(id) => Role::Following {
                reference: id,
                client: Box::new(ClockClient::new(self.config.clock.clone())),
                locked: false,
            },
        };
        self.events.push_back(Event::ClockReference { id: next });
    }

    /// While following, export the client's time once it has locked.
    fn follow_segment(&mut self) {
        if let Role::Following {
            client,
            reference,
            locked,
        } = &mut self.role
        {
            if let Some(seg) = client.segment() {
                self.segment = Some(seg);
                if !*locked {
                    *locked = true;
                    self.events.push_back(Event::ClockLocked {
                        reference: *reference,
                    });
                }
            }
        }
        self.publish();
    }

    fn publish(&mut self) {
        if self.segment != self.published {
            if let Some(s) = self.segment {
                self.publisher.publish(s);
            }
            self.published = self.segment;
        }
    }
}

/// Local time at which `seg` reaches ensemble time `ens` (rounded up).
fn local_of(seg: &ClockSegment, ens: u64) -> u64 {
    let de = ens as f64 - seg.ensemble_origin_ns as f64;
    let dl = (de / (1.0 + seg.rate)).ceil();
    (seg.local_origin_ns as f64 + dl).max(0.0) as u64
}
