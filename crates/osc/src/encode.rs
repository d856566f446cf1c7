//! OSC encoding into a caller-provided `&mut [u8]`.
//!
//! [`encode_message`] writes one message; [`BundleWriter`] writes bundles, nested up to
//! [`MAX_BUNDLE_DEPTH`]. Everything written here decodes again with
//! [`Packet::decode`](crate::Packet::decode). This module must never allocate, and it
//! never writes past the buffer it was given: a short buffer is an error, not a panic.

use crate::arg::{padded_str_len, Arg};
use crate::decode::{BUNDLE_TAG, MAX_ARRAY_DEPTH, MAX_BUNDLE_DEPTH};
use crate::time::TimeTag;

/// Why a message or bundle could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The output buffer is too small.
    #[error("output buffer too small: {needed} bytes needed, {available} available")]
    BufferTooSmall {
        /// Bytes the encoding needs in total.
        needed: usize,
        /// Bytes the buffer has.
        available: usize,
    },
    /// An address must start with `/` (or `!` for a literal address) and contain no NUL.
    #[error("address must start with '/' or '!' and contain no NUL byte")]
    BadAddress,
    /// OSC strings cannot contain NUL bytes.
    #[error("string argument contains a NUL byte")]
    NulInString,
    /// Blobs longer than `i32::MAX` bytes cannot be encoded.
    #[error("blob longer than i32::MAX bytes")]
    BlobTooLong,
    /// `ArrayBegin`/`ArrayEnd` do not pair up.
    #[error("ArrayBegin and ArrayEnd do not pair up (or nest deeper than {MAX_ARRAY_DEPTH})")]
    UnbalancedArray,
    /// Too many nested bundles.
    #[error("bundles nested deeper than {MAX_BUNDLE_DEPTH}")]
    NestingTooDeep,
    /// `close_bundle`/`finish` called in the wrong state.
    #[error("no nested bundle is open")]
    NoOpenBundle,
    /// A raw element is empty or not a multiple of 4 bytes long.
    #[error("raw bundle element must be a non-empty multiple of 4 bytes")]
    BadElement,
}

/// Bytes [`encode_message`] needs for this message.
pub fn message_len(address: &str, args: &[Arg<'_>]) -> usize {
    padded_str_len(address.len())
        + padded_str_len(1 + args.len())
        + args.iter().map(Arg::encoded_len).sum::<usize>()
}

/// Encodes one message into `buf` and returns the number of bytes written.
///
/// ```
/// use netjam_osc::{encode_message, Arg};
/// let mut buf = [0u8; 64];
/// let n = encode_message(&mut buf, "/oscillator/4/frequency", &[Arg::Float(440.0)]).unwrap();
/// assert_eq!(n, 32);
/// ```
#[inline]
pub fn encode_message(buf: &mut [u8], address: &str, args: &[Arg<'_>]) -> Result<usize, EncodeError> {
    let ab = address.as_bytes();
    if !matches!(ab.first(), Some(b'/') | Some(b'!')) || has_nul(ab) {
        return Err(EncodeError::BadAddress);
    }
    // One pass: validate and size.
    let mut needed = padded_str_len(ab.len()) + padded_str_len(1 + args.len());
    let mut depth = 0usize;
    for a in args {
        needed += a.encoded_len();
        match a {
            Arg::Str(s) | Arg::Symbol(s) if has_nul(s.as_bytes()) => return Err(EncodeError::NulInString),
            Arg::Blob(b) if b.len() > i32::MAX as usize => return Err(EncodeError::BlobTooLong),
            Arg::ArrayBegin => {
                depth += 1;
                if depth > MAX_ARRAY_DEPTH {
                    return Err(EncodeError::UnbalancedArray);
                }
            }
            Arg::ArrayEnd => depth = depth.checked_sub(1).ok_or(EncodeError::UnbalancedArray)?,
            _ => {}
        }
    }
    if depth != 0 {
        return Err(EncodeError::UnbalancedArray);
    }
    let Some(out) = buf.get_mut(..needed) else {
        return Err(EncodeError::BufferTooSmall {
            needed,
            available: buf.len(),
        });
    };
    let mut pos = put_str(out, 0, ab);
    // Type tag string: ',' then one tag per argument, NUL padded.
    let tag_end = pos + padded_str_len(1 + args.len());
    let tags = &mut out[pos..tag_end];
    let n = tags.len();
    tags[n - 4..].copy_from_slice(&[0; 4]);
    tags[0] = b',';
    for (t, a) in tags[1..].iter_mut().zip(args) {
        *t = a.tag();
    }
    pos = tag_end;
    for a in args {
        pos = put_arg(out, pos, a);
    }
    debug_assert_eq!(pos, needed);
    Ok(needed)
}

/// Whether `b` contains a NUL byte, 8 bytes at a time.
#[inline]
fn has_nul(b: &[u8]) -> bool {
    let mut i = 0;
    while let Some(Ok(c)) = b.get(i..i + 8).map(<[u8; 8]>::try_from) {
        let w = u64::from_ne_bytes(c);
        if w.wrapping_sub(0x0101_0101_0101_0101) & !w & 0x8080_8080_8080_8080 != 0 {
            return true;
        }
        i += 8;
    }
    b.get(i..).is_some_and(|t| t.contains(&0))
}

#[inline]
fn put_str(out: &mut [u8], pos: usize, s: &[u8]) -> usize {
    let end = pos + padded_str_len(s.len());
    // Zero the last word first (it holds the NUL and the padding), then copy over it.
    out[end - 4..end].copy_from_slice(&[0; 4]);
    out[pos..pos + s.len()].copy_from_slice(s);
    end
}

#[inline]
fn put4(out: &mut [u8], pos: usize, b: [u8; 4]) -> usize {
    out[pos..pos + 4].copy_from_slice(&b);
    pos + 4
}

#[inline]
fn put8(out: &mut [u8], pos: usize, b: [u8; 8]) -> usize {
    out[pos..pos + 8].copy_from_slice(&b);
    pos + 8
}

#[inline]
fn put_arg(out: &mut [u8], pos: usize, a: &Arg<'_>) -> usize {
    match *a {
        Arg::Int(v) => put4(out, pos, v.to_be_bytes()),
        Arg::Float(v) => put4(out, pos, v.to_bits().to_be_bytes()),
        Arg::Char(c) => put4(out, pos, (c as u32).to_be_bytes()),
        Arg::Color(b) | Arg::Midi(b) => put4(out, pos, b),
        Arg::Long(v) => put8(out, pos, v.to_be_bytes()),
        Arg::Time(t) => put8(out, pos, t.0.to_be_bytes()),
        Arg::Double(v) => put8(out, pos, v.to_bits().to_be_bytes()),
        Arg::Str(s) | Arg::Symbol(s) => put_str(out, pos, s.as_bytes()),
        Arg::Blob(b) => {
            let p = put4(out, pos, (b.len() as u32).to_be_bytes());
            let end = p + crate::arg::pad4(b.len());
            if end > p {
                out[end - 4..end].copy_from_slice(&[0; 4]);
            }
            out[p..p + b.len()].copy_from_slice(b);
            end
        }
        Arg::True | Arg::False | Arg::Nil | Arg::Inf | Arg::ArrayBegin | Arg::ArrayEnd => pos,
    }
}

/// Writes a bundle (with nested bundles) into a caller's buffer.
///
/// ```
/// use netjam_osc::{Arg, BundleWriter, Packet, TimeTag};
/// let mut buf = [0u8; 256];
/// let mut w = BundleWriter::new(&mut buf, TimeTag::IMMEDIATELY).unwrap();
/// w.message("/a", &[Arg::Int(1)]).unwrap();
/// w.open_bundle(TimeTag::new(100, 0)).unwrap();
/// w.message("/b", &[]).unwrap();
/// w.close_bundle().unwrap();
/// let n = w.finish().unwrap();
/// assert!(matches!(Packet::decode(&buf[..n]), Ok(Packet::Bundle(_))));
/// ```
#[derive(Debug)]
pub struct BundleWriter<'b> {
    buf: &'b mut [u8],
    len: usize,
    /// Offsets of the size fields of the open nested bundles.
    open: [usize; MAX_BUNDLE_DEPTH],
    depth: usize,
}

impl<'b> BundleWriter<'b> {
    /// Starts a bundle with time tag `time` at the beginning of `buf`.
    pub fn new(buf: &'b mut [u8], time: TimeTag) -> Result<Self, EncodeError> {
        let mut w = BundleWriter {
            buf,
            len: 0,
            open: [0; MAX_BUNDLE_DEPTH],
            depth: 1,
        };
        w.header(time)?;
        Ok(w)
    }

    fn reserve(&self, n: usize) -> Result<(), EncodeError> {
        if self.len + n > self.buf.len() {
            Err(EncodeError::BufferTooSmall {
                needed: self.len + n,
                available: self.buf.len(),
            })
        } else {
            Ok(())
        }
    }

    fn header(&mut self, time: TimeTag) -> Result<(), EncodeError> {
        self.reserve(16)?;
        self.buf[self.len..self.len + 8].copy_from_slice(BUNDLE_TAG);
        self.buf[self.len + 8..self.len + 16].copy_from_slice(&time.0.to_be_bytes());
        self.len += 16;
        Ok(())
    }

    /// Appends a message element to the innermost open bundle.
    pub fn message(&mut self, address: &str, args: &[Arg<'_>]) -> Result<(), EncodeError> {
        self.reserve(4)?;
        let start = self.len + 4;
        let n = encode_message(&mut self.buf[start..], address, args).map_err(|e| match e {
            EncodeError::BufferTooSmall { needed, .. } => EncodeError::BufferTooSmall {
                needed: start + needed,
                available: self.buf.len(),
            },
            e => e,
        })?;
        self.buf[self.len..start].copy_from_slice(&(n as u32).to_be_bytes());
        self.len = start + n;
        Ok(())
    }

    /// Appends an already encoded message or bundle as an element.
    pub fn raw(&mut self, element: &[u8]) -> Result<(), EncodeError> {
        if element.is_empty() || element.len() % 4 != 0 || element.len() > i32::MAX as usize {
            return Err(EncodeError::BadElement);
        }
        self.reserve(4 + element.len())?;
        self.buf[self.len..self.len + 4].copy_from_slice(&(element.len() as u32).to_be_bytes());
        self.buf[self.len + 4..self.len + 4 + element.len()].copy_from_slice(element);
        self.len += 4 + element.len();
        Ok(())
    }

    /// Opens a nested bundle; elements go into it until [`close_bundle`](Self::close_bundle).
    pub fn open_bundle(&mut self, time: TimeTag) -> Result<(), EncodeError> {
        if self.depth >= MAX_BUNDLE_DEPTH {
            return Err(EncodeError::NestingTooDeep);
        }
        self.reserve(4 + 16)?;
        self.open[self.depth] = self.len;
        self.len += 4;
        self.header(time)?;
        self.depth += 1;
        Ok(())
    }

    /// Closes the innermost nested bundle.
    pub fn close_bundle(&mut self) -> Result<(), EncodeError> {
        if self.depth <= 1 {
            return Err(EncodeError::NoOpenBundle);
        }
        self.depth -= 1;
        let at = self.open[self.depth];
        let size = (self.len - at - 4) as u32;
        self.buf[at..at + 4].copy_from_slice(&size.to_be_bytes());
        Ok(())
    }

    /// Finishes the bundle and returns its length; every nested bundle must be closed.
    pub fn finish(self) -> Result<usize, EncodeError> {
        if self.depth != 1 {
            return Err(EncodeError::NoOpenBundle);
        }
        Ok(self.len)
    }
}
