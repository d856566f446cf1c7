//! Opus over a lossy link: `netjam send --codec opus --sine 440` through `netjam impair`
//! (5 % loss, seeded) into `netjam recv`.
//!
//! * Without redundancy the decoder conceals every lost 2.5 ms packet, and only those: its
//!   concealed frames are the receiver's lost packets × 120, give or take the packets at the
//!   edges of the run. Its concealment continues the tone, so no 2.5 ms window of what was
//!   played falls silent.
//! * With `--redundancy 1` (RFC 2198) on the same link, each packet carries the one before,
//!   so isolated losses are rebuilt and decoded rather than concealed: the decoder conceals
//!   only the bursts of two or more.
//!
//! The receiver stops while the sender is still sending, so nothing after the stream's end
//! is concealed and counted.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::signal::{dominant_hz, quietest, read_channel0, sliding_rms, RATE};
use common::{read_json, start_recv, Proc, BIN};

const TONE_HZ: f64 = 440.0;
/// netjam's test tone peaks at 0.5.
const TONE_RMS: f64 = 0.5 / std::f64::consts::SQRT_2;
/// Frames of one 2.5 ms Opus packet.
const PACKET: f64 = 120.0;
const LOSS_PCT: &str = "5";
const SEED: &str = "7";
/// Seconds the receiver plays, the sender sends and the link runs.
const RECV_S: &str = "1.5";
const SEND_S: &str = "2.2";
const IMPAIR_S: &str = "2.8";

fn tmp(name: &str) -> PathBuf {
    common::tmp("opus-loss", name)
}

/// What one run measured.
#[derive(Debug)]
struct Run {
    /// Packets the receiver counted lost (RFC 3550), and the link dropped on the way up.
    lost: f64,
    link_lost: f64,
    received: f64,
    decoded: f64,
    concealed_frames: f64,
    concealment_events: f64,
    late: f64,
    /// The 440 Hz tone: how long it played, its frequency, and the quietest 2.5 ms of it.
    voiced_ms: f64,
    hz: f64,
    quietest_rms: f64,
    quietest_at_ms: f64,
    /// The longest stretch, and the share of the time, in which the 2.5 ms RMS stayed
    /// below a third of the tone's (about 2.5 ms more than the run of window starts).
    longest_quiet_ms: f64,
    quiet_share: f64,
    /// Everything the programs printed, for failure messages.
    said: String,
    /// The played WAV and the statistics, removed when the test passes.
    files: [PathBuf; 2],
}

/// Send the tone through a 5 % loss link into a receiver and measure what it played.
fn run(tag: &str, redundancy: &str) -> Run {
    let output = tmp(&format!("{tag}.wav"));
    let stats = tmp(&format!("{tag}.json"));
    let (mut recv, recv_addr) = start_recv(&[
        "--buffer",
        "30ms",
        "--duration",
        RECV_S,
        "--output",
        output.to_str().expect("path"),
        "--stats-json",
        stats.to_str().expect("path"),
    ]);
    let (mut impair, link_addr) = common::impair(
        recv_addr,
        &["--loss", LOSS_PCT, "--seed", SEED, "--duration", IMPAIR_S],
    );
    let mut send = Proc::spawn_lines(
        Command::new(BIN)
            .args([
                "send",
                "--to",
                &link_addr.to_string(),
                "--codec",
                "opus",
                "--sine",
                "440",
                "--channels",
                "2",
                "--redundancy",
                redundancy,
                "--duration",
                SEND_S,
            ])
            .stdout(Stdio::null()),
        "netjam send",
    );
    // The sender runs longest but for the link; the receiver stops before it.
    let (send_status, send_said) = send.finish(Duration::from_secs(10));
    let (recv_status, recv_said) = recv.finish(Duration::from_secs(5));
    let (impair_status, impair_said) = impair.finish(Duration::from_secs(5));
    let said = format!("recv: {recv_said:?}\nsend: {send_said:?}\nimpair: {impair_said:?}");
    assert!(
        recv_status.success() && send_status.success() && impair_status.success(),
        "{tag}: a program failed\n{said}"
    );
    // impair's last line: "netjam impair: {json counters}".
    let link: serde_json::Value = common::impair_counters(&impair_said)
        .unwrap_or_else(|| panic!("{tag}: no counters from impair\n{said}"));
    let report = read_json(&stats);
    let s = &report["stats"];
    let d = &s["decoder"];
    let n = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let said = format!("{said}\nstats: {s}\nlink: {link}");
    assert_eq!(s["format"]["codec"], "opus", "{tag}\n{said}");
    assert_eq!(s["malformed"], 0, "{tag}\n{said}");
    assert_eq!(d["decode_errors"], 0, "{tag}\n{said}");

    let x = read_channel0(&output);
    // From 50 ms after the tone starts (the first packet may be among the lost, and the
    // encoder settles) to the end: the receiver stops while the tone is still sent.
    let first = x.iter().position(|v| v.abs() > 0.1).unwrap_or(x.len());
    let body = &x[(first + 2400).min(x.len())..];
    let rms = sliding_rms(body);
    let (quietest_rms, at) = quietest(&rms);
    let quiet = |r: &f64| *r < TONE_RMS / 3.0;
    let (mut longest, mut current) = (0usize, 0usize);
    for r in &rms {
        current = if quiet(r) { current + 1 } else { 0 };
        longest = longest.max(current);
    }
    let quiet_share = rms.iter().filter(|r| quiet(r)).count() as f64 / rms.len().max(1) as f64;
    let run = Run {
        lost: n(&s["lost"]),
        link_lost: n(&link["up"]["lost"]),
        received: n(&s["received"]),
        decoded: n(&d["decoded_packets"]),
        concealed_frames: n(&d["concealed_frames"]),
        concealment_events: n(&d["concealment_events"]),
        late: n(&d["late_packets"]),
        voiced_ms: (x.len() - first) as f64 / RATE * 1000.0,
        hz: dominant_hz(body),
        quietest_rms,
        quietest_at_ms: (first + 2400 + at) as f64 / RATE * 1000.0,
        longest_quiet_ms: if longest > 0 {
            longest as f64 / RATE * 1000.0 + 2.5
        } else {
            0.0
        },
        quiet_share,
        said,
        files: [output, stats],
    };
    eprintln!(
        "{tag}: lost {} (link dropped {}), received {}, decoded {}, concealed {} frames in {} gaps, late {}; tone {:.0} ms at {} Hz, quietest 2.5 ms RMS {:.3} at {:.1} ms, below a third of the tone for at most {:.1} ms, {:.2} % of the time",
        run.lost,
        run.link_lost,
        run.received,
        run.decoded,
        run.concealed_frames,
        run.concealment_events,
        run.late,
        run.voiced_ms,
        run.hz,
        run.quietest_rms,
        run.quietest_at_ms,
        run.longest_quiet_ms,
        100.0 * run.quiet_share
    );
    run
}

/// Checks both runs share: the receiver saw the link's losses, and the tone played to the
/// end at 440 Hz.
fn check_common(tag: &str, r: &Run) {
    let said = &r.said;
    // 1.5 s of 2.5 ms packets at 5 % loss: about 30 lost.
    assert!(r.lost >= 10.0, "{tag}: only {} packets lost\n{said}", r.lost);
    assert!(
        r.lost <= r.link_lost,
        "{tag}: the receiver counts {} lost, more than the link's {}\n{said}",
        r.lost,
        r.link_lost
    );
    assert!(
        r.voiced_ms >= 1400.0,
        "{tag}: {:.0} ms of tone\n{said}",
        r.voiced_ms
    );
    assert!(
        (r.hz - TONE_HZ).abs() <= 5.0,
        "{tag}: dominant {} Hz\n{said}",
        r.hz
    );
}

#[test]
fn lost_opus_packets_are_concealed_by_the_decoder_and_redundancy_rebuilds_them() {
    // Both runs at once (each is mostly waiting), to keep the test short.
    let (plain, red) = std::thread::scope(|s| {
        let plain = s.spawn(|| run("plain", "0"));
        let red = s.spawn(|| run("red1", "1"));
        (
            plain.join().expect("the plain run"),
            red.join().expect("the redundant run"),
        )
    });

    check_common("no redundancy", &plain);
    let said = &plain.said;
    // Each lost packet was concealed as its 120 frames, and nothing else was -- except a
    // packet that came after its time (on a busy machine a thread of the sender, the link
    // or the receiver can be held up past the buffer), which is counted as late. A loss
    // just before the receiver stopped may not have been played yet, and the first packets
    // may be lost before the stream started.
    let concealed_packets = plain.concealed_frames / PACKET;
    assert_eq!(plain.concealed_frames % PACKET, 0.0, "{said}");
    assert!(
        (plain.lost - 3.0..=plain.lost + plain.late + 1.0).contains(&concealed_packets),
        "concealed {concealed_packets} packets' worth for {} lost and {} late\n{said}",
        plain.lost,
        plain.late
    );
    assert!(
        plain.concealment_events > 0.0 && plain.concealment_events <= plain.lost + plain.late,
        "{} concealment events for {} lost\n{said}",
        plain.concealment_events,
        plain.lost
    );

    // The concealment continues the tone: no 2.5 ms anywhere is near silence (34 dB under
    // the tone; a lost packet played as silence, or not concealed, is far below that), and
    // the tone is never much quieter for longer than a few packets. libopus (1.3) fades its
    // concealment of a loss that comes one packet after another one, to about -20 dB for
    // 5-10 ms, so short dips below a third of the tone are allowed, rarely.
    assert!(
        plain.quietest_rms >= TONE_RMS / 50.0,
        "a silent gap: 2.5 ms of RMS {:.4} at {:.1} ms\n{said}",
        plain.quietest_rms,
        plain.quietest_at_ms
    );
    assert!(
        plain.longest_quiet_ms <= 20.0 && plain.quiet_share <= 0.02,
        "the tone was below a third of its level for {:.1} ms at a stretch, {:.2} % of the time\n{said}",
        plain.longest_quiet_ms,
        100.0 * plain.quiet_share
    );

    check_common("redundancy 1", &red);
    let said = &red.said;
    // With one redundant copy only bursts of two or more losses are concealed: at 5 %
    // independent loss, about one loss in twenty is followed by another. A packet that
    // came after its time is concealed whatever it carries (on a loaded machine: 7 of 27
    // lost concealed, 4 of them late).
    assert!(
        red.concealed_frames / PACKET <= red.lost / 4.0 + red.late,
        "with redundancy the decoder still concealed {} packets' worth of {} lost and {} late\n{said}",
        red.concealed_frames / PACKET,
        red.lost,
        red.late
    );
    // Late packets are concealed whatever redundancy carries: on a loaded machine the link
    // emulator once slipped 60 ms, and 20 late packets' 2,400 frames made most of what the
    // run with redundancy concealed. What is left is what loss cost.
    let red_for_loss = (red.concealed_frames - red.late * PACKET).max(0.0);
    assert!(
        red_for_loss * 3.0 <= plain.concealed_frames,
        "redundancy concealed {} frames ({red_for_loss} beyond its {} late packets), without {}\n{said}",
        red.concealed_frames,
        red.late,
        plain.concealed_frames
    );
    // Rebuilt packets are decoded, and what is left to conceal is mostly single packets in
    // a stream that was whole before, which the decoder continues well.
    assert!(
        red.quietest_rms >= TONE_RMS / 4.0,
        "with redundancy, 2.5 ms of RMS {:.3} at {:.1} ms\n{said}",
        red.quietest_rms,
        red.quietest_at_ms
    );
    // The rebuilt packets were decoded: the decoder saw about as many packets as were sent.
    let rebuilt = red.decoded - red.received;
    assert!(
        rebuilt >= red.lost - red.concealed_frames / PACKET - 3.0,
        "{} packets rebuilt from redundancy of {} lost\n{said}",
        rebuilt,
        red.lost
    );
    for f in plain.files.iter().chain(&red.files) {
        let _ = std::fs::remove_file(f);
    }
}
