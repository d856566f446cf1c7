//! The rooms server as a program (`netjam server`): the forwarding shell ([`crate::server`])
//! started on its socket, alone or sharing rooms through a directory, with its OSC queries
//! and its page; a status line and a line for each change of who is where, of the
//! directory's reach and of the rooms it lost; at the end the page's, the directory's and
//! the server's figures, and the JSON report. What to serve comes in a [`Serve`], parsed
//! and opened by `netjam server`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use netjam_engine::room::ServerConfig;

use crate::control::server::ServerControl;
use crate::room_directory::{DirectoryThread, RedisDirectory, LEASE, RENEW_EVERY};
use crate::server::{self, ServerReport, ShellConfig};
use crate::session::interrupt_flag;
use crate::shell::write_json;
use crate::status::StatusLine;
use crate::transport::UdpTransport;
use crate::web::server_page::ServerPage;
use crate::web::WebListener;

/// What `netjam server` asked for, with its socket, key, page and directory opened.
#[allow(missing_debug_implementations)] // the directory's connection
pub struct Serve {
    pub socket: UdpTransport,
    pub config: ServerConfig,
    pub shell: ShellConfig,
    /// Where the server's key is kept, as said at start.
    pub key_path: PathBuf,
    /// Rooms shared through this directory, this server known to it by the address given.
    pub directory: Option<(RedisDirectory, String)>,
    pub region: String,
    /// Where OSC queries are answered.
    pub osc: Option<SocketAddr>,
    /// The server's page, its address already taken.
    pub web: Option<WebListener>,
    /// Stop after this many seconds.
    pub duration_s: Option<f64>,
    pub stats_json: Option<PathBuf>,
}

/// Serves until Ctrl-C, the duration, or the server stops; then says its figures and
/// writes the report.
pub fn serve(a: Serve) -> anyhow::Result<()> {
    // Ctrl-C from here on stops the server cleanly, with its report: a player (or a test)
    // that interrupts it as soon as it says where it serves must not kill it unreported.
    let stop = interrupt_flag();
    let Serve {
        socket,
        config,
        shell,
        ..
    } = a;
    let local = socket.local_addr()?;
    let (handle, directory) = match a.directory {
        Some((redis, me)) => {
            let url = redis.url().to_owned();
            let (thread, link) = DirectoryThread::spawn(redis, me.clone(), a.region.clone(), Some(local))?;
            let handle = server::spawn_with_directory(socket, config, shell, link)?;
            eprintln!(
                "netjam: sharing rooms through the directory at {url} as {me} (leases of {} s, renewed every {} s)",
                LEASE.as_secs(),
                RENEW_EVERY.as_secs()
            );
            (handle, Some(thread))
        }
        None => (server::spawn_on(socket, config, shell, None)?, None),
    };
    eprintln!(
        "netjam: serving rooms on {} (UDP; control and audio on one port). Players join with: netjam jam --server HOST:{} --room NAME --name YOU",
        handle.local,
        handle.local.port()
    );
    eprintln!(
        "netjam: this server's key is {} (kept in {}); players pin it on their first join and are shown it",
        handle.fingerprint,
        a.key_path.display()
    );
    let osc = match a.osc {
        Some(bind) => {
            let control = ServerControl::spawn(bind, handle.reader())?;
            eprintln!(
                "netjam: OSC queries on {} (/stats, /rooms, /members, /delay; '/_meta ,s PATH' describes an address)",
                control.local_addr()
            );
            Some(control)
        }
        None => None,
    };
    let page = match a.web {
        Some(listener) => {
            let (url, note) = (listener.url(), web_note(&listener));
            let page =
                ServerPage::start(listener, handle.reader()).map_err(|e| anyhow::anyhow!("--web: {e}"))?;
            eprintln!("netjam: the server's page: {url} ({note})");
            Some(page)
        }
        None => None,
    };
    let deadline = a
        .duration_s
        .map(|d| std::time::Instant::now() + Duration::from_secs_f64(d));
    let mut status = StatusLine::new();
    let mut last = handle.report();
    let mut roster = String::new();
    let mut directory_told = true;
    let mut lost_told = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed)
        && !handle.is_finished()
        && deadline.map_or(true, |d| std::time::Instant::now() < d)
    {
        std::thread::sleep(Duration::from_millis(500));
        let r = handle.report();
        let now_roster = roster_text(&r);
        if now_roster != roster {
            status.finish();
            eprintln!("netjam: {now_roster}");
            roster = now_roster;
        }
        if let Some(d) = &directory {
            let st = d.status();
            if st.reachable != directory_told {
                directory_told = st.reachable;
                status.finish();
                if st.reachable {
                    eprintln!(
                        "netjam: the room directory at {} answers again: new rooms are opened again",
                        st.url
                    );
                } else {
                    eprintln!(
                        "netjam: lost the room directory at {} ({}): rooms playing here go on; new rooms are refused until it answers",
                        st.url,
                        st.error.as_deref().unwrap_or("no answer")
                    );
                }
            }
            for (room, holder) in st.lost.iter().skip(lost_told) {
                status.finish();
                eprintln!(
                    "netjam: room {room:?} is now claimed by {holder} (this server's lease ran out): its players here are sent there"
                );
            }
            lost_told = st.lost.len();
        }
        status.show(&line(&r, &last));
        last = r;
    }
    status.finish();
    if let Some(c) = osc {
        c.shutdown();
    }
    if let Some(p) = page {
        let w = p.stop();
        eprintln!(
            "netjam: page: loaded {} times, {} updates sent, {} requests refused",
            w.page_loads, w.messages_sent, w.refused
        );
    }
    let r = handle.stop()?;
    if let Some(d) = directory {
        let st = d.stop();
        eprintln!(
            "netjam: directory: {} calls to Redis in {:.0} s ({:.1}/s) for up to {} rooms held; {} rooms claimed here, {} redirected elsewhere, {} refused without Redis",
            st.ops,
            st.uptime_s,
            st.ops as f64 / st.uptime_s.max(1e-3),
            st.rooms_held_max,
            st.claimed,
            st.elsewhere,
            st.unavailable
        );
    }
    eprintln!(
        "netjam: forwarded {} copies of {} datagrams; {} joins, {} rejoins, {} refused, {} timed out; time inside the server p50 {:.0} µs, p99 {:.0} µs, p99.9 {:.0} µs",
        r.shell.sent,
        r.shell.received,
        r.server.joins,
        r.server.rejoins,
        r.server.refused,
        r.server.timeouts,
        r.delay.p50_us,
        r.delay.p99_us,
        r.delay.p999_us
    );
    if let Some(path) = &a.stats_json {
        write_json(path, &r)?;
    }
    Ok(())
}

fn line(r: &ServerReport, last: &ServerReport) -> String {
    let dt = (r.uptime_s - last.uptime_s).max(1e-3);
    let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / dt;
    let dropped = |r: &ServerReport| {
        r.members
            .iter()
            .map(|m| m.policed_drops + m.forged_drops + m.queue_drops)
            .sum::<u64>()
            + r.server.unknown_source
    };
    format!(
        "rooms {}  members {}  in {:.0}/s  out {:.0}/s  dropped {}  inside p99 {:.0} µs",
        r.server.rooms,
        r.server.members,
        rate(r.shell.received, last.shell.received),
        rate(r.shell.sent, last.shell.sent),
        dropped(r),
        r.delay.p99_us,
    )
}

/// "room band: ana, bo, cy; room duo: ..." or "no one is here".
fn roster_text(r: &ServerReport) -> String {
    let mut rooms: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for m in &r.members {
        rooms.entry(&m.room).or_default().push(&m.name);
    }
    if rooms.is_empty() {
        return "no one is here".into();
    }
    rooms
        .iter()
        .map(|(room, names)| format!("room {room}: {}", names.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// How the page's URL is to be used, said next to it.
fn web_note(l: &WebListener) -> &'static str {
    match (l.access().token().is_some(), l.local_addr().ip().is_unspecified()) {
        (false, _) => "read-only; this machine only",
        (true, false) => "read-only; anyone with this URL can read it: share it only with who runs the server",
        (true, true) => "read-only; from elsewhere use this machine's address with the same token; share it only with who runs the server",
    }
}
