//! `netjam ensemble`: join an ensemble and print what its services receive, list its
//! members and services, send a message to a service (now or at an ensemble time), and
//! show the clock. Every command is a member while it runs, found and finding others
//! with no configuration on the local network, or through a rooms server with
//! `--server HOST` (the room named after the ensemble is the ensemble; the server is its
//! clock reference). This module only parses flags, calls the shell
//! ([`crate::ensemble`]) and prints, one line per thing, flushed, so other programs can
//! read the output live.

use std::io::Write;
use std::net::SocketAddr;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use netjam_ensemble::address::service_of;
use netjam_ensemble::auth::Secret;
use netjam_ensemble::discovery::{Discovery, DEFAULT_BASE_PORT, DEFAULT_PORTS};
use netjam_ensemble::Event;
use netjam_osc::{encode_message, message_len, Arg, Message};

use crate::ensemble::click::{seat_name, ClickAsk};
use crate::ensemble::{bind_ip, mono_ns, random_id, Node, NodeConfig, RoomReach};

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

#[derive(Debug, Subcommand)]
pub enum EnsembleCommand {
    /// Join as a member offering services; print every message they receive, one per line.
    Join(JoinArgs),
    /// List the ensemble's members and services.
    List(ListArgs),
    /// Send one message to a service, e.g. `send band /synth1/cutoff 440 --at +0.5s`.
    Send(SendArgs),
    /// Show the ensemble clock: the reference, this member's offset and error bound.
    Clock(ClockArgs),
    /// Set the ensemble's tempo: from the next beat (or bar) far enough ahead to reach
    /// every member, the same beat everywhere; with no tempo yet, from ensemble time 0.
    Tempo(TempoArgs),
}

/// Where members look for each other.
#[derive(Debug, Clone, Args)]
pub struct NetArgs {
    /// Stay on this machine: bind 127.0.0.1 and send no broadcast.
    #[arg(long)]
    pub local: bool,
    /// First UDP port of the discovery list (members bind the first free one).
    #[arg(long, default_value_t = DEFAULT_BASE_PORT)]
    pub discovery_port: u16,
    /// Ports in the discovery list (members per machine).
    #[arg(long, default_value_t = DEFAULT_PORTS)]
    pub discovery_ports: u16,
    /// This member's id in hex (default: random).
    #[arg(long, value_name = "HEX")]
    pub id: Option<String>,
    /// Reach the ensemble through this rooms server (`netjam server`, HOST or HOST:PORT,
    /// port 4464 unless given) instead of on the local network: the room is the ensemble.
    /// Several servers sharing a room directory, separated by commas, are asked in turn
    /// when the one before goes silent, as a player's are.
    #[arg(long, value_name = "HOST[:PORT][,HOST[:PORT]...]", conflicts_with = "local")]
    pub server: Option<String>,
    /// With --server: the room (default: the ensemble's name).
    #[arg(long, value_name = "NAME", requires = "server")]
    pub room: Option<String>,
    /// With --server: the room's password.
    #[arg(long, value_name = "TEXT", requires = "server", default_value = "")]
    pub password: String,
    /// The ensemble's shared secret: every datagram is sealed with an HMAC and members
    /// without the same secret are ignored. Prefer the environment variable
    /// NETJAM_ENSEMBLE_SECRET (a command line is visible to every user of the machine).
    #[arg(long, value_name = "SECRET")]
    pub secret: Option<String>,
}

/// The variable that holds the ensemble's shared secret when `--secret` is not given.
pub const SECRET_ENV: &str = "NETJAM_ENSEMBLE_SECRET";

/// The ensemble's shared secret: `given` by `flag`, else [`SECRET_ENV`], else none.
fn ensemble_secret(given: Option<&str>, flag: &str) -> anyhow::Result<Option<Secret>> {
    match given
        .map(str::to_owned)
        .or_else(|| std::env::var(SECRET_ENV).ok())
    {
        Some(s) => Ok(Some(Secret::new(s.as_bytes()).with_context(|| {
            format!("{flag} / {SECRET_ENV}: give a non-empty secret, or leave both unset")
        })?)),
        None => Ok(None),
    }
}

#[derive(Debug, Args)]
pub struct JoinArgs {
    /// Ensemble name.
    pub name: String,
    /// A service to offer (repeat for more).
    #[arg(long = "service", value_name = "NAME")]
    pub services: Vec<String>,
    /// Copy every message of service A to service B (`A:B`; repeat for more).
    #[arg(long = "tap", value_name = "A:B")]
    pub taps: Vec<String>,
    /// A plain OSC UDP port: messages sent there go to the services their addresses name;
    /// messages this member's services receive go back to whoever sent there.
    #[arg(long, value_name = "ADDR:PORT")]
    pub osc_bridge: Option<SocketAddr>,
    /// A WebSocket port (ws://ADDR:PORT/) for web pages: each binary frame is one OSC
    /// packet, routed like the OSC bridge's; messages this member's services receive go
    /// to every connected page. Text frames are refused.
    #[arg(long = "ws", value_name = "ADDR:PORT")]
    pub ws_bridge: Option<SocketAddr>,
    /// With --ws: let in browsers' pages from this origin only (e.g.
    /// `http://localhost:8000`; repeat for more). Without it any web site the browser
    /// visits may connect; programs that send no Origin are always let in.
    #[arg(long = "ws-origin", value_name = "ORIGIN", requires = "ws_bridge")]
    pub ws_origins: Vec<String>,
    /// Leave after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    #[command(flatten)]
    pub net: NetArgs,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    pub name: String,
    /// How long to listen before printing, in seconds.
    #[arg(long, default_value_t = 2.0)]
    pub wait: f64,
    #[command(flatten)]
    pub net: NetArgs,
}

#[derive(Debug, Args)]
pub struct SendArgs {
    pub name: String,
    /// Address: /service/... (or !service/... for a literal address).
    pub address: String,
    /// Values: typed as i:5 f:0.5 s:text h:5 d:0.5 T F N, or untyped (an integer, a
    /// number, else a string). Flags go before the address or after the values.
    #[arg(allow_negative_numbers = true)]
    pub values: Vec<String>,
    /// Send the same message to these addresses too (same values, same time).
    #[arg(long = "also", value_name = "ADDRESS")]
    pub also: Vec<String>,
    /// When to deliver it: +0.5s / +500ms from now, or an ensemble time in seconds.
    #[arg(long)]
    pub at: Option<String>,
    /// Send best effort instead of reliably.
    #[arg(long)]
    pub best_effort: bool,
    /// Give up when the services are not found (or not acknowledged) within this many seconds.
    #[arg(long, default_value_t = 5.0)]
    pub wait: f64,
    #[command(flatten)]
    pub net: NetArgs,
}

#[derive(Debug, Args)]
pub struct ClockArgs {
    pub name: String,
    /// Print this many lines, one per --interval, then leave (default: until stopped).
    #[arg(long)]
    pub count: Option<u64>,
    /// Seconds between lines.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    #[command(flatten)]
    pub net: NetArgs,
}

#[derive(Debug, Args)]
pub struct TempoArgs {
    pub name: String,
    /// Beats per minute.
    pub bpm: f64,
    /// Start on the first beat of a bar of this many beats rather than on the next beat.
    #[arg(long, value_name = "BEATS")]
    pub bar: Option<u32>,
    /// How far ahead the change may start at the earliest, in seconds (it must reach
    /// every member before its beat).
    #[arg(long, default_value_t = 0.3)]
    pub lead: f64,
    /// Give up when the ensemble clock does not lock (or the change is not acknowledged)
    /// within this many seconds.
    #[arg(long, default_value_t = 5.0)]
    pub wait: f64,
    #[command(flatten)]
    pub net: NetArgs,
}

/// `netjam jam --ensemble NAME`: hear a click on the ensemble's shared beat.
#[derive(Debug, Clone, Args)]
pub struct JamEnsembleArgs {
    /// Join ensemble NAME (see `netjam ensemble`) and hear a click on its shared beat,
    /// mixed into what you hear: every member's click lands on the same beat. In a room
    /// (--room) NAME may be left out: the room is the ensemble, through its server.
    #[arg(long, value_name = "NAME", num_args = 0..=1, default_missing_value = "")]
    pub ensemble: Option<String>,
    /// With --ensemble: the tempo to click at if the ensemble has none yet (otherwise its
    /// own is followed; `netjam ensemble tempo NAME BPM` changes it for everyone).
    #[arg(long, value_name = "BPM", requires = "ensemble")]
    pub tempo: Option<f64>,
    /// With --ensemble: the click's level in dB below full scale.
    #[arg(long, value_name = "DB", default_value_t = -12.0, allow_negative_numbers = true, requires = "ensemble")]
    pub click_gain: f32,
    /// With --ensemble in a room (--room): the ensemble's room on the same server, if not
    /// the room itself.
    #[arg(long, value_name = "NAME", requires = "ensemble")]
    pub ensemble_room: Option<String>,
    /// With --ensemble and --peer: stay on this machine (127.0.0.1, no broadcast). In a room
    /// the ensemble goes through the rooms server.
    #[arg(long, requires = "ensemble")]
    pub ensemble_local: bool,
    /// With --ensemble and --peer: first UDP port of the ensemble's discovery list on the
    /// local network (default: 14640). In a room the ensemble goes through the rooms server.
    #[arg(long, value_name = "PORT", requires = "ensemble")]
    pub ensemble_port: Option<u16>,
    /// With --ensemble: the ensemble's shared secret, as `netjam ensemble --secret` takes
    /// it (every datagram sealed, replays refused, members without it ignored). Prefer
    /// the environment variable NETJAM_ENSEMBLE_SECRET, which is taken when this is not
    /// given (a command line is visible to every user of the machine).
    #[arg(long, value_name = "SECRET", requires = "ensemble")]
    pub ensemble_secret: Option<String>,
}

impl JamEnsembleArgs {
    /// The click these flags ask for (the secret from the environment when not given).
    pub fn ask(&self) -> anyhow::Result<ClickAsk> {
        Ok(ClickAsk {
            ensemble: self.ensemble.clone(),
            tempo: self.tempo,
            gain_db: self.click_gain,
            room: self.ensemble_room.clone(),
            local: self.ensemble_local,
            port: self.ensemble_port,
            secret: ensemble_secret(self.ensemble_secret.as_deref(), "--ensemble-secret")?,
        })
    }
}

pub fn run(cmd: EnsembleCommand) -> anyhow::Result<()> {
    match cmd {
        EnsembleCommand::Join(a) => join(a),
        EnsembleCommand::List(a) => list(a),
        EnsembleCommand::Send(a) => send(a),
        EnsembleCommand::Clock(a) => clock(a),
        EnsembleCommand::Tempo(a) => tempo(a),
    }
}

/// Send what is queued, wait up to `wait` seconds (`--wait`) until every reliable message
/// is acknowledged, then leave; fails saying how many were `not_acked` otherwise.
fn leave_when_acknowledged(node: Node, wait: f64, not_acked: &str) -> anyhow::Result<()> {
    let until = mono_ns() + secs(wait, "--wait")?;
    node.leave_when_acknowledged(until)
        .map_err(|left| anyhow::anyhow!("{left} {not_acked} within {wait} s"))
}

fn secs(s: f64, what: &str) -> anyhow::Result<u64> {
    if !(s.is_finite() && s >= 0.0) {
        bail!("{what} must be a number of seconds, not {s}");
    }
    Ok((s * S as f64) as u64)
}

fn start(
    name: &str,
    net: &NetArgs,
    services: Vec<String>,
    taps: Vec<(String, String)>,
    bridge: Option<SocketAddr>,
) -> anyhow::Result<Node> {
    let id = match &net.id {
        Some(h) => u64::from_str_radix(h.trim_start_matches("0x"), 16)
            .with_context(|| format!("--id {h:?} is not a hex number"))?,
        None => random_id()?,
    };
    let discovery = Discovery {
        base_port: net.discovery_port,
        ports: net.discovery_ports.max(1),
        broadcast: !net.local,
    };
    let room = match &net.server {
        Some(s) => Some({
            let (server, others) = super::common::resolve_servers(s)?;
            RoomReach {
                server,
                front: crate::room_client::FrontDoors::new(server, &others),
                room: net.room.clone().unwrap_or_else(|| name.to_string()),
                name: seat_name(id),
                password: net.password.clone(),
                join_timeout_ns: 5 * S,
                seat: None,
            }
        }),
        None => None,
    };
    let secret = ensemble_secret(net.secret.as_deref(), "--secret")?;
    Node::start_with(
        NodeConfig {
            ensemble: name.to_string(),
            id,
            services,
            taps,
            discovery,
            bind_ip: bind_ip(net.local),
            osc_bridge: bridge,
            room,
        },
        secret,
    )
}

/// A member's address as shown: `via-server:ID` for one reached through the rooms server.
fn shown_addr(a: SocketAddr) -> String {
    match crate::ensemble::relayed_member(&a) {
        Some(id) => format!("via-server:{id}"),
        None => a.to_string(),
    }
}

/// A clock reference as shown: `server` for the rooms server.
fn shown_reference(r: u64) -> String {
    if r == netjam_ensemble::SERVER_REFERENCE {
        "server".into()
    } else {
        format!("{r:016x}")
    }
}

fn out(line: std::fmt::Arguments<'_>) {
    let mut o = std::io::stdout().lock();
    let _ = o.write_fmt(line);
    let _ = o.write_all(b"\n");
    let _ = o.flush();
}

fn ens_s(ns: u64) -> String {
    format!("{}.{:09}", ns / S, ns % S)
}

fn format_args_of(m: &Message<'_>) -> String {
    let mut s = String::new();
    for a in m.args() {
        if !s.is_empty() {
            s.push(' ');
        }
        match a {
            Arg::Int(v) => s += &format!("i:{v}"),
            Arg::Float(v) => s += &format!("f:{v}"),
            Arg::Str(v) | Arg::Symbol(v) => s += &format!("s:{v}"),
            Arg::Long(v) => s += &format!("h:{v}"),
            Arg::Double(v) => s += &format!("d:{v}"),
            Arg::True => s += "T",
            Arg::False => s += "F",
            Arg::Nil => s += "N",
            other => s += &format!("{other:?}"),
        }
    }
    s
}

fn print_event(node: &Node, ev: &Event) {
    match ev {
        Event::Message(d) => {
            let mono = mono_ns();
            let Ok(m) = Message::decode(&d.bytes) else { return };
            let at = if d.time_ns == 0 {
                "now".to_string()
            } else {
                ens_s(d.time_ns)
            };
            let ens = d.delivered_ns.map(ens_s).unwrap_or_else(|| "-".into());
            out(format_args!(
                "msg ens={ens} at={at} mono={mono} from={:016x} service={} {} {}{}",
                d.from,
                d.service,
                m.address(),
                format_args_of(&m),
                if d.tap_copy { " (tap)" } else { "" }
            ));
        }
        Event::MemberJoined { id } => out(format_args!("joined {id:016x}")),
        Event::MemberLeft {
            id,
            services,
            timed_out,
        } => out(format_args!(
            "left {id:016x} {} services={}",
            if *timed_out { "timed-out" } else { "bye" },
            services.join(",")
        )),
        Event::ServicesChanged => {
            let rows = node.member_ref().table().services();
            let list: Vec<String> = rows
                .iter()
                .map(|r| format!("{}@{:016x}", r.service, r.provider))
                .collect();
            out(format_args!("services {}", list.join(" ")));
        }
        Event::ClockLocked { reference } => out(format_args!("clock-locked {}", shown_reference(*reference))),
        Event::Tempo(t) => out(format_args!(
            "tempo bpm={} beat={} from={} by={:016x}",
            t.bpm,
            t.start_beat,
            ens_s(t.start_ns),
            t.by
        )),
        Event::ClockReference { id } => match id {
            Some(id) => out(format_args!("clock-reference {}", shown_reference(*id))),
            None => out(format_args!("clock-reference none")),
        },
    }
}

fn stop_flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let _ = ctrlc::set_handler(move || s.store(true, std::sync::atomic::Ordering::Relaxed));
    stop
}

fn join(a: JoinArgs) -> anyhow::Result<()> {
    let mut taps = Vec::new();
    for t in &a.taps {
        let Some((x, y)) = t.split_once(':') else {
            bail!("--tap {t:?}: give it as TAPPEE:TAPPER, e.g. synth1:log");
        };
        taps.push((x.to_string(), y.to_string()));
    }
    let mut node = start(&a.name, &a.net, a.services.clone(), taps, a.osc_bridge)?;
    out(format_args!(
        "member {:016x} on {} in ensemble {} services={}",
        node.member_ref().id(),
        node.local_addr(),
        a.name,
        a.services.join(",")
    ));
    if let Some(b) = node.bridge_addr() {
        out(format_args!("osc-bridge {b}"));
    }
    if let Some(addr) = a.ws_bridge {
        let at = node.start_ws_bridge(addr, a.ws_origins.clone())?;
        out(format_args!("ws-bridge {at}"));
    }
    let mut ws_seen = node.ws_stats();
    let deadline = a
        .duration
        .map(|d| secs(d, "--duration"))
        .transpose()?
        .map(|d| mono_ns() + d);
    let stop = stop_flag();
    // Wake at least every 200 ms to notice Ctrl-C.
    loop {
        let slice = mono_ns() + 200 * MS;
        let until = deadline.map_or(slice, |d| d.min(slice));
        node.run(Some(until), |n, ev| {
            print_event(n, &ev);
            true
        });
        let ws = node.ws_stats();
        if ws != ws_seen {
            if let Some(st) = ws {
                out(format_args!(
                    "ws-bridge-stats {}",
                    serde_json::to_string(&st).unwrap_or_default()
                ));
            }
            ws_seen = ws;
        }
        if stop.load(std::sync::atomic::Ordering::Relaxed) || deadline.is_some_and(|d| mono_ns() >= d) {
            break;
        }
    }
    node.leave();
    Ok(())
}

fn list(a: ListArgs) -> anyhow::Result<()> {
    let mut node = start(&a.name, &a.net, Vec::new(), Vec::new(), None)?;
    let me = node.member_ref().id();
    let until = mono_ns() + secs(a.wait, "--wait")?;
    node.run(Some(until), |_, _| true);
    let m = node.member_ref();
    let reference = m.reference();
    let mut members: Vec<_> = m.table().members().filter(|x| x.id != me).collect();
    members.sort_by_key(|x| x.id);
    out(format_args!("members {}", members.len()));
    if reference == Some(netjam_ensemble::SERVER_REFERENCE) {
        out(format_args!("clock-reference server"));
    }
    for x in members {
        out(format_args!(
            "member {:016x} {} services={}{}",
            x.id,
            x.addr.map(shown_addr).unwrap_or_default(),
            x.list.services.join(","),
            if reference == Some(x.id) {
                " clock-reference"
            } else {
                ""
            }
        ));
    }
    if let Some(ens) = m.ensemble_time(mono_ns()) {
        if let (Some(seg), Some(beat)) = (m.tempo().at(ens), m.tempo().beat_at(ens)) {
            out(format_args!(
                "tempo bpm={} beat={beat:.3} at={}",
                seg.bpm,
                ens_s(ens)
            ));
        }
    }
    for r in m.table().services() {
        let others: Vec<String> = r
            .offered_by
            .iter()
            .filter(|i| **i != r.provider)
            .map(|i| format!("{i:016x}"))
            .collect();
        out(format_args!(
            "service {} provider={:016x}{}{}",
            r.service,
            r.provider,
            if others.is_empty() {
                String::new()
            } else {
                format!(" also={}", others.join(","))
            },
            if r.tapped_by.is_empty() {
                String::new()
            } else {
                format!(" tapped-by={}", r.tapped_by.join(","))
            }
        ));
    }
    node.leave();
    Ok(())
}

fn parse_value(v: &str) -> Arg<'_> {
    if let Some((t, x)) = v.split_once(':') {
        match t {
            "i" => {
                if let Ok(n) = x.parse() {
                    return Arg::Int(n);
                }
            }
            "f" => {
                if let Ok(n) = x.parse() {
                    return Arg::Float(n);
                }
            }
            "h" => {
                if let Ok(n) = x.parse() {
                    return Arg::Long(n);
                }
            }
            "d" => {
                if let Ok(n) = x.parse() {
                    return Arg::Double(n);
                }
            }
            "s" => return Arg::Str(x),
            _ => {}
        }
    }
    match v {
        "T" => Arg::True,
        "F" => Arg::False,
        "N" => Arg::Nil,
        _ => {
            if let Ok(n) = v.parse::<i32>() {
                Arg::Int(n)
            } else if let Ok(f) = v.parse::<f32>() {
                Arg::Float(f)
            } else {
                Arg::Str(v)
            }
        }
    }
}

/// `+0.5s`, `+500ms`, `+0.5` (relative, seconds) or `12.5` (absolute ensemble seconds).
fn parse_at(at: &str, ens_now: u64) -> anyhow::Result<u64> {
    let bad = || format!("--at {at:?}: give +0.5s, +500ms or an ensemble time in seconds");
    if let Some(rel) = at.strip_prefix('+') {
        let (num, scale) = if let Some(x) = rel.strip_suffix("ms") {
            (x, 1e-3)
        } else if let Some(x) = rel.strip_suffix('s') {
            (x, 1.0)
        } else {
            (rel, 1.0)
        };
        let v: f64 = num.parse().with_context(bad)?;
        return Ok(ens_now + secs(v * scale, "--at")?);
    }
    let v: f64 = at.parse().with_context(bad)?;
    secs(v, "--at")
}

fn send(a: SendArgs) -> anyhow::Result<()> {
    let mut addresses = vec![a.address.clone()];
    addresses.extend(a.also.iter().cloned());
    let mut services = Vec::new();
    for addr in &addresses {
        let (s, _) = service_of(addr).with_context(|| format!("cannot send to {addr:?}"))?;
        services.push(s.to_string());
    }
    let args: Vec<Arg<'_>> = a.values.iter().map(|v| parse_value(v)).collect();
    let mut messages = Vec::new();
    for addr in &addresses {
        let mut buf = vec![0u8; message_len(addr, &args)];
        let n = encode_message(&mut buf, addr, &args)
            .with_context(|| format!("cannot encode a message to {addr:?}"))?;
        buf.truncate(n);
        messages.push(buf);
    }
    let mut node = start(&a.name, &a.net, Vec::new(), Vec::new(), None)?;
    let give_up = mono_ns() + secs(a.wait, "--wait")?;
    let need_clock = a.at.is_some();
    node.run(Some(give_up), |n, _| {
        !(n.missing(&services).is_empty() && (!need_clock || n.synced()))
    });
    // Also check before the first event (the table may be complete already).
    let missing = node.missing(&services);
    if !missing.is_empty() {
        bail!(
            "no member of ensemble {:?} offers {:?} (waited {} s): is a member running with --service, on this network and discovery ports, and with the same --secret / {SECRET_ENV} if the ensemble has one?",
            a.name,
            missing,
            a.wait
        );
    }
    if need_clock && !node.run_until_synced(give_up) {
        bail!(
            "the ensemble clock did not lock within {} s; try a longer --wait",
            a.wait
        );
    }
    let now = mono_ns();
    let time = match &a.at {
        Some(at) => {
            let ens = node
                .member_ref()
                .ensemble_time(now)
                .context("no ensemble time yet")?;
            parse_at(at, ens)?
        }
        None => 0,
    };
    for (addr, m) in addresses.iter().zip(&messages) {
        let to = node
            .member()
            .send(now, m, time, !a.best_effort)
            .with_context(|| format!("cannot send to {addr}"))?;
        out(format_args!(
            "sent {addr} to={to:016x} at={}",
            if time == 0 { "now".to_string() } else { ens_s(time) }
        ));
    }
    leave_when_acknowledged(node, a.wait, "message(s) not acknowledged")
}

fn clock(a: ClockArgs) -> anyhow::Result<()> {
    let mut node = start(&a.name, &a.net, Vec::new(), Vec::new(), None)?;
    let step = secs(a.interval, "--interval")?.max(MS);
    let stop = stop_flag();
    let mut next = mono_ns() + step;
    let mut printed = 0u64;
    while a.count.map_or(true, |c| printed < c) && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        node.run(Some(next), |_, _| true);
        next += step;
        let now = mono_ns();
        let m = node.member_ref();
        let ens = m.ensemble_time(now).map(ens_s).unwrap_or_else(|| "-".into());
        let reference = m
            .reference()
            .map(shown_reference)
            .unwrap_or_else(|| "none".into());
        match m.clock_stats() {
            Some(st) if m.reference() != Some(m.id()) => out(format_args!(
                "clock reference={reference} ensemble={ens} offset_ms={:.3} error_bound_ms={:.3} min_rtt_ms={:.3} rate_ppm={:.1} locked={} exchanges={}",
                st.offset_ns as f64 / 1e6,
                st.error_bound_ns as f64 / 1e6,
                st.min_rtt_ns as f64 / 1e6,
                st.rate_ppm,
                st.locked,
                st.exchanges
            )),
            _ => out(format_args!("clock reference={reference} ensemble={ens} (this member)")),
        }
        printed += 1;
    }
    node.leave();
    Ok(())
}

fn tempo(a: TempoArgs) -> anyhow::Result<()> {
    if a.bar == Some(0) {
        bail!("--bar 0: a bar has at least one beat");
    }
    let mut node = start(&a.name, &a.net, Vec::new(), Vec::new(), None)?;
    let give_up = mono_ns() + secs(a.wait, "--wait")?;
    // Wait for the clock, then one more hello round so every member is known (and has
    // sent the beat it holds) before planning the change.
    if !node.run_until_synced(give_up) {
        bail!(
            "the clock of ensemble {:?} did not lock within {} s: is a member running (netjam ensemble join {}), on this network and discovery ports? Or try a longer --wait",
            a.name,
            a.wait,
            a.name
        );
    }
    node.run(Some(mono_ns() + 600 * MS), |_, _| true);
    let now = mono_ns();
    let seg = node
        .member()
        .set_tempo(now, a.bpm, secs(a.lead, "--lead")?, a.bar)
        .context("cannot set the tempo")?;
    out(format_args!(
        "tempo bpm={} beat={} from={} to {} member(s)",
        seg.bpm,
        seg.start_beat,
        ens_s(seg.start_ns),
        node.member_ref().table().len().saturating_sub(1)
    ));
    leave_when_acknowledged(node, a.wait, "member(s) did not acknowledge the tempo")
}
