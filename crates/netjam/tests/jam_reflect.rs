//! `netjam jam` against `netjam reflect` on loopback: the player hears their own stream
//! come back, and the round trip is measured in-band from the click track.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::signal::read_wav;
use common::{free_udp_port, reflect, tmp_dir, BIN};

#[test]
fn jam_against_reflect_hears_its_own_round_trip() {
    let dir = tmp_dir("jam");
    let (wav, json) = (dir.join("heard.wav"), dir.join("jam.json"));
    let (reflect, reflector) = reflect("6");
    // The click measure needs the first click back. The players of the test alongside start
    // at the same time as this one; a little later, the machine is no longer busy starting
    // them and the first packets leave on time.
    std::thread::sleep(Duration::from_millis(200));
    let status = Command::new(BIN)
        .args(["jam", "--peer", &reflector.to_string(), "--listen", "127.0.0.1:0"])
        .args([
            // 100 a minute: the clicks after the first miss the meter's bursts (once a
            // second), which a click's 1 kHz edges can hide below the meter's threshold.
            "--clicks",
            "100",
            "--duration",
            "3",
            "--output",
            wav.to_str().expect("path"),
        ])
        .args([
            "--stats-json",
            json.to_str().expect("path"),
            "--measure-roundtrip",
        ])
        .stderr(Stdio::null())
        .status()
        .expect("netjam jam");
    drop(reflect);
    assert!(status.success());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    let sent = report["stats"]["sent"]["packets"].as_u64().expect("sent");
    let heard = report["stats"]["heard"]["received"].as_u64().expect("heard");
    assert!(
        sent > 2100 && heard >= sent * 95 / 100,
        "sent {sent}, heard {heard}"
    );
    assert_eq!(report["stats"]["heard"]["stream_starts"], 1);
    // RTCP is reflected too: the sender's reports come back and give the round trip.
    let rtt = report["stats"]["sent"]["rtt_ms"]
        .as_f64()
        .expect("RTT measured through RTCP");
    assert!(rtt < 50.0, "rtt {rtt} ms");
    // The first click leaves at input frame 0; output frame 0 is the same callback, so the
    // first heard click's onset is the mouth-to-ear round trip.
    let samples: Vec<i32> = hound::WavReader::open(&wav)
        .expect("wav")
        .samples::<i32>()
        .map(|s| s.expect("sample"))
        .collect();
    let onset = samples
        .iter()
        .position(|s| s.abs() > 3000)
        .expect("a click was heard")
        / 2;
    let rtt_ms = onset as f64 / 48.0;
    // Loopback: packetization (1.33 ms) + buffer (a period plus target) + the wire (~0).
    // Under load the adaptive buffer grows, but on loopback it stays within a few periods.
    assert!((1.3..12.0).contains(&rtt_ms), "in-band round trip {rtt_ms:.2} ms");
    // The meter measures the same path from bursts a second apart, the last of them near
    // the end: a round trip of this loopback path too, but not the first click's, since the
    // buffer adapts in between (1.69 ms at the first click and 5.58 ms at the last burst in
    // one CI run on a stalling VM). The stages below tie it to its own moment.
    let meter_ms = report["stats"]["round_trip_ms"].as_f64().unwrap_or_else(|| {
        panic!(
            "no round trip measured in band: bursts found {}, lost {}; {}",
            report["stats"]["round_trip_found"],
            report["stats"]["round_trip_lost"],
            report["stats"]["heard"]["jitter_buffer"]
        )
    });
    assert!(
        (1.3..12.0).contains(&meter_ms),
        "meter {meter_ms:.2} ms (click {rtt_ms:.2} ms)"
    );
    eprintln!("in-band round trip through netjam reflect: click {rtt_ms:.2} ms ({onset} frames), meter {meter_ms:.2} ms");
    // Where the time goes, stage by stage, next to the measured round trip.
    let stages = &report["stages"];
    assert_eq!(stages["round_trip_ms"].as_f64(), Some(meter_ms), "{stages}");
    let packet_ms = stages["packet_ms"].as_f64().expect("packet_ms");
    assert!((packet_ms - 64.0 / 48.0).abs() < 1e-3, "{stages}");
    assert_eq!(stages["codec_ms"].as_f64(), Some(0.0), "{stages}");
    assert!(stages["network_ms"].as_f64().is_some(), "{stages}");
    assert!(
        stages["jitter_buffer_ms"].as_f64().is_some_and(|j| j > 0.0),
        "{stages}"
    );
    assert!(
        stages["device_ms"].is_null(),
        "no device with a paced source: {stages}"
    );
    // The stages add up to what was measured in band: the packet the sender waits for, the
    // network both ways and the buffer's wait (arrival to playout, its period included) for
    // the packet that brought the burst back, so a buffer that grew or shrank elsewhere in
    // the run does not enter the sum.
    // The in-band meter sees capture and playout of one callback at the same media time, so
    // the sum may exceed it by up to the period the two share; never by more. It may fall
    // short by a late wake of this player's audio thread: a burst that leaves late is late
    // in band, and no stage is the host's (the report's worst wake bounds it).
    let sum: f64 = ["packet_ms", "codec_ms", "network_ms", "jitter_buffer_ms"]
        .iter()
        .map(|k| stages[*k].as_f64().unwrap_or(0.0))
        .sum();
    let late_ms = report["periods"]["wake_late_max_us"]
        .as_f64()
        .expect("wake lateness")
        / 1e3;
    eprintln!(
        "stages add up to {sum:.2} ms against {meter_ms:.2} ms measured in band (worst wake {late_ms:.2} ms late)"
    );
    let period_ms = 64.0 / 48.0;
    assert!(
        sum >= meter_ms - 0.5 - late_ms && sum <= meter_ms + period_ms + 0.5,
        "stages {sum:.2} ms vs in band {meter_ms:.2} ms, worst wake {late_ms:.2} ms late: {stages}"
    );
}

/// Dominant frequency of the first channel of a WAV over its second half, from zero crossings.
fn frequency(path: &std::path::Path) -> f64 {
    let audio = read_wav(path);
    let mono = &audio.channels[0];
    let half = &mono[mono.len() / 2..];
    let crossings = half.windows(2).filter(|w| w[0] < 0.0 && w[1] >= 0.0).count();
    crossings as f64 * f64::from(audio.rate) / half.len() as f64
}

#[test]
fn two_players_hear_each_other_one_on_opus_the_other_on_pcm() {
    let dir = tmp_dir("duo");
    let (pa, pb) = (free_udp_port(), free_udp_port());
    let player = |listen: u16, peer: u16, tone: &str, codec: &str, heard: &std::path::Path| {
        Command::new(BIN)
            .args(["jam", "--listen", &format!("127.0.0.1:{listen}")])
            .args(["--peer", &format!("127.0.0.1:{peer}")])
            .args(["--sine", tone, "--channels", "2", "--codec", codec])
            .args(["--duration", "3", "--output", heard.to_str().expect("path")])
            .stderr(Stdio::piped())
            .spawn()
            .expect("netjam jam")
    };
    let (heard_a, heard_b) = (dir.join("a.wav"), dir.join("b.wav"));
    let a = player(pa, pb, "440", "opus", &heard_a);
    let b = player(pb, pa, "660", "l24", &heard_b);
    let (a, b) = (a.wait_with_output().expect("a"), b.wait_with_output().expect("b"));
    let (ea, eb) = (
        String::from_utf8_lossy(&a.stderr),
        String::from_utf8_lossy(&b.stderr),
    );
    assert!(a.status.success(), "{ea}");
    assert!(b.status.success(), "{eb}");
    // Each hears the other's tone: A (sending Opus) hears B's 660 Hz in L24, B hears A's
    // 440 Hz through Opus.
    let (fa, fb) = (frequency(&heard_a), frequency(&heard_b));
    assert!((fa - 660.0).abs() < 5.0, "A heard {fa:.1} Hz:\n{ea}");
    assert!((fb - 440.0).abs() < 5.0, "B heard {fb:.1} Hz:\n{eb}");
    let _ = std::fs::remove_dir_all(&dir);
}
