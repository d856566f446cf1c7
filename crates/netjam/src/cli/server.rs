//! `netjam server`: the rooms server. Flags, the live status line and the summary; the
//! forwarding itself is [`crate::server`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use netjam_engine::room::ServerConfig;

use crate::cli::common::check_outputs;
use crate::control::server::ServerControl;
use crate::room_directory::{DirectoryThread, OpenError, LEASE, RENEW_EVERY};
use crate::server::{self, ServerReport, ShellConfig, DEFAULT_PORT};
use crate::session::interrupt_flag;
use crate::shell::write_json;
use crate::status::StatusLine;
use crate::web::server_page::{self, ServerPage};
use crate::web::{WebError, WebListener};

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address and UDP port to serve rooms on (control and media share it).
    #[arg(long, help_heading = SERVE, default_value_t = SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)))]
    pub listen: SocketAddr,
    /// Most players in one room (ensemble members without audio, e.g. `netjam ensemble
    /// join --server` or `jam --ensemble`'s seat, have a limit of their own: 32).
    #[arg(long, help_heading = LIMITS, default_value_t = 16, value_parser = clap::value_parser!(u16).range(2..=64))]
    pub max_members_per_room: u16,
    /// Most rooms on this server.
    #[arg(long, help_heading = LIMITS, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_rooms: u32,
    /// Highest media rate a member may declare, in packets per second.
    #[arg(long, help_heading = LIMITS, default_value_t = 4000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_packet_rate: u32,
    /// Stop after this many seconds (default: run until interrupted).
    #[arg(long, help_heading = REPORTS)]
    pub duration: Option<f64>,
    /// Write the final report (server, members, time inside the server) as JSON.
    #[arg(long, help_heading = REPORTS)]
    pub stats_json: Option<PathBuf>,
    /// Answer OSC queries on this UDP port (0: any free port): /stats (JSON), /rooms,
    /// /members, /delay; `/_meta ,s PATH` describes each address. Read-only.
    #[arg(long, help_heading = REPORTS, value_name = "PORT")]
    pub osc: Option<u16>,
    /// The address OSC queries are answered on (default: this machine only).
    #[arg(long, help_heading = REPORTS, value_name = "ADDR", default_value = "127.0.0.1", requires = "osc")]
    pub osc_bind: std::net::IpAddr,
    /// Share rooms with other servers through this Redis (redis://HOST:PORT): each room
    /// lives on one server, and a join for a room another server hosts is redirected there.
    /// Claims are leases of 5 s, renewed every second.
    #[arg(long, help_heading = SERVE, value_name = "URL")]
    pub directory: Option<String>,
    /// The address players reach this server at, as the directory tells other servers
    /// (HOST:PORT; HOST alone takes the port listened on). Default: the --listen address,
    /// unless that is a wildcard (0.0.0.0, ::).
    #[arg(long, help_heading = SERVE, value_name = "HOST:PORT", requires = "directory")]
    pub advertise: Option<String>,
    /// A label for where this server is (e.g. eu-west), shown with its public rooms in
    /// `netjam rooms`.
    #[arg(long, help_heading = SERVE, value_name = "LABEL", default_value = "")]
    pub region: String,
    /// Serve a read-only page of the rooms, their members and the server's figures, for a
    /// browser, on ADDR:PORT (alone: 127.0.0.1:4465; port 0: any free port). A loopback
    /// address serves this machine only; any other needs the token printed with the URL.
    #[arg(long, help_heading = REPORTS, value_name = "ADDR:PORT", num_args = 0..=1, default_missing_value = server_page::DEFAULT_ADDR)]
    pub web: Option<SocketAddr>,
    /// The file of this server's static key, which players pin on first join (made there
    /// on first start, readable by its owner only). Default:
    /// ~/.local/state/netjam/server.key. Keep it: a server with a new key is refused by
    /// every player who pinned the old one.
    #[arg(long, help_heading = SERVE, value_name = "FILE")]
    pub key: Option<PathBuf>,
}

/// `server --help`'s headings.
const SERVE: &str = "Where to serve";
const LIMITS: &str = "Limits";
const REPORTS: &str = "Control and reports";

/// Binds the page's address, saying what to do when it cannot be had.
pub(crate) fn bind_web(addr: SocketAddr) -> anyhow::Result<WebListener> {
    WebListener::bind(addr).map_err(|e| match e {
        WebError::InUse { .. } => anyhow::anyhow!(
            "--web {addr}: {e}: pick another port (--web {}:0 takes any free one)",
            addr.ip()
        ),
        WebError::NotHere { .. } => anyhow::anyhow!(
            "--web {addr}: {e}: give one of its addresses, 0.0.0.0 for all of them, or 127.0.0.1 for this machine only"
        ),
        e => anyhow::anyhow!("--web {addr}: {e}"),
    })
}

/// How the page's URL is to be used, said next to it.
fn web_note(l: &WebListener) -> &'static str {
    match (l.access().token().is_some(), l.local_addr().ip().is_unspecified()) {
        (false, _) => "read-only; this machine only",
        (true, false) => "read-only; anyone with this URL can read it: share it only with who runs the server",
        (true, true) => "read-only; from elsewhere use this machine's address with the same token; share it only with who runs the server",
    }
}

/// What the directory knows this server as: `--advertise` (its port defaulting to the
/// port listened on), or the listen address when it is not a wildcard.
fn advertised(advertise: Option<&str>, local: SocketAddr) -> anyhow::Result<String> {
    use netjam_engine::room::msg::MAX_SERVER_LEN;
    let text = match advertise {
        None if local.ip().is_unspecified() => anyhow::bail!(
            "--directory needs --advertise HOST:PORT, the address players reach this server at: it listens on {local}, which names no one address"
        ),
        None => local.to_string(),
        Some(a) => {
            let a = a.trim();
            if a.is_empty() || a.starts_with(':') {
                anyhow::bail!("--advertise {a:?} names no host: write HOST:PORT (e.g. rooms.example.org:{DEFAULT_PORT})");
            }
            let (host, port) = match a.rsplit_once(':') {
                // "host:port", "[v6]:port"; a bare IPv6 address has colons but no brackets.
                Some((h, p)) if !h.is_empty() && (a.starts_with('[') || !h.contains(':')) => {
                    let port: u16 = p
                        .parse()
                        .map_err(|_| anyhow::anyhow!("--advertise {a:?}: {p:?} is not a port (1..=65535)"))?;
                    (h.to_owned(), port)
                }
                _ if a.contains(':') && !a.starts_with('[') => (format!("[{a}]"), local.port()),
                _ => (a.to_owned(), local.port()),
            };
            if host.is_empty() || port == 0 || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
                anyhow::bail!("--advertise {a:?} is not HOST:PORT (e.g. rooms.example.org:{DEFAULT_PORT})");
            }
            format!("{host}:{port}")
        }
    };
    if text.len() > MAX_SERVER_LEN {
        anyhow::bail!("--advertise is longer than {MAX_SERVER_LEN} bytes");
    }
    Ok(text)
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

pub fn run(a: ServerArgs) -> anyhow::Result<()> {
    check_outputs([(a.stats_json.as_deref(), "--stats-json")])?;
    if let Some(d) = a.duration {
        if !(d.is_finite() && d > 0.0) {
            anyhow::bail!("--duration must be a positive number of seconds");
        }
    }
    if a.region.len() > netjam_engine::room::msg::MAX_NAME_LEN || a.region.chars().any(char::is_control) {
        anyhow::bail!("--region must be at most 64 printable characters");
    }
    let config = ServerConfig {
        region: a.region.clone(),
        max_members_per_room: usize::from(a.max_members_per_room),
        max_rooms: a.max_rooms as usize,
        max_packets_per_s: a.max_packet_rate,
        ..ServerConfig::default()
    };
    // A key that cannot be read or made is said before anything starts.
    let key_path = a
        .key
        .clone()
        .or_else(crate::keys::default_key_path)
        .ok_or_else(|| {
            anyhow::anyhow!("no home directory to keep the server's key in: name a file with --key")
        })?;
    let key = crate::keys::load_or_create(&key_path).context("--key")?;
    let shell = ShellConfig {
        static_key: Some(key),
        ..ShellConfig::default()
    };
    // An address the page cannot have is said before anything starts.
    let web = a.web.map(bind_web).transpose()?;
    // A directory that cannot be used is said before anything else starts.
    let redis = a
        .directory
        .as_deref()
        .map(|url| {
            crate::room_directory::RedisDirectory::open(url).map_err(|e| match e {
                OpenError::Unreachable { .. } => {
                    anyhow::anyhow!("--directory: {e} (or leave out --directory to serve rooms alone)")
                }
                OpenError::BadUrl { .. } => anyhow::anyhow!("--directory: {e}"),
            })
        })
        .transpose()?;
    // Ctrl-C from here on stops the server cleanly, with its report: a player (or a test)
    // that interrupts it as soon as it says where it serves must not kill it unreported.
    let stop = interrupt_flag();
    let socket = server::bind(a.listen)?;
    let local = socket.local_addr()?;
    let (handle, directory) = match redis {
        Some(redis) => {
            let me = advertised(a.advertise.as_deref(), local)?;
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
        key_path.display()
    );
    let osc = match a.osc {
        Some(port) => {
            let control = ServerControl::spawn(SocketAddr::new(a.osc_bind, port), handle.reader())?;
            eprintln!(
                "netjam: OSC queries on {} (/stats, /rooms, /members, /delay; '/_meta ,s PATH' describes an address)",
                control.local_addr()
            );
            Some(control)
        }
        None => None,
    };
    let page = match web {
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
        .duration
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_advertised_address_takes_the_port_listened_on_and_refuses_what_names_no_one() {
        let local: SocketAddr = "10.0.0.5:4470".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:4470".parse().unwrap();
        assert_eq!(advertised(None, local).unwrap(), "10.0.0.5:4470");
        assert!(advertised(None, any)
            .unwrap_err()
            .to_string()
            .contains("--advertise"));
        assert_eq!(
            advertised(Some("rooms.example.org"), any).unwrap(),
            "rooms.example.org:4470"
        );
        assert_eq!(
            advertised(Some("rooms.example.org:9000"), any).unwrap(),
            "rooms.example.org:9000"
        );
        assert_eq!(
            advertised(Some("[2001:db8::1]:9000"), any).unwrap(),
            "[2001:db8::1]:9000"
        );
        assert_eq!(
            advertised(Some("2001:db8::1"), any).unwrap(),
            "[2001:db8::1]:4470"
        );
        for bad in ["rooms:0", "rooms:http", ":9000", "two words:9000"] {
            assert!(advertised(Some(bad), any).is_err(), "{bad}");
        }
    }
}
