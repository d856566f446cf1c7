//! A lock-free single-producer single-consumer ring of whole datagrams.
//!
//! The network thread and the audio thread hand packets to each other through it: each
//! record is an arrival time, the kind the socket sorted the datagram into (so the audio
//! thread never sorts it again), a length and the bytes. Memory is reserved at construction;
//! `push` and `pop` never allocate, lock or block — a full ring refuses the packet (the
//! caller counts it) instead of waiting.

use netjam_engine::wire::PacketKind;
use rtrb::{Consumer, Producer, RingBuffer};

/// Time (8 bytes), length (4), kind (1).
const HEADER: usize = 13;

fn kind_byte(kind: PacketKind) -> u8 {
    match kind {
        PacketKind::Rtp => 1,
        PacketKind::Rtcp => 2,
        PacketKind::Other => 0,
    }
}

fn byte_kind(b: u8) -> PacketKind {
    match b {
        1 => PacketKind::Rtp,
        2 => PacketKind::Rtcp,
        _ => PacketKind::Other,
    }
}

/// Writing end.
#[derive(Debug)]
pub struct PacketTx(Producer<u8>);

/// Reading end.
#[derive(Debug)]
pub struct PacketRx(Consumer<u8>);

/// A ring holding up to `bytes` bytes of records.
pub fn packet_ring(bytes: usize) -> (PacketTx, PacketRx) {
    let (p, c) = RingBuffer::new(bytes);
    (PacketTx(p), PacketRx(c))
}

fn put(dst: (&mut [u8], &mut [u8]), at: usize, src: &[u8]) {
    let (a, b) = dst;
    for (i, byte) in src.iter().enumerate() {
        let k = at + i;
        if k < a.len() {
            a[k] = *byte;
        } else {
            b[k - a.len()] = *byte;
        }
    }
}

impl PacketTx {
    /// Queue `data` stamped `at_ns`, of no kind the reader needs (what the audio thread
    /// sends); `false` if the ring is full.
    pub fn push(&mut self, at_ns: u64, data: &[u8]) -> bool {
        self.push_kind(at_ns, PacketKind::Other, data)
    }

    /// Queue `data` stamped `at_ns`, of the `kind` it was sorted into; `false` if the ring
    /// is full.
    pub fn push_kind(&mut self, at_ns: u64, kind: PacketKind, data: &[u8]) -> bool {
        let Ok(mut chunk) = self.0.write_chunk(HEADER + data.len()) else {
            return false;
        };
        let (a, b) = chunk.as_mut_slices();
        put((&mut *a, &mut *b), 0, &at_ns.to_le_bytes());
        put((&mut *a, &mut *b), 8, &(data.len() as u32).to_le_bytes());
        put((&mut *a, &mut *b), 12, &[kind_byte(kind)]);
        put((a, b), HEADER, data);
        chunk.commit_all();
        true
    }
}

impl PacketRx {
    /// Take the oldest record into `buf`: its time, kind and length. A record longer than
    /// `buf` is dropped and reported with length 0.
    pub fn pop(&mut self, buf: &mut [u8]) -> Option<(u64, PacketKind, usize)> {
        let mut header = [0u8; HEADER];
        {
            let chunk = self.0.read_chunk(HEADER).ok()?;
            let (a, b) = chunk.as_slices();
            for (i, h) in header.iter_mut().enumerate() {
                *h = if i < a.len() { a[i] } else { b[i - a.len()] };
            }
            // Not committed: the whole record is consumed below.
        }
        let at = u64::from_le_bytes([
            header[0], header[1], header[2], header[3], header[4], header[5], header[6], header[7],
        ]);
        let len = u32::from_le_bytes([header[8], header[9], header[10], header[11]]) as usize;
        let kind = byte_kind(header[12]);
        let chunk = self.0.read_chunk(HEADER + len).ok()?;
        let (a, b) = chunk.as_slices();
        let fits = len <= buf.len();
        if fits {
            for (i, slot) in buf[..len].iter_mut().enumerate() {
                let k = HEADER + i;
                *slot = if k < a.len() { a[k] } else { b[k - a.len()] };
            }
        }
        chunk.commit_all();
        Some((at, kind, if fits { len } else { 0 }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_wraparound_in_order() {
        let (mut tx, mut rx) = packet_ring(100);
        let mut buf = [0u8; 64];
        let kinds = [PacketKind::Rtp, PacketKind::Rtcp, PacketKind::Other];
        for round in 0..50u64 {
            let data: Vec<u8> = (0..(round % 40) as u8).collect();
            let kind = kinds[round as usize % 3];
            assert!(tx.push_kind(round, kind, &data));
            let (at, got, len) = rx.pop(&mut buf).expect("record");
            assert_eq!((at, got, &buf[..len]), (round, kind, &data[..]));
        }
        assert!(rx.pop(&mut buf).is_none());
    }

    #[test]
    fn a_full_ring_refuses_instead_of_blocking() {
        let (mut tx, _rx) = packet_ring(40);
        assert!(tx.push(1, &[0; 20]));
        assert!(!tx.push(2, &[0; 20]));
    }
}
