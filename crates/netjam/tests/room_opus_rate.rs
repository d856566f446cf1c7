//! A room with Opus and a player whose device is not at 48 kHz: `netjam jam --jack --server`
//! on a JACK dummy server at 44.1 kHz joins a room on a local `netjam server` with a
//! player at 48 kHz (a WAV file), both with `--codec opus`.
//!
//! * each hears the other's tone at its pitch (within 1.5 %: the dummy driver's clock runs
//!   up to 1 % off the wall clock the file player paces by) — the 44.1 kHz player's through
//!   its JACK output port, recorded by `jack_rec` at the device's rate;
//! * the 44.1 kHz player's recording (`--record`) holds both tones at Opus's 48 kHz;
//! * its report counts the hearing edge's delay in every member's latency;
//! * `--member-ports`, which cannot follow the edge, is refused with what to do instead.
//!
//! Every wait is for something a process prints or a port that appears, with a timeout.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::jackd::Jackd;
use common::signal::{read_wav, write_tone};
use common::{address_in, read_json, require, tmp_dir, Proc, BIN};

/// The tone the 44.1 kHz player sends (made in JACK, so at the device's rate) and the one
/// the 48 kHz player sends (its WAV file).
const JACK_HZ: f64 = 440.0;
const FILE_HZ: f64 = 660.0;
const AMP: f64 = 0.3;
/// The pitch heard may be this far off (the dummy driver's clock against the wall clock).
const PITCH_TOLERANCE: f64 = 0.015;
const STEP: Duration = Duration::from_secs(20);

/// Power of `x` at `hz` for a signal sampled at `rate`, through a Hann window.
fn power(x: &[f64], hz: f64, rate: f64) -> f64 {
    let n = x.len();
    let k = 2.0 * (2.0 * std::f64::consts::PI * hz / rate).cos();
    let (mut s1, mut s2) = (0.0, 0.0);
    for (i, &v) in x.iter().enumerate() {
        let w = 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / (n - 1) as f64).cos();
        let s0 = v * w + k * s1 - s2;
        s2 = s1;
        s1 = s0;
    }
    s1 * s1 + s2 * s2 - k * s1 * s2
}

/// The strongest frequency within ±10 % of `near`, to 0.25 Hz, and its amplitude (a sine
/// of amplitude A reads A).
fn pitch_near(x: &[f64], rate: f64, near: f64) -> (f64, f64) {
    let (lo, hi) = ((near * 0.9 * 4.0) as u64, (near * 1.1 * 4.0) as u64);
    let (hz, p) = (lo..=hi)
        .map(|q| q as f64 / 4.0)
        .map(|hz| (hz, power(x, hz, rate)))
        .fold((0.0, 0.0), |best, c| if c.1 > best.1 { c } else { best });
    let sum_w = x.len() as f64 / 2.0;
    (hz, 2.0 * p.max(0.0).sqrt() / sum_w)
}

/// Checks that `path`'s first channel carries `hz` at its pitch in every half-second block
/// for `seconds`, from the block after the first in which it is heard (that one may hold
/// its onset), loud enough to be the tone and not a splash; returns the pitches found.
fn assert_tone(path: &Path, hz: f64, seconds: f64, what: &str) -> Vec<f64> {
    let audio = read_wav(path);
    let rate = f64::from(audio.rate);
    let x = audio.channels.into_iter().next().unwrap_or_default();
    let block = (rate / 2.0) as usize;
    let blocks: Vec<&[f64]> = x.chunks_exact(block).collect();
    let first = blocks
        .iter()
        .position(|b| pitch_near(b, rate, hz).1 > AMP / 4.0)
        .unwrap_or_else(|| panic!("{what}: {hz} Hz is never heard in {}", path.display()));
    let want = (seconds * 2.0) as usize;
    assert!(
        blocks.len() >= first + 1 + want,
        "{what}: {} holds {:.1} s after the tone starts at {:.1} s, wanted {seconds} s",
        path.display(),
        (blocks.len() - first) as f64 / 2.0,
        first as f64 / 2.0
    );
    let mut found = Vec::new();
    for b in &blocks[first + 1..first + 1 + want] {
        let (at, amp) = pitch_near(b, rate, hz);
        assert!(
            amp > AMP / 4.0,
            "{what}: the {hz} Hz tone is at amplitude {amp:.3} (sent {AMP}) in a block"
        );
        assert!(
            (at - hz).abs() <= hz * PITCH_TOLERANCE,
            "{what}: heard {at} Hz for {hz} Hz"
        );
        found.push(at);
    }
    found
}

/// Lines `p` prints until one contains `needle` (panics after `timeout`).
fn wait_for_line(p: &Proc, needle: &str, timeout: Duration, said: &mut Vec<String>) {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match p.line_within(left) {
            Some(l) => {
                let hit = l.contains(needle);
                said.push(l);
                if hit {
                    return;
                }
            }
            None => panic!("no line with {needle:?} within {timeout:?}:\n{}", said.join("\n")),
        }
    }
}

#[test]
fn a_player_at_44_1_khz_hears_and_is_heard_in_an_opus_room() {
    require("jack_rec", "jackd2");
    require("gst-launch-1.0", "gstreamer1.0-tools");
    let jack = Jackd::start_at_rate("netjam-test-roomrate", 64, 44_100);
    let dir = tmp_dir("roomrate");
    let server_json = dir.join("server.json");
    let server = Proc::spawn_lines(
        Command::new(BIN)
            .args(["server", "--listen", "127.0.0.1:0", "--stats-json"])
            .arg(&server_json)
            .stdout(Stdio::null()),
        "netjam server",
    );
    let addr = address_in(&server.next_line(STEP)).to_string();

    // What cannot follow the edge is refused, saying what to do.
    let client = format!("njroomrate{}", std::process::id());
    let refused = jack.netjam(&[
        "jam",
        "--jack",
        "--jack-name",
        &client,
        "--no-connect",
        "--server",
        &addr,
        "--room",
        "r",
        "--name",
        "ports",
        "--codec",
        "opus",
        "--member-ports",
        "--duration",
        "1",
    ]);
    let told = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "--member-ports at 44.1 kHz ran:\n{told}"
    );
    assert!(
        told.contains("--member-ports") && told.contains("jackd -r 48000"),
        "{told}"
    );

    // The 44.1 kHz player, its JACK input fed a tone made at the device's rate.
    let (a_json, a_rec) = (dir.join("ana.json"), dir.join("ana-rec"));
    let mut ana = Proc::spawn_lines(
        jack.client(&mut Command::new(BIN))
            .args(["jam", "--jack", "--jack-name", &client, "--no-connect"])
            .args(["--server", &addr, "--room", "r", "--name", "ana"])
            .args(["--codec", "opus", "--channels", "1", "--duration", "12"])
            .arg("--record")
            .arg(&a_rec)
            .arg("--stats-json")
            .arg(&a_json)
            .env("NETJAM_NO_REALTIME", "1")
            .stdout(Stdio::null()),
        "netjam jam (44.1 kHz)",
    );
    let mut ana_said = Vec::new();
    wait_for_line(&ana, "in room", STEP, &mut ana_said);
    let edge_line = ana_said
        .iter()
        .find(|l| l.contains("resampling the device's 44100 Hz to and from Opus's 48000 Hz"))
        .unwrap_or_else(|| panic!("no resampling line:\n{}", ana_said.join("\n")))
        .clone();
    let tone_client = format!("njtone{}", std::process::id());
    let _tone = Proc::spawn(
        jack.client(&mut Command::new("gst-launch-1.0"))
            .args(["-q", "audiotestsrc", "is-live=true", "wave=sine"])
            .arg(format!("freq={JACK_HZ}"))
            .arg(format!("volume={AMP}"))
            .args([
                "!",
                "audio/x-raw,channels=1",
                "!",
                "jackaudiosink",
                "connect=none",
            ])
            .arg(format!("client-name={tone_client}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "gst-launch-1.0 (tone into JACK)",
    );
    let deadline = Instant::now() + STEP;
    let tone_port = loop {
        if let Some(p) = jack
            .ports()
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with(&format!("{tone_client}:")))
        {
            break p.to_string();
        }
        assert!(Instant::now() < deadline, "the tone's JACK port never appeared");
        std::thread::sleep(Duration::from_millis(50));
    };
    jack.connect(&tone_port, &format!("{client}:send_1"));

    // The 48 kHz player, from a file.
    let b_tone = dir.join("bo-tone.wav");
    write_tone(&b_tone, FILE_HZ, AMP, 12.0);
    let (b_heard, b_json) = (dir.join("bo-heard.wav"), dir.join("bo.json"));
    let mut bo = Proc::spawn_lines(
        Command::new(BIN)
            .args(["jam", "--server", &addr, "--room", "r", "--name", "bo", "--input"])
            .arg(&b_tone)
            .args(["--codec", "opus", "--duration", "9", "--output"])
            .arg(&b_heard)
            .arg("--stats-json")
            .arg(&b_json)
            .env("NETJAM_NO_REALTIME", "1")
            .stdout(Stdio::null()),
        "netjam jam (48 kHz)",
    );
    wait_for_line(&ana, "room r: bo", STEP, &mut ana_said);

    // What the 44.1 kHz player plays, recorded at the device's rate (its last 3 s checked:
    // the first second lets the jitter buffer fill).
    let a_heard = dir.join("ana-heard.wav");
    let rec = jack.run_bounded(
        Command::new("jack_rec")
            .arg("-f")
            .arg(&a_heard)
            .args(["-d", "4", "-b", "16"])
            .arg(format!("{client}:receive_1")),
        STEP,
    );
    assert!(
        rec.as_ref().is_some_and(|o| o.status.success()),
        "jack_rec failed: {rec:?}"
    );

    let (b_status, b_said) = bo.finish(STEP);
    assert!(
        b_status.success(),
        "the 48 kHz player failed:\n{}",
        b_said.join("\n")
    );
    let (a_status, rest) = ana.finish(STEP);
    ana_said.extend(rest);
    let ana_text = ana_said.join("\n");
    assert!(a_status.success(), "the 44.1 kHz player failed:\n{ana_text}");
    assert!(!ana_text.contains("ran short"), "{ana_text}");

    // Each hears the other at pitch: the 44.1 kHz player at its device's rate...
    let a_pitch = assert_tone(&a_heard, FILE_HZ, 3.0, "the 44.1 kHz player heard");
    assert_eq!(read_wav(&a_heard).rate, 44_100);
    // ... the 48 kHz player in its file.
    let b_pitch = assert_tone(&b_heard, JACK_HZ, 4.0, "the 48 kHz player heard");
    // The recording is at Opus's rate and holds both: you.wav the tone sent, mix.wav the
    // other's.
    let you = a_rec.join("you.wav");
    let mix = a_rec.join("mix.wav");
    assert_eq!(read_wav(&mix).rate, 48_000);
    assert_tone(&you, JACK_HZ, 3.0, "the 44.1 kHz player's you.wav");
    assert_tone(&mix, FILE_HZ, 3.0, "the 44.1 kHz player's mix.wav");

    // The hearing edge's delay is in every member's latency.
    let report = read_json(&a_json);
    let edge_ms = report["hear_edge_ms"].as_f64().expect("hear_edge_ms");
    assert!(edge_ms > 0.0 && edge_ms < 10.0, "{report}");
    assert!(
        edge_line.contains(&format!("{edge_ms:.2} ms hearing")),
        "{edge_line} vs {edge_ms}"
    );
    let bo_heard = report["heard"]
        .as_array()
        .and_then(|h| h.iter().find(|m| m["name"] == "bo"))
        .unwrap_or_else(|| panic!("bo not heard: {report}"));
    let rtt = bo_heard["rtt_ms"].as_f64().expect("rtt measured");
    let buffer = bo_heard["added_latency_ms"].as_f64().expect("buffer");
    let ear = bo_heard["mouth_to_ear_ms"].as_f64().expect("mouth to ear");
    // Two JACK periods of 64 frames at 44.1 kHz, besides the packet.
    let device_ms = 2.0 * 64.0 * 1e3 / 44_100.0;
    assert!(
        ear >= rtt / 2.0 + buffer + device_ms + edge_ms - 0.01,
        "mouth to ear {ear} ms: rtt {rtt}, buffer {buffer}, edge {edge_ms}"
    );
    drop(server);
    eprintln!(
        "44.1 kHz player in an Opus room: {edge_line}; heard {FILE_HZ} Hz as {a_pitch:?}; the 48 kHz player heard {JACK_HZ} Hz as {b_pitch:?}; mouth to ear {ear:.2} ms"
    );
}
