//! The sound-card endpoint on a real, clocked ALSA device without a sound card: the ALSA
//! JACK plugin (Debian's libasound2-plugins, PCM `jack` in alsa-lib's configuration) routed
//! into `jackd -d dummy`, both installed by scripts/deps. To cpal it is an ordinary ALSA
//! device: 2 channels of f32 at the server's 48000 Hz, buffers of 128 frames or more, its
//! callbacks clocked by the dummy driver. (alsa-lib's `null` PCM would need nothing, but it
//! is not clocked: it swallows and produces audio as fast as it is asked.)
//!
//! Each test runs its own server (`jackd -n <name>`, found by the plugin through
//! `JACK_DEFAULT_SERVER`), one at a time, stopped with SIGTERM on drop so a failing
//! assertion never leaves it behind.
#![cfg(all(feature = "cpal", target_os = "linux"))]

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::echo::{run_at_most, Echo};
use common::jackd::Jackd;
use common::{reflect, tmp, Proc, BIN};
use netjam::endpoint::cpal::{CpalConfig, CpalEndpoint};
use netjam::endpoint::Endpoint;

alloc_count::install!();

/// A server for one test of this file, with the ALSA plugin that makes it a sound card.
fn start_server(tag: &str) -> Jackd {
    assert!(
        std::path::Path::new("/usr/share/alsa/alsa.conf.d/50-jack.conf").exists(),
        "the ALSA JACK plugin is missing: run scripts/deps (installs Debian's libasound2-plugins)"
    );
    Jackd::start(&format!("netjam-cpal-{tag}"), 64)
}

#[test]
fn devices_lists_the_plugin_with_channels_rates_and_buffer_sizes() {
    let server = start_server("devices");
    let out = server.netjam(&["devices"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("JACK server"), "{text}");
    assert!(
        text.contains("jack: JACK Audio Connection Kit"),
        "the plugin is not listed:\n{text}"
    );
    assert!(text.contains("in  2 ch, 48000 Hz, buffer 128-"), "{text}");

    let out = server.netjam(&["devices", "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["jack"]["rate"], 48_000);
    let alsa = v["hosts"]
        .as_array()
        .expect("hosts")
        .iter()
        .find(|h| h["name"].as_str().is_some_and(|n| n.eq_ignore_ascii_case("alsa")))
        .expect("the ALSA host");
    let jack = alsa["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["id"] == "jack")
        .expect("the jack PCM");
    for side in ["input", "output"] {
        assert_eq!(jack[side]["channels"], serde_json::json!([2]), "{jack}");
        assert_eq!(jack[side]["rates"], serde_json::json!([[48_000, 48_000]]));
        assert_eq!(jack[side]["buffer_frames"][0], 128);
    }
}

#[test]
fn jam_through_the_plugin_against_reflect_sends_and_hears() {
    let server = start_server("jam");
    let json = tmp("cpal", "jam.json");
    let (reflect, reflector) = reflect("8");
    let out = server.netjam(&[
        "jam",
        "--device",
        "jack",
        "--frames",
        "64",
        "--peer",
        &reflector.to_string(),
        "--listen",
        "127.0.0.1:0",
        "--duration",
        "2",
        "--stats-json",
        json.to_str().expect("path"),
    ]);
    drop(reflect);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "netjam jam failed:\n{err}");
    // 64-frame buffers are below the plugin's minimum: netjam says so and takes 128.
    assert!(err.contains("using 128-frame buffers"), "{err}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    let sent = r["stats"]["sent"]["packets"].as_u64().expect("sent");
    let heard = r["stats"]["heard"]["received"].as_u64().expect("heard");
    // Two seconds of 64-frame packets is 1500; the card's clock sets the pace.
    assert!((1200..=1800).contains(&sent), "sent {sent}");
    assert!(heard >= sent * 95 / 100, "sent {sent}, heard {heard}");
    assert!(
        r["stats"]["sent"]["rtt_ms"].as_f64().is_some(),
        "no RTCP round trip"
    );
    let d = &r["device"];
    assert_eq!(d["rate"], 48_000);
    assert_eq!(d["period"], 64);
    assert_eq!(d["callback_frames"], 128);
    assert_eq!(r["periods"]["periods"].as_u64(), Some(sent));
    // Whole periods per callback: the adapter adds nothing and the bridge starts with one
    // callback each way (256 frames). Each underrun of the adapter or the bridge may grow
    // its cushion by at most one callback, and nothing else may.
    let added = d["added_latency_frames"].as_u64().expect("added latency");
    let underruns = d["adapter_underruns"].as_u64().expect("adapter underruns")
        + d["bridge_underruns"].as_u64().expect("bridge underruns");
    assert!(
        (256..=256 + 128 * underruns).contains(&added),
        "added {added} frames with {underruns} underruns: {d}"
    );
    eprintln!(
        "jam --device jack: sent {sent}, heard {heard}, callback {:.1} µs mean, {:.1} µs worst, {} missed deadlines, {} xruns",
        r["periods"]["callback_mean_us"].as_f64().unwrap_or(0.0),
        r["periods"]["callback_max_us"].as_f64().unwrap_or(0.0),
        r["periods"]["missed_deadlines"],
        d["xruns"]
    );
}

#[test]
fn device_errors_say_what_would_work() {
    let server = start_server("errors");
    let jam = |extra: &[&str]| {
        let mut args = vec!["jam", "--peer", "127.0.0.1:9", "--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let out = server.netjam(&args);
        assert!(!out.status.success(), "{extra:?} succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = jam(&["--device", "no-such-card"]);
    assert!(err.contains("no input or output device matches"), "{err}");
    assert!(
        err.contains("jack (JACK Audio Connection Kit): in 2 ch, 48000 Hz"),
        "{err}"
    );
    let err = jam(&["--device", "rate"]);
    assert!(
        err.contains("is ambiguous") && err.contains("samplerate"),
        "{err}"
    );
    let err = jam(&["--device", "jack", "--rate", "44100"]);
    assert!(
        err.contains("44100 Hz is not offered") && err.contains("48000 Hz"),
        "{err}"
    );
    let err = jam(&["--device", "jack", "--channels", "6"]);
    assert!(
        err.contains("6 channels are not offered") && err.contains("2 ch"),
        "{err}"
    );
    let err = jam(&["--device", "jack", "--sine", "440"]);
    assert!(err.contains("cannot be used with"), "{err}");
}

#[test]
fn the_endpoint_runs_whole_periods_on_the_device_clock_without_allocating() {
    let server = start_server("endpoint");
    // The plugin finds the server through the environment of this process.
    std::env::set_var("JACK_DEFAULT_SERVER", server.name());
    std::env::set_var("JACK_NO_START_SERVER", "1");
    let endpoint = CpalEndpoint::open(&CpalConfig {
        device: Some("jack".into()),
        period: 64,
        ..Default::default()
    })
    .expect("open the plugin's PCM");
    let spec = endpoint.spec();
    assert_eq!((spec.rate, spec.period), (48_000, 64));
    assert_eq!((spec.input_channels, spec.output_channels), (2, 2));
    let monitor = endpoint.monitor();
    let endpoint = Box::new(endpoint.with_limit(Some(24_000)));
    let mut echo = Echo::new(100_000);
    let (periods, took) = run_at_most(endpoint, &mut echo, Duration::from_secs(8));
    assert!(echo.times.len() >= 375, "{} periods", echo.times.len());
    assert_eq!(periods.periods as usize, echo.times.len());
    assert_eq!(
        echo.deliberate, 1,
        "the counter does not move on the cpal callback thread"
    );
    assert_eq!(echo.allocations, 0, "the cpal callback allocated");
    // Half a second of audio takes about half a second: the device clocks the stream.
    assert!(
        (0.3..3.0).contains(&took.as_secs_f64()),
        "24000 frames took {took:?}"
    );
    assert!(echo.times.windows(2).all(|w| w[1] > w[0]));
    assert_eq!(monitor.callback_frames(), 128);
    eprintln!(
        "cpal on the ALSA JACK plugin: {} periods, callback {:.1} µs mean, {:.1} µs worst, lateness {:.1} µs mean, {:.1} µs worst, {} missed, realtime {}",
        periods.periods,
        periods.callback_mean_us,
        periods.callback_max_us,
        periods.wake_late_mean_us,
        periods.wake_late_max_us,
        periods.missed_deadlines,
        periods.realtime
    );
}

#[test]
fn a_device_that_goes_away_ends_jam_with_an_error() {
    let mut server = start_server("gone");
    let log = tmp("cpal", "gone.log");
    let mut jam = Proc::spawn(
        server
            .client(&mut Command::new(BIN))
            .args(["jam", "--device", "jack", "--peer", "127.0.0.1:9"])
            .args(["--listen", "127.0.0.1:0", "--duration", "15"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log")),
        "netjam jam",
    );
    assert!(
        common::wait_for_text(&log, "netjam: jamming with", Duration::from_secs(10)),
        "jam did not start: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // Once the stream runs, the device's server goes away under it, as an unplugged card would.
    server.stop();
    let status = jam.wait_until(Duration::from_secs(8)).unwrap_or_else(|| {
        panic!(
            "netjam jam kept running after its device went away:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        )
    });
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "{err}");
    assert!(err.contains("the sound card stopped calling back"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
