//! A room as the player reports it: each member heard (name, seat, path, figures, the mix
//! set), joined from the media core's [`MediaReport`] and the session's [`Roster`], for the
//! live status line, the closing summary, the statistics file (`--stats-json`, with its
//! time series) and the OSC queries. It decides nothing and does no I/O: the `jam --room`
//! shell feeds it snapshots and prints or writes what it makes.

use std::net::SocketAddr;

use crate::control::{ControlHandle, MemberStats as OscMemberStats};
use crate::endpoint::PeriodStats;
use crate::record::RecordSummary;
use crate::series::BoundedSeries;
use crate::session::Snapshot;
use crate::status::HeardRate;
use netjam_engine::nat::direct::{PathInfo, PathState};
use netjam_engine::player::reflexive::Reflexive;
use netjam_engine::player::{MediaReport, Roster, SEATS};

/// How media reaches a member, for the status line and the summary.
pub(crate) fn path_text(p: Option<&PathInfo>, rtcp_rtt_ms: Option<f64>) -> String {
    let ms = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.1}"));
    match p {
        Some(p) if p.state == PathState::Direct => format!("direct RTT {} ms", ms(p.direct_rtt_ms)),
        Some(p) if p.state == PathState::Punching => {
            format!(
                "via server RTT {} ms (trying direct)",
                ms(p.relay_rtt_ms.or(rtcp_rtt_ms))
            )
        }
        Some(p) if p.slower => format!(
            "via server RTT {} ms (direct {} ms, slower)",
            ms(p.relay_rtt_ms.or(rtcp_rtt_ms)),
            ms(p.direct_rtt_ms)
        ),
        Some(p) => format!("via server RTT {} ms", ms(p.relay_rtt_ms.or(rtcp_rtt_ms))),
        None => format!("via server RTT {} ms", ms(rtcp_rtt_ms)),
    }
}

/// One member as the status line, the summary and the JSON report show it.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct HeardMember {
    pub(crate) name: String,
    pub(crate) member_id: u32,
    /// The rooms server this member was heard through (member ids are per server: a room
    /// that moves to another server hears its members again under new ids).
    pub(crate) server: Option<SocketAddr>,
    pub(crate) ssrc: u32,
    /// Control seat (`/memberN`).
    pub(crate) seat: Option<usize>,
    pub(crate) received: u64,
    pub(crate) lost: i64,
    pub(crate) concealment_events: u64,
    /// Waits (inserted stretches) and catch-ups (skipped stretches) in their playout.
    pub(crate) inserted: u64,
    pub(crate) skipped: u64,
    pub(crate) buffer_target_ms: f64,
    pub(crate) added_latency_ms: f64,
    /// Round trip to this member (RTCP, on whichever path media takes), ms.
    pub(crate) rtt_ms: Option<f64>,
    /// How media reaches this member: `direct RTT x ms` or `via server RTT y ms`.
    pub(crate) path: String,
    /// Estimated one-way latency from their playing to your hearing: half the round trip,
    /// a packet of audio, your jitter buffer, the devices' periods and your device's
    /// resampler from Opus's 48 kHz (if it runs at another rate), ms.
    pub(crate) mouth_to_ear_ms: Option<f64>,
    pub(crate) gain_db: f32,
    pub(crate) pan: f32,
    pub(crate) mute: bool,
    pub(crate) solo: bool,
    /// Their peak level since the snapshot before, dBFS (-120: silence); in the summary
    /// (`heard` in the statistics file), their loudest of the session.
    pub(crate) peak_dbfs: f32,
}

pub(crate) fn heard_members(stats: &MediaReport, roster: &Roster, fixed_ms: f64) -> Vec<HeardMember> {
    stats
        .active_members()
        .map(|m| {
            let id = m.member;
            let jb = &m.heard.jitter_buffer;
            HeardMember {
                name: roster
                    .members
                    .get(&id)
                    .map_or_else(|| format!("member {id}"), |r| r.name.clone()),
                member_id: id,
                server: roster.server,
                ssrc: m.ssrc,
                seat: roster.seat_of(id),
                received: m.heard.received,
                lost: m.heard.lost,
                concealment_events: jb.concealment_events,
                inserted: jb.discontinuities.inserted_events,
                skipped: jb.discontinuities.skipped_events,
                buffer_target_ms: jb.target_ms,
                added_latency_ms: jb.added_latency_ms,
                rtt_ms: m.rtt_ms,
                path: path_text(roster.paths.get(&id), m.rtt_ms),
                mouth_to_ear_ms: m.mouth_to_ear_ms(fixed_ms),
                gain_db: netjam_engine::mixer::amplitude_db(m.mix.gain),
                pan: m.mix.pan,
                mute: m.mix.mute,
                solo: m.mix.solo,
                peak_dbfs: m.level.peak_dbfs(),
            }
        })
        .collect()
}

/// The live status: the time, the room, then each member heard, the one who sounds latest
/// first (so the worst is what stays on screen when the line is cut to the terminal's
/// width): name, mouth-to-ear in ms, a one-character meter, then packets lost and the mix
/// you set (solo, mute, or a gain other than 0 dB) only when there is something to say. About
/// seven columns a member: eight fit in 80.
pub(crate) fn room_line(s: &Snapshot<MediaReport>, roster: &Roster, fixed_ms: f64) -> String {
    let mut members = heard_members(&s.stats, roster, fixed_ms);
    let ear = |m: &HeardMember| m.mouth_to_ear_ms.unwrap_or(f64::INFINITY);
    members.sort_by(|a, b| ear(b).total_cmp(&ear(a)).then(b.lost.cmp(&a.lost)));
    // The room's name was said at the join; the line keeps its columns for the members.
    let mut line = format!("{:.0}s", s.t_s);
    if roster.lost {
        line.push_str(" server not answering");
    }
    let limiter = &s.stats.limiter;
    if limiter.max_reduction_db > 0.0 {
        line.push_str(&format!(" limiter -{:.1}dB", limiter.max_reduction_db));
    }
    if members.is_empty() {
        line.push_str("  nobody else yet");
        return line;
    }
    line.push_str(" ms:");
    for m in &members {
        let name: String = m.name.chars().take(8).collect();
        let ms = m.mouth_to_ear_ms.map_or("-".to_string(), |x| format!("{x:.0}"));
        line.push_str(&format!(" {name} {ms}{}", crate::status::meter_char(m.peak_dbfs)));
        if m.lost > 0 {
            line.push_str(&format!(" lost {}", m.lost));
        }
        if m.solo {
            line.push_str(" solo");
        }
        if m.mute {
            line.push_str(" mute");
        } else if m.gain_db.abs() >= 0.05 {
            line.push_str(&format!(" {:+.0}dB", m.gain_db));
        }
    }
    line
}

/// Folds the peaks of `earlier` (a snapshot not shown) into `now`: the status line and the
/// statistics file show each tenth of a second's loudest, whatever the snapshots' rate.
pub(crate) fn keep_peaks(earlier: &Snapshot<MediaReport>, now: &mut Snapshot<MediaReport>) {
    now.peak_dbfs = now.peak_dbfs.max(earlier.peak_dbfs);
    let limiter = &mut now.stats.limiter;
    limiter.max_reduction_db = limiter
        .max_reduction_db
        .max(earlier.stats.limiter.max_reduction_db);
    let monitor = &mut now.stats.monitor;
    monitor.peak = monitor.peak.max(earlier.stats.monitor.peak);
    for (m, e) in now.stats.members.iter_mut().zip(&earlier.stats.members) {
        if m.active && e.active && m.ssrc == e.ssrc {
            m.level.peak = m.level.peak.max(e.level.peak);
        }
    }
}

/// Keep the latest figures of everyone heard, and the name they had while in the room.
pub(crate) fn remember(everyone: &mut Everyone, now: Vec<HeardMember>) {
    for mut m in now {
        let key = (m.server, m.member_id);
        if let Some(old) = everyone.get(&key) {
            // The summary's level is the loudest of the session: the last snapshot, taken
            // as everyone stops, is silence for members who played to the end.
            m.peak_dbfs = m.peak_dbfs.max(old.peak_dbfs);
            if m.seat.is_none() {
                m.name.clone_from(&old.name);
                m.seat = old.seat;
                // Its path as it was while it was here.
                m.path.clone_from(&old.path);
            }
        }
        everyone.insert(key, m);
    }
}

/// Everyone heard during the session, by server and member id.
pub(crate) type Everyone = std::collections::BTreeMap<(Option<SocketAddr>, u32), HeardMember>;

#[derive(Debug, serde::Serialize)]
pub(crate) struct RoomReport {
    pub(crate) server: SocketAddr,
    pub(crate) room: String,
    pub(crate) name: String,
    pub(crate) member_id: u32,
    pub(crate) ssrc: u32,
    pub(crate) roster: Roster,
    pub(crate) heard: Vec<HeardMember>,
    pub(crate) stats: MediaReport,
    pub(crate) periods: PeriodStats,
    pub(crate) record: Option<RecordSummary>,
    /// With `--measure-roundtrip`: every round trip found in band.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) round_trip: Option<RoundTrips>,
    /// Where the rooms server (and `--stun`) saw this player.
    pub(crate) reflexive: Reflexive,
    /// The resampler from Opus's 48 kHz to a device at another rate, ms (0 without one):
    /// counted in every member's `mouth_to_ear_ms`.
    pub(crate) hear_edge_ms: f64,
    /// How the session went: a point about every 100 ms, spread evenly over a long one.
    pub(crate) series: BoundedSeries<RoomPoint>,
}

/// One moment of the session in the statistics file.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct RoomPoint {
    /// Seconds into the session.
    pub(crate) t_s: f64,
    pub(crate) sent_packets: u64,
    /// The output limiter's most gain reduction since the point before, dB.
    pub(crate) limiter_reduction_db: f32,
    /// Each member heard then, as the summary's `heard` lists them.
    pub(crate) members: Vec<HeardMember>,
}

impl RoomPoint {
    pub(crate) fn new(s: &Snapshot<MediaReport>, members: &[HeardMember]) -> Self {
        Self {
            t_s: s.t_s,
            sent_packets: s.stats.sent.packets,
            limiter_reduction_db: s.stats.limiter.max_reduction_db,
            members: members.to_vec(),
        }
    }
}

/// One round trip found in band: when (seconds into the session) and how long, ms.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct RoundTrip {
    pub(crate) t_s: f64,
    pub(crate) ms: f64,
}

/// The in-band round trips through the room (`--measure-roundtrip`).
#[derive(Debug, serde::Serialize)]
pub(crate) struct RoundTrips {
    /// Each one found, spread evenly over the session when it ran long.
    pub(crate) readings: BoundedSeries<RoundTrip>,
    /// Bursts found and bursts that never came back.
    pub(crate) found: u64,
    pub(crate) lost: u64,
}

impl RoundTrips {
    /// Takes the reading of `s` if the meter found a burst since the last snapshot.
    pub(crate) fn offer(&mut self, s: &Snapshot<MediaReport>) {
        if s.stats.round_trip_found > self.found {
            if let Some(ms) = s.stats.round_trip_ms {
                self.readings.push(RoundTrip { t_s: s.t_s, ms });
            }
        }
        self.found = s.stats.round_trip_found;
        self.lost = s.stats.round_trip_lost;
    }

    pub(crate) fn summary(&self) -> String {
        let mut v: Vec<f64> = self.readings.iter().map(|r| r.ms).collect();
        v.sort_by(f64::total_cmp);
        match (v.get(v.len() / 2), v.last()) {
            (Some(median), Some(worst)) => format!(
                "round trip through the room measured in band: median {median:.2} ms, worst {worst:.2} ms ({} found, {} lost)",
                self.found, self.lost
            ),
            _ => format!(
                "round trip through the room: no burst came back ({} lost); does a member monitor through (send you what they hear)?",
                self.lost
            ),
        }
    }
}

/// Publish what OSC queries answer: names at their seats, mix settings, figures.
pub(crate) fn publish(control: &ControlHandle, s: &Snapshot<MediaReport>, roster: &Roster, fixed_ms: f64) {
    let members = heard_members(&s.stats, roster, fixed_ms);
    let json = serde_json::to_string(&members).unwrap_or_default();
    control.update(|st| {
        for (seat, state) in st.members.iter_mut().enumerate().take(SEATS) {
            let who = roster.member_at(seat);
            state.name = who.map(|m| m.name.clone());
            if let Some(m) = who.and_then(|w| members.iter().find(|m| m.member_id == w.member_id)) {
                state.gain_db = m.gain_db;
                state.pan = m.pan;
                state.mute = m.mute;
                state.solo = m.solo;
                state.stats = OscMemberStats {
                    latency_ms: m.mouth_to_ear_ms.map(|x| x as f32),
                    lost: m.lost.max(0) as u64,
                    concealed: m.concealment_events,
                    buffer_ms: m.added_latency_ms as f32,
                };
            }
        }
        st.stats_json = json;
    });
}

/// The lines that end a session in `room`: what was sent, the limiter's work on a mix at
/// `rate`, each member heard, the in-band round trips and the sealing of a private room.
pub(crate) fn summary(
    stats: &MediaReport,
    heard: &[HeardMember],
    rate: u32,
    room: &str,
    round_trips: Option<&RoundTrips>,
) -> Vec<String> {
    let mut lines = vec![format!(
        "netjam: sent {} packets to room {room}; heard {} member(s)",
        stats.sent.packets,
        heard.len()
    )];
    if stats.limiter.limited_frames > 0 {
        lines.push(format!(
            "netjam: the mix was over -3 dBFS: its limiter turned {:.1} s of it down to stay under full scale (lower the members' gains or --master-gain to hear it untouched)",
            stats.limiter.limited_frames as f64 / f64::from(rate.max(1))
        ));
    }
    lines.extend(heard.iter().map(|m| {
        format!(
            "netjam:   {}: {} packets, lost {}, {} concealed, {} waits, {} catch-ups; buffer {:.2} ms; {}; round trip {}; mouth to ear about {}",
            m.name,
            m.received,
            m.lost,
            m.concealment_events,
            m.inserted,
            m.skipped,
            m.added_latency_ms,
            m.path,
            m.rtt_ms.map_or("not measured".into(), |r| format!("{r:.2} ms")),
            m.mouth_to_ear_ms.map_or("-".into(), |r| format!("{r:.1} ms"))
        )
    }));
    if let Some(rt) = round_trips {
        lines.push(format!("netjam: {}", rt.summary()));
    }
    if let Some(f) = &stats.sframe {
        lines.push(format!(
            "netjam: private room: sealed {} packets, opened {}, dropped {} that did not open ({} altered or under another password, {} replayed, {} without a key, {} not sealed)",
            f.sealed, f.opened, f.rejected, f.forged, f.replayed, f.no_key, f.malformed
        ));
    }
    lines
}

/// What the session has said of the room already, so that each thing that happens is one
/// line, said once, however many snapshots show it.
#[derive(Debug, Default)]
pub struct Told {
    /// This player's seat was taken by its rejoin, or the server refused to seat it again.
    refusal: bool,
    /// The roster's password notes and notices said so far.
    password_notes: usize,
    notices: usize,
    /// What was said of each stream's rate, by SSRC.
    rates: std::collections::BTreeMap<u32, HeardRate>,
}

impl Told {
    /// The lines to print for what is new in `roster` and in the members heard (`stats`) on
    /// a device at `device_rate`, and whether this player must stop: the same player
    /// joined again from this computer and took its seat.
    pub fn news(
        &mut self,
        roster: &Roster,
        stats: &MediaReport,
        room: &str,
        device_rate: u32,
    ) -> (Vec<String>, bool) {
        let mut lines = Vec::new();
        let mut stop = false;
        if roster.replaced && !self.refusal {
            self.refusal = true;
            stop = true;
            lines.push(format!(
                "netjam: netjam joined room {room:?} again under this name from this computer and took the seat; this one stops"
            ));
        }
        if roster.refused.is_some() && !self.refusal {
            self.refusal = true;
            lines.push(format!(
                "netjam: the rooms server at {} refused to seat this player again ({}): restart to try again",
                roster.server.map_or("-".into(), |a| a.to_string()),
                roster.refused.as_deref().unwrap_or_default()
            ));
        }
        let notes = roster.password_notes.iter().skip(self.password_notes);
        lines.extend(notes.map(|n| format!("netjam: {n}")));
        let notices = roster.notices.iter().skip(self.notices);
        lines.extend(notices.map(|n| format!("netjam: {n}")));
        self.password_notes = roster.password_notes.len();
        self.notices = roster.notices.len();
        for m in stats.active_members() {
            let who = roster
                .members
                .get(&m.member)
                .map_or_else(|| format!("member {}", m.member), |r| r.name.clone());
            let heard_rate = m.heard.format.map(|f| f.rate);
            let told = self.rates.entry(m.ssrc).or_default();
            lines.extend(told.tell(&who, heard_rate, m.heard.rate_mismatch, device_rate));
        }
        (lines, stop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netjam_engine::player::RosterMember;

    #[test]
    fn eight_members_fit_80_columns_latest_first_with_mutes_and_gains() {
        let names = ["ana", "bo", "cy", "dee", "ed", "flo", "gus", "hal"];
        let mut roster = Roster {
            room: "friday".into(),
            ..Roster::default()
        };
        let mut stats = MediaReport::default();
        for (i, name) in names.iter().enumerate() {
            let id = i as u32 + 1;
            roster.members.insert(
                id,
                RosterMember {
                    member_id: id,
                    name: (*name).into(),
                    ssrc: 0x100 + id,
                },
            );
            let m = &mut stats.members[i];
            m.active = true;
            m.member = id as _;
            m.ssrc = 0x100 + id;
            // bo sounds latest; the rest 10-17 ms.
            m.rtt_ms = Some(if *name == "bo" {
                60.0
            } else {
                20.0 + i as f64 * 2.0
            });
            m.level.peak = 0.3;
            m.mix.gain = 1.0;
        }
        stats.members[2].mix.mute = true;
        stats.members[3].mix.gain = 0.5;
        let snap = Snapshot {
            t_s: 12.3,
            peak_dbfs: -10.0,
            stats,
        };
        let line = room_line(&snap, &roster, 0.0);
        let shown = crate::status::fit(&line, 80);
        assert!(!shown.ends_with('…'), "{} columns: {line}", line.chars().count());
        for name in names {
            assert!(shown.contains(&format!(" {name} ")), "{name} missing: {shown}");
        }
        let after_colon = shown.split(" ms:").nth(1).expect("members");
        assert!(after_colon.trim_start().starts_with("bo 30"), "{shown}");
        assert!(shown.contains("cy 12▇ mute"), "{shown}");
        assert!(shown.contains("-6dB"), "{shown}");
    }
}

#[cfg(test)]
mod told_tests {
    use super::*;
    use netjam_engine::player::session::Notice;
    use netjam_engine::player::RosterMember;
    use netjam_engine::wire::{AudioFormat, Codec};

    /// Everything the room says is said once, in the order it happened, however many
    /// snapshots show it; only the seat taken by this player's own rejoin stops it.
    #[test]
    fn each_thing_that_happens_in_a_room_is_said_once() {
        let server: SocketAddr = "192.0.2.1:4464".parse().expect("address");
        let mut roster = Roster {
            room: "friday".into(),
            server: Some(server),
            ..Roster::default()
        };
        roster.members.insert(
            7,
            RosterMember {
                member_id: 7,
                name: "ana".into(),
                ssrc: 0x77,
            },
        );
        let mut stats = MediaReport::default();
        let m = &mut stats.members[0];
        m.active = true;
        m.member = 7;
        m.ssrc = 0x77;
        m.heard.format = Some(AudioFormat::new(Codec::L16, 44_100, 1).expect("format"));
        let mut told = Told::default();

        let (lines, stop) = told.news(&roster, &stats, "friday", 48_000);
        assert_eq!(
            lines,
            ["netjam: ana sends at 44100 Hz: converted to your 48000 Hz"]
        );
        assert!(!stop);
        assert_eq!(told.news(&roster, &stats, "friday", 48_000), (vec![], false));

        roster.notices.push(Notice::ServerLost { server });
        roster.password_notes.push("the room's password changed".into());
        roster.refused = Some("room full".into());
        let (lines, stop) = told.news(&roster, &stats, "friday", 48_000);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[0].contains("refused to seat this player again (room full)"),
            "{lines:?}"
        );
        assert_eq!(lines[1], "netjam: the room's password changed");
        assert!(lines[2].contains("stopped answering"), "{lines:?}");
        assert!(!stop, "a refusal is said, and the player goes on");
        assert_eq!(told.news(&roster, &stats, "friday", 48_000), (vec![], false));

        roster.notices.push(Notice::ServerBack {
            server,
            silence_s: 3.0,
        });
        let (lines, _) = told.news(&roster, &stats, "friday", 48_000);
        assert_eq!(lines.len(), 1, "only the new notice: {lines:?}");

        let mut told = Told::default();
        roster.replaced = true;
        let (lines, stop) = told.news(&roster, &stats, "friday", 48_000);
        assert!(stop, "{lines:?}");
        assert!(lines[0].contains("took the seat; this one stops"), "{lines:?}");
        assert!(
            !lines.iter().any(|l| l.contains("refused")),
            "one of the two: {lines:?}"
        );
        assert!(!told.news(&roster, &stats, "friday", 48_000).1, "stopped once");
    }
}
