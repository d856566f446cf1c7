//! RTCP's round trip when a player jams against a reflector (everything it sends, RTCP
//! included, comes back unchanged) and when two players jam with each other, in virtual
//! time. Each player works as `netjam jam` does: one sender, one receiver, and every RTCP
//! packet that arrives goes to both halves.

use netjam_engine::link::{LinkConfig, LinkModel};
use netjam_engine::receiver::{Receiver, ReceiverConfig};
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::wire::{classify, AudioFormat, Codec, PacketKind};

const ONE_WAY_NS: u64 = 19_000_000;
const PACKET_FRAMES: u32 = 64;

struct Player {
    sender: Sender,
    receiver: Receiver,
    out: Vec<f32>,
    frames: Vec<f32>,
}

impl Player {
    fn new(seed: u64) -> Self {
        let format = AudioFormat::new(Codec::L16, 48_000, 1).expect("format");
        let mut receiver = Receiver::new(ReceiverConfig {
            seed: seed + 100,
            ..ReceiverConfig::new(2)
        });
        receiver.set_output_format(format);
        Self {
            sender: Sender::new(SenderConfig {
                seed,
                ..SenderConfig::new(format, PACKET_FRAMES)
            })
            .expect("sender"),
            receiver,
            out: vec![0.0; PACKET_FRAMES as usize],
            frames: (0..PACKET_FRAMES)
                .map(|i| (i as f32 * 0.05).sin() * 0.3)
                .collect(),
        }
    }

    fn on_datagram(&mut self, at: u64, bytes: &[u8]) {
        if classify(bytes) == PacketKind::Rtcp {
            self.sender.on_rtcp(at, bytes);
        }
        self.receiver.on_datagram(at, bytes);
    }

    /// One packet period: capture and send, play, and any RTCP due, onto `link`.
    fn period(&mut self, now: u64, link: &mut LinkModel<Vec<u8>>) {
        let mut rtcp = [0u8; 1500];
        let frames = std::mem::take(&mut self.frames);
        self.sender.push_frames(now, &frames, |p| {
            link.send(now, p.to_vec(), p.len());
        });
        self.frames = frames;
        self.receiver.play(now, &mut self.out);
        if let Some(n) = self.sender.poll_rtcp(now, &mut rtcp) {
            link.send(now, rtcp[..n].to_vec(), n);
        }
        if let Some(n) = self.receiver.poll_rtcp(now, &mut rtcp) {
            link.send(now, rtcp[..n].to_vec(), n);
        }
    }
}

fn link(seed: u64) -> LinkModel<Vec<u8>> {
    LinkModel::new(
        LinkConfig {
            delay_ns: ONE_WAY_NS,
            ..LinkConfig::ideal()
        },
        seed,
    )
}

const PERIOD_NS: u64 = 1_333_333;

#[test]
fn against_a_reflector_rtcp_measures_the_path_once() {
    let mut me = Player::new(1);
    let (mut to_reflector, mut from_reflector) = (link(2), link(3));
    let mut now = 0;
    while now < 6_000_000_000 {
        // The reflector sends back each datagram the moment it arrives.
        while let Some((at, bytes)) = to_reflector.poll(now) {
            let len = bytes.len();
            from_reflector.send(at, bytes, len);
        }
        while let Some((at, bytes)) = from_reflector.poll(now) {
            me.on_datagram(at, &bytes);
        }
        me.period(now, &mut to_reflector);
        now += PERIOD_NS;
    }
    let st = me.sender.stats();
    let rtt = st.rtt_ms.expect("a round trip from our own reports coming back");
    eprintln!("RTCP round trip against a reflector on a 19 + 19 ms loop: {rtt:.3} ms");
    assert!((rtt - 38.0).abs() <= 1.0, "rtt {rtt} ms on a 38 ms loop: {st:?}");
    assert!(st.rtcp_echoes >= 3, "{st:?}");
    assert!(st.rtcp_received >= 3, "{st:?}");
}

#[test]
fn two_players_each_measure_the_round_trip_between_them() {
    let (mut a, mut b) = (Player::new(10), Player::new(20));
    let (mut a_to_b, mut b_to_a) = (link(11), link(21));
    let mut now = 0;
    while now < 6_000_000_000 {
        while let Some((at, bytes)) = a_to_b.poll(now) {
            b.on_datagram(at, &bytes);
        }
        while let Some((at, bytes)) = b_to_a.poll(now) {
            a.on_datagram(at, &bytes);
        }
        a.period(now, &mut a_to_b);
        b.period(now, &mut b_to_a);
        now += PERIOD_NS;
    }
    for (who, p) in [("a", &a), ("b", &b)] {
        let st = p.sender.stats();
        let rtt = st.rtt_ms.expect("a round trip from the other player's reports");
        eprintln!("RTCP round trip of {who} on a 19 + 19 ms path: {rtt:.3} ms");
        assert_eq!(st.rtcp_echoes, 0, "{who}: {st:?}");
        assert!(
            (rtt - 38.0).abs() <= 1.0,
            "{who}: rtt {rtt} ms on a 38 ms path: {st:?}"
        );
        assert_eq!(st.remote_cumulative_lost, Some(0), "{who}");
    }
}
