//! Rooms across servers in virtual time: two server cores sharing one directory
//! (`InMemoryDirectory`, answered the way a server's directory thread answers), and
//! clients that follow redirects. Datagrams are delivered at once; time moves 1 ms a step.
//!
//! * a join at the server that does not host the room is redirected, and the client is
//!   seated where the room lives, with the room's other member in its roster;
//! * a join for a room nobody hosts is held while the server claims it, then admitted;
//! * a directory that does not answer refuses new rooms and nothing else;
//! * every spelling of a room's name finds the one room (the directory knows it in
//!   lowercase);
//! * the last member leaving gives the claim back; an unused claim is given back too;
//! * a room whose claim another server took while it played (its lease ran out: a server
//!   cut off from the directory) is not split in two: its members are sent to the new
//!   holder and seated there with the member who opened it anew;
//! * two servers that each believe the other hosts the room stop a client after a bounded
//!   number of redirects; redirects to a server that never answers (dead, its lease not yet
//!   run out) do not count.

use std::net::SocketAddr;

use netjam_engine::room::client::MAX_REDIRECTS;
use netjam_engine::room::msg::MAX_ENS_LEN;
use netjam_engine::room::server::{CLAIM_UNUSED_NS, LOCATE_WAIT_NS};
use netjam_engine::room::{
    ClientConfig, DirectoryRequest, InMemoryDirectory, ListedRoom, Placement, RefuseCode, RoomClient,
    RoomDirectory, RoomEvent, RosterKind, Server, ServerConfig,
};

const MS: u64 = 1_000_000;

fn server_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 9, 0, i as u8], 4464))
}

/// How the test answers a server's directory requests.
#[derive(Clone, Copy, PartialEq)]
enum Answer {
    /// Through the shared directory, as a server's directory thread does.
    Directory,
    /// As if the directory did not answer.
    Down,
    /// Always "the other server has it" (two servers that disagree).
    TheOther,
    /// Never: the request is lost (a directory thread that is stuck).
    Never,
}

struct Player {
    addr: SocketAddr,
    client: RoomClient,
    /// Index of the server it sends to.
    at: usize,
    events: Vec<RoomEvent>,
}

struct World {
    now: u64,
    servers: Vec<Server>,
    directory: InMemoryDirectory,
    answer: Answer,
    players: Vec<Player>,
    /// Requests the servers made, in order: (server, request).
    asked: Vec<(usize, DirectoryRequest)>,
}

impl World {
    fn new() -> Self {
        let cfg = ServerConfig {
            directory: true,
            ..ServerConfig::default()
        };
        Self {
            now: 1_000 * MS,
            servers: (0..2)
                .map(|i| Server::new(cfg.clone(), [i as u8 + 1; 32]))
                .collect(),
            directory: InMemoryDirectory::new(5_000 * MS),
            answer: Answer::Directory,
            players: Vec::new(),
            asked: Vec::new(),
        }
    }

    fn add(&mut self, at: usize, room: &str, name: &str) -> usize {
        let i = self.players.len();
        let mut cfg = ClientConfig::new(room, name, "pw", 100 + i as u32);
        cfg.nonce_seed = [i as u8; 16];
        self.players.push(Player {
            addr: SocketAddr::from(([10, 1, 0, i as u8 + 1], 5000)),
            client: RoomClient::new(cfg, self.now),
            at,
            events: Vec::new(),
        });
        i
    }

    fn step(&mut self) {
        let mut buf = [0u8; MAX_ENS_LEN];
        let now = self.now;
        for p in &mut self.players {
            if p.client.poll_timeout().is_some_and(|t| t <= now) {
                p.client.handle_timeout(now);
            }
            while let Some(n) = p.client.poll_transmit(&mut buf) {
                let _ = self.servers[p.at].handle_datagram(now, p.addr, &buf[..n]);
            }
        }
        for s in 0..self.servers.len() {
            let server = &mut self.servers[s];
            if server.poll_timeout().is_some_and(|t| t <= now) {
                server.handle_timeout(now);
            }
            while let Some(r) = server.poll_directory() {
                self.asked.push((s, r.clone()));
                let me = server_addr(s).to_string();
                match r {
                    DirectoryRequest::Locate(room) => {
                        let placement = match self.answer {
                            Answer::Never => continue,
                            Answer::Down => Placement::Unavailable,
                            Answer::TheOther => Placement::Elsewhere(server_addr(1 - s).to_string()),
                            Answer::Directory => {
                                let holder = self.directory.claim(&room, &me, now).expect("claim");
                                if holder == me {
                                    Placement::Here
                                } else {
                                    Placement::Elsewhere(holder)
                                }
                            }
                        };
                        server.placed(now, &room, placement);
                    }
                    DirectoryRequest::Vacate(room) => self.directory.release(&room, &me).expect("release"),
                    DirectoryRequest::Listed { .. } => {}
                }
            }
            while let Some((dst, n)) = server.poll_transmit(&mut buf) {
                if let Some(p) = self.players.iter_mut().find(|p| p.addr == dst && p.at == s) {
                    p.client.handle_datagram(now, &buf[..n]);
                }
            }
        }
        for p in &mut self.players {
            while let Some(e) = p.client.poll_event() {
                if let RoomEvent::Redirected { server } = &e {
                    p.at = (0..2)
                        .find(|&i| server_addr(i).to_string() == *server)
                        .expect("a redirect to a known server");
                    p.client.server_changed(now);
                }
                p.events.push(e);
            }
        }
        self.now += MS;
    }

    fn run_ms(&mut self, ms: u64) {
        for _ in 0..ms {
            self.step();
        }
    }

    fn seated(&self, p: usize) -> bool {
        self.players[p].client.seat().is_some()
    }

    fn redirects(&self, p: usize) -> usize {
        self.players[p]
            .events
            .iter()
            .filter(|e| matches!(e, RoomEvent::Redirected { .. }))
            .count()
    }
}

#[test]
fn a_join_at_the_wrong_server_is_redirected_and_seated_where_the_room_lives() {
    let mut w = World::new();
    let ana = w.add(1, "band", "ana");
    w.run_ms(50);
    assert!(w.seated(ana), "{:?}", w.players[ana].events);
    assert_eq!(w.redirects(ana), 0);
    assert_eq!(
        w.directory.lookup("band", w.now).unwrap().as_deref(),
        Some(server_addr(1).to_string().as_str())
    );
    let bo = w.add(0, "band", "bo");
    w.run_ms(50);
    assert!(w.seated(bo), "{:?}", w.players[bo].events);
    assert_eq!(w.redirects(bo), 1);
    assert_eq!(w.players[bo].at, 1);
    assert!(w.players[bo]
        .events
        .iter()
        .any(|e| matches!(e, RoomEvent::Roster(r) if r.name == "ana" && r.kind == RosterKind::Joined)));
    assert_eq!(
        w.servers[0].stats().rooms,
        0,
        "the front door opened the room too"
    );
    assert_eq!(w.servers[0].stats().redirects, 1);
    assert_eq!(w.servers[1].stats().members, 2);
}

#[test]
fn a_room_claimed_by_another_server_while_it_played_moves_there_whole() {
    let mut w = World::new();
    let ana = w.add(1, "band", "ana");
    let bo = w.add(1, "band", "bo");
    w.run_ms(50);
    assert!(w.seated(ana) && w.seated(bo));
    // Server 1 renews nothing here, as a server cut off from the directory: its lease runs
    // out, and a join at server 0 claims the room there. Two halves of one band.
    w.run_ms(5_100);
    let cy = w.add(0, "band", "cy");
    w.run_ms(50);
    assert!(w.seated(cy), "{:?}", w.players[cy].events);
    assert_eq!(w.players[cy].at, 0);
    assert_eq!(
        (w.servers[0].stats().members, w.servers[1].stats().members),
        (1, 2)
    );
    // Server 1's directory thread finds the claim gone to server 0 when it renews.
    let asked_before = w.asked.len();
    let (now, to) = (w.now, server_addr(0).to_string());
    w.servers[1].placed(now, "band", Placement::Moved(to));
    w.run_ms(100);
    for p in [ana, bo] {
        assert!(w.seated(p), "{:?}", w.players[p].events);
        assert_eq!(w.players[p].at, 0, "moved to the room's server");
        assert_eq!(w.redirects(p), 1);
    }
    assert_eq!(
        w.servers[1].stats().rooms,
        0,
        "the room is closed where it lost its claim"
    );
    assert_eq!(w.servers[1].stats().members, 0);
    assert_eq!(w.servers[1].stats().moved_members, 2);
    assert_eq!(
        w.servers[0].stats().members,
        3,
        "the band whole again on server 0"
    );
    assert!(
        !w.asked[asked_before..].contains(&(1, DirectoryRequest::Vacate("band".into()))),
        "the claim is server 0's: server 1 gives nothing back"
    );
    assert_eq!(
        w.directory.lookup("band", w.now).unwrap().as_deref(),
        Some(server_addr(0).to_string().as_str())
    );
    // Everyone hears of the other two on the room's server.
    for (p, others) in [(ana, ["bo", "cy"]), (bo, ["ana", "cy"]), (cy, ["ana", "bo"])] {
        for other in others {
            assert!(
                w.players[p].events.iter().rev().any(
                    |e| matches!(e, RoomEvent::Roster(r) if r.name == other && r.kind == RosterKind::Joined)
                ),
                "{} never heard of {other} on server 0",
                w.players[p].client.seat().map_or(0, |s| s.0)
            );
        }
    }
}

#[test]
fn every_spelling_of_a_room_finds_it_on_the_server_that_hosts_it() {
    let mut w = World::new();
    let ana = w.add(1, "Friday", "ana");
    w.run_ms(50);
    assert!(w.seated(ana));
    assert_eq!(
        w.directory.lookup("friday", w.now).unwrap().as_deref(),
        Some(server_addr(1).to_string().as_str()),
        "the directory knows the room in lowercase"
    );
    let bo = w.add(0, "FRIDAY", "bo");
    w.run_ms(50);
    assert!(w.seated(bo), "{:?}", w.players[bo].events);
    assert_eq!((w.redirects(bo), w.players[bo].at), (1, 1));
    assert_eq!(w.servers[1].stats().rooms, 1);
    assert!(w.servers[1].member_stats().iter().all(|m| m.room == "Friday"));
    w.players[ana].client.leave(w.now);
    w.players[bo].client.leave(w.now);
    w.run_ms(10);
    assert!(w.asked.contains(&(1, DirectoryRequest::Vacate("friday".into()))));
    assert_eq!(w.directory.lookup("friday", w.now).unwrap(), None);
}

#[test]
fn the_last_member_leaving_gives_the_room_back_and_the_next_join_claims_it_anywhere() {
    let mut w = World::new();
    let ana = w.add(1, "band", "ana");
    w.run_ms(50);
    assert!(w.seated(ana));
    w.players[ana].client.leave(w.now);
    w.run_ms(10);
    assert!(w.asked.contains(&(1, DirectoryRequest::Vacate("band".into()))));
    assert_eq!(w.directory.lookup("band", w.now).unwrap(), None);
    let bo = w.add(0, "band", "bo");
    w.run_ms(50);
    assert!(w.seated(bo));
    assert_eq!((w.redirects(bo), w.players[bo].at), (0, 0));
}

#[test]
fn a_claim_no_join_uses_is_given_back() {
    let mut w = World::new();
    // A claim answered after the joins gave up (the directory was slow): nobody opens it.
    w.servers[0].placed(w.now, "ghost", Placement::Here);
    w.run_ms(CLAIM_UNUSED_NS / MS - 10);
    assert!(!w
        .asked
        .iter()
        .any(|(_, r)| matches!(r, DirectoryRequest::Vacate(_))));
    w.run_ms(20);
    assert_eq!(w.asked, [(0, DirectoryRequest::Vacate("ghost".into()))]);
}

#[test]
fn without_the_directory_new_rooms_are_refused_and_open_rooms_go_on() {
    let mut w = World::new();
    let ana = w.add(0, "band", "ana");
    w.run_ms(50);
    assert!(w.seated(ana));
    w.answer = Answer::Down;
    let bo = w.add(0, "band", "bo");
    let cy = w.add(0, "duo", "cy");
    w.run_ms(50);
    assert!(w.seated(bo), "a join for an open room asked the directory");
    assert!(!w.seated(cy));
    assert!(
        w.players[cy].events.iter().any(|e| matches!(
            e,
            RoomEvent::Refused {
                code: Some(RefuseCode::DirectoryUnavailable),
                ..
            }
        )),
        "{:?}",
        w.players[cy].events
    );
}

#[test]
fn a_join_the_directory_never_answers_is_dropped_and_retried() {
    let mut w = World::new();
    w.answer = Answer::Never;
    let ana = w.add(0, "band", "ana");
    w.run_ms(LOCATE_WAIT_NS / MS + 100);
    assert!(!w.seated(ana));
    assert_eq!(
        w.servers[0].stats().locates,
        1,
        "the client's retries asked again while one request was out"
    );
    // The directory answers again: the client's next retry is asked about afresh.
    w.answer = Answer::Directory;
    w.run_ms(3_000);
    assert!(w.seated(ana), "{:?}", w.players[ana].events);
    assert_eq!(w.servers[0].stats().locates, 2);
    assert!(w.servers[0].stats().locate_drops >= 1);
}

#[test]
fn servers_that_disagree_stop_a_client_after_a_bounded_number_of_redirects() {
    let mut w = World::new();
    w.answer = Answer::TheOther;
    let ana = w.add(0, "band", "ana");
    w.run_ms(2_000);
    assert!(!w.seated(ana));
    assert_eq!(w.redirects(ana), MAX_REDIRECTS as usize);
    assert!(
        matches!(
            w.players[ana].events.last(),
            Some(RoomEvent::Refused { code: None, .. })
        ),
        "{:?}",
        w.players[ana].events
    );
}

#[test]
fn redirects_to_a_server_that_never_answers_do_not_use_up_the_limit() {
    let mut cfg = ClientConfig::new("band", "ana", "", 1);
    cfg.nonce_seed = [1; 16];
    let mut now = 1_000 * MS;
    let mut c = RoomClient::new(cfg, now);
    let mut front = Server::new(
        ServerConfig {
            directory: true,
            ..ServerConfig::default()
        },
        [7; 32],
    );
    let me: SocketAddr = "10.1.0.1:5000".parse().unwrap();
    let mut buf = [0u8; MAX_ENS_LEN];
    // Three times as many redirects as the limit, each to a server that stays silent.
    for _ in 0..3 * MAX_REDIRECTS {
        // At the front door: hello, challenge, join, redirect.
        let mut redirected = false;
        for _ in 0..20 {
            while let Some(n) = c.poll_transmit(&mut buf) {
                let _ = front.handle_datagram(now, me, &buf[..n]);
            }
            while let Some(r) = front.poll_directory() {
                if let DirectoryRequest::Locate(room) = r {
                    front.placed(now, &room, Placement::Elsewhere("10.9.9.9:4464".into()));
                }
            }
            while let Some((_, n)) = front.poll_transmit(&mut buf) {
                c.handle_datagram(now, &buf[..n]);
            }
            if let Some(e) = c.poll_event() {
                assert!(matches!(e, RoomEvent::Redirected { .. }), "{e:?}");
                redirected = true;
                break;
            }
            now += MS;
        }
        assert!(redirected);
        // Off to the silent server, and back to the front door after a while.
        c.server_changed(now);
        while c.poll_transmit(&mut buf).is_some() {}
        now += 1_000 * MS;
        c.server_changed(now);
    }
    assert!(c.poll_event().is_none());
}

/// Asks `server` for its list at `now` from `from`: hello, challenge, list.
fn ask_list(server: &mut Server, now: u64, from: SocketAddr) -> Vec<(String, String, u32, String)> {
    use netjam_engine::room::msg::{Control, HELLO_PAD, MAX_CONTROL_LEN};
    let mut buf = [0u8; MAX_ENS_LEN];
    let n = Control::Hello { pad: HELLO_PAD }.encode(&mut buf).expect("hello");
    let _ = server.handle_datagram(now, from, &buf[..n]);
    let (_, n) = server.poll_transmit(&mut buf).expect("a challenge");
    let Ok(Control::Challenge { cookie, .. }) = Control::decode(&buf[..n]) else {
        panic!("no challenge")
    };
    let cookie = *cookie;
    let mut q = [0u8; MAX_CONTROL_LEN];
    let n = Control::List { cookie: &cookie }.encode(&mut q).expect("list");
    let _ = server.handle_datagram(now, from, &q[..n]);
    let mut out = Vec::new();
    while let Some((to, n)) = server.poll_transmit(&mut buf) {
        assert_eq!(to, from);
        match Control::decode(&buf[..n]).expect("a reply") {
            Control::Listed {
                room,
                server,
                members,
                region,
            } => out.push((room.into(), server.into(), members, region.into())),
            Control::ListEnd { count } => {
                assert_eq!(count as usize, out.len());
                return out;
            }
            other => panic!("{other:?}"),
        }
    }
    panic!("no end of the list: {out:?}");
}

#[test]
fn public_rooms_are_listed_with_their_players_and_region_and_private_ones_are_not() {
    let mut w = World::new();
    w.servers[0] = Server::new(
        ServerConfig {
            region: "eu-west".into(),
            ..ServerConfig::default()
        },
        [9; 32],
    );
    let ana = w.add(0, "band", "ana");
    let bo = w.add(0, "band", "bo");
    let cy = w.add(0, "duo", "cy");
    w.run_ms(50);
    assert!(w.seated(ana) && w.seated(bo) && w.seated(cy));
    let asker: SocketAddr = "10.2.0.1:7000".parse().unwrap();
    assert_eq!(ask_list(&mut w.servers[0], w.now, asker), []);
    w.players[ana].client.set_public();
    w.run_ms(20);
    assert!(w.players[ana].client.is_public());
    assert_eq!(
        ask_list(&mut w.servers[0], w.now, asker),
        [("band".into(), String::new(), 2, "eu-west".into())]
    );
    w.players[bo].client.leave(w.now);
    w.run_ms(20);
    assert_eq!(ask_list(&mut w.servers[0], w.now, asker)[0].2, 1);
    // Without a cookie for its address, a list is refused, never answered.
    let mut buf = [0u8; MAX_ENS_LEN];
    let n = netjam_engine::room::msg::Control::List { cookie: &[0; 32] }
        .encode(&mut buf)
        .unwrap();
    let _ = w.servers[0].handle_datagram(w.now, asker, &buf[..n]);
    while let Some((_, n)) = w.servers[0].poll_transmit(&mut buf) {
        assert!(matches!(
            netjam_engine::room::msg::Control::decode(&buf[..n]),
            Ok(netjam_engine::room::msg::Control::Refused { .. })
        ));
    }
}

#[test]
fn with_a_directory_public_rooms_are_published_and_the_list_is_the_directorys() {
    let mut w = World::new();
    let ana = w.add(1, "band", "ana");
    w.run_ms(50);
    w.players[ana].client.set_public();
    w.run_ms(20);
    assert!(w.asked.contains(&(
        1,
        DirectoryRequest::Listed {
            room: "band".into(),
            members: 1
        }
    )));
    let listing = vec![ListedRoom {
        room: "band".into(),
        server: server_addr(1).to_string(),
        members: 1,
        region: "us".into(),
    }];
    w.servers[0].set_listing(listing);
    let asker: SocketAddr = "10.2.0.1:7000".parse().unwrap();
    assert_eq!(
        ask_list(&mut w.servers[0], w.now, asker),
        [("band".into(), server_addr(1).to_string(), 1, "us".into())]
    );
    w.players[ana].client.leave(w.now);
    w.run_ms(20);
    assert!(w.asked.contains(&(
        1,
        DirectoryRequest::Listed {
            room: "band".into(),
            members: 0
        }
    )));
}
