//! OSC control of a running netjam, driven by implementations nobody here wrote:
//! python-osc and liblo (`oscsend`, `oscdump`) set and query a real `ControlServer` on
//! loopback, and `oscsend` mutes what a real `netjam jam` hears while its statistics are
//! queried. Loopback only, ephemeral ports, every wait bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    address_in, free_udp_port, oscdump_lines, python_json_lines, require, require_python_osc, Proc, BIN,
};
use netjam::control::{
    command_ring, CommandRx, ControlCommand, ControlHandle, ControlServer, ControlState, Surface,
};
use netjam_osc::{encode_message, Arg, Message};

const WAIT: Duration = Duration::from_secs(10);

fn room_server(ring: usize) -> (ControlHandle, CommandRx) {
    let (tx, rx) = command_ring(ring);
    let surface = Surface::room();
    let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let h = ControlServer::spawn(bind, surface, ControlState::new(&surface), tx).unwrap();
    (h, rx)
}

/// Pops the next command, waiting at most [`WAIT`].
fn next_command(rx: &mut CommandRx) -> ControlCommand {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Ok(c) = rx.pop() {
            return c;
        }
        assert!(Instant::now() < deadline, "no command within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A plain UDP client of our own that queries and decodes replies.
struct Client {
    socket: UdpSocket,
    to: SocketAddr,
}

impl Client {
    fn new(to: SocketAddr) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        Client { socket, to }
    }

    fn send(&self, address: &str, args: &[Arg<'_>]) {
        let mut buf = [0u8; 512];
        let n = encode_message(&mut buf, address, args).unwrap();
        self.socket.send_to(&buf[..n], self.to).unwrap();
    }

    /// The raw bytes of the next reply, if one comes within the read timeout.
    fn reply_bytes(&self) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 65_536];
        let (n, _) = self.socket.recv_from(&mut buf).ok()?;
        buf.truncate(n);
        Some(buf)
    }

    /// Queries `address` until it answers (a datagram may be lost or the server still
    /// starting), at most [`WAIT`]; returns the reply's bytes.
    fn query(&self, address: &str) -> Vec<u8> {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            self.send(address, &[]);
            if let Some(b) = self.reply_bytes() {
                let m = Message::decode(&b).unwrap();
                assert_eq!(m.address(), address, "{:?}", m.args().collect::<Vec<_>>());
                return b;
            }
        }
        panic!("{address} was not answered within {WAIT:?}")
    }

    /// Queries until the answer satisfies `ok`, at most [`WAIT`]; returns the last answer.
    fn query_until(&self, address: &str, ok: impl Fn(&Message<'_>) -> bool) -> Vec<u8> {
        let deadline = Instant::now() + WAIT;
        loop {
            let b = self.query(address);
            if ok(&Message::decode(&b).unwrap()) {
                return b;
            }
            assert!(
                Instant::now() < deadline,
                "{address} never satisfied the condition; last {:?}",
                Message::decode(&b).unwrap().args().collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn oscsend(to: SocketAddr, address: &str, types: &str, args: &[&str]) {
    let out = Command::new("oscsend")
        .args([to.ip().to_string(), to.port().to_string()])
        .args([address, types])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "oscsend failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const PY_CLIENT: &str = r#"
import json, sys
from pythonosc import udp_client
from pythonosc.osc_message import OscMessage
c = udp_client.SimpleUDPClient("127.0.0.1", int(sys.argv[1]))
c.send_message("/member2/gain", -6.0)
c.send_message("/member3/mute", True)
c.send_message("/_meta", "/member2/gain")
c.send_message("/member2/gain", [])
c.send_message("/member2/gain", 40.0)
for _ in range(3):
    data = c.receive(10)
    if not data:
        sys.exit("no reply within 10 s")
    m = OscMessage(data)
    print(json.dumps([m.address, list(m.params)]), flush=True)
"#;

#[test]
fn python_osc_sets_a_member_gain_and_queries_meta_and_value() {
    require_python_osc("pythonosc.udp_client, pythonosc.osc_message");
    let (server, mut rx) = room_server(16);
    let port = server.local_addr().port().to_string();
    let replies = python_json_lines(PY_CLIENT, &port);
    // The metadata, in python-osc's decoding.
    assert_eq!(replies[0][0], "/_meta");
    assert_eq!(replies[0][1][0], "/member2/gain");
    let meta: serde_json::Value = serde_json::from_str(replies[0][1][1].as_str().unwrap()).unwrap();
    assert_eq!(meta["unit"], "dB");
    assert_eq!(
        (meta["min"].as_f64(), meta["max"].as_f64()),
        (Some(-60.0), Some(12.0))
    );
    assert!(meta["doc"].as_str().unwrap().contains("mix"));
    // The value it set, then the refusal of an out-of-range one.
    assert_eq!(replies[1], serde_json::json!(["/member2/gain", [-6.0]]));
    assert_eq!(replies[2][0], "/error");
    assert_eq!(replies[2][1][0], "/member2/gain");
    // python-osc sends True as `T`.
    assert_eq!(
        next_command(&mut rx),
        ControlCommand::MemberGain { member: 2, db: -6.0 }
    );
    assert_eq!(
        next_command(&mut rx),
        ControlCommand::MemberMute {
            member: 3,
            mute: true
        }
    );
    assert!(rx.pop().is_err(), "the refused gain made no command");
    let c = server.counters();
    assert_eq!((c.commands, c.refused), (2, 1));
}

#[test]
fn liblo_sets_through_oscsend_and_reads_our_replies_in_oscdump() {
    require("oscsend", "liblo-tools");
    require("oscdump", "liblo-tools");
    // Room for every command below: nobody pops until all were sent.
    let (server, mut rx) = room_server(32);
    let to = server.local_addr();
    oscsend(to, "/member1/gain", "f", &["-3.5"]);
    oscsend(to, "/member*/mute", "T", &[]);
    oscsend(to, "/buffer/latency", "s", &["safe"]);
    assert_eq!(
        next_command(&mut rx),
        ControlCommand::MemberGain { member: 1, db: -3.5 }
    );
    for member in 0..16 {
        assert_eq!(
            next_command(&mut rx),
            ControlCommand::MemberMute { member, mute: true }
        );
    }
    assert_eq!(
        next_command(&mut rx),
        ControlCommand::Latency(netjam_engine::delay::LatencyPolicy::Safe)
    );
    // Our replies, handed to liblo's decoder: a value, a nil and the metadata.
    let client = Client::new(to);
    let value = client.query("/member1/gain");
    let stats = client.query("/member1/stats");
    client.send("/_meta", &[Arg::Str("/member1/gain")]);
    let meta = client.reply_bytes().expect("metadata reply");
    let lines = oscdump_lines(free_udp_port(), &[&value, &stats, &meta], WAIT);
    assert!(lines[0].ends_with("/member1/gain f -3.500000"), "{}", lines[0]);
    assert!(
        lines[1].ends_with("/member1/stats Niif Nil 0 0 0.000000"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].contains("/_meta ss \"/member1/gain\" \"{"),
        "{}",
        lines[2]
    );
    assert!(lines[2].contains("\"unit\":\"dB\""), "{}", lines[2]);
}

/// The field `key` of the JSON in a `/stats` reply.
fn stats_field(m: &Message<'_>, key: &str) -> Option<f64> {
    let json: serde_json::Value = serde_json::from_str(m.arg(0)?.as_str()?).ok()?;
    json.pointer(key)?.as_f64()
}

#[test]
fn oscsend_mutes_what_a_running_jam_hears_and_stats_are_answered() {
    require("oscsend", "liblo-tools");
    let (pa, pb) = (free_udp_port(), free_udp_port());
    let jam = |listen: u16, peer: u16, hz: &str, extra: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.args(["jam", "--listen", &format!("127.0.0.1:{listen}")])
            .args(["--peer", &format!("127.0.0.1:{peer}")])
            .args(["--sine", hz, "--duration", "30"])
            .args(extra)
            .stdout(Stdio::null());
        cmd
    };
    let mut a = Proc::spawn_lines(&mut jam(pa, pb, "440", &["--osc", "0"]), "netjam jam (OSC)");
    let _b = Proc::spawn(jam(pb, pa, "660", &[]).stderr(Stdio::null()), "netjam jam");
    let deadline = Instant::now() + WAIT;
    let osc = loop {
        let line = a.next_line(WAIT);
        if line.contains("OSC control on") {
            break address_in(&line);
        }
        assert!(Instant::now() < deadline, "jam never said where OSC listens");
    };
    let client = Client::new(osc);
    // The other player's tone is heard.
    let loud = |m: &Message<'_>| stats_field(m, "/peak_dbfs").is_some_and(|p| p > -20.0);
    let stats = client.query_until("/stats", loud);
    let m = Message::decode(&stats).unwrap();
    assert!(stats_field(&m, "/stats/heard/received").unwrap() > 0.0);
    // The member's figures and name.
    let b = client.query("/member0/stats");
    let m = Message::decode(&b).unwrap();
    assert_eq!(m.type_tags().len(), 4, "{:?}", m.args().collect::<Vec<_>>());
    assert!(matches!(m.arg(3), Some(Arg::Float(ms)) if ms >= 0.0));
    let b = client.query("/member0/name");
    assert_eq!(
        Message::decode(&b).unwrap().arg(0),
        Some(Arg::Str(&format!("127.0.0.1:{pb}")))
    );
    // liblo mutes the other player: the query says so at once, and what jam hears falls
    // silent within a few snapshots.
    let muted_at = Instant::now();
    oscsend(osc, "/member0/mute", "i", &["1"]);
    let b = client.query("/member0/mute");
    assert_eq!(Message::decode(&b).unwrap().arg(0), Some(Arg::Int(1)));
    let silent = |m: &Message<'_>| stats_field(m, "/peak_dbfs").is_some_and(|p| p < -100.0);
    client.query_until("/stats", silent);
    eprintln!(
        "oscsend to a silent /stats snapshot: {:.0} ms",
        muted_at.elapsed().as_secs_f64() * 1e3
    );
    // And unmuted, the tone comes back.
    oscsend(osc, "/member0/mute", "F", &[]);
    client.query_until("/stats", loud);
    // Something jam cannot do is refused, not ignored.
    client.send("/send/mute", &[Arg::Int(1)]);
    let b = client.reply_bytes().expect("an error reply");
    assert_eq!(Message::decode(&b).unwrap().address(), "/error");
    assert!(a.running(), "jam stopped early");
}
