//! A [`RoomDirectory`] on Redis: which server hosts each room, shared by several
//! `netjam server` processes (`netjam server --directory redis://HOST:PORT`).
//!
//! # Leases
//!
//! A claim is a lease of [`LEASE`] (5 s) that its server renews every [`RENEW_EVERY`]
//! (1 s) while the room has members. A server that dies stops renewing; within 5 s its
//! rooms are free and the next server a player reaches claims them. Four renewals can be
//! lost in a row (a slow Redis, a congested link) before a live room's lease runs out.
//!
//! # Keys and commands
//!
//! * `netjam:room:<name>` holds `"<epoch> <server>"`: the fencing epoch of the claim and
//!   the address players reach the holder at (`--advertise`).
//! * `netjam:epoch` is a counter: every claim takes a fresh epoch from it with `INCR`.
//! * Claim: `INCR netjam:epoch`, then `SET netjam:room:<name> "<epoch> <server>" NX GET PX
//!   5000` — set only if absent, answering with the holder when it is not.
//! * Renew and release: Lua scripts run with `EVALSHA` (`EVAL` the first time) that act only
//!   if the key still holds this server's exact value, epoch included (one call renews
//!   every room a server holds, so a server costs Redis about one call a second however
//!   many rooms it hosts, plus two per room opened and one per room closed) — Redis 7 has no
//!   compare-and-delete of its own. An earlier incarnation of the same server (restarted at
//!   the same address) holds another epoch, so it can neither renew nor release a claim
//!   made since. A renewal that finds the key gone (Redis restarted empty, or the lease ran
//!   out while Redis was unreachable) takes it again, since the room is still playing here;
//!   one that finds another holder reports the room lost, and the directory thread tells
//!   the forwarding thread ([`Placement::Moved`]) so that its players are sent to the
//!   holder rather than playing on as half a band.
//! * Lookup: `GET`.
//! * Public rooms (`jam --public`): `netjam:public:<name>` holds `"<players>\t<region>\t<server>"`
//!   with the same lease, written by the room's server each renewal (one pipelined call
//!   for all of them) and deleted when the room closes (a script: only the server that
//!   wrote it). A server reads the list with `SCAN MATCH netjam:public:*` and `MGET` each
//!   renewal, and answers `netjam rooms` from it.
//!
//! Every call is a blocking round trip to Redis, bounded by [`IO_TIMEOUT`]; it belongs
//! on a thread of its own (the server's directory thread), never on the forwarding thread.
//! A failed call drops the connection and the next call connects again.
//!
//! # Why a crate
//!
//! The `redis` crate speaks RESP, parses `redis://` URLs (with passwords and database
//! numbers) and runs scripts by SHA with the `EVAL` fallback; a hand-written client
//! would repeat all of that for no gain in latency, as nothing here is on the audio or
//! forwarding path. Its blocking API is used: one directory thread needs no async runtime.
//!
//! # The directory thread
//!
//! [`DirectoryThread::spawn`] runs a server's side of it: it takes the forwarding
//! thread's [`DirectoryRequest`]s from a channel (never blocking the sender), claims or
//! looks rooms up, answers with a [`Placement`] on another channel that the forwarding
//! thread drains between batches, releases rooms that emptied and renews every claim each
//! [`RENEW_EVERY`]. Whether Redis answers, and what it cost, is published in a
//! [`DirectoryStatus`] for the command line to say.
//!
//! Never here: anything the forwarding thread waits for.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use netjam_engine::room::directory::{DirectoryError, RoomDirectory, ServerId};
use netjam_engine::room::{DirectoryRequest, ListedRoom, Placement};

/// How long a claim lives without renewal.
pub const LEASE: Duration = Duration::from_secs(5);
/// How often a server renews its claims.
pub const RENEW_EVERY: Duration = Duration::from_secs(1);
/// The longest one call to Redis may take (connecting, sending, waiting for the answer).
pub const IO_TIMEOUT: Duration = Duration::from_millis(500);

const ROOM_PREFIX: &str = "netjam:room:";
const PUBLIC_PREFIX: &str = "netjam:public:";
/// Most public rooms read into one list.
const LIST_MOST: usize = 1024;

/// Deletes the key if its value ends with ARGV[1] (a tab and the server that wrote it).
const UNPUBLISH: &str = r"
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, -string.len(ARGV[1])) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";
const EPOCH_KEY: &str = "netjam:epoch";

/// For each key KEYS[i]: extends its lease (ARGV[1] ms) if it holds exactly ARGV[i + 1],
/// takes it again if it is gone; answers 1 for each renewed, 0 for each held by another.
const RENEW: &str = r"
local out = {}
for i, key in ipairs(KEYS) do
  local v = redis.call('GET', key)
  if v == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
    out[i] = 1
  elseif v == false then
    redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
";
/// Most claims renewed by one call (one script run holds Redis for its duration).
const RENEW_BATCH: usize = 256;

/// Deletes the key if it holds exactly ARGV[1].
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Replaces the key's value ARGV[1] (a dead incarnation's claim) by ARGV[2].
const TAKE_OVER: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";

/// Why a directory URL cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Not a `redis://HOST:PORT` (or `rediss://`, `redis+unix://`) URL.
    #[error("{url:?} is not a Redis URL ({reason}): write redis://HOST:PORT")]
    BadUrl { url: String, reason: String },
    /// Redis did not answer `PING`.
    #[error("no answer from Redis at {url} ({reason}): is redis-server running there and reachable from this machine?")]
    Unreachable { url: String, reason: String },
}

/// The room directory on one Redis server. See the module docs.
pub struct RedisDirectory {
    client: redis::Client,
    url: String,
    conn: Option<redis::Connection>,
    lease_ms: u64,
    /// The claims this directory made and still holds: room → value stored.
    held: HashMap<String, String>,
    /// Rooms whose claim another server took (found while renewing), not yet taken.
    lost: Vec<(String, ServerId)>,
    renew: redis::Script,
    release: redis::Script,
    take_over: redis::Script,
    unpublish: redis::Script,
    /// Calls made to Redis (each one round trip).
    ops: u64,
}

impl std::fmt::Debug for RedisDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisDirectory")
            .field("url", &self.url)
            .field("connected", &self.conn.is_some())
            .field("held", &self.held.len())
            .finish_non_exhaustive()
    }
}

fn unavailable(e: &redis::RedisError) -> DirectoryError {
    DirectoryError::Unavailable(e.to_string())
}

/// The server part of a stored `"<epoch> <server>"`.
fn holder_of(value: &str) -> &str {
    value.split_once(' ').map_or(value, |(_, s)| s)
}

impl RedisDirectory {
    /// A directory at `url` (`redis://HOST:PORT`) with leases of [`LEASE`]: checks the URL
    /// and that Redis answers, so a mistake is said at start, not at the first join.
    pub fn open(url: &str) -> Result<Self, OpenError> {
        Self::open_with_lease(url, LEASE)
    }

    /// [`RedisDirectory::open`] with leases of `lease` (tests shorten it).
    pub fn open_with_lease(url: &str, lease: Duration) -> Result<Self, OpenError> {
        let bad = |reason: String| OpenError::BadUrl {
            url: url.to_owned(),
            reason,
        };
        if !(url.starts_with("redis://") || url.starts_with("rediss://") || url.starts_with("redis+unix://"))
        {
            return Err(bad("it must start with redis://".into()));
        }
        let client = redis::Client::open(url).map_err(|e| bad(e.to_string()))?;
        let mut d = Self {
            client,
            url: url.to_owned(),
            conn: None,
            lease_ms: lease.as_millis().max(1) as u64,
            held: HashMap::new(),
            lost: Vec::new(),
            renew: redis::Script::new(RENEW),
            release: redis::Script::new(RELEASE),
            take_over: redis::Script::new(TAKE_OVER),
            unpublish: redis::Script::new(UNPUBLISH),
            ops: 0,
        };
        d.ping().map_err(|e| OpenError::Unreachable {
            url: url.to_owned(),
            reason: e.to_string(),
        })?;
        Ok(d)
    }

    /// The URL it was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Calls made to Redis so far (each one round trip).
    pub fn ops(&self) -> u64 {
        self.ops
    }

    /// The rooms this directory holds claims on.
    pub fn held(&self) -> impl Iterator<Item = &str> {
        self.held.keys().map(String::as_str)
    }

    /// The fencing epoch of the claim held on `room`, if this directory holds one.
    pub fn epoch(&self, room: &str) -> Option<u64> {
        self.held
            .get(room)
            .and_then(|v| v.split_once(' '))
            .and_then(|(e, _)| e.parse().ok())
    }

    /// Stops renewing the claim on `room` without releasing it: its lease runs out.
    pub fn forget(&mut self, room: &str) {
        self.held.remove(room);
    }

    /// Rooms found held by another server while renewing (each reported once), with
    /// their holder.
    pub fn take_lost(&mut self) -> Vec<(String, ServerId)> {
        std::mem::take(&mut self.lost)
    }

    /// Lists `rooms` (name, players) publicly as `server`'s, in `region`, for one lease:
    /// one call for all of them.
    pub fn publish(
        &mut self,
        rooms: &[(String, u32)],
        server: &str,
        region: &str,
    ) -> Result<(), DirectoryError> {
        if rooms.is_empty() {
            return Ok(());
        }
        let ms = self.lease_ms;
        self.with_conn(|c| {
            let mut p = redis::pipe();
            for (room, members) in rooms {
                p.cmd("SET")
                    .arg(format!("{PUBLIC_PREFIX}{room}"))
                    .arg(format!("{members}\t{region}\t{server}"))
                    .arg("PX")
                    .arg(ms)
                    .ignore();
            }
            p.query::<()>(c)
        })
    }

    /// Takes `room` off the public list if `server` listed it.
    pub fn unpublish(&mut self, room: &str, server: &str) -> Result<(), DirectoryError> {
        let key = format!("{PUBLIC_PREFIX}{room}");
        let script = self.unpublish.clone();
        let _: i64 = self.with_conn(|c| script.key(&key).arg(format!("\t{server}")).invoke(c))?;
        Ok(())
    }

    /// Every server's public rooms (at most 1024), by name.
    pub fn public_rooms(&mut self) -> Result<Vec<ListedRoom>, DirectoryError> {
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = self.with_conn(|c| {
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{PUBLIC_PREFIX}*"))
                    .arg("COUNT")
                    .arg(500)
                    .query(c)
            })?;
            keys.extend(batch);
            cursor = next;
            if cursor == 0 || keys.len() >= LIST_MOST {
                break;
            }
        }
        keys.truncate(LIST_MOST);
        keys.sort_unstable();
        keys.dedup();
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let values: Vec<Option<String>> = self.with_conn(|c| redis::cmd("MGET").arg(&keys).query(c))?;
        Ok(keys
            .iter()
            .zip(values)
            .filter_map(|(k, v)| {
                let v = v?;
                let mut f = v.splitn(3, '\t');
                let members = f.next()?.parse().ok()?;
                let region = f.next()?.to_owned();
                let server = f.next()?.to_owned();
                Some(ListedRoom {
                    room: k.strip_prefix(PUBLIC_PREFIX)?.to_owned(),
                    server,
                    members,
                    region,
                })
            })
            .collect())
    }

    /// Whether Redis answers now.
    pub fn ping(&mut self) -> Result<(), DirectoryError> {
        self.with_conn(|c| redis::cmd("PING").query::<String>(c))
            .map(drop)
    }

    fn key(room: &str) -> String {
        format!("{ROOM_PREFIX}{room}")
    }

    /// Runs `f` on the connection (made first if there is none); a failure drops it.
    fn with_conn<T>(
        &mut self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, DirectoryError> {
        if self.conn.is_none() {
            let c = self
                .client
                .get_connection_with_timeout(IO_TIMEOUT)
                .map_err(|e| unavailable(&e))?;
            c.set_read_timeout(Some(IO_TIMEOUT))
                .map_err(|e| unavailable(&e))?;
            c.set_write_timeout(Some(IO_TIMEOUT))
                .map_err(|e| unavailable(&e))?;
            self.conn = Some(c);
        }
        let Some(c) = self.conn.as_mut() else {
            return Err(DirectoryError::Unavailable("not connected".into()));
        };
        self.ops += 1;
        match f(c) {
            Ok(v) => Ok(v),
            Err(e) => {
                self.conn = None;
                Err(unavailable(&e))
            }
        }
    }
}

impl RoomDirectory for RedisDirectory {
    fn lookup(&mut self, room: &str, _now_ns: u64) -> Result<Option<ServerId>, DirectoryError> {
        let key = Self::key(room);
        let v: Option<String> = self.with_conn(|c| redis::cmd("GET").arg(&key).query(c))?;
        Ok(v.map(|v| holder_of(&v).to_owned()))
    }

    fn claim(&mut self, room: &str, server: &str, _now_ns: u64) -> Result<ServerId, DirectoryError> {
        let key = Self::key(room);
        let ms = self.lease_ms;
        if let Some(mine) = self.held.get(room).cloned() {
            // Held already: renew, and if it is lost say who has it.
            let script = self.renew.clone();
            let ok: Vec<i64> = self.with_conn(|c| script.key(&key).arg(ms).arg(&mine).invoke(c))?;
            if ok.first() == Some(&1) {
                return Ok(server.to_owned());
            }
            self.held.remove(room);
        }
        let epoch: u64 = self.with_conn(|c| redis::cmd("INCR").arg(EPOCH_KEY).query(c))?;
        let value = format!("{epoch} {server}");
        let before: Option<String> = self.with_conn(|c| {
            redis::cmd("SET")
                .arg(&key)
                .arg(&value)
                .arg("NX")
                .arg("GET")
                .arg("PX")
                .arg(ms)
                .query(c)
        })?;
        match before {
            None => {
                self.held.insert(room.to_owned(), value);
                Ok(server.to_owned())
            }
            Some(old) if holder_of(&old) == server => {
                // An earlier incarnation of this server (same address, another epoch)
                // claimed it and died or forgot it: take it over if it is still that claim.
                let script = self.take_over.clone();
                let took: i64 =
                    self.with_conn(|c| script.key(&key).arg(&old).arg(&value).arg(ms).invoke(c))?;
                if took == 1 {
                    self.held.insert(room.to_owned(), value);
                    return Ok(server.to_owned());
                }
                Ok(self.lookup(room, 0)?.unwrap_or_default())
            }
            Some(old) => Ok(holder_of(&old).to_owned()),
        }
    }

    fn renew(&mut self, _server: &str, _now_ns: u64) -> Result<(), DirectoryError> {
        let ms = self.lease_ms;
        let held: Vec<(String, String)> = self.held.iter().map(|(r, v)| (r.clone(), v.clone())).collect();
        let script = self.renew.clone();
        for batch in held.chunks(RENEW_BATCH) {
            let ok: Vec<i64> = self.with_conn(|c| {
                let mut call = script.prepare_invoke();
                call.arg(ms);
                for (room, value) in batch {
                    call.key(Self::key(room)).arg(value);
                }
                call.invoke(c)
            })?;
            for ((room, _), ok) in batch.iter().zip(ok.iter().chain(std::iter::repeat(&0))) {
                if *ok != 1 {
                    self.held.remove(room);
                    let holder = self.lookup(room, 0)?.unwrap_or_default();
                    self.lost.push((room.clone(), holder));
                }
            }
        }
        Ok(())
    }

    fn release(&mut self, room: &str, _server: &str) -> Result<(), DirectoryError> {
        let Some(value) = self.held.get(room).cloned() else {
            return Ok(());
        };
        let key = Self::key(room);
        let script = self.release.clone();
        let _: i64 = self.with_conn(|c| script.key(&key).arg(&value).invoke(c))?;
        self.held.remove(room);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holders_are_read_from_stored_values() {
        assert_eq!(holder_of("17 10.0.0.1:4464"), "10.0.0.1:4464");
        assert_eq!(holder_of("odd"), "odd");
    }

    #[test]
    fn urls_that_are_not_redis_are_refused_before_any_connection() {
        for url in ["http://localhost:6379", "localhost:6379", "redis://[::1"] {
            match RedisDirectory::open(url) {
                Err(OpenError::BadUrl { .. }) => {}
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}

/// The forwarding thread's ends of the directory thread's channels.
#[derive(Debug)]
pub struct DirectoryLink {
    /// Requests from the core ([`netjam_engine::room::Server::poll_directory`]); sending
    /// never blocks.
    pub requests: mpsc::Sender<DirectoryRequest>,
    /// Answers for [`netjam_engine::room::Server::placed`]; read with `try_recv`.
    pub answers: mpsc::Receiver<(String, Placement)>,
    /// Every server's public rooms, when the list changed, for
    /// [`netjam_engine::room::Server::set_listing`]; read with `try_recv`.
    pub listings: mpsc::Receiver<Vec<ListedRoom>>,
}

/// What the directory thread reports.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DirectoryStatus {
    /// The directory's URL.
    pub url: String,
    /// The address this server advertises (what redirects to it name).
    pub advertise: String,
    /// Whether Redis answered the last call.
    pub reachable: bool,
    /// The last error, while it does not answer.
    pub error: Option<String>,
    /// Rooms this server holds claims on.
    pub rooms_held: usize,
    /// Most rooms held at once.
    pub rooms_held_max: usize,
    /// Calls made to Redis (each one round trip).
    pub ops: u64,
    /// Seconds since the thread started.
    pub uptime_s: f64,
    /// Rooms claimed for this server, answered elsewhere, and refused for want of Redis.
    pub claimed: u64,
    pub elsewhere: u64,
    pub unavailable: u64,
    /// Rooms whose claim another server took while this one still had them: (room, holder).
    pub lost: Vec<(String, String)>,
}

/// A server's directory thread. Stopping it (or dropping the forwarding thread's end)
/// releases every claim it holds.
#[derive(Debug)]
pub struct DirectoryThread {
    status: Arc<Mutex<DirectoryStatus>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl DirectoryThread {
    /// Runs `directory` for the server that players reach at `advertise`, whose region
    /// label is `region`. With `wake` (the forwarding thread's socket), every answer is
    /// followed by an empty datagram there, so the forwarding thread takes it at once
    /// instead of at its next idle wake (a join through a redirect waits for it).
    pub fn spawn(
        directory: RedisDirectory,
        advertise: String,
        region: String,
        wake: Option<SocketAddr>,
    ) -> std::io::Result<(Self, DirectoryLink)> {
        let wake = match wake {
            Some(to) => {
                let to = wake_address(to);
                let from = SocketAddr::new(to.ip(), 0);
                Some((std::net::UdpSocket::bind(from)?, to))
            }
            None => None,
        };
        let (req_tx, req_rx) = mpsc::channel();
        let (ans_tx, ans_rx) = mpsc::channel();
        let (list_tx, list_rx) = mpsc::channel();
        let status = Arc::new(Mutex::new(DirectoryStatus {
            url: directory.url().to_owned(),
            advertise: advertise.clone(),
            reachable: true,
            ..DirectoryStatus::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (status, stop) = (status.clone(), stop.clone());
            std::thread::Builder::new()
                .name("netjam-directory".into())
                .spawn(move || {
                    let wires = Wires {
                        requests: req_rx,
                        answers: ans_tx,
                        listings: list_tx,
                        wake,
                    };
                    run(directory, &advertise, &region, &wires, &status, &stop);
                })?
        };
        Ok((
            Self {
                status,
                stop,
                thread: Some(thread),
            },
            DirectoryLink {
                requests: req_tx,
                answers: ans_rx,
                listings: list_rx,
            },
        ))
    }

    /// The latest status.
    pub fn status(&self) -> DirectoryStatus {
        match self.status.lock() {
            Ok(s) => s.clone(),
            Err(e) => e.into_inner().clone(),
        }
    }

    /// Releases every claim and stops.
    pub fn stop(mut self) -> DirectoryStatus {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.status()
    }
}

impl Drop for DirectoryThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Where `room` lives, claiming it for `me` if nobody holds it.
fn locate(d: &mut RedisDirectory, room: &str, me: &str) -> Result<Placement, DirectoryError> {
    let holder = d.claim(room, me, 0)?;
    Ok(if holder == me {
        Placement::Here
    } else {
        Placement::Elsewhere(holder)
    })
}

/// The directory thread's ends of its channels.
struct Wires {
    requests: mpsc::Receiver<DirectoryRequest>,
    answers: mpsc::Sender<(String, Placement)>,
    listings: mpsc::Sender<Vec<ListedRoom>>,
    /// Where an empty datagram wakes the forwarding thread (see [`DirectoryThread::spawn`]).
    wake: Option<(std::net::UdpSocket, SocketAddr)>,
}

impl Wires {
    /// Wakes the forwarding thread to take what was just sent; a lost wake costs one idle
    /// wake's wait, as before.
    fn wake(&self) {
        if let Some((s, to)) = &self.wake {
            let _ = s.send_to(&[], to);
        }
    }
}

/// Where to reach a socket bound to `bound` from this machine: a wildcard address becomes
/// the loopback of its family.
pub fn wake_address(bound: SocketAddr) -> SocketAddr {
    match bound.ip() {
        std::net::IpAddr::V4(a) if a.is_unspecified() => {
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, bound.port()))
        }
        std::net::IpAddr::V6(a) if a.is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, bound.port()))
        }
        _ => bound,
    }
}

fn run(
    mut d: RedisDirectory,
    me: &str,
    region: &str,
    w: &Wires,
    status: &Mutex<DirectoryStatus>,
    stop: &AtomicBool,
) {
    // This server's public rooms and their players; the last list sent.
    let mut public: HashMap<String, u32> = HashMap::new();
    let mut listed: Vec<ListedRoom> = Vec::new();
    let started = Instant::now();
    let mut next_renew = started + RENEW_EVERY;
    let mut st = DirectoryStatus {
        url: d.url().to_owned(),
        advertise: me.to_owned(),
        reachable: true,
        ..DirectoryStatus::default()
    };
    let result = |st: &mut DirectoryStatus, r: &Result<(), DirectoryError>| match r {
        Ok(()) => {
            st.reachable = true;
            st.error = None;
        }
        Err(e) => {
            st.reachable = false;
            st.error = Some(e.to_string());
        }
    };
    while !stop.load(Ordering::Relaxed) {
        let wait = next_renew
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(100));
        match w.requests.recv_timeout(wait) {
            Ok(DirectoryRequest::Locate(room)) => {
                let placement = match locate(&mut d, &room, me) {
                    Ok(p) => {
                        result(&mut st, &Ok(()));
                        p
                    }
                    Err(e) => {
                        result(&mut st, &Err(e));
                        Placement::Unavailable
                    }
                };
                match &placement {
                    Placement::Here => st.claimed += 1,
                    Placement::Elsewhere(_) => st.elsewhere += 1,
                    Placement::Unavailable => st.unavailable += 1,
                    Placement::Moved(_) => {}
                }
                if w.answers.send((room, placement)).is_err() {
                    break;
                }
                w.wake();
            }
            Ok(DirectoryRequest::Vacate(room)) => {
                let r = d.release(&room, me);
                if r.is_err() {
                    // Its lease runs out instead.
                    d.forget(&room);
                }
                result(&mut st, &r);
            }
            Ok(DirectoryRequest::Listed { room, members: 0 }) => {
                public.remove(&room);
                let r = d.unpublish(&room, me);
                result(&mut st, &r);
            }
            Ok(DirectoryRequest::Listed { room, members }) => {
                public.insert(room, members);
                // Published at once, so a list asked for right after shows it.
                next_renew = Instant::now();
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        let now = Instant::now();
        if now >= next_renew {
            next_renew = now + RENEW_EVERY;
            let mut r = if d.held().next().is_some() {
                d.renew(me, 0)
            } else {
                d.ping()
            };
            if r.is_ok() {
                let rooms: Vec<(String, u32)> = public.iter().map(|(k, v)| (k.clone(), *v)).collect();
                r = d.publish(&rooms, me, region);
            }
            if r.is_ok() {
                match d.public_rooms() {
                    Ok(list) => {
                        if list != listed {
                            listed = list;
                            let _ = w.listings.send(listed.clone());
                            w.wake();
                        }
                    }
                    Err(e) => r = Err(e),
                }
            }
            result(&mut st, &r);
            // A room another server claimed since: its players here are sent there.
            let lost = d.take_lost();
            for (room, holder) in &lost {
                if w.answers
                    .send((room.clone(), Placement::Moved(holder.clone())))
                    .is_err()
                {
                    break;
                }
            }
            if !lost.is_empty() {
                w.wake();
            }
            st.lost.extend(lost);
        }
        st.rooms_held = d.held().count();
        st.rooms_held_max = st.rooms_held_max.max(st.rooms_held);
        st.ops = d.ops();
        st.uptime_s = started.elapsed().as_secs_f64();
        if let Ok(mut s) = status.lock() {
            s.clone_from(&st);
        }
    }
    let rooms: Vec<String> = d.held().map(str::to_owned).collect();
    for room in rooms {
        let _ = d.release(&room, me);
    }
    for room in public.keys() {
        let _ = d.unpublish(room, me);
    }
    st.rooms_held = d.held().count();
    st.ops = d.ops();
    if let Ok(mut s) = status.lock() {
        s.clone_from(&st);
    }
}
