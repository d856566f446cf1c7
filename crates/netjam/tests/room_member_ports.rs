//! `jam --jack --member-ports` in a room, with real processes: a private JACK server on the
//! dummy driver, a rooms server on loopback, two players sending sines of their own
//! frequency from test signals (no JACK) and one JACK player with per-member ports.
//!
//! Its ports exist for all 16 seats from the start (`jack_lsp`), a seat's ports take the
//! name of the member who sits there and give it back when the member leaves, and JACK's
//! own `jack_rec` finds on each seat's ports exactly that member's tone (the other's below
//! -25 dB: a member mixed in would be near 0 dB, while a concealed stretch or a catch-up on
//! a loaded machine splashes broadband energy measured up to -36 dB), and digital silence
//! on a seat nobody holds.
//!
//! Linux only: the server is Debian's jackd2 and its dummy driver.
#![cfg(target_os = "linux")]

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::jackd::Jackd;
use common::signal::{dominant_hz, goertzel, read_wav};
use common::{free_udp_port, require, tmp_dir, Proc, BIN};

const PER_SEAT: usize = 2;
const SEATS: usize = 16;
/// Seconds `jack_rec` records; the analysis takes the last second.
const RECORD_S: &str = "2";

/// A player of `args` in room `band` on `port`, its stderr read line by line; returns once
/// it has its seat, with the lines it printed until then.
fn player(cmd: &mut Command, port: u16, name: &str, args: &[&str]) -> (Proc, Vec<String>) {
    let server = format!("127.0.0.1:{port}");
    let p = Proc::spawn_lines(
        cmd.args(["jam", "--server", &server, "--room", "band", "--name", name])
            .args(args),
        "netjam jam",
    );
    let mut said = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = p
            .line_within(left)
            .unwrap_or_else(|| panic!("{name} took no seat within 20 s: {said:?}"));
        let seated = line.contains("in room");
        said.push(line);
        if seated {
            return (p, said);
        }
    }
}

/// Record `ports` of the JACK server with `jack_rec` into `file` (one channel each).
fn record(server: &Jackd, file: &Path, ports: &[String]) {
    let out = server
        .run_bounded(
            Command::new("jack_rec")
                .args(["-f", file.to_str().expect("path"), "-d", RECORD_S, "-b", "24"])
                .args(ports),
            Duration::from_secs(15),
        )
        .expect("jack_rec did not finish within 15 s");
    assert!(
        out.status.success(),
        "jack_rec {ports:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Wait up to 5 s until `port` is gone from the server.
fn wait_until_gone(server: &Jackd, port: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.ports().lines().any(|l| l.trim() == port) {
        assert!(Instant::now() < deadline, "{port} still there after 5 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last second of each channel.
fn last_second(file: &Path) -> Vec<Vec<f64>> {
    let audio = read_wav(file);
    assert_eq!(audio.rate, 48_000, "{}", file.display());
    audio
        .channels
        .into_iter()
        .map(|c| c[c.len().saturating_sub(48_000)..].to_vec())
        .collect()
}

/// `x` under a Hann window, so that a tone's power stays near its own frequency (a member
/// whose playout was caught up or resampled is not a pure periodic block).
fn hann(x: &[f64]) -> Vec<f64> {
    let n = x.len().max(2) as f64 - 1.0;
    x.iter()
        .enumerate()
        .map(|(i, v)| v * (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n).cos()))
        .collect()
}

fn rms(x: &[f64]) -> f64 {
    (x.iter().map(|v| v * v).sum::<f64>() / x.len().max(1) as f64).sqrt()
}

#[test]
fn each_seats_ports_carry_exactly_that_members_tone() {
    require("jack_rec", "jackd2");
    let jack = Jackd::start("netjam-test-mports", 64);
    let port = free_udp_port();
    let mut rooms = Proc::spawn_lines(
        Command::new(BIN).args([
            "server",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--duration",
            "90",
        ]),
        "netjam server",
    );
    rooms.next_line(Duration::from_secs(10));
    let client = format!("njmp{}", std::process::id());
    let (mut dj, mut dj_said) = player(
        jack.client(&mut Command::new(BIN)),
        port,
        "dj",
        &[
            "--jack",
            "--jack-name",
            &client,
            "--no-connect",
            "--member-ports",
            "--duration",
            "60",
        ],
    );
    // Every seat's ports, registered before anyone sits there.
    let ports = jack.ports();
    for seat in 1..=SEATS {
        for c in 1..=PER_SEAT {
            let p = format!("{client}:from_{seat}_{c}");
            assert!(ports.lines().any(|l| l.trim() == p), "{p} missing: {ports}");
        }
    }
    assert_eq!(
        ports.lines().filter(|l| l.contains(":from_")).count(),
        SEATS * PER_SEAT,
        "{ports}"
    );

    // One at a time, so ana takes seat 1 and bo seat 2.
    let (mut ana, _) = player(
        &mut Command::new(BIN),
        port,
        "ana",
        &["--sine", "440", "--duration", "60"],
    );
    let (mut bo, _) = player(
        &mut Command::new(BIN),
        port,
        "bo bass",
        &["--sine", "1000", "--duration", "60"],
    );
    for p in ["from_ana_1", "from_ana_2", "from_bo_bass_1", "from_bo_bass_2"] {
        jack.wait_for_port(&format!("{client}:{p}"), "netjam jam --member-ports");
    }
    wait_until_gone(&jack, &format!("{client}:from_1_1"));
    wait_until_gone(&jack, &format!("{client}:from_2_1"));

    let dir = tmp_dir("mports");
    let take = dir.join("seats.wav");
    let recorded: Vec<String> = [
        "from_ana_1",
        "from_ana_2",
        "from_bo_bass_1",
        "from_bo_bass_2",
        "from_3_1",
    ]
    .iter()
    .map(|p| format!("{client}:{p}"))
    .collect();
    record(&jack, &take, &recorded);
    let channels = last_second(&take);
    assert_eq!(channels.len(), recorded.len());
    for (k, (x, (own, other))) in channels
        .iter()
        .zip([(440.0, 1000.0), (440.0, 1000.0), (1000.0, 440.0), (1000.0, 440.0)])
        .enumerate()
    {
        let w = hann(x);
        // In JACK's samples a member's tone was measured up to 1 % off its pitch (445 Hz for
        // 440, 1010 for 1000), and once 3.4 % (455 Hz for 440, in a CI run on a stalling
        // VM): playout follows each member's clock by resampling, and the dummy driver's
        // sleep-paced sample clock, which loses time at its xruns, is the other side of that
        // ratio. What this test checks is routing (each seat carries its member's tone and
        // not the other's, 440 against 1000 Hz), so the tone is looked for within 4 %; the
        // pitch itself is the listener measure's to judge.
        let near = |hz: f64| {
            let span = (hz * 0.04).ceil() as i32;
            (-span..=span)
                .map(|d| goertzel(&w, hz + f64::from(d)))
                .fold(0.0, f64::max)
        };
        let (p_own, p_other) = (near(own), near(other));
        let leak_db = 10.0 * (p_other / p_own).log10();
        let hz = dominant_hz(x);
        println!(
            "{}: rms {:.3}, strongest {hz} Hz, the other member's tone {leak_db:.1} dB below",
            recorded[k],
            rms(x)
        );
        assert!(
            (hz - own).abs() <= own * 0.04 + 5.0,
            "{}: strongest at {hz} Hz",
            recorded[k]
        );
        assert!(rms(x) > 0.2, "{}: rms {}", recorded[k], rms(x));
        assert!(
            leak_db < -25.0,
            "{}: the other tone at {leak_db:.1} dB",
            recorded[k]
        );
    }
    let empty = &channels[4];
    assert!(
        empty.iter().all(|v| *v == 0.0),
        "seat 3 has nobody, yet {} carries rms {}",
        recorded[4],
        rms(empty)
    );

    // bo leaves: seat 2's ports get their number back, and fall silent.
    bo.interrupt();
    assert!(bo.wait_for(Duration::from_secs(15)).success());
    jack.wait_for_port(&format!("{client}:from_2_1"), "netjam jam --member-ports");
    wait_until_gone(&jack, &format!("{client}:from_bo_bass_1"));
    let after = dir.join("left.wav");
    let recorded = [format!("{client}:from_2_1"), format!("{client}:from_ana_1")];
    record(&jack, &after, &recorded);
    let channels = last_second(&after);
    println!(
        "after bo left: {} rms {:.3}, {} rms {:.3}",
        recorded[0],
        rms(&channels[0]),
        recorded[1],
        rms(&channels[1])
    );
    assert!(channels[0].iter().all(|v| *v == 0.0), "seat 2 is empty now");
    assert!(rms(&channels[1]) > 0.2, "ana plays on");

    ana.interrupt();
    assert!(ana.wait_for(Duration::from_secs(15)).success());
    dj.interrupt();
    let (status, rest) = dj.finish(Duration::from_secs(15));
    dj_said.extend(rest);
    let _ = rooms.child.kill();
    let _ = std::fs::remove_dir_all(&dir);
    let said = dj_said.join("\n");
    println!("{said}");
    assert!(status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "member ports: seat 1 ana: {client}:from_ana_1, {client}:from_ana_2; seat 2 bo bass: {client}:from_bo_bass_1, {client}:from_bo_bass_2"
        )),
        "the seat map as it changed: {said}"
    );
    assert!(!said.contains("refused"), "{said}");
}
