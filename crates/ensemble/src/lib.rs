//! netjam's ensemble messaging core (sans-IO): what a networked band shares beside audio,
//! after O2 — named services, discovery, one clock, and best-effort, reliable and timed
//! delivery with taps.
//!
//! * [`member`]: one member of an ensemble as a state machine — membership, the service
//!   table, choosing and following the clock reference, delivery. Start here.
//! * [`clock`]: one clock for the whole ensemble. A member estimates the reference's
//!   offset and rate from probe round trips with minimum-RTT filtering and slews its
//!   exported ensemble time instead of jumping; [`clock::ClockReader`] hands that time to
//!   the audio thread without locks or allocation.
//! * [`table`]: who is in the ensemble and who provides which service.
//! * [`address`]: services from addresses (`/synth1/...`, literal `!synth1/...`).
//! * [`reliable`]: acknowledged, retransmitted, ordered streams per sender.
//! * [`beat`]: the shared beat (a tempo map on ensemble time, set by timed messages that
//!   take effect on the same beat everywhere) and a sample-accurate click on it.
//! * [`publish`]: one value published to the audio thread without locks or allocation.
//! * [`inbox`]: timed messages taken by the audio thread in the period they fall in.
//! * [`discovery`]: where hellos go on a local network with no configuration.
//! * [`wire`]: the ensemble's own OSC messages.
//! * [`auth`]: an optional shared secret that seals every datagram with an HMAC.
//!
//! Nothing in this crate touches a socket, a thread or the system clock: callers pass the
//! time in, as a monotonic nanosecond count, and carry the bytes.
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod address;
pub mod auth;
pub mod beat;
pub mod clock;
pub mod discovery;
pub mod inbox;
pub mod member;
pub mod publish;
pub mod reliable;
pub mod table;
pub mod wire;

pub use member::{Delivery, Dest, Event, Member, MemberConfig, SendError, Transmit, SERVER_REFERENCE};
