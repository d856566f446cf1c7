//! Getting through home routers: what a player's public (reflexive) address is, as the
//! rooms server or any STUN server sees it.
//!
//! * [`direct`]: direct paths between the members of a room (authenticated probes,
//!   simultaneous punching, the server as fallback) and where each media packet goes.
//! * [`predict`]: the next ports a router that hands out ports in sequence will give a
//!   socket, from two servers' answers (candidates for the other players to probe).
//! * [`stun`]: the STUN Binding request and success response (RFC 8489) — the subset a
//!   rooms server answers on its media port and a client asks with.
//!
//! Nothing here opens a socket or reads a clock: callers pass bytes in and take bytes out,
//! written into buffers they own.

pub mod direct;
pub mod predict;
pub mod stun;
