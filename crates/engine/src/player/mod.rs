//! The player: one member of a jam, with one other player or in a room.
//!
//! [`Media`] is its audio half: the sender of what you play, a receiver per member you hear,
//! the mixer with its limiter, the send gain, the meters and a private room's SFrame stage.
//! Every control surface (OSC, a web page, the settings file, the keyboard, the roster)
//! says what it wants as a [`Command`]; every view reads [`MediaReport`] and its
//! [`MemberReport`]s. The [`Roster`] turns who is in the room into commands and keeps each
//! member's seat and mix under its name. The [`ReflexiveQuery`] asks the rooms server (and a
//! STUN server) where the internet sees the player's socket. [`Session`] is the control half
//! from the first hello: the join, the room client, the direct paths, the roster and the
//! front doors the room may move between (its docs show its run loop). Like the rest of the engine it never reads a clock or touches a
//! socket, a thread or a device: the caller hands it the time, the datagrams and the
//! device's buffers, and takes what it transmits.
//!
//! The run loop, on the audio thread, once per device period:
//!
//! ```
//! use netjam_engine::player::{Command, Media, MediaConfig};
//! use netjam_engine::room::demux;
//! use netjam_engine::sender::{Sender, SenderConfig};
//! use netjam_engine::wire::{AudioFormat, Codec};
//!
//! let format = AudioFormat::new(Codec::L16, 48_000, 1).unwrap();
//! let sender = Sender::new(SenderConfig::new(format, 64)).unwrap();
//! let mut media = Media::new(sender, MediaConfig::new(8, 2));
//! let mut sent = Vec::new();
//! // What the control side sent since the last period (a ring in a real player):
//! media.apply(Command::Assign { ssrc: 0x1234_5678, member: 1 });
//! media.apply(Command::Gain { member: 1, db: -6.0 });
//! // What arrived from the network since the last period, sorted once at the socket
//! // (control and STUN went to the control half there):
//! # let mut arrived: Vec<(u64, Vec<u8>)> = Vec::new();
//! for (at, datagram) in &mut arrived {
//!     let kind = demux(datagram).media_kind();
//!     media.handle(*at, kind, datagram);
//! }
//! // The device's period: what you play in, the mix out.
//! let (input, mut output) = ([0.0f32; 64], [0.0f32; 128]);
//! media.process(1_000_000, &input, &mut output, &mut |_at: u64, d: &[u8]| sent.push(d.to_vec()));
//! // A few times a second, for the views:
//! let report = media.report();
//! assert_eq!(report.active_members().count(), 1);
//! assert!(!sent.is_empty());
//! ```

mod command;
mod media;
pub mod reflexive;
pub mod roster;
pub mod session;

pub use command::Command;
pub use media::{Media, MediaConfig, MediaReport, MemberReport, RoundTrip};
pub use reflexive::ReflexiveQuery;
pub use roster::{parse_mix, MemberMix, Mixes, RoomMove, Roster, RosterMember, SEATS};
pub use session::{FrontDoors, Notice, Session, SessionEvent, SessionStart};

/// Where the player's datagrams go: the caller's socket, a ring to its network thread, or
/// a simulated link. Called on the audio thread: it must not block or allocate.
pub trait Transmit {
    /// Send `datagram`, made at `now_ns`.
    fn transmit(&mut self, now_ns: u64, datagram: &[u8]);
}

impl<F: FnMut(u64, &[u8])> Transmit for F {
    fn transmit(&mut self, now_ns: u64, datagram: &[u8]) {
        self(now_ns, datagram)
    }
}
