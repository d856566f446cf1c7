//! A private room's audio callback (`jam --room --password`) — `RoomProcess::process` with
//! its SFrame stage, its rings to real network threads on loopback — allocates nothing per
//! period in steady state: its own packets sealed, three members' opened before their
//! receivers, a fourth member's sealed under another password's key and a replay of every
//! 50th packet dropped and counted, and a key installed by an `Assign` while the stream
//! plays. Counted with a per-thread counting allocator on the thread that runs the
//! callback. A file of its own, so it never shares the two cores with `no_alloc_room.rs`.

use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use netjam::endpoint::Process;
use netjam::session::{NetIo, Peer, RoomProcess};
use netjam::transport::UdpTransport;
use netjam_engine::player::{Command, MediaConfig};
use netjam_engine::privacy::rtp::seal_rtp;
use netjam_engine::privacy::MediaSeal;
use netjam_engine::privacy::{kid, RoomKdf, RoomSecret};
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::synth::{Synth, SynthKind};
use netjam_engine::time::frames_to_ns;
use netjam_engine::wire::{AudioFormat, Codec};

alloc_count::install!();

const MEMBERS: u32 = 4;
const PERIOD: usize = 64;

fn sender(channels: u16, seed: u64) -> Sender {
    let format = AudioFormat::new(Codec::L16, 48_000, channels).expect("format");
    Sender::new(SenderConfig {
        seed,
        ..SenderConfig::new(format, PERIOD as u32)
    })
    .expect("sender")
}

#[test]
fn private_room_callback_does_not_allocate() {
    alloc_count::prove_counting();
    let cheap = RoomKdf {
        memory_kib: 64,
        passes: 1,
        lanes: 1,
    };
    let media = |pw: &str| {
        RoomSecret::derive_with("band", pw, cheap)
            .expect("derive")
            .media_key()
    };
    let (right, wrong) = (media("right"), media("wrong"));
    let me = sender(2, 1);
    let my_ssrc = me.ssrc();
    // The room's network threads on a socket the members send to, sending to a socket
    // nobody reads (the server's place).
    let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let socket = UdpTransport::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let to = socket.local_addr().expect("addr");
    let (io, link) = NetIo::start(socket, Peer::Fixed(server.local_addr().expect("addr"))).expect("io");
    let (mut room, snapshots, mut commands) =
        RoomProcess::new(me, link, MediaConfig::new(MEMBERS as usize, 2));
    room.media_mut()
        .set_seal(MediaSeal::new(right, 0, my_ssrc, MEMBERS as usize));
    let players: Vec<(Sender, Synth)> = (1..=MEMBERS as u64)
        .map(|i| (sender(1, 10 + i), Synth::new(SynthKind::Noise, 48_000, 1, i)))
        .collect();
    // Members 1..=3 are assigned now, member 4 (the wrong key) once the stream plays.
    let ssrcs: Vec<u32> = players.iter().map(|(s, _)| s.ssrc()).collect();
    for (i, &ssrc) in ssrcs.iter().enumerate().take(3) {
        commands
            .push(Command::Assign {
                ssrc,
                member: i as u32 + 1,
            })
            .expect("command ring");
    }
    let mut sealers: Vec<_> = ssrcs
        .iter()
        .enumerate()
        .map(|(i, &ssrc)| if i < 3 { right } else { wrong }.sealer(kid(0, ssrc)))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let members_thread = {
        let stop = stop.clone();
        let mut players = players;
        thread::spawn(move || {
            let out = UdpSocket::bind("127.0.0.1:0").expect("bind");
            let period = frames_to_ns(PERIOD as u64, 48_000);
            let start = netjam::clock::now_ns();
            let mut cap = vec![0.0f32; PERIOD];
            let mut sealed = vec![0u8; 2048];
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                netjam::clock::sleep_until_ns(start + k * period);
                let now = netjam::clock::now_ns();
                for ((s, synth), sealer) in players.iter_mut().zip(&mut sealers) {
                    synth.fill(&mut cap);
                    s.push_frames(now, &cap, |p| {
                        let n = seal_rtp(sealer, p, &mut sealed).expect("seal");
                        let _ = out.send_to(&sealed[..n], to);
                        if k % 50 == 0 {
                            let _ = out.send_to(&sealed[..n], to);
                        }
                    });
                }
                if k == 1000 {
                    let _ = commands.push(Command::Assign {
                        ssrc: ssrcs[3],
                        member: MEMBERS,
                    });
                }
                if k == 2500 {
                    // The password changes (here to the same one, in epoch 1): the audio
                    // thread keys every slot again, and the members seal in epoch 1.
                    let _ = commands.push(Command::Rekey { epoch: 1, key: right });
                    for (sealer, &ssrc) in sealers.iter_mut().zip(&ssrcs).take(3) {
                        sealer.rekey(kid(1, ssrc), &right.sender_base_key(kid(1, ssrc)));
                    }
                }
            }
        })
    };
    // The audio thread: 64 stereo frames a period on their real schedule; 5 s, counted
    // from 1 s on.
    let (periods, from) = (3750u64, 750u64);
    let mut input = vec![0.0f32; PERIOD * 2];
    let mut output = vec![0.0f32; PERIOD * 2];
    let mut own = Synth::new(SynthKind::Music { bpm: 100.0 }, 48_000, 2, 3);
    let period = frames_to_ns(PERIOD as u64, 48_000);
    let start = netjam::clock::now_ns();
    let mut measured = 0;
    for k in 0..periods {
        if k == from {
            measured = alloc_count::allocations();
            alloc_count::prove_counting();
            measured += 1;
        }
        let deadline = start + (k + 1) * period;
        netjam::clock::sleep_until_ns(deadline);
        own.fill(&mut input);
        room.process(deadline, &input, &mut output);
    }
    let during = alloc_count::allocations() - measured;
    stop.store(true, Ordering::Relaxed);
    members_thread.join().expect("members thread");
    let stats = room.report();
    drop(snapshots);
    io.shutdown();
    drop(server);
    let f = stats.sframe.expect("a private room reports its SFrame stage");
    println!("sframe: {f:?}");
    assert!(f.sealed > 2000 && f.opened > 6000, "{f:?}");
    assert!(f.forged > 1000 && f.replayed > 100, "{f:?}");
    assert_eq!((f.epoch, f.rekeys), (1, 1), "{f:?}");
    for m in stats.active_members().filter(|m| m.member < MEMBERS) {
        assert!(
            m.heard.received > 2000,
            "member {} barely heard: {:?}",
            m.member,
            m.heard
        );
    }
    assert_eq!(
        during,
        0,
        "{during} allocations in {} private room callbacks",
        periods - from
    );
}
