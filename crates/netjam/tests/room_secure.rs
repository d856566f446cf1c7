//! The control channel as a band meets it: `netjam server --key` keeps its key and prints
//! its fingerprint; a player pins it on the first join and says so; the same player
//! refuses a server on that address that shows another key, with what to do, before any
//! audio; a key file that holds no key is refused before the server starts. Loopback only
//! (the pins live in a file `NETJAM_KNOWN_SERVERS` names, as loopback servers are pinned
//! only there), every wait bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::{server_fingerprint, sine_player, tmp, Proc, BIN};

const WAIT: Duration = Duration::from_secs(20);

/// `netjam server --key KEY` on `listen`, its address and the fingerprint it printed.
fn keyed_server(listen: &str, key: &std::path::Path, json: &std::path::Path) -> (Proc, SocketAddr, String) {
    let p = Proc::spawn_lines(
        Command::new(BIN)
            .args(["server", "--listen", listen, "--duration", "30", "--key"])
            .arg(key)
            .arg("--stats-json")
            .arg(json),
        "netjam server",
    );
    let serving = p.line_with("serving rooms on", WAIT);
    let addr = serving
        .split_whitespace()
        .nth(4)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {serving:?}"));
    let fp = server_fingerprint(&p, WAIT);
    (p, addr, fp)
}

#[test]
fn a_player_pins_the_servers_key_and_refuses_another_one_on_that_address() {
    let known = tmp("room-secure", "known_servers");
    let _ = std::fs::remove_file(&known);
    let (key_a, key_b) = (tmp("room-secure", "a.key"), tmp("room-secure", "b.key"));
    let (json_a, json_b) = (tmp("room-secure", "a.json"), tmp("room-secure", "b.json"));
    for f in [&key_a, &key_b] {
        let _ = std::fs::remove_file(f);
    }
    let (mut server, addr, fp_a) = keyed_server("127.0.0.1:0", &key_a, &json_a);

    // First join: taken and pinned, and the player says which key it took.
    let mut ana = Proc::spawn_lines(
        sine_player(addr, "ana", "440", "2").env("NETJAM_KNOWN_SERVERS", &known),
        "ana",
    );
    let (status, said) = ana.finish(WAIT);
    assert!(status.success(), "{said:#?}");
    assert!(said.iter().any(|l| l.contains("in room \"band\"")), "{said:#?}");
    assert!(
        said.iter().any(|l| l.contains(&format!(
            "shows the key {fp_a}, now pinned in {}",
            known.display()
        ))),
        "{said:#?}"
    );
    let pins = std::fs::read_to_string(&known).unwrap();
    assert_eq!(pins.lines().count(), 1, "{pins}");
    assert!(pins.starts_with(&format!("{addr} ")), "{pins}");

    // Again: the pin holds, nothing new is pinned.
    let mut again = Proc::spawn_lines(
        sine_player(addr, "ana", "440", "1").env("NETJAM_KNOWN_SERVERS", &known),
        "ana again",
    );
    let (status, said) = again.finish(WAIT);
    assert!(status.success(), "{said:#?}");
    assert!(!said.iter().any(|l| l.contains("now pinned")), "{said:#?}");
    assert_eq!(std::fs::read_to_string(&known).unwrap(), pins);
    let report = server.stop_server(&json_a, WAIT);
    let channel = &report["channel"];
    assert!(channel["handshakes"].as_u64().unwrap() >= 2, "{channel}");
    assert!(channel["opened"].as_u64().unwrap() >= 4, "{channel}");
    assert_eq!(channel["forged"].as_u64(), Some(0), "{channel}");
    assert_eq!(
        report["server"]["clear_control"].as_u64(),
        Some(0),
        "{}",
        report["server"]
    );

    // Another server on the same address, with another key: refused by name, at once.
    let (mut other, addr_b, fp_b) = keyed_server(&addr.to_string(), &key_b, &json_b);
    assert_eq!(addr_b, addr);
    assert_ne!(fp_b, fp_a);
    let mut ana = Proc::spawn_lines(
        sine_player(addr, "ana", "440", "5").env("NETJAM_KNOWN_SERVERS", &known),
        "ana, server changed",
    );
    let (status, said) = ana.finish(WAIT);
    assert!(
        !status.success(),
        "seated by a server with another key: {said:#?}"
    );
    let why = said.join("\n");
    assert!(
        why.contains(&format!(
            "showed the key {fp_b}, not {fp_a} as pinned in {}",
            known.display()
        )),
        "{why}"
    );
    assert!(why.contains(&format!("delete the line for {addr}")), "{why}");
    assert!(!why.contains("in room \"band\""), "seated: {why}");
    let report = other.stop_server(&json_b, WAIT);
    assert_eq!(
        report["server"]["joins"].as_u64(),
        Some(0),
        "{}",
        report["server"]
    );
}

#[test]
fn a_key_file_that_holds_no_key_is_refused_before_the_server_starts() {
    let bad = tmp("room-secure", "bad.key");
    std::fs::write(&bad, "not a key\n").unwrap();
    let out = Command::new(BIN)
        .args(["server", "--listen", "127.0.0.1:0", "--duration", "5", "--key"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("holds no server key") && err.contains("bad.key"),
        "{err}"
    );
    assert!(!err.contains("serving rooms"), "{err}");
    // A key kept across restarts: the same fingerprint twice.
    let key = tmp("room-secure", "kept.key");
    let _ = std::fs::remove_file(&key);
    let prints: Vec<String> = (0..2)
        .map(|i| {
            let json = tmp("room-secure", &format!("kept{i}.json"));
            let (mut p, _, fp) = keyed_server("127.0.0.1:0", &key, &json);
            p.stop_server(&json, WAIT);
            fp
        })
        .collect();
    assert_eq!(prints[0], prints[1]);
}
