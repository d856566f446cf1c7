//! Direct paths between the members of a room, with the rooms server as the fallback that
//! is always ready: [`DirectPaths`], a sans-IO state machine on the client.
//!
//! The server tells each member of a pair about the other (`/netjam/peer`: where the
//! server sees it, the host addresses it declared, and a fresh token for the pair). Both
//! then punch at the same time: every [`DirectConfig::punch_interval_ns`] a
//! `/netjam/probe` goes to each of the other's candidate addresses, for at most
//! [`DirectConfig::punch_for_ns`]. A probe carries an authenticator made with the pair's
//! token; one without the right authenticator is ignored and counted. Each probe is
//! answered with an ack to the address it came from, and an ack measures the direct round
//! trip. The path is **direct** once an ack arrives whose round trip is not larger than
//! the round trip through the server (this client's to the server plus the other's, which
//! it writes in its probes) plus [`DirectConfig::rtt_slack_ns`]; otherwise, after the
//! punching time, **relayed**. A direct path keeps being probed every
//! [`DirectConfig::keep_interval_ns`] and is declared dead when
//! [`DirectConfig::missed_limit`] probe intervals pass (beyond one round trip) without an
//! ack; media then goes back through the server at once.
//!
//! **Slower paths.** The direct round trip compared is the smallest of the last
//! [`RTT_WINDOW`] acks (queueing only ever adds to a sample). A direct path that answers
//! but is slower than the way through the server is kept open and measured (probed like a
//! direct one, [`PathInfo::slower`]) while media goes through the server. The figures are
//! weighed again at every ack, with hysteresis: media leaves a direct path once it has
//! been slower by more than [`DirectConfig::rtt_slack_ns`] plus
//! [`DirectConfig::rtt_hysteresis_ns`] for [`DirectConfig::switch_hold_ns`], and comes
//! back once it has been within [`DirectConfig::rtt_slack_ns`] for as long.
//!
//! **Retries.** A pair whose punching found no answer, or whose direct path died, punches
//! again after [`DirectConfig::retry_after_ns`], doubling after each further failure up
//! to [`DirectConfig::retry_max_ns`], so a router that lets the pair through later (it
//! rebooted, a firewall rule went, the other player moved) still gives them a direct
//! path. A valid probe from the other side while relayed makes this side punch along,
//! at most once per [`DirectConfig::retry_after_ns`].
//!
//! Routing is the sender's: this client tells the server (`/netjam/route`, retried until
//! `/netjam/routed`) which members it reaches directly, and the server stops forwarding
//! its media to them. [`DirectPaths::route_table`] says where each media packet goes: to
//! the server unless every member is direct and the server has applied that list, and
//! straight to every member on a direct path. When a path dies, the new list is queued
//! before the path is taken out of the table, so a shell that sends what
//! [`DirectPaths::poll_transmit`] gives before it reads the table tells the server first.
//!
//! Candidates are where the server sees the member and the host addresses it declared; a
//! declared address with an unspecified IP (`0.0.0.0:PORT`) stands for that port at the
//! address the server sees it at — a port its router forwards to it on request (UPnP).
//!
//! Calling loop: [`DirectPaths::set_peer`] / [`DirectPaths::remove_peer`] /
//! [`DirectPaths::routed`] / [`DirectPaths::set_server_rtt`] from the room client's
//! events; [`DirectPaths::handle_probe`] for every `/netjam/probe` datagram from anyone;
//! [`DirectPaths::handle_timeout`] at [`DirectPaths::poll_timeout`]; then drain
//! [`DirectPaths::poll_transmit`] and [`DirectPaths::poll_event`] and refresh the table.
//!
//! Nothing here opens a socket or reads a clock. After [`DirectPaths::new`] nothing
//! allocates (peers, transmissions and events live in storage sized at construction), and
//! no datagram, however forged, can make it panic or open a path.

use std::collections::VecDeque;
use std::net::SocketAddr;

use crate::room::auth;
use crate::room::client::PeerEntry;
use crate::room::msg::{Control, Probe, ProbeKind, MAX_HOSTS, PAIR_TOKEN_LEN};

/// How long after a direct path was declared dead a late answer to a probe sent before
/// revives it (see [`DirectPaths::handle_probe`]).
const REVIVE_NS: u64 = 1_000_000_000;

/// Most members a [`RouteTable`] names directly.
pub const MAX_DIRECT: usize = 16;
/// Candidate addresses kept per member: where the server sees it, its host addresses, and
/// addresses its valid probes came from.
const MAX_CANDIDATES: usize = 1 + MAX_HOSTS + 2;
/// Probes remembered per member for their round trip.
const SENT_RING: usize = 64;
/// Acks whose smallest round trip is the direct path's figure.
pub const RTT_WINDOW: usize = 8;

/// Timers and limits of [`DirectPaths`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct DirectConfig {
    /// Probe interval while punching.
    pub punch_interval_ns: u64,
    /// How long to punch before the pair stays relayed.
    pub punch_for_ns: u64,
    /// Probe interval on a direct path.
    pub keep_interval_ns: u64,
    /// Probe intervals without an ack (beyond one round trip) after which a direct path
    /// is dead.
    pub missed_limit: u32,
    /// How much longer than the way through the server the direct round trip may be and
    /// still be taken: the two round trips are measured by different messages on a
    /// loaded machine, so equal paths must not flap.
    pub rtt_slack_ns: u64,
    /// Beyond [`DirectConfig::rtt_slack_ns`], how much slower a direct path in use must
    /// become before media leaves it (it comes back within the slack): the band that
    /// keeps a path at the edge from flapping.
    pub rtt_hysteresis_ns: u64,
    /// How long the figures must keep saying so before media moves between a direct path
    /// that answers and the server.
    pub switch_hold_ns: u64,
    /// After a pair gave up or a direct path died, punch again after this long; each
    /// further failure doubles the wait.
    pub retry_after_ns: u64,
    /// The longest wait between two attempts.
    pub retry_max_ns: u64,
    /// Resend an unacknowledged route list this often.
    pub route_retry_ns: u64,
    /// Members tracked at most (room size).
    pub max_peers: usize,
}

impl Default for DirectConfig {
    fn default() -> Self {
        Self {
            punch_interval_ns: 20_000_000,
            punch_for_ns: 1_000_000_000,
            keep_interval_ns: 25_000_000,
            missed_limit: 3,
            rtt_slack_ns: 1_000_000,
            rtt_hysteresis_ns: 1_000_000,
            switch_hold_ns: 1_000_000_000,
            retry_after_ns: 10_000_000_000,
            retry_max_ns: 60_000_000_000,
            route_retry_ns: 30_000_000,
            max_peers: MAX_DIRECT,
        }
    }
}

/// Which way media to a member goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathState {
    /// Probing; media goes through the server meanwhile.
    Punching,
    /// Straight to the member.
    Direct,
    /// Through the server (no direct path, or a slower one).
    Relayed,
}

/// One member's path, for status lines and reports.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct PathInfo {
    /// The member.
    pub member_id: u32,
    /// Which way media goes.
    pub state: PathState,
    /// The direct address in use (or last confirmed).
    pub addr: Option<SocketAddr>,
    /// The direct round trip: the smallest of the last [`RTT_WINDOW`] acks, ms.
    pub direct_rtt_ms: Option<f64>,
    /// The round trip through the server (ours plus theirs), ms.
    pub relay_rtt_ms: Option<f64>,
    /// Times the path became direct.
    pub direct_count: u32,
    /// Times a direct path died.
    pub died: u32,
    /// Relayed although a direct path answers, because it is slower than through the
    /// server; it is kept open and measured.
    pub slower: bool,
    /// Attempts in a row that found no direct path (the next waits longer).
    pub failures: u32,
}

/// What happened to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathEvent {
    /// Media to `member_id` now goes straight to `addr`.
    Direct {
        /// The member.
        member_id: u32,
        /// Its address.
        addr: SocketAddr,
        /// The round trip that confirmed it, ns.
        rtt_ns: u64,
    },
    /// Media to `member_id` goes through the server.
    Relayed {
        /// The member.
        member_id: u32,
        /// The direct path was up and stopped answering (else: punching gave up, or the
        /// direct path is slower than through the server).
        died: bool,
    },
}

/// Where to send a datagram from [`DirectPaths::poll_transmit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// To the rooms server.
    Server,
    /// Straight to this address.
    Addr(SocketAddr),
}

/// Where each media packet goes: [`DirectPaths::route_table`]. `Copy`, so a shell can
/// hand it to its send thread whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteTable {
    /// Send to the server too.
    pub to_server: bool,
    direct: [Option<SocketAddr>; MAX_DIRECT],
}

impl Default for RouteTable {
    fn default() -> Self {
        Self {
            to_server: true,
            direct: [None; MAX_DIRECT],
        }
    }
}

impl RouteTable {
    /// A table naming `direct` (the first [`MAX_DIRECT`] of them), and the server too if
    /// `to_server`: for a shell or a test that steers a send thread by hand.
    pub fn new(to_server: bool, direct: &[SocketAddr]) -> Self {
        let mut t = Self {
            to_server,
            direct: [None; MAX_DIRECT],
        };
        for (slot, a) in t.direct.iter_mut().zip(direct) {
            *slot = Some(*a);
        }
        t
    }

    /// The members' direct addresses media goes to.
    pub fn direct(&self) -> impl Iterator<Item = SocketAddr> + '_ {
        self.direct.iter().flatten().copied()
    }
}

/// Counters of [`DirectPaths`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct DirectStats {
    /// Probes and acks sent.
    pub probes_sent: u64,
    /// Valid probes received (answered).
    pub probes_received: u64,
    /// Valid acks received.
    pub acks_received: u64,
    /// Probes or acks with a wrong authenticator, for another member, from an unknown
    /// member, or acks for no probe sent: ignored.
    pub rejected: u64,
    /// Route lists sent (with retries).
    pub routes_sent: u64,
    /// Datagrams not queued because the transmit queue was full.
    pub transmit_drops: u64,
    /// Peers not tracked because [`DirectConfig::max_peers`] were.
    pub peers_refused: u64,
    /// Direct paths declared dead and revived by a late answer (see `REVIVE_NS`).
    pub revived: u64,
}

#[derive(Debug, Clone, Copy)]
struct PeerPath {
    member_id: u32,
    token: [u8; PAIR_TOKEN_LEN],
    candidates: [Option<SocketAddr>; MAX_CANDIDATES],
    state: PathState,
    addr: Option<SocketAddr>,
    punch_until: u64,
    next_probe_at: u64,
    retry_at: u64,
    next_seq: u32,
    sent: [(u32, u64); SENT_RING],
    last_ack_at: u64,
    rtt_ns: Option<u64>,
    /// The latest acks' round trips (0: none), oldest overwritten.
    rtts: [u64; RTT_WINDOW],
    rtt_next: usize,
    /// Since when the figures have said media should move (u64::MAX: they do not).
    move_since: u64,
    /// Relayed, but a direct path answers (slower): kept probed.
    standby: bool,
    failures: u32,
    punched_at: u64,
    peer_server_rtt_ns: Option<u64>,
    direct_count: u32,
    died: u32,
    /// When the direct path was last declared dead (0: never, or revived since).
    died_at: u64,
    /// Probes sent since the last ack: a path is dead only once this many went unanswered
    /// (a thread that did not run for a while sent none, and heard nothing for it).
    unanswered: u32,
}

impl PeerPath {
    /// The direct path's figure: the smallest recent round trip.
    fn direct_rtt(&self) -> Option<u64> {
        self.rtts.iter().copied().filter(|&r| r > 0).min()
    }

    fn forget_rtts(&mut self) {
        self.rtts = [0; RTT_WINDOW];
        self.rtt_next = 0;
        self.move_since = u64::MAX;
    }
}

#[derive(Debug, Clone, Copy)]
enum Out {
    Probe {
        member_id: u32,
        to: SocketAddr,
        seq: u32,
        kind: ProbeKind,
        /// When the probe an ack answers arrived.
        arrived: u64,
    },
    Route,
}

/// The client's direct paths. See the module docs for the calling loop.
#[derive(Debug)]
pub struct DirectPaths {
    cfg: DirectConfig,
    me: u32,
    peers: Vec<PeerPath>,
    server_rtt_ns: Option<u64>,
    out: VecDeque<Out>,
    events: VecDeque<PathEvent>,
    route_seq: u32,
    route_acked: u32,
    route_retry_at: u64,
    stats: DirectStats,
}

/// Transmissions that may wait: a probe per candidate of every member, acks, routes.
const OUT_CAPACITY: usize = 1024;

impl DirectPaths {
    /// Paths for member `me` (its id from the welcome).
    pub fn new(config: DirectConfig, me: u32) -> Self {
        let n = config.max_peers.max(1);
        Self {
            peers: Vec::with_capacity(n),
            cfg: config,
            me,
            server_rtt_ns: None,
            out: VecDeque::with_capacity(OUT_CAPACITY),
            events: VecDeque::with_capacity(4 * n + 4),
            route_seq: 0,
            route_acked: 0,
            route_retry_at: u64::MAX,
            stats: DirectStats::default(),
        }
    }

    /// This client's member id changed (a fresh seat): every path starts over.
    pub fn set_me(&mut self, now_ns: u64, me: u32) {
        if me != self.me {
            self.me = me;
            let ids: [Option<u32>; MAX_DIRECT] = {
                let mut a = [None; MAX_DIRECT];
                for (s, p) in a.iter_mut().zip(&self.peers) {
                    *s = Some(p.member_id);
                }
                a
            };
            for id in ids.into_iter().flatten() {
                self.remove_peer(now_ns, id);
            }
        }
    }

    /// This client's round trip to the server (written in its probes, and half of the
    /// comparison that decides direct or relayed).
    pub fn set_server_rtt(&mut self, rtt_ns: u64) {
        self.server_rtt_ns = Some(rtt_ns);
    }

    /// Counters.
    pub fn stats(&self) -> DirectStats {
        self.stats
    }

    /// Every member's path.
    pub fn paths(&self) -> impl Iterator<Item = PathInfo> + '_ {
        self.peers.iter().map(|p| PathInfo {
            member_id: p.member_id,
            state: p.state,
            addr: p.addr,
            direct_rtt_ms: p.direct_rtt().or(p.rtt_ns).map(|r| r as f64 / 1e6),
            relay_rtt_ms: self.relay_rtt(p).map(|r| r as f64 / 1e6),
            direct_count: p.direct_count,
            died: p.died,
            slower: p.state == PathState::Relayed && p.standby,
            failures: p.failures,
        })
    }

    /// `member_id`'s path.
    pub fn path(&self, member_id: u32) -> Option<PathInfo> {
        self.paths().find(|p| p.member_id == member_id)
    }

    fn relay_rtt(&self, p: &PeerPath) -> Option<u64> {
        Some(self.server_rtt_ns? + p.peer_server_rtt_ns?)
    }

    /// Where media goes now. Call after draining [`DirectPaths::poll_transmit`].
    pub fn route_table(&self) -> RouteTable {
        let mut t = RouteTable {
            to_server: self.peers.is_empty()
                || self.route_acked < self.route_seq
                || self.peers.iter().any(|p| p.state != PathState::Direct),
            direct: [None; MAX_DIRECT],
        };
        for (slot, p) in t
            .direct
            .iter_mut()
            .zip(self.peers.iter().filter(|p| p.state == PathState::Direct))
        {
            *slot = p.addr;
        }
        t
    }

    /// The server told how to reach `e.member_id`: start punching (again, if the token or
    /// the addresses changed; a direct path to it goes back through the server first).
    pub fn set_peer(&mut self, now_ns: u64, e: &PeerEntry) {
        if e.member_id == self.me {
            return;
        }
        let mut cands = [None; MAX_CANDIDATES];
        // A declared host with an unspecified IP is a port the member's router forwards
        // to it (UPnP): at the address the server sees the member at.
        let at_observed = |h: SocketAddr| match (h.ip().is_unspecified(), e.observed) {
            (false, _) => Some(h),
            (true, Some(o)) => Some(SocketAddr::new(o.ip(), h.port())),
            (true, None) => None,
        };
        for (c, a) in cands.iter_mut().zip(
            core::iter::once(e.observed)
                .flatten()
                .chain(e.hosts.into_iter().flatten().filter_map(at_observed)),
        ) {
            *c = Some(a);
        }
        let idx = match self.peers.iter().position(|p| p.member_id == e.member_id) {
            Some(i) => {
                let p = &self.peers[i];
                if p.token == e.token && p.candidates[..1 + MAX_HOSTS] == cands[..1 + MAX_HOSTS] {
                    return;
                }
                if p.state == PathState::Direct {
                    self.set_state(now_ns, i, PathState::Relayed, true);
                }
                // New addresses or a new token: a fresh start, no back-off.
                self.peers[i].failures = 0;
                i
            }
            None => {
                if self.peers.len() >= self.cfg.max_peers.min(MAX_DIRECT) {
                    self.stats.peers_refused += 1;
                    return;
                }
                self.peers.push(PeerPath {
                    member_id: e.member_id,
                    token: e.token,
                    candidates: cands,
                    state: PathState::Punching,
                    addr: None,
                    punch_until: 0,
                    next_probe_at: 0,
                    retry_at: u64::MAX,
                    next_seq: 1,
                    sent: [(0, 0); SENT_RING],
                    last_ack_at: 0,
                    rtt_ns: None,
                    rtts: [0; RTT_WINDOW],
                    rtt_next: 0,
                    move_since: u64::MAX,
                    standby: false,
                    failures: 0,
                    punched_at: 0,
                    peer_server_rtt_ns: None,
                    direct_count: 0,
                    died: 0,
                    died_at: 0,
                    unanswered: 0,
                });
                // A new member is not direct: the server must carry media to it.
                self.route_changed(now_ns);
                self.peers.len() - 1
            }
        };
        let p = &mut self.peers[idx];
        p.token = e.token;
        p.candidates = cands;
        p.sent = [(0, 0); SENT_RING];
        self.start_punching(now_ns, idx);
    }

    fn start_punching(&mut self, now: u64, i: usize) {
        let p = &mut self.peers[i];
        p.state = PathState::Punching;
        p.standby = false;
        p.addr = None;
        p.forget_rtts();
        p.punch_until = now + self.cfg.punch_for_ns;
        p.punched_at = now;
        p.next_probe_at = now;
        p.retry_at = u64::MAX;
        self.probe_due(now, i);
    }

    /// `member_id` left the room.
    pub fn remove_peer(&mut self, now_ns: u64, member_id: u32) {
        if let Some(i) = self.peers.iter().position(|p| p.member_id == member_id) {
            let was_direct = self.peers[i].state == PathState::Direct;
            self.peers.swap_remove(i);
            if was_direct {
                self.route_changed(now_ns);
            }
        }
    }

    /// The server applied route list `seq`.
    pub fn routed(&mut self, seq: u32) {
        if seq > self.route_acked && seq <= self.route_seq {
            self.route_acked = seq;
            if self.route_acked == self.route_seq {
                self.route_retry_at = u64::MAX;
            }
        }
    }

    fn route_changed(&mut self, now: u64) {
        self.route_seq = self.route_seq.wrapping_add(1).max(1);
        self.push_out(Out::Route);
        self.route_retry_at = now + self.cfg.route_retry_ns;
    }

    fn push_out(&mut self, o: Out) {
        if self.out.len() >= OUT_CAPACITY {
            self.stats.transmit_drops += 1;
            return;
        }
        self.out.push_back(o);
    }

    fn push_event(&mut self, e: PathEvent) {
        if self.events.len() < self.events.capacity() {
            self.events.push_back(e);
        }
    }

    /// How long to wait before the next attempt after `failures` in a row.
    fn backoff(&self, failures: u32) -> u64 {
        let doublings = failures.saturating_sub(1).min(16);
        self.cfg
            .retry_after_ns
            .saturating_mul(1 << doublings)
            .min(self.cfg.retry_max_ns.max(self.cfg.retry_after_ns))
    }

    /// Moves peer `i` to `state`. Into [`PathState::Relayed`]: with `standby` set, the
    /// direct path is slower but kept; else this attempt failed and the next is scheduled.
    fn set_state(&mut self, now: u64, i: usize, state: PathState, died: bool) {
        let retry_in = self.backoff(self.peers[i].failures + 1);
        let p = &mut self.peers[i];
        let was_direct = p.state == PathState::Direct;
        p.state = state;
        p.move_since = u64::MAX;
        let member_id = p.member_id;
        match state {
            PathState::Direct => {
                p.standby = false;
                p.failures = 0;
                p.direct_count += 1;
                p.next_probe_at = now + self.cfg.keep_interval_ns;
                let (addr, rtt_ns) = (p.addr, p.rtt_ns.unwrap_or(0));
                if let Some(addr) = addr {
                    self.push_event(PathEvent::Direct {
                        member_id,
                        addr,
                        rtt_ns,
                    });
                }
                self.route_changed(now);
            }
            PathState::Relayed => {
                if died {
                    p.died += 1;
                    p.died_at = now.max(1);
                    p.standby = false;
                }
                if p.standby {
                    p.retry_at = u64::MAX;
                } else {
                    p.failures += 1;
                    p.retry_at = now + retry_in;
                    p.next_probe_at = u64::MAX;
                }
                self.push_event(PathEvent::Relayed { member_id, died });
                if was_direct {
                    self.route_changed(now);
                }
            }
            PathState::Punching => {}
        }
    }

    /// Queues the probes due for peer `i` and sets its next probe time.
    fn probe_due(&mut self, now: u64, i: usize) {
        let p = self.peers[i];
        match p.state {
            PathState::Punching => {
                for to in p.candidates.into_iter().flatten() {
                    self.send_probe(now, i, to);
                }
                self.peers[i].next_probe_at = now + self.cfg.punch_interval_ns;
            }
            PathState::Direct => {
                if let Some(to) = p.addr {
                    self.send_probe(now, i, to);
                }
                self.peers[i].next_probe_at = now + self.cfg.keep_interval_ns;
            }
            PathState::Relayed if p.standby => {
                if let Some(to) = p.addr {
                    self.send_probe(now, i, to);
                }
                self.peers[i].next_probe_at = now + self.cfg.keep_interval_ns;
            }
            PathState::Relayed => self.peers[i].next_probe_at = u64::MAX,
        }
    }

    fn send_probe(&mut self, now: u64, i: usize, to: SocketAddr) {
        let p = &mut self.peers[i];
        let seq = p.next_seq;
        p.next_seq = p.next_seq.wrapping_add(1).max(1);
        p.unanswered = p.unanswered.saturating_add(1);
        p.sent[seq as usize % SENT_RING] = (seq, now);
        let member_id = p.member_id;
        self.push_out(Out::Probe {
            member_id,
            to,
            seq,
            kind: ProbeKind::Probe,
            arrived: now,
        });
    }

    /// Takes a datagram that may be a `/netjam/probe` from `from`, received at `now_ns`.
    /// Returns whether it was one (valid or not); a probe is answered, an ack measured.
    pub fn handle_probe(&mut self, now_ns: u64, from: SocketAddr, bytes: &[u8]) -> bool {
        let Ok(Control::Probe(pr)) = Control::decode(bytes) else {
            return false;
        };
        let Some(i) = self
            .peers
            .iter()
            .position(|p| p.member_id == pr.from)
            .filter(|_| pr.to == self.me)
        else {
            self.stats.rejected += 1;
            return true;
        };
        let expect = auth::probe_mac(
            &self.peers[i].token,
            [
                pr.from,
                pr.to,
                pr.seq,
                pr.kind as u32,
                pr.server_rtt_us,
                pr.hold_us,
            ],
        );
        if !auth::ct_eq(&expect, pr.mac) {
            self.stats.rejected += 1;
            return true;
        }
        if pr.server_rtt_us > 0 {
            self.peers[i].peer_server_rtt_ns = Some(u64::from(pr.server_rtt_us) * 1_000);
        }
        match pr.kind {
            ProbeKind::Probe => {
                self.stats.probes_received += 1;
                self.push_out(Out::Probe {
                    member_id: pr.from,
                    to: from,
                    seq: pr.seq,
                    kind: ProbeKind::Ack,
                    arrived: now_ns,
                });
                let p = &mut self.peers[i];
                if !p.candidates.contains(&Some(from)) {
                    // Where its probes come from is where it can be reached (its router's
                    // mapping towards us): probe there too.
                    let slot = p.candidates[1 + MAX_HOSTS..]
                        .iter()
                        .position(Option::is_none)
                        .map_or(1 + MAX_HOSTS, |k| 1 + MAX_HOSTS + k);
                    p.candidates[slot] = Some(from);
                }
                // The other side punches now (it learned of us later, or it tries again
                // before we do): punch along, but not more often than we would retry.
                let first = p.died == 0 && p.direct_count == 0 && p.failures <= 1;
                let rested = now_ns >= p.punched_at.saturating_add(self.cfg.retry_after_ns);
                if p.state == PathState::Relayed && !p.standby && (first || rested) {
                    self.start_punching(now_ns, i);
                }
            }
            ProbeKind::Ack => self.ack(now_ns, i, from, pr.seq, u64::from(pr.hold_us) * 1_000),
        }
        true
    }

    fn ack(&mut self, now: u64, i: usize, from: SocketAddr, seq: u32, hold_ns: u64) {
        let slot = seq as usize % SENT_RING;
        let (sseq, at) = self.peers[i].sent[slot];
        if sseq != seq || seq == 0 || at > now {
            self.stats.rejected += 1;
            return;
        }
        self.stats.acks_received += 1;
        self.peers[i].sent[slot] = (0, 0);
        // The other side's own delay in answering is not the path's.
        let rtt = (now - at).saturating_sub(hold_ns).max(1);
        let relay = self.relay_rtt(&self.peers[i]);
        let (slack, band, hold) = (
            self.cfg.rtt_slack_ns,
            self.cfg.rtt_hysteresis_ns,
            self.cfg.switch_hold_ns,
        );
        let p = &mut self.peers[i];
        let best_before = p.direct_rtt();
        p.rtt_ns = Some(rtt);
        p.last_ack_at = now;
        p.unanswered = 0;
        p.rtts[p.rtt_next] = rtt;
        p.rtt_next = (p.rtt_next + 1) % RTT_WINDOW;
        let direct = p.direct_rtt().unwrap_or(rtt);
        // Within the slack of the way through the server (or that way is not measured yet).
        let fast_enough = relay.map_or(true, |r| direct <= r + slack);
        let too_slow = relay.is_some_and(|r| direct > r + slack + band);
        match p.state {
            PathState::Punching if fast_enough => {
                p.addr = Some(from);
                self.set_state(now, i, PathState::Direct, false);
            }
            PathState::Relayed
                if !p.standby
                    && p.died_at > 0
                    && at < p.died_at
                    && now < p.died_at + REVIVE_NS
                    && fast_enough =>
            {
                // The answer to a probe sent before the path was declared dead, and quick
                // but for the other side's own delay in answering: the path was alive, its
                // acks late because a thread at one end was held up (a busy machine), not
                // lost. Direct again at once, not after the retry's wait.
                p.addr = Some(from);
                p.died_at = 0;
                self.stats.revived += 1;
                self.set_state(now, i, PathState::Direct, false);
            }
            PathState::Punching => {
                // It answers, but slower: remember the quickest address that did.
                if best_before.map_or(true, |b| rtt <= b) {
                    p.addr = Some(from);
                }
            }
            PathState::Direct | PathState::Relayed => {
                let (in_use, standby) = (p.state == PathState::Direct, p.standby);
                let wants_move = if in_use { too_slow } else { standby && fast_enough };
                if !wants_move {
                    p.move_since = u64::MAX;
                } else if p.move_since == u64::MAX {
                    p.move_since = now;
                } else if now - p.move_since >= hold {
                    if in_use {
                        p.standby = true;
                        self.set_state(now, i, PathState::Relayed, false);
                    } else {
                        self.set_state(now, i, PathState::Direct, false);
                    }
                }
            }
        }
    }

    /// When a path that carries (or could carry) media is dead without a further ack, if
    /// [`DirectConfig::missed_limit`] probes were sent since the last one.
    fn dead_at(&self, p: &PeerPath) -> u64 {
        if p.unanswered < self.cfg.missed_limit {
            return u64::MAX;
        }
        let grace = p.rtt_ns.unwrap_or(0) + u64::from(self.cfg.missed_limit) * self.cfg.keep_interval_ns;
        p.last_ack_at.saturating_add(grace)
    }

    /// Runs the timers due at `now_ns`: probes, the end of punching, dead paths, route
    /// retries.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        for i in 0..self.peers.len() {
            let p = self.peers[i];
            match p.state {
                PathState::Punching if now_ns >= p.punch_until => {
                    // Answered, but slower than the server: keep it measured.
                    self.peers[i].standby = p.addr.is_some() && p.direct_rtt().is_some();
                    self.set_state(now_ns, i, PathState::Relayed, false);
                }
                PathState::Direct if now_ns > self.dead_at(&p) => {
                    self.set_state(now_ns, i, PathState::Relayed, true);
                    continue;
                }
                PathState::Relayed if p.standby && now_ns > self.dead_at(&p) => {
                    // The slower path stopped answering too: an attempt that failed.
                    let retry_in = self.backoff(p.failures + 1);
                    let q = &mut self.peers[i];
                    q.standby = false;
                    q.failures += 1;
                    q.retry_at = now_ns + retry_in;
                    q.next_probe_at = u64::MAX;
                    continue;
                }
                PathState::Relayed if now_ns >= p.retry_at => {
                    self.start_punching(now_ns, i);
                    continue;
                }
                _ => {}
            }
            if now_ns >= self.peers[i].next_probe_at {
                self.probe_due(now_ns, i);
            }
        }
        if now_ns >= self.route_retry_at && self.route_acked < self.route_seq {
            self.push_out(Out::Route);
            self.route_retry_at = now_ns + self.cfg.route_retry_ns;
        }
    }

    /// When [`DirectPaths::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut t = self.route_retry_at;
        for p in &self.peers {
            t = t.min(p.next_probe_at);
            match p.state {
                PathState::Punching => t = t.min(p.punch_until),
                PathState::Direct => t = t.min(self.dead_at(p).saturating_add(1)),
                PathState::Relayed if p.standby => t = t.min(self.dead_at(p).saturating_add(1)),
                PathState::Relayed => t = t.min(p.retry_at),
            }
        }
        (t != u64::MAX).then_some(t)
    }

    /// The next datagram to send at `now_ns`: written into `buf` (256 bytes always
    /// suffice), with where it goes. Call it right before sending: an ack says how long
    /// its probe waited here. Route lists go to the server before any probe queued after
    /// them.
    pub fn poll_transmit(&mut self, now_ns: u64, buf: &mut [u8]) -> Option<(Target, usize)> {
        loop {
            let o = self.out.pop_front()?;
            match o {
                Out::Route => {
                    if self.route_acked >= self.route_seq {
                        continue;
                    }
                    // The newest list, whenever it was queued.
                    let mut ids = [0u8; 4 * MAX_DIRECT];
                    let mut n = 0;
                    for p in self.peers.iter().filter(|p| p.state == PathState::Direct) {
                        ids[n..n + 4].copy_from_slice(&p.member_id.to_be_bytes());
                        n += 4;
                    }
                    let msg = Control::Route {
                        seq: self.route_seq,
                        direct: &ids[..n],
                    };
                    if let Ok(len) = msg.encode(buf) {
                        self.stats.routes_sent += 1;
                        return Some((Target::Server, len));
                    }
                }
                Out::Probe {
                    member_id,
                    to,
                    seq,
                    kind,
                    arrived,
                } => {
                    let Some(p) = self.peers.iter().find(|p| p.member_id == member_id) else {
                        continue;
                    };
                    let rtt_us = self
                        .server_rtt_ns
                        .map_or(0, |r| u32::try_from(r / 1_000).unwrap_or(u32::MAX).max(1));
                    let hold_us = match kind {
                        ProbeKind::Ack => {
                            u32::try_from(now_ns.saturating_sub(arrived) / 1_000).unwrap_or(u32::MAX)
                        }
                        ProbeKind::Probe => 0,
                    };
                    let mac =
                        auth::probe_mac(&p.token, [self.me, member_id, seq, kind as u32, rtt_us, hold_us]);
                    let msg = Control::Probe(Probe {
                        from: self.me,
                        to: member_id,
                        seq,
                        kind,
                        server_rtt_us: rtt_us,
                        hold_us,
                        mac: &mac,
                    });
                    if let Ok(len) = msg.encode(buf) {
                        self.stats.probes_sent += 1;
                        return Some((Target::Addr(to), len));
                    }
                }
            }
        }
    }

    /// The next path event.
    pub fn poll_event(&mut self) -> Option<PathEvent> {
        self.events.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u32, observed: &str, token: u8) -> PeerEntry {
        PeerEntry {
            seq: 1,
            member_id: id,
            observed: observed.parse().ok(),
            hosts: [None; MAX_HOSTS],
            token: [token; PAIR_TOKEN_LEN],
        }
    }

    /// Two clients facing each other with no server: every datagram delivered at once.
    fn exchange(a: &mut DirectPaths, b: &mut DirectPaths, now: u64, a_addr: SocketAddr, b_addr: SocketAddr) {
        let mut buf = [0u8; 256];
        for _ in 0..8 {
            while let Some((t, n)) = a.poll_transmit(now, &mut buf) {
                if t == Target::Addr(b_addr) {
                    b.handle_probe(now, a_addr, &buf[..n]);
                }
            }
            while let Some((t, n)) = b.poll_transmit(now, &mut buf) {
                if t == Target::Addr(a_addr) {
                    a.handle_probe(now + 1_000, b_addr, &buf[..n]);
                }
            }
        }
    }

    #[test]
    fn a_pair_that_answers_goes_direct_and_a_wrong_token_never_does() {
        let (aa, ba): (SocketAddr, SocketAddr) = ("1.1.1.1:1".parse().unwrap(), "2.2.2.2:2".parse().unwrap());
        let mut a = DirectPaths::new(DirectConfig::default(), 1);
        let mut b = DirectPaths::new(DirectConfig::default(), 2);
        a.set_peer(0, &entry(2, "2.2.2.2:2", 7));
        b.set_peer(0, &entry(1, "1.1.1.1:1", 7));
        exchange(&mut a, &mut b, 0, aa, ba);
        assert_eq!(a.path(2).map(|p| p.state), Some(PathState::Direct));
        assert!(a.route_table().direct().eq([ba]));
        // Until the server applies the list, media goes through it too.
        assert!(a.route_table().to_server);

        let mut c = DirectPaths::new(DirectConfig::default(), 1);
        let mut d = DirectPaths::new(DirectConfig::default(), 2);
        c.set_peer(0, &entry(2, "2.2.2.2:2", 7));
        d.set_peer(0, &entry(1, "1.1.1.1:1", 8));
        exchange(&mut c, &mut d, 0, aa, ba);
        assert_eq!(c.path(2).map(|p| p.state), Some(PathState::Punching));
        assert!(c.stats().rejected > 0 && d.stats().rejected > 0);
    }
    #[test]
    fn a_forwarded_port_declared_without_an_address_is_probed_where_the_server_sees_the_member() {
        let mut a = DirectPaths::new(DirectConfig::default(), 1);
        let mut e = entry(2, "2.2.2.2:2", 7);
        e.hosts[0] = "0.0.0.0:777".parse().ok();
        e.hosts[1] = "10.0.0.5:5".parse().ok();
        a.set_peer(0, &e);
        let mut buf = [0u8; 256];
        let mut to = Vec::new();
        while let Some((t, _)) = a.poll_transmit(0, &mut buf) {
            to.push(t);
        }
        for want in ["2.2.2.2:2", "2.2.2.2:777", "10.0.0.5:5"] {
            assert!(
                to.contains(&Target::Addr(want.parse().unwrap())),
                "{want}: {to:?}"
            );
        }
        assert!(!to
            .iter()
            .any(|t| matches!(t, Target::Addr(x) if x.ip().is_unspecified())));
        // Without an address from the server there is nothing to fill in.
        let mut b = DirectPaths::new(DirectConfig::default(), 1);
        e.observed = None;
        b.set_peer(0, &e);
        let mut probed = Vec::new();
        while let Some((t, _)) = b.poll_transmit(0, &mut buf) {
            if t != Target::Server {
                probed.push(t);
            }
        }
        assert_eq!(probed, [Target::Addr("10.0.0.5:5".parse().unwrap())]);
    }

    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;

    /// Two clients in virtual time on a direct link with a one-way delay (per datagram,
    /// from `delay`) that can be blocked; their round trip through the server is set.
    struct Pair {
        now: u64,
        a: DirectPaths,
        b: DirectPaths,
        addrs: [SocketAddr; 2],
        /// (deliver at, to b?, from, bytes)
        flying: Vec<(u64, bool, SocketAddr, Vec<u8>)>,
        blocked: bool,
        delay: Box<dyn FnMut(u64) -> u64>,
        /// (when, a's event)
        events: Vec<(u64, PathEvent)>,
        /// b's thread does not run before this (a busy machine): what reaches it waits,
        /// with when it came.
        b_stalled_until: u64,
        b_held: Vec<(u64, SocketAddr, Vec<u8>)>,
    }

    impl Pair {
        fn new(server_rtt: u64, delay: impl FnMut(u64) -> u64 + 'static) -> Self {
            let addrs: [SocketAddr; 2] = ["1.1.1.1:1".parse().unwrap(), "2.2.2.2:2".parse().unwrap()];
            let mut a = DirectPaths::new(DirectConfig::default(), 1);
            let mut b = DirectPaths::new(DirectConfig::default(), 2);
            a.set_server_rtt(server_rtt);
            b.set_server_rtt(server_rtt);
            a.set_peer(0, &entry(2, "2.2.2.2:2", 7));
            b.set_peer(0, &entry(1, "1.1.1.1:1", 7));
            Self {
                now: 0,
                a,
                b,
                addrs,
                flying: Vec::new(),
                blocked: false,
                delay: Box::new(delay),
                events: Vec::new(),
                b_stalled_until: 0,
                b_held: Vec::new(),
            }
        }

        fn flush(&mut self) {
            let mut buf = [0u8; 256];
            for to_b in [true, false] {
                if !to_b && self.now < self.b_stalled_until {
                    continue;
                }
                let (me, other) = if to_b { (0, 1) } else { (1, 0) };
                let p = if to_b { &mut self.a } else { &mut self.b };
                while let Some((t, n)) = p.poll_transmit(self.now, &mut buf) {
                    if t == Target::Addr(self.addrs[other]) && !self.blocked {
                        let at = self.now + (self.delay)(self.now);
                        self.flying.push((at, to_b, self.addrs[me], buf[..n].to_vec()));
                    }
                }
            }
            while let Some(e) = self.a.poll_event() {
                self.events.push((self.now, e));
            }
            // b's events are not looked at; the server applies every route list.
            while self.b.poll_event().is_some() {}
            self.a.routed(self.a.route_seq);
            self.b.routed(self.b.route_seq);
        }

        fn run_until(&mut self, until: u64) {
            loop {
                self.flush();
                let stalled = self.now < self.b_stalled_until;
                let b_next = if stalled {
                    Some(self.b_stalled_until)
                } else {
                    self.b.poll_timeout()
                };
                let next = [self.a.poll_timeout(), b_next]
                    .into_iter()
                    .flatten()
                    .chain(self.flying.iter().map(|f| f.0))
                    .min()
                    .unwrap_or(u64::MAX);
                if next > until {
                    self.now = until;
                    return;
                }
                self.now = self.now.max(next);
                let now = self.now;
                let (due, later): (Vec<_>, Vec<_>) = self.flying.drain(..).partition(|f| f.0 <= now);
                self.flying = later;
                let stalled = now < self.b_stalled_until;
                if !stalled {
                    for (at, from, bytes) in std::mem::take(&mut self.b_held) {
                        self.b.handle_probe(at, from, &bytes);
                    }
                }
                for (_, to_b, from, bytes) in due {
                    if to_b && stalled {
                        self.b_held.push((now, from, bytes));
                        continue;
                    }
                    let p = if to_b { &mut self.b } else { &mut self.a };
                    p.handle_probe(now, from, &bytes);
                }
                for (p, runs) in [(&mut self.a, true), (&mut self.b, !stalled)] {
                    if runs && p.poll_timeout().is_some_and(|t| t <= now) {
                        p.handle_timeout(now);
                    }
                }
            }
        }

        fn state(&self) -> PathState {
            self.a.path(2).map(|p| p.state).expect("a path to b")
        }

        /// When a's path became direct and when it went back to the server, from `since`.
        fn changes(&self, since: u64) -> Vec<(u64, bool)> {
            self.events
                .iter()
                .filter(|(t, _)| *t >= since)
                .map(|(t, e)| (*t, matches!(e, PathEvent::Direct { .. })))
                .collect()
        }
    }

    #[test]
    fn a_pair_that_found_no_path_tries_again_backing_off_and_goes_direct_once_let_through() {
        let mut w = Pair::new(20 * MS, |_| 2 * MS);
        w.blocked = true;
        w.run_until(25 * S);
        // Attempts start at 0, 11 s (10 s after the first gave up) and 32 s (20 s after
        // the second): the second has given up, the third has not started.
        let gave_up: Vec<u64> = w.changes(0).iter().map(|c| c.0).collect();
        assert_eq!(gave_up, [S, 12 * S]);
        assert_eq!(w.a.path(2).map(|p| p.failures), Some(2));
        assert!(w.a.route_table().to_server && w.a.route_table().direct().count() == 0);
        // The routers let them through; the next attempt finds the path.
        w.blocked = false;
        w.run_until(40 * S);
        let c = w.changes(25 * S);
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(c[0].1 && (32 * S..32 * S + 10 * MS).contains(&c[0].0), "{c:?}");
        assert_eq!(w.state(), PathState::Direct);
        assert!(w.a.route_table().direct().eq([w.addrs[1]]));

        // The direct path dies: through the server at once, punching again 10 s later
        // (a path that worked starts the back-off over), and direct again once it answers.
        w.blocked = true;
        let cut = w.now;
        w.run_until(cut + 15 * S);
        let c = w.changes(cut);
        assert_eq!(c.len(), 2, "{c:?}");
        assert!(!c[0].1 && c[0].0 - cut <= 150 * MS, "{c:?}");
        assert_eq!(
            (c[1].1, c[1].0 - c[0].0),
            (false, 11 * S),
            "gave up 10 s + 1 s later"
        );
        w.blocked = false;
        w.run_until(cut + 45 * S);
        let c = w.changes(cut);
        assert_eq!(c.len(), 3, "{c:?}");
        // The next attempt, 20 s on, finds it in one round trip.
        assert!(
            c[2].1 && (20 * S..20 * S + 10 * MS).contains(&(c[2].0 - c[1].0)),
            "{c:?}"
        );
    }

    /// The other side's thread held up for 150 ms (a busy machine): no acks for twice the
    /// dead limit, so the path is declared dead and media goes through the server; then its
    /// answers come, late only by its own delay in answering, and the path is direct again
    /// at once instead of after the 10 s retry.
    #[test]
    fn a_direct_path_whose_other_end_was_held_up_comes_back_at_once() {
        let mut pair = Pair::new(10 * MS, |_| MS);
        pair.run_until(S);
        assert_eq!(pair.state(), PathState::Direct);
        let stall = pair.now;
        pair.b_stalled_until = stall + 150 * MS;
        pair.run_until(stall + 140 * MS);
        assert_eq!(
            pair.state(),
            PathState::Relayed,
            "declared dead while b said nothing"
        );
        pair.run_until(stall + 160 * MS);
        assert_eq!(pair.state(), PathState::Direct, "{:?}", pair.changes(stall));
        assert_eq!(pair.a.stats().revived, 1);
        // And it holds.
        pair.run_until(stall + 2 * S);
        assert_eq!(pair.changes(stall).len(), 2, "{:?}", pair.changes(stall));
    }

    /// This side's own thread held up for 150 ms (with the other's: a machine that
    /// stalled): it sent no probe meanwhile and heard no answer for none, so on waking it
    /// probes, and the path holds.
    #[test]
    fn a_direct_path_outlives_a_stall_of_this_side() {
        let mut pair = Pair::new(10 * MS, |_| MS);
        pair.run_until(S);
        assert_eq!(pair.state(), PathState::Direct);
        let stall = pair.now;
        pair.now += 150 * MS;
        pair.run_until(stall + 2 * S);
        assert_eq!(pair.state(), PathState::Direct);
        assert!(pair.changes(stall).is_empty(), "{:?}", pair.changes(stall));
    }

    /// A path that is really gone stays gone: no answer comes to revive it.
    #[test]
    fn a_direct_path_that_is_cut_is_not_revived() {
        let mut pair = Pair::new(10 * MS, |_| MS);
        pair.run_until(S);
        let cut = pair.now;
        pair.blocked = true;
        pair.run_until(cut + 2 * S);
        assert_eq!(pair.state(), PathState::Relayed);
        assert_eq!(pair.a.stats().revived, 0);
    }

    #[test]
    fn retries_back_off_to_the_longest_wait_and_stay_there() {
        let mut w = Pair::new(20 * MS, |_| 2 * MS);
        w.blocked = true;
        w.run_until(400 * S);
        let gave_up: Vec<u64> = w.changes(0).iter().map(|c| c.0 / MS).collect();
        let gaps: Vec<u64> = gave_up.windows(2).map(|g| g[1] - g[0]).collect();
        // 1 s of punching after each wait.
        assert_eq!(
            gaps,
            [11_000, 21_000, 41_000, 61_000, 61_000, 61_000, 61_000, 61_000]
        );
        let st = w.a.stats();
        // Probes only while punching: 50 per attempt to the one candidate.
        assert!(st.probes_sent <= 9 * 51, "{st:?}");
    }

    #[test]
    fn media_leaves_a_direct_path_that_became_slower_and_comes_back_with_hysteresis() {
        use std::cell::Cell;
        use std::rc::Rc;
        // Through the server: 5 ms + 5 ms. Direct one way: settable.
        let one_way = Rc::new(Cell::new(2 * MS));
        let d = one_way.clone();
        let mut w = Pair::new(5 * MS, move |_| d.get());
        w.run_until(2 * S);
        assert_eq!(w.state(), PathState::Direct);
        let info = w.a.path(2).expect("path");
        assert_eq!((info.direct_rtt_ms, info.relay_rtt_ms), (Some(4.0), Some(10.0)));

        // Slower by 0.5 ms, inside the slack, then by 1.5 ms, inside the band: stays.
        for rtt in [10_500_000, 11_500_000] {
            one_way.set(rtt / 2);
            let t = w.now;
            w.run_until(t + 10 * S);
            assert!(w.changes(t).is_empty(), "{rtt}: {:?}", w.changes(t));
            assert_eq!(w.state(), PathState::Direct);
        }
        // Slower by 3 ms: media goes through the server after the hold (plus the window
        // of acks that still remember the faster path), and the path is kept measured.
        one_way.set(6_500_000);
        let t = w.now;
        w.run_until(t + 10 * S);
        let c = w.changes(t);
        assert_eq!(c.len(), 1, "{c:?}");
        let after = c[0].0 - t;
        assert!(!c[0].1 && (S..S + 250 * MS).contains(&after), "{after}");
        assert!(matches!(
            w.events.last(),
            Some((_, PathEvent::Relayed { died: false, .. }))
        ));
        let info = w.a.path(2).expect("path");
        assert_eq!(
            (info.state, info.slower, info.direct_rtt_ms),
            (PathState::Relayed, true, Some(13.0))
        );
        assert!(w.a.route_table().to_server && w.a.route_table().direct().count() == 0);

        // Back inside the band: stays on the server (hysteresis).
        one_way.set(5_750_000);
        let t = w.now;
        w.run_until(t + 10 * S);
        assert!(w.changes(t).is_empty(), "{:?}", w.changes(t));
        assert_eq!(w.a.path(2).map(|p| p.slower), Some(true));
        // Within the slack again: direct after the hold.
        one_way.set(5_250_000);
        let t = w.now;
        w.run_until(t + 10 * S);
        let c = w.changes(t);
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(c[0].1 && (S..S + 250 * MS).contains(&(c[0].0 - t)), "{c:?}");
        assert!(w.a.route_table().direct().eq([w.addrs[1]]));

        // A slower path that then stops answering: an attempt that failed, retried later.
        one_way.set(6_500_000);
        let t = w.now;
        w.run_until(t + 5 * S);
        w.blocked = true;
        let t = w.now;
        w.run_until(t + S);
        let info = w.a.path(2).expect("path");
        assert_eq!(
            (info.state, info.slower, info.failures),
            (PathState::Relayed, false, 1)
        );
    }

    #[test]
    fn a_jittery_direct_path_near_the_edge_does_not_flap() {
        // Through the server 10 ms; direct 10 ms plus 0-6 ms of jitter (an LCG): its smallest
        // recent round trip sits within the slack, single acks often beyond the band.
        let mut x = 12_345u64;
        let mut w = Pair::new(5 * MS, move |_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            5 * MS + (x >> 33) % (3 * MS)
        });
        w.run_until(120 * S);
        let c = w.changes(0);
        assert!(c.first().is_some_and(|c| c.1), "{c:?}");
        assert!(c.len() <= 2, "flapped: {c:?}");
    }

    #[test]
    fn a_path_slower_from_the_start_is_kept_measured_and_taken_once_it_is_not() {
        use std::cell::Cell;
        use std::rc::Rc;
        let one_way = Rc::new(Cell::new(8 * MS));
        let d = one_way.clone();
        let mut w = Pair::new(5 * MS, move |_| d.get());
        w.run_until(3 * S);
        let info = w.a.path(2).expect("path");
        assert_eq!((info.state, info.slower), (PathState::Relayed, true));
        assert_eq!(info.failures, 0);
        one_way.set(3 * MS);
        let t = w.now;
        w.run_until(t + 3 * S);
        let c = w.changes(t);
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(c[0].1 && c[0].0 - t <= S + 250 * MS, "{c:?}");
    }
}
