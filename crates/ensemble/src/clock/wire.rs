//! The clock probe messages on the wire: two OSC messages, encoded and decoded with
//! `netjam-osc` into and from the caller's buffers, never allocating.
//!
//! * `/_clock/ping ,ih` — probe id, t1 (the member's send time, int64 ns of its local clock).
//! * `/_clock/pong ,ihhh` — the same id and t1 echoed, t2 (the reference's receive time)
//!   and t3 (its send time), int64 ns of the reference clock.
//!
//! Times are int64 nanoseconds rather than OSC time tags: they are monotonic counts with
//! an arbitrary origin, not wall time, and need nanosecond resolution. Decoding accepts
//! only these exact shapes (negative times are rejected) and never panics on input.

use netjam_osc::{encode_message, Arg, DecodeError, EncodeError, Message, Packet};

/// Address of a probe from a member to the reference.
pub const PING_ADDRESS: &str = "/_clock/ping";
/// Address of the reference's answer.
pub const PONG_ADDRESS: &str = "/_clock/pong";
/// Bytes of an encoded [`ProbeRequest`].
pub const PING_LEN: usize = 32;
/// Bytes of an encoded [`ProbeReply`].
pub const PONG_LEN: usize = 52;

/// Why a probe message could not be read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("not a clock probe: the address is not {0}")]
    WrongAddress(&'static str),
    #[error("clock probe arguments are not {0}")]
    WrongArguments(&'static str),
    #[error("a clock probe time does not fit in int64 nanoseconds")]
    TimeOutOfRange,
}

/// A member's probe: its id and the member's local send time t1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeRequest {
    pub id: u32,
    pub t1_ns: u64,
}

/// The reference's answer: the probe's id and t1 echoed, its receive time t2 and send time t3.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeReply {
    pub id: u32,
    pub t1_ns: u64,
    pub t2_ns: u64,
    pub t3_ns: u64,
}

fn long(ns: u64) -> Result<Arg<'static>, ProbeError> {
    i64::try_from(ns)
        .map(Arg::Long)
        .map_err(|_| ProbeError::TimeOutOfRange)
}

fn time_arg(a: Option<Arg<'_>>) -> Option<u64> {
    match a {
        Some(Arg::Long(v)) => u64::try_from(v).ok(),
        _ => None,
    }
}

fn message<'a>(
    bytes: &'a [u8],
    address: &'static str,
    tags: &'static str,
) -> Result<Message<'a>, ProbeError> {
    let Packet::Message(m) = Packet::decode(bytes)? else {
        return Err(ProbeError::WrongAddress(address));
    };
    if m.address() != address {
        return Err(ProbeError::WrongAddress(address));
    }
    if m.type_tags().trim_start_matches(',') != tags {
        return Err(ProbeError::WrongArguments(tags));
    }
    Ok(m)
}

impl ProbeRequest {
    /// Write the probe into `buf` (at least [`PING_LEN`] bytes); the length written.
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, ProbeError> {
        Ok(encode_message(
            buf,
            PING_ADDRESS,
            &[Arg::Int(self.id as i32), long(self.t1_ns)?],
        )?)
    }

    /// Read a probe; any other message or malformed bytes are an error.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProbeError> {
        let m = message(bytes, PING_ADDRESS, "ih")?;
        let bad = ProbeError::WrongArguments("ih");
        let Some(Arg::Int(id)) = m.arg(0) else {
            return Err(bad);
        };
        let t1_ns = time_arg(m.arg(1)).ok_or(bad)?;
        Ok(Self { id: id as u32, t1_ns })
    }
}

impl ProbeReply {
    /// Write the answer into `buf` (at least [`PONG_LEN`] bytes); the length written.
    pub fn encode(&self, buf: &mut [u8]) -> Result<usize, ProbeError> {
        Ok(encode_message(
            buf,
            PONG_ADDRESS,
            &[
                Arg::Int(self.id as i32),
                long(self.t1_ns)?,
                long(self.t2_ns)?,
                long(self.t3_ns)?,
            ],
        )?)
    }

    /// Read an answer; any other message or malformed bytes are an error.
    pub fn decode(bytes: &[u8]) -> Result<Self, ProbeError> {
        let m = message(bytes, PONG_ADDRESS, "ihhh")?;
        let bad = ProbeError::WrongArguments("ihhh");
        let Some(Arg::Int(id)) = m.arg(0) else {
            return Err(bad);
        };
        Ok(Self {
            id: id as u32,
            t1_ns: time_arg(m.arg(1)).ok_or(bad)?,
            t2_ns: time_arg(m.arg(2)).ok_or(bad)?,
            t3_ns: time_arg(m.arg(3)).ok_or(bad)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_round_trip_at_their_fixed_lengths() {
        let mut buf = [0u8; 64];
        let req = ProbeRequest {
            id: u32::MAX,
            t1_ns: 123_456_789_012,
        };
        let n = req.encode(&mut buf).unwrap();
        assert_eq!(n, PING_LEN);
        assert_eq!(ProbeRequest::decode(&buf[..n]).unwrap(), req);
        let rep = ProbeReply {
            id: 7,
            t1_ns: 1,
            t2_ns: i64::MAX as u64,
            t3_ns: 0,
        };
        let n = rep.encode(&mut buf).unwrap();
        assert_eq!(n, PONG_LEN);
        assert_eq!(ProbeReply::decode(&buf[..n]).unwrap(), rep);
        // A ping is not a pong and the other way round.
        let mut ping = [0u8; PING_LEN];
        req.encode(&mut ping).unwrap();
        assert_eq!(
            ProbeReply::decode(&ping),
            Err(ProbeError::WrongAddress(PONG_ADDRESS))
        );
        assert_eq!(
            ProbeRequest::decode(&buf[..n]),
            Err(ProbeError::WrongAddress(PING_ADDRESS))
        );
    }

    #[test]
    fn bad_probes_are_errors_not_panics() {
        let mut buf = [0u8; 64];
        let too_late = ProbeRequest {
            id: 1,
            t1_ns: u64::MAX,
        };
        assert_eq!(too_late.encode(&mut buf), Err(ProbeError::TimeOutOfRange));
        let n = encode_message(
            &mut buf,
            PONG_ADDRESS,
            &[Arg::Int(1), Arg::Long(-5), Arg::Long(1), Arg::Long(1)],
        )
        .unwrap();
        assert_eq!(
            ProbeReply::decode(&buf[..n]),
            Err(ProbeError::WrongArguments("ihhh"))
        );
        let n = encode_message(&mut buf, PING_ADDRESS, &[Arg::Float(1.0), Arg::Long(1)]).unwrap();
        assert_eq!(
            ProbeRequest::decode(&buf[..n]),
            Err(ProbeError::WrongArguments("ih"))
        );
        let n = ProbeReply {
            id: 1,
            t1_ns: 2,
            t2_ns: 3,
            t3_ns: 4,
        }
        .encode(&mut buf)
        .unwrap();
        for cut in 0..n {
            assert!(ProbeReply::decode(&buf[..cut]).is_err(), "cut at {cut}");
        }
    }
}
