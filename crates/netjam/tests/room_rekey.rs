//! A private room's password changed while it plays, on loopback: `netjam server` and three
//! `netjam jam --password first` players, each sending its own tone.
//!
//! * ana changes the password over OSC (`/password ,s second`); bo and cy are told;
//! * bo takes the new password over OSC; cy never does;
//! * from then on ana and bo hear each other and not cy, and cy hears neither of them
//!   (their packets carry another epoch's key IDs: dropped and counted), where before the
//!   change everyone heard everyone;
//! * a newcomer with the old password is refused.
//!
//! Every wait is for something a process prints, with a timeout.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::signal::{read_channel0, tone_amp, RATE};
use common::{address_in, read_json, room_server, sine_player, tmp, Proc};
use netjam_osc::{encode_message, Arg};

const WAIT: Duration = Duration::from_secs(20);
const SECONDS: &str = "16";
const TONES: [(&str, f64); 3] = [("ana", 311.0), ("bo", 463.0), ("cy", 587.0)];
/// A tone is heard above this amplitude in a 0.2 s block (each is sent at about 0.5).
const HEARD: f64 = 0.05;
/// And absent below this one (−46 dBFS).
const ABSENT: f64 = 0.005;

fn player(server: SocketAddr, name: &str, hz: f64, password: &str, osc: bool) -> (Proc, PathBuf, PathBuf) {
    let out = tmp("room-rekey", &format!("{name}.wav"));
    let json = tmp("room-rekey", &format!("{name}.json"));
    let mut c = sine_player(server, name, &hz.to_string(), SECONDS);
    c.args(["--password", password, "--output"])
        .arg(&out)
        .arg("--stats-json")
        .arg(&json);
    if osc {
        c.args(["--osc", "0"]);
    }
    (Proc::spawn_lines(&mut c, "jam --password"), out, json)
}

fn set_password(osc: SocketAddr, password: &str) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut buf = [0u8; 256];
    let n = encode_message(&mut buf, "/password", &[Arg::Str(password)]).unwrap();
    socket.send_to(&buf[..n], osc).unwrap();
}

/// The amplitude of `hz` in each 0.2 s block of `path` from `from_s` to `to_s` seconds
/// (negative: from the end).
fn amps(path: &Path, hz: f64, from_s: f64, to_s: f64) -> Vec<f64> {
    blocks(path, from_s, to_s)
        .iter()
        .map(|c| tone_amp(c, hz))
        .collect()
}

/// How far `hz` stands above the spectrum beside it in each 0.2 s block: its amplitude less
/// the larger of the amplitudes 30 Hz either side (outside the window's main lobe). A tone
/// that is heard stands out by its whole level; a splice in another member's tone (a lost
/// packet concealed) spreads a broadband step across all three alike and stands out by
/// nothing, where its plain amplitude at `hz` can reach −43 dBFS.
fn standing_out(path: &Path, hz: f64, from_s: f64, to_s: f64) -> Vec<f64> {
    blocks(path, from_s, to_s)
        .iter()
        .map(|c| tone_amp(c, hz) - tone_amp(c, hz - 30.0).max(tone_amp(c, hz + 30.0)))
        .collect()
}

/// The 0.2 s blocks of channel 0 of `path` from `from_s` to `to_s` seconds.
fn blocks(path: &Path, from_s: f64, to_s: f64) -> Vec<Vec<f64>> {
    let x = read_channel0(path);
    let at = |s: f64| {
        let f = (s.abs() * RATE) as usize;
        if s < 0.0 {
            x.len().saturating_sub(f)
        } else {
            f.min(x.len())
        }
    };
    let (a, b) = (at(from_s), at(to_s));
    assert!(b > a + 9_600, "{} is only {} frames", path.display(), x.len());
    x[a..b].chunks_exact(9_600).map(<[f64]>::to_vec).collect()
}

fn hz_of(name: &str) -> f64 {
    TONES.iter().find(|t| t.0 == name).map(|t| t.1).unwrap()
}

#[test]
fn a_changed_password_is_followed_by_those_who_take_it_and_shuts_out_the_one_who_does_not() {
    let (server, addr) = room_server("40", WAIT);
    let (ana, ana_wav, ana_json) = player(addr, "ana", hz_of("ana"), "first", true);
    let ana_osc = address_in(&ana.line_with("OSC control on", WAIT));
    ana.line_with("in room", WAIT);
    let (bo, bo_wav, bo_json) = player(addr, "bo", hz_of("bo"), "first", true);
    let bo_osc = address_in(&bo.line_with("OSC control on", WAIT));
    bo.line_with("in room", WAIT);
    let (cy, cy_wav, cy_json) = player(addr, "cy", hz_of("cy"), "first", false);
    cy.line_with("in room", WAIT);
    // Everyone hears everyone for a while first.
    std::thread::sleep(Duration::from_millis(2_500));

    set_password(ana_osc, "second");
    ana.line_with("you changed room", WAIT);
    bo.line_with("ana changed room", WAIT);
    cy.line_with("ana changed room", WAIT);
    set_password(bo_osc, "second");
    bo.line_with("you took room", WAIT);

    // The old password seats nobody any more.
    let (mut dee, _, _) = player(addr, "dee", 700.0, "first", false);
    let (status, said) = dee.finish(WAIT);
    assert!(
        !status.success(),
        "dee was seated with the old password: {said:#?}"
    );
    assert!(
        said.iter().any(|l| l.contains("password")),
        "dee is not told why: {said:#?}"
    );

    let mut reports = Vec::new();
    for (name, mut p, wav, json) in [
        ("ana", ana, ana_wav, ana_json),
        ("bo", bo, bo_wav, bo_json),
        ("cy", cy, cy_wav, cy_json),
    ] {
        let (status, said) = p.finish(WAIT + Duration::from_secs(20));
        assert!(status.success(), "{name} failed: {said:#?}");
        reports.push((name, wav, read_json(&json), said));
    }
    server.interrupt();

    for (name, wav, report, said) in &reports {
        let sframe = &report["stats"]["sframe"];
        let epoch = sframe["epoch"].as_u64();
        for (other, hz) in TONES.iter().filter(|t| t.0 != *name) {
            // Before the change: 0.6 s to 2.0 s after this player's own start (cy sat
            // down last, and the change came 2.5 s after).
            let before = amps(wav, *hz, 0.6, 2.0);
            // 3 s well after the change, ending 1.5 s before this player's end: each plays
            // 16 s from its own start, and the players start up to a second apart on a
            // loaded machine (ana's tone stopped 0.55 s before bo's recording did).
            let after = amps(wav, *hz, -4.5, -1.5);
            let after_peak = standing_out(wav, *hz, -4.5, -1.5);
            let kept = (*name != "cy") && (*other != "cy");
            let best = before.iter().cloned().fold(0.0, f64::max);
            assert!(
                best > HEARD,
                "{name} did not hear {other} before the change: {before:.3?}"
            );
            if kept {
                assert!(
                    after.iter().all(|&a| a > HEARD),
                    "{name} lost {other} after both took the new password: {after:.3?}; {said:#?}"
                );
            } else {
                assert!(
                    after_peak.iter().all(|&a| a < ABSENT),
                    "{name} still hears {other} across the change: {after_peak:.4?} above the \
                     spectrum beside it ({after:.4?} in all); {said:#?}"
                );
            }
        }
        if *name == "cy" {
            assert_eq!(epoch, Some(0), "{sframe}");
            assert!(sframe["no_key"].as_u64().unwrap() > 100, "{sframe}");
        } else {
            assert_eq!(epoch, Some(1), "{name}: {sframe}");
            assert_eq!(sframe["rekeys"].as_u64(), Some(1), "{name}: {sframe}");
        }
    }
}

/// `netjam jam --password` with its `/password` port; without a password there is none.
#[test]
fn only_a_private_room_has_a_password_port() {
    let (server, addr) = room_server("10", WAIT);
    let (p, _, _) = {
        let out = tmp("room-rekey-open", "zed.wav");
        let json = tmp("room-rekey-open", "zed.json");
        let mut c = sine_player(addr, "zed", "440", "4");
        c.args(["--osc", "0", "--output"])
            .arg(&out)
            .arg("--stats-json")
            .arg(&json);
        (Proc::spawn_lines(&mut c, "jam"), out, json)
    };
    let osc = address_in(&p.line_with("OSC control on", WAIT));
    p.line_with("in room", WAIT);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buf = [0u8; 256];
    let n = encode_message(&mut buf, "/password", &[Arg::Str("x")]).unwrap();
    socket.send_to(&buf[..n], osc).unwrap();
    let mut reply = [0u8; 512];
    let (n, _) = socket.recv_from(&mut reply).expect("an answer");
    let text = String::from_utf8_lossy(&reply[..n]).to_string();
    assert!(text.starts_with("/error"), "{text}");
    server.interrupt();
}
