//! Direct paths between room members in virtual time: the real [`Server`], two or three
//! [`RoomClient`]s with their [`DirectPaths`], and an in-memory network whose homes filter
//! inbound datagrams like the NAT lab's routers (only from an address the home has sent
//! to: simultaneous punching is needed). Each member sends an RTP packet every
//! [`PACKET`] where its route table says.
//!
//! * a pair whose routers let punching through goes direct within 1 s, and the server then
//!   forwards none of its media;
//! * a blocked pair, and a pair whose direct path is slower than the server's, stay
//!   relayed and lose nothing;
//! * a direct path that dies mid-stream: media is back through the server within two
//!   packet times of the death being noticed, and nothing sent after that is lost;
//! * forged probes and acks never open a path, and are counted;
//! * the per-packet work (route table, probes, forwarding with direct lists) allocates
//!   nothing.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::net::SocketAddr;

use netjam_engine::nat::direct::{DirectConfig, DirectPaths, PathEvent, PathState, Target};
use netjam_engine::room::msg::{Control, Probe, ProbeKind, MAX_CONTROL_LEN, PROBE_MAC_LEN};
use netjam_engine::room::{ClientConfig, RoomClient, RoomEvent, RosterKind, Server, ServerConfig, Verdict};

alloc_count::install!();

const MS: u64 = 1_000_000;
/// One media packet every 2.5 ms (120 frames at 48 kHz).
const PACKET: u64 = 2_500_000;
const SECRET: [u8; 32] = [9; 32];

fn server_addr() -> SocketAddr {
    SocketAddr::from(([203, 0, 113, 1], 4464))
}

fn home(i: u16) -> SocketAddr {
    SocketAddr::from(([198, 51, 100, i as u8], 50_000 + i))
}

fn rtp(ssrc: u32, seq: u16) -> Vec<u8> {
    let mut b = vec![0u8; 12 + 40];
    b[0] = 0x80;
    b[1] = 96;
    b[2..4].copy_from_slice(&seq.to_be_bytes());
    b[8..12].copy_from_slice(&ssrc.to_be_bytes());
    b
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Via {
    Server,
    Direct,
}

struct Member {
    addr: SocketAddr,
    client: RoomClient,
    paths: Option<DirectPaths>,
    ssrc: u32,
    /// Addresses this home has sent to (its router lets their answers in).
    opened: BTreeSet<SocketAddr>,
    next_packet: u64,
    seq: u16,
    /// When each packet was sent.
    sent_at: BTreeMap<u16, u64>,
    /// (from SSRC, seq) -> how it arrived (first copy) and copies.
    heard: BTreeMap<(u32, u16), (Via, u32)>,
    path_events: Vec<(u64, PathEvent)>,
    joined_at: Option<u64>,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct InFlight {
    at: std::cmp::Reverse<(u64, u64)>,
    src: SocketAddr,
    dst: SocketAddr,
    bytes: Vec<u8>,
}

struct World {
    now: u64,
    server: Server,
    members: Vec<Member>,
    queue: BinaryHeap<InFlight>,
    serial: u64,
    /// One way, home <-> server.
    to_server: u64,
    /// One way, home <-> home.
    direct: u64,
    /// Home-to-home datagrams dropped (a router in between blocks them).
    blocked: bool,
    /// Homes let in only what answers something they sent.
    filtering: bool,
    /// Homes no other home can reach directly, nor be reached from.
    isolated: BTreeSet<SocketAddr>,
    direct_cfg: DirectConfig,
}

impl World {
    fn new(to_server: u64, direct: u64) -> Self {
        Self {
            now: 1_000 * MS,
            server: Server::new(ServerConfig::default(), SECRET),
            members: Vec::new(),
            queue: BinaryHeap::new(),
            serial: 0,
            to_server,
            direct,
            blocked: false,
            filtering: true,
            isolated: BTreeSet::new(),
            direct_cfg: DirectConfig::default(),
        }
    }

    fn add(&mut self, i: u16, name: &str) -> usize {
        let mut cfg = ClientConfig::new("band", name, "", 100 + u32::from(i));
        cfg.nonce_seed = [i as u8; 16];
        // A private address the other home cannot reach: it must not hurt.
        cfg.hosts = vec![SocketAddr::from(([192, 168, 1, 2], 4464))];
        self.members.push(Member {
            addr: home(i),
            client: RoomClient::new(cfg, self.now),
            paths: None,
            ssrc: 0,
            opened: BTreeSet::new(),
            next_packet: u64::MAX,
            seq: 0,
            sent_at: BTreeMap::new(),
            heard: BTreeMap::new(),
            path_events: Vec::new(),
            joined_at: None,
        });
        self.members.len() - 1
    }

    fn send(&mut self, src: SocketAddr, dst: SocketAddr, bytes: Vec<u8>) {
        let delay = if src == server_addr() || dst == server_addr() {
            self.to_server
        } else {
            self.direct
        };
        self.serial += 1;
        self.queue.push(InFlight {
            at: std::cmp::Reverse((self.now + delay, self.serial)),
            src,
            dst,
            bytes,
        });
    }

    fn member_send(&mut self, i: usize, dst: SocketAddr, bytes: Vec<u8>) {
        let src = self.members[i].addr;
        self.members[i].opened.insert(dst);
        self.send(src, dst, bytes);
    }

    fn flush(&mut self) {
        let mut buf = [0u8; MAX_CONTROL_LEN];
        for i in 0..self.members.len() {
            while let Some(n) = self.members[i].client.poll_transmit(&mut buf) {
                self.member_send(i, server_addr(), buf[..n].to_vec());
            }
            while let Some(e) = self.members[i].client.poll_event() {
                let now = self.now;
                let m = &mut self.members[i];
                match e {
                    RoomEvent::Joined { member_id, ssrc, .. } => {
                        m.ssrc = ssrc;
                        m.joined_at.get_or_insert(now);
                        m.next_packet = m.next_packet.min(now);
                        match &mut m.paths {
                            Some(p) => p.set_me(now, member_id),
                            None => m.paths = Some(DirectPaths::new(self.direct_cfg.clone(), member_id)),
                        }
                    }
                    RoomEvent::Peer(p) => {
                        if let Some(paths) = &mut m.paths {
                            paths.set_peer(now, &p);
                        }
                    }
                    RoomEvent::Roster(r) if matches!(r.kind, RosterKind::Left | RosterKind::Timeout) => {
                        if let Some(paths) = &mut m.paths {
                            paths.remove_peer(now, r.member_id);
                        }
                    }
                    RoomEvent::Routed { seq } => {
                        if let Some(paths) = &mut m.paths {
                            paths.routed(seq);
                        }
                    }
                    _ => {}
                }
            }
            let rtt = self.members[i].client.server_rtt_ns();
            let mut out = Vec::new();
            let now = self.now;
            let m = &mut self.members[i];
            if let Some(p) = &mut m.paths {
                if let Some(r) = rtt {
                    p.set_server_rtt(r);
                }
                while let Some((t, n)) = p.poll_transmit(now, &mut buf) {
                    out.push((t, buf[..n].to_vec()));
                }
                while let Some(e) = p.poll_event() {
                    m.path_events.push((now, e));
                }
            }
            for (t, b) in out {
                let dst = match t {
                    Target::Server => server_addr(),
                    Target::Addr(a) => a,
                };
                self.member_send(i, dst, b);
            }
        }
        while let Some((dst, n)) = self.server.poll_transmit(&mut buf) {
            self.send(server_addr(), dst, buf[..n].to_vec());
        }
    }

    fn send_media(&mut self, i: usize) {
        let m = &mut self.members[i];
        m.seq = m.seq.wrapping_add(1);
        let (seq, ssrc) = (m.seq, m.ssrc);
        m.sent_at.insert(seq, self.now);
        m.next_packet += PACKET;
        let table = m.paths.as_ref().map(|p| p.route_table()).unwrap_or_default();
        let pkt = rtp(ssrc, seq);
        if table.to_server {
            self.member_send(i, server_addr(), pkt.clone());
        }
        for a in table.direct() {
            self.member_send(i, a, pkt.clone());
        }
    }

    fn deliver(&mut self, p: InFlight) {
        if p.dst == server_addr() {
            if let Verdict::Forward(dests) = self.server.handle_datagram(self.now, p.src, &p.bytes) {
                let dests: Vec<_> = dests.to_vec();
                for d in dests {
                    self.server.sent(d.id);
                    self.send(server_addr(), d.addr, p.bytes.clone());
                }
            }
            return;
        }
        let Some(i) = self.members.iter().position(|m| m.addr == p.dst) else {
            return;
        };
        let from_server = p.src == server_addr();
        if !from_server {
            let home_to_home = self.members.iter().any(|m| m.addr == p.src);
            if home_to_home
                && (self.blocked || self.isolated.contains(&p.src) || self.isolated.contains(&p.dst))
            {
                return;
            }
            if self.filtering && !self.members[i].opened.contains(&p.src) {
                return;
            }
        }
        let now = self.now;
        let m = &mut self.members[i];
        match p.bytes.first() {
            Some(b'/') if from_server => m.client.handle_datagram(now, &p.bytes),
            Some(b'/') => {
                if let Some(paths) = &mut m.paths {
                    paths.handle_probe(now, p.src, &p.bytes);
                }
            }
            Some(0x80) => {
                let ssrc = u32::from_be_bytes([p.bytes[8], p.bytes[9], p.bytes[10], p.bytes[11]]);
                let seq = u16::from_be_bytes([p.bytes[2], p.bytes[3]]);
                let via = if from_server { Via::Server } else { Via::Direct };
                m.heard.entry((ssrc, seq)).or_insert((via, 0)).1 += 1;
            }
            _ => {}
        }
    }

    fn run_until(&mut self, until: u64) {
        self.flush();
        loop {
            let mut next = self.queue.peek().map_or(u64::MAX, |p| p.at.0 .0);
            next = next.min(self.server.poll_timeout().unwrap_or(u64::MAX));
            for m in &self.members {
                next = next.min(m.client.poll_timeout().unwrap_or(u64::MAX));
                next = next.min(
                    m.paths
                        .as_ref()
                        .and_then(|p| p.poll_timeout())
                        .unwrap_or(u64::MAX),
                );
                next = next.min(m.next_packet);
            }
            if next > until {
                self.now = until;
                return;
            }
            self.now = self.now.max(next);
            while self.queue.peek().is_some_and(|p| p.at.0 .0 <= self.now) {
                let Some(p) = self.queue.pop() else { break };
                self.deliver(p);
                self.flush();
            }
            self.server.handle_timeout(self.now);
            for i in 0..self.members.len() {
                let now = self.now;
                let m = &mut self.members[i];
                m.client.handle_timeout(now);
                if let Some(p) = &mut m.paths {
                    p.handle_timeout(now);
                }
                // Whatever the paths said goes out before the next packet reads the table.
                self.flush();
                if self.members[i].next_packet <= now {
                    self.send_media(i);
                }
            }
            self.flush();
        }
    }

    fn run_for(&mut self, d: u64) {
        let t = self.now + d;
        self.run_until(t);
    }

    fn member_id(&self, i: usize) -> u32 {
        self.members[i].client.seat().expect("seated").0
    }

    fn state(&self, i: usize, of: usize) -> Option<PathState> {
        let id = self.member_id(of);
        self.members[i].paths.as_ref()?.path(id).map(|p| p.state)
    }

    fn first_direct_at(&self, i: usize) -> Option<u64> {
        self.members[i]
            .path_events
            .iter()
            .find(|(_, e)| matches!(e, PathEvent::Direct { .. }))
            .map(|(t, _)| *t)
    }

    /// Packets `from` sent in [t0, t1) and how `to` heard each: (total, via server, direct, missing).
    fn heard_between(&self, from: usize, to: usize, t0: u64, t1: u64) -> (usize, usize, usize, usize) {
        let ssrc = self.members[from].ssrc;
        let (mut n, mut srv, mut dir, mut miss) = (0, 0, 0, 0);
        for (&seq, &at) in &self.members[from].sent_at {
            if at < t0 || at >= t1 {
                continue;
            }
            n += 1;
            match self.members[to].heard.get(&(ssrc, seq)) {
                Some((Via::Server, _)) => srv += 1,
                Some((Via::Direct, _)) => dir += 1,
                None => miss += 1,
            }
        }
        (n, srv, dir, miss)
    }

    fn server_sent_to(&self, i: usize) -> u64 {
        let id = self.member_id(i);
        self.server
            .member_stats()
            .iter()
            .find(|m| m.member_id == id)
            .map_or(0, |m| m.sent_to)
    }
}

/// Two members joined 100 ms apart, run until both are seated.
fn pair(to_server: u64, direct: u64) -> World {
    let mut w = World::new(to_server, direct);
    w.add(1, "ana");
    w.run_for(100 * MS);
    w.add(2, "bo");
    w.run_for(100 * MS);
    assert!(w.members.iter().all(|m| m.client.seat().is_some()));
    w
}

#[test]
fn a_pair_whose_routers_allow_punching_goes_direct_within_a_second_and_the_server_forwards_none() {
    let mut w = pair(10 * MS, 4 * MS);
    w.run_for(1_000 * MS);
    let joined = w.members[1].joined_at.expect("joined");
    for (i, of) in [(0, 1), (1, 0)] {
        assert_eq!(w.state(i, of), Some(PathState::Direct));
        let t = w.first_direct_at(i).expect("direct event");
        println!(
            "member {i}: direct {:.1} ms after the second member joined",
            (t - joined) as f64 / 1e6
        );
        assert!(t - joined <= 1_000 * MS);
    }
    let rtt = w.members[0]
        .paths
        .as_ref()
        .and_then(|p| p.path(w.member_id(1)))
        .expect("path");
    println!(
        "direct rtt {:?} ms, through the server {:?} ms",
        rtt.direct_rtt_ms, rtt.relay_rtt_ms
    );
    let (d, r) = (
        rtt.direct_rtt_ms.expect("direct rtt"),
        rtt.relay_rtt_ms.expect("relay rtt"),
    );
    // 4 ms each way direct, 10 ms each way to the server and back out.
    assert!((7.9..=8.1).contains(&d), "{d}");
    assert!((39.0..=41.0).contains(&r), "{r}");
    // From now on the server forwards nothing between them, and nothing is lost.
    let before = (w.server_sent_to(0), w.server_sent_to(1));
    let t0 = w.now;
    w.run_for(2_000 * MS);
    assert_eq!((w.server_sent_to(0), w.server_sent_to(1)), before);
    for (from, to) in [(0, 1), (1, 0)] {
        let (n, srv, dir, miss) = w.heard_between(from, to, t0, w.now - 50 * MS);
        assert!(n > 700, "{n}");
        assert_eq!((srv, miss), (0, 0), "{from}->{to}: {n} sent, {dir} direct");
    }
    // From the first packet on, nothing went missing during the switch either.
    for (from, to) in [(0, 1), (1, 0)] {
        let (n, _, _, miss) = w.heard_between(from, to, w.members[1].joined_at.unwrap_or(0) + 30 * MS, t0);
        assert!(n > 300);
        assert_eq!(miss, 0, "{from}->{to}");
    }
}

#[test]
fn a_blocked_pair_stays_relayed_and_loses_nothing() {
    let mut w = World::new(10 * MS, 4 * MS);
    w.blocked = true;
    w.add(1, "ana");
    w.run_for(100 * MS);
    w.add(2, "bo");
    w.run_for(3_000 * MS);
    let joined = w.members[1].joined_at.expect("joined");
    for (i, of) in [(0, 1), (1, 0)] {
        assert_eq!(w.state(i, of), Some(PathState::Relayed));
        let gave_up = w.members[i]
            .path_events
            .iter()
            .find(|(_, e)| matches!(e, PathEvent::Relayed { died: false, .. }))
            .map(|(t, _)| *t)
            .expect("gave up");
        assert!(gave_up - joined <= 1_100 * MS, "{}", (gave_up - joined) / MS);
    }
    for (from, to) in [(0, 1), (1, 0)] {
        let (n, srv, dir, miss) = w.heard_between(from, to, joined + 30 * MS, w.now - 50 * MS);
        assert!(n > 1000);
        assert_eq!((dir, miss), (0, 0));
        assert_eq!(srv, n);
    }
}

#[test]
fn a_direct_path_slower_than_the_server_stays_relayed() {
    // 2 ms each way to the server, 15 ms each way between the homes.
    let mut w = pair(2 * MS, 15 * MS);
    w.run_for(2_000 * MS);
    for (i, of) in [(0, 1), (1, 0)] {
        assert_eq!(w.state(i, of), Some(PathState::Relayed));
    }
    assert!(w.members[0]
        .path_events
        .iter()
        .all(|(_, e)| !matches!(e, PathEvent::Direct { .. })));
}

#[test]
fn a_direct_path_that_dies_is_back_through_the_server_within_two_packets_of_noticing() {
    let mut w = pair(10 * MS, 4 * MS);
    w.run_for(1_500 * MS);
    assert_eq!(w.state(0, 1), Some(PathState::Direct));
    let cut = w.now;
    w.blocked = true;
    w.run_for(1_000 * MS);
    for (from, to) in [(0, 1), (1, 0)] {
        let noticed = w.members[from]
            .path_events
            .iter()
            .find(|(_, e)| matches!(e, PathEvent::Relayed { died: true, .. }))
            .map(|(t, _)| *t)
            .expect("the death was noticed");
        println!(
            "{from}->{to}: noticed {:.1} ms after the cut",
            (noticed - cut) as f64 / 1e6
        );
        // Probes every 25 ms, dead after 3 intervals beyond the 8 ms round trip.
        assert!(noticed - cut <= 150 * MS);
        // The first packet sent after noticing goes through the server, and every one
        // from there on arrives.
        let ssrc = w.members[from].ssrc;
        let first_relayed = w.members[from]
            .sent_at
            .iter()
            .filter(|&(_, &at)| at >= noticed)
            .find(|(seq, _)| matches!(w.members[to].heard.get(&(ssrc, **seq)), Some((Via::Server, _))))
            .map(|(_, &at)| at)
            .expect("heard through the server");
        assert!(
            first_relayed - noticed <= 2 * PACKET,
            "{} ns",
            first_relayed - noticed
        );
        let (n, _, dir, miss) = w.heard_between(from, to, noticed, w.now - 50 * MS);
        assert!(n > 300);
        assert_eq!((dir, miss), (0, 0));
        // What was lost is what went straight into the cut before it was noticed.
        let (_, _, _, lost) = w.heard_between(from, to, cut, noticed);
        assert!(lost as u64 <= (noticed - cut) / PACKET + 1);
    }
}

#[test]
fn forged_probes_and_acks_never_open_a_path() {
    let mut w = World::new(10 * MS, 4 * MS);
    w.blocked = true;
    w.add(1, "ana");
    w.run_for(100 * MS);
    w.add(2, "bo");
    w.run_for(100 * MS);
    let (a, b) = (w.member_id(0), w.member_id(1));
    let mallory = SocketAddr::from(([198, 51, 100, 66], 6666));
    let mut buf = [0u8; 256];
    let mut injected = 0u64;
    for k in 0..400u32 {
        // Probes and acks "from bo" with made-up authenticators, from Mallory's address,
        // handed to ana's paths as if her router had let them in.
        for kind in [ProbeKind::Probe, ProbeKind::Ack] {
            let mac = [(k % 251) as u8; PROBE_MAC_LEN];
            let n = Control::Probe(Probe {
                from: b,
                to: a,
                seq: k % 40 + 1,
                kind,
                server_rtt_us: 1,
                hold_us: 0,
                mac: &mac,
            })
            .encode(&mut buf)
            .expect("encode");
            let now = w.now;
            if let Some(p) = &mut w.members[0].paths {
                assert!(p.handle_probe(now, mallory, &buf[..n]));
            }
            injected += 1;
        }
        w.run_for(5 * MS);
    }
    assert_eq!(w.state(0, 1), Some(PathState::Relayed));
    let stats = w.members[0].paths.as_ref().map(|p| p.stats()).expect("paths");
    assert!(stats.rejected >= injected, "{stats:?}");
    assert_eq!(stats.probes_received, 0);
    assert!(w.members[0]
        .path_events
        .iter()
        .all(|(_, e)| !matches!(e, PathEvent::Direct { .. })));
}

#[test]
fn per_packet_work_does_not_allocate() {
    let mut w = pair(10 * MS, 4 * MS);
    w.isolated.insert(home(3));
    w.add(3, "cy");
    w.run_for(1_500 * MS);
    assert_eq!(w.state(0, 1), Some(PathState::Direct));
    assert_eq!(w.state(0, 2), Some(PathState::Relayed));
    // Steady state: probes answered, the route table read for every packet, the server
    // forwarding with direct lists.
    let (a_addr, b_addr) = (w.members[0].addr, w.members[1].addr);
    let ssrc = w.members[0].ssrc;
    let mut pkt = rtp(ssrc, 1);
    let mut buf = [0u8; 256];
    let mut a = w.members[0].paths.take().expect("paths");
    let mut b = w.members[1].paths.take().expect("paths");
    let mut now = w.now;
    let mut copies = 0usize;
    let mut direct = 0usize;
    let before = alloc_count::allocations();
    alloc_count::prove_counting();
    let before = before + 1;
    for k in 0..20_000u64 {
        now += PACKET;
        let t = a.route_table();
        direct += t.direct().count();
        pkt[2..4].copy_from_slice(&(k as u16).to_be_bytes());
        if let Verdict::Forward(d) = w.server.handle_datagram(now, a_addr, &pkt) {
            copies += d.len();
            for x in d.iter().map(|d| d.id).collect::<arrayish::Ids>().iter() {
                w.server.sent(*x);
            }
        }
        a.handle_timeout(now);
        b.handle_timeout(now);
        while let Some((t, n)) = a.poll_transmit(now, &mut buf) {
            if t == Target::Addr(b_addr) {
                b.handle_probe(now + MS, a_addr, &buf[..n]);
            }
        }
        while let Some((t, n)) = b.poll_transmit(now + MS, &mut buf) {
            if t == Target::Addr(a_addr) {
                a.handle_probe(now + 2 * MS, b_addr, &buf[..n]);
            }
        }
        while a.poll_event().is_some() || b.poll_event().is_some() {}
    }
    let allocated = alloc_count::allocations() - before;
    assert_eq!(allocated, 0);
    // Every packet went direct to bo and through the server to cy only.
    assert_eq!(direct, 20_000);
    assert_eq!(copies, 20_000);
}

/// A fixed-size collection of destination ids (no allocation).
mod arrayish {
    use netjam_engine::room::DestId;

    pub struct Ids {
        ids: [Option<DestId>; 16],
    }

    impl FromIterator<DestId> for Ids {
        fn from_iter<I: IntoIterator<Item = DestId>>(iter: I) -> Self {
            let mut ids = [None; 16];
            for (s, d) in ids.iter_mut().zip(iter) {
                *s = Some(d);
            }
            Self { ids }
        }
    }

    impl Ids {
        pub fn iter(&self) -> impl Iterator<Item = &DestId> {
            self.ids.iter().flatten()
        }
    }
}

#[test]
fn a_member_whose_mapping_changes_is_paired_anew_and_goes_direct_again() {
    let mut w = pair(10 * MS, 4 * MS);
    w.run_for(1_500 * MS);
    assert_eq!(w.state(0, 1), Some(PathState::Direct));
    let token_events = |w: &World, i: usize| {
        w.members[i]
            .path_events
            .iter()
            .filter(|(_, e)| matches!(e, PathEvent::Direct { .. }))
            .count()
    };
    let before = (token_events(&w, 0), token_events(&w, 1));
    // Bo's router maps his socket to a new public port: whatever went to the old one is
    // lost, and the server does not know the new one until he takes his seat back.
    let changed = w.now;
    w.members[1].addr = home(12);
    w.members[1].opened.clear();
    w.run_for(3_000 * MS);
    assert!(w.members[1].client.seat().is_some());
    for (i, of) in [(0, 1), (1, 0)] {
        assert_eq!(w.state(i, of), Some(PathState::Direct), "{i}");
    }
    // Ana's path points at bo's new address.
    let path = w.members[0]
        .paths
        .as_ref()
        .and_then(|p| p.path(w.member_id(1)))
        .expect("path");
    assert_eq!(path.addr, Some(home(12)));
    assert!(token_events(&w, 0) > before.0 && token_events(&w, 1) > before.1);
    for (from, to) in [(0, 1), (1, 0)] {
        let ssrc = w.members[from].ssrc;
        let back = w.members[from]
            .sent_at
            .iter()
            .filter(|&(_, &at)| at > changed)
            .find(|(seq, _)| w.members[to].heard.contains_key(&(ssrc, **seq)))
            .map(|(_, &at)| at - changed)
            .expect("heard again");
        println!(
            "mapping changed: {from}->{to} heard again from packets sent {:.1} ms after",
            back as f64 / 1e6
        );
        assert!(back <= 1_000 * MS);
    }
    // The music came back: everything ana sent from 1 s after the change on arrived.
    let (n, _, _, miss) = w.heard_between(0, 1, changed + 1_000 * MS, w.now - 50 * MS);
    assert!(n > 700);
    assert_eq!(miss, 0);
    let (n, _, _, miss) = w.heard_between(1, 0, changed + 1_000 * MS, w.now - 50 * MS);
    assert!(n > 700);
    assert_eq!(miss, 0);
}
