//! netjam's ensemble messaging core (sans-IO): what a networked band shares beside audio.
//!
//! * [`clock`]: one clock for the whole ensemble. A member estimates the reference's
//!   offset and rate from probe round trips with minimum-RTT filtering and slews its
//!   exported ensemble time instead of jumping; [`clock::ClockReader`] hands that time to
//!   the audio thread without locks or allocation.
//!
//! Planned here (see the README): named services and their tables, discovery, best-effort,
//! reliable and timed delivery, taps and bridges, a shared beat.
//!
//! Nothing in this crate touches a socket, a thread or the system clock: callers pass the
//! time in, as a monotonic nanosecond count, and carry the bytes.
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod clock;
