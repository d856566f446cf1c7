//! Where the internet sees this player: STUN Binding requests (RFC 8489) to the rooms
//! server, and optionally to another STUN server, from the socket the audio uses.
//!
//! [`ReflexiveQuery`] is a small state machine over [`crate::nat::stun`]: it says what to
//! send and when (a request, retransmitted at 250, 750 and 1750 ms after the first, as
//! RFC 8489's doubling timer with a shorter first step because a musician is waiting),
//! takes the answers, and reports the public address each server saw and what that says
//! about the router: one public port per socket whatever the destination
//! (endpoint-independent mapping: direct paths between players can work), or a port per
//! destination (a port-randomising or symmetric NAT: they need the relay or prediction).
//!
//! Like the rest of the player's core it reads no clock and touches no socket: the caller
//! gives the time, fresh transaction ids (the core has no source of randomness), sends
//! what [`ReflexiveQuery::poll_transmit`] returns and hands back what arrives. It runs
//! during the join, before the audio starts; never on the audio thread.

use std::net::SocketAddr;

use crate::nat::stun::{self, TransactionId, REQUEST_LEN};

/// Delays between the sends of one request (the last one waits for its answer as long).
const RETRANSMIT_NS: [u64; 4] = [250_000_000, 500_000_000, 1_000_000_000, 1_000_000_000];

/// Who answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Asked {
    /// The rooms server, on its room port.
    RoomServer,
    /// A STUN server given with `--stun`.
    Stun,
}

#[derive(Debug)]
struct Ask {
    who: Asked,
    server: SocketAddr,
    txid: TransactionId,
    sends: usize,
    next_at: u64,
    first_sent: Option<u64>,
    answer: Option<(SocketAddr, u64)>,
}

/// What the router does with this socket's mappings, from two servers' answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mapping {
    /// Both servers saw the same public address and port.
    EndpointIndependent,
    /// They saw different ones: the router maps each destination anew.
    EndpointDependent,
    /// Only one server asked or answered.
    Unknown,
}

/// The answers, as `--stats-json` writes them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Reflexive {
    /// The address the rooms server sees this player at.
    pub server_sees: Option<SocketAddr>,
    /// Round trip of that question, ms.
    pub server_rtt_ms: Option<f64>,
    /// The `--stun` server asked, if any.
    pub stun_server: Option<SocketAddr>,
    /// The address it sees this player at.
    pub stun_sees: Option<SocketAddr>,
    pub mapping: Mapping,
}

/// STUN questions in flight from one socket.
#[derive(Debug)]
pub struct ReflexiveQuery {
    asks: Vec<Ask>,
}

impl ReflexiveQuery {
    /// Asks the rooms server, and `stun` too if given, starting at `now_ns`, with the
    /// transaction ids `ids` (the first for the rooms server): random, and never used
    /// before (RFC 8489 section 5).
    pub fn new(
        room_server: SocketAddr,
        stun: Option<SocketAddr>,
        now_ns: u64,
        ids: [TransactionId; 2],
    ) -> Self {
        let ask = |who, server, txid| Ask {
            who,
            server,
            txid,
            sends: 0,
            next_at: now_ns,
            first_sent: None,
            answer: None,
        };
        let mut asks = vec![ask(Asked::RoomServer, room_server, ids[0])];
        asks.extend(stun.map(|s| ask(Asked::Stun, s, ids[1])));
        Self { asks }
    }

    /// A request due at `now_ns`, written into `buf` (at least [`REQUEST_LEN`] bytes):
    /// where to send it and its length. Call until `None`.
    pub fn poll_transmit(&mut self, now_ns: u64, buf: &mut [u8]) -> Option<(SocketAddr, usize)> {
        let a = self
            .asks
            .iter_mut()
            .find(|a| a.answer.is_none() && a.sends < RETRANSMIT_NS.len() && a.next_at <= now_ns)?;
        let n = stun::write_binding_request(&a.txid, buf).ok()?;
        a.next_at = now_ns + RETRANSMIT_NS[a.sends];
        a.sends += 1;
        a.first_sent.get_or_insert(now_ns);
        Some((a.server, n))
    }

    /// When [`ReflexiveQuery::poll_transmit`] or [`ReflexiveQuery::done`] next changes,
    /// as of `now_ns` (`None`: nothing will).
    pub fn poll_timeout(&self, now_ns: u64) -> Option<u64> {
        self.asks
            .iter()
            .filter(|a| a.answer.is_none() && (a.sends < RETRANSMIT_NS.len() || a.next_at > now_ns))
            .map(|a| a.next_at)
            .min()
    }

    /// Takes a datagram that arrived at `at_ns` from `from`; true if it answered one of
    /// the questions (then nothing else should read it).
    pub fn handle_datagram(&mut self, at_ns: u64, from: SocketAddr, bytes: &[u8]) -> bool {
        let Some(txid) = stun::success_transaction(bytes) else {
            return false;
        };
        let Some(a) = self.asks.iter_mut().find(|a| a.txid == txid && a.server == from) else {
            return false;
        };
        // An answer that does not parse answers nothing: the request is sent again.
        let Ok(mapped) = stun::parse_binding_success(bytes, &txid) else {
            return false;
        };
        if a.answer.is_none() {
            a.answer = Some((mapped, at_ns));
        }
        true
    }

    /// Every question answered, or asked for the last time and waited for.
    pub fn done(&self, now_ns: u64) -> bool {
        self.asks
            .iter()
            .all(|a| a.answer.is_some() || (a.sends >= RETRANSMIT_NS.len() && a.next_at <= now_ns))
    }

    /// What the answers say so far.
    pub fn report(&self) -> Reflexive {
        let find = |who| self.asks.iter().find(|a| a.who == who);
        let server = find(Asked::RoomServer);
        let other = find(Asked::Stun);
        let server_sees = server.and_then(|a| a.answer.map(|x| x.0));
        let stun_sees = other.and_then(|a| a.answer.map(|x| x.0));
        let mapping = match (server_sees, stun_sees) {
            (Some(a), Some(b)) if a == b => Mapping::EndpointIndependent,
            (Some(_), Some(_)) => Mapping::EndpointDependent,
            _ => Mapping::Unknown,
        };
        Reflexive {
            server_sees,
            server_rtt_ms: server.and_then(|a| {
                let (_, at) = a.answer?;
                // The first send's round trip, or a retransmission's: an upper bound.
                Some(at.saturating_sub(a.first_sent?) as f64 / 1e6)
            }),
            stun_server: other.map(|a| a.server),
            stun_sees,
            mapping,
        }
    }
}

/// A request is this long; a buffer for [`ReflexiveQuery::poll_transmit`] needs as much.
pub const REQUEST_BYTES: usize = REQUEST_LEN;

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn answer(q: &ReflexiveQuery, i: usize, mapped: SocketAddr) -> Vec<u8> {
        let mut b = [0u8; 64];
        let n = stun::write_binding_success(&q.asks[i].txid, mapped, &mut b).expect("answer");
        b[..n].to_vec()
    }

    #[test]
    fn retransmits_then_gives_up_and_tells_the_mapping() {
        let server: SocketAddr = "10.99.0.1:4464".parse().unwrap();
        let other: SocketAddr = "10.99.0.2:3478".parse().unwrap();
        let mut q = ReflexiveQuery::new(server, Some(other), 0, [[1; 12], [2; 12]]);
        let mut buf = [0u8; REQUEST_BYTES];
        let sent: Vec<SocketAddr> =
            std::iter::from_fn(|| q.poll_transmit(0, &mut buf).map(|x| x.0)).collect();
        assert_eq!(sent, vec![server, other]);
        assert_eq!(q.poll_timeout(0), Some(250 * MS));
        // The rooms server answers; the other is asked again at 250 ms, 750, 1750 ms.
        let me: SocketAddr = "10.99.0.11:40000".parse().unwrap();
        let a = answer(&q, 0, me);
        assert!(
            !q.handle_datagram(3 * MS, other, &a),
            "an answer from the wrong address"
        );
        assert!(q.handle_datagram(3 * MS, server, &a));
        let mut resent = Vec::new();
        for t in (0..4000).map(|ms| ms * MS) {
            while let Some((to, _)) = q.poll_transmit(t, &mut buf) {
                resent.push((t / MS, to));
            }
        }
        assert_eq!(
            resent,
            vec![(250, other), (750, other), (1750, other)],
            "retransmissions"
        );
        assert!(!q.done(2000 * MS));
        assert!(q.done(2750 * MS));
        assert_eq!(q.poll_timeout(2750 * MS), None, "nothing left to wait for");
        let r = q.report();
        assert_eq!(
            (r.server_sees, r.stun_sees, r.mapping),
            (Some(me), None, Mapping::Unknown)
        );
        assert_eq!(r.server_rtt_ms, Some(3.0));
    }

    #[test]
    fn two_answers_tell_endpoint_independent_from_dependent() {
        let server: SocketAddr = "10.99.0.1:4464".parse().unwrap();
        let other: SocketAddr = "10.99.0.2:3478".parse().unwrap();
        for (theirs, want) in [
            ("10.99.0.11:40000", Mapping::EndpointIndependent),
            ("10.99.0.11:51234", Mapping::EndpointDependent),
        ] {
            let mut q = ReflexiveQuery::new(server, Some(other), 0, [[1; 12], [2; 12]]);
            let mut buf = [0u8; REQUEST_BYTES];
            while q.poll_transmit(0, &mut buf).is_some() {}
            let a = answer(&q, 0, "10.99.0.11:40000".parse().unwrap());
            let b = answer(&q, 1, theirs.parse().unwrap());
            assert!(q.handle_datagram(MS, server, &a) && q.handle_datagram(MS, other, &b));
            assert!(q.done(MS));
            assert_eq!(q.report().mapping, want);
        }
    }
}
