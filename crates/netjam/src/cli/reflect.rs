//! `netjam reflect`: echo audio and probe packets back to their sender.

use clap::Args;

#[derive(Debug, Args)]
pub struct ReflectArgs {}

pub fn run(_a: ReflectArgs) -> anyhow::Result<()> {
    anyhow::bail!("netjam reflect is not available in this build yet")
}
