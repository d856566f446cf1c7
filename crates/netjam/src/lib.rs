//! netjam: play music together live over the internet.
//!
//! This crate is the I/O shell around the sans-IO cores of `netjam-engine` and
//! `netjam-osc`: sockets, threads, clocks, files and the command line. It keeps that shell
//! thin; protocol and signal logic belong in the engine.

pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod dl;
pub mod endpoint;
pub mod ensemble;
pub mod keys;
pub mod lifecycle;
pub mod link_emulator;
pub mod loopback;
pub mod member_ports;
pub mod opus;
pub mod peer_play;
pub mod port_map;
pub mod probe;
pub mod record;
pub mod resample;
pub mod ring;
pub mod room_client;
pub mod room_directory;
pub mod room_join;
pub mod room_play;
pub mod room_view;
pub mod rt;
pub mod series;
pub mod serve;
pub mod server;
pub mod session;
pub mod shell;
pub mod status;
pub mod stream_play;
pub mod transport;
pub mod udp_batch;
pub mod web;
pub mod ws_bridge;
