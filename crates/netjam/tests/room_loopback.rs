//! Rooms with real processes on loopback: `netjam server` and four `netjam jam --server`
//! players, each sending its own tone.
//!
//! * every player hears exactly the three others and never itself, and its report names
//!   the three with packets received; every tone is at −6 dBFS, so the three a player
//!   hears would clip without the mix's limiter, and no sample of what it plays reaches
//!   full scale;
//! * a player killed with SIGKILL (no leave sent) and started again under the same name on
//!   the same machine is seated afresh and its old seat goes at once (a member written
//!   here watches the roster: never two of that name), and the others hear it again;
//! * a second player under a name already in the room, from another address, is refused
//!   within seconds and told to pick another name (the room named in another case is the
//!   same room);
//! * a fifth member (a [`RoomClient`] in this process) flooding at 50× its declared rate is
//!   policed, and the four hear each other as cleanly as a room next to it without a flood;
//! * random bytes, truncated and mistyped OSC, forged RTP and oversize datagrams at the
//!   server's port are counted, never crash it and never reach a player's ears;
//! * a player with another password is refused within seconds and told why;
//! * a player at 96 kHz in a room playing at 48 kHz is refused at join, told the room's
//!   rate and how to run at it;
//! * a player naming a silent server first (`--server SILENT,A`) asks the next one and plays.
//!
//! What a player hears is proved from its WAV file: the level of each tone in 200 ms
//! Hann-windowed blocks, with thresholds far from what a loaded machine can blur. Every
//! wait is for something a process prints or reports, with a timeout.
//!
//! One room plays at a time (about 45 s for the file on two cores).

mod common;

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use common::signal::{read_channel0, tone_amp, write_tone, RATE};
use common::{address_in, read_json, Proc, BIN};
use netjam_engine::room::msg::MAX_CONTROL_LEN;
use netjam_engine::room::{ClientConfig, RoomClient, RoomEvent, RosterKind};
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::wire::payload::{AudioFormat, Codec};

/// The players and the tone each sends: far apart, no one a low-order sum or difference
/// of two others, so a tone found in a player's output came from that player alone.
const PLAYERS: [(&str, f64); 4] = [("ana", 311.0), ("bo", 463.0), ("cy", 647.0), ("dee", 887.0)];
/// Amplitude of each player's tone, −6 dBFS: three summed peak at +3.5 dBFS, so only the
/// mix's limiter keeps a player's output under full scale.
const AMP: f64 = 0.5;
/// A sample this loud in a player's output was clipped (the limiter's ceiling is −0.1
/// dBFS, 0.9886).
const CLIPPED: f64 = 0.999;
/// The tone forged packets carry, louder than any player's.
const FORGED_HZ: f64 = 1201.0;
const FORGED_AMP: f64 = 0.9;
/// Analysis block: 200 ms (a 5 Hz bin; the Hann window's leakage is negligible 150 Hz away).
const BLOCK: usize = 9_600;
/// A tone is heard in a block at more than −12 dB of what was sent...
const PRESENT: f64 = AMP / 4.0;
/// ... and absent when it stands out of the level beside it by less than −30 dB of it
/// (the splash of a concealed stretch reaches −36 dB in a block; a tone heard through the
/// room would be at 0 dB).
const ABSENT: f64 = AMP / 30.0;
/// How long any one step may take on a loaded machine before the test gives up.
const STEP: Duration = Duration::from_secs(15);

/// One room plays at a time, and players run at normal priority: a player paces its file
/// by spinning the last part of every 1.33 ms period, and on two cores shared with other
/// work several such players at realtime priority were measured stalling each other for
/// 90–170 ms (at normal priority: 10–25 ms), which would measure the machine, not rooms.
static ONE_ROOM_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_room_at_a_time() -> MutexGuard<'static, ()> {
    ONE_ROOM_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn names_except(i: usize) -> Vec<&'static str> {
    PLAYERS
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .map(|(_, p)| p.0)
        .collect()
}

// ---- audio ---------------------------------------------------------------------------

/// What one player heard: per 200 ms block, the level of each tone of interest and the
/// level beside it (the louder of ±[`SIDE_HZ`]), which tells a tone from the broadband
/// splash of a concealed or skipped stretch.
#[derive(Debug)]
struct Heard {
    blocks: usize,
    /// Tone (Hz, truncated) → per block (level, level beside it).
    levels: BTreeMap<u64, Vec<(f64, f64)>>,
}

/// Where the level beside a tone is read: outside the Hann window's main lobe (±10 Hz),
/// far inside the 150 Hz between two players' tones.
const SIDE_HZ: f64 = 25.0;

impl Heard {
    fn of(path: &Path, tones: &[f64]) -> Self {
        let x = read_channel0(path);
        let blocks: Vec<&[f64]> = x.chunks_exact(BLOCK).collect();
        let levels = tones
            .iter()
            .map(|&hz| {
                let per_block = blocks
                    .iter()
                    .map(|b| {
                        let beside = tone_amp(b, hz - SIDE_HZ).max(tone_amp(b, hz + SIDE_HZ));
                        (tone_amp(b, hz), beside)
                    })
                    .collect();
                (hz as u64, per_block)
            })
            .collect();
        Self {
            blocks: blocks.len(),
            levels,
        }
    }

    fn levels(&self, hz: f64) -> &[(f64, f64)] {
        &self.levels[&(hz as u64)]
    }

    /// Seconds of blocks (from block `from` on) in which `hz` is heard.
    fn seconds_heard(&self, hz: f64, from: usize) -> f64 {
        let n = self
            .levels(hz)
            .iter()
            .skip(from)
            .filter(|l| l.0 > PRESENT)
            .count();
        (n * BLOCK) as f64 / RATE
    }

    /// The most `hz` stands out of what is beside it in any block: a tone that is there
    /// stands out by its level, a splash of broadband noise by nothing.
    fn loudest_tone(&self, hz: f64) -> f64 {
        self.levels(hz)
            .iter()
            .fold(0.0, |m, &(at, beside)| m.max(at - beside))
    }

    fn seconds(&self) -> f64 {
        (self.blocks * BLOCK) as f64 / RATE
    }

    fn summary(&self) -> String {
        self.levels
            .iter()
            .map(|(hz, l)| {
                let heard = l.iter().filter(|b| b.0 > PRESENT).count();
                let loudest = l.iter().fold(0.0f64, |m, b| m.max(b.0));
                let tone = l.iter().fold(0.0f64, |m, b| m.max(b.0 - b.1));
                format!(
                    "{hz} Hz: {heard}/{} blocks, loudest {loudest:.4} (above its sides {tone:.4})",
                    l.len()
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// Player `i` heard the three others for at least `min_s` seconds each and never itself
/// nor anything in `never` (tones nobody in the room sends).
fn assert_hears_exactly_the_others(who: &str, i: usize, heard: &Heard, min_s: f64, never: &[f64]) {
    let own = PLAYERS[i].1;
    assert!(
        heard.seconds() >= 4.0,
        "{who}: only {:.1} s of output",
        heard.seconds()
    );
    for (j, &(name, hz)) in PLAYERS.iter().enumerate() {
        if j == i {
            continue;
        }
        let s = heard.seconds_heard(hz, 0);
        assert!(
            s >= min_s,
            "{who} heard {name} ({hz} Hz) for only {s:.1} s of {:.1} s: {}",
            heard.seconds(),
            heard.summary()
        );
    }
    for hz in std::iter::once(own).chain(never.iter().copied()) {
        let loudest = heard.loudest_tone(hz);
        assert!(
            loudest < ABSENT,
            "{who} heard a tone at {hz} Hz (its own is {own} Hz) {loudest:.4} above its sides in some block: {}",
            heard.summary()
        );
    }
}

// ---- processes -------------------------------------------------------------------------

/// `netjam server` on an ephemeral loopback port, writing its report to `json` when
/// interrupted.
struct RoomServer {
    proc: Proc,
    addr: SocketAddr,
    json: PathBuf,
}

impl RoomServer {
    fn start(dir: &Path) -> Self {
        let json = dir.join("server.json");
        let proc = Proc::spawn_lines(
            Command::new(BIN)
                .args(["server", "--listen", "127.0.0.1:0", "--stats-json"])
                .arg(&json)
                .stdout(Stdio::null()),
            "netjam server",
        );
        let addr = address_in(&proc.next_line(STEP));
        Self { proc, addr, json }
    }

    /// Interrupts it (as Ctrl-C would) and returns its report; it must still have been
    /// running and must exit cleanly.
    fn stop(mut self) -> serde_json::Value {
        self.proc.stop_server(&self.json, STEP)
    }
}

/// A `netjam jam --server` player, with what it printed so far.
struct Player {
    name: &'static str,
    proc: Proc,
    output: PathBuf,
    json: PathBuf,
    said: Vec<String>,
    /// When it said it was in the room (its audio starts then).
    seated_at: Option<Instant>,
}

#[derive(Clone, Copy)]
struct PlayerArgs<'a> {
    server: SocketAddr,
    room: &'a str,
    password: &'a str,
    duration_s: f64,
    dir: &'a Path,
    /// Tells apart the files of two runs of one name.
    tag: &'a str,
}

impl Player {
    fn start(name: &'static str, input: &Path, a: &PlayerArgs<'_>) -> Self {
        Self::start_with(name, input, a, &[])
    }

    /// [`Player::start`] with `extra` arguments.
    fn start_with(name: &'static str, input: &Path, a: &PlayerArgs<'_>, extra: &[&str]) -> Self {
        let output = a.dir.join(format!("{name}{}.heard.wav", a.tag));
        let json = a.dir.join(format!("{name}{}.json", a.tag));
        let proc = Proc::spawn_lines(
            Command::new(BIN)
                .args(["jam", "--server", &a.server.to_string(), "--room", a.room])
                .args(["--name", name, "--password", a.password, "--input"])
                .arg(input)
                .args(["--duration", &a.duration_s.to_string(), "--output"])
                .arg(&output)
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
            output,
            json,
            said: Vec::new(),
            seated_at: None,
        }
    }

    /// Reads its lines until one satisfies `want`, within `timeout`.
    fn wait_line(&mut self, what: &str, timeout: Duration, want: impl Fn(&str) -> bool) -> String {
        self.proc
            .line_keeping(self.name, &mut self.said, what, timeout, want)
    }

    /// Waits until it is seated and playing.
    fn wait_seated(&mut self) {
        self.wait_line("seat", STEP, |l| l.starts_with("netjam: in room"));
        self.seated_at = Some(Instant::now());
    }

    /// Waits until the roster it prints is exactly `names` (in any order, repeats counted).
    fn wait_roster(&mut self, room: &str, names: &[&str]) {
        let mut want: Vec<&str> = names.to_vec();
        want.sort_unstable();
        let prefix = format!("netjam: room {room}: ");
        let what = format!("roster {want:?}");
        self.wait_line(&what, STEP, |l| {
            l.strip_prefix(&prefix).is_some_and(|rest| {
                let mut got: Vec<&str> = rest.split(", ").collect();
                got.sort_unstable();
                got == want
            })
        });
    }

    /// Waits for it to end on its own: its report, and what it heard.
    fn finish(mut self, timeout: Duration) -> Finished {
        let (status, rest) = self.proc.finish(timeout);
        self.said.extend(rest);
        assert!(status.success(), "{} failed: {:#?}", self.name, self.said);
        let report = read_json(&self.json);
        let p = &report["periods"];
        eprintln!(
            "{}: {} periods late, the latest by {:.1} ms",
            self.name,
            p["missed_deadlines"],
            p["wake_late_max_us"].as_f64().unwrap_or_default() / 1e3
        );
        Finished {
            name: self.name,
            report,
            output: self.output,
            said: self.said,
        }
    }
}

struct Finished {
    name: &'static str,
    report: serde_json::Value,
    output: PathBuf,
    said: Vec<String>,
}

impl Finished {
    fn said_lines(&self) -> impl Iterator<Item = &String> {
        self.said.iter()
    }

    /// The members it heard: name → (member id, counters).
    fn heard(&self) -> Vec<(String, u64, serde_json::Value)> {
        self.report["heard"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: no heard in {}", self.name, self.report))
            .iter()
            .map(|m| {
                (
                    m["name"].as_str().unwrap_or_default().to_string(),
                    m["member_id"].as_u64().unwrap_or_default(),
                    m.clone(),
                )
            })
            .collect()
    }

    /// Packets lost from the four players.
    fn lost(&self) -> i64 {
        let players: Vec<&str> = PLAYERS.iter().map(|p| p.0).collect();
        self.heard()
            .iter()
            .filter(|(name, _, _)| players.contains(&name.as_str()))
            .map(|(_, _, m)| m["lost"].as_i64().unwrap_or_default())
            .sum()
    }

    /// Concealed, inserted and skipped stretches in what it heard from the four players.
    fn glitches(&self) -> u64 {
        let players: Vec<&str> = PLAYERS.iter().map(|p| p.0).collect();
        self.heard()
            .iter()
            .filter(|(name, _, _)| players.contains(&name.as_str()))
            .map(|(_, _, m)| {
                ["concealment_events", "inserted", "skipped"]
                    .iter()
                    .map(|k| m[*k].as_u64().unwrap_or_default())
                    .sum::<u64>()
            })
            .sum()
    }
}

/// Writes each player's tone into `dir`, long enough for `seconds` of playing (20 s at
/// least): a player stops when its input ends.
fn tones(dir: &Path, seconds: f64) -> Vec<PathBuf> {
    PLAYERS
        .iter()
        .map(|&(name, hz)| {
            let p = dir.join(format!("{name}.wav"));
            write_tone(&p, hz, AMP, seconds.max(20.0));
            p
        })
        .collect()
}

/// A server and the four players in one room, everyone seated and hearing the others.
fn room_of_four(dir: &Path, room: &str, duration_s: f64) -> (RoomServer, Vec<Player>) {
    let server = RoomServer::start(dir);
    let inputs = tones(dir, duration_s + 1.0);
    let args = PlayerArgs {
        server: server.addr,
        room,
        password: "open sesame",
        duration_s,
        dir,
        tag: "",
    };
    let mut players: Vec<Player> = PLAYERS
        .iter()
        .zip(&inputs)
        .map(|(&(name, _), input)| Player::start(name, input, &args))
        .collect();
    for p in &mut players {
        p.wait_seated();
    }
    for (i, p) in players.iter_mut().enumerate() {
        p.wait_roster(room, &names_except(i));
    }
    (server, players)
}

/// The member named `name` in the server's report.
fn server_member<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["members"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["name"] == name))
        .unwrap_or_else(|| panic!("no member {name} in the server's report: {report}"))
}

fn counter(v: &serde_json::Value, path: &[&str]) -> u64 {
    let mut v = v;
    for k in path {
        v = &v[*k];
    }
    v.as_u64()
        .unwrap_or_else(|| panic!("no counter {path:?} in the report"))
}

// ---- a member written here ---------------------------------------------------------

/// A room member driven by this test: [`RoomClient`] over a plain socket, so it can send
/// what `netjam jam` never would.
struct RawMember {
    socket: UdpSocket,
    server: SocketAddr,
    client: RoomClient,
    t0: Instant,
    ssrc: u32,
    /// Everyone else's SSRC, by name, from the roster.
    roster: BTreeMap<String, u32>,
    /// Every roster event, when it was handed on: (time, kind, name, member id).
    log: Vec<(Instant, RosterKind, String, u32)>,
    buf: Vec<u8>,
}

/// A 64-frame mono L16 packet's declared rate, as `netjam jam` declares it (audio plus RTCP).
const DECLARED_PPS: u32 = 750 + 40;

impl RawMember {
    fn join(server: SocketAddr, room: &str, name: &str, password: &str, bytes_per_s: u32) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
        socket.set_nonblocking(true).expect("nonblocking");
        let t0 = Instant::now();
        let mut config = ClientConfig::new(room, name, password, 0x5eed_0000);
        config.packets_per_s = DECLARED_PPS;
        config.bytes_per_s = bytes_per_s;
        config.nonce_seed = *b"room-loopback-tt";
        config.secure = true;
        let mut m = Self {
            socket,
            server,
            client: RoomClient::new(config, 0),
            t0,
            ssrc: 0,
            roster: BTreeMap::new(),
            log: Vec::new(),
            buf: vec![0u8; 65_536],
        };
        let deadline = Instant::now() + STEP;
        while m.ssrc == 0 {
            assert!(Instant::now() < deadline, "{name} got no seat within {STEP:?}");
            m.pump();
            std::thread::sleep(Duration::from_millis(2));
        }
        m
    }

    fn now_ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    /// Everything due: datagrams in (control to the client, media dropped), timers,
    /// datagrams out, events.
    fn pump(&mut self) {
        while let Ok((n, from)) = self.socket.recv_from(&mut self.buf) {
            if from == self.server && self.buf.first() == Some(&b'/') {
                let now = self.now_ns();
                self.client.handle_datagram(now, &self.buf[..n]);
            }
        }
        let now = self.now_ns();
        if self.client.poll_timeout().is_some_and(|t| t <= now) {
            self.client.handle_timeout(now);
        }
        let mut out = [0u8; MAX_CONTROL_LEN];
        while let Some(n) = self.client.poll_transmit(&mut out) {
            let _ = self.socket.send_to(&out[..n], self.server);
        }
        while let Some(e) = self.client.poll_event() {
            if let RoomEvent::Roster(r) = &e {
                self.log
                    .push((Instant::now(), r.kind, r.name.clone(), r.member_id));
            }
            match e {
                RoomEvent::Joined { ssrc, .. } => self.ssrc = ssrc,
                RoomEvent::Roster(r) if r.kind == RosterKind::Joined => {
                    self.roster.insert(r.name, r.ssrc);
                }
                RoomEvent::Roster(r) if matches!(r.kind, RosterKind::Left | RosterKind::Timeout) => {
                    self.roster.remove(&r.name);
                }
                RoomEvent::Refused { reason, .. } => panic!("refused: {reason}"),
                _ => {}
            }
        }
    }

    /// Waits until the roster holds every one of `names`.
    fn wait_roster(&mut self, names: &[&str]) {
        let deadline = Instant::now() + STEP;
        while !names.iter().all(|n| self.roster.contains_key(*n)) {
            assert!(
                Instant::now() < deadline,
                "roster {:?} never held {names:?}",
                self.roster
            );
            self.pump();
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// netjam's L16 mono 48 kHz packets of 64 frames with `ssrc`, carrying a sine at `hz` of
/// amplitude `amp` (0 for silence).
struct Packets {
    sender: Sender,
    n: u64,
    hz: f64,
    amp: f64,
}

impl Packets {
    fn new(ssrc: u32, hz: f64, amp: f64) -> Self {
        let format = AudioFormat::new(Codec::L16, RATE as u32, 1).expect("format");
        let mut sender = Sender::new(SenderConfig::new(format, 64)).expect("sender");
        sender.set_ssrc(ssrc);
        Self {
            sender,
            n: 0,
            hz,
            amp,
        }
    }

    /// Bytes per second at `pps` packets per second, as `netjam jam` declares them.
    fn bytes_per_s(&self, pps: u32) -> u32 {
        pps * (self.sender.max_packet_bytes() as u32 + 28) + 40 * 1500
    }

    /// The next packet, handed to `send`.
    fn next(&mut self, mut send: impl FnMut(&[u8])) {
        let frames: Vec<f32> = (0..64)
            .map(|k| {
                let t = (self.n + k) as f64 / RATE;
                (self.amp * (2.0 * std::f64::consts::PI * self.hz * t).sin()) as f32
            })
            .collect();
        self.n += 64;
        self.sender.push_frames(0, &frames, &mut send);
    }
}

// ---- tests ---------------------------------------------------------------------------

/// What one room of four reported.
struct RoomRun {
    players: Vec<Finished>,
    server: serde_json::Value,
}

/// Four players for 8 s; with `flood`, a fifth member floods at 50× its declared rate from
/// the moment the four hear each other until they end. Returns the reports and, with a
/// flood, how many packets the flooder sent.
fn run_room(tag: &str, flood: bool) -> (RoomRun, u64) {
    const SECONDS: f64 = 8.0;
    let dir = common::tmp_dir(tag);
    let _alone = one_room_at_a_time();
    let (server, players) = room_of_four(&dir, "band", SECONDS);
    let stop = Arc::new(AtomicBool::new(false));
    let flooder = flood.then(|| {
        let (stop, addr) = (stop.clone(), server.addr);
        std::thread::spawn(move || flood_room(addr, &stop))
    });
    let players: Vec<Finished> = players
        .into_iter()
        .map(|p| p.finish(Duration::from_secs_f64(SECONDS) + STEP))
        .collect();
    // The flooder still holds its seat while the server writes its report.
    let server = server.stop();
    stop.store(true, Ordering::Relaxed);
    let sent = flooder.map_or(0, |f| f.join().expect("flooder"));
    (RoomRun { players, server }, sent)
}

/// Takes a seat as "flood" and sends silence with its own SSRC at 50× the rate it
/// declared until `stop`; returns the packets sent.
fn flood_room(server: SocketAddr, stop: &AtomicBool) -> u64 {
    let mut packets = Packets::new(0, 0.0, 0.0);
    let mut m = RawMember::join(
        server,
        "band",
        "flood",
        "open sesame",
        packets.bytes_per_s(DECLARED_PPS),
    );
    packets.sender.set_ssrc(m.ssrc);
    let rate = f64::from(DECLARED_PPS) * 50.0;
    let start = Instant::now();
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let due = (start.elapsed().as_secs_f64() * rate) as u64;
        while sent < due {
            packets.next(|b| {
                let _ = m.socket.send_to(b, server);
            });
            sent += 1;
        }
        m.pump();
        std::thread::sleep(Duration::from_micros(500));
    }
    sent
}

#[test]
fn four_players_hear_the_three_others_and_a_flooding_member_changes_nothing() {
    // The same room without and with a flood, one after the other.
    let (clean, _) = run_room("room-clean", false);
    let (flooded, flood_sent) = run_room("room-flooded", true);

    for (run, what) in [(&clean, "clean"), (&flooded, "flooded")] {
        for (i, p) in run.players.iter().enumerate() {
            let who = format!("{} ({what})", p.name);
            let heard = Heard::of(&p.output, &PLAYERS.map(|p| p.1));
            assert_hears_exactly_the_others(&who, i, &heard, 5.0, &[]);
            let played = common::signal::read_wav(&p.output);
            let samples = played.channels.iter().flatten();
            let clipped = samples.clone().filter(|x| x.abs() >= CLIPPED).count();
            let peak = samples.fold(0.0f64, |m, x| m.max(x.abs()));
            eprintln!("{who}: peak {peak:.4}, {clipped} samples at full scale");
            assert_eq!(clipped, 0, "{who}: {clipped} clipped samples (peak {peak:.4})");
            let members = p.heard();
            for other in names_except(i) {
                let received = members
                    .iter()
                    .filter(|(n, _, _)| n == other)
                    .map(|(_, _, m)| m["received"].as_u64().unwrap_or_default())
                    .sum::<u64>();
                // 750 packets a second: at least 5 s of them.
                assert!(
                    received >= 3_750,
                    "{who} received {received} packets from {other}: {members:?}"
                );
                // Their tone at -6 dBFS, however the session ended.
                let peak = members
                    .iter()
                    .filter(|(n, _, _)| n == other)
                    .filter_map(|(_, _, m)| m["peak_dbfs"].as_f64())
                    .fold(-200.0, f64::max);
                assert!(peak > -12.0, "{who}: {other} peaked at {peak:.1} dBFS");
            }
            assert!(
                members.iter().all(|(n, _, _)| n != p.name),
                "{who} heard itself: {members:?}"
            );
            assert_series_follows_the_others(&who, p, &names_except(i));
        }
    }

    // The flooder: policed down to about its declared rate.
    let f = server_member(&flooded.server, "flood");
    let (arrived, policed, forwarded) = (
        counter(f, &["packets_in"]),
        counter(f, &["policed_drops"]),
        counter(f, &["forwarded"]),
    );
    eprintln!("flood: sent {flood_sent}, server got {arrived}, policed {policed}, forwarded {forwarded}");
    assert!(
        arrived >= flood_sent / 2,
        "the server saw {arrived} of {flood_sent} flood packets"
    );
    assert!(
        policed * 10 >= arrived * 8,
        "only {policed} of {arrived} flood packets policed"
    );
    let uptime = flooded.server["uptime_s"].as_f64().expect("uptime");
    // 1.5× the declared rate, plus a burst of 100 ms of it.
    let allowed = (1.5 * f64::from(DECLARED_PPS) * uptime + 0.1 * f64::from(DECLARED_PPS)) as u64 + 1;
    assert!(
        forwarded <= allowed,
        "{forwarded} flood packets forwarded in {uptime:.1} s (allowed {allowed})"
    );

    // The four: the flood reaches none of them. Unpoliced, it would bring each of them
    // tens of thousands of packets a second, and thousands of losses and glitches. Policed,
    // what is left is the machine's noise: the flooder and the server share its two cores
    // with the players, and a player descheduled for longer than the policer's burst
    // (100 ms of its rate) catches up faster than its rate and the server drops the excess.
    for (c, f) in clean.players.iter().zip(&flooded.players) {
        let (gc, gf) = (c.glitches(), f.glitches());
        let (lc, lf) = (c.lost(), f.lost());
        eprintln!(
            "{}: glitches clean {gc}, flooded {gf}; lost clean {lc}, flooded {lf}",
            c.name
        );
        assert!(
            gf <= 2 * gc + 60,
            "{} had {gf} concealed/inserted/skipped stretches with the flood, {gc} without",
            c.name
        );
        // 3 % of the 18,000 packets three players send in 8 s.
        assert!(
            lf <= lc + 540,
            "{} lost {lf} packets with the flood, {lc} without",
            c.name
        );
    }
}

/// The statistics file's time series: points over the whole session, in time order, one of
/// them listing all of `others` by name, with counters that never went back.
fn assert_series_follows_the_others(who: &str, p: &Finished, others: &[&str]) {
    let series = p.report["series"]
        .as_array()
        .unwrap_or_else(|| panic!("{who}: no series in the statistics file"));
    // A point about every 100 ms of a session of more than 5 s; a busy machine skips some.
    assert!(series.len() >= 20, "{who}: {} points in the series", series.len());
    let t: Vec<f64> = series.iter().map(|x| x["t_s"].as_f64().expect("t_s")).collect();
    assert!(
        t.windows(2).all(|w| w[0] < w[1]),
        "{who}: times out of order: {t:?}"
    );
    let all_in = |x: &&serde_json::Value| {
        others.iter().all(|o| {
            x["members"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["name"] == *o))
        })
    };
    let full = series.iter().filter(all_in).count();
    // Everyone plays for at least 5 s of the 8: half the points at least.
    assert!(
        2 * full >= series.len(),
        "{who}: only {full} of {} points list {others:?}",
        series.len()
    );
    eprintln!("{who}: mid-session {}", series[series.len() / 2]);
    for other in others {
        let received: Vec<u64> = series
            .iter()
            .filter_map(|x| {
                x["members"]
                    .as_array()?
                    .iter()
                    .find(|m| m["name"] == *other)
                    .and_then(|m| m["received"].as_u64())
            })
            .collect();
        assert!(
            received.windows(2).all(|w| w[0] <= w[1]),
            "{who}: packets received from {other} went back: {received:?}"
        );
    }
}

#[test]
fn a_killed_player_started_again_replaces_its_ghost_at_once_and_is_heard_again() {
    const SURVIVORS_S: f64 = 12.0;
    const RESTARTED_S: f64 = 7.0;
    /// How long after the restarted player's seat the room may still hold its ghost.
    const GHOST_BOUND: Duration = Duration::from_secs(1);
    let dir = common::tmp_dir("room-restart");
    let _alone = one_room_at_a_time();
    let (server, mut players) = room_of_four(&dir, "band", SURVIVORS_S);
    let (dee, dee_hz) = PLAYERS[3];
    // A member written here watches the roster as it changes, event by event.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let stop = stop.clone();
        let mut m = RawMember::join(server.addr, "band", "watch", "open sesame", 100_000);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                m.pump();
                std::thread::sleep(Duration::from_millis(1));
            }
            m.log
        })
    };
    // Let the room play a while; the checks below find each stretch in the audio itself.
    std::thread::sleep(Duration::from_millis(1500));
    let mut victim = players.pop().expect("four players");
    victim.proc.child.kill().expect("SIGKILL"); // no leave: only its restart can tell
    victim.proc.child.wait().expect("reap");
    let killed_at = Instant::now();
    let args = PlayerArgs {
        server: server.addr,
        room: "band",
        password: "open sesame",
        duration_s: RESTARTED_S,
        dir: &dir,
        tag: ".again",
    };
    let mut again = Player::start(dee, &dir.join(format!("{dee}.wav")), &args);
    again.wait_seated();
    let restarted_at = again.seated_at.expect("seated");
    let mut others = names_except(3);
    others.push("watch");
    again.wait_roster("band", &others);
    let again = again.finish(Duration::from_secs_f64(RESTARTED_S) + STEP);
    let survivors: Vec<(Finished, Instant)> = players
        .into_iter()
        .map(|p| {
            let seated = p.seated_at.expect("seated");
            (p.finish(Duration::from_secs_f64(SURVIVORS_S) + STEP), seated)
        })
        .collect();
    stop.store(true, Ordering::Relaxed);
    let log = watcher.join().expect("watcher");
    let report = server.stop();

    // The watcher's roster: the number of dees after each event, and when the ghost went.
    let new_id = counter(&again.report, &["member_id"]);
    let mut dees = 0i32;
    let mut most = 0;
    let mut ghost_gone = None;
    let mut new_joined = None;
    for (at, kind, name, id) in &log {
        if name != dee {
            continue;
        }
        match kind {
            RosterKind::Joined => dees += 1,
            RosterKind::Left | RosterKind::Timeout => dees -= 1,
            RosterKind::Renamed => {}
        }
        most = most.max(dees);
        match (kind, u64::from(*id) == new_id) {
            (RosterKind::Joined, true) => new_joined = Some(*at),
            (RosterKind::Left | RosterKind::Timeout, false) => ghost_gone = Some(*at),
            _ => {}
        }
    }
    let summary: Vec<_> = log
        .iter()
        .map(|(at, k, n, id)| (at.duration_since(killed_at).as_secs_f64(), *k, n.as_str(), *id))
        .collect();
    let (Some(gone), Some(joined)) = (ghost_gone, new_joined) else {
        panic!("the watcher never saw dee's ghost go and dee {new_id} come: {summary:?}");
    };
    let lingered = joined
        .saturating_duration_since(gone)
        .max(gone.saturating_duration_since(joined));
    eprintln!(
        "dee's ghost went {:.3} s after the kill; the restarted dee sat {:.3} s after the kill, seated at {:.3} s",
        gone.duration_since(killed_at).as_secs_f64(),
        joined.duration_since(killed_at).as_secs_f64(),
        restarted_at.duration_since(killed_at).as_secs_f64()
    );
    assert!(
        most == 1 && gone <= joined && lingered < GHOST_BOUND,
        "two dees in the room (at most {most} at once), the ghost went {lingered:?} from the new seat: {summary:?}"
    );
    assert!(
        counter(&report, &["server", "replaced"]) >= 1,
        "the restarted player never replaced its seat: {}",
        report["server"]
    );
    assert!(
        counter(&report, &["server", "joins"]) >= 5,
        "{}",
        report["server"]
    );
    let heard_again = Heard::of(&again.output, &PLAYERS.map(|p| p.1));
    assert_hears_exactly_the_others("dee (restarted)", 3, &heard_again, 4.0, &[]);
    for (i, (p, seated)) in survivors.iter().enumerate() {
        let heard = Heard::of(&p.output, &PLAYERS.map(|p| p.1));
        assert_hears_exactly_the_others(p.name, i, &heard, 4.0, &[]);
        // dee before it was killed, and again from shortly after it was seated anew.
        let block_at = |t: Instant| (t.duration_since(*seated).as_secs_f64() * RATE) as usize / BLOCK;
        let before = heard.seconds_heard(dee_hz, 0) - heard.seconds_heard(dee_hz, block_at(killed_at));
        let after = heard.seconds_heard(dee_hz, block_at(restarted_at) + 3);
        assert!(
            before >= 0.4 && after >= 3.0,
            "{} heard dee {before:.1} s before the kill and {after:.1} s after the restart: {}",
            p.name,
            heard.summary()
        );
        let dees: Vec<(u64, u64)> = p
            .heard()
            .into_iter()
            .filter(|(n, _, _)| n == dee)
            .map(|(_, id, m)| (id, m["received"].as_u64().unwrap_or_default()))
            .collect();
        assert!(
            dees.len() == 2 && dees.iter().any(|&(id, got)| id == new_id && got >= 2_250),
            "{} heard these dees: {dees:?} (the restarted one is member {new_id})",
            p.name
        );
    }
}

#[test]
fn hostile_datagrams_at_the_server_are_counted_and_never_heard() {
    const SECONDS: f64 = 8.0;
    const HOSTILE: Duration = Duration::from_secs(4);
    let dir = common::tmp_dir("room-hostile");
    let _alone = one_room_at_a_time();
    let (server, players) = room_of_four(&dir, "band", SECONDS);
    let to = server.addr;

    // mallory holds a seat, so it can forge from a member's address too.
    let mut forged_by_member = Packets::new(0, FORGED_HZ, FORGED_AMP);
    let bytes = forged_by_member.bytes_per_s(DECLARED_PPS);
    let mut mallory = RawMember::join(to, "band", "mallory", "open sesame", bytes);
    mallory.wait_roster(&PLAYERS.map(|p| p.0));
    forged_by_member.sender.set_ssrc(mallory.roster["bo"]);
    let mut forged_by_stranger = Packets::new(mallory.roster["ana"], FORGED_HZ, FORGED_AMP);
    let stranger = UdpSocket::bind("127.0.0.1:0").expect("bind");
    stranger.set_nonblocking(true).expect("nonblocking");

    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let send = |b: &[u8]| stranger.send_to(b, to).is_ok() as u64;
    let (mut junk, mut truncated_osc, mut mistyped_osc, mut by_stranger, mut by_member, mut oversize) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut anything = 0u64;
    let mut tick = 0u64;
    let start = Instant::now();
    while start.elapsed() < HOSTILE {
        tick += 1;
        // Random bytes: first byte below '#', so neither OSC nor RTP.
        let len = 1 + (next() % 1400) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        b[0] %= b'#';
        junk += send(&b);
        // Random bytes of any kind.
        let len = (next() % 600) as usize;
        anything += send(&(0..len).map(|_| next() as u8).collect::<Vec<_>>());
        // Truncated OSC.
        truncated_osc += send(b"/netjam/jo");
        truncated_osc += send(b"/netjam/join\0\0\0\0,ibssbbiiibb\0\0\0\0\0\0\0\x02");
        // Well-formed OSC with the wrong types.
        mistyped_osc += send(b"/netjam/join\0\0\0\0,sss\0\0\0\0a\0\0\0b\0\0\0c\0\0\0");
        mistyped_osc += send(b"/netjam/leave\0\0\0,f\0\0\x3f\x80\0\0");
        // A player's audio forged from a stranger's address and from another member's.
        forged_by_stranger.next(|p| by_stranger += send(p));
        forged_by_member.next(|p| by_member += mallory.socket.send_to(p, to).is_ok() as u64);
        // Datagrams longer than any the server forwards, with a player's SSRC.
        if tick % 10 == 0 {
            let mut b = vec![0u8; if tick % 100 == 0 { 65_000 } else { 20_000 }];
            b[0] = 0x80;
            b[1] = 96;
            b[8..12].copy_from_slice(&mallory.roster["cy"].to_be_bytes());
            oversize += send(&b);
        }
        mallory.pump();
        while stranger.recv_from(&mut [0u8; 2048]).is_ok() {}
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!(
        "hostile: {junk} junk, {anything} random, {truncated_osc} truncated OSC, {mistyped_osc} mistyped OSC, \
         {by_stranger} forged from a stranger, {by_member} forged by a member, {oversize} oversize"
    );
    let players: Vec<Finished> = players
        .into_iter()
        .map(|p| p.finish(Duration::from_secs_f64(SECONDS) + STEP))
        .collect();
    let report = server.stop(); // asserts it was still up

    let s = &report["server"];
    let got = |k: &str| counter(s, &[k]);
    eprintln!("server: {s}\nshell: {}", report["shell"]);
    assert!(got("junk") >= junk / 2, "junk {} of {junk}", got("junk"));
    assert!(
        got("bad_control") >= (truncated_osc + mistyped_osc) / 2,
        "bad_control {} of {}",
        got("bad_control"),
        truncated_osc + mistyped_osc
    );
    assert!(
        got("unknown_source") >= by_stranger / 2,
        "unknown_source {} of {by_stranger}",
        got("unknown_source")
    );
    let truncated = counter(&report, &["shell", "truncated"]);
    assert!(truncated >= oversize / 2, "oversize {truncated} of {oversize}");
    let m = server_member(&report, "mallory");
    let (forged, forwarded) = (counter(m, &["forged_drops"]), counter(m, &["forwarded"]));
    assert!(forged >= by_member / 2, "forged_drops {forged} of {by_member}");
    assert_eq!(
        forwarded, 0,
        "mallory sent only forgeries, yet some were forwarded"
    );

    for (i, p) in players.iter().enumerate() {
        let heard = Heard::of(
            &p.output,
            &[PLAYERS.map(|p| p.1).as_slice(), &[FORGED_HZ]].concat(),
        );
        assert_hears_exactly_the_others(p.name, i, &heard, 5.0, &[FORGED_HZ]);
        for (name, _, m) in p.heard() {
            if name == "mallory" {
                assert_eq!(m["received"], 0, "{} received mallory's packets: {m}", p.name);
            }
        }
    }
}

/// "ana" plays in room `room` (password "open sesame") and a second player, started by
/// `second` with the room's arguments, must be refused within seconds and say `what_to_do`
/// (every fragment); the server must have refused it and seated ana alone. Returns the
/// server's report.
fn a_second_player_is_refused(
    tag: &str,
    room: &str,
    what_to_do: &[&str],
    second: impl FnOnce(&Path, &PlayerArgs<'_>) -> Proc,
) -> serde_json::Value {
    let dir = common::tmp_dir(tag);
    let server = RoomServer::start(&dir);
    let input = dir.join("tone.wav");
    write_tone(&input, PLAYERS[0].1, AMP, 10.0);
    let args = PlayerArgs {
        server: server.addr,
        room,
        password: "open sesame",
        duration_s: 10.0,
        dir: &dir,
        tag: "",
    };
    let mut ana = Player::start("ana", &input, &args);
    ana.wait_seated();
    let started = Instant::now();
    let (status, said) = second(&input, &args).finish(Duration::from_secs(5));
    let took = started.elapsed();
    eprintln!("refused after {took:?}: {said:?}");
    assert!(!status.success(), "the second player joined: {said:?}");
    assert!(
        said.iter().any(|l| what_to_do.iter().all(|w| l.contains(w))),
        "the refusal does not say {what_to_do:?}: {said:?}"
    );
    let report = server.stop();
    assert!(
        counter(&report, &["server", "refused"]) >= 1,
        "{}",
        report["server"]
    );
    let seated: Vec<(&str, &str)> = report["members"]
        .as_array()
        .expect("members")
        .iter()
        .filter_map(|m| Some((m["name"].as_str()?, m["room"].as_str()?)))
        .collect();
    assert_eq!(seated, [("ana", room)], "the second player was seated");
    drop(ana);
    report
}

#[test]
fn a_wrong_password_is_refused_within_seconds() {
    a_second_player_is_refused("room-password", "band", &["password"], |input, args| {
        Player::start(
            "bo",
            input,
            &PlayerArgs {
                password: "open sesame!",
                tag: ".bo",
                ..*args
            },
        )
        .proc
    });
}

#[test]
fn a_second_player_under_a_taken_name_is_refused_and_told_to_pick_another() {
    // Another "ana" from another address (another machine, as the server sees it), naming
    // the room in another case: the same room, and the name is taken.
    let report = a_second_player_is_refused(
        "room-names",
        "Band",
        &["already has a player named", "--name"],
        |input, args| {
            Player::start_with(
                "ana",
                input,
                &PlayerArgs {
                    room: "band",
                    tag: ".other",
                    ..*args
                },
                &["--listen", "127.0.0.2:0"],
            )
            .proc
        },
    );
    assert!(
        counter(&report, &["server", "names_taken"]) >= 1,
        "{}",
        report["server"]
    );
}

/// A player at 96 kHz in a room playing at 48 kHz (netjam converts 44.1 ↔ 48 kHz, not this):
/// refused at join, told the rate to run at, instead of silence both ways.
#[test]
fn a_player_at_a_rate_the_room_cannot_convert_is_refused_and_told_the_rooms_rate() {
    a_second_player_is_refused(
        "room-rate",
        "band",
        &["plays at 48000 Hz", "96000 Hz", "--rate 48000"],
        |_, args| {
            let output = args.dir.join("cy.heard.wav");
            Proc::spawn_lines(
                Command::new(BIN)
                    .args(["jam", "--server", &args.server.to_string(), "--room", args.room])
                    .args(["--name", "cy", "--password", args.password])
                    .args([
                        "--sine",
                        "500",
                        "--rate",
                        "96000",
                        "--channels",
                        "1",
                        "--duration",
                        "10",
                    ])
                    .arg("--output")
                    .arg(&output)
                    .env("NETJAM_NO_REALTIME", "1")
                    .stdout(Stdio::null()),
                "netjam jam at 96 kHz",
            )
        },
    );
}

/// `--server SILENT,A`: the first server named does not answer (a port that takes
/// datagrams and says nothing), so the player asks the next one and plays there.
#[test]
fn a_player_whose_first_server_is_silent_asks_the_next_one_named() {
    let dir = common::tmp_dir("room-front-doors");
    let server = RoomServer::start(&dir);
    let silent = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let silent_addr = silent.local_addr().expect("addr");
    let input = dir.join("tone.wav");
    write_tone(&input, PLAYERS[0].1, AMP, 3.0);
    let started = Instant::now();
    let mut ana = Proc::spawn_lines(
        Command::new(BIN)
            .args(["jam", "--server", &format!("{silent_addr},{}", server.addr)])
            .args(["--room", "band", "--name", "ana", "--input"])
            .arg(&input)
            .args(["--duration", "2", "--output"])
            .arg(dir.join("ana.heard.wav"))
            .env("NETJAM_NO_REALTIME", "1")
            .stdout(Stdio::null()),
        "netjam jam",
    );
    let (status, said) = ana.finish(STEP);
    eprintln!("done after {:?}: {said:?}", started.elapsed());
    assert!(status.success(), "{said:?}");
    let asked = format!(
        "no answer from the rooms server at {silent_addr}: asking {}",
        server.addr
    );
    assert!(
        said.iter().any(|l| l.contains(&asked)),
        "never said {asked:?}: {said:?}"
    );
    assert!(
        said.iter().any(|l| l.starts_with("netjam: in room")),
        "never seated: {said:?}"
    );
    let mut buf = [0u8; 2048];
    silent.set_nonblocking(true).expect("nonblocking");
    assert!(silent.recv(&mut buf).is_ok(), "the silent server was never asked");
    // The room list and an ensemble through the rooms server take the same doors.
    let doors = format!("{silent_addr},{}", server.addr);
    for (what, args) in [
        ("rooms", vec!["rooms", "--server", &doors, "--timeout", "1"]),
        (
            "ensemble list",
            vec!["ensemble", "list", "band", "--server", &doors, "--wait", "1"],
        ),
    ] {
        let out = Command::new(BIN).args(&args).output().expect("netjam");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what}: {said}");
        assert!(
            (said.contains(&silent_addr.to_string()) && said.contains("next server"))
                || said.contains(&asked),
            "{what} never said it asked past the silent server: {said}"
        );
    }
    server.stop();
}

/// A server that stops answering (SIGSTOP, as a machine that hangs) and comes back: each
/// player says so once when it goes, and once when it answers again, with how long it was;
/// the server keeps every seat through its own silence.
#[test]
fn a_server_that_stops_answering_and_comes_back_is_said_both_times() {
    const HELD_S: u64 = 7;
    // Long enough that the players still play when the server answers again, however long
    // four players take to sit down on a loaded machine (5 s of silence before "lost", 7 s
    // held, a second to be seated again, and the rest for the setup).
    const PLAYS_S: u64 = 24;
    let dir = common::tmp_dir("room-held");
    let _alone = one_room_at_a_time();
    let (server, mut players) = room_of_four(&dir, "held", PLAYS_S as f64);
    let pid = server.proc.child.id().to_string();
    let signal = |sig: &str| {
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let held = Instant::now();
    for p in &mut players {
        p.wait_line("the server lost", Duration::from_secs(HELD_S), |l| {
            l.contains("rooms server at") && l.contains("stopped answering")
        });
    }
    std::thread::sleep(Duration::from_secs(HELD_S).saturating_sub(held.elapsed()));
    signal("-CONT");
    // At least HELD_S: longer when the players took longer to say it was lost.
    let stopped_s = held.elapsed().as_secs_f64();
    for p in &mut players {
        let line = p.wait_line("the server back", STEP, |l| l.contains("answers again"));
        let said: f64 = line
            .split("after ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{}: no time in {line:?}", p.name));
        // The silence holds the time the server was stopped, what passed since the player
        // last heard it before (a keep-alive's second) and the next ask after (at most a
        // second's back-off), each stretched on a loaded machine.
        assert!(
            (stopped_s - 0.2..stopped_s + 4.0).contains(&said),
            "{}: {line} (the server was stopped for {stopped_s:.1} s)",
            p.name
        );
    }
    for p in players {
        let f = p.finish(Duration::from_secs(PLAYS_S) + STEP);
        let lost = f
            .said_lines()
            .filter(|l| l.contains("rooms server at") && l.contains("stopped answering"))
            .count();
        assert_eq!(lost, 1, "{}: said the server was lost {lost} times", f.name);
    }
    // The server knew it had not run, and dropped nobody for its own silence.
    let report = server.stop();
    assert!(report["shell"]["stalls"].as_u64() >= Some(1), "{report}");
    assert_eq!(report["server"]["timeouts"].as_u64(), Some(0), "{report}");
}
