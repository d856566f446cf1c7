//! `netjam jam --jack` on a real JACK server (Debian's jackd2 with its dummy driver, installed
//! by scripts/deps) against `netjam reflect` on loopback, measured by JACK's own
//! `jack_iodelay`: its test signal goes into `NAME:send_1`, through netjam, the reflector and
//! back, and out of `NAME:receive_1` into `jack_iodelay` again, which reports the round trip
//! in frames. The figure itself is printed by `scripts/bench-jack-roundtrip`; here it only
//! has to be stable and sane.
//!
//! Each test runs its own server (`jackd -n <unique name>`, found by clients through
//! `JACK_DEFAULT_SERVER`), killed on drop, so a failing assertion never leaves it behind.
//! Linux only: the server is Debian's jackd2 and its dummy driver.
#![cfg(target_os = "linux")]

mod common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::echo::{run_at_most, Echo};
use common::jackd::Jackd;
use common::{reflect, require, start_recv, tmp, Proc, BIN};
use netjam::endpoint::jack::{JackConfig, JackEndpoint};
use netjam::endpoint::Endpoint;

alloc_count::install!();

/// A server for one test of this file, with the JACK tools the tests drive it with.
fn start_server(tag: &str) -> Jackd {
    for tool in ["jack_connect", "jack_iodelay"] {
        require(tool, "jackd2");
    }
    require("stdbuf", "coreutils");
    Jackd::start(&format!("netjam-test-{tag}"), 64)
}

/// `netjam jam --jack` against `netjam reflect` on loopback, both stopped on drop.
struct Jam {
    proc: Proc,
    /// Its JACK client name.
    client: String,
    log: PathBuf,
    _reflect: Proc,
}

impl Jam {
    /// Start jam with `args` as client `nj<tag><pid>` of `server`, its ports left
    /// unconnected, against a reflector up for `reflect_s` seconds; returns once jam's ports
    /// are there.
    fn start(server: &Jackd, tag: &str, reflect_s: &str, args: &[&str]) -> Self {
        let client = format!("nj{tag}{}", std::process::id());
        let log = tmp("jack", &format!("{tag}.log"));
        let (reflect, reflector) = reflect(reflect_s);
        let proc = Proc::spawn(
            server
                .client(&mut Command::new(BIN))
                .args(["jam", "--jack", "--jack-name", &client, "--no-connect"])
                .args(["--peer", &reflector.to_string(), "--listen", "127.0.0.1:0"])
                .args(args)
                .stderr(std::fs::File::create(&log).expect("log")),
            "netjam jam",
        );
        server.wait_for_port(
            &format!("{client}:send_1"),
            &format!("netjam jam --jack {args:?}"),
        );
        Self {
            proc,
            client,
            log,
            _reflect: reflect,
        }
    }

    /// What jam printed so far.
    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// A round trip in frames from a line of jack_iodelay ("   228.000 frames  4.750 ms total ...").
fn parse_iodelay(line: &str) -> Option<f64> {
    let mut words = line.split_whitespace();
    let frames = words.next()?.parse().ok()?;
    (words.next()? == "frames").then_some(frames)
}

#[test]
fn parses_jack_iodelay_lines() {
    assert_eq!(
        parse_iodelay("   228.000 frames      4.750 ms total roundtrip latency"),
        Some(228.0)
    );
    assert_eq!(parse_iodelay("Signal below threshold..."), None);
    assert_eq!(parse_iodelay("\textra loopback latency: 227 frames"), None);
}

/// A period in and one out, the packet, a 2 ms buffer on top of a period, the wire: about
/// 230 frames on loopback; a busy machine may add a few periods, never 10 ms.
const ROUND_TRIP_FRAMES: std::ops::Range<f64> = 128.0..480.0;

#[test]
fn jam_through_jack_against_reflect_has_a_stable_round_trip() {
    let server = start_server("jam");
    let json = tmp("jack", "jam.json");
    let mut jam = Jam::start(
        &server,
        "jam",
        "33",
        &[
            "--channels",
            "1",
            "--frames",
            "128",
            // A fixed jitter buffer, so the round trip holds still while the machine is busy
            // (the adaptive one follows the load, which is its job but not what this checks).
            "--buffer",
            "2ms",
            "--duration",
            "30",
            "--stats-json",
            json.to_str().expect("path"),
        ],
    );
    let client = &jam.client;

    // What netjam says while it starts: it followed the server's period, not --frames.
    assert!(
        jam.stderr().contains("64-frame periods"),
        "netjam did not report the server's period:\n{}",
        jam.stderr()
    );

    // `netjam devices` sees the server and netjam's own ports.
    let devices = server
        .run_bounded(Command::new(BIN).arg("devices"), Duration::from_secs(5))
        .expect("netjam devices finished");
    let listing = String::from_utf8_lossy(&devices.stdout);
    assert!(devices.status.success(), "netjam devices failed: {listing}");
    assert!(listing.contains("48000 Hz"), "{listing}");
    assert!(listing.contains(&format!("{client}:send_1")), "{listing}");

    let mut iodelay = Proc::spawn(
        server
            .client(&mut Command::new("stdbuf"))
            .args(["-oL", "jack_iodelay"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
        "jack_iodelay",
    );
    let (tx, rx) = mpsc::channel();
    let out = iodelay.child.stdout.take().expect("stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    server.wait_for_port("jack_delay:out", "jack_iodelay");
    server.connect("jack_delay:out", &format!("{client}:send_1"));
    server.connect(&format!("{client}:receive_1"), "jack_delay:in");

    // Wait for three readings in a row (about 1.5 s) within two frames of each other. On a
    // machine whose cores are both busy the buffer moves as hiccups come and go, so the wait
    // may be long before a quiet stretch of 1.5 s.
    let deadline = Instant::now() + Duration::from_secs(22);
    let mut run: Vec<f64> = Vec::new();
    let mut seen = Vec::new();
    let mut held_too_long = None;
    let stable = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = rx.recv_timeout(left) else {
            break None;
        };
        seen.push(line.clone());
        if let Some(frames) = parse_iodelay(&line) {
            if run.last().is_some_and(|&last| (frames - last).abs() > 2.0) {
                run.clear();
            }
            run.push(frames);
            if run.len() >= 3 {
                let mean = run.iter().sum::<f64>() / run.len() as f64;
                if ROUND_TRIP_FRAMES.contains(&mean) {
                    break Some(mean);
                }
                // Held still, but too long: a start-up transient on a busy machine is given
                // back within a second or two, so keep listening until the deadline.
                held_too_long = Some(mean);
                run.clear();
            }
        } else if line.contains("below threshold") {
            run.clear();
        }
    };
    drop(iodelay);
    let Some(frames) = stable.or(held_too_long) else {
        panic!(
            "jack_iodelay found no stable round trip through netjam; it said:\n{}\nnetjam said:\n{}",
            seen.join("\n"),
            jam.stderr()
        );
    };
    if !ROUND_TRIP_FRAMES.contains(&frames) {
        // Say where the time went: netjam's own account of its buffer and every move it made.
        jam.proc.interrupt();
        let _ = jam.proc.wait_until(Duration::from_secs(3));
        let report = std::fs::read_to_string(&json).unwrap_or_default();
        let report: serde_json::Value = serde_json::from_str(&report).unwrap_or_default();
        panic!(
            "round trip {frames} frames; jack_iodelay said:\n{}\nnetjam's buffer: {}\nits stages: {}\nits discontinuities: {}\nthreads: {}\nnetjam said:\n{}",
            seen.join("\n"),
            report["stats"]["heard"]["jitter_buffer"],
            report["stages"],
            report["discontinuities"],
            report["threads"],
            jam.stderr()
        );
    }
    eprintln!(
        "jack_iodelay round trip through netjam jam --jack and netjam reflect: {frames:.1} frames ({:.2} ms) at 64 frames/period",
        frames / 48.0
    );

    // Stop netjam as Ctrl-C would and check its report.
    jam.proc.interrupt();
    let status = jam
        .proc
        .wait_until(Duration::from_secs(3))
        .unwrap_or_else(|| panic!("netjam jam did not stop on SIGINT:\n{}", jam.stderr()));
    assert!(status.success(), "netjam jam failed:\n{}", jam.stderr());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    eprintln!(
        "netjam's stages: {}\nits buffer's discontinuities: {}\nits threads: {} (JACK's callback: {})",
        report["stages"],
        report["stats"]["heard"]["jitter_buffer"]["discontinuities"],
        report["threads"],
        report["jack"]["realtime_priority"]
    );
    assert_eq!(report["jack"]["period"], 64);
    assert_eq!(report["jack"]["rate"], 48000);
    // The network threads never run above the callback they feed.
    if let Some(callback) = report["jack"]["realtime_priority"].as_i64() {
        for t in report["threads"].as_array().expect("threads") {
            if let Some(p) = t["priority"].as_i64() {
                assert!(p < callback, "{t} above the JACK callback at {callback}");
            }
        }
    }
    let sent = report["stats"]["sent"]["packets"].as_u64().unwrap_or(0);
    let heard = report["stats"]["heard"]["received"].as_u64().unwrap_or(0);
    assert!(
        sent > 300 && heard >= sent * 95 / 100,
        "sent {sent}, heard {heard}"
    );
    assert!(report["periods"]["periods"].as_u64().unwrap_or(0) > 100);
}

/// A server held up (SIGSTOP, as a machine that does not run it for a while) loses that time
/// without counting it: its dummy driver carries on from where it stopped. The stream's
/// timeline must skip as much, or the far side hears this sender's clock fall behind by every
/// stop for good: a path that got slower, late packets, a re-lock.
#[test]
fn time_the_server_lost_uncounted_is_skipped_in_the_stream() {
    let server = start_server("slip");
    let json = tmp("jack", "slip.json");
    let far_json = tmp("jack", "slip-far.json");
    let far_wav = tmp("jack", "slip-far.wav");
    // The far side: a receiver on the system clock, following the sender's clock.
    let (mut far, far_addr) = start_recv(&[
        "--drift-correction",
        "--duration",
        "9",
        "--output",
        far_wav.to_str().expect("path"),
        "--stats-json",
        far_json.to_str().expect("path"),
    ]);
    let client = format!("njslip{}", std::process::id());
    let log = tmp("jack", "slip.log");
    let mut jam = Proc::spawn(
        server
            .client(&mut Command::new(BIN))
            .args([
                "jam",
                "--jack",
                "--jack-name",
                &client,
                "--no-connect",
                "--channels",
                "1",
            ])
            .args(["--peer", &far_addr.to_string(), "--listen", "127.0.0.1:0"])
            .args(["--duration", "9", "--stats-json", json.to_str().expect("path")])
            .stderr(std::fs::File::create(&log).expect("log")),
        "netjam jam",
    );
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    server.wait_for_port(&format!("{client}:send_1"), "netjam jam --jack");
    std::thread::sleep(Duration::from_secs(2));
    let stopped = stop_three_times(&server);
    let status = jam
        .wait_until(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("netjam jam did not end:\n{}", said()));
    assert!(status.success(), "netjam jam failed:\n{}", said());
    let (status, far_said) = far.finish(Duration::from_secs(20));
    assert!(status.success(), "netjam recv failed: {far_said:?}");
    // The far side heard gaps where the server stood still, and kept its timeline: no
    // re-lock for a stop, and few late packets: those sent before a stop was found, 20 ms
    // each (16 a stop, 47-51 in all, on a quiet machine; up to 92 with both cores busy,
    // where the 20 ms stretch). Without the guard it re-locks at every stop, three times;
    // one re-lock is allowed, as a VM that stalls on its own can make one (CI saw it once,
    // in a run with 13 ms of PDV at the 99th percentile and 880 underrun periods).
    let far_report = common::read_json(&far_json);
    let jb = &far_report["stats"]["jitter_buffer"];
    assert!(jb["relocks"].as_u64().expect("relocks") <= 1, "{jb}");
    let late = jb["late_packets"].as_u64().expect("late");
    assert!(late <= 3 * 40, "{late} late packets: {jb}");
    let report = common::read_json(&json);
    let rate = 48_000.0;
    let slipped = report["jack"]["slipped_frames"].as_u64().expect("slipped_frames") as f64;
    let slips = report["jack"]["slips"].as_u64().expect("slips") as f64;
    let stopped_frames = stopped.as_secs_f64() * rate;
    // Most of the time it was stopped is found (a server may run a few cycles late before
    // it carries on, and a busy machine holds it up more than the 300 ms asked). A server on
    // a virtual machine also loses a period or two now and then on its own (60-90 slips of
    // about 100 frames in 9 s here, quiet or busy): each slip beyond the three stops may add
    // a few periods, no more.
    let own = (slips - 3.0).max(0.0) * 4.0 * 64.0;
    assert!(
        slipped >= 0.8 * 0.3 * rate && slipped <= stopped_frames + 0.2 * rate + own,
        "{slipped} frames found lost in {slips} slips, stopped {stopped_frames:.0}:\n{}",
        said()
    );
    let skipped = report["stats"]["sent"]["skipped_frames"]
        .as_u64()
        .expect("skipped") as f64;
    assert!(skipped >= slipped, "the stream skipped {skipped} of {slipped}");
    assert!(said().contains("JACK's clock lost"), "{}", said());
}

/// Stop `server` (SIGSTOP) three times for 100 ms, 1.5 s apart; returns how long it stood.
fn stop_three_times(server: &Jackd) -> Duration {
    let pid = server.pid().to_string();
    let mut stopped = Duration::ZERO;
    for _ in 0..3 {
        let t = Instant::now();
        let ok = Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "could not stop jackd");
        std::thread::sleep(Duration::from_millis(100));
        let ok = Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .expect("kill")
            .success();
        stopped += t.elapsed();
        assert!(ok, "could not continue jackd");
        std::thread::sleep(Duration::from_millis(1500));
    }
    stopped
}

#[test]
fn time_the_server_lost_is_dropped_from_what_it_hears() {
    // What jam hears is its own stream, echoed by a reflector: the time its server stood
    // still is missing from the echo too, and must not be heard late.
    let server = start_server("slipheard");
    let json = tmp("jack", "slipheard.json");
    let mut jam = Jam::start(
        &server,
        "slipheard",
        "12",
        &[
            "--channels",
            "1",
            "--duration",
            "9",
            "--stats-json",
            json.to_str().expect("path"),
        ],
    );
    std::thread::sleep(Duration::from_secs(2));
    let stopped = stop_three_times(&server);
    let status = jam
        .proc
        .wait_until(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("netjam jam did not end:\n{}", jam.stderr()));
    assert!(status.success(), "netjam jam failed:\n{}", jam.stderr());
    let report = common::read_json(&json);
    let slipped = report["jack"]["slipped_frames"].as_u64().expect("slipped_frames");
    // From the totals, not the log of recent entries: a busy machine's server slips a period
    // or two hundreds of times, and the log keeps only the newest.
    let jb = &report["stats"]["heard"]["jitter_buffer"]["discontinuities"];
    let dropped = jb["device_lost_frames"].as_u64().expect("device_lost_frames");
    // Every skip, whatever settled it: the device's loss, the echo's gap, a catch-up.
    let skipped = report["stats"]["heard"]["jitter_buffer"]["skipped_frames"]
        .as_u64()
        .expect("skipped_frames");
    let stopped_frames = (stopped.as_secs_f64() * 48_000.0) as u64;
    eprintln!(
        "stood {stopped_frames} frames, found lost {slipped}, skipped {skipped} of what it hears ({dropped} as device time): {jb}"
    );
    // What the device lost in all (the slips found against the system clock, and cycles
    // the server said it dropped) is what the stream skipped.
    let device_lost = report["stats"]["sent"]["skipped_frames"]
        .as_u64()
        .expect("skipped_frames");
    // The time found lost is dropped from playout, never more of it as device time than the
    // device lost (give or take a period or two: the output side learns of a slip a period
    // apart from the input side's count). The echo is missing the same time: playout plays
    // what it holds and jumps the echo's gap when it gets there, so most of a stop goes as
    // the far stream's gap, not as device time (15 frames of 14,264 in one run beside the
    // other JACK tests); with both cores busy playout is often late already when a stop is
    // found, and a catch-up takes part of the time back instead. So here at least a period
    // is skipped, and what a listener hears is asserted below, whichever way the time came
    // back. The engine's `time_the_device_lost_costs_one_skip` holds the rule exactly, in
    // virtual time.
    assert!(
        slipped >= 48_000 / 10 && skipped >= 64 && dropped <= device_lost + 3 * 64,
        "stood {stopped_frames} frames, found {slipped} lost in slips, {device_lost} in all, skipped {skipped} of what it hears ({dropped} as device time): {jb}"
    );
    // No stop is heard late for the rest of the session: in the seconds after the last one
    // (from 6.5 s, about 1.2 s after it) the latency comes back to within a fifth of one
    // stop of where it was before the first: a stop's 100 ms kept in playout would be far
    // above that. The bound is wide because the machine's own hiccups are not the stops':
    // beside the other JACK tests in CI the tight policy rightly covered recurring peaks with
    // 8-9 ms of target after the stops (2.49 ms before, 6.71 ms at the least after); quiet,
    // it came back within 0.3 ms. (The least of those seconds: a late packet of the
    // machine's own can raise it again at any moment.)
    let recent = |e: &serde_json::Value| {
        e["stats"]["heard"]["jitter_buffer"]["added_latency_recent_ms"]
            .as_f64()
            .unwrap_or(f64::NAN)
    };
    let series = report["series"].as_array().expect("series");
    let before = series
        .iter()
        .filter(|e| e["t_s"].as_f64().is_some_and(|t| (1.0..=1.9).contains(&t)))
        .map(recent)
        .fold(f64::NAN, f64::max);
    let after = series
        .iter()
        .filter(|e| e["t_s"].as_f64().is_some_and(|t| t >= 6.5))
        .map(recent)
        .fold(f64::NAN, f64::min);
    eprintln!("added latency: {before:.2} ms before the stops, {after:.2} ms at the least after them");
    assert!(
        after <= before + 20.0,
        "the stops left latency behind: {before:.2} ms before them, at least {after:.2} ms after"
    );
}

/// A server that stops calling netjam (here stopped outright, as a wedged server or one that
/// threw the client out of its graph) must not keep a player from ending: `--duration` counts
/// the server's frames, so the wall clock bounds it too, and a goodbye the server does not
/// answer is not waited for. The player says what happened and still writes its report.
#[test]
fn a_server_that_stops_calling_does_not_keep_jam_from_ending() {
    let server = start_server("stuck");
    let json = tmp("jack", "stuck.json");
    let mut jam = Jam::start(
        &server,
        "stuck",
        "20",
        &[
            "--channels",
            "1",
            "--duration",
            "3",
            "--stats-json",
            json.to_str().expect("path"),
        ],
    );
    std::thread::sleep(Duration::from_millis(800));
    let pid = server.pid().to_string();
    let signal = |sig: &str| {
        Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill")
            .success()
    };
    /// Lets the server run again however the test ends, so it can be stopped cleanly.
    struct Continue<'a>(&'a dyn Fn(&str) -> bool);
    impl Drop for Continue<'_> {
        fn drop(&mut self) {
            (self.0)("-CONT");
        }
    }
    assert!(signal("-STOP"), "could not stop jackd");
    let _resume = Continue(&signal);
    let stopped = Instant::now();
    // At most: the rest of the 3 s asked, 2 s of grace, 2 s for the goodbye, and a loaded
    // machine's slack. Without the bounds jam waits for as long as the server stands still.
    let status = jam.proc.wait_until(Duration::from_secs(15)).unwrap_or_else(|| {
        panic!(
            "netjam jam did not end with its server stopped:\n{}",
            jam.stderr()
        )
    });
    let took = stopped.elapsed();
    let said = jam.stderr();
    eprintln!("jam ended {took:?} after its server stopped:\n{said}");
    assert!(status.success(), "netjam jam failed:\n{said}");
    assert!(said.contains("has not run netjam for"), "{said}");
    assert!(said.contains("stopping by the wall clock"), "{said}");
    let report = common::read_json(&json);
    assert!(
        report["stats"]["sent"]["packets"].as_u64().unwrap_or(0) > 0,
        "{report}"
    );
}

#[test]
fn opus_through_jack_then_a_live_period_change_stops_jam_with_a_message() {
    let server = start_server("period");
    let mut jam = Jam::start(
        &server,
        "period",
        "15",
        &["--channels", "2", "--codec", "opus", "--duration", "12"],
    );
    assert!(
        common::wait_for_text(
            &jam.log,
            "opus/48000/2ch, packets of 120 frames (2.50 ms), codec delay 2.5 ms",
            Duration::from_secs(10)
        ),
        "{}",
        jam.stderr()
    );
    assert!(jam.proc.running(), "jam stopped early:\n{}", jam.stderr());
    let changed = server.run_bounded(Command::new("jack_bufsize").arg("128"), Duration::from_secs(5));
    assert!(
        changed.is_some_and(|o| o.status.success()),
        "jack_bufsize 128 failed"
    );
    let status = jam
        .proc
        .wait_until(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("jam kept running after the period changed:\n{}", jam.stderr()));
    assert!(!status.success(), "{}", jam.stderr());
    assert!(
        jam.stderr()
            .contains("the JACK server changed its period from 64 frames; restart netjam"),
        "{}",
        jam.stderr()
    );
}

#[test]
fn jam_without_a_server_says_how_to_start_one() {
    let out = Command::new(BIN)
        .args([
            "jam",
            "--jack",
            "--peer",
            "127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
        ])
        .env(
            "JACK_DEFAULT_SERVER",
            format!("netjam-absent-{}", std::process::id()),
        )
        .env("JACK_NO_START_SERVER", "1")
        .output()
        .expect("netjam jam");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("jackd -d dummy") || err.contains("libjack could not be loaded"),
        "{err}"
    );
}

#[test]
fn a_libjack_named_in_the_environment_that_does_not_load_is_named_in_the_error() {
    let named = "/nonexistent/netjam-test/libjack.so.0";
    let out = Command::new(BIN)
        .args([
            "jam",
            "--jack",
            "--peer",
            "127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
        ])
        .env("NETJAM_LIBJACK", named)
        .output()
        .expect("netjam jam");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    // The named file is the only one tried (a system libjack is not silently used instead),
    // and the error says what to install on this platform.
    assert!(
        err.contains(named) && err.contains("named by NETJAM_LIBJACK"),
        "{err}"
    );
    assert!(!err.contains("libjack.so.0 (the dynamic linker"), "{err}");
    assert!(err.contains("apt install jackd2"), "{err}");
}

#[test]
fn jack_callback_allocates_nothing_and_gets_nominal_period_times() {
    let server = start_server("noalloc");
    let endpoint = JackEndpoint::open(&JackConfig {
        name: "netjam-noalloc".into(),
        channels: 2,
        inputs: None,
        outputs: None,
        connect: false,
        server: Some(server.name().to_string()),
    })
    .expect("open a client on the test server");
    let spec = endpoint.spec();
    assert_eq!((spec.rate, spec.period), (48_000, 64));
    assert_eq!((spec.input_channels, spec.output_channels), (2, 2));
    let endpoint = Box::new(endpoint.with_limit(Some(24_000)));
    let mut echo = Echo::new(100_000);
    // Stop after 8 s even if the limit is never reached.
    let (periods, _) = run_at_most(endpoint, &mut echo, Duration::from_secs(8));
    assert!(
        echo.times.len() >= 300,
        "only {} periods ran in half a second of audio",
        echo.times.len()
    );
    assert_eq!(periods.periods as usize, echo.times.len());
    assert_eq!(echo.frames_seen, echo.times.len() * 64 * 2);
    assert_eq!(
        echo.deliberate, 1,
        "the counter does not move on the JACK callback thread"
    );
    assert_eq!(echo.allocations, 0, "the JACK callback allocated");
    // The times are the periods' nominal starts: strictly increasing, and on average a
    // period apart give or take a wide margin (this checks units and clock, not timing).
    assert!(echo.times.windows(2).all(|w| w[1] > w[0]));
    let span = echo.times[echo.times.len() - 1] - echo.times[0];
    let mean = span as f64 / (echo.times.len() - 1) as f64;
    assert!((700_000.0..2_000_000.0).contains(&mean), "mean period {mean} ns");
}

/// `jack_lsp -c` as (from, to) pairs, each connection once, in the direction audio flows.
fn connections(server: &Jackd) -> Vec<(String, String)> {
    let out = server
        .run_bounded(Command::new("jack_lsp").arg("-c"), Duration::from_secs(2))
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut pairs = Vec::new();
    let mut port = String::new();
    for line in out.lines() {
        if let Some(peer) = line.strip_prefix("   ") {
            // Each connection is listed under both ends; keep the one from a capture or
            // receive port (the producing end).
            if port.contains(":capture_") || port.contains(":receive_") {
                pairs.push((port.clone(), peer.trim().to_string()));
            }
        } else {
            port = line.trim().to_string();
        }
    }
    pairs.sort();
    pairs
}

#[test]
fn jam_with_a_channel_map_sends_inputs_3_4_and_plays_on_outputs_5_6() {
    let server = Jackd::start_with_ports("netjam-test-map", 64, 8);
    let client = format!("njmap{}", std::process::id());
    let (_reflect, reflector) = reflect("30");
    let log = tmp("jack", "map.log");
    let _jam = Proc::spawn(
        server
            .client(&mut Command::new(BIN))
            .args(["jam", "--jack", "--jack-name", &client])
            .args(["--inputs", "3-4", "--outputs", "5,6", "--duration", "20"])
            .args(["--peer", &reflector.to_string(), "--listen", "127.0.0.1:0"])
            .stderr(std::fs::File::create(&log).expect("log")),
        "netjam jam --jack --inputs 3-4 --outputs 5,6",
    );
    server.wait_for_port(&format!("{client}:send_1"), "netjam jam --inputs 3-4");
    let mut want: Vec<(String, String)> = vec![
        ("system:capture_3".into(), format!("{client}:send_1")),
        ("system:capture_4".into(), format!("{client}:send_2")),
        (format!("{client}:receive_1"), "system:playback_5".into()),
        (format!("{client}:receive_2"), "system:playback_6".into()),
    ];
    want.sort();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut got = connections(&server);
    while got != want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        got = connections(&server);
    }
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(got, want, "jam printed:\n{log_text}");
    let ports = server.ports();
    assert!(
        !ports.contains(&format!("{client}:send_3")) && !ports.contains(&format!("{client}:receive_3")),
        "one port per channel named:\n{ports}"
    );
    assert!(
        log_text.contains("physical ports 3-4") && log_text.contains("physical ports 5-6"),
        "{log_text}"
    );
}

#[test]
fn a_channel_map_beyond_the_servers_ports_says_how_many_there_are() {
    let server = Jackd::start_with_ports("netjam-test-mapbad", 64, 8);
    let out = server.netjam(&[
        "jam",
        "--jack",
        "--inputs",
        "2,9",
        "--peer",
        "127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
        "--duration",
        "1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--inputs 9: the JACK server's physical capture side has 8 inputs (1-8)"),
        "{err}"
    );
}
