//! `netjam osc send` and `netjam osc dump`: a thin command-line shell around
//! `netjam_osc` for talking to SuperCollider, Pd, TouchOSC, liblo and python-osc.
//!
//! Sending encodes one message and writes it over UDP or TCP (length-prefix or SLIP
//! framing). Dumping prints one line per received message and flushes it, so other
//! programs can read the output live. This module must never hold protocol logic of its
//! own: parsing, validation and framing live in the library.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use netjam_osc::transport::{frame, Framing, StreamDecoder};
use netjam_osc::{encode_message, Arg, BundleWriter, Message, Packet, TimeTag};

#[derive(Debug, Subcommand)]
pub enum OscCommand {
    /// Send one OSC message, e.g. `netjam osc send 127.0.0.1:57120 /synth/freq f 440`.
    Send(SendArgs),
    /// Print every OSC message received, one line each: address, type tags, values.
    Dump(DumpArgs),
}

#[derive(Debug, Args)]
pub struct SendArgs {
    /// Where to send, as HOST:PORT.
    pub target: String,
    /// OSC address, e.g. /synth/voice3/freq (or !synth/voice3/freq for a literal address).
    pub address: String,
    /// Type tags, one per value: i f s b h t d S c r m T F N I [ ] (e.g. "sif").
    pub types: Option<String>,
    /// Values, one per data-carrying type tag. Blobs, colours (r) and MIDI (m) are hex;
    /// time tags (t) are "now", "immediately", UNIX seconds or NTP hex "SSSSSSSS.FFFFFFFF".
    #[arg(allow_hyphen_values = true)]
    pub values: Vec<String>,
    /// Send over TCP with OSC 1.0 length-prefix framing.
    #[arg(long)]
    pub tcp: bool,
    /// Send over TCP with OSC 1.1 SLIP framing (implies --tcp).
    #[arg(long)]
    pub slip: bool,
    /// Wrap the message in a bundle with this time tag ("now", "immediately", UNIX
    /// seconds or NTP hex SSSSSSSS.FFFFFFFF).
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
}

#[derive(Debug, Args)]
pub struct DumpArgs {
    /// Address and port to listen on (port 0 picks a free one; the chosen address is
    /// printed on stderr).
    #[arg(long, default_value = "0.0.0.0:9000")]
    pub listen: String,
    /// Listen on TCP instead of UDP; the framing (length prefix or SLIP) is detected per
    /// connection.
    #[arg(long)]
    pub tcp: bool,
    /// With --tcp, expect SLIP framing instead of detecting it (implies --tcp).
    #[arg(long)]
    pub slip: bool,
    /// Exit after this many messages.
    #[arg(long)]
    pub count: Option<u64>,
}

pub fn run(cmd: OscCommand) -> anyhow::Result<()> {
    match cmd {
        OscCommand::Send(a) => send(a),
        OscCommand::Dump(a) => dump(a),
    }
}

fn resolve(target: &str) -> anyhow::Result<SocketAddr> {
    super::common::resolve_host(target, None, "the target")
}

fn send(a: SendArgs) -> anyhow::Result<()> {
    if !a.address.starts_with('/') && !a.address.starts_with('!') {
        bail!(
            "OSC address {:?} must start with '/' (e.g. /synth/freq)",
            a.address
        );
    }
    let types = a.types.as_deref().unwrap_or("");
    let types = types.strip_prefix(',').unwrap_or(types);
    let mut blobs: Vec<Vec<u8>> = Vec::new();
    // Hex blobs are parsed first so the arguments can borrow them.
    let mut vi = 0usize;
    for t in types.chars() {
        if takes_value(t) {
            if t == 'b' {
                let v = a.values.get(vi).context("missing value for type 'b'")?;
                blobs.push(
                    hex(v).with_context(|| format!("blob value {v:?} must be hex bytes, e.g. 00ff10"))?,
                );
            }
            vi += 1;
        }
    }
    let mut args = Vec::new();
    let mut values = a.values.iter();
    let mut blob = blobs.iter();
    for t in types.chars() {
        if !takes_value(t) {
            args.push(match t {
                'T' => Arg::True,
                'F' => Arg::False,
                'N' => Arg::Nil,
                'I' => Arg::Inf,
                '[' => Arg::ArrayBegin,
                ']' => Arg::ArrayEnd,
                other => bail!("unknown type tag {other:?}: use i f s b h t d S c r m T F N I [ ]"),
            });
            continue;
        }
        let v = values
            .next()
            .with_context(|| format!("type tags {types:?} need more values than were given"))?;
        args.push(parse_value(t, v, &mut blob)?);
    }
    if values.next().is_some() {
        bail!("more values than type tags {types:?} describe; add a type tag for each value");
    }
    let mut buf = vec![0u8; netjam_osc::message_len(&a.address, &args) + 20];
    let n = match &a.at {
        None => encode_message(&mut buf, &a.address, &args).context("cannot encode this message")?,
        Some(at) => {
            let time = parse_time(at).with_context(|| {
                format!(
                    "--at {at:?} must be \"now\", \"immediately\", UNIX seconds or NTP hex SSSSSSSS.FFFFFFFF"
                )
            })?;
            let mut w = BundleWriter::new(&mut buf, time).context("cannot encode the bundle")?;
            w.message(&a.address, &args)
                .context("cannot encode this message")?;
            w.finish().context("cannot encode the bundle")?
        }
    };
    let to = resolve(&a.target)?;
    if a.tcp || a.slip {
        let framing = if a.slip {
            Framing::Slip
        } else {
            Framing::LengthPrefix
        };
        let mut wire = Vec::new();
        frame(framing, &buf[..n], &mut wire);
        let mut s = std::net::TcpStream::connect_timeout(&to, Duration::from_secs(5)).with_context(|| {
            format!("cannot connect over TCP to {to}: is an OSC TCP server listening there?")
        })?;
        s.write_all(&wire)
            .with_context(|| format!("cannot send to {to} over TCP"))?;
        let _ = s.shutdown(std::net::Shutdown::Write);
    } else {
        let bind = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
        let sock = UdpSocket::bind(bind).context("cannot open a UDP socket")?;
        sock.send_to(&buf[..n], to)
            .with_context(|| format!("cannot send to {to} over UDP"))?;
    }
    Ok(())
}

fn takes_value(t: char) -> bool {
    !matches!(t, 'T' | 'F' | 'N' | 'I' | '[' | ']') && "ifsbhtdScrm".contains(t)
}

fn parse_value<'a>(
    t: char,
    v: &'a str,
    blobs: &mut std::slice::Iter<'a, Vec<u8>>,
) -> anyhow::Result<Arg<'a>> {
    let ctx = |what: &str| format!("value {v:?} for type '{t}' must be {what}");
    Ok(match t {
        'i' => Arg::Int(v.parse().with_context(|| ctx("a 32-bit integer"))?),
        'h' => Arg::Long(v.parse().with_context(|| ctx("a 64-bit integer"))?),
        'f' => Arg::Float(v.parse().with_context(|| ctx("a number"))?),
        'd' => Arg::Double(v.parse().with_context(|| ctx("a number"))?),
        's' => Arg::Str(v),
        'S' => Arg::Symbol(v),
        'c' => {
            let mut cs = v.chars();
            match (cs.next(), cs.next()) {
                (Some(c), None) => Arg::Char(c),
                _ => bail!(ctx("exactly one character")),
            }
        }
        'b' => Arg::Blob(blobs.next().context("internal: blob not parsed")?),
        'r' | 'm' => {
            let b = hex(v)
                .ok()
                .filter(|b| b.len() == 4)
                .with_context(|| ctx("4 bytes in hex, e.g. ff000080"))?;
            let four = [b[0], b[1], b[2], b[3]];
            if t == 'r' {
                Arg::Color(four)
            } else {
                Arg::Midi(four)
            }
        }
        't' => {
            Arg::Time(parse_time(v).with_context(|| {
                ctx("\"now\", \"immediately\", UNIX seconds or NTP hex SSSSSSSS.FFFFFFFF")
            })?)
        }
        other => bail!("unknown type tag {other:?}: use i f s b h t d S c r m T F N I [ ]"),
    })
}

fn parse_time(v: &str) -> anyhow::Result<TimeTag> {
    match v {
        "now" => Ok(TimeTag::from_system_time(SystemTime::now())),
        "immediately" | "immediate" => Ok(TimeTag::IMMEDIATELY),
        _ => {
            if let Some((s, f)) = v.split_once('.') {
                if s.len() == 8 && f.len() == 8 {
                    if let (Ok(s), Ok(f)) = (u32::from_str_radix(s, 16), u32::from_str_radix(f, 16)) {
                        return Ok(TimeTag::new(s, f));
                    }
                }
            }
            Ok(TimeTag::from_unix_secs_f64(v.parse::<f64>()?))
        }
    }
}

fn hex(s: &str) -> anyhow::Result<Vec<u8>> {
    let s = s.strip_prefix("0x").unwrap_or(s);
    if s.len() % 2 != 0 {
        bail!("odd number of hex digits");
    }
    (0..s.len())
        .step_by(2)
        .map(|i| Ok(u8::from_str_radix(s.get(i..i + 2).context("not hex")?, 16)?))
        .collect()
}

/// One line for one message: `[@TIMETAG ]ADDRESS ,TAGS VALUES...`.
fn format_message(time: Option<TimeTag>, m: &Message<'_>) -> String {
    use std::fmt::Write as _;
    let mut line = String::new();
    if let Some(t) = time {
        let _ = write!(line, "@{t} ");
    }
    let _ = write!(line, "{} ,{}", m.address(), m.type_tags());
    for a in m.args() {
        line.push(' ');
        let _ = match a {
            Arg::Int(v) => write!(line, "{v}"),
            Arg::Float(v) => write!(line, "{v}"),
            Arg::Long(v) => write!(line, "{v}"),
            Arg::Double(v) => write!(line, "{v}"),
            Arg::Str(s) => write!(line, "{s:?}"),
            Arg::Symbol(s) => write!(line, "'{}'", s.escape_debug()),
            Arg::Blob(b) => {
                line.push_str("0x");
                b.iter().try_for_each(|x| write!(line, "{x:02x}"))
            }
            Arg::Time(t) => write!(line, "{t}"),
            Arg::Char(c) => write!(line, "{c:?}"),
            Arg::Color(c) => write!(line, "#{:02x}{:02x}{:02x}{:02x}", c[0], c[1], c[2], c[3]),
            Arg::Midi(m) => write!(line, "midi:{:02x}{:02x}{:02x}{:02x}", m[0], m[1], m[2], m[3]),
            Arg::True => write!(line, "true"),
            Arg::False => write!(line, "false"),
            Arg::Nil => write!(line, "nil"),
            Arg::Inf => write!(line, "inf"),
            Arg::ArrayBegin => write!(line, "["),
            Arg::ArrayEnd => write!(line, "]"),
        };
    }
    line
}

/// Prints every message of one packet; returns how many were printed.
fn print_packet(bytes: &[u8], from: &str) -> u64 {
    match Packet::decode(bytes) {
        Ok(p) => {
            let mut n = 0;
            let is_bundle = matches!(p, Packet::Bundle(_));
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            p.for_each_message(|t, m| {
                let _ = writeln!(out, "{}", format_message(is_bundle.then_some(t), m));
                let _ = out.flush();
                n += 1;
            });
            n
        }
        Err(e) => {
            eprintln!("netjam osc dump: dropped a packet from {from}: {e}");
            0
        }
    }
}

fn dump(a: DumpArgs) -> anyhow::Result<()> {
    let limit = a.count.unwrap_or(u64::MAX);
    let hint = "give --listen as ADDR:PORT, e.g. 0.0.0.0:9000 (port 0 picks a free one)";
    if a.tcp || a.slip {
        let listener = TcpListener::bind(&a.listen)
            .with_context(|| format!("cannot listen on TCP {}: {hint}", a.listen))?;
        eprintln!("netjam osc dump: listening on tcp {}", listener.local_addr()?);
        let printed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        for conn in listener.incoming() {
            let mut stream = match conn {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("netjam osc dump: accept failed: {e}");
                    continue;
                }
            };
            let counter = printed.clone();
            let slip = a.slip;
            let handle = std::thread::spawn(move || {
                use std::io::Read;
                let from = stream.peer_addr().map(|p| p.to_string()).unwrap_or_default();
                let mut dec = if slip {
                    StreamDecoder::with_framing(Framing::Slip)
                } else {
                    StreamDecoder::new()
                };
                let mut buf = [0u8; 8192];
                loop {
                    let n = match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let fed = dec.feed(&buf[..n], |pkt| {
                        let k = print_packet(pkt, &from);
                        counter.fetch_add(k, std::sync::atomic::Ordering::Relaxed);
                    });
                    if let Err(e) = fed {
                        eprintln!("netjam osc dump: closing connection from {from}: {e}");
                        break;
                    }
                    if counter.load(std::sync::atomic::Ordering::Relaxed) >= limit {
                        std::process::exit(0);
                    }
                }
            });
            drop(handle);
        }
        Ok(())
    } else {
        let sock = UdpSocket::bind(&a.listen)
            .with_context(|| format!("cannot listen on UDP {}: {hint}", a.listen))?;
        eprintln!("netjam osc dump: listening on udp {}", sock.local_addr()?);
        let mut buf = vec![0u8; 65536];
        let mut printed = 0u64;
        while printed < limit {
            let (n, from) = sock
                .recv_from(&mut buf)
                .context("receiving on the UDP socket failed")?;
            printed += print_packet(&buf[..n], &from.to_string());
        }
        Ok(())
    }
}
