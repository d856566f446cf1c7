//! `netjam server`: the rooms server's flags, and what they name opened before anything
//! starts (its key, its page's address, the room directory, its socket), so a bad one is
//! said first; it runs in [`crate::serve`], the forwarding itself in [`crate::server`].

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use netjam_engine::room::ServerConfig;

use crate::cli::common::check_outputs;
use crate::room_directory::OpenError;
use crate::serve::Serve;
use crate::server::{self, ShellConfig, DEFAULT_PORT};
use crate::web::server_page;
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
    let socket = server::bind(a.listen)?;
    let local = socket.local_addr()?;
    let directory = match redis {
        Some(redis) => Some((redis, advertised(a.advertise.as_deref(), local)?)),
        None => None,
    };
    crate::serve::serve(Serve {
        socket,
        config,
        shell,
        key_path,
        directory,
        region: a.region,
        osc: a.osc.map(|port| SocketAddr::new(a.osc_bind, port)),
        web,
        duration_s: a.duration,
        stats_json: a.stats_json,
    })
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
