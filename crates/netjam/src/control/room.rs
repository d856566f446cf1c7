//! OSC in a room: what the control surface asks (`/member3/gain`, `/send/mute`, …) becomes
//! the player's one [`Command`], the member found at the control seat the address names
//! through the roster the room thread owns. The room thread polls it beside the page's
//! commands and is the one producer of the audio thread's ring.

use netjam_engine::player::{Command, Roster};

use super::{CommandRx, ControlCommand};
use crate::room_client::CommandSource;

/// OSC commands, turned into the audio thread's by the control seat they name.
#[derive(Debug)]
pub struct OscCommands {
    rx: crate::control::CommandRx,
    /// `/record` pauses and resumes a recording (`--record`); without one it is refused.
    recording: bool,
    /// Refused: no member at that seat, or a parameter rooms do not change yet.
    unsupported: u64,
}

impl CommandSource for OscCommands {
    fn next(&mut self, roster: &Roster) -> Option<Command> {
        loop {
            let c = self.rx.pop().ok()?;
            let member = |seat: u16| roster.member_at(usize::from(seat)).map(|m| m.member_id as _);
            let mapped = match c {
                ControlCommand::MemberGain { member: seat, db } => {
                    member(seat).map(|member| Command::Gain { member, db })
                }
                ControlCommand::MemberPan { member: seat, pan } => {
                    member(seat).map(|member| Command::Pan { member, pan })
                }
                ControlCommand::MemberMute { member: seat, mute } => {
                    member(seat).map(|member| Command::Mute { member, mute })
                }
                ControlCommand::MemberSolo { member: seat, solo } => {
                    member(seat).map(|member| Command::Solo { member, solo })
                }
                ControlCommand::SendGain(db) => Some(Command::SendGain { db }),
                ControlCommand::SendMute(mute) => Some(Command::SendMute { mute }),
                ControlCommand::MonitorGain(db) => Some(Command::MonitorGain { db }),
                ControlCommand::MonitorMute(mute) => Some(Command::MonitorMute { mute }),
                ControlCommand::MasterGain(db) => Some(Command::MasterGain { db }),
                ControlCommand::Latency(policy) => Some(Command::Latency { policy }),
                ControlCommand::Record(on) if self.recording => Some(Command::Record { on }),
                ControlCommand::Redundancy(_) | ControlCommand::Record(_) => None,
            };
            match mapped {
                Some(m) => return Some(m),
                None => {
                    self.unsupported += 1;
                    tracing::info!("OSC {c:?}: nothing to apply it to in this room");
                }
            }
        }
    }
}

impl OscCommands {
    /// Commands from `rx`; `/record` applies only when the player `recording` records.
    pub fn new(rx: CommandRx, recording: bool) -> Self {
        Self {
            rx,
            recording,
            unsupported: 0,
        }
    }

    /// Commands refused: no member at that seat, or nothing in a room to apply them to.
    pub fn unsupported(&self) -> u64 {
        self.unsupported
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::command_ring;
    use netjam_engine::player::RosterMember;

    #[test]
    fn a_seat_names_the_member_sitting_there_and_an_empty_seat_is_refused() {
        let (mut tx, rx) = command_ring(8);
        let mut osc = OscCommands::new(rx, false);
        let mut roster = Roster::default();
        roster.members.insert(
            7,
            RosterMember {
                member_id: 7,
                name: "ana".into(),
                ssrc: 70,
            },
        );
        roster.seats[2] = Some(7);
        for c in [
            ControlCommand::MemberGain { member: 5, db: -3.0 },
            ControlCommand::MemberGain { member: 2, db: -6.0 },
            ControlCommand::Record(false),
            ControlCommand::SendGain(-4.0),
        ] {
            tx.push(c).expect("room in the ring");
        }
        assert_eq!(osc.next(&roster), Some(Command::Gain { member: 7, db: -6.0 }));
        assert_eq!(osc.next(&roster), Some(Command::SendGain { db: -4.0 }));
        assert_eq!(osc.next(&roster), None);
        // Seat 5 is empty, and nothing records here.
        assert_eq!(osc.unsupported(), 2);
    }
}
