//! The player's one [`Command`]: every control surface (OSC, the web page, the settings
//! file, the keyboard, the roster) says what it wants of the audio as one of these, and
//! [`Media::apply`](super::Media::apply) is the one place it takes effect.

use crate::delay::LatencyPolicy;
use crate::members::MemberId;

/// A change for the player's audio half ([`super::Media`]). Members are named by the
/// control side's ids; a member's mix settings apply once it is assigned, so send
/// `Assign` first (a ring keeps the order).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub enum Command {
    /// Hear `ssrc` as `member`, at unity gain, centred, unmuted.
    Assign {
        ssrc: u32,
        member: MemberId,
    },
    /// Stop hearing `ssrc`; its slot falls silent and is free.
    Release {
        ssrc: u32,
    },
    /// A member's gain in dB (−∞ is silence; at most +12).
    Gain {
        member: MemberId,
        db: f32,
    },
    /// A member's pan, −1 (left) ..= 1 (right).
    Pan {
        member: MemberId,
        pan: f32,
    },
    Mute {
        member: MemberId,
        mute: bool,
    },
    /// While any member is soloed, only the soloed ones are heard (your monitor stays).
    Solo {
        member: MemberId,
        solo: bool,
    },
    /// Your own signal in your ears (the local monitor, never through the network).
    MonitorGain {
        db: f32,
    },
    MonitorPan {
        pan: f32,
    },
    MonitorMute {
        mute: bool,
    },
    /// Gain on the whole mix you hear, before its limiter, in dB (ramped like a member's;
    /// −∞ is silence; at most +12).
    MasterGain {
        db: f32,
    },
    /// Gain on what you send, in dB (ramped over the next period; −∞ is silence).
    SendGain {
        db: f32,
    },
    /// Send silence (the stream keeps flowing, so the others' buffers stay primed).
    SendMute {
        mute: bool,
    },
    /// Every member's buffer policy.
    Latency {
        policy: LatencyPolicy,
    },
    /// Pause (`false`) or resume the recording; refused when the player records nothing
    /// (see [`super::Media::allow_recording`]).
    Record {
        on: bool,
    },
    /// Seal and open in `epoch` with `key` (a private room's password changed, or this
    /// player took the new one); nothing in a room without a password.
    Rekey {
        epoch: u32,
        key: crate::privacy::MediaKey,
    },
    /// `member` sits at control seat `seat` (0..[`crate::room::ROOM_SEATS`]), whose
    /// per-member ports carry its audio (see [`super::Media::member_ports`]); a member has
    /// one seat, a seat one member. Send after its `Assign`; a `Release` frees the seat.
    Seat {
        member: MemberId,
        seat: u16,
    },
}
