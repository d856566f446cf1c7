//! The `netjam` command line: one module per family of subcommands.

use clap::{Parser, Subcommand};

pub mod osc;
pub mod probe;
pub mod reflect;

/// Play music together live over the internet.
#[derive(Debug, Parser)]
#[command(name = "netjam", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Echo every audio and probe packet back to its sender (hear your own round trip).
    Reflect(reflect::ReflectArgs),
    /// Measure a link against `netjam reflect`: round trip, one-way delays, jitter, loss.
    Ping(probe::PingArgs),
    /// Ping over a grid of packet sizes and rates, and recommend a packetization.
    Sweep(probe::SweepArgs),
    /// Relay UDP through an emulated link (delay, jitter, loss, reordering, rate cap).
    Impair(probe::ImpairArgs),
    /// Open Sound Control tools.
    #[command(subcommand)]
    Osc(osc::OscCommand),
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Reflect(a) => reflect::run(a),
            Command::Ping(a) => probe::run_ping(a),
            Command::Sweep(a) => probe::run_sweep(a),
            Command::Impair(a) => probe::run_impair(a),
            Command::Osc(c) => osc::run(c),
        }
    }
}
