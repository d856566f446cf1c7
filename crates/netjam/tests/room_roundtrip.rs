//! The in-band round trip through a room: on a private JACK dummy server, ana and bo join
//! one room of a `netjam server` on loopback; bo monitors through (his receive port is
//! connected to his send port inside JACK), and ana's `--measure-roundtrip` finds her own
//! burst again in what she hears. Loopback only, ephemeral ports, every wait bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::jackd::Jackd;
use common::{free_udp_port, read_json, tmp, Proc, BIN};

const WAIT: Duration = Duration::from_secs(15);

/// Waits for a line of `p` containing `needle`; returns it.
fn line_with(p: &Proc, needle: &str, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match p.line_within(left) {
            Some(l) if l.contains(needle) => return l,
            Some(_) => {}
            None => panic!("no line with {needle:?} within {within:?}"),
        }
    }
}

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
    let port = free_udp_port();
    let server_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let server = Proc::spawn_lines(
        Command::new(BIN).args(["server", "--listen", &server_addr.to_string(), "--duration", "40"]),
        "netjam server",
    );
    line_with(&server, "serving rooms", WAIT);

    let bo = player(&jack, server_addr, "bo", &["--duration", "30"]);
    line_with(&bo, "in room", WAIT);
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
