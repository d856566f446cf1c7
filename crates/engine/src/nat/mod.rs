//! Getting through home routers: what a player's public (reflexive) address is, as the
//! rooms server or any STUN server sees it.
//!
//! * [`stun`]: the STUN Binding request and success response (RFC 8489) — the subset a
//!   rooms server answers on its media port and a client asks with.
//!
//! Nothing here opens a socket or reads a clock: callers pass bytes in and take bytes out,
//! written into buffers they own.

pub mod stun;
