//! OSC argument values as they appear on the wire, borrowed from the packet.
//!
//! [`Arg`] is a plain value type; it must never own heap memory so that building and
//! reading arguments stays allocation-free on a realtime thread.

use crate::time::TimeTag;

/// One OSC argument. Strings, symbols and blobs borrow from the packet (or from the
/// caller when encoding).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<'a> {
    /// `i`: 32-bit two's complement integer.
    Int(i32),
    /// `f`: 32-bit IEEE 754 float.
    Float(f32),
    /// `s`: string (never contains NUL).
    Str(&'a str),
    /// `b`: blob, arbitrary bytes.
    Blob(&'a [u8]),
    /// `h`: 64-bit integer (OSC 1.0 nonstandard, OSC 1.1 standard).
    Long(i64),
    /// `t`: time tag.
    Time(TimeTag),
    /// `d`: 64-bit IEEE 754 double.
    Double(f64),
    /// `S`: alternate string type ("symbol").
    Symbol(&'a str),
    /// `c`: character, sent as a 32-bit code point.
    Char(char),
    /// `r`: 32-bit RGBA colour, bytes in order red, green, blue, alpha.
    Color([u8; 4]),
    /// `m`: 4-byte MIDI message: port id, status byte, data1, data2.
    Midi([u8; 4]),
    /// `T`: true (no data).
    True,
    /// `F`: false (no data).
    False,
    /// `N`: nil (no data).
    Nil,
    /// `I`: infinitum / impulse (no data).
    Inf,
    /// `[`: start of an array.
    ArrayBegin,
    /// `]`: end of an array.
    ArrayEnd,
}

impl Arg<'_> {
    /// The type tag character of this argument.
    #[inline]
    pub const fn tag(&self) -> u8 {
        match self {
            Arg::Int(_) => b'i',
            Arg::Float(_) => b'f',
            Arg::Str(_) => b's',
            Arg::Blob(_) => b'b',
            Arg::Long(_) => b'h',
            Arg::Time(_) => b't',
            Arg::Double(_) => b'd',
            Arg::Symbol(_) => b'S',
            Arg::Char(_) => b'c',
            Arg::Color(_) => b'r',
            Arg::Midi(_) => b'm',
            Arg::True => b'T',
            Arg::False => b'F',
            Arg::Nil => b'N',
            Arg::Inf => b'I',
            Arg::ArrayBegin => b'[',
            Arg::ArrayEnd => b']',
        }
    }

    /// Bytes this argument takes in the argument section (with padding).
    #[inline]
    pub const fn encoded_len(&self) -> usize {
        match self {
            Arg::Int(_) | Arg::Float(_) | Arg::Char(_) | Arg::Color(_) | Arg::Midi(_) => 4,
            Arg::Long(_) | Arg::Time(_) | Arg::Double(_) => 8,
            Arg::Str(s) | Arg::Symbol(s) => padded_str_len(s.len()),
            Arg::Blob(b) => 4 + pad4(b.len()),
            Arg::True | Arg::False | Arg::Nil | Arg::Inf | Arg::ArrayBegin | Arg::ArrayEnd => 0,
        }
    }

    /// The value as `f32` if it is numeric (`i f h d`), for ports that accept any number.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Arg::Int(v) => Some(v as f32),
            Arg::Float(v) => Some(v),
            Arg::Long(v) => Some(v as f32),
            Arg::Double(v) => Some(v as f32),
            _ => None,
        }
    }

    /// The value as `i32` if it is `i`, or `T`/`F` as 1/0.
    pub fn as_i32(&self) -> Option<i32> {
        match *self {
            Arg::Int(v) => Some(v),
            Arg::True => Some(1),
            Arg::False => Some(0),
            _ => None,
        }
    }

    /// The string of an `s` or `S` argument.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Arg::Str(s) | Arg::Symbol(s) => Some(s),
            _ => None,
        }
    }
}

/// Whether `tag` is a type tag this crate knows (OSC 1.0 required and nonstandard tags,
/// OSC 1.1 tags).
pub const fn is_known_tag(tag: u8) -> bool {
    matches!(
        tag,
        b'i' | b'f'
            | b's'
            | b'b'
            | b'h'
            | b't'
            | b'd'
            | b'S'
            | b'c'
            | b'r'
            | b'm'
            | b'T'
            | b'F'
            | b'N'
            | b'I'
            | b'['
            | b']'
    )
}

/// `n` rounded up to a multiple of 4.
pub const fn pad4(n: usize) -> usize {
    (n + 3) & !3
}

/// Bytes an OSC string of `len` characters takes: at least one NUL, padded to 4.
pub const fn padded_str_len(len: usize) -> usize {
    (len + 4) & !3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding() {
        assert_eq!(padded_str_len(0), 4);
        assert_eq!(padded_str_len(3), 4);
        assert_eq!(padded_str_len(4), 8);
        assert_eq!(pad4(0), 0);
        assert_eq!(pad4(5), 8);
    }

    #[test]
    fn tags_are_known() {
        for t in b"ifsbhtdScrmTFNI[]" {
            assert!(is_known_tag(*t));
        }
        assert!(!is_known_tag(b'x'));
    }
}
