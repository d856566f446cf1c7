//! A private JACK server on the dummy driver (Debian's jackd2, installed by scripts/deps),
//! and its clients.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{require, Proc, BIN};

/// One JACK server at a time: two dummy servers plus their clients on a small machine cause
/// xruns, and each xrun moves what the tests measure.
fn one_server_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A private JACK server on the dummy driver at 48000 Hz, stopped on drop; clients find it
/// through `JACK_DEFAULT_SERVER`. While it exists no other test of the same binary has one.
///
/// jackd keeps a machine-wide table of at most 8 servers in shared memory; one that is
/// killed outright leaves its entry behind until a server of the same name starts again. So
/// the server is stopped with SIGTERM (it unregisters itself), and names come from a small
/// fixed set per test, so an entry left by a crashed run is reclaimed by the next one.
#[derive(Debug)]
pub struct Jackd {
    name: String,
    child: Child,
    log: PathBuf,
    stopped: bool,
    /// This server's turn of [`one_server_at_a_time`], given up after it stopped.
    turn: Option<MutexGuard<'static, ()>>,
}

impl Drop for Jackd {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Jackd {
    /// Stop the server now, under its clients (as an unplugged device goes away); the next
    /// test's server still waits until this is dropped.
    pub fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
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

    /// Start a server of `period` frames named `BASE-0` to `BASE-3`, the first that no live
    /// server has. `base` names the test, and differs between test files.
    pub fn start(base: &str, period: u32) -> Self {
        Self::start_with_ports(base, period, 2)
    }

    /// [`Jackd::start`] with `ports` physical capture and as many playback ports.
    pub fn start_with_ports(base: &str, period: u32, ports: u16) -> Self {
        Self::start_full(base, period, ports, 48_000)
    }

    /// [`Jackd::start`] at another sample rate than 48 kHz.
    pub fn start_at_rate(base: &str, period: u32, rate: u32) -> Self {
        Self::start_full(base, period, 2, rate)
    }

    fn start_full(base: &str, period: u32, ports: u16, rate: u32) -> Self {
        require("jackd", "jackd2");
        require("jack_lsp", "jackd2");
        let turn = one_server_at_a_time();
        let mut failures = String::new();
        for slot in 0..4 {
            let name = format!("{base}-{slot}");
            match Self::try_start(&name, period, ports, rate) {
                Ok(mut server) => {
                    server.turn = Some(turn);
                    return server;
                }
                Err(why) => failures.push_str(&format!("{name}: {why}\n")),
            }
        }
        panic!("could not start a JACK server:\n{failures}");
    }

    /// Start jackd as `name` unless a live server already has that name (another test run).
    fn try_start(name: &str, period: u32, ports: u16, rate: u32) -> Result<Self, String> {
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
                &rate.to_string(),
                "-p",
                &period.to_string(),
                "-C",
                &ports.to_string(),
                "-P",
                &ports.to_string(),
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
            stopped: false,
            turn: None,
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
                .run_bounded(&mut Command::new("jack_lsp"), Duration::from_secs(2))
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

    /// The server's process id (to stop and continue it as a machine that held it up would).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// What jackd printed.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `cmd` as a client of this server (never starting another).
    pub fn client<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.env("JACK_DEFAULT_SERVER", &self.name)
            .env("JACK_NO_START_SERVER", "1")
            .env("JACK_NO_AUDIO_RESERVATION", "1")
    }

    /// Run a client to completion, or kill it after `limit` and return None.
    pub fn run_bounded(&self, cmd: &mut Command, limit: Duration) -> Option<Output> {
        let mut child = Proc::spawn(
            self.client(cmd).stdout(Stdio::piped()).stderr(Stdio::piped()),
            "a JACK client",
        );
        // Read both pipes as the client writes, so that a long output never blocks it.
        let stdout = read_all(child.child.stdout.take());
        let stderr = read_all(child.child.stderr.take());
        let status = child.wait_until(limit)?;
        Some(Output {
            status,
            stdout: stdout.join().unwrap_or_default(),
            stderr: stderr.join().unwrap_or_default(),
        })
    }

    /// `netjam ARGS` as a client of this server, run to completion (killed after 20 s).
    pub fn netjam(&self, args: &[&str]) -> Output {
        self.run_bounded(Command::new(BIN).args(args), Duration::from_secs(20))
            .unwrap_or_else(|| panic!("netjam {args:?} did not finish within 20 s"))
    }

    /// The server's ports, one a line (`jack_lsp`).
    pub fn ports(&self) -> String {
        self.run_bounded(&mut Command::new("jack_lsp"), Duration::from_secs(2))
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    pub fn connect(&self, from: &str, to: &str) {
        let out = self.run_bounded(
            Command::new("jack_connect").args([from, to]),
            Duration::from_secs(3),
        );
        assert!(
            out.as_ref().is_some_and(|o| o.status.success()),
            "jack_connect {from} {to} failed: {:?}",
            out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        );
    }

    /// Wait up to 5 s for `port` to appear; `what` is the client that registers it.
    pub fn wait_for_port(&self, port: &str, what: &str) {
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

/// Everything `pipe` yields until it closes, read in a thread.
fn read_all<R: Read + Send + 'static>(pipe: Option<R>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}
