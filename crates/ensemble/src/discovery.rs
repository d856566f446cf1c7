//! Finding the ensemble on a local network with no configuration, the way O2 does it:
//! a short, fixed list of UDP ports. Each member binds the first free port of the list
//! (that socket carries all its ensemble traffic) and sends its hellos to every port of
//! the list on 127.0.0.1 (the members on this machine) and, unless told to stay on this
//! machine, on the broadcast address 255.255.255.255 (the members on the LAN).
//!
//! Why this and not DNS-SD/mDNS (e.g. the `mdns-sd` crate): mDNS is multicast, and the
//! loopback interface of Linux has no multicast, so members on one machine — the tests,
//! a laptop running three synths — would not find each other without a network
//! interface up; mDNS records live for their TTL, so a dead member lingers unless we add
//! our own heartbeats, which we need anyway to notice death within seconds; and it would
//! bring a responder thread and a dependency for what is one datagram every half second.
//! Broadcast to a port list needs no daemon, works on loopback and on any LAN that
//! passes broadcast, and costs one hello per port per interval. Its limits: at most
//! [`Discovery::ports`] members per machine, and networks that filter broadcast (some
//! Wi-Fi access points) need the rooms server path instead.
//!
//! This module only computes ports and targets; the I/O shell binds and sends.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// First port of the default list: below the ephemeral range Linux hands out to client
/// sockets (32768–60999), so a member neither loses its port to an outgoing connection
/// nor sends hellos to one.
pub const DEFAULT_BASE_PORT: u16 = 14640;
/// Ports in the default list (members per machine).
pub const DEFAULT_PORTS: u16 = 16;

/// Where members look for each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovery {
    pub base_port: u16,
    pub ports: u16,
    /// Also send hellos to the LAN broadcast address (off: this machine only).
    pub broadcast: bool,
}

impl Default for Discovery {
    fn default() -> Self {
        Self {
            base_port: DEFAULT_BASE_PORT,
            ports: DEFAULT_PORTS,
            broadcast: true,
        }
    }
}

impl Discovery {
    /// This machine only (tests, or a single computer running several members).
    pub fn local(base_port: u16) -> Self {
        Self {
            base_port,
            broadcast: false,
            ..Self::default()
        }
    }

    /// The ports of the list, in the order a member tries to bind them.
    pub fn port_list(&self) -> impl Iterator<Item = u16> + '_ {
        (0..self.ports).filter_map(|k| self.base_port.checked_add(k))
    }

    /// Where a hello goes.
    pub fn targets(&self) -> Vec<SocketAddr> {
        let mut t: Vec<SocketAddr> = self
            .port_list()
            .map(|p| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, p)))
            .collect();
        if self.broadcast {
            t.extend(
                self.port_list()
                    .map(|p| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::BROADCAST, p))),
            );
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_cover_every_port_locally_and_by_broadcast() {
        let d = Discovery::default();
        let t = d.targets();
        assert_eq!(t.len(), 2 * DEFAULT_PORTS as usize);
        assert!(t.contains(&"127.0.0.1:14640".parse().unwrap()));
        assert!(t.contains(&"255.255.255.255:14655".parse().unwrap()));
        let l = Discovery::local(65530);
        assert_eq!(l.port_list().count(), 6);
        assert!(l.targets().iter().all(|a| a.ip().is_loopback()));
    }
}
