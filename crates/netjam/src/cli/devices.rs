//! `netjam devices`: the audio endpoints netjam can use on this machine.
//!
//! It lists what it can actually enumerate: a running JACK server (rate, period, its ports
//! grouped by client with their channel counts), the ALSA cards the kernel knows (reachable
//! through JACK's ALSA driver), and the file, pipe and test-signal endpoints that always work.

use std::collections::BTreeMap;

use clap::Args;

use crate::endpoint::jack::{server_info, ServerInfo};

#[derive(Debug, Args)]
pub struct DevicesArgs {
    /// The JACK server to ask (its `jackd -n` name; default: $JACK_DEFAULT_SERVER, else the default).
    #[arg(long, value_name = "NAME")]
    pub jack_server: Option<String>,
    /// Print the JACK server's details as JSON instead.
    #[arg(long)]
    pub json: bool,
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

pub fn run(a: DevicesArgs) -> anyhow::Result<()> {
    let jack = server_info("netjam-devices", a.jack_server.as_deref());
    if a.json {
        let info = jack.map_err(|e| anyhow::anyhow!("{e}"))?;
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    match &jack {
        Ok(info) => print_jack(info, a.jack_server.as_deref()),
        Err(e) => println!("JACK: {e}"),
    }
    let cards = alsa_cards();
    if cards.is_empty() {
        println!("ALSA: no sound cards in /proc/asound/cards");
    } else {
        println!("ALSA cards (netjam plays them through JACK: jackd -d alsa -d hw:ID -r 48000 -p 64):");
        for (index, id, desc) in cards {
            println!("  hw:{id} (card {index}): {desc}");
        }
    }
    println!(
        "Always available: --input FILE.wav, --stdin/--stdout (raw PCM), --sine/--clicks/--noise/--silence"
    );
    Ok(())
}
