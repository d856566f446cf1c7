//! Which server hosts a room: the [`RoomDirectory`] trait and its in-memory default.
//!
//! A room lives on exactly one server. When netjam runs more than one server, a directory
//! shared by all of them says where each room lives, so a client (or a server that
//! receives a join for a room it does not host) can be sent to the right one. The
//! directory is consulted only when a room is created, looked up or closed — never on the
//! forwarding path, which must not depend on it.
//!
//! # Plugging in a shared backend
//!
//! A Redis or etcd backend implements the same trait:
//! * [`RoomDirectory::claim`] is an atomic create-if-absent with a lease: Redis
//!   `SET room:<name> <server> NX PX <ttl>`, or an etcd transaction
//!   `if version(room/<name>) == 0 then put(room/<name>, <server>, lease)` on a lease
//!   granted with a TTL. It returns the holder, which is another server when the claim lost.
//! * [`RoomDirectory::renew`] keeps the server's claims alive: Redis `PEXPIRE` on each room
//!   it holds, or one etcd `LeaseKeepAlive` for all of them. A server that dies stops
//!   renewing, its leases expire, and its rooms can be claimed elsewhere.
//! * [`RoomDirectory::release`] deletes the key when the room's last member leaves
//!   (only if this server still holds it: a compare-and-delete).
//! * [`RoomDirectory::lookup`] is a plain read (`GET`, etcd `Range`).
//!
//! Those calls do network I/O, so a real backend runs them on a thread of its own and
//! caches answers; the trait is synchronous and infallible in shape only for the in-memory
//! default — a networked implementation reports failures through [`DirectoryError`].
//!
//! The Redis backend (`netjam::room_directory`, `netjam server --directory`) stores a
//! fencing epoch with each claim and renews and releases with compare-and-set scripts
//! rather than a bare `PEXPIRE`/`DEL`, so a server whose lease ran out cannot touch a
//! claim made since; the [`Server`](super::Server) core asks for it through
//! [`DirectoryRequest`](super::DirectoryRequest) and never waits for it.

use std::collections::HashMap;

/// A server's identity in the directory: the address clients reach it at, e.g.
/// `"eu-west-1.example.org:4464"`.
pub type ServerId = String;

/// Why the directory could not answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectoryError {
    /// The backend could not be reached or refused the operation.
    #[error("room directory unavailable: {0}")]
    Unavailable(String),
}

/// Where rooms live.
pub trait RoomDirectory {
    /// Which server hosts `room`, if any.
    fn lookup(&mut self, room: &str, now_ns: u64) -> Result<Option<ServerId>, DirectoryError>;
    /// Claims `room` for `server` unless another server holds it; returns the holder after
    /// the call (equal to `server` when the claim succeeded or was already ours).
    fn claim(&mut self, room: &str, server: &str, now_ns: u64) -> Result<ServerId, DirectoryError>;
    /// Extends every claim `server` holds to `now_ns` + the lease time.
    fn renew(&mut self, server: &str, now_ns: u64) -> Result<(), DirectoryError>;
    /// Gives `room` up if `server` holds it.
    fn release(&mut self, room: &str, server: &str) -> Result<(), DirectoryError>;
}

/// The default directory: one process, a map with leases in virtual time.
#[derive(Debug, Clone)]
pub struct InMemoryDirectory {
    lease_ns: u64,
    rooms: HashMap<String, (ServerId, u64)>,
}

impl InMemoryDirectory {
    /// A directory whose claims expire `lease_ns` after their last renewal.
    pub fn new(lease_ns: u64) -> Self {
        Self {
            lease_ns,
            rooms: HashMap::new(),
        }
    }

    fn live(&self, room: &str, now_ns: u64) -> Option<&ServerId> {
        self.rooms
            .get(room)
            .filter(|(_, expires)| *expires > now_ns)
            .map(|(s, _)| s)
    }
}

impl Default for InMemoryDirectory {
    /// Leases of 30 s.
    fn default() -> Self {
        Self::new(30_000_000_000)
    }
}

impl RoomDirectory for InMemoryDirectory {
    fn lookup(&mut self, room: &str, now_ns: u64) -> Result<Option<ServerId>, DirectoryError> {
        Ok(self.live(room, now_ns).cloned())
    }

    fn claim(&mut self, room: &str, server: &str, now_ns: u64) -> Result<ServerId, DirectoryError> {
        if let Some(holder) = self.live(room, now_ns) {
            if holder != server {
                return Ok(holder.clone());
            }
        }
        self.rooms
            .insert(room.to_owned(), (server.to_owned(), now_ns + self.lease_ns));
        Ok(server.to_owned())
    }

    fn renew(&mut self, server: &str, now_ns: u64) -> Result<(), DirectoryError> {
        let lease = self.lease_ns;
        for (holder, expires) in self.rooms.values_mut() {
            if holder == server && *expires > now_ns {
                *expires = now_ns + lease;
            }
        }
        Ok(())
    }

    fn release(&mut self, room: &str, server: &str) -> Result<(), DirectoryError> {
        if self.rooms.get(room).is_some_and(|(h, _)| h == server) {
            self.rooms.remove(room);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_exclusive_until_the_lease_runs_out() {
        let mut d = InMemoryDirectory::new(1_000);
        assert_eq!(d.claim("band", "a", 0).unwrap(), "a");
        assert_eq!(d.claim("band", "b", 10).unwrap(), "a");
        assert_eq!(d.lookup("band", 10).unwrap().as_deref(), Some("a"));
        d.renew("a", 900).unwrap();
        assert_eq!(d.claim("band", "b", 1_500).unwrap(), "a");
        // a stops renewing: its lease expires and b may take the room.
        assert_eq!(d.lookup("band", 1_900).unwrap(), None);
        assert_eq!(d.claim("band", "b", 1_900).unwrap(), "b");
        d.release("band", "a").unwrap();
        assert_eq!(d.lookup("band", 1_901).unwrap().as_deref(), Some("b"));
        d.release("band", "b").unwrap();
        assert_eq!(d.lookup("band", 1_901).unwrap(), None);
    }
}
