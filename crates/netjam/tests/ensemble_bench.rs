//! Message latency and throughput between two ensemble members on loopback, in one
//! process (two nodes, each with its own sockets and threads, exactly as `netjam
//! ensemble join` runs them). Ignored by default: it measures, it does not check.
//!
//! `cargo test --release -p netjam --test ensemble_bench -- --ignored --nocapture`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use netjam::ensemble::{mono_ns, Node, NodeConfig};
use netjam_ensemble::discovery::Discovery;
use netjam_ensemble::{Event, SendError};
use netjam_osc::{encode_message, Arg, Message};

const S: u64 = 1_000_000_000;

fn node(name: &str, base: u16, id: u64, service: &str) -> Node {
    Node::start(NodeConfig {
        ensemble: name.into(),
        id,
        services: vec![service.into()],
        taps: Vec::new(),
        discovery: Discovery::local(base),
        bind_ip: "127.0.0.1".parse().unwrap(),
        osc_bridge: None,
        room: None,
    })
    .unwrap()
}

fn pct(v: &mut [u64], p: f64) -> f64 {
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize] as f64 / 1e3
}

#[test]
#[ignore]
fn loopback_latency_and_throughput() {
    let name = format!("bench-{}", std::process::id());
    // Below the ephemeral range, clear of the loopback tests' 20000–31583.
    let base = 32_000 + (std::process::id() % 40) as u16 * 16;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_b = stop.clone();
    let (name_b, base_b) = (name.clone(), base);
    // The echo member: answers /echo/ping with /a/pong (same arguments, same delivery),
    // counts /echo/count and answers /echo/total with the count.
    let echo = std::thread::spawn(move || {
        let mut b = node(&name_b, base_b, 2, "echo");
        let mut counted = 0i32;
        while !stop_b.load(Ordering::Relaxed) {
            let until = mono_ns() + 100_000_000;
            b.run(Some(until), |n, ev| {
                if let Event::Message(d) = ev {
                    let m = Message::decode(&d.bytes).unwrap();
                    let mut buf = [0u8; 256];
                    let reply = match m.address() {
                        "/echo/ping" => {
                            let args: Vec<Arg<'_>> = m.args().collect();
                            encode_message(&mut buf, "/a/pong", &args).unwrap()
                        }
                        "/echo/count" => {
                            counted += 1;
                            return true;
                        }
                        _ => encode_message(&mut buf, "/a/total", &[Arg::Int(counted)]).unwrap(),
                    };
                    let _ = n.member().send(mono_ns(), &buf[..reply], 0, d.reliable);
                }
                true
            });
        }
    });
    let mut a = node(&name, base, 1, "a");
    let deadline = mono_ns() + 10 * S;
    a.run(Some(deadline), |n, _| {
        n.member_ref().table().provider("echo").is_none()
    });
    assert!(
        a.member_ref().table().provider("echo").is_some(),
        "the echo member was not found"
    );

    let mut buf = [0u8; 64];
    for reliable in [false, true] {
        let mut one_way = Vec::new();
        for i in 0..2_000i32 {
            let len = encode_message(&mut buf, "/echo/ping", &[Arg::Int(i)]).unwrap();
            let t0 = mono_ns();
            a.member().send(t0, &buf[..len], 0, reliable).unwrap();
            a.flush();
            let mut back = None;
            a.run(Some(t0 + S / 2), |_, ev| {
                if let Event::Message(d) = ev {
                    if Message::decode(&d.bytes).unwrap().arg(0) == Some(Arg::Int(i)) {
                        back = Some(mono_ns());
                        return false;
                    }
                }
                true
            });
            if let Some(t1) = back {
                one_way.push((t1 - t0) / 2);
            }
        }
        let n = one_way.len();
        println!(
            "{}: {n}/2000 round trips; one way (half the round trip, socket to socket through both members' threads) p50 {:.1} µs, p99 {:.1} µs",
            if reliable { "reliable" } else { "best effort" },
            pct(&mut one_way, 0.5),
            pct(&mut one_way, 0.99)
        );
    }

    // Throughput: reliable, as fast as the window lets; then best effort, counted at the far end.
    const N: i32 = 50_000;
    let len = encode_message(&mut buf, "/echo/count", &[Arg::Int(0)]).unwrap();
    for reliable in [true, false] {
        let t0 = mono_ns();
        let mut sent = 0;
        while sent < N {
            match a.member().send(mono_ns(), &buf[..len], 0, reliable) {
                Ok(_) => sent += 1,
                Err(SendError::Backlogged(_)) => {
                    a.flush();
                    a.run(Some(mono_ns() + 1_000_000), |_, _| true);
                }
                Err(e) => panic!("{e}"),
            }
            if sent % 64 == 0 {
                a.flush();
            }
        }
        a.flush();
        while reliable && a.member_ref().unacked() > 0 && mono_ns() < t0 + 60 * S {
            a.run(Some(mono_ns() + 1_000_000), |_, _| true);
        }
        let t1 = mono_ns();
        let secs = (t1 - t0) as f64 / 1e9;
        let total_len = encode_message(&mut buf[32..], "/echo/total", &[]).unwrap();
        let total_msg = buf[32..32 + total_len].to_vec();
        a.member().send(mono_ns(), &total_msg, 0, true).unwrap();
        let mut total = None;
        a.run(Some(mono_ns() + 5 * S), |_, ev| {
            if let Event::Message(d) = ev {
                let m = Message::decode(&d.bytes).unwrap();
                if m.address() == "/a/total" {
                    total = m.arg(0).and_then(|x| x.as_i32());
                    return false;
                }
            }
            true
        });
        println!(
            "{}: {N} messages in {secs:.2} s = {:.0} messages/s ({}); the far end counted {} in all so far",
            if reliable {
                "reliable throughput (all acknowledged)"
            } else {
                "best-effort throughput (sent)"
            },
            N as f64 / secs,
            if reliable {
                format!("{} retransmits", a.member_ref().stats().retransmits)
            } else {
                "no acks".into()
            },
            total.map_or("?".into(), |t| t.to_string())
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    echo.join().unwrap();
}
