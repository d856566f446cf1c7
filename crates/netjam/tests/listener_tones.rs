//! Two players jam over loopback, each sending a steady tone (440 Hz and 660 Hz), and what
//! each heard is judged the way a listener would (netjam_engine::listen): the other's tone
//! at the level it was sent, in tune, without glitches, and none of their own tone.
//!
//! It asserts what holds on a loaded 2-core machine today and prints the rest: the worst
//! pitch error and the glitch windows of each player's output.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{free_udp_port, tmp_dir, Proc, BIN};
use netjam::endpoint::wav::read_first_channel;
use netjam_engine::listen::{listen, ListenSummary, Tones};

/// Seconds each player plays.
const SECONDS: u32 = 6;
/// The start left out: the stream's first packets and the jitter buffer settling.
const SKIP_SECONDS: f64 = 1.5;
/// `netjam jam --sine` plays a sine of amplitude 0.5: -6 dB relative to full scale.
const SINE_DB: f64 = -6.02;
/// The worst pitch error allowed in a window without a glitch, in cents. Playout that gave
/// latency back by playing 0.5 % faster read 8.7 cents here; it now cuts and waits by whole
/// periods and resamples within 0.87 cents of the clock (quiet machine: 0 to 1.3 cents).
/// A window that holds a glitch (a late packet concealed on a loaded machine) has no pitch
/// worth reading and is counted, not judged, here.
const MAX_CENTS: f64 = 3.0;

/// A player at `rate` sending a sine of `hz` from `listen` to `peer`, writing what it hears
/// to `output` and what it says to `log`.
fn player(hz: &str, rate: u32, listen: u16, peer: u16, output: &Path, log: &Path) -> Proc {
    player_with(&[], hz, rate, listen, peer, output, log)
}

/// [`player`] with `extra` flags.
fn player_with(
    extra: &[&str],
    hz: &str,
    rate: u32,
    listen: u16,
    peer: u16,
    output: &Path,
    log: &Path,
) -> Proc {
    let log = std::fs::File::create(log).expect("log file");
    Proc::spawn(
        Command::new(BIN)
            .args(["jam", "--peer", &format!("127.0.0.1:{peer}")])
            .args(extra)
            .args(["--listen", &format!("127.0.0.1:{listen}"), "--sine", hz])
            .args(["--rate", &rate.to_string()])
            .args(["--duration", &SECONDS.to_string(), "--output"])
            .arg(output)
            .stdout(Stdio::null())
            .stderr(log),
        "netjam jam",
    )
}

/// What `output` holds of `heard` (the other player's tone) and `own`.
/// Also the worst pitch error over the windows without a glitch.
fn judge(output: &Path, heard: f64, own: f64) -> (ListenSummary, f64, usize, u32) {
    let (samples, rate) =
        read_first_channel(output).unwrap_or_else(|e| panic!("{}: {e:#}", output.display()));
    let tones = Tones::present(&[heard]).absent(&[own]).skip(SKIP_SECONDS);
    let listening = listen(&samples, rate, &tones).unwrap_or_else(|e| panic!("{}: {e}", output.display()));
    let clean_cents = listening.worst_clean_cents().abs();
    (listening.summary, clean_cents, samples.len(), rate)
}

#[test]
fn two_players_hear_each_others_tone_in_tune_and_not_their_own() {
    two_players(48_000, 48_000);
}

/// A player at 44.1 kHz and one at 48 kHz: each hears the other converted to their own
/// rate, in tune, and is told so in one line.
#[test]
fn players_at_44_1_and_48_khz_hear_each_other_converted() {
    let logs = two_players(44_100, 48_000);
    for (log, other, mine) in [(&logs[0], 48_000, 44_100), (&logs[1], 44_100, 48_000)] {
        let want = format!("the other player sends at {other} Hz: converted to your {mine} Hz");
        assert_eq!(log.matches(&want).count(), 1, "said once: {want:?} in\n{log}");
    }
}

/// A two-player jam is a room of one other member: `--monitor` puts your own tone in your
/// ears beside the other player's, and `--master-gain` turns the whole mix down (here by
/// 6 dB, so that the two tones' sum stays under the limiter's knee and neither moves).
#[test]
fn a_player_hears_themself_with_monitor_and_the_mix_follows_master_gain() {
    let dir = tmp_dir("listener-tones-monitor");
    let (a_out, b_out) = (dir.join("a.wav"), dir.join("b.wav"));
    let (a_log, b_log) = (dir.join("a.log"), dir.join("b.log"));
    let (a_port, b_port) = (free_udp_port(), free_udp_port());
    let a_flags = ["--monitor", "--master-gain", "-6"];
    let mut a = player_with(&a_flags, "440", 48_000, a_port, b_port, &a_out, &a_log);
    let mut b = player("660", 48_000, b_port, a_port, &b_out, &b_log);
    let limit = Duration::from_secs(u64::from(SECONDS) + 20);
    assert!(a.wait_for(limit).success(), "player a failed");
    assert!(b.wait_for(limit).success(), "player b failed");
    let (samples, rate) = read_first_channel(&a_out).unwrap_or_else(|e| panic!("{}: {e:#}", a_out.display()));
    let tones = Tones::present(&[660.0, 440.0]).skip(SKIP_SECONDS);
    let a_heard = listen(&samples, rate, &tones).expect("listen").summary;
    eprintln!("player a (--monitor --master-gain -6) heard: {a_heard}");
    for (i, hz) in [(0, 660), (1, 440)] {
        let level = a_heard.present[i].median_db;
        assert!(
            (level - (SINE_DB - 6.0)).abs() < 1.0,
            "player a heard {hz} Hz at {level:.1} dB: {a_heard}"
        );
    }
    // The other player's ears are their own: only a's tone, at the level it was sent.
    let (b_heard, _, _, _) = judge(&b_out, 440.0, 660.0);
    eprintln!("player b heard: {b_heard}");
    assert!((b_heard.present[0].median_db - SINE_DB).abs() < 1.0, "{b_heard}");
    assert!(b_heard.loudest_absent_db().unwrap_or(0.0) < -30.0, "{b_heard}");
}

/// Two players at `a_rate` and `b_rate`, judged; returns what each said.
fn two_players(a_rate: u32, b_rate: u32) -> [String; 2] {
    let dir = tmp_dir(&format!("listener-tones-{a_rate}-{b_rate}"));
    let (a_out, b_out) = (dir.join("a.wav"), dir.join("b.wav"));
    let (a_log, b_log) = (dir.join("a.log"), dir.join("b.log"));
    let (a_port, b_port) = (free_udp_port(), free_udp_port());
    let mut a = player("440", a_rate, a_port, b_port, &a_out, &a_log);
    let mut b = player("660", b_rate, b_port, a_port, &b_out, &b_log);
    let limit = Duration::from_secs(u64::from(SECONDS) + 20);
    assert!(a.wait_for(limit).success(), "player a failed");
    assert!(b.wait_for(limit).success(), "player b failed");

    let heard = [("a", &a_out, 660.0, 440.0, a_rate), ("b", &b_out, 440.0, 660.0, b_rate)].map(|(who, out, heard, own, want_rate)| {
        let (summary, clean_cents, frames, rate) = judge(out, heard, own);
        let level = summary.present[0].median_db;
        eprintln!(
            "player {who} heard {heard} Hz at {level:.1} dB: {summary}; worst outside glitch windows {clean_cents:.2} cents"
        );
        assert_eq!(rate, want_rate, "player {who} writes at its own rate");
        (who, summary, clean_cents, frames, rate)
    });
    for (who, s, clean_cents, frames, rate) in &heard {
        // The duration in whole periods of 64 frames (at 44.1 kHz, 6 s is 4134.4 of them).
        let want = (SECONDS * rate) as usize;
        assert!(
            (want..want + 64).contains(frames),
            "player {who}: {frames} frames at {rate} Hz"
        );
        let level = s.present[0].median_db;
        assert!(
            (level - SINE_DB).abs() < 1.0,
            "player {who} heard the other's tone at {level:.1} dB: {s}"
        );
        let own = s.loudest_absent_db().unwrap_or(0.0);
        assert!(own < -30.0, "player {who} heard their own tone: {s}");
        assert!(
            *clean_cents <= MAX_CENTS,
            "player {who}: {clean_cents:.2} cents outside glitch windows: {s}"
        );
    }
    [a_log, b_log].map(|p| std::fs::read_to_string(p).unwrap_or_default())
}
