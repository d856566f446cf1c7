//! `netjam server --web`: the operator's read-only page. Rooms, their members (name,
//! address, packet and bit rate, what was forwarded and policed, and which of the others
//! each reaches directly rather than through the server), totals, the time packets spend
//! inside the server, and uptime; events (a member joined or left) as they are seen.
//!
//! A feed thread takes the report the forwarding thread already publishes
//! ([`ReportReader`], refreshed four times a second) whenever it is a new one, turns it
//! into a [`ServerView`] (rates from the difference with the one before), and publishes
//! it as JSON to the pages' [`Board`]: pages are updated at the rate the server publishes.
//! Reading the report never makes the forwarding thread wait (it only ever tries its
//! lock), so an open page costs the forwarding thread nothing.
//!
//! The server knows no member's codec or sample rate (it never decodes), so the page
//! shows rates in packets and bits per second.
//!
//! Never here: a handle on the server's socket or core, or anything that changes the
//! server.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

use super::{Board, WebError, WebListener, WebServer, WebStats};
use crate::server::{DelayFigures, ReportReader, ServerReport};

/// Where `--web` without an address serves the page: this machine only, on the port after
/// the rooms server's default one.
pub const DEFAULT_ADDR: &str = "127.0.0.1:4465";
/// The page: HTML, its style and its script in one document, embedded in the binary.
pub const PAGE: &str = include_str!("server_page.html");
/// How often the feed looks for a new report (the server publishes one every 250 ms).
const FEED_POLL: Duration = Duration::from_millis(50);

/// One message of the WebSocket: what the page shows, whole.
#[derive(Debug, Clone, Serialize)]
pub struct ServerView {
    /// Always `"snapshot"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub listen: Option<SocketAddr>,
    pub uptime_s: f64,
    pub rooms: Vec<RoomView>,
    pub totals: Totals,
    /// Time inside the server per forwarded packet.
    pub delay: DelayFigures,
    /// Pages open now (this one included).
    pub pages_open: u64,
}

/// A room with someone in it, and its members by name.
#[derive(Debug, Clone, Serialize)]
pub struct RoomView {
    pub name: String,
    pub members: Vec<MemberView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemberView {
    pub id: u32,
    pub name: String,
    /// The address the server sees it at.
    pub addr: SocketAddr,
    /// Datagrams per second received from it, since the report before.
    pub packets_per_s: f64,
    /// Kilobits per second received from it (UDP payloads).
    pub kbit_per_s: f64,
    /// Its media packets forwarded (once each, whatever the fan-out).
    pub forwarded: u64,
    /// Its packets dropped for exceeding its declared rate.
    pub policed: u64,
    /// Its packets dropped otherwise (another SSRC from its address, malformed), and
    /// copies for it dropped because its queue was full.
    pub dropped: u64,
    /// The others in the room it says it reaches directly: its media to them does not
    /// pass through the server.
    pub direct_to: Vec<String>,
    /// The others its media reaches through the server.
    pub via_server_to: Vec<String>,
}

/// The whole server.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Totals {
    pub rooms: u64,
    pub members: u64,
    /// Datagrams received (media and control).
    pub packets_in: u64,
    /// Copies forwarded and control replies sent.
    pub packets_out: u64,
    pub in_per_s: f64,
    pub out_per_s: f64,
    /// Media packets forwarded (once each).
    pub forwarded: u64,
    /// Dropped for exceeding a member's rate.
    pub policed: u64,
    /// Dropped for any other reason (forged, malformed, full queue, not a member, a
    /// refused or full send, too long).
    pub dropped: u64,
}

/// One event message.
#[derive(Debug, Clone, Serialize)]
struct Event<'a> {
    /// Always `"event"`.
    #[serde(rename = "type")]
    kind: &'static str,
    uptime_s: f64,
    text: &'a str,
}

fn packets_out(r: &ServerReport) -> u64 {
    r.shell.sent + r.shell.control_sent
}

/// What the page shows of `now`, with rates against `before` (the report before it).
pub fn view(now: &ServerReport, before: Option<&ServerReport>, pages_open: u64) -> ServerView {
    let dt = before.map_or(0.0, |b| now.uptime_s - b.uptime_s);
    let per_s = |n: u64, then: Option<u64>| match then {
        Some(then) if dt > 1e-3 => n.saturating_sub(then) as f64 / dt,
        _ => 0.0,
    };
    let earlier: BTreeMap<u32, (u64, u64)> = before
        .map(|b| {
            b.members
                .iter()
                .map(|m| (m.member_id, (m.packets_in, m.bytes_in)))
                .collect()
        })
        .unwrap_or_default();
    let mut rooms: BTreeMap<&str, Vec<MemberView>> = BTreeMap::new();
    for m in &now.members {
        let before = earlier.get(&m.member_id);
        let others = now
            .members
            .iter()
            .filter(|o| o.room == m.room && o.member_id != m.member_id);
        let (mut direct, mut via): (Vec<_>, Vec<_>) = others
            .map(|o| (o.member_id, o.name.clone()))
            .partition(|(id, _)| m.direct_to.contains(id));
        direct.sort_by(|a, b| a.1.cmp(&b.1));
        via.sort_by(|a, b| a.1.cmp(&b.1));
        rooms.entry(&m.room).or_default().push(MemberView {
            id: m.member_id,
            name: m.name.clone(),
            addr: m.addr,
            packets_per_s: per_s(m.packets_in, before.map(|b| b.0)),
            kbit_per_s: per_s(m.bytes_in, before.map(|b| b.1)) * 8.0 / 1e3,
            forwarded: m.forwarded,
            policed: m.policed_drops,
            dropped: m.forged_drops + m.malformed_drops + m.queue_drops,
            direct_to: direct.into_iter().map(|(_, name)| name).collect(),
            via_server_to: via.into_iter().map(|(_, name)| name).collect(),
        });
    }
    let members: &[_] = &now.members;
    let totals = Totals {
        rooms: rooms.len() as u64,
        members: members.len() as u64,
        packets_in: now.shell.received,
        packets_out: packets_out(now),
        in_per_s: per_s(now.shell.received, before.map(|b| b.shell.received)),
        out_per_s: per_s(packets_out(now), before.map(packets_out)),
        forwarded: members.iter().map(|m| m.forwarded).sum(),
        policed: members.iter().map(|m| m.policed_drops).sum(),
        dropped: members
            .iter()
            .map(|m| m.forged_drops + m.malformed_drops + m.queue_drops)
            .sum::<u64>()
            + now.server.unknown_source
            + now.shell.send_failed
            + now.shell.send_would_block
            + now.shell.truncated,
    };
    ServerView {
        kind: "snapshot",
        listen: now.listen,
        uptime_s: now.uptime_s,
        rooms: rooms
            .into_iter()
            .map(|(name, mut members)| {
                members.sort_by(|a, b| a.name.cmp(&b.name).then(a.id.cmp(&b.id)));
                RoomView {
                    name: name.to_owned(),
                    members,
                }
            })
            .collect(),
        totals,
        delay: now.delay,
        pages_open,
    }
}

/// Who joined and who left between two reports, as sentences.
pub fn changes(now: &ServerReport, before: &ServerReport) -> Vec<String> {
    let seats = |r: &ServerReport| -> BTreeSet<(u32, String, String)> {
        r.members
            .iter()
            .map(|m| (m.member_id, m.name.clone(), m.room.clone()))
            .collect()
    };
    let (now, before) = (seats(now), seats(before));
    let joined = now
        .difference(&before)
        .map(|(_, name, room)| format!("{name} joined room {room}"));
    let left = before
        .difference(&now)
        .map(|(_, name, room)| format!("{name} left room {room}"));
    left.chain(joined).collect()
}

/// The operator's page, running: its server and its feed.
#[derive(Debug)]
pub struct ServerPage {
    web: Option<WebServer>,
    stop: Arc<AtomicBool>,
    feed: Option<JoinHandle<()>>,
}

impl ServerPage {
    /// Serves the page on `listener`, fed from `reader`.
    pub fn start(listener: WebListener, reader: ReportReader) -> Result<Self, WebError> {
        let board = Arc::new(Board::default());
        let web = WebServer::start(listener, PAGE, board.clone())?;
        let stop = Arc::new(AtomicBool::new(false));
        let feed = {
            let stop = stop.clone();
            let shared = web.shared.clone();
            std::thread::Builder::new()
                .name("netjam-web-feed".into())
                .spawn(move || {
                    let mut last: Option<Arc<ServerReport>> = None;
                    while !stop.load(Ordering::Relaxed) {
                        let now = reader.latest();
                        if last.as_ref().map_or(true, |l| !Arc::ptr_eq(l, &now)) {
                            let pages = shared.counters.pages_open.load(Ordering::Relaxed);
                            let events = last.as_deref().map(|l| changes(&now, l)).unwrap_or_default();
                            let events = events
                                .iter()
                                .filter_map(|text| {
                                    serde_json::to_string(&Event {
                                        kind: "event",
                                        uptime_s: now.uptime_s,
                                        text,
                                    })
                                    .ok()
                                })
                                .collect();
                            if let Ok(json) = serde_json::to_string(&view(&now, last.as_deref(), pages)) {
                                board.publish(json, events);
                            }
                            last = Some(now);
                        }
                        std::thread::sleep(FEED_POLL);
                    }
                })
                .map_err(WebError::Thread)?
        };
        Ok(Self {
            web: Some(web),
            stop,
            feed: Some(feed),
        })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.web.as_ref().map(WebServer::local_addr)
    }

    /// Closes every page and stops serving.
    pub fn stop(mut self) -> WebStats {
        self.halt()
    }

    fn halt(&mut self) -> WebStats {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(f) = self.feed.take() {
            let _ = f.join();
        }
        self.web.take().map(WebServer::stop).unwrap_or_default()
    }
}

impl Drop for ServerPage {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netjam_engine::room::MemberStats;

    fn member(id: u32, name: &str, room: &str, packets_in: u64, direct_to: Vec<u32>) -> MemberStats {
        MemberStats {
            member_id: id,
            name: name.into(),
            room: room.into(),
            addr: SocketAddr::from(([127, 0, 0, 1], 5000 + id as u16)),
            ssrc: id,
            packets_in,
            bytes_in: packets_in * 100,
            forwarded: packets_in,
            policed_drops: 2,
            forged_drops: 1,
            malformed_drops: 0,
            sent_to: 0,
            queue_drops: 0,
            direct_skipped: 0,
            direct_to,
        }
    }

    fn report(uptime_s: f64, members: Vec<MemberStats>) -> ServerReport {
        ServerReport {
            uptime_s,
            members,
            ..ServerReport::default()
        }
    }

    #[test]
    fn rooms_list_their_members_with_rates_and_paths() {
        let before = report(
            1.0,
            vec![
                member(1, "ana", "band", 100, vec![]),
                member(2, "bo", "band", 100, vec![]),
            ],
        );
        let now = report(
            1.25,
            vec![
                member(3, "cy", "band", 10, vec![]),
                member(1, "ana", "band", 200, vec![2]),
                member(2, "bo", "band", 150, vec![]),
                member(4, "dee", "duo", 10, vec![]),
            ],
        );
        let v = view(&now, Some(&before), 1);
        assert_eq!(v.rooms.len(), 2);
        let band = &v.rooms[0];
        assert_eq!(band.name, "band");
        let names: Vec<_> = band.members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["ana", "bo", "cy"]);
        let ana = &band.members[0];
        assert!((ana.packets_per_s - 400.0).abs() < 1e-6, "{}", ana.packets_per_s);
        assert!((ana.kbit_per_s - 320.0).abs() < 1e-6, "{}", ana.kbit_per_s);
        assert_eq!(ana.direct_to, ["bo"]);
        assert_eq!(ana.via_server_to, ["cy"]);
        assert_eq!(band.members[1].via_server_to, ["ana", "cy"]);
        assert_eq!(band.members[2].packets_per_s, 0.0, "a newcomer has no rate yet");
        assert_eq!(v.totals.members, 4);
        assert_eq!(v.totals.policed, 8);
        assert_eq!(v.rooms[1].members[0].via_server_to, Vec::<String>::new());
        let json = serde_json::to_value(&v).expect("json");
        assert_eq!(json["type"], "snapshot");
        assert_eq!(json["rooms"][0]["members"][0]["direct_to"][0], "bo");
    }

    #[test]
    fn joins_and_leaves_are_told_once() {
        let before = report(
            1.0,
            vec![
                member(1, "ana", "band", 1, vec![]),
                member(2, "bo", "band", 1, vec![]),
            ],
        );
        let now = report(
            1.25,
            vec![
                member(2, "bo", "band", 1, vec![]),
                member(3, "cy", "band", 1, vec![]),
            ],
        );
        assert_eq!(
            changes(&now, &before),
            ["ana left room band", "cy joined room band"]
        );
        assert!(changes(&now, &now).is_empty());
    }
}
