//! The control tree without sockets: each datagram goes through the same `respond` the
//! control thread runs, replies are decoded, commands are popped from a real ring.
#![allow(clippy::unwrap_used)]

use super::*;
use netjam_osc::Message;

/// A decoded argument of a reply.
#[derive(Debug, Clone, PartialEq)]
enum V {
    F(f32),
    I(i32),
    S(String),
    Nil,
    Other(String),
}

type Reply = (String, Vec<V>);

fn owned(a: Arg<'_>) -> V {
    match a {
        Arg::Float(v) => V::F(v),
        Arg::Int(v) => V::I(v),
        Arg::Str(s) => V::S(s.to_owned()),
        Arg::Nil => V::Nil,
        other => V::Other(format!("{other:?}")),
    }
}

struct Rig {
    tree: Tree<Ctx>,
    ctx: Ctx,
    rx: CommandRx,
    passwords: std::sync::mpsc::Receiver<String>,
    scratch: Vec<u8>,
}

impl Rig {
    fn new(surface: Surface, ring: usize) -> Self {
        let (tx, rx) = command_ring(ring);
        let (password_tx, passwords) = std::sync::mpsc::channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(ControlState::new(&surface)),
            counters: Counters::default(),
            stop: AtomicBool::new(false),
        });
        Rig {
            tree: tree::build(&surface).unwrap(),
            ctx: Ctx {
                shared,
                sink: Box::new(tx),
                passwords: Some(password_tx),
            },
            rx,
            passwords,
            scratch: vec![0; DATAGRAM],
        }
    }

    fn room() -> Self {
        Self::new(Surface::room(), DEFAULT_RING)
    }

    fn packet(&mut self, bytes: &[u8]) -> Vec<Reply> {
        let mut replies = Vec::new();
        let shared = self.ctx.shared.clone();
        respond_named(
            &self.tree,
            &mut self.ctx,
            &*shared,
            bytes,
            &mut self.scratch,
            |b| {
                let m = Message::decode(b).unwrap();
                replies.push((m.address().to_owned(), m.args().map(owned).collect()));
                true
            },
        );
        replies
    }

    fn send(&mut self, address: &str, args: &[Arg<'_>]) -> Vec<Reply> {
        let mut buf = [0u8; 512];
        let n = encode_message(&mut buf, address, args).unwrap();
        self.packet(&buf[..n])
    }

    fn commands(&mut self) -> Vec<ControlCommand> {
        std::iter::from_fn(|| self.rx.pop().ok()).collect()
    }

    fn counters(&self) -> ControlCounters {
        self.ctx.shared.counters.snapshot()
    }

    fn state(&self) -> ControlState {
        self.ctx.shared.state().clone()
    }
}

fn is_error(replies: &[Reply], address: &str) -> bool {
    matches!(replies, [(a, args)] if a == "/error" && args.first() == Some(&V::S(address.into())))
}

#[test]
fn a_password_goes_to_the_room_thread_only_where_the_surface_has_the_port() {
    let mut r = Rig::new(
        Surface {
            password: true,
            ..Surface::room()
        },
        DEFAULT_RING,
    );
    assert!(r.send("/password", &[Arg::Str("second")]).is_empty());
    assert_eq!(r.passwords.try_recv().ok().as_deref(), Some("second"));
    for args in [vec![Arg::Str("")], vec![Arg::Int(3)], vec![]] {
        let replies = r.send("/password", &args);
        assert!(
            replies.first().is_some_and(|(a, _)| a == "/error"),
            "{args:?}: {replies:?}"
        );
    }
    assert!(r.passwords.try_recv().is_err());
    assert!(r.commands().is_empty(), "nothing for the audio thread");
    // A room without a password has no such port.
    let mut open = Rig::room();
    assert!(is_error(&open.send("/password", &[Arg::Str("x")]), "/password"));
    assert!(open.passwords.try_recv().is_err());
}

#[test]
fn each_set_delivers_its_command_and_replies_nothing() {
    let mut r = Rig::room();
    let cases: Vec<(&str, Vec<Arg<'_>>, ControlCommand)> = vec![
        (
            "/member3/gain",
            vec![Arg::Float(-6.5)],
            ControlCommand::MemberGain { member: 3, db: -6.5 },
        ),
        // python-osc sends a whole number as `i`.
        (
            "/member15/gain",
            vec![Arg::Int(-12)],
            ControlCommand::MemberGain {
                member: 15,
                db: -12.0,
            },
        ),
        (
            "/member0/pan",
            vec![Arg::Float(-0.25)],
            ControlCommand::MemberPan {
                member: 0,
                pan: -0.25,
            },
        ),
        (
            "/member7/mute",
            vec![Arg::Int(1)],
            ControlCommand::MemberMute {
                member: 7,
                mute: true,
            },
        ),
        (
            "/member7/mute",
            vec![Arg::False],
            ControlCommand::MemberMute {
                member: 7,
                mute: false,
            },
        ),
        (
            "/member7/solo",
            vec![Arg::Int(1)],
            ControlCommand::MemberSolo {
                member: 7,
                solo: true,
            },
        ),
        (
            "/send/gain",
            vec![Arg::Double(3.0)],
            ControlCommand::SendGain(3.0),
        ),
        ("/send/mute", vec![Arg::True], ControlCommand::SendMute(true)),
        (
            "/monitor/gain",
            vec![Arg::Float(-60.0)],
            ControlCommand::MonitorGain(-60.0),
        ),
        // A touch-screen toggle sends 1.0.
        (
            "/monitor/mute",
            vec![Arg::Float(1.0)],
            ControlCommand::MonitorMute(true),
        ),
        (
            "/master/gain",
            vec![Arg::Float(-3.0)],
            ControlCommand::MasterGain(-3.0),
        ),
        (
            "/buffer/latency",
            vec![Arg::Str("safe")],
            ControlCommand::Latency(LatencyPolicy::Safe),
        ),
        (
            "/buffer/latency",
            vec![Arg::Int(0)],
            ControlCommand::Latency(LatencyPolicy::Tight),
        ),
        ("/redundancy", vec![Arg::Int(2)], ControlCommand::Redundancy(2)),
        ("/record", vec![Arg::Int(1)], ControlCommand::Record(true)),
    ];
    for (address, args, want) in &cases {
        let replies = r.send(address, args);
        assert!(replies.is_empty(), "{address}: {replies:?}");
        assert_eq!(r.commands(), vec![*want], "{address} {args:?}");
    }
    assert_eq!(r.counters().commands, cases.len() as u64);
    let st = r.state();
    assert_eq!(
        (st.members[3].gain_db, st.members[15].gain_db, st.members[0].pan),
        (-6.5, -12.0, -0.25)
    );
    assert!(!st.members[7].mute && st.send.mute && st.monitor.mute && st.record);
    assert_eq!(
        (
            st.send.gain_db,
            st.monitor.gain_db,
            st.master_gain_db,
            st.latency,
            st.redundancy
        ),
        (3.0, -60.0, -3.0, LatencyPolicy::Tight, 2)
    );
}

#[test]
fn out_of_range_values_are_refused_with_an_error_and_no_command() {
    let mut r = Rig::room();
    let cases: Vec<(&str, Arg<'_>)> = vec![
        ("/member0/gain", Arg::Float(12.5)),
        ("/member0/gain", Arg::Float(-61.0)),
        ("/member0/gain", Arg::Float(f32::NAN)),
        ("/member2/pan", Arg::Float(1.01)),
        ("/member2/mute", Arg::Int(2)),
        ("/member2/mute", Arg::Float(0.5)),
        ("/send/gain", Arg::Float(f32::INFINITY)),
        ("/buffer/latency", Arg::Str("loose")),
        ("/buffer/latency", Arg::Int(2)),
        ("/redundancy", Arg::Int(i32::from(MAX_REDUNDANCY) + 1)),
        ("/redundancy", Arg::Int(-1)),
        ("/redundancy", Arg::Float(1.5)),
        ("/record", Arg::Int(-1)),
    ];
    for (address, arg) in &cases {
        let replies = r.send(address, &[*arg]);
        assert!(is_error(&replies, address), "{address} {arg:?}: {replies:?}");
    }
    assert_eq!(r.commands(), vec![]);
    let c = r.counters();
    assert_eq!((c.refused, c.commands), (cases.len() as u64, 0));
    assert_eq!(r.state(), ControlState::new(&Surface::room()));
    // The reason says what is allowed.
    let replies = r.send("/member0/gain", &[Arg::Float(20.0)]);
    assert_eq!(replies[0].1[1], V::S("a gain is -60 to 12 dB, not 20".into()));
}

#[test]
fn a_wildcard_mutes_every_member() {
    let mut r = Rig::room();
    assert!(r.send("/member*/mute", &[Arg::Int(1)]).is_empty());
    let got = r.commands();
    let want: Vec<_> = (0..MAX_MEMBERS)
        .map(|member| ControlCommand::MemberMute { member, mute: true })
        .collect();
    assert_eq!(got, want);
    assert!(r.state().members.iter().all(|m| m.mute));
    // And a query through a pattern answers from every concrete address.
    let replies = r.send("/member1[0-2]/mute", &[]);
    assert_eq!(
        replies,
        (10..13)
            .map(|i| (format!("/member{i}/mute"), vec![V::I(1)]))
            .collect::<Vec<_>>()
    );
}

#[test]
fn queries_answer_current_values() {
    let mut r = Rig::room();
    r.send("/member4/gain", &[Arg::Float(-3.0)]);
    r.send("/member4/pan", &[Arg::Float(0.5)]);
    r.send("/buffer/latency", &[Arg::Str("SAFE")]);
    r.send("/redundancy", &[Arg::Int(3)]);
    r.ctx.shared.state().members[4].name = Some("Ana".into());
    r.ctx.shared.state().members[9].name = Some("Bo".into());
    r.ctx.shared.state().members[4].stats = MemberStats {
        latency_ms: Some(21.5),
        lost: 7,
        concealed: 2,
        buffer_ms: 3.25,
    };
    r.ctx.shared.state().stats_json = "{\"t_s\":1.5}".into();
    let q = |r: &mut Rig, a: &str| r.send(a, &[]);
    let one = |a: &str, v: V| vec![(a.to_owned(), vec![v])];
    assert_eq!(q(&mut r, "/member4/gain"), one("/member4/gain", V::F(-3.0)));
    assert_eq!(q(&mut r, "/member4/pan"), one("/member4/pan", V::F(0.5)));
    assert_eq!(q(&mut r, "/member4/mute"), one("/member4/mute", V::I(0)));
    assert_eq!(q(&mut r, "/member5/gain"), one("/member5/gain", V::F(0.0)));
    assert_eq!(
        q(&mut r, "/member4/name"),
        one("/member4/name", V::S("Ana".into()))
    );
    assert_eq!(
        q(&mut r, "/member5/name"),
        one("/member5/name", V::S(String::new()))
    );
    assert_eq!(
        q(&mut r, "/member4/stats"),
        vec![(
            "/member4/stats".into(),
            vec![V::F(21.5), V::I(7), V::I(2), V::F(3.25)]
        )]
    );
    assert_eq!(q(&mut r, "/member5/stats")[0].1[0], V::Nil);
    assert_eq!(
        q(&mut r, "/buffer/latency"),
        one("/buffer/latency", V::S("safe".into()))
    );
    assert_eq!(q(&mut r, "/redundancy"), one("/redundancy", V::I(3)));
    assert_eq!(q(&mut r, "/record"), one("/record", V::I(0)));
    assert_eq!(q(&mut r, "/send/gain"), one("/send/gain", V::F(0.0)));
    assert_eq!(q(&mut r, "/stats"), one("/stats", V::S("{\"t_s\":1.5}".into())));
    assert_eq!(
        q(&mut r, "/roster"),
        vec![
            ("/roster".into(), vec![V::I(4), V::S("Ana".into())]),
            ("/roster".into(), vec![V::I(9), V::S("Bo".into())]),
            ("/roster/end".into(), vec![V::I(2)]),
        ]
    );
    assert_eq!(r.commands().len(), 4, "queries push no command");
}

#[test]
fn a_full_ring_is_counted_and_answered_without_blocking() {
    let mut r = Rig::new(Surface::room(), 2);
    assert!(r.send("/member0/gain", &[Arg::Float(-1.0)]).is_empty());
    assert!(r.send("/member1/gain", &[Arg::Float(-2.0)]).is_empty());
    // Nobody pops: the third set finds the ring full and returns at once.
    let replies = r.send("/member2/gain", &[Arg::Float(-3.0)]);
    assert!(is_error(&replies, "/member2/gain"), "{replies:?}");
    assert!(matches!(&replies[0].1[1], V::S(why) if why.contains("queue is full")));
    // A wildcard past the ring's room: what fits is delivered, each of the rest refused.
    r.commands();
    let replies = r.send("/member*/mute", &[Arg::Int(1)]);
    assert_eq!(replies.len(), usize::from(MAX_MEMBERS) - 2);
    assert_eq!(r.commands().len(), 2);
    let c = r.counters();
    assert_eq!((c.ring_full, c.commands), (1 + u64::from(MAX_MEMBERS) - 2, 4));
    // The refused change was not recorded: a query tells the truth.
    let st = r.state();
    assert_eq!((st.members[1].gain_db, st.members[2].gain_db), (-2.0, 0.0));
    assert_eq!(st.members.iter().filter(|m| m.mute).count(), 2);
}

#[test]
fn unknown_addresses_wrong_types_and_junk_get_an_error() {
    let mut r = Rig::room();
    for (address, args) in [
        ("/member16/gain", vec![Arg::Float(0.0)]),
        ("/nothing", vec![]),
        ("/member0/gain", vec![Arg::Str("loud")]),
        ("/member0/name", vec![Arg::Str("Eve")]),
        ("/stats", vec![Arg::Int(1)]),
    ] {
        let replies = r.send(address, &args);
        assert!(is_error(&replies, address), "{address}: {replies:?}");
    }
    let replies = r.packet(b"not osc at all");
    assert!(is_error(&replies, ""), "{replies:?}");
    let c = r.counters();
    assert_eq!((c.unmatched, c.wrong_types, c.malformed), (2, 3, 1));
    assert_eq!(r.commands(), vec![]);
}

#[test]
fn every_port_has_metadata_answered_on_meta() {
    let mut r = Rig::room();
    let json: serde_json::Value = serde_json::from_str(&r.tree.to_json()).unwrap();
    let ports = json["ports"].as_array().unwrap();
    let paths: Vec<&str> = ports.iter().map(|p| p["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "/member#16/gain",
            "/member#16/pan",
            "/member#16/mute",
            "/member#16/solo",
            "/member#16/name",
            "/member#16/stats",
            "/send/gain",
            "/send/mute",
            "/monitor/gain",
            "/monitor/mute",
            "/master/gain",
            "/buffer/latency",
            "/redundancy",
            "/record",
            "/stats",
            "/roster",
        ]
    );
    for p in ports {
        let path = p["path"].as_str().unwrap();
        let args: Vec<&str> = p["args"]
            .as_array()
            .unwrap_or_else(|| panic!("{path}: no argument types"))
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(args[0], "", "{path}: every port answers a query");
        assert!(p["doc"].as_str().is_some_and(|d| d.len() > 20), "{path}: doc");
        assert!(p["unit"].as_str().is_some_and(|u| !u.is_empty()), "{path}: unit");
        // Settable numbers have a range a fader can use.
        if args.len() > 1 {
            let (min, max) = (p["min"].as_f64(), p["max"].as_f64());
            assert!(matches!((min, max), (Some(a), Some(b)) if a < b), "{path}: range");
        }
    }
    // Each concrete address answers on /_meta with its port's JSON.
    let replies = r.send("/_meta", &[Arg::Str("/member5/gain")]);
    let [(address, args)] = &replies[..] else {
        panic!("{replies:?}")
    };
    assert_eq!(address, "/_meta");
    let V::S(json) = &args[1] else { panic!("{args:?}") };
    let meta: serde_json::Value = serde_json::from_str(json).unwrap();
    assert_eq!(
        (meta["unit"].as_str(), meta["min"].as_f64(), meta["max"].as_f64()),
        (
            Some("dB"),
            Some(f64::from(GAIN_MIN_DB)),
            Some(f64::from(GAIN_MAX_DB))
        )
    );
}

#[test]
fn jam_surface_offers_only_what_jam_honours() {
    let mut r = Rig::new(jam::surface(), 4);
    assert!(r.send("/member0/mute", &[Arg::True]).is_empty());
    assert_eq!(
        r.commands(),
        vec![ControlCommand::MemberMute {
            member: 0,
            mute: true
        }]
    );
    for address in ["/member1/mute", "/member0/pan", "/send/mute", "/record"] {
        let replies = r.send(address, &[Arg::Int(1)]);
        assert!(is_error(&replies, address), "{address}: {replies:?}");
    }
}

#[test]
fn a_jams_member_zero_is_the_players_command_for_the_other_player() {
    use netjam_engine::player::{Command, Media, MediaConfig};
    use netjam_engine::sender::{Sender, SenderConfig};
    use netjam_engine::wire::{AudioFormat, Codec};
    let peer = crate::session::PEER_TRACK;
    let (tx, mut rx) = rtrb::RingBuffer::new(8);
    let mut sink = jam::PeerMix::new(tx);
    sink.deliver(ControlCommand::MemberGain { member: 0, db: -20.0 })
        .unwrap();
    sink.deliver(ControlCommand::MemberMute {
        member: 0,
        mute: true,
    })
    .unwrap();
    let got: Vec<Command> = std::iter::from_fn(|| rx.pop().ok()).collect();
    assert_eq!(
        got,
        vec![
            Command::Gain {
                member: peer,
                db: -20.0
            },
            Command::Mute {
                member: peer,
                mute: true
            }
        ]
    );
    // The jam's media hears the other player as that member from the start, so its mix
    // takes them before a packet has arrived.
    let format = AudioFormat::new(Codec::L16, 48_000, 1).unwrap();
    let sender = Sender::new(SenderConfig::new(format, 64)).unwrap();
    let mut media = Media::new(
        sender,
        MediaConfig {
            one_peer: Some(peer),
            ..MediaConfig::new(1, 1)
        },
    );
    for c in got {
        assert!(media.apply(c), "{c:?}");
    }
    let mix = media.report().members[0].mix;
    assert!((mix.gain - 0.1).abs() < 1e-6 && mix.mute, "{mix:?}");
}

#[test]
fn server_on_loopback_answers_and_says_when_the_port_is_taken() {
    let (tx, mut rx) = command_ring(8);
    let surface = Surface::room();
    let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let h = ControlServer::spawn(bind, surface, ControlState::new(&surface), tx).unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 256];
    let n = encode_message(&mut buf, "/member2/gain", &[Arg::Float(-9.0)]).unwrap();
    client.send_to(&buf[..n], h.local_addr()).unwrap();
    let n = encode_message(&mut buf, "/member2/gain", &[]).unwrap();
    client.send_to(&buf[..n], h.local_addr()).unwrap();
    let mut rbuf = [0u8; 512];
    let (len, _) = client.recv_from(&mut rbuf).unwrap();
    let m = Message::decode(&rbuf[..len]).unwrap();
    assert_eq!((m.address(), m.arg(0)), ("/member2/gain", Some(Arg::Float(-9.0))));
    assert_eq!(rx.pop(), Ok(ControlCommand::MemberGain { member: 2, db: -9.0 }));
    let err = ControlServer::spawn(
        h.local_addr(),
        surface,
        ControlState::new(&surface),
        command_ring(1).0,
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("--osc"), "{err:#}");
    let c = h.counters();
    assert_eq!((c.datagrams, c.commands, c.queries), (2, 1, 1));
    h.shutdown();
}

#[test]
fn a_member_is_addressed_by_name_whatever_the_case_and_answered_under_it() {
    let mut r = Rig::room();
    r.ctx.shared.state().members[2].name = Some("Ana".into());
    r.ctx.shared.state().members[5].name = Some("bo".into());
    // A set by name is the seat's command, and replies nothing.
    assert!(r.send("/member/ana/gain", &[Arg::Float(-6.0)]).is_empty());
    assert!(r.send("/member/BO/mute", &[Arg::Int(1)]).is_empty());
    assert_eq!(
        r.commands(),
        [
            ControlCommand::MemberGain { member: 2, db: -6.0 },
            ControlCommand::MemberMute {
                member: 5,
                mute: true
            },
        ]
    );
    // A query by name is answered under the name it was asked by.
    assert_eq!(
        r.send("/member/Ana/gain", &[]),
        [("/member/Ana/gain".to_owned(), vec![V::F(-6.0)])]
    );
    assert_eq!(
        r.send("/member/bo/name", &[]),
        [("/member/bo/name".to_owned(), vec![V::S("bo".into())])]
    );
    // Out of range by name is refused like by seat, under the seat's address.
    let refused = r.send("/member/ana/gain", &[Arg::Float(99.0)]);
    assert!(matches!(&refused[..], [(a, _)] if a == "/error"), "{refused:?}");
    assert!(r.commands().is_empty());
    // Nobody of that name: an error that says how to find out who is here.
    let nobody = r.send("/member/cy/gain", &[Arg::Float(-3.0)]);
    assert!(is_error(&nobody, "/member/cy/gain"), "{nobody:?}");
    assert!(
        matches!(&nobody[0].1[1], V::S(why) if why.contains("/roster")),
        "{nobody:?}"
    );
    assert!(r.commands().is_empty());
    assert_eq!(r.counters().unmatched, 1);
}
