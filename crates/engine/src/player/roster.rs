//! The roster: who is in the room as the player sees it, which control seat each member
//! sits at, and each member's mix kept under its name.
//!
//! The room client's roster events ([`RosterEntry`]) become the audio half's
//! [`Command`]s here, in one place: a member joining is assigned a receiver, seated at a
//! control seat (its own again if it had one under that name and it is free), and given
//! the mix last set for its name; a member leaving is released and its seat kept for its
//! name. Plain data: no clock, no socket, no thread.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crate::nat::direct::{DirectStats, PathInfo};
use crate::room::msg::fold_name;
use crate::room::{RosterEntry, RosterKind, ROOM_SEATS};

use super::Command;

/// A member of the room as the roster names it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RosterMember {
    pub member_id: u32,
    pub name: String,
    pub ssrc: u32,
}

/// Who is in the room, as the roster says; shared with the status line and OSC.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Roster {
    pub room: String,
    /// Your own seat: (member id, SSRC you send with).
    pub me: Option<(u32, u32)>,
    /// The others, by member id.
    pub members: BTreeMap<u32, RosterMember>,
    /// The server stopped answering (the client keeps trying).
    pub lost: bool,
    /// Seats retaken after an address change.
    pub rejoins: u64,
    /// Roster changes the audio thread's ring refused (full).
    pub commands_dropped: u64,
    /// Control datagrams dropped because the control thread was behind.
    pub control_dropped: u64,
    /// Which member sits at each control seat (`/member0` …): a member keeps its seat
    /// while it is in the room and gets it back when it comes again under its name while
    /// the seat is free; a newcomer takes the lowest free seat no one left is kept for, or
    /// else the lowest free one.
    pub seats: [Option<u32>; SEATS],
    /// The path media takes to each member (direct or through the server), by member id.
    pub paths: BTreeMap<u32, PathInfo>,
    /// Your round trip to the server, ms.
    pub server_rtt_ms: Option<f64>,
    /// Probe counters of the direct paths.
    pub direct: DirectStats,
    /// What happened to a private room's password, as said to the player, in order (a
    /// change, another member's change, a refusal).
    pub password_notes: Vec<String>,
    /// Where the server sees you, as it answered STUN after the last rejoin (a rejoin
    /// follows a changed mapping; the first answer is in the join's report).
    pub server_sees: Option<SocketAddr>,
    /// The rooms server the seat is on now.
    pub server: Option<SocketAddr>,
    /// The fingerprint of that server's key, as the control channel checked it.
    pub server_key: Option<String>,
    /// What the player was told happened to the server (lost, back, moved, where it sees
    /// the player), in order: the shell says each once.
    pub notices: Vec<super::session::Notice>,
    /// Times the room was found on another server after the one it was on stopped
    /// answering (failover), and the last such move.
    pub moves: u64,
    pub last_move: Option<RoomMove>,
    /// Why the server (or the one the room moved to) refused to seat this player again;
    /// it then stops trying.
    pub refused: Option<String>,
    /// The refusal was [`RefuseCode::Replaced`](crate::room::msg::RefuseCode::Replaced): netjam joined again under this player's
    /// name from this computer and has the seat now.
    pub replaced: bool,
    /// Seats kept, by name (as [`fold_name`] folds it), for members who left or timed out
    /// and for every member while the room moves between servers: a member seen again
    /// under the same name takes its seat back. At most one name per seat.
    #[serde(skip)]
    pub kept_seats: BTreeMap<String, usize>,
    /// Each member's mix as last set (by `--mix` or through its seat), by name as
    /// [`fold_name`] folds it: applied again whenever a member of that name is seated, so
    /// a mix survives the member leaving and coming back.
    #[serde(skip)]
    pub mixes: Mixes,
}

/// A member's mix settings given so far (`None`: never set, the mixer's default stands).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MemberMix {
    pub gain_db: Option<f32>,
    pub pan: Option<f32>,
    pub mute: Option<bool>,
    pub solo: Option<bool>,
}

/// Mix settings by member name, folded by [`fold_name`].
pub type Mixes = BTreeMap<String, MemberMix>;

/// Parses `--mix`: `NAME=SETTING` entries separated by commas, each SETTING a gain in dB
/// (`-6`, `+3`, `-inf`), `mute`, `unmute`, `solo` or `unsolo`; a name may come back for a second setting
/// (`bo=-3,bo=mute`). Names are matched whatever the case.
pub fn parse_mix(text: &str) -> Result<Mixes, String> {
    let mut out = Mixes::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, setting)) = entry.rsplit_once('=') else {
            return Err(format!("{entry:?} is not NAME=SETTING (e.g. ana=-6 or bo=mute)"));
        };
        let (name, setting) = (name.trim(), setting.trim());
        if name.is_empty() {
            return Err(format!("{entry:?} names no member (e.g. ana=-6)"));
        }
        let mix = out.entry(fold_name(name)).or_default();
        match setting.to_ascii_lowercase().as_str() {
            "mute" => mix.mute = Some(true),
            "unmute" => mix.mute = Some(false),
            "solo" => mix.solo = Some(true),
            "unsolo" => mix.solo = Some(false),
            s => match s.parse::<f32>() {
                Ok(db) if !db.is_nan() && db <= MAX_MEMBER_GAIN_DB => mix.gain_db = Some(db),
                _ => {
                    return Err(format!(
                        "{setting:?} for {name:?} is neither a gain in dB (at most +{MAX_MEMBER_GAIN_DB}) nor mute/unmute/solo/unsolo"
                    ))
                }
            },
        }
    }
    Ok(out)
}

/// The highest gain `--mix` takes for a member, as the mixer's own limit.
const MAX_MEMBER_GAIN_DB: f32 = 12.0;

/// The room moved to another server after the one it was on stopped answering.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RoomMove {
    /// The server it is on now.
    pub to: SocketAddr,
    /// Seconds from the last word of the old server to the seat on the new one.
    pub silence_s: f64,
    /// The old server sent the player away (another server took the room over), rather
    /// than going silent.
    pub handed_over: bool,
}

/// Control seats (the OSC surface's `/member#16`).
pub const SEATS: usize = ROOM_SEATS;

impl Roster {
    /// The name of the member sending with `ssrc`.
    pub fn name_of_ssrc(&self, ssrc: u32) -> Option<&str> {
        self.members
            .values()
            .find(|m| m.ssrc == ssrc)
            .map(|m| m.name.as_str())
    }

    /// The member id of the member named `name` (whatever the case), as OSC's
    /// `/member/NAME/...` addresses it.
    pub fn member_named(&self, name: &str) -> Option<u32> {
        let name = fold_name(name);
        self.members
            .values()
            .find(|m| fold_name(&m.name) == name)
            .map(|m| m.member_id)
    }

    /// The seat `member_id` holds.
    pub fn seat_of(&self, member_id: u32) -> Option<usize> {
        self.seats.iter().position(|s| *s == Some(member_id))
    }

    /// The member at seat `seat`.
    pub fn member_at(&self, seat: usize) -> Option<&RosterMember> {
        self.seats
            .get(seat)
            .copied()
            .flatten()
            .and_then(|id| self.members.get(&id))
    }

    /// The commands the audio thread needs for roster event `e`: [`Roster::apply`]'s, and
    /// after an `Assign` the seat of that member (for its per-member ports) and the mix
    /// set for its name.
    pub fn commands_for(&mut self, e: &RosterEntry) -> impl Iterator<Item = Command> {
        let first = self.apply(e);
        let (seat, mix) = match first {
            Some(Command::Assign { member, .. }) => (
                self.seat_of(member).map(|seat| Command::Seat {
                    member,
                    seat: seat as u16,
                }),
                self.mixes.get(&fold_name(&e.name)).copied().unwrap_or_default(),
            ),
            _ => (None, MemberMix::default()),
        };
        let member = e.member_id;
        let mix = [
            mix.gain_db.map(|db| Command::Gain { member, db }),
            mix.pan.map(|pan| Command::Pan { member, pan }),
            mix.mute.map(|mute| Command::Mute { member, mute }),
            mix.solo.map(|solo| Command::Solo { member, solo }),
        ];
        first.into_iter().chain(seat).chain(mix.into_iter().flatten())
    }

    /// Keeps a member's gain, pan, mute or solo under its name (other commands are not
    /// about one member's mix).
    pub fn remember(&mut self, c: &Command) {
        let member = match *c {
            Command::Gain { member, .. }
            | Command::Pan { member, .. }
            | Command::Mute { member, .. }
            | Command::Solo { member, .. } => member,
            _ => return,
        };
        let Some(name) = self.members.get(&member).map(|m| fold_name(&m.name)) else {
            return;
        };
        let mix = self.mixes.entry(name).or_default();
        match *c {
            Command::Gain { db, .. } => mix.gain_db = Some(db),
            Command::Pan { pan, .. } => mix.pan = Some(pan),
            Command::Mute { mute, .. } => mix.mute = Some(mute),
            Command::Solo { solo, .. } => mix.solo = Some(solo),
            _ => {}
        }
    }

    /// Apply one roster event; returns the command the audio thread needs, if any.
    pub fn apply(&mut self, e: &RosterEntry) -> Option<Command> {
        match e.kind {
            RosterKind::Joined => {
                self.members.insert(
                    e.member_id,
                    RosterMember {
                        member_id: e.member_id,
                        name: e.name.clone(),
                        ssrc: e.ssrc,
                    },
                );
                if self.seat_of(e.member_id).is_none() {
                    let kept = self
                        .kept_seats
                        .remove(&fold_name(&e.name))
                        .filter(|&s| self.seats.get(s).is_some_and(Option::is_none));
                    let free = |s: &usize| self.seats[*s].is_none();
                    let seat = kept
                        .or_else(|| {
                            (0..SEATS)
                                .filter(free)
                                .find(|s| !self.kept_seats.values().any(|k| k == s))
                        })
                        .or_else(|| (0..SEATS).find(free));
                    if let Some(s) = seat {
                        self.kept_seats.retain(|_, k| *k != s);
                        self.seats[s] = Some(e.member_id);
                    }
                }
                Some(Command::Assign {
                    ssrc: e.ssrc,
                    member: e.member_id as _,
                })
            }
            RosterKind::Left | RosterKind::Timeout => {
                if let Some(seat) = self.seat_of(e.member_id) {
                    self.seats[seat] = None;
                    if let Some(m) = self.members.get(&e.member_id) {
                        self.kept_seats.retain(|_, k| *k != seat);
                        self.kept_seats.insert(fold_name(&m.name), seat);
                    }
                }
                self.members
                    .remove(&e.member_id)
                    .map(|m| Command::Release { ssrc: m.ssrc })
            }
            RosterKind::Renamed => {
                if let Some(m) = self.members.get_mut(&e.member_id) {
                    m.name = e.name.clone();
                }
                None
            }
        }
    }

    /// The room is on a new server, where every member has a new id: forgets the members
    /// (their commands release them on the audio thread) and keeps each one's seat for
    /// its name, so that a member seen again under the same name sits where it sat.
    pub fn forget_members(&mut self) -> Vec<Command> {
        let mut out = Vec::new();
        for (seat, id) in self.seats.iter_mut().enumerate() {
            if let Some(m) = id.take().and_then(|id| self.members.get(&id)) {
                self.kept_seats.retain(|_, k| *k != seat);
                self.kept_seats.insert(fold_name(&m.name), seat);
            }
        }
        for m in std::mem::take(&mut self.members).into_values() {
            out.push(Command::Release { ssrc: m.ssrc });
        }
        self.paths.clear();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: RosterKind, member_id: u32, name: &str, ssrc: u32) -> RosterEntry {
        RosterEntry {
            seq: 0,
            kind,
            member_id,
            name: name.into(),
            ssrc,
        }
    }

    #[test]
    fn the_roster_assigns_and_releases_exactly_the_members_it_names() {
        let mut r = Roster::default();
        assert_eq!(
            r.apply(&entry(RosterKind::Joined, 2, "bo", 0xb0)),
            Some(Command::Assign {
                ssrc: 0xb0,
                member: 2
            })
        );
        assert_eq!(r.apply(&entry(RosterKind::Renamed, 2, "bob", 0xb0)), None);
        assert_eq!(r.name_of_ssrc(0xb0), Some("bob"));
        assert_eq!(r.seat_of(2), Some(0));
        r.apply(&entry(RosterKind::Joined, 5, "cy", 0xc0));
        assert_eq!(r.seat_of(5), Some(1));
        assert_eq!(
            r.apply(&entry(RosterKind::Timeout, 2, "bob", 0xb0)),
            Some(Command::Release { ssrc: 0xb0 })
        );
        // A member already gone is not released twice.
        assert_eq!(r.apply(&entry(RosterKind::Left, 2, "bob", 0xb0)), None);
        assert_eq!(r.seat_of(2), None);
        // The seat bob left is kept for him: the next newcomer takes the next free one;
        // cy keeps hers.
        r.apply(&entry(RosterKind::Joined, 7, "di", 0xd0));
        assert_eq!((r.seat_of(7), r.seat_of(5)), (Some(2), Some(1)));
        assert_eq!(r.member_at(1).map(|m| m.name.as_str()), Some("cy"));
    }

    #[test]
    fn a_member_who_comes_back_under_its_name_sits_where_it_sat() {
        let mut r = Roster::default();
        for (id, name) in [(1, "ana"), (2, "bo"), (3, "cy")] {
            r.apply(&entry(RosterKind::Joined, id, name, id));
        }
        // Bo's ghost is replaced (left, then joined with a new id): seat 1 again, so a
        // fader on /member1 keeps moving Bo.
        r.apply(&entry(RosterKind::Left, 2, "bo", 2));
        r.apply(&entry(RosterKind::Joined, 9, "bo", 9));
        assert_eq!(r.seat_of(9), Some(1));
        // Timed out, a newcomer in between, then back (in another case): still seat 0.
        r.apply(&entry(RosterKind::Timeout, 1, "ana", 1));
        r.apply(&entry(RosterKind::Joined, 10, "di", 10));
        assert_eq!(r.seat_of(10), Some(3));
        r.apply(&entry(RosterKind::Joined, 11, "Ana", 11));
        assert_eq!(r.seat_of(11), Some(0));
        // A full house: a newcomer takes a kept seat rather than none, and the name it was
        // kept for then sits wherever is free.
        r.apply(&entry(RosterKind::Left, 3, "cy", 3));
        for id in 20..32 {
            r.apply(&entry(RosterKind::Joined, id, &format!("m{id}"), id));
        }
        r.apply(&entry(RosterKind::Joined, 40, "eve", 40));
        assert_eq!(r.seat_of(40), Some(2));
        assert!(r.kept_seats.is_empty());
        assert!(r.seats.iter().all(Option::is_some));
    }

    #[test]
    fn a_mix_set_by_name_applies_whenever_that_name_is_seated() {
        let mut r = Roster {
            mixes: parse_mix("Ana=-6, bo=mute").expect("mix"),
            ..Roster::default()
        };
        let c: Vec<_> = r
            .commands_for(&entry(RosterKind::Joined, 1, "ana", 0xa0))
            .collect();
        assert_eq!(
            c,
            [
                Command::Assign {
                    ssrc: 0xa0,
                    member: 1
                },
                Command::Seat { member: 1, seat: 0 },
                Command::Gain { member: 1, db: -6.0 },
            ]
        );
        let c: Vec<_> = r
            .commands_for(&entry(RosterKind::Joined, 2, "bo", 0xb0))
            .collect();
        assert_eq!(
            c[2..],
            [Command::Mute {
                member: 2,
                mute: true
            }]
        );
        // Set through bo's seat, then bo's ghost is replaced: the new bo gets all of it.
        for c in [
            Command::Gain { member: 2, db: -3.0 },
            Command::Pan { member: 2, pan: 0.5 },
            Command::Mute {
                member: 2,
                mute: false,
            },
            Command::Solo {
                member: 2,
                solo: true,
            },
            Command::SendGain { db: 2.0 },
        ] {
            r.remember(&c);
        }
        r.commands_for(&entry(RosterKind::Left, 2, "bo", 0xb0))
            .for_each(drop);
        let c: Vec<_> = r
            .commands_for(&entry(RosterKind::Joined, 7, "Bo", 0xb7))
            .collect();
        assert_eq!(
            c[1..],
            [
                Command::Seat { member: 7, seat: 1 },
                Command::Gain { member: 7, db: -3.0 },
                Command::Pan { member: 7, pan: 0.5 },
                Command::Mute {
                    member: 7,
                    mute: false
                },
                Command::Solo {
                    member: 7,
                    solo: true
                },
            ]
        );
        // Someone never mixed gets the mixer's defaults: nothing beyond its seat.
        assert_eq!(
            r.commands_for(&entry(RosterKind::Joined, 8, "cy", 0xc0)).count(),
            2
        );
    }

    #[test]
    fn mix_flags_parse_or_say_what_is_wrong() {
        let m = parse_mix("ana=-6,bo=mute,bo=+3, cy = -inf ,dee=unmute,ana=SOLO,eve=unsolo").expect("mix");
        assert_eq!(
            (m["ana"].solo, m["eve"].solo, m["bo"].solo),
            (Some(true), Some(false), None)
        );
        assert_eq!(m["ana"].gain_db, Some(-6.0));
        assert_eq!((m["bo"].gain_db, m["bo"].mute), (Some(3.0), Some(true)));
        assert_eq!(m["cy"].gain_db, Some(f32::NEG_INFINITY));
        assert_eq!(m["dee"].mute, Some(false));
        assert_eq!(parse_mix("").expect("empty"), Mixes::new());
        for bad in ["ana", "=-6", "ana=loud", "ana=+20", "ana=NaN"] {
            let e = parse_mix(bad).expect_err(bad);
            assert!(e.contains("ana") || e.contains("member"), "{bad}: {e}");
        }
    }

    #[test]
    fn each_assign_is_followed_by_the_members_seat() {
        let mut r = Roster::default();
        let c: Vec<_> = r
            .commands_for(&entry(RosterKind::Joined, 2, "bo", 0xb0))
            .collect();
        assert_eq!(
            c,
            [
                Command::Assign {
                    ssrc: 0xb0,
                    member: 2
                },
                Command::Seat { member: 2, seat: 0 }
            ]
        );
        let c: Vec<_> = r
            .commands_for(&entry(RosterKind::Joined, 5, "cy", 0xc0))
            .collect();
        assert_eq!(c[1], Command::Seat { member: 5, seat: 1 });
        // A rejoin with a new SSRC keeps the seat.
        let c: Vec<_> = r
            .commands_for(&entry(RosterKind::Joined, 2, "bo", 0xb1))
            .collect();
        assert_eq!(c[1], Command::Seat { member: 2, seat: 0 });
        let c: Vec<_> = r.commands_for(&entry(RosterKind::Left, 2, "bo", 0xb1)).collect();
        assert_eq!(c, [Command::Release { ssrc: 0xb1 }]);
        assert!(r
            .commands_for(&entry(RosterKind::Renamed, 5, "cyd", 0xc0))
            .next()
            .is_none());
    }
}
