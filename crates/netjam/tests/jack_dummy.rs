//! `netjam jam --jack` on a real JACK server (Debian's jackd2 with its dummy driver, installed
//! by scripts/deps) against `netjam reflect` on loopback, measured by JACK's own
//! `jack_iodelay`: its test signal goes into `NAME:send_1`, through netjam, the reflector and
//! back, and out of `NAME:receive_1` into `jack_iodelay` again, which reports the round trip
//! in frames. The figure itself is printed by `scripts/bench-jack-roundtrip`; here it only
//! has to be stable and sane.
//!
//! Each test runs its own server (`jackd -n <unique name>`, found by clients through
//! `JACK_DEFAULT_SERVER`), killed on drop, so a failing assertion never leaves it behind.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use netjam::endpoint::jack::{JackConfig, JackEndpoint};
use netjam::endpoint::{Endpoint, Process};

const BIN: &str = env!("CARGO_BIN_EXE_netjam");

alloc_count::install!();

/// A child process killed and reaped when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One JACK server at a time: two dummy servers plus their clients on a small machine cause
/// xruns, and each xrun moves the round trip jack_iodelay measures.
fn one_server_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A private JACK server on the dummy driver, stopped on drop.
///
/// jackd keeps a machine-wide table of at most 8 servers in shared memory; one that is
/// killed outright leaves its entry behind until a server of the same name starts again. So
/// the server is stopped with SIGTERM (it unregisters itself), and names come from a small
/// fixed set per test, so an entry left by a crashed run is reclaimed by the next one.
struct Jackd {
    name: String,
    child: Child,
    log: PathBuf,
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

fn require(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "{tool} is missing: run scripts/deps (installs Debian's jackd2 and coreutils)"
    );
}

impl Jackd {
    fn start(tag: &str, period: u32) -> Self {
        for tool in ["jackd", "jack_lsp", "jack_connect", "jack_iodelay", "stdbuf"] {
            require(tool);
        }
        let mut failures = String::new();
        for slot in 0..4 {
            let name = format!("netjam-test-{tag}-{slot}");
            match Self::try_start(&name, period) {
                Ok(server) => return server,
                Err(why) => failures.push_str(&format!("{name}: {why}\n")),
            }
        }
        panic!("could not start a JACK server:\n{failures}");
    }

    /// Start jackd as `name` unless a live server already has that name (another test run).
    fn try_start(name: &str, period: u32) -> Result<Self, String> {
        let probe = Command::new("jack_lsp")
            .env("JACK_DEFAULT_SERVER", name)
            .env("JACK_NO_START_SERVER", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if probe.is_ok_and(|s| s.success()) {
            return Err("in use".into());
        }
        let log = std::env::temp_dir().join(format!("{name}-{}.jackd.log", std::process::id()));
        let child = Command::new("jackd")
            .args([
                "-n",
                name,
                "-d",
                "dummy",
                "-r",
                "48000",
                "-p",
                &period.to_string(),
            ])
            .env("JACK_NO_AUDIO_RESERVATION", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).map_err(|e| e.to_string())?)
            .spawn()
            .map_err(|e| format!("cannot run jackd: {e}"))?;
        let mut server = Self {
            name: name.to_string(),
            child,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!(
                    "jackd exited ({status}) before it was ready:\n{}",
                    server.log()
                ));
            }
            if server
                .run_bounded(Command::new("jack_lsp"), Duration::from_secs(2))
                .is_some_and(|o| o.status.success())
            {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err(format!("jackd did not come up within 5 s:\n{}", server.log()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `cmd` as a client of this server (never starting another).
    fn client<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.env("JACK_DEFAULT_SERVER", &self.name)
            .env("JACK_NO_START_SERVER", "1")
            .env("JACK_NO_AUDIO_RESERVATION", "1")
    }

    /// Run a client to completion, or kill it after `limit` and return None.
    fn run_bounded(&self, mut cmd: Command, limit: Duration) -> Option<Output> {
        let child = self
            .client(&mut cmd)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .ok()?;
        let mut child = Killed(child);
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.0.try_wait() {
                let mut stdout = Vec::new();
                let mut stderr = Vec::new();
                if let Some(mut o) = child.0.stdout.take() {
                    let _ = o.read_to_end(&mut stdout);
                }
                if let Some(mut e) = child.0.stderr.take() {
                    let _ = e.read_to_end(&mut stderr);
                }
                return Some(Output {
                    status,
                    stdout,
                    stderr,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn ports(&self) -> String {
        self.run_bounded(Command::new("jack_lsp"), Duration::from_secs(2))
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    fn connect(&self, from: &str, to: &str) {
        let mut cmd = Command::new("jack_connect");
        cmd.args([from, to]);
        let out = self.run_bounded(cmd, Duration::from_secs(3));
        assert!(
            out.as_ref().is_some_and(|o| o.status.success()),
            "jack_connect {from} {to} failed: {:?}",
            out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        );
    }

    fn wait_for_port(&self, port: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.ports().lines().any(|l| l.trim() == port) {
            assert!(
                Instant::now() < deadline,
                "{what} did not register {port} within 5 s; ports: {}",
                self.ports()
            );
            std::thread::sleep(Duration::from_millis(50));
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

#[test]
fn jam_through_jack_against_reflect_has_a_stable_round_trip() {
    let _one = one_server_at_a_time();
    let server = Jackd::start("jam", 64);
    let client = format!("nj{}", std::process::id());
    let port = free_udp_port();
    let dir = std::env::temp_dir().join(format!("netjam-jack-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let json = dir.join("jam.json");
    let jam_log = dir.join("jam.log");

    let _reflect = Killed(
        Command::new(BIN)
            .args(["reflect", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--duration", "18"])
            .stderr(Stdio::null())
            .spawn()
            .expect("netjam reflect"),
    );
    let mut jam = Killed(
        server
            .client(&mut Command::new(BIN))
            .args(["jam", "--jack", "--jack-name", &client, "--no-connect"])
            .args(["--channels", "1", "--frames", "128"])
            // A fixed jitter buffer, so the round trip holds still while the machine is busy
            // (the adaptive one follows the load, which is its job but not what this checks).
            .args(["--buffer", "2ms"])
            .args(["--peer", &format!("127.0.0.1:{port}"), "--listen", "127.0.0.1:0"])
            .args(["--duration", "15", "--stats-json", json.to_str().expect("path")])
            .stderr(std::fs::File::create(&jam_log).expect("log"))
            .spawn()
            .expect("netjam jam"),
    );
    let jam_stderr = || std::fs::read_to_string(&jam_log).unwrap_or_default();
    server.wait_for_port(&format!("{client}:send_1"), "netjam jam --jack");

    // What netjam says while it starts: it followed the server's period, not --frames.
    assert!(
        jam_stderr().contains("64-frame periods"),
        "netjam did not report the server's period:\n{}",
        jam_stderr()
    );

    // `netjam devices` sees the server and netjam's own ports.
    let devices = server
        .run_bounded(
            {
                let mut c = Command::new(BIN);
                c.arg("devices");
                c
            },
            Duration::from_secs(5),
        )
        .expect("netjam devices finished");
    let listing = String::from_utf8_lossy(&devices.stdout);
    assert!(devices.status.success(), "netjam devices failed: {listing}");
    assert!(listing.contains("48000 Hz"), "{listing}");
    assert!(listing.contains(&format!("{client}:send_1")), "{listing}");

    let mut iodelay = Killed(
        server
            .client(&mut Command::new("stdbuf"))
            .args(["-oL", "jack_iodelay"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("jack_iodelay"),
    );
    let (tx, rx) = mpsc::channel();
    let out = iodelay.0.stdout.take().expect("stdout");
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

    // Wait for three readings in a row (about 1.5 s) within two frames of each other.
    let deadline = Instant::now() + Duration::from_secs(9);
    let mut run: Vec<f64> = Vec::new();
    let mut seen = Vec::new();
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
                break Some(run.iter().sum::<f64>() / run.len() as f64);
            }
        } else if line.contains("below threshold") {
            run.clear();
        }
    };
    drop(iodelay);
    let Some(frames) = stable else {
        panic!(
            "jack_iodelay found no stable round trip through netjam; it said:\n{}\nnetjam said:\n{}",
            seen.join("\n"),
            jam_stderr()
        );
    };
    // One period in, one out, packetization and a jitter buffer: more than a period, and on
    // loopback far less than 100 ms.
    assert!((64.0..4800.0).contains(&frames), "round trip {frames} frames");
    eprintln!(
        "jack_iodelay round trip through netjam jam --jack and netjam reflect: {frames:.1} frames ({:.2} ms) at 64 frames/period",
        frames / 48.0
    );

    // Stop netjam as Ctrl-C would and check its report.
    let _ = Command::new("kill")
        .args(["-INT", &jam.0.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(3);
    let status = loop {
        if let Ok(Some(s)) = jam.0.try_wait() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "netjam jam did not stop on SIGINT:\n{}",
            jam_stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "netjam jam failed:\n{}", jam_stderr());
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(report["jack"]["period"], 64);
    assert_eq!(report["jack"]["rate"], 48000);
    assert!(report["stats"]["heard"]["received"].as_u64().unwrap_or(0) > 100);
    assert!(report["periods"]["periods"].as_u64().unwrap_or(0) > 100);
}

#[test]
fn opus_through_jack_then_a_live_period_change_stops_jam_with_a_message() {
    let _one = one_server_at_a_time();
    let server = Jackd::start("period", 64);
    let client = format!("njp{}", std::process::id());
    let port = free_udp_port();
    let log = std::env::temp_dir().join(format!("netjam-jack-period-{}.log", std::process::id()));
    let _reflect = Killed(
        Command::new(BIN)
            .args([
                "reflect",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--duration",
                "15",
            ])
            .stderr(Stdio::null())
            .spawn()
            .expect("netjam reflect"),
    );
    let mut jam = Killed(
        server
            .client(&mut Command::new(BIN))
            .args([
                "jam",
                "--jack",
                "--jack-name",
                &client,
                "--no-connect",
                "--channels",
                "2",
            ])
            .args([
                "--codec",
                "opus",
                "--peer",
                &format!("127.0.0.1:{port}"),
                "--listen",
                "127.0.0.1:0",
            ])
            .args(["--duration", "12"])
            .stderr(std::fs::File::create(&log).expect("log"))
            .spawn()
            .expect("netjam jam"),
    );
    let stderr = || std::fs::read_to_string(&log).unwrap_or_default();
    server.wait_for_port(&format!("{client}:send_1"), "netjam jam --jack --codec opus");
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        stderr().contains("opus/48000/2ch, packets of 120 frames (2.50 ms), codec delay 2.5 ms"),
        "{}",
        stderr()
    );
    assert!(
        jam.0.try_wait().expect("wait").is_none(),
        "jam stopped early:\n{}",
        stderr()
    );
    let changed = server.run_bounded(
        {
            let mut c = Command::new("jack_bufsize");
            c.arg("128");
            c
        },
        Duration::from_secs(5),
    );
    assert!(
        changed.is_some_and(|o| o.status.success()),
        "jack_bufsize 128 failed"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(s) = jam.0.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "jam kept running after the period changed:\n{}",
            stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "{}", stderr());
    assert!(
        stderr().contains("the JACK server changed its period from 64 frames; restart netjam"),
        "{}",
        stderr()
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
        err.contains("jackd -d dummy") || err.contains("libjack is not installed"),
        "{err}"
    );
}

/// A `Process` that plays back what it captures and keeps each period's time, in memory
/// reserved before the stream starts.
struct Echo {
    times: Vec<u64>,
    frames_seen: usize,
    /// The JACK thread's allocation count at the first period, and how many it made since.
    first: Option<u64>,
    allocations: u64,
}

impl Process for Echo {
    fn process(&mut self, now_ns: u64, input: &[f32], output: &mut [f32]) {
        // Everything the JACK thread allocates after the first period's `process` shows up
        // here: the rest of that callback and every later one (up to this call).
        let now = alloc_count::allocations();
        let first = *self.first.get_or_insert(now);
        self.allocations = now - first;
        output.copy_from_slice(input);
        self.frames_seen += input.len();
        if self.times.len() < self.times.capacity() {
            self.times.push(now_ns);
        }
    }
}

#[test]
fn jack_callback_allocates_nothing_and_gets_nominal_period_times() {
    let _one = one_server_at_a_time();
    let server = Jackd::start("noalloc", 64);
    let endpoint = JackEndpoint::open(&JackConfig {
        name: "netjam-noalloc".into(),
        channels: 2,
        connect: false,
        server: Some(server.name.clone()),
    })
    .expect("open a client on the test server");
    let spec = endpoint.spec();
    assert_eq!((spec.rate, spec.period), (48_000, 64));
    assert_eq!((spec.input_channels, spec.output_channels), (2, 2));
    let endpoint = Box::new(endpoint.with_limit(Some(24_000)));
    let mut echo = Echo {
        times: Vec::with_capacity(100_000),
        frames_seen: 0,
        first: None,
        allocations: 0,
    };
    let stop = Arc::new(AtomicBool::new(false));
    // Stop after 8 s even if the limit is never reached; wakes as soon as `run` returns.
    let (done, finished) = mpsc::channel::<()>();
    let watchdog = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = finished.recv_timeout(Duration::from_secs(8));
            stop.store(true, Ordering::Relaxed);
        })
    };
    let (_, periods) = endpoint.run(&mut echo, stop.clone()).expect("run");
    drop(done);
    let _ = watchdog.join();
    assert!(
        echo.times.len() >= 300,
        "only {} periods ran in half a second of audio",
        echo.times.len()
    );
    assert_eq!(periods.periods as usize, echo.times.len());
    assert_eq!(echo.frames_seen, echo.times.len() * 64 * 2);
    assert_eq!(echo.allocations, 0, "the JACK callback allocated");
    // The times are the periods' nominal starts: strictly increasing, and on average a
    // period apart give or take a wide margin (this checks units and clock, not timing).
    assert!(echo.times.windows(2).all(|w| w[1] > w[0]));
    let span = echo.times[echo.times.len() - 1] - echo.times[0];
    let mean = span as f64 / (echo.times.len() - 1) as f64;
    assert!((700_000.0..2_000_000.0).contains(&mean), "mean period {mean} ns");
}
