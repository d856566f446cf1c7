//! What the netjam integration tests share: child processes that never outlive a failing
//! assertion, `netjam reflect`, `impair` and `recv` on ephemeral loopback ports, temporary
//! files, checks for the tools scripts/deps installs, and (in submodules) a private Redis, a private JACK
//! server, an echoing `Process` and the analysis of decoded tones.
//!
//! Every test binary compiles this module on its own and uses a part of it.
#![allow(dead_code)]

pub mod echo;
pub mod jackd;
pub mod natlab;
pub mod redis;
pub mod signal;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_netjam");

/// A child process killed and reaped when dropped, so a failing assertion leaves nothing
/// running; its stderr read line by line if it was started with [`Proc::spawn_lines`].
#[derive(Debug)]
pub struct Proc {
    pub child: Child,
    what: &'static str,
    lines: Option<mpsc::Receiver<String>>,
}

impl Proc {
    pub fn spawn(cmd: &mut Command, what: &'static str) -> Self {
        let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Self {
            child,
            what,
            lines: None,
        }
    }

    /// Start with stderr read line by line in a thread.
    pub fn spawn_lines(cmd: &mut Command, what: &'static str) -> Self {
        let mut p = Self::spawn(cmd.stderr(Stdio::piped()), what);
        let stderr = p.child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        p.lines = Some(rx);
        p
    }

    fn lines(&self) -> &mpsc::Receiver<String> {
        self.lines.as_ref().expect("started with spawn_lines")
    }

    /// The next line it prints within `timeout`, if any.
    pub fn line_within(&self, timeout: Duration) -> Option<String> {
        self.lines().recv_timeout(timeout).ok()
    }

    /// Reads lines, keeping each in `said`, until one satisfies `want`, within `timeout`;
    /// panics with all it said, naming it `name`, when none does or it exits first.
    pub fn line_keeping(
        &mut self,
        name: &str,
        said: &mut Vec<String>,
        what: &str,
        timeout: Duration,
        want: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.line_within(left.min(Duration::from_millis(200))) {
                Some(line) => {
                    said.push(line.clone());
                    if want(&line) {
                        return line;
                    }
                }
                None => {
                    let exited = !self.running();
                    if exited || left.is_zero() {
                        said.extend(self.drain_lines());
                        panic!(
                            "{name}: no {what} within {timeout:?}{}; it said: {said:#?}",
                            if exited { " (it exited)" } else { "" },
                        );
                    }
                }
            }
        }
    }

    pub fn next_line(&self, timeout: Duration) -> String {
        self.line_within(timeout)
            .unwrap_or_else(|| panic!("{} printed nothing within {timeout:?}", self.what))
    }

    /// Every line printed so far.
    pub fn drain_lines(&self) -> Vec<String> {
        self.lines
            .as_ref()
            .map_or_else(Vec::new, |l| l.try_iter().collect())
    }

    /// Wait for the process to exit on its own; None after `timeout` (the drop kills it).
    pub fn wait_until(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Wait for the process to exit on its own; panics (and the drop kills it) after
    /// `timeout`.
    pub fn wait_for(&mut self, timeout: Duration) -> ExitStatus {
        self.wait_until(timeout)
            .unwrap_or_else(|| panic!("{} did not finish within {timeout:?}", self.what))
    }

    /// [`Proc::wait_for`], then everything else it printed (waiting for the last lines).
    pub fn finish(&mut self, timeout: Duration) -> (ExitStatus, Vec<String>) {
        let status = self.wait_for(timeout);
        let mut out = Vec::new();
        if let Some(lines) = &self.lines {
            // The reader thread ends with the pipe.
            while let Ok(l) = lines.recv_timeout(Duration::from_secs(2)) {
                out.push(l);
            }
        }
        (status, out)
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGINT, as Ctrl-C would (`gst-launch-1.0 -e` turns it into end-of-stream).
    pub fn interrupt(&self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
    }

    /// The first line it prints that contains `needle`, waiting at most `within` in all
    /// (started with [`Proc::spawn_lines`]).
    pub fn line_with(&self, needle: &str, within: Duration) -> String {
        let deadline = Instant::now() + within;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.line_within(left) {
                Some(l) if l.contains(needle) => return l,
                Some(_) => {}
                None => break,
            }
        }
        panic!("{} printed no line with {needle:?} within {within:?}", self.what);
    }

    /// Interrupts a server (as Ctrl-C would) and returns the report it wrote to `json`; it
    /// must still have been running and must exit cleanly within `timeout`.
    pub fn stop_server(&mut self, json: &Path, timeout: Duration) -> serde_json::Value {
        assert!(self.running(), "the server died: {:?}", self.drain_lines());
        self.interrupt();
        let (status, said) = self.finish(timeout);
        assert!(status.success(), "the server failed: {said:?}");
        read_json(json)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The first address in `line` ("netjam: listening on 127.0.0.1:4464",
/// "netjam impair: 127.0.0.1:5000 -> 127.0.0.1:4464").
pub fn address_in(line: &str) -> SocketAddr {
    line.split_whitespace()
        .find_map(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}

/// `netjam ARGS` (listening on `127.0.0.1:0`) with its stderr read line by line, and the
/// address it says in its first line that it took.
fn start_listening(args: &[&str], what: &'static str) -> (Proc, SocketAddr) {
    let p = Proc::spawn_lines(Command::new(BIN).args(args).stdout(Stdio::null()), what);
    let addr = address_in(&p.next_line(Duration::from_secs(10)));
    (p, addr)
}

/// `netjam reflect` on an ephemeral loopback port for `seconds`, once it is listening.
pub fn reflect(seconds: &str) -> (Proc, SocketAddr) {
    start_listening(
        &["reflect", "--listen", "127.0.0.1:0", "--duration", seconds],
        "netjam reflect",
    )
}

/// `netjam impair` on an ephemeral loopback port forwarding to `to`, with `args` (link and
/// duration), once it is listening.
pub fn impair(to: SocketAddr, args: &[&str]) -> (Proc, SocketAddr) {
    let to = to.to_string();
    let head = ["impair", "--listen", "127.0.0.1:0", "--forward", &to];
    start_listening(&[&head[..], args].concat(), "netjam impair")
}

/// The counters `netjam impair` prints as its last line ("netjam impair: {json}").
pub fn impair_counters(said: &[String]) -> Option<serde_json::Value> {
    said.iter()
        .rev()
        .find_map(|l| l.strip_prefix("netjam impair: {").map(|j| format!("{{{j}")))
        .and_then(|j| serde_json::from_str(&j).ok())
}

/// `netjam recv` on an ephemeral loopback port with `args`, once it is listening.
pub fn start_recv(args: &[&str]) -> (Proc, SocketAddr) {
    start_listening(
        &[&["recv", "--listen", "127.0.0.1:0"][..], args].concat(),
        "netjam recv",
    )
}

/// A loopback UDP port nobody uses right now.
pub fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// This test run's directory `netjam-TAG-PID` in the system's temporary directory.
pub fn tmp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("netjam-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// `name` in [`tmp_dir`]`(tag)`.
pub fn tmp(tag: &str, name: &str) -> PathBuf {
    tmp_dir(tag).join(name)
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `netjam server` on a free loopback port for at most `duration_s` seconds, once it says
/// it is serving rooms (within `timeout`): the process and its address.
pub fn room_server(duration_s: &str, timeout: Duration) -> (Proc, SocketAddr) {
    // Port 0: the server binds a free port itself and says which. A port found free here
    // and handed over could be taken by another test in between (the server then exits).
    let server = Proc::spawn_lines(
        Command::new(BIN).args(["server", "--listen", "127.0.0.1:0", "--duration", duration_s]),
        "netjam server",
    );
    let line = server.line_with("serving rooms", timeout);
    let addr = line
        .split_whitespace()
        .nth(4)
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (server, addr)
}

/// The fingerprint of its key a `netjam server` prints after its address ("this server's
/// key is 1a2b-…"), waited for within `timeout`.
pub fn server_fingerprint(server: &Proc, timeout: Duration) -> String {
    let line = server.line_with("this server's key is", timeout);
    let fp = line
        .split("key is ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or_else(|| panic!("no fingerprint in {line:?}"))
        .to_owned();
    assert_eq!(fp.len(), 19, "{line}");
    fp
}

/// `netjam jam` joining room "band" on `server` as `name`, playing a mono sine at `hz` for
/// `seconds`: a player of the room tests, for the caller to add its own flags to and spawn.
pub fn sine_player(server: SocketAddr, name: &str, hz: &str, seconds: &str) -> Command {
    let mut c = Command::new(BIN);
    c.args(["jam", "--server", &server.to_string(), "--room", "band"])
        .args([
            "--name",
            name,
            "--sine",
            hz,
            "--duration",
            seconds,
            "--channels",
            "1",
        ]);
    c
}

/// Runs the python `script` with the argument `arg`, which must succeed, and parses each
/// line it prints as JSON.
pub fn python_json_lines(script: &str, arg: &str) -> Vec<serde_json::Value> {
    let out = Command::new("python3")
        .args(["-c", script, arg])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python-osc client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

/// Panics unless python3 can import `modules` from python-osc (e.g.
/// `"pythonosc.udp_client, pythonosc.osc_message"`); scripts/deps installs it.
pub fn require_python_osc(modules: &str) {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .output();
    assert!(
        ok.is_ok_and(|o| o.status.success()),
        "python3 with the pythonosc module (python-osc) is not installed: run scripts/deps"
    );
}

/// Starts liblo's `oscdump` on `port`, sends it each packet and returns the lines it prints
/// for them, waiting at most `timeout` for each. The first is sent until oscdump prints (it
/// gives no sign of being ready).
pub fn oscdump_lines(port: u16, packets: &[&[u8]], timeout: Duration) -> Vec<String> {
    let mut dump = Proc::spawn(
        Command::new("oscdump")
            .args(["-L", &port.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
        "oscdump",
    );
    let stdout = dump.child.stdout.take().expect("stdout");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let to = SocketAddr::from(([127, 0, 0, 1], port));
    let mut got = Vec::new();
    let deadline = Instant::now() + timeout;
    while got.is_empty() {
        assert!(Instant::now() < deadline, "oscdump printed nothing");
        socket.send_to(packets[0], to).expect("send");
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(250)) {
            got.push(l);
        }
    }
    // Only one copy of the first packet is wanted; later copies are skipped below.
    for p in &packets[1..] {
        socket.send_to(p, to).expect("send");
        loop {
            let l = lines.recv_timeout(timeout).expect("oscdump line");
            if l != got[0] {
                got.push(l);
                break;
            }
        }
    }
    drop(dump);
    got
}

/// Panics unless `tool` is on the PATH; scripts/deps installs it with Debian's `package`.
pub fn require(tool: &str, package: &str) {
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

/// Panics unless GStreamer has each of `elements`.
pub fn require_gstreamer(elements: &[&str]) {
    for element in elements {
        let ok = Command::new("gst-inspect-1.0")
            .arg(element)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        assert!(
            ok.is_ok_and(|s| s.success()),
            "GStreamer's {element} is missing: run scripts/deps (installs gstreamer1.0-tools, -plugins-base and -plugins-good)"
        );
    }
}

/// GStreamer receiving RTP on a free loopback port and writing what it decodes to a WAV
/// file: `gst-launch-1.0 -e udpsrc caps=CAPS ! CHAIN ! wavenc ! filesink`.
#[derive(Debug)]
pub struct GstReceiver {
    gst: Proc,
    pub port: u16,
    log: PathBuf,
}

impl GstReceiver {
    /// Start the pipeline, `chain` being its elements between udpsrc and wavenc separated by
    /// white space as on gst-launch's command line, and wait until it listens. What it
    /// prints on stdout (its warnings among it) goes to `log`.
    pub fn start(caps: &str, chain: &str, output: &Path, log: &Path) -> Self {
        let port = free_udp_port();
        let mut gst = Proc::spawn_lines(
            Command::new("gst-launch-1.0")
                .args(["-e", "udpsrc", &format!("port={port}"), "address=127.0.0.1"])
                .arg(format!("caps={caps}"))
                .arg("!")
                .args(chain.split_whitespace())
                .args(["!", "wavenc", "!", "filesink"])
                .arg(format!("location={}", output.display()))
                .stdout(std::fs::File::create(log).expect("log file")),
            "gst-launch-1.0 (receiver)",
        );
        // udpsrc binds with SO_REUSEADDR; a plain bind fails once it has the port.
        let deadline = Instant::now() + Duration::from_secs(10);
        while UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            assert!(
                gst.running() && Instant::now() < deadline,
                "GStreamer did not open port {port}: {:?}",
                gst.drain_lines()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(200)); // from PAUSED to PLAYING
        Self {
            gst,
            port,
            log: log.to_path_buf(),
        }
    }

    /// Where to send the stream.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Give the last packets 300 ms, then end the stream with SIGINT (`-e` turns it into
    /// end-of-stream, so wavenc finishes its file): the exit status and all it printed.
    pub fn stop(mut self) -> (ExitStatus, String) {
        std::thread::sleep(Duration::from_millis(300));
        self.gst.interrupt();
        let status = self.gst.wait_for(Duration::from_secs(10));
        let mut said = std::fs::read_to_string(&self.log).unwrap_or_default();
        said.extend(self.gst.drain_lines().iter().map(|l| format!("{l}\n")));
        (status, said)
    }
}

/// Waits until the file at `path` (a child's stderr log) contains `needle`, up to
/// `timeout`; true when it does.
pub fn wait_for_text(path: &Path, needle: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if std::fs::read_to_string(path).is_ok_and(|t| t.contains(needle)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
