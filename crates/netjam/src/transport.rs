//! UDP transport: the thin socket shell under the media and probe paths.
//!
//! Receive timestamps are taken as close to arrival as the platform allows and say where
//! they came from. Sockets carry DSCP EF (46) so routers that honour it queue audio first.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::clock;

/// DSCP Expedited Forwarding, shifted into the TOS byte.
pub const TOS_EF: u32 = 46 << 2;

/// Where a receive timestamp came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimestampSource {
    /// Taken by the kernel when the datagram arrived.
    Kernel,
    /// Read from the process's monotonic clock after `recv` returned.
    Monotonic,
}

/// A received datagram's metadata.
#[derive(Debug, Clone, Copy)]
pub struct Received {
    pub len: usize,
    pub from: SocketAddr,
    /// Arrival time on the [`clock::now_ns`] scale.
    pub at_ns: u64,
    pub source: TimestampSource,
}

/// A UDP socket set up for realtime media.
#[derive(Debug)]
pub struct UdpTransport {
    socket: UdpSocket,
}

impl UdpTransport {
    /// Bind to `addr` with DSCP EF set (best effort: a refusal is ignored) and large
    /// socket buffers so a burst never overflows the kernel queue.
    pub fn bind(addr: SocketAddr) -> io::Result<Self> {
        let domain = if addr.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv4() {
            let _ = socket.set_tos(TOS_EF);
        } else {
            let _ = socket.set_tclass_v6(TOS_EF);
        }
        let _ = socket.set_recv_buffer_size(1 << 20);
        let _ = socket.set_send_buffer_size(1 << 20);
        socket.bind(&addr.into())?;
        Ok(Self {
            socket: socket.into(),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    /// How long [`UdpTransport::recv`] may block; `None` blocks forever.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.socket.set_read_timeout(timeout)
    }

    pub fn send_to(&self, buf: &[u8], to: SocketAddr) -> io::Result<usize> {
        self.socket.send_to(buf, to)
    }

    /// Receive one datagram into `buf`. A timeout is `Ok(None)`.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<Received>> {
        match self.socket.recv_from(buf) {
            Ok((len, from)) => Ok(Some(Received {
                len,
                from,
                at_ns: clock::now_ns(),
                source: TimestampSource::Monotonic,
            })),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The underlying socket, for the rare caller that needs an option set here.
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }
}
