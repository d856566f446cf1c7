//! Batched UDP I/O for a forwarding server on one socket: many datagrams in per system
//! call, each with its own kernel receive stamp, and many datagrams out per system call,
//! where one received buffer can go to N destinations without being copied.
//!
//! [`RecvBatch`] owns pre-allocated slots and is refilled by every [`RecvBatch::recv`];
//! [`SendBatch`] owns pre-allocated message headers and sends a list of [`Transmit`]s
//! (destination + index of a payload in any [`Payloads`], e.g. the receive batch itself).
//! Nothing allocates after construction, and nothing here looks at what the bytes mean:
//! forwarding decisions belong to a sans-IO core, this module only moves datagrams.
//!
//! On Linux this is `recvmmsg` (with `MSG_WAITFORONE`: block for the first datagram, as
//! long as the socket's read timeout allows, then take whatever else is queued) and
//! `sendmmsg`. Receive stamps come from `SO_TIMESTAMPNS`, which [`UdpTransport::bind`]
//! switches on, and are moved onto the [`crate::clock::now_ns`] scale by the same helpers
//! [`UdpTransport::recv`] uses. Elsewhere (macOS, Windows) the same API runs on plain
//! `recv_from` (one datagram per call, stamped with the monotonic clock on return) and
//! `send_to` in a loop.
//!
//! Why hand-written on libc: quinn-udp batches receives but its send path is one
//! destination per call (GSO segments of one transmit), so a 7-way fan-out costs 7 system
//! calls, and its receive metadata carries no kernel timestamp; socket2 0.5 (the version
//! this crate uses) has no `recvmmsg`/`sendmmsg`; nix 0.31 has both over `MultiHeaders`,
//! but ties headers, buffers and results to one borrow per call and converts every
//! destination through its own address type and parses control messages into its own
//! enum; the extra layer buys nothing over the two system calls and one control message
//! this needs. The unsafe surface is the two calls and the address conversions below.
//!
//! Never here: blocking beyond the socket's own read timeout, allocation after
//! construction, copying a payload to send it to several destinations, or dropping a
//! datagram silently (a refused destination is reported; a too-long datagram is flagged
//! [`Datagram::truncated`]).

use std::io;
use std::net::SocketAddr;

use crate::transport::{TimestampSource, UdpTransport};

/// One received datagram, borrowed from its [`RecvBatch`] slot.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    pub bytes: &'a [u8],
    pub from: SocketAddr,
    /// Arrival time on the [`crate::clock::now_ns`] scale.
    pub at_ns: u64,
    pub source: TimestampSource,
    /// The datagram was longer than the slot; `bytes` holds only its start.
    pub truncated: bool,
}

#[derive(Debug, Clone, Copy)]
struct Meta {
    len: usize,
    from: SocketAddr,
    at_ns: u64,
    source: TimestampSource,
    truncated: bool,
}

const UNSPECIFIED: SocketAddr =
    SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0));

/// Pre-allocated receive slots, refilled by each [`RecvBatch::recv`].
#[derive(Debug)]
pub struct RecvBatch {
    /// Bytes a datagram may have; each slot is one byte longer so a longer datagram is
    /// noticed on every platform.
    max_datagram: usize,
    slots: Vec<u8>,
    meta: Vec<Meta>,
    count: usize,
    #[cfg(target_os = "linux")]
    sys: linux::RecvHeaders,
}

impl RecvBatch {
    /// Room for `capacity` datagrams (at least 1) of up to `max_datagram` bytes each.
    pub fn new(capacity: usize, max_datagram: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            max_datagram,
            slots: vec![0; capacity * (max_datagram + 1)],
            meta: vec![
                Meta {
                    len: 0,
                    from: UNSPECIFIED,
                    at_ns: 0,
                    source: TimestampSource::Monotonic,
                    truncated: false,
                };
                capacity
            ],
            count: 0,
            #[cfg(target_os = "linux")]
            sys: linux::RecvHeaders::new(capacity),
        }
    }

    pub fn capacity(&self) -> usize {
        self.meta.len()
    }

    /// Datagrams from the last [`RecvBatch::recv`].
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Datagram `i` (`i < len()`).
    pub fn get(&self, i: usize) -> Datagram<'_> {
        let m = &self.meta[..self.count][i];
        let start = i * (self.max_datagram + 1);
        Datagram {
            bytes: &self.slots[start..start + m.len],
            from: m.from,
            at_ns: m.at_ns,
            source: m.source,
            truncated: m.truncated,
        }
    }

    /// Datagram `i`'s bytes, to rewrite in place before forwarding.
    pub fn bytes_mut(&mut self, i: usize) -> &mut [u8] {
        let len = self.meta[..self.count][i].len;
        let start = i * (self.max_datagram + 1);
        &mut self.slots[start..start + len]
    }

    pub fn iter(&self) -> impl Iterator<Item = Datagram<'_>> + '_ {
        (0..self.count).map(|i| self.get(i))
    }

    /// Replace the batch with newly arrived datagrams: wait (up to the socket's read
    /// timeout; not at all on a non-blocking socket) for the first, then take whatever
    /// else is already queued, up to the capacity. Returns how many; 0 means the wait
    /// timed out or would have blocked.
    pub fn recv(&mut self, socket: &UdpTransport) -> io::Result<usize> {
        self.count = 0;
        #[cfg(target_os = "linux")]
        let n = self.recv_mmsg(socket)?;
        #[cfg(not(target_os = "linux"))]
        let n = self.recv_portable(socket)?;
        self.count = n;
        Ok(n)
    }

    /// One datagram through `recv_from`, stamped on return: the path every platform
    /// without `recvmmsg` takes (compiled everywhere so Linux tests cover it too).
    #[cfg_attr(target_os = "linux", allow(dead_code))]
    fn recv_portable(&mut self, socket: &UdpTransport) -> io::Result<usize> {
        let slot = self.max_datagram + 1;
        match recv_from_portable(socket.socket(), &mut self.slots[..slot]) {
            Ok((len, from)) => {
                self.meta[0] = Meta {
                    len: len.min(self.max_datagram),
                    from,
                    at_ns: crate::clock::now_ns(),
                    source: TimestampSource::Monotonic,
                    truncated: len > self.max_datagram,
                };
                Ok(1)
            }
            Err(e) if is_transient(&e) => Ok(0),
            Err(e) => Err(e),
        }
    }

    #[cfg(target_os = "linux")]
    fn recv_mmsg(&mut self, socket: &UdpTransport) -> io::Result<usize> {
        use std::os::fd::AsRawFd;
        let slot = self.max_datagram + 1;
        let n = self
            .sys
            .recv(socket.socket().as_raw_fd(), &mut self.slots, slot)?;
        let clocks = crate::transport::ClockPair::sample();
        let mut kept = 0;
        for i in 0..n {
            let (len, from, stamp) = self.sys.result(i);
            // A sender whose address is not IP (cannot happen on an IP socket) is skipped.
            let Some(from) = from else { continue };
            let (at_ns, source) = clocks.arrival(stamp);
            if kept != i {
                let (dst, src) = (kept * slot, i * slot);
                self.slots.copy_within(src..src + len.min(slot), dst);
            }
            self.meta[kept] = Meta {
                len: len.min(self.max_datagram),
                from,
                at_ns,
                source,
                truncated: len > self.max_datagram,
            };
            kept += 1;
        }
        Ok(kept)
    }
}

/// `recv_from`, except that on Windows a datagram longer than `buf` is skipped: Windows
/// refuses it instead of truncating it and does not say who sent it.
#[cfg_attr(target_os = "linux", allow(dead_code))]
fn recv_from_portable(socket: &std::net::UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
    #[cfg(windows)]
    loop {
        const WSAEMSGSIZE: i32 = 10040;
        match socket.recv_from(buf) {
            Err(e) if e.raw_os_error() == Some(WSAEMSGSIZE) => continue,
            r => return r,
        }
    }
    #[cfg(not(windows))]
    socket.recv_from(buf)
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

/// Where [`SendBatch`] finds the bytes of a [`Transmit`].
pub trait Payloads {
    /// The bytes of payload `index`; panics if there is no such payload (a caller bug).
    fn payload(&self, index: usize) -> &[u8];
}

impl Payloads for RecvBatch {
    fn payload(&self, index: usize) -> &[u8] {
        self.get(index).bytes
    }
}

impl<T: AsRef<[u8]>> Payloads for [T] {
    fn payload(&self, index: usize) -> &[u8] {
        self[index].as_ref()
    }
}

/// One datagram to send: payload `payload` of the [`Payloads`] given to the send call,
/// to `dst`. Many transmits may name the same payload (fan-out without copying).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    pub dst: SocketAddr,
    pub payload: usize,
}

/// What [`SendBatch::flush`] did with a list of transmits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Transmits the kernel took.
    pub sent: usize,
    /// Transmits it refused (a destination it cannot send to); skipped.
    pub failed: usize,
    /// The last refusal's kind, if any.
    pub last_error: Option<io::ErrorKind>,
    /// Stopped because the socket would block: `transmits[sent + failed..]` remain.
    pub would_block: bool,
}

/// Pre-allocated message headers for sending up to `capacity` datagrams per system call.
#[derive(Debug)]
pub struct SendBatch {
    capacity: usize,
    #[cfg(target_os = "linux")]
    sys: linux::SendHeaders,
}

impl SendBatch {
    /// Headers for `capacity` datagrams per call (at least 1; Linux takes at most 1024).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, 1024);
        Self {
            capacity,
            #[cfg(target_os = "linux")]
            sys: linux::SendHeaders::new(capacity),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Send `transmits` in order, as many as one system call takes (at most the
    /// capacity). `Ok(n)`: the first `n` went and the caller keeps the rest (`n` may be 0
    /// if the socket would block). `Err(e)`: `transmits[0]` was refused and nothing went;
    /// the caller decides whether to skip it ([`SendBatch::flush`] does).
    pub fn send<P: Payloads + ?Sized>(
        &mut self,
        socket: &UdpTransport,
        payloads: &P,
        transmits: &[Transmit],
    ) -> io::Result<usize> {
        let transmits = &transmits[..transmits.len().min(self.capacity)];
        if transmits.is_empty() {
            return Ok(0);
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            self.sys.send(socket.socket().as_raw_fd(), payloads, transmits)
        }
        #[cfg(not(target_os = "linux"))]
        send_portable(socket, payloads, transmits)
    }

    /// Send all of `transmits`, skipping (and counting) any the kernel refuses, until
    /// done or the socket would block.
    pub fn flush<P: Payloads + ?Sized>(
        &mut self,
        socket: &UdpTransport,
        payloads: &P,
        transmits: &[Transmit],
    ) -> Flushed {
        let mut out = Flushed::default();
        while out.sent + out.failed < transmits.len() {
            match self.send(socket, payloads, &transmits[out.sent + out.failed..]) {
                Ok(0) => {
                    out.would_block = true;
                    break;
                }
                Ok(n) => out.sent += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    out.would_block = true;
                    break;
                }
                Err(e) => {
                    out.failed += 1;
                    out.last_error = Some(e.kind());
                }
            }
        }
        out
    }
}

/// `send_to` per transmit, with [`SendBatch::send`]'s contract: the path every platform
/// without `sendmmsg` takes (compiled everywhere so Linux tests cover it too).
#[cfg_attr(target_os = "linux", allow(dead_code))]
fn send_portable<P: Payloads + ?Sized>(
    socket: &UdpTransport,
    payloads: &P,
    transmits: &[Transmit],
) -> io::Result<usize> {
    for (i, t) in transmits.iter().enumerate() {
        match socket.send_to(payloads.payload(t.payload), t.dst) {
            Ok(_) => {}
            Err(e) if i > 0 => {
                // Like sendmmsg: report what went; the error comes back on the next call
                // unless it was only a full buffer.
                let _ = e;
                return Ok(i);
            }
            Err(e) if is_transient(&e) => return Ok(0),
            Err(e) => return Err(e),
        }
    }
    Ok(transmits.len())
}

#[cfg(target_os = "linux")]
mod linux {
    //! The `recvmmsg`/`sendmmsg` calls and the conversions between `SocketAddr` and the
    //! C socket address structures they read and write.

    use std::io;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
    use std::os::fd::RawFd;

    use super::{Payloads, Transmit};
    use crate::transport::{kernel_stamp, STAMP_CONTROL_WORDS};

    /// An IPv4 or IPv6 socket address in C layout (`sockaddr_in6` is the larger).
    #[derive(Clone, Copy)]
    #[repr(C)]
    pub(super) union SockName {
        v4: libc::sockaddr_in,
        v6: libc::sockaddr_in6,
    }

    impl SockName {
        fn zeroed() -> Self {
            // SAFETY: both members are plain C structs of integers, for which all zero
            // bytes are a valid value.
            unsafe { std::mem::zeroed() }
        }

        /// Write `addr` in C layout; returns the length to pass the kernel.
        fn set(&mut self, addr: SocketAddr) -> libc::socklen_t {
            match addr {
                SocketAddr::V4(a) => {
                    let mut v4: libc::sockaddr_in = zeroed_in();
                    v4.sin_family = libc::AF_INET as libc::sa_family_t;
                    v4.sin_port = a.port().to_be();
                    v4.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                    self.v4 = v4;
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
                }
                SocketAddr::V6(a) => {
                    let mut v6: libc::sockaddr_in6 = zeroed_in6();
                    v6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                    v6.sin6_port = a.port().to_be();
                    v6.sin6_flowinfo = a.flowinfo();
                    v6.sin6_addr.s6_addr = a.ip().octets();
                    v6.sin6_scope_id = a.scope_id();
                    self.v6 = v6;
                    std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
                }
            }
        }

        /// Read back an address the kernel wrote with length `len`.
        fn get(&self, len: libc::socklen_t) -> Option<SocketAddr> {
            let len = len as usize;
            // SAFETY: every member starts with the family field at the same offset, and
            // the whole union was initialised (zeroed, then written by the kernel), so
            // reading any member's plain integer fields is defined. A member is read only
            // when the kernel said it wrote that family and at least that many bytes.
            unsafe {
                match self.v4.sin_family as libc::c_int {
                    libc::AF_INET if len >= std::mem::size_of::<libc::sockaddr_in>() => {
                        let a = self.v4;
                        Some(SocketAddr::V4(SocketAddrV4::new(
                            Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes()),
                            u16::from_be(a.sin_port),
                        )))
                    }
                    libc::AF_INET6 if len >= std::mem::size_of::<libc::sockaddr_in6>() => {
                        let a = self.v6;
                        Some(SocketAddr::V6(SocketAddrV6::new(
                            Ipv6Addr::from(a.sin6_addr.s6_addr),
                            u16::from_be(a.sin6_port),
                            a.sin6_flowinfo,
                            a.sin6_scope_id,
                        )))
                    }
                    _ => None,
                }
            }
        }
    }

    fn zeroed_in() -> libc::sockaddr_in {
        // SAFETY: a C struct of integers; all zero bytes is a valid value.
        unsafe { std::mem::zeroed() }
    }

    fn zeroed_in6() -> libc::sockaddr_in6 {
        // SAFETY: a C struct of integers; all zero bytes is a valid value.
        unsafe { std::mem::zeroed() }
    }

    fn zeroed_mmsghdr() -> libc::mmsghdr {
        // SAFETY: a C struct of integers and raw pointers; all zero bytes (null pointers,
        // zero lengths) is a valid value.
        unsafe { std::mem::zeroed() }
    }

    /// The C side of a receive batch. The raw pointers in `hdrs` and `iovs` are written
    /// at the start of every call and point only into memory borrowed for that call.
    pub(super) struct RecvHeaders {
        hdrs: Vec<libc::mmsghdr>,
        iovs: Vec<libc::iovec>,
        names: Vec<SockName>,
        control: Vec<[u64; STAMP_CONTROL_WORDS]>,
    }

    // SAFETY: the raw pointers stored inside are only dereferenced (by the kernel) during
    // a `recv` call that rewrites them first from `&mut` borrows; between calls they are
    // stale values nobody reads, so moving the struct to another thread is sound.
    unsafe impl Send for RecvHeaders {}

    impl std::fmt::Debug for RecvHeaders {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("RecvHeaders")
                .field("capacity", &self.hdrs.len())
                .finish()
        }
    }

    impl RecvHeaders {
        pub(super) fn new(capacity: usize) -> Self {
            Self {
                hdrs: vec![zeroed_mmsghdr(); capacity],
                iovs: vec![
                    libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0
                    };
                    capacity
                ],
                names: vec![SockName::zeroed(); capacity],
                control: vec![[0; STAMP_CONTROL_WORDS]; capacity],
            }
        }

        /// `recvmmsg` into `slots` (`capacity` slots of `slot` bytes). Returns how many
        /// datagrams arrived; a timeout or would-block is 0.
        pub(super) fn recv(&mut self, fd: RawFd, slots: &mut [u8], slot: usize) -> io::Result<usize> {
            let capacity = self.hdrs.len();
            debug_assert!(slots.len() >= capacity * slot);
            for (i, chunk) in slots.chunks_exact_mut(slot).take(capacity).enumerate() {
                self.iovs[i] = libc::iovec {
                    iov_base: chunk.as_mut_ptr().cast(),
                    iov_len: slot,
                };
                self.names[i] = SockName::zeroed();
                let h = &mut self.hdrs[i];
                h.msg_hdr.msg_name = (&mut self.names[i] as *mut SockName).cast();
                h.msg_hdr.msg_namelen = std::mem::size_of::<SockName>() as libc::socklen_t;
                h.msg_hdr.msg_iov = &mut self.iovs[i];
                h.msg_hdr.msg_iovlen = 1;
                h.msg_hdr.msg_control = self.control[i].as_mut_ptr().cast();
                h.msg_hdr.msg_controllen = std::mem::size_of::<[u64; STAMP_CONTROL_WORDS]>() as _;
                h.msg_hdr.msg_flags = 0;
                h.msg_len = 0;
            }
            // SAFETY: `hdrs` has `capacity` entries, each pointing to its own iovec (into a
            // distinct `slot`-byte chunk of `slots`), its own name buffer of the stated
            // length and its own control buffer of the stated length. All of them are
            // borrowed by this call and outlive it; the kernel writes only within those
            // lengths. A null timeout means none (the socket's read timeout still applies).
            let n = unsafe {
                libc::recvmmsg(
                    fd,
                    self.hdrs.as_mut_ptr(),
                    capacity as libc::c_uint,
                    libc::MSG_WAITFORONE,
                    std::ptr::null_mut(),
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if super::is_transient(&e) {
                    return Ok(0);
                }
                return Err(e);
            }
            Ok(n as usize)
        }

        /// Datagram `i` of the last `recv`: its full length (which may exceed the slot:
        /// the kernel reports the real length with `MSG_TRUNC`), sender and kernel stamp.
        pub(super) fn result(&self, i: usize) -> (usize, Option<SocketAddr>, Option<libc::timespec>) {
            let h = &self.hdrs[i];
            let truncated = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            let len = if truncated {
                // The slot is full; make the caller see "longer than the slot".
                h.msg_len as usize + 1
            } else {
                h.msg_len as usize
            };
            let from = self.names[i].get(h.msg_hdr.msg_namelen);
            // SAFETY: `recvmmsg` succeeded and filled this header; its control pointer
            // and length still describe `self.control[i]`, which is alive and unchanged.
            let stamp = unsafe { kernel_stamp(&h.msg_hdr) };
            (len, from, stamp)
        }
    }

    /// The C side of a send batch, rewritten at the start of every call.
    pub(super) struct SendHeaders {
        hdrs: Vec<libc::mmsghdr>,
        iovs: Vec<libc::iovec>,
        names: Vec<SockName>,
    }

    // SAFETY: as for `RecvHeaders`: the stored pointers are rewritten from live borrows
    // before every `sendmmsg` and never read between calls.
    unsafe impl Send for SendHeaders {}

    impl std::fmt::Debug for SendHeaders {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("SendHeaders")
                .field("capacity", &self.hdrs.len())
                .finish()
        }
    }

    impl SendHeaders {
        pub(super) fn new(capacity: usize) -> Self {
            Self {
                hdrs: vec![zeroed_mmsghdr(); capacity],
                iovs: vec![
                    libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0
                    };
                    capacity
                ],
                names: vec![SockName::zeroed(); capacity],
            }
        }

        /// `sendmmsg` of `transmits` (at most the capacity). See `SendBatch::send`.
        pub(super) fn send<P: Payloads + ?Sized>(
            &mut self,
            fd: RawFd,
            payloads: &P,
            transmits: &[Transmit],
        ) -> io::Result<usize> {
            let n = transmits.len().min(self.hdrs.len());
            for (i, t) in transmits[..n].iter().enumerate() {
                let bytes = payloads.payload(t.payload);
                // The kernel only reads through a send iovec; the cast to `*mut` is what
                // the C type asks for.
                self.iovs[i] = libc::iovec {
                    iov_base: bytes.as_ptr().cast_mut().cast(),
                    iov_len: bytes.len(),
                };
                let namelen = self.names[i].set(t.dst);
                let h = &mut self.hdrs[i];
                h.msg_hdr.msg_name = (&mut self.names[i] as *mut SockName).cast();
                h.msg_hdr.msg_namelen = namelen;
                h.msg_hdr.msg_iov = &mut self.iovs[i];
                h.msg_hdr.msg_iovlen = 1;
                h.msg_hdr.msg_control = std::ptr::null_mut();
                h.msg_hdr.msg_controllen = 0;
                h.msg_hdr.msg_flags = 0;
                h.msg_len = 0;
            }
            // SAFETY: the first `n` headers each point to one iovec over a payload slice
            // borrowed (through `payloads`) for this whole call, and to a name buffer
            // holding an address of the stated length; the kernel only reads them.
            let sent = unsafe { libc::sendmmsg(fd, self.hdrs.as_mut_ptr(), n as libc::c_uint, 0) };
            if sent < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    return Ok(0);
                }
                return Err(e);
            }
            Ok(sent as usize)
        }
    }

    #[cfg(test)]
    #[allow(clippy::unwrap_used)]
    mod tests {
        use super::*;

        #[test]
        fn socket_names_round_trip() {
            for addr in [
                "127.0.0.1:4464".parse::<SocketAddr>().unwrap(),
                "[::1]:9".parse().unwrap(),
                "[fe80::1%3]:65535".parse().unwrap(),
            ] {
                let mut name = SockName::zeroed();
                let len = name.set(addr);
                assert_eq!(name.get(len), Some(addr));
            }
            let name = SockName::zeroed();
            assert_eq!(name.get(std::mem::size_of::<SockName>() as _), None);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::clock;
    use std::time::Duration;

    const WAIT: Duration = Duration::from_secs(5);

    fn bind() -> UdpTransport {
        let t = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        t.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        t
    }

    /// Receive until `want` datagrams have arrived or `WAIT` has passed; returns them
    /// (bytes, at_ns, source) and the largest batch one call returned.
    fn collect(rx: &UdpTransport, batch: &mut RecvBatch, want: usize) -> (Vec<(Vec<u8>, u64)>, usize) {
        let deadline = std::time::Instant::now() + WAIT;
        let mut got = Vec::new();
        let mut largest = 0;
        while got.len() < want && std::time::Instant::now() < deadline {
            let n = batch.recv(rx).unwrap();
            largest = largest.max(n);
            for d in batch.iter() {
                got.push((d.bytes.to_vec(), d.at_ns));
            }
        }
        (got, largest)
    }

    #[test]
    fn a_batch_of_datagrams_arrives_with_kernel_stamps_in_order() {
        let rx = bind();
        let tx = bind();
        let to = rx.local_addr().unwrap();
        let n = 40u8;
        let before = clock::now_ns();
        for i in 0..n {
            tx.send_to(&[i; 100], to).unwrap();
        }
        let mut batch = RecvBatch::new(32, 1500);
        let deadline = std::time::Instant::now() + WAIT;
        let mut seen = Vec::new();
        let mut largest = 0;
        while seen.len() < n as usize && std::time::Instant::now() < deadline {
            let got = batch.recv(&rx).unwrap();
            largest = largest.max(got);
            for d in batch.iter() {
                assert_eq!(d.from, tx.local_addr().unwrap());
                assert!(!d.truncated);
                assert_eq!(d.bytes.len(), 100);
                if cfg!(target_os = "linux") {
                    assert_eq!(d.source, TimestampSource::Kernel);
                }
                seen.push((d.bytes[0], d.at_ns));
            }
        }
        let after = clock::now_ns();
        assert_eq!(seen.len(), n as usize, "every datagram arrives");
        for (i, (tag, at)) in seen.iter().enumerate() {
            assert_eq!(*tag as usize, i, "loopback keeps order");
            // The two clocks are sampled a little apart; allow a millisecond.
            assert!(*at + 1_000_000 >= before && *at <= after, "{before} {at} {after}");
        }
        for w in seen.windows(2) {
            // Stamps converted in one batch keep the kernel's order exactly; across
            // batches the clock pair is resampled, so allow a small step back.
            assert!(w[1].1 + 1_000_000 >= w[0].1, "stamps go backwards: {w:?}");
        }
        assert!(largest <= 32);
        if cfg!(target_os = "linux") {
            // All 40 were queued before the first call: one call takes more than one.
            assert!(largest > 1, "recvmmsg never returned more than one datagram");
        }
    }

    #[test]
    fn a_quiet_socket_times_out_with_an_empty_batch() {
        let rx = bind();
        rx.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut batch = RecvBatch::new(8, 1500);
        assert_eq!(batch.recv(&rx).unwrap(), 0);
        assert!(batch.is_empty());
        assert_eq!(batch.iter().count(), 0);
    }

    #[test]
    fn a_datagram_longer_than_a_slot_is_flagged_truncated() {
        let rx = bind();
        let tx = bind();
        tx.send_to(&[7u8; 300], rx.local_addr().unwrap()).unwrap();
        tx.send_to(&[8u8; 64], rx.local_addr().unwrap()).unwrap();
        let mut batch = RecvBatch::new(4, 64);
        let (got, _) = collect(&rx, &mut batch, 2);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, vec![7u8; 64]);
        assert_eq!(got[1].0, vec![8u8; 64]);
        // The flag belongs to the batch that held it; check it on a fresh pair.
        tx.send_to(&[9u8; 65], rx.local_addr().unwrap()).unwrap();
        assert_eq!(batch.recv(&rx).unwrap(), 1);
        assert!(batch.get(0).truncated);
        assert_eq!(batch.get(0).bytes.len(), 64);
    }

    #[test]
    fn one_received_buffer_fans_out_to_n_sockets() {
        let server = bind();
        let member = bind();
        let listeners: Vec<UdpTransport> = (0..7).map(|_| bind()).collect();
        let payload: Vec<u8> = (0..=255u8).cycle().take(276).collect();
        member.send_to(&payload, server.local_addr().unwrap()).unwrap();
        let mut batch = RecvBatch::new(16, 1500);
        let (got, _) = collect(&server, &mut batch, 1);
        assert_eq!(got.len(), 1);
        let transmits: Vec<Transmit> = listeners
            .iter()
            .map(|l| Transmit {
                dst: l.local_addr().unwrap(),
                payload: 0,
            })
            .collect();
        let mut send = SendBatch::new(64);
        let done = send.flush(&server, &batch, &transmits);
        assert_eq!(
            done,
            Flushed {
                sent: 7,
                ..Flushed::default()
            }
        );
        for l in &listeners {
            let mut one = RecvBatch::new(4, 1500);
            let (got, _) = collect(l, &mut one, 1);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].0, payload);
        }
    }

    #[test]
    fn a_batch_larger_than_the_headers_goes_in_parts_and_the_caller_keeps_the_rest() {
        let server = bind();
        let sink = bind();
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 20]).collect();
        let transmits: Vec<Transmit> = (0..10)
            .map(|i| Transmit {
                dst: sink.local_addr().unwrap(),
                payload: i,
            })
            .collect();
        let mut send = SendBatch::new(4);
        let first = send.send(&server, payloads.as_slice(), &transmits).unwrap();
        assert!((1..=4).contains(&first), "sent {first}");
        let rest = send.flush(&server, payloads.as_slice(), &transmits[first..]);
        assert_eq!(rest.sent, 10 - first);
        let mut batch = RecvBatch::new(16, 100);
        let (got, _) = collect(&sink, &mut batch, 10);
        let tags: Vec<u8> = got.iter().map(|(b, _)| b[0]).collect();
        assert_eq!(tags, (0..10).collect::<Vec<u8>>());
    }

    #[test]
    fn a_refused_destination_stops_the_call_after_what_went_and_flush_skips_it() {
        let server = bind();
        let sink = bind();
        let good = sink.local_addr().unwrap();
        // An IPv6 destination on an IPv4 socket: the kernel refuses that one message.
        let bad: SocketAddr = "[::1]:9".parse().unwrap();
        let payloads = [b"a".as_slice(), b"b", b"c", b"d"];
        let transmits = [
            Transmit {
                dst: good,
                payload: 0,
            },
            Transmit {
                dst: good,
                payload: 1,
            },
            Transmit { dst: bad, payload: 2 },
            Transmit {
                dst: good,
                payload: 3,
            },
        ];
        let mut send = SendBatch::new(8);
        let n = send.send(&server, payloads.as_slice(), &transmits).unwrap();
        assert_eq!(n, 2, "the call stops at the refused message, counting what went");
        assert!(send.send(&server, payloads.as_slice(), &transmits[2..]).is_err());
        let done = send.flush(&server, payloads.as_slice(), &transmits[n..]);
        assert_eq!(done.sent + n, 3);
        assert_eq!(done.failed, 1);
        assert!(done.last_error.is_some());
        assert!(!done.would_block);
        let mut batch = RecvBatch::new(8, 100);
        let (got, _) = collect(&sink, &mut batch, 3);
        let tags: Vec<Vec<u8>> = got.into_iter().map(|(b, _)| b).collect();
        assert_eq!(tags, [b"a".to_vec(), b"b".to_vec(), b"d".to_vec()]);
    }

    #[test]
    fn the_portable_path_keeps_the_same_contract() {
        let server = bind();
        let sink = bind();
        let mut batch = RecvBatch::new(4, 64);
        sink.send_to(&[1u8; 80], server.local_addr().unwrap()).unwrap();
        let deadline = std::time::Instant::now() + WAIT;
        let mut n = 0;
        while n == 0 && std::time::Instant::now() < deadline {
            n = batch.recv_portable(&server).unwrap();
        }
        batch.count = n;
        assert_eq!(n, 1);
        let d = batch.get(0);
        assert!(d.truncated);
        assert_eq!(d.from, sink.local_addr().unwrap());
        assert_eq!(d.source, TimestampSource::Monotonic);
        let transmits = [
            Transmit {
                dst: sink.local_addr().unwrap(),
                payload: 0,
            },
            Transmit {
                dst: "[::1]:9".parse().unwrap(),
                payload: 0,
            },
        ];
        assert_eq!(send_portable(&server, &batch, &transmits).unwrap(), 1);
        assert!(send_portable(&server, &batch, &transmits[1..]).is_err());
        let (got, _) = collect(&sink, &mut batch, 1);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, vec![1u8; 64]);
    }
}
