//! Realtime-safe Open Sound Control (OSC 1.0 / 1.1).
//!
//! Encoding writes into a caller's buffer, decoding borrows from the packet, and dispatch
//! never allocates, so every part of this crate may run on an audio thread.
//! This crate must never depend on netjam's audio engine.
#![forbid(unsafe_code)]
