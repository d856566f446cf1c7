//! A room client's per-member JACK ports (`jam --jack --member-ports`): one set of output
//! ports per control seat, so that a DAW records each player on a track of its own.
//!
//! Registering a JACK port is not realtime-safe, so every seat's ports are registered when
//! the client opens: `from_<seat>_<channel>` (seats and channels from 1). When libjack can
//! rename ports, a seat's ports are renamed `from_<name>_<channel>` while a member sits there
//! and get their seat number back when it leaves; a DAW's connections follow the port, not
//! its name. This module only decides names: [`MemberPorts::update`] compares the roster's
//! seats with the names last given and asks the endpoint's [`PortRenamer`] for the
//! difference; [`start`] registers them on the client when it opens and says so. The audio
//! itself goes through [`crate::session::RoomProcess::set_member_ports`].
//!
//! Never here: audio, or anything the process callback waits for.

use anyhow::Context;

use crate::endpoint::jack::PortRenamer;
use netjam_engine::player::{Roster, SEATS};

/// The short names of every seat's ports as registered: `from_<seat>_<channel>`, seat by
/// seat (the order [`crate::session::RoomProcess`] fills them in).
pub fn registered_names(per_seat: usize) -> Vec<String> {
    (0..SEATS)
        .flat_map(|seat| (1..=per_seat).map(move |c| port_name(&(seat + 1).to_string(), c)))
        .collect()
}

fn port_name(label: &str, channel: usize) -> String {
    format!("from_{label}_{channel}")
}

/// A member's name as part of a port name: `:` separates a JACK client from its port and
/// white space makes ports awkward to name in a shell, so both become `_`.
pub fn port_label(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c == ':' || c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// What each seat's ports are called now, given who sits where: the seat number when
/// empty (or without renaming), else the member's name; `<name>-<seat>` when that name
/// would be taken (another member of the same name, or a name that is a seat number).
pub fn seat_labels(roster: &Roster, rename: bool) -> [String; SEATS] {
    let names: [Option<String>; SEATS] =
        std::array::from_fn(|seat| roster.member_at(seat).map(|m| port_label(&m.name)));
    std::array::from_fn(|seat| match &names[seat] {
        Some(name) if rename => {
            let twice = names
                .iter()
                .enumerate()
                .any(|(s, n)| s != seat && n.as_deref() == Some(name.as_str()));
            let numeric = !name.is_empty() && name.chars().all(|c| c.is_ascii_digit());
            if twice || numeric || name.is_empty() {
                format!("{name}-{}", seat + 1)
            } else {
                name.clone()
            }
        }
        _ => (seat + 1).to_string(),
    })
}

/// The ports of a running room client, renamed as members come and go.
#[derive(Debug)]
pub struct MemberPorts {
    client: String,
    per_seat: usize,
    renamer: Option<PortRenamer>,
    /// Who sat at each seat when last looked at, and the label its ports were given.
    seen: [(Option<u32>, String); SEATS],
}

impl MemberPorts {
    /// The ports of JACK client `client`, `per_seat` a seat, as [`registered_names`] named
    /// them; `renamer`: None where libjack cannot rename ports.
    pub fn new(client: &str, per_seat: usize, renamer: Option<PortRenamer>) -> Self {
        Self {
            client: client.to_owned(),
            per_seat,
            renamer,
            seen: std::array::from_fn(|seat| (None, (seat + 1).to_string())),
        }
    }

    /// Whether the ports are renamed after the members.
    pub fn renaming(&self) -> bool {
        self.renamer.is_some()
    }

    /// Renames the endpoint refused so far.
    pub fn rename_failures(&self) -> u64 {
        self.renamer.as_ref().map_or(0, PortRenamer::failures)
    }

    /// Follow the roster: rename the ports of every seat whose label changed (ports that
    /// give a name back first, so a name freed and taken at once is free when taken).
    /// Returns whether anyone moved or was renamed (then [`Self::describe`] says who is
    /// where).
    pub fn update(&mut self, roster: &Roster) -> bool {
        let labels = seat_labels(roster, self.renamer.is_some());
        let moved = (0..SEATS).any(|s| self.seen[s].0 != roster.seats[s] || self.seen[s].1 != labels[s]);
        if let Some(renamer) = &self.renamer {
            let mut changed: Vec<usize> = (0..SEATS).filter(|&s| self.seen[s].1 != labels[s]).collect();
            changed.sort_by_key(|&s| roster.seats[s].is_some());
            for s in changed {
                for c in 1..=self.per_seat {
                    renamer.rename(s * self.per_seat + c - 1, &port_name(&labels[s], c));
                }
            }
        }
        for (s, label) in labels.into_iter().enumerate() {
            self.seen[s] = (roster.seats[s], label);
        }
        moved
    }

    /// Who sits at which seat and on which ports, e.g. `seat 1 ana: nj:from_ana_1,
    /// nj:from_ana_2`; `nobody` when every seat is empty.
    pub fn describe(&self, roster: &Roster) -> String {
        let seats: Vec<String> = (0..SEATS)
            .filter_map(|s| {
                let m = roster.member_at(s)?;
                let ports: Vec<String> = (1..=self.per_seat)
                    .map(|c| format!("{}:{}", self.client, port_name(&self.seen[s].1, c)))
                    .collect();
                Some(format!("seat {} {}: {}", s + 1, m.name, ports.join(", ")))
            })
            .collect();
        if seats.is_empty() {
            "nobody".into()
        } else {
            seats.join("; ")
        }
    }
}

/// `--member-ports`: JACK output ports of `per_seat` channels for every seat, filled by the
/// room's `process`.
pub fn start(
    jack: &mut crate::endpoint::jack::JackEndpoint,
    per_seat: usize,
    process: &mut crate::session::RoomProcess,
) -> anyhow::Result<MemberPorts> {
    jack.register_extra_outputs(&registered_names(per_seat))
        .context("cannot register the per-member JACK ports (--member-ports): the JACK server may be out of ports (jackd -p sets its limit)")?;
    process.set_member_ports(per_seat);
    let renamer = jack.port_renamer();
    let ports = MemberPorts::new(jack.client_name(), per_seat, renamer);
    eprintln!(
        "netjam: member ports {name}:from_1_1 .. {name}:from_{SEATS}_{per_seat}, one set per seat (/memberN){}",
        if ports.renaming() {
            ", renamed from_<member>_N while a member sits there"
        } else {
            "; this libjack cannot rename ports (JACK >= 0.125 or jack2 >= 1.9.11 can), so they keep their seat numbers"
        },
        name = jack.client_name(),
    );
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use netjam_engine::player::RosterMember;

    fn roster(seated: &[(usize, u32, &str)]) -> Roster {
        let mut r = Roster::default();
        for &(seat, id, name) in seated {
            r.seats[seat] = Some(id);
            r.members.insert(
                id,
                RosterMember {
                    member_id: id,
                    name: name.into(),
                    ssrc: id,
                },
            );
        }
        r
    }

    #[test]
    fn ports_are_registered_seat_by_seat() {
        let names = registered_names(2);
        assert_eq!(names.len(), 2 * SEATS);
        assert_eq!(&names[..3], ["from_1_1", "from_1_2", "from_2_1"]);
        assert_eq!(names.last().map(String::as_str), Some("from_16_2"));
    }

    #[test]
    fn labels_are_names_unless_taken() {
        let r = roster(&[(0, 7, "ana"), (1, 8, "bo: bass"), (2, 9, "ana"), (4, 10, "3")]);
        let l = seat_labels(&r, true);
        assert_eq!(&l[..6], ["ana-1", "bo__bass", "ana-3", "4", "3-5", "6"]);
        let l = seat_labels(&r, false);
        assert_eq!(&l[..3], ["1", "2", "3"]);
    }

    #[test]
    fn only_the_seats_that_changed_are_described_and_renamed() {
        let mut p = MemberPorts::new("nj", 2, None);
        assert!(!p.update(&Roster::default()));
        let r = roster(&[(1, 8, "bo")]);
        assert!(p.update(&r));
        assert!(!p.update(&r));
        // Without renaming the ports keep their seat numbers.
        assert_eq!(p.describe(&r), "seat 2 bo: nj:from_2_1, nj:from_2_2");
        assert!(p.update(&Roster::default()));
        assert_eq!(p.describe(&Roster::default()), "nobody");
    }

    #[test]
    fn a_seat_is_renamed_when_taken_and_given_its_number_back_when_left() {
        let (renamer, asked) = PortRenamer::detached();
        let mut p = MemberPorts::new("nj", 2, Some(renamer));
        p.update(&roster(&[(1, 8, "bo")]));
        assert_eq!(asked(), [(2, "from_bo_1".into()), (3, "from_bo_2".into())]);
        assert_eq!(
            p.describe(&roster(&[(1, 8, "bo")])),
            "seat 2 bo: nj:from_bo_1, nj:from_bo_2"
        );
        assert!(!p.update(&roster(&[(1, 8, "bo")])));
        assert!(asked().is_empty(), "nothing changed");
        // A member renamed in the room: its ports follow.
        assert!(p.update(&roster(&[(1, 8, "bob")])));
        assert_eq!(asked(), [(2, "from_bob_1".into()), (3, "from_bob_2".into())]);
        // bo leaves seat 2 as another bo takes seat 1: seat 2 gives the name back first.
        p.update(&roster(&[(0, 9, "bo")]));
        assert_eq!(
            asked(),
            [
                (2, "from_2_1".into()),
                (3, "from_2_2".into()),
                (0, "from_bo_1".into()),
                (1, "from_bo_2".into())
            ]
        );
    }
}
