//! `netjam ping`, `netjam sweep` and `netjam impair`.

use clap::Args;

#[derive(Debug, Args)]
pub struct PingArgs {}
#[derive(Debug, Args)]
pub struct SweepArgs {}
#[derive(Debug, Args)]
pub struct ImpairArgs {}

pub fn run_ping(_a: PingArgs) -> anyhow::Result<()> {
    anyhow::bail!("netjam ping is not available in this build yet")
}
pub fn run_sweep(_a: SweepArgs) -> anyhow::Result<()> {
    anyhow::bail!("netjam sweep is not available in this build yet")
}
pub fn run_impair(_a: ImpairArgs) -> anyhow::Result<()> {
    anyhow::bail!("netjam impair is not available in this build yet")
}
