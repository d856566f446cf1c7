//! Rooms in virtual time: clients and the server exchange datagrams through an in-memory
//! network (1 ms one way, optional seeded loss) driven by their `poll_timeout`s.
//! Join, leave, timeout, rejoin after a NAT rebinding, wrong password, SSRC collisions,
//! forged and spoofed traffic, policing of a flooding member, per-destination queues,
//! roster delivery over a path that loses half the control packets (where joins retried
//! after a lost welcome must not replace their own seat), and names: one player per name
//! in a room, a restarted player replacing its ghost, rooms matched whatever the case.
//!
//! The scenarios marked `sealed!` run a second time with the control channel on (the
//! server holds a static key, every client pins it), as every `netjam server` runs.

use std::cell::Cell;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::SocketAddr;

use netjam_engine::rng::SimRng;
use netjam_engine::room::auth;
use netjam_engine::room::msg::{Control, RekeyStatus, ENS_EVERYONE, MAX_CONTROL_LEN, MAX_ENS_LEN};
use netjam_engine::room::secure::{self, StaticKey};
use netjam_engine::room::{
    ClientConfig, DropReason, RefuseCode, RoomClient, RoomEvent, RosterKind, Server, ServerConfig, Verdict,
};

const MS: u64 = 1_000_000;
const SECRET: [u8; 32] = [42; 32];
/// The static key of the sealed runs' server.
const SERVER_KEY: [u8; 32] = [5; 32];

thread_local! {
    /// This thread's scenario runs with the control channel on.
    static SEALED: Cell<bool> = const { Cell::new(false) };
}

/// A second test that runs `$scenario` with the control channel on.
macro_rules! sealed {
    ($sealed:ident, $scenario:ident) => {
        #[test]
        fn $sealed() {
            SEALED.with(|s| s.set(true));
            $scenario();
        }
    };
}

fn addr(i: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 40_000 + i))
}

fn rtp(ssrc: u32, seq: u16, payload: usize) -> Vec<u8> {
    let mut b = vec![0u8; 12 + payload];
    b[0] = 0x80;
    b[1] = 96;
    b[2..4].copy_from_slice(&seq.to_be_bytes());
    b[8..12].copy_from_slice(&ssrc.to_be_bytes());
    b
}

/// An RTCP receiver report (no report blocks) from `ssrc`.
fn rtcp_rr(ssrc: u32) -> Vec<u8> {
    let mut b = vec![0x80, 201, 0, 1];
    b.extend_from_slice(&ssrc.to_be_bytes());
    b
}

struct Peer {
    addr: SocketAddr,
    client: RoomClient,
    events: Vec<RoomEvent>,
    alive: bool,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: std::cmp::Reverse<(u64, u64)>,
    to_server: bool,
    src: SocketAddr,
    dst: SocketAddr,
    bytes: Vec<u8>,
}

struct World {
    now: u64,
    server: Server,
    peers: Vec<Peer>,
    queue: BinaryHeap<InFlight>,
    serial: u64,
    loss: f64,
    rng: SimRng,
    /// Bytes the server sent to each address.
    sent_to: BTreeMap<SocketAddr, usize>,
    /// `/netjam/ens` the server relayed: (to, bytes).
    ens_heard: Vec<(SocketAddr, Vec<u8>)>,
    /// The control channel is on.
    sealed: bool,
    /// Every datagram either way, as it crossed the network.
    wire: Vec<Vec<u8>>,
    /// Keys the clients reported to pin, per peer.
    pinned: Vec<(usize, [u8; 32])>,
    /// The path's one-way delay, either way.
    one_way: u64,
    /// While the server's process does not run: what reached its socket since (the
    /// first [`HELD_MAX`], as a full receive buffer), with when it came.
    held: Option<Vec<(u64, SocketAddr, Vec<u8>)>>,
}

/// Datagrams a stopped server's socket holds.
const HELD_MAX: usize = 64;

impl World {
    fn new(cfg: ServerConfig, loss: f64, seed: u64) -> Self {
        let sealed = SEALED.with(Cell::get);
        let mut server = Server::new(cfg, SECRET);
        if sealed {
            server.set_static_key(StaticKey::from_private(SERVER_KEY));
        }
        Self {
            now: 1_000 * MS,
            server,
            sealed,
            wire: Vec::new(),
            pinned: Vec::new(),
            one_way: MS,
            held: None,
            peers: Vec::new(),
            queue: BinaryHeap::new(),
            serial: 0,
            loss,
            rng: SimRng::new(seed),
            sent_to: BTreeMap::new(),
            ens_heard: Vec::new(),
        }
    }

    fn add(&mut self, i: u16, room: &str, name: &str, password: &str, ssrc: u32) -> usize {
        self.add_with(i, room, name, password, ssrc, 750)
    }

    /// A seat declaring `pps` media packets per second (0: a seat without media).
    fn add_with(&mut self, i: u16, room: &str, name: &str, password: &str, ssrc: u32, pps: u32) -> usize {
        self.add_at(i, room, name, password, ssrc, pps, 0)
    }

    /// A seat declaring `pps` media packets per second and a sample rate (0: not said).
    #[allow(clippy::too_many_arguments)]
    fn add_at(
        &mut self,
        i: u16,
        room: &str,
        name: &str,
        password: &str,
        ssrc: u32,
        pps: u32,
        rate: u32,
    ) -> usize {
        let mut cfg = ClientConfig::new(room, name, password, ssrc);
        cfg.packets_per_s = pps;
        cfg.bytes_per_s = pps * 300;
        cfg.nonce_seed = [i as u8; 16];
        cfg.sample_rate = rate;
        cfg.secure = self.sealed;
        self.peers.push(Peer {
            addr: addr(i),
            client: RoomClient::new(cfg, self.now),
            events: Vec::new(),
            alive: true,
        });
        self.peers.len() - 1
    }

    fn send(&mut self, to_server: bool, src: SocketAddr, dst: SocketAddr, bytes: Vec<u8>) {
        if self.loss > 0.0 && self.rng.chance(self.loss) {
            return;
        }
        self.serial += 1;
        self.wire.push(bytes.clone());
        self.queue.push(InFlight {
            at: std::cmp::Reverse((self.now + self.one_way, self.serial)),
            to_server,
            src,
            dst,
            bytes,
        });
    }

    fn flush(&mut self) {
        let mut buf = [0u8; MAX_ENS_LEN];
        for i in 0..self.peers.len() {
            while let Some(n) = self.peers[i].client.poll_transmit(&mut buf) {
                let src = self.peers[i].addr;
                if self.peers[i].alive {
                    self.send(true, src, addr(0), buf[..n].to_vec());
                }
            }
            while let Some(e) = self.peers[i].client.poll_event() {
                match e {
                    RoomEvent::ServerKey { key } => self.pinned.push((i, key)),
                    e => self.peers[i].events.push(e),
                }
            }
        }
        while let Some((dst, n)) = self.server.poll_transmit(&mut buf) {
            *self.sent_to.entry(dst).or_default() += n;
            self.send(false, addr(0), dst, buf[..n].to_vec());
        }
    }

    /// Runs the network until `until` (absolute virtual time).
    fn run_until(&mut self, until: u64) {
        self.flush();
        loop {
            let mut next = self.queue.peek().map_or(u64::MAX, |p| p.at.0 .0);
            if let Some(t) = self.server.poll_timeout().filter(|_| self.held.is_none()) {
                next = next.min(t);
            }
            for p in self.peers.iter().filter(|p| p.alive) {
                if let Some(t) = p.client.poll_timeout() {
                    next = next.min(t);
                }
            }
            if next > until {
                self.now = until;
                return;
            }
            self.now = self.now.max(next);
            while self.queue.peek().is_some_and(|p| p.at.0 .0 <= self.now) {
                let Some(p) = self.queue.pop() else { break };
                if let (true, Some(held)) = (p.to_server, self.held.as_mut()) {
                    if held.len() < HELD_MAX {
                        held.push((self.now, p.src, p.bytes));
                    }
                } else if p.to_server {
                    let _ = self.server.handle_datagram(self.now, p.src, &p.bytes);
                } else if p.bytes.starts_with(b"/netjam/ens") {
                    self.ens_heard.push((p.dst, p.bytes));
                } else if let Some(peer) = self.peers.iter_mut().find(|q| q.alive && q.addr == p.dst) {
                    peer.client.handle_datagram(self.now, &p.bytes);
                }
            }
            if self.held.is_none() {
                self.server.handle_timeout(self.now);
            }
            for p in self.peers.iter_mut().filter(|p| p.alive) {
                p.client.handle_timeout(self.now);
            }
            self.flush();
        }
    }

    /// The server's process stops: nothing it does until [`World::cont`].
    fn stop_server(&mut self) {
        self.held = Some(Vec::new());
    }

    /// The server's process runs again after `stalled` without running: it reads what
    /// its socket held (stamped when it came), is told of its stall, then runs its timers.
    fn cont_server(&mut self, stalled: Option<u64>) {
        for (at, src, bytes) in self.held.take().unwrap_or_default() {
            let _ = self.server.handle_datagram(at, src, &bytes);
        }
        if let Some(d) = stalled {
            self.server.stalled(self.now, d);
        }
        self.server.handle_timeout(self.now);
        self.flush();
    }

    fn run_for(&mut self, d: u64) {
        let t = self.now + d;
        self.run_until(t);
    }

    fn seat(&self, i: usize) -> (u32, u32) {
        self.peers[i].client.seat().expect("seated")
    }

    fn roster(&self, i: usize) -> Vec<(RosterKind, String)> {
        self.peers[i]
            .events
            .iter()
            .filter_map(|e| match e {
                RoomEvent::Roster(r) => Some((r.kind, r.name.clone())),
                _ => None,
            })
            .collect()
    }

    /// Media from `src` straight into the server; the destinations it names.
    fn media(&mut self, src: SocketAddr, bytes: &[u8]) -> Result<Vec<SocketAddr>, DropReason> {
        match self.server.handle_datagram(self.now, src, bytes) {
            Verdict::Forward(d) => {
                let d: Vec<_> = d.to_vec();
                for x in &d {
                    self.server.sent(x.id);
                }
                Ok(d.iter().map(|x| x.addr).collect())
            }
            Verdict::Drop(r) => Err(r),
            Verdict::Control | Verdict::ClockProbe => panic!("media taken as control"),
        }
    }

    /// A peer sends `/netjam/ens` for member `to` carrying `payload`.
    fn ens(&mut self, from: usize, to: u32, payload: &[u8]) {
        let mut buf = [0u8; MAX_ENS_LEN];
        let n = Control::Ens {
            member_id: to,
            payload,
        }
        .encode(&mut buf)
        .expect("encode");
        let src = self.peers[from].addr;
        self.send(true, src, addr(0), buf[..n].to_vec());
    }

    /// What the server relayed to `to` so far: (from member id, payload), then forgets it.
    fn ens_to(&mut self, to: SocketAddr) -> Vec<(u32, Vec<u8>)> {
        let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.ens_heard)
            .into_iter()
            .partition(|(d, _)| *d == to);
        self.ens_heard = rest;
        mine.iter()
            .filter_map(|(_, b)| match Control::decode(b) {
                Ok(Control::Ens { member_id, payload }) => Some((member_id, payload.to_vec())),
                _ => None,
            })
            .collect()
    }
}

fn joined(events: &[RoomEvent]) -> Vec<(u32, u32, bool)> {
    events
        .iter()
        .filter_map(|e| match e {
            RoomEvent::Joined {
                member_id,
                ssrc,
                rejoined,
            } => Some((*member_id, *ssrc, *rejoined)),
            _ => None,
        })
        .collect()
}

#[test]
fn members_join_hear_of_each_other_and_forward_to_the_others_only() {
    let mut w = World::new(ServerConfig::default(), 0.0, 1);
    let a = w.add(1, "band", "Ana", "secret", 0x1111);
    w.run_for(100 * MS);
    let b = w.add(2, "band", "Bo", "secret", 0x2222);
    let c = w.add(3, "band", "Cy", "secret", 0x3333);
    w.run_for(500 * MS);
    for i in [a, b, c] {
        assert_eq!(
            joined(&w.peers[i].events).len(),
            1,
            "peer {i}: {:?}",
            w.peers[i].events
        );
    }
    assert_eq!(w.seat(a).1, 0x1111);
    // Each hears exactly of the other two, never of itself.
    let mut names: Vec<_> = w.roster(a).into_iter().map(|(_, n)| n).collect();
    names.sort();
    assert_eq!(names, ["Bo", "Cy"]);
    let mut names: Vec<_> = w.roster(c).into_iter().map(|(_, n)| n).collect();
    names.sort();
    assert_eq!(names, ["Ana", "Bo"]);
    assert!(w.roster(b).iter().all(|(k, _)| *k == RosterKind::Joined));

    let mut dests = w.media(addr(1), &rtp(0x1111, 1, 200)).expect("forwarded");
    dests.sort();
    assert_eq!(dests, [addr(2), addr(3)]);
    let dests = w.media(addr(2), &rtcp_rr(0x2222)).expect("RTCP forwarded");
    assert_eq!(dests.len(), 2);
    assert!(!dests.contains(&addr(2)));

    // Leave: the others hear `left`; a joiner in another room hears nothing of this one.
    let other = w.add(9, "other", "Zed", "", 0x1111);
    w.peers[b].client.leave(w.now);
    w.run_for(500 * MS);
    assert_eq!(w.roster(a).last(), Some(&(RosterKind::Left, "Bo".to_owned())));
    assert_eq!(w.roster(c).last(), Some(&(RosterKind::Left, "Bo".to_owned())));
    assert!(w.roster(other).is_empty());
    assert_eq!(w.seat(other).1, 0x1111, "SSRCs are per room");
    assert_eq!(
        w.media(addr(2), &rtp(0x2222, 2, 200)),
        Err(DropReason::UnknownSource)
    );
    let s = w.server.stats();
    assert_eq!((s.members, s.rooms, s.leaves), (3, 2, 1));
}

#[test]
fn a_silent_member_times_out_and_the_room_is_told() {
    let mut w = World::new(ServerConfig::default(), 0.0, 2);
    let a = w.add(1, "band", "Ana", "", 1);
    let b = w.add(2, "band", "Bo", "", 2);
    w.run_for(500 * MS);
    assert!(w.peers[b].client.seat().is_some());
    // Bo's machine vanishes: no leave, no keep-alives.
    w.peers[b].alive = false;
    let gone = w.now;
    w.run_for(4 * 1_000 * MS);
    assert!(
        !w.roster(a).iter().any(|(k, _)| *k == RosterKind::Timeout),
        "too early"
    );
    w.run_for(2 * 1_000 * MS);
    assert_eq!(w.roster(a).last(), Some(&(RosterKind::Timeout, "Bo".to_owned())));
    assert_eq!(w.server.stats().timeouts, 1);
    // Ana kept sending keep-alives and is still seated long after.
    w.run_for(20 * 1_000 * MS);
    assert!(w.peers[a].client.seat().is_some());
    assert!(!w.peers[a].events.contains(&RoomEvent::Lost));
    assert!(w.now - gone > 5_000 * MS);
}

#[test]
fn wrong_password_is_refused_and_the_first_joiner_fixes_the_password() {
    let mut w = World::new(ServerConfig::default(), 0.0, 3);
    let a = w.add(1, "band", "Ana", "right", 1);
    w.run_for(300 * MS);
    let b = w.add(2, "band", "Bo", "wrong", 2);
    let open = w.add(3, "open", "Cy", "", 3);
    w.run_for(300 * MS);
    assert!(w.peers[a].client.seat().is_some());
    assert!(
        w.peers[open].client.seat().is_some(),
        "rooms without password work"
    );
    assert!(w.peers[b].client.seat().is_none());
    assert!(matches!(
        w.peers[b].events.as_slice(),
        [RoomEvent::Refused {
            code: Some(RefuseCode::WrongPassword),
            ..
        }]
    ));
    assert!(w.roster(a).is_empty(), "a refused joiner is never announced");
    // A refused client stops asking.
    let before = w.server.stats().refused;
    w.run_for(5_000 * MS);
    assert_eq!(w.server.stats().refused, before);
}

#[test]
fn ssrc_collisions_are_resolved_and_forged_ssrcs_never_forwarded() {
    let mut w = World::new(ServerConfig::default(), 0.0, 4);
    let a = w.add(1, "band", "Ana", "", 0xABCD);
    w.run_for(200 * MS);
    let b = w.add(2, "band", "Bo", "", 0xABCD);
    w.run_for(200 * MS);
    let (_, sa) = w.seat(a);
    let (_, sb) = w.seat(b);
    assert_eq!(sa, 0xABCD);
    assert_ne!(sb, sa, "the second member gets another SSRC");
    // Bo learns Ana's SSRC from the roster and Ana Bo's.
    assert!(w.peers[b]
        .events
        .iter()
        .any(|e| matches!(e, RoomEvent::Roster(r) if r.ssrc == sa)));
    assert!(w.peers[a]
        .events
        .iter()
        .any(|e| matches!(e, RoomEvent::Roster(r) if r.ssrc == sb)));

    // Bo claims Ana's SSRC: dropped, counted against Bo.
    for k in 0..10 {
        assert_eq!(w.media(addr(2), &rtp(sa, k, 100)), Err(DropReason::ForgedSsrc));
    }
    assert_eq!(w.media(addr(2), &rtcp_rr(sa)), Err(DropReason::ForgedSsrc));
    // A compound whose second packet names someone else is forged too.
    let mut compound = rtcp_rr(sb);
    compound.extend(rtcp_rr(sa));
    assert_eq!(w.media(addr(2), &compound), Err(DropReason::ForgedSsrc));
    // What every receiver sorts as RTCP (RFC 5761: a second byte of 192..=223) but is no
    // RTCP packet type in use (200..=207) is neither RTP nor RTCP: malformed, even with
    // Bo's own SSRC where an RTP header would carry it.
    for second in [192u8, 199, 208, 223] {
        let mut odd = rtp(sb, 12, 100);
        odd[1] = second;
        assert_eq!(
            w.media(addr(2), &odd),
            Err(DropReason::Malformed),
            "second byte {second}"
        );
    }
    // A stranger with Ana's SSRC: dropped as an unknown source.
    assert_eq!(w.media(addr(7), &rtp(sa, 1, 100)), Err(DropReason::UnknownSource));
    // Bo's own packets still flow.
    assert_eq!(w.media(addr(2), &rtp(sb, 11, 100)), Ok(vec![addr(1)]));
    let stats = w.server.member_stats();
    let bo = stats.iter().find(|m| m.name == "Bo").expect("Bo");
    assert_eq!(bo.forged_drops, 12);
    assert_eq!(bo.forwarded, 1);
    let ana = stats.iter().find(|m| m.name == "Ana").expect("Ana");
    assert_eq!(ana.sent_to, 1, "Ana received only Bo's own packet");
    assert_eq!(w.server.stats().unknown_source, 1);
}

#[test]
fn a_member_whose_address_changes_keeps_its_seat_after_reauthenticating() {
    let mut w = World::new(ServerConfig::default(), 0.0, 5);
    let a = w.add(1, "band", "Ana", "pw", 10);
    let b = w.add(2, "band", "Bo", "pw", 20);
    w.run_for(300 * MS);
    let (id_a, ssrc_a) = w.seat(a);
    // Ana's NAT gives her a new port; she does not know it yet and keeps sending media.
    w.peers[a].addr = addr(101);
    assert_eq!(
        w.media(addr(101), &rtp(ssrc_a, 1, 160)),
        Err(DropReason::UnknownSource)
    );
    w.run_for(5 * MS);
    assert!(w.server.stats().rebind_hints >= 1);
    w.run_for(300 * MS);
    assert_eq!(joined(&w.peers[a].events).last(), Some(&(id_a, ssrc_a, true)));
    assert_eq!(w.server.stats().rejoins, 1);
    // Same seat: media from the new address flows, to the old one nothing goes.
    assert_eq!(w.media(addr(101), &rtp(ssrc_a, 2, 160)), Ok(vec![addr(2)]));
    let (_, ssrc_b) = w.seat(b);
    assert_eq!(w.media(addr(2), &rtp(ssrc_b, 1, 160)), Ok(vec![addr(101)]));
    assert_eq!(
        w.media(addr(1), &rtp(ssrc_a, 3, 160)),
        Err(DropReason::UnknownSource)
    );
    // Bo heard nothing about it: still one `joined` for Ana.
    assert_eq!(w.roster(b), [(RosterKind::Joined, "Ana".to_owned())]);

    // The client may also say it moved (a new network).
    w.peers[a].addr = addr(102);
    w.peers[a].client.address_changed(w.now);
    w.run_for(300 * MS);
    assert_eq!(joined(&w.peers[a].events).last(), Some(&(id_a, ssrc_a, true)));
    assert_eq!(w.media(addr(2), &rtp(ssrc_b, 2, 160)), Ok(vec![addr(102)]));
    // A stolen session token without the password does not take the seat: the rejoin
    // authenticator is keyed by the room key, checked in the server's unit of work.
    assert!(w.server.member_stats().iter().any(|m| m.addr == addr(102)));
}

#[test]
fn a_restarted_server_sends_the_client_back_through_a_fresh_join() {
    let mut w = World::new(ServerConfig::default(), 0.0, 6);
    let a = w.add(1, "band", "Ana", "", 10);
    w.run_for(300 * MS);
    let (id, _) = w.seat(a);
    w.server = Server::new(ServerConfig::default(), [7; 32]);
    // Its next keep-alive reaches a server that does not know it: the rebind hint sends
    // it through hello and rejoin, the unknown seat turns that into a join.
    w.run_for(12_000 * MS);
    let j = joined(&w.peers[a].events);
    assert_eq!(j.len(), 2, "{:?}", w.peers[a].events);
    assert_eq!(j[0].0, id);
    assert!(!j[1].2, "a fresh seat, not a rejoin");
    assert!(w.peers[a].client.seat().is_some());
}

#[test]
fn a_spoofed_source_gets_nothing_more_than_it_sent() {
    let mut w = World::new(ServerConfig::default(), 0.0, 7);
    let a = w.add(1, "band", "Ana", "", 10);
    w.run_for(300 * MS);
    let (_, ssrc_a) = w.seat(a);
    let attacker = addr(66);
    let victim = addr(77);
    let mut from_attacker = 0usize;
    let mut from_victim = 0usize;
    let mut buf = [0u8; MAX_CONTROL_LEN];
    let drain = |w: &mut World| {
        let mut out = [0u8; MAX_CONTROL_LEN];
        while let Some((dst, n)) = w.server.poll_transmit(&mut out) {
            *w.sent_to.entry(dst).or_default() += n;
        }
    };
    // A short hello (would amplify): nothing.
    let n = Control::Hello { pad: 0 }.encode(&mut buf).expect("hello");
    let short = buf[..n].to_vec();
    assert!(matches!(
        w.server.handle_datagram(w.now, victim, &short),
        Verdict::Drop(_)
    ));
    from_victim += short.len();
    drain(&mut w);
    // Hellos spoofed from the victim's address: each challenge no longer than its hello.
    let n = Control::Hello {
        pad: netjam_engine::room::msg::HELLO_PAD,
    }
    .encode(&mut buf)
    .expect("hello");
    let hello = buf[..n].to_vec();
    for _ in 0..100 {
        let _ = w.server.handle_datagram(w.now, victim, &hello);
        from_victim += hello.len();
    }
    drain(&mut w);
    // The attacker learns a cookie for its own address and replays it as the victim, and
    // replays a cookie made for the victim from its own address: neither gets a seat.
    let _ = w.server.handle_datagram(w.now, attacker, &hello);
    from_attacker += hello.len();
    let mut chal = [0u8; MAX_CONTROL_LEN];
    let (_, n) = w.server.poll_transmit(&mut chal).expect("challenge");
    *w.sent_to.entry(attacker).or_default() += n;
    let Ok(Control::Challenge { cookie, server_nonce }) = Control::decode(&chal[..n]) else {
        panic!("challenge")
    };
    let key = netjam_engine::room::auth::room_key("band", "");
    let nonce = [1u8; 16];
    let auth = netjam_engine::room::auth::join_authenticator(&key, server_nonce, &nonce, "band", "Mallory");
    let join = Control::Join(netjam_engine::room::msg::Join {
        cookie,
        room: "band",
        name: "Mallory",
        client_nonce: &nonce,
        authenticator: &auth,
        ssrc: ssrc_a,
        packets_per_s: 750,
        bytes_per_s: 200_000,
        create_key: &[],
        key_agreement: &[],
        hosts: &[],
        sample_rate: 0,
    });
    let mut jb = [0u8; MAX_CONTROL_LEN];
    let n = join.encode(&mut jb).expect("join");
    for _ in 0..50 {
        let _ = w.server.handle_datagram(w.now, victim, &jb[..n]);
        from_victim += n;
    }
    drain(&mut w);
    // Media and keep-alives from addresses that are no members.
    for k in 0..1_000u16 {
        let _ = w
            .server
            .handle_datagram(w.now + u64::from(k) * MS, attacker, &rtp(ssrc_a, k, 12));
        from_attacker += 24;
        let _ = w.server.handle_datagram(w.now, victim, &rtp(ssrc_a, k, 0));
        from_victim += 12;
    }
    drain(&mut w);
    assert_eq!(w.server.stats().members, 1, "nobody got a seat");
    assert_eq!(w.server.member_stats()[0].sent_to, 0, "nothing was forwarded");
    let to_attacker = w.sent_to.get(&attacker).copied().unwrap_or(0);
    let to_victim = w.sent_to.get(&victim).copied().unwrap_or(0);
    assert!(to_attacker <= from_attacker, "{to_attacker} > {from_attacker}");
    assert!(to_victim <= from_victim, "{to_victim} > {from_victim}");
    assert!(w.server.stats().bad_cookies >= 50);
}

#[test]
fn a_flooding_member_is_policed_while_the_others_pass_untouched() {
    let mut w = World::new(ServerConfig::default(), 0.0, 8);
    let a = w.add(1, "band", "Ana", "", 1);
    let b = w.add(2, "band", "Bo", "", 2);
    let c = w.add(3, "band", "Cy", "", 3);
    w.run_for(300 * MS);
    let (sa, sb) = (w.seat(a).1, w.seat(b).1);
    let _ = c;
    // Declared: 750 packets/s of 300 bytes. Ana sends 50× that; Bo sends at his rate.
    let period = 1_000_000_000 / 750;
    let mut bo_forwarded = 0;
    let mut ana_sent = 0u64;
    let start = w.now;
    for k in 0..1_500u64 {
        let t = start + k * period;
        for j in 0..50 {
            let now = t + j * (period / 50);
            if let Verdict::Forward(d) = w.server.handle_datagram(now, addr(1), &rtp(sa, k as u16, 288)) {
                // The shell sent them: the queue slots are free again.
                let ids: Vec<_> = d.iter().map(|x| x.id).collect();
                for x in ids {
                    w.server.sent(x);
                }
            }
            ana_sent += 1;
        }
        // Bo's packet: decided in the same call, forwarded to both others at once.
        match w
            .server
            .handle_datagram(t + period / 2, addr(2), &rtp(sb, k as u16, 288))
        {
            Verdict::Forward(d) => {
                assert_eq!(d.len(), 2);
                let d = d.to_vec();
                for x in d {
                    w.server.sent(x.id);
                }
                bo_forwarded += 1;
            }
            v => panic!("Bo's packet {k}: {v:?}"),
        }
    }
    assert_eq!(bo_forwarded, 1_500);
    let stats = w.server.member_stats();
    let ana = stats.iter().find(|m| m.name == "Ana").expect("Ana");
    let bo = stats.iter().find(|m| m.name == "Bo").expect("Bo");
    // 2 s at 1.5× 750/s plus a burst of 100 ms of 750/s may pass; the rest is policed.
    let allowed = (1.5 * 750.0 * 2.0) as u64 + 75;
    assert!(ana.forwarded <= allowed + 2, "{} > {allowed}", ana.forwarded);
    assert!(
        ana.forwarded >= 750 * 2,
        "Ana's declared rate still passes: {}",
        ana.forwarded
    );
    assert_eq!(ana.forwarded + ana.policed_drops, ana_sent);
    assert_eq!((bo.policed_drops, bo.queue_drops), (0, 0));
    println!(
        "flood: Ana sent {ana_sent}, forwarded {}, policed {}; Bo forwarded {bo_forwarded}/1500",
        ana.forwarded, ana.policed_drops
    );
}

#[test]
fn a_slow_destination_fills_only_its_own_queue() {
    let cfg = ServerConfig {
        dest_queue: 32,
        ..ServerConfig::default()
    };
    let mut w = World::new(cfg, 0.0, 9);
    for (i, n) in [(1, "Ana"), (2, "Bo"), (3, "Cy")] {
        w.add(i, "band", n, "", u32::from(i));
    }
    w.run_for(300 * MS);
    let sa = w.seat(0).1;
    let period = 1_000_000_000 / 750;
    let mut to_bo = 0;
    for k in 0..200u64 {
        let v = w
            .server
            .handle_datagram(w.now + k * period, addr(1), &rtp(sa, k as u16, 100));
        let Verdict::Forward(d) = v else { panic!("{v:?}") };
        let d = d.to_vec();
        // The shell sends to Bo at once; Cy's path is stuck, his packets are never done.
        for x in d {
            if x.addr == addr(2) {
                to_bo += 1;
                w.server.sent(x.id);
            }
        }
    }
    assert_eq!(to_bo, 200, "Bo gets every packet");
    let stats = w.server.member_stats();
    let cy = stats.iter().find(|m| m.name == "Cy").expect("Cy");
    assert_eq!((cy.sent_to, cy.queue_drops), (32, 168));
    let bo = stats.iter().find(|m| m.name == "Bo").expect("Bo");
    assert_eq!(bo.queue_drops, 0);
}

/// Roster events reach every member complete and in order although half the control
/// packets (both ways) are lost.
#[test]
fn roster_events_survive_half_the_control_packets_lost() {
    for seed in 1..=20u64 {
        // Keep-alives every 250 ms with a 10 s timeout: 40 in a row would have to be lost
        // for a member to time out, so the events are the ones this test makes.
        let cfg = ServerConfig {
            keepalive_ms: 250,
            timeout_ms: 10_000,
            ..ServerConfig::default()
        };
        let mut w = World::new(cfg, 0.5, seed);
        let names = ["Ana", "Bo", "Cy", "Dee", "Eve"];
        for (i, n) in names.iter().enumerate() {
            w.add(i as u16 + 1, "band", n, "pw", 100 + i as u32);
            w.run_for(200 * MS);
        }
        // A join takes four messages, each lost half the time; retries come at most 1 s
        // apart. Sealed it takes six (the handshake's two before the join), and a join
        // retried before the channel opened starts the handshake again.
        w.run_for(if w.sealed { 120_000 } else { 40_000 } * MS);
        for (i, p) in w.peers.iter().enumerate() {
            assert!(
                p.client.seat().is_some(),
                "seed {seed}: {} not seated: {:?} {:?}",
                names[i],
                p.events,
                p.client
            );
        }
        w.peers[1].client.rename("Bob");
        // A lost rename is not retried by the protocol; say it until the others heard it.
        for _ in 0..20 {
            w.run_for(300 * MS);
            if w.roster(0).iter().any(|(k, _)| *k == RosterKind::Renamed) {
                break;
            }
            w.peers[1].client.rename("Bob");
        }
        w.peers[2].client.leave(w.now);
        w.run_for(15_000 * MS);
        // Every event in sequence order, without gaps or duplicates (roster and peer
        // events share the sequence).
        for p in &w.peers {
            let seqs: Vec<u32> = p
                .events
                .iter()
                .filter_map(|e| match e {
                    RoomEvent::Roster(r) => Some(r.seq),
                    RoomEvent::Peer(r) => Some(r.seq),
                    _ => None,
                })
                .collect();
            assert_eq!(seqs, (1..=seqs.len() as u32).collect::<Vec<_>>(), "seed {seed}");
        }
        // Ana heard the others join in the order the server seated them (ascending member
        // ids; loss may reorder the joins themselves), then the rename, then Cy leave (a
        // lost leave ends as a timeout).
        let ana = w.roster(0);
        let join_ids: Vec<u32> = w.peers[0]
            .events
            .iter()
            .filter_map(|e| match e {
                RoomEvent::Roster(r) if r.kind == RosterKind::Joined => Some(r.member_id),
                _ => None,
            })
            .collect();
        assert_eq!(join_ids.len(), 4, "seed {seed}: {ana:?}");
        assert!(
            join_ids.windows(2).all(|p| p[0] < p[1]),
            "seed {seed}: {join_ids:?}"
        );
        let mut joins: Vec<_> = ana.iter().take(4).map(|(_, n)| n.as_str()).collect();
        joins.sort();
        assert_eq!(joins, ["Bo", "Cy", "Dee", "Eve"], "seed {seed}");
        let tail: Vec<_> = ana.iter().skip(4).map(|(k, _)| *k).collect();
        assert_eq!(tail[0], RosterKind::Renamed, "seed {seed}: {ana:?}");
        assert!(
            matches!(tail.last(), Some(RosterKind::Left | RosterKind::Timeout)),
            "seed {seed}: {ana:?}"
        );
        // Eve joined last: she heard of all four before her, Bo already or later renamed.
        let eve = w.roster(4);
        assert_eq!(
            eve.iter().filter(|(k, _)| *k == RosterKind::Joined).count(),
            4,
            "seed {seed}: {eve:?}"
        );
        assert_eq!(w.server.stats().members, 4, "seed {seed}");
    }
}

#[test]
fn ensemble_seats_relay_ensemble_datagrams_in_their_room_only_and_carry_no_media() {
    let mut w = World::new(ServerConfig::default(), 0.0, 11);
    let player = w.add(1, "band", "Ana", "pw", 0x1111);
    let e1 = w.add_with(2, "band", "ens-1", "pw", 2, 0);
    let e2 = w.add_with(3, "band", "ens-2", "pw", 3, 0);
    let elsewhere = w.add_with(4, "other", "ens-x", "", 4, 0);
    w.run_for(500 * MS);
    for i in [player, e1, e2, elsewhere] {
        assert_eq!(joined(&w.peers[i].events).len(), 1, "peer {i} seated");
    }
    // Seats without media are in no roster, and hear none.
    assert!(w.roster(player).is_empty(), "{:?}", w.roster(player));
    assert!(w.roster(e1).is_empty());
    // Media goes to no seat without media, and none comes from one.
    assert_eq!(w.media(addr(1), &rtp(0x1111, 1, 200)), Ok(vec![]));
    assert_eq!(
        w.media(addr(2), &rtp(w.seat(e1).1, 1, 200)),
        Err(DropReason::Policed)
    );

    // To everyone: only members that speak ensemble (have sent /netjam/ens) hear it.
    let (id1, id2) = (w.seat(e1).0, w.seat(e2).0);
    w.ens(e2, ENS_EVERYONE, b"first");
    w.run_for(10 * MS);
    assert!(w.ens_to(addr(2)).is_empty(), "e1 has not spoken ensemble yet");
    w.ens(e1, ENS_EVERYONE, b"hello");
    w.ens(w.peers.len() - 1, ENS_EVERYONE, b"other room");
    w.run_for(10 * MS);
    assert_eq!(w.ens_to(addr(3)), [(id1, b"hello".to_vec())]);
    assert!(w.ens_to(addr(1)).is_empty(), "the player speaks no ensemble");
    assert!(w.ens_to(addr(2)).is_empty(), "nothing from another room");
    // To one member, re-addressed with the sender's id.
    w.ens(e2, id1, b"to one");
    w.ens(e2, w.seat(player).0, b"to a player");
    w.run_for(10 * MS);
    assert_eq!(w.ens_to(addr(2)), [(id2, b"to one".to_vec())]);
    assert!(w.ens_to(addr(1)).is_empty());
    let s = w.server.stats();
    assert_eq!((s.ens_relayed, s.ens_undeliverable), (2, 1));

    // Clock probes: answered (by the shell) for members only.
    let ping = b"/_clock/ping\0\0\0\0,ih\0";
    let t = w.now;
    assert_eq!(w.server.handle_datagram(t, addr(2), ping), Verdict::ClockProbe);
    assert_eq!(
        w.server.handle_datagram(t, addr(77), ping),
        Verdict::Drop(DropReason::UnknownSource)
    );
    assert_eq!(w.server.stats().clock_probes, 1);
}

#[test]
fn seats_without_media_have_a_limit_of_their_own_beside_the_players() {
    let cfg = ServerConfig {
        max_members_per_room: 2,
        max_ensemble_seats_per_room: 2,
        ..ServerConfig::default()
    };
    let mut w = World::new(cfg, 0.0, 12);
    let seats = [
        w.add(1, "band", "Ana", "", 1),
        w.add_with(2, "band", "ens-a", "", 2, 0),
        w.add(3, "band", "Bo", "", 3),
        w.add_with(4, "band", "ens-b", "", 4, 0),
    ];
    w.run_for(500 * MS);
    for i in seats {
        assert_eq!(joined(&w.peers[i].events).len(), 1, "seat {i} taken");
    }
    let player = w.add(5, "band", "Cy", "", 5);
    let ens = w.add_with(6, "band", "ens-c", "", 6, 0);
    w.run_for(500 * MS);
    for i in [player, ens] {
        assert!(
            w.peers[i].events.iter().any(|e| matches!(
                e,
                RoomEvent::Refused {
                    code: Some(RefuseCode::RoomFull),
                    ..
                }
            )),
            "seat {i}: {:?}",
            w.peers[i].events
        );
    }
}

/// `addr(i)`'s IP address with another port: another socket on the same machine.
fn same_ip(i: u16, port: u16) -> SocketAddr {
    SocketAddr::new(addr(i).ip(), port)
}

fn refusals(events: &[RoomEvent]) -> Vec<Option<RefuseCode>> {
    events
        .iter()
        .filter_map(|e| match e {
            RoomEvent::Refused { code, .. } => Some(*code),
            _ => None,
        })
        .collect()
}

/// A player that moves to another server (its room moved there) asks for its seat back
/// with the id the first server gave it; there that id may be someone else's. It is
/// answered as unknown and joins afresh, never refused as if its password were wrong.
#[test]
fn a_seat_from_another_server_is_taken_afresh_where_its_id_is_someone_elses() {
    let mut w1 = World::new(ServerConfig::default(), 0.0, 31);
    let ana = w1.add(1, "band", "ana", "", 1);
    w1.run_for(300 * MS);
    let (ana_id, _) = w1.seat(ana);
    // The other server (its own secret) seats two players first: ana's id is taken there.
    let mut w2 = World::new(ServerConfig::default(), 0.0, 32);
    w2.server = Server::new(ServerConfig::default(), [7; 32]);
    let bo = w2.add(2, "band", "bo", "", 2);
    let cy = w2.add(3, "band", "cy", "", 3);
    w2.run_for(300 * MS);
    assert!([w2.seat(bo).0, w2.seat(cy).0].contains(&ana_id));
    let mut moved = w1.peers.remove(ana);
    moved.events.clear();
    w2.peers.push(moved);
    let ana = w2.peers.len() - 1;
    w2.peers[ana].client.server_changed(w2.now);
    w2.run_for(500 * MS);
    assert_eq!(refusals(&w2.peers[ana].events), [], "{:?}", w2.peers[ana].events);
    let (new_id, _) = w2.seat(ana);
    assert!(new_id != w2.seat(bo).0 && new_id != w2.seat(cy).0);
    assert!(w2
        .roster(bo)
        .iter()
        .any(|(k, n)| *k == RosterKind::Joined && n == "ana"));
    assert_eq!(w2.server.stats().members, 3);
}

#[test]
fn a_player_whose_rate_cannot_be_converted_is_refused_at_join_naming_the_rooms_rate() {
    let mut w = World::new(ServerConfig::default(), 0.0, 23);
    // 48 and 44.1 kHz convert both ways: both play.
    let a = w.add_at(1, "band", "ana", "", 1, 750, 48_000);
    let b = w.add_at(2, "band", "bo", "", 2, 690, 44_100);
    w.run_for(300 * MS);
    // 96 kHz converts to neither: refused at once, told the rate the room plays at.
    let c = w.add_at(3, "band", "cy", "", 3, 1500, 96_000);
    // A player that does not say its rate, and an ensemble seat (no media) at any rate, sit.
    let d = w.add_at(4, "band", "di", "", 4, 750, 0);
    let e = w.add_at(5, "band", "ens", "", 5, 0, 96_000);
    // Another room plays at its own rate.
    let f = w.add_at(6, "studio", "fe", "", 6, 1500, 96_000);
    w.run_for(300 * MS);
    for i in [a, b, d, e, f] {
        assert!(w.peers[i].client.seat().is_some(), "{i}: {:?}", w.peers[i].events);
    }
    assert!(w.peers[c].client.seat().is_none());
    assert_eq!(
        refusals(&w.peers[c].events),
        [Some(RefuseCode::RateUnconvertible)]
    );
    assert!(
        w.peers[c].events.iter().any(|e| matches!(
            e,
            RoomEvent::Refused { reason, .. } if reason.contains("48000 Hz") && reason.contains("96000 Hz")
        )),
        "{:?}",
        w.peers[c].events
    );
    // Nobody heard of the refused player.
    assert!(w.roster(a).iter().all(|(_, n)| n != "cy"), "{:?}", w.roster(a));
}

#[test]
fn a_second_player_under_a_name_already_in_the_room_is_refused() {
    let mut w = World::new(ServerConfig::default(), 0.0, 21);
    let a = w.add(1, "band", "ana", "pw", 1);
    let b = w.add(2, "band", "Bo", "pw", 2);
    w.run_for(300 * MS);
    // Another machine, the same name (in any case): someone else, told to pick another.
    let c = w.add(3, "band", "ana", "pw", 3);
    let d = w.add(4, "band", "ANA", "pw", 4);
    w.run_for(300 * MS);
    for i in [c, d] {
        assert!(w.peers[i].client.seat().is_none());
        assert_eq!(refusals(&w.peers[i].events), [Some(RefuseCode::NameTaken)]);
    }
    assert!(w.peers[c].events.iter().any(|e| matches!(
        e,
        RoomEvent::Refused { reason, .. } if reason.contains("pick another")
    )));
    assert_eq!(w.roster(b), [(RosterKind::Joined, "ana".to_owned())]);
    assert!(w.peers[a].client.seat().is_some());
    // The name is free again once its player left; another room has names of its own;
    // a seat without media (an ensemble member) is no player and may share it.
    let e = w.add(5, "other", "ana", "", 5);
    let f = w.add_with(6, "band", "ana", "pw", 0, 0);
    w.run_for(300 * MS);
    assert!(w.peers[e].client.seat().is_some());
    assert!(w.peers[f].client.seat().is_some());
    w.peers[a].client.leave(w.now);
    w.run_for(300 * MS);
    let g = w.add(7, "band", "ana", "pw", 7);
    w.run_for(300 * MS);
    assert!(w.peers[g].client.seat().is_some(), "{:?}", w.peers[g].events);
    let s = w.server.stats();
    assert_eq!((s.names_taken, s.replaced), (2, 0));
}

#[test]
fn a_player_restarted_after_a_crash_replaces_its_ghost_at_once() {
    let mut w = World::new(ServerConfig::default(), 0.0, 22);
    let a = w.add(1, "band", "ana", "", 1);
    let b = w.add(2, "band", "Bo", "", 2);
    w.run_for(500 * MS);
    let (ghost_id, _) = w.seat(a);
    // Ana's process dies (no leave) and starts again on the same machine, another port.
    w.peers[a].alive = false;
    w.run_for(300 * MS);
    let again = w.add(1, "band", "ana", "", 1);
    w.peers[again].addr = same_ip(1, 50_001);
    w.run_for(100 * MS);
    let (id, _) = w.seat(again);
    assert_ne!(id, ghost_id);
    // Bo hears the ghost leave and Ana join, at once: never two "ana"s, no timeout later.
    assert_eq!(
        w.roster(b),
        [
            (RosterKind::Joined, "ana".to_owned()),
            (RosterKind::Left, "ana".to_owned()),
            (RosterKind::Joined, "ana".to_owned()),
        ]
    );
    let heard: Vec<_> = w.peers[again]
        .events
        .iter()
        .filter_map(|e| match e {
            RoomEvent::Roster(r) => Some((r.kind, r.name.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(heard, [(RosterKind::Joined, "Bo".to_owned())]);
    // The ghost's address was told it was replaced.
    assert!(w.sent_to.contains_key(&addr(1)));
    w.run_for(10_000 * MS);
    assert_eq!(w.roster(b).len(), 3, "{:?}", w.roster(b));
    let s = w.server.stats();
    assert_eq!((s.members, s.replaced, s.timeouts, s.names_taken), (2, 1, 0, 0));
    assert_eq!(
        w.media(same_ip(1, 50_001), &rtp(w.seat(again).1, 1, 100)),
        Ok(vec![addr(2)])
    );
}

#[test]
fn a_player_restarted_on_the_same_port_replaces_its_seat() {
    let mut w = World::new(ServerConfig::default(), 0.0, 23);
    let a = w.add(1, "band", "ana", "", 1);
    let b = w.add(2, "band", "Bo", "", 2);
    w.run_for(500 * MS);
    let (ghost_id, _) = w.seat(a);
    w.peers[a].alive = false;
    // Restarted with `--listen` on the same port: the same address, a fresh nonce.
    let again = w.add(11, "band", "ana", "", 1);
    w.peers[again].addr = addr(1);
    w.run_for(100 * MS);
    assert_ne!(w.seat(again).0, ghost_id);
    assert_eq!(
        w.roster(b),
        [
            (RosterKind::Joined, "ana".to_owned()),
            (RosterKind::Left, "ana".to_owned()),
            (RosterKind::Joined, "ana".to_owned()),
        ]
    );
    assert!(refusals(&w.peers[again].events).is_empty());
    w.run_for(10_000 * MS);
    assert!(w.peers[again].client.seat().is_some());
    let s = w.server.stats();
    assert_eq!((s.members, s.replaced, s.timeouts), (2, 1, 0));
}

#[test]
fn two_copies_of_one_player_do_not_take_the_seat_from_each_other() {
    let mut w = World::new(ServerConfig::default(), 0.0, 24);
    let a = w.add(1, "band", "ana", "", 1);
    let b = w.add(2, "band", "Bo", "", 2);
    w.run_for(500 * MS);
    // A second copy on the same machine while the first still plays.
    let again = w.add(1, "band", "ana", "", 1);
    w.peers[again].addr = same_ip(1, 50_001);
    w.run_for(100 * MS);
    assert!(w.peers[again].client.seat().is_some());
    assert!(w.peers[a].client.seat().is_none());
    assert_eq!(refusals(&w.peers[a].events), [Some(RefuseCode::Replaced)]);
    // The first one stops: it keeps no keep-alives going and asks for nothing back.
    w.run_for(20_000 * MS);
    assert!(w.peers[again].client.seat().is_some());
    assert_eq!(w.roster(b).len(), 3, "{:?}", w.roster(b));
    let s = w.server.stats();
    assert_eq!((s.members, s.replaced, s.joins), (2, 1, 3));
}

#[test]
fn room_names_match_whatever_the_case_and_keep_the_first_spelling() {
    let mut w = World::new(ServerConfig::default(), 0.0, 25);
    let a = w.add(1, "Friday", "ana", "pw", 1);
    w.run_for(300 * MS);
    let b = w.add(2, "friday", "Bo", "pw", 2);
    let c = w.add(3, "FRIDAY", "Cy", "wrong", 3);
    w.run_for(300 * MS);
    assert!(w.peers[b].client.seat().is_some(), "{:?}", w.peers[b].events);
    assert_eq!(w.roster(a), [(RosterKind::Joined, "Bo".to_owned())]);
    assert_eq!(refusals(&w.peers[c].events), [Some(RefuseCode::WrongPassword)]);
    let s = w.server.stats();
    assert_eq!((s.rooms, s.members), (1, 2));
    assert!(w.server.member_stats().iter().all(|m| m.room == "Friday"));
    // Once empty the room is gone, and the next opener's spelling is the room's.
    for i in [a, b] {
        w.peers[i].client.leave(w.now);
    }
    w.run_for(300 * MS);
    assert_eq!(w.server.stats().rooms, 0);
    w.add(4, "fRiDaY", "Dee", "", 4);
    w.run_for(300 * MS);
    assert!(w.server.member_stats().iter().all(|m| m.room == "fRiDaY"));
}

#[test]
fn a_rename_to_a_name_another_player_has_is_ignored() {
    let mut w = World::new(ServerConfig::default(), 0.0, 26);
    let a = w.add(1, "band", "ana", "", 1);
    let b = w.add(2, "band", "Bo", "", 2);
    let c = w.add(3, "band", "Cy", "", 3);
    w.run_for(500 * MS);
    w.peers[b].client.rename("Ana");
    w.run_for(300 * MS);
    assert!(!w.roster(a).iter().any(|(k, _)| *k == RosterKind::Renamed));
    w.peers[b].client.rename("Bob");
    w.run_for(300 * MS);
    assert_eq!(w.roster(c).last(), Some(&(RosterKind::Renamed, "Bob".to_owned())));
    assert_eq!(w.server.stats().bad_control, 1);
}

fn epochs(events: &[RoomEvent]) -> Vec<(u32, [u8; 32])> {
    events
        .iter()
        .filter_map(|e| match e {
            RoomEvent::Epoch { epoch, key } => Some((*epoch, *key)),
            _ => None,
        })
        .collect()
}

fn rekey_refusals(events: &[RoomEvent]) -> Vec<Option<RekeyStatus>> {
    events
        .iter()
        .filter_map(|e| match e {
            RoomEvent::RekeyRefused { status, .. } => Some(*status),
            _ => None,
        })
        .collect()
}

#[test]
fn a_password_change_moves_the_room_to_a_new_epoch_that_only_the_new_password_follows() {
    let mut w = World::new(ServerConfig::default(), 0.0, 21);
    let (old, new) = (auth::room_key("band", "first"), auth::room_key("band", "second"));
    let a = w.add(1, "band", "Ana", "first", 0x1111);
    let b = w.add(2, "band", "Bo", "first", 0x2222);
    let c = w.add(3, "band", "Cy", "first", 0x3333);
    w.run_for(300 * MS);
    let ana_id = w.seat(a).0;

    // Ana changes it: her request is the only place the new key crosses, encrypted.
    w.peers[a].client.rekey(w.now, new);
    let mut buf = [0u8; MAX_CONTROL_LEN];
    let n = w.peers[a]
        .client
        .poll_transmit(&mut buf)
        .expect("a rekey request");
    let request = buf[..n].to_vec();
    assert!(matches!(Control::decode(&request), Ok(Control::Rekey(r)) if r.epoch == 1));
    assert!(
        !request.windows(32).any(|x| x == new),
        "the new key is never in clear"
    );
    w.send(true, addr(1), addr(0), request.clone());
    w.run_for(100 * MS);
    assert_eq!(epochs(&w.peers[a].events), [(1, new)]);
    assert_eq!(w.peers[a].client.epoch(), 1);
    for i in [b, c] {
        assert!(
            w.peers[i]
                .events
                .contains(&RoomEvent::PasswordChanged { epoch: 1, by: ana_id }),
            "peer {i}: {:?}",
            w.peers[i].events
        );
        assert_eq!(w.peers[i].client.epoch(), 0);
    }

    // Bo takes the new password; Cy tries a wrong one and stays out.
    w.peers[b].client.rekey(w.now, new);
    w.peers[c].client.rekey(w.now, auth::room_key("band", "guess"));
    w.run_for(100 * MS);
    assert_eq!(epochs(&w.peers[b].events), [(1, new)]);
    assert!(epochs(&w.peers[c].events).is_empty());
    assert_eq!(
        rekey_refusals(&w.peers[c].events),
        [Some(RekeyStatus::NotTheNewPassword)]
    );
    // Cy cannot change it back with the old password: it is not the room's any more.
    w.peers[c].client.rekey(w.now, old);
    w.run_for(100 * MS);
    assert_eq!(rekey_refusals(&w.peers[c].events).len(), 2);
    assert_eq!(w.peers[c].client.epoch(), 0);

    // Ana's request again (replayed by anyone, from any seat) changes nothing more.
    w.send(true, addr(3), addr(0), request);
    // An altered request is refused as unproven, and answered without an authenticator.
    let mut forged = buf[..n].to_vec();
    let at = forged.len() - 40;
    forged[at] ^= 1;
    w.send(true, addr(2), addr(0), forged);
    w.run_for(100 * MS);
    let s = w.server.stats();
    assert_eq!(s.rekeys, 1, "one change");
    assert!(s.rekeys_refused >= 3, "{s:?}");
    for i in [a, b] {
        assert!(
            !w.peers[i]
                .events
                .iter()
                .any(|e| matches!(e, RoomEvent::PasswordChanged { epoch, .. } if *epoch > 1)),
            "peer {i}: {:?}",
            w.peers[i].events
        );
    }

    // The old password seats nobody now; the new one seats a newcomer in epoch 1.
    let d = w.add(4, "band", "Dee", "first", 0x4444);
    let e = w.add(5, "band", "Eve", "second", 0x5555);
    w.run_for(300 * MS);
    assert_eq!(refusals(&w.peers[d].events), [Some(RefuseCode::WrongPassword)]);
    assert!(w.peers[e].client.seat().is_some());
    assert_eq!(epochs(&w.peers[e].events), [(1, new)]);
    assert_eq!(w.peers[e].client.epoch(), 1);

    // Bo moves: his rejoin proves the new password and keeps his seat.
    let bo_seat = w.seat(b);
    w.peers[b].addr = addr(12);
    w.peers[b].client.address_changed(w.now);
    w.run_for(300 * MS);
    assert_eq!(w.seat(b), bo_seat);
    assert!(
        joined(&w.peers[b].events).iter().any(|j| j.2),
        "{:?}",
        w.peers[b].events
    );
}

/// Whether `needle` appears anywhere in `hay`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn sealed_control_carries_no_token_name_or_room_in_clear_and_pins_the_key_once() {
    SEALED.with(|s| s.set(true));
    let mut w = World::new(ServerConfig::default(), 0.0, 31);
    let a = w.add(1, "rehearsal", "Ana", "pw", 0x1111);
    let b = w.add(2, "rehearsal", "Bo", "pw", 0x2222);
    w.run_for(500 * MS);
    let tokens: Vec<[u8; 16]> = w.peers[a]
        .events
        .iter()
        .filter_map(|e| match e {
            RoomEvent::Peer(p) => Some(p.token),
            _ => None,
        })
        .collect();
    assert_eq!(tokens.len(), 1, "{:?}", w.peers[a].events);
    assert_eq!(w.roster(b), [(RosterKind::Joined, "Ana".to_owned())]);
    // Nothing that admits a member or says who plays where crosses in clear.
    for d in &w.wire {
        for t in &tokens {
            assert!(!contains(d, t), "a pair token in clear");
        }
        for word in [
            &b"rehearsal"[..],
            b"Ana",
            b"Bo\0",
            b"/netjam/join",
            b"/netjam/peer",
            b"/netjam/welcome",
        ] {
            assert!(!contains(d, word), "{:?} in clear", String::from_utf8_lossy(word));
        }
    }
    assert!(w.wire.iter().any(|d| secure::is_sealed(d)));
    // Each client pinned the server's one key, once.
    let public = *StaticKey::from_private(SERVER_KEY).public();
    assert_eq!(w.pinned, [(a, public), (b, public)]);
    assert_eq!(w.server.public_key(), Some(public));
    let ch = w.server.secure_stats().expect("a channel");
    assert_eq!((ch.handshakes, ch.forged, ch.replayed), (2, 0, 0));
    assert_eq!(w.server.stats().clear_control, 0);
    // Keep-alives went on sealed for seconds.
    w.run_for(5_000 * MS);
    assert!(w.server.secure_stats().expect("a channel").opened >= 10);
    assert_eq!(w.server.stats().members, 2);
}

#[test]
fn an_altered_or_replayed_control_message_is_refused_and_the_seat_plays_on() {
    SEALED.with(|s| s.set(true));
    let mut w = World::new(ServerConfig::default(), 0.0, 32);
    let a = w.add(1, "band", "Ana", "pw", 0x1111);
    let _b = w.add(2, "band", "Bo", "pw", 0x2222);
    w.run_for(500 * MS);
    // Ana's next control message, taken before it reaches the server.
    let mut ka = [0u8; 64];
    let n = Control::Keepalive.encode(&mut ka).expect("encode");
    w.peers[a].client.send_control(&ka[..n]);
    let mut buf = [0u8; MAX_ENS_LEN];
    let n = w.peers[a].client.poll_transmit(&mut buf).expect("sealed");
    let sealed_from_a = buf[..n].to_vec();
    assert!(secure::is_sealed(&sealed_from_a));
    let before = w.server.secure_stats().expect("channel");
    // Each of the last 16 bytes (the tag) and of 16 bytes of ciphertext flipped in turn.
    for i in (n - 32)..n {
        let mut bad = sealed_from_a.clone();
        bad[i] ^= 0x01;
        let _ = w.server.handle_datagram(w.now, addr(1), &bad);
    }
    let after = w.server.secure_stats().expect("channel");
    assert_eq!(after.forged, before.forged + 32, "{before:?} → {after:?}");
    assert_eq!(after.opened, before.opened, "nothing altered was opened");
    // The message itself is taken once; again, it is a replay.
    let _ = w.server.handle_datagram(w.now, addr(1), &sealed_from_a);
    let _ = w.server.handle_datagram(w.now, addr(1), &sealed_from_a);
    let after = w.server.secure_stats().expect("channel");
    assert_eq!(
        (after.opened, after.replayed),
        (before.opened + 1, before.replayed + 1)
    );
    // From another address it has no session: a rebind hint, nothing opened.
    let hints = w.server.stats().rebind_hints;
    eprintln!(
        "{hints} hints, {} suppressed",
        w.server.stats().unproven_suppressed
    );
    let _ = w.server.handle_datagram(w.now, addr(7), &sealed_from_a);
    assert_eq!(w.server.stats().rebind_hints, hints + 1);
    assert_eq!(
        w.server.secure_stats().expect("channel").opened,
        before.opened + 1
    );
    let mut out = [0u8; MAX_ENS_LEN];
    while w.server.poll_transmit(&mut out).is_some() {}
    // A join in clear to a server whose control is sealed is refused (counted).
    let mut cfg = ClientConfig::new("band", "Mallory", "pw", 9);
    cfg.nonce_seed = [9; 16];
    let mut clear = RoomClient::new(cfg, w.now);
    let n = clear.poll_transmit(&mut buf).expect("hello");
    let _ = w.server.handle_datagram(w.now, addr(9), &buf[..n]);
    let (dst, m) = w.server.poll_transmit(&mut out).expect("a challenge, in clear");
    assert_eq!(dst, addr(9));
    clear.handle_datagram(w.now, &out[..m]);
    let n = clear.poll_transmit(&mut buf).expect("a join in clear");
    let _ = w.server.handle_datagram(w.now, addr(9), &buf[..n]);
    assert_eq!(w.server.stats().clear_control, 1);
    assert!(
        w.server.poll_transmit(&mut out).is_none(),
        "no answer to a clear join"
    );
    // Ana plays on.
    w.run_for(3_000 * MS);
    assert!(w.peers[a].client.seat().is_some());
    assert_eq!(w.server.stats().members, 2);
}

#[test]
fn a_server_showing_another_key_than_pinned_is_refused_by_name() {
    SEALED.with(|s| s.set(true));
    let mut w = World::new(ServerConfig::default(), 0.0, 33);
    let mut cfg = ClientConfig::new("band", "Ana", "", 1);
    cfg.secure = true;
    let pinned = *StaticKey::from_private([6; 32]).public();
    cfg.server_key = Some(pinned);
    w.peers.push(Peer {
        addr: addr(1),
        client: RoomClient::new(cfg, w.now),
        events: Vec::new(),
        alive: true,
    });
    w.run_for(2_000 * MS);
    let offered = secure::fingerprint(StaticKey::from_private(SERVER_KEY).public());
    assert_eq!(
        w.peers[0].events,
        [RoomEvent::ServerKeyChanged {
            pinned: secure::fingerprint(&pinned),
            offered,
        }]
    );
    assert!(w.peers[0].client.seat().is_none());
    assert_eq!(w.server.stats().joins, 0, "no join went to the server");
    // It stops: nothing more after the handshake.
    let sent = w.wire.len();
    w.run_for(5_000 * MS);
    assert_eq!(w.wire.len(), sent);
}

#[test]
fn a_restarted_server_with_its_key_takes_the_player_back_through_a_new_handshake() {
    SEALED.with(|s| s.set(true));
    let mut w = World::new(ServerConfig::default(), 0.0, 34);
    let a = w.add(1, "band", "Ana", "", 10);
    w.run_for(300 * MS);
    w.server = Server::new(ServerConfig::default(), [7; 32]);
    w.server.set_static_key(StaticKey::from_private(SERVER_KEY));
    // Its next sealed keep-alive reaches a server with no session for it: a rebind hint
    // in clear, a hello, a new handshake, and a fresh seat.
    w.run_for(12_000 * MS);
    let j = joined(&w.peers[a].events);
    assert_eq!(j.len(), 2, "{:?}", w.peers[a].events);
    assert!(!j[1].2, "a fresh seat");
    assert!(w.server.stats().rebind_hints >= 1);
    assert_eq!(w.server.secure_stats().expect("channel").handshakes, 1);
    assert_eq!(w.pinned.len(), 1, "the key was pinned once");
}

#[test]
fn a_handshake_whose_cookie_is_not_the_sources_is_never_answered() {
    SEALED.with(|s| s.set(true));
    let mut w = World::new(ServerConfig::default(), 0.0, 35);
    // Ana's hello and challenge go through; her handshake is then replayed from elsewhere.
    let mut cfg = ClientConfig::new("band", "Ana", "", 1);
    cfg.secure = true;
    let mut c = RoomClient::new(cfg, w.now);
    let mut buf = [0u8; MAX_ENS_LEN];
    let mut out = [0u8; MAX_ENS_LEN];
    let n = c.poll_transmit(&mut buf).expect("hello");
    let _ = w.server.handle_datagram(w.now, addr(1), &buf[..n]);
    let (_, m) = w.server.poll_transmit(&mut out).expect("challenge");
    c.handle_datagram(w.now, &out[..m]);
    let n = c.poll_transmit(&mut buf).expect("handshake");
    assert!(secure::is_handshake(&buf[..n]));
    let _ = w.server.handle_datagram(w.now, addr(2), &buf[..n]);
    assert!(
        w.server.poll_transmit(&mut out).is_none(),
        "answered a forged source"
    );
    let _ = w.server.handle_datagram(w.now, addr(1), &buf[..n]);
    let (dst, m) = w.server.poll_transmit(&mut out).expect("answered its own source");
    assert_eq!(dst, addr(1));
    assert!(secure::is_handshake(&out[..m]));
    let ch = w.server.secure_stats().expect("channel");
    assert_eq!((ch.handshakes, ch.handshakes_refused), (1, 1));
}

// The scenarios above again, with the control channel on.
sealed!(
    sealed_members_join_hear_of_each_other_and_forward,
    members_join_hear_of_each_other_and_forward_to_the_others_only
);
sealed!(
    sealed_a_silent_member_times_out,
    a_silent_member_times_out_and_the_room_is_told
);
sealed!(
    sealed_wrong_password_is_refused,
    wrong_password_is_refused_and_the_first_joiner_fixes_the_password
);
sealed!(
    sealed_a_member_whose_address_changes_keeps_its_seat,
    a_member_whose_address_changes_keeps_its_seat_after_reauthenticating
);
sealed!(
    sealed_roster_events_survive_half_the_control_packets_lost,
    roster_events_survive_half_the_control_packets_lost
);
sealed!(
    sealed_a_second_player_under_a_name_taken_is_refused,
    a_second_player_under_a_name_already_in_the_room_is_refused
);
sealed!(
    sealed_a_restarted_player_replaces_its_ghost,
    a_player_restarted_after_a_crash_replaces_its_ghost_at_once
);
sealed!(
    sealed_a_player_restarted_on_the_same_port_replaces_its_seat,
    a_player_restarted_on_the_same_port_replaces_its_seat
);
sealed!(
    sealed_two_copies_of_one_player_do_not_swap_the_seat,
    two_copies_of_one_player_do_not_take_the_seat_from_each_other
);
sealed!(
    sealed_room_names_match_whatever_the_case,
    room_names_match_whatever_the_case_and_keep_the_first_spelling
);

/// Every live peer that had a seat sends `ms` milliseconds of media (750 packets a second, as
/// 64-frame packets at 48 kHz) while the world runs, seated or not (a player plays on
/// while its server is away). Returns when each peer last became seated, if it did.
fn stream_for(w: &mut World, ms: u64, seq: &mut u16) -> Vec<Option<u64>> {
    let mut seated_at: Vec<Option<u64>> = vec![None; w.peers.len()];
    let mut was: Vec<bool> = w.peers.iter().map(|p| p.client.seat().is_some()).collect();
    let ssrcs: Vec<u32> = (0..w.peers.len())
        .map(|i| w.peers[i].client.seat().map_or(0, |s| s.1))
        .collect();
    // Three packets every 4 ms.
    for _ in 0..ms / 4 {
        for _ in 0..3 {
            *seq = seq.wrapping_add(1);
            for (i, &ssrc) in ssrcs.iter().enumerate() {
                if !w.peers[i].alive {
                    continue;
                }
                let src = w.peers[i].addr;
                w.send(true, src, addr(0), rtp(ssrc, *seq, 160));
            }
        }
        w.run_for(4 * MS);
        for (i, p) in w.peers.iter().enumerate() {
            let now = p.client.seat().is_some();
            if now && !was[i] {
                seated_at[i] = Some(w.now);
            }
            was[i] = now;
        }
    }
    seated_at
}

/// A server restarted under a room of four that keep streaming: every packet from them is
/// from an address it does not know, so each would earn a rebind hint. The hints must
/// not eat the replies that seat the players again: all four are back within seconds.
#[test]
fn a_restarted_server_under_four_streaming_players_seats_them_all_again_within_seconds() {
    let mut w = World::new(ServerConfig::default(), 0.0, 61);
    // Players across a continent: a handshake takes more than the time a stream of
    // unknown packets needs to spend the whole budget for unproven addresses.
    w.one_way = 20 * MS;
    let names = ["Ana", "Bo", "Cy", "Dee"];
    for (i, name) in names.iter().enumerate() {
        w.add(i as u16 + 1, "band", name, "", 0x100 + i as u32);
    }
    let mut seq = 0u16;
    stream_for(&mut w, 500, &mut seq);
    assert!(
        w.peers.iter().all(|p| p.client.seat().is_some()),
        "all seated first"
    );
    let mut server = Server::new(ServerConfig::default(), [7; 32]);
    if w.sealed {
        server.set_static_key(StaticKey::from_private(SERVER_KEY));
    }
    w.server = server;
    let restarted = w.now;
    // The players lose the server after its silence (5 s) and ask again: each must be
    // seated again within a few of its retries after that.
    let back = stream_for(&mut w, 10_000, &mut seq);
    for (i, b) in back.iter().enumerate() {
        let b = b.unwrap_or_else(|| panic!("{} never seated again: {:?}", names[i], w.peers[i].events));
        let after_s = (b - restarted) as f64 / 1e9;
        eprintln!("{} seated again after {after_s:.3} s", names[i]);
        assert!(
            after_s < 1.0,
            "{} seated again only after {after_s:.2} s",
            names[i]
        );
    }
    // The hints: a bounded few per address, not one per packet.
    let hints = w.server.stats().rebind_hints;
    eprintln!(
        "{hints} hints, {} suppressed",
        w.server.stats().unproven_suppressed
    );
    assert!(hints <= 4 * 50, "{hints} rebind hints for four addresses in 10 s");
}

/// A server whose own process did not run for seven seconds (stopped, a machine that
/// hung) finds every member's last packet seven seconds old. That silence was its own:
/// told so (`stall`), it keeps the room, and drops only a member that stays silent after.
fn a_server_stalls_for_seven_seconds(stall: Option<u64>) -> (World, u32, u32) {
    let mut w = World::new(ServerConfig::default(), 0.0, 62);
    let a = w.add(1, "band", "Ana", "", 0x100);
    let b = w.add(2, "band", "Bo", "", 0x101);
    let mut seq = 0;
    stream_for(&mut w, 500, &mut seq);
    let (id_a, _) = w.seat(a);
    let (id_b, _) = w.seat(b);
    // Bo's machine goes away during the stall; Ana's stays, plays on (her media fills
    // the server's socket within a tenth of a second), and asks again once she has not
    // heard the server for its timeout.
    w.peers[b].alive = false;
    w.stop_server();
    stream_for(&mut w, 7_000, &mut seq);
    w.cont_server(stall);
    w.run_for(2_000 * MS);
    let ana = &w.peers[a].events;
    assert!(ana.iter().any(|e| matches!(e, RoomEvent::Lost)), "{ana:?}");
    (w, id_a, id_b)
}

#[test]
fn a_server_that_did_not_run_for_seconds_keeps_its_members() {
    let (mut w, id_a, id_b) = a_server_stalls_for_seven_seconds(Some(7_000 * MS));
    assert_eq!(
        w.server.stats().timeouts,
        0,
        "a member dropped for the server's own stall"
    );
    // Ana's seat is hers still: taken back, not a fresh join.
    let j = joined(&w.peers[0].events);
    assert_eq!(j.len(), 2, "{:?}", w.peers[0].events);
    assert_eq!(j[1].0, id_a);
    assert!(j[1].2, "her seat, taken back");
    // Bo says nothing after the stall: dropped once the timeout has passed from it.
    w.run_for(4_000 * MS);
    assert_eq!(w.server.stats().timeouts, 1);
    assert!(w.server.member_stats().iter().all(|m| m.member_id != id_b));
    assert!(w.server.member_stats().iter().any(|m| m.member_id == id_a));
}

/// The same stall, the server not told: every member is dropped (what the scenario
/// above guards against).
#[test]
fn a_server_not_told_of_its_stall_drops_every_member() {
    let (w, _, _) = a_server_stalls_for_seven_seconds(None);
    assert_eq!(w.server.stats().timeouts, 2);
    let j = joined(&w.peers[0].events);
    assert!(j.len() == 2 && !j[1].2, "a fresh seat: {:?}", w.peers[0].events);
}

sealed!(
    sealed_a_restarted_server_under_four_streaming_players_seats_them_all_again,
    a_restarted_server_under_four_streaming_players_seats_them_all_again_within_seconds
);
