//! The reflector's state machine: what `netjam reflect` does with each datagram.
//!
//! It answers probe hellos with a token, answers probes that carry a valid token, and echoes
//! RTP audio unchanged, so one port serves both link measurement and "hear your own round
//! trip". It is built to be safe to leave running on the internet:
//!
//! - **No amplification.** A reply is never longer than its request: hello requests must be
//!   at least as long as the reply, probe replies have the probe's length, RTP is echoed
//!   byte for byte.
//! - **No reflection onto third parties.** A probe is answered only if it carries a token
//!   the reflector handed to that very source address in a hello reply. Tokens are a keyed
//!   hash of the address under a secret that rotates every epoch, so the reflector keeps no
//!   per-token state; a forged source address never saw its token.
//! - **Bounded memory, bounded rate.** Per-source token buckets and replay windows live in
//!   fixed-capacity tables whose least recently seen entry is evicted when full; hellos
//!   share one global bucket.
//! - **Optional shared secret.** With a [`ProbeKey`], only packets tagged with it are
//!   answered, replies are tagged too, and RTP is echoed only to sources that completed an
//!   authenticated handshake.
//!
//! Like every engine module, it never reads a clock or touches a socket: the caller passes
//! the receive time and the current time with each datagram and sends what it is told to.

use std::collections::HashMap;
use std::net::SocketAddr;

use hmac::digest::KeyInit;
use hmac::Mac;
use serde::{Deserialize, Serialize};

use super::packet::{
    self, addr_bytes, classify, DatagramKind, HelloReply, HmacSha256, Kind, ProbeError, ProbeKey,
    ReflectorFields, TOKEN_LEN,
};

/// Settings of a reflector.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReflectorConfig {
    /// Replies per second one source may draw (probes and echoed RTP each).
    pub rate_limit_pps: u32,
    /// Probe sessions remembered at once (one per source address).
    pub max_sessions: usize,
    /// RTP sources remembered at once for rate limiting.
    pub max_rtp_sources: usize,
    /// Hello replies per second, all sources together.
    pub hello_rate_pps: u32,
    /// How often the token secret rotates; a token is valid for one to two epochs.
    pub token_epoch_ns: u64,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        Self {
            rate_limit_pps: 20_000,
            max_sessions: 4096,
            max_rtp_sources: 1024,
            hello_rate_pps: 2000,
            token_epoch_ns: 300_000_000_000,
        }
    }
}

/// Why a datagram was not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// A probe packet that does not parse (truncated, bad version, unknown kind).
    Malformed,
    /// Missing or wrong authentication tag.
    BadTag,
    /// Token missing, forged, expired or issued to another address.
    BadToken,
    /// A sequence number already seen in this session (or too old to tell).
    Replayed,
    /// Over the source's (or, for hellos, the global) rate limit.
    RateLimited,
    /// A reply kind sent to the reflector.
    Unexpected,
    /// RTP from a source without an authenticated session while a secret is set.
    Unauthenticated,
    /// Neither a probe nor RTP.
    Other,
}

/// What to do with a datagram after [`Reflector::handle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Send the first `len` bytes of the buffer back to the sender.
    Reply { len: usize },
    /// Send nothing.
    Drop(DropReason),
}

/// Counters of a reflector (a serde snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReflectorStats {
    pub datagrams: u64,
    pub hellos_answered: u64,
    pub probes_answered: u64,
    pub rtp_echoed: u64,
    pub malformed: u64,
    pub bad_tag: u64,
    pub bad_token: u64,
    pub replayed: u64,
    pub rate_limited: u64,
    pub unexpected: u64,
    /// RTCP echoed with the media, so a sender measures its round trip through RTCP too.
    pub rtcp_echoed: u64,
    pub unauthenticated: u64,
    pub other: u64,
    pub sessions: u64,
    pub sessions_evicted: u64,
    pub rtp_sources_evicted: u64,
}

/// A token bucket refilled continuously.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last_ns: u64,
}

impl Bucket {
    fn full(capacity: f64, now_ns: u64) -> Self {
        Self {
            tokens: capacity,
            last_ns: now_ns,
        }
    }

    fn take(&mut self, now_ns: u64, rate: f64, capacity: f64) -> bool {
        let dt = now_ns.saturating_sub(self.last_ns) as f64 * 1e-9;
        self.last_ns = self.last_ns.max(now_ns);
        self.tokens = (self.tokens + dt * rate).min(capacity);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

const WINDOW_BITS: u32 = 1024;

/// Sliding anti-replay window over 32-bit sequence numbers.
#[derive(Debug, Clone)]
struct ReplayWindow {
    highest: Option<u32>,
    bits: [u64; (WINDOW_BITS / 64) as usize],
}

impl ReplayWindow {
    fn new() -> Self {
        Self {
            highest: None,
            bits: [0; (WINDOW_BITS / 64) as usize],
        }
    }

    fn bit(seq: u32) -> (usize, u64) {
        let i = seq % WINDOW_BITS;
        ((i / 64) as usize, 1u64 << (i % 64))
    }

    /// Mark `seq` as seen; false if it was seen before or is too old to tell.
    fn accept(&mut self, seq: u32) -> bool {
        match self.highest {
            None => {
                self.highest = Some(seq);
            }
            Some(h) if seq > h => {
                if seq - h >= WINDOW_BITS {
                    self.bits = [0; (WINDOW_BITS / 64) as usize];
                } else {
                    for s in h + 1..seq {
                        let (w, m) = Self::bit(s);
                        self.bits[w] &= !m;
                    }
                }
                self.highest = Some(seq);
            }
            Some(h) => {
                if h - seq >= WINDOW_BITS {
                    return false;
                }
                let (w, m) = Self::bit(seq);
                if self.bits[w] & m != 0 {
                    return false;
                }
            }
        }
        let (w, m) = Self::bit(seq);
        self.bits[w] |= m;
        true
    }
}

#[derive(Debug, Clone)]
struct Session {
    id: u32,
    /// The last token verified for this source and the epoch it belongs to: a probe
    /// carrying the same token skips the keyed hash (it is bound to this address).
    token: [u8; TOKEN_LEN],
    token_epoch: u64,
    received: u32,
    refused: u16,
    window: ReplayWindow,
    bucket: Bucket,
    last_seen_ns: u64,
}

/// The reflector. See the module docs.
#[derive(Debug)]
pub struct Reflector {
    config: ReflectorConfig,
    key: Option<ProbeKey>,
    master: [u8; 32],
    /// Token keys for the current epoch and the one before.
    epoch: Option<u64>,
    epoch_keys: [Option<HmacSha256>; 2],
    sessions: HashMap<SocketAddr, Session>,
    rtp_sources: HashMap<SocketAddr, Bucket>,
    hello_bucket: Bucket,
    stats: ReflectorStats,
}

impl Reflector {
    /// A reflector whose token secrets derive from `master` (random bytes from the caller:
    /// anyone who knows them can mint tokens). `key` is the optional shared secret.
    pub fn new(config: ReflectorConfig, master: [u8; 32], key: Option<ProbeKey>) -> Self {
        let sessions = HashMap::with_capacity(config.max_sessions.min(1 << 16));
        let rtp_sources = HashMap::with_capacity(config.max_rtp_sources.min(1 << 16));
        let hello_bucket = Bucket::full(config.hello_rate_pps as f64 / 10.0 + 1.0, 0);
        Self {
            config,
            key,
            master,
            epoch: None,
            epoch_keys: [None, None],
            sessions,
            rtp_sources,
            hello_bucket,
            stats: ReflectorStats::default(),
        }
    }

    pub fn config(&self) -> &ReflectorConfig {
        &self.config
    }

    pub fn stats(&self) -> ReflectorStats {
        let mut s = self.stats;
        s.sessions = self.sessions.len() as u64;
        s
    }

    fn epoch_key(&self, epoch: u64) -> HmacSha256 {
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&self.master).unwrap_or_else(|_| fallback_mac());
        m.update(b"netjam probe token epoch");
        m.update(&epoch.to_be_bytes());
        let derived = m.finalize().into_bytes();
        <HmacSha256 as KeyInit>::new_from_slice(&derived).unwrap_or_else(|_| fallback_mac())
    }

    fn rotate(&mut self, now_ns: u64) -> u64 {
        let e = now_ns / self.config.token_epoch_ns.max(1);
        if self.epoch != Some(e) {
            let prev = if self.epoch == Some(e.wrapping_sub(1)) {
                self.epoch_keys[0].take()
            } else {
                Some(self.epoch_key(e.wrapping_sub(1)))
            };
            self.epoch_keys = [Some(self.epoch_key(e)), prev];
            self.epoch = Some(e);
        }
        e
    }

    /// The latest time (monotonic ns, as given to [`Reflector::handle`]) at which
    /// [`Reflector::handle_timeout`] should be called: the start of the next token epoch,
    /// when new tokens are minted and those of two epochs ago stop being accepted. `None`
    /// until a datagram or a timeout has fixed the epoch. The reflector is correct without
    /// it (the first datagram of an epoch rotates the keys itself); calling it on time
    /// takes the key derivation out of the packet path.
    pub fn poll_timeout(&self) -> Option<u64> {
        let period = self.config.token_epoch_ns.max(1);
        self.epoch.map(|e| e.saturating_add(1).saturating_mul(period))
    }

    /// Do what is due at `now_ns`: move the token keys into the epoch of `now_ns`.
    pub fn handle_timeout(&mut self, now_ns: u64) {
        self.rotate(now_ns);
    }

    /// The token for `from` in the current epoch.
    pub fn token_for(&mut self, now_ns: u64, from: &SocketAddr) -> [u8; TOKEN_LEN] {
        self.rotate(now_ns);
        let mut out = [0u8; TOKEN_LEN];
        if let Some(k) = &self.epoch_keys[0] {
            let mut m = k.clone();
            m.update(&addr_bytes(from));
            out.copy_from_slice(&m.finalize().into_bytes()[..TOKEN_LEN]);
        }
        out
    }

    /// The epoch whose key issued `token` to `from`, if it is one still accepted.
    fn token_epoch(&mut self, now_ns: u64, from: &SocketAddr, token: &[u8; TOKEN_LEN]) -> Option<u64> {
        let e = self.rotate(now_ns);
        let a = addr_bytes(from);
        self.epoch_keys
            .iter()
            .zip([e, e.wrapping_sub(1)])
            .find_map(|(k, epoch)| {
                let mut m = k.as_ref()?.clone();
                m.update(&a);
                m.verify_truncated_left(token).is_ok().then_some(epoch)
            })
    }

    fn drop(&mut self, why: DropReason) -> Action {
        let s = &mut self.stats;
        match why {
            DropReason::Malformed => s.malformed += 1,
            DropReason::BadTag => s.bad_tag += 1,
            DropReason::BadToken => s.bad_token += 1,
            DropReason::Replayed => s.replayed += 1,
            DropReason::RateLimited => s.rate_limited += 1,
            DropReason::Unexpected => s.unexpected += 1,
            DropReason::Unauthenticated => s.unauthenticated += 1,
            DropReason::Other => s.other += 1,
        }
        Action::Drop(why)
    }

    fn drop_probe_error(&mut self, e: ProbeError) -> Action {
        match e {
            ProbeError::BadTag | ProbeError::MissingTag => self.drop(DropReason::BadTag),
            ProbeError::UnexpectedKind => self.drop(DropReason::Unexpected),
            _ => self.drop(DropReason::Malformed),
        }
    }

    /// Handle one datagram of `len` bytes in `buf`, received from `from` at `rx_at_ns`
    /// (`kernel_ts`: that time came from the kernel); `now_ns` is the time now, just before
    /// the reply would be sent. On [`Action::Reply`], the reply is in `buf[..len]`.
    pub fn handle(
        &mut self,
        now_ns: u64,
        rx_at_ns: u64,
        kernel_ts: bool,
        from: SocketAddr,
        buf: &mut [u8],
        len: usize,
    ) -> Action {
        self.stats.datagrams += 1;
        let len = len.min(buf.len());
        let pkt = &mut buf[..len];
        match classify(pkt) {
            DatagramKind::Probe => self.handle_probe(now_ns, rx_at_ns, kernel_ts, from, pkt),
            DatagramKind::Rtp => self.handle_rtp(now_ns, from, len, false),
            DatagramKind::Rtcp => self.handle_rtp(now_ns, from, len, true),
            DatagramKind::Other => self.drop(DropReason::Other),
        }
    }

    /// Echo media (RTP, or its RTCP when `rtcp`) back to its sender, within the source's
    /// rate limit: same bytes, same size, so never an amplifier.
    fn handle_rtp(&mut self, now_ns: u64, from: SocketAddr, len: usize, rtcp: bool) -> Action {
        if self.key.is_some() && !self.sessions.contains_key(&from) {
            return self.drop(DropReason::Unauthenticated);
        }
        let rate = self.config.rate_limit_pps as f64;
        let cap = burst_capacity(self.config.rate_limit_pps);
        if make_room(&mut self.rtp_sources, &from, self.config.max_rtp_sources, |b| {
            b.last_ns
        }) {
            self.stats.rtp_sources_evicted += 1;
        }
        if self.config.max_rtp_sources == 0 {
            return self.drop(DropReason::RateLimited);
        }
        let bucket = self
            .rtp_sources
            .entry(from)
            .or_insert_with(|| Bucket::full(cap, now_ns));
        if !bucket.take(now_ns, rate, cap) {
            return self.drop(DropReason::RateLimited);
        }
        if rtcp {
            self.stats.rtcp_echoed += 1;
        } else {
            self.stats.rtp_echoed += 1;
        }
        Action::Reply { len }
    }

    fn handle_probe(
        &mut self,
        now_ns: u64,
        rx_at_ns: u64,
        kernel_ts: bool,
        from: SocketAddr,
        pkt: &mut [u8],
    ) -> Action {
        let header = match packet::parse_header(pkt) {
            Ok(h) => h,
            Err(e) => return self.drop_probe_error(e),
        };
        match header.kind {
            Kind::Hello => self.handle_hello(now_ns, from, header.session, pkt),
            Kind::Probe => self.handle_probe_request(now_ns, rx_at_ns, kernel_ts, from, pkt),
            Kind::HelloReply | Kind::ProbeReply => self.drop(DropReason::Unexpected),
        }
    }

    fn handle_hello(&mut self, now_ns: u64, from: SocketAddr, session: u32, pkt: &mut [u8]) -> Action {
        let key = self.key.clone();
        if let Err(e) = packet::check_auth(pkt, key.as_ref()) {
            return self.drop_probe_error(e);
        }
        let reply_len = packet::hello_reply_len(key.as_ref());
        if pkt.len() < reply_len {
            // Answering would amplify.
            return self.drop(DropReason::Malformed);
        }
        let rate = self.config.hello_rate_pps as f64;
        let cap = rate / 10.0 + 1.0;
        if !self.hello_bucket.take(now_ns, rate, cap) {
            return self.drop(DropReason::RateLimited);
        }
        let epoch = self.rotate(now_ns);
        let p = self.config.token_epoch_ns.max(1);
        let valid_until = epoch.saturating_add(2).saturating_mul(p);
        let valid_ms = (valid_until.saturating_sub(now_ns) / 1_000_000).min(u32::MAX as u64) as u32;
        let reply = HelloReply {
            session,
            token: self.token_for(now_ns, &from),
            valid_ms,
        };
        match packet::write_hello_reply(pkt, &reply, key.as_ref()) {
            Ok(len) => {
                self.stats.hellos_answered += 1;
                Action::Reply { len }
            }
            Err(e) => self.drop_probe_error(e),
        }
    }

    fn handle_probe_request(
        &mut self,
        now_ns: u64,
        rx_at_ns: u64,
        kernel_ts: bool,
        from: SocketAddr,
        pkt: &mut [u8],
    ) -> Action {
        let key = self.key.clone();
        let req = match packet::parse_probe(pkt, key.as_ref()) {
            Ok(r) => r,
            Err(e) => return self.drop_probe_error(e),
        };
        let epoch = self.rotate(now_ns);
        let cached = self.sessions.get(&from).and_then(|s| {
            (s.token_epoch.saturating_add(1) >= epoch && same_token(&s.token, &req.token))
                .then_some(s.token_epoch)
        });
        let token_epoch = match cached {
            Some(e) => e,
            None => match self.token_epoch(now_ns, &from, &req.token) {
                Some(e) => e,
                None => return self.drop(DropReason::BadToken),
            },
        };
        if make_room(&mut self.sessions, &from, self.config.max_sessions, |s| {
            s.last_seen_ns
        }) {
            self.stats.sessions_evicted += 1;
        }
        if self.config.max_sessions == 0 {
            return self.drop(DropReason::RateLimited);
        }
        let rate = self.config.rate_limit_pps as f64;
        let cap = burst_capacity(self.config.rate_limit_pps);
        let fresh = || Session {
            id: req.session,
            token: req.token,
            token_epoch,
            received: 0,
            refused: 0,
            window: ReplayWindow::new(),
            bucket: Bucket::full(cap, now_ns),
            last_seen_ns: now_ns,
        };
        let s = self.sessions.entry(from).or_insert_with(fresh);
        if s.id != req.session {
            *s = fresh();
        }
        s.last_seen_ns = now_ns;
        s.token = req.token;
        s.token_epoch = token_epoch;
        if !s.bucket.take(now_ns, rate, cap) {
            s.refused = s.refused.saturating_add(1);
            return self.drop(DropReason::RateLimited);
        }
        if !s.window.accept(req.seq) {
            return self.drop(DropReason::Replayed);
        }
        s.received = s.received.saturating_add(1);
        let fields = ReflectorFields {
            t2_ns: rx_at_ns,
            hold_ns: now_ns.saturating_sub(rx_at_ns).min(u32::MAX as u64) as u32,
            received: s.received,
            refused: s.refused,
            kernel_ts,
        };
        match packet::write_probe_reply(pkt, &fields, key.as_ref()) {
            Ok(len) => {
                self.stats.probes_answered += 1;
                Action::Reply { len }
            }
            Err(e) => self.drop_probe_error(e),
        }
    }
}

/// Keep a per-source table within `max` entries: when `from` is new and the table is full,
/// evict the entry seen longest ago (by `last_seen`). Returns whether one was evicted.
fn make_room<V>(
    table: &mut HashMap<SocketAddr, V>,
    from: &SocketAddr,
    max: usize,
    last_seen: impl Fn(&V) -> u64,
) -> bool {
    if table.contains_key(from) || table.len() < max {
        return false;
    }
    let oldest = table.iter().min_by_key(|(_, v)| last_seen(v)).map(|(a, _)| *a);
    oldest.is_some_and(|a| table.remove(&a).is_some())
}

/// Compare tokens without an early exit.
fn same_token(a: &[u8; TOKEN_LEN], b: &[u8; TOKEN_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn burst_capacity(rate_pps: u32) -> f64 {
    (rate_pps as f64 / 10.0).max(16.0)
}

#[cold]
fn fallback_mac() -> HmacSha256 {
    // HMAC takes keys of every length; this only satisfies the type checker.
    <HmacSha256 as KeyInit>::new(&Default::default())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::probe::packet::{
        parse_hello_reply, parse_probe_reply, write_hello, write_probe, ProbeRequest, HELLO_LEN,
    };

    const MS: u64 = 1_000_000;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, 1], port))
    }

    fn handshake(r: &mut Reflector, now: u64, from: SocketAddr, key: Option<&ProbeKey>) -> [u8; 8] {
        let mut b = [0u8; 128];
        let n = write_hello(&mut b, 42, key).unwrap();
        match r.handle(now, now, false, from, &mut b, n) {
            Action::Reply { len } => {
                assert!(len <= n, "hello reply larger than request");
                parse_hello_reply(&b[..len], key).unwrap().token
            }
            a => panic!("hello not answered: {a:?}"),
        }
    }

    fn probe(seq: u32, token: [u8; 8], key: Option<&ProbeKey>, size: usize) -> Vec<u8> {
        let mut b = vec![0u8; size];
        let req = ProbeRequest {
            session: 42,
            seq,
            t1_ns: 1000 + seq as u64,
            token,
        };
        write_probe(&mut b, size, &req, key).unwrap();
        b
    }

    #[test]
    fn answers_a_probe_with_its_token_at_the_same_size() {
        let mut r = Reflector::new(ReflectorConfig::default(), [3; 32], None);
        let from = addr(5000);
        let token = handshake(&mut r, 0, from, None);
        let mut b = probe(0, token, None, 80);
        let a = r.handle(10 * MS + 500, 10 * MS, true, from, &mut b, 80);
        assert_eq!(a, Action::Reply { len: 80 });
        let rep = parse_probe_reply(&b, 42, None).unwrap();
        assert_eq!(rep.t2_ns, 10 * MS);
        assert_eq!(rep.hold_ns, 500);
        assert_eq!(rep.received, 1);
        assert_eq!(rep.t1_ns, 1000);
        assert!(rep.reflector_kernel_ts);
    }

    #[test]
    fn forged_source_and_wrong_token_are_refused() {
        let mut r = Reflector::new(ReflectorConfig::default(), [3; 32], None);
        let token = handshake(&mut r, 0, addr(5000), None);
        // Same token from another address (a forged source) is refused.
        let mut b = probe(0, token, None, 64);
        assert_eq!(
            r.handle(1, 1, false, addr(5001), &mut b, 64),
            Action::Drop(DropReason::BadToken)
        );
        let mut b = probe(0, [0; 8], None, 64);
        assert_eq!(
            r.handle(1, 1, false, addr(5000), &mut b, 64),
            Action::Drop(DropReason::BadToken)
        );
        // Another reflector (another master secret) does not accept it either.
        let mut other = Reflector::new(ReflectorConfig::default(), [4; 32], None);
        let mut b = probe(0, token, None, 64);
        assert_eq!(
            other.handle(1, 1, false, addr(5000), &mut b, 64),
            Action::Drop(DropReason::BadToken)
        );
        assert_eq!(r.stats().bad_token, 2);
        assert_eq!(r.stats().sessions, 0, "refused probes must not create state");
    }

    #[test]
    fn tokens_expire_after_two_epochs() {
        let cfg = ReflectorConfig {
            token_epoch_ns: 1000 * MS,
            ..ReflectorConfig::default()
        };
        let mut r = Reflector::new(cfg, [3; 32], None);
        let from = addr(1);
        let token = handshake(&mut r, 10, from, None);
        let mut b = probe(0, token, None, 64);
        assert!(matches!(
            r.handle(1500 * MS, 0, false, from, &mut b, 64),
            Action::Reply { .. }
        ));
        let mut b = probe(1, token, None, 64);
        assert_eq!(
            r.handle(2000 * MS, 0, false, from, &mut b, 64),
            Action::Drop(DropReason::BadToken)
        );
    }

    #[test]
    fn poll_timeout_is_when_the_token_epoch_turns() {
        let cfg = ReflectorConfig {
            token_epoch_ns: 1000 * MS,
            ..ReflectorConfig::default()
        };
        let mut r = Reflector::new(cfg, [3; 32], None);
        let from = addr(1);
        assert_eq!(r.poll_timeout(), None, "no epoch before the first datagram");
        let token = handshake(&mut r, 10, from, None);
        assert_eq!(r.poll_timeout(), Some(1000 * MS));
        // Virtual time: the token for this address changes exactly at the timeout.
        assert_eq!(r.token_for(1000 * MS - 1, &from), token);
        r.handle_timeout(1000 * MS);
        let renewed = r.token_for(1000 * MS, &from);
        assert_ne!(renewed, token, "a new epoch mints new tokens");
        let due = r.poll_timeout().expect("the next epoch");
        assert_eq!(due, 2000 * MS);
        // The old token is still accepted until then, and refused from then on.
        let mut b = probe(0, token, None, 64);
        assert!(matches!(
            r.handle(due - 1, 0, false, from, &mut b, 64),
            Action::Reply { .. }
        ));
        r.handle_timeout(due);
        let mut b = probe(1, token, None, 64);
        assert_eq!(
            r.handle(due, 0, false, from, &mut b, 64),
            Action::Drop(DropReason::BadToken)
        );
        let mut b = probe(2, renewed, None, 64);
        assert!(matches!(
            r.handle(due, 0, false, from, &mut b, 64),
            Action::Reply { .. }
        ));
    }

    #[test]
    fn replays_are_dropped_and_counted() {
        let mut r = Reflector::new(ReflectorConfig::default(), [3; 32], None);
        let from = addr(7);
        let token = handshake(&mut r, 0, from, None);
        let expect_replay = [false, false, false, true, true, false, true, false, true];
        for (seq, replay) in [5u32, 3, 4, 5, 3, 2000, 900, 977, 976]
            .into_iter()
            .zip(expect_replay)
        {
            let mut b = probe(seq, token, None, 64);
            let a = r.handle(1, 1, false, from, &mut b, 64);
            if replay {
                assert_eq!(a, Action::Drop(DropReason::Replayed), "seq {seq}");
            } else {
                assert!(matches!(a, Action::Reply { .. }), "seq {seq}: {a:?}");
            }
        }
        // 5,3,4 answered; 5,3 replayed; 2000 answered; 900 too old; 977 answered; 976 too old.
        assert_eq!(r.stats().probes_answered, 5);
        assert_eq!(r.stats().replayed, 4);
    }

    #[test]
    fn replay_window_unit() {
        let mut w = ReplayWindow::new();
        assert!(w.accept(10));
        assert!(!w.accept(10));
        assert!(w.accept(9));
        assert!(w.accept(1033));
        assert!(!w.accept(9), "now outside the window");
        assert!(w.accept(10 + 1024), "slot reused by a newer number");
        assert!(w.accept(u32::MAX));
        assert!(!w.accept(u32::MAX));
    }

    #[test]
    fn hello_shorter_than_reply_is_refused() {
        let mut r = Reflector::new(ReflectorConfig::default(), [3; 32], None);
        let mut b = [0u8; 128];
        write_hello(&mut b, 1, None).unwrap();
        assert_eq!(
            r.handle(0, 0, false, addr(1), &mut b, 16),
            Action::Drop(DropReason::Malformed)
        );
        assert_eq!(
            r.handle(0, 0, false, addr(1), &mut b, HELLO_LEN),
            Action::Reply {
                len: packet::HELLO_REPLY_LEN
            }
        );
    }

    #[test]
    fn rate_limit_per_source() {
        let cfg = ReflectorConfig {
            rate_limit_pps: 100,
            ..ReflectorConfig::default()
        };
        let mut r = Reflector::new(cfg, [3; 32], None);
        let from = addr(9);
        let token = handshake(&mut r, 0, from, None);
        // 1000 probes within 1 s: burst of 16 plus 100/s refill.
        let mut answered = 0;
        for seq in 0..1000u32 {
            let now = seq as u64 * MS;
            let mut b = probe(seq, token, None, 64);
            if matches!(r.handle(now, now, false, from, &mut b, 64), Action::Reply { .. }) {
                answered += 1;
            }
        }
        assert!((100..=120).contains(&answered), "answered {answered}");
        // The refusals are reported to the sender in the next reply.
        let mut b = probe(5000, token, None, 64);
        r.handle(3000 * MS, 3000 * MS, false, from, &mut b, 64);
        let rep = parse_probe_reply(&b, 42, None).unwrap();
        assert_eq!(rep.refused as u64, 1000 - answered);
        // Another source has its own bucket.
        let other = addr(10);
        let token = handshake(&mut r, 0, other, None);
        let mut b = probe(0, token, None, 64);
        assert!(matches!(
            r.handle(999 * MS, 0, false, other, &mut b, 64),
            Action::Reply { .. }
        ));
    }

    #[test]
    fn secret_mode_needs_the_tag_everywhere() {
        let key = ProbeKey::new(b"band secret");
        let mut r = Reflector::new(ReflectorConfig::default(), [3; 32], Some(key.clone()));
        let from = addr(11);
        // Untagged hello: refused.
        let mut b = [0u8; 128];
        let n = write_hello(&mut b, 1, None).unwrap();
        assert_eq!(
            r.handle(0, 0, false, from, &mut b, n),
            Action::Drop(DropReason::BadTag)
        );
        // RTP before a session: refused.
        let mut rtp = [0x80u8, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9, 1, 2];
        assert_eq!(
            r.handle(0, 0, false, from, &mut rtp, 14),
            Action::Drop(DropReason::Unauthenticated)
        );
        let token = handshake(&mut r, 0, from, Some(&key));
        let mut b = probe(0, token, Some(&key), 80);
        assert_eq!(r.handle(0, 0, false, from, &mut b, 80), Action::Reply { len: 80 });
        assert!(parse_probe_reply(&b, 42, Some(&key)).is_ok());
        // Wrong key: refused.
        let mut b = probe(1, token, Some(&ProbeKey::new(b"guess")), 80);
        assert_eq!(
            r.handle(0, 0, false, from, &mut b, 80),
            Action::Drop(DropReason::BadTag)
        );
        // After the handshake RTP is echoed unchanged.
        let before = rtp;
        assert_eq!(
            r.handle(0, 0, false, from, &mut rtp, 14),
            Action::Reply { len: 14 }
        );
        assert_eq!(rtp, before);
    }

    #[test]
    fn rtp_and_rtcp_are_echoed_unchanged() {
        let mut r = Reflector::new(ReflectorConfig::default(), [3; 32], None);
        let mut rtp = [0x80u8, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9, 1, 2, 3];
        let before = rtp;
        assert_eq!(
            r.handle(0, 0, false, addr(1), &mut rtp, 15),
            Action::Reply { len: 15 }
        );
        assert_eq!(rtp, before);
        let mut rtcp = [0x80u8, 200, 0, 1, 0, 0, 0, 7];
        let before = rtcp;
        assert_eq!(
            r.handle(0, 0, false, addr(1), &mut rtcp, 8),
            Action::Reply { len: 8 }
        );
        assert_eq!(rtcp, before);
        assert_eq!((r.stats().rtp_echoed, r.stats().rtcp_echoed), (1, 1));
    }

    /// Two seconds of flood in virtual time: a valid source at 20 000 probes/s against a
    /// 1000/s limit, forged tokens from ever-new addresses, garbage — and a legitimate
    /// sender at 200/s, every one of whose probes is answered.
    #[test]
    fn flood_in_virtual_time_keeps_the_legitimate_sender_answered() {
        let cfg = ReflectorConfig {
            rate_limit_pps: 1000,
            ..ReflectorConfig::default()
        };
        let mut r = Reflector::new(cfg, [3; 32], None);
        let legit = addr(1);
        let greedy = addr(2);
        let legit_token = handshake(&mut r, 0, legit, None);
        let greedy_token = handshake(&mut r, 0, greedy, None);
        let (mut legit_answered, mut greedy_answered) = (0, 0);
        let mut seq = 0u32;
        for us in (0..2_000_000u64).step_by(50) {
            let now = us * 1000;
            let mut b = probe(seq, greedy_token, None, 64);
            if matches!(
                r.handle(now, now, false, greedy, &mut b, 64),
                Action::Reply { .. }
            ) {
                greedy_answered += 1;
            }
            seq += 1;
            if us % 1000 == 0 {
                let spoofed = SocketAddr::from(([198, 51, (us >> 16) as u8, (us >> 8) as u8], us as u16));
                let mut b = probe(seq, legit_token, None, 64);
                assert_eq!(
                    r.handle(now, now, false, spoofed, &mut b, 64),
                    Action::Drop(DropReason::BadToken)
                );
                let mut junk = [0x4E, 0x4A, 0x50, 1, 3, 0, 0];
                assert!(matches!(
                    r.handle(now, now, false, spoofed, &mut junk, 7),
                    Action::Drop(_)
                ));
            }
            if us % 5000 == 0 {
                let mut b = probe((us / 5000) as u32, legit_token, None, 64);
                if matches!(r.handle(now, now, false, legit, &mut b, 64), Action::Reply { .. }) {
                    legit_answered += 1;
                }
            }
        }
        assert_eq!(legit_answered, 400);
        assert!(greedy_answered <= 100 + 2000, "greedy got {greedy_answered}");
        assert!(greedy_answered >= 1900, "greedy got {greedy_answered}");
        assert_eq!(
            r.stats().sessions,
            2,
            "forged sources must not take table entries"
        );
    }

    #[test]
    fn tables_stay_bounded_under_many_sources() {
        let cfg = ReflectorConfig {
            max_sessions: 8,
            max_rtp_sources: 8,
            ..ReflectorConfig::default()
        };
        let mut r = Reflector::new(cfg, [3; 32], None);
        for port in 0..100u16 {
            let from = addr(port);
            let token = handshake(&mut r, port as u64, from, None);
            let mut b = probe(0, token, None, 64);
            assert!(matches!(
                r.handle(port as u64, 0, false, from, &mut b, 64),
                Action::Reply { .. }
            ));
            let mut rtp = [0x80u8, 96, 0, 1, 0, 0, 0, 0, 0, 0, 0, 9];
            r.handle(port as u64, 0, false, from, &mut rtp, 12);
        }
        assert_eq!(r.sessions.len(), 8);
        assert_eq!(r.rtp_sources.len(), 8);
        assert_eq!(r.stats().sessions_evicted, 92);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_never_grow_replies() {
        let mut r = Reflector::new(ReflectorConfig::default(), [3; 32], None);
        let mut rng = crate::rng::SimRng::new(1);
        let mut b = [0u8; 256];
        for i in 0..20_000u64 {
            let len = (rng.next_u64() % 256) as usize;
            for x in b.iter_mut() {
                *x = rng.next_u64() as u8;
            }
            if i % 3 == 0 && len >= 3 {
                b[..4].copy_from_slice(b"NJP\x01");
                b[4] = (rng.next_u64() % 6) as u8;
            }
            if let Action::Reply { len: out } = r.handle(i, i, false, addr(1), &mut b, len) {
                assert!(out <= len);
            }
        }
    }
}
