//! `netjam rooms --server HOST[,HOST...]`: the public rooms a rooms server knows (every
//! server's, when it shares a directory), with their players and their servers' region
//! labels. Several servers are asked in order, as a player's front doors are: the first
//! that answers gives the list.

use std::time::Duration;

use clap::Args;

use crate::cli::common::resolve_servers;
use crate::room_client::list_rooms;

#[derive(Debug, Args)]
pub struct RoomsArgs {
    /// The rooms server to ask (HOST or HOST:PORT); several, separated by commas, are asked
    /// in turn until one answers.
    #[arg(long, value_name = "HOST[:PORT][,HOST[:PORT]...]")]
    pub server: String,
    /// How long to wait for each server's answer, in seconds.
    #[arg(long, default_value_t = 5.0)]
    pub timeout: f64,
    /// Print the list as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: RoomsArgs) -> anyhow::Result<()> {
    if !(a.timeout.is_finite() && a.timeout > 0.0) {
        anyhow::bail!("--timeout must be a positive number of seconds");
    }
    let (first, others) = resolve_servers(&a.server)?;
    let timeout = Duration::from_secs_f64(a.timeout);
    let mut asked = std::iter::once(first).chain(others).peekable();
    let mut rooms = loop {
        let Some(server) = asked.next() else {
            anyhow::bail!("--server names no rooms server");
        };
        match list_rooms(server, timeout) {
            Ok(rooms) => break rooms,
            Err(e) if asked.peek().is_some() => {
                eprintln!("netjam: {e:#}; asking the next server");
            }
            Err(e) => return Err(e),
        }
    };
    rooms.sort_by(|x, y| x.room.cmp(&y.room));
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rooms)?);
        return Ok(());
    }
    if rooms.is_empty() {
        println!("no public rooms (a player lists a room with `netjam jam --room NAME --public`)");
        return Ok(());
    }
    let width = rooms.iter().map(|r| r.room.len()).max().unwrap_or(4).max(4);
    println!("{:width$}  players  region      server", "room");
    for r in &rooms {
        let region = if r.region.is_empty() { "-" } else { &r.region };
        println!("{:width$}  {:>7}  {region:10}  {}", r.room, r.members, r.server);
    }
    Ok(())
}
