//! The ensemble's own messages on the wire. Every one is an OSC message under `/_ens/`,
//! so Wireshark and `netjam osc dump` read them; member ids are int64, times int64
//! nanoseconds of ensemble time (0 = now).
//!
//! * `/_ens/hello ,shii` — ensemble name, member id, version of its service list, flags
//!   ([`HELLO_SYNCED`]: its ensemble time is valid; [`HELLO_REPLY`]: an answer to a
//!   hello, not to be answered). Sent to the discovery targets and, as a reply, to a
//!   member heard for the first time.
//! * `/_ens/svq ,hh` — from, to: "send me your service list".
//! * `/_ens/svc ,hii s… s…` — id, version, number of services, the services, then
//!   (tappee, tapper) pairs.
//! * `/_ens/bye ,h` — a member leaving.
//! * `/_ens/msg ,hhiiihb` — from, to, sequence (0: best effort; reliable streams count
//!   from 1 per sender and receiver, low 32 bits), base (the sender's oldest
//!   unacknowledged sequence: a receiver that lost the stream's state, e.g. after
//!   dropping the sender for silence, restarts there instead of waiting for ever), flags ([`MSG_RELIABLE`],
//!   [`MSG_TAP_COPY`]), ensemble time, the user's OSC message.
//! * `/_ens/tempo ,hddh` — carried as the user message of a `/_ens/msg` (reliable,
//!   timed for its start): start (ensemble ns), beat at the start, beats per minute,
//!   the member that set it. See [`crate::beat`].
//! * `/_ens/ack ,hhii` — from (the receiver), to (the sender), next sequence expected,
//!   sequence just received.
//!
//! Decoding never panics and rejects any other shape; it allocates only for service lists.

use netjam_osc::{encode_message, message_len, Arg, DecodeError, EncodeError, Message, Packet};

use crate::table::{MAX_SERVICES, MAX_TAPS};

pub const HELLO: &str = "/_ens/hello";
pub const SERVICES_QUERY: &str = "/_ens/svq";
pub const SERVICES: &str = "/_ens/svc";
pub const BYE: &str = "/_ens/bye";
pub const MSG: &str = "/_ens/msg";
pub const ACK: &str = "/_ens/ack";
pub const TEMPO: &str = "/_ens/tempo";

/// Hello flag: the sender's ensemble time is valid (it may serve as clock reference).
pub const HELLO_SYNCED: u32 = 1;
/// Hello flag: this hello answers one; do not answer it.
pub const HELLO_REPLY: u32 = 2;
/// Message flag: acknowledged and retransmitted, delivered in order.
pub const MSG_RELIABLE: u32 = 1;
/// Message flag: a tap's copy (never tapped again, so taps cannot loop).
pub const MSG_TAP_COPY: u32 = 2;

/// Why bytes are not an ensemble message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error(transparent)]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error("not an ensemble message")]
    NotEnsemble,
    #[error("ensemble message {0} has the wrong arguments")]
    BadArguments(&'static str),
    #[error("service list with more names than a member may offer")]
    OverCap,
}

/// A service list as announced: services offered and taps (tappee, tapper).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceList {
    pub services: Vec<String>,
    pub taps: Vec<(String, String)>,
}

/// One decoded ensemble message, borrowing from the packet.
#[derive(Debug, Clone, PartialEq)]
pub enum Wire<'a> {
    Hello {
        ensemble: &'a str,
        id: u64,
        version: u32,
        flags: u32,
    },
    ServicesQuery {
        from: u64,
        to: u64,
    },
    Services {
        id: u64,
        version: u32,
        list: ServiceList,
    },
    Bye {
        id: u64,
    },
    Data(Data<'a>),
    Ack {
        from: u64,
        to: u64,
        next: u32,
        got: u32,
    },
}

/// A user message in its envelope.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Data<'a> {
    pub from: u64,
    pub to: u64,
    pub seq: u32,
    pub base: u32,
    pub flags: u32,
    pub time_ns: u64,
    pub payload: &'a [u8],
}

fn id(a: Option<Arg<'_>>) -> Option<u64> {
    match a {
        Some(Arg::Long(v)) => Some(v as u64),
        _ => None,
    }
}

fn int(a: Option<Arg<'_>>) -> Option<u32> {
    match a {
        Some(Arg::Int(v)) => Some(v as u32),
        _ => None,
    }
}

fn text(a: Option<Arg<'_>>) -> Option<&str> {
    match a {
        Some(Arg::Str(s)) => Some(s),
        _ => None,
    }
}

/// Encodes a message into a fresh buffer of exactly its size.
pub fn encode_vec(address: &str, args: &[Arg<'_>]) -> Result<Vec<u8>, WireError> {
    let mut v = vec![0u8; message_len(address, args)];
    let n = encode_message(&mut v, address, args)?;
    v.truncate(n);
    Ok(v)
}

impl<'a> Wire<'a> {
    /// Whether `bytes` look like an ensemble message (cheap: the address prefix only).
    pub fn is_ensemble(bytes: &[u8]) -> bool {
        bytes.starts_with(b"/_ens/")
    }

    /// Decodes one ensemble message.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, WireError> {
        let Packet::Message(m) = Packet::decode(bytes)? else {
            return Err(WireError::NotEnsemble);
        };
        Self::from_message(&m)
    }

    fn from_message(m: &Message<'a>) -> Result<Self, WireError> {
        let a = |n| m.arg(n);
        let tags = m.type_tags();
        match m.address() {
            HELLO if tags == "shii" => Ok(Wire::Hello {
                ensemble: text(a(0)).ok_or(WireError::BadArguments(HELLO))?,
                id: id(a(1)).ok_or(WireError::BadArguments(HELLO))?,
                version: int(a(2)).ok_or(WireError::BadArguments(HELLO))?,
                flags: int(a(3)).ok_or(WireError::BadArguments(HELLO))?,
            }),
            SERVICES_QUERY if tags == "hh" => Ok(Wire::ServicesQuery {
                from: id(a(0)).ok_or(WireError::BadArguments(SERVICES_QUERY))?,
                to: id(a(1)).ok_or(WireError::BadArguments(SERVICES_QUERY))?,
            }),
            SERVICES if tags.starts_with("hii") && tags[3..].bytes().all(|t| t == b's') => {
                let bad = WireError::BadArguments(SERVICES);
                let id = id(a(0)).ok_or(bad.clone())?;
                let version = int(a(1)).ok_or(bad.clone())?;
                let n = int(a(2)).ok_or(bad.clone())? as usize;
                let strings = tags.len() - 3;
                if n > strings || (strings - n) % 2 != 0 {
                    return Err(bad);
                }
                // Refused before a string is copied: a datagram of tiny names cannot make
                // the receiver allocate thousands of them.
                if n > MAX_SERVICES || (strings - n) / 2 > MAX_TAPS {
                    return Err(WireError::OverCap);
                }
                let mut it = m.args().skip(3).map(|x| text(Some(x)).unwrap_or("").to_string());
                let services: Vec<String> = it.by_ref().take(n).collect();
                let rest: Vec<String> = it.collect();
                let taps = rest
                    .chunks_exact(2)
                    .map(|p| (p[0].clone(), p[1].clone()))
                    .collect();
                Ok(Wire::Services {
                    id,
                    version,
                    list: ServiceList { services, taps },
                })
            }
            BYE if tags == "h" => Ok(Wire::Bye {
                id: id(a(0)).ok_or(WireError::BadArguments(BYE))?,
            }),
            MSG if tags == "hhiiihb" => {
                let bad = WireError::BadArguments(MSG);
                let Some(Arg::Long(t)) = a(5) else {
                    return Err(bad);
                };
                let Some(Arg::Blob(payload)) = a(6) else {
                    return Err(bad);
                };
                Ok(Wire::Data(Data {
                    from: id(a(0)).ok_or(bad.clone())?,
                    to: id(a(1)).ok_or(bad.clone())?,
                    seq: int(a(2)).ok_or(bad.clone())?,
                    base: int(a(3)).ok_or(bad.clone())?,
                    flags: int(a(4)).ok_or(bad)?,
                    time_ns: t.max(0) as u64,
                    payload,
                }))
            }
            ACK if tags == "hhii" => Ok(Wire::Ack {
                from: id(a(0)).ok_or(WireError::BadArguments(ACK))?,
                to: id(a(1)).ok_or(WireError::BadArguments(ACK))?,
                next: int(a(2)).ok_or(WireError::BadArguments(ACK))?,
                got: int(a(3)).ok_or(WireError::BadArguments(ACK))?,
            }),
            _ => Err(WireError::NotEnsemble),
        }
    }

    /// Encodes this message into a fresh buffer.
    pub fn encode(&self) -> Result<Vec<u8>, WireError> {
        match self {
            Wire::Hello {
                ensemble,
                id,
                version,
                flags,
            } => encode_vec(
                HELLO,
                &[
                    Arg::Str(ensemble),
                    Arg::Long(*id as i64),
                    Arg::Int(*version as i32),
                    Arg::Int(*flags as i32),
                ],
            ),
            Wire::ServicesQuery { from, to } => {
                encode_vec(SERVICES_QUERY, &[Arg::Long(*from as i64), Arg::Long(*to as i64)])
            }
            Wire::Services { id, version, list } => {
                let mut args = vec![
                    Arg::Long(*id as i64),
                    Arg::Int(*version as i32),
                    Arg::Int(list.services.len() as i32),
                ];
                args.extend(list.services.iter().map(|s| Arg::Str(s)));
                for (a, b) in &list.taps {
                    args.push(Arg::Str(a));
                    args.push(Arg::Str(b));
                }
                encode_vec(SERVICES, &args)
            }
            Wire::Bye { id } => encode_vec(BYE, &[Arg::Long(*id as i64)]),
            Wire::Data(d) => encode_vec(
                MSG,
                &[
                    Arg::Long(d.from as i64),
                    Arg::Long(d.to as i64),
                    Arg::Int(d.seq as i32),
                    Arg::Int(d.base as i32),
                    Arg::Int(d.flags as i32),
                    Arg::Long(d.time_ns.min(i64::MAX as u64) as i64),
                    Arg::Blob(d.payload),
                ],
            ),
            Wire::Ack { from, to, next, got } => encode_vec(
                ACK,
                &[
                    Arg::Long(*from as i64),
                    Arg::Long(*to as i64),
                    Arg::Int(*next as i32),
                    Arg::Int(*got as i32),
                ],
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_round_trips() {
        let payload = encode_vec("/synth1/gate", &[Arg::Float(1.0)]).unwrap();
        let all = [
            Wire::Hello {
                ensemble: "band",
                id: u64::MAX - 3,
                version: 7,
                flags: HELLO_SYNCED,
            },
            Wire::ServicesQuery { from: 1, to: 2 },
            Wire::Services {
                id: 9,
                version: u32::MAX,
                list: ServiceList {
                    services: vec!["a".into(), "b".into()],
                    taps: vec![("a".into(), "log".into())],
                },
            },
            Wire::Services {
                id: 9,
                version: 0,
                list: ServiceList::default(),
            },
            Wire::Bye { id: 4 },
            Wire::Data(Data {
                from: 1,
                to: 2,
                seq: u32::MAX,
                base: 3,
                flags: MSG_RELIABLE,
                time_ns: 123_456_789,
                payload: &payload,
            }),
            Wire::Ack {
                from: 2,
                to: 1,
                next: 5,
                got: 9,
            },
        ];
        for w in all {
            let bytes = w.encode().unwrap();
            assert!(Wire::is_ensemble(&bytes));
            assert_eq!(Wire::decode(&bytes).unwrap(), w);
        }
    }

    #[test]
    fn wrong_shapes_are_errors() {
        let b = encode_vec(HELLO, &[Arg::Str("x")]).unwrap();
        assert!(Wire::decode(&b).is_err());
        let b = encode_vec(SERVICES, &[Arg::Long(1), Arg::Int(0), Arg::Int(3), Arg::Str("a")]).unwrap();
        assert_eq!(Wire::decode(&b), Err(WireError::BadArguments(SERVICES)));
        let mut args = vec![Arg::Long(1), Arg::Int(0), Arg::Int(MAX_SERVICES as i32 + 1)];
        args.extend((0..=MAX_SERVICES).map(|_| Arg::Str("a")));
        let b = encode_vec(SERVICES, &args).unwrap();
        assert_eq!(Wire::decode(&b), Err(WireError::OverCap));
        let b = encode_vec("/other", &[]).unwrap();
        assert_eq!(Wire::decode(&b), Err(WireError::NotEnsemble));
        assert!(Wire::decode(&[1, 2, 3]).is_err());
    }
}
