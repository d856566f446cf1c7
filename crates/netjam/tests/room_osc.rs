//! Every player's own mix, set over OSC by implementations nobody here wrote: a server and
//! four `jam --server` clients on loopback (sines at 220, 330, 440 and 550 Hz); ana finds
//! her seats through `/roster`, mutes bo and solos cy at their seats with liblo's `oscsend`
//! and turns cy down 12 dB by name (`/member/Cy/gain`) with python-osc. Her output then
//! holds no bo, no dee (cy is soloed) and cy 12 dB down (at the level bo, whose master
//! gain is -12 dB, hears her), while bo's own mix is untouched. A mix given with `--mix` at start applies by name, again
//! to a member killed and started anew under that name. Loopback only, ephemeral ports,
//! every wait bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{Duration, Instant};

use common::signal::{goertzel, read_channel0};
use common::{address_in, read_json, require, require_python_osc, room_server, sine_player, tmp, Proc};
use netjam_osc::{encode_message, Arg, Packet};

const WAIT: Duration = Duration::from_secs(15);

fn player(server: SocketAddr, name: &str, hz: &str, seconds: &str, extra: &[&str]) -> Proc {
    player_in("room-osc", server, name, hz, seconds, extra)
}

/// [`player`], its files under `tag`.
fn player_in(tag: &str, server: SocketAddr, name: &str, hz: &str, seconds: &str, extra: &[&str]) -> Proc {
    let out = tmp(tag, &format!("{name}.wav"));
    let json = tmp(tag, &format!("{name}.json"));
    Proc::spawn_lines(
        sine_player(server, name, hz, seconds)
            .arg("--output")
            .arg(&out)
            .arg("--stats-json")
            .arg(&json)
            .args(extra),
        "jam --server",
    )
}

/// The seats `/roster` names: (seat, name).
fn roster(osc: SocketAddr) -> Vec<(i32, String)> {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let mut buf = [0u8; 256];
    let n = encode_message(&mut buf, "/roster", &[]).unwrap();
    socket.send_to(&buf[..n], osc).unwrap();
    let mut seats = Vec::new();
    let mut reply = [0u8; 2048];
    while let Ok((n, _)) = socket.recv_from(&mut reply) {
        let Ok(Packet::Message(m)) = Packet::decode(&reply[..n]) else {
            continue;
        };
        match m.address() {
            "/roster" => {
                let args: Vec<Arg> = m.args().collect();
                if let [Arg::Int(seat), Arg::Str(name)] = args[..] {
                    seats.push((seat, name.to_string()));
                }
            }
            "/roster/end" => break,
            _ => {}
        }
    }
    seats
}

/// Tone power in dB of the last `seconds` of a mono WAV, summed over ±5 Hz of `hz` in a
/// Hann-windowed block: drift correction moves a tone by a fraction of a hertz, which a
/// single exact-frequency bin would read as a level change.
fn tone_db(path: &std::path::Path, hz: f64, seconds: f64) -> f64 {
    let x = read_channel0(path);
    let n = (seconds * 48_000.0) as usize;
    assert!(
        x.len() > n + 48_000,
        "{} is only {} frames",
        path.display(),
        x.len()
    );
    // Leave the last 0.2 s out: a player that stopped first may have faded out there.
    let end = x.len() - 9_600;
    let block: Vec<f64> = x[end - n..end]
        .iter()
        .enumerate()
        .map(|(i, v)| v * (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n as f64).cos()))
        .collect();
    let step = 1.0 / seconds;
    let power: f64 = (-10..=10)
        .map(|k| goertzel(&block, hz + f64::from(k) * step))
        .sum();
    10.0 * power.max(1e-12).log10()
}

#[test]
fn each_player_sets_their_own_mix_over_osc() {
    require("oscsend", "liblo-tools");
    require_python_osc("pythonosc.udp_client");

    let (server, server_addr) = room_server("40", WAIT);

    // bo hears three tones at -6 dBFS: his master gain keeps them under the limiter's
    // knee, so his mix is the reference level, untouched.
    let mut bo = player(server_addr, "bo", "330", "10", &["--master-gain=-12"]);
    bo.line_with("in room", WAIT);
    let mut cy = player(server_addr, "cy", "440", "10", &[]);
    cy.line_with("in room", WAIT);
    let mut dee = player(server_addr, "dee", "550", "10", &[]);
    dee.line_with("in room", WAIT);
    let mut ana = player(server_addr, "ana", "220", "7", &["--osc", "0"]);
    let osc = address_in(&ana.line_with("OSC control on", WAIT));

    // Ana's seats, once the roster has the three others.
    let deadline = Instant::now() + WAIT;
    let seats = loop {
        let seats = roster(osc);
        if seats.len() == 3 {
            break seats;
        }
        assert!(
            Instant::now() < deadline,
            "ana's roster never held bo, cy and dee: {seats:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let seat_of = |name: &str| {
        seats
            .iter()
            .find(|(_, n)| n == name)
            .map(|(s, _)| *s)
            .expect(name)
    };
    let bo_seat = seat_of("bo");

    let mute = Command::new("oscsend")
        .args([
            "127.0.0.1",
            &osc.port().to_string(),
            &format!("/member{bo_seat}/mute"),
            "i",
            "1",
        ])
        .status()
        .unwrap();
    assert!(mute.success(), "oscsend failed");
    // cy soloed at her seat: dee falls silent for ana (bo is muted anyway).
    let solo = Command::new("oscsend")
        .args([
            "127.0.0.1",
            &osc.port().to_string(),
            &format!("/member{}/solo", seat_of("cy")),
            "i",
            "1",
        ])
        .status()
        .unwrap();
    assert!(solo.success(), "oscsend failed");
    let gain = Command::new("python3")
        .args([
            "-c",
            &format!(
                "from pythonosc import udp_client; udp_client.SimpleUDPClient('127.0.0.1', {}).send_message('/member/Cy/gain', -12.0)",
                osc.port()
            ),
        ])
        .status()
        .unwrap();
    assert!(gain.success(), "python-osc failed");
    // The settings reached the mix: the queries answer them.
    let deadline = Instant::now() + WAIT;
    loop {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut buf = [0u8; 128];
        let n = encode_message(&mut buf, &format!("/member{bo_seat}/mute"), &[]).unwrap();
        socket.send_to(&buf[..n], osc).unwrap();
        let mut reply = [0u8; 256];
        let muted = socket.recv_from(&mut reply).ok().is_some_and(|(n, _)| {
            matches!(Packet::decode(&reply[..n]), Ok(Packet::Message(m))
                if m.args().next().is_some_and(|a| matches!(a, Arg::Int(1) | Arg::True)))
        });
        if muted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the mute never showed in /member{bo_seat}/mute"
        );
    }

    let (status, said) = ana.finish(WAIT);
    assert!(status.success(), "ana failed: {said:#?}");
    assert!(bo.wait_for(WAIT).success());
    assert!(cy.wait_for(WAIT).success());
    assert!(dee.wait_for(WAIT).success());
    server.interrupt();

    // Ana heard the three (their streams arrived), and in her last two seconds bo and dee are silent and cy
    // is 12 dB down (as bo hears cy through his -12 dB master).
    let report = read_json(&tmp("room-osc", "ana.json"));
    let heard: Vec<(String, u64)> = report["heard"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["name"].as_str().unwrap().to_string(),
                h["received"].as_u64().unwrap(),
            )
        })
        .collect();
    for who in ["bo", "cy", "dee"] {
        assert!(
            heard.iter().any(|(n, r)| n == who && *r > 1000),
            "ana did not receive {who}: {heard:?}"
        );
    }
    let ana_wav = tmp("room-osc", "ana.wav");
    let bo_wav = tmp("room-osc", "bo.wav");
    let bo_in_ana = tone_db(&ana_wav, 330.0, 2.0);
    let cy_in_ana = tone_db(&ana_wav, 440.0, 2.0);
    let cy_in_bo = tone_db(&bo_wav, 440.0, 2.0);
    let own_in_ana = tone_db(&ana_wav, 220.0, 2.0);
    let dee_in_ana = tone_db(&ana_wav, 550.0, 2.0);
    let dee_in_bo = tone_db(&bo_wav, 550.0, 2.0);
    eprintln!("ana hears bo {bo_in_ana:.1} dB, cy {cy_in_ana:.1} dB (soloed), dee {dee_in_ana:.1} dB, herself {own_in_ana:.1} dB; bo hears cy {cy_in_bo:.1} dB, dee {dee_in_bo:.1} dB");
    // A tone left in ana's mix would be near the 0 dB level, 12 dB above cy's: whatever is
    // muted or not soloed must lie 30 dB below cy there (42 dB below that level).
    let unheard = cy_in_ana - 30.0;
    assert!(
        dee_in_ana < unheard,
        "with cy soloed ana still hears dee: {dee_in_ana:.1} dB against cy at {cy_in_ana:.1} dB"
    );
    assert!(
        bo_in_ana < unheard,
        "muted bo is still in ana's mix: {bo_in_ana:.1} dB against cy at {cy_in_ana:.1} dB"
    );
    // cy at -12 dB in ana's mix (master 0 dB) against cy at 0 dB in bo's (master -12 dB).
    let drop = cy_in_bo - cy_in_ana;
    assert!(
        (-1.5..=1.5).contains(&drop),
        "cy should be 12 dB down in ana's mix, as bo hears her through his -12 dB master: {drop:.1} dB apart"
    );
    assert!(
        own_in_ana < unheard,
        "ana hears herself through the network: {own_in_ana:.1} dB"
    );
}

#[test]
fn a_mix_given_at_start_follows_each_name_across_a_restart() {
    let (server, server_addr) = room_server("40", WAIT);
    let bo = player_in("room-mix", server_addr, "bo", "330", "20", &[]);
    bo.line_with("in room", WAIT);
    let ana = player_in(
        "room-mix",
        server_addr,
        "ana",
        "220",
        "8",
        &["--mix", "BO=-6,cy=mute"],
    );
    ana.line_with("room band: bo", WAIT);
    // Bo crashes and comes back under the same name on the same machine: the server
    // replaces its seat, and ana's mix for "bo" applies to the new member at once.
    let mut bo = bo;
    bo.child.kill().unwrap();
    bo.child.wait().unwrap();
    let mut again = player_in("room-mix", server_addr, "bo", "330", "5", &[]);
    again.line_with("in room", WAIT);
    let mut ana = ana;
    let (status, said) = ana.finish(WAIT);
    assert!(status.success(), "ana failed: {said:#?}");
    assert!(again.wait_for(WAIT).success());
    server.interrupt();

    let report = read_json(&tmp("room-mix", "ana.json"));
    let bos: Vec<(u64, f64, bool)> = report["heard"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["name"] == "bo")
        .map(|h| {
            (
                h["member_id"].as_u64().unwrap(),
                h["gain_db"].as_f64().unwrap(),
                h["mute"].as_bool().unwrap(),
            )
        })
        .collect();
    assert!(
        bos.len() == 2 && bos.iter().all(|&(_, db, mute)| (db + 6.0).abs() < 0.01 && !mute),
        "ana's bos (the first, then the restarted one) were not both at -6 dB: {bos:?}"
    );
}
