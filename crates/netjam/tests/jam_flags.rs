//! No silent flags in `netjam jam`: a flag that means something in one mode only (`--peer`,
//! two players; `--room`, through a rooms server) is refused in the other at once, before
//! a packet leaves, with what to use instead; `--record` works in both, so a two-player
//! jam records its multitrack too. The same holds for the sound: Opus's settings without
//! `--codec opus`, and `--sample-format` without raw PCM on stdin or stdout, are refused by
//! `jam`, `send` and `recv` alike.

mod common;

use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::signal::read_wav;
use common::{read_json, reflect, tmp_dir, Proc, BIN};

/// Generous on a loaded 2-core machine; a refusal takes milliseconds.
const REFUSED_WITHIN: Duration = Duration::from_secs(10);

/// A socket standing for the other player or the rooms server, which must hear nothing.
fn silent_end() -> (UdpSocket, String) {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.set_nonblocking(true).expect("nonblocking");
    let addr = s.local_addr().expect("addr").to_string();
    (s, addr)
}

/// Runs `netjam jam HEAD EXTRA`, which must fail on its own at once, printing every one of
/// `says`; returns what it printed.
fn refused(head: &[&str], extra: &[&str], says: &[&str]) -> String {
    let args = [head, extra].concat();
    let start = Instant::now();
    let mut p = Proc::spawn_lines(Command::new(BIN).args(&args).stdout(Stdio::null()), "netjam jam");
    let (status, lines) = p.finish(REFUSED_WITHIN);
    let text = lines.join("\n");
    assert!(!status.success(), "netjam {args:?} succeeded: {text}");
    assert!(
        start.elapsed() < REFUSED_WITHIN,
        "netjam {args:?} took {:?}",
        start.elapsed()
    );
    for s in says {
        assert!(text.contains(s), "netjam {args:?} does not say {s:?}: {text}");
    }
    text
}

#[test]
fn room_flags_with_peer_are_refused_saying_what_to_use() {
    let (peer, to) = silent_end();
    let head = ["jam", "--peer", &to, "--listen", "127.0.0.1:0", "--sine", "440"];
    let room = "--room NAME --server HOST";
    let cases: &[(&[&str], &[&str])] = &[
        (&["--password", "pw"], &["--password", room, "--password TEXT"]),
        (&["--mix", "ana=-6"], &["--mix", "--gain DB", "--mute"]),
        (&["--via-server"], &["--via-server", room]),
        (&["--public"], &["--public", room]),
        (&["--port-map"], &["--port-map", "--listen port", room]),
        (&["--stun", "127.0.0.1:3478"], &["--stun", room]),
        (&["--web"], &["--web", room, "--osc PORT"]),
        (&["--web", "127.0.0.1:0"], &["--web", room]),
        (
            &["--ensemble", "band", "--ensemble-room", "other"],
            &["--ensemble-room", "--ensemble NAME", room],
        ),
        (&["--ensemble"], &["--ensemble", "--ensemble NAME"]),
    ];
    for (extra, says) in cases {
        refused(&head, extra, says);
    }
    let mut buf = [0u8; 2048];
    assert!(peer.recv(&mut buf).is_err(), "jam sent a packet to its peer");
}

#[test]
fn member_ports_with_peer_are_refused_before_jack_opens() {
    let (_peer, to) = silent_end();
    // No JACK server needs to run: the refusal comes before the device opens.
    let head = ["jam", "--peer", &to, "--listen", "127.0.0.1:0", "--jack"];
    refused(&head, &["--member-ports"], &["--member-ports", "NAME:receive_N"]);
}

#[test]
fn peer_flags_in_a_room_are_refused_saying_what_to_use() {
    let (server, to) = silent_end();
    let head = [
        "jam", "--room", "flags", "--server", &to, "--name", "ana", "--sine", "440",
    ];
    let cases: &[(&[&str], &[&str])] = &[
        (&["--gain", "-6"], &["--gain", "--master-gain DB", "--mix"]),
        (&["--mute"], &["--mute", "--master-gain DB", "NAME=mute"]),
        (
            &["--ensemble", "band", "--ensemble-local"],
            &["--ensemble-local", "through the rooms server", "leave them out"],
        ),
        (
            &["--ensemble", "--ensemble-port", "15000"],
            &["--ensemble-port", "through the rooms server", "leave them out"],
        ),
        (
            &["--ensemble", "--delay-to-beat"],
            &["--delay-to-beat", "play with --peer"],
        ),
    ];
    for (extra, says) in cases {
        refused(&head, extra, says);
    }
    let mut buf = [0u8; 2048];
    assert!(server.recv(&mut buf).is_err(), "jam sent a packet to the server");
}

#[test]
fn codec_and_sample_format_flags_that_mean_nothing_here_are_refused() {
    let (peer, to) = silent_end();
    let jam = ["jam", "--peer", &to, "--listen", "127.0.0.1:0", "--sine", "440"];
    let send = ["send", "--to", &to, "--sine", "440"];
    for head in [&jam[..], &send[..]] {
        refused(head, &["--opus-frame", "5"], &["--opus-frame", "--codec opus"]);
        refused(head, &["--complexity", "9"], &["--complexity", "--codec opus"]);
        refused(head, &["--bitrate", "64"], &["--bitrate", "--codec opus"]);
        refused(
            head,
            &["--codec", "l24", "--opus-frame", "5"],
            &["--opus-frame", "--codec opus"],
        );
        refused(
            head,
            &["--sample-format", "f32le"],
            &["--sample-format", "--stdin"],
        );
    }
    let out = tmp_dir("jam-flags-recv").join("heard.wav");
    refused(
        &[
            "recv",
            "--listen",
            "127.0.0.1:0",
            "--output",
            out.to_str().expect("path"),
        ],
        &["--sample-format", "f32le"],
        &["--sample-format", "--stdout"],
    );
    assert!(!out.exists(), "recv wrote {} before refusing", out.display());
    let mut buf = [0u8; 2048];
    assert!(peer.recv(&mut buf).is_err(), "a packet was sent");
}

#[test]
fn help_says_jam_plays_with_a_peer_or_in_a_room_under_headings() {
    let top = Command::new(BIN).arg("--help").output().expect("netjam --help");
    let top = String::from_utf8_lossy(&top.stdout);
    let jam = top
        .lines()
        .find(|l| l.trim_start().starts_with("jam "))
        .unwrap_or_else(|| panic!("no jam in {top}"));
    assert!(jam.contains("one other player") && jam.contains("room"), "{jam}");
    let help = Command::new(BIN)
        .args(["jam", "--help"])
        .output()
        .expect("jam --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for heading in [
        "Where to play:",
        "What you play:",
        "Audio device:",
        "Sound and latency:",
        "Mix:",
        "Room:",
        "Recording:",
        "Control and reports:",
    ] {
        assert!(help.contains(heading), "no {heading} in jam --help: {help}");
    }
}

/// Root mean square of `x`.
fn rms(x: &[f64]) -> f64 {
    (x.iter().map(|v| v * v).sum::<f64>() / x.len().max(1) as f64).sqrt()
}

#[test]
fn a_two_player_jam_records_you_the_other_player_and_the_mix() {
    let dir = tmp_dir("jam-flags-record");
    let take = dir.join("take");
    let json = dir.join("jam.json");
    let _ = std::fs::remove_dir_all(&take);
    let (reflect, reflector) = reflect("10");
    let status = Command::new(BIN)
        .args(["jam", "--peer", &reflector.to_string(), "--listen", "127.0.0.1:0"])
        .args(["--sine", "440", "--duration", "2", "--gain", "-6"])
        .args(["--record", take.to_str().expect("path")])
        .args(["--stats-json", json.to_str().expect("path")])
        .stderr(Stdio::null())
        .status()
        .expect("netjam jam");
    drop(reflect);
    assert!(status.success(), "netjam jam --peer --record failed");

    let you = read_wav(&take.join("you.wav"));
    let peer = read_wav(&take.join("01-peer.wav"));
    let mix = read_wav(&take.join("mix.wav"));
    // Two seconds at 48 kHz, every file as long as the others.
    let frames = you.channels[0].len();
    assert!(
        (90_000..=100_000).contains(&frames),
        "you.wav holds {frames} frames"
    );
    assert_eq!(
        peer.channels[0].len(),
        frames,
        "01-peer.wav is as long as you.wav"
    );
    assert_eq!(mix.channels[0].len(), frames, "mix.wav is as long as you.wav");
    assert!(rms(&you.channels[0]) > 0.05, "you.wav holds the sine");
    // The sine came back from the reflector: the other player's track is heard...
    let half = frames / 2;
    let heard = rms(&peer.channels[0][half..]);
    assert!(heard > 0.05, "01-peer.wav is silent (RMS {heard})");
    // ...before --gain -6: the mix is the same track turned down, sample by sample.
    let g = 10f64.powf(-6.0 / 20.0);
    assert_eq!((mix.channels.len(), peer.channels.len()), (2, 2));
    for (c, (mix, peer)) in mix.channels.iter().zip(&peer.channels).enumerate() {
        for (i, (m, p)) in mix.iter().zip(peer).enumerate() {
            assert!(
                (m - p * g).abs() < 1e-4,
                "channel {c} frame {i}: mix {m} is not {g:.3} x {p}"
            );
        }
    }
    let report = read_json(&json);
    let files = report["record"]["files"]
        .as_array()
        .expect("record in the report");
    assert_eq!(files.len(), 3, "{:?}", report["record"]);
    assert_eq!(report["record"]["frames"].as_u64(), Some(frames as u64));
    let _ = std::fs::remove_dir_all(&dir);
}
