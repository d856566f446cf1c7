//! Link measurement and link emulation: the I/O shells around the engine's probe and link
//! cores.
//!
//! - [`ping`]: isochronous probes to a reflector and the statistics of their replies;
//! - [`sweep`]: ping over an audio stream's packet sizes and rates, and a packetization;
//! - [`reflect`]: the reflector loop that answers them (and echoes RTP);
//! - [`impair`]: `netjam impair`'s link emulator.
//!
//! The measuring and the rules live in the engine (`netjam_engine::probe`,
//! `netjam_engine::link`); these modules only move datagrams and time them. They never
//! print: the command line does.

pub mod impair;
pub mod ping;
pub mod reflect;
pub mod sweep;
