//! Who is in the ensemble and who offers what: the service table every member keeps.
//!
//! Each member's entry holds the service list it last announced and that list's version;
//! a hello carrying a newer version makes the owner ask for the list again, so tables
//! converge after any loss. When two members offer the same service, every table picks
//! the same provider — the one with the larger member id — so a message for that service
//! goes to one member, wherever it was sent from (O2 also keeps one provider per service
//! and lets a fixed order decide).
//!
//! The table is filled from the network, so it is capped: at most [`MAX_MEMBERS`]
//! members (a newcomer beyond is not entered, and counted), and a member's list holds at
//! most [`MAX_SERVICES`] services and [`MAX_TAPS`] taps, every name a valid service name
//! of at most [`MAX_SERVICE_LEN`] bytes. A list beyond the caps is refused whole (counted)
//! and its member offers nothing here, so every table refuses it alike and they still
//! agree. Memory for one member's entry is thus bounded by about
//! (32 + 2 × 32) × 64 bytes, and the whole table by 64 times that.
//!
//! Plain data on the network thread: it allocates, and it never reads a clock.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::Serialize;

use crate::address::valid_service;
pub use crate::address::MAX_SERVICE_LEN;
use crate::wire::ServiceList;

/// Members a table holds, this process included. A band with its control surfaces,
/// loggers and light desks fits many times over; every member sends each other a hello
/// every 0.5 s, so 64 members are already 8,000 hellos a second across the ensemble.
pub const MAX_MEMBERS: usize = 64;
/// Services one member may offer. A process offers a handful (`/synth1`, `/conductor`);
/// 32 names of at most 64 bytes keep a service list near 2 KB even with every tap.
pub const MAX_SERVICES: usize = 32;
/// Taps one member may ask for.
pub const MAX_TAPS: usize = 32;

/// Whether a service list is within the caps: counts, and every name valid.
pub fn list_within_caps(list: &ServiceList) -> bool {
    list.services.len() <= MAX_SERVICES
        && list.taps.len() <= MAX_TAPS
        && list.services.iter().all(|s| valid_service(s))
        && list
            .taps
            .iter()
            .all(|(a, b)| valid_service(a) && valid_service(b))
}

/// What the table refused, for the stats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TableRefusals {
    /// Datagrams from a newcomer not entered because [`MAX_MEMBERS`] were known.
    pub members: u64,
    /// Service lists refused for breaking the caps.
    pub lists: u64,
}

/// A comparable summary of a table: (service, provider) and (tappee, tapper) pairs.
pub type Digest = (Vec<(String, u64)>, Vec<(String, String)>);

/// One member as this table knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    pub id: u64,
    /// Where it is heard from; `None` for this process itself.
    pub addr: Option<SocketAddr>,
    /// Local time it was last heard from.
    pub last_heard_ns: u64,
    /// The latest version of its service list it announced.
    pub announced: u32,
    /// The version of the list held in `list` (`None`: not received yet).
    pub have: Option<u32>,
    pub list: ServiceList,
    /// Its ensemble time is valid (it may be the clock reference).
    pub synced: bool,
}

/// A row of [`ServiceTable::services`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServiceRow {
    pub service: String,
    /// The member chosen to provide it.
    pub provider: u64,
    /// Every member offering it (the provider among them), ascending.
    pub offered_by: Vec<u64>,
    /// Services that receive a copy of its messages.
    pub tapped_by: Vec<String>,
}

/// Members and their services; see the module docs.
#[derive(Debug, Default, Clone)]
pub struct ServiceTable {
    members: BTreeMap<u64, MemberInfo>,
    providers: BTreeMap<String, u64>,
    taps: BTreeMap<String, Vec<String>>,
    refused: TableRefusals,
}

impl ServiceTable {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn member(&self, id: u64) -> Option<&MemberInfo> {
        self.members.get(&id)
    }

    pub fn member_mut(&mut self, id: u64) -> Option<&mut MemberInfo> {
        self.members.get_mut(&id)
    }

    pub fn members(&self) -> impl Iterator<Item = &MemberInfo> {
        self.members.values()
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// What was refused so far.
    pub fn refusals(&self) -> TableRefusals {
        self.refused
    }

    /// Counts a service list refused before it reached the table (e.g. too many names to
    /// decode).
    pub fn count_refused_list(&mut self) {
        self.refused.lists += 1;
    }

    /// Adds a member (or refreshes its address); returns whether it was new. A newcomer
    /// beyond [`MAX_MEMBERS`] is not entered (and counted): check with
    /// [`ServiceTable::member`].
    pub fn insert(&mut self, id: u64, addr: Option<SocketAddr>, now_ns: u64) -> bool {
        if self.members.len() >= MAX_MEMBERS && !self.members.contains_key(&id) {
            self.refused.members += 1;
            return false;
        }
        let mut new = false;
        let m = self.members.entry(id).or_insert_with(|| {
            new = true;
            MemberInfo {
                id,
                addr,
                last_heard_ns: now_ns,
                announced: 0,
                have: None,
                list: ServiceList::default(),
                synced: false,
            }
        });
        if addr.is_some() {
            m.addr = addr;
        }
        m.last_heard_ns = m.last_heard_ns.max(now_ns);
        new
    }

    /// Stores a member's service list of `version`; returns whether anything changed.
    /// An older version than the one held is ignored. A list beyond the caps is refused
    /// (counted) and stored as empty, so it is not asked for again until a new version.
    pub fn set_services(&mut self, id: u64, version: u32, mut list: ServiceList) -> bool {
        let Some(m) = self.members.get_mut(&id) else {
            return false;
        };
        if m.have.is_some_and(|h| newer(h, version)) {
            return false;
        }
        if !list_within_caps(&list) {
            self.refused.lists += 1;
            list = ServiceList::default();
        }
        if newer(version, m.announced) {
            m.announced = version;
        }
        let changed = m.list != list;
        m.have = Some(version);
        m.list = list;
        if changed {
            self.rebuild();
        }
        changed
    }

    /// Removes a member and withdraws its services; returns its entry.
    pub fn remove(&mut self, id: u64) -> Option<MemberInfo> {
        let m = self.members.remove(&id)?;
        if !m.list.services.is_empty() || !m.list.taps.is_empty() {
            self.rebuild();
        }
        Some(m)
    }

    /// Members (other than this process) not heard from since `now − timeout`.
    pub fn silent(&self, now_ns: u64, timeout_ns: u64) -> Vec<u64> {
        self.members
            .values()
            .filter(|m| m.addr.is_some() && now_ns.saturating_sub(m.last_heard_ns) > timeout_ns)
            .map(|m| m.id)
            .collect()
    }

    /// When the next member falls silent for `timeout` if nothing is heard from it.
    pub fn next_expiry(&self, timeout_ns: u64) -> Option<u64> {
        self.members
            .values()
            .filter(|m| m.addr.is_some())
            .map(|m| m.last_heard_ns + timeout_ns + 1)
            .min()
    }

    /// The member that provides `service`.
    pub fn provider(&self, service: &str) -> Option<u64> {
        self.providers.get(service).copied()
    }

    /// Services that tap `service`.
    pub fn taps_of(&self, service: &str) -> &[String] {
        self.taps.get(service).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Every service, its provider, who else offers it and who taps it, by name.
    pub fn services(&self) -> Vec<ServiceRow> {
        let mut rows: BTreeMap<&str, ServiceRow> = BTreeMap::new();
        for m in self.members.values() {
            for s in &m.list.services {
                let row = rows.entry(s).or_insert_with(|| ServiceRow {
                    service: s.clone(),
                    provider: self.providers.get(s).copied().unwrap_or(m.id),
                    offered_by: Vec::new(),
                    tapped_by: self.taps_of(s).to_vec(),
                });
                row.offered_by.push(m.id);
            }
        }
        rows.into_values().collect()
    }

    /// A comparable summary: (service, provider) pairs and (tappee, tapper) pairs.
    pub fn digest(&self) -> Digest {
        let providers = self.providers.iter().map(|(s, id)| (s.clone(), *id)).collect();
        let taps = self
            .taps
            .iter()
            .flat_map(|(a, bs)| bs.iter().map(move |b| (a.clone(), b.clone())))
            .collect();
        (providers, taps)
    }

    fn rebuild(&mut self) {
        self.providers.clear();
        self.taps.clear();
        // Ascending ids: the last (largest) offer wins.
        for m in self.members.values() {
            for s in &m.list.services {
                self.providers.insert(s.clone(), m.id);
            }
            for (tappee, tapper) in &m.list.taps {
                let v = self.taps.entry(tappee.clone()).or_default();
                if !v.contains(tapper) {
                    v.push(tapper.clone());
                }
            }
        }
        for v in self.taps.values_mut() {
            v.sort();
        }
    }
}

/// Whether version `a` is newer than `b` (serial-number order, wrapping).
pub fn newer(a: u32, b: u32) -> bool {
    a != b && a.wrapping_sub(b) < 0x8000_0000
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(s: &[&str]) -> ServiceList {
        ServiceList {
            services: s.iter().map(|x| x.to_string()).collect(),
            taps: Vec::new(),
        }
    }

    #[test]
    fn the_larger_id_provides_a_shared_service_and_leaving_withdraws() {
        let mut t = ServiceTable::new();
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        t.insert(5, Some(a), 0);
        t.insert(9, Some(a), 0);
        assert!(t.set_services(5, 1, list(&["synth", "drums"])));
        assert!(t.set_services(9, 1, list(&["synth"])));
        assert_eq!(t.provider("synth"), Some(9));
        assert_eq!(t.provider("drums"), Some(5));
        // An old version is ignored.
        assert!(!t.set_services(9, 0, list(&[])));
        t.remove(9);
        assert_eq!(t.provider("synth"), Some(5));
        assert_eq!(t.silent(10, 5), vec![5]);
        assert!(newer(0, u32::MAX));
        assert!(!newer(3, 3));
    }

    #[test]
    fn members_and_lists_beyond_the_caps_are_refused_and_counted() {
        let mut t = ServiceTable::new();
        let a: SocketAddr = "127.0.0.1:1".parse().unwrap();
        for id in 1..=(MAX_MEMBERS as u64 + 10) {
            t.insert(id, Some(a), 0);
        }
        assert_eq!(t.len(), MAX_MEMBERS);
        assert_eq!(t.refusals().members, 10);
        assert!(t.member(MAX_MEMBERS as u64 + 1).is_none());
        // A known member is refreshed, not refused.
        assert!(!t.insert(1, Some(a), 5));
        assert_eq!(t.refusals().members, 10);

        let many: Vec<String> = (0..=MAX_SERVICES).map(|i| format!("s{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(t.set_services(1, 1, list(&["synth"])));
        assert_eq!(t.provider("synth"), Some(1));
        // Too many services: refused whole, the member now offers nothing.
        assert!(t.set_services(1, 2, list(&many)));
        assert_eq!(t.provider("synth"), None);
        assert_eq!(t.provider("s0"), None);
        assert_eq!(t.member(1).unwrap().have, Some(2));
        let long = "x".repeat(MAX_SERVICE_LEN + 1);
        assert!(!t.set_services(2, 1, list(&[&long])));
        assert!(!t.set_services(3, 1, list(&["/slash"])));
        let taps = ServiceList {
            services: vec!["ok".into()],
            taps: (0..=MAX_TAPS)
                .map(|i| ("ok".to_string(), format!("t{i}")))
                .collect(),
        };
        assert!(!t.set_services(4, 1, taps));
        assert_eq!(t.refusals().lists, 4);
        assert!(t.services().is_empty());
        // Exactly at the caps is fine.
        let full: Vec<String> = (0..MAX_SERVICES)
            .map(|i| format!("{i}{}", "y".repeat(MAX_SERVICE_LEN - 3)))
            .collect();
        let full: Vec<&str> = full.iter().map(String::as_str).collect();
        assert!(t.set_services(5, 1, list(&full)));
        assert_eq!(t.services().len(), MAX_SERVICES);
        assert_eq!(t.refusals().lists, 4);
    }
}
