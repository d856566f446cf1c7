//! The wire format: RTP/RTCP (RFC 3550), linear PCM payloads (RFC 3551 / RFC 3190),
//! redundancy (RFC 2198) and SDP. Parsers borrow from the packet and never allocate;
//! writers fill a caller's buffer.
