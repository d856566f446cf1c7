//! Proves that encoding, decoding, pattern matching, dispatch and the message queue do
//! not allocate in steady state, with a counting global allocator.
#![allow(clippy::unwrap_used, clippy::approx_constant)]

use netjam_osc::pattern::matches;
use netjam_osc::queue::message_queue;
use netjam_osc::schedule::Scheduler;
use netjam_osc::{encode_message, Arg, BundleWriter, Meta, Outbox, Packet, Route, TimeTag, TreeBuilder};

alloc_count::install!();

/// Allocations made on this thread while running `f`.
fn allocations<R>(f: impl FnOnce() -> R) -> (u64, R) {
    alloc_count::count(f)
}

#[derive(Default)]
struct State {
    freq: [[f32; 8]; 16],
    gain: f32,
}

#[test]
fn steady_state_paths_do_not_allocate() {
    // Setup may allocate.
    let mut b = TreeBuilder::<State>::new();
    b.port("/part#16/voice#8/freq::f", Meta::new().unit("Hz"), |s, r| {
        let (p, v) = (r.index(0) as usize, r.index(1) as usize);
        match r.arg(0) {
            Some(Arg::Float(f)) => s.freq[p][v] = f,
            _ => {
                let _ = r.reply_here(&[Arg::Float(s.freq[p][v])]);
            }
        }
    })
    .port("/gain::f", Meta::new().doc("Master gain"), |s, r| {
        if let Some(Arg::Float(g)) = r.arg(0) {
            s.gain = g;
            let _ = r.broadcast("/gain", &[Arg::Float(g)]);
            let _ = r.chain("/part0/voice0/freq", &[Arg::Float(g)]);
        } else {
            let _ = r.forward();
        }
    });
    let tree = b.build().unwrap();
    let mut state = State::default();
    let (mut tx, mut rx) = message_queue(4096);
    let mut sched = Scheduler::new(8, 256);
    let mut pkt = [0u8; 512];
    let mut outbuf = [0u8; 4096];
    let mut popped = [0u8; 512];

    let mut round = || {
        // Encode.
        let n = encode_message(
            &mut pkt,
            "/methodname",
            &[Arg::Str("this is a string"), Arg::Int(123), Arg::Float(3.14)],
        )
        .unwrap();
        // Decode and iterate lazily.
        let Ok(Packet::Message(m)) = Packet::decode(&pkt[..n]) else {
            panic!("decode")
        };
        assert_eq!(m.args().count(), 3);
        // Pattern match.
        assert!(matches("/part*/voice[0-3]/{freq,gain}", "/part12/voice2/freq"));
        assert!(matches("//freq", "/part12/voice2/freq"));
        let mut out = Outbox::new(&mut outbuf);
        // Literal, query with reply, pattern, '!' address, broadcast + chain + forward.
        for (addr, args) in [
            ("/part3/voice5/freq", &[Arg::Float(220.0)][..]),
            ("/part3/voice5/freq", &[][..]),
            ("/part*/voice[0-1]/freq", &[Arg::Float(1.0)][..]),
            ("!part3/voice5/freq", &[Arg::Float(2.0)][..]),
            ("/gain", &[Arg::Float(0.5)][..]),
            ("/gain", &[][..]),
            ("//freq", &[Arg::Float(3.0)][..]),
            ("/_meta", &[Arg::Str("/gain")][..]),
        ] {
            out.clear();
            let n = encode_message(&mut pkt, addr, args).unwrap();
            let r = tree.dispatch(&mut state, &pkt[..n], &mut out).unwrap();
            assert!(r.handled > 0 || addr == "/_meta", "{addr}");
            // Forwarded messages cross to the other thread's queue.
            let (queued, refused) = tx.push_outbox(&out, Route::Forward);
            assert_eq!(refused, 0);
            for _ in 0..queued {
                assert!(rx.pop(&mut popped).unwrap().is_some());
            }
        }
        // A bundle.
        let mut w = BundleWriter::new(&mut pkt, TimeTag::new(10, 0)).unwrap();
        w.message("/gain", &[Arg::Float(0.1)]).unwrap();
        w.open_bundle(TimeTag::new(5, 0)).unwrap();
        w.message("/part1/voice1/freq", &[Arg::Float(9.0)]).unwrap();
        w.close_bundle().unwrap();
        let n = w.finish().unwrap();
        out.clear();
        assert_eq!(tree.dispatch(&mut state, &pkt[..n], &mut out).unwrap().handled, 3);
        // Queue handoff and scheduling.
        tx.push(&pkt[..n]).unwrap();
        let got = rx.pop(&mut popped).unwrap().unwrap();
        assert_eq!(got.len(), n);
        sched
            .offer(TimeTag::new(1, 0), TimeTag::new(2, 0), &pkt[..n], |_, _| {})
            .unwrap();
        sched.drain_due(TimeTag::new(3, 0), |_, m| assert_eq!(m.len(), n));
    };
    round(); // warm up
    let (count, ()) = allocations(|| {
        for _ in 0..100 {
            round();
        }
    });
    assert_eq!(count, 0, "steady-state OSC paths allocated {count} times");
    // The counter itself works.
    let (count, v) = allocations(|| vec![1u8; 10]);
    assert!(count > 0 && v.len() == 10);
}
