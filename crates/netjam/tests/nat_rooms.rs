//! Rooms through home routers, for real: network namespaces, veth pairs and nftables
//! routers (see `common/natlab.rs`), with `netjam server` in a "public" namespace and
//! `netjam jam --server` players at home behind a cone NAT (`masquerade`), a
//! port-randomising NAT (`masquerade random`) and a firewall that drops unsolicited
//! inbound packets, plus one player in the public namespace who is already playing.
//!
//! * coturn's `turnutils_stunclient`, run behind each router, gets the router's public
//!   address from the rooms server's port (STUN interop);
//! * each player says where the server sees it — its router's public address — and,
//!   asking a second STUN server, whether its router's mapping is endpoint-independent
//!   (cone, firewall) or not (port-randomising);
//! * everyone hears everyone else's tone through the server, and never their own;
//! * a router whose mappings all change mid-session (new port range, connection tracking
//!   flushed): the player keeps its seat (same member id in the others' report, one seat,
//!   a rejoin counted by server and client) and the others hear it again within a bound.
//!
//! * direct paths: two players behind cone routers go direct within 1 s of joining and the
//!   server forwards none of their media; pairs with a port-randomising router stay
//!   relayed and the music goes on; a direct path cut mid-stream (a drop rule between the
//!   two routers) comes back through the server with a bounded loss. Across both switches
//!   (server to direct, direct to server) each player's recording is judged as a listener
//!   would (`netjam_engine::listen`): the other's tone in tune outside glitch windows, the
//!   glitch windows counted and placed against the switch.
//!
//! * retries: two players behind cone routers whose direct way is blocked when they join
//!   stay relayed; once it opens, their next attempt finds the direct path.
//!
//! * a slower direct path: two players behind cone routers whose direct way crosses a
//!   `netjam impair` delay (the way to the server does not) measure the direct path, keep
//!   media with the server and say `via server … (direct x ms, slower)`.
//!
//! * router help: two players behind port-randomising routers that run miniupnpd go direct
//!   with `--port-map` (or its old name `--upnp`) through the ports their routers forward,
//!   by UPnP-IGD, by PCP and by NAT-PMP (without it such a pair stays relayed, see the success
//!   matrix), and say which protocol gave the mapping and how long it took; a player that
//!   ends by an error or by SIGTERM leaves no forwarding in its router.
//!
//! Printed for the benchmarks: the time from `jam` start to first audio heard
//! through each kind of router (direct and relayed), the success matrix of the router
//! kinds, and the outage a changed mapping or a cut direct path costs.
//!
//! Needs root for the namespaces; without it each test says why and returns (skips).
//! Every wait is for something a process prints, with a timeout, except the seconds of
//! music before the mapping changes, whose presence the WAV then proves.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::natlab::{in_ns, Mapper, NatLab, RouterKind};
use common::signal::{read_channel0, tone_amp, write_tone, RATE};
use common::{address_in, read_json, require, tmp_dir, Proc, BIN};
use netjam::endpoint::wav::read_first_channel;
use netjam_engine::listen::{listen, Tones};

/// Tone amplitude: four summed stay far from clipping.
const AMP: f64 = 0.2;
/// Analysis block: 20 ms (the Hann window's main lobe is ±100 Hz; tones are 600 Hz apart).
const BLOCK: usize = 960;
/// Where the level beside a tone is read: past the main lobe, far from the next tone.
const SIDE_HZ: f64 = 200.0;
/// A tone is heard in a block at more than −12 dB of what was sent...
const PRESENT: f64 = AMP / 4.0;
/// ... and absent when it stands out of its sides by less than −30 dB of it.
const ABSENT: f64 = AMP / 30.0;
/// The worst pitch error a listener may hear in a window without a glitch, in cents, across
/// a path switch (as `tests/listener_tones.rs` allows a jam on loopback on a loaded
/// machine; the players here run without realtime scheduling).
const MAX_CENTS: f64 = 3.0;
/// How long any one step may take on a loaded machine.
const STEP: Duration = Duration::from_secs(15);
const ROOM: &str = "natlab";
const ROOM_PORT: u16 = 4464;
const STUN_PORT: u16 = 3478;
/// The player in the public namespace, and its tone.
const ANCHOR: (&str, f64) = ("pub", 350.0);

/// One lab at a time: players on a 2-core machine are enough load without two rooms.
static ONE_LAB: Mutex<()> = Mutex::new(());

fn one_lab() -> MutexGuard<'static, ()> {
    ONE_LAB.lock().unwrap_or_else(|e| e.into_inner())
}

/// The lab, or `None` (with the reason printed) where namespaces cannot be made; these
/// tests read the routers' mappings with conntrack too.
fn lab_or_skip(kinds: &[RouterKind]) -> Option<NatLab> {
    require("conntrack", "conntrack");
    NatLab::build_or_skip(kinds)
}

fn tone_of(kind: RouterKind) -> f64 {
    match kind {
        RouterKind::Cone => 950.0,
        RouterKind::Symmetric => 1550.0,
        RouterKind::Firewall => 2150.0,
        RouterKind::Sequential => 2750.0,
    }
}

/// Per 20 ms block of a WAV: (level of `hz`, level beside it).
fn levels(path: &Path, hz: f64) -> Vec<(f64, f64)> {
    read_channel0(path)
        .chunks_exact(BLOCK)
        .map(|b| {
            (
                tone_amp(b, hz),
                tone_amp(b, hz - SIDE_HZ).max(tone_amp(b, hz + SIDE_HZ)),
            )
        })
        .collect()
}

/// How `p` heard `hz` (its own tone, `own`, must be absent) while it played, the way a
/// listener would (`netjam_engine::listen`, over the span from 0.3 s after the tone was
/// first heard to 0.3 s before it was last heard): the worst pitch error in a window
/// without a glitch (cents), the glitch windows' starts and where the span starts, in
/// seconds into its recording.
fn listened(p: &Player, hz: f64, own: f64) -> (f64, Vec<f64>, f64) {
    let l = levels(&p.output, hz);
    let first = l.iter().position(|b| b.0 > PRESENT).expect("the tone is heard");
    let last = l.iter().rposition(|b| b.0 > PRESENT).expect("the tone is heard");
    let (samples, rate) =
        read_first_channel(&p.output).unwrap_or_else(|e| panic!("{}: {e:#}", p.output.display()));
    let edge = rate as usize * 3 / 10;
    let from = first * BLOCK + edge;
    let to = ((last + 1) * BLOCK).saturating_sub(edge).min(samples.len());
    assert!(
        to > from + rate as usize,
        "{}: {hz} Hz heard for under 1.6 s",
        p.name
    );
    let listening = listen(&samples[from..to], rate, &Tones::present(&[hz]).absent(&[own]))
        .unwrap_or_else(|e| panic!("{}: {e}", p.output.display()));
    let clean_cents = listening.worst_clean_cents().abs();
    let offset = from as f64 / rate as f64;
    let glitches = listening
        .summary
        .glitches
        .iter()
        .map(|g| g.at_seconds + offset)
        .collect();
    (clean_cents, glitches, offset)
}

/// The listener's figures for `p` hearing `hz` across a path switch at `switch` (seconds
/// into its recording), printed under `what`; fails on a pitch error beyond [`MAX_CENTS`]
/// outside glitch windows. Glitch windows are counted, not judged: a player without
/// realtime scheduling on a loaded machine conceals a late packet now and then.
fn judge_switch(what: &str, p: &Player, hz: f64, own: f64, switch: f64) {
    let (cents, glitches, from) = listened(p, hz, own);
    let near = glitches.iter().filter(|&&g| (g - switch).abs() <= 0.5).count();
    eprintln!(
        "{what}: {} heard {hz} Hz within {cents:.2} cents outside glitch windows from {from:.2} s on; \
         {} glitch windows, {near} of them within 0.5 s of the switch at {switch:.2} s (at {:.2?} s)",
        p.name,
        glitches.len(),
        glitches
    );
    assert!(
        cents <= MAX_CENTS,
        "{what}: {} heard {hz} Hz {cents:.2} cents off in a window without a glitch",
        p.name
    );
}

fn block_s(blocks: usize) -> f64 {
    (blocks * BLOCK) as f64 / RATE
}

/// Both servers in the public namespace: the rooms server, and another one that only
/// answers STUN for the players' `--stun` (a rooms server nobody joins).
struct Servers {
    room: Proc,
    _stun: Proc,
    json: PathBuf,
}

impl Servers {
    fn start(lab: &NatLab, dir: &Path) -> Self {
        let json = dir.join("server.json");
        let start = |addr: String, json: &Path| {
            let p = Proc::spawn_lines(
                lab.command(&lab.public, BIN)
                    .args(["server", "--listen", &addr, "--stats-json"])
                    .arg(json)
                    .stdout(Stdio::null()),
                "netjam server",
            );
            let said = address_in(&p.next_line(STEP));
            assert_eq!(said.to_string(), addr);
            p
        };
        let room = start(format!("{}:{ROOM_PORT}", lab.server_ip), &json);
        let stun = start(format!("{}:{STUN_PORT}", lab.stun_ip), &dir.join("stun.json"));
        Self {
            room,
            _stun: stun,
            json,
        }
    }

    /// Interrupts the rooms server and returns its report.
    fn stop(mut self) -> serde_json::Value {
        self.room.stop_server(&self.json, STEP)
    }
}

/// A `netjam jam --server` player inside a namespace, its stderr read line by line with
/// the instant each line arrived (the test reads several players' lines in turn).
struct Player {
    name: String,
    proc: Proc,
    lines: mpsc::Receiver<(Instant, String)>,
    output: PathBuf,
    json: PathBuf,
    said: Vec<String>,
    spawned: Instant,
    seated: Option<Instant>,
    /// Every line read, with when it arrived.
    history: Vec<(Instant, String)>,
}

impl Player {
    fn start(lab: &NatLab, ns: &str, name: &str, input: &Path, dir: &Path, seconds: f64, stun: bool) -> Self {
        Self::start_with(lab, ns, name, input, dir, seconds, stun, &[])
    }

    #[allow(clippy::too_many_arguments)]
    fn start_with(
        lab: &NatLab,
        ns: &str,
        name: &str,
        input: &Path,
        dir: &Path,
        seconds: f64,
        stun: bool,
        extra: &[&str],
    ) -> Self {
        let output = dir.join(format!("{name}.heard.wav"));
        let json = dir.join(format!("{name}.json"));
        let mut cmd = lab.command(ns, BIN);
        cmd.args(["jam", "--server", &format!("{}:{ROOM_PORT}", lab.server_ip)])
            .args(["--room", ROOM, "--name", name, "--input"])
            .arg(input)
            .args(["--duration", &seconds.to_string(), "--output"])
            .arg(&output)
            .arg("--stats-json")
            .arg(&json)
            .env("NETJAM_NO_REALTIME", "1")
            .args(extra)
            .stdout(Stdio::null());
        if stun {
            cmd.args(["--stun", &format!("{}:{STUN_PORT}", lab.stun_ip)]);
        }
        let spawned = Instant::now();
        let mut proc = Proc::spawn(cmd.stderr(Stdio::piped()), "netjam jam");
        let stderr = proc.child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send((Instant::now(), line));
            }
        });
        Self {
            name: name.to_string(),
            proc,
            lines,
            output,
            json,
            said: Vec::new(),
            spawned,
            seated: None,
            history: Vec::new(),
        }
    }

    /// Reads its lines until one satisfies `want`, within [`STEP`].
    fn wait_line(&mut self, what: &str, want: impl Fn(&str) -> bool) -> String {
        self.wait_stamped(what, want).1
    }

    /// [`Player::wait_line`], with when the line arrived.
    fn wait_stamped(&mut self, what: &str, want: impl Fn(&str) -> bool) -> (Instant, String) {
        let deadline = Instant::now() + STEP;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok((at, line)) => {
                    self.said.push(line.clone());
                    self.history.push((at, line.clone()));
                    if want(&line) {
                        return (at, line);
                    }
                }
                Err(_) => {
                    let exited = !self.proc.running();
                    if exited || left.is_zero() {
                        self.said.extend(self.lines.try_iter().map(|l| l.1));
                        panic!(
                            "{}: no {what} within {STEP:?}{}; it said: {:#?}",
                            self.name,
                            if exited { " (it exited)" } else { "" },
                            self.said
                        );
                    }
                }
            }
        }
    }

    /// A line read already or to come that satisfies `want`, with when it arrived.
    fn seen_or_wait(&mut self, what: &str, want: impl Fn(&str) -> bool) -> (Instant, String) {
        if let Some(hit) = self.history.iter().find(|(_, l)| want(l)) {
            return hit.clone();
        }
        self.wait_stamped(what, want)
    }

    /// What it said first about its path to `other`: (when, direct).
    fn path_to(&mut self, other: &str) -> (Instant, bool) {
        let direct = format!("netjam: direct path to {other} at");
        let relayed = format!("netjam: no direct path to {other}:");
        let slower = format!("netjam: the direct path to {other} answers but is slower");
        let (at, line) = self.seen_or_wait(&format!("a path to {other}"), |l| {
            l.starts_with(&direct) || l.starts_with(&relayed) || l.starts_with(&slower)
        });
        (at, line.starts_with(&direct))
    }

    /// Its path to `other` as it stands at `until`: the first it said, or a direct path it
    /// said after that, by then (a direct path declared dead for a moment on a busy
    /// machine comes back with a line of its own): (when, direct).
    fn path_by(&mut self, other: &str, until: Instant) -> (Instant, bool) {
        let first = self.path_to(other);
        if first.1 {
            return first;
        }
        let direct = format!("netjam: direct path to {other} at");
        if let Some(hit) = self
            .history
            .iter()
            .find(|(at, l)| *at > first.0 && l.starts_with(&direct))
        {
            return (hit.0, true);
        }
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            if let Ok((at, line)) = self.lines.recv_timeout(left) {
                self.said.push(line.clone());
                self.history.push((at, line.clone()));
                if line.starts_with(&direct) {
                    return (at, true);
                }
            }
        }
        first
    }

    /// The address it says the rooms server sees it at (printed before it is seated).
    fn server_sees(&mut self) -> SocketAddr {
        address_in(&self.wait_line("reflexive address", |l| {
            l.starts_with("netjam: the server sees you at")
        }))
    }

    fn wait_seated(&mut self) {
        let (at, _) = self.wait_stamped("seat", |l| l.starts_with("netjam: in room"));
        self.seated = Some(at);
    }

    /// Waits for it to end on its own; its report.
    fn finish(&mut self) -> serde_json::Value {
        let status = self.proc.wait_for(STEP + Duration::from_secs(15));
        // The reader thread ends with the pipe.
        while let Ok((_, l)) = self.lines.recv_timeout(Duration::from_secs(2)) {
            self.said.push(l);
        }
        assert!(status.success(), "{} failed: {:#?}", self.name, self.said);
        read_json(&self.json)
    }

    /// Where `at` falls in its output WAV, in blocks (the audio starts when it is seated).
    fn block_at(&self, at: Instant) -> usize {
        let seated = self.seated.expect("seated");
        (at.saturating_duration_since(seated).as_secs_f64() * RATE) as usize / BLOCK
    }
}

/// One player per `(name, Hz)` of `tones`, the i-th at home i playing its tone for
/// `seconds(i)` with the extra arguments `args(i)`; `before_seat` reads what each says
/// before its seat (its own checks), then it waits to be seated. In `tones`' order.
fn seat_players(
    lab: &NatLab,
    dir: &Path,
    tones: &[(&str, f64)],
    seconds: impl Fn(usize) -> f64,
    args: impl Fn(usize) -> Vec<String>,
    mut before_seat: impl FnMut(usize, &mut Player),
) -> Vec<Player> {
    tones
        .iter()
        .enumerate()
        .map(|(i, (name, hz))| {
            let input = dir.join(format!("{name}.wav"));
            write_tone(&input, *hz, AMP, 20.0);
            let args = args(i);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut p =
                Player::start_with(lab, &lab.homes[i].ns, name, &input, dir, seconds(i), false, &args);
            before_seat(i, &mut p);
            p.wait_seated();
            p
        })
        .collect()
}

/// `name`'s entries in a player's report (`heard`).
fn heard_entries<'a>(report: &'a serde_json::Value, name: &str) -> Vec<&'a serde_json::Value> {
    report["heard"]
        .as_array()
        .map(|a| a.iter().filter(|m| m["name"] == name).collect())
        .unwrap_or_default()
}

/// What coturn's STUN client says the rooms server sees, run inside `ns`.
fn turnutils_mapped(lab: &NatLab, ns: &str) -> SocketAddr {
    let out = in_ns(
        ns,
        "turnutils_stunclient",
        &["-p", &ROOM_PORT.to_string(), &lab.server_ip.to_string()],
    )
    .unwrap_or_else(|e| panic!("turnutils_stunclient: {e}"));
    // "UDP reflexive addr: 10.99.0.10:40123"
    out.lines()
        .find(|l| l.contains("reflexive addr"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|a| a.trim().parse().ok())
        .unwrap_or_else(|| panic!("no reflexive address in turnutils_stunclient's output: {out}"))
}

#[test]
fn players_behind_three_kinds_of_router_share_a_room() {
    let _one = one_lab();
    require("turnutils_stunclient", "coturn");
    let kinds = [RouterKind::Cone, RouterKind::Symmetric, RouterKind::Firewall];
    let Some(lab) = lab_or_skip(&kinds) else { return };
    let dir = tmp_dir("nat-rooms-three");
    let servers = Servers::start(&lab, &dir);

    // A STUN client nobody here wrote, behind each router, asks the rooms server's port.
    for home in &lab.homes {
        let mapped = turnutils_mapped(&lab, &home.ns);
        assert_eq!(
            mapped.ip(),
            home.public_ip(),
            "turnutils_stunclient behind the {} router",
            home.kind.label()
        );
    }

    let anchor_in = dir.join("pub.wav");
    write_tone(&anchor_in, ANCHOR.1, AMP, 20.0);
    let mut anchor = Player::start(&lab, &lab.public, ANCHOR.0, &anchor_in, &dir, 9.0, false);
    anchor.wait_seated();
    let mut players: Vec<Player> = lab
        .homes
        .iter()
        .map(|h| {
            let input = dir.join(format!("{}.wav", h.kind.label()));
            write_tone(&input, tone_of(h.kind), AMP, 20.0);
            Player::start(&lab, &h.ns, h.kind.label(), &input, &dir, 6.0, true)
        })
        .collect();
    for (p, home) in players.iter_mut().zip(&lab.homes) {
        let seen = p.server_sees();
        assert_eq!(
            seen.ip(),
            home.public_ip(),
            "{}: the server sees it at {seen}",
            p.name
        );
        let line = p.wait_line("the STUN server's view", |l| {
            l.starts_with("netjam: the STUN server")
        });
        let same = line.contains(" too: ");
        let differs = line.contains("not where the rooms server does");
        match home.kind {
            RouterKind::Cone | RouterKind::Firewall => assert!(same, "{}: {line}", p.name),
            RouterKind::Symmetric | RouterKind::Sequential => assert!(differs, "{}: {line}", p.name),
        }
        p.wait_seated();
    }
    let reports: Vec<serde_json::Value> = players.iter_mut().map(Player::finish).collect();
    let anchor_report = anchor.finish();
    let server = servers.stop();

    // The reports carry the reflexive address too.
    for ((p, r), home) in players.iter().zip(&reports).zip(&lab.homes) {
        let sees: SocketAddr = r["reflexive"]["server_sees"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("{}: no reflexive address in {}", p.name, r["reflexive"]));
        assert_eq!(sees.ip(), home.public_ip());
    }
    let st = &server["server"];
    assert!(
        st["stun_answered"].as_u64().unwrap_or_default() >= 6,
        "three turnutils and three players asked: {st}"
    );

    // Everyone hears everyone else, never themselves.
    let everyone: Vec<(&str, f64)> = std::iter::once(ANCHOR)
        .chain(lab.homes.iter().map(|h| (h.kind.label(), tone_of(h.kind))))
        .collect();
    let outputs: Vec<(&Player, &serde_json::Value)> = std::iter::once((&anchor, &anchor_report))
        .chain(players.iter().zip(&reports))
        .collect();
    for (who, _) in &outputs {
        for &(name, hz) in &everyone {
            let l = levels(&who.output, hz);
            if name == who.name {
                let loudest = l.iter().fold(0.0f64, |m, b| m.max(b.0 - b.1));
                assert!(
                    loudest < ABSENT,
                    "{} heard itself ({hz} Hz at {loudest:.4})",
                    who.name
                );
            } else {
                let s = block_s(l.iter().filter(|b| b.0 > PRESENT).count());
                assert!(s >= 3.5, "{} heard {name} ({hz} Hz) for only {s:.2} s", who.name);
            }
        }
    }

    // Time from `jam` start to the first audio heard: the player in the public namespace
    // was playing before each of them started.
    for (p, home) in players.iter().zip(&lab.homes) {
        // 10 ms blocks (a ±200 Hz main lobe, 600 Hz from the next tone) for a finer onset.
        let x = read_channel0(&p.output);
        let first = x
            .chunks_exact(BLOCK / 2)
            .position(|b| tone_amp(b, ANCHOR.1) > PRESENT)
            .expect("heard the anchor");
        let seat = p.seated.expect("seated").duration_since(p.spawned).as_secs_f64();
        let total = seat + block_s(first) / 2.0;
        eprintln!(
            "through the {} router: seated {:.0} ms after `jam` started, first audio heard {:.0} ms after (its output's first 10 ms block with the tone)",
            home.kind.label(),
            seat * 1e3,
            total * 1e3
        );
        assert!(total < 5.0, "{}: first audio after {total:.2} s", p.name);
    }
    // The firewall does drop what the home did not ask for.
    let fw = lab
        .homes
        .iter()
        .find(|h| h.kind == RouterKind::Firewall)
        .expect("firewall home");
    let before = lab.firewall_drops(fw).expect("the firewall's counter");
    in_ns(
        &lab.public,
        "bash",
        &["-c", &format!("echo unsolicited > /dev/udp/{}/9", fw.ip)],
    )
    .expect("send an unsolicited datagram");
    let after = lab.firewall_drops(fw).expect("the firewall's counter");
    assert!(
        after > before,
        "the firewall let an unsolicited datagram in ({before} -> {after} drops)"
    );
}

#[test]
fn a_mapping_that_changes_keeps_the_seat_and_the_audio_returns() {
    let _one = one_lab();
    let Some(lab) = lab_or_skip(&[RouterKind::Cone]) else {
        return;
    };
    let home = lab.homes[0].clone();
    let dir = tmp_dir("nat-rooms-remap");
    let servers = Servers::start(&lab, &dir);
    let (anchor_in, home_in) = (dir.join("pub.wav"), dir.join("cone.wav"));
    write_tone(&anchor_in, ANCHOR.1, AMP, 20.0);
    write_tone(&home_in, tone_of(home.kind), AMP, 20.0);
    // Long enough that the change comes well inside both players' time even when seating
    // takes seconds on a loaded machine (with 7 s, a player once ended before its router
    // was remapped, and no new mapping came).
    const PLAYER_S: f64 = 10.0;
    let mut anchor = Player::start(
        &lab,
        &lab.public,
        ANCHOR.0,
        &anchor_in,
        &dir,
        PLAYER_S + 2.0,
        false,
    );
    anchor.wait_seated();
    let mut player = Player::start(&lab, &home.ns, "cone", &home_in, &dir, PLAYER_S, false);
    let before = player.server_sees();
    player.wait_seated();
    anchor.wait_line("cone in the roster", |l| {
        l == format!("netjam: room {ROOM}: cone")
    });
    // Two seconds of music through the first mapping (the WAV proves they were heard).
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        player.proc.running(),
        "the player ended before its router was remapped: {:#?}",
        player.said
    );
    let remapped_at = Instant::now();
    lab.remap(&home).expect("remap");
    // The router maps the player's flow to the server anew, from the new port range.
    let mapped = lab.wait_mapping(&home, lab.server_ip, STEP);
    assert!(
        (20_000..=20_999).contains(&mapped),
        "new mapping port {mapped} (was {before})"
    );
    // Once its seat is back, the player asks where the server sees it now.
    let now_sees = address_in(&player.wait_line("the new reflexive address", |l| {
        l.starts_with("netjam: the server now sees you at")
    }));
    assert_eq!(
        now_sees.port(),
        mapped,
        "the player's new reflexive address {now_sees}"
    );
    let player_report = player.finish();
    let anchor_report = anchor.finish();
    let server = servers.stop();

    // The seat is kept: one entry for the player in the other's report, with its id.
    let id = player_report["member_id"].as_u64().expect("member id");
    let entries = heard_entries(&anchor_report, "cone");
    assert_eq!(entries.len(), 1, "one seat for the player: {entries:?}");
    assert_eq!(entries[0]["member_id"].as_u64(), Some(id), "the same member id");
    let client_rejoins = player_report["roster"]["rejoins"].as_u64().unwrap_or_default();
    let server_rejoins = server["server"]["rejoins"].as_u64().unwrap_or_default();
    assert!(
        client_rejoins >= 1 && server_rejoins >= 1,
        "rejoins: client {client_rejoins}, server {server_rejoins}"
    );
    assert_eq!(server["server"]["timeouts"].as_u64(), Some(0), "nobody timed out");

    // What the other player heard around the change.
    let l = levels(&anchor.output, tone_of(home.kind));
    let at = anchor.block_at(remapped_at);
    let present = |b: &(f64, f64)| b.0 > PRESENT;
    let window = |from: usize, to: usize| &l[from.min(l.len())..to.min(l.len())];
    // Heard before (the second before the change, allowing for the timing of the seat line).
    let before_s = block_s(
        window(at.saturating_sub(50), at.saturating_sub(10))
            .iter()
            .filter(|b| present(b))
            .count(),
    );
    assert!(
        before_s >= 0.6,
        "heard the player for {before_s:.2} s of the 0.8 s before the change"
    );
    // The outage: the longest run without the tone from shortly before the change on.
    let around = window(at.saturating_sub(10), at + 150);
    let (mut run, mut longest, mut back_at) = (0usize, 0usize, None);
    for (i, b) in around.iter().enumerate() {
        if present(b) {
            if run > 0 && run >= longest {
                back_at = Some(i);
            }
            run = 0;
        } else {
            run += 1;
            longest = longest.max(run);
        }
    }
    let outage_s = block_s(longest);
    let after = back_at.map_or(at + 150, |b| at.saturating_sub(10) + b);
    let after_s = block_s(window(after, after + 100).iter().filter(|b| present(b)).count());
    let lost = entries[0]["lost"].as_i64().unwrap_or_default();
    let sent = player_report["stats"]["sent"]["packets"]
        .as_f64()
        .unwrap_or_default();
    let packet_ms = if sent > 0.0 { PLAYER_S * 1e3 / sent } else { 0.0 };
    eprintln!(
        "mapping changed: the other player lost {lost} packets (about {:.0} ms of audio) and heard a gap of {:.0} ms (to the 20 ms block); seat kept (member {id}, {client_rejoins} rejoin)",
        lost as f64 * packet_ms,
        outage_s * 1e3
    );
    assert!(outage_s <= 1.5, "the audio took {outage_s:.2} s to come back");
    assert!(
        after_s >= 1.6,
        "after the change the player was heard for only {after_s:.2} s of 2 s"
    );
    // And the player hears the other again.
    let back = levels(&player.output, ANCHOR.1);
    let player_at = player.block_at(remapped_at);
    let heard_back = block_s(
        back[(player_at + 75).min(back.len())..(player_at + 175).min(back.len())]
            .iter()
            .filter(|b| present(b))
            .count(),
    );
    assert!(
        heard_back >= 1.6,
        "the player heard the other for {heard_back:.2} s of the 2 s after the change"
    );
}

/// Every router's UDP connection-tracking table, to tell why a direct path failed.
/// ana and bo (players 0 and 1) each found a direct path to the other within a second of
/// bo being seated.
fn both_direct_within_a_second(players: &mut [Player], lab: &NatLab, pair: &str) {
    let joined = players[1].seated.expect("seated");
    for (i, other) in [(0, "bo"), (1, "ana")] {
        let (at, direct) = players[i].path_by(other, joined + Duration::from_secs(1));
        let after = at.saturating_duration_since(joined).as_secs_f64();
        eprintln!(
            "{pair}: {} has a {} path to {other} {:.0} ms after bo was seated",
            players[i].name,
            if direct { "direct" } else { "relayed" },
            after * 1e3
        );
        assert!(
            direct,
            "{}: {:#?}\nconnection tracking:\n{}",
            players[i].name,
            players[i].said,
            routers_conntrack(lab)
        );
        assert!(after <= 1.0, "direct only after {after:.2} s");
    }
}

fn routers_conntrack(lab: &NatLab) -> String {
    lab.homes
        .iter()
        .map(|h| {
            format!(
                "{} ({}):\n{}",
                h.router,
                h.kind.label(),
                in_ns(&h.router, "conntrack", &["-L", "-p", "udp"]).unwrap_or_else(|e| e)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn count(v: &serde_json::Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no {key} in {v}"))
}

/// Seconds of `hz` heard in a player's output.
/// Asserts that `players[me]` heard `tones[other]` for at least `min_s` seconds, and gives
/// the path its final report says it heard that player on.
fn heard_path<'a>(
    players: &[Player],
    reports: &'a [serde_json::Value],
    tones: &[(&str, f64)],
    (me, other): (usize, usize),
    min_s: f64,
) -> &'a str {
    let s = heard_s(&players[me], tones[other].1);
    assert!(
        s >= min_s,
        "{} heard {} for only {s:.2} s",
        players[me].name,
        tones[other].0
    );
    let entry = heard_entries(&reports[me], tones[other].0);
    entry.first().and_then(|e| e["path"].as_str()).unwrap_or_default()
}

fn heard_s(p: &Player, hz: f64) -> f64 {
    block_s(levels(&p.output, hz).iter().filter(|b| b.0 > PRESENT).count())
}

/// Time from `p`'s `jam` start to the first 10 ms of `hz` in what it heard.
fn first_audio_s(p: &Player, hz: f64) -> f64 {
    let x = read_channel0(&p.output);
    let first = x
        .chunks_exact(BLOCK / 2)
        .position(|b| tone_amp(b, hz) > PRESENT)
        .unwrap_or_else(|| panic!("{} never heard {hz} Hz", p.name));
    let seat = p.seated.expect("seated").duration_since(p.spawned).as_secs_f64();
    seat + block_s(first) / 2.0
}

#[test]
fn players_behind_cone_routers_go_direct_and_the_server_forwards_none_of_their_media() {
    let _one = one_lab();
    let Some(lab) = lab_or_skip(&[RouterKind::Cone, RouterKind::Cone]) else {
        return;
    };
    let dir = tmp_dir("nat-direct-cone");
    let servers = Servers::start(&lab, &dir);
    let tones = [("ana", 950.0), ("bo", 1550.0)];
    // bo plays a second less than ana.
    let mut players = seat_players(&lab, &dir, &tones, |i| 6.0 - i as f64, |_| vec![], |_, _| {});
    both_direct_within_a_second(&mut players, &lab, "cone <-> cone");
    let switched: Vec<Instant> = [(0, "bo"), (1, "ana")]
        .iter()
        .map(|&(i, other)| players[i].path_to(other).0)
        .collect();
    let reports: Vec<serde_json::Value> = players.iter_mut().map(Player::finish).collect();
    let server = servers.stop();
    // Media goes through the server until the direct path is confirmed: what each heard
    // across the switch, as a listener would.
    for (me, other) in [(0, 1), (1, 0)] {
        let at = block_s(players[me].block_at(switched[me]));
        judge_switch("server -> direct", &players[me], tones[other].1, tones[me].1, at);
    }
    // The server forwarded none of their media once the path was direct: at most what
    // they sent in the second it may take to confirm it (measured: tens of milliseconds).
    let forwarded = count(&server["shell"], "sent");
    let sent: Vec<u64> = reports
        .iter()
        .map(|r| r["stats"]["sent"]["packets"].as_u64().unwrap_or(0))
        .collect();
    let total: u64 = sent.iter().sum();
    let per_second = sent[0] as f64 / 6.0 + sent[1] as f64 / 5.0;
    eprintln!(
        "server: forwarded {forwarded} copies while ana and bo sent {total} packets ({:.1} % through the server, {:.0} ms of their audio)",
        100.0 * forwarded as f64 / total.max(1) as f64,
        1e3 * forwarded as f64 / per_second.max(1.0)
    );
    assert!(total > 1000, "{total}");
    assert!(
        forwarded as f64 <= per_second,
        "{forwarded} of {total} went through the server: more than a second's worth"
    );
    // Each hears the other; the report says which path.
    for (i, (me, other)) in [(0, 1), (1, 0)]
        .iter()
        .map(|&(a, b)| (a, (tones[b].0, tones[b].1)))
        .enumerate()
    {
        let p = &players[me];
        let s = heard_s(p, other.1);
        assert!(s >= 3.5, "{} heard {} for only {s:.2} s", p.name, other.0);
        let entry = heard_entries(&reports[me], other.0);
        let path = entry.first().and_then(|e| e["path"].as_str()).unwrap_or_default();
        assert!(path.starts_with("direct RTT "), "{i}: {path}");
    }
    let t = first_audio_s(&players[1], tones[0].1);
    eprintln!(
        "cone <-> cone (direct): bo heard ana {:.0} ms after its `jam` started",
        t * 1e3
    );
    assert!(t < 5.0);
}

#[test]
fn router_kinds_success_matrix_and_the_music_never_stops() {
    let _one = one_lab();
    let kinds = [
        RouterKind::Cone,
        RouterKind::Cone,
        RouterKind::Symmetric,
        RouterKind::Symmetric,
        RouterKind::Firewall,
    ];
    let Some(lab) = lab_or_skip(&kinds) else { return };
    let dir = tmp_dir("nat-direct-matrix");
    let servers = Servers::start(&lab, &dir);
    let names = ["cone0", "cone1", "sym0", "sym1", "fw"];
    let tones = [650.0, 1250.0, 1850.0, 2450.0, 3050.0];
    const N: usize = 5;
    let mut players = Vec::new();
    // The symmetric pair first, so sym1's first audio is sym0's, through the server.
    for i in [2, 3, 0, 1, 4] {
        let input = dir.join(format!("{}.wav", names[i]));
        write_tone(&input, tones[i], AMP, 20.0);
        let mut p = Player::start(&lab, &lab.homes[i].ns, names[i], &input, &dir, 6.0, false);
        p.wait_seated();
        players.push((i, p));
    }
    players.sort_by_key(|(i, _)| *i);
    let mut players: Vec<Player> = players.into_iter().map(|(_, p)| p).collect();
    let mut matrix = Vec::new();
    for a in 0..N {
        for b in 0..N {
            if a == b {
                continue;
            }
            let later = players[a].seated.max(players[b].seated).expect("seated");
            // Both routers must keep one public port per socket (a firewall keeps the
            // home's own); a port-randomising one defeats punching.
            let expect_direct = kinds[a] != RouterKind::Symmetric && kinds[b] != RouterKind::Symmetric;
            let (at, direct) = if expect_direct {
                players[a].path_by(names[b], later + Duration::from_secs(1))
            } else {
                players[a].path_to(names[b])
            };
            let after = at.saturating_duration_since(later).as_secs_f64();
            matrix.push((a, b, direct, after));
            assert_eq!(
                direct, expect_direct,
                "{} -> {}: {:#?}",
                names[a], names[b], players[a].said
            );
            // Media is relayed from the start; punching gives up after its 1 s (the line
            // comes at the next status tick), or a cone pair is direct well before.
            assert!(
                after <= 2.0,
                "{} -> {}: decided after {after:.2} s",
                names[a],
                names[b]
            );
        }
    }
    let reports: Vec<serde_json::Value> = players.iter_mut().map(Player::finish).collect();
    let _server = servers.stop();
    let mut heard = [[0.0f64; N]; N];
    for a in 0..N {
        for b in 0..N {
            if a != b {
                heard[a][b] = heard_s(&players[a], tones[b]);
            }
        }
    }
    eprintln!("success matrix (row -> column: path media takes; seconds of the other's 6 s tone heard):");
    eprintln!("{:>8} {}", "", names.map(|n| format!("{n:>22}")).join(""));
    for a in 0..N {
        let row: String = (0..N)
            .map(|b| match matrix.iter().find(|m| m.0 == a && m.1 == b) {
                None => format!("{:>22}", "-"),
                Some(&(_, _, direct, after)) => {
                    let what = if heard[a][b] < 3.5 {
                        "failed"
                    } else if direct {
                        "direct"
                    } else {
                        "relayed"
                    };
                    format!(
                        "{:>22}",
                        format!("{what} {:.0}ms {:.1}s", after * 1e3, heard[a][b])
                    )
                }
            })
            .collect();
        eprintln!("{:>8} {row}", names[a]);
    }
    for a in 0..N {
        for b in 0..N {
            if a != b {
                assert!(
                    heard[a][b] >= 3.5,
                    "{} heard {} for only {:.2} s",
                    names[a],
                    names[b],
                    heard[a][b]
                );
            }
        }
    }
    let report_paths = &reports[2]["roster"]["paths"];
    assert!(
        report_paths.as_object().is_some_and(|m| m.len() == N - 1),
        "sym0's report names a path to each other member: {report_paths}"
    );
    let t = first_audio_s(&players[3], tones[2]);
    eprintln!(
        "symmetric <-> symmetric (relayed): sym1 heard sym0 {:.0} ms after its `jam` started",
        t * 1e3
    );
    assert!(t < 5.0);
}

#[test]
fn a_direct_path_cut_mid_stream_comes_back_through_the_server() {
    let _one = one_lab();
    let Some(lab) = lab_or_skip(&[RouterKind::Cone, RouterKind::Cone]) else {
        return;
    };
    let dir = tmp_dir("nat-direct-cut");
    let servers = Servers::start(&lab, &dir);
    let tones = [("ana", 950.0), ("bo", 1550.0)];
    let mut players = seat_players(&lab, &dir, &tones, |_| 7.0, |_| vec![], |_, _| {});
    let by = players[1].seated.expect("seated") + Duration::from_secs(1);
    for (i, other) in [(0, "bo"), (1, "ana")] {
        assert!(
            players[i].path_by(other, by).1,
            "{}: {:#?}",
            players[i].name,
            players[i].said
        );
    }
    // Two seconds of music on the direct path (the WAV proves they were heard).
    std::thread::sleep(Duration::from_secs(2));
    let cut_at = Instant::now();
    lab.cut(&lab.homes[0], &lab.homes[1]).expect("cut");
    for (i, other) in [(0, "bo"), (1, "ana")] {
        let (at, _) = players[i].seen_or_wait("the direct path's end", |l| {
            l.starts_with(&format!(
                "netjam: the direct path to {other} stopped answering: through the server again"
            ))
        });
        let after = at.saturating_duration_since(cut_at).as_secs_f64();
        eprintln!(
            "cut: {} noticed {:.0} ms after the cut (to the status tick)",
            players[i].name,
            after * 1e3
        );
        assert!(after <= 1.0, "noticed after {after:.2} s");
    }
    let reports: Vec<serde_json::Value> = players.iter_mut().map(Player::finish).collect();
    let _server = servers.stop();
    for (me, other) in [(0, 1), (1, 0)] {
        let at = block_s(players[me].block_at(cut_at));
        judge_switch("direct -> server", &players[me], tones[other].1, tones[me].1, at);
    }
    for (me, other) in [(0, 1), (1, 0)] {
        let l = levels(&players[me].output, tones[other].1);
        let at = players[me].block_at(cut_at);
        let around = &l[at.saturating_sub(10).min(l.len())..(at + 100).min(l.len())];
        let (mut run, mut longest) = (0usize, 0usize);
        for b in around {
            if b.0 > PRESENT {
                run = 0;
            } else {
                run += 1;
                longest = longest.max(run);
            }
        }
        let after_s = block_s(
            l[(at + 25).min(l.len())..(at + 100).min(l.len())]
                .iter()
                .filter(|b| b.0 > PRESENT)
                .count(),
        );
        let entry = heard_entries(&reports[me], tones[other].0);
        let lost = entry.first().and_then(|e| e["lost"].as_i64()).unwrap_or_default();
        let path = entry.first().and_then(|e| e["path"].as_str()).unwrap_or_default();
        eprintln!(
            "cut: {} lost {lost} packets of {} and heard a gap of {:.0} ms (to the 20 ms block); now {path}",
            players[me].name,
            tones[other].0,
            block_s(longest) * 1e3
        );
        assert!(block_s(longest) <= 0.5, "a gap of {:.2} s", block_s(longest));
        assert!(
            after_s >= 1.3,
            "heard only {after_s:.2} s of the 1.5 s after the cut"
        );
        assert!(path.starts_with("via server"), "{path}");
    }
}

#[test]
fn a_pair_blocked_when_joining_goes_direct_once_the_way_opens() {
    let _one = one_lab();
    let Some(lab) = lab_or_skip(&[RouterKind::Cone, RouterKind::Cone]) else {
        return;
    };
    let retry = netjam_engine::nat::direct::DirectConfig::default();
    let dir = tmp_dir("nat-direct-retry");
    let servers = Servers::start(&lab, &dir);
    // The way between the two homes is closed (the server stays reachable).
    lab.cut(&lab.homes[0], &lab.homes[1]).expect("cut");
    let tones = [("ana", 950.0), ("bo", 1550.0)];
    let mut players = seat_players(&lab, &dir, &tones, |_| 15.0, |_| vec![], |_, _| {});
    for (i, other) in [(0, "bo"), (1, "ana")] {
        let (_, direct) = players[i].path_to(other);
        assert!(
            !direct,
            "{}: direct through a closed way: {:#?}",
            players[i].name, players[i].said
        );
    }
    let opened = Instant::now();
    lab.uncut(&lab.homes[0]).expect("uncut");
    // The next attempt comes at most the first wait after the first one gave up.
    let bound = Duration::from_nanos(retry.retry_after_ns + retry.punch_for_ns) + Duration::from_secs(3);
    for (i, other) in [(0, "bo"), (1, "ana")] {
        let (at, _) = players[i].wait_stamped("a direct path after the way opened", |l| {
            l.starts_with(&format!("netjam: direct path to {other} at"))
        });
        let after = at.saturating_duration_since(opened);
        eprintln!(
            "retry: {} went direct to {other} {:.1} s after the way between the routers opened (retries after {:.0} s)",
            players[i].name,
            after.as_secs_f64(),
            retry.retry_after_ns as f64 / 1e9
        );
        assert!(after <= bound, "direct only after {after:?}");
    }
    let reports: Vec<serde_json::Value> = players.iter_mut().map(Player::finish).collect();
    let _server = servers.stop();
    for pair in [(0, 1), (1, 0)] {
        let path = heard_path(&players, &reports, &tones, pair, 12.0);
        assert!(path.starts_with("direct RTT "), "{path}");
    }
}

/// miniupnpd on each router of `lab`, answering `speaks`, once it says it is ready.
fn port_mappers(lab: &NatLab, dir: &Path, speaks: Mapper) -> Vec<Proc> {
    lab.homes
        .iter()
        .map(|home| {
            let mut cmd = lab
                .upnp_gateway(home, dir, speaks)
                .expect("port mapping on the router");
            let d = Proc::spawn_lines(&mut cmd, "miniupnpd");
            let deadline = Instant::now() + STEP;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match d.line_within(left) {
                    Some(l) if l.contains(speaks.ready_line()) => break,
                    Some(_) => {}
                    None => panic!(
                        "miniupnpd in {} did not start: {:?}",
                        home.router,
                        d.drain_lines()
                    ),
                }
            }
            d
        })
        .collect()
}

/// The port forwardings miniupnpd holds in `home`'s router (one nft rule each).
fn forwardings(home: &common::natlab::Home) -> Vec<String> {
    in_ns(
        &home.router,
        "nft",
        &["list", "chain", "inet", "upnp", "upnp_dnat"],
    )
    .unwrap_or_default()
    .lines()
    .filter(|l| l.contains("dport"))
    .map(|l| l.trim().to_string())
    .collect()
}

/// Two players behind port-randomising routers that forward ports by `speaks` go direct
/// with `--port-map` (`flag`), say which protocol gave the mapping, and take it away
/// when they leave.
fn mapped_ports_go_direct(speaks: Mapper, flag: &str, protocol: &str) {
    let _one = one_lab();
    require("miniupnpd", "miniupnpd-nftables");
    let Some(lab) = lab_or_skip(&[RouterKind::Symmetric, RouterKind::Symmetric]) else {
        return;
    };
    let dir = tmp_dir(&format!("nat-direct-{protocol}"));
    let daemons = port_mappers(&lab, &dir, speaks);
    let servers = Servers::start(&lab, &dir);
    let tones = [("ana", 950.0), ("bo", 1550.0)];
    let mut players = seat_players(
        &lab,
        &dir,
        &tones,
        |_| 6.0,
        |_| vec![flag.into()],
        |_, p| {
            let name = p.name.clone();
            let line = p.wait_line("the router's port mapping", |l| {
                l.starts_with("netjam: your router at") || l.starts_with("netjam: --port-map")
            });
            eprintln!("{protocol}: {name}: {line}");
            assert!(line.contains("forwards UDP port"), "{name}: {line}");
            assert!(line.contains(&format!("({protocol}, ")), "{name}: {line}");
            // "... (PCP, 12 ms; ...)": the time from asking to the mapping.
            let ms: f64 = line
                .split(&format!("({protocol}, "))
                .nth(1)
                .and_then(|r| r.split(" ms").next())
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("no time in {line}"));
            assert!(ms < 2000.0, "{name}: the mapping took {ms} ms");
        },
    );
    both_direct_within_a_second(
        &mut players,
        &lab,
        &format!("symmetric+{protocol} <-> symmetric+{protocol}"),
    );
    for (i, other) in [(0, "bo"), (1, "ana")] {
        let (_, line) =
            players[i].seen_or_wait("its path line", |l| l.contains(&format!(" path to {other} ")));
        eprintln!("{protocol}: {}: {line}", players[i].name);
    }
    let reports: Vec<serde_json::Value> = players.iter_mut().map(Player::finish).collect();
    let _server = servers.stop();
    for pair in [(0, 1), (1, 0)] {
        let path = heard_path(&players, &reports, &tones, pair, 3.5);
        assert!(path.starts_with("direct RTT "), "{path}");
    }
    // Each player took its mapping away when it left.
    for (home, d) in lab.homes.iter().zip(&daemons) {
        let left = forwardings(home);
        assert!(
            left.is_empty(),
            "{}: mappings left: {left:?}\n{:?}",
            home.router,
            d.drain_lines()
        );
    }
}

#[test]
fn players_behind_port_randomising_routers_go_direct_through_ports_their_routers_forward() {
    // The old flag's name still works.
    mapped_ports_go_direct(Mapper::Upnp, "--upnp", "UPnP-IGD");
}

#[test]
fn routers_that_speak_pcp_forward_ports_too() {
    mapped_ports_go_direct(Mapper::PcpNatPmp, "--port-map", "PCP");
}

/// PCP goes unanswered (a first try and two retries: about a second), then NAT-PMP maps.
#[test]
fn routers_that_ignore_pcp_forward_ports_by_nat_pmp() {
    mapped_ports_go_direct(Mapper::NatPmp, "--port-map", "NAT-PMP");
}

/// A player that ends by an error (a wrong room password) and one stopped by SIGTERM
/// mid-stream both leave no forwarding in their routers.
#[test]
fn no_port_mapping_is_left_behind_by_an_error_or_a_signal() {
    let _one = one_lab();
    require("miniupnpd", "miniupnpd-nftables");
    let Some(lab) = lab_or_skip(&[RouterKind::Symmetric, RouterKind::Symmetric]) else {
        return;
    };
    let dir = tmp_dir("nat-portmap-exits");
    let daemons = port_mappers(&lab, &dir, Mapper::PcpNatPmp);
    let servers = Servers::start(&lab, &dir);
    let input = dir.join("tone.wav");
    write_tone(&input, 950.0, AMP, 20.0);
    let mapped = |p: &mut Player| {
        let line = p.wait_line("the router's port mapping", |l| {
            l.starts_with("netjam: your router at") || l.starts_with("netjam: --port-map")
        });
        assert!(line.contains("forwards UDP port"), "{}: {line}", p.name);
    };
    let mut ana = Player::start_with(
        &lab,
        &lab.homes[0].ns,
        "ana",
        &input,
        &dir,
        30.0,
        false,
        &["--port-map", "--password", "right"],
    );
    mapped(&mut ana);
    ana.wait_seated();
    assert_eq!(
        forwardings(&lab.homes[0]).len(),
        1,
        "ana's router forwards her port"
    );
    // bo gets his mapping, then the room refuses him: an error exit.
    let mut bo = Player::start_with(
        &lab,
        &lab.homes[1].ns,
        "bo",
        &input,
        &dir,
        30.0,
        false,
        &["--port-map", "--password", "wrong"],
    );
    mapped(&mut bo);
    let status = bo.proc.wait_for(STEP);
    assert!(
        !status.success(),
        "bo joined with a wrong password: {:#?}",
        bo.said
    );
    let left = forwardings(&lab.homes[1]);
    assert!(
        left.is_empty(),
        "bo's error exit left {left:?}\n{:?}",
        daemons[1].drain_lines()
    );
    // ana is stopped as a service manager or a closed terminal would stop her.
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &ana.proc.child.id().to_string()])
        .status();
    let status = ana.proc.wait_for(STEP);
    assert!(status.success(), "ana after SIGTERM: {status:?}");
    let left = forwardings(&lab.homes[0]);
    assert!(
        left.is_empty(),
        "ana's SIGTERM left {left:?}\n{:?}",
        daemons[0].drain_lines()
    );
    let _server = servers.stop();
}

/// Two players behind cone routers whose direct way crosses a `netjam impair` delay of
/// [`DETOUR_MS`] each way while their way to the server does not: the direct path answers
/// but is slower, so media stays with the server and both say so.
#[test]
fn a_direct_path_slower_than_the_server_is_measured_and_not_used() {
    const DETOUR_MS: f64 = 10.0;
    let _one = one_lab();
    let Some(mut lab) = lab_or_skip(&[RouterKind::Cone, RouterKind::Cone]) else {
        return;
    };
    let dir = tmp_dir("nat-direct-slower");
    let ports = [5000u16, 5001];
    let via = std::net::SocketAddrV4::new(std::net::Ipv4Addr::new(10, 99, 0, 3), 7000);
    let (ana_home, bo_home) = (lab.homes[0].clone(), lab.homes[1].clone());
    let mid = lab
        .detour(&ana_home, ports[0], &bo_home, ports[1], via)
        .expect("the detour");
    let bo_public = SocketAddr::new(lab.homes[1].public_ip().into(), ports[1]);
    let impair = Proc::spawn_lines(
        lab.command(&mid, BIN)
            .args(["impair", "--listen", &via.to_string()])
            .args(["--forward", &bo_public.to_string()])
            .args(["--delay", &DETOUR_MS.to_string()])
            .stdout(Stdio::null()),
        "netjam impair",
    );
    impair.line_with("netjam impair:", STEP);
    let servers = Servers::start(&lab, &dir);
    let tones = [("ana", 950.0), ("bo", 1550.0)];
    let listen = |i: usize| vec!["--listen".into(), format!("{}:{}", lab.homes[i].ip, ports[i])];
    let mut players = seat_players(
        &lab,
        &dir,
        &tones,
        |_| 6.0,
        listen,
        |i, p| {
            let seen = p.server_sees();
            assert_eq!(
                seen.port(),
                ports[i],
                "{}: the cone router did not keep the socket's port, which the detour needs",
                p.name
            );
        },
    );
    for (i, other) in [(0, "bo"), (1, "ana")] {
        let (_, direct) = players[i].path_to(other);
        let (_, line) = players[i].seen_or_wait("its path line", |l| {
            l.starts_with(&format!("netjam: no direct path to {other}:"))
                || l.starts_with(&format!("netjam: direct path to {other} "))
                || l.starts_with(&format!(
                    "netjam: the direct path to {other} answers but is slower"
                ))
        });
        eprintln!("detour: {}: {line}", players[i].name);
        assert!(!direct, "{}: {line}", players[i].name);
        assert!(
            line.contains("answers but is slower"),
            "{}: {line}\nconnection tracking:\n{}\nthe emulator: {:?}",
            players[i].name,
            routers_conntrack(&lab),
            impair.drain_lines()
        );
        // "(RTT 20.41 ms, through the server ...": at least the detour's two delays.
        let rtt: f64 = line
            .split("(RTT ")
            .nth(1)
            .and_then(|r| r.split(" ms").next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no direct RTT in {line}"));
        assert!(
            rtt >= 2.0 * DETOUR_MS,
            "{}: a direct RTT of {rtt} ms through the detour",
            players[i].name
        );
    }
    let reports: Vec<serde_json::Value> = players.iter_mut().map(Player::finish).collect();
    let server = servers.stop();
    let forwarded = count(&server["shell"], "sent");
    let total: u64 = reports
        .iter()
        .map(|r| r["stats"]["sent"]["packets"].as_u64().unwrap_or(0))
        .sum();
    eprintln!("detour: the server forwarded {forwarded} copies of the {total} packets ana and bo sent");
    assert!(total > 1000, "{total}");
    assert!(
        forwarded as f64 >= 0.8 * total as f64,
        "only {forwarded} of {total} went through the server"
    );
    for (me, other) in [(0, 1), (1, 0)] {
        let path = heard_path(&players, &reports, &tones, (me, other), 3.5);
        eprintln!("detour: {}'s report: {} {path}", players[me].name, tones[other].0);
        assert!(
            path.starts_with("via server") && path.ends_with("slower)"),
            "{path}"
        );
    }
}

/// A player behind a router that hands out ports in sequence and one behind a cone router
/// go direct: the first predicts its router's next ports from the two servers' answers and
/// declares them, and the second's probes to them open its router for the first's. A
/// third behind another such router, asking no second server, predicts nothing and stays
/// relayed: the prediction is what opens the way.
#[test]
fn a_router_that_hands_out_ports_in_sequence_is_punched_through_by_prediction() {
    let _one = one_lab();
    let kinds = [RouterKind::Sequential, RouterKind::Cone, RouterKind::Sequential];
    let Some(lab) = lab_or_skip(&kinds) else {
        return;
    };
    let dir = tmp_dir("nat-direct-sequential");
    let servers = Servers::start(&lab, &dir);
    let tones = [("ana", 950.0), ("bo", 1550.0), ("cy", 2150.0)];
    // cy asks no second server.
    let stun = |i: usize| match i {
        2 => vec![],
        _ => vec!["--stun".into(), format!("{}:{STUN_PORT}", lab.stun_ip)],
    };
    let mut players = seat_players(
        &lab,
        &dir,
        &tones,
        |_| 6.0,
        stun,
        |i, p| {
            if i == 0 {
                let line = p.wait_line("the predicted ports", |l| {
                    l.starts_with("netjam: your router gives each new destination the next port")
                });
                eprintln!("sequential: {}: {line}", p.name);
                assert!(line.contains("(+1)"), "{line}");
            }
        },
    );
    both_direct_within_a_second(&mut players[..2], &lab, "sequential <-> cone");
    for (me, other) in [(2, "bo"), (1, "cy")] {
        let (_, direct) = players[me].path_to(other);
        assert!(
            !direct,
            "{} -> {other} without a prediction: {:#?}",
            players[me].name, players[me].said
        );
    }
    for p in &players[1..] {
        assert!(
            !p.said.iter().any(|l| l.contains("the next port")),
            "{} predicted: {:#?}",
            p.name,
            p.said
        );
    }
    let reports: Vec<serde_json::Value> = players.iter_mut().map(Player::finish).collect();
    let _server = servers.stop();
    for (me, other, how) in [(0, 1, "direct RTT "), (1, 0, "direct RTT "), (2, 1, "via server")] {
        let path = heard_path(&players, &reports, &tones, (me, other), 3.5);
        eprintln!("sequential: {} hears {} {path}", players[me].name, tones[other].0);
        assert!(path.starts_with(how), "{path}");
    }
}
