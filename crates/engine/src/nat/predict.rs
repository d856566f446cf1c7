//! Port prediction for routers that give each new destination the next public port (a
//! sequential, endpoint-dependent NAT): from the ports two servers saw one socket at, asked
//! one after the other, the ports the router will most likely give the socket's next
//! destinations — the other players it punches towards. Those are declared as candidates
//! (at the address the server sees the member, `0.0.0.0:PORT`), so that the other side's
//! probes, sent to them, open its own router for this player's probes.
//!
//! A port-randomising router shows no stride and gets no prediction; a router that keeps one
//! port per socket (endpoint-independent) needs none. Pure arithmetic: no sockets, no clock,
//! no allocation.

use std::net::SocketAddr;

/// Largest step between successive ports still taken for a sequential allocator (routers
/// that hand out ports to all their hosts in turn skip a few between one host's flows).
pub const MAX_STRIDE: u16 = 8;
/// Most ports predicted.
pub const MAX_PREDICTED: usize = 4;

/// The next ports a sequential router will likely give this socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prediction {
    /// The step between successive ports the router gave.
    pub stride: u16,
    ports: [u16; MAX_PREDICTED],
    len: usize,
}

impl Prediction {
    /// The predicted ports, nearest first.
    pub fn ports(&self) -> &[u16] {
        &self.ports[..self.len]
    }
}

/// From `first` (the address one server saw the socket at) and `second` (what another
/// server saw, asked after the first), up to `count` (at most [`MAX_PREDICTED`]) ports the
/// router will give the socket's next destinations: `second`'s port plus one stride, two
/// strides, and so on. `None` where the answers show no sequential allocation: another
/// public address, the same port (one port per socket: nothing to predict), a step backwards
/// or larger than [`MAX_STRIDE`] (random ports), or no port left above `second`'s.
pub fn sequential(first: SocketAddr, second: SocketAddr, count: usize) -> Option<Prediction> {
    if first.ip() != second.ip() {
        return None;
    }
    let stride = second.port().checked_sub(first.port())?;
    if stride == 0 || stride > MAX_STRIDE {
        return None;
    }
    let mut p = Prediction {
        stride,
        ports: [0; MAX_PREDICTED],
        len: 0,
    };
    let mut port = second.port();
    for slot in p.ports.iter_mut().take(count.min(MAX_PREDICTED)) {
        let Some(next) = port.checked_add(stride) else {
            break;
        };
        *slot = next;
        port = next;
        p.len += 1;
    }
    (p.len > 0).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ip: &str, port: u16) -> SocketAddr {
        SocketAddr::new(ip.parse().expect("ip"), port)
    }

    #[test]
    fn successive_ports_predict_the_next_ones() {
        let p = sequential(at("198.51.100.7", 20000), at("198.51.100.7", 20001), 3).expect("sequential");
        assert_eq!(p.stride, 1);
        assert_eq!(p.ports(), &[20002, 20003, 20004]);
        let p = sequential(at("198.51.100.7", 40000), at("198.51.100.7", 40004), 2).expect("stride 4");
        assert_eq!(p.ports(), &[40008, 40012]);
    }

    #[test]
    fn no_prediction_where_the_router_shows_no_sequence() {
        let a = at("198.51.100.7", 20000);
        // One port per socket: nothing to predict.
        assert_eq!(sequential(a, a, 3), None);
        // Random ports: a large step, or a step back.
        assert_eq!(sequential(a, at("198.51.100.7", 20000 + MAX_STRIDE + 1), 3), None);
        assert_eq!(sequential(a, at("198.51.100.7", 19999), 3), None);
        // Another public address: two routers, or a pool.
        assert_eq!(sequential(a, at("198.51.100.8", 20001), 3), None);
        // Nothing asked for.
        assert_eq!(sequential(a, at("198.51.100.7", 20001), 0), None);
    }

    #[test]
    fn predictions_stop_at_the_last_port_and_at_the_most_kept() {
        let p = sequential(at("198.51.100.7", 65531), at("198.51.100.7", 65533), 4).expect("room for one");
        assert_eq!(p.ports(), &[65535]);
        assert_eq!(
            sequential(at("198.51.100.7", 65534), at("198.51.100.7", 65535), 4),
            None
        );
        let p = sequential(at("198.51.100.7", 1000), at("198.51.100.7", 1001), 100).expect("capped");
        assert_eq!(p.ports().len(), MAX_PREDICTED);
    }

    #[test]
    fn ipv6_answers_are_read_the_same_way() {
        let p = sequential(at("2001:db8::7", 5000), at("2001:db8::7", 5002), 1).expect("v6");
        assert_eq!(p.ports(), &[5004]);
    }
}
