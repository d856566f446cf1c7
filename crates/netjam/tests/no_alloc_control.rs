//! The audio side of OSC control only pops typed commands from a ring: while a control
//! server takes sets over UDP on its own thread, the stand-in audio thread pops and applies
//! them without allocating. Counted with the per-thread counting allocator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use netjam::control::{
    command_ring, linear_gain, ControlCommand, ControlServer, ControlState, Surface, MAX_MEMBERS,
};
use netjam_osc::{encode_message, Arg};

alloc_count::install!();

/// What an audio thread keeps of the mix: plain arrays, sized at start.
#[derive(Default)]
struct Mix {
    gain_db: [f32; MAX_MEMBERS as usize],
    mute: [bool; MAX_MEMBERS as usize],
    linear: [f32; MAX_MEMBERS as usize],
}

impl Mix {
    fn apply(&mut self, c: ControlCommand) {
        if let ControlCommand::MemberGain { member, db } = c {
            self.gain_db[usize::from(member)] = db;
        }
        if let ControlCommand::MemberMute { member, mute } = c {
            self.mute[usize::from(member)] = mute;
        }
        for i in 0..self.linear.len() {
            self.linear[i] = linear_gain(self.gain_db[i], self.mute[i]);
        }
    }
}

#[test]
fn popping_and_applying_commands_allocates_nothing() {
    const SETS: usize = 200;
    let (tx, mut rx) = command_ring(SETS + usize::from(MAX_MEMBERS));
    let surface = Surface::room();
    let bind: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = ControlServer::spawn(bind, surface, ControlState::new(&surface), tx).unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut buf = [0u8; 64];
    for i in 0..SETS {
        let member = format!("/member{}/gain", i % usize::from(MAX_MEMBERS));
        let n = encode_message(&mut buf, &member, &[Arg::Float(-((i % 60) as f32))]).unwrap();
        client.send_to(&buf[..n], server.local_addr()).unwrap();
    }
    let n = encode_message(&mut buf, "/member*/mute", &[Arg::Int(1)]).unwrap();
    client.send_to(&buf[..n], server.local_addr()).unwrap();

    let mut mix = Mix::default();
    let mut popped = 0usize;
    let mut allocated = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    // Every set is delivered (the ring holds them all) unless a datagram was lost on
    // loopback; the mutes come last, so wait for them.
    while !mix.mute.iter().all(|&m| m) && Instant::now() < deadline {
        let (a, ()) = alloc_count::count(|| {
            alloc_count::prove_counting();
            while let Ok(c) = rx.pop() {
                mix.apply(c);
                popped += 1;
            }
        });
        allocated += a - 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(allocated, 0, "popping and applying commands allocated");
    assert!(mix.mute.iter().all(|&m| m), "the mutes never arrived");
    assert!(popped > SETS / 2, "only {popped} commands of {}", SETS + 16);
    assert!(mix.linear.iter().all(|&g| g == 0.0));
    server.shutdown();
}
