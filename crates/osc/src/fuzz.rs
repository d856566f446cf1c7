//! Entry points for the fuzz targets in `fuzz/`, compiled in every build so they never
//! rot. They must never panic on any input; a panic here is a bug in this crate.

use crate::decode::Packet;
use crate::encode::{encode_message, BundleWriter};
use crate::time::TimeTag;

/// Decodes arbitrary bytes; when they decode, re-encodes every message and checks the
/// result decodes to the same arguments, and dispatches the packet through a small tree
/// with array ports, type constraints, replies and chained messages.
pub fn decode(data: &[u8]) {
    let mut state = 0u64;
    let mut outbuf = [0u8; 1024];
    let mut out = crate::Outbox::new(&mut outbuf);
    if let Some(tree) = tree() {
        let _ = tree.dispatch(&mut state, data, &mut out);
    }
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

fn tree() -> Option<&'static crate::Tree<u64>> {
    static TREE: std::sync::OnceLock<Option<crate::Tree<u64>>> = std::sync::OnceLock::new();
    TREE.get_or_init(|| {
        let mut b = crate::TreeBuilder::<u64>::new();
        b.port("/a#4/b#3/c::f", crate::Meta::new(), |n, r| {
            *n += 1;
            let mut buf = [0u8; 32];
            if let Some(addr) = r.concrete_address(&mut buf) {
                let addr: &str = addr;
                let mut copy = [0u8; 32];
                copy[..addr.len()].copy_from_slice(addr.as_bytes());
                if let Ok(a) = core::str::from_utf8(&copy[..addr.len()]) {
                    let _ = r.reply(a, &[crate::Arg::Int(1)]);
                }
            }
        })
        .port("/x/y", crate::Meta::new().doc("any"), |n, r| {
            *n += 1;
            let _ = r.forward();
            let _ = r.chain("/a0/b1/c", &[crate::Arg::Float(1.0)]);
        })
        .port("/z9:", crate::Meta::new(), |n, r| {
            *n += 1;
            let _ = r.broadcast("/z9", &[]);
            let _ = r.chain("/x/y", &[]);
        });
        b.build().ok()
    })
    .as_ref()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuzz_tree_builds_and_dispatches() {
        let tree = tree().unwrap();
        let mut n = 0u64;
        let mut pkt = [0u8; 64];
        let mut ob = [0u8; 512];
        let mut out = crate::Outbox::new(&mut ob);
        let len = encode_message(&mut pkt, "/z9", &[]).unwrap();
        let s = tree.dispatch(&mut n, &pkt[..len], &mut out).unwrap();
        // /z9 chains /x/y, which chains /a0/b1/c.
        assert_eq!((s.handled, s.chained, n), (3, 2, 3));
        decode(&pkt[..len]);
        pattern(b"/a*/b?\0/ab/bc");
    }
}
