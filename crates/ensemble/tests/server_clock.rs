//! Members whose ensemble is a room on a rooms server, in virtual time: the server answers
//! clock probes with its own clock, and every member follows it rather than choosing a
//! member. Members join and leave without moving anyone's time line, and each member's
//! ensemble time agrees with the server's clock.
//!
//! The network is a hub: probes to the server take 2 ms each way; member-to-member
//! datagrams go through the server (4 ms). Every clock has its own origin.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::net::SocketAddr;

use netjam_ensemble::clock::{ClockServer, ProbeRequest, PING_ADDRESS};
use netjam_ensemble::{Dest, Event, Member, MemberConfig, SERVER_REFERENCE};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;
/// The server's clock: virtual time plus this.
const SERVER_OFFSET: u64 = 3_100 * MS;

fn server_addr() -> SocketAddr {
    "192.0.2.1:4464".parse().unwrap()
}

struct Node {
    member: Member,
    addr: SocketAddr,
    offset: u64,
    events: Vec<Event>,
    alive: bool,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Flight {
    at: Reverse<(u64, u64)>,
    /// Destination node (usize::MAX: the server).
    to: usize,
    from: SocketAddr,
    bytes: Vec<u8>,
}

struct Hub {
    now: u64,
    nodes: Vec<Node>,
    queue: BinaryHeap<Flight>,
    serial: u64,
    server: ClockServer,
}

impl Hub {
    fn join(&mut self, id: u64) -> usize {
        let k = self.nodes.len();
        let offset = (k as u64 + 1) * 7_300 * MS;
        let mut cfg = MemberConfig::new("band", id);
        cfg.clock_server = Some(server_addr());
        let addr: SocketAddr = format!("[100::{}]:0", k + 1).parse().unwrap();
        self.nodes.push(Node {
            member: Member::new(cfg, self.now + offset),
            addr,
            offset,
            events: Vec::new(),
            alive: true,
        });
        k
    }

    fn push(&mut self, delay: u64, to: usize, from: SocketAddr, bytes: Vec<u8>) {
        self.serial += 1;
        self.queue.push(Flight {
            at: Reverse((self.now + delay, self.serial)),
            to,
            from,
            bytes,
        });
    }

    fn flush(&mut self, k: usize) {
        let from = self.nodes[k].addr;
        while let Some(e) = self.nodes[k].member.poll_event() {
            self.nodes[k].events.push(e);
        }
        while let Some(t) = self.nodes[k].member.poll_transmit() {
            match t.to {
                Dest::Peer(a) if a == server_addr() => self.push(2 * MS, usize::MAX, from, t.bytes),
                Dest::Peer(a) => {
                    if let Some(j) = self.nodes.iter().position(|n| n.addr == a) {
                        self.push(4 * MS, j, from, t.bytes);
                    }
                }
                Dest::Discovery => {
                    for j in (0..self.nodes.len()).filter(|j| *j != k) {
                        self.push(4 * MS, j, from, t.bytes.clone());
                    }
                }
            }
        }
    }

    fn run_until(&mut self, until: u64) {
        loop {
            let mut next = until;
            for n in self.nodes.iter().filter(|n| n.alive) {
                next = next.min(n.member.poll_timeout().saturating_sub(n.offset).max(self.now));
            }
            if let Some(f) = self.queue.peek() {
                next = next.min(f.at.0 .0);
            }
            if next >= until {
                self.now = until;
                return;
            }
            self.now = next;
            while self.queue.peek().is_some_and(|f| f.at.0 .0 <= self.now) {
                let f = self.queue.pop().unwrap();
                if f.to == usize::MAX {
                    let Ok(req) = ProbeRequest::decode(&f.bytes) else {
                        continue;
                    };
                    let server_now = self.now + SERVER_OFFSET;
                    let reply = self.server.answer(server_now, &req);
                    let mut buf = [0u8; 64];
                    let n = reply.encode(&mut buf).unwrap();
                    if let Some(j) = self.nodes.iter().position(|x| x.addr == f.from) {
                        self.push(2 * MS, j, server_addr(), buf[..n].to_vec());
                    }
                } else if self.nodes[f.to].alive {
                    let local = self.now + self.nodes[f.to].offset;
                    self.nodes[f.to].member.handle(local, f.from, &f.bytes);
                    self.flush(f.to);
                }
            }
            for k in 0..self.nodes.len() {
                if !self.nodes[k].alive {
                    continue;
                }
                let local = self.now + self.nodes[k].offset;
                if self.nodes[k].member.poll_timeout() <= local {
                    self.nodes[k].member.handle_timeout(local);
                }
                self.flush(k);
            }
        }
    }
}

#[test]
fn members_of_a_room_follow_the_server_clock_and_nobody_moves_it() {
    let mut hub = Hub {
        now: 0,
        nodes: Vec::new(),
        queue: BinaryHeap::new(),
        serial: 0,
        server: ClockServer::new(),
    };
    // Ids in an order that would make the last one the reference on a LAN.
    let a = hub.join(900);
    let b = hub.join(500);
    hub.run_until(3 * S);
    let c = hub.join(3);
    hub.run_until(8 * S);
    for k in [a, b, c] {
        let n = &hub.nodes[k];
        assert_eq!(n.member.reference(), Some(SERVER_REFERENCE), "member {k}");
        assert!(
            n.events.contains(&Event::ClockLocked {
                reference: SERVER_REFERENCE
            }),
            "member {k}: {:?}",
            n.events
        );
        let refs = n
            .events
            .iter()
            .filter(|e| matches!(e, Event::ClockReference { .. }))
            .count();
        assert_eq!(refs, 1, "member {k} changed reference: {:?}", n.events);
        let ens = n.member.ensemble_time(hub.now + n.offset).unwrap();
        let err = ens as i64 - (hub.now + SERVER_OFFSET) as i64;
        assert!(err.abs() < 50_000, "member {k}: {err} ns off the server's clock");
        assert_eq!(n.member.table().len(), 3, "member {k} knows the three");
    }
    // The one with the smallest id leaves: nobody's time line moves.
    hub.nodes[c].member.leave();
    hub.flush(c);
    hub.nodes[c].alive = false;
    hub.run_until(12 * S);
    for k in [a, b] {
        let n = &hub.nodes[k];
        assert_eq!(n.member.reference(), Some(SERVER_REFERENCE));
        let ens = n.member.ensemble_time(hub.now + n.offset).unwrap();
        let err = ens as i64 - (hub.now + SERVER_OFFSET) as i64;
        assert!(err.abs() < 50_000, "member {k}: {err} ns off the server's clock");
        assert_eq!(n.member.table().len(), 2);
    }
}

#[test]
fn the_rooms_server_recognises_the_clock_probe_by_its_address() {
    assert!(netjam_engine::room::msg::CLOCK_PING_PREFIX == PING_ADDRESS.as_bytes());
    let mut buf = [0u8; 64];
    let n = ProbeRequest { id: 1, t1_ns: 5 }.encode(&mut buf).unwrap();
    assert!(buf[..n].starts_with(netjam_engine::room::msg::CLOCK_PING_PREFIX));
}
