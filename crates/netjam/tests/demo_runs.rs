//! The README's first command: `netjam demo` runs to the end, writes what the far end heard
//! (music, not silence) and a statistics file whose figures hold together.

mod common;

use std::process::{Command, Stdio};

use common::signal::read_wav;
use common::{read_json, tmp_dir, BIN};

#[test]
fn demo_plays_music_across_the_emulated_link_and_reports_its_budget() {
    let dir = tmp_dir("demo");
    let (wav, json) = (dir.join("demo.wav"), dir.join("demo.json"));
    let seconds = 3.0;
    let out = Command::new(BIN)
        .args(["demo", "--duration", &seconds.to_string()])
        .args(["--output", wav.to_str().expect("path")])
        .args(["--stats-json", json.to_str().expect("path")])
        .stdin(Stdio::null())
        .output()
        .expect("netjam demo");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "netjam demo failed:\n{said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("Latency budget"), "{said}");

    // What the far end heard: about the duration asked, mostly music.
    let audio = read_wav(&wav);
    let left = &audio.channels[0];
    let heard_s = left.len() as f64 / f64::from(audio.rate);
    assert!(
        (seconds * 0.8..=seconds + 1.0).contains(&heard_s),
        "{heard_s:.2} s heard"
    );
    let block = audio.rate as usize / 100;
    let blocks: Vec<f64> = left
        .chunks_exact(block)
        .map(|b| (b.iter().map(|x| x * x).sum::<f64>() / block as f64).sqrt())
        .collect();
    // -60 dBFS: the synthesised music is far louder, silence and concealed gaps are not.
    let loud = blocks.iter().filter(|r| **r > 1e-3).count();
    assert!(
        loud * 10 >= blocks.len() * 7,
        "only {loud} of {} 10 ms blocks carry sound",
        blocks.len()
    );

    // The statistics hold together.
    let r = read_json(&json);
    let sent = r["sender"]["packets"].as_u64().expect("packets sent");
    let received = r["receiver"]["received"].as_u64().expect("packets received");
    let expected = (seconds * 48_000.0 / 64.0) as u64;
    assert!(
        (expected * 9 / 10..=expected * 12 / 10).contains(&sent),
        "sent {sent}, expected about {expected}"
    );
    // The link loses a few per cent in bursts; redundancy rebuilds most, not counted here.
    assert!(
        received <= sent && received >= sent * 85 / 100,
        "sent {sent}, received {received}"
    );
    let budget = &r["budget"];
    let total = budget["total_ms"].as_f64().expect("total");
    let network = budget["network_ms"].as_f64().expect("network");
    let packetization = budget["packetization_ms"].as_f64().expect("packetization");
    let jitter_buffer = budget["jitter_buffer_ms"].as_f64().expect("jitter buffer");
    assert!((15.0..40.0).contains(&network), "network {network} ms");
    assert!((packetization - 64.0 / 48.0).abs() < 0.01, "{packetization}");
    assert!(
        (0.0..20.0).contains(&jitter_buffer),
        "jitter buffer {jitter_buffer} ms"
    );
    assert!(
        (total - (network + packetization + jitter_buffer)).abs() < 0.01,
        "{budget}"
    );
    let series = r["series"].as_array().expect("series");
    assert!(series.len() >= 10, "{} snapshots", series.len());
    eprintln!(
        "demo: sent {sent}, received {received}, budget {total:.2} ms (network {network:.2}, jitter buffer {jitter_buffer:.2}), {loud}/{} loud blocks",
        blocks.len()
    );
}
