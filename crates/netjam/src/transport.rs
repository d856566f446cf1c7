//! UDP transport: the thin socket shell under the media and probe paths.
//!
//! Receive timestamps are taken as close to arrival as the platform allows and say where
//! they came from. Sockets carry DSCP EF (46) so routers that honour it queue audio first.
//!
//! On Linux the kernel stamps every datagram as it arrives (`SO_TIMESTAMPNS`, read back
//! with `recvmsg`); the stamp is on `CLOCK_REALTIME`, so it is moved onto the monotonic
//! [`clock::now_ns`] scale by sampling both clocks right after the datagram is read and
//! subtracting the datagram's age. This removes the scheduler's wake-up delay from the
//! measurement. Elsewhere, or if the kernel refuses, the monotonic clock is read after
//! `recv` returns. UDP GRO and every other receive batching stay off (they are never
//! enabled here): each read returns one datagram with its own stamp.

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
    kernel_timestamps: bool,
}

/// Mark an IPv6 socket EF where the platform has a traffic-class option (best effort, like
/// IPv4's TOS), or say once that IPv6 packets leave unmarked.
fn set_tclass_v6(socket: &Socket) {
    #[cfg(any(
        target_os = "android",
        target_os = "dragonfly",
        target_os = "freebsd",
        target_os = "fuchsia",
        target_os = "linux",
        target_os = "macos",
        target_os = "netbsd",
        target_os = "openbsd"
    ))]
    let _ = socket.set_tclass_v6(TOS_EF);
    #[cfg(not(any(
        target_os = "android",
        target_os = "dragonfly",
        target_os = "freebsd",
        target_os = "fuchsia",
        target_os = "linux",
        target_os = "macos",
        target_os = "netbsd",
        target_os = "openbsd"
    )))]
    {
        let _ = socket;
        say_once_about_dscp("no IPv6 traffic-class option on this platform: IPv6 packets leave unmarked");
    }
}

/// One line on stderr, once per process, when DSCP marking cannot be what it is on Linux.
#[cfg(any(
    windows,
    not(any(
        target_os = "android",
        target_os = "dragonfly",
        target_os = "freebsd",
        target_os = "fuchsia",
        target_os = "linux",
        target_os = "macos",
        target_os = "netbsd",
        target_os = "openbsd"
    ))
))]
fn say_once_about_dscp(line: &str) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        eprintln!("netjam: DSCP: {line}");
    }
}

/// A kernel stamp older than this (or in the future) means the wall clock was stepped
/// between arrival and reading; the monotonic reading is used instead.
#[cfg(target_os = "linux")]
const MAX_KERNEL_AGE_NS: i128 = 10_000_000_000;

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
        #[cfg(windows)]
        say_once_about_dscp(
            "Windows ignores a program's own DSCP mark unless a Policy-based QoS rule gives netjam.exe \
             DSCP 46; without one, netjam's packets leave unmarked",
        );
        if addr.is_ipv4() {
            let _ = socket.set_tos(TOS_EF);
        } else {
            set_tclass_v6(&socket);
        }
        let _ = socket.set_recv_buffer_size(1 << 20);
        let _ = socket.set_send_buffer_size(1 << 20);
        socket.bind(&addr.into())?;
        let socket: UdpSocket = socket.into();
        let kernel_timestamps = enable_kernel_timestamps(&socket);
        Ok(Self {
            socket,
            kernel_timestamps,
        })
    }

    /// Where receive timestamps on this socket come from.
    pub fn timestamp_source(&self) -> TimestampSource {
        if self.kernel_timestamps {
            TimestampSource::Kernel
        } else {
            TimestampSource::Monotonic
        }
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
        #[cfg(target_os = "linux")]
        if self.kernel_timestamps {
            return self.recv_stamped(buf);
        }
        self.recv_plain(buf)
    }

    fn recv_plain(&self, buf: &mut [u8]) -> io::Result<Option<Received>> {
        match self.socket.recv_from(buf) {
            Ok((len, from)) => Ok(Some(Received {
                len,
                from,
                at_ns: clock::now_ns(),
                source: TimestampSource::Monotonic,
            })),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    #[cfg(target_os = "linux")]
    fn recv_stamped(&self, buf: &mut [u8]) -> io::Result<Option<Received>> {
        use std::os::fd::AsRawFd;

        let fd = self.socket.as_raw_fd();
        let mut control = [0u64; STAMP_CONTROL_WORDS];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut stamp: Option<libc::timespec> = None;
        // SAFETY: `try_init` hands us a zeroed sockaddr_storage and its length to fill.
        // recvmsg writes at most `msg_namelen` bytes of address into it, at most `iov_len`
        // bytes into `buf` (which the iovec borrows for this call only) and at most
        // `msg_controllen` bytes into `control`; all three outlive the call. The control
        // messages are walked with the libc CMSG macros, which stay inside
        // `msg_controllen`, and the timespec is read unaligned from inside one of them.
        let result = unsafe {
            socket2::SockAddr::try_init(|storage, len| {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_name = storage.cast();
                msg.msg_namelen = *len;
                msg.msg_iov = &mut iov;
                msg.msg_iovlen = 1;
                msg.msg_control = control.as_mut_ptr().cast();
                msg.msg_controllen = std::mem::size_of_val(&control) as _;
                let n = libc::recvmsg(fd, &mut msg, 0);
                if n < 0 {
                    return Err(io::Error::last_os_error());
                }
                *len = msg.msg_namelen;
                stamp = kernel_stamp(&msg);
                Ok(n as usize)
            })
        };
        let clocks = ClockPair::sample();
        let (len, addr) = match result {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let from = addr
            .as_socket()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "datagram from a non-IP address"))?;
        let (at_ns, source) = clocks.arrival(stamp);
        Ok(Some(Received {
            len: len.min(buf.len()),
            from,
            at_ns,
            source,
        }))
    }

    /// The underlying socket, for the rare caller that needs an option set here.
    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }
}

/// Control-message room for one `SCM_TIMESTAMPNS` (a timespec), in 8-byte words so it is
/// aligned for `cmsghdr`.
#[cfg(target_os = "linux")]
pub(crate) const STAMP_CONTROL_WORDS: usize = 8;

/// The kernel receive stamp among `msg`'s control messages, if there is one.
///
/// # Safety
/// `msg` must have been filled by a successful `recvmsg`/`recvmmsg`, with `msg_control`
/// pointing to a live buffer of at least `msg_controllen` bytes.
#[cfg(target_os = "linux")]
pub(crate) unsafe fn kernel_stamp(msg: &libc::msghdr) -> Option<libc::timespec> {
    let mut stamp = None;
    // SAFETY: per the contract above, the CMSG macros walk only inside `msg_controllen`
    // bytes of a live buffer; the timespec is read unaligned from inside one message.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            let c = &*cmsg;
            if c.cmsg_level == libc::SOL_SOCKET && c.cmsg_type == libc::SCM_TIMESTAMPNS {
                stamp = Some(std::ptr::read_unaligned(
                    libc::CMSG_DATA(cmsg).cast::<libc::timespec>(),
                ));
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    stamp
}

/// The monotonic and wall clocks read together right after a receive, to move kernel
/// stamps (wall clock) onto the [`clock::now_ns`] scale by their age.
#[cfg(target_os = "linux")]
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClockPair {
    mono_ns: u64,
    real_ns: Option<i128>,
}

#[cfg(target_os = "linux")]
impl ClockPair {
    pub(crate) fn sample() -> Self {
        let mono_ns = clock::now_ns();
        let real_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .map(|d| d.as_nanos() as i128);
        Self { mono_ns, real_ns }
    }

    /// Arrival time of a datagram with kernel stamp `stamp`; the monotonic reading when
    /// there is no stamp or it is implausible (the wall clock was stepped).
    pub(crate) fn arrival(&self, stamp: Option<libc::timespec>) -> (u64, TimestampSource) {
        if let (Some(ts), Some(real)) = (stamp, self.real_ns) {
            let stamped = ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128;
            let age = real - stamped;
            if (0..MAX_KERNEL_AGE_NS).contains(&age) {
                return (self.mono_ns.saturating_sub(age as u64), TimestampSource::Kernel);
            }
        }
        (self.mono_ns, TimestampSource::Monotonic)
    }
}

/// Ask the kernel to stamp arriving datagrams (Linux `SO_TIMESTAMPNS`). False if the
/// platform or the kernel does not offer it.
#[cfg(target_os = "linux")]
fn enable_kernel_timestamps(socket: &UdpSocket) -> bool {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: the fd is a live socket owned by `socket`; the option value points to a
    // c_int that lives across the call and its exact size is passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    rc == 0
}

#[cfg(not(target_os = "linux"))]
fn enable_kernel_timestamps(_socket: &UdpSocket) -> bool {
    false
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn loopback_datagram_gets_a_plausible_timestamp() {
        let a = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let b = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        b.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let before = clock::now_ns();
        a.send_to(b"hello", b.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 64];
        let r = b.recv(&mut buf).unwrap().unwrap();
        let after = clock::now_ns();
        assert_eq!(&buf[..r.len], b"hello");
        assert_eq!(r.from, a.local_addr().unwrap());
        // Allow for the two clocks being sampled a little apart.
        assert!(
            r.at_ns + 1_000_000 >= before && r.at_ns <= after,
            "{before} {} {after}",
            r.at_ns
        );
        if cfg!(target_os = "linux") {
            assert_eq!(b.timestamp_source(), TimestampSource::Kernel);
            assert_eq!(r.source, TimestampSource::Kernel);
        }
    }
}
