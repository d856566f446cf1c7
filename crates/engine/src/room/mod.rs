//! Rooms: the server that forwards a band's RTP/RTCP to every other member, and the
//! client's side of its join protocol. Both are sans-IO state machines.
//!
//! * [`msg`]: the control messages (OSC under `/netjam/`) and their codec.
//! * [`auth`]: cookies, nonces, tokens, room keys and authenticators.
//! * [`server`]: [`Server`], the room table, membership, forwarding verdicts and policing.
//! * [`client`]: [`RoomClient`], hello → challenge → join → welcome, keep-alives, roster
//!   acknowledgements and rejoin after an address change.
//! * [`directory`]: [`RoomDirectory`], which server hosts a room.
//! * [`fuzz`]: the fuzzing entry point for control messages.
//! * [`secure`]: the Noise channel control messages are to travel in, with the server's
//!   key pinned by its players.
//!
//! One UDP port carries control, media and STUN Binding requests; [`demux`] tells them apart by the first byte.
//! The protocol, with byte layouts, is specified in `docs/protocol.md`.
//!
//! Nothing here opens a socket, starts a thread or reads a clock: callers pass the time
//! (monotonic nanoseconds) and bytes in and take bytes out. The server's forwarding path
//! never allocates; no input may make any of it panic.

pub mod auth;
pub mod client;
pub mod directory;
pub mod fuzz;
pub mod msg;
pub mod secure;
pub mod server;

/// The most members a room seats by default, and so the most a player hears at once: the
/// size of a player's member receivers, mixer strips and OSC seats (`/member0` …
/// `/member15`). The one place this number is set.
pub const ROOM_SEATS: usize = 16;

pub use client::{ClientConfig, PeerEntry, RoomClient, RoomEvent, RosterEntry};
pub use directory::{InMemoryDirectory, RoomDirectory};
pub use msg::{RefuseCode, RosterKind, PROTOCOL_VERSION};
pub use server::{
    Dest, DestId, DirectoryRequest, DropReason, ListedRoom, MemberStats, Placement, Server, ServerConfig,
    ServerStats, Verdict,
};

/// What a datagram on the room port is, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Demux {
    /// An OSC message (first byte `/`): control.
    Control,
    /// An OSC bundle (`#`): not used by the protocol.
    Bundle,
    /// RTP (version 2, as [`crate::wire::rtp::classify`] sorts it: RFC 5761).
    Rtp,
    /// RTCP (version 2, second byte 192..=223, as [`crate::wire::rtp::classify`] sorts it).
    Rtcp,
    /// A STUN message (first byte `0x00` or `0x01`, the magic cookie at bytes 4..8).
    Stun,
    /// Anything else.
    Junk,
}

impl Demux {
    /// What the media path makes of it: RTP, RTCP, or neither. The same answer as
    /// [`crate::wire::rtp::classify`] for every datagram, so a socket that sorted a datagram
    /// once hands the media path its kind and nothing downstream sorts it again.
    #[inline]
    pub fn media_kind(self) -> crate::wire::rtp::PacketKind {
        use crate::wire::rtp::PacketKind;
        match self {
            Demux::Rtp => PacketKind::Rtp,
            Demux::Rtcp => PacketKind::Rtcp,
            Demux::Control | Demux::Bundle | Demux::Stun | Demux::Junk => PacketKind::Other,
        }
    }
}

/// Classifies a datagram received on the room port: media is told apart from control and
/// STUN by its first byte, and RTP from RTCP by the one rule every receiver uses
/// ([`crate::wire::rtp::classify`]).
#[inline]
pub fn demux(bytes: &[u8]) -> Demux {
    use crate::wire::rtp::{classify, PacketKind};
    match bytes {
        [b'/', ..] => Demux::Control,
        [b'#', ..] => Demux::Bundle,
        [0x00 | 0x01, ..] if crate::nat::stun::is_stun(bytes) => Demux::Stun,
        _ => match classify(bytes) {
            PacketKind::Rtp => Demux::Rtp,
            PacketKind::Rtcp => Demux::Rtcp,
            PacketKind::Other => Demux::Junk,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::rtp::{classify, PacketKind};

    #[test]
    fn the_room_port_sorts_rtp_and_rtcp_as_every_receiver_does() {
        for b0 in 0x80..=0xBFu8 {
            for b1 in 0..=255u8 {
                let d = [b0, b1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
                let want = match classify(&d) {
                    PacketKind::Rtp => Demux::Rtp,
                    PacketKind::Rtcp => Demux::Rtcp,
                    PacketKind::Other => Demux::Junk,
                };
                assert_eq!(demux(&d), want, "{b0:#04x} {b1}");
            }
        }
        // Whatever the first two bytes, the media kind the port hands on is the receivers' own.
        for b0 in 0..=255u8 {
            for b1 in 0..=255u8 {
                let d = [b0, b1, 0x21, 0x12, 0xA4, 0x42, 0, 0, 0, 0, 0, 0];
                assert_eq!(demux(&d).media_kind(), classify(&d), "{b0:#04x} {b1}");
            }
            assert_eq!(demux(&[b0]).media_kind(), classify(&[b0]), "{b0:#04x}");
        }
        assert_eq!(demux(&[0x80, 200, 0, 1]), Demux::Rtcp);
        assert_eq!(demux(&[0x80, 195, 0, 1]), Demux::Rtcp);
        assert_eq!(demux(&[0x80, 96]), Demux::Rtp);
        assert_eq!(demux(b"/netjam/join"), Demux::Control);
        assert_eq!(demux(b"#bundle"), Demux::Bundle);
        assert_eq!(demux(&[0x40, 0]), Demux::Junk);
    }
}
