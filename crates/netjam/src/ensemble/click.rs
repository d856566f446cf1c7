//! What a player asks of the ensemble whose beat it hears as a click (`jam --ensemble`),
//! and joining it: on the local network beside a two-player jam, or through the rooms
//! server in a room, where the room is the ensemble unless another is named, riding on the
//! player's own seat when it is the same room.

use std::net::SocketAddr;

use anyhow::{bail, Context};
use netjam_engine::room::msg::fold_name;
use netjam_ensemble::auth::Secret;
use netjam_ensemble::discovery::{Discovery, DEFAULT_BASE_PORT, DEFAULT_PORTS};

use super::beat::JamBeat;
use super::{bind_ip, random_id, NodeConfig, RoomReach, SharedSeat};
use crate::room_client::FrontDoors;

/// How long the click's member waits for a seat in its room.
const JOIN_TIMEOUT_NS: u64 = 5_000_000_000;

/// The name an ensemble member's seat has in its room.
pub fn seat_name(id: u64) -> String {
    format!("ensemble-{id:016x}")
}

/// The click a player asked for.
#[derive(Clone, Default)]
pub struct ClickAsk {
    /// The ensemble to join: `None` for no click, `Some("")` for the room's own.
    pub ensemble: Option<String>,
    /// The tempo to click at if the ensemble has none yet.
    pub tempo: Option<f64>,
    /// The click's level, dB below full scale.
    pub gain_db: f32,
    /// In a room: the ensemble's room on the same server, if not the room itself.
    pub room: Option<String>,
    /// Beside a two-player jam: this machine only (127.0.0.1, no broadcast).
    pub local: bool,
    /// Beside a two-player jam: the first port of the discovery list.
    pub port: Option<u16>,
    /// The ensemble's shared secret.
    pub secret: Option<Secret>,
}

impl std::fmt::Debug for ClickAsk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClickAsk")
            .field("ensemble", &self.ensemble)
            .field("tempo", &self.tempo)
            .field("gain_db", &self.gain_db)
            .field("room", &self.room)
            .field("local", &self.local)
            .field("port", &self.port)
            .field("secret", &self.secret.as_ref().map(|_| "(set)"))
            .finish()
    }
}

impl ClickAsk {
    /// Joins the ensemble when one is asked for, on the local network.
    pub fn start(&self) -> anyhow::Result<Option<JamBeat>> {
        self.start_with(None)
    }

    /// The room the ensemble lives in when playing in `room` (the room itself unless
    /// another is named); `None` without an ensemble.
    pub fn room_for(&self, room: &str) -> Option<String> {
        let name = self.ensemble.as_ref()?;
        Some(self.room.clone().unwrap_or_else(|| {
            if name.is_empty() {
                room.to_string()
            } else {
                name.clone()
            }
        }))
    }

    /// Whether the ensemble is `room` itself, so it can ride on the player's seat there
    /// (room names are one room whatever their case).
    pub fn shares_seat_in(&self, room: &str) -> bool {
        self.room_for(room)
            .is_some_and(|r| fold_name(&r) == fold_name(room))
    }

    /// Joins the ensemble when one is asked for, through the rooms server at `server` when
    /// playing in `room`: on the player's own `seat` when it is that room, else with a seat
    /// of its own.
    pub fn start_in_room(
        &self,
        server: SocketAddr,
        front: FrontDoors,
        room: &str,
        password: &str,
        seat: Option<SharedSeat>,
    ) -> anyhow::Result<Option<JamBeat>> {
        let Some(ens_room) = self.room_for(room) else {
            return Ok(None);
        };
        let seat = seat.filter(|_| self.shares_seat_in(room));
        self.start_with(Some(RoomReach {
            server,
            front,
            room: ens_room,
            name: String::new(),
            password: password.to_string(),
            join_timeout_ns: JOIN_TIMEOUT_NS,
            seat,
        }))
    }

    fn start_with(&self, room: Option<RoomReach>) -> anyhow::Result<Option<JamBeat>> {
        let Some(name) = &self.ensemble else {
            return Ok(None);
        };
        let name = match (&room, name.is_empty()) {
            (Some(r), true) => r.room.clone(),
            (None, true) => bail!("--ensemble needs a NAME outside a room (or play in one with --room)"),
            (_, false) => name.clone(),
        };
        if let Some(bpm) = self.tempo {
            if !(netjam_ensemble::beat::MIN_BPM..=netjam_ensemble::beat::MAX_BPM).contains(&bpm) {
                bail!(
                    "--tempo {bpm}: give {}–{} beats per minute",
                    netjam_ensemble::beat::MIN_BPM,
                    netjam_ensemble::beat::MAX_BPM
                );
            }
        }
        let id = random_id()?;
        let cfg = NodeConfig {
            ensemble: name.clone(),
            id,
            services: Vec::new(),
            taps: Vec::new(),
            discovery: Discovery {
                base_port: self.port.unwrap_or(DEFAULT_BASE_PORT),
                ports: DEFAULT_PORTS,
                broadcast: !self.local,
            },
            bind_ip: bind_ip(self.local),
            osc_bridge: None,
            room: room.map(|r| RoomReach {
                name: seat_name(id),
                ..r
            }),
        };
        JamBeat::start(cfg, self.tempo, self.secret.clone())
            .with_context(|| format!("cannot join ensemble {name:?}"))
            .map(Some)
    }
}
