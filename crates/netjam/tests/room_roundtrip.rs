//! The in-band round trip through a room: on a private JACK dummy server, ana and bo join
//! one room of a `netjam server` on loopback; bo monitors through (his receive port is
//! connected to his send port inside JACK), and ana's `--measure-roundtrip` finds her own
//! burst again in what she hears. Loopback only, ephemeral ports, every wait bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::jackd::Jackd;
use common::{read_json, room_server, tmp, Proc, BIN};

const WAIT: Duration = Duration::from_secs(15);

fn player(jack: &Jackd, server: SocketAddr, name: &str, extra: &[&str]) -> Proc {
    Proc::spawn_lines(
        jack.client(
            Command::new(BIN)
                .args([
                    "jam",
                    "--jack",
                    "--jack-name",
                    name,
                    "--no-connect",
                    "--channels",
                    "1",
                ])
                .args(["--server", &server.to_string(), "--room", "rt", "--name", name])
                .args(extra)
                .stdout(Stdio::null()),
        ),
        "jam --jack --server",
    )
}

#[test]
fn a_player_monitoring_through_sends_the_burst_back_through_the_room() {
    let jack = Jackd::start("netjam-test-roomrt", 64);
    let (server, server_addr) = room_server("40", WAIT);

    let bo = player(&jack, server_addr, "bo", &["--duration", "30"]);
    bo.line_with("in room", WAIT);
    jack.wait_for_port("bo:send_1", "bo");
    jack.wait_for_port("bo:receive_1", "bo");
    jack.connect("bo:receive_1", "bo:send_1");

    let json = tmp("room-roundtrip", "ana.json");
    let mut ana = player(
        &jack,
        server_addr,
        "ana",
        &[
            "--duration",
            "7",
            "--measure-roundtrip",
            "--stats-json",
            json.to_str().unwrap(),
        ],
    );
    let (status, said) = ana.finish(WAIT + Duration::from_secs(7));
    assert!(status.success(), "ana failed: {said:#?}");
    let summary = said
        .iter()
        .find(|l| l.contains("round trip through the room"))
        .unwrap_or_else(|| panic!("no round-trip summary: {said:#?}"));
    assert!(summary.contains("median"), "{summary}");

    let report = read_json(&json);
    let rt = &report["round_trip"];
    let readings: Vec<f64> = rt["readings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["ms"].as_f64().unwrap())
        .collect();
    // About one burst a second for 7 s: a loaded machine may lose some, not most.
    assert!(readings.len() >= 3, "{rt}");
    for ms in &readings {
        // At least a period of bo's loop inside JACK; far less than the meter's 500 ms
        // timeout (two jitter buffers and two packet's worth on loopback).
        assert!((1.3..200.0).contains(ms), "round trip {ms} ms: {rt}");
    }
    assert_eq!(rt["found"].as_u64().unwrap() as usize, readings.len(), "{rt}");
    drop(bo);
    server.interrupt();
}
