//! `netjam devices`: the audio endpoints netjam can use on this machine.
//!
//! It lists what it can actually enumerate: a running JACK server (rate, period, its ports
//! grouped by client with their channel counts); with the `cpal` feature every audio host
//! (ALSA, CoreAudio, WASAPI...) with its devices, their channels, sample rates and buffer
//! sizes, defaults marked; without it, the ALSA cards the kernel knows (reachable through
//! JACK's ALSA driver); and the file, pipe and test-signal endpoints that always work.

use std::collections::BTreeMap;

use clap::Args;

use crate::endpoint::jack::{server_info, ServerInfo};

#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// The JACK server to ask (its `jackd -n` name; default: $JACK_DEFAULT_SERVER, else the default).
    #[arg(long, value_name = "NAME")]
    pub jack_server: Option<String>,
    /// Print everything as JSON instead: `{"jack": server or null, "jack_error": why not,
    /// "hosts": [sound-card hosts and their devices] (with the cpal feature)}`.
    #[arg(long)]
    pub json: bool,
}

/// What a build without sound-card support says when asked for one.
pub const WITHOUT_CPAL: &str = "this netjam was built without sound-card support: rebuild it with `cargo build --release --features cpal` (on Linux, install libasound2-dev and pkg-config first)";

/// `netjam devices --json`.
#[derive(Debug, serde::Serialize)]
struct Listing {
    jack: Option<ServerInfo>,
    jack_error: Option<String>,
    #[cfg(feature = "cpal")]
    hosts: Vec<crate::endpoint::cpal::HostInfo>,
    #[cfg(not(feature = "cpal"))]
    hosts: Option<()>,
    #[cfg(not(feature = "cpal"))]
    hosts_missing: &'static str,
}

/// Channel counts of one JACK client's audio ports.
#[derive(Debug, Default)]
struct ClientPorts {
    /// Ports that produce audio (capture, or a program's outputs).
    outputs: Vec<String>,
    /// Ports that take audio (playback, or a program's inputs).
    inputs: Vec<String>,
    physical: bool,
}

fn by_client(info: &ServerInfo) -> BTreeMap<String, ClientPorts> {
    let mut clients: BTreeMap<String, ClientPorts> = BTreeMap::new();
    for p in &info.ports {
        let (client, short) = p.name.split_once(':').unwrap_or(("", &p.name));
        let c = clients.entry(client.to_string()).or_default();
        c.physical |= p.physical;
        if p.output {
            c.outputs.push(short.to_string());
        } else {
            c.inputs.push(short.to_string());
        }
    }
    clients
}

fn print_jack(info: &ServerInfo, server: Option<&str>) {
    println!(
        "JACK server{}: {} Hz, {} frames per period ({:.2} ms), {}, DSP load {:.1} %",
        server
            .map(str::to_string)
            .or_else(|| std::env::var("JACK_DEFAULT_SERVER").ok())
            .map(|s| format!(" {s:?}"))
            .unwrap_or_default(),
        info.rate,
        info.period,
        info.period as f64 * 1e3 / info.rate.max(1) as f64,
        if info.realtime { "realtime" } else { "not realtime" },
        info.cpu_load_percent
    );
    for (client, ports) in by_client(info) {
        let kind = if ports.physical { " (hardware)" } else { "" };
        println!(
            "  {client}{kind}: {} out, {} in",
            ports.outputs.len(),
            ports.inputs.len()
        );
        for p in &ports.outputs {
            println!("    {client}:{p}  (out: produces audio)");
        }
        for p in &ports.inputs {
            println!("    {client}:{p}  (in: takes audio)");
        }
    }
    println!("  use it: netjam jam --jack [--jack-name NAME] [--channels N] [--no-connect] --peer HOST:PORT");
}

/// ALSA cards from /proc/asound/cards: (index, id, description).
fn alsa_cards() -> Vec<(String, String, String)> {
    let Ok(text) = std::fs::read_to_string("/proc/asound/cards") else {
        return Vec::new();
    };
    let mut cards = Vec::new();
    for line in text.lines() {
        // " 0 [PCH            ]: HDA-Intel - HDA Intel PCH"
        let t = line.trim_start();
        let Some((index, rest)) = t.split_once(' ') else {
            continue;
        };
        if index.parse::<u32>().is_err() {
            continue;
        }
        let id = rest
            .split_once('[')
            .and_then(|(_, r)| r.split_once(']'))
            .map(|(id, _)| id.trim().to_string())
            .unwrap_or_default();
        let desc = rest
            .split_once("]:")
            .map(|(_, d)| d.trim().to_string())
            .unwrap_or_default();
        cards.push((index.to_string(), id, desc));
    }
    cards
}

/// A host's devices split into those netjam could open in some direction, in the host's
/// order, and the names of those it could open in none (on Linux, ALSA plugins such as
/// `lavrate` or `oss` whose backend is not installed or not running).
#[cfg(feature = "cpal")]
fn split_unopenable(
    devices: &[crate::endpoint::cpal::DeviceInfo],
) -> (Vec<&crate::endpoint::cpal::DeviceInfo>, Vec<&str>) {
    let opens = |d: &crate::endpoint::cpal::DeviceInfo| {
        [&d.input, &d.output]
            .into_iter()
            .any(|side| side.as_ref().is_some_and(|s| s.error.is_none()))
    };
    let usable = devices.iter().filter(|d| opens(d)).collect();
    let unopenable = devices
        .iter()
        .filter(|d| !opens(d))
        .map(|d| d.id.as_str())
        .collect();
    (usable, unopenable)
}

/// The one line that names every device that cannot be opened, or None if there is none.
#[cfg(feature = "cpal")]
fn unopenable_line(names: &[&str]) -> Option<String> {
    (!names.is_empty()).then(|| {
        format!(
            "{} more that cannot be opened here (plugins whose backend is missing or not running; `netjam devices --json` says why): {}",
            names.len(),
            names.join(", ")
        )
    })
}

/// Every cpal host, its devices and what each direction offers.
#[cfg(feature = "cpal")]
fn print_hosts(hosts: &[crate::endpoint::cpal::HostInfo]) {
    for h in hosts {
        println!(
            "Sound cards, host {}{}:",
            h.name,
            if h.default { " (default)" } else { "" }
        );
        if let Some(e) = &h.error {
            println!("  cannot list its devices: {e}");
            continue;
        }
        if h.devices.is_empty() {
            println!("  no devices");
        }
        let (usable, unopenable) = split_unopenable(&h.devices);
        for d in usable {
            let mut marks = Vec::new();
            if d.default_input {
                marks.push("default input");
            }
            if d.default_output {
                marks.push("default output");
            }
            let marks = if marks.is_empty() {
                String::new()
            } else {
                format!("  [{}]", marks.join(", "))
            };
            if d.name.is_empty() || d.name == d.id {
                println!("  {}{marks}", d.id);
            } else {
                println!("  {}: {}{marks}", d.id, d.name);
            }
            for (word, side) in [("in ", &d.input), ("out", &d.output)] {
                if let Some(side) = side {
                    println!("    {word} {}", side.summary());
                }
            }
        }
        if let Some(line) = unopenable_line(&unopenable) {
            println!("  {line}");
        }
    }
    println!("  channels are numbered from 1 for --inputs/--outputs; the sound-card layer (cpal) gives no channel names");
    println!(
        "  use one: netjam jam --device NAME (or --input-device/--output-device NAME, --host NAME) [--rate HZ] [--channels N] [--frames N] --peer HOST:PORT"
    );
}

pub fn run(a: DevicesArgs) -> anyhow::Result<()> {
    let jack = server_info("netjam-devices", a.jack_server.as_deref());
    #[cfg(feature = "cpal")]
    let hosts = crate::endpoint::cpal::hosts();
    if a.json {
        let (jack, jack_error) = match jack {
            Ok(info) => (Some(info), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let listing = Listing {
            jack,
            jack_error,
            #[cfg(feature = "cpal")]
            hosts,
            #[cfg(not(feature = "cpal"))]
            hosts: None,
            #[cfg(not(feature = "cpal"))]
            hosts_missing: WITHOUT_CPAL,
        };
        println!("{}", serde_json::to_string_pretty(&listing)?);
        return Ok(());
    }
    match &jack {
        Ok(info) => print_jack(info, a.jack_server.as_deref()),
        Err(e) => println!("JACK: {e}"),
    }
    #[cfg(feature = "cpal")]
    print_hosts(&hosts);
    let cards = alsa_cards();
    if cards.is_empty() {
        println!("ALSA: no sound cards in /proc/asound/cards");
    } else {
        #[cfg(feature = "cpal")]
        println!(
            "ALSA cards in the kernel (also usable through JACK: jackd -d alsa -d hw:ID -r 48000 -p 64):"
        );
        #[cfg(not(feature = "cpal"))]
        println!("ALSA cards (netjam plays them through JACK: jackd -d alsa -d hw:ID -r 48000 -p 64):");
        for (index, id, desc) in cards {
            println!("  hw:{id} (card {index}): {desc}");
        }
    }
    #[cfg(not(feature = "cpal"))]
    println!("Sound cards directly (netjam jam --device): {WITHOUT_CPAL}");
    println!(
        "Always available: --input FILE.wav, --stdin/--stdout (raw PCM), --sine/--clicks/--noise/--silence"
    );
    Ok(())
}

#[cfg(all(test, feature = "cpal"))]
mod tests {
    use super::*;
    use crate::endpoint::cpal::{DeviceInfo, DirectionInfo};

    fn device(id: &str, opens: bool) -> DeviceInfo {
        let side = DirectionInfo {
            channels: if opens { vec![1, 2] } else { Vec::new() },
            error: (!opens).then(|| "not available".to_string()),
            ..Default::default()
        };
        DeviceInfo {
            id: id.into(),
            name: String::new(),
            input: Some(side.clone()),
            output: Some(side),
            default_input: false,
            default_output: false,
        }
    }

    #[test]
    fn devices_that_cannot_be_opened_fold_into_one_line_after_the_others() {
        let mut half = device("hw:CARD=Clarett,DEV=0", true);
        half.output = Some(DirectionInfo {
            error: Some("busy".into()),
            ..Default::default()
        });
        let devices = [
            device("lavrate", false),
            device("null", true),
            device("oss", false),
            half,
            device("speexrate", false),
        ];
        let (usable, unopenable) = split_unopenable(&devices);
        let ids: Vec<&str> = usable.iter().map(|d| d.id.as_str()).collect();
        // A device that opens one way is a real choice and keeps its place.
        assert_eq!(ids, ["null", "hw:CARD=Clarett,DEV=0"]);
        assert_eq!(unopenable, ["lavrate", "oss", "speexrate"]);
        let line = unopenable_line(&unopenable).expect("a line");
        assert!(line.starts_with("3 more that cannot be opened here"), "{line}");
        assert!(line.ends_with(": lavrate, oss, speexrate"), "{line}");
        assert_eq!(unopenable_line(&[]), None);
    }
}
