//! The OSC surface of `netjam server --osc PORT`: read-only figures of the rooms server,
//! every port with its metadata (`/_meta ,s PATH`).
//!
//! * `/stats` — `,s` one JSON object: rooms, members, packets in and out, what was dropped
//!   and why, the time each forwarded packet spent inside the server (p50/p99/p99.9), and
//!   the core's and shell's full counters.
//! * `/rooms` — one `/rooms ,si NAME MEMBERS` per room with someone in it, then
//!   `/rooms/end ,i ROOMS`.
//! * `/members` — one `/members ,ssishhhh ROOM NAME ID ADDRESS FORWARDED POLICED FORGED
//!   QUEUE_DROPS` per member, then `/members/end ,i MEMBERS`.
//! * `/delay` — `,fff` time inside the server per forwarded packet, p50 p99 p99.9, µs.
//!
//! Every answer comes from the report the forwarding thread publishes about four times a
//! second ([`ReportReader`]): this module never touches the forwarding thread, its socket
//! or its core, and reading the report never makes that thread wait. A reply that does not
//! fit the reply buffer (some hundreds of members in one `/members` answer) is counted in
//! [`ControlCounters::reply_failures`] and left out.
//!
//! Nothing here can be set: a message with arguments gets `/error`, like any address the
//! surface does not have.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::Context;
use netjam_engine::room::ServerStats;
use netjam_osc::{Arg, Meta, Request, Tree, TreeBuilder};

use super::{bump, listen, ControlCounters, Counters, Running, Served};
use crate::server::{DelayFigures, ReportReader, ServerReport, ShellStats};

/// Queries only.
const READ_ONLY: &str = ":";

/// What the control thread and its owner share.
#[derive(Debug)]
struct Shared {
    reader: ReportReader,
    counters: Counters,
    stop: AtomicBool,
}

impl Served for Shared {
    fn counters(&self) -> &Counters {
        &self.counters
    }
    fn stop_flag(&self) -> &AtomicBool {
        &self.stop
    }
}

/// The state the tree's handlers work on.
struct Ctx {
    shared: Arc<Shared>,
}

impl Ctx {
    fn report(&self) -> Arc<ServerReport> {
        self.shared.reader.latest()
    }

    /// Counts a query, and a failure if any of its replies did not go out.
    fn answered(&self, ok: bool) {
        bump(&self.shared.counters.queries);
        if !ok {
            bump(&self.shared.counters.reply_failures);
        }
    }
}

/// What was dropped, and where, summed over the members.
#[derive(Debug, Default, serde::Serialize)]
struct Dropped {
    /// Over a member's declared rate.
    policed: u64,
    /// From a member's address with another SSRC.
    forged: u64,
    /// Malformed media from a member.
    malformed: u64,
    /// A destination's queue was full.
    queue: u64,
    /// Media from an address that is no member.
    unknown_source: u64,
    /// Copies the kernel refused or had no room for.
    send_failed: u64,
    send_would_block: u64,
    /// Datagrams longer than the largest forwarded.
    truncated: u64,
}

/// `/stats`' answer.
#[derive(Debug, serde::Serialize)]
struct Summary<'a> {
    listen: Option<SocketAddr>,
    uptime_s: f64,
    rooms: u64,
    members: u64,
    /// Datagrams received (media and control).
    packets_in: u64,
    /// Forwarded copies sent, plus control replies.
    packets_out: u64,
    dropped: Dropped,
    /// Time inside the server per forwarded packet.
    delay: &'a DelayFigures,
    server: &'a ServerStats,
    shell: &'a ShellStats,
}

fn summary(r: &ServerReport) -> Summary<'_> {
    let mut dropped = Dropped {
        unknown_source: r.server.unknown_source,
        send_failed: r.shell.send_failed,
        send_would_block: r.shell.send_would_block,
        truncated: r.shell.truncated,
        ..Dropped::default()
    };
    for m in &r.members {
        dropped.policed += m.policed_drops;
        dropped.forged += m.forged_drops;
        dropped.malformed += m.malformed_drops;
        dropped.queue += m.queue_drops;
    }
    Summary {
        listen: r.listen,
        uptime_s: r.uptime_s,
        rooms: r.server.rooms,
        members: r.server.members,
        packets_in: r.shell.received,
        packets_out: r.shell.sent + r.shell.control_sent,
        dropped,
        delay: &r.delay,
        server: &r.server,
        shell: &r.shell,
    }
}

/// A counter as OSC's 64-bit integer.
fn long(v: u64) -> Arg<'static> {
    Arg::Long(i64::try_from(v).unwrap_or(i64::MAX))
}

fn int(v: usize) -> Arg<'static> {
    Arg::Int(i32::try_from(v).unwrap_or(i32::MAX))
}

fn build() -> Result<Tree<Ctx>, netjam_osc::dispatch::BuildError> {
    let mut b = TreeBuilder::<Ctx>::new();
    b.port(
        &format!("/stats{READ_ONLY}"),
        Meta::new()
            .doc("Read-only: the server's figures as one JSON object: rooms, members, packets_in, packets_out, dropped (by cause), delay (time inside the server per forwarded packet, µs), and the full server and shell counters")
            .short("stats")
            .unit("json"),
        |c: &mut Ctx, r: &mut Request<'_, '_>| {
            let report = c.report();
            let json = serde_json::to_string(&summary(&report)).unwrap_or_else(|_| "{}".into());
            let ok = r.reply_here(&[Arg::Str(&json)]).is_ok();
            c.answered(ok);
        },
    );
    b.port(
        &format!("/rooms{READ_ONLY}"),
        Meta::new()
            .doc("Read-only: one /rooms ,si NAME MEMBERS per room with someone in it, then /rooms/end ,i ROOMS")
            .short("rooms")
            .unit("members"),
        |c: &mut Ctx, r: &mut Request<'_, '_>| {
            let report = c.report();
            let mut rooms: std::collections::BTreeMap<&str, usize> = Default::default();
            for m in &report.members {
                *rooms.entry(&m.room).or_default() += 1;
            }
            let mut ok = true;
            for (name, members) in &rooms {
                ok &= r.reply("/rooms", &[Arg::Str(name), int(*members)]).is_ok();
            }
            ok &= r.reply("/rooms/end", &[int(rooms.len())]).is_ok();
            c.answered(ok);
        },
    );
    b.port(
        &format!("/members{READ_ONLY}"),
        Meta::new()
            .doc("Read-only: one /members ,ssishhhh ROOM NAME ID ADDRESS FORWARDED POLICED FORGED QUEUE_DROPS per member (its packets forwarded; its packets dropped over its rate; packets from its address with another SSRC; copies for it dropped because its queue was full), then /members/end ,i MEMBERS")
            .short("members")
            .unit("packets"),
        |c: &mut Ctx, r: &mut Request<'_, '_>| {
            let report = c.report();
            let mut ok = true;
            for m in &report.members {
                let addr = m.addr.to_string();
                let args = [
                    Arg::Str(&m.room),
                    Arg::Str(&m.name),
                    Arg::Int(i32::try_from(m.member_id).unwrap_or(i32::MAX)),
                    Arg::Str(&addr),
                    long(m.forwarded),
                    long(m.policed_drops),
                    long(m.forged_drops),
                    long(m.queue_drops),
                ];
                ok &= r.reply("/members", &args).is_ok();
            }
            ok &= r.reply("/members/end", &[int(report.members.len())]).is_ok();
            c.answered(ok);
        },
    );
    b.port(
        &format!("/delay{READ_ONLY}"),
        Meta::new()
            .doc("Read-only: ,fff the time each forwarded packet spent inside the server (kernel receive stamp to its send), p50 p99 p99.9, µs; 0 before any packet was forwarded")
            .short("delay")
            .unit("µs"),
        |c: &mut Ctx, r: &mut Request<'_, '_>| {
            let d = c.report().delay;
            let ok = r
                .reply_here(&[
                    Arg::Float(d.p50_us as f32),
                    Arg::Float(d.p99_us as f32),
                    Arg::Float(d.p999_us as f32),
                ])
                .is_ok();
            c.answered(ok);
        },
    );
    b.build()
}

/// A running server's OSC control thread; dropping it stops the thread.
#[derive(Debug)]
pub struct ServerControl {
    running: Running<Shared>,
}

impl ServerControl {
    /// Listens on `bind` and answers from what `reader` reads.
    pub fn spawn(bind: SocketAddr, reader: ReportReader) -> anyhow::Result<Self> {
        let tree = build().context("the server's OSC tree is malformed")?;
        let (socket, local) = listen(bind)?;
        let shared = Arc::new(Shared {
            reader,
            counters: Counters::default(),
            stop: AtomicBool::new(false),
        });
        let ctx = Ctx {
            shared: shared.clone(),
        };
        Ok(ServerControl {
            running: Running::spawn(socket, local, tree, ctx, shared)?,
        })
    }

    /// The address it listens on (the port chosen when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.running.local
    }

    /// What the control thread saw so far.
    pub fn counters(&self) -> ControlCounters {
        self.running.counters()
    }

    /// Stops the control thread and waits for it (at most one poll interval).
    pub fn shutdown(mut self) {
        self.running.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netjam_osc::{encode_message, Message};

    fn ask(to: SocketAddr, address: &str, args: &[Arg<'_>]) -> Vec<(String, Vec<String>)> {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(std::time::Duration::from_millis(500)))
            .unwrap();
        let mut buf = [0u8; 256];
        let n = encode_message(&mut buf, address, args).unwrap();
        socket.send_to(&buf[..n], to).unwrap();
        let mut replies = Vec::new();
        let mut reply = vec![0u8; 65_536];
        while let Ok((n, _)) = socket.recv_from(&mut reply) {
            let m = Message::decode(&reply[..n]).unwrap();
            let args = m.args().map(|a| format!("{a:?}")).collect();
            let end = m.address().ends_with("/end") || !matches!(m.address(), "/rooms" | "/members");
            replies.push((m.address().to_owned(), args));
            if end {
                break;
            }
        }
        replies
    }

    /// A server nobody joined answers every port, refuses a set and describes a port.
    #[test]
    fn an_empty_server_answers_every_port() {
        crate::rt::disable();
        let server = crate::server::spawn(
            "127.0.0.1:0".parse().unwrap(),
            netjam_engine::room::ServerConfig::default(),
        )
        .unwrap();
        let control = ServerControl::spawn("127.0.0.1:0".parse().unwrap(), server.reader()).unwrap();
        let to = control.local_addr();
        let stats = ask(to, "/stats", &[]);
        assert_eq!(stats[0].0, "/stats");
        assert_eq!(
            ask(to, "/rooms", &[]),
            vec![("/rooms/end".into(), vec!["Int(0)".into()])]
        );
        assert_eq!(
            ask(to, "/members", &[]),
            vec![("/members/end".into(), vec!["Int(0)".into()])]
        );
        let delay = ask(to, "/delay", &[]);
        assert_eq!((delay[0].0.as_str(), delay[0].1.len()), ("/delay", 3));
        let set = ask(to, "/delay", &[Arg::Float(1.0)]);
        assert_eq!(set[0].0, "/error");
        let meta = ask(to, "/_meta", &[Arg::Str("/members")]);
        assert_eq!(meta[0].0, "/_meta");
        assert!(meta[0].1[1].contains("QUEUE_DROPS"), "{meta:?}");
        let c = control.counters();
        assert_eq!((c.queries, c.wrong_types, c.reply_failures), (4, 1, 0), "{c:?}");
        control.shutdown();
        server.stop().unwrap();
    }
}
