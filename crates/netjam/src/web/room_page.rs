//! `netjam jam --room NAME --web`: the player's own page. Who is in the room (name, path,
//! mouth-to-ear latency, a quality label, loss and concealment, codec and rate), meters in
//! dBFS (your input, each member, the mix, the limiter's gain reduction), the mix:
//! each member's fader, pan, mute and solo, the master gain, your send's gain and mute and
//! your monitor;
//! and where each member's latency goes: mouth to ear stage by stage (network, packet,
//! resampling, their jitter buffer, devices) and the last five minutes of round trip,
//! jitter and buffer, a point a second, sent with one snapshot a second and with the first
//! after a page opens.
//!
//! Two halves, both off the audio thread:
//! * [`RoomPage::publish`], called by the main thread with every snapshot the audio
//!   thread already publishes, turns it and the roster into a [`RoomView`] and puts it on
//!   the pages' [`Board`] (with an event when someone joins or leaves);
//! * what a page sends is checked on the page's own thread ([`parse`]: JSON, one setting,
//!   in range, a member's name that is in the room) and queued (bounded); the room
//!   client's control thread polls [`PageCommands`] like it polls OSC, turns the name into
//!   the member's id with the roster it owns and hands the player's one
//!   [`Command`] to the audio thread through the one ring it already feeds. So OSC and
//!   the page move the same faders, the mix is remembered by name, and every page sees
//!   every move in the next snapshot (it carries each member's gain, pan and mute as the
//!   audio thread reports them).
//!
//! Messages a page sends (one setting each; members by name, whatever the case):
//! `{"member":"ana","gain_db":-6}` (−60..=+12), `{"member":"ana","pan":-0.5}` (−1..=1),
//! `{"member":"ana","mute":true}`, `{"member":"ana","solo":true}`, `{"master_gain_db":-3}` (−60..=+12),
//! `{"monitor_gain_db":-10}`, `{"monitor_mute":false}`, `{"send_gain_db":-3}` (−60..=+12),
//! `{"send_mute":true}`,
//! `{"record":false}` (pauses a recording started with `--record DIR`; `true` resumes it:
//! what is recorded meanwhile is silence in every file, so the tracks stay aligned),
//! `{"password":"NEW"}` (a private room's password changes, or this player takes the one
//! another member set, as OSC's `/password` does: it goes to the room thread, never to
//! the audio thread, and is never shown again).
//!
//! The page also shows the rooms server the seat is on and its key's fingerprint as the
//! control channel checked it, and in a private room the media epoch and what happened to
//! the password.
//!
//! Never here: a handle on the audio thread, its ring or anything it locks; a command sent
//! anywhere but through the control thread's [`crate::room_client::CommandSource`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use netjam_engine::mixer::amplitude_db;
use netjam_engine::nat::direct::PathState;
use netjam_engine::player::{Command, MediaReport, Roster};
use netjam_engine::room::msg::fold_name;
use serde::{Deserialize, Serialize};

use super::{Board, Inbox, WebError, WebListener, WebServer, WebStats};
use crate::room_client::CommandSource;
use crate::session::Snapshot;

/// Where `--web` without an address serves the page: this machine only, on the port after
/// the server's page.
pub const DEFAULT_ADDR: &str = "127.0.0.1:4466";
/// The page: HTML, its style and its script in one document, embedded in the binary.
pub const PAGE: &str = include_str!("room_page.html");
/// The faders' range, dB (members, master and monitor).
pub const FADER_MIN_DB: f32 = -60.0;
pub const FADER_MAX_DB: f32 = 12.0;
/// The longest member name a page may send (the room's names are shorter).
const MAX_NAME: usize = 64;
/// Commands from pages that may wait for the control thread (it polls every few ms).
const QUEUE: usize = 64;
/// The round trips the quality label looks at: the last this many seconds.
const QUALITY_WINDOW_S: f64 = 10.0;
/// The trend keeps a point this often, s, and this many (five minutes).
const TREND_STEP_S: f64 = 1.0;
const TREND_POINTS: usize = 300;

/// What every member's path has besides the network and their jitter buffer, as this
/// player knows its own setup (see
/// [`netjam_engine::player::MemberReport::mouth_to_ear_ms`]), ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct FixedStages {
    /// The packet of audio a sender waits for before it sends.
    pub packet_ms: f64,
    /// The devices' periods at both ends (theirs taken to be like yours).
    pub device_ms: f64,
    /// Resampling at the edges: a stream at another rate than your device.
    pub resampler_ms: f64,
}

impl FixedStages {
    pub fn total_ms(&self) -> f64 {
        self.packet_ms + self.device_ms + self.resampler_ms
    }
}

/// One member's mouth to ear, stage by stage, ms; the stages add up to
/// [`MemberView::mouth_to_ear_ms`].
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Budget {
    /// Half the round trip to them: the network one way and the server's forwarding.
    pub network_ms: f64,
    pub packet_ms: f64,
    pub resampler_ms: f64,
    /// What their jitter buffer adds.
    pub buffer_ms: f64,
    pub device_ms: f64,
}

/// One point of a member's trend: seconds into the session, round trip (when known),
/// jitter (RFC 3550) and what their buffer adds, ms. Sent as an array of four.
pub type TrendPoint = (f64, Option<f64>, f64, f64);

/// A member's last `TREND_POINTS` points, a second apart.
#[derive(Debug, Clone, Serialize)]
pub struct TrendView {
    pub name: String,
    pub member_id: u32,
    pub points: Vec<TrendPoint>,
}

/// One setting for one member.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemberSetting {
    Gain(f32),
    Pan(f32),
    Mute(bool),
    Solo(bool),
}

/// What a page asked for, checked, with members by name.
#[derive(Debug, Clone, PartialEq)]
pub enum PageCommand {
    Member {
        name: String,
        set: MemberSetting,
    },
    MasterGain(f32),
    MonitorGain(f32),
    MonitorMute(bool),
    SendGain(f32),
    SendMute(bool),
    Record(bool),
    /// A private room's new password (or the one another member set).
    Password(String),
}

/// The longest password a page may send, bytes.
const MAX_PASSWORD: usize = 256;

/// A page's message as JSON (every field optional; exactly one setting is allowed).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    member: Option<String>,
    gain_db: Option<f64>,
    pan: Option<f64>,
    mute: Option<bool>,
    solo: Option<bool>,
    master_gain_db: Option<f64>,
    monitor_gain_db: Option<f64>,
    monitor_mute: Option<bool>,
    send_gain_db: Option<f64>,
    send_mute: Option<bool>,
    record: Option<bool>,
    password: Option<String>,
}

fn in_range(what: &str, x: f64, lo: f32, hi: f32) -> Result<f32, String> {
    if x.is_finite() && x >= f64::from(lo) && x <= f64::from(hi) {
        Ok(x as f32)
    } else {
        Err(format!("{what} {x} is out of range ({lo}..={hi})"))
    }
}

/// Checks a page's message: JSON with one setting, in range. Names are not checked here
/// (see [`RoomPage`]'s inbox).
pub fn parse(text: &str) -> Result<PageCommand, String> {
    if text.len() > super::MAX_INCOMING {
        return Err("message too long".into());
    }
    let w: Wire = serde_json::from_str(text).map_err(|e| format!("not a command: {e}"))?;
    let member_settings = usize::from(w.gain_db.is_some())
        + usize::from(w.pan.is_some())
        + usize::from(w.mute.is_some())
        + usize::from(w.solo.is_some());
    let own_settings = usize::from(w.master_gain_db.is_some())
        + usize::from(w.monitor_gain_db.is_some())
        + usize::from(w.monitor_mute.is_some())
        + usize::from(w.send_gain_db.is_some())
        + usize::from(w.send_mute.is_some())
        + usize::from(w.record.is_some())
        + usize::from(w.password.is_some());
    match w.member {
        Some(name) => {
            if own_settings > 0 || member_settings != 1 {
                return Err("a member's command sets one of gain_db, pan, mute or solo".into());
            }
            if name.is_empty() || name.len() > MAX_NAME {
                return Err("no such member".into());
            }
            let set = if let Some(db) = w.gain_db {
                MemberSetting::Gain(in_range("gain_db", db, FADER_MIN_DB, FADER_MAX_DB)?)
            } else if let Some(pan) = w.pan {
                MemberSetting::Pan(in_range("pan", pan, -1.0, 1.0)?)
            } else if let Some(solo) = w.solo {
                MemberSetting::Solo(solo)
            } else {
                MemberSetting::Mute(w.mute.unwrap_or_default())
            };
            Ok(PageCommand::Member { name, set })
        }
        None => {
            if member_settings > 0 || own_settings != 1 {
                return Err(
                    "a command sets one thing: a member's (with \"member\"), master_gain_db, monitor_gain_db, monitor_mute, send_gain_db, send_mute, record or password"
                        .into(),
                );
            }
            if let Some(db) = w.master_gain_db {
                Ok(PageCommand::MasterGain(in_range(
                    "master_gain_db",
                    db,
                    FADER_MIN_DB,
                    FADER_MAX_DB,
                )?))
            } else if let Some(db) = w.monitor_gain_db {
                Ok(PageCommand::MonitorGain(in_range(
                    "monitor_gain_db",
                    db,
                    FADER_MIN_DB,
                    FADER_MAX_DB,
                )?))
            } else if let Some(mute) = w.monitor_mute {
                Ok(PageCommand::MonitorMute(mute))
            } else if let Some(db) = w.send_gain_db {
                Ok(PageCommand::SendGain(in_range(
                    "send_gain_db",
                    db,
                    FADER_MIN_DB,
                    FADER_MAX_DB,
                )?))
            } else if let Some(on) = w.record {
                Ok(PageCommand::Record(on))
            } else if let Some(p) = w.password {
                if p.is_empty() || p.len() > MAX_PASSWORD || p.chars().any(char::is_control) {
                    return Err(format!(
                        "a password is 1 to {MAX_PASSWORD} bytes of printable characters"
                    ));
                }
                Ok(PageCommand::Password(p))
            } else {
                Ok(PageCommand::SendMute(w.send_mute.unwrap_or_default()))
            }
        }
    }
}

/// A link's quality on JackTrip's scale (its Virtual Studio's labels). The figures used
/// here: the round trip to the member as RTCP measures it on the path media takes,
/// averaged and at its worst over the last `QUALITY_WINDOW_S` seconds, and what the
/// member's jitter buffer adds now (its `added_latency_ms`).
/// Excellent: round trip < 10 ms on average and < 15 ms at worst, buffer < 6 ms; Good:
/// 20 / 30 / 9 ms; Fair: 30 / 40 / 12 ms; anything else Poor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Quality {
    Excellent,
    Good,
    Fair,
    Poor,
}

pub fn quality(rtt_avg_ms: f64, rtt_max_ms: f64, buffer_ms: f64) -> Quality {
    let within = |avg: f64, max: f64, buf: f64| rtt_avg_ms < avg && rtt_max_ms < max && buffer_ms < buf;
    if within(10.0, 15.0, 6.0) {
        Quality::Excellent
    } else if within(20.0, 30.0, 9.0) {
        Quality::Good
    } else if within(30.0, 40.0, 12.0) {
        Quality::Fair
    } else {
        Quality::Poor
    }
}

/// One message of the WebSocket: what the page shows, whole.
#[derive(Debug, Clone, Serialize)]
pub struct RoomView {
    /// Always `"snapshot"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub room: String,
    /// Your name in the room.
    pub you: String,
    /// Seconds of audio played.
    pub t_s: f64,
    /// The rooms server stopped answering (members on a direct path are still heard).
    pub server_lost: bool,
    /// The others, by name.
    pub members: Vec<MemberView>,
    /// Your input (before the monitor's gain).
    pub input: Meter,
    /// What you hear, after the limiter: its peak.
    pub mix_peak_dbfs: f32,
    /// The limiter's most gain reduction since the snapshot before, dB (0: untouched).
    pub limiter_reduction_db: f32,
    pub master_gain_db: f32,
    pub monitor_gain_db: f32,
    pub monitor_mute: bool,
    /// The gain on what you send, dB (−120: silence), and whether you send silence, as
    /// the audio thread reports them (set from a page or OSC).
    pub send_gain_db: f32,
    pub send_mute: bool,
    /// Pages open now (this one included).
    pub pages_open: u64,
    /// Commands from pages taken and refused since the start.
    pub commands: u64,
    pub commands_refused: u64,
    /// The recording (`None`: nothing records).
    pub recording: Option<RecordingView>,
    /// The shared beat (`None`: no ensemble, or no tempo yet).
    pub beat: Option<BeatView>,
    /// The rooms server the seat is on, and its key's fingerprint (the control channel's).
    pub server: Option<String>,
    pub server_key: Option<String>,
    /// A private room: the media epoch sealed in now (the password's generation), and what
    /// happened to the password, the latest last (at most three).
    pub private: Option<PrivateView>,
    /// Each member's trend, in one snapshot a second and the first after a page opens
    /// (absent from the others).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trends: Option<Vec<TrendView>>,
}

/// A private room's keys, as the page shows them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PrivateView {
    pub epoch: u32,
    pub notes: Vec<String>,
}

/// The ensemble's shared beat (`--ensemble`), as it stood at the snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BeatView {
    pub bpm: f64,
    /// Beats since the tempo's origin (fractional).
    pub beat: f64,
    /// The bar, from 1, and the beat in it, from 1 (the click's bars).
    pub bar: u64,
    pub beat_in_bar: u32,
    pub beats_per_bar: u32,
}

impl BeatView {
    pub fn new(bpm: f64, beat: f64, beats_per_bar: u32) -> Self {
        let whole = beat.max(0.0).floor() as u64;
        let per = u64::from(beats_per_bar.max(1));
        Self {
            bpm,
            beat,
            bar: whole / per + 1,
            beat_in_bar: (whole % per) as u32 + 1,
            beats_per_bar: per as u32,
        }
    }
}

/// A recording started with `--record DIR`.
#[derive(Debug, Clone, Serialize)]
pub struct RecordingView {
    /// Running (else paused: silence goes into the files meanwhile).
    pub on: bool,
    /// Where the files are.
    pub dir: String,
    /// Seconds written so far.
    pub seconds: f64,
}

/// A level since the snapshot before, dBFS (−120: silence).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Meter {
    pub peak_dbfs: f32,
    pub rms_dbfs: f32,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemberView {
    pub name: String,
    pub member_id: u32,
    /// `direct`, `via server`, or `trying direct` (via the server meanwhile).
    pub path: &'static str,
    /// From their playing to your hearing, ms (once a round trip is known).
    pub mouth_to_ear_ms: Option<f64>,
    /// Round trip now, and its average and worst over the quality window, ms.
    pub rtt_ms: Option<f64>,
    pub rtt_avg_ms: Option<f64>,
    pub rtt_max_ms: Option<f64>,
    /// Mouth to ear stage by stage (once a round trip is known).
    pub budget: Option<Budget>,
    /// What their jitter buffer adds, ms.
    pub buffer_ms: f64,
    /// Their packets' interarrival jitter (RFC 3550), ms.
    pub jitter_ms: f64,
    pub quality: Option<Quality>,
    pub received: u64,
    /// Packets lost (RTP's count, which duplicates can make negative, floored at 0).
    pub lost: u64,
    /// Stretches concealed (lost or late audio filled in).
    pub concealed: u64,
    pub codec: Option<String>,
    pub rate: Option<u32>,
    pub channels: Option<u16>,
    /// Their level before their fader.
    pub level: Meter,
    pub gain_db: f32,
    pub pan: f32,
    pub mute: bool,
    /// Soloed: while any member is, only the soloed ones are heard.
    pub solo: bool,
}

/// One event message.
#[derive(Debug, Serialize)]
struct Event<'a> {
    /// Always `"event"`.
    #[serde(rename = "type")]
    kind: &'static str,
    t_s: f64,
    text: &'a str,
}

/// Round trips seen lately, per member: (seconds into the session, ms).
type RttHistory = BTreeMap<u32, VecDeque<(f64, f64)>>;

/// What the page shows of snapshot `s` with `roster`; `fixed` is what every member's
/// path has besides the network and the buffer.
pub fn view(
    s: &Snapshot<MediaReport>,
    roster: &Roster,
    you: &str,
    fixed: &FixedStages,
    rtts: &mut RttHistory,
) -> RoomView {
    let stats = &s.stats;
    let mut members: Vec<MemberView> = roster
        .members
        .values()
        .map(|r| {
            let heard = stats.active_members().find(|m| m.member == r.member_id);
            let path = match roster.paths.get(&r.member_id).map(|p| p.state) {
                Some(PathState::Direct) => "direct",
                Some(PathState::Punching) => "trying direct",
                _ => "via server",
            };
            let history = rtts.entry(r.member_id).or_default();
            if let Some(rtt) = heard.and_then(|m| m.rtt_ms) {
                history.push_back((s.t_s, rtt));
            }
            while history
                .front()
                .is_some_and(|(t, _)| *t < s.t_s - QUALITY_WINDOW_S)
            {
                history.pop_front();
            }
            let (avg, max) = if history.is_empty() {
                (None, None)
            } else {
                let sum: f64 = history.iter().map(|(_, r)| r).sum();
                let max = history.iter().map(|(_, r)| *r).fold(0.0, f64::max);
                (Some(sum / history.len() as f64), Some(max))
            };
            let buffer_ms = heard.map_or(0.0, |m| m.heard.jitter_buffer.added_latency_ms);
            let format = heard.and_then(|m| m.heard.format);
            MemberView {
                name: r.name.clone(),
                member_id: r.member_id,
                path,
                mouth_to_ear_ms: heard.and_then(|m| m.mouth_to_ear_ms(fixed.total_ms())),
                rtt_ms: heard.and_then(|m| m.rtt_ms),
                rtt_avg_ms: avg,
                rtt_max_ms: max,
                budget: heard.and_then(|m| m.rtt_ms).map(|rtt| Budget {
                    network_ms: rtt / 2.0,
                    packet_ms: fixed.packet_ms,
                    resampler_ms: fixed.resampler_ms,
                    buffer_ms,
                    device_ms: fixed.device_ms,
                }),
                buffer_ms,
                jitter_ms: heard.map_or(0.0, |m| m.heard.jitter_ms),
                quality: avg.zip(max).map(|(a, m)| quality(a, m, buffer_ms)),
                received: heard.map_or(0, |m| m.heard.received),
                lost: heard.map_or(0, |m| m.heard.lost.max(0) as u64),
                concealed: heard.map_or(0, |m| m.heard.jitter_buffer.concealment_events),
                codec: format.map(|f| f.codec.to_string()),
                rate: format.map(|f| f.rate),
                channels: format.map(|f| f.channels),
                level: heard.map_or(
                    Meter {
                        peak_dbfs: -120.0,
                        rms_dbfs: -120.0,
                    },
                    |m| Meter {
                        peak_dbfs: m.level.peak_dbfs(),
                        rms_dbfs: m.level.rms_dbfs(),
                    },
                ),
                gain_db: heard.map_or(0.0, |m| amplitude_db(m.mix.gain)),
                pan: heard.map_or(0.0, |m| m.mix.pan),
                mute: heard.is_some_and(|m| m.mix.mute),
                solo: heard.is_some_and(|m| m.mix.solo),
            }
        })
        .collect();
    rtts.retain(|id, _| roster.members.contains_key(id));
    members.sort_by(|a, b| {
        fold_name(&a.name)
            .cmp(&fold_name(&b.name))
            .then(a.member_id.cmp(&b.member_id))
    });
    RoomView {
        kind: "snapshot",
        room: roster.room.clone(),
        you: you.to_owned(),
        t_s: s.t_s,
        server_lost: roster.lost,
        members,
        input: Meter {
            peak_dbfs: stats.monitor.peak_dbfs(),
            rms_dbfs: stats.monitor.rms_dbfs(),
        },
        mix_peak_dbfs: s.peak_dbfs,
        limiter_reduction_db: stats.limiter.max_reduction_db,
        master_gain_db: amplitude_db(stats.master_gain),
        monitor_gain_db: amplitude_db(stats.monitor_mix.gain),
        monitor_mute: stats.monitor_mix.mute,
        send_gain_db: stats.send_gain_db.max(amplitude_db(0.0)),
        send_mute: stats.send_mute,
        pages_open: 0,
        commands: 0,
        commands_refused: 0,
        recording: None,
        beat: None,
        server: roster.server.map(|a| a.to_string()),
        server_key: roster.server_key.clone(),
        private: stats.sframe.as_ref().map(|f| PrivateView {
            epoch: f.epoch,
            notes: roster
                .password_notes
                .iter()
                .rev()
                .take(3)
                .rev()
                .cloned()
                .collect(),
        }),
        trends: None,
    }
}

/// Members' trends, a point a second (see [`TrendPoint`]).
#[derive(Debug, Default)]
pub struct Trends {
    members: BTreeMap<u32, VecDeque<TrendPoint>>,
    /// When the next point is due, s into the session.
    next_s: f64,
}

impl Trends {
    /// Keeps a point of every member in `v` when one is due and forgets members no longer
    /// in it; whether a point was kept.
    pub fn sample(&mut self, v: &RoomView) -> bool {
        if v.t_s < self.next_s {
            return false;
        }
        self.next_s = (v.t_s / TREND_STEP_S).floor() * TREND_STEP_S + TREND_STEP_S;
        self.members
            .retain(|id, _| v.members.iter().any(|m| m.member_id == *id));
        for m in &v.members {
            let points = self.members.entry(m.member_id).or_default();
            points.push_back((v.t_s, m.rtt_ms, m.jitter_ms, m.buffer_ms));
            while points.len() > TREND_POINTS {
                points.pop_front();
            }
        }
        true
    }

    /// The trend of every member in `v`.
    pub fn of(&self, v: &RoomView) -> Vec<TrendView> {
        v.members
            .iter()
            .map(|m| TrendView {
                name: m.name.clone(),
                member_id: m.member_id,
                points: self
                    .members
                    .get(&m.member_id)
                    .map(|p| p.iter().copied().collect())
                    .unwrap_or_default(),
            })
            .collect()
    }
}

/// What the page thread and the feed share: the names in the room (folded), to refuse a
/// command for nobody at once.
#[derive(Debug, Default)]
struct Names(Mutex<BTreeSet<String>>);

impl Names {
    fn has(&self, name: &str) -> bool {
        self.0
            .lock()
            .map(|n| n.contains(&fold_name(name)))
            .unwrap_or(false)
    }

    fn set(&self, names: BTreeSet<String>) {
        if let Ok(mut n) = self.0.lock() {
            *n = names;
        }
    }
}

/// The page threads' half: checks and queues.
struct PageInbox {
    tx: SyncSender<PageCommand>,
    names: Arc<Names>,
    /// Whether the player records (`--record`): a page may pause and resume it.
    records: bool,
    /// Where a private room's new passwords go (the room thread's); `None`: no password.
    passwords: Option<Mutex<mpsc::Sender<String>>>,
}

impl Inbox for PageInbox {
    fn take(&self, text: &str) -> Result<(), String> {
        let c = parse(text)?;
        if let PageCommand::Member { name, .. } = &c {
            if !self.names.has(name) {
                return Err(format!("nobody named {name:?} is in the room"));
            }
        }
        if matches!(c, PageCommand::Record(_)) && !self.records {
            return Err("nothing records here: start the player with --record DIR".to_owned());
        }
        if let PageCommand::Password(p) = c {
            let Some(to) = &self.passwords else {
                return Err(
                    "this room has no password: a room is private from its start (--password)".to_owned(),
                );
            };
            let sent = to
                .lock()
                .map_err(|_| "the player is stopping".to_owned())?
                .send(p);
            return sent.map_err(|_| "the player is stopping".to_owned());
        }
        self.tx.try_send(c).map_err(|e| match e {
            TrySendError::Full(_) => "too many commands at once: try again".to_owned(),
            TrySendError::Disconnected(_) => "the player is stopping".to_owned(),
        })
    }
}

/// The control thread's half: the page's commands, as the player's one [`Command`], with
/// the member found by name in the roster the control thread owns.
#[derive(Debug)]
pub struct PageCommands {
    rx: Receiver<PageCommand>,
    /// Commands for a member who left between the page's check and now.
    gone: Arc<AtomicU64>,
}

impl CommandSource for PageCommands {
    fn next(&mut self, roster: &Roster) -> Option<Command> {
        loop {
            let c = self.rx.try_recv().ok()?;
            let command = match c {
                PageCommand::Member { name, set } => {
                    let Some(id) = roster.member_named(&name) else {
                        self.gone.fetch_add(1, Ordering::Relaxed);
                        continue;
                    };
                    let member = id;
                    match set {
                        MemberSetting::Gain(db) => Command::Gain { member, db },
                        MemberSetting::Pan(pan) => Command::Pan { member, pan },
                        MemberSetting::Mute(mute) => Command::Mute { member, mute },
                        MemberSetting::Solo(solo) => Command::Solo { member, solo },
                    }
                }
                PageCommand::MasterGain(db) => Command::MasterGain { db },
                PageCommand::MonitorGain(db) => Command::MonitorGain { db },
                PageCommand::MonitorMute(mute) => Command::MonitorMute { mute },
                PageCommand::SendGain(db) => Command::SendGain { db },
                PageCommand::SendMute(mute) => Command::SendMute { mute },
                PageCommand::Record(on) => Command::Record { on },
                // Taken by the inbox, never queued here.
                PageCommand::Password(_) => continue,
            };
            return Some(command);
        }
    }
}

/// The player's page, running: its server, and what the feed keeps between snapshots.
#[derive(Debug)]
pub struct RoomPage {
    web: Option<WebServer>,
    board: Arc<Board>,
    names: Arc<Names>,
    gone: Arc<AtomicU64>,
    rtts: RttHistory,
    trends: Trends,
    /// Pages opened by the last snapshot that carried the trends.
    sockets_seen: u64,
    /// Where a recording goes (`--record`), and how much of it is written.
    record_dir: Option<String>,
    recorded_s: f64,
    beat: Option<BeatView>,
    /// Who was in the room at the snapshot before, for the joined/left events.
    present: Option<BTreeSet<String>>,
}

impl RoomPage {
    /// Serves the page on `listener`; `record_dir` is where the player records (`--record`),
    /// if it does; `passwords` is where a private room's new passwords go (the room
    /// thread's, as OSC's `/password`). The commands pages send come out of the returned
    /// [`PageCommands`], for the room client's control thread.
    pub fn start(
        listener: WebListener,
        record_dir: Option<String>,
        passwords: Option<mpsc::Sender<String>>,
    ) -> Result<(Self, PageCommands), WebError> {
        let board = Arc::new(Board::default());
        let names = Arc::new(Names::default());
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let inbox: Arc<dyn Inbox> = Arc::new(PageInbox {
            tx,
            names: names.clone(),
            records: record_dir.is_some(),
            passwords: passwords.map(Mutex::new),
        });
        let web = WebServer::start_with_inbox(listener, PAGE, board.clone(), Some(inbox))?;
        let gone = Arc::new(AtomicU64::new(0));
        let commands = PageCommands {
            rx,
            gone: gone.clone(),
        };
        Ok((
            Self {
                web: Some(web),
                board,
                names,
                gone,
                rtts: RttHistory::default(),
                trends: Trends::default(),
                sockets_seen: 0,
                record_dir,
                recorded_s: 0.0,
                beat: None,
                present: None,
            },
            commands,
        ))
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.web.as_ref().map(WebServer::local_addr)
    }

    pub fn stats(&self) -> WebStats {
        self.web.as_ref().map(WebServer::stats).unwrap_or_default()
    }

    /// How many seconds of the recording are written (shown with the next snapshot).
    pub fn set_recorded_s(&mut self, seconds: f64) {
        self.recorded_s = seconds;
    }

    /// The shared beat, shown with the next snapshot.
    pub fn set_beat(&mut self, beat: Option<BeatView>) {
        self.beat = beat;
    }

    /// Commands for members who had left by the time they were applied.
    pub fn gone(&self) -> u64 {
        self.gone.load(Ordering::Relaxed)
    }

    /// Shows snapshot `s` on every open page (see [`view`]).
    pub fn publish(&mut self, s: &Snapshot<MediaReport>, roster: &Roster, you: &str, fixed: &FixedStages) {
        let mut v = view(s, roster, you, fixed, &mut self.rtts);
        let stats = self.stats();
        v.beat = self.beat;
        v.recording = self.record_dir.as_ref().map(|dir| RecordingView {
            on: s.stats.recording != Some(false),
            dir: dir.clone(),
            seconds: self.recorded_s,
        });
        // The trends go out with a new point, and at once to a page that just opened.
        if self.trends.sample(&v) || stats.sockets_opened != self.sockets_seen {
            v.trends = Some(self.trends.of(&v));
            self.sockets_seen = stats.sockets_opened;
        }
        v.pages_open = stats.pages_open;
        v.commands = stats.commands;
        v.commands_refused = stats.commands_refused;
        let now: BTreeSet<String> = v.members.iter().map(|m| m.name.clone()).collect();
        self.names.set(now.iter().map(|n| fold_name(n)).collect());
        let mut events = Vec::new();
        if let Some(before) = &self.present {
            let left = before.difference(&now).map(|n| format!("{n} left"));
            let joined = now.difference(before).map(|n| format!("{n} joined"));
            for text in left.chain(joined) {
                if let Ok(e) = serde_json::to_string(&Event {
                    kind: "event",
                    t_s: s.t_s,
                    text: &text,
                }) {
                    events.push(e);
                }
            }
        }
        self.present = Some(now);
        if let Ok(json) = serde_json::to_string(&v) {
            self.board.publish(json, events);
        }
    }

    /// Closes every page and stops serving.
    pub fn stop(mut self) -> WebStats {
        self.web.take().map(WebServer::stop).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_sets_one_thing_in_range() {
        assert_eq!(
            parse(r#"{"member":"ana","gain_db":-6}"#),
            Ok(PageCommand::Member {
                name: "ana".into(),
                set: MemberSetting::Gain(-6.0)
            })
        );
        assert_eq!(
            parse(r#"{"member":"Bo","mute":true}"#),
            Ok(PageCommand::Member {
                name: "Bo".into(),
                set: MemberSetting::Mute(true)
            })
        );
        assert_eq!(
            parse(r#"{"member":"Bo","solo":true}"#),
            Ok(PageCommand::Member {
                name: "Bo".into(),
                set: MemberSetting::Solo(true)
            })
        );
        assert_eq!(
            parse(r#"{"member":"bo","pan":0.25}"#),
            Ok(PageCommand::Member {
                name: "bo".into(),
                set: MemberSetting::Pan(0.25)
            })
        );
        assert_eq!(
            parse(r#"{"master_gain_db":-3}"#),
            Ok(PageCommand::MasterGain(-3.0))
        );
        assert_eq!(parse(r#"{"send_mute":true}"#), Ok(PageCommand::SendMute(true)));
        assert_eq!(parse(r#"{"send_gain_db":-4.5}"#), Ok(PageCommand::SendGain(-4.5)));
        assert!(parse(r#"{"send_gain_db":13}"#).is_err());
        assert!(parse(r#"{"send_gain_db":-3,"send_mute":true}"#).is_err());
        assert_eq!(parse(r#"{"record":false}"#), Ok(PageCommand::Record(false)));
        assert_eq!(
            parse(r#"{"password":"s3cret words"}"#),
            Ok(PageCommand::Password("s3cret words".into()))
        );
        assert!(parse(r#"{"password":""}"#).is_err());
        assert!(parse(r#"{"password":"a\nb"}"#).is_err());
        assert!(parse(&format!(r#"{{"password":"{}"}}"#, "x".repeat(257))).is_err());
        assert!(parse(r#"{"password":"x","record":true}"#).is_err());
        assert_eq!(
            parse(r#"{"monitor_mute":false}"#),
            Ok(PageCommand::MonitorMute(false))
        );
        assert_eq!(
            parse(r#"{"monitor_gain_db":12}"#),
            Ok(PageCommand::MonitorGain(12.0))
        );
        for bad in [
            "",
            "nonsense",
            "[]",
            "{}",
            r#"{"member":"ana"}"#,
            r#"{"member":"ana","gain_db":99}"#,
            r#"{"member":"ana","gain_db":-61}"#,
            r#"{"member":"ana","gain_db":"loud"}"#,
            r#"{"member":"ana","pan":1.5}"#,
            r#"{"member":"ana","gain_db":-6,"mute":true}"#,
            r#"{"member":"ana","master_gain_db":0}"#,
            r#"{"member":"","mute":true}"#,
            r#"{"gain_db":-6}"#,
            r#"{"master_gain_db":13}"#,
            r#"{"master_gain_db":0,"send_mute":true}"#,
            r#"{"master_gain_db":1e400}"#,
            r#"{"solo":true}"#,
            r#"{"record":true,"send_mute":true}"#,
            r#"{"member":"ana","record":true}"#,
            r#"{"record":1}"#,
            r#"{"member":"ana","gain_db":-6,"extra":1}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad} was taken");
        }
        let long = format!(r#"{{"member":"{}","mute":true}}"#, "a".repeat(100));
        assert!(parse(&long).is_err());
        let huge = "x".repeat(super::super::MAX_INCOMING + 1);
        assert!(parse(&huge).is_err());
    }

    #[test]
    fn the_beat_counts_bars_from_one() {
        let b = BeatView::new(120.0, 0.2, 4);
        assert_eq!((b.bar, b.beat_in_bar), (1, 1));
        let b = BeatView::new(120.0, 3.99, 4);
        assert_eq!((b.bar, b.beat_in_bar), (1, 4));
        let b = BeatView::new(120.0, 9.5, 4);
        assert_eq!((b.bar, b.beat_in_bar), (3, 2));
        let b = BeatView::new(90.0, 7.0, 3);
        assert_eq!((b.bar, b.beat_in_bar), (3, 2));
        let b = BeatView::new(90.0, -0.5, 4);
        assert_eq!(
            (b.bar, b.beat_in_bar),
            (1, 1),
            "before the origin: the first beat"
        );
    }

    #[test]
    fn quality_follows_jacktrips_scale() {
        assert_eq!(quality(5.0, 12.0, 3.0), Quality::Excellent);
        assert_eq!(
            quality(5.0, 16.0, 3.0),
            Quality::Good,
            "a worst round trip of 16 ms"
        );
        assert_eq!(quality(5.0, 12.0, 7.0), Quality::Good, "a 7 ms buffer");
        assert_eq!(quality(25.0, 35.0, 10.0), Quality::Fair);
        assert_eq!(quality(31.0, 35.0, 10.0), Quality::Poor);
        assert_eq!(quality(5.0, 5.0, 12.0), Quality::Poor);
    }

    /// A setup whose stages add up to 4 ms.
    const FIXED: FixedStages = FixedStages {
        packet_ms: 1.5,
        device_ms: 2.0,
        resampler_ms: 0.5,
    };

    fn snapshot(t_s: f64, heard: &[(u32, f64, f64)]) -> Snapshot<MediaReport> {
        let mut stats = MediaReport::default();
        for (slot, &(member, rtt, buffer)) in heard.iter().enumerate() {
            let m = &mut stats.members[slot];
            m.active = true;
            m.member = member;
            m.ssrc = member * 10;
            m.rtt_ms = Some(rtt);
            m.mix.gain = 0.5;
            m.heard.jitter_buffer.added_latency_ms = buffer;
        }
        Snapshot {
            t_s,
            peak_dbfs: -6.0,
            stats,
        }
    }

    fn roster_of(names: &[(u32, &str)]) -> Roster {
        let mut roster = Roster {
            room: "band".into(),
            ..Roster::default()
        };
        for &(id, name) in names {
            roster.members.insert(
                id,
                netjam_engine::player::RosterMember {
                    member_id: id,
                    name: name.into(),
                    ssrc: id * 10,
                },
            );
        }
        roster
    }

    #[test]
    fn the_view_lists_the_roster_by_name_with_its_quality_over_ten_seconds() {
        let roster = roster_of(&[(2, "cy"), (1, "Bo"), (3, "ana")]);
        let mut rtts = RttHistory::default();
        // A spike of 50 ms at the start, then 2 ms: Poor until the spike is 10 s old.
        let v = view(
            &snapshot(1.0, &[(1, 50.0, 2.0), (2, 2.0, 2.0)]),
            &roster,
            "me",
            &FIXED,
            &mut rtts,
        );
        let names: Vec<_> = v.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["ana", "Bo", "cy"], "by name, whatever the case");
        let bo = &v.members[1];
        assert_eq!(bo.quality, Some(Quality::Poor));
        assert!((bo.gain_db + 6.02).abs() < 0.01, "{}", bo.gain_db);
        assert_eq!(bo.path, "via server");
        assert_eq!(bo.mouth_to_ear_ms, Some(25.0 + 4.0 + 2.0));
        let b = bo.budget.expect("a budget once the round trip is known");
        assert_eq!(
            [
                b.network_ms,
                b.packet_ms,
                b.resampler_ms,
                b.buffer_ms,
                b.device_ms
            ],
            [25.0, 1.5, 0.5, 2.0, 2.0],
            "stage by stage"
        );
        let sum = b.network_ms + b.packet_ms + b.resampler_ms + b.buffer_ms + b.device_ms;
        assert_eq!(Some(sum), bo.mouth_to_ear_ms, "the stages add up to mouth to ear");
        assert_eq!(v.members[0].budget, None, "ana has no round trip yet");
        assert_eq!(v.members[2].quality, Some(Quality::Excellent));
        assert_eq!(v.members[0].quality, None, "ana is not heard yet");
        for t in 2..=11 {
            view(
                &snapshot(f64::from(t), &[(1, 2.0, 2.0)]),
                &roster,
                "me",
                &FIXED,
                &mut rtts,
            );
        }
        let v = view(
            &snapshot(11.5, &[(1, 2.0, 2.0)]),
            &roster,
            "me",
            &FIXED,
            &mut rtts,
        );
        assert_eq!(v.members[1].quality, Some(Quality::Excellent));
        assert_eq!(v.members[1].rtt_max_ms, Some(2.0));
        // Who leaves is gone from the view and from what is kept.
        let v = view(
            &snapshot(12.0, &[]),
            &roster_of(&[(3, "ana")]),
            "me",
            &FIXED,
            &mut rtts,
        );
        assert_eq!(v.members.len(), 1);
        assert!(!rtts.contains_key(&1));
        let json = serde_json::to_value(&v).expect("json");
        assert_eq!(json["type"], "snapshot");
        assert_eq!(json["room"], "band");
        assert!(json.get("trends").is_none(), "no trends outside their second");
    }

    #[test]
    fn trends_keep_a_point_a_second_for_five_minutes_and_forget_who_left() {
        let roster = roster_of(&[(1, "bo"), (2, "cy")]);
        let mut rtts = RttHistory::default();
        let mut trends = Trends::default();
        let mut sent = 0;
        let mut last = None;
        // 400 s of snapshots, 20 a second.
        for k in 0..8000 {
            let t = f64::from(k) * 0.05;
            let v = view(
                &snapshot(t, &[(1, 10.0 + t / 100.0, 3.0), (2, 4.0, 1.0)]),
                &roster,
                "me",
                &FIXED,
                &mut rtts,
            );
            if trends.sample(&v) {
                sent += 1;
                last = Some(trends.of(&v));
            }
        }
        assert!((399..=401).contains(&sent), "{sent} trends in 400 s");
        let last = last.expect("trends");
        assert_eq!(last.len(), 2);
        let bo = last.iter().find(|t| t.name == "bo").expect("bo");
        assert_eq!(bo.points.len(), TREND_POINTS, "five minutes kept");
        let (t0, rtt0, _, buffer0) = bo.points[0];
        let (t1, _, _, _) = bo.points[TREND_POINTS - 1];
        assert!((t1 - t0 - 299.0).abs() < 0.1, "a point a second: {t0}..{t1}");
        assert!((rtt0.expect("rtt") - (10.0 + t0 / 100.0)).abs() < 1e-9);
        assert_eq!(buffer0, 3.0);
        // cy leaves: the next trend has only bo, and cy's points are gone.
        let v = view(
            &snapshot(401.0, &[(1, 10.0, 3.0)]),
            &roster_of(&[(1, "bo")]),
            "me",
            &FIXED,
            &mut rtts,
        );
        assert!(trends.sample(&v), "a point due");
        let tr = trends.of(&v);
        assert_eq!(tr.len(), 1);
        assert!(!trends.members.contains_key(&2));
        let json = serde_json::to_value(&tr[0]).expect("json");
        assert_eq!(json["points"][0].as_array().map(Vec::len), Some(4), "{json}");
    }

    #[test]
    fn the_page_commands_name_members_through_the_roster() {
        let (tx, rx) = mpsc::sync_channel(4);
        let mut source = PageCommands {
            rx,
            gone: Arc::default(),
        };
        let mut roster = Roster::default();
        roster.members.insert(
            7,
            netjam_engine::player::RosterMember {
                member_id: 7,
                name: "Ana".into(),
                ssrc: 70,
            },
        );
        for c in [
            PageCommand::Member {
                name: "ana".into(),
                set: MemberSetting::Gain(-6.0),
            },
            PageCommand::Member {
                name: "cy".into(),
                set: MemberSetting::Mute(true),
            },
            PageCommand::SendMute(true),
            PageCommand::SendGain(-4.5),
        ] {
            tx.try_send(c).expect("room");
        }
        assert_eq!(source.next(&roster), Some(Command::Gain { member: 7, db: -6.0 }));
        assert_eq!(source.next(&roster), Some(Command::SendMute { mute: true }));
        assert_eq!(source.next(&roster), Some(Command::SendGain { db: -4.5 }));
        assert_eq!(source.next(&roster), None);
        assert_eq!(source.gone.load(Ordering::Relaxed), 1, "cy left meanwhile");
    }
}
