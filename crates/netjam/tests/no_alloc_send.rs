//! The network send thread's per-packet work — `SendRoute::send`: look up the peer and the
//! room's route table without a lock, send to each address — allocates and frees nothing while
//! another thread keeps changing the table (as a room client's control thread does when
//! direct paths come and go) and the peer (as the receive thread does when it learns one).
//! Counted with the per-thread counting allocator on the thread that sends, as the send
//! thread would; real loopback sockets, every wait bounded.

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use netjam::session::SendRoute;
use netjam::transport::UdpTransport;
use netjam_engine::nat::direct::RouteTable;

alloc_count::install!();

/// Packets sent while counting, at the least.
const PACKETS: u64 = 20_000;
/// Route changes the other thread must have made while counting, at the least.
const CHANGES: u64 = 50;
/// The longest the counted stretch may take (it takes well under a second when idle).
const LIMIT: Duration = Duration::from_secs(30);

/// A loopback socket that counts the datagrams it receives, until `stop`.
fn sink(stop: &Arc<AtomicBool>) -> (SocketAddr, Arc<AtomicU64>, JoinHandle<()>) {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_millis(20)))
        .expect("timeout");
    let addr = socket.local_addr().expect("addr");
    let count = Arc::new(AtomicU64::new(0));
    let thread = {
        let (stop, count) = (stop.clone(), count.clone());
        thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                if socket.recv(&mut buf).is_ok() {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    (addr, count, thread)
}

#[test]
fn sending_a_packet_does_not_allocate_while_the_route_changes() {
    // The counter counts this thread.
    alloc_count::prove_counting();

    let stop = Arc::new(AtomicBool::new(false));
    // Two peers the receive thread could learn in turn, and two members' direct paths.
    let sinks: Vec<_> = (0..4).map(|_| sink(&stop)).collect();
    let addr: Vec<SocketAddr> = sinks.iter().map(|s| s.0).collect();
    let route = Arc::new(SendRoute::new(Some(addr[0])));
    let tables = [
        RouteTable::default(),
        RouteTable::new(true, &addr[2..]),
        RouteTable::new(false, &addr[2..]),
    ];
    let changes = Arc::new(AtomicU64::new(0));
    let changer = {
        let (stop, route, changes) = (stop.clone(), route.clone(), changes.clone());
        thread::spawn(move || {
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                route.set_table(tables[k % tables.len()]);
                route.learn_peer(addr[k / tables.len() % 2]);
                changes.fetch_add(1, Ordering::Relaxed);
                // Pacing only: the route changes a few thousand times a second.
                thread::sleep(Duration::from_micros(200));
            }
        })
    };

    let socket = UdpTransport::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let packet = [0x80u8; 172];
    // The send thread's first loads set up its read slots before its first packet.
    let warm = alloc_count::allocations();
    for _ in 0..100 {
        route.send(&socket, &packet);
    }
    let warm = alloc_count::allocations() - warm;
    let mut measured = alloc_count::allocations();
    alloc_count::prove_counting();
    measured += 1;
    // After the proof, which frees what it allocated.
    let freed = alloc_count::deallocations();
    let changes_from = changes.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut sent = 0u64;
    while sent < PACKETS || changes.load(Ordering::Relaxed) < changes_from + CHANGES {
        route.send(&socket, &packet);
        sent += 1;
        if started.elapsed() > LIMIT {
            break;
        }
    }
    let during = alloc_count::allocations() - measured;
    let freed = alloc_count::deallocations() - freed;
    let elapsed = started.elapsed();
    let changed = changes.load(Ordering::Relaxed) - changes_from;
    stop.store(true, Ordering::Relaxed);
    changer.join().expect("changer");
    let received: Vec<u64> = sinks
        .into_iter()
        .map(|(_, count, thread)| {
            thread.join().expect("sink");
            count.load(Ordering::Relaxed)
        })
        .collect();
    println!("the first 100 packets: {warm} allocations (the thread's read slots)");
    println!(
        "{sent} packets sent in {:.0} ms while the route changed {changed} times: {during} allocations, {freed} frees; received {received:?}",
        elapsed.as_secs_f64() * 1e3
    );
    assert!(
        changed >= CHANGES,
        "the route changed only {changed} times in {LIMIT:?}"
    );
    for (i, n) in received.iter().enumerate() {
        assert!(*n > 0, "destination {i} received nothing: {received:?}");
    }
    assert_eq!(during, 0, "{during} allocations in {sent} packets sent");
    assert_eq!(freed, 0, "{freed} frees in {sent} packets sent");
}
