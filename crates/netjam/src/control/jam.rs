//! The control surface of today's two-player `netjam jam`: what it can honour of the room
//! tree. `/member0` is the other player (gain and mute of what you hear, their address as
//! name, their figures), `/stats` is jam's latest snapshot and `/roster` names the one
//! other player.
//!
//! Jam's audio thread reads one shared atomic for the gain of what you hear, so the
//! commands are applied by the control thread itself ([`HeardGain`]): one atomic store,
//! nothing for the audio thread to pop. This module must never be called from the audio
//! thread.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::{
    linear_gain, CommandSink, ControlCommand, ControlHandle, ControlServer, ControlState, Level, MemberStats,
    Surface,
};
use crate::session::{JamStats, Snapshot};

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

/// Applies member 0's gain and mute to the linear gain jam's audio thread reads (f32
/// bits; 0 mutes).
#[derive(Debug)]
pub struct HeardGain {
    gain: Arc<AtomicU32>,
    level: Level,
}

impl HeardGain {
    /// Starts from `level` (what the command line asked for); `gain` is what the audio
    /// thread reads.
    pub fn new(gain: Arc<AtomicU32>, level: Level) -> Self {
        HeardGain { gain, level }
    }
}

impl CommandSink for HeardGain {
    fn deliver(&mut self, command: ControlCommand) -> Result<(), ControlCommand> {
        match command {
            ControlCommand::MemberGain { member: 0, db } => self.level.gain_db = db,
            ControlCommand::MemberMute { member: 0, mute } => self.level.mute = mute,
            // Jam's surface has no other settable port: nothing else can arrive.
            _ => return Ok(()),
        }
        let linear = linear_gain(self.level.gain_db, self.level.mute);
        self.gain.store(linear.to_bits(), Ordering::Relaxed);
        Ok(())
    }
}

/// A running jam's OSC control.
#[derive(Debug)]
pub struct JamControl {
    handle: ControlHandle,
    packet_ms: f64,
}

impl JamControl {
    /// Listens on `bind`; `gain` is the audio thread's heard gain, which starts at
    /// `gain_db` (or muted); `peer` names the other player and `packet_ms` is the audio
    /// one packet carries (for the latency estimate).
    pub fn spawn(
        bind: SocketAddr,
        gain: Arc<AtomicU32>,
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
        let sink = HeardGain::new(gain, Level { gain_db, mute });
        let handle = ControlServer::spawn(bind, surface, state, sink)?;
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
