//! The rooms server's forwarding path allocates nothing in steady state, proven with a
//! counting allocator: members of a full room sending RTP and RTCP, a flooding member
//! being policed, a forger and a stranger being dropped, a slow destination whose queue
//! overflows.

use std::net::SocketAddr;

use netjam_engine::room::msg::MAX_CONTROL_LEN;
use netjam_engine::room::{ClientConfig, DropReason, RoomClient, Server, ServerConfig, Verdict};

alloc_count::install!();

fn addr(i: u16) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8], 40_000 + i))
}

#[test]
fn forwarding_does_not_allocate() {
    const N: u16 = 8;
    let mut s = Server::new(ServerConfig::default(), [1; 32]);
    let mut buf = [0u8; MAX_CONTROL_LEN];
    let mut ssrcs = Vec::new();
    for i in 1..=N {
        let mut c = RoomClient::new(
            ClientConfig::new("band", &format!("m{i}"), "pw", 1000 + u32::from(i)),
            0,
        );
        for _ in 0..6 {
            while let Some(n) = c.poll_transmit(&mut buf) {
                let _ = s.handle_datagram(0, addr(i), &buf[..n]);
            }
            while let Some((dst, n)) = s.poll_transmit(&mut buf) {
                if dst == addr(i) {
                    c.handle_datagram(0, &buf[..n]);
                }
            }
        }
        ssrcs.push(c.seat().expect("seated").1);
    }
    // Roster events stay queued for the control path; only media is measured here.
    let mut pkt = [0u8; 288];
    pkt[0] = 0x80;
    pkt[1] = 96;
    let mut rr = [0u8; 32];
    rr[..4].copy_from_slice(&[0x81, 201, 0, 7]);
    let period = 1_000_000_000u64 / 750;
    let mut dests: Vec<netjam_engine::room::Dest> = Vec::with_capacity(64);
    let mut forwarded = 0u64;
    let mut copies = 0u64;
    let mut measured = 0u64;
    for k in 0..20_000u64 {
        if k == 2_000 {
            measured = alloc_count::allocations();
            alloc_count::prove_counting();
            measured += 1;
        }
        let now = 1_000 + k * period / 8;
        let i = (k % u64::from(N)) as usize;
        let from = addr(i as u16 + 1);
        pkt[8..12].copy_from_slice(&ssrcs[i].to_be_bytes());
        pkt[2..4].copy_from_slice(&(k as u16).to_be_bytes());
        let bytes: &[u8] = if k % 50 == 0 {
            rr[4..8].copy_from_slice(&ssrcs[i].to_be_bytes());
            &rr
        } else {
            &pkt
        };
        dests.clear();
        if let Verdict::Forward(d) = s.handle_datagram(now, from, bytes) {
            dests.extend_from_slice(d);
            forwarded += 1;
        }
        // Member 1 floods (policed) and member 2's destination is stuck (queue drops).
        let _ = s.handle_datagram(now, addr(1), &pkt);
        for d in &dests {
            copies += 1;
            if d.addr != addr(2) {
                s.sent(d.id);
            }
        }
        // A forger and a stranger.
        pkt[8..12].copy_from_slice(&ssrcs[0].to_be_bytes());
        assert_eq!(
            s.handle_datagram(now, addr(3), &pkt),
            Verdict::Drop(DropReason::ForgedSsrc)
        );
        let _ = s.handle_datagram(now, addr(200), &pkt[..12]);
    }
    let during = alloc_count::allocations() - measured;
    assert_eq!(during, 0, "forwarding allocated {during} times");
    assert!(forwarded > 15_000, "{forwarded}");
    assert!(copies >= forwarded * u64::from(N - 2), "{copies}");
    let stats = s.member_stats();
    let m2 = stats.iter().find(|m| m.name == "m2").expect("m2");
    assert!(m2.queue_drops > 0);
    let m1 = stats.iter().find(|m| m.name == "m1").expect("m1");
    assert!(m1.policed_drops > 0);
}
