//! The I/O shell: OSC over UDP and TCP with std sockets.
//!
//! TCP streams carry packets either with OSC 1.0 framing (a big-endian int32 length
//! before each packet, liblo's default) or OSC 1.1 SLIP framing (RFC 1055 with an END
//! byte on both sides, python-osc's default). The sender chooses; [`StreamDecoder`]
//! detects the framing from the first byte it sees. The framing code is sans-IO; the
//! socket wrappers stay thin. Nothing here may be used from a realtime thread: it
//! blocks and allocates.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs, UdpSocket};

/// Largest packet accepted from a stream (a bound on memory per connection).
pub const MAX_STREAM_PACKET: usize = 1 << 20;

const END: u8 = 0xC0;
const ESC: u8 = 0xDB;
const ESC_END: u8 = 0xDC;
const ESC_ESC: u8 = 0xDD;

/// How packets are delimited on a byte stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// OSC 1.0: int32 big-endian length, then the packet.
    LengthPrefix,
    /// OSC 1.1: SLIP (RFC 1055), END before and after each packet.
    Slip,
}

/// Why a stream could not be decoded; the connection should be closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A frame announces or accumulates more than [`MAX_STREAM_PACKET`] bytes.
    #[error("frame of {0} bytes exceeds the limit of {MAX_STREAM_PACKET}")]
    TooLarge(usize),
    /// A SLIP escape byte followed by something other than ESC_END or ESC_ESC.
    #[error("invalid SLIP escape sequence")]
    BadEscape,
}

/// Appends `packet` framed with `framing` to `out`.
pub fn frame(framing: Framing, packet: &[u8], out: &mut Vec<u8>) {
    match framing {
        Framing::LengthPrefix => {
            out.extend_from_slice(&(packet.len() as u32).to_be_bytes());
            out.extend_from_slice(packet);
        }
        Framing::Slip => {
            out.push(END);
            for &b in packet {
                match b {
                    END => out.extend_from_slice(&[ESC, ESC_END]),
                    ESC => out.extend_from_slice(&[ESC, ESC_ESC]),
                    b => out.push(b),
                }
            }
            out.push(END);
        }
    }
}

/// Splits a byte stream into OSC packets, detecting the framing from the first byte:
/// SLIP if it is END (0xC0) or the start of a packet (`/`, `#`), otherwise a length
/// prefix.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    framing: Option<Framing>,
    pending: Vec<u8>,
    escape: bool,
}

impl StreamDecoder {
    /// A decoder that detects the framing.
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder for a known framing.
    pub fn with_framing(framing: Framing) -> Self {
        StreamDecoder {
            framing: Some(framing),
            ..Self::default()
        }
    }

    /// The framing in use, once known.
    pub fn framing(&self) -> Option<Framing> {
        self.framing
    }

    /// Feeds received bytes; calls `on_packet` for every complete packet.
    pub fn feed<F: FnMut(&[u8])>(&mut self, mut data: &[u8], mut on_packet: F) -> Result<(), FrameError> {
        let framing = match self.framing {
            Some(f) => f,
            None => {
                let Some(&first) = data.first() else { return Ok(()) };
                let f = if matches!(first, END | b'/' | b'#') {
                    Framing::Slip
                } else {
                    Framing::LengthPrefix
                };
                self.framing = Some(f);
                f
            }
        };
        match framing {
            Framing::Slip => {
                for &b in data {
                    if self.escape {
                        self.escape = false;
                        match b {
                            ESC_END => self.pending.push(END),
                            ESC_ESC => self.pending.push(ESC),
                            _ => return Err(FrameError::BadEscape),
                        }
                        continue;
                    }
                    match b {
                        END => {
                            if !self.pending.is_empty() {
                                on_packet(&self.pending);
                                self.pending.clear();
                            }
                        }
                        ESC => self.escape = true,
                        b => self.pending.push(b),
                    }
                    if self.pending.len() > MAX_STREAM_PACKET {
                        return Err(FrameError::TooLarge(self.pending.len()));
                    }
                }
                Ok(())
            }
            Framing::LengthPrefix => {
                while !data.is_empty() {
                    let have = self.pending.len();
                    if have < 4 {
                        let take = (4 - have).min(data.len());
                        self.pending.extend_from_slice(&data[..take]);
                        data = &data[take..];
                        if let [a, b, c, d] = self.pending[..] {
                            let len = u32::from_be_bytes([a, b, c, d]) as usize;
                            if len > MAX_STREAM_PACKET {
                                return Err(FrameError::TooLarge(len));
                            }
                        }
                        continue;
                    }
                    let len = u32::from_be_bytes([
                        self.pending[0],
                        self.pending[1],
                        self.pending[2],
                        self.pending[3],
                    ]) as usize;
                    if len > MAX_STREAM_PACKET {
                        return Err(FrameError::TooLarge(len));
                    }
                    let take = (4 + len - have).min(data.len());
                    self.pending.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.pending.len() == 4 + len {
                        if len > 0 {
                            on_packet(&self.pending[4..]);
                        }
                        self.pending.clear();
                    }
                }
                Ok(())
            }
        }
    }
}

/// An OSC endpoint over UDP.
#[derive(Debug)]
pub struct UdpEndpoint {
    socket: UdpSocket,
}

impl UdpEndpoint {
    /// Binds to `addr` (e.g. `127.0.0.1:0` for an ephemeral port).
    pub fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<Self> {
        Ok(UdpEndpoint {
            socket: UdpSocket::bind(addr)?,
        })
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// The underlying socket (for timeouts and options).
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// Sends one packet.
    pub fn send_to<A: ToSocketAddrs>(&self, packet: &[u8], to: A) -> io::Result<()> {
        self.socket.send_to(packet, to).map(|_| ())
    }

    /// Receives one datagram into `buf`.
    pub fn recv<'b>(&self, buf: &'b mut [u8]) -> io::Result<(&'b [u8], SocketAddr)> {
        let (n, from) = self.socket.recv_from(buf)?;
        Ok((&buf[..n], from))
    }
}

/// What [`UdpEndpoint::serve_one`] did with one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// Who sent the datagram.
    pub from: SocketAddr,
    /// What dispatch did, or why the datagram was dropped.
    pub result: Result<crate::DispatchSummary, crate::DecodeError>,
    /// Replies sent back to the sender.
    pub replies: u32,
    /// Broadcast messages sent to the listeners.
    pub broadcasts: u32,
}

impl UdpEndpoint {
    /// Receives one datagram, dispatches it through `tree`, sends the replies back to
    /// its sender and the broadcasts to every address in `listeners`. Forwarded and
    /// chained entries stay in the outbox buffer `scratch` for the caller to read until
    /// the next call. A malformed datagram is counted in the result, never an `Err`.
    pub fn serve_one<S>(
        &self,
        tree: &crate::Tree<S>,
        state: &mut S,
        packet_buf: &mut [u8],
        scratch: &mut [u8],
        listeners: &[SocketAddr],
    ) -> io::Result<Served> {
        let (n, from) = self.socket.recv_from(packet_buf)?;
        let mut out = crate::Outbox::new(scratch);
        let result = tree.dispatch(state, &packet_buf[..n], &mut out);
        let (mut replies, mut broadcasts) = (0, 0);
        for (route, msg) in out.entries() {
            match route {
                crate::Route::Reply => {
                    self.socket.send_to(msg, from)?;
                    replies += 1;
                }
                crate::Route::Broadcast => {
                    for l in listeners {
                        self.socket.send_to(msg, l)?;
                    }
                    broadcasts += 1;
                }
                crate::Route::Forward | crate::Route::Chain => {}
            }
        }
        Ok(Served {
            from,
            result,
            replies,
            broadcasts,
        })
    }
}

/// An OSC connection over TCP with a chosen sending framing and detected receiving
/// framing.
#[derive(Debug)]
pub struct TcpConnection {
    stream: TcpStream,
    send_framing: Framing,
    decoder: StreamDecoder,
    out: Vec<u8>,
}

impl TcpConnection {
    /// Connects to `addr`.
    pub fn connect<A: ToSocketAddrs>(addr: A, send_framing: Framing) -> io::Result<Self> {
        Ok(Self::from_stream(TcpStream::connect(addr)?, send_framing))
    }

    /// Wraps an accepted stream.
    pub fn from_stream(stream: TcpStream, send_framing: Framing) -> Self {
        TcpConnection {
            stream,
            send_framing,
            decoder: StreamDecoder::new(),
            out: Vec::new(),
        }
    }

    /// The underlying stream.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Sends one packet with this connection's framing.
    pub fn send(&mut self, packet: &[u8]) -> io::Result<()> {
        self.out.clear();
        frame(self.send_framing, packet, &mut self.out);
        self.stream.write_all(&self.out)
    }

    /// Reads once from the stream and calls `on_packet` for every complete packet.
    /// Returns `Ok(false)` at end of stream.
    pub fn recv<F: FnMut(&[u8])>(&mut self, on_packet: F) -> io::Result<bool> {
        let mut buf = [0u8; 8192];
        let n = self.stream.read(&mut buf)?;
        if n == 0 {
            return Ok(false);
        }
        self.decoder
            .feed(&buf[..n], on_packet)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(true)
    }

    /// The framing detected on received data, once known.
    pub fn recv_framing(&self) -> Option<Framing> {
        self.decoder.framing()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(dec: &mut StreamDecoder, data: &[u8]) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        dec.feed(data, |p| v.push(p.to_vec())).unwrap();
        v
    }

    #[test]
    fn length_prefix_round_trip_byte_by_byte() {
        let mut wire = Vec::new();
        frame(Framing::LengthPrefix, b"/a\0\0,\0\0\0", &mut wire);
        frame(Framing::LengthPrefix, b"/bc\0,i\0\0\0\0\0\x01", &mut wire);
        let mut dec = StreamDecoder::new();
        let mut got = Vec::new();
        for b in &wire {
            got.extend(frames(&mut dec, std::slice::from_ref(b)));
        }
        assert_eq!(dec.framing(), Some(Framing::LengthPrefix));
        assert_eq!(
            got,
            vec![b"/a\0\0,\0\0\0".to_vec(), b"/bc\0,i\0\0\0\0\0\x01".to_vec()]
        );
    }

    #[test]
    fn slip_round_trip_with_escapes() {
        let pkt = [b'/', b'x', 0, 0, b',', b'b', 0, 0, 0, 0, 0, 4, END, ESC, 1, 2];
        let mut wire = Vec::new();
        frame(Framing::Slip, &pkt, &mut wire);
        frame(Framing::Slip, &pkt, &mut wire);
        let mut dec = StreamDecoder::new();
        let got = frames(&mut dec, &wire);
        assert_eq!(dec.framing(), Some(Framing::Slip));
        assert_eq!(got, vec![pkt.to_vec(), pkt.to_vec()]);
    }

    #[test]
    fn slip_without_leading_end_is_detected() {
        let mut dec = StreamDecoder::new();
        let got = frames(&mut dec, b"/a\0\0,\0\0\0\xC0");
        assert_eq!(got, vec![b"/a\0\0,\0\0\0".to_vec()]);
    }

    #[test]
    fn udp_server_answers_metadata_queries_and_broadcasts() {
        use crate::{encode_message, Arg, Message, Meta, Scale, TreeBuilder};
        let mut b = TreeBuilder::<f32>::new();
        b.port(
            "/gain::f",
            Meta::new()
                .doc("Output gain")
                .range(0.0, 2.0)
                .scale(Scale::Linear),
            |g, r| {
                if let Some(Arg::Float(v)) = r.arg(0) {
                    *g = v;
                    let _ = r.broadcast("/gain", &[Arg::Float(v)]);
                }
            },
        );
        let tree = b.build().unwrap();
        let server = UdpEndpoint::bind("127.0.0.1:0").unwrap();
        let client = UdpEndpoint::bind("127.0.0.1:0").unwrap();
        let listener = UdpEndpoint::bind("127.0.0.1:0").unwrap();
        for s in [&server, &client, &listener] {
            s.socket()
                .set_read_timeout(Some(std::time::Duration::from_secs(5)))
                .unwrap();
        }
        let to = server.local_addr().unwrap();
        let mut pkt = [0u8; 64];
        let (mut gain, mut inbuf, mut scratch, mut rx) = (1.0f32, [0u8; 1500], [0u8; 1500], [0u8; 1500]);

        let n = encode_message(&mut pkt, "/_meta", &[Arg::Str("/gain")]).unwrap();
        client.send_to(&pkt[..n], to).unwrap();
        let served = server
            .serve_one(&tree, &mut gain, &mut inbuf, &mut scratch, &[])
            .unwrap();
        assert_eq!(served.replies, 1);
        let (reply, _) = client.recv(&mut rx).unwrap();
        let m = Message::decode(reply).unwrap();
        let json = m.arg(1).and_then(|a| a.as_str().map(str::to_owned)).unwrap();
        assert!(json.contains("\"doc\":\"Output gain\""), "{json}");

        let n = encode_message(&mut pkt, "/gain", &[Arg::Float(0.5)]).unwrap();
        client.send_to(&pkt[..n], to).unwrap();
        let l = listener.local_addr().unwrap();
        let served = server
            .serve_one(&tree, &mut gain, &mut inbuf, &mut scratch, &[l])
            .unwrap();
        assert_eq!((served.broadcasts, gain), (1, 0.5));
        let (b, _) = listener.recv(&mut rx).unwrap();
        assert_eq!(Message::decode(b).unwrap().arg(0), Some(Arg::Float(0.5)));

        client.send_to(b"junk", to).unwrap();
        let served = server
            .serve_one(&tree, &mut gain, &mut inbuf, &mut scratch, &[])
            .unwrap();
        assert!(served.result.is_err());
    }

    #[test]
    fn oversized_frames_are_refused() {
        let mut dec = StreamDecoder::new();
        assert_eq!(
            dec.feed(&[0x7f, 0, 0, 0], |_| {}),
            Err(FrameError::TooLarge(0x7f00_0000))
        );
        let mut dec = StreamDecoder::with_framing(Framing::Slip);
        assert_eq!(dec.feed(&[ESC, 1], |_| {}), Err(FrameError::BadEscape));
    }
}
