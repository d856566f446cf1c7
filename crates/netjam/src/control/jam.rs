//! The control surface of today's two-player `netjam jam`: what it can honour of the room
//! tree. `/member0` is the other player (gain and mute of what you hear, their address as
//! name, their figures), `/stats` is jam's latest snapshot and `/roster` names the one
//! other player.
//!
//! A two-player jam is a room of one other member on the player's core, so `/member0`'s
//! gain and mute become the player's one [`Command`] for that member ([`PeerMix`]) and
//! reach the mixer through the same ring as a room's. This module must never be called
//! from the audio thread.

use std::net::SocketAddr;

use netjam_engine::player::Command;

use super::{CommandSink, ControlCommand, ControlHandle, ControlServer, ControlState, MemberStats, Surface};
use crate::session::{JamStats, Snapshot, PEER_TRACK};

/// The ports jam offers: one seat (gain, mute, name, stats), `/stats` and `/roster`.
pub fn surface() -> Surface {
    Surface {
        members: 1,
        pan: false,
        solo: false,
        send: false,
        monitor: false,
        master: false,
        latency: false,
        redundancy: false,
        record: false,
        password: false,
    }
}

/// Turns `/member0`'s gain and mute into the player's [`Command`]s for the other player
/// ([`PEER_TRACK`]), onto the audio thread's command ring.
#[derive(Debug)]
pub struct PeerMix {
    commands: rtrb::Producer<Command>,
}

impl PeerMix {
    pub fn new(commands: rtrb::Producer<Command>) -> Self {
        PeerMix { commands }
    }
}

impl CommandSink for PeerMix {
    fn deliver(&mut self, command: ControlCommand) -> Result<(), ControlCommand> {
        let member = PEER_TRACK;
        let media = match command {
            ControlCommand::MemberGain { member: 0, db } => Command::Gain { member, db },
            ControlCommand::MemberMute { member: 0, mute } => Command::Mute { member, mute },
            // Jam's surface has no other settable port: nothing else can arrive.
            _ => return Ok(()),
        };
        self.commands.push(media).map_err(|_| command)
    }
}

/// A running jam's OSC control.
#[derive(Debug)]
pub struct JamControl {
    handle: ControlHandle,
    packet_ms: f64,
}

impl JamControl {
    /// Listens on `bind`; `commands` is the audio thread's command ring, and the other
    /// player's gain starts at `gain_db` (or muted); `peer` names the other player and
    /// `packet_ms` is the audio one packet carries (for the latency estimate).
    pub fn spawn(
        bind: SocketAddr,
        commands: rtrb::Producer<Command>,
        gain_db: f32,
        mute: bool,
        peer: &str,
        packet_ms: f64,
    ) -> anyhow::Result<Self> {
        let surface = surface();
        let mut state = ControlState::new(&surface);
        if let Some(m) = state.members.first_mut() {
            m.name = Some(peer.to_owned());
            m.gain_db = gain_db;
            m.mute = mute;
        }
        let handle = ControlServer::spawn(bind, surface, state, PeerMix::new(commands))?;
        Ok(JamControl { handle, packet_ms })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.handle.local_addr()
    }

    /// The running control thread.
    pub fn handle(&self) -> &ControlHandle {
        &self.handle
    }

    /// Makes `snap` what `/stats` and `/member0/stats` answer.
    pub fn publish(&self, snap: &Snapshot<JamStats>) {
        let heard = &snap.stats.heard;
        let jb = &heard.jitter_buffer;
        // One way: half the RTCP round trip, the packet waited for, the encoder's
        // look-ahead and the jitter buffer.
        let latency_ms = snap.stats.sent.rtt_ms.map(|rtt| {
            (rtt / 2.0 + self.packet_ms + snap.stats.sent.codec_delay_ms + jb.added_latency_ms) as f32
        });
        let stats = MemberStats {
            latency_ms,
            lost: heard.lost.max(0) as u64,
            concealed: jb.concealment_events,
            buffer_ms: jb.depth_ms as f32,
        };
        let json = serde_json::to_string(snap).unwrap_or_else(|_| "{}".into());
        self.handle.update(|st| {
            if let Some(m) = st.members.first_mut() {
                m.stats = stats;
            }
            st.stats_json = json;
        });
    }
}
