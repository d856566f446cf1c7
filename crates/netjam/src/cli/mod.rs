//! The `netjam` command line: one module per family of subcommands.

use clap::{Parser, Subcommand};

pub mod common;
pub mod demo;
pub mod devices;
pub mod ensemble;
pub mod jam;
pub mod osc;
pub mod probe;
pub mod reflect;
pub mod rooms;
pub mod server;
pub mod stream;

/// Play music together live over the internet.
#[derive(Debug, Parser)]
#[command(name = "netjam", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// Parsed once at start and moved into its command: the size of the largest variant costs
// nothing, and boxing it would only make every command's flags harder to read.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// A Seattle–Vermont jam over an emulated link in one process; prints the latency budget.
    Demo(demo::DemoArgs),
    /// Send audio (a WAV file, stdin, or a test signal) as RTP.
    Send(stream::SendArgs),
    /// Receive a stream into a WAV file or stdout, through the adaptive jitter buffer.
    Recv(stream::RecvArgs),
    /// Play live with one other player (--peer) or in a room of players (--room): send what you play, hear what they play.
    Jam(jam::JamArgs),
    /// Print an SDP description of a stream (for GStreamer, ffmpeg, VLC).
    Sdp(stream::SdpArgs),
    /// Echo every audio and probe packet back to its sender (hear your own round trip).
    Reflect(reflect::ReflectArgs),
    /// Measure a link against `netjam reflect`: round trip, one-way delays, jitter, loss.
    Ping(probe::PingArgs),
    /// Ping over a grid of packet sizes and rates, and recommend a packetization.
    Sweep(probe::SweepArgs),
    /// Carry UDP through an emulated link (delay, jitter, loss, reordering, rate cap).
    Impair(probe::ImpairArgs),
    /// List the audio devices and endpoints netjam can use (JACK server and its ports, ALSA cards).
    Devices(devices::DevicesArgs),
    /// Serve rooms: forward every member's audio to the others in their room, without decoding.
    Server(server::ServerArgs),
    /// List the public rooms a rooms server knows, with their players and region.
    Rooms(rooms::RoomsArgs),
    /// Open Sound Control tools.
    #[command(subcommand)]
    Osc(osc::OscCommand),
    /// Ensemble messaging: named services, one clock, timed and reliable messages (after O2).
    #[command(subcommand)]
    Ensemble(ensemble::EnsembleCommand),
}

impl Cli {
    pub fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Demo(a) => demo::run_demo(a),
            Command::Send(a) => stream::run_send(a),
            Command::Recv(a) => stream::run_recv(a),
            Command::Sdp(a) => stream::run_sdp(a),
            Command::Jam(a) => jam::run_jam(a),
            Command::Reflect(a) => reflect::run(a),
            Command::Ping(a) => probe::run_ping(a),
            Command::Sweep(a) => probe::run_sweep(a),
            Command::Impair(a) => probe::run_impair(a),
            Command::Devices(a) => devices::run(a),
            Command::Server(a) => server::run(a),
            Command::Rooms(a) => rooms::run(a),
            Command::Osc(c) => osc::run(c),
            Command::Ensemble(c) => ensemble::run(c),
        }
    }
}
