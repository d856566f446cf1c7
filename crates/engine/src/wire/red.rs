//! Redundant audio payloads (RFC 2198).
//!
//! A RED payload carries the current ("primary") audio block plus copies of up to
//! [`MAX_RED_BLOCKS`] earlier blocks, so a receiver that lost a packet can fill the gap
//! from the next one without waiting for a retransmission. The layout is a run of block
//! headers followed by the block data in the same order:
//!
//! ```text
//!  redundant header (4 bytes): F=1 | PT (7) | timestamp offset (14) | block length (10)
//!  primary header   (1 byte):  F=0 | PT (7)
//!  data of each redundant block, then the primary data (its length is whatever remains)
//! ```
//!
//! [`parse_red`] borrows the blocks from the packet into a fixed array and
//! [`write_red`] fills a caller's buffer: neither allocates, and no input makes either
//! panic.

/// Most redundant blocks netjam reads or writes in one payload (the primary is extra).
pub const MAX_RED_BLOCKS: usize = 8;

/// Largest timestamp offset a redundant block header can carry (14 bits).
pub const MAX_RED_OFFSET: u16 = 0x3FFF;

/// Largest redundant block a header can describe (10 bits).
pub const MAX_RED_BLOCK_LEN: usize = 0x3FF;

/// One block of a RED payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedBlock<'a> {
    /// 7-bit RTP payload type of the block's data.
    pub payload_type: u8,
    /// How far, in RTP timestamp units, this block's media time lies before the packet's
    /// timestamp; 0 for the primary block.
    pub timestamp_offset: u16,
    pub data: &'a [u8],
}

const EMPTY_BLOCK: RedBlock<'static> = RedBlock {
    payload_type: 0,
    timestamp_offset: 0,
    data: &[],
};

/// A parsed RED payload: up to [`MAX_RED_BLOCKS`] redundant blocks and the primary.
#[derive(Debug, Clone, Copy)]
pub struct RedPayload<'a> {
    /// Redundant blocks in wire order, then the primary at index `redundant_count`.
    blocks: [RedBlock<'a>; MAX_RED_BLOCKS + 1],
    redundant_count: usize,
}

impl<'a> RedPayload<'a> {
    /// The redundant blocks in wire order (oldest first, as netjam sends them).
    pub fn redundant(&self) -> &[RedBlock<'a>] {
        &self.blocks[..self.redundant_count]
    }

    /// The primary block (timestamp offset 0).
    pub fn primary(&self) -> RedBlock<'a> {
        self.blocks[self.redundant_count]
    }
}

/// Why bytes are not a valid RED payload, or blocks cannot be written as one.
#[derive(Debug, thiserror::Error, Clone, Copy, PartialEq, Eq)]
pub enum RedError {
    #[error("RED payload is empty")]
    Empty,
    #[error("RED block headers run past the end of the payload")]
    HeaderPastEnd,
    #[error("RED payload has more than {max} redundant blocks")]
    TooManyBlocks { max: usize },
    #[error("RED block lengths add up to more than the payload holds")]
    BlockPastEnd,
    #[error("redundant block of {len} bytes is too long for RED (at most 1023): send fewer frames per packet or less redundancy")]
    BlockTooLong { len: usize },
    #[error("redundant block is {offset} timestamp units old, more than RED's 16383: use less redundancy or smaller packets")]
    OffsetTooLarge { offset: u16 },
    #[error("payload type {0} does not fit in 7 bits (0 to 127)")]
    BadPayloadType(u8),
    #[error("buffer too small for the RED payload: {need} bytes needed, {have} available")]
    BufferTooSmall { need: usize, have: usize },
}

/// Parses a RED payload (the RTP payload of a packet whose payload type is RED).
///
/// Rejects an empty payload, headers or block data that run past the end, and more than
/// [`MAX_RED_BLOCKS`] redundant blocks.
pub fn parse_red(payload: &[u8]) -> Result<RedPayload<'_>, RedError> {
    if payload.is_empty() {
        return Err(RedError::Empty);
    }
    let mut blocks = [EMPTY_BLOCK; MAX_RED_BLOCKS + 1];
    let mut lengths = [0usize; MAX_RED_BLOCKS];
    let mut count = 0;
    let mut pos = 0;
    let primary_pt = loop {
        let &first = payload.get(pos).ok_or(RedError::HeaderPastEnd)?;
        if first & 0x80 == 0 {
            pos += 1;
            break first;
        }
        if count == MAX_RED_BLOCKS {
            return Err(RedError::TooManyBlocks { max: MAX_RED_BLOCKS });
        }
        let h = payload.get(pos..pos + 4).ok_or(RedError::HeaderPastEnd)?;
        let word = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        blocks[count].payload_type = first & 0x7f;
        blocks[count].timestamp_offset = ((word >> 10) & 0x3FFF) as u16;
        lengths[count] = (word & 0x3FF) as usize;
        count += 1;
        pos += 4;
    };
    for (block, &len) in blocks.iter_mut().zip(lengths.iter()).take(count) {
        block.data = payload.get(pos..pos + len).ok_or(RedError::BlockPastEnd)?;
        pos += len;
    }
    blocks[count] = RedBlock {
        payload_type: primary_pt,
        timestamp_offset: 0,
        data: &payload[pos..],
    };
    Ok(RedPayload {
        blocks,
        redundant_count: count,
    })
}

/// Writes a RED payload into `out` and returns its length.
///
/// `redundant` lists earlier blocks oldest first; each must be at most 1023 bytes with an
/// offset of at most 16383 timestamp units, and there may be at most [`MAX_RED_BLOCKS`].
/// The primary block may be any length.
pub fn write_red(
    primary_pt: u8,
    primary: &[u8],
    redundant: &[RedBlock<'_>],
    out: &mut [u8],
) -> Result<usize, RedError> {
    if redundant.len() > MAX_RED_BLOCKS {
        return Err(RedError::TooManyBlocks { max: MAX_RED_BLOCKS });
    }
    if primary_pt > 0x7f {
        return Err(RedError::BadPayloadType(primary_pt));
    }
    let mut need = 1usize.saturating_add(primary.len());
    for b in redundant {
        if b.payload_type > 0x7f {
            return Err(RedError::BadPayloadType(b.payload_type));
        }
        if b.data.len() > MAX_RED_BLOCK_LEN {
            return Err(RedError::BlockTooLong { len: b.data.len() });
        }
        if b.timestamp_offset > MAX_RED_OFFSET {
            return Err(RedError::OffsetTooLarge {
                offset: b.timestamp_offset,
            });
        }
        need += 4 + b.data.len();
    }
    if need > out.len() {
        return Err(RedError::BufferTooSmall {
            need,
            have: out.len(),
        });
    }
    let mut pos = 0;
    for b in redundant {
        let word = (0x80 | u32::from(b.payload_type)) << 24
            | u32::from(b.timestamp_offset) << 10
            | b.data.len() as u32;
        out[pos..pos + 4].copy_from_slice(&word.to_be_bytes());
        pos += 4;
    }
    out[pos] = primary_pt;
    pos += 1;
    for b in redundant.iter().map(|b| b.data).chain([primary]) {
        out[pos..pos + b.len()].copy_from_slice(b);
        pos += b.len();
    }
    Ok(pos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_rfc_2198_byte_by_byte() {
        // Two redundant blocks (PT 97, offsets 64 and 32, lengths 3 and 2) and a primary.
        let older = RedBlock {
            payload_type: 97,
            timestamp_offset: 64,
            data: &[1, 2, 3],
        };
        let newer = RedBlock {
            payload_type: 97,
            timestamp_offset: 32,
            data: &[4, 5],
        };
        let mut out = [0u8; 32];
        let n = write_red(97, &[6, 7, 8, 9], &[older, newer], &mut out).expect("fits");
        assert_eq!(n, 4 + 4 + 1 + 3 + 2 + 4);
        // F=1, PT 97 = 0xE1; offset 64 << 10 | len 3 = 0x0001_0003 in the low 24 bits.
        assert_eq!(out[0..4], [0xE1, 0x01, 0x00, 0x03]);
        // Offset 32 << 10 = 0x8000; | len 2.
        assert_eq!(out[4..8], [0xE1, 0x00, 0x80, 0x02]);
        // Primary header: F=0, PT 97.
        assert_eq!(out[8], 97);
        assert_eq!(out[9..n], [1, 2, 3, 4, 5, 6, 7, 8, 9]);

        let red = parse_red(&out[..n]).expect("valid");
        assert_eq!(red.redundant(), &[older, newer]);
        assert_eq!(
            red.primary(),
            RedBlock {
                payload_type: 97,
                timestamp_offset: 0,
                data: &[6, 7, 8, 9]
            }
        );
    }

    #[test]
    fn field_extremes_round_trip() {
        let big = [0xAAu8; MAX_RED_BLOCK_LEN];
        let blocks = [RedBlock {
            payload_type: 127,
            timestamp_offset: MAX_RED_OFFSET,
            data: &big,
        }; MAX_RED_BLOCKS];
        let mut out = vec![0u8; 9000];
        let n = write_red(0, &[], &blocks, &mut out).expect("fits");
        let red = parse_red(&out[..n]).expect("valid");
        assert_eq!(red.redundant(), &blocks);
        assert_eq!(red.primary().data, &[] as &[u8]);
        assert_eq!(red.primary().payload_type, 0);

        // Only a primary.
        let n = write_red(96, b"abc", &[], &mut out).expect("fits");
        assert_eq!(out[..n], [96, b'a', b'b', b'c']);
        let red = parse_red(&out[..n]).expect("valid");
        assert!(red.redundant().is_empty());
        assert_eq!(red.primary().data, b"abc");
    }

    #[test]
    fn writer_rejects_what_the_format_cannot_express() {
        let mut out = [0u8; 4096];
        let long = [0u8; 1024];
        let block = |offset, data| RedBlock {
            payload_type: 96,
            timestamp_offset: offset,
            data,
        };
        assert_eq!(
            write_red(96, &[], &[block(0, &long)], &mut out),
            Err(RedError::BlockTooLong { len: 1024 })
        );
        assert_eq!(
            write_red(96, &[], &[block(16384, &[])], &mut out),
            Err(RedError::OffsetTooLarge { offset: 16384 })
        );
        assert_eq!(
            write_red(96, &[], &[block(0, &[]); 9], &mut out),
            Err(RedError::TooManyBlocks { max: 8 })
        );
        assert_eq!(
            write_red(128, &[], &[], &mut out),
            Err(RedError::BadPayloadType(128))
        );
        assert_eq!(
            write_red(96, &[1, 2, 3], &[block(1, &[1])], &mut out[..8]),
            Err(RedError::BufferTooSmall { need: 9, have: 8 })
        );
        assert!(RedError::BlockTooLong { len: 1024 }
            .to_string()
            .contains("fewer frames"));
    }

    #[test]
    fn hostile_payloads_are_typed_errors() {
        let err = |b: &[u8]| parse_red(b).err();
        assert_eq!(err(&[]), Some(RedError::Empty));
        // A redundant header with no primary header after it.
        assert_eq!(err(&[0xE1, 0, 0, 0]), Some(RedError::HeaderPastEnd));
        // Truncated redundant header.
        assert_eq!(err(&[0xE1, 0, 0]), Some(RedError::HeaderPastEnd));
        // Block length 1023 with 2 bytes of data.
        assert_eq!(
            err(&[0xE1, 0, 0x03, 0xFF, 97, 1, 2]),
            Some(RedError::BlockPastEnd)
        );
        // Nine redundant headers.
        let mut nine = [0u8; 9 * 4 + 1];
        for h in nine.chunks_exact_mut(4) {
            h[0] = 0xE1;
        }
        assert_eq!(err(&nine), Some(RedError::TooManyBlocks { max: 8 }));
        // Every truncation of a valid payload either fails or shortens the primary.
        let mut out = [0u8; 64];
        let b = RedBlock {
            payload_type: 1,
            timestamp_offset: 5,
            data: &[9; 10],
        };
        let n = write_red(2, &[7; 10], &[b, b], &mut out).expect("fits");
        for len in 0..n {
            if let Ok(red) = parse_red(&out[..len]) {
                assert_eq!(red.redundant().len(), 2);
                assert_eq!(red.primary().data.len(), len - 29);
            }
        }
    }
}
