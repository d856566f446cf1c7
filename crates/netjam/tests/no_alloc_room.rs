//! A room client's audio callback — `RoomProcess::process`, with its lock-free rings to real
//! network threads on loopback — allocates nothing per period in steady state while it
//! hears four members through the mix's limiter, drops a stranger, takes mix commands
//! (the master gain among them) from another thread, and records every member, the mix
//! and its input (`--record`) through its rings to a writer, and fills one set of ports
//! per control seat with the member sitting there (`--member-ports`), while a member moves
//! between seats. So does a room with Opus on a
//! 44.1 kHz device: the room process behind both edge resamplers, decoding two members'
//! Opus and recording. The first does so with the player's page open (`jam --web`): a
//! thread shows every snapshot the callback publishes on the page, and a WebSocket client
//! reads it, as a browser would; nothing on the callback's thread knows.
//! Counted with a per-thread counting allocator on the thread that runs the callback, as
//! the audio thread would.

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;

use netjam::endpoint::Process;
use netjam::opus::{decoders, OpusEncoder, OpusSettings};
use netjam::record::{RecordSummary, RecordTap, RecordWriter};
use netjam::resample::EdgeProcess;
use netjam::session::{NetIo, Peer, RoomProcess, Snapshot};
use netjam::transport::UdpTransport;
use netjam_engine::player::{Command, MediaConfig, MediaReport};
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::synth::{Synth, SynthKind};
use netjam_engine::time::frames_to_ns;
use netjam_engine::wire::{AudioFormat, Codec};

alloc_count::install!();

const MEMBERS: u32 = 4;
const PERIOD: usize = 64;
/// The control seats members 1..=4 take; member 4 moves to [`MOVED_TO`] and back.
const SEATS: [u16; 4] = [3, 0, 5, 1];
const MOVED_TO: u16 = 9;
/// Per-member ports per seat.
const PER_SEAT: usize = 2;

fn sender(channels: u16, seed: u64) -> Sender {
    let format = AudioFormat::new(Codec::L16, 48_000, channels).expect("format");
    Sender::new(SenderConfig {
        seed,
        ..SenderConfig::new(format, PERIOD as u32)
    })
    .expect("sender")
}

/// A room client on loopback as `jam --server` runs one: its network threads on a socket
/// the members send to (`addr`), sending to a socket nobody reads (the server's place).
struct LoopbackRoom {
    io: NetIo,
    addr: SocketAddr,
    _server: UdpSocket,
}

type RoomEnds = (
    LoopbackRoom,
    RoomProcess,
    rtrb::Consumer<Snapshot<MediaReport>>,
    rtrb::Producer<Command>,
);

fn room_on_loopback(sender: Sender, config: MediaConfig) -> RoomEnds {
    let server = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let socket = UdpTransport::bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
    let addr = socket.local_addr().expect("addr");
    let (io, link) = NetIo::start(socket, Peer::Fixed(server.local_addr().expect("addr"))).expect("io");
    let (room, snapshots, commands) = RoomProcess::new(sender, link, config);
    let room_io = LoopbackRoom {
        io,
        addr,
        _server: server,
    };
    (room_io, room, snapshots, commands)
}

/// `--record` at 48 kHz, stereo mix and input, into a fresh temporary folder named by
/// `tag`: the folder, the audio thread's tap and the writer.
fn start_recording(tag: &str) -> (PathBuf, RecordTap, RecordWriter) {
    let take = std::env::temp_dir().join(format!("netjam-no-alloc-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&take);
    let (tap, writer) = netjam::record::start(netjam::record::RecordConfig {
        dir: take.clone(),
        rate: 48_000,
        mix_channels: 2,
        you_channels: 2,
        names: Box::new(|id| Some(format!("player {id}"))),
    })
    .expect("recording");
    (take, tap, writer)
}

/// The members play to `to` on their own thread, a period at a time on its real schedule
/// with their RTCP, until `stop`; `after_period(k)` runs after period k.
fn play_members(
    mut players: Vec<(Sender, Synth)>,
    to: SocketAddr,
    stop: Arc<AtomicBool>,
    mut after_period: impl FnMut(u64) + Send + 'static,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let out = UdpSocket::bind("127.0.0.1:0").expect("bind");
        let period = frames_to_ns(PERIOD as u64, 48_000);
        let start = netjam::clock::now_ns();
        let mut cap = vec![0.0f32; PERIOD * 2];
        let mut rtcp = [0u8; 1500];
        let mut k = 0u64;
        while !stop.load(Ordering::Relaxed) {
            k += 1;
            netjam::clock::sleep_until_ns(start + k * period);
            let now = netjam::clock::now_ns();
            for (s, synth) in &mut players {
                let n = PERIOD * s.format().channels as usize;
                synth.fill(&mut cap[..n]);
                s.push_frames(now, &cap[..n], |p| {
                    let _ = out.send_to(p, to);
                });
                if let Some(len) = s.poll_rtcp(now, &mut rtcp) {
                    let _ = out.send_to(&rtcp[..len], to);
                }
            }
            after_period(k);
        }
    })
}

/// The audio thread: `periods` periods of PERIOD frames of stereo music at `rate` through
/// `process(k, deadline, input, output)` on their real schedule; the allocations this
/// thread made from period `from` on.
fn periods_on_time(
    rate: u32,
    periods: u64,
    from: u64,
    mut process: impl FnMut(u64, u64, &[f32], &mut [f32]),
) -> u64 {
    let mut input = vec![0.0f32; PERIOD * 2];
    let mut output = vec![0.0f32; PERIOD * 2];
    let mut own = Synth::new(SynthKind::Music { bpm: 100.0 }, rate, 2, 3);
    let period = frames_to_ns(PERIOD as u64, rate);
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
        process(k, deadline, &input, &mut output);
    }
    alloc_count::allocations() - measured
}

/// A page open on the room (`jam --web`): a thread shows every snapshot the callback
/// publishes on the player's page, and a WebSocket client reads the page. Stopped through
/// the flag returned; joined, it gives back the snapshots' ring, the last snapshot it
/// showed, and the messages the client read.
#[allow(clippy::type_complexity)]
fn open_page(
    mut snapshots: rtrb::Consumer<Snapshot<MediaReport>>,
) -> (
    Arc<AtomicBool>,
    thread::JoinHandle<(
        rtrb::Consumer<Snapshot<MediaReport>>,
        Option<Snapshot<MediaReport>>,
        u64,
    )>,
) {
    use netjam::web::room_page::{FixedStages, RoomPage};
    use netjam::web::WebListener;
    use netjam_engine::player::{Roster, RosterMember};

    let stop = Arc::new(AtomicBool::new(false));
    let stop_page = stop.clone();
    let listener = WebListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).expect("the page's port");
    let addr = listener.local_addr();
    let (mut page, _commands) = RoomPage::start(listener, None, None).expect("the page");
    let mut roster = Roster {
        room: "band".into(),
        ..Roster::default()
    };
    for member in 1..=MEMBERS {
        roster.members.insert(
            member,
            RosterMember {
                member_id: member,
                name: format!("m{member}"),
                ssrc: 0,
            },
        );
    }
    let reader = thread::spawn(move || {
        let (mut ws, _) =
            tungstenite::client::connect(format!("ws://{addr}/ws")).expect("the page's WebSocket");
        if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
            s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
                .expect("a read timeout");
        }
        let mut read = 0u64;
        while let Ok(m) = ws.read() {
            if m.is_text() {
                read += 1;
            }
        }
        read
    });
    let fixed = FixedStages {
        packet_ms: 1.33,
        device_ms: 2.67,
        resampler_ms: 0.0,
    };
    let shower = thread::spawn(move || {
        let mut last = None;
        while !stop_page.load(Ordering::Relaxed) {
            while let Ok(s) = snapshots.pop() {
                page.publish(&s, &roster, "me", &fixed);
                last = Some(s);
            }
            thread::sleep(std::time::Duration::from_millis(10));
        }
        page.stop();
        let read = reader.join().expect("the page's reader");
        (snapshots, last, read)
    });
    (stop, shower)
}

/// After the members stopped: the room's last snapshot and final figures, and what the
/// recording wrote (its folder removed). `shown` is the last snapshot a page took.
fn finish(
    mut room: RoomProcess,
    mut snapshots: rtrb::Consumer<Snapshot<MediaReport>>,
    shown: Option<Snapshot<MediaReport>>,
    room_io: LoopbackRoom,
    (take, writer): (PathBuf, RecordWriter),
) -> (MediaReport, MediaReport, RecordSummary, RoomProcess) {
    let last: MediaReport = std::iter::from_fn(|| snapshots.pop().ok())
        .last()
        .or(shown)
        .expect("room snapshots")
        .stats;
    let stats = room.report();
    drop(room.take_recorder());
    let recorded = writer.finish().expect("recording");
    room_io.io.shutdown();
    let _ = std::fs::remove_dir_all(&take);
    (last, stats, recorded, room)
}

#[test]
fn room_callback_with_four_members_does_not_allocate() {
    // The counter counts this thread.
    alloc_count::prove_counting();

    let (room_io, mut room, snapshots, mut commands) =
        room_on_loopback(sender(2, 1), MediaConfig::new(MEMBERS as usize, 2));
    let (page_stop, page) = open_page(snapshots);
    let (take, tap, writer) = start_recording("record");
    room.set_recorder(tap);
    room.set_member_ports(PER_SEAT);
    // Members 1..=4 (mono and stereo), and a stranger (seed 9) who holds no slot.
    let players: Vec<(Sender, Synth)> = (1..=MEMBERS as u64 + 1)
        .map(|i| {
            let ch = if i % 2 == 0 { 2 } else { 1 };
            let seed = if i > MEMBERS as u64 { 9 } else { 10 + i };
            (
                sender(ch, seed),
                Synth::new(SynthKind::Noise, 48_000, ch as usize, i),
            )
        })
        .collect();
    for (i, (s, _)) in players.iter().take(MEMBERS as usize).enumerate() {
        let member = i as u32 + 1;
        commands
            .push(Command::Assign {
                ssrc: s.ssrc(),
                member,
            })
            .expect("command ring");
        commands
            .push(Command::Seat {
                member,
                seat: SEATS[i],
            })
            .expect("command ring");
    }

    // The members play on their own thread, which also turns the mix's knobs (as the OSC
    // thread would).
    let stop = Arc::new(AtomicBool::new(false));
    let members_thread = play_members(players, room_io.addr, stop.clone(), move |k| {
        if k % 100 == 0 {
            let member = (k / 100 % MEMBERS as u64) as u32 + 1;
            let step = (k / 100) as f32;
            let _ = commands.push(Command::Gain {
                member,
                db: -(step % 12.0),
            });
            let _ = commands.push(Command::Pan {
                member,
                pan: (step % 5.0) / 2.0 - 1.0,
            });
            let _ = commands.push(Command::Mute {
                member,
                mute: k % 300 == 0,
            });
            let _ = commands.push(Command::MonitorGain { db: -(step % 6.0) });
            // In and out of the mix's limiter.
            let _ = commands.push(Command::MasterGain {
                db: if k % 200 == 0 { 12.0 } else { 0.0 },
            });
            // Pause the recording for a while now and then (silence in its files).
            let _ = commands.push(Command::Record { on: k % 500 != 0 });
            let _ = commands.push(Command::Seat {
                member: MEMBERS,
                seat: if k % 200 == 0 { MOVED_TO } else { SEATS[3] },
            });
        }
    });

    // The audio thread: 64 stereo frames a period on their real schedule; 5 s, counted
    // from 1 s on (every member's stream has started, RTCP goes both ways).
    let seats = netjam::session::MAX_ROOM_MEMBERS;
    let mut ports = vec![0.0f32; seats * PER_SEAT * PERIOD];
    let mut port_energy = vec![0.0f64; seats * PER_SEAT];
    let (periods, from) = (3750u64, 750u64);
    let during = periods_on_time(48_000, periods, from, |k, deadline, input, output| {
        room.process(deadline, input, output);
        room.extra_outputs(PERIOD, &mut ports);
        if k >= from {
            for (e, port) in port_energy.iter_mut().zip(ports.chunks_exact(PERIOD)) {
                *e += port.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>();
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    members_thread.join().expect("members thread");
    page_stop.store(true, Ordering::Relaxed);
    let (snapshots, shown, page_messages) = page.join().expect("the page's thread");
    println!("the page open all along: {page_messages} messages read by its WebSocket client");
    assert!(
        page_messages >= 20,
        "the page showed {page_messages} snapshots in 5 s"
    );
    let (last, stats, recorded, room) = finish(room, snapshots, shown, room_io, (take, writer));
    println!(
        "recorded {} frames into {} files; {} periods dropped, {} frames padded",
        recorded.frames,
        recorded.files.len(),
        recorded.dropped_blocks,
        recorded.padded_frames
    );
    assert_eq!(recorded.files.len(), 2 + MEMBERS as usize, "{recorded:?}");
    assert!(recorded.error.is_none(), "{recorded:?}");
    assert!(
        recorded.frames + 100 * PERIOD as u64 >= periods * PERIOD as u64,
        "{recorded:?}"
    );
    assert!(recorded.padded_frames > 0, "the pauses are silence: {recorded:?}");
    println!(
        "room snapshot: {} bytes; routing {:?}; commands {} applied, {} refused",
        std::mem::size_of::<MediaReport>(),
        stats.routing,
        stats.commands,
        stats.command_errors
    );
    assert_eq!(last.active_members().count(), MEMBERS as usize, "{last:?}");
    // Every port of a seat a member sat at carried sound; every other seat was silent.
    for (port, e) in port_energy.iter().enumerate() {
        let seat = (port / PER_SEAT) as u16;
        let rms = (e / ((periods - from) as f64 * PERIOD as f64)).sqrt();
        if SEATS.contains(&seat) || seat == MOVED_TO {
            assert!(rms > 0.01, "seat {seat} port {port}: rms {rms}");
        } else {
            assert_eq!(*e, 0.0, "seat {seat} port {port} has no member");
        }
    }
    println!(
        "member ports: rms by seat {:?}",
        port_energy
            .chunks(PER_SEAT)
            .map(|e| (e[0] / ((periods - from) as f64 * PERIOD as f64)).sqrt())
            .collect::<Vec<_>>()
    );
    let seated = room.media().seats();
    for member in 1..=MEMBERS {
        assert_eq!(
            seated.iter().filter(|s| **s == Some(member)).count(),
            1,
            "member {member} has one seat: {seated:?}"
        );
    }
    assert_eq!(seated.iter().flatten().count(), MEMBERS as usize, "{seated:?}");
    for m in stats.active_members() {
        println!(
            "member {}: received {}, concealed {} frames, target {:.2} ms",
            m.member,
            m.heard.received,
            m.heard.jitter_buffer.concealed_frames,
            m.heard.jitter_buffer.target_ms
        );
        assert!(
            m.heard.received > 2000,
            "member {} barely heard: {:?}",
            m.member,
            m.heard
        );
    }
    assert!(
        stats.routing.unknown_ssrc > 1000,
        "the stranger: {:?}",
        stats.routing
    );
    assert!(
        stats.commands > MEMBERS as u64 + 40,
        "{} commands",
        stats.commands
    );
    assert_eq!(stats.command_errors, 0);
    assert!(stats.sent.packets > 2000, "{:?}", stats.sent);
    assert!(
        stats.limiter.limited_frames > 0,
        "the limiter never worked: {:?}",
        stats.limiter
    );
    assert_eq!(
        during,
        0,
        "{during} allocations in {} room callbacks with {MEMBERS} members",
        periods - from
    );
}

fn opus_sender(channels: u16, seed: u64) -> Sender {
    let format = AudioFormat::new(Codec::Opus, 48_000, channels).expect("format");
    let settings = OpusSettings::new(2.5, 96 * u32::from(channels), 5).expect("settings");
    let encoder =
        OpusEncoder::new(format, settings).expect("libopus encoder (scripts/deps installs libopus0)");
    Sender::with_encoder(
        SenderConfig {
            seed,
            ..SenderConfig::new(format, settings.frames)
        },
        Some(Box::new(encoder)),
    )
    .expect("sender")
}

#[test]
fn room_callback_with_opus_on_a_44_1_khz_device_does_not_allocate() {
    const DEVICE_RATE: u32 = 44_100;
    const OPUS_MEMBERS: u32 = 2;
    let mut config = MediaConfig::new(OPUS_MEMBERS as usize, 2);
    config.receiver.decoders = decoders();
    let (room_io, mut room, snapshots, mut commands) = room_on_loopback(opus_sender(2, 1), config);
    let room_addr = room_io.addr;
    let (take, tap, writer) = start_recording("record-opus");
    room.set_recorder(tap);
    let players: Vec<(Sender, Synth)> = (1..=OPUS_MEMBERS as u64)
        .map(|i| {
            let ch = if i % 2 == 0 { 2 } else { 1 };
            (
                opus_sender(ch, 10 + i),
                Synth::new(SynthKind::Noise, 48_000, ch as usize, i),
            )
        })
        .collect();
    for (i, (s, _)) in players.iter().enumerate() {
        commands
            .push(Command::Assign {
                ssrc: s.ssrc(),
                member: i as u32 + 1,
            })
            .expect("command ring");
    }
    // Your own input stays out of what is played, so the output is the members alone.
    commands
        .push(Command::MonitorMute { mute: true })
        .expect("command ring");
    let mut room = EdgeProcess::new(room, DEVICE_RATE, PERIOD, 2, 2).expect("edges");

    let stop = Arc::new(AtomicBool::new(false));
    let members_thread = play_members(players, room_addr, stop.clone(), |_| {});

    // The audio thread: 64 stereo frames a period at 44.1 kHz on their real schedule; 4 s,
    // counted from 1 s on (both members' decoders exist by then).
    let periods = 4 * u64::from(DEVICE_RATE) / PERIOD as u64;
    let from = periods / 4;
    let mut energy = 0.0f64;
    let during = periods_on_time(DEVICE_RATE, periods, from, |k, deadline, input, output| {
        room.process(deadline, input, output);
        if k >= from {
            energy += output.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>();
        }
    });
    stop.store(true, Ordering::Relaxed);
    members_thread.join().expect("members thread");
    let underruns = room.underruns();
    let (last, stats, recorded, _) = finish(room.into_inner(), snapshots, None, room_io, (take, writer));
    let rms = (energy / ((periods - from) as f64 * PERIOD as f64 * 2.0)).sqrt();
    println!(
        "Opus room on a 44.1 kHz device: output rms {rms:.3}; recorded {} frames at 48 kHz for {periods} periods of {PERIOD} at 44.1 kHz",
        recorded.frames
    );
    assert_eq!(underruns, 0, "the played edge ran dry");
    assert!(rms > 0.01, "the members were heard: rms {rms}");
    assert_eq!(last.active_members().count(), OPUS_MEMBERS as usize, "{last:?}");
    for m in stats.active_members() {
        assert!(m.heard.decoder.decoded_packets > 1000, "{:?}", m.heard);
        assert_eq!(m.heard.undecodable, 0, "{:?}", m.heard);
    }
    // The recording runs on the process's 48 kHz timeline: 4 s of it, less what the
    // capture edge's filter still held.
    assert!(recorded.error.is_none(), "{recorded:?}");
    let at_48k = periods * PERIOD as u64 * 48_000 / u64::from(DEVICE_RATE);
    assert!(
        (at_48k - 200..=at_48k).contains(&recorded.frames),
        "{} frames recorded, {at_48k} expected",
        recorded.frames
    );
    assert_eq!(
        during,
        0,
        "{during} allocations in {} room callbacks behind the Opus edges",
        periods - from
    );
}
