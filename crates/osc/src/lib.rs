//! Realtime-safe Open Sound Control (OSC 1.0 / 1.1).
//!
//! * [`encode_message`] and [`BundleWriter`] write into a caller's `&mut [u8]`.
//! * [`Packet::decode`] validates a packet strictly and borrows from it; arguments are
//!   decoded lazily by [`Message::args`]. Errors say what is wrong and at which byte.
//! * [`pattern`] matches OSC 1.0 wildcards and OSC 1.1 `//` path traversal.
//! * [`dispatch`] routes messages through a tree of ports with per-port metadata.
//! * [`queue`] hands whole messages between threads without locks; a full queue hands
//!   the message back. [`queue::Producer::push_outbox`] moves what a realtime dispatch
//!   forwarded over to the control thread.
//! * [`schedule`] holds bundled messages until their time tags (bounded, optional);
//!   [`transport`] is the std-socket shell for UDP and TCP (length-prefix and SLIP
//!   framing, detected on receive), with [`transport::UdpEndpoint::serve_one`] sending a
//!   dispatch's replies and broadcasts.
//!
//! A typical setup: the control thread receives packets, answers metadata queries and
//! pushes parameter changes through a [`queue`] to the audio thread, which dispatches
//! them through its [`Tree`] at the start of each audio callback and pushes the replies
//! back the same way.
//!
//! Encoding, decoding, matching, dispatch and the queue never allocate, so they may run
//! on an audio thread. This crate must never depend on netjam's engine or binary, and
//! must never panic on input that came from outside.
//!
//! ```
//! use netjam_osc::{encode_message, Arg, Packet};
//! let mut buf = [0u8; 64];
//! let n = encode_message(&mut buf, "/synth/gain", &[Arg::Float(0.5)]).unwrap();
//! let Packet::Message(m) = Packet::decode(&buf[..n]).unwrap() else { unreachable!() };
//! assert_eq!(m.address(), "/synth/gain");
//! assert_eq!(m.args().next(), Some(Arg::Float(0.5)));
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod arg;
pub mod decode;
pub mod dispatch;
pub mod encode;
pub mod fuzz;
pub mod meta;
pub mod pattern;
pub mod queue;
pub mod schedule;
pub mod time;
pub mod transport;

pub use arg::Arg;
pub use decode::{Bundle, DecodeError, DecodeErrorKind, Message, Packet};
pub use dispatch::{DispatchSummary, Outbox, Request, Route, Tree, TreeBuilder};
pub use encode::{encode_message, message_len, BundleWriter, EncodeError};
pub use meta::{Meta, Scale};
pub use time::TimeTag;

#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
