//! The rooms server's sans-IO core: room table, membership, join protocol, forwarding
//! decisions, rate policing and per-destination queue accounting.
//!
//! [`Server`] owns no socket and reads no clock. The I/O shell calls, in a loop:
//! 1. [`Server::handle_datagram`] for every datagram received on the server's one UDP port,
//!    with the time it arrived. For media the answer is a [`Verdict::Forward`] naming the
//!    destinations of the *input buffer*, which the shell sends unchanged to each one and
//!    then hands every [`Dest::id`] back through [`Server::sent`] (sent or dropped, it no
//!    longer occupies that destination's queue). The slice borrows a pre-allocated
//!    scratch vector: copy the destinations out before the next call.
//! 2. [`Server::poll_transmit`] until `None` after each call, to send control replies.
//! 3. [`Server::handle_timeout`] when the time [`Server::poll_timeout`] named has come.
//!
//! The forwarding path (an RTP or RTCP packet from a member) does not allocate, looks the
//! member up by source address in O(1) and costs O(room size). It must never send to an
//! address that has not returned a valid cookie, never forward a packet whose SSRC is not
//! the sender's own, and never let one member's traffic delay or drop another member's
//! packets: each member has its own token bucket, each destination its own bounded queue.
//! Everything dropped is counted, per member where a member is to blame.
//!
//! Replies to addresses that have not proven themselves (a challenge, a refusal of a bad
//! cookie or version, a rebind hint) are never longer than the datagram that caused them,
//! and all but the challenge come out of a small global budget.
//!
//! Names: rooms are known by their name in lowercase ([`fold_name`]): "Friday" and
//! "friday" are one room, shown as its creator spelled it. Within a room no two players
//! (seats with media) share a name, compared the same way. A join naming a player already
//! seated is told apart by address: from that player's IP address it is the same player,
//! restarted after a crash (a second copy of netjam on one machine under one name is no
//! band member either), so it replaces the old seat at once instead of sitting beside its
//! ghost until the timeout, and the old address is sent [`RefuseCode::Replaced`]; from any
//! other address it is someone else and is refused with [`RefuseCode::NameTaken`]. The
//! address is what the server can check without keeping anything on the player's disk; a
//! key kept by the player would also tell apart two people with one name behind one
//! router, who here replace each other once (the replaced one is told, and stops). A
//! rename to a name another player of the room has is ignored.
//!
//! Direct paths: when a member joins (and when it takes its seat back from a new address)
//! the server pairs it with every other member of its room — `/netjam/peer` both ways, with
//! a fresh token per pair, reliable and ordered like roster events. A member's
//! `/netjam/route` names the members it reaches directly; the forwarding path skips their
//! copies of its media (counted as `direct_skipped`) until a newer list leaves them out.
//!
//! Ensembles (the room is the ensemble): a member's `/netjam/ens` carries one ensemble
//! datagram, to one member of its room or to every member of it that speaks ensemble
//! (has sent `/netjam/ens` itself); the server re-addresses it with the sender's member id
//! and queues it like a control reply. The ensemble's clock probes (`/_clock/ping`) from
//! a member come back as [`Verdict::ClockProbe`]: the shell answers them with its own
//! clock, so the server is the room's one clock reference, the one place every member
//! reaches. A join that declares a media rate of zero takes a seat without media (an
//! ensemble member that plays no audio, e.g. `netjam ensemble join --server`): no media is
//! forwarded to or from it, it is in no roster and paired with nobody, and its control
//! and ensemble traffic is policed at [`ServerConfig::ensemble_packets_per_s`].
//!
//! Rooms across servers ([`ServerConfig::directory`]): a join for a room this server does
//! not host is held while the shell asks the shared room directory where it lives
//! ([`Server::poll_directory`] gives [`DirectoryRequest::Locate`]; the answer comes back
//! through [`Server::placed`]). [`Placement::Here`] (this server claimed it) lets the held
//! joins in; [`Placement::Elsewhere`] answers them with `/netjam/redirect`;
//! [`Placement::Unavailable`] refuses them ([`RefuseCode::DirectoryUnavailable`]). A room
//! that empties, or a claim no join used, comes back as [`DirectoryRequest::Vacate`]. The
//! core never waits for the directory: held joins are bytes in a bounded table, and rooms
//! already open here never ask it anything.
//!
//! STUN Binding requests (RFC 8489) on the same port are answered with the address the
//! request came from (XOR-MAPPED-ADDRESS), so a player learns the public address and port
//! its router gave the socket its audio uses. Anyone may ask, so an answer comes out of
//! the same global budget and is never more than 12 bytes longer than its request (an
//! IPv4 answer to a bare 20-byte request; an IPv6 answer needs a request of 32 bytes,
//! which netjam's clients send).

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::net::SocketAddr;

use super::msg::{
    decode_addrs, encode_addrs, fold_name, valid_name, Control, Join, PeerInfo, RefuseCode, Rejoin, Rekey,
    RekeyStatus, Roster, RosterKind, Welcome, CHALLENGE_LEN, CLOCK_PING_PREFIX, ENS_EVERYONE, MAX_ADDRS_LEN,
    MAX_CONTROL_LEN, MAX_ENS_LEN, MAX_HOSTS, MAX_LISTED, NONCE_LEN, PAIR_TOKEN_LEN, ROOM_KEY_LEN, TOKEN_LEN,
};
use super::secure::{self, SecureServer, SecureStats, StaticKey};
use super::{auth, Demux};
use crate::nat::stun;

/// Limits and timers of a [`Server`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerConfig {
    /// Most members with media (players) in one room.
    pub max_members_per_room: usize,
    /// Most seats without media (ensemble members) in one room, besides its players: a
    /// band whose every player also runs an ensemble member still fits.
    pub max_ensemble_seats_per_room: usize,
    /// Most members on the server.
    pub max_members: usize,
    /// Most rooms on the server.
    pub max_rooms: usize,
    /// How often members send `/netjam/keepalive` (told in the welcome).
    pub keepalive_ms: u32,
    /// Silence after which a member is dropped and the others told `timeout`.
    pub timeout_ms: u32,
    /// Highest declared packet rate admitted.
    pub max_packets_per_s: u32,
    /// Highest declared byte rate admitted.
    pub max_bytes_per_s: u32,
    /// A member's token bucket refills at its declared rate times this.
    pub rate_headroom: f64,
    /// Packets a member may send back to back above its rate, at least.
    pub burst_packets: u32,
    /// The burst also covers this much of the member's declared rate (ms): a player whose
    /// computer held its audio for a moment sends it late in one go, and that catch-up must
    /// pass, while a flood (many times the rate, for longer) does not.
    pub burst_ms: u32,
    /// Packets handed to the shell for one destination and not yet returned through
    /// [`Server::sent`]; more are dropped and counted against that destination.
    pub dest_queue: u32,
    /// First roster retransmission timeout; doubles up to `retransmit_max_ns`.
    pub retransmit_initial_ns: u64,
    /// Longest roster retransmission timeout.
    pub retransmit_max_ns: u64,
    /// Roster events in flight to one member at a time.
    pub roster_window: u32,
    /// Unacknowledged roster events one member may accumulate before it is dropped.
    pub roster_backlog: usize,
    /// Replies per second to addresses that have not proven themselves (refusals of bad
    /// cookies and versions, rebind hints), with a burst of as many.
    pub unproven_replies_per_s: u32,
    /// Control replies waiting for [`Server::poll_transmit`]; more are dropped and counted.
    pub transmit_queue: usize,
    /// The rate a seat without media (declared rate zero: an ensemble member) is policed
    /// at: packets per second.
    pub ensemble_packets_per_s: u32,
    /// The same in bytes per second.
    pub ensemble_bytes_per_s: u32,
    /// Rooms are shared with other servers through a room directory: a join for a room not
    /// open here waits for [`Server::placed`] (see the module docs).
    pub directory: bool,
    /// This server's region label, named with its public rooms (`/netjam/listed`).
    pub region: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_members_per_room: super::ROOM_SEATS,
            max_ensemble_seats_per_room: 32,
            max_members: 4096,
            max_rooms: 1024,
            keepalive_ms: 1000,
            timeout_ms: 5000,
            max_packets_per_s: 4000,
            max_bytes_per_s: 8_000_000,
            rate_headroom: 1.5,
            burst_packets: 20,
            burst_ms: 100,
            dest_queue: 256,
            retransmit_initial_ns: 100_000_000,
            retransmit_max_ns: 1_000_000_000,
            roster_window: 8,
            roster_backlog: 256,
            unproven_replies_per_s: 200,
            transmit_queue: 8192,
            ensemble_packets_per_s: 400,
            ensemble_bytes_per_s: 400_000,
            directory: false,
            region: String::new(),
        }
    }
}

/// Where the shared room directory puts a room: the shell's answer to
/// [`DirectoryRequest::Locate`], given to [`Server::placed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// This server holds the claim: it may open the room.
    Here,
    /// Another server hosts it (`host:port`, as that server advertises itself).
    Elsewhere(String),
    /// The directory did not answer: no new room can be opened now.
    Unavailable,
    /// Not an answer to a [`DirectoryRequest::Locate`]: another server (`host:port`) took
    /// the claim on a room playing here (this server's lease ran out while it was cut off
    /// from the directory, or stalled). Its members are sent there (see [`Server::placed`]).
    Moved(String),
}

/// What the core asks of the room directory ([`Server::poll_directory`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectoryRequest {
    /// A join came for this room, which is not open here: where does it live? Claim it
    /// for this server if nobody holds it, and answer with [`Server::placed`].
    Locate(String),
    /// This server no longer hosts the room (its last member left, or a claim went
    /// unused): release the claim.
    Vacate(String),
    /// A public room here now has this many players (0: it is no longer listed): publish
    /// it for the other servers' lists.
    Listed {
        /// The room.
        room: String,
        /// Its players.
        members: u32,
    },
}

/// One public room, as the directory lists it ([`Server::set_listing`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ListedRoom {
    /// The room's name.
    pub room: String,
    /// The server it lives on (`host:port`).
    pub server: String,
    /// Its players.
    pub members: u32,
    /// That server's region label.
    pub region: String,
}

/// How long a join waits for the directory before it is dropped (the client retries).
pub const LOCATE_WAIT_NS: u64 = 2_000_000_000;
/// How long a claim may stay unused (no join opened the room) before it is given back.
pub const CLAIM_UNUSED_NS: u64 = 10_000_000_000;
/// Joins held for one room while the directory is asked; more are dropped (retried).
const LOCATE_JOINS: usize = 16;
/// Rooms being located at once; joins for more are dropped (retried).
const LOCATE_ROOMS: usize = 256;

/// Joins held while the directory is asked where their room lives.
#[derive(Debug)]
struct Locating {
    since: u64,
    /// Source and the join's bytes, replayed when the room turns out to be ours.
    joins: Vec<(SocketAddr, Vec<u8>)>,
}

/// Identifies a destination's queue; give it back through [`Server::sent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestId {
    slot: u32,
    gen: u32,
}

/// Where to send a forwarded packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dest {
    /// The member's current address.
    pub addr: SocketAddr,
    /// Its queue, to return through [`Server::sent`] once sent or dropped.
    pub id: DestId,
}

/// Why [`Server::handle_datagram`] dropped a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Neither OSC nor RTP/RTCP.
    Junk,
    /// An OSC bundle (the protocol uses none).
    Bundle,
    /// OSC that is not a valid control message, or one the server does not take here.
    BadControl,
    /// Media from an address that is not a member.
    UnknownSource,
    /// Media from a member carrying another SSRC than its own.
    ForgedSsrc,
    /// RTP/RTCP too short or with a broken RTCP compound.
    Malformed,
    /// Over the member's rate.
    Policed,
    /// A STUN message that is not a Binding request this server answers.
    Stun,
}

/// What became of a datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict<'a> {
    /// Send the datagram's bytes, unchanged, to each destination (possibly none).
    Forward(&'a [Dest]),
    /// A control message, consumed; replies (if any) wait in [`Server::poll_transmit`].
    Control,
    /// An ensemble clock probe (`/_clock/ping`) from a member: the shell answers it to
    /// its source with its own clock (the room's reference), at once.
    ClockProbe,
    /// Dropped and counted.
    Drop(DropReason),
}

/// Server-wide counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ServerStats {
    /// Datagrams neither OSC nor RTP/RTCP.
    pub junk: u64,
    /// OSC bundles.
    pub bundles: u64,
    /// Malformed or misdirected control messages.
    pub bad_control: u64,
    /// Media from non-members.
    pub unknown_source: u64,
    /// Hellos shorter than the challenge they ask for.
    pub short_hellos: u64,
    /// Challenges sent.
    pub challenges: u64,
    /// Joins that got a seat.
    pub joins: u64,
    /// Rejoins that kept a seat.
    pub rejoins: u64,
    /// Refusals sent.
    pub refused: u64,
    /// Joins refused because another player in the room had the name
    /// ([`RefuseCode::NameTaken`]).
    pub names_taken: u64,
    /// Seats given up to a new join of their name from their IP address (a restarted
    /// player replacing its ghost).
    pub replaced: u64,
    /// Joins and rejoins whose cookie was not valid for their source.
    pub bad_cookies: u64,
    /// Rebind hints sent.
    pub rebind_hints: u64,
    /// Replies to unproven addresses not sent because the budget was spent, the reply
    /// would have been longer than its cause, or (a rebind hint) the address was sent one
    /// a moment ago.
    pub unproven_suppressed: u64,
    /// Control replies dropped because the transmit queue was full.
    pub transmit_drops: u64,
    /// Members dropped for silence.
    pub timeouts: u64,
    /// Members that left.
    pub leaves: u64,
    /// Members now.
    pub members: u64,
    /// Rooms now.
    pub rooms: u64,
    /// STUN Binding requests answered with the address they came from.
    pub stun_answered: u64,
    /// STUN Binding requests not answered: over the unproven-reply budget, or an answer
    /// that would have been more than [`STUN_GROWTH`] bytes longer than the request.
    pub stun_suppressed: u64,
    /// STUN messages that are not a Binding request this server answers (responses,
    /// indications, unknown comprehension-required attributes), dropped.
    pub stun_dropped: u64,
    /// Password changes taken (`/netjam/rekey` for a room's next epoch).
    pub rekeys: u64,
    /// `/netjam/rekey` answered with anything but [`RekeyStatus::Done`]: proven by neither
    /// of the room's last two keys (altered, or a password two changes old), offering
    /// another key than the room's, or for another epoch.
    pub rekeys_refused: u64,
    /// Ensemble datagrams (`/netjam/ens`) queued to a member (one per destination).
    pub ens_relayed: u64,
    /// `/netjam/ens` for a member that is not in the sender's room or speaks no ensemble.
    pub ens_undeliverable: u64,
    /// Ensemble clock probes handed to the shell to answer.
    pub clock_probes: u64,
    /// Joins answered with `/netjam/redirect` (the room lives on another server), and
    /// seated members sent away with one.
    pub redirects: u64,
    /// Of those, members whose room another server claimed while it played here
    /// ([`Placement::Moved`]).
    pub moved_members: u64,
    /// Rooms asked of the room directory.
    pub locates: u64,
    /// Joins dropped unanswered because the directory had not answered in time, or too
    /// many waited (the client retries).
    pub locate_drops: u64,
    /// `/netjam/list` queries answered.
    pub lists: u64,
    /// Control messages that came in clear to a server whose control travels sealed
    /// ([`Server::set_static_key`]): anything but a hello, a list or an ensemble relay.
    pub clear_control: u64,
}

/// How many bytes longer than its request a STUN answer may be (an IPv4
/// XOR-MAPPED-ADDRESS attribute): the most an unproven source can amplify through it.
pub const STUN_GROWTH: usize = 12;

/// One member's counters, as [`Server::member_stats`] reports them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberStats {
    /// Member id.
    pub member_id: u32,
    /// Name.
    pub name: String,
    /// Room name.
    pub room: String,
    /// Current address.
    pub addr: SocketAddr,
    /// Assigned SSRC.
    pub ssrc: u32,
    /// Datagrams received from the member (media and control).
    pub packets_in: u64,
    /// Bytes received from the member.
    pub bytes_in: u64,
    /// Media packets of this member forwarded (once each, whatever the fan-out).
    pub forwarded: u64,
    /// Packets of this member dropped for exceeding its rate.
    pub policed_drops: u64,
    /// Packets from this member's address with another SSRC, dropped.
    pub forged_drops: u64,
    /// Malformed media from this member, dropped.
    pub malformed_drops: u64,
    /// Packets handed to the shell for this member as a destination.
    pub sent_to: u64,
    /// Packets for this member as a destination dropped because its queue was full.
    pub queue_drops: u64,
    /// Copies of this member's media not forwarded because it reaches that member
    /// directly (`/netjam/route`).
    pub direct_skipped: u64,
    /// The members this member says it reaches directly.
    pub direct_to: Vec<u32>,
}

/// A fast hasher for socket addresses (the map holds only proven members, so hash
/// flooding would need thousands of authenticated members).
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
}

type AddrMap<V> = HashMap<SocketAddr, V, BuildHasherDefault<AddrHasher>>;

/// Rebind hints remembered (by address hash), so that an address streaming media at a
/// server that no longer knows it (restarted, or it stalled past the timeout) gets one
/// hint per [`HINT_GAP_NS`], not one per packet: a room of players at 750 packets a second
/// would otherwise spend the whole budget for unproven addresses on hints, and leave none
/// for the handshakes that seat them again. A fixed table: a collision costs one more
/// hint, never memory.
const HINT_SLOTS: usize = 256;
/// The least time between two rebind hints to one address (a client asks again within
/// its first retry, 250 ms).
const HINT_GAP_NS: u64 = 200_000_000;

/// When each recent rebind hint went, and where.
#[derive(Debug)]
struct HintTable {
    slots: Box<[(Option<SocketAddr>, u64)]>,
}

impl HintTable {
    fn new() -> Self {
        Self {
            slots: vec![(None, 0); HINT_SLOTS].into_boxed_slice(),
        }
    }

    fn slot(&mut self, dst: SocketAddr) -> &mut (Option<SocketAddr>, u64) {
        let mut h = AddrHasher::default();
        dst.hash(&mut h);
        &mut self.slots[(h.finish() >> 32) as usize % HINT_SLOTS]
    }

    /// Whether `dst` may be sent a hint at `now`.
    fn due(&mut self, now: u64, dst: SocketAddr) -> bool {
        let slot = self.slot(dst);
        slot.0 != Some(dst) || now >= slot.1.saturating_add(HINT_GAP_NS)
    }

    /// A hint went to `dst` at `now`.
    fn sent(&mut self, now: u64, dst: SocketAddr) {
        *self.slot(dst) = (Some(dst), now);
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    pkt_per_ns: f64,
    byte_per_ns: f64,
    pkt_cap: f64,
    byte_cap: f64,
    pkts: f64,
    bytes: f64,
    last: u64,
}

impl Bucket {
    fn new(cfg: &ServerConfig, pps: u32, bps: u32, now: u64) -> Self {
        let h = cfg.rate_headroom.max(1.0);
        let avg = f64::from(bps) / f64::from(pps.max(1));
        let pkt_cap = f64::from(cfg.burst_packets.max(1)).max(f64::from(pps) * f64::from(cfg.burst_ms) / 1e3);
        let byte_cap = (pkt_cap * avg * h).max(2.0 * 9_000.0);
        Self {
            pkt_per_ns: f64::from(pps) * h / 1e9,
            byte_per_ns: f64::from(bps) * h / 1e9,
            pkt_cap,
            byte_cap,
            pkts: pkt_cap,
            bytes: byte_cap,
            last: now,
        }
    }

    #[inline]
    fn take(&mut self, now: u64, len: usize) -> bool {
        let dt = now.saturating_sub(self.last) as f64;
        self.last = self.last.max(now);
        self.pkts = (self.pkts + dt * self.pkt_per_ns).min(self.pkt_cap);
        self.bytes = (self.bytes + dt * self.byte_per_ns).min(self.byte_cap);
        let len = len as f64;
        if self.pkts >= 1.0 && self.bytes >= len {
            self.pkts -= 1.0;
            self.bytes -= len;
            true
        } else {
            false
        }
    }
}

#[derive(Debug, Clone)]
struct OutEvent {
    seq: u32,
    body: OutBody,
}

/// What a reliable event to a member says.
#[derive(Debug, Clone)]
enum OutBody {
    /// `/netjam/roster`.
    Roster {
        kind: RosterKind,
        member_id: u32,
        name: String,
        ssrc: u32,
    },
    /// `/netjam/epoch`.
    Epoch { epoch: u32, by: u32 },
    /// `/netjam/peer`.
    Peer {
        member_id: u32,
        observed: SocketAddr,
        hosts: [Option<SocketAddr>; MAX_HOSTS],
        token: [u8; PAIR_TOKEN_LEN],
    },
}

#[derive(Debug)]
struct Member {
    id: u32,
    room: usize,
    addr: SocketAddr,
    name: String,
    ssrc: u32,
    token: [u8; TOKEN_LEN],
    bucket: Bucket,
    last_heard: u64,
    inflight: u32,
    outbox: VecDeque<OutEvent>,
    next_seq: u32,
    /// Highest seq sent at least once.
    sent_upto: u32,
    rto: u64,
    retransmit_at: Option<u64>,
    evict: bool,
    stats: Counters,
    /// The host addresses it declared.
    hosts: [Option<SocketAddr>; MAX_HOSTS],
    /// Member ids it reaches directly: its media is not forwarded to them.
    direct: Vec<u32>,
    /// The newest `/netjam/route` applied.
    route_seq: u32,
    /// It declared a media rate (a seat without media carries only ensemble traffic).
    media: bool,
    /// The sample rate it declared, Hz (0: not said).
    sample_rate: u32,
    /// It has sent `/netjam/ens`: ensemble datagrams are relayed to it.
    ens: bool,
    /// The client nonce of the join that gave the seat: a join from the seat's address
    /// with this nonce is a retry (its welcome was lost), with another a restart.
    join_nonce: [u8; NONCE_LEN],
}

#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    packets_in: u64,
    bytes_in: u64,
    forwarded: u64,
    policed: u64,
    forged: u64,
    malformed: u64,
    sent_to: u64,
    queue_drops: u64,
    direct_skipped: u64,
}

#[derive(Debug)]
struct Room {
    /// As its creator spelled it.
    name: String,
    /// [`fold_name`] of it: how the room table, claims and the directory know it.
    folded: String,
    key: [u8; ROOM_KEY_LEN],
    /// The media epoch: how many times a member changed the password since the room
    /// was created here.
    epoch: u32,
    /// The key before the last change: a member who takes the new password proves the
    /// request with it.
    prev_key: Option<[u8; ROOM_KEY_LEN]>,
    members: Vec<u32>,
    /// Listed publicly (a member asked, `/netjam/public`).
    public: bool,
}

/// The rooms server's state machine. See the module docs for the calling loop.
#[derive(Debug)]
pub struct Server {
    cfg: ServerConfig,
    secret: [u8; 32],
    slots: Vec<Option<Member>>,
    gens: Vec<u32>,
    free_slots: Vec<u32>,
    by_addr: AddrMap<u32>,
    by_id: HashMap<u32, u32>,
    rooms: Vec<Option<Room>>,
    free_rooms: Vec<usize>,
    room_by_name: HashMap<String, usize>,
    /// Rooms this server claimed in the directory and has not opened yet, with when the
    /// claim is given back if no join opens it.
    claimed: HashMap<String, u64>,
    locating: HashMap<String, Locating>,
    directory_out: VecDeque<DirectoryRequest>,
    /// Every server's public rooms, as the directory last said (with a directory).
    listing: Vec<ListedRoom>,
    scratch: Vec<Dest>,
    transmit: VecDeque<(SocketAddr, Vec<u8>)>,
    next_member_id: u32,
    serial: u64,
    next_wake: u64,
    unproven_tokens: f64,
    unproven_last: u64,
    hints: HintTable,
    stats: ServerStats,
    /// The control channel, once the server has a static key.
    secure: Option<SecureServer>,
}

/// What an RTP/RTCP packet's sender SSRC check found.
enum SsrcCheck {
    Own,
    Foreign,
    Malformed,
}

/// Checks that every sender SSRC in `b` is `ssrc`: the RTP header's SSRC, or the SSRC
/// after the header of each packet of an RTCP compound. `rtcp` is what [`super::demux`]
/// found (RTP and RTCP told apart as every receiver does, RFC 5761); an RTCP compound holds
/// only the packet types in use (200..=207), so a second byte elsewhere in RFC 5761's
/// range (192..=223) is neither, and malformed.
#[inline]
fn check_ssrc(b: &[u8], rtcp: bool, ssrc: u32) -> SsrcCheck {
    let be32 = |at: usize| {
        b.get(at..at + 4)
            .map(|w| u32::from_be_bytes([w[0], w[1], w[2], w[3]]))
    };
    if !rtcp {
        if b.len() < 12 {
            return SsrcCheck::Malformed;
        }
        return match be32(8) {
            Some(s) if s == ssrc => SsrcCheck::Own,
            Some(_) => SsrcCheck::Foreign,
            None => SsrcCheck::Malformed,
        };
    }
    let mut at = 0usize;
    let mut n = 0;
    while at < b.len() {
        let (Some(&v), Some(&pt), Some(words)) =
            (b.get(at), b.get(at + 1), be32(at).map(|w| (w & 0xffff) as usize))
        else {
            return SsrcCheck::Malformed;
        };
        if v >> 6 != 2 || !(200..=207).contains(&pt) {
            return SsrcCheck::Malformed;
        }
        match be32(at + 4) {
            Some(s) if s == ssrc => {}
            Some(_) => return SsrcCheck::Foreign,
            None => return SsrcCheck::Malformed,
        }
        at += 4 * (words + 1);
        n += 1;
    }
    if at != b.len() || n == 0 {
        return SsrcCheck::Malformed;
    }
    SsrcCheck::Own
}

impl Server {
    /// A server with `secret` as the key of its cookies and tokens (32 random bytes chosen
    /// by the caller; tests pass fixed ones).
    pub fn new(config: ServerConfig, secret: [u8; 32]) -> Self {
        let cap = config.max_members_per_room;
        let burst = f64::from(config.unproven_replies_per_s);
        Self {
            scratch: Vec::with_capacity(cap),
            by_addr: AddrMap::with_capacity_and_hasher(config.max_members.min(65_536), Default::default()),
            cfg: config,
            secret,
            slots: Vec::new(),
            gens: Vec::new(),
            free_slots: Vec::new(),
            by_id: HashMap::new(),
            rooms: Vec::new(),
            free_rooms: Vec::new(),
            room_by_name: HashMap::new(),
            claimed: HashMap::new(),
            locating: HashMap::new(),
            directory_out: VecDeque::new(),
            listing: Vec::new(),
            transmit: VecDeque::new(),
            next_member_id: 1,
            serial: 0,
            next_wake: u64::MAX,
            unproven_tokens: burst,
            unproven_last: 0,
            hints: HintTable::new(),
            stats: ServerStats::default(),
            secure: None,
        }
    }

    /// Gives the server its static key: from now on a player's control travels in the
    /// Noise channel ([`secure`]) and what comes in clear is refused (counted as
    /// [`ServerStats::clear_control`]), but for what must come before the channel or has
    /// no member behind it: a hello, its challenge, `/netjam/list`, STUN, and ensemble
    /// datagrams (sealed by the ensemble's own secret, which the server does not hold).
    pub fn set_static_key(&mut self, key: StaticKey) {
        let most = self.cfg.max_members.saturating_mul(2).max(64);
        self.secure = Some(SecureServer::new(key, most));
    }

    /// The public half of the static key, when the server has one.
    pub fn public_key(&self) -> Option<[u8; secure::KEY_LEN]> {
        self.secure.as_ref().map(|s| *s.public())
    }

    /// What the control channel did, when the server has one.
    pub fn secure_stats(&self) -> Option<SecureStats> {
        self.secure.as_ref().map(SecureServer::stats)
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// Takes one datagram received at `now_ns` from `src`. Media from a member comes back
    /// as [`Verdict::Forward`]; control is answered through [`Server::poll_transmit`].
    ///
    /// Sorted once by [`super::demux`]: `/` is an OSC control message, `#` an OSC bundle
    /// (dropped), RTP or RTCP (version 2, told apart as every receiver does), `0x00`/`0x01`
    /// with the magic cookie STUN, anything else junk.
    #[inline]
    pub fn handle_datagram(&mut self, now_ns: u64, src: SocketAddr, bytes: &[u8]) -> Verdict<'_> {
        match super::demux(bytes) {
            Demux::Rtp => self.media(now_ns, src, false, bytes),
            Demux::Rtcp => self.media(now_ns, src, true, bytes),
            Demux::Control if bytes.starts_with(CLOCK_PING_PREFIX) => {
                self.clock_probe(now_ns, src, bytes.len())
            }
            Demux::Control => self.control(now_ns, src, bytes),
            Demux::Stun => self.stun(now_ns, src, bytes),
            Demux::Bundle => {
                self.stats.bundles += 1;
                Verdict::Drop(DropReason::Bundle)
            }
            Demux::Junk => {
                self.stats.junk += 1;
                Verdict::Drop(DropReason::Junk)
            }
        }
    }

    /// Returns a destination's queue slot: the shell sent (or gave up on) one packet the
    /// server handed it for `id`. Ids of members that have gone are ignored.
    #[inline]
    pub fn sent(&mut self, id: DestId) {
        if self.gens.get(id.slot as usize) == Some(&id.gen) {
            if let Some(Some(m)) = self.slots.get_mut(id.slot as usize) {
                m.inflight = m.inflight.saturating_sub(1);
            }
        }
    }

    /// Answers a STUN Binding request with the address it came from, within the
    /// unproven-reply budget and never more than [`STUN_GROWTH`] bytes longer than it.
    fn stun(&mut self, now: u64, src: SocketAddr, bytes: &[u8]) -> Verdict<'static> {
        let Ok(txid) = stun::parse_binding_request(bytes) else {
            self.stats.stun_dropped += 1;
            return Verdict::Drop(DropReason::Stun);
        };
        let mut buf = [0u8; stun::MAX_SUCCESS_LEN];
        let Ok(n) = stun::write_binding_success(&txid, src, &mut buf) else {
            self.stats.stun_dropped += 1;
            return Verdict::Drop(DropReason::Stun);
        };
        if n > bytes.len() + STUN_GROWTH || !self.unproven_budget(now) {
            self.stats.stun_suppressed += 1;
            return Verdict::Control;
        }
        self.stats.stun_answered += 1;
        self.queue_clear(src, buf[..n].to_vec());
        Verdict::Control
    }

    /// A clock probe: answered (by the shell) only to members, within their rate, so an
    /// unproven source can never make the server send its longer answer.
    fn clock_probe(&mut self, now: u64, src: SocketAddr, len: usize) -> Verdict<'static> {
        let Some(Some(m)) = self
            .by_addr
            .get(&src)
            .and_then(|&s| self.slots.get_mut(s as usize))
        else {
            self.stats.unknown_source += 1;
            return Verdict::Drop(DropReason::UnknownSource);
        };
        m.last_heard = now;
        m.stats.packets_in += 1;
        m.stats.bytes_in += len as u64;
        if !m.bucket.take(now, len) {
            m.stats.policed += 1;
            return Verdict::Drop(DropReason::Policed);
        }
        self.stats.clock_probes += 1;
        Verdict::ClockProbe
    }

    /// Relays one ensemble datagram from the member in `slot` to `to` (or to every other
    /// ensemble member of its room), re-addressed with the sender's id.
    fn ens(&mut self, slot: u32, to: u32, payload: &[u8]) {
        let Some(m) = self.slots.get_mut(slot as usize).and_then(Option::as_mut) else {
            return;
        };
        m.ens = true;
        let (from, room) = (m.id, m.room);
        let mut buf = vec![0u8; MAX_ENS_LEN];
        let Ok(n) = (Control::Ens {
            member_id: from,
            payload,
        })
        .encode(&mut buf) else {
            self.stats.transmit_drops += 1;
            return;
        };
        buf.truncate(n);
        let dests: Vec<SocketAddr> = match self.rooms.get(room) {
            Some(Some(r)) => r
                .members
                .iter()
                .filter(|&&o| o != slot)
                .filter_map(|&o| self.slots.get(o as usize).and_then(Option::as_ref))
                .filter(|o| o.ens && (to == ENS_EVERYONE || o.id == to))
                .map(|o| o.addr)
                .collect(),
            _ => Vec::new(),
        };
        if dests.is_empty() && to != ENS_EVERYONE {
            self.stats.ens_undeliverable += 1;
        }
        for d in dests {
            self.stats.ens_relayed += 1;
            self.queue_clear(d, buf.clone());
        }
    }

    fn media(&mut self, now: u64, src: SocketAddr, rtcp: bool, bytes: &[u8]) -> Verdict<'_> {
        let Some(&slot) = self.by_addr.get(&src) else {
            self.stats.unknown_source += 1;
            self.rebind_hint(now, src, bytes.len());
            return Verdict::Drop(DropReason::UnknownSource);
        };
        let Some(Some(m)) = self.slots.get_mut(slot as usize) else {
            return Verdict::Drop(DropReason::UnknownSource);
        };
        m.last_heard = now;
        m.stats.packets_in += 1;
        m.stats.bytes_in += bytes.len() as u64;
        if !m.media {
            // It declared a media rate of zero.
            m.stats.policed += 1;
            return Verdict::Drop(DropReason::Policed);
        }
        match check_ssrc(bytes, rtcp, m.ssrc) {
            SsrcCheck::Own => {}
            SsrcCheck::Foreign => {
                m.stats.forged += 1;
                return Verdict::Drop(DropReason::ForgedSsrc);
            }
            SsrcCheck::Malformed => {
                m.stats.malformed += 1;
                return Verdict::Drop(DropReason::Malformed);
            }
        }
        if !m.bucket.take(now, bytes.len()) {
            m.stats.policed += 1;
            return Verdict::Drop(DropReason::Policed);
        }
        m.stats.forwarded += 1;
        let room = m.room;
        // Moved out and back (no allocation) so the loop can borrow the other slots.
        let direct = std::mem::take(&mut m.direct);
        let mut skipped = 0u64;
        self.scratch.clear();
        let cap = self.cfg.dest_queue;
        if let Some(Some(r)) = self.rooms.get(room) {
            for &other in &r.members {
                if other == slot {
                    continue;
                }
                let gen = self.gens.get(other as usize).copied().unwrap_or(0);
                if let Some(Some(o)) = self.slots.get_mut(other as usize) {
                    if !o.media {
                        continue;
                    }
                    if direct.contains(&o.id) {
                        skipped += 1;
                        continue;
                    }
                    if o.inflight >= cap {
                        o.stats.queue_drops += 1;
                        continue;
                    }
                    o.inflight += 1;
                    o.stats.sent_to += 1;
                    // Capacity is the room cap, so this never reallocates.
                    self.scratch.push(Dest {
                        addr: o.addr,
                        id: DestId { slot: other, gen },
                    });
                }
            }
        }
        if let Some(Some(m)) = self.slots.get_mut(slot as usize) {
            m.direct = direct;
            m.stats.direct_skipped += skipped;
        }
        Verdict::Forward(&self.scratch)
    }

    /// A control datagram: a handshake or a sealed message when the server has a key,
    /// otherwise (or for what may come in clear) the message itself.
    fn control(&mut self, now: u64, src: SocketAddr, bytes: &[u8]) -> Verdict<'static> {
        let Some(sec) = self.secure.as_mut() else {
            return self.control_plain(now, src, bytes, true);
        };
        if secure::is_handshake(bytes) {
            return self.handshake(now, src, bytes);
        }
        if !secure::is_sealed(bytes) {
            return self.control_plain(now, src, bytes, false);
        }
        let mut plain = [0u8; MAX_ENS_LEN];
        match sec.open(now, src, bytes, &mut plain) {
            Ok(p) => {
                let n = p.len();
                self.control_plain(now, src, &plain[..n], true)
            }
            Err(secure::SecureError::NoSession) => {
                // A player that had a session at another address (its router remapped
                // it) or with a server that restarted: it says hello again.
                self.rebind_hint(now, src, bytes.len());
                Verdict::Drop(DropReason::UnknownSource)
            }
            Err(_) => Verdict::Drop(DropReason::BadControl),
        }
    }

    /// The first message of a Noise handshake: answered (in clear) when its cookie is
    /// valid for its source. A member's handshakes count against its rate; anyone else's
    /// come out of the global budget for unproven addresses, after the cookie check, so
    /// a forged source costs a hash and never an answer.
    fn handshake(&mut self, now: u64, src: SocketAddr, bytes: &[u8]) -> Verdict<'static> {
        if let Some(&slot) = self.by_addr.get(&src) {
            if let Some(Some(m)) = self.slots.get_mut(slot as usize) {
                m.stats.packets_in += 1;
                m.stats.bytes_in += bytes.len() as u64;
                if !m.bucket.take(now, bytes.len()) {
                    m.stats.policed += 1;
                    return Verdict::Drop(DropReason::Policed);
                }
            }
        }
        let Some(mut sec) = self.secure.take() else {
            return Verdict::Drop(DropReason::BadControl);
        };
        let member = self.by_addr.contains_key(&src);
        let secret = self.secret;
        let mut over_budget = false;
        let mut out = [0u8; MAX_CONTROL_LEN];
        let answer = sec.accept(
            now,
            src,
            bytes,
            |cookie| {
                if !auth::cookie_valid(&secret, src, now, cookie) {
                    return false;
                }
                over_budget = !member && !self.unproven_budget(now);
                !over_budget
            },
            &mut out,
        );
        self.secure = Some(sec);
        if over_budget {
            self.stats.unproven_suppressed += 1;
        }
        match answer {
            Ok(n) => {
                self.queue_clear(src, out[..n].to_vec());
                Verdict::Control
            }
            Err(_) => Verdict::Drop(DropReason::BadControl),
        }
    }

    /// One control message, opened from the channel or as it came. `trusted`: it came
    /// sealed, or the server has no channel; otherwise only what may come in clear is
    /// taken.
    fn control_plain(&mut self, now: u64, src: SocketAddr, bytes: &[u8], trusted: bool) -> Verdict<'static> {
        let msg = match Control::decode(bytes) {
            Ok(m) => m,
            Err(super::msg::ControlError::Version(_)) => {
                self.stats.bad_control += 1;
                self.unproven_reply(
                    now,
                    src,
                    bytes.len(),
                    &Control::Refused {
                        code: RefuseCode::BadVersion as i32,
                        text: RefuseCode::BadVersion.text(),
                    },
                );
                return Verdict::Drop(DropReason::BadControl);
            }
            Err(_) => {
                self.stats.bad_control += 1;
                return Verdict::Drop(DropReason::BadControl);
            }
        };
        if !trusted
            && !matches!(
                msg,
                Control::Hello { .. } | Control::List { .. } | Control::Ens { .. }
            )
        {
            self.stats.clear_control += 1;
            return Verdict::Drop(DropReason::BadControl);
        }
        let member = self.by_addr.get(&src).copied();
        if let Some(slot) = member {
            let Some(Some(m)) = self.slots.get_mut(slot as usize) else {
                return Verdict::Drop(DropReason::BadControl);
            };
            m.last_heard = now;
            m.stats.packets_in += 1;
            m.stats.bytes_in += bytes.len() as u64;
            // Control counts against the member's rate too (a rename flood would fan out).
            if !m.bucket.take(now, bytes.len()) {
                m.stats.policed += 1;
                return Verdict::Drop(DropReason::Policed);
            }
        }
        match (msg, member) {
            (Control::Hello { .. }, _) => {
                if bytes.len() < CHALLENGE_LEN {
                    self.stats.short_hellos += 1;
                    return Verdict::Drop(DropReason::BadControl);
                }
                let cookie = auth::cookie(&self.secret, src, auth::slot(now));
                let nonce = auth::server_nonce(&self.secret, &cookie);
                self.stats.challenges += 1;
                // In clear: a player says hello when it has no session (a first hello,
                // a new address, a server that forgot it).
                let mut buf = [0u8; MAX_CONTROL_LEN];
                if let Ok(n) = (Control::Challenge {
                    cookie: &cookie,
                    server_nonce: &nonce,
                })
                .encode(&mut buf)
                {
                    self.queue_clear(src, buf[..n].to_vec());
                }
            }
            (Control::Join(j), _) => self.join(now, src, &j, bytes),
            (Control::List { cookie }, _) => self.list(now, src, cookie, bytes.len()),
            (Control::Public, Some(slot)) => {
                let room = self.room_of(slot);
                if let Some(Some(r)) = room.and_then(|i| self.rooms.get_mut(i)) {
                    r.public = true;
                }
                if let Some(i) = room {
                    self.listed_changed(i);
                }
                self.queue(src, &Control::Public);
            }
            (Control::Rejoin(r), _) => self.rejoin(now, src, &r, bytes.len()),
            (Control::Ack { seq }, Some(slot)) => self.ack(now, slot, seq),
            (Control::Rename { name }, Some(slot)) => {
                let room = self.slots.get(slot as usize).and_then(Option::as_ref);
                let clash = room
                    .filter(|m| m.media)
                    .is_some_and(|m| self.player_named(m.room, name, Some(slot)).is_some());
                if valid_name(name) && !clash {
                    if let Some(Some(m)) = self.slots.get_mut(slot as usize) {
                        m.name.clear();
                        m.name.push_str(name);
                    }
                    self.announce(now, slot, RosterKind::Renamed);
                } else {
                    self.stats.bad_control += 1;
                }
            }
            (Control::Keepalive, Some(_)) => self.queue(src, &Control::Keepalive),
            (Control::Route { seq, direct }, Some(slot)) => self.route(slot, src, seq, direct),
            (Control::Ens { member_id, payload }, Some(slot)) => self.ens(slot, member_id, payload),
            (Control::Rekey(r), Some(slot)) => self.rekey(now, src, slot, &r),
            (Control::Leave, Some(slot)) => {
                self.stats.leaves += 1;
                self.remove(now, slot, RosterKind::Left);
            }
            (
                Control::Ack { .. }
                | Control::Rename { .. }
                | Control::Keepalive
                | Control::Leave
                | Control::Route { .. }
                | Control::Ens { .. }
                | Control::Rekey(_)
                | Control::Public,
                None,
            ) => {
                self.rebind_hint(now, src, bytes.len());
                return Verdict::Drop(DropReason::UnknownSource);
            }
            _ => {
                self.stats.bad_control += 1;
                return Verdict::Drop(DropReason::BadControl);
            }
        }
        Verdict::Control
    }

    /// Applies a member's list of members it reaches directly (if newer than the last),
    /// and acknowledges it.
    fn route(&mut self, slot: u32, src: SocketAddr, seq: u32, direct: &[u8]) {
        let cap = self.cfg.max_members_per_room;
        if let Some(Some(m)) = self.slots.get_mut(slot as usize) {
            if seq > m.route_seq {
                m.route_seq = seq;
                m.direct.clear();
                for w in direct.chunks_exact(4).take(cap) {
                    let id = u32::from_be_bytes([w[0], w[1], w[2], w[3]]);
                    if id != m.id && !m.direct.contains(&id) {
                        m.direct.push(id);
                    }
                }
            }
        }
        self.queue(src, &Control::Routed { seq });
    }

    /// Tells the members of `slot`'s room and `slot` how to reach each other directly,
    /// with a fresh token per pair. Forwarding between them resumes until they say again
    /// that they reach each other.
    fn pair_all(&mut self, now: u64, slot: u32) {
        let Some((room, id)) = self
            .slots
            .get(slot as usize)
            .and_then(Option::as_ref)
            .filter(|m| m.media)
            .map(|m| (m.room, m.id))
        else {
            return;
        };
        let others: Vec<u32> = match self.rooms.get(room) {
            Some(Some(r)) => r
                .members
                .iter()
                .copied()
                .filter(|&o| o != slot && self.has_media(o))
                .collect(),
            _ => return,
        };
        if let Some(Some(m)) = self.slots.get_mut(slot as usize) {
            m.direct.clear();
        }
        for o in others {
            let Some(o_id) = self.slots.get_mut(o as usize).and_then(Option::as_mut).map(|om| {
                om.direct.retain(|&d| d != id);
                om.id
            }) else {
                continue;
            };
            self.serial += 1;
            let token = auth::pair_token(&self.secret, id, o_id, self.serial);
            if let Some(ev) = self.peer_event(o, token) {
                self.push_event(now, slot, ev);
            }
            if let Some(ev) = self.peer_event(slot, token) {
                self.push_event(now, o, ev);
            }
        }
    }

    fn peer_event(&self, about: u32, token: [u8; PAIR_TOKEN_LEN]) -> Option<OutEvent> {
        let m = self.slots.get(about as usize)?.as_ref()?;
        Some(OutEvent {
            seq: 0,
            body: OutBody::Peer {
                member_id: m.id,
                observed: m.addr,
                hosts: m.hosts,
                token,
            },
        })
    }

    fn refuse(&mut self, dst: SocketAddr, code: RefuseCode) {
        self.stats.refused += 1;
        self.queue(
            dst,
            &Control::Refused {
                code: code as i32,
                text: code.text(),
            },
        );
    }

    fn join(&mut self, now: u64, src: SocketAddr, j: &Join<'_>, bytes: &[u8]) {
        let len = bytes.len();
        if !auth::cookie_valid(&self.secret, src, now, j.cookie) {
            self.stats.bad_cookies += 1;
            let code = RefuseCode::BadCookie;
            self.unproven_reply(
                now,
                src,
                len,
                &Control::Refused {
                    code: code as i32,
                    text: code.text(),
                },
            );
            return;
        }
        // From here on the source has proven it receives at its address.
        // A rate of zero (both figures) is a seat without media; one zero is a mistake.
        let media = j.packets_per_s != 0 || j.bytes_per_s != 0;
        if !valid_name(j.room)
            || !valid_name(j.name)
            || (media && (j.packets_per_s == 0 || j.bytes_per_s == 0))
        {
            return self.refuse(src, RefuseCode::BadRequest);
        }
        if j.packets_per_s > self.cfg.max_packets_per_s || j.bytes_per_s > self.cfg.max_bytes_per_s {
            return self.refuse(src, RefuseCode::RateTooHigh);
        }
        let folded = fold_name(j.room);
        let room_idx = self.room_by_name.get(&folded).copied();
        if self.cfg.directory && room_idx.is_none() && !self.claimed.contains_key(&folded) {
            return self.locate(now, src, &folded, bytes);
        }
        let server_nonce = auth::server_nonce(&self.secret, j.cookie);
        let key = match room_idx.and_then(|i| self.rooms.get(i)).and_then(Option::as_ref) {
            Some(r) => r.key,
            None => match <&[u8; ROOM_KEY_LEN]>::try_from(j.create_key) {
                Ok(k) => *k,
                Err(_) => return self.refuse(src, RefuseCode::NoSuchRoom),
            },
        };
        let expect = auth::join_authenticator(&key, &server_nonce, j.client_nonce, j.room, j.name);
        if !auth::ct_eq(&expect, j.authenticator) {
            return self.refuse(src, RefuseCode::WrongPassword);
        }
        // A repeated join (its welcome was lost) from a seated member: welcome again. The
        // same join with another nonce is the player restarted on the same port: below, it
        // replaces its old seat.
        if let Some(&slot) = self.by_addr.get(&src) {
            let seated = self.slots.get(slot as usize).and_then(Option::as_ref);
            let same = seated.is_some_and(|m| m.name == j.name && room_idx == Some(m.room));
            if !same {
                return self.refuse(src, RefuseCode::BadRequest);
            }
            if seated.is_some_and(|m| m.join_nonce == *j.client_nonce) {
                return self.welcome(src, slot);
            }
            self.replace(now, slot, src, src);
        }
        // One player per name in a room: the same name from the same IP address is that
        // player again (restarted; its old seat is a ghost) and takes over at once, from
        // anywhere else it is someone else, who must pick another name.
        if let Some(held) = room_idx
            .filter(|_| media)
            .and_then(|i| self.player_named(i, j.name, None))
        {
            let old = self
                .slots
                .get(held as usize)
                .and_then(Option::as_ref)
                .map(|m| m.addr);
            match old {
                Some(old) if old.ip() == src.ip() => self.replace(now, held, old, src),
                _ => {
                    self.stats.names_taken += 1;
                    return self.refuse(src, RefuseCode::NameTaken);
                }
            }
        }
        if self.by_id.len() >= self.cfg.max_members {
            return self.refuse(src, RefuseCode::ServerFull);
        }
        let room = match room_idx {
            Some(i) => i,
            None => {
                if self.room_by_name.len() >= self.cfg.max_rooms {
                    return self.refuse(src, RefuseCode::ServerFull);
                }
                let r = Room {
                    name: j.room.to_owned(),
                    folded: folded.clone(),
                    key,
                    epoch: 0,
                    prev_key: None,
                    members: Vec::with_capacity(self.cfg.max_members_per_room),
                    public: false,
                };
                let i = match self.free_rooms.pop() {
                    Some(i) => {
                        self.rooms[i] = Some(r);
                        i
                    }
                    None => {
                        self.rooms.push(Some(r));
                        self.rooms.len() - 1
                    }
                };
                self.claimed.remove(&folded);
                self.room_by_name.insert(folded, i);
                i
            }
        };
        let Some(Some(r)) = self.rooms.get(room) else {
            return;
        };
        let like = r.members.iter().filter(|&&o| self.has_media(o) == media).count();
        let cap = if media {
            self.cfg.max_members_per_room
        } else {
            self.cfg.max_ensemble_seats_per_room
        };
        if like >= cap {
            return self.refuse(src, RefuseCode::RoomFull);
        }
        // Every player hears every other, each at its own rate: a rate that cannot be
        // converted to or from a player's already here is refused now, naming the room's
        // rate, not met with silence both ways.
        if media && j.sample_rate != 0 {
            let far = r.members.iter().find_map(|&o| {
                let m = self.slots.get(o as usize).and_then(Option::as_ref)?;
                let rate = m.sample_rate;
                (m.media && rate != 0 && !crate::drift::converts(j.sample_rate, rate)).then_some(rate)
            });
            if let Some(rate) = far {
                self.stats.refused += 1;
                let text = format!("the room plays at {rate} Hz, too far from {} Hz", j.sample_rate);
                let code = RefuseCode::RateUnconvertible as i32;
                return self.queue(src, &Control::Refused { code, text: &text });
            }
        }
        // Resolve an SSRC collision inside the room by assigning a free one.
        let taken = |s: u32, slots: &[Option<Member>]| {
            r.members.iter().any(|&o| {
                slots
                    .get(o as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|m| m.ssrc == s)
            })
        };
        let mut ssrc = j.ssrc;
        let mut k = 0u32;
        while taken(ssrc, &self.slots) {
            k += 1;
            ssrc = j.ssrc.wrapping_add(k.wrapping_mul(0x9E37_79B9)) ^ k;
        }
        let id = self.next_member_id;
        self.next_member_id = self.next_member_id.wrapping_add(1).max(1);
        self.serial += 1;
        let m = Member {
            id,
            room,
            addr: src,
            name: j.name.to_owned(),
            ssrc,
            token: auth::session_token(&self.secret, id, self.serial),
            bucket: if media {
                Bucket::new(&self.cfg, j.packets_per_s, j.bytes_per_s, now)
            } else {
                Bucket::new(
                    &self.cfg,
                    self.cfg.ensemble_packets_per_s,
                    self.cfg.ensemble_bytes_per_s,
                    now,
                )
            },
            last_heard: now,
            inflight: 0,
            outbox: VecDeque::new(),
            next_seq: 1,
            sent_upto: 0,
            rto: self.cfg.retransmit_initial_ns,
            retransmit_at: None,
            evict: false,
            stats: Counters::default(),
            hosts: decode_addrs(j.hosts),
            direct: Vec::with_capacity(self.cfg.max_members_per_room),
            route_seq: 0,
            media,
            sample_rate: j.sample_rate,
            ens: false,
            join_nonce: *j.client_nonce,
        };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(m);
                s
            }
            None => {
                self.slots.push(Some(m));
                self.gens.push(0);
                (self.slots.len() - 1) as u32
            }
        };
        self.by_addr.insert(src, slot);
        self.by_id.insert(id, slot);
        let existing: Vec<u32> = match self.rooms.get_mut(room) {
            Some(Some(r)) => {
                let e = r.members.clone();
                r.members.push(slot);
                e
            }
            _ => Vec::new(),
        };
        self.stats.joins += 1;
        self.welcome(src, slot);
        // After a change of password the newcomer seals in the room's epoch (it proved
        // the room's key now to sit down); in epoch 0 nothing needs saying.
        let epoch = self
            .rooms
            .get(room)
            .and_then(Option::as_ref)
            .map_or(0, |r| r.epoch);
        if media && epoch > 0 {
            self.push_event(
                now,
                slot,
                OutEvent {
                    seq: 0,
                    body: OutBody::Epoch { epoch, by: 0 },
                },
            );
        }
        self.listed_changed(room);
        // The newcomer hears of everyone already there; they hear of the newcomer. A seat
        // without media is in no roster and hears none.
        for other in existing {
            if !media || !self.has_media(other) {
                continue;
            }
            if let Some(ev) = self.event_about(other, RosterKind::Joined) {
                self.push_event(now, slot, ev);
            }
        }
        self.announce(now, slot, RosterKind::Joined);
        self.pair_all(now, slot);
        self.wake_at(now + u64::from(self.cfg.timeout_ms) * 1_000_000);
    }

    fn welcome(&mut self, dst: SocketAddr, slot: u32) {
        let Some(Some(m)) = self.slots.get(slot as usize) else {
            return;
        };
        let (id, ssrc, token) = (m.id, m.ssrc, m.token);
        let w = Welcome {
            member_id: id,
            ssrc,
            token: &token,
            keepalive_ms: self.cfg.keepalive_ms,
            timeout_ms: self.cfg.timeout_ms,
            key_agreement: &[],
        };
        self.queue(dst, &Control::Welcome(w));
    }

    fn rejoin(&mut self, now: u64, src: SocketAddr, r: &Rejoin<'_>, len: usize) {
        if !auth::cookie_valid(&self.secret, src, now, r.cookie) {
            self.stats.bad_cookies += 1;
            let code = RefuseCode::BadCookie;
            self.unproven_reply(
                now,
                src,
                len,
                &Control::Refused {
                    code: code as i32,
                    text: code.text(),
                },
            );
            return;
        }
        let Some(&slot) = self.by_id.get(&r.member_id) else {
            return self.refuse(src, RefuseCode::UnknownMember);
        };
        let server_nonce = auth::server_nonce(&self.secret, r.cookie);
        let Some(Some(m)) = self.slots.get(slot as usize) else {
            return;
        };
        let Some(Some(room)) = self.rooms.get(m.room) else {
            return;
        };
        // Another seat's token: not this member. Member ids are this server's own, so a
        // player whose room moved here from another server asks with an id that may be
        // someone else's here: it is unknown here and joins afresh (its join proves the
        // password again).
        if !auth::ct_eq(&m.token, r.token) {
            return self.refuse(src, RefuseCode::UnknownMember);
        }
        let expect =
            auth::rejoin_authenticator(&room.key, &server_nonce, r.client_nonce, r.member_id, &m.token);
        if !auth::ct_eq(&expect, r.authenticator) {
            return self.refuse(src, RefuseCode::WrongPassword);
        }
        match self.by_addr.get(&src) {
            Some(&s) if s != slot => return self.refuse(src, RefuseCode::BadRequest),
            _ => {}
        }
        let old = m.addr;
        self.by_addr.remove(&old);
        self.by_addr.insert(src, slot);
        if old != src {
            if let Some(sec) = self.secure.as_mut() {
                sec.forget(old);
            }
        }
        if let Some(Some(m)) = self.slots.get_mut(slot as usize) {
            m.addr = src;
            m.last_heard = now;
            let hosts = decode_addrs(r.hosts);
            if hosts[0].is_some() {
                m.hosts = hosts;
            }
            // Whatever was in flight to the old address is re-sent to the new one now.
            m.sent_upto = m.outbox.front().map_or(m.sent_upto, |e| e.seq.saturating_sub(1));
            m.rto = self.cfg.retransmit_initial_ns;
        }
        self.stats.rejoins += 1;
        self.welcome(src, slot);
        if old != src {
            // Every direct path to the old address is gone: forward again, and pair anew.
            self.pair_all(now, slot);
        }
        self.pump(now, slot);
    }

    fn event_about(&self, slot: u32, kind: RosterKind) -> Option<OutEvent> {
        let m = self.slots.get(slot as usize)?.as_ref()?;
        Some(OutEvent {
            seq: 0,
            body: OutBody::Roster {
                kind,
                member_id: m.id,
                name: m.name.clone(),
                ssrc: m.ssrc,
            },
        })
    }

    /// Whether the member in `slot` declared a media rate.
    fn has_media(&self, slot: u32) -> bool {
        self.slots
            .get(slot as usize)
            .and_then(Option::as_ref)
            .is_some_and(|m| m.media)
    }

    /// Tells every other member of `slot`'s room that `kind` happened to it (members with
    /// media, about members with media: the roster is the room's players).
    fn announce(&mut self, now: u64, slot: u32, kind: RosterKind) {
        if !self.has_media(slot) {
            return;
        }
        let Some(ev) = self.event_about(slot, kind) else {
            return;
        };
        let Some(room) = self.room_of(slot) else {
            return;
        };
        let others: Vec<u32> = match self.rooms.get(room) {
            Some(Some(r)) => r
                .members
                .iter()
                .copied()
                .filter(|&o| o != slot && self.has_media(o))
                .collect(),
            _ => return,
        };
        for o in others {
            self.push_event(now, o, ev.clone());
        }
    }

    fn push_event(&mut self, now: u64, slot: u32, mut ev: OutEvent) {
        let backlog = self.cfg.roster_backlog;
        let Some(Some(m)) = self.slots.get_mut(slot as usize) else {
            return;
        };
        if m.outbox.len() >= backlog {
            // A member that acknowledges nothing is not listening: drop it at the next timer.
            m.evict = true;
            self.wake_at(now);
            return;
        }
        ev.seq = m.next_seq;
        m.next_seq = m.next_seq.wrapping_add(1);
        m.outbox.push_back(ev);
        self.pump(now, slot);
    }

    /// Sends the events that entered the window and were never sent; arms the timer.
    fn pump(&mut self, now: u64, slot: u32) {
        let window = self.cfg.roster_window;
        let Some(Some(m)) = self.slots.get_mut(slot as usize) else {
            return;
        };
        let Some(first) = m.outbox.front().map(|e| e.seq) else {
            m.retransmit_at = None;
            return;
        };
        let limit = first.wrapping_add(window);
        let mut out: Vec<Vec<u8>> = Vec::new();
        for e in &m.outbox {
            if e.seq >= limit {
                break;
            }
            if e.seq > m.sent_upto {
                out.push(encode_roster(e));
                m.sent_upto = e.seq;
            }
        }
        let addr = m.addr;
        let at = *m.retransmit_at.get_or_insert(now + m.rto);
        for b in out {
            self.queue_bytes(addr, b);
        }
        self.wake_at(at);
    }

    /// A seated member's `/netjam/rekey`. Proven with the room's key and for the next
    /// epoch, it changes the password: the key it carries becomes the room's, every other
    /// player hears of the new epoch, and joins need the new password from now on. Proven
    /// with the room's key or the one before it and for the room's epoch, it says whether
    /// the sender has the password now (a change answered once and asked again, a member
    /// who took the new password, a player seated again after this server restarted).
    /// Every answer but an unproven one is authenticated with the request's keys.
    fn rekey(&mut self, now: u64, src: SocketAddr, slot: u32, r: &Rekey<'_>) {
        let Some(room_idx) = self.room_of(slot) else {
            return;
        };
        let Some(Some(room)) = self.rooms.get_mut(room_idx) else {
            return;
        };
        let current = auth::RekeyKeys::new(&room.key, &room.name, r.epoch, r.nonce);
        let earlier = room
            .prev_key
            .map(|k| auth::RekeyKeys::new(&k, &room.name, r.epoch, r.nonce));
        let (keys, offered, under_current) = match current.unwrap(r.epoch, r.nonce, r.wrapped, r.mac) {
            Some(k) => (current, k, true),
            None => {
                match earlier.and_then(|e| e.unwrap(r.epoch, r.nonce, r.wrapped, r.mac).map(|k| (e, k))) {
                    Some((e, k)) => (e, k, false),
                    None => {
                        self.stats.rekeys_refused += 1;
                        let epoch = room.epoch;
                        self.queue(
                            src,
                            &Control::Rekeyed {
                                epoch,
                                status: RekeyStatus::Unproven as i32,
                                mac: &[],
                            },
                        );
                        return;
                    }
                }
            }
        };
        let change = under_current && r.epoch == room.epoch.wrapping_add(1);
        let status = if change {
            room.prev_key = Some(room.key);
            room.key = offered;
            room.epoch = r.epoch;
            RekeyStatus::Done
        } else if r.epoch != room.epoch {
            RekeyStatus::Stale
        } else if auth::ct_eq(&offered, &room.key) {
            RekeyStatus::Done
        } else {
            RekeyStatus::NotTheNewPassword
        };
        let epoch = room.epoch;
        let mac = keys.answer_mac(epoch, status as i32);
        self.queue(
            src,
            &Control::Rekeyed {
                epoch,
                status: status as i32,
                mac: &mac,
            },
        );
        if status != RekeyStatus::Done {
            self.stats.rekeys_refused += 1;
        }
        if change {
            self.stats.rekeys += 1;
            let by = self
                .slots
                .get(slot as usize)
                .and_then(Option::as_ref)
                .map_or(0, |m| m.id);
            let others: Vec<u32> = match self.rooms.get(room_idx) {
                Some(Some(r)) => r
                    .members
                    .iter()
                    .copied()
                    .filter(|&o| o != slot && self.has_media(o))
                    .collect(),
                _ => Vec::new(),
            };
            for o in others {
                self.push_event(
                    now,
                    o,
                    OutEvent {
                        seq: 0,
                        body: OutBody::Epoch { epoch, by },
                    },
                );
            }
        }
    }

    fn ack(&mut self, now: u64, slot: u32, seq: u32) {
        let initial = self.cfg.retransmit_initial_ns;
        let Some(Some(m)) = self.slots.get_mut(slot as usize) else {
            return;
        };
        let mut advanced = false;
        while m.outbox.front().is_some_and(|e| e.seq <= seq) {
            m.outbox.pop_front();
            advanced = true;
        }
        if advanced {
            m.rto = initial;
            m.retransmit_at = None;
            self.pump(now, slot);
        }
    }

    fn remove(&mut self, now: u64, slot: u32, kind: RosterKind) {
        let addr = self
            .slots
            .get(slot as usize)
            .and_then(Option::as_ref)
            .map(|m| m.addr);
        self.remove_member(now, slot, kind, true);
        if let (Some(sec), Some(addr)) = (self.secure.as_mut(), addr) {
            sec.forget(addr);
        }
    }

    /// The player in `room` (a seat with media) whose name folds to `name`'s, other than
    /// `except`.
    fn player_named(&self, room: usize, name: &str, except: Option<u32>) -> Option<u32> {
        let want = fold_name(name);
        let r = self.rooms.get(room)?.as_ref()?;
        r.members.iter().copied().find(|&o| {
            Some(o) != except
                && self
                    .slots
                    .get(o as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|m| m.media && fold_name(&m.name) == want)
        })
    }

    /// A join of the player in `slot`'s name came from its IP address (`by`): the old seat
    /// (at `old`) goes at once, the others hear it `left`, and whatever still listens at
    /// `old` is told it was replaced, so two copies of one player never take the seat from
    /// each other in turn. The room stays open for the join that follows.
    fn replace(&mut self, now: u64, slot: u32, old: SocketAddr, by: SocketAddr) {
        self.stats.replaced += 1;
        if old != by {
            self.refuse(old, RefuseCode::Replaced);
            if let Some(sec) = self.secure.as_mut() {
                sec.forget(old);
            }
        }
        self.remove_member(now, slot, RosterKind::Left, false);
    }

    /// Takes the member in `slot` out, telling the others `kind`. A room left empty closes
    /// (and is given back to the directory) when `close_empty`.
    fn remove_member(&mut self, now: u64, slot: u32, kind: RosterKind, close_empty: bool) {
        self.announce(now, slot, kind);
        let Some(m) = self.slots.get_mut(slot as usize).and_then(Option::take) else {
            return;
        };
        if let Some(g) = self.gens.get_mut(slot as usize) {
            *g = g.wrapping_add(1);
        }
        self.free_slots.push(slot);
        self.by_addr.remove(&m.addr);
        self.by_id.remove(&m.id);
        if let Some(Some(r)) = self.rooms.get_mut(m.room) {
            r.members.retain(|&s| s != slot);
            if r.public && self.cfg.directory {
                let members = r
                    .members
                    .iter()
                    .filter(|&&o| {
                        self.slots
                            .get(o as usize)
                            .and_then(Option::as_ref)
                            .is_some_and(|m| m.media)
                    })
                    .count() as u32;
                self.directory_out.push_back(DirectoryRequest::Listed {
                    room: r.name.clone(),
                    members,
                });
            }
            if r.members.is_empty() && close_empty {
                if self.cfg.directory {
                    self.directory_out
                        .push_back(DirectoryRequest::Vacate(r.folded.clone()));
                }
                self.room_by_name.remove(&r.folded);
                self.rooms[m.room] = None;
                self.free_rooms.push(m.room);
            }
        }
    }

    /// The server's own process did not run for `for_ns` up to `now_ns` (stopped, a
    /// machine that hung or was suspended): that time is not its members' silence. Each
    /// member is given the time back, so none is dropped for it; one that stays silent
    /// after is dropped a whole timeout later.
    pub fn stalled(&mut self, now_ns: u64, for_ns: u64) {
        for m in self.slots.iter_mut().flatten() {
            m.last_heard = m.last_heard.saturating_add(for_ns).min(now_ns);
        }
    }

    /// Runs the timers due at `now_ns`: roster retransmissions and member timeouts.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        if now_ns < self.next_wake {
            return;
        }
        let timeout = u64::from(self.cfg.timeout_ms) * 1_000_000;
        let mut next = u64::MAX;
        let mut dead = Vec::new();
        let mut resend: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
        let window = self.cfg.roster_window;
        let max_rto = self.cfg.retransmit_max_ns;
        for (slot, m) in self.slots.iter_mut().enumerate() {
            let Some(m) = m else { continue };
            if m.evict || now_ns >= m.last_heard.saturating_add(timeout) {
                dead.push(slot as u32);
                continue;
            }
            next = next.min(m.last_heard + timeout);
            if let Some(at) = m.retransmit_at {
                if now_ns >= at {
                    let first = m.outbox.front().map_or(0, |e| e.seq);
                    for e in m.outbox.iter().take_while(|e| e.seq < first.wrapping_add(window)) {
                        resend.push((m.addr, encode_roster(e)));
                    }
                    m.rto = (m.rto * 2).min(max_rto);
                    m.retransmit_at = if m.outbox.is_empty() {
                        None
                    } else {
                        Some(now_ns + m.rto)
                    };
                }
                if let Some(at) = m.retransmit_at {
                    next = next.min(at);
                }
            }
        }
        self.locating.retain(|_, l| {
            let keep = now_ns < l.since + LOCATE_WAIT_NS;
            if keep {
                next = next.min(l.since + LOCATE_WAIT_NS);
            } else {
                self.stats.locate_drops += l.joins.len() as u64;
            }
            keep
        });
        let out = &mut self.directory_out;
        self.claimed.retain(|room, until| {
            let keep = now_ns < *until;
            if keep {
                next = next.min(*until);
            } else {
                out.push_back(DirectoryRequest::Vacate(room.clone()));
            }
            keep
        });
        self.next_wake = next;
        for (a, b) in resend {
            self.queue_bytes(a, b);
        }
        for slot in dead {
            self.stats.timeouts += 1;
            self.remove(now_ns, slot, RosterKind::Timeout);
        }
    }

    /// When [`Server::handle_timeout`] must be called next (`None`: no member, no timer).
    pub fn poll_timeout(&self) -> Option<u64> {
        let waiting = !self.by_id.is_empty() || !self.locating.is_empty() || !self.claimed.is_empty();
        (self.next_wake != u64::MAX && waiting).then_some(self.next_wake)
    }

    /// The next request for the room directory (only with [`ServerConfig::directory`]):
    /// drain after each call, like [`Server::poll_transmit`].
    pub fn poll_directory(&mut self) -> Option<DirectoryRequest> {
        self.directory_out.pop_front()
    }

    /// The directory's answer to [`DirectoryRequest::Locate`] for `room`: lets the joins
    /// held for it in ([`Placement::Here`]), redirects them, or refuses them. A claim
    /// (`Here`) that no join uses within [`CLAIM_UNUSED_NS`] comes back as
    /// [`DirectoryRequest::Vacate`].
    pub fn placed(&mut self, now_ns: u64, room: &str, placement: Placement) {
        let room = &fold_name(room);
        let joins = self.locating.remove(room).map(|l| l.joins).unwrap_or_default();
        match placement {
            Placement::Here => {
                if !self.room_by_name.contains_key(room) {
                    self.claimed.insert(room.to_owned(), now_ns + CLAIM_UNUSED_NS);
                    self.wake_at(now_ns + CLAIM_UNUSED_NS);
                }
                for (src, bytes) in joins {
                    // Held as opened: a join that came in clear to a server with a
                    // channel was refused before it could be held.
                    self.control_plain(now_ns, src, &bytes, true);
                }
            }
            Placement::Elsewhere(server) => {
                self.redirect(joins.iter().map(|(src, _)| *src), room, &server);
            }
            Placement::Unavailable => {
                for (src, _) in joins {
                    self.refuse(src, RefuseCode::DirectoryUnavailable);
                }
            }
            Placement::Moved(server) => {
                self.redirect(joins.iter().map(|(src, _)| *src), room, &server);
                self.moved(now_ns, room, &server);
            }
        }
    }

    /// Sends each of `to` a `/netjam/redirect` naming `room` on `server`.
    fn redirect(&mut self, to: impl Iterator<Item = SocketAddr>, room: &str, server: &str) {
        for dst in to {
            self.stats.redirects += 1;
            self.queue(dst, &Control::Redirect { room, server });
        }
    }

    /// Another server holds the claim on `room` (folded) now: one room on two servers would
    /// split the band into two halves that cannot hear each other, so every member here is
    /// sent there with `/netjam/redirect` (as a join for a room elsewhere is) and the room
    /// closes here, without giving back a claim that is the other server's.
    fn moved(&mut self, now: u64, room: &str, to: &str) {
        self.claimed.remove(room);
        let Some(&idx) = self.room_by_name.get(room) else {
            return;
        };
        let Some(Some(r)) = self.rooms.get(idx) else {
            return;
        };
        let members = r.members.clone();
        let seated: Vec<SocketAddr> = members
            .iter()
            .filter_map(|&slot| {
                self.slots
                    .get(slot as usize)
                    .and_then(Option::as_ref)
                    .map(|m| m.addr)
            })
            .collect();
        self.stats.moved_members += seated.len() as u64;
        self.redirect(seated.into_iter(), room, to);
        for slot in members {
            self.remove_member(now, slot, RosterKind::Left, false);
        }
        self.room_by_name.remove(room);
        self.rooms[idx] = None;
        self.free_rooms.push(idx);
    }

    /// Every server's public rooms, as the directory last listed them (with
    /// [`ServerConfig::directory`]; without one, `/netjam/list` is answered from this
    /// server's own rooms).
    pub fn set_listing(&mut self, rooms: Vec<ListedRoom>) {
        self.listing = rooms;
    }

    /// This server's public rooms: name and players.
    pub fn public_rooms(&self) -> Vec<(String, u32)> {
        self.rooms
            .iter()
            .flatten()
            .filter(|r| r.public)
            .map(|r| (r.name.clone(), self.players_in(r)))
            .collect()
    }

    fn players_in(&self, r: &Room) -> u32 {
        r.members.iter().filter(|&&o| self.has_media(o)).count() as u32
    }

    /// A public room's player count changed: tell the directory.
    fn listed_changed(&mut self, room: usize) {
        let Some(Some(r)) = self.rooms.get(room) else {
            return;
        };
        if r.public && self.cfg.directory {
            let members = self.players_in(r);
            let room = r.name.clone();
            self.directory_out
                .push_back(DirectoryRequest::Listed { room, members });
        }
    }

    /// Answers `/netjam/list` from an address that proved it receives (its cookie): the
    /// public rooms, at most [`MAX_LISTED`], then `/netjam/listend`.
    fn list(&mut self, now: u64, src: SocketAddr, cookie: &[u8; super::msg::COOKIE_LEN], len: usize) {
        if !auth::cookie_valid(&self.secret, src, now, cookie) {
            self.stats.bad_cookies += 1;
            let code = RefuseCode::BadCookie;
            let refusal = Control::Refused {
                code: code as i32,
                text: code.text(),
            };
            return self.unproven_reply(now, src, len, &refusal);
        }
        let rooms: Vec<ListedRoom> = if self.cfg.directory {
            self.listing.iter().take(MAX_LISTED).cloned().collect()
        } else {
            self.public_rooms()
                .into_iter()
                .take(MAX_LISTED)
                .map(|(room, members)| ListedRoom {
                    room,
                    server: String::new(),
                    members,
                    region: self.cfg.region.clone(),
                })
                .collect()
        };
        for r in &rooms {
            self.queue(
                src,
                &Control::Listed {
                    room: &r.room,
                    server: &r.server,
                    members: r.members,
                    region: &r.region,
                },
            );
        }
        self.stats.lists += 1;
        self.queue(
            src,
            &Control::ListEnd {
                count: rooms.len() as u32,
            },
        );
    }

    /// Holds a join for a room not open here and asks the directory where it lives.
    fn locate(&mut self, now: u64, src: SocketAddr, room: &str, bytes: &[u8]) {
        let rooms = self.locating.len();
        match self.locating.get_mut(room) {
            Some(l) => {
                if let Some(held) = l.joins.iter_mut().find(|(a, _)| *a == src) {
                    // A retry: keep the newest (its cookie is the freshest).
                    held.1 = bytes.to_vec();
                } else if l.joins.len() < LOCATE_JOINS {
                    l.joins.push((src, bytes.to_vec()));
                } else {
                    self.stats.locate_drops += 1;
                }
            }
            None if rooms >= LOCATE_ROOMS => self.stats.locate_drops += 1,
            None => {
                self.locating.insert(
                    room.to_owned(),
                    Locating {
                        since: now,
                        joins: vec![(src, bytes.to_vec())],
                    },
                );
                self.stats.locates += 1;
                self.directory_out
                    .push_back(DirectoryRequest::Locate(room.to_owned()));
                self.wake_at(now + LOCATE_WAIT_NS);
            }
        }
    }

    /// The next control reply: writes it into `buf` and returns its destination and
    /// length. A reply longer than `buf` ([`super::msg::MAX_WIRE_LEN`] always suffices) is dropped
    /// and counted.
    pub fn poll_transmit(&mut self, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        loop {
            let (dst, bytes) = self.transmit.pop_front()?;
            if let Some(out) = buf.get_mut(..bytes.len()) {
                out.copy_from_slice(&bytes);
                return Some((dst, bytes.len()));
            }
            self.stats.transmit_drops += 1;
        }
    }

    /// Server-wide counters.
    pub fn stats(&self) -> ServerStats {
        ServerStats {
            members: self.by_id.len() as u64,
            rooms: self.room_by_name.len() as u64,
            ..self.stats
        }
    }

    /// A snapshot of every member's counters.
    pub fn member_stats(&self) -> Vec<MemberStats> {
        self.slots
            .iter()
            .flatten()
            .map(|m| MemberStats {
                member_id: m.id,
                name: m.name.clone(),
                room: self
                    .rooms
                    .get(m.room)
                    .and_then(Option::as_ref)
                    .map(|r| r.name.clone())
                    .unwrap_or_default(),
                addr: m.addr,
                ssrc: m.ssrc,
                packets_in: m.stats.packets_in,
                bytes_in: m.stats.bytes_in,
                forwarded: m.stats.forwarded,
                policed_drops: m.stats.policed,
                forged_drops: m.stats.forged,
                malformed_drops: m.stats.malformed,
                sent_to: m.stats.sent_to,
                queue_drops: m.stats.queue_drops,
                direct_skipped: m.stats.direct_skipped,
                direct_to: m.direct.clone(),
            })
            .collect()
    }

    /// The room index of the member in `slot`.
    fn room_of(&self, slot: u32) -> Option<usize> {
        self.slots
            .get(slot as usize)
            .and_then(Option::as_ref)
            .map(|m| m.room)
    }

    fn wake_at(&mut self, t: u64) {
        self.next_wake = self.next_wake.min(t);
    }

    fn queue(&mut self, dst: SocketAddr, msg: &Control<'_>) {
        let mut buf = vec![0u8; MAX_CONTROL_LEN];
        match msg.encode(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                self.queue_bytes(dst, buf);
            }
            Err(_) => self.stats.transmit_drops += 1,
        }
    }

    /// Queues a control message for `dst`: sealed in its session when the server has a
    /// channel (a reply to an address with none goes in clear: a refusal to a join that
    /// came in clear before the channel, a hello's answer).
    fn queue_bytes(&mut self, dst: SocketAddr, bytes: Vec<u8>) {
        if let Some(sec) = self.secure.as_mut().filter(|s| s.has(dst)) {
            let mut out = vec![0u8; super::msg::MAX_WIRE_LEN];
            match sec.seal(dst, &bytes, &mut out) {
                Ok(n) => {
                    out.truncate(n);
                    return self.queue_clear(dst, out);
                }
                Err(_) => {
                    self.stats.transmit_drops += 1;
                    return;
                }
            }
        }
        self.queue_clear(dst, bytes);
    }

    /// Queues a datagram for `dst` as it is: STUN, a challenge, a handshake's answer, a
    /// rebind hint, an ensemble relay.
    fn queue_clear(&mut self, dst: SocketAddr, bytes: Vec<u8>) {
        if self.transmit.len() >= self.cfg.transmit_queue {
            self.stats.transmit_drops += 1;
            return;
        }
        self.transmit.push_back((dst, bytes));
    }

    /// Sends `msg` to an address that has not proven itself, only if it is no longer than
    /// the `cause_len` bytes that came from there and the global budget allows.
    fn unproven_reply(&mut self, now: u64, dst: SocketAddr, cause_len: usize, msg: &Control<'_>) {
        let mut buf = [0u8; MAX_CONTROL_LEN];
        let Ok(n) = msg.encode(&mut buf) else { return };
        if n > cause_len || !self.unproven_budget(now) {
            self.stats.unproven_suppressed += 1;
            return;
        }
        if matches!(msg, Control::Refused { .. }) {
            self.stats.refused += 1;
        }
        self.queue_bytes(dst, buf[..n].to_vec());
    }

    /// Takes one reply from the global budget for unproven addresses, if one is left.
    fn unproven_budget(&mut self, now: u64) -> bool {
        self.unproven_budget_above(now, 0.0)
    }

    /// Takes one reply from the global budget if more than `reserve` of it would be left:
    /// rebind hints leave half the budget to the handshakes and refusals they lead to.
    fn unproven_budget_above(&mut self, now: u64, reserve: f64) -> bool {
        let rate = f64::from(self.cfg.unproven_replies_per_s);
        let dt = now.saturating_sub(self.unproven_last) as f64 / 1e9;
        self.unproven_last = self.unproven_last.max(now);
        self.unproven_tokens = (self.unproven_tokens + dt * rate).min(rate);
        if self.unproven_tokens < 1.0 + reserve {
            return false;
        }
        self.unproven_tokens -= 1.0;
        true
    }

    /// A "who are you" to an address that sent member traffic but is no member (its NAT
    /// binding changed): the client says hello and rejoins.
    fn rebind_hint(&mut self, now: u64, dst: SocketAddr, cause_len: usize) {
        let before = self.transmit.len();
        // In clear: the address has no session (or the player lost it).
        let mut buf = [0u8; MAX_CONTROL_LEN];
        let Ok(n) = Control::Rebind.encode(&mut buf) else {
            return;
        };
        let reserve = f64::from(self.cfg.unproven_replies_per_s) / 2.0;
        if n > cause_len || !self.hints.due(now, dst) || !self.unproven_budget_above(now, reserve) {
            self.stats.unproven_suppressed += 1;
        } else {
            self.hints.sent(now, dst);
            self.queue_clear(dst, buf[..n].to_vec());
        }
        if self.transmit.len() > before {
            self.stats.rebind_hints += 1;
        }
    }
}

fn encode_roster(e: &OutEvent) -> Vec<u8> {
    let mut buf = vec![0u8; MAX_CONTROL_LEN];
    let n = match &e.body {
        OutBody::Roster {
            kind,
            member_id,
            name,
            ssrc,
        } => Control::Roster(Roster {
            seq: e.seq,
            kind: *kind,
            member_id: *member_id,
            name,
            ssrc: *ssrc,
        })
        .encode(&mut buf),
        OutBody::Epoch { epoch, by } => Control::Epoch {
            seq: e.seq,
            epoch: *epoch,
            by: *by,
        }
        .encode(&mut buf),
        OutBody::Peer {
            member_id,
            observed,
            hosts,
            token,
        } => {
            let mut o = [0u8; MAX_ADDRS_LEN];
            let on = encode_addrs(&[*observed], &mut o);
            let mut list = [*observed; MAX_HOSTS];
            let mut k = 0;
            for (slot, h) in list.iter_mut().zip(hosts.iter().flatten()) {
                *slot = *h;
                k += 1;
            }
            let mut h = [0u8; MAX_ADDRS_LEN];
            let hn = encode_addrs(&list[..k], &mut h);
            Control::Peer(PeerInfo {
                seq: e.seq,
                member_id: *member_id,
                observed: &o[..on],
                hosts: &h[..hn],
                token,
            })
            .encode(&mut buf)
        }
    }
    .unwrap_or(0);
    buf.truncate(n);
    buf
}
