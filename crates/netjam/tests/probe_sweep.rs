//! `netjam sweep` end to end on loopback through `impair`: it measures every grid point,
//! recommends a packetization with a reason, and writes JSON and an SVG plot.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Command;

use common::BIN;

#[test]
fn sweep_recommends_and_writes_json_and_plot() {
    let (reflect, reflector) = common::reflect("15");
    let (impair, target) = common::impair(reflector, &["--delay", "5", "--duration", "15"]);
    let dir = std::env::temp_dir();
    let json = dir.join(format!("netjam-sweep-{}.json", std::process::id()));
    let svg = dir.join(format!("netjam-sweep-{}.svg", std::process::id()));
    let out = Command::new(BIN)
        .args(["sweep", &target.to_string(), "--codec", "l24", "--channels", "1"])
        .args(["--seconds-per-point", "0.25", "--json", json.to_str().unwrap()])
        .args(["--plot", svg.to_str().unwrap()])
        .output()
        .unwrap();
    drop((reflect, impair));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("recommendation: use "), "{text}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 8, "6 frame counts and 2 extra rates");
    let p128 = points.iter().find(|p| p["point"]["frames"] == 128).unwrap();
    assert_eq!(p128["point"]["size_bytes"], 12 + 8 + 128 * 3);
    let best = &v["recommendation"]["best"];
    let expected = best["expected_ms"].as_f64().unwrap();
    // 5 ms each way on loopback: one way plus at most a 10.7 ms packet and a small buffer.
    assert!((5.0..20.0).contains(&expected), "{expected}\n{text}");
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(plot.starts_with("<svg") && plot.contains("polyline"));
    let _ = std::fs::remove_file(&json);
    let _ = std::fs::remove_file(&svg);
}
