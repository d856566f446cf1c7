//! What the ensemble's real-process tests share: `netjam` children whose stdout lines are
//! collected as they come (and which are killed when dropped), and a `Band`: an ensemble
//! name and discovery port list of its own per test, so tests running at once never meet.
//! Every wait is bounded.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const NETJAM: &str = env!("CARGO_BIN_EXE_netjam");
pub const WAIT: Duration = Duration::from_secs(15);

/// A process killed when dropped, its stdout lines collected as they come.
pub struct Proc {
    pub child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    err: Arc<Mutex<Vec<String>>>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn collect<R: Read + Send + 'static>(r: R) -> Arc<Mutex<Vec<String>>> {
    let v = Arc::new(Mutex::new(Vec::new()));
    let w = v.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            w.lock().unwrap().push(line);
        }
    });
    v
}

pub fn spawn(cmd: &mut Command) -> Proc {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start netjam");
    let lines = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    Proc { child, lines, err }
}

impl Proc {
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits (bounded) for a line satisfying `f`; returns it.
    pub fn wait_for(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = self.lines().into_iter().find(|l| f(l)) {
                return l;
            }
            assert!(
                start.elapsed() < WAIT,
                "no {what} within {WAIT:?}; output {:?}; stderr {:?}",
                self.lines(),
                self.err.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn err_lines(&self) -> Vec<String> {
        self.err.lock().unwrap().clone()
    }

    /// Waits (bounded by `within`) for a line on stderr satisfying `f`; returns it.
    pub fn wait_err(&self, what: &str, within: Duration, f: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            if let Some(l) = self.err_lines().into_iter().find(|l| f(l)) {
                return l;
            }
            assert!(
                start.elapsed() < within,
                "no {what} within {within:?}; stderr {:?}",
                self.err_lines()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until this member has an ensemble time: it is the reference, or it locked
    /// onto the reference it follows now.
    pub fn wait_clock(&self) {
        let id = self.id();
        let start = Instant::now();
        loop {
            let l = self.lines();
            if let Some(r) = l.iter().rposition(|x| x.starts_with("clock-reference ")) {
                let reference = &l[r][16..];
                if reference == id || l[r..].iter().any(|x| *x == format!("clock-locked {reference}")) {
                    return;
                }
            }
            assert!(start.elapsed() < WAIT, "no ensemble time: {l:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// This member's id, from its first line.
    pub fn id(&self) -> String {
        let l = self.wait_for("member line", |l| l.starts_with("member "));
        l.split_whitespace().nth(1).unwrap().to_string()
    }
}

/// An ensemble name and discovery list of its own for each test (or a rooms server).
pub struct Band {
    pub name: String,
    pub port: String,
    /// Reach the ensemble through this rooms server (`--server`) instead.
    pub server: Option<String>,
}

impl Band {
    pub fn new(test: u16) -> Self {
        let pid = std::process::id() as u16;
        Band {
            name: format!("band-{pid}-{test}"),
            // Below the ephemeral range (32768–60999), so hellos reach no client socket
            // of another test; 64 ports per process, 4 tests of 16.
            port: (20_000 + (pid % 180) * 64 + test * 16).to_string(),
            server: None,
        }
    }

    /// The same ensemble reached through the rooms server at `server` (the room is the
    /// ensemble).
    pub fn in_room(test: u16, server: std::net::SocketAddr) -> Self {
        Band {
            server: Some(server.to_string()),
            ..Band::new(test)
        }
    }

    pub fn net(&self) -> Vec<&str> {
        match &self.server {
            Some(s) => vec!["--server", s],
            None => vec!["--local", "--discovery-port", &self.port],
        }
    }

    pub fn join(&self, services: &[&str], extra: &[&str]) -> Proc {
        let mut c = Command::new(NETJAM);
        c.args(["ensemble", "join", &self.name])
            .args(self.net())
            .args(extra);
        for s in services {
            c.args(["--service", s]);
        }
        spawn(&mut c)
    }

    pub fn send(&self, args: &[&str]) -> String {
        let out = Command::new(NETJAM)
            .args(["ensemble", "send"])
            .args(self.net())
            .args(["--wait", "10", &self.name])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "send {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts members offering `services` (one each) and waits until every one of them
    /// lists every service and their clocks agree on one reference.
    pub fn start(&self, services: &[&str]) -> Vec<Proc> {
        let members: Vec<Proc> = services.iter().map(|s| self.join(&[s], &[])).collect();
        let ids: Vec<String> = members.iter().map(Proc::id).collect();
        for m in &members {
            m.wait_for("full service table", |l| {
                l.starts_with("services ") && services.iter().all(|s| l.contains(&format!(" {s}@")))
            });
        }
        // One reference, every other member locked onto it.
        let start = Instant::now();
        loop {
            let refs: Vec<Option<String>> = members
                .iter()
                .map(|m| {
                    m.lines()
                        .iter()
                        .rev()
                        .find(|l| l.starts_with("clock-reference "))
                        .map(|l| l[16..].to_string())
                })
                .collect();
            if let Some(Some(r)) = refs.first() {
                let all_same = refs.iter().all(|x| x.as_deref() == Some(r.as_str()));
                let locked = members.iter().zip(&ids).all(|(m, id)| {
                    id == r || {
                        let l = m.lines();
                        let last_ref = l.iter().rposition(|x| x.starts_with("clock-reference "));
                        let last_lock = l.iter().rposition(|x| *x == format!("clock-locked {r}"));
                        matches!((last_ref, last_lock), (Some(a), Some(b)) if b > a)
                    }
                });
                if all_same && locked {
                    return members;
                }
            }
            assert!(start.elapsed() < WAIT, "clocks did not settle: {refs:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

pub fn messages(p: &Proc, needle: &str) -> Vec<String> {
    p.lines()
        .into_iter()
        .filter(|l| l.starts_with("msg ") && l.contains(needle))
        .collect()
}

pub fn field(line: &str, key: &str) -> String {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        .to_string()
}

pub fn ens_ns(s: &str) -> u64 {
    let (a, b) = s.split_once('.').unwrap();
    a.parse::<u64>().unwrap() * 1_000_000_000 + b.parse::<u64>().unwrap()
}

/// Click onsets in a WAV file as frames: the first sample above the threshold after
/// 100 ms without one. Returns the sample rate too.
pub fn onsets(path: &std::path::Path) -> (u32, Vec<u64>) {
    let mut r = hound::WavReader::open(path).unwrap();
    let spec = r.spec();
    let ch = usize::from(spec.channels);
    let samples: Vec<f64> = match spec.sample_format {
        hound::SampleFormat::Float => r.samples::<f32>().map(|s| f64::from(s.unwrap())).collect(),
        hound::SampleFormat::Int => {
            let scale = f64::from(1u32 << (spec.bits_per_sample - 1));
            r.samples::<i32>()
                .map(|s| f64::from(s.unwrap()) / scale)
                .collect()
        }
    };
    let gap = u64::from(spec.sample_rate) / 10;
    let mut found = Vec::new();
    let mut last: Option<u64> = None;
    for (i, s) in samples.iter().step_by(ch).enumerate() {
        let i = i as u64;
        if s.abs() > 0.05 {
            if !last.is_some_and(|l| i - l <= gap) {
                found.push(i);
            }
            last = Some(i);
        }
    }
    (spec.sample_rate, found)
}

/// Onsets in `path` as true times (monotonic ns), from the player's word on where its
/// first frame lies.
pub fn onset_times(p: &Proc, path: &std::path::Path) -> Vec<f64> {
    let l = p.wait_err("first frame", Duration::from_secs(1), |l| {
        l.contains("first frame heard")
    });
    let first: f64 = l.split_whitespace().rev().nth(1).unwrap().parse().unwrap();
    let (rate, frames) = onsets(path);
    frames
        .iter()
        .map(|f| first + *f as f64 * 1e9 / f64::from(rate))
        .collect()
}

/// The element of `v` nearest `t`.
pub fn nearest(v: &[f64], t: f64) -> f64 {
    v.iter()
        .copied()
        .min_by(|a, b| (a - t).abs().total_cmp(&(b - t).abs()))
        .unwrap()
}

/// A loopback UDP port free at the moment of asking.
pub fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .expect("local address")
        .port()
}

/// `name` in this test run's directory `netjam-TAG-PID` in the system's temporary directory.
pub fn tmp(tag: &str, name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("netjam-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d.join(name)
}
