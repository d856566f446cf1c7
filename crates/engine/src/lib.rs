//! netjam's sans-IO core.
//!
//! Everything in this crate is a plain state machine: it is handed the current time
//! (a monotonic nanosecond count) and bytes, and returns bytes to send, frames to play and
//! events. It never touches a socket, a thread, a device or the system clock, so tests drive
//! it in simulated time over the simulated links of [`link`].
#![forbid(unsafe_code)]

#[doc(hidden)]
pub mod align;
pub mod codec;
pub mod conceal;
pub mod delay;
pub mod discontinuity;
pub mod drift;
pub mod jitter;
pub mod limiter;
pub mod link;
pub mod listen;
pub mod members;
pub mod mixer;
pub mod nat;
pub mod player;
pub mod privacy;
pub mod probe;
pub mod receiver;
pub mod rng;
pub mod room;
pub mod roundtrip;
pub mod sender;
pub mod slip;
pub mod splice;
pub mod synth;
pub mod time;
pub mod wire;
