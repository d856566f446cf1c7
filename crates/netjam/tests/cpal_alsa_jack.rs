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

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use netjam::endpoint::cpal::{CpalConfig, CpalEndpoint};
use netjam::endpoint::{Endpoint, Process};

const BIN: &str = env!("CARGO_BIN_EXE_netjam");

alloc_count::install!();

fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn require(tool: &str, package: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{tool} is missing: run scripts/deps (installs Debian's {package})"
    );
}

/// A private JACK server on the dummy driver, stopped on drop.
struct Jackd {
    name: String,
    child: Child,
}

impl Drop for Jackd {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Jackd {
    /// Start a server named after `tag` from a small fixed set (jackd's table of servers is
    /// machine-wide; a name is reclaimed by the next run if a crash left it behind).
    fn start(tag: &str) -> Self {
        require("jackd", "jackd2");
        require("jack_lsp", "jackd2");
        assert!(
            std::path::Path::new("/usr/share/alsa/alsa.conf.d/50-jack.conf").exists(),
            "the ALSA JACK plugin is missing: run scripts/deps (installs Debian's libasound2-plugins)"
        );
        let mut failures = String::new();
        for slot in 0..4 {
            let name = format!("netjam-cpal-{tag}-{slot}");
            match Self::try_start(&name) {
                Ok(server) => return server,
                Err(why) => failures.push_str(&format!("{name}: {why}\n")),
            }
        }
        panic!("could not start a JACK server:\n{failures}");
    }

    fn lsp_ok(name: &str) -> bool {
        Command::new("jack_lsp")
            .env("JACK_DEFAULT_SERVER", name)
            .env("JACK_NO_START_SERVER", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn try_start(name: &str) -> Result<Self, String> {
        if Self::lsp_ok(name) {
            return Err("in use".into());
        }
        let child = Command::new("jackd")
            .args(["-n", name, "-d", "dummy", "-r", "48000", "-p", "64"])
            .env("JACK_NO_AUDIO_RESERVATION", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run jackd: {e}"))?;
        let mut server = Self {
            name: name.to_string(),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("jackd exited ({status}) before it was ready"));
            }
            if Self::lsp_ok(name) {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err("jackd did not come up within 5 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `netjam ARGS` as a client of this server, run to completion (killed after 20 s).
    fn netjam(&self, args: &[&str]) -> Output {
        let child = Command::new(BIN)
            .args(args)
            .env("JACK_DEFAULT_SERVER", &self.name)
            .env("JACK_NO_START_SERVER", "1")
            .env("JACK_NO_AUDIO_RESERVATION", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("netjam");
        let (tx, rx) = mpsc::channel();
        let pid = child.id();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(out) => out.expect("netjam output"),
            Err(_) => {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
                panic!("netjam {args:?} did not finish within 20 s");
            }
        }
    }
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

#[test]
fn devices_lists_the_plugin_with_channels_rates_and_buffer_sizes() {
    let _one = one_at_a_time();
    let server = Jackd::start("devices");
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
    let _one = one_at_a_time();
    let server = Jackd::start("jam");
    let port = free_udp_port();
    let dir = std::env::temp_dir().join(format!("netjam-cpal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let json = dir.join("jam.json");
    let mut reflect = Command::new(BIN)
        .args(["reflect", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--duration", "8"])
        .stderr(Stdio::null())
        .spawn()
        .expect("netjam reflect");
    std::thread::sleep(Duration::from_millis(200));
    let out = server.netjam(&[
        "jam",
        "--device",
        "jack",
        "--frames",
        "64",
        "--peer",
        &format!("127.0.0.1:{port}"),
        "--listen",
        "127.0.0.1:0",
        "--duration",
        "2",
        "--stats-json",
        json.to_str().expect("path"),
    ]);
    let _ = reflect.kill();
    let _ = reflect.wait();
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
    // Whole periods per callback: the adapter adds nothing, the bridge one callback each way.
    assert_eq!(d["added_latency_frames"], 256, "{d}");
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
    let _one = one_at_a_time();
    let server = Jackd::start("errors");
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

/// Plays back what it captures; counts what the callback thread allocates from its first
/// period on, and keeps each period's time in memory reserved before the stream starts.
struct Echo {
    times: Vec<u64>,
    first: Option<u64>,
    allocations: u64,
}

impl Process for Echo {
    fn process(&mut self, now_ns: u64, input: &[f32], output: &mut [f32]) {
        let now = alloc_count::allocations();
        let first = *self.first.get_or_insert(now);
        self.allocations = now - first;
        output.copy_from_slice(input);
        if self.times.len() < self.times.capacity() {
            self.times.push(now_ns);
        }
    }
}

#[test]
fn the_endpoint_runs_whole_periods_on_the_device_clock_without_allocating() {
    let _one = one_at_a_time();
    let server = Jackd::start("endpoint");
    // The plugin finds the server through the environment of this process.
    std::env::set_var("JACK_DEFAULT_SERVER", &server.name);
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
    let mut echo = Echo {
        times: Vec::with_capacity(100_000),
        first: None,
        allocations: 0,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (done, finished) = mpsc::channel::<()>();
    let watchdog = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = finished.recv_timeout(Duration::from_secs(8));
            stop.store(true, Ordering::Relaxed);
        })
    };
    let started = Instant::now();
    let (_, periods) = endpoint.run(&mut echo, stop).expect("run");
    let took = started.elapsed();
    drop(done);
    let _ = watchdog.join();
    assert!(echo.times.len() >= 375, "{} periods", echo.times.len());
    assert_eq!(periods.periods as usize, echo.times.len());
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
    let _one = one_at_a_time();
    let server = Jackd::start("gone");
    let log = std::env::temp_dir().join(format!("netjam-cpal-gone-{}.log", std::process::id()));
    let mut jam = Command::new(BIN)
        .args(["jam", "--device", "jack", "--peer", "127.0.0.1:9"])
        .args(["--listen", "127.0.0.1:0", "--duration", "15"])
        .env("JACK_DEFAULT_SERVER", &server.name)
        .env("JACK_NO_START_SERVER", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("netjam jam");
    std::thread::sleep(Duration::from_millis(1500));
    // The device's server goes away under it, as an unplugged card would.
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(8);
    let status = loop {
        if let Ok(Some(s)) = jam.try_wait() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = jam.kill();
            let _ = jam.wait();
            panic!(
                "netjam jam kept running after its device went away:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let err = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "{err}");
    assert!(err.contains("the sound card stopped calling back"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
