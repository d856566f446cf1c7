//! `netjam server`: the rooms server. Flags, the live status line and the summary; the
//! forwarding itself is [`crate::server`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use netjam_engine::room::ServerConfig;

use crate::cli::common::check_outputs;
use crate::cli::stream::write_json;
use crate::control::server::ServerControl;
use crate::server::{self, ServerReport, DEFAULT_PORT};
use crate::session::interrupt_flag;
use crate::status::StatusLine;

#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address and UDP port to serve rooms on (control and media share it).
    #[arg(long, default_value_t = SocketAddr::from(([0, 0, 0, 0], DEFAULT_PORT)))]
    pub listen: SocketAddr,
    /// Most players in one room (ensemble members without audio, e.g. `netjam ensemble
    /// join --server` or `jam --ensemble`'s seat, have a limit of their own: 32).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(2..=64))]
    pub max_members_per_room: u16,
    /// Most rooms on this server.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_rooms: u32,
    /// Highest media rate a member may declare, in packets per second.
    #[arg(long, default_value_t = 4000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_packet_rate: u32,
    /// Stop after this many seconds (default: run until interrupted).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Write the final report (server, members, time inside the server) as JSON.
    #[arg(long)]
    pub stats_json: Option<PathBuf>,
    /// Answer OSC queries on this UDP port (0: any free port): /stats (JSON), /rooms,
    /// /members, /delay; `/_meta ,s PATH` describes each address. Read-only.
    #[arg(long, value_name = "PORT")]
    pub osc: Option<u16>,
    /// The address OSC queries are answered on (default: this machine only).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1", requires = "osc")]
    pub osc_bind: std::net::IpAddr,
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
    let config = ServerConfig {
        max_members_per_room: usize::from(a.max_members_per_room),
        max_rooms: a.max_rooms as usize,
        max_packets_per_s: a.max_packet_rate,
        ..ServerConfig::default()
    };
    let handle = server::spawn(a.listen, config)?;
    eprintln!(
        "netjam: serving rooms on {} (UDP; control and audio on one port). Players join with: netjam jam --server HOST:{} --room NAME --name YOU",
        handle.local,
        handle.local.port()
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
    let stop = interrupt_flag();
    let deadline = a
        .duration
        .map(|d| std::time::Instant::now() + Duration::from_secs_f64(d));
    let mut status = StatusLine::new();
    let mut last = handle.report();
    let mut roster = String::new();
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
        status.show(&line(&r, &last));
        last = r;
    }
    status.finish();
    if let Some(c) = osc {
        c.shutdown();
    }
    let r = handle.stop()?;
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
