//! A private room on loopback: `netjam server`, two `netjam jam --password` players, and a
//! third member ("eve", a [`RoomClient`] in this process) who holds the room key, so she
//! gets a seat, but seals and opens with a media key from another password: the position
//! of whoever has the join proof (the server) but not the password, or of a member who
//! kept an earlier password.
//!
//! * the two players hear each other's tones;
//! * what eve receives through the server never opens under her key, and its payload
//!   bytes are as evenly spread as random data (a clear L16 tone is far from it);
//! * eve's tone, sealed under her key, and a burst of packets in clear reach the players
//!   and are dropped and counted, never heard.
//!
//! Every wait is for something a process prints or reports, with a timeout.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::signal::{read_channel0, tone_amp, write_tone, RATE};
use common::{address_in, read_json, Proc, BIN};
use netjam_engine::privacy::rtp::{open_rtp, seal_rtp};
use netjam_engine::privacy::{kid, MediaKey, RoomKdf, RoomSecret, SframeOpener};
use netjam_engine::room::msg::MAX_CONTROL_LEN;
use netjam_engine::room::{ClientConfig, RoomClient, RoomEvent};
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::wire::payload::{AudioFormat, Codec};
use netjam_engine::wire::{classify, parse_rtp, PacketKind};

const PASSWORD: &str = "open sesame";
const PLAYERS: [(&str, f64); 2] = [("ana", 311.0), ("bo", 463.0)];
const EVE_HZ: f64 = 887.0;
const AMP: f64 = 0.5;
const SECONDS: f64 = 8.0;
const STEP: Duration = Duration::from_secs(20);
const BLOCK: usize = 9_600;

fn player(name: &str, input: &Path, dir: &Path, server: SocketAddr) -> Proc {
    Proc::spawn_lines(
        Command::new(BIN)
            .args(["jam", "--server", &server.to_string(), "--room", "band"])
            .args(["--name", name, "--password", PASSWORD, "--input"])
            .arg(input)
            .args(["--duration", &SECONDS.to_string(), "--output"])
            .arg(dir.join(format!("{name}.heard.wav")))
            .arg("--stats-json")
            .arg(dir.join(format!("{name}.json")))
            .env("NETJAM_NO_REALTIME", "1")
            .stdout(Stdio::null()),
        "netjam jam",
    )
}

/// Blocks of `path` in which `hz` stands at more than a quarter of the sent amplitude.
fn blocks_with(path: &Path, hz: f64) -> usize {
    read_channel0(path)
        .chunks_exact(BLOCK)
        .filter(|b| tone_amp(b, hz) > AMP / 4.0)
        .count()
}

/// The member written here: seated with the room's join password, holding a media key
/// from another password.
struct Eve {
    socket: UdpSocket,
    server: SocketAddr,
    client: RoomClient,
    t0: Instant,
    ssrc: u32,
    buf: Vec<u8>,
    /// Her media key (another password's) and the keys it gives for what she hears.
    wrong: MediaKey,
    opener: SframeOpener,
    /// Media packets received, opened under her key, and their payloads' byte counts.
    received: u64,
    opened: u64,
    histogram: [u64; 256],
}

impl Eve {
    fn now_ns(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64
    }

    fn pump(&mut self) {
        while let Ok((n, from)) = self.socket.recv_from(&mut self.buf) {
            if from != self.server {
                continue;
            }
            if self.buf.first() == Some(&b'/') {
                let now = self.now_ns();
                self.client.handle_datagram(now, &self.buf[..n]);
            } else if classify(&self.buf[..n]) == PacketKind::Rtp {
                self.received += 1;
                if let Ok(p) = parse_rtp(&self.buf[..n]) {
                    // The sealed payload past the SFrame header (at most 17 bytes).
                    for &b in p.payload.iter().skip(17) {
                        self.histogram[usize::from(b)] += 1;
                    }
                    let k = kid(0, p.header.ssrc);
                    if !self.opener.has(k) {
                        self.wrong.install(&mut self.opener, k);
                    }
                }
                if open_rtp(&mut self.opener, &mut self.buf[..n]).is_ok() {
                    self.opened += 1;
                }
            }
        }
        let now = self.now_ns();
        if self.client.poll_timeout().is_some_and(|t| t <= now) {
            self.client.handle_timeout(now);
        }
        let mut out = [0u8; MAX_CONTROL_LEN];
        while let Some(n) = self.client.poll_transmit(&mut out) {
            let _ = self.socket.send_to(&out[..n], self.server);
        }
        while let Some(e) = self.client.poll_event() {
            match e {
                RoomEvent::Joined { ssrc, .. } => self.ssrc = ssrc,
                RoomEvent::Refused { reason, .. } => panic!("eve refused: {reason}"),
                _ => {}
            }
        }
    }
}

#[test]
fn members_with_the_password_hear_each_other_and_another_key_hears_nothing() {
    let dir = common::tmp_dir("room-private");
    let json = dir.join("server.json");
    let mut server = Proc::spawn_lines(
        Command::new(BIN)
            .args(["server", "--listen", "127.0.0.1:0", "--stats-json"])
            .arg(&json)
            .stdout(Stdio::null()),
        "netjam server",
    );
    let addr = address_in(&server.next_line(STEP));

    let mut players: Vec<(&str, Proc, Vec<String>)> = PLAYERS
        .iter()
        .map(|&(name, hz)| {
            let input = dir.join(format!("{name}.wav"));
            write_tone(&input, hz, AMP, 20.0);
            (name, player(name, &input, &dir, addr), Vec::new())
        })
        .collect();
    for (name, p, said) in &mut players {
        p.line_keeping(name, said, "private room", STEP, |l| {
            l.starts_with("netjam: private room:")
        });
        p.line_keeping(name, said, "seat", STEP, |l| l.starts_with("netjam: in room"));
    }

    // Eve: the join password is right, the media key is another password's.
    let format = AudioFormat::new(Codec::L16, RATE as u32, 1).expect("format");
    let mut sender = Sender::new(SenderConfig::new(format, 64)).expect("sender");
    let cheap = RoomKdf {
        memory_kib: 64,
        passes: 1,
        lanes: 1,
    };
    let wrong = RoomSecret::derive_with("band", "not the password", cheap)
        .expect("derive")
        .media_key();
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket.set_nonblocking(true).expect("nonblocking");
    let mut config = ClientConfig::new("band", "eve", PASSWORD, 0x5eed_0000);
    config.packets_per_s = 800;
    config.bytes_per_s = 800 * (sender.max_packet_bytes() as u32 + 28 + 27) + 40 * 1500;
    config.nonce_seed = *b"room-private-eve";
    config.secure = true;
    let mut eve = Eve {
        socket,
        server: addr,
        client: RoomClient::new(config, 0),
        t0: Instant::now(),
        ssrc: 0,
        buf: vec![0; 65_536],
        wrong,
        opener: SframeOpener::new(),
        received: 0,
        opened: 0,
        histogram: [0; 256],
    };
    let deadline = Instant::now() + STEP;
    while eve.ssrc == 0 {
        assert!(Instant::now() < deadline, "eve got no seat");
        eve.pump();
        std::thread::sleep(Duration::from_millis(2));
    }
    sender.set_ssrc(eve.ssrc);
    let mut sealer = wrong.sealer(kid(0, eve.ssrc));

    // Eve plays her tone, sealed under her key, for 4 s; every 50th packet goes in clear.
    let started = Instant::now();
    let mut sent = 0u64;
    let mut sealed = vec![0u8; 2048];
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(4) {
        eve.pump();
        let due = (started.elapsed().as_secs_f64() * 750.0) as u64;
        while sent < due {
            let frames: Vec<f32> = (0..64)
                .map(|k| (AMP * (2.0 * std::f64::consts::PI * EVE_HZ * (n + k) as f64 / RATE).sin()) as f32)
                .collect();
            n += 64;
            let clear = sent % 50 == 0;
            let (sock, srv) = (&eve.socket, eve.server);
            sender.push_frames(0, &frames, |p| {
                let bytes = if clear {
                    p
                } else {
                    let len = seal_rtp(&mut sealer, p, &mut sealed).expect("seal");
                    &sealed[..len]
                };
                let _ = sock.send_to(bytes, srv);
            });
            sent += 1;
        }
        std::thread::sleep(Duration::from_millis(2));
    }

    let mut reports = Vec::new();
    for (name, mut p, mut said) in players {
        let (status, rest) = p.finish(Duration::from_secs_f64(SECONDS) + STEP);
        said.extend(rest);
        assert!(status.success(), "{name} failed: {said:#?}");
        reports.push((name, read_json(&dir.join(format!("{name}.json"))), said));
    }
    let _ = server.stop_server(&json, STEP);

    // The two with the password heard each other, and never eve.
    for (i, (name, report, said)) in reports.iter().enumerate() {
        let heard = dir.join(format!("{name}.heard.wav"));
        let other = PLAYERS[1 - i].1;
        let with_other = blocks_with(&heard, other);
        assert!(
            with_other >= 15,
            "{name} heard the other player in only {with_other} blocks: {said:#?}"
        );
        assert_eq!(blocks_with(&heard, EVE_HZ), 0, "{name} heard eve");
        let f = &report["stats"]["sframe"];
        let get = |k: &str| {
            f[k].as_u64()
                .unwrap_or_else(|| panic!("{name}: no sframe.{k} in {f}"))
        };
        eprintln!("{name}: {f}");
        assert!(get("sealed") > 3_000 && get("opened") > 3_000, "{name}: {f}");
        // Eve's sealed packets fail their tag; her clear ones are no SFrame of a known key.
        assert!(get("forged") > 1_000, "{name}: {f}");
        assert!(
            get("no_key") + get("malformed") + get("forged") >= 2_500,
            "{name}: {f}"
        );
        assert_eq!(
            get("rejected"),
            get("forged") + get("replayed") + get("no_key") + get("malformed")
        );
    }

    // Eve heard packets and opened none, and their bytes look random.
    assert!(eve.received > 1_000, "eve received {} packets", eve.received);
    assert_eq!(eve.opened, 0, "eve opened a member's packet with another key");
    let total: u64 = eve.histogram.iter().sum();
    let mean = total as f64 / 256.0;
    let (lo, hi) = eve
        .histogram
        .iter()
        .fold((u64::MAX, 0), |(lo, hi), &c| (lo.min(c), hi.max(c)));
    eprintln!(
        "eve: {} packets, {total} payload bytes, byte counts {lo}..{hi} around {mean:.0}",
        eve.received
    );
    assert!(
        (lo as f64) > 0.8 * mean && (hi as f64) < 1.2 * mean,
        "payload bytes are not spread like random data: {lo}..{hi} around {mean:.0}"
    );
}
