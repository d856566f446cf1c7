//! Scenarios a listener would notice, played by real processes on loopback (issue 22, item
//! 6), shared by the bench `benches/listener.rs` (which prints them) and the test
//! `tests/listener_scenarios.rs` (which asserts bounds on them).
//!
//! Every player sends its own steady sine (`jam --sine`, amplitude 0.5) and writes what it
//! hears to a WAV file (`--output`); [`netjam_engine::listen`] judges each file with the
//! other players' tones present and the player's own absent. A scenario gives one [`Row`]
//! per listening player:
//!
//! - **cents**: the largest |pitch error| of a heard tone in a window that is not a glitch.
//!   A tone is read only in windows where it is heard (within [`HEARD_WITHIN_DB`] of its
//!   median level, that median within as much of the loudest tone's), so a member who has
//!   left, or was never heard, does not read as a wild pitch (the weakest level says so);
//!   and the same over every window that is not silent (**any**): a pitch that bends fast
//!   leaves a residual and glitches its own window, so the first figure alone would hide it;
//! - **glitch windows**, and of those the ones **away** from the event (more than
//!   [`EVENT_BEFORE_S`] before it starts or [`EVENT_AFTER_S`] after it ends), and the
//!   **silent** ones among them;
//! - the **worst residual** of a window that is not silent (dB);
//! - the **ghost**: the player's own tone relative to the loudest tone it hears (dB);
//! - the **weakest** heard tone's median level relative to the level sent (dB);
//! - the jitter buffer's **added latency** before the event, at its peak and 1 s after it
//!   ([`Latency`]), from the `--stats-json` time series of a `jam --peer` player. A player
//!   in a room (`jam --room`) writes no time series, so its latency reads "-".
//!
//! Times are on the listener's clock: seconds since its process was started, which is where
//! its WAV file and its time series start, give or take its start-up (tens of ms).
//!
//! The players of a room run without realtime priority (`NETJAM_NO_REALTIME`), as in
//! tests/room_loopback.rs: four players spinning at realtime priority on two cores stall
//! each other for 100 ms and more, which measures the machine rather than the room. The two
//! players of a peer-to-peer scenario run as a user runs them, at realtime priority.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use netjam::endpoint::wav::read_first_channel;
use netjam_engine::listen::{listen, Listening, Tones};

use crate::common::{free_udp_port, room_server, Proc, BIN};

/// Amplitude of `jam --sine`.
pub const SINE_AMPLITUDE: f64 = 0.5;
/// Seconds a scenario plays (a leave/join plays [`LEAVE_JOIN_SECONDS`]).
pub const SECONDS: f64 = 10.0;
/// The start left out of the measure: the first packets and the jitter buffer settling.
pub const SKIP_SECONDS: f64 = 1.5;
/// When a scripted link event happens, seconds after the first packet through the link.
pub const EVENT_AT_S: f64 = 4.0;
/// The stall of scenario (c), ms.
pub const STALL_MS: f64 = 200.0;
/// The one-way delay of the stall scenario's link, ms.
pub const STALL_LINK_DELAY_MS: f64 = 5.0;
/// The delay step of scenario (d): from this one-way delay (ms) ...
pub const STEP_FROM_MS: f64 = 15.0;
/// ... by this much (ms).
pub const STEP_BY_MS: f64 = -10.0;
/// A leave/join room plays this long; one member leaves at [`LEAVE_AT_S`] and is started
/// again at [`JOIN_AT_S`].
pub const LEAVE_JOIN_SECONDS: f64 = 12.0;
pub const LEAVE_AT_S: f64 = 4.0;
pub const JOIN_AT_S: f64 = 7.0;
/// A tone's pitch is read in a window only where its level is within this of its median
/// (dB): a member who is away is not there to be out of tune.
pub const HEARD_WITHIN_DB: f64 = 20.0;
/// A glitch window that starts this long before an event, or ends within
/// [`EVENT_AFTER_S`] after it, belongs to the event (s).
pub const EVENT_BEFORE_S: f64 = 0.3;
pub const EVENT_AFTER_S: f64 = 1.0;
/// The time constant of the series' `added_latency_recent_ms`, s (its doc: "an exponential
/// mean with a 0.5 s time constant").
const RECENT_TAU_S: f64 = 0.5;
/// The longest any one process may take beyond what it was told to play.
const GRACE: Duration = Duration::from_secs(20);

/// The level `jam --sine` sends, dB relative to a full-scale sine.
pub fn sent_db() -> f64 {
    20.0 * SINE_AMPLITUDE.log10()
}

/// The scenarios of issue 22, item 6, on loopback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// (a) Two `jam --peer` players, no event.
    PeerPair,
    /// (b) Four players in one room on one `netjam server`, no event.
    RoomOfFour,
    /// (b) with every player's page open (`--web`, a WebSocket reading its snapshots for
    /// the whole run): what a page costs the sound.
    RoomOfFourPages,
    /// (c) Two peers through `netjam impair`, a 200 ms stall at 4 s.
    Stall,
    /// (d) Two peers through `netjam impair`, the delay stepping from 15 to 5 ms at 4 s.
    DelayStep,
    /// (e) Three players in a room; one leaves at 4 s and joins again at 7 s.
    LeaveJoin,
    /// (b) in a room with a password: every stream sealed end to end (SFrame).
    RoomOfFourPrivate,
}

impl Scenario {
    pub const ALL: [Scenario; 7] = [
        Scenario::PeerPair,
        Scenario::RoomOfFour,
        Scenario::RoomOfFourPages,
        Scenario::RoomOfFourPrivate,
        Scenario::Stall,
        Scenario::DelayStep,
        Scenario::LeaveJoin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::PeerPair => "p2p",
            Scenario::RoomOfFour => "room4",
            Scenario::RoomOfFourPages => "room4-web",
            Scenario::RoomOfFourPrivate => "room4-private",
            Scenario::Stall => "stall",
            Scenario::DelayStep => "step",
            Scenario::LeaveJoin => "leave-join",
        }
    }

    /// Plays the scenario once, its files in `dir`: a row per listening player.
    pub fn run(self, dir: &Path) -> Vec<Row> {
        std::fs::create_dir_all(dir).expect("scenario directory");
        match self {
            Scenario::PeerPair => peer_pair(self, dir, None),
            Scenario::Stall => peer_pair(
                self,
                dir,
                Some(Link {
                    delay_ms: STALL_LINK_DELAY_MS,
                    event: format!("{EVENT_AT_S}s:stall={STALL_MS}ms"),
                    lasts_s: STALL_MS / 1e3,
                }),
            ),
            Scenario::DelayStep => peer_pair(
                self,
                dir,
                Some(Link {
                    delay_ms: STEP_FROM_MS,
                    event: format!("{EVENT_AT_S}s:delay={STEP_BY_MS}ms"),
                    lasts_s: 0.0,
                }),
            ),
            Scenario::RoomOfFour => room_of_four(self, dir, false, None),
            Scenario::RoomOfFourPages => room_of_four(self, dir, true, None),
            Scenario::RoomOfFourPrivate => room_of_four(self, dir, false, Some("rehearsal only")),
            Scenario::LeaveJoin => leave_join(self, dir),
        }
    }
}

/// What one player heard in one run of a scenario.
#[derive(Debug, Clone)]
pub struct Row {
    pub scenario: Scenario,
    /// The listening player, by the tone it sends.
    pub listener: String,
    pub heard: Heard,
    pub latency: Latency,
    /// The latency series it was read from ([`latency_series`]); empty for a room player.
    pub series: Vec<(f64, f64)>,
    /// When the event started and ended on the listener's clock (s), if there was one.
    pub event: Option<(f64, f64)>,
    /// A second event (a member joining again), on the listener's clock (s).
    pub second_event: Option<f64>,
}

/// The listener's measure of one WAV file, in the figures the table prints.
#[derive(Debug, Clone)]
pub struct Heard {
    /// Largest |cents| of a heard tone outside glitch windows.
    pub clean_cents: f64,
    /// When the window holding it starts (s).
    pub clean_cents_at_s: f64,
    /// Largest |cents| of a heard tone in any window that is not silent, glitch windows
    /// included: a pitch that bends fast enough leaves a residual and glitches its window.
    pub any_cents: f64,
    pub windows: usize,
    /// Start of every glitch window (s).
    pub glitches_at: Vec<f64>,
    pub silent_windows: usize,
    /// Worst residual of a window that is not silent (dB); None if every window was silent.
    pub worst_residual_db: Option<f64>,
    /// The own tone relative to the loudest tone heard (dB).
    pub ghost_db: Option<f64>,
    /// Each heard tone's median level relative to the level sent (dB), in the order given.
    pub levels_db: Vec<(f64, f64)>,
    /// The listener's one-line summary.
    pub summary: String,
}

impl Heard {
    /// The weakest heard tone relative to the level sent (dB).
    pub fn weakest_db(&self) -> f64 {
        self.levels_db.iter().map(|l| l.1).fold(f64::INFINITY, f64::min)
    }

    /// Glitch windows more than [`EVENT_BEFORE_S`] before the events or
    /// [`EVENT_AFTER_S`] after them (all of them without an event).
    pub fn glitches_away(&self, events: &[(f64, f64)]) -> usize {
        let win = netjam_engine::listen::WINDOW_SECONDS;
        self.glitches_at
            .iter()
            .filter(|&&at| {
                !events
                    .iter()
                    .any(|&(from, to)| at + win > from - EVENT_BEFORE_S && at < to + EVENT_AFTER_S)
            })
            .count()
    }
}

/// Judges `wav` with `present` heard and `own` absent.
pub fn judge(wav: &Path, present: &[f64], own: f64) -> Heard {
    let (samples, rate) = read_first_channel(wav).unwrap_or_else(|e| panic!("{}: {e:#}", wav.display()));
    let tones = Tones::present(present).absent(&[own]).skip(SKIP_SECONDS);
    let l = listen(&samples, rate, &tones).unwrap_or_else(|e| panic!("{}: {e}", wav.display()));
    heard_of(&l)
}

fn heard_of(l: &Listening) -> Heard {
    let s = &l.summary;
    let (mut clean_cents, mut clean_cents_at_s, mut any_cents) = (0.0f64, 0.0, 0.0f64);
    for w in &l.windows {
        for (t, level) in w.present.iter().zip(&s.present) {
            // A tone never heard (its median far below the loudest) has no pitch to read.
            let heard = level.relative_db > -HEARD_WITHIN_DB;
            if !heard || t.level_db <= level.median_db - HEARD_WITHIN_DB {
                continue;
            }
            any_cents = any_cents.max(t.cents.abs());
            if !w.is_glitch() && t.cents.abs() > clean_cents {
                (clean_cents, clean_cents_at_s) = (t.cents.abs(), w.start_seconds);
            }
        }
    }
    let worst_residual_db = l.windows.iter().filter_map(|w| w.residual_db).reduce(f64::max);
    Heard {
        clean_cents,
        clean_cents_at_s,
        any_cents,
        windows: s.windows,
        glitches_at: s.glitches.iter().map(|g| g.at_seconds).collect(),
        silent_windows: s.silent_windows,
        worst_residual_db,
        ghost_db: s.loudest_absent_db(),
        levels_db: s
            .present
            .iter()
            .map(|t| (t.hz, t.median_db - sent_db()))
            .collect(),
        summary: s.to_string(),
    }
}

/// The jitter buffer's added latency around an event, ms, from a `jam --peer` player's
/// time series. Without an event: the median over the measured run, its peak, no "after".
#[derive(Debug, Clone, Copy, Default)]
pub struct Latency {
    pub before_ms: Option<f64>,
    pub peak_ms: Option<f64>,
    pub after_ms: Option<f64>,
    /// Seconds from the event's end until the latency came back within [`BACK_WITHIN_MS`]
    /// of what it was before and stayed there (issue 22's goal: within 1 s); None if not
    /// within [`BACK_HORIZON_S`] ([`back_after`]).
    pub back_s: Option<f64>,
}

/// How close to the latency before an event counts as back (issue 22: 0.5 ms), ms.
pub const BACK_WITHIN_MS: f64 = 0.5;
/// How far after an event's end [`back_after`] looks for the latency to be back, s.
pub const BACK_HORIZON_S: f64 = 3.0;
/// How long the latency must stay back to count as back, s.
pub const BACK_STAYS_S: f64 = 1.0;

/// Seconds from `to` until the latency of `series` is back within `within_ms` of
/// `before_ms` and stays there for [`BACK_STAYS_S`]: the start of the first interval from
/// which it does (0 if it never rose), looking at most [`BACK_HORIZON_S`] ahead; None if it
/// is not back by then. Each interval is read as the median of itself and its two
/// neighbours, so one interval's misreading of the smoothed series is not taken for latency
/// kept, and a rise a second later (the machine, not the event) is not the event's.
pub fn back_after(series: &[(f64, f64)], to: f64, before_ms: f64, within_ms: f64) -> Option<f64> {
    let within = |i: usize| {
        let near: Vec<f64> = series[i.saturating_sub(1)..(i + 2).min(series.len())]
            .iter()
            .map(|p| p.1)
            .collect();
        median(near).is_some_and(|ms| ms <= before_ms + within_ms)
    };
    let end = series.last()?.0;
    (0..series.len())
        .filter(|&i| series[i].0 > to && series[i].0 <= to + BACK_HORIZON_S + 1e-6)
        .filter(|&i| series[i].0 + BACK_STAYS_S <= end + 1e-6)
        .find(|&i| {
            (i..series.len())
                .take_while(|&j| series[j].0 <= series[i].0 + BACK_STAYS_S + 1e-6)
                .all(within)
        })
        .map(|i| {
            let start = if i == 0 { to } else { series[i - 1].0 };
            (start - to).max(0.0)
        })
}

/// The mean added latency of what played in each interval of the time series: (end of the
/// interval in s, ms).
///
/// The series holds `added_latency_recent_ms`, an exponential mean (0.5 s) that would still
/// show a 200 ms stall 1 s later; each interval's own mean is recovered from two successive
/// points, r₁ = a·r₀ + (1 − a)·m with a = exp(−Δt/τ), and kept within the running maximum
/// (`added_latency_max_ms`), which a mean cannot exceed: after a stretch where nothing
/// played, the first packets weigh more than a steady flow would.
pub fn latency_series(stats_json: &Path) -> Vec<(f64, f64)> {
    let text =
        std::fs::read_to_string(stats_json).unwrap_or_else(|e| panic!("{}: {e}", stats_json.display()));
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", stats_json.display()));
    let points: Vec<(f64, f64, f64)> = v["series"]
        .as_array()
        .map(|s| {
            s.iter()
                .filter_map(|p| {
                    let jb = &p["stats"]["heard"]["jitter_buffer"];
                    Some((
                        p["t_s"].as_f64()?,
                        jb["added_latency_recent_ms"].as_f64()?,
                        jb["added_latency_max_ms"].as_f64()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    points
        .windows(2)
        .map(|w| {
            let ((t0, r0, _), (t1, r1, max)) = (w[0], w[1]);
            let a = (-(t1 - t0).max(1e-6) / RECENT_TAU_S).exp();
            (t1, ((r1 - a * r0) / (1.0 - a)).clamp(0.0, max))
        })
        .collect()
}

impl Latency {
    /// Around an event from `from` to `to` (s on the series' clock): the median of the
    /// 1.5 s before it, the peak from just before it to 1.5 s after it, and the mean of the
    /// intervals ending 0.9 to 1.1 s after its end.
    pub fn around(series: &[(f64, f64)], from: f64, to: f64) -> Self {
        let within = |a: f64, b: f64| -> Vec<f64> {
            series
                .iter()
                .filter(|p| p.0 > a && p.0 <= b)
                .map(|p| p.1)
                .collect()
        };
        let before_ms = median(within(from - 1.5, from - 0.2));
        Self {
            before_ms,
            peak_ms: within(from - 0.1, to + 1.5).into_iter().reduce(f64::max),
            after_ms: median(within(to + 0.9 - 1e-6, to + 1.1 + 1e-6)),
            back_s: before_ms.and_then(|b| back_after(series, to, b, BACK_WITHIN_MS)),
        }
    }

    /// Without an event: the median and the peak after the skipped start.
    pub fn steady(series: &[(f64, f64)]) -> Self {
        let after_skip: Vec<f64> = series
            .iter()
            .filter(|p| p.0 > SKIP_SECONDS)
            .map(|p| p.1)
            .collect();
        Self {
            before_ms: median(after_skip.clone()),
            peak_ms: after_skip.into_iter().reduce(f64::max),
            after_ms: None,
            back_s: None,
        }
    }
}

pub fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

// ---- processes -------------------------------------------------------------------------

/// A link through `netjam impair` for each direction of a peer pair.
struct Link {
    delay_ms: f64,
    /// The scripted event (`--event`).
    event: String,
    /// How long the event lasts, s.
    lasts_s: f64,
}

/// One `jam` player's files.
struct Files {
    wav: PathBuf,
    json: PathBuf,
    log: PathBuf,
}

impl Files {
    fn new(dir: &Path, tag: &str) -> Self {
        Self {
            wav: dir.join(format!("{tag}.wav")),
            json: dir.join(format!("{tag}.json")),
            log: dir.join(format!("{tag}.log")),
        }
    }
}

fn log_file(path: &Path) -> std::fs::File {
    std::fs::File::create(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A `jam --peer` player sending `hz` from `listen` to `peer`.
fn peer_player(hz: f64, listen: u16, peer: u16, seconds: f64, f: &Files) -> Proc {
    Proc::spawn(
        Command::new(BIN)
            .args(["jam", "--peer", &format!("127.0.0.1:{peer}")])
            .args(["--listen", &format!("127.0.0.1:{listen}")])
            .args(["--sine", &hz.to_string(), "--duration", &seconds.to_string()])
            .arg("--output")
            .arg(&f.wav)
            .arg("--stats-json")
            .arg(&f.json)
            .stdout(Stdio::null())
            .stderr(log_file(&f.log)),
        "netjam jam --peer",
    )
}

/// `netjam impair` from `listen` to `forward` with `link`, its stderr read line by line.
fn impair(listen: u16, forward: u16, link: &Link, seconds: f64) -> Proc {
    let p = Proc::spawn_lines(
        Command::new(BIN)
            .args(["impair", "--listen", &format!("127.0.0.1:{listen}")])
            .args(["--forward", &format!("127.0.0.1:{forward}")])
            .args(["--delay", &link.delay_ms.to_string(), "--event", &link.event])
            .args(["--duration", &seconds.to_string()])
            .stdout(Stdio::null()),
        "netjam impair",
    );
    p.line_with("scripted link events", Duration::from_secs(10));
    p
}

/// Waits for `impair` to say its event begins ("4.000 s: event begins: ..." for a stall,
/// "... event takes effect: ..." for a step): when, as an instant here.
fn event_begins(impair: &Proc, within: Duration) -> Instant {
    impair.line_with(" s: event ", within);
    Instant::now()
}

fn since(t0: Instant, t: Instant) -> f64 {
    t.saturating_duration_since(t0).as_secs_f64()
}

/// (a), (c), (d): two `jam --peer` players at 440 and 660 Hz, directly or each direction
/// through its own `netjam impair` (the player sends to its impair, which forwards to the
/// other player; a player hears whoever sends to its port).
fn peer_pair(scenario: Scenario, dir: &Path, link: Option<Link>) -> Vec<Row> {
    let (a_hz, b_hz) = (440.0, 660.0);
    let (a_port, b_port) = (free_udp_port(), free_udp_port());
    let (fa, fb) = (Files::new(dir, "a440"), Files::new(dir, "b660"));
    // Each impair carries what one player hears: [to b, to a].
    let impairs = link.as_ref().map(|l| {
        let (to_b, to_a) = (free_udp_port(), free_udp_port());
        let linger = SECONDS + 5.0;
        (
            [impair(to_b, b_port, l, linger), impair(to_a, a_port, l, linger)],
            (to_b, to_a),
        )
    });
    let (a_sends_to, b_sends_to) = impairs.as_ref().map_or((b_port, a_port), |i| i.1);
    let a_started = Instant::now();
    let mut a = peer_player(a_hz, a_port, a_sends_to, SECONDS, &fa);
    let b_started = Instant::now();
    let mut b = peer_player(b_hz, b_port, b_sends_to, SECONDS, &fb);
    // When each listener's link event began, on its own clock.
    let events = impairs.as_ref().zip(link.as_ref()).map(|((procs, _), l)| {
        let within = Duration::from_secs_f64(EVENT_AT_S) + GRACE;
        let to_b = since(b_started, event_begins(&procs[0], within));
        let to_a = since(a_started, event_begins(&procs[1], within));
        [(to_a, to_a + l.lasts_s), (to_b, to_b + l.lasts_s)]
    });
    let limit = Duration::from_secs_f64(SECONDS) + GRACE;
    for (p, f) in [(&mut a, &fa), (&mut b, &fb)] {
        let status = p.wait_for(limit);
        assert!(
            status.success(),
            "{scenario:?}: a player failed: {}",
            std::fs::read_to_string(&f.log).unwrap_or_default()
        );
    }
    drop(impairs);
    [("440", &fa, b_hz, a_hz), ("660", &fb, a_hz, b_hz)]
        .into_iter()
        .enumerate()
        .map(|(i, (who, f, heard, own))| {
            let series = latency_series(&f.json);
            let event = events.map(|e| e[i]);
            let latency = match event {
                Some((from, to)) => Latency::around(&series, from, to),
                None => Latency::steady(&series),
            };
            Row {
                scenario,
                listener: who.into(),
                heard: judge(&f.wav, &[heard], own),
                latency,
                series,
                event,
                second_event: None,
            }
        })
        .collect()
}

/// A `jam --room` player named after its tone.
struct RoomPlayer {
    hz: f64,
    proc: Proc,
    files: Files,
    started: Instant,
    /// With its page open: the reader of the page's WebSocket, which returns how many
    /// snapshots it read.
    page: Option<std::thread::JoinHandle<u64>>,
}

impl RoomPlayer {
    fn start(server: std::net::SocketAddr, hz: f64, seconds: f64, files: Files) -> Self {
        Self::start_with(server, hz, seconds, files, false, None)
    }

    /// [`RoomPlayer::start`], serving its page (`--web`) when `page` (see
    /// [`RoomPlayer::open_page`]).
    fn start_with(
        server: std::net::SocketAddr,
        hz: f64,
        seconds: f64,
        files: Files,
        page: bool,
        password: Option<&str>,
    ) -> Self {
        let started = Instant::now();
        let mut cmd = Command::new(BIN);
        cmd.args(["jam", "--server", &server.to_string(), "--room", "scenario"])
            .args(["--name", &format!("p{hz}"), "--sine", &hz.to_string()])
            .args(["--duration", &seconds.to_string(), "--output"])
            .arg(&files.wav)
            .arg("--stats-json")
            .arg(&files.json)
            .env("NETJAM_NO_REALTIME", "1")
            .stdout(Stdio::null());
        if page {
            cmd.args(["--web", "127.0.0.1:0"]);
        }
        if let Some(p) = password {
            cmd.args(["--password", p]);
        }
        let proc = Proc::spawn_lines(&mut cmd, "netjam jam --room");
        Self {
            hz,
            proc,
            files,
            started,
            page: None,
        }
    }

    /// Opens the page it serves, for a reader that stays until the player ends. Called
    /// once every player is started, so the players start as close together as without
    /// pages (and end so: a member leaving is heard, and must not count against the page).
    fn open_page(&mut self) {
        let line = self.proc.line_with("your page of room", Duration::from_secs(15));
        let host = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http://"))
            .and_then(|u| u.split('/').next())
            .unwrap_or_else(|| panic!("no page URL in {line:?}"))
            .to_owned();
        self.page = Some(std::thread::spawn(move || read_page(&host)));
    }

    /// Waits until it is seated: when, as an instant here.
    fn seated(&self) -> Instant {
        self.proc.line_with("netjam: in room", Duration::from_secs(15));
        Instant::now()
    }

    /// Waits for it to end on its own (it must succeed); what it said is kept in its log.
    fn finish(mut self, seconds: f64) -> Self {
        let (status, said) = self.proc.finish(Duration::from_secs_f64(seconds) + GRACE);
        let _ = std::fs::write(&self.files.log, said.join("\n"));
        assert!(status.success(), "room player {} failed: {said:#?}", self.hz);
        self
    }
}

/// Reads the page's WebSocket at `host` until the player closes it; the snapshots read.
fn read_page(host: &str) -> u64 {
    let Ok((mut ws, _)) = tungstenite::client::connect(format!("ws://{host}/ws")) else {
        return 0;
    };
    let mut snapshots = 0;
    while let Ok(m) = ws.read() {
        if m.to_text().is_ok_and(|t| t.contains(r#""type":"snapshot""#)) {
            snapshots += 1;
        }
    }
    snapshots
}

/// A row for a room player who heard `others`.
fn room_row(scenario: Scenario, p: &RoomPlayer, others: &[f64], event: Option<(f64, f64)>) -> Row {
    Row {
        scenario,
        listener: format!("{}", p.hz),
        heard: judge(&p.files.wav, others, p.hz),
        latency: Latency::default(),
        series: Vec::new(),
        event,
        second_event: None,
    }
}

/// (b): four players in one room, each hearing the other three; with `pages`, each with
/// its page open for the whole run.
fn room_of_four(scenario: Scenario, dir: &Path, pages: bool, password: Option<&str>) -> Vec<Row> {
    const TONES: [f64; 4] = [330.0, 440.0, 550.0, 660.0];
    let (_server, addr) = room_server(&(SECONDS + 30.0).to_string(), Duration::from_secs(10));
    let mut players: Vec<RoomPlayer> = TONES
        .iter()
        .map(|&hz| {
            RoomPlayer::start_with(
                addr,
                hz,
                SECONDS,
                Files::new(dir, &format!("p{hz}")),
                pages,
                password,
            )
        })
        .collect();
    if pages {
        players.iter_mut().for_each(RoomPlayer::open_page);
    }
    let mut players: Vec<RoomPlayer> = players.into_iter().map(|p| p.finish(SECONDS)).collect();
    for p in &mut players {
        if let Some(reader) = p.page.take() {
            let snapshots = reader.join().unwrap_or(0);
            let rate = snapshots as f64 / SECONDS;
            eprintln!(
                "the page of the player at {} Hz: {snapshots} snapshots ({rate:.1}/s)",
                p.hz
            );
            assert!(
                rate >= 10.0,
                "the page of {} Hz read {rate:.1} snapshots a second",
                p.hz
            );
        }
    }
    players
        .iter()
        .map(|p| {
            let others: Vec<f64> = TONES.iter().copied().filter(|&t| t != p.hz).collect();
            room_row(scenario, p, &others, None)
        })
        .collect()
}

/// (e): three players in a room; the one at 550 Hz leaves at [`LEAVE_AT_S`] (Ctrl-C, as a
/// player who quits) and is started again at [`JOIN_AT_S`] under the same name. A row for
/// each of the two who stayed.
fn leave_join(scenario: Scenario, dir: &Path) -> Vec<Row> {
    let (stay, goes) = ([330.0, 440.0], 550.0);
    let (_server, addr) = room_server(&(LEAVE_JOIN_SECONDS + 30.0).to_string(), Duration::from_secs(10));
    let stayers: Vec<RoomPlayer> = stay
        .iter()
        .map(|&hz| RoomPlayer::start(addr, hz, LEAVE_JOIN_SECONDS, Files::new(dir, &format!("p{hz}"))))
        .collect();
    let t0 = Instant::now();
    let first = RoomPlayer::start(addr, goes, LEAVE_JOIN_SECONDS, Files::new(dir, "p550-first"));
    first.seated();
    sleep_until(t0 + Duration::from_secs_f64(LEAVE_AT_S));
    let left = Instant::now();
    first.proc.interrupt();
    let _first = first.finish(5.0);
    sleep_until(t0 + Duration::from_secs_f64(JOIN_AT_S));
    let again_for = LEAVE_JOIN_SECONDS - JOIN_AT_S - 1.0;
    let again = RoomPlayer::start(addr, goes, again_for, Files::new(dir, "p550-again"));
    let joined = again.seated();
    let _again = again.finish(again_for);
    let stayers: Vec<RoomPlayer> = stayers
        .into_iter()
        .map(|p| p.finish(LEAVE_JOIN_SECONDS))
        .collect();
    stayers
        .iter()
        .map(|p| {
            let others = [stay[0] + stay[1] - p.hz, goes];
            let leave = since(p.started, left);
            let mut row = room_row(scenario, p, &others, Some((leave, leave)));
            row.second_event = Some(since(p.started, joined));
            row
        })
        .collect()
}

fn sleep_until(t: Instant) {
    if let Some(d) = t.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
}

// ---- the table -------------------------------------------------------------------------

/// Prints one table: a row per scenario per listening player, each cell the median and the
/// worst of its runs (`runs[i]` holds run i's rows, in the same order every run).
pub fn print_table(runs: &[Vec<Row>]) {
    let Some(first) = runs.first() else {
        return;
    };
    let n = runs.len();
    println!("listener scenarios: {n} run(s) each; cells: median/worst over runs (one run: its figure)");
    println!(
        "{:<10} {:>6} {:>11} {:>11} {:>7} {:>7} {:>7} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
        "scenario",
        "hears",
        "|cents|",
        "any |c|",
        "glitch",
        "away",
        "silent",
        "resid dB",
        "ghost dB",
        "weakest dB",
        "lat before",
        "lat peak",
        "lat +1s",
        "back s",
        "event s"
    );
    for (i, row) in first.iter().enumerate() {
        let cells: Vec<&Row> = runs.iter().filter_map(|r| r.get(i)).collect();
        let col = |f: &dyn Fn(&Row) -> Option<f64>, worst_high: bool, digits: usize| {
            cell(cells.iter().map(|r| f(r)).collect(), worst_high, digits)
        };
        println!(
            "{:<10} {:>6} {:>11} {:>11} {:>7} {:>7} {:>7} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11}",
            row.scenario.name(),
            row.listener,
            col(&|r| Some(r.heard.clean_cents), true, 1),
            col(&|r| Some(r.heard.any_cents), true, 1),
            col(&|r| Some(r.heard.glitches_at.len() as f64), true, 0),
            col(&|r| Some(r.heard.glitches_away(&events(r)) as f64), true, 0),
            col(&|r| Some(r.heard.silent_windows as f64), true, 0),
            col(&|r| r.heard.worst_residual_db, true, 0),
            col(&|r| r.heard.ghost_db, true, 0),
            col(&|r| Some(r.heard.weakest_db()), false, 1),
            col(&|r| r.latency.before_ms, true, 1),
            col(&|r| r.latency.peak_ms, true, 1),
            col(&|r| r.latency.after_ms, true, 1),
            back_cell(&cells),
            event_cell(&cells),
        );
    }
    println!(
        "hears: the listener, by the tone it sends; |cents|: worst pitch error of a heard tone \
         outside glitch windows; any |c|: the same in any window not silent (a fast bend glitches \
         its window); glitch: glitch windows (200 ms, hop 100 ms) after the first \
         {SKIP_SECONDS} s, away: of those, more than {EVENT_BEFORE_S} s before or \
         {EVENT_AFTER_S} s after the event, silent: of those, silent; resid: worst residual of \
         a window that is not silent; ghost: own tone relative to the loudest heard; weakest: \
         weakest heard tone's median level relative to what was sent; lat: the jitter \
         buffer's added latency in ms (mean of each 0.1 s of the --stats-json series) before \
         the event, at its peak, 1 s after it (no event: median and peak of the run; a room \
         player writes no series: -); back s: from the event's end until the latency was back \
         within {BACK_WITHIN_MS} ms of before and stayed there {BACK_STAYS_S} s (\"never\": not \
         within {BACK_HORIZON_S} s); event s: when it began on the \
         listener's clock (+ a member joining again)."
    );
}

/// The events of a row, for [`Heard::glitches_away`].
pub fn events(r: &Row) -> Vec<(f64, f64)> {
    r.event
        .into_iter()
        .chain(r.second_event.map(|t| (t, t)))
        .collect()
}

fn cell(mut v: Vec<Option<f64>>, worst_high: bool, digits: usize) -> String {
    if v.iter().all(Option::is_none) {
        return "-".into();
    }
    let missing = v.iter().any(Option::is_none);
    v.retain(Option::is_some);
    let vals: Vec<f64> = v.into_iter().flatten().collect();
    let med = median(vals.clone()).unwrap_or(f64::NAN);
    let worst = if worst_high {
        vals.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    } else {
        vals.iter().copied().fold(f64::INFINITY, f64::min)
    };
    let mark = if missing { "?" } else { "" };
    if vals.len() == 1 {
        format!("{med:.digits$}{mark}")
    } else {
        format!("{med:.digits$}/{worst:.digits$}{mark}")
    }
}

/// Median and worst of [`Latency::back_s`], a run that never came back being the worst.
fn back_cell(cells: &[&Row]) -> String {
    if cells.iter().all(|r| r.event.is_none() || r.series.is_empty()) {
        return "-".into();
    }
    let never = cells.iter().filter(|r| r.latency.back_s.is_none()).count();
    let mut back: Vec<f64> = cells.iter().filter_map(|r| r.latency.back_s).collect();
    back.sort_by(f64::total_cmp);
    // Never counts as later than any time.
    let at = |i: usize| back.get(i).map_or("never".to_string(), |s| format!("{s:.1}"));
    let n = cells.len();
    if n == 1 {
        at(0)
    } else if never > 0 {
        format!("{}/never", at(n / 2))
    } else {
        format!("{}/{}", at(n / 2), at(n - 1))
    }
}

fn event_cell(cells: &[&Row]) -> String {
    let starts: Vec<f64> = cells.iter().filter_map(|r| r.event.map(|e| e.0)).collect();
    let Some(at) = median(starts) else {
        return "-".into();
    };
    match median(cells.iter().filter_map(|r| r.second_event).collect()) {
        Some(again) => format!("{at:.2}+{again:.2}"),
        None => format!("{at:.2}"),
    }
}

/// One row on one line, with the listener's summary: what a test prints beside its table.
pub fn describe(r: &Row) -> String {
    let h = &r.heard;
    format!(
        "{} heard by {}: {:.1} cents at {:.1} s outside glitch windows ({:.1} in any); {} glitch windows \
         ({} away from the event, {} silent) of {}; latency {:?}; event {:?}{}; {}",
        r.scenario.name(),
        r.listener,
        h.clean_cents,
        h.clean_cents_at_s,
        h.any_cents,
        h.glitches_at.len(),
        h.glitches_away(&events(r)),
        h.silent_windows,
        h.windows,
        r.latency,
        r.event,
        r.second_event.map(|t| format!(" and {t:.2}")).unwrap_or_default(),
        h.summary
    )
}
