//! Zero-copy OSC decoding with strict validation.
//!
//! [`Packet::decode`] checks the whole packet once — 4-byte alignment, zero padding,
//! string termination, UTF-8, known type tags, balanced arrays, blob lengths, bundle
//! element sizes and nesting depth — and reports the first problem with its byte
//! offset. After that, [`Message::args`] and [`Bundle::elements`] iterate lazily over
//! the borrowed bytes. This module must never allocate and never panic on any input.

use crate::arg::{is_known_tag, padded_str_len, Arg};
use crate::time::TimeTag;

/// How many bundles may be nested inside each other (the outermost counts as 1).
pub const MAX_BUNDLE_DEPTH: usize = 8;

/// How deeply `[` `]` arrays may nest in one message.
pub const MAX_ARRAY_DEPTH: usize = 16;

/// The 8-byte header every bundle starts with.
pub const BUNDLE_TAG: &[u8; 8] = b"#bundle\0";

/// What is wrong with a packet, and at which byte offset from the packet's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("malformed OSC packet: {kind} at byte {offset}")]
pub struct DecodeError {
    /// Offset of the offending byte from the start of the outermost packet.
    pub offset: usize,
    /// What is wrong.
    pub kind: DecodeErrorKind,
}

/// The kinds of malformed input [`DecodeError`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeErrorKind {
    /// The packet has no bytes.
    #[error("empty packet")]
    Empty,
    /// OSC packets are a multiple of 4 bytes long.
    #[error("length {0} is not a multiple of 4")]
    Misaligned(usize),
    /// The packet ends in the middle of a field.
    #[error("packet ends early, {needed} more bytes needed")]
    Truncated {
        /// How many bytes are missing.
        needed: usize,
    },
    /// A string has no terminating NUL before the end of the packet.
    #[error("string not terminated by NUL")]
    UnterminatedString,
    /// A padding byte after a string or blob is not zero.
    #[error("non-zero padding byte")]
    NonZeroPadding,
    /// A string is not valid UTF-8.
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    /// The address does not start with `/` (or `!` for a literal address).
    #[error("address does not start with '/' or '!'")]
    BadAddress,
    /// The type tag string is missing or does not start with `,`.
    #[error("type tag string missing (must start with ',')")]
    MissingTypeTags,
    /// A type tag this crate does not know.
    #[error("unknown type tag {0:?}")]
    UnknownTypeTag(char),
    /// `[` and `]` do not pair up, or nest too deeply.
    #[error("unbalanced or too deeply nested array brackets in type tags")]
    UnbalancedArray,
    /// A blob's length runs past the end of the packet.
    #[error("blob length {0} runs past the end of the packet")]
    BlobTooLong(u32),
    /// A `c` argument is not a Unicode scalar value.
    #[error("character code {0:#x} is not a valid character")]
    InvalidChar(u32),
    /// Bytes remain after the last argument the type tags describe.
    #[error("{0} bytes left over after the last argument")]
    TrailingBytes(usize),
    /// Starts with `#` but not with `#bundle\0`.
    #[error("bad bundle header (expected \"#bundle\\0\")")]
    BadBundleHeader,
    /// A bundle element's size is not a positive multiple of 4.
    #[error("bundle element size {0} is not a positive multiple of 4")]
    BadElementSize(i32),
    /// A bundle element's size runs past the end of its bundle.
    #[error("bundle element size {0} runs past the end of the bundle")]
    ElementPastEnd(i32),
    /// Bundles are nested deeper than [`MAX_BUNDLE_DEPTH`].
    #[error("bundles nested deeper than {MAX_BUNDLE_DEPTH}")]
    NestingTooDeep,
}

fn err(offset: usize, kind: DecodeErrorKind) -> DecodeError {
    DecodeError { offset, kind }
}

/// A decoded OSC packet: a message or a bundle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Packet<'a> {
    /// A single message.
    Message(Message<'a>),
    /// A bundle of messages and bundles with a time tag.
    Bundle(Bundle<'a>),
}

impl<'a> Packet<'a> {
    /// Validates and decodes one packet (a UDP datagram or one TCP frame).
    #[inline]
    pub fn decode(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        decode_at(bytes, 0, 1)
    }

    /// Calls `f` for every message in this packet, depth first, with the time tag that
    /// applies to it: [`TimeTag::IMMEDIATELY`] for a bare message, the bundle's time tag
    /// otherwise, where a nested bundle's time tag earlier than its parent's counts as
    /// the parent's.
    pub fn for_each_message<F: FnMut(TimeTag, &Message<'a>)>(&self, mut f: F) {
        self.walk(TimeTag::IMMEDIATELY, true, &mut f);
    }

    fn walk<F: FnMut(TimeTag, &Message<'a>)>(&self, parent: TimeTag, top: bool, f: &mut F) {
        match self {
            Packet::Message(m) => f(parent, m),
            Packet::Bundle(b) => {
                let t = if top { b.time } else { b.time.nested_in(parent) };
                for e in b.elements() {
                    e.walk(t, false, f);
                }
            }
        }
    }
}

#[inline]
fn decode_at(bytes: &[u8], base: usize, depth: usize) -> Result<Packet<'_>, DecodeError> {
    match bytes.first() {
        None => Err(err(base, DecodeErrorKind::Empty)),
        Some(b'#') => Bundle::decode_at(bytes, base, depth).map(Packet::Bundle),
        Some(_) => Message::decode_at(bytes, base).map(Packet::Message),
    }
}

/// A validated OSC message borrowing from its packet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Message<'a> {
    /// Validated UTF-8.
    address: &'a [u8],
    tags: &'a [u8],
    args: &'a [u8],
    bytes: &'a [u8],
}

impl<'a> Message<'a> {
    /// Validates and decodes a message (not a bundle).
    pub fn decode(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        Self::decode_at(bytes, 0)
    }

    #[inline]
    fn decode_at(bytes: &'a [u8], base: usize) -> Result<Self, DecodeError> {
        check_len(bytes, base)?;
        let (address, pos) = read_raw_str(bytes, 0, base)?;
        check_utf8(address, base)?;
        match address.first() {
            Some(b'/') | Some(b'!') => {}
            _ => return Err(err(base, DecodeErrorKind::BadAddress)),
        }
        if bytes.get(pos) != Some(&b',') {
            return Err(err(base + pos, DecodeErrorKind::MissingTypeTags));
        }
        let (tag_str, args_start) = read_raw_str(bytes, pos, base)?;
        let tags = tag_str.get(1..).unwrap_or(&[]);
        let args = bytes.get(args_start..).unwrap_or(&[]);
        validate_args(tags, args, base + pos + 1, base + args_start)?;
        Ok(Message {
            address,
            tags,
            args,
            bytes,
        })
    }

    /// The address (or address pattern), e.g. `/synth/voice3/freq`.
    #[inline]
    pub fn address(&self) -> &'a str {
        // Validated as UTF-8 when decoded; converted on demand because dispatch only
        // needs the bytes.
        core::str::from_utf8(self.address).unwrap_or("")
    }

    /// The address as bytes.
    #[inline]
    pub fn address_bytes(&self) -> &'a [u8] {
        self.address
    }

    /// The type tags without the leading comma, e.g. `"sif"`.
    #[inline]
    pub fn type_tags(&self) -> &'a str {
        // Validation admitted only ASCII type tags.
        core::str::from_utf8(self.tags).unwrap_or("")
    }

    /// The type tags as bytes, without the leading comma.
    #[inline]
    pub fn type_tag_bytes(&self) -> &'a [u8] {
        self.tags
    }

    /// The whole encoded message.
    #[inline]
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The argument section (after the type tag string).
    #[inline]
    pub fn arg_bytes(&self) -> &'a [u8] {
        self.args
    }

    /// Iterates over the arguments, decoding each one as it is reached.
    #[inline]
    pub fn args(&self) -> Args<'a> {
        Args {
            tags: self.tags,
            data: self.args,
        }
    }

    /// The `n`th argument (counting `[` and `]` as arguments).
    #[inline]
    pub fn arg(&self, n: usize) -> Option<Arg<'a>> {
        self.args().nth(n)
    }
}

/// Lazy iterator over a validated message's arguments.
#[derive(Debug, Clone)]
pub struct Args<'a> {
    tags: &'a [u8],
    data: &'a [u8],
}

impl<'a> Iterator for Args<'a> {
    type Item = Arg<'a>;

    #[inline]
    fn next(&mut self) -> Option<Arg<'a>> {
        let (&tag, rest) = self.tags.split_first()?;
        self.tags = rest;
        let (arg, used) = read_arg(tag, self.data)?;
        self.data = self.data.get(used..).unwrap_or(&[]);
        Some(arg)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.tags.len(), Some(self.tags.len()))
    }
}

impl ExactSizeIterator for Args<'_> {}

/// Reads one argument from already validated data. Returns `None` only if the data is
/// not what validation guaranteed, which cannot happen for a decoded [`Message`].
#[inline]
fn read_arg(tag: u8, d: &[u8]) -> Option<(Arg<'_>, usize)> {
    Some(match tag {
        b'i' => (Arg::Int(be_u32(d, 0)? as i32), 4),
        b'f' => (Arg::Float(f32::from_bits(be_u32(d, 0)?)), 4),
        b'c' => (Arg::Char(char::from_u32(be_u32(d, 0)?)?), 4),
        b'r' => (Arg::Color(be_4(d)?), 4),
        b'm' => (Arg::Midi(be_4(d)?), 4),
        b'h' => (Arg::Long(be_u64(d)? as i64), 8),
        b't' => (Arg::Time(TimeTag(be_u64(d)?)), 8),
        b'd' => (Arg::Double(f64::from_bits(be_u64(d)?)), 8),
        b's' | b'S' => {
            let nul = find_nul(d)?;
            let s = core::str::from_utf8(d.get(..nul)?).ok()?;
            let arg = if tag == b's' { Arg::Str(s) } else { Arg::Symbol(s) };
            (arg, padded_str_len(nul))
        }
        b'b' => {
            let n = be_u32(d, 0)? as usize;
            let blob = d.get(4..4 + n)?;
            (Arg::Blob(blob), 4 + crate::arg::pad4(n))
        }
        b'T' => (Arg::True, 0),
        b'F' => (Arg::False, 0),
        b'N' => (Arg::Nil, 0),
        b'I' => (Arg::Inf, 0),
        b'[' => (Arg::ArrayBegin, 0),
        b']' => (Arg::ArrayEnd, 0),
        _ => return None,
    })
}

#[inline]
fn validate_args(tags: &[u8], data: &[u8], tags_off: usize, data_off: usize) -> Result<(), DecodeError> {
    let mut pos = 0usize;
    let mut depth = 0usize;
    for (i, &tag) in tags.iter().enumerate() {
        let at = data_off + pos;
        let rest = data.get(pos..).unwrap_or(&[]);
        let need = |n: usize| -> Result<(), DecodeError> {
            if rest.len() < n {
                Err(err(
                    at,
                    DecodeErrorKind::Truncated {
                        needed: n - rest.len(),
                    },
                ))
            } else {
                Ok(())
            }
        };
        match tag {
            b'i' | b'f' | b'r' | b'm' => {
                need(4)?;
                pos += 4;
            }
            b'c' => {
                need(4)?;
                let v = be_u32(rest, 0).unwrap_or(0);
                if char::from_u32(v).is_none() {
                    return Err(err(at, DecodeErrorKind::InvalidChar(v)));
                }
                pos += 4;
            }
            b'h' | b't' | b'd' => {
                need(8)?;
                pos += 8;
            }
            b's' | b'S' => pos = check_str(data, pos, data_off)?,
            b'b' => {
                need(4)?;
                let n = be_u32(rest, 0).unwrap_or(0);
                let padded = crate::arg::pad4(n as usize);
                if rest.len() - 4 < padded {
                    return Err(err(at, DecodeErrorKind::BlobTooLong(n)));
                }
                check_zero(rest, 4 + n as usize, 4 + padded, at)?;
                pos += 4 + padded;
            }
            b'T' | b'F' | b'N' | b'I' => {}
            b'[' => {
                depth += 1;
                if depth > MAX_ARRAY_DEPTH {
                    return Err(err(tags_off + i, DecodeErrorKind::UnbalancedArray));
                }
            }
            b']' => {
                if depth == 0 {
                    return Err(err(tags_off + i, DecodeErrorKind::UnbalancedArray));
                }
                depth -= 1;
            }
            other => {
                let kind = if is_known_tag(other) {
                    DecodeErrorKind::UnbalancedArray
                } else {
                    DecodeErrorKind::UnknownTypeTag(other as char)
                };
                return Err(err(tags_off + i, kind));
            }
        }
    }
    if depth != 0 {
        return Err(err(tags_off + tags.len(), DecodeErrorKind::UnbalancedArray));
    }
    if pos < data.len() {
        return Err(err(
            data_off + pos,
            DecodeErrorKind::TrailingBytes(data.len() - pos),
        ));
    }
    Ok(())
}

/// A validated bundle borrowing from its packet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bundle<'a> {
    time: TimeTag,
    elements: &'a [u8],
    base: usize,
    depth: usize,
    bytes: &'a [u8],
}

impl<'a> Bundle<'a> {
    /// Validates and decodes a bundle.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, DecodeError> {
        Self::decode_at(bytes, 0, 1)
    }

    fn decode_at(bytes: &'a [u8], base: usize, depth: usize) -> Result<Self, DecodeError> {
        check_len(bytes, base)?;
        if depth > MAX_BUNDLE_DEPTH {
            return Err(err(base, DecodeErrorKind::NestingTooDeep));
        }
        if bytes.len() < 16 {
            if bytes.starts_with(BUNDLE_TAG) || BUNDLE_TAG.starts_with(bytes) {
                return Err(err(
                    base + bytes.len(),
                    DecodeErrorKind::Truncated {
                        needed: 16 - bytes.len(),
                    },
                ));
            }
            return Err(err(base, DecodeErrorKind::BadBundleHeader));
        }
        if !bytes.starts_with(BUNDLE_TAG) {
            return Err(err(base, DecodeErrorKind::BadBundleHeader));
        }
        let time = TimeTag(be_u64(&bytes[8..]).unwrap_or(0));
        let elements = &bytes[16..];
        let mut pos = 0usize;
        while pos < elements.len() {
            let at = base + 16 + pos;
            let rest = &elements[pos..];
            let size = be_u32(rest, 0).map(|v| v as i32);
            let Some(size) = size else {
                return Err(err(
                    at,
                    DecodeErrorKind::Truncated {
                        needed: 4 - rest.len(),
                    },
                ));
            };
            if size <= 0 || size % 4 != 0 {
                return Err(err(at, DecodeErrorKind::BadElementSize(size)));
            }
            let Some(content) = rest.get(4..4 + size as usize) else {
                return Err(err(at, DecodeErrorKind::ElementPastEnd(size)));
            };
            decode_at(content, at + 4, depth + 1)?;
            pos += 4 + size as usize;
        }
        Ok(Bundle {
            time,
            elements,
            base,
            depth,
            bytes,
        })
    }

    /// The bundle's own time tag, as written on the wire.
    #[inline]
    pub fn time(&self) -> TimeTag {
        self.time
    }

    /// The whole encoded bundle.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Iterates over the bundle's elements (messages and nested bundles).
    pub fn elements(&self) -> Elements<'a> {
        Elements {
            rest: self.elements,
            base: self.base + 16,
            depth: self.depth,
        }
    }
}

/// Iterator over a validated bundle's elements.
#[derive(Debug, Clone)]
pub struct Elements<'a> {
    rest: &'a [u8],
    base: usize,
    depth: usize,
}

impl<'a> Iterator for Elements<'a> {
    type Item = Packet<'a>;

    fn next(&mut self) -> Option<Packet<'a>> {
        let size = be_u32(self.rest, 0)? as usize;
        let content = self.rest.get(4..4 + size)?;
        let at = self.base + 4;
        self.rest = self.rest.get(4 + size..).unwrap_or(&[]);
        self.base += 4 + size;
        decode_at(content, at, self.depth + 1).ok()
    }
}

fn check_len(bytes: &[u8], base: usize) -> Result<(), DecodeError> {
    if bytes.is_empty() {
        return Err(err(base, DecodeErrorKind::Empty));
    }
    if bytes.len() % 4 != 0 {
        return Err(err(base + bytes.len(), DecodeErrorKind::Misaligned(bytes.len())));
    }
    Ok(())
}

/// Reads a NUL-terminated, zero-padded string starting at `pos`; returns it and the
/// position after its padding.
/// Skips a string argument after proving it is valid UTF-8 (cheaply when ASCII).
#[inline]
fn check_str(bytes: &[u8], pos: usize, base: usize) -> Result<usize, DecodeError> {
    let (raw, next) = read_raw_str(bytes, pos, base)?;
    check_utf8(raw, base + pos)?;
    Ok(next)
}

/// Proves `raw` (found at offset `at`) is UTF-8, cheaply when it is ASCII.
#[inline]
fn check_utf8(raw: &[u8], at: usize) -> Result<(), DecodeError> {
    if !is_ascii(raw) {
        core::str::from_utf8(raw).map_err(|e| err(at + e.valid_up_to(), DecodeErrorKind::InvalidUtf8))?;
    }
    Ok(())
}

#[inline]
fn is_ascii(b: &[u8]) -> bool {
    let mut i = 0;
    while let Some(Ok(c)) = b.get(i..i + 8).map(<[u8; 8]>::try_from) {
        if u64::from_ne_bytes(c) & 0x8080_8080_8080_8080 != 0 {
            return false;
        }
        i += 8;
    }
    b.get(i..).is_some_and(|t| t.iter().all(|&c| c < 0x80))
}

/// The bytes of a NUL-terminated, zero-padded string at `pos`, and the position after
/// its padding.
#[inline]
fn read_raw_str(bytes: &[u8], pos: usize, base: usize) -> Result<(&[u8], usize), DecodeError> {
    let rest = bytes.get(pos..).unwrap_or(&[]);
    let Some(nul) = find_nul(rest) else {
        return Err(err(base + pos, DecodeErrorKind::UnterminatedString));
    };
    let end = padded_str_len(nul);
    if end > rest.len() {
        return Err(err(
            base + bytes.len(),
            DecodeErrorKind::Truncated {
                needed: end - rest.len(),
            },
        ));
    }
    check_zero(rest, nul + 1, end, base + pos)?;
    Ok((&rest[..nul], pos + end))
}

/// Index of the first NUL byte, looking at 8 bytes at a time (OSC strings end in the
/// last 4-byte word of their padding).
#[inline]
fn find_nul(d: &[u8]) -> Option<usize> {
    let mut i = 0;
    while let Some(Ok(c)) = d.get(i..i + 8).map(<[u8; 8]>::try_from) {
        let w = u64::from_le_bytes(c);
        // The lowest set bit marks the first zero byte exactly.
        let m = w.wrapping_sub(0x0101_0101_0101_0101) & !w & 0x8080_8080_8080_8080;
        if m != 0 {
            return Some(i + (m.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    d.get(i..)?.iter().position(|&b| b == 0).map(|j| i + j)
}

#[inline]
fn check_zero(bytes: &[u8], from: usize, to: usize, base: usize) -> Result<(), DecodeError> {
    let pad = bytes.get(from..to).unwrap_or(&[]);
    for (i, &b) in pad.iter().enumerate() {
        if b != 0 {
            return Err(err(base + from + i, DecodeErrorKind::NonZeroPadding));
        }
    }
    Ok(())
}

#[inline]
fn be_u32(d: &[u8], at: usize) -> Option<u32> {
    let b: [u8; 4] = d.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_be_bytes(b))
}

#[inline]
fn be_4(d: &[u8]) -> Option<[u8; 4]> {
    d.get(..4)?.try_into().ok()
}

#[inline]
fn be_u64(d: &[u8]) -> Option<u64> {
    let b: [u8; 8] = d.get(..8)?.try_into().ok()?;
    Some(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encode::{encode_message, BundleWriter};
    use proptest::prelude::*;

    /// OSC 1.0 specification, "Examples": `/oscillator/4/frequency ,f 440.0`.
    const SPEC_FREQUENCY: &[u8] = &[
        0x2f, 0x6f, 0x73, 0x63, 0x69, 0x6c, 0x6c, 0x61, 0x74, 0x6f, 0x72, 0x2f, 0x34, 0x2f, 0x66, 0x72, 0x65,
        0x71, 0x75, 0x65, 0x6e, 0x63, 0x79, 0x00, 0x2c, 0x66, 0x00, 0x00, 0x43, 0xdc, 0x00, 0x00,
    ];

    /// OSC 1.0 specification: `/foo ,iisff 1000 -1 "hello" 1.234 5.678`.
    const SPEC_FOO: &[u8] = &[
        0x2f, 0x66, 0x6f, 0x6f, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x69, 0x69, 0x73, 0x66, 0x66, 0x00, 0x00, 0x00,
        0x00, 0x03, 0xe8, 0xff, 0xff, 0xff, 0xff, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x00, 0x00, 0x00, 0x3f, 0x9d,
        0xf3, 0xb6, 0x40, 0xb5, 0xb2, 0x2d,
    ];

    fn kind(bytes: &[u8]) -> DecodeErrorKind {
        Packet::decode(bytes).unwrap_err().kind
    }

    #[test]
    fn spec_example_frequency() {
        let m = Message::decode(SPEC_FREQUENCY).unwrap();
        assert_eq!(m.address(), "/oscillator/4/frequency");
        assert_eq!(m.type_tags(), "f");
        assert_eq!(m.args().collect::<Vec<_>>(), vec![Arg::Float(440.0)]);
        let mut buf = [0u8; 64];
        let n = encode_message(&mut buf, "/oscillator/4/frequency", &[Arg::Float(440.0)]).unwrap();
        assert_eq!(&buf[..n], SPEC_FREQUENCY);
    }

    #[test]
    fn spec_example_foo() {
        let args = [
            Arg::Int(1000),
            Arg::Int(-1),
            Arg::Str("hello"),
            Arg::Float(1.234),
            Arg::Float(5.678),
        ];
        let m = Message::decode(SPEC_FOO).unwrap();
        assert_eq!(m.address(), "/foo");
        assert_eq!(m.args().collect::<Vec<_>>(), args.to_vec());
        let mut buf = [0u8; 64];
        let n = encode_message(&mut buf, "/foo", &args).unwrap();
        assert_eq!(&buf[..n], SPEC_FOO);
    }

    #[test]
    fn spec_strings_are_padded() {
        let mut buf = [0u8; 32];
        let n = encode_message(&mut buf, "/a", &[Arg::Str("OSC"), Arg::Str("data")]).unwrap();
        assert_eq!(&buf[8..n], b"OSC\0data\0\0\0\0");
    }

    #[test]
    fn every_type_round_trips() {
        let blob = [1u8, 2, 3, 4, 5];
        let args = [
            Arg::Int(-7),
            Arg::Float(1.5),
            Arg::Str("str"),
            Arg::Blob(&blob),
            Arg::Long(-1 << 40),
            Arg::Time(TimeTag::new(5, 6)),
            Arg::Double(2.25),
            Arg::Symbol("sym"),
            Arg::Char('é'),
            Arg::Color([1, 2, 3, 4]),
            Arg::Midi([0, 0x90, 60, 100]),
            Arg::True,
            Arg::False,
            Arg::Nil,
            Arg::Inf,
            Arg::ArrayBegin,
            Arg::Int(1),
            Arg::ArrayBegin,
            Arg::ArrayEnd,
            Arg::ArrayEnd,
        ];
        let mut buf = [0u8; 256];
        let n = encode_message(&mut buf, "/all", &args).unwrap();
        let m = Message::decode(&buf[..n]).unwrap();
        assert_eq!(m.type_tags(), "ifsbhtdScrmTFNI[i[]]");
        assert_eq!(m.args().collect::<Vec<_>>(), args.to_vec());
    }

    #[test]
    fn bundles_nest_and_carry_time_tags() {
        let mut buf = [0u8; 256];
        let mut w = BundleWriter::new(&mut buf, TimeTag::new(100, 0)).unwrap();
        w.message("/a", &[Arg::Int(1)]).unwrap();
        w.open_bundle(TimeTag::new(50, 0)).unwrap();
        w.message("/b", &[]).unwrap();
        w.open_bundle(TimeTag::new(200, 0)).unwrap();
        w.message("/c", &[]).unwrap();
        w.close_bundle().unwrap();
        w.close_bundle().unwrap();
        let n = w.finish().unwrap();
        let p = Packet::decode(&buf[..n]).unwrap();
        let mut seen = Vec::new();
        p.for_each_message(|t, m| seen.push((t, m.address().to_owned())));
        assert_eq!(
            seen,
            vec![
                (TimeTag::new(100, 0), "/a".into()),
                (TimeTag::new(100, 0), "/b".into()),
                (TimeTag::new(200, 0), "/c".into())
            ]
        );
        let Packet::Bundle(b) = p else {
            panic!("not a bundle")
        };
        assert_eq!(b.time(), TimeTag::new(100, 0));
        assert_eq!(b.elements().count(), 2);
    }

    #[test]
    fn malformed_input_gets_typed_errors() {
        assert_eq!(kind(b""), DecodeErrorKind::Empty);
        assert_eq!(kind(b"/a\0"), DecodeErrorKind::Misaligned(3));
        assert_eq!(kind(b"/abc"), DecodeErrorKind::UnterminatedString);
        assert_eq!(kind(b"/a\0x,\0\0\0"), DecodeErrorKind::NonZeroPadding);
        assert_eq!(Packet::decode(b"/a\0x,\0\0\0").unwrap_err().offset, 3);
        assert_eq!(kind(b"a\0\0\0,\0\0\0"), DecodeErrorKind::BadAddress);
        assert_eq!(kind(b"/a\0\0"), DecodeErrorKind::MissingTypeTags);
        assert_eq!(kind(b"/a\0\0,x\0\0"), DecodeErrorKind::UnknownTypeTag('x'));
        assert_eq!(Packet::decode(b"/a\0\0,x\0\0").unwrap_err().offset, 5);
        assert_eq!(kind(b"/a\0\0,i\0\0"), DecodeErrorKind::Truncated { needed: 4 });
        assert_eq!(
            kind(b"/a\0\0,b\0\0\0\0\0\x09abcd"),
            DecodeErrorKind::BlobTooLong(9)
        );
        assert_eq!(
            kind(b"/a\0\0,b\0\0\0\0\0\x02ab\0x"),
            DecodeErrorKind::NonZeroPadding
        );
        assert_eq!(kind(b"/a\0\0,s\0\0abcd"), DecodeErrorKind::UnterminatedString);
        assert_eq!(kind(b"/a\0\0,[\0\0"), DecodeErrorKind::UnbalancedArray);
        assert_eq!(kind(b"/a\0\0,]\0\0"), DecodeErrorKind::UnbalancedArray);
        assert_eq!(kind(b"/a\0\0,\0\0\0\0\0\0\0"), DecodeErrorKind::TrailingBytes(4));
        assert_eq!(
            kind(b"/a\0\0,c\0\0\0\x11\0\0"),
            DecodeErrorKind::InvalidChar(0x11_0000)
        );
        assert_eq!(kind(b"/\xff\0\0,\0\0\0"), DecodeErrorKind::InvalidUtf8);
        assert_eq!(
            kind(b"#bundlX\0\0\0\0\0\0\0\0\x01"),
            DecodeErrorKind::BadBundleHeader
        );
        assert_eq!(kind(b"#bundle\0"), DecodeErrorKind::Truncated { needed: 8 });
        let mut b = b"#bundle\0\0\0\0\0\0\0\0\x01".to_vec();
        b.extend_from_slice(&[0, 0, 0, 3]);
        assert_eq!(kind(&b), DecodeErrorKind::BadElementSize(3));
        b.truncate(16);
        b.extend_from_slice(&[0, 0, 0, 8, b'/', b'a', 0, 0]);
        assert_eq!(kind(&b), DecodeErrorKind::ElementPastEnd(8));
        let err = Packet::decode(&b).unwrap_err();
        assert_eq!(err.offset, 16);
        assert_eq!(
            err.to_string(),
            "malformed OSC packet: bundle element size 8 runs past the end of the bundle at byte 16"
        );
    }

    #[test]
    fn bundles_nested_beyond_the_limit_are_refused() {
        fn nest(depth: usize) -> Vec<u8> {
            let mut inner = b"/a\0\0,\0\0\0".to_vec();
            for _ in 0..depth {
                let mut b = b"#bundle\0\0\0\0\0\0\0\0\x01".to_vec();
                b.extend_from_slice(&(inner.len() as u32).to_be_bytes());
                b.extend_from_slice(&inner);
                inner = b;
            }
            inner
        }
        assert!(Packet::decode(&nest(MAX_BUNDLE_DEPTH)).is_ok());
        assert_eq!(kind(&nest(MAX_BUNDLE_DEPTH + 1)), DecodeErrorKind::NestingTooDeep);
        assert_eq!(kind(&nest(200)), DecodeErrorKind::NestingTooDeep);
    }

    #[derive(Debug, Clone)]
    enum Owned {
        I(i32),
        F(f32),
        S(String),
        B(Vec<u8>),
        H(i64),
        T(u64),
        D(f64),
        Sym(String),
        C(char),
        R([u8; 4]),
        M([u8; 4]),
        True,
        False,
        Nil,
        Inf,
        Array(Vec<Owned>),
    }

    fn owned() -> impl Strategy<Value = Owned> {
        let text = "[^\0]{0,12}";
        let leaf = prop_oneof![
            any::<i32>().prop_map(Owned::I),
            any::<f32>().prop_map(Owned::F),
            text.prop_map(Owned::S),
            proptest::collection::vec(any::<u8>(), 0..20).prop_map(Owned::B),
            any::<i64>().prop_map(Owned::H),
            any::<u64>().prop_map(Owned::T),
            any::<f64>().prop_map(Owned::D),
            text.prop_map(Owned::Sym),
            any::<char>().prop_map(Owned::C),
            any::<[u8; 4]>().prop_map(Owned::R),
            any::<[u8; 4]>().prop_map(Owned::M),
            Just(Owned::True),
            Just(Owned::False),
            Just(Owned::Nil),
            Just(Owned::Inf),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            proptest::collection::vec(inner, 0..4).prop_map(Owned::Array)
        })
    }

    fn flatten<'a>(o: &'a Owned, out: &mut Vec<Arg<'a>>) {
        let a = match o {
            Owned::I(v) => Arg::Int(*v),
            Owned::F(v) => Arg::Float(*v),
            Owned::S(v) => Arg::Str(v),
            Owned::B(v) => Arg::Blob(v),
            Owned::H(v) => Arg::Long(*v),
            Owned::T(v) => Arg::Time(TimeTag(*v)),
            Owned::D(v) => Arg::Double(*v),
            Owned::Sym(v) => Arg::Symbol(v),
            Owned::C(v) => Arg::Char(*v),
            Owned::R(v) => Arg::Color(*v),
            Owned::M(v) => Arg::Midi(*v),
            Owned::True => Arg::True,
            Owned::False => Arg::False,
            Owned::Nil => Arg::Nil,
            Owned::Inf => Arg::Inf,
            Owned::Array(items) => {
                out.push(Arg::ArrayBegin);
                for i in items {
                    flatten(i, out);
                }
                Arg::ArrayEnd
            }
        };
        out.push(a);
    }

    /// Bitwise equality so NaNs compare equal to themselves.
    fn same(a: &Arg<'_>, b: &Arg<'_>) -> bool {
        match (a, b) {
            (Arg::Float(x), Arg::Float(y)) => x.to_bits() == y.to_bits(),
            (Arg::Double(x), Arg::Double(y)) => x.to_bits() == y.to_bits(),
            _ => a == b,
        }
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(
            address in "/[a-zA-Z0-9_/]{0,20}",
            values in proptest::collection::vec(owned(), 0..10),
        ) {
            let mut args = Vec::new();
            for v in &values {
                flatten(v, &mut args);
            }
            let mut buf = vec![0u8; crate::encode::message_len(&address, &args)];
            let n = encode_message(&mut buf, &address, &args).unwrap();
            prop_assert_eq!(n, buf.len());
            let m = Message::decode(&buf).unwrap();
            prop_assert_eq!(m.address(), address.as_str());
            let back: Vec<Arg<'_>> = m.args().collect();
            prop_assert_eq!(back.len(), args.len());
            for (x, y) in back.iter().zip(&args) {
                prop_assert!(same(x, y), "{:?} != {:?}", x, y);
            }
            // Too small a buffer is an error, never a panic.
            if n > 0 {
                prop_assert!(encode_message(&mut buf[..n - 1], &address, &args).is_err());
            }
            // Every truncation of a valid message is rejected.
            for cut in 0..n {
                prop_assert!(Packet::decode(&buf[..cut]).is_err());
            }
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = Packet::decode(&bytes);
            crate::fuzz::decode(&bytes);
        }

        #[test]
        fn mutated_messages_never_panic(
            values in proptest::collection::vec(owned(), 0..6),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
        ) {
            let mut args = Vec::new();
            for v in &values {
                flatten(v, &mut args);
            }
            let mut buf = vec![0u8; crate::encode::message_len("/m", &args)];
            encode_message(&mut buf, "/m", &args).unwrap();
            for (at, b) in flips {
                let i = at % buf.len();
                buf[i] = b;
            }
            crate::fuzz::decode(&buf);
        }
    }
}
