//! Joining by room name alone: `jam --room NAME` takes the rooms server and the player's
//! name from the settings file (`$NETJAM_CONFIG`), and a settings file that is wrong is
//! refused before anything starts, naming the file. Loopback only, every wait bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{free_udp_port, tmp, Proc, BIN};

const WAIT: Duration = Duration::from_secs(15);

#[test]
fn a_room_name_is_all_a_player_types() {
    let port = free_udp_port();
    let server_addr = format!("127.0.0.1:{port}");
    let mut server = Proc::spawn_lines(
        Command::new(BIN).args(["server", "--listen", &server_addr, "--duration", "20"]),
        "netjam server",
    );
    let serving = server.next_line(WAIT);
    assert!(serving.contains("serving rooms"), "{serving}");

    let config = tmp("room-config", "config.toml");
    std::fs::write(&config, format!("server = \"{server_addr}\"\nname = \"ana\"\n")).unwrap();
    let mut ana = Proc::spawn_lines(
        Command::new(BIN).env("NETJAM_CONFIG", &config).args([
            "jam",
            "--room",
            "band",
            "--sine",
            "440",
            "--duration",
            "1",
        ]),
        "jam --room",
    );
    let (status, said) = ana.finish(WAIT);
    assert!(status.success(), "{said:#?}");
    assert!(
        said.iter()
            .any(|l| l.contains(&format!("joining room \"band\" on {server_addr} as \"ana\""))),
        "{said:#?}"
    );
    assert!(said.iter().any(|l| l.contains("in room \"band\"")), "{said:#?}");
    server.interrupt();
    let _ = server.wait_until(WAIT);

    // A misspelt setting is refused with the file's name, before any audio or network.
    let bad = tmp("room-config", "bad.toml");
    std::fs::write(&bad, "sever = \"127.0.0.1:1\"\n").unwrap();
    let out = Command::new(BIN)
        .env("NETJAM_CONFIG", &bad)
        .args(["jam", "--room", "band", "--sine", "440", "--duration", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("bad.toml") && err.contains("fix or remove it"),
        "{err}"
    );

    // No server anywhere: the player is told both ways to give one.
    let empty = tmp("room-config", "empty.toml");
    std::fs::write(&empty, "name = \"ana\"\n").unwrap();
    let out = Command::new(BIN)
        .env("NETJAM_CONFIG", &empty)
        .args(["jam", "--room", "band", "--sine", "440", "--duration", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--server HOST") && err.contains("empty.toml"),
        "{err}"
    );
}
