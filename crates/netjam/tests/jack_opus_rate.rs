//! `netjam jam --jack --codec opus` on a JACK server at 44.1 kHz: the jam runs Opus at
//! 48 kHz between two edge resamplers, hears its own stream back through `netjam reflect`,
//! and counts both edges in the codec delay of its latency budget.

mod common;

use std::process::Command;
use std::time::Duration;

use common::jackd::Jackd;
use common::{reflect, tmp, Proc, BIN};

#[test]
fn opus_on_a_44_1_khz_jack_server_resamples_at_the_edges() {
    let server = Jackd::start_at_rate("netjam-test-rate", 64, 44_100);
    let (_reflect, reflector) = reflect("10");
    let client = format!("njrate{}", std::process::id());
    let (stats, log) = (tmp("jackrate", "stats.json"), tmp("jackrate", "jam.log"));
    let mut jam = Proc::spawn(
        server
            .client(&mut Command::new(BIN))
            .args(["jam", "--jack", "--jack-name", &client, "--no-connect"])
            .args(["--peer", &reflector.to_string(), "--listen", "127.0.0.1:0"])
            .args(["--codec", "opus", "--channels", "2", "--duration", "3"])
            .args(["--stats-json", stats.to_str().expect("path")])
            .stderr(std::fs::File::create(&log).expect("log")),
        "netjam jam",
    );
    let status = jam.wait_until(Duration::from_secs(20));
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.is_some_and(|s| s.success()), "jam failed:\n{said}");
    let key = "resampling the device's 44100 Hz to and from Opus's 48000 Hz adds ";
    let line = said
        .lines()
        .find(|l| l.contains(key))
        .unwrap_or_else(|| panic!("{said}"));
    let ms: Vec<f64> = line[line.find(key).expect("key") + key.len()..]
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(ms.len(), 2, "{line}");
    assert!(ms.iter().all(|&m| m > 0.0 && m < 10.0), "{line}");
    assert!(!said.contains("ran short"), "{said}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&stats).expect("stats")).expect("json");
    let heard = &report["stats"]["heard"];
    assert_eq!(heard["format"]["codec"], "opus", "{report}");
    assert_eq!(heard["format"]["rate"], 48_000, "{report}");
    // 3 s of 2.5 ms packets are 1200; the reflected stream arrives once jam is up.
    let received = heard["received"].as_u64().unwrap_or(0);
    assert!(received > 600, "heard {received} packets\n{said}");
    assert_eq!(heard["undecodable"], 0, "{report}");
    // Opus's 2.5 ms look-ahead plus both edges (as printed, to 0.01 ms).
    let codec_ms = report["stages"]["codec_ms"].as_f64().expect("codec_ms");
    assert!(
        codec_ms >= 2.5 + ms[0] + ms[1] - 0.02,
        "codec {codec_ms} ms, edges {ms:?}"
    );
    eprintln!(
        "44.1 kHz JACK with Opus: edges {ms:?} ms, codec delay {codec_ms:.2} ms, heard {received} packets"
    );
}
