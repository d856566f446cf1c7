//! `netjam impair --event` on loopback: a scheduled 300 ms stall holds every datagram sent
//! into it and releases them together, in order, none lost; impair announces the schedule
//! and the stall's begin and end.

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

const INTERVAL: Duration = Duration::from_millis(5);
const PACKETS: u32 = 500;
const STALL_MS: f64 = 300.0;
/// How much sooner than the stall's end the last packet before it may be released late on a
/// loaded machine (which shortens the gap the receiver sees).
const SLIP_MS: f64 = 60.0;

#[test]
fn a_scheduled_stall_holds_datagrams_and_releases_them_together_in_order() {
    let sink = UdpSocket::bind("127.0.0.1:0").expect("bind sink");
    sink.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let (mut impair, emulator) = common::impair(
        sink.local_addr().expect("addr"),
        &["--event", "1s:stall=300ms", "--duration", "8"],
    );
    impair.line_with("scripted link events", Duration::from_secs(5));
    let listed = impair.next_line(Duration::from_secs(5));
    assert!(
        listed.contains("1s:stall=300ms") && listed.contains("1.000 s to 1.300 s"),
        "{listed}"
    );

    // Sequence numbers every 5 ms on absolute times for 2.5 s; arrivals timed as they come.
    let receiver = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        let mut got: Vec<(u32, Instant)> = Vec::with_capacity(PACKETS as usize);
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < PACKETS as usize && Instant::now() < deadline {
            if let Ok(n) = sink.recv(&mut buf) {
                let at = Instant::now();
                if n == 4 {
                    got.push((u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]), at));
                }
            }
        }
        got
    });
    let sender = UdpSocket::bind("127.0.0.1:0").expect("bind sender");
    let start = Instant::now();
    for seq in 0..PACKETS {
        let due = start + INTERVAL * seq;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        sender.send_to(&seq.to_be_bytes(), emulator).expect("send");
    }
    let begins = impair.line_with("event begins", Duration::from_secs(5));
    let ends = impair.line_with("event ends", Duration::from_secs(5));
    let got = receiver.join().expect("receiver");
    let (status, said) = impair.finish(Duration::from_secs(15));
    assert!(status.success(), "impair failed: {said:?}");
    assert!(begins.contains("1.000 s") && begins.contains("stall"), "{begins}");
    assert!(ends.contains("1.300 s"), "{ends}");

    assert_eq!(got.len(), PACKETS as usize, "datagrams lost through the stall");
    let seqs: Vec<u32> = got.iter().map(|g| g.0).collect();
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "out of order: {seqs:?}"
    );
    let (gap, after) = got
        .windows(2)
        .enumerate()
        .map(|(i, w)| (w[1].1 - w[0].1, i + 1))
        .max()
        .expect("two arrivals");
    let gap_ms = gap.as_secs_f64() * 1e3;
    // Sent every 5 ms, so without the stall no gap comes near this.
    assert!(
        (STALL_MS - SLIP_MS..STALL_MS + 700.0).contains(&gap_ms),
        "longest gap {gap_ms:.1} ms, stall {STALL_MS} ms"
    );
    // What was sent into the stall (about 60 datagrams) comes out at once at its end.
    let released_at = got[after].1;
    let burst = got[after..]
        .iter()
        .take_while(|g| g.1 - released_at < Duration::from_millis(20))
        .count();
    assert!(
        burst >= 30,
        "only {burst} datagrams released with the stall's end"
    );

    let counters = common::impair_counters(&said).unwrap_or_else(|| panic!("no counters: {said:?}"));
    let up = &counters["up"];
    assert_eq!(up["delivered"], PACKETS, "{counters}");
    // About 60 datagrams are sent into the stall; a late sender thread may send fewer.
    assert!(up["stalled"].as_u64().is_some_and(|n| n >= 30), "{counters}");
    eprintln!("longest gap {gap_ms:.1} ms; {burst} datagrams released at the stall's end; {counters}");
}
