//! The shared beat between real processes on loopback: two `netjam jam --ensemble`
//! players (each other's peer) render what they hear, with the ensemble's click mixed
//! in, to `--output` files; a third process changes the tempo on the next bar.
//!
//! Each player says where the first frame it heard lies on the machine's monotonic
//! clock, which every process here shares, so a click's onset in a file is a true time.
//! The ensemble time was started from that same clock by its first member, so the click
//! must also land on the beat grid (beat k at k × 0.5 s at 120 BPM from ensemble time 0).
//! The bounds (2 ms) hold under load: the files are paced by the nominal period times,
//! so only the clocks' agreement and the frame rounding move a click.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ensemble_support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ensemble_support::{field, free_port, nearest, onset_times, spawn, tmp, Band, Proc, NETJAM};

const MS: f64 = 1e6;
const BOUND_NS: f64 = 2.0 * MS;

fn player(band: &Band, listen: u16, peer: u16, out: &Path) -> Proc {
    let mut c = Command::new(NETJAM);
    c.args(["jam", "--silence", "--duration", "16"])
        .args(["--listen", &format!("127.0.0.1:{listen}")])
        .args(["--peer", &format!("127.0.0.1:{peer}")])
        .args(["--output", out.to_str().unwrap()])
        .args([
            "--ensemble",
            &band.name,
            "--ensemble-local",
            "--ensemble-port",
            &band.port,
        ])
        .args(["--tempo", "120"]);
    spawn(&mut c)
}

#[test]
fn two_players_click_on_one_beat_and_a_tempo_change_lands_on_the_same_bar() {
    let band = Band::new(0);
    let (pa, pb) = (free_port(), free_port());
    let (wa, wb) = (tmp("beat", "a.wav"), tmp("beat", "b.wav"));
    let mut a = player(&band, pa, pb, &wa);
    let mut b = player(&band, pb, pa, &wb);
    let within = Duration::from_secs(15);
    for p in [&a, &b] {
        p.wait_err("clock lock", within, |l| l.contains("clock locked"));
        p.wait_err("the tempo", within, |l| l.contains(": 120 BPM from beat 0"));
    }
    // A third member changes the tempo on the next bar of four.
    let out = Command::new(NETJAM)
        .args([
            "ensemble", "tempo", &band.name, "90", "--bar", "4", "--wait", "10",
        ])
        .args(band.net())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "netjam ensemble tempo: {said} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let change_beat: f64 = field(&said, "beat=").parse().unwrap();
    let from = field(&said, "from=");
    let (s, ns) = from.split_once('.').unwrap();
    let change_ns = s.parse::<f64>().unwrap() * 1e9 + ns.parse::<f64>().unwrap();
    assert_eq!(change_beat % 4.0, 0.0, "{said}");
    for p in [&a, &b] {
        p.wait_err("the change", within, |l| {
            l.contains(&format!(": 90 BPM from beat {change_beat} "))
        });
    }
    let start = Instant::now();
    for p in [&mut a, &mut b] {
        while p.child.try_wait().unwrap().is_none() {
            assert!(start.elapsed() < Duration::from_secs(30), "a player did not stop");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let (ta, tb) = (onset_times(&a, &wa), onset_times(&b, &wb));
    let change_s = change_ns / 1e9;
    println!(
        "clicks: {} and {} onsets; tempo change to 90 BPM on beat {change_beat} at ensemble {change_s:.3} s",
        ta.len(),
        tb.len()
    );
    // Both clicking: the later first onset to the earlier last one.
    let lo = ta[0].max(tb[0]);
    let hi = ta.last().unwrap().min(*tb.last().unwrap());
    let mut deltas = Vec::new();
    for &t in ta.iter().filter(|t| **t >= lo - 1e6 && **t <= hi + 1e6) {
        let d = (nearest(&tb, t) - t).abs();
        assert!(
            d < BOUND_NS,
            "a click at {t} ns has none within 2 ms on the other player ({d} ns)"
        );
        deltas.push(d);
    }
    assert!(
        deltas.len() >= 8,
        "only {} clicks in common: {ta:?} {tb:?}",
        deltas.len()
    );
    deltas.sort_by(f64::total_cmp);
    println!(
        "{} clicks heard by both players: onsets apart median {:.3} ms, max {:.3} ms",
        deltas.len(),
        deltas[deltas.len() / 2] / MS,
        deltas.last().unwrap() / MS
    );
    for (who, t) in [("a", &ta), ("b", &tb)] {
        // Before the change: on the 120 BPM grid from ensemble time 0.
        for &x in t.iter().filter(|x| **x < change_ns - 1e6) {
            let off = (x + 250.0 * MS).rem_euclid(500.0 * MS) - 250.0 * MS;
            assert!(
                off.abs() < BOUND_NS,
                "player {who}: a click {:.3} ms off the beat",
                off / MS
            );
        }
        // The change lands on its beat, and the beats after it are 2/3 s apart.
        let after: Vec<f64> = t.iter().copied().filter(|x| *x >= change_ns - BOUND_NS).collect();
        assert!(
            after.len() >= 3,
            "player {who}: {} clicks after the change",
            after.len()
        );
        assert!(
            (after[0] - change_ns).abs() < BOUND_NS,
            "player {who}: the first 90 BPM click is {:.3} ms from its beat",
            (after[0] - change_ns) / MS
        );
        for w in after.windows(2) {
            assert!(
                (w[1] - w[0] - 666.667 * MS).abs() < BOUND_NS,
                "player {who}: {after:?}"
            );
        }
        let before = t.iter().copied().rfind(|x| *x < change_ns - 1e6).unwrap();
        assert!((after[0] - before - 500.0 * MS).abs() < BOUND_NS, "player {who}");
    }
    let _ = std::fs::remove_file(&wa);
    let _ = std::fs::remove_file(&wb);
}
