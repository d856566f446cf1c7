//! Codec and dispatch benchmarks, side by side with the `rosc` crate on the same
//! messages. Reference figures (rtosc paper): rtosc 53 ns decode, 125 ns encode, 54 ns
//! single-layer dispatch; liblo 218 / 383 / 530 ns.
#![allow(clippy::unwrap_used, clippy::approx_constant)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use netjam_osc::{encode_message, Arg, Meta, Outbox, Packet, Tree, TreeBuilder};

alloc_count::install!();

/// Average allocations per call of `f` over 1000 calls, after one warm-up call.
fn allocations_per_call(mut f: impl FnMut()) -> f64 {
    f();
    let (n, ()) = alloc_count::count(|| {
        for _ in 0..1000 {
            f();
        }
    });
    n as f64 / 1000.0
}

const ADDRESS: &str = "/methodname";
const TEXT: &str = "this is a string";

fn sif() -> [Arg<'static>; 3] {
    [Arg::Str(TEXT), Arg::Int(123), Arg::Float(3.14)]
}

fn rosc_msg() -> rosc::OscPacket {
    rosc::OscPacket::Message(rosc::OscMessage {
        addr: ADDRESS.to_owned(),
        args: vec![
            rosc::OscType::String(TEXT.to_owned()),
            rosc::OscType::Int(123),
            rosc::OscType::Float(3.14),
        ],
    })
}

fn codec(c: &mut Criterion) {
    let mut bytes = [0u8; 64];
    let n = encode_message(&mut bytes, ADDRESS, &sif()).unwrap();
    let bytes = &bytes[..n];
    assert_eq!(rosc::encoder::encode(&rosc_msg()).unwrap(), bytes);

    let mut scratch = [0u8; 64];
    let packet = rosc_msg();
    println!(
        "allocations per call: netjam-osc decode {} encode {}; rosc decode {} encode {}",
        allocations_per_call(|| {
            let Ok(Packet::Message(m)) = Packet::decode(black_box(bytes)) else {
                unreachable!()
            };
            black_box(m.args().count());
        }),
        allocations_per_call(|| {
            black_box(encode_message(&mut scratch, ADDRESS, &sif()).unwrap());
        }),
        allocations_per_call(|| {
            black_box(rosc::decoder::decode_udp(black_box(bytes)).unwrap());
        }),
        allocations_per_call(|| {
            black_box(rosc::encoder::encode(black_box(&packet)).unwrap());
        }),
    );

    let mut g = c.benchmark_group("decode /methodname sif");
    g.bench_function("netjam-osc", |b| {
        b.iter(|| {
            let Ok(Packet::Message(m)) = Packet::decode(black_box(bytes)) else {
                unreachable!()
            };
            let mut sum = 0.0f32;
            for a in m.args() {
                match a {
                    Arg::Str(s) => sum += s.len() as f32,
                    Arg::Int(i) => sum += i as f32,
                    Arg::Float(f) => sum += f,
                    _ => {}
                }
            }
            black_box(sum)
        })
    });
    g.bench_function("rosc", |b| {
        b.iter(|| black_box(rosc::decoder::decode_udp(black_box(bytes)).unwrap()))
    });
    g.finish();

    let mut g = c.benchmark_group("encode /methodname sif");
    let mut out = [0u8; 64];
    g.bench_function("netjam-osc", |b| {
        b.iter(|| black_box(encode_message(&mut out, black_box(ADDRESS), black_box(&sif())).unwrap()))
    });
    g.bench_function("rosc (encode, new Vec)", |b| {
        b.iter(|| black_box(rosc::encoder::encode(black_box(&packet)).unwrap()))
    });
    let mut v = Vec::with_capacity(64);
    g.bench_function("rosc (encode_into, reused Vec)", |b| {
        b.iter(|| {
            v.clear();
            black_box(rosc::encoder::encode_into(black_box(&packet), &mut v).unwrap())
        })
    });
    g.bench_function("rosc (build message + encode)", |b| {
        b.iter(|| black_box(rosc::encoder::encode(&rosc_msg()).unwrap()))
    });
    g.finish();
}

#[derive(Default)]
struct Sink {
    acc: f32,
}

fn absorb(s: &mut Sink, r: &mut netjam_osc::Request<'_, '_>) {
    for a in r.args() {
        if let Some(v) = a.as_f32() {
            s.acc += v;
        }
    }
    s.acc += r.index(0) as f32;
}

/// A synthesizer-shaped tree of ZynAddSubFX scale: 16 parts × 16 kits × 8 voices, each
/// voice with oscillators, envelopes, LFOs and filters; about 3.8 million reachable
/// leaf addresses at depth 5–8.
fn zyn_tree() -> Tree<Sink> {
    let mut b = TreeBuilder::<Sink>::new();
    let voice = "/part#16/kit#16/adpars/voice#8";
    for p in ["mag", "phase", "bw", "relf"] {
        b.port(
            &format!("{voice}/oscil#3/harmonic#128/{p}::f"),
            Meta::new().range(0.0, 1.0),
            absorb,
        );
    }
    for p in [
        "base", "shape", "filter", "amp", "seed", "mode", "spread", "rand", "adapt", "norm",
    ] {
        b.port(&format!("{voice}/oscil#3/{p}::f"), Meta::new(), absorb);
    }
    for p in ["time", "value", "curve"] {
        b.port(&format!("{voice}/env#4/point#16/{p}::f"), Meta::new(), absorb);
    }
    for p in [
        "attack", "decay", "sustain", "release", "stretch", "forced", "linear", "repeat",
    ] {
        b.port(&format!("{voice}/env#4/{p}::f"), Meta::new(), absorb);
    }
    for p in [
        "freq", "depth", "delay", "start", "rand", "shape", "sync", "fade", "stretch", "cutoff",
    ] {
        b.port(&format!("{voice}/lfo#3/{p}::f"), Meta::new(), absorb);
    }
    for p in ["freq", "q", "gain", "type", "track", "velocity"] {
        b.port(&format!("{voice}/filter/stage#4/{p}::f"), Meta::new(), absorb);
    }
    for k in 0..35 {
        b.port(&format!("{voice}/params/ctl{k}x::f"), Meta::new(), absorb);
    }
    for k in 0..60 {
        b.port(
            &format!("/part#16/kit#16/adpars/global/g{k}x::f"),
            Meta::new(),
            absorb,
        );
    }
    for k in 0..20 {
        b.port(&format!("/part#16/kit#16/k{k}x::f"), Meta::new(), absorb);
        b.port(&format!("/part#16/p{k}x::f"), Meta::new(), absorb);
    }
    b.port("/volume::f", Meta::new(), absorb);
    b.build().unwrap()
}

fn encoded(addresses: &[String]) -> Vec<Vec<u8>> {
    addresses
        .iter()
        .map(|a| {
            let mut buf = vec![0u8; 128];
            let n = encode_message(&mut buf, a, &[Arg::Float(0.5)]).unwrap();
            buf.truncate(n);
            buf
        })
        .collect()
}

fn dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");

    let mut b = TreeBuilder::<Sink>::new();
    b.port("/methodname:sif", Meta::new(), absorb);
    for k in 0..15 {
        b.port(&format!("/other{k}x"), Meta::new(), absorb);
    }
    let single = b.build().unwrap();
    let mut bytes = [0u8; 64];
    let n = encode_message(&mut bytes, ADDRESS, &sif()).unwrap();
    let mut sink = Sink::default();
    let mut ob = [0u8; 256];
    g.bench_function(
        "single layer /methodname sif (decode + lookup + handler)",
        |bch| {
            bch.iter(|| {
                let mut out = Outbox::new(&mut ob);
                black_box(
                    single
                        .dispatch(&mut sink, black_box(&bytes[..n]), &mut out)
                        .unwrap(),
                )
            })
        },
    );

    let Ok(Packet::Message(decoded)) = Packet::decode(&bytes[..n]) else {
        unreachable!()
    };
    g.bench_function(
        "single layer /methodname sif, pre-decoded (lookup + handler)",
        |bch| {
            bch.iter(|| {
                let mut out = Outbox::new(&mut ob);
                black_box(single.dispatch_message(
                    &mut sink,
                    black_box(&decoded),
                    netjam_osc::TimeTag::IMMEDIATELY,
                    &mut out,
                ))
            })
        },
    );

    let tree = zyn_tree();
    let paths = tree.reachable_paths();
    println!("zyn-scale tree: {paths} reachable paths");
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut next = |m: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % m
    };
    let mut addrs = Vec::new();
    for _ in 0..256 {
        let (p, k, v, o, h) = (next(16), next(16), next(8), next(3), next(128));
        addrs.push(match next(4) {
            0 => format!("/part{p}/kit{k}/adpars/voice{v}/oscil{o}/harmonic{h}/mag"),
            1 => format!("/part{p}/kit{k}/adpars/voice{v}/env{o}/point{}/value", next(16)),
            2 => format!("/part{p}/kit{k}/adpars/voice{v}/filter/stage{}/freq", next(4)),
            _ => format!("/part{p}/kit{k}/adpars/voice{v}/params/ctl{}x", next(35)),
        });
    }
    let msgs = encoded(&addrs);
    let mut i = 0usize;
    let pattern_msg = encoded(&["/part3/kit*/adpars/voice[0-1]/oscil0/harmonic7/mag".to_owned()]);
    println!(
        "allocations per dispatch: single layer {}, zyn-scale literal {}, zyn-scale pattern {}",
        allocations_per_call(|| {
            black_box(
                single
                    .dispatch(&mut sink, &bytes[..n], &mut Outbox::new(&mut ob))
                    .unwrap(),
            );
        }),
        allocations_per_call(|| {
            i = (i + 1) & 255;
            black_box(
                tree.dispatch(&mut sink, &msgs[i], &mut Outbox::new(&mut ob))
                    .unwrap(),
            );
        }),
        allocations_per_call(|| {
            black_box(
                tree.dispatch(&mut sink, &pattern_msg[0], &mut Outbox::new(&mut ob))
                    .unwrap(),
            );
        }),
    );
    g.bench_function("zyn-scale tree, random literal paths depth 6-7", |bch| {
        bch.iter(|| {
            i = (i + 1) & 255;
            let mut out = Outbox::new(&mut ob);
            let s = tree.dispatch(&mut sink, black_box(&msgs[i]), &mut out).unwrap();
            debug_assert_eq!(s.handled, 1);
            black_box(s)
        })
    });
    let bang: Vec<String> = addrs.iter().map(|a| a.replacen('/', "!", 1)).collect();
    let bang = encoded(&bang);
    g.bench_function("zyn-scale tree, same paths as '!' literal addresses", |bch| {
        bch.iter(|| {
            i = (i + 1) & 255;
            let mut out = Outbox::new(&mut ob);
            black_box(tree.dispatch(&mut sink, black_box(&bang[i]), &mut out).unwrap())
        })
    });
    g.bench_function("zyn-scale tree, pattern matching 32 ports", |bch| {
        bch.iter(|| {
            let mut out = Outbox::new(&mut ob);
            black_box(
                tree.dispatch(&mut sink, black_box(&pattern_msg[0]), &mut out)
                    .unwrap(),
            )
        })
    });
    g.finish();
    black_box(sink.acc);
}

/// Short enough that the whole bench runs in about a minute.
fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(2500))
        .sample_size(50)
}

criterion_group! { name = benches; config = config(); targets = codec, dispatch }
criterion_main!(benches);
