//! The player's control half ([`Session`]) in virtual time, against two rooms-server cores
//! named as front doors: two players seated on the first, which then goes silent (the
//! process died). Datagrams are delivered at once; time moves 1 ms a step.
//!
//! * each player's session gives up the silent server for the next front door on its own,
//!   is seated there anew and counts one move, with the silence it cost;
//! * the other member is heard again there under its new id, at the seat it sat at
//!   before, with the mix this player set for its name (a mix follows the name);
//! * the join is the session's first phase: a first front door that never answers is
//!   given up for the next after the redirect patience, and a refusal is said with its
//!   code, never as a seat;
//! * while both servers answer, nothing moves, and the two punch a direct path to each
//!   other; a datagram from an address other than the server's goes to the direct paths,
//!   never to the room client.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use netjam_engine::player::session::REDIRECT_PATIENCE_NS;
use netjam_engine::player::{Command, FrontDoors, Notice, Session, SessionEvent, SessionStart};
use netjam_engine::room::msg::MAX_ENS_LEN;
use netjam_engine::room::{ClientConfig, RefuseCode, RoomClient, Server, ServerConfig};

const MS: u64 = 1_000_000;

fn server_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 9, 0, i as u8 + 1], 4464))
}

struct Player {
    addr: SocketAddr,
    session: Session,
    commands: Vec<Command>,
    events: Vec<SessionEvent>,
}

struct World {
    now: u64,
    servers: Vec<Server>,
    alive: Vec<bool>,
    players: Vec<Player>,
}

impl World {
    fn new() -> Self {
        World {
            now: 1_000 * MS,
            servers: (0..2)
                .map(|i| Server::new(ServerConfig::default(), [i as u8 + 1; 32]))
                .collect(),
            alive: vec![true, true],
            players: Vec::new(),
        }
    }

    fn server_at(&self, a: SocketAddr) -> Option<usize> {
        (0..self.servers.len()).find(|&i| server_addr(i) == a && self.alive[i])
    }

    /// Seats a player named `name` on server 0: its session joins from the first hello.
    fn seat(&mut self, name: &str) -> usize {
        self.seat_with(name, &[server_addr(1)])
    }

    /// [`World::seat`], with `others` as the front doors after the first server.
    fn seat_with(&mut self, name: &str, others: &[SocketAddr]) -> usize {
        let i = self.join(name, "", others);
        for _ in 0..2_000 {
            if self.players[i].session.seated() {
                return i;
            }
            self.step();
        }
        panic!("{name} was not seated: {:?}", self.players[i].events);
    }

    /// A player whose session starts joining room "band" with `password`; not stepped.
    fn join(&mut self, name: &str, password: &str, others: &[SocketAddr]) -> usize {
        let i = self.players.len();
        let addr = SocketAddr::from(([10, 1, 0, i as u8 + 1], 5000));
        let mut cfg = ClientConfig::new("band", name, password, 100 + i as u32);
        cfg.nonce_seed = [i as u8 + 1; 16];
        let session = Session::new(SessionStart {
            client: RoomClient::new(cfg, self.now),
            front: FrontDoors::new(server_addr(0), others),
            room: "band".into(),
            ssrc: 100 + i as u32,
            direct: true,
            public: false,
            mixes: Default::default(),
            private: None,
            pinned: BTreeMap::new(),
            stun_seed: [i as u8 + 7; 32],
            now_ns: self.now,
        });
        self.players.push(Player {
            addr,
            session,
            commands: Vec::new(),
            events: Vec::new(),
        });
        i
    }

    fn deliver(&mut self, to: SocketAddr, from: SocketAddr, bytes: &[u8]) {
        let now = self.now;
        if let Some(p) = self.players.iter_mut().find(|p| p.addr == to) {
            p.session.handle_datagram(now, from, bytes);
        }
    }

    fn step_servers(&mut self) {
        let now = self.now;
        for s in &mut self.servers {
            if s.poll_timeout().is_some_and(|t| t <= now) {
                s.handle_timeout(now);
            }
        }
    }

    fn step(&mut self) {
        self.now += MS;
        let now = self.now;
        let mut buf = [0u8; MAX_ENS_LEN];
        let mut out = Vec::new();
        for p in &mut self.players {
            p.session.handle_timeout(now);
            while let Some(e) = p.session.poll_event() {
                p.events.push(e);
            }
            while let Some((to, n)) = p.session.poll_transmit(now, &mut buf) {
                out.push((p.addr, to, buf[..n].to_vec()));
            }
            while let Some(c) = p.session.poll_command() {
                p.commands.push(c);
            }
        }
        for (from, to, bytes) in out {
            match self.server_at(to) {
                Some(s) => {
                    let _ = self.servers[s].handle_datagram(now, from, &bytes);
                }
                None => self.deliver(to, from, &bytes),
            }
        }
        self.step_servers();
        for s in 0..self.servers.len() {
            while let Some((to, n)) = self.servers[s].poll_transmit(&mut buf) {
                if self.alive[s] {
                    let bytes = buf[..n].to_vec();
                    self.deliver(to, server_addr(s), &bytes);
                }
            }
        }
    }

    fn run(&mut self, ms: u64) {
        for _ in 0..ms {
            self.step();
        }
    }
}

/// What a player was told about its server (not about paths), in order.
fn server_notices(r: &netjam_engine::player::Roster) -> Vec<&Notice> {
    r.notices
        .iter()
        .filter(|n| !matches!(n, Notice::Path { .. } | Notice::Members { .. }))
        .collect()
}

#[test]
fn a_silent_server_is_left_for_the_next_front_door_and_the_mix_follows_the_name() {
    let mut w = World::new();
    let ana = w.seat("ana");
    let bo = w.seat("bo");
    w.run(2_000);
    for p in [ana, bo] {
        let r = w.players[p].session.roster();
        assert_eq!(r.members.len(), 1, "{}: the other member is in the roster", p);
        assert_eq!(r.server, Some(server_addr(0)));
        assert_eq!(r.moves, 0, "nothing moves while the server answers");
        // The two punched a direct path to each other through the session's probes, and
        // the shell was told to route media over it.
        let direct = w.players[p].session.route_table().direct().count();
        assert_eq!(direct, 1, "{p}: a direct path to the other member");
        assert!(w.players[p].events.contains(&SessionEvent::Routes));
        // ... and the player was told, once, by the other's name.
        let other = if p == ana { "bo" } else { "ana" };
        let told: Vec<String> = r
            .notices
            .iter()
            .filter(|n| matches!(n, Notice::Path { .. }))
            .map(|n| n.to_string())
            .collect();
        assert!(
            told.len() == 1 && told[0].starts_with(&format!("direct path to {other} at 10.1.0.")),
            "{p}: {told:?}"
        );
    }
    // Ana turns Bo down, through her seat, as an OSC fader would.
    let (bo_id, bo_seat) = {
        let r = w.players[ana].session.roster();
        let id = r.member_named("bo").expect("bo");
        (id, r.seat_of(id).expect("a seat"))
    };
    w.players[ana].session.command(Command::Gain {
        member: bo_id,
        db: -9.0,
    });
    w.run(10);
    w.players[ana].commands.clear();

    // The first server dies.
    w.alive[0] = false;
    let died = w.now;
    let seated_again = |w: &World| {
        [ana, bo].iter().all(|&p| {
            let r = w.players[p].session.roster();
            r.server == Some(server_addr(1)) && r.members.len() == 1
        })
    };
    while !seated_again(&w) && w.now - died < 15_000 * MS {
        w.step();
    }
    let took = (w.now - died) as f64 / 1e9;
    w.run(500);
    for p in [ana, bo] {
        let pl = &w.players[p];
        let r = pl.session.roster();
        assert_eq!(
            r.server,
            Some(server_addr(1)),
            "{p}: seated on the second front door"
        );
        assert!(
            pl.events.contains(&SessionEvent::ServerIs(server_addr(1))),
            "{p}: the shell was told to talk to the second server: {:?}",
            pl.events
        );
        assert_eq!(r.moves, 1, "{p}: one move");
        let m = r.last_move.as_ref().expect("the move");
        // The client calls the server lost after 5 s of silence; the last word was
        // heard at most a keep-alive before it died.
        eprintln!("{p}: moved after {:.2} s of silence", m.silence_s);
        assert!((4.0..12.0).contains(&m.silence_s) && !m.handed_over, "{p}: {m:?}");
        assert!(!r.lost, "{p}: seated again");
        // What the player was told about the server, in order.
        let server = server_notices(r);
        assert_eq!(
            server.first().copied(),
            Some(&Notice::ServerLost {
                server: server_addr(0)
            }),
            "{p}: {:?}",
            r.notices
        );
        assert!(
            matches!(server.last(), Some(Notice::Moved(m)) if m.to == server_addr(1)),
            "{p}: {:?}",
            r.notices
        );
        assert_eq!(server.len(), 2, "{p}: said once each: {:?}", r.notices);
    }
    eprintln!("both seated again, each hearing the other, {took:.2} s after the server died");
    // Who is in the room is said when it changes: bo arrived, and after the move (with
    // whoever was seated first told "nobody" until the other came) bo is there again.
    for (p, other) in [(ana, "bo"), (bo, "ana")] {
        let told: Vec<&Vec<String>> = w.players[p]
            .session
            .roster()
            .notices
            .iter()
            .filter_map(|n| match n {
                Notice::Members { names, .. } => Some(names),
                _ => None,
            })
            .collect();
        eprintln!("{p}: told of members {told:?}");
        let other = vec![other.to_string()];
        assert_eq!(told.first(), Some(&&other), "{p}: {told:?}");
        assert_eq!(told.last(), Some(&&other), "{p}: {told:?}");
        assert!(told.windows(2).all(|w| w[0] != w[1]), "{p}: told twice: {told:?}");
        assert!(told.len() <= 3, "{p}: {told:?}");
    }
    assert!(took < 7.0, "{took:.2} s");
    // Bo is back in Ana's roster under his new id, at the seat he had, at −9 dB.
    let r = w.players[ana].session.roster();
    let new_id = r.member_named("bo").expect("bo is heard again");
    assert_eq!(r.seat_of(new_id), Some(bo_seat), "the same seat");
    let cmds = &w.players[ana].commands;
    assert!(
        cmds.contains(&Command::Gain {
            member: new_id,
            db: -9.0
        }),
        "the mix set for bo is applied to his new id: {cmds:?}"
    );
    assert!(
        cmds.iter().any(|c| matches!(c, Command::Release { .. })),
        "the old seat's member was released: {cmds:?}"
    );
    // In that order: the old seat released, then bo assigned again, then his mix.
    let last_release = cmds.iter().rposition(|c| matches!(c, Command::Release { .. }));
    let assigned = cmds
        .iter()
        .position(|c| matches!(c, Command::Assign { member, .. } if *member == new_id));
    let mixed = cmds.iter().position(|c| {
        *c == Command::Gain {
            member: new_id,
            db: -9.0,
        }
    });
    assert!(
        last_release < assigned && assigned < mixed,
        "release, assign, mix, in order: {cmds:?}"
    );
}

#[test]
fn a_probe_goes_to_the_direct_paths_and_never_to_the_room_client() {
    let mut w = World::new();
    let ana = w.seat("ana");
    w.run(500);
    let before = w.players[ana].session.roster().clone();
    // Junk and a probe-looking datagram from an address that is not the server.
    let stranger = SocketAddr::from(([10, 7, 7, 7], 6000));
    let now = w.now;
    w.players[ana]
        .session
        .handle_datagram(now, stranger, b"/netjam/leave\0\0\0,\0\0\0");
    w.players[ana]
        .session
        .handle_datagram(now, stranger, b"/netjam/probe junk");
    w.run(100);
    let after = w.players[ana].session.roster();
    assert_eq!(after.members.len(), before.members.len());
    assert_eq!(
        after.me, before.me,
        "a control message from elsewhere is not the server's"
    );
    assert!(!after.lost && after.refused.is_none());
}

#[test]
fn a_server_that_comes_back_is_said_to_be_back_not_a_move() {
    let mut w = World::new();
    let ana = w.seat_with("ana", &[]);
    let bo = w.seat_with("bo", &[]);
    w.run(2_000);
    // The only server goes silent for 8 s (a restart that kept nothing, or a cable), then
    // answers again.
    w.alive[0] = false;
    w.run(8_000);
    for p in [ana, bo] {
        let r = w.players[p].session.roster();
        assert!(r.lost, "{p}: lost while silent");
        assert_eq!(
            server_notices(r),
            vec![&Notice::ServerLost {
                server: server_addr(0)
            }],
            "{p}"
        );
    }
    w.alive[0] = true;
    w.run(5_000);
    for p in [ana, bo] {
        let r = w.players[p].session.roster();
        assert!(!r.lost, "{p}: seated again");
        assert_eq!(r.members.len(), 1, "{p}: hears the other again");
        let told = server_notices(r);
        assert_eq!(told.len(), 2, "{p}: {:?}", r.notices);
        match told[1] {
            Notice::ServerBack { server, silence_s } => {
                eprintln!("{p}: back after {silence_s:.2} s");
                assert_eq!(*server, server_addr(0));
                assert!((8.0..15.0).contains(silence_s), "{p}: {silence_s}");
            }
            n => panic!("{p}: told {n} instead of the server being back"),
        }
    }
}

#[test]
fn a_join_to_a_silent_first_door_is_seated_at_the_next() {
    let mut w = World::new();
    w.alive[0] = false;
    let start = w.now;
    let ana = w.seat("ana");
    let took = w.now - start;
    let p = &w.players[ana];
    eprintln!(
        "seated at the second front door {:.2} s after the first hello",
        took as f64 / 1e9
    );
    assert!(
        (REDIRECT_PATIENCE_NS..REDIRECT_PATIENCE_NS + 500 * MS).contains(&took),
        "given up after its patience, seated at once: {took} ns"
    );
    assert_eq!(p.session.server(), server_addr(1));
    assert_eq!(p.session.roster().server, Some(server_addr(1)));
    let seated: Vec<_> = p
        .events
        .iter()
        .filter(|e| matches!(e, SessionEvent::Seated { .. }))
        .collect();
    assert!(
        matches!(seated[..], [SessionEvent::Seated { ssrc, redirected: None, .. }] if Some(*ssrc) == p.session.roster().me.map(|m| m.1)),
        "seated once, not by a redirect: {:?}",
        p.events
    );
    assert!(
        p.events.contains(&SessionEvent::ServerIs(server_addr(1))),
        "{:?}",
        p.events
    );
    // No move, no loss: a join that found its server is not a room that moved.
    let r = p.session.roster();
    assert_eq!(r.moves, 0);
    assert!(server_notices(r).is_empty(), "{:?}", r.notices);
}

#[test]
fn a_join_with_another_password_is_refused_with_its_code() {
    let mut w = World::new();
    let ana = w.join("ana", "first", &[]);
    w.run(500);
    assert!(w.players[ana].session.seated());
    let bo = w.join("bo", "second", &[]);
    w.run(2_000);
    let p = &w.players[bo];
    assert!(!p.session.seated(), "{:?}", p.events);
    let refused: Vec<_> = p
        .events
        .iter()
        .filter_map(|e| match e {
            SessionEvent::Refused { code, .. } => Some(*code),
            _ => None,
        })
        .collect();
    assert_eq!(refused, vec![Some(RefuseCode::WrongPassword)], "{:?}", p.events);
    assert!(!p.events.iter().any(|e| matches!(e, SessionEvent::Seated { .. })));
    assert_eq!(
        w.players[ana].session.roster().members.len(),
        0,
        "ana plays alone"
    );
}
