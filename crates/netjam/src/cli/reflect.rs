//! `netjam reflect`: the flags, the status line and the summary around
//! [`crate::probe::reflect::serve`], which echoes audio and probe packets back to their
//! sender.

use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use anyhow::Context;
use clap::Args;
use netjam_engine::probe::{ProbeKey, Reflector, ReflectorConfig, ReflectorStats};

use crate::clock;
use crate::probe::reflect::{random_bytes, serve};
use crate::transport::{TimestampSource, UdpTransport};

#[derive(Debug, Args)]
pub struct ReflectArgs {
    /// Address and port to answer on.
    #[arg(long, default_value = "0.0.0.0:4464")]
    pub listen: SocketAddr,
    /// Answer only senders that know this shared secret (HMAC-SHA256).
    #[arg(long)]
    pub secret: Option<String>,
    /// Replies per second to one source (probes, and echoed RTP, each).
    #[arg(long = "rate-limit", default_value_t = 20_000)]
    pub rate_limit: u32,
    /// Stop after this many seconds (default: run until interrupted).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Write the final counters as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

fn status_line(s: &ReflectorStats) -> String {
    let dropped = s.malformed
        + s.bad_tag
        + s.bad_token
        + s.replayed
        + s.rate_limited
        + s.unexpected
        + s.unauthenticated
        + s.other;
    format!(
        "sessions {}  probes {}  hellos {}  rtp echoed {}  rtcp echoed {}  dropped {} (bad token {}, bad tag {}, replayed {}, \
         rate-limited {}, malformed {})",
        s.sessions,
        s.probes_answered,
        s.hellos_answered,
        s.rtp_echoed,
        s.rtcp_echoed,
        dropped,
        s.bad_token,
        s.bad_tag,
        s.replayed,
        s.rate_limited,
        s.malformed
    )
}

pub fn run(a: ReflectArgs) -> anyhow::Result<()> {
    super::common::check_outputs([(a.json.as_deref(), "--json")])?;
    let transport = UdpTransport::bind(a.listen)
        .with_context(|| format!("cannot listen on {}; is the port already in use?", a.listen))?;
    let config = ReflectorConfig {
        rate_limit_pps: a.rate_limit,
        ..ReflectorConfig::default()
    };
    let key = a.secret.as_deref().map(|s| ProbeKey::new(s.as_bytes()));
    let mut reflector = Reflector::new(config, random_bytes(), key);
    let deadline = a.duration.map(|d| clock::now_ns() + (d.max(0.0) * 1e9) as u64);
    let live = std::io::stderr().is_terminal();
    eprintln!(
        "netjam reflect: answering probes and echoing RTP on {} (timestamps: {}, {}, rate limit {}/s per source)",
        transport.local_addr()?,
        match transport.timestamp_source() {
            TimestampSource::Kernel => "kernel",
            TimestampSource::Monotonic => "monotonic",
        },
        if a.secret.is_some() { "shared secret required" } else { "open" },
        a.rate_limit
    );
    let stop = AtomicBool::new(false);
    let stats = serve(&transport, &mut reflector, &stop, deadline, |s| {
        if live {
            let mut e = std::io::stderr();
            let _ = write!(e, "\r\x1b[2K{}", status_line(s));
            let _ = e.flush();
        }
    })?;
    if live {
        eprintln!();
    }
    eprintln!("netjam reflect: {}", status_line(&stats));
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&stats)?;
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
