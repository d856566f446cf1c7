//! Pages served by the process itself: one HTML page embedded in the binary and one
//! WebSocket (`/ws`) that pushes JSON text messages, on threads of their own. The
//! server's read-only page ([`server_page`]) and the player's own page ([`room_page`]);
//! what they show is published to a [`Board`] from the snapshots the process already
//! makes. A page that may change something (the player's mix) hands each text message it
//! sends to the server's [`Inbox`], which says yes or why not; a refusal goes back to that
//! page as an error event.
//!
//! Crates: the WebSocket is [`tungstenite`]'s (already used by the ensemble's bridge,
//! blocking, no runtime), and HTTP requests are parsed by [`httparse`] (the parser
//! tungstenite's own handshake uses). A small HTTP server crate such as `tiny_http` was
//! weighed: it gives no way to bound the connections it takes, to time out a silent one
//! or to put a write timeout on an upgraded stream, and everything that comes from the
//! network here must be bounded. The serving left to this module is small: read one
//! request head (at most [`MAX_HEAD_BYTES`] within [`REQUEST_TIMEOUT`]), answer the page,
//! a refusal or the WebSocket upgrade, and close.
//!
//! Who may look ([`Access`]): a page bound to a loopback address is served without a
//! token, but only to requests that name a loopback host (`localhost`, `127.x.y.z`,
//! `[::1]`), so a web site that rebinds its name to 127.0.0.1 is refused. Any other bind
//! needs a random token in the URL (`?token=…`, printed once at start) for the page and
//! the WebSocket alike. The WebSocket handshake also checks that a browser's `Origin` is
//! the page's own (`http://` + the `Host` it asked for): a page from another site gets
//! `403`. Programs other than browsers send no `Origin` and pass on the token alone.
//!
//! Bounds: [`MAX_CONNECTIONS`] connections at once (one more is answered `503`), one
//! thread each; a page that does not take a message within [`WRITE_TIMEOUT`] is
//! disconnected; a slow page skips snapshots rather than queueing them (it is always sent
//! the newest), and keeps up to [`KEPT_EVENTS`] events.
//!
//! Never here: anything on the forwarding or audio threads, any lock those threads take,
//! reading a request body, serving files from disk, or acting on what a page sends (that
//! is the [`Inbox`]'s, which only checks and queues it).

pub mod room_page;
pub mod server_page;

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use tungstenite::protocol::{Role, WebSocketConfig};
use tungstenite::{Message, WebSocket};

/// Connections held at once (pages and plain requests). Each costs one thread.
pub const MAX_CONNECTIONS: usize = 32;
/// The longest request head read; a longer one is refused (`431`).
pub const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Time a connection has to send its whole request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// A page that does not take a message within this long is disconnected.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// Events kept for a page that connects or falls behind.
pub const KEPT_EVENTS: usize = 64;
/// The WebSocket's path.
pub const WS_PATH: &str = "/ws";
/// The largest message a page may send (a command of the mix is a few dozen bytes).
pub const MAX_INCOMING: usize = 4 * 1024;
/// Messages taken from one page per wake, at most; the rest wait for the next.
const INCOMING_PER_WAKE: usize = 64;
/// How long the accepting thread waits before trying again after a failed accept.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// Longest a page's thread waits for news before it looks at what the page sent.
const PAGE_WAKE: Duration = Duration::from_millis(500);

/// Why a page cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum WebError {
    #[error("{addr} is in use by another program")]
    InUse { addr: SocketAddr },
    #[error("{addr} is not an address of this machine")]
    NotHere { addr: SocketAddr },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("no randomness from the operating system for the page's token: {0}")]
    NoRandomness(String),
    #[error("cannot start the page's thread: {0}")]
    Thread(io::Error),
}

/// Who may see a page: see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// Required in the URL's query (`token=…`) when set.
    token: Option<String>,
    /// Only requests naming a loopback host are served.
    loopback_only: bool,
}

/// Why a request was refused (`403`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("this page is served to this machine only: open it as localhost or 127.0.0.1")]
    HostNotLoopback,
    #[error("this page needs the token netjam printed when it started (?token=...)")]
    Token,
    #[error("a page from another site may not read this one")]
    ForeignOrigin,
}

impl Access {
    /// The rule for a page bound to `addr`: loopback without a token; anything else with a
    /// fresh random token.
    pub fn for_bind(addr: IpAddr) -> Result<Self, WebError> {
        if addr.is_loopback() {
            return Ok(Self {
                token: None,
                loopback_only: true,
            });
        }
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| WebError::NoRandomness(e.to_string()))?;
        let token = raw.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self {
            token: Some(token),
            loopback_only: false,
        })
    }

    /// The token a URL must carry, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Whether a request for `target` (path and query), naming `host`, from a page of
    /// `origin` (browsers send one with every WebSocket handshake), may be answered.
    pub fn check(&self, target: &str, host: Option<&str>, origin: Option<&str>) -> Result<(), Refusal> {
        if self.loopback_only && !host.is_some_and(names_loopback) {
            return Err(Refusal::HostNotLoopback);
        }
        if let Some(want) = &self.token {
            let given = query_value(target, "token").unwrap_or("");
            if !same_secret(given.as_bytes(), want.as_bytes()) {
                return Err(Refusal::Token);
            }
        }
        if let Some(origin) = origin {
            let own = host.map(|h| format!("http://{h}"));
            if !own.is_some_and(|own| own.eq_ignore_ascii_case(origin)) {
                return Err(Refusal::ForeignOrigin);
            }
        }
        Ok(())
    }
}

/// Compares without stopping at the first difference.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of `key` in `target`'s query, if given.
fn query_value<'a>(target: &'a str, key: &str) -> Option<&'a str> {
    let (_, query) = target.split_once('?')?;
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// Whether a `Host` header names this machine (`localhost`, `127.x.y.z`, `[::1]`, with
/// or without a port).
fn names_loopback(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or("", |(a, _)| a),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// A bound listener and the rule for it, before anything is served: binding first lets
/// a command refuse a bad address before it starts its real work.
#[derive(Debug)]
pub struct WebListener {
    listener: TcpListener,
    local: SocketAddr,
    access: Access,
}

impl WebListener {
    pub fn bind(addr: SocketAddr) -> Result<Self, WebError> {
        let listener = TcpListener::bind(addr).map_err(|source| match source.kind() {
            io::ErrorKind::AddrInUse => WebError::InUse { addr },
            io::ErrorKind::AddrNotAvailable => WebError::NotHere { addr },
            _ => WebError::Bind { addr, source },
        })?;
        let local = listener
            .local_addr()
            .map_err(|source| WebError::Bind { addr, source })?;
        let access = Access::for_bind(addr.ip())?;
        Ok(Self {
            listener,
            local,
            access,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn access(&self) -> &Access {
        &self.access
    }

    /// The URL to open: on a wildcard bind, through loopback (the same token opens it
    /// from elsewhere with this machine's address).
    pub fn url(&self) -> String {
        let host = match self.local.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        let at = SocketAddr::new(host, self.local.port());
        match self.access.token() {
            Some(t) => format!("http://{at}/?token={t}"),
            None => format!("http://{at}/"),
        }
    }
}

/// The latest snapshot and recent events, as JSON texts, for every page's thread.
#[derive(Debug, Default)]
pub struct Board {
    state: Mutex<BoardState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct BoardState {
    /// Bumped with every snapshot.
    seq: u64,
    snapshot: Option<Arc<str>>,
    /// (number, event), the newest last.
    events: VecDeque<(u64, Arc<str>)>,
    next_event: u64,
    closed: bool,
}

/// What a page has not been sent yet.
#[derive(Debug, Default)]
struct News {
    events: Vec<Arc<str>>,
    snapshot: Option<Arc<str>>,
    closed: bool,
}

impl Board {
    fn state(&self) -> MutexGuard<'_, BoardState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes a snapshot and the events that came with it.
    pub fn publish(&self, snapshot: String, events: Vec<String>) {
        let mut s = self.state();
        for e in events {
            s.next_event += 1;
            let n = s.next_event;
            s.events.push_back((n, e.into()));
            if s.events.len() > KEPT_EVENTS {
                s.events.pop_front();
            }
        }
        s.seq += 1;
        s.snapshot = Some(snapshot.into());
        drop(s);
        self.changed.notify_all();
    }

    /// Wakes every page's thread to close its page.
    pub fn close(&self) {
        self.state().closed = true;
        self.changed.notify_all();
    }

    /// What is newer than (`seq`, `event`), waiting up to `wait` for something; the two
    /// are moved on to what is returned.
    fn news(&self, seq: &mut u64, event: &mut u64, wait: Duration) -> News {
        let s = self.state();
        let (s, _) = self
            .changed
            .wait_timeout_while(s, wait, |s| !s.closed && s.seq == *seq && s.next_event == *event)
            .unwrap_or_else(|e| e.into_inner());
        let events = s
            .events
            .iter()
            .filter(|(n, _)| *n > *event)
            .map(|(_, e)| e.clone())
            .collect();
        let snapshot = (s.seq != *seq).then(|| s.snapshot.clone()).flatten();
        *seq = s.seq;
        *event = s.next_event;
        News {
            events,
            snapshot,
            closed: s.closed,
        }
    }
}

/// Where a page's text messages go. [`Inbox::take`] runs on the page's own thread: it
/// checks the message and queues what it asks for, never waiting on the audio side.
pub trait Inbox: Send + Sync + 'static {
    /// Takes one message from a page: `Err` says why it was refused (sent back to that page
    /// as `{"type":"error","text":…}`).
    fn take(&self, text: &str) -> Result<(), String>;
}

/// The reply to a refused message.
#[derive(Serialize)]
struct Refused<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

/// Counters of a page server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WebStats {
    /// Pages (WebSockets) open now.
    pub pages_open: u64,
    /// Times the page itself was sent.
    pub page_loads: u64,
    /// WebSockets opened.
    pub sockets_opened: u64,
    /// Messages sent to pages.
    pub messages_sent: u64,
    /// Requests refused `403` (host, token or origin).
    pub refused: u64,
    /// Connections refused `503` because [`MAX_CONNECTIONS`] were held.
    pub busy: u64,
    /// Requests malformed, too long, or too slow to arrive.
    pub bad_requests: u64,
    /// Pages disconnected because they took no message within [`WRITE_TIMEOUT`].
    pub stalled: u64,
    /// Messages from pages taken by the [`Inbox`].
    pub commands: u64,
    /// Messages from pages refused (not JSON, not a command, out of range, unknown name,
    /// binary, or sent to a page server that takes none).
    pub commands_refused: u64,
}

#[derive(Debug, Default)]
struct Counters {
    pages_open: AtomicU64,
    page_loads: AtomicU64,
    sockets_opened: AtomicU64,
    messages_sent: AtomicU64,
    refused: AtomicU64,
    busy: AtomicU64,
    bad_requests: AtomicU64,
    stalled: AtomicU64,
    commands: AtomicU64,
    commands_refused: AtomicU64,
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    fn snapshot(&self) -> WebStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WebStats {
            pages_open: g(&self.pages_open),
            page_loads: g(&self.page_loads),
            sockets_opened: g(&self.sockets_opened),
            messages_sent: g(&self.messages_sent),
            refused: g(&self.refused),
            busy: g(&self.busy),
            bad_requests: g(&self.bad_requests),
            stalled: g(&self.stalled),
            commands: g(&self.commands),
            commands_refused: g(&self.commands_refused),
        }
    }
}

/// What the connection threads share.
#[derive(Debug)]
struct Shared {
    access: Access,
    page: &'static str,
    board: Arc<Board>,
    inbox: Option<Arc<dyn Inbox>>,
    counters: Counters,
    live: AtomicUsize,
    stop: AtomicBool,
}

impl std::fmt::Debug for dyn Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Inbox")
    }
}

/// A running page server: its accepting thread, and through the [`Board`] its pages.
#[derive(Debug)]
pub struct WebServer {
    local: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl WebServer {
    /// Serves `page` (a whole HTML document) on `listener`, and on [`WS_PATH`] what is
    /// published to `board`.
    pub fn start(listener: WebListener, page: &'static str, board: Arc<Board>) -> Result<Self, WebError> {
        Self::start_with_inbox(listener, page, board, None)
    }

    /// As [`WebServer::start`], handing what pages send to `inbox` (without one, every
    /// message is refused).
    pub fn start_with_inbox(
        listener: WebListener,
        page: &'static str,
        board: Arc<Board>,
        inbox: Option<Arc<dyn Inbox>>,
    ) -> Result<Self, WebError> {
        let WebListener {
            listener,
            local,
            access,
        } = listener;
        let shared = Arc::new(Shared {
            access,
            page,
            board,
            inbox,
            counters: Counters::default(),
            live: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        });
        let accept = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("netjam-web".into())
                .spawn(move || accept_loop(&listener, &shared))
                .map_err(WebError::Thread)?
        };
        Ok(Self {
            local,
            shared,
            accept: Some(accept),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    pub fn stats(&self) -> WebStats {
        self.shared.counters.snapshot()
    }

    /// Closes every page and stops accepting.
    pub fn stop(mut self) -> WebStats {
        self.halt();
        self.stats()
    }

    fn halt(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.board.close();
        if let Some(t) = self.accept.take() {
            // The accepting thread waits in accept(): a connection of our own wakes it to
            // see the flag. Without one (no route to ourselves), it is left to end with the
            // process rather than waited for.
            let wake = match self.local.ip() {
                IpAddr::V4(ip) if ip.is_unspecified() => {
                    SocketAddr::from((Ipv4Addr::LOCALHOST, self.local.port()))
                }
                IpAddr::V6(ip) if ip.is_unspecified() => {
                    SocketAddr::from((Ipv6Addr::LOCALHOST, self.local.port()))
                }
                _ => self.local,
            };
            if TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok() {
                let _ = t.join();
            }
        }
    }
}

impl Drop for WebServer {
    fn drop(&mut self) {
        self.halt();
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::Relaxed) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            // Out of descriptors and the like: let it pass rather than spin.
            Err(_) => {
                std::thread::sleep(ACCEPT_RETRY);
                continue;
            }
        };
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }
        if shared.live.load(Ordering::Acquire) >= MAX_CONNECTIONS {
            bump(&shared.counters.busy);
            let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
            let _ = answer(
                &stream,
                "503 Service Unavailable",
                "text/plain",
                b"too many pages open\n",
            );
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        shared.live.fetch_add(1, Ordering::AcqRel);
        let for_thread = shared.clone();
        let started = std::thread::Builder::new()
            .name("netjam-web-page".into())
            .spawn(move || {
                serve(stream, &for_thread);
                for_thread.live.fetch_sub(1, Ordering::AcqRel);
            });
        if started.is_err() {
            shared.live.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// The parts of a request head this module looks at.
#[derive(Debug, Default)]
struct Head {
    method: String,
    target: String,
    host: Option<String>,
    origin: Option<String>,
    upgrade_websocket: bool,
    connection_upgrade: bool,
    ws_version_13: bool,
    ws_key: Option<String>,
}

enum ReadHead {
    /// The head, and any bytes read after it.
    Complete(Head, Vec<u8>),
    TooLong,
    Malformed,
    /// Closed or timed out before the head was whole.
    Gone,
}

fn read_head(stream: &mut TcpStream) -> ReadHead {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut buf = vec![0u8; MAX_HEAD_BYTES];
    let mut filled = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return ReadHead::Gone;
        }
        match stream.read(&mut buf[filled..]) {
            Ok(0) | Err(_) => return ReadHead::Gone,
            Ok(n) => filled += n,
        }
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..filled]) {
            Ok(httparse::Status::Complete(len)) => {
                let mut head = Head {
                    method: req.method.unwrap_or("").to_owned(),
                    target: req.path.unwrap_or("").to_owned(),
                    ..Head::default()
                };
                for h in req.headers.iter() {
                    let value = std::str::from_utf8(h.value).unwrap_or("").trim();
                    let has = |word: &str| value.split(',').any(|v| v.trim().eq_ignore_ascii_case(word));
                    match h.name.to_ascii_lowercase().as_str() {
                        "host" => head.host = Some(value.to_owned()),
                        "origin" => head.origin = Some(value.to_owned()),
                        "upgrade" => head.upgrade_websocket = has("websocket"),
                        "connection" => head.connection_upgrade = has("upgrade"),
                        "sec-websocket-version" => head.ws_version_13 = value == "13",
                        "sec-websocket-key" => head.ws_key = Some(value.to_owned()),
                        _ => {}
                    }
                }
                return ReadHead::Complete(head, buf[len..filled].to_vec());
            }
            Ok(httparse::Status::Partial) if filled < buf.len() => {}
            Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
                return ReadHead::TooLong;
            }
            Err(_) => return ReadHead::Malformed,
        }
    }
}

fn answer(mut stream: &TcpStream, status: &str, content_type: &str, body: &[u8]) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\n\
         Content-Type: {content_type}\r\n\
         Content-Length: {}\r\n\
         Cache-Control: no-store\r\n\
         X-Content-Type-Options: nosniff\r\n\
         Referrer-Policy: no-referrer\r\n\
         Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

/// One connection: one request, answered, then closed; or a page's WebSocket.
fn serve(mut stream: TcpStream, shared: &Shared) {
    let c = &shared.counters;
    let _ = stream.set_nodelay(true);
    if stream.set_write_timeout(Some(WRITE_TIMEOUT)).is_err() {
        return;
    }
    let (head, rest) = match read_head(&mut stream) {
        ReadHead::Complete(head, rest) => (head, rest),
        ReadHead::TooLong => {
            bump(&c.bad_requests);
            let _ = answer(&stream, "431 Request Header Fields Too Large", "text/plain", b"");
            return;
        }
        ReadHead::Malformed => {
            bump(&c.bad_requests);
            let _ = answer(&stream, "400 Bad Request", "text/plain", b"");
            return;
        }
        ReadHead::Gone => {
            bump(&c.bad_requests);
            return;
        }
    };
    let path = head.target.split('?').next().unwrap_or("");
    let page = path == "/" || path == "/index.html";
    if !page && path != WS_PATH {
        let _ = answer(&stream, "404 Not Found", "text/plain", b"not here\n");
        return;
    }
    if head.method != "GET" {
        let _ = answer(&stream, "405 Method Not Allowed", "text/plain", b"GET only\n");
        return;
    }
    // The page itself is only fetched by browsers' navigation: an Origin matters for the
    // WebSocket, where a foreign page could read what is sent.
    let origin = if page { None } else { head.origin.as_deref() };
    if let Err(why) = shared.access.check(&head.target, head.host.as_deref(), origin) {
        bump(&c.refused);
        let _ = answer(
            &stream,
            "403 Forbidden",
            "text/plain; charset=utf-8",
            format!("{why}\n").as_bytes(),
        );
        return;
    }
    if page {
        if answer(
            &stream,
            "200 OK",
            "text/html; charset=utf-8",
            shared.page.as_bytes(),
        )
        .is_ok()
        {
            bump(&c.page_loads);
        }
        return;
    }
    let key = match &head.ws_key {
        Some(k) if head.upgrade_websocket && head.connection_upgrade && head.ws_version_13 => k,
        _ => {
            bump(&c.bad_requests);
            let _ = answer(
                &stream,
                "426 Upgrade Required",
                "text/plain",
                b"a WebSocket (version 13) only\n",
            );
            return;
        }
    };
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let upgrade = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n\r\n"
    );
    if stream.write_all(upgrade.as_bytes()).is_err() {
        return;
    }
    bump(&c.sockets_opened);
    c.pages_open.fetch_add(1, Ordering::Relaxed);
    push_to_page(stream, rest, shared);
    c.pages_open.fetch_sub(1, Ordering::Relaxed);
}

fn ws_config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_INCOMING))
        .max_frame_size(Some(MAX_INCOMING))
}

/// Sends a page every event and the newest snapshot as they come, until it goes away,
/// stalls, or the server stops.
fn push_to_page(stream: TcpStream, rest: Vec<u8>, shared: &Shared) {
    let c = &shared.counters;
    // Reads only take what the page has already sent: a close, a pong.
    if stream.set_read_timeout(Some(Duration::from_millis(1))).is_err() {
        return;
    }
    let mut ws = WebSocket::from_partially_read(stream, rest, Role::Server, Some(ws_config()));
    let (mut seq, mut event) = (0, 0);
    loop {
        let news = shared.board.news(&mut seq, &mut event, PAGE_WAKE);
        if news.closed {
            let _ = ws.close(None);
            let _ = ws.flush();
            break;
        }
        let mut sent = Ok(());
        for text in news.events.iter().chain(news.snapshot.as_ref()) {
            sent = ws.send(Message::text(text.to_string()));
            if sent.is_err() {
                break;
            }
            bump(&c.messages_sent);
        }
        if let Err(e) = sent {
            if matches!(&e, tungstenite::Error::Io(io) if matches!(io.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
            {
                bump(&c.stalled);
            }
            break;
        }
        if !take_incoming(&mut ws, shared) {
            break;
        }
    }
    let _ = ws.get_ref().shutdown(Shutdown::Both);
}

/// Takes what the page sent; false once it is gone or said goodbye.
fn take_incoming(ws: &mut WebSocket<TcpStream>, shared: &Shared) -> bool {
    let c = &shared.counters;
    for _ in 0..INCOMING_PER_WAKE {
        let taken = match ws.read() {
            // The close reply is queued by the WebSocket itself.
            Ok(Message::Close(_)) => {
                let _ = ws.flush();
                return false;
            }
            Ok(Message::Text(text)) => match &shared.inbox {
                Some(inbox) => inbox.take(text.as_str()),
                None => Err("this page changes nothing".to_owned()),
            },
            Ok(Message::Binary(_)) => Err("send commands as JSON text".to_owned()),
            Ok(_) => continue,
            Err(tungstenite::Error::Io(e))
                if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) =>
            {
                return true;
            }
            // Too long or not UTF-8: the page is dropped.
            Err(tungstenite::Error::Capacity(_) | tungstenite::Error::Utf8(_)) => {
                bump(&c.commands_refused);
                return false;
            }
            Err(_) => return false,
        };
        match taken {
            Ok(()) => bump(&c.commands),
            Err(why) => {
                bump(&c.commands_refused);
                let reply = serde_json::to_string(&Refused {
                    kind: "error",
                    text: &why,
                })
                .unwrap_or_default();
                if ws.send(Message::text(reply)).is_err() {
                    return false;
                }
                bump(&c.messages_sent);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loopback() -> Access {
        Access::for_bind(IpAddr::V4(Ipv4Addr::LOCALHOST)).expect("access")
    }

    #[test]
    fn a_loopback_page_is_served_to_loopback_names_only() {
        let a = loopback();
        assert_eq!(a.token(), None);
        for host in [
            "127.0.0.1:4465",
            "localhost:4465",
            "LOCALHOST",
            "[::1]:4465",
            "127.1.2.3",
        ] {
            assert_eq!(a.check("/", Some(host), None), Ok(()), "{host}");
        }
        for host in ["evil.example:4465", "192.168.1.5:4465", "[2001:db8::1]:80", ""] {
            assert_eq!(
                a.check("/", Some(host), None),
                Err(Refusal::HostNotLoopback),
                "{host}"
            );
        }
        assert_eq!(a.check("/", None, None), Err(Refusal::HostNotLoopback));
    }

    #[test]
    fn the_websocket_takes_its_own_origin_only() {
        let a = loopback();
        let host = Some("127.0.0.1:4465");
        assert_eq!(a.check("/ws", host, Some("http://127.0.0.1:4465")), Ok(()));
        assert_eq!(a.check("/ws", host, None), Ok(()), "a program, not a browser");
        for foreign in [
            "http://evil.example",
            "http://127.0.0.1:8000",
            "https://127.0.0.1:4465",
            "null",
        ] {
            assert_eq!(
                a.check("/ws", host, Some(foreign)),
                Err(Refusal::ForeignOrigin),
                "{foreign}"
            );
        }
    }

    #[test]
    fn any_other_bind_needs_its_random_token() {
        let a = Access::for_bind("0.0.0.0".parse().expect("ip")).expect("access");
        let b = Access::for_bind("192.168.1.5".parse().expect("ip")).expect("access");
        let t = a.token().expect("a token").to_owned();
        assert_eq!(t.len(), 32);
        assert_ne!(Some(t.as_str()), b.token(), "each bind draws its own");
        let host = Some("rooms.example.org:4465");
        assert_eq!(a.check(&format!("/?token={t}"), host, None), Ok(()));
        assert_eq!(
            a.check(
                &format!("/ws?x=1&token={t}"),
                host,
                Some("http://rooms.example.org:4465")
            ),
            Ok(())
        );
        for bad in [
            "/",
            "/?token=",
            "/?token=00",
            &format!("/?token={t}0"),
            &format!("/?tok={t}"),
        ] {
            assert_eq!(a.check(bad, host, None), Err(Refusal::Token), "{bad}");
        }
        assert_eq!(
            a.check(&format!("/ws?token={t}"), host, Some("http://evil.example")),
            Err(Refusal::ForeignOrigin)
        );
    }

    #[test]
    fn a_slow_page_is_sent_the_newest_snapshot_and_every_kept_event() {
        let board = Board::default();
        let (mut seq, mut event) = (0, 0);
        let none = board.news(&mut seq, &mut event, Duration::from_millis(1));
        assert!(none.snapshot.is_none() && none.events.is_empty() && !none.closed);
        board.publish("s1".into(), vec!["e1".into()]);
        board.publish("s2".into(), vec!["e2".into(), "e3".into()]);
        let news = board.news(&mut seq, &mut event, Duration::from_millis(1));
        assert_eq!(news.snapshot.as_deref(), Some("s2"));
        assert_eq!(
            news.events.iter().map(|e| &**e).collect::<Vec<_>>(),
            ["e1", "e2", "e3"]
        );
        for i in 0..KEPT_EVENTS + 10 {
            board.publish(format!("s{i}"), vec![format!("e{i}")]);
        }
        let news = board.news(&mut seq, &mut event, Duration::from_millis(1));
        assert_eq!(news.events.len(), KEPT_EVENTS);
        assert_eq!(
            news.events.last().map(|e| &**e),
            Some(&*format!("e{}", KEPT_EVENTS + 9))
        );
        board.close();
        assert!(board.news(&mut seq, &mut event, Duration::from_secs(5)).closed);
    }
}
