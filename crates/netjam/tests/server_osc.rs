//! The rooms server's read-only OSC surface, read by implementations nobody here wrote: a
//! `netjam server --osc 0` and two `jam --server` players (sines) on loopback; python-osc
//! queries `/members`, `/rooms`, `/stats`, `/delay` and `/_meta`, and liblo's `oscdump`
//! decodes the server's `/members` and `/stats` replies. Loopback only, ephemeral ports,
//! every wait bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    address_in, free_udp_port, oscdump_lines, python_json_lines, require, require_python_osc, sine_player,
    tmp, Proc, BIN,
};
use netjam_osc::{encode_message, Message};

const WAIT: Duration = Duration::from_secs(15);

fn player(server: SocketAddr, name: &str, hz: &str) -> Proc {
    Proc::spawn_lines(
        sine_player(server, name, hz, "30")
            // What is asked of the server is what it forwards: no direct path between the
            // two players (on loopback one would form within a few packets).
            .arg("--via-server")
            .arg("--output")
            .arg(tmp("server-osc", &format!("{name}.wav")))
            .stdout(Stdio::null()),
        "jam --server",
    )
}

/// The raw replies to one query (until `end` is seen, or half a second of silence).
fn replies(to: SocketAddr, address: &str, end: &str) -> Vec<Vec<u8>> {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buf = [0u8; 256];
    let n = encode_message(&mut buf, address, &[]).unwrap();
    socket.send_to(&buf[..n], to).unwrap();
    let mut got = Vec::new();
    let mut reply = vec![0u8; 65_536];
    while let Ok((n, _)) = socket.recv_from(&mut reply) {
        got.push(reply[..n].to_vec());
        if Message::decode(&reply[..n]).is_ok_and(|m| m.address() == end) {
            break;
        }
    }
    got
}

/// A python-osc client that sends each query and prints every reply as a JSON line
/// `[address, [args…]]`, reading until `/members/end`, `/rooms/end`, and one reply each
/// for `/stats`, `/delay` and `/_meta`.
const PY_CLIENT: &str = r#"
import json, sys
from pythonosc import udp_client
from pythonosc.osc_message import OscMessage
c = udp_client.SimpleUDPClient("127.0.0.1", int(sys.argv[1]))
def ask(address, *args, until=None):
    c.send_message(address, list(args))
    while True:
        data = c.receive(10)
        if not data:
            sys.exit("no reply to " + address + " within 10 s")
        m = OscMessage(data)
        print(json.dumps([m.address, list(m.params)]), flush=True)
        if until is None or m.address == until:
            return
ask("/members", until="/members/end")
ask("/rooms", until="/rooms/end")
ask("/stats")
ask("/delay")
ask("/_meta", "/delay")
"#;

#[test]
fn python_osc_and_liblo_read_a_servers_members_and_stats() {
    require("oscdump", "liblo-tools");
    require_python_osc("pythonosc.udp_client, pythonosc.osc_message");

    let port = free_udp_port();
    let server_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut server = Proc::spawn_lines(
        Command::new(BIN)
            .args(["server", "--listen", &server_addr.to_string()])
            .args(["--osc", "0", "--duration", "60"]),
        "netjam server",
    );
    let osc = address_in(&server.line_with("OSC queries on", WAIT));
    assert!(osc.ip().is_loopback(), "OSC listens on {osc} by default");

    let ana = player(server_addr, "ana", "220");
    ana.line_with("in room", WAIT);
    let bo = player(server_addr, "bo", "330");
    bo.line_with("in room", WAIT);

    // Both seated and both forwarded (the report is refreshed four times a second).
    let deadline = Instant::now() + WAIT;
    let members = loop {
        let got = replies(osc, "/members", "/members/end");
        let members: Vec<Message<'_>> = got
            .iter()
            .map(|b| Message::decode(b).unwrap())
            .filter(|m| m.address() == "/members")
            .collect();
        let forwarding = members.len() == 2
            && members
                .iter()
                .all(|m| matches!(m.arg(4), Some(netjam_osc::Arg::Long(n)) if n > 100));
        if forwarding {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "/members never listed two forwarding members: {:?}",
            members
                .iter()
                .map(|m| m.args().collect::<Vec<_>>())
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    };

    // python-osc's view.
    let said = python_json_lines(PY_CLIENT, &osc.port().to_string());
    let of = |address: &str| -> Vec<&serde_json::Value> {
        said.iter().filter(|r| r[0] == address).map(|r| &r[1]).collect()
    };
    let listed = of("/members");
    let mut names: Vec<&str> = listed.iter().map(|a| a[1].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["ana", "bo"], "{said:?}");
    for m in &listed {
        assert_eq!(m[0], "band");
        assert_eq!(m.as_array().unwrap().len(), 8, "{m}");
        let addr: SocketAddr = m[3].as_str().unwrap().parse().unwrap();
        assert!(addr.ip().is_loopback());
        assert!(m[4].as_i64().unwrap() > 100, "forwarded {m}");
    }
    assert_eq!(of("/members/end")[0][0], 2);
    assert_eq!(of("/rooms"), [&serde_json::json!(["band", 2])]);
    assert_eq!(of("/rooms/end")[0][0], 1);
    let stats: serde_json::Value = serde_json::from_str(of("/stats")[0][0].as_str().unwrap()).unwrap();
    assert_eq!(stats["members"], 2, "{stats}");
    assert_eq!(stats["rooms"], 1, "{stats}");
    assert!(stats["packets_in"].as_u64().unwrap() > 200, "{stats}");
    assert!(stats["packets_out"].as_u64().unwrap() > 200, "{stats}");
    assert!(stats["delay"]["p99_us"].as_f64().unwrap() > 0.0, "{stats}");
    let delay = of("/delay")[0];
    let (p50, p99) = (delay[0].as_f64().unwrap(), delay[1].as_f64().unwrap());
    assert!(p50 > 0.0 && p50 <= p99, "{delay}");
    let meta = of("/_meta")[0];
    assert_eq!(meta[0], "/delay");
    let meta: serde_json::Value = serde_json::from_str(meta[1].as_str().unwrap()).unwrap();
    assert!(meta["doc"].as_str().unwrap().contains("p99.9"), "{meta}");

    // liblo decodes the server's replies: two members with 64-bit counters, then the end,
    // and the JSON of /stats.
    let stats = replies(osc, "/stats", "/stats");
    let mut packets = members;
    packets.extend(stats);
    let packets: Vec<&[u8]> = packets.iter().map(Vec::as_slice).collect();
    let lines = oscdump_lines(free_udp_port(), &packets, WAIT);
    assert_eq!(lines.len(), 4, "{lines:#?}");
    for l in &lines[..2] {
        assert!(l.contains("/members ssishhhh \"band\" "), "{l}");
    }
    assert!(lines[2].ends_with("/members/end i 2"), "{}", lines[2]);
    assert!(lines[3].contains("/stats s \"{"), "{}", lines[3]);
    assert!(lines[3].contains("\"members\":2"), "{}", lines[3]);

    drop((ana, bo));
    server.interrupt();
    assert!(server.wait_for(WAIT).success(), "the server did not stop cleanly");
}
