//! Rooms across servers, with real processes: a private `redis-server`, two `netjam server
//! --directory` beside it on loopback, and `netjam jam` players sending sine tones through
//! the server (`--via-server`: a direct path between two players on one machine would keep
//! them hearing each other without any server, which is not what is tested here).
//!
//! * Four players naming server A join a room that server B hosts: each is redirected, says
//!   so, and ends on B hearing the other three. B is killed: within the lease plus the
//!   players' silence timeout and some slack, each plays on on A, hearing the other three
//!   under their names (the silence each measured is printed). B started again: nothing
//!   moves. Then A, the server each player named first (`--server A,B`), stops: each asks
//!   B, the next one it named, and plays on there once A's lease is gone.
//! * A room whose claim another server takes while it plays (written into Redis as B's,
//!   as a lease that ran out while A was cut off from Redis and a claim by B would leave
//!   it): A finds it at its next renewal, says so and sends its players to B; they say the
//!   room was handed over, play on on B hearing each other, and B keeps the claim renewed.
//! * `netjam rooms --server A` lists the public rooms of both servers (`jam --public`) with
//!   their players and their server's region label (`server --region`), and not the
//!   rooms nobody made public.
//! * Two ensemble members naming server A join their room on B (redirected), a message
//!   passes; B is killed: they follow the room back to A, and a message passes again.
//! * Redis stopped: the room in progress plays on, the server says once that it lost the
//!   directory, and a player asking for a new room is refused with the reason; Redis back:
//!   the server says so and a new room opens.
//!
//! What a player heard is read from its `--stats-json`: packets received from each member
//! of its final roster (the seats on the last server), and from the same names before.
//! Every wait is for something a process prints, with a generous timeout; every process
//! started is killed when the test ends, passed or failed.

mod common;
mod ensemble_support;

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::redis::RedisServer;
use common::{address_in, read_json, tmp_dir, Proc, BIN};
use netjam_engine::room::msg::MAX_WIRE_LEN;
use netjam_engine::room::{ClientConfig, RoomClient};

/// How long any one step may take on a loaded machine.
const STEP: Duration = Duration::from_secs(20);
/// Packets a second each player sends (64-frame packets at 48 kHz).
const PACKETS_PER_S: f64 = 750.0;
/// The lease of a claim and the silence after which a player gives its server up (the
/// server's default member timeout, told in the welcome).
const LEASE_S: f64 = 5.0;
const SILENCE_TIMEOUT_S: f64 = 5.0;

const PLAYERS: [(&str, u32); 4] = [("ana", 311), ("bo", 463), ("cy", 647), ("dee", 887)];

/// `netjam server --directory` on a loopback port.
struct DirServer {
    proc: Proc,
    addr: SocketAddr,
    json: PathBuf,
    said: Vec<String>,
}

impl DirServer {
    fn start(redis: &str, dir: &Path, tag: &str, listen: &str) -> Self {
        Self::start_in(redis, dir, tag, listen, "")
    }

    fn start_in(redis: &str, dir: &Path, tag: &str, listen: &str, region: &str) -> Self {
        let json = dir.join(format!("server-{tag}.json"));
        let proc = Proc::spawn_lines(
            Command::new(BIN)
                .args(["server", "--listen", listen, "--directory", redis, "--stats-json"])
                .arg(&json)
                .args(["--region", region])
                .env("NETJAM_NO_REALTIME", "1")
                .stdout(Stdio::null()),
            "netjam server",
        );
        let addr = address_in(
            &proc
                .line_with("serving rooms on", STEP)
                .replace("serving rooms on ", ""),
        );
        Self {
            proc,
            addr,
            json,
            said: Vec::new(),
        }
    }

    /// Reads its lines until one contains `needle`.
    fn wait_line(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if let Some(l) = self.proc.line_within(left) {
                self.said.push(l.clone());
                if l.contains(needle) {
                    return l;
                }
            }
        }
        panic!(
            "the server said no {needle:?} within {timeout:?}: {:#?}",
            self.said
        );
    }

    fn lines_with(&mut self, needle: &str) -> usize {
        self.said.extend(self.proc.drain_lines());
        self.said.iter().filter(|l| l.contains(needle)).count()
    }
}

/// A `netjam jam` player with what it printed so far.
struct Player {
    name: &'static str,
    proc: Proc,
    json: PathBuf,
    said: Vec<String>,
}

impl Player {
    fn start(
        name: &'static str,
        hz: u32,
        server: SocketAddr,
        room: &str,
        duration_s: f64,
        dir: &Path,
    ) -> Self {
        Self::start_with(name, hz, &server.to_string(), room, duration_s, dir, &[])
    }

    /// A player naming `servers` (`--server`: one, or several separated by commas).
    fn start_with(
        name: &'static str,
        hz: u32,
        servers: &str,
        room: &str,
        duration_s: f64,
        dir: &Path,
        extra: &[&str],
    ) -> Self {
        let json = dir.join(format!("{name}-{room}.json"));
        let proc = Proc::spawn_lines(
            Command::new(BIN)
                .args(["jam", "--server", servers, "--room", room, "--name", name])
                .args(["--sine", &hz.to_string(), "--via-server"])
                .args(["--duration", &duration_s.to_string(), "--output"])
                .arg(dir.join(format!("{name}-{room}.wav")))
                .arg("--stats-json")
                .arg(&json)
                .args(extra)
                .env("NETJAM_NO_REALTIME", "1")
                .stdout(Stdio::null()),
            "netjam jam",
        );
        Self {
            name,
            proc,
            json,
            said: Vec::new(),
        }
    }

    /// Reads its lines until one satisfies `want`; the time it came.
    fn wait_line(&mut self, what: &str, timeout: Duration, want: impl Fn(&str) -> bool) -> (String, Instant) {
        let line = self
            .proc
            .line_keeping(self.name, &mut self.said, what, timeout, want);
        (line, Instant::now())
    }

    /// Waits for its seat; how long the join took, as it says (ms, hello to welcome).
    fn wait_seated(&mut self) -> f64 {
        let (line, _) = self.wait_line("seat", STEP, |l| l.starts_with("netjam: in room"));
        line.rsplit("seated in ")
            .next()
            .and_then(|r| r.split(' ').next())
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("{}: no join time in {line:?}", self.name))
    }

    /// Waits until the roster it prints is exactly `names`.
    fn wait_roster(&mut self, room: &str, names: &[&str], timeout: Duration) {
        let mut want: Vec<&str> = names.to_vec();
        want.sort_unstable();
        let prefix = format!("netjam: room {room}: ");
        self.wait_line(&format!("roster {want:?}"), timeout, |l| {
            l.strip_prefix(&prefix).is_some_and(|rest| {
                let mut got: Vec<&str> = rest.split(", ").collect();
                got.sort_unstable();
                got == want
            })
        });
    }

    /// Waits for it to end on its own; its report.
    fn finish(mut self, timeout: Duration) -> serde_json::Value {
        let (status, rest) = self.proc.finish(timeout);
        self.said.extend(rest);
        assert!(status.success(), "{} failed: {:#?}", self.name, self.said);
        read_json(&self.json)
    }
}

/// Packets received from each name through each server (member ids are per server).
fn heard_by_name(report: &serde_json::Value) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for h in report["heard"].as_array().into_iter().flatten() {
        let server = h["server"].as_str().unwrap_or_default().to_owned();
        let name = h["name"].as_str().unwrap_or_default().to_owned();
        *out.entry((server, name)).or_default() += h["received"].as_u64().unwrap_or_default();
    }
    out
}

/// A seat without media on `server` in `room` (an ensemble-style member: in nobody's
/// roster), kept until dropped: the room is open on that server while it sits.
struct Holder {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<bool>>,
}

impl Holder {
    fn sit(server: SocketAddr, room: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (seated_tx, seated_rx) = std::sync::mpsc::channel();
        let thread = {
            let (stop, room) = (stop.clone(), room.to_owned());
            std::thread::spawn(move || {
                let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
                socket
                    .set_read_timeout(Some(Duration::from_millis(20)))
                    .expect("timeout");
                let start = Instant::now();
                let now = || start.elapsed().as_nanos() as u64 + 1;
                let mut cfg = ClientConfig::new(&room, "holder", "", 1);
                cfg.packets_per_s = 0;
                cfg.bytes_per_s = 0;
                cfg.secure = true;
                let mut client = RoomClient::new(cfg, now());
                let mut buf = [0u8; 2048];
                let mut told = false;
                while !stop.load(Ordering::Relaxed) {
                    while let Some(n) = client.poll_transmit(&mut buf[..MAX_WIRE_LEN]) {
                        let _ = socket.send_to(&buf[..n], server);
                    }
                    while client.poll_event().is_some() {}
                    if !told && client.seat().is_some() {
                        told = true;
                        let _ = seated_tx.send(());
                    }
                    if let Ok((n, from)) = socket.recv_from(&mut buf) {
                        if from == server && buf.first() == Some(&b'/') {
                            client.handle_datagram(now(), &buf[..n]);
                        }
                    }
                    if client.poll_timeout().is_some_and(|t| t <= now()) {
                        client.handle_timeout(now());
                    }
                }
                // Its seat goes with it: a later socket of this test given the same port
                // must not find a seat of another name there.
                client.leave(now());
                while let Some(n) = client.poll_transmit(&mut buf[..MAX_WIRE_LEN]) {
                    let _ = socket.send_to(&buf[..n], server);
                }
                told
            })
        };
        assert!(
            seated_rx.recv_timeout(STEP).is_ok(),
            "the holder got no seat on {server} within {STEP:?}"
        );
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One scenario at a time: several players pacing sine tones on two shared cores would
/// otherwise measure the machine, not the rooms.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn players_naming_a_front_door_end_on_the_rooms_server_and_play_on_after_it_dies() {
    let _turn = one_at_a_time();
    let dir = tmp_dir("rooms-directory-failover");
    let redis = RedisServer::start();
    let mut a = DirServer::start(&redis.url(), &dir, "a", "127.0.0.1:0");
    let b = DirServer::start(&redis.url(), &dir, "b", "127.0.0.1:0");
    let b_addr = b.addr;
    // B hosts the room: a seat is held there before any player comes.
    let holder = Holder::sit(b.addr, "band");
    const DURATION_S: f64 = 45.0;
    // Each names A first, then B: A is the front door while it answers.
    let servers = format!("{},{b_addr}", a.addr);
    let mut players: Vec<Player> = PLAYERS
        .iter()
        .map(|&(name, hz)| Player::start_with(name, hz, &servers, "band", DURATION_S, &dir, &[]))
        .collect();
    let mut join_s = Vec::new();
    for p in &mut players {
        let (line, _) = p.wait_line("redirect", STEP, |l| l.contains("lives on"));
        assert!(line.contains(&b_addr.to_string()), "{}: {line}", p.name);
        join_s.push(p.wait_seated());
    }
    for (i, p) in players.iter_mut().enumerate() {
        let others: Vec<&str> = PLAYERS
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, x)| x.0)
            .collect();
        p.wait_roster("band", &others, STEP);
    }
    eprintln!(
        "joined through a redirect in {:.0} ms median, {:.0} ms worst (hello to welcome)",
        median(&mut join_s.clone()),
        join_s.iter().copied().fold(0.0, f64::max)
    );
    // Music on B for a while, then B dies without a word (its leases are left to expire).
    std::thread::sleep(Duration::from_secs(4));
    drop(holder);
    let killed = Instant::now();
    drop(b);
    let deadline = Duration::from_secs_f64(LEASE_S + SILENCE_TIMEOUT_S + 15.0);
    let mut silences = Vec::new();
    for p in &mut players {
        let (line, at) = p.wait_line("move to A", deadline, |l| l.contains("moved to"));
        assert!(line.contains(&a.addr.to_string()), "{}: {line}", p.name);
        let said: f64 = line
            .split("after ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no silence in {line:?}"));
        let seen = at.duration_since(killed).as_secs_f64();
        eprintln!(
            "{}: back on A {seen:.1} s after B was killed; it measured {said:.1} s of silence",
            p.name
        );
        silences.push(seen);
    }
    let worst = silences.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "failover: silence median {:.1} s, worst {worst:.1} s (lease {LEASE_S} s, silence timeout {SILENCE_TIMEOUT_S} s)",
        median(&mut silences.clone())
    );
    assert!(worst <= deadline.as_secs_f64());
    // (The roster lines do not change: the same names sit in the same seats. What each
    // heard on A is read from its report below.)
    // B back (on its old port): the room stays where it is.
    let mut b = DirServer::start(&redis.url(), &dir, "b2", &b_addr.to_string());
    std::thread::sleep(Duration::from_secs(3));
    for p in &mut players {
        let moves = p.said.iter().filter(|l| l.contains("moved to")).count();
        p.said.extend(p.proc.drain_lines());
        assert_eq!(
            p.said.iter().filter(|l| l.contains("moved to")).count(),
            moves,
            "{} moved again when B came back: {:#?}",
            p.name,
            p.said
        );
    }
    assert_eq!(
        b.lines_with("room band"),
        0,
        "a player sat on the restarted B: {:#?}",
        b.said
    );
    let playing_on_a = killed.elapsed().as_secs_f64();
    // Now the front door itself goes: A stops. Each player asks the next server it named
    // (B), which sends it back to A while A's lease on the room stands, and claims the
    // room once it is gone: the band plays on on B.
    let report = a.proc.stop_server(&a.json, STEP);
    a.said.extend(a.proc.drain_lines());
    assert!(
        report["server"]["redirects"].as_u64().unwrap_or(0) >= 4,
        "{}",
        report["server"]
    );
    let stopped = Instant::now();
    let mut silences = Vec::new();
    for p in &mut players {
        let (line, at) = p.wait_line("move to B", deadline, |l| {
            l.contains("moved to") && l.contains(&b_addr.to_string())
        });
        let seen = at.duration_since(stopped).as_secs_f64();
        eprintln!(
            "{}: on B {seen:.1} s after A, the server it named first, stopped: {line}",
            p.name
        );
        silences.push(seen);
    }
    eprintln!(
        "front door gone: silence median {:.1} s, worst {:.1} s",
        median(&mut silences.clone()),
        silences.iter().copied().fold(0.0, f64::max)
    );
    let reports: Vec<(&str, serde_json::Value)> = players
        .into_iter()
        .map(|p| (p.name, p.finish(Duration::from_secs_f64(DURATION_S) + STEP)))
        .collect();
    let (a_text, b_text) = (a.addr.to_string(), b_addr.to_string());
    for (i, (name, r)) in reports.iter().enumerate() {
        let heard = heard_by_name(r);
        for (j, (other, _)) in PLAYERS.iter().enumerate() {
            let on = |server: &str| {
                heard
                    .get(&(server.to_owned(), (*other).to_owned()))
                    .copied()
                    .unwrap_or(0)
            };
            if i == j {
                assert_eq!(on(&a_text) + on(&b_text), 0, "{name} heard itself");
                continue;
            }
            // Each played a few seconds on B, a quarter of a minute on A, and the rest on B
            // again (B restarted, on the same port); a loaded machine starves players'
            // threads for whole seconds, so the bounds are far below that: a second's
            // packets through each.
            let (on_a, on_b) = (on(&a_text), on(&b_text));
            eprintln!("{name} heard {other}: {on_b} packets through B, {on_a} through A");
            assert!(
                on_b as f64 >= PACKETS_PER_S,
                "{name} heard {other} through B for less than 1 s: {on_b}"
            );
            assert!(
                on_a as f64 >= PACKETS_PER_S,
                "{name} heard {other} through A for less than 1 s: {on_a}"
            );
        }
    }
    assert!(playing_on_a > 3.0);
    drop(b);
}

#[test]
fn without_redis_rooms_in_progress_play_on_and_new_rooms_wait_for_it() {
    let _turn = one_at_a_time();
    let dir = tmp_dir("rooms-directory-redis-lost");
    let mut redis = RedisServer::start();
    let mut a = DirServer::start(&redis.url(), &dir, "a", "127.0.0.1:0");
    const DURATION_S: f64 = 30.0;
    let mut band: Vec<Player> = PLAYERS[..2]
        .iter()
        .map(|&(name, hz)| Player::start(name, hz, a.addr, "band", DURATION_S, &dir))
        .collect();
    let mut join_s = Vec::new();
    for p in &mut band {
        join_s.push(p.wait_seated());
    }
    band[0].wait_roster("band", &["bo"], STEP);
    band[1].wait_roster("band", &["ana"], STEP);
    eprintln!(
        "joined without a redirect in {:.0} ms and {:.0} ms (hello to welcome; the first to come claims the room)",
        join_s[0], join_s[1]
    );
    redis.stop();
    let lost_at = Instant::now();
    a.wait_line("lost the room directory", STEP);
    // A new room is refused, with the reason.
    let mut cy = Player::start("cy", 647, a.addr, "duo", 5.0, &dir);
    let (status, said) = cy.proc.finish(STEP);
    assert!(
        !status.success(),
        "cy was seated in a new room without Redis: {said:#?}"
    );
    assert!(
        said.iter().any(|l| l.contains("cannot reach the room directory")),
        "cy was not told why: {said:#?}"
    );
    // The room in progress takes a newcomer too: it is open here.
    let mut dee = Player::start("dee", 887, a.addr, "band", 5.0, &dir);
    dee.wait_seated();
    // Redis back: said once, and new rooms open again.
    std::thread::sleep(Duration::from_secs(2));
    redis.restart();
    let down_s = lost_at.elapsed().as_secs_f64();
    a.wait_line("answers again", STEP);
    let mut cy = Player::start("cy", 647, a.addr, "duo", 3.0, &dir);
    cy.wait_seated();
    cy.finish(STEP);
    dee.finish(STEP);
    assert_eq!(a.lines_with("lost the room directory"), 1, "{:#?}", a.said);
    for (i, p) in band.into_iter().enumerate() {
        let name = p.name;
        let r = p.finish(Duration::from_secs_f64(DURATION_S) + STEP);
        let other = PLAYERS[1 - i].0;
        let got = heard_by_name(&r)
            .get(&(a.addr.to_string(), other.to_owned()))
            .copied()
            .unwrap_or(0);
        // It heard the other through the whole outage: at least half of the packets sent
        // while Redis was down, however loaded the machine.
        eprintln!("{name} heard {other}: {got} packets; Redis was down {down_s:.1} s");
        assert!(
            got as f64 >= 0.5 * down_s * PACKETS_PER_S,
            "{name} heard {other} for {got} packets only, Redis down {down_s:.1} s"
        );
    }
    let report = a.proc.stop_server(&a.json, STEP);
    assert_eq!(
        report["server"]["timeouts"].as_u64(),
        Some(0),
        "{}",
        report["server"]
    );
}

/// `redis-cli` against the test's Redis: its answer.
fn redis_cli(redis: &RedisServer, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &redis.addr.port().to_string()])
        .args(args)
        .output()
        .expect("redis-cli (Debian's redis-tools, installed with redis-server)");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn a_room_another_server_took_over_moves_there_whole() {
    let _turn = one_at_a_time();
    let dir = tmp_dir("rooms-directory-handed-over");
    let redis = RedisServer::start();
    let mut a = DirServer::start(&redis.url(), &dir, "a", "127.0.0.1:0");
    let b = DirServer::start(&redis.url(), &dir, "b", "127.0.0.1:0");
    const DURATION_S: f64 = 16.0;
    let mut band: Vec<Player> = PLAYERS[..2]
        .iter()
        .map(|&(name, hz)| Player::start(name, hz, a.addr, "band", DURATION_S, &dir))
        .collect();
    for p in &mut band {
        p.wait_seated();
    }
    band[0].wait_roster("band", &["bo"], STEP);
    band[1].wait_roster("band", &["ana"], STEP);
    let key = "netjam:room:band";
    assert!(redis_cli(&redis, &["GET", key]).ends_with(&a.addr.to_string()));
    // B's claim now, as if A's lease had run out while it was cut off from Redis.
    let taken = Instant::now();
    let value = format!("999999999 {}", b.addr);
    assert_eq!(redis_cli(&redis, &["SET", key, &value, "PX", "5000"]), "OK");
    a.wait_line(&format!("now claimed by {}", b.addr), STEP);
    for p in &mut band {
        let (line, at) = p.wait_line("handed over", STEP, |l| l.contains("handed it over"));
        eprintln!(
            "{} {:.2} s after the claim changed: {line}",
            p.name,
            at.duration_since(taken).as_secs_f64()
        );
        assert!(line.contains(&b.addr.to_string()), "{line}");
    }
    // B took the claim that names it over (with an epoch of its own) and renews it: past
    // the lease it is still B's.
    std::thread::sleep(Duration::from_secs_f64(LEASE_S + 1.5));
    let held = redis_cli(&redis, &["GET", key]);
    assert!(
        held.ends_with(&format!(" {}", b.addr)),
        "B kept the claim: {held:?}"
    );
    for (i, p) in band.into_iter().enumerate() {
        let name = p.name;
        let r = p.finish(Duration::from_secs_f64(DURATION_S) + STEP);
        let other = PLAYERS[1 - i].0;
        let on_b = heard_by_name(&r)
            .get(&(b.addr.to_string(), other.to_owned()))
            .copied()
            .unwrap_or(0);
        eprintln!("{name} heard {other} on B: {on_b} packets");
        // On B for the last 7 s or more: at least half of it, however loaded the machine.
        assert!(
            on_b as f64 >= 0.5 * (LEASE_S + 1.5) * PACKETS_PER_S,
            "{name} heard {other} on B for {on_b} packets only"
        );
    }
    let report = a.proc.stop_server(&a.json, STEP);
    assert_eq!(
        report["server"]["moved_members"].as_u64(),
        Some(2),
        "{}",
        report["server"]
    );
}

/// `netjam rooms --server SERVER --json`: room → (players, region, server).
fn rooms_at(server: SocketAddr) -> BTreeMap<String, (u64, String, String)> {
    let out = Command::new(BIN)
        .args([
            "rooms",
            "--server",
            &server.to_string(),
            "--json",
            "--timeout",
            "10",
        ])
        .output()
        .expect("run netjam rooms");
    assert!(
        out.status.success(),
        "netjam rooms failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON from netjam rooms");
    list.as_array()
        .expect("a list")
        .iter()
        .map(|r| {
            (
                r["room"].as_str().unwrap_or_default().to_owned(),
                (
                    r["members"].as_u64().unwrap_or_default(),
                    r["region"].as_str().unwrap_or_default().to_owned(),
                    r["server"].as_str().unwrap_or_default().to_owned(),
                ),
            )
        })
        .collect()
}

#[test]
fn public_rooms_of_every_server_are_listed_with_players_and_region() {
    let _turn = one_at_a_time();
    let dir = tmp_dir("rooms-directory-list");
    let redis = RedisServer::start();
    let a = DirServer::start_in(&redis.url(), &dir, "a", "127.0.0.1:0", "eu-west");
    let b = DirServer::start_in(&redis.url(), &dir, "b", "127.0.0.1:0", "us-east");
    const DURATION_S: f64 = 20.0;
    // Two players make "band" public on B (one names A and is sent there); one plays in a
    // room on A that nobody made public.
    let mut players = vec![
        Player::start_with(
            "ana",
            311,
            &b.addr.to_string(),
            "band",
            DURATION_S,
            &dir,
            &["--public"],
        ),
        Player::start("cy", 647, a.addr, "secret", DURATION_S, &dir),
    ];
    players[0].wait_seated();
    players.push(Player::start_with(
        "bo",
        463,
        &a.addr.to_string(),
        "band",
        DURATION_S,
        &dir,
        &["--public"],
    ));
    for p in &mut players[1..] {
        p.wait_seated();
    }
    players[0].wait_roster("band", &["bo"], STEP);
    // The list is refreshed every renewal (1 s): ask until it shows both players.
    let deadline = Instant::now() + STEP;
    let listed = loop {
        let listed = rooms_at(a.addr);
        if listed.get("band").is_some_and(|r| r.0 == 2) || Instant::now() >= deadline {
            break listed;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("netjam rooms --server A: {listed:?}");
    assert_eq!(
        listed.get("band"),
        Some(&(2, "us-east".to_owned(), b.addr.to_string())),
        "{listed:?}"
    );
    assert!(
        !listed.contains_key("secret"),
        "a room nobody made public is listed: {listed:?}"
    );
    assert_eq!(rooms_at(b.addr), listed, "the two servers list differently");
    for p in players {
        p.finish(Duration::from_secs_f64(DURATION_S) + STEP);
    }
    // Once its players left, the room is no longer listed (within a renewal).
    std::thread::sleep(Duration::from_secs(2));
    assert!(!rooms_at(a.addr).contains_key("band"));
    drop((a, b));
}

#[test]
fn ensemble_members_naming_a_front_door_follow_their_room_there_and_back() {
    let _turn = one_at_a_time();
    let dir = tmp_dir("rooms-directory-ensemble");
    let redis = RedisServer::start();
    let a = DirServer::start(&redis.url(), &dir, "ea", "127.0.0.1:0");
    let b = DirServer::start(&redis.url(), &dir, "eb", "127.0.0.1:0");
    let band = format!("ens-{}", std::process::id());
    // B hosts the ensemble's room before anyone comes.
    let holder = Holder::sit(b.addr, &band);
    let a_text = a.addr.to_string();
    let member = |service: &str| {
        ensemble_support::spawn(
            Command::new(BIN)
                .args([
                    "ensemble",
                    "join",
                    &band,
                    "--server",
                    &a_text,
                    "--service",
                    service,
                ])
                .env("NETJAM_LOG", "info"),
        )
    };
    let (keys, bass) = (member("keys"), member("bass"));
    for m in [&keys, &bass] {
        m.wait_for("both services", |l| {
            l.starts_with("services ") && l.contains(" keys@") && l.contains(" bass@")
        });
    }
    let send = |path: &str| {
        Command::new(BIN)
            .args([
                "ensemble", "send", "--server", &a_text, "--wait", "10", &band, path, "f:1",
            ])
            .output()
            .expect("send")
    };
    let sent = send("/bass/before");
    assert!(sent.status.success(), "{}", String::from_utf8_lossy(&sent.stderr));
    bass.wait_for("the message through B", |l| l.contains("/bass/before"));
    // B dies: once its lease is gone and the members noticed the silence, they are back
    // through A, where the room opens again.
    drop(holder);
    let killed = Instant::now();
    drop(b);
    let deadline = Duration::from_secs_f64(LEASE_S + SILENCE_TIMEOUT_S + 20.0);
    loop {
        let sent = send("/bass/after");
        if sent.status.success() && bass.lines().iter().any(|l| l.contains("/bass/after")) {
            break;
        }
        assert!(
            killed.elapsed() < deadline,
            "no message reached bass through A within {deadline:?} of B's end: bass said {:?} {:?}; the sender {}",
            bass.lines(),
            bass.err_lines(),
            String::from_utf8_lossy(&sent.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "ensemble back through A {:.1} s after B was killed",
        killed.elapsed().as_secs_f64()
    );
    assert!(
        bass.err_lines().iter().any(|l| l.contains("the room is on")),
        "bass never said it followed the redirect: {:?}",
        bass.err_lines()
    );
    drop(a);
}

/// A number from Redis's `INFO` answer (`field:value` lines).
fn redis_info(redis: &RedisServer, section: &str, field: &str) -> f64 {
    let info = redis_cli(redis, &["INFO", section]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in INFO {section}: {info}"))
}

/// Calls of every command so far, from `INFO commandstats` (`cmdstat_NAME:calls=N,...`).
fn redis_calls(redis: &RedisServer) -> BTreeMap<String, f64> {
    let info = redis_cli(redis, &["INFO", "commandstats"]);
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(":calls=")?;
            Some((name.to_owned(), rest.split(',').next()?.parse().ok()?))
        })
        .collect()
}

/// One seat taken through `netjam`'s own join (redirects followed): hello to welcome, ms,
/// and the server it ended on. The seat is left at once.
fn join_once(server: SocketAddr, room: &str, name: &str) -> (f64, SocketAddr) {
    let socket = netjam::transport::UdpTransport::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let seated = netjam::room_client::join(
        &socket,
        &netjam::room_client::JoinRequest {
            server,
            room: room.to_owned(),
            name: name.to_owned(),
            password: String::new(),
            room_key: None,
            ssrc: 7,
            packets_per_s: 0,
            bytes_per_s: 0,
            timeout: STEP,
            hosts: Vec::new(),
            sample_rate: 0,
            also: Vec::new(),
            known: netjam::keys::KnownServers::from_env(),
            setup: Default::default(),
        },
    )
    .expect("seated");
    let (took, on) = (seated.took.as_secs_f64() * 1e3, seated.session.server());
    let mut session = seated.session;
    session.leave(0);
    let mut buf = [0u8; MAX_WIRE_LEN];
    while let Some((to, n)) = session.poll_transmit(0, &mut buf) {
        let _ = socket.send_to(&buf[..n], to);
    }
    (took, on)
}

fn summary(v: &[f64]) -> String {
    let mut s = v.to_vec();
    let worst = s.iter().copied().fold(f64::MIN, f64::max);
    format!("median {:.2}, worst {worst:.2} (of {})", median(&mut s), v.len())
}

/// The figures of rooms across servers, against a real Redis: Redis commands a second from
/// a server holding 100 rooms, the time to a seat with and without a redirect (10 each),
/// and the silence at failover (10 failovers of a room with two players):
/// `cargo test --release -p netjam --test rooms_directory -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_redis_load_join_time_and_failover_silence() {
    let _turn = one_at_a_time();
    let dir = tmp_dir("rooms-directory-bench");
    let redis = RedisServer::start();
    let a = DirServer::start(&redis.url(), &dir, "a", "127.0.0.1:0");

    // 100 rooms on A, one seat each: what A asks of Redis to keep them.
    let holders: Vec<Holder> = (0..100)
        .map(|i| Holder::sit(a.addr, &format!("load-{i}")))
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let secs = 20.0;
    let (c0, by0) = (
        redis_info(&redis, "stats", "total_commands_processed"),
        redis_calls(&redis),
    );
    std::thread::sleep(Duration::from_secs_f64(secs));
    let (c1, by1) = (
        redis_info(&redis, "stats", "total_commands_processed"),
        redis_calls(&redis),
    );
    // The two INFO calls of the first reading are counted in the second.
    let per_s = (c1 - c0 - 2.0) / secs;
    let by: Vec<String> = by1
        .iter()
        .filter(|(k, _)| k.as_str() != "info")
        .map(|(k, v)| (k, (v - by0.get(k).copied().unwrap_or(0.0)) / secs))
        .filter(|(_, v)| *v > 0.0)
        .map(|(k, v)| format!("{k} {v:.1}"))
        .collect();
    println!(
        "Redis: {per_s:.1} commands/s from one server holding 100 rooms, over {secs} s: {}",
        by.join(", ")
    );
    drop(holders);

    // The time to a seat: a room A hosts, asked of A, and of B (redirected to A).
    let b = DirServer::start(&redis.url(), &dir, "b", "127.0.0.1:0");
    let _host = Holder::sit(a.addr, "band");
    let mut direct = Vec::new();
    let mut redirected = Vec::new();
    for i in 0..10 {
        let (ms, on) = join_once(a.addr, "band", &format!("d{i}"));
        assert_eq!(on, a.addr);
        direct.push(ms);
        let (ms, on) = join_once(b.addr, "band", &format!("r{i}"));
        assert_eq!(on, a.addr, "not redirected to the room's server");
        redirected.push(ms);
    }
    println!(
        "join (hello to welcome, ms): on the room's server {}",
        summary(&direct)
    );
    println!(
        "join (hello to welcome, ms): through a redirect {}",
        summary(&redirected)
    );
    drop(b);

    // Failover, ten times: a room on a server of its own that is killed; its two players
    // named A, were redirected there, and come back through A.
    let mut seen = Vec::new();
    let mut said = Vec::new();
    let mut worst_of_each = Vec::new();
    for i in 0..10 {
        let host = DirServer::start(&redis.url(), &dir, &format!("host{i}"), "127.0.0.1:0");
        let room = format!("fail-{i}");
        let holder = Holder::sit(host.addr, &room);
        let mut players: Vec<Player> = PLAYERS[..2]
            .iter()
            .map(|&(name, hz)| Player::start(name, hz, a.addr, &room, 30.0, &dir))
            .collect();
        for p in &mut players {
            p.wait_seated();
        }
        players[0].wait_roster(&room, &[PLAYERS[1].0], STEP);
        players[1].wait_roster(&room, &[PLAYERS[0].0], STEP);
        std::thread::sleep(Duration::from_secs(1));
        drop(holder);
        let killed = Instant::now();
        drop(host);
        let mut worst: f64 = 0.0;
        for p in &mut players {
            let (line, at) = p.wait_line("move to A", STEP + STEP, |l| l.contains("moved to"));
            let s: f64 = line
                .split("after ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("no silence in {line:?}"));
            let t = at.duration_since(killed).as_secs_f64();
            worst = worst.max(t);
            seen.push(t);
            said.push(s);
        }
        worst_of_each.push(worst);
        for p in players {
            drop(p.proc);
        }
    }
    println!(
        "failover (lease {LEASE_S} s, silence timeout {SILENCE_TIMEOUT_S} s): back on A after the kill, s: {}",
        summary(&seen)
    );
    println!(
        "failover: the band's worst player per failover, s: {}",
        summary(&worst_of_each)
    );
    println!(
        "failover: the silence the players measured, s: {}",
        summary(&said)
    );
}
