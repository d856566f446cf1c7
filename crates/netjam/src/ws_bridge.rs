//! The ensemble's WebSocket bridge: a web page connects to `ws://ADDR:PORT/` and speaks
//! OSC in binary frames, one OSC packet (message or bundle) per frame, exactly as a
//! program speaks to the plain OSC UDP bridge: a message to `/synth1/...` goes to the
//! member offering `synth1`, and every message this member's services receive is sent to
//! every connected page.
//!
//! Text frames are refused (the connection is closed with 1003, "unsupported data"): OSC
//! is a binary format that browsers encode directly into an `ArrayBuffer`, and a JSON
//! mapping would be a format of our own that loses OSC's types (int32 against float32,
//! string against symbol, blobs, time tags) for no gain.
//!
//! A browser lets any web site open a WebSocket to `127.0.0.1`, so a page the musician
//! happens to visit could reach the bridge. With allowed origins given
//! (`--ws-origin`), a handshake whose `Origin` header is not among them is answered
//! `403` (programs other than browsers send no `Origin` and are let in).
//!
//! Everything that comes from outside is bounded: [`MAX_CLIENTS`] connections (one
//! more is answered `503` and closed, holding the accepting thread at most
//! [`REFUSE_TIME`]), [`MAX_FRAME_BYTES`] per message (a larger one
//! closes the connection with 1009), [`HANDSHAKE_TIMEOUT`] for the HTTP upgrade,
//! [`MAX_PENDING_IN`] frames waiting for the member's thread (beyond: dropped, counted)
//! and [`OUTBOX_SLOTS`] messages waiting for a slow page (beyond: dropped, counted; a
//! page that stops reading for [`WRITE_TIMEOUT`] is disconnected).
//!
//! Threads: one accepts; each connection has a reader (handshake, then frames) and a
//! writer (the only thread that writes to its socket: outgoing messages, and the
//! reader's handshake answer and control frames, in order). The member's thread never
//! blocks on a page: it hands messages over with `try_send`. This is not realtime code and
//! never runs on the audio thread; it holds no protocol logic (routing is the member's).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, Sender, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tungstenite::handshake::HandshakeError;
use tungstenite::http::StatusCode;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::{CloseFrame, Role, WebSocketConfig, WebSocketContext};
use tungstenite::Message;

/// Pages connected at once. Each costs two threads; a band's control surfaces fit.
pub const MAX_CLIENTS: usize = 16;
/// The largest OSC packet a page may send: it must still fit one UDP datagram (65,507
/// bytes) once wrapped in the ensemble's envelope (under 100 bytes).
pub const MAX_FRAME_BYTES: usize = 64_000;
/// Frames from every page waiting for the member's thread.
pub const MAX_PENDING_IN: usize = 1024;
/// Messages waiting to be written to one page.
pub const OUTBOX_SLOTS: usize = 256;
/// Time a connection has to complete the HTTP upgrade.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a refused connection holds the accepting thread.
pub const REFUSE_TIME: Duration = Duration::from_millis(200);
/// A page that does not take a message within this long is disconnected.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// Counters of the bridge (a snapshot of [`WsCounters`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct WsBridgeStats {
    /// Pages connected now.
    pub clients: u64,
    /// Connections that completed the WebSocket handshake.
    pub accepted: u64,
    /// Connections refused because [`MAX_CLIENTS`] pages were connected.
    pub refused_full: u64,
    /// Connections that failed or timed out in the handshake.
    pub handshake_failed: u64,
    /// Handshakes refused (`403`) for an `Origin` not allowed.
    pub refused_origin: u64,
    /// Binary frames handed to the member.
    pub frames_in: u64,
    /// Messages written to pages.
    pub frames_out: u64,
    /// Frames dropped because [`MAX_PENDING_IN`] were waiting for the member.
    pub dropped_in: u64,
    /// Messages dropped because a page's outbox was full.
    pub dropped_out: u64,
    /// Text frames refused (their connection closed with 1003).
    pub refused_text: u64,
    /// Connections closed for a frame over [`MAX_FRAME_BYTES`] (1009).
    pub oversized: u64,
}

/// Live counters shared by the bridge's threads.
#[derive(Debug, Default)]
pub struct WsCounters {
    clients: AtomicU64,
    accepted: AtomicU64,
    refused_full: AtomicU64,
    handshake_failed: AtomicU64,
    refused_origin: AtomicU64,
    frames_in: AtomicU64,
    frames_out: AtomicU64,
    dropped_in: AtomicU64,
    dropped_out: AtomicU64,
    refused_text: AtomicU64,
    oversized: AtomicU64,
}

impl WsCounters {
    pub fn snapshot(&self) -> WsBridgeStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WsBridgeStats {
            clients: g(&self.clients),
            accepted: g(&self.accepted),
            refused_full: g(&self.refused_full),
            handshake_failed: g(&self.handshake_failed),
            refused_origin: g(&self.refused_origin),
            frames_in: g(&self.frames_in),
            frames_out: g(&self.frames_out),
            dropped_in: g(&self.dropped_in),
            dropped_out: g(&self.dropped_out),
            refused_text: g(&self.refused_text),
            oversized: g(&self.oversized),
        }
    }
}

fn bump(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

/// What the bridge's threads tell the member's thread.
#[derive(Debug)]
pub enum WsInput {
    /// A page completed its handshake; messages for it go to `outbox`.
    Open { client: u64, outbox: WsOutbox },
    /// One OSC packet from a page. Call [`WsBridge::taken`] once it is handled.
    Frame { client: u64, bytes: Vec<u8> },
    /// A page went away.
    Closed { client: u64 },
}

/// Where a page's writer takes its work from.
#[derive(Debug, Clone)]
pub struct WsOutbox(SyncSender<Out>);

#[derive(Debug)]
enum Out {
    /// An OSC packet, to be sent as one binary message.
    Osc(Vec<u8>),
    /// Bytes the reader's WebSocket produced (the handshake answer, pongs, the close
    /// reply), written as they are.
    Raw(Vec<u8>),
}

/// The bridge as the member's thread holds it: the pages connected and the counters.
#[derive(Debug)]
pub struct WsBridge {
    addr: SocketAddr,
    counters: Arc<WsCounters>,
    pending: Arc<AtomicUsize>,
    clients: Vec<(u64, WsOutbox)>,
}

impl WsBridge {
    /// Listens on `addr`; what pages send arrives on `tx` as [`WsInput`] (wrapped by
    /// `wrap`, so the caller can merge it into its own channel). With `origins`, only
    /// browsers' pages from those origins (e.g. `http://localhost:8000`) are let in.
    pub fn start<T: Send + 'static>(
        addr: SocketAddr,
        origins: Vec<String>,
        tx: Sender<T>,
        wrap: fn(WsInput) -> T,
    ) -> anyhow::Result<WsBridge> {
        let listener = TcpListener::bind(addr)
            .with_context(|| format!("cannot open the WebSocket bridge on {addr}: is the port free?"))?;
        let at = listener.local_addr().context("WebSocket bridge address")?;
        let counters = Arc::new(WsCounters::default());
        let pending = Arc::new(AtomicUsize::new(0));
        let shared = Shared {
            counters: counters.clone(),
            pending: pending.clone(),
            live: Arc::new(AtomicUsize::new(0)),
            origins: Arc::new(origins),
            tx,
            wrap,
        };
        std::thread::Builder::new()
            .name("ens-ws-accept".into())
            .spawn(move || accept_loop(listener, shared))
            .context("cannot start the WebSocket bridge thread")?;
        Ok(WsBridge {
            addr: at,
            counters,
            pending,
            clients: Vec::new(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stats(&self) -> WsBridgeStats {
        self.counters.snapshot()
    }

    /// Keeps the list of pages up to date; returns the OSC packet of a frame.
    pub fn input(&mut self, input: WsInput) -> Option<(u64, Vec<u8>)> {
        match input {
            WsInput::Open { client, outbox } => {
                self.clients.push((client, outbox));
                None
            }
            WsInput::Closed { client } => {
                self.clients.retain(|(c, _)| *c != client);
                None
            }
            WsInput::Frame { client, bytes } => Some((client, bytes)),
        }
    }

    /// A frame from [`WsInput::Frame`] was handled: room for another.
    pub fn taken(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }

    /// Sends one OSC packet to every page, never blocking: a full outbox drops it
    /// (counted).
    pub fn broadcast(&mut self, bytes: &[u8]) {
        let counters = &self.counters;
        self.clients
            .retain(|(_, outbox)| match outbox.0.try_send(Out::Osc(bytes.to_vec())) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    bump(&counters.dropped_out);
                    true
                }
                Err(TrySendError::Disconnected(_)) => false,
            });
    }
}

struct Shared<T> {
    counters: Arc<WsCounters>,
    pending: Arc<AtomicUsize>,
    /// Connections holding threads now (handshaking or open).
    live: Arc<AtomicUsize>,
    /// Allowed `Origin`s (empty: any).
    origins: Arc<Vec<String>>,
    tx: Sender<T>,
    wrap: fn(WsInput) -> T,
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Self {
            counters: self.counters.clone(),
            pending: self.pending.clone(),
            live: self.live.clone(),
            origins: self.origins.clone(),
            tx: self.tx.clone(),
            wrap: self.wrap,
        }
    }
}

fn accept_loop<T: Send + 'static>(listener: TcpListener, shared: Shared<T>) {
    let mut next_client = 1u64;
    for conn in listener.incoming() {
        let Ok(stream) = conn else {
            // Out of descriptors and the like: let it pass rather than spin.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if shared.live.load(Ordering::Acquire) >= MAX_CLIENTS {
            bump(&shared.counters.refused_full);
            refuse(&stream);
            continue;
        }
        shared.live.fetch_add(1, Ordering::AcqRel);
        let client = next_client;
        next_client += 1;
        if start_client(client, stream, shared.clone()).is_err() {
            shared.live.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Answers `503` to a connection beyond [`MAX_CLIENTS`], within [`REFUSE_TIME`]: reads
/// the request first and the client's close after, so the answer is not lost to a reset
/// (closing a socket with unread bytes resets it).
fn refuse(stream: &TcpStream) {
    let deadline = Instant::now() + REFUSE_TIME;
    let mut buf = [0u8; 2048];
    let mut tail = [0u8; 4];
    let mut read_until = |stop_at_blank_line: bool| loop {
        let mut s = stream;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                // The last four bytes seen, to find the end of the request's headers.
                for &b in &buf[..n] {
                    tail = [tail[1], tail[2], tail[3], b];
                }
                if stop_at_blank_line && &tail == b"\r\n\r\n" {
                    return;
                }
            }
        }
    };
    read_until(true);
    let _ = stream.set_write_timeout(Some(REFUSE_TIME));
    let mut w = stream;
    let _ =
        w.write_all(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    let _ = stream.shutdown(Shutdown::Write);
    read_until(false);
}

/// The reader's stream: reads the socket (within a deadline while handshaking), and
/// hands what it writes to the writer thread, which owns writing.
struct Duplex {
    read: TcpStream,
    out: SyncSender<Out>,
    deadline: Option<Instant>,
}

impl Read for Duplex {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            self.read.set_read_timeout(Some(left))?;
        }
        match self.read.read(buf) {
            // A timed-out read is WouldBlock on Unix: with a deadline, it is the end.
            Err(e) if self.deadline.is_some() && e.kind() == io::ErrorKind::WouldBlock => {
                Err(io::ErrorKind::TimedOut.into())
            }
            r => r,
        }
    }
}

impl Write for Duplex {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Whole buffers only, so a control frame is never split around a message.
        match self.out.try_send(Out::Raw(buf.to_vec())) {
            Ok(()) => Ok(buf.len()),
            Err(TrySendError::Full(_)) => Err(io::ErrorKind::WouldBlock.into()),
            Err(TrySendError::Disconnected(_)) => Err(io::ErrorKind::BrokenPipe.into()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn config() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_FRAME_BYTES))
        .max_frame_size(Some(MAX_FRAME_BYTES))
}

fn start_client<T: Send + 'static>(client: u64, stream: TcpStream, shared: Shared<T>) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let write_half = stream.try_clone()?;
    let (out_tx, out_rx) = sync_channel(OUTBOX_SLOTS);
    let counters = shared.counters.clone();
    std::thread::Builder::new()
        .name("ens-ws-write".into())
        .spawn(move || write_loop(write_half, out_rx, &counters))?;
    let duplex = Duplex {
        read: stream,
        out: out_tx,
        deadline: Some(Instant::now() + HANDSHAKE_TIMEOUT),
    };
    std::thread::Builder::new()
        .name("ens-ws-read".into())
        .spawn(move || {
            read_loop(client, duplex, &shared);
            shared.live.fetch_sub(1, Ordering::AcqRel);
        })?;
    Ok(())
}

fn write_loop(mut socket: TcpStream, rx: Receiver<Out>, counters: &WsCounters) {
    let mut ws = WebSocketContext::new(Role::Server, Some(config()));
    // Ends when every sender is gone (the reader ended and the member dropped the
    // page), or the page stopped taking bytes.
    while let Ok(out) = rx.recv() {
        let ok = match out {
            Out::Raw(b) => socket.write_all(&b).is_ok(),
            Out::Osc(b) => {
                let sent = ws
                    .write(&mut socket, Message::binary(b))
                    .and_then(|()| ws.flush(&mut socket));
                if sent.is_ok() {
                    bump(&counters.frames_out);
                }
                sent.is_ok()
            }
        };
        if !ok {
            break;
        }
    }
    // Wakes the reader, which tells the member.
    let _ = socket.shutdown(Shutdown::Both);
}

fn read_loop<T>(client: u64, duplex: Duplex, shared: &Shared<T>) {
    let c = &shared.counters;
    let outbox = WsOutbox(duplex.out.clone());
    let origins = &shared.origins;
    // The result type is tungstenite's handshake callback's, not ours to shrink.
    #[allow(clippy::result_large_err)]
    let check_origin = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        let origin = req.headers().get("origin").map(|o| o.to_str().unwrap_or(""));
        match origin {
            Some(o) if !origins.is_empty() && !origins.iter().any(|a| a.eq_ignore_ascii_case(o)) => {
                bump(&c.refused_origin);
                let mut refusal = ErrorResponse::new(Some("origin not allowed".into()));
                *refusal.status_mut() = StatusCode::FORBIDDEN;
                Err(refusal)
            }
            _ => Ok(resp),
        }
    };
    let mut ws = match tungstenite::accept_hdr_with_config(duplex, check_origin, Some(config())) {
        Ok(ws) => ws,
        Err(HandshakeError::Interrupted(_)) | Err(HandshakeError::Failure(_)) => {
            bump(&c.handshake_failed);
            return;
        }
    };
    ws.get_mut().deadline = None;
    if ws.get_ref().read.set_read_timeout(None).is_err() {
        bump(&c.handshake_failed);
        return;
    }
    bump(&c.accepted);
    c.clients.fetch_add(1, Ordering::Relaxed);
    let send = |i: WsInput| shared.tx.send((shared.wrap)(i)).is_ok();
    if send(WsInput::Open { client, outbox }) {
        loop {
            match ws.read() {
                Ok(Message::Binary(b)) => {
                    if shared.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING_IN {
                        shared.pending.fetch_sub(1, Ordering::AcqRel);
                        bump(&c.dropped_in);
                        continue;
                    }
                    bump(&c.frames_in);
                    if !send(WsInput::Frame {
                        client,
                        bytes: b.to_vec(),
                    }) {
                        break;
                    }
                }
                Ok(Message::Text(_)) => {
                    bump(&c.refused_text);
                    close(&mut ws, CloseCode::Unsupported, "binary OSC frames only");
                    break;
                }
                // Pings are answered by the WebSocket itself; pongs need nothing.
                Ok(_) => {}
                Err(tungstenite::Error::Capacity(_)) => {
                    bump(&c.oversized);
                    close(&mut ws, CloseCode::Size, "frame too large");
                    break;
                }
                Err(_) => break,
            }
        }
        send(WsInput::Closed { client });
    }
    c.clients.fetch_sub(1, Ordering::Relaxed);
    // Lets the writer end once it has sent what is queued (the close frame included).
    let _ = ws.get_ref().read.shutdown(Shutdown::Read);
}

fn close(ws: &mut tungstenite::WebSocket<Duplex>, code: CloseCode, reason: &'static str) {
    let _ = ws.close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }));
    let _ = ws.flush();
}
