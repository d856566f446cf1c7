//! Entry points for the fuzz targets in `fuzz/`, compiled in every build so they never
//! rot. They must never panic on any input; a panic here is a bug in this crate.

use crate::decode::Packet;
use crate::encode::{encode_message, BundleWriter};
use crate::time::TimeTag;

/// Decodes arbitrary bytes; when they decode, re-encodes every message and checks the
/// result decodes to the same arguments.
pub fn decode(data: &[u8]) {
    let Ok(packet) = Packet::decode(data) else { return };
    let mut buf = [0u8; 4096];
    let mut args = [crate::Arg::Nil; 64];
    packet.for_each_message(|_, m| {
        let mut n = 0;
        for a in m.args() {
            if n == args.len() {
                return;
            }
            args[n] = a;
            n += 1;
        }
        if let Ok(len) = encode_message(&mut buf, m.address(), &args[..n]) {
            let again = crate::Message::decode(&buf[..len]);
            assert!(again.is_ok(), "re-encoded message does not decode: {again:?}");
            if let Ok(again) = again {
                assert!(again.args().eq(m.args().take(n)) || has_nan(&args[..n]));
            }
        }
    });
    let mut out = [0u8; 256];
    if let Ok(mut w) = BundleWriter::new(&mut out, TimeTag::IMMEDIATELY) {
        let _ = w.raw(data);
        let _ = w.finish();
    }
}

fn has_nan(args: &[crate::Arg<'_>]) -> bool {
    args.iter().any(|a| match a {
        crate::Arg::Float(f) => f.is_nan(),
        crate::Arg::Double(d) => d.is_nan(),
        _ => false,
    })
}

/// Splits the input at the first NUL into a pattern and an address and matches them.
pub fn pattern(data: &[u8]) {
    let (p, a) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &b"/a/b"[..]),
    };
    let (Ok(p), Ok(a)) = (core::str::from_utf8(p), core::str::from_utf8(a)) else {
        return;
    };
    let m = crate::pattern::matches(p, a);
    if m && crate::pattern::is_literal(p) && p.starts_with('/') {
        assert_eq!(p, a, "a literal pattern matched a different address");
    }
}
