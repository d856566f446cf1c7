//! `netjam osc send` and `netjam osc dump`.

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum OscCommand {
    /// Send one OSC message.
    Send,
    /// Print every OSC message received.
    Dump,
}

pub fn run(_cmd: OscCommand) -> anyhow::Result<()> {
    anyhow::bail!("netjam osc is not available in this build yet")
}
