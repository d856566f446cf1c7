//! Joining by room name alone: `jam --room NAME` takes the rooms server and the player's
//! name from the settings file (`$NETJAM_CONFIG`), and a settings file that is wrong is
//! refused before anything starts, naming the file. Loopback only, every wait bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{room_server, tmp, Proc, BIN};

const WAIT: Duration = Duration::from_secs(15);
/// What the player types: the room's name alone (and a test tone for a second).
const JAM_IN_BAND: [&str; 7] = ["jam", "--room", "band", "--sine", "440", "--duration", "1"];

/// `jam --room band` with a settings file `name` that says `settings`: it must be refused;
/// what it said.
fn refused(name: &str, settings: &str) -> String {
    let file = tmp("room-config", name);
    std::fs::write(&file, settings).unwrap();
    let out = Command::new(BIN)
        .env("NETJAM_CONFIG", &file)
        .args(JAM_IN_BAND)
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_room_name_is_all_a_player_types() {
    let (mut server, server_addr) = room_server("20", WAIT);

    let config = tmp("room-config", "config.toml");
    std::fs::write(&config, format!("server = \"{server_addr}\"\nname = \"ana\"\n")).unwrap();
    let mut ana = Proc::spawn_lines(
        Command::new(BIN).env("NETJAM_CONFIG", &config).args(JAM_IN_BAND),
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
    let err = refused("bad.toml", "sever = \"127.0.0.1:1\"\n");
    assert!(
        err.contains("bad.toml") && err.contains("fix or remove it"),
        "{err}"
    );

    // No server anywhere: the player is told both ways to give one.
    let err = refused("empty.toml", "name = \"ana\"\n");
    assert!(
        err.contains("--server HOST") && err.contains("empty.toml"),
        "{err}"
    );
}
