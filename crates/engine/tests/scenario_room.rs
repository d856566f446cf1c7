//! A room as one client hears it, in virtual time: three senders (different SSRCs, each
//! its own noise, L16 and L24) over links of different delays into one
//! [`MemberReceivers`] and a [`Mixer`] playing 64-frame periods into a mono output.
//!
//! Each member's contribution is recovered by alignment ([`netjam_engine::align`]): with
//! the other two muted, the output is that member's input, bit-exact, from its first frame
//! in one segment. A fourth sender that holds no slot is counted and never heard. A slot
//! released and handed to a new sender plays nothing of the old one afterwards: silence,
//! then the new sender from its first frame.

use netjam_engine::align::{align, AlignOptions, Alignment};
use netjam_engine::link::{JitterDist, LinkConfig, LinkModel};
use netjam_engine::members::{MemberReceivers, MembersConfig};
use netjam_engine::mixer::Mixer;
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::synth::{Synth, SynthKind};
use netjam_engine::time::frames_to_ns;
use netjam_engine::wire::{classify, AudioFormat, Codec, PacketKind};

const RATE: u32 = 48_000;
const FRAMES: usize = 64;

struct Player {
    sender: Sender,
    link: LinkModel<Vec<u8>>,
    synth: Synth,
    codec: Codec,
    /// Captures from this virtual time on (and until `until`).
    from_ns: u64,
    until_ns: u64,
    sent: Vec<f32>,
    /// RTP and RTCP datagrams delivered to the client.
    rtp_delivered: u64,
    rtcp_delivered: u64,
}

impl Player {
    fn new(codec: Codec, seed: u64, delay_ms: u64) -> Self {
        let format = AudioFormat::new(codec, RATE, 1).expect("format");
        let sender = Sender::new(SenderConfig {
            seed,
            ..SenderConfig::new(format, FRAMES as u32)
        })
        .expect("sender");
        let link = LinkConfig {
            delay_ns: delay_ms * 1_000_000,
            jitter_ns: 200_000,
            jitter_dist: JitterDist::Uniform,
            ..LinkConfig::ideal()
        };
        Self {
            sender,
            link: LinkModel::new(link, seed + 100),
            synth: Synth::new(SynthKind::Noise, RATE, 1, seed),
            codec,
            from_ns: 0,
            until_ns: u64::MAX,
            sent: Vec::new(),
            rtp_delivered: 0,
            rtcp_delivered: 0,
        }
    }

    /// What was sent, as the codec carries it.
    fn sent_quantized(&self) -> Vec<f32> {
        let scale = match self.codec {
            Codec::L16 => 32_768.0,
            Codec::L24 => 8_388_608.0,
            other => panic!("not linear PCM: {other:?}"),
        };
        self.sent
            .iter()
            .map(|x| (x * scale).round().clamp(-scale, scale - 1.0) / scale)
            .collect()
    }
}

struct Room {
    players: Vec<Player>,
    members: MemberReceivers,
    mixer: Mixer,
    now: u64,
    played: Vec<f32>,
}

impl Room {
    fn new(players: Vec<Player>, capacity: usize) -> Self {
        Self {
            players,
            members: MemberReceivers::new(MembersConfig::new(capacity, 2, RATE)),
            mixer: Mixer::new(capacity, 1, RATE),
            now: 0,
            played: Vec::new(),
        }
    }

    /// Run until `end_ns`: every player captures and sends a packet per period; the client
    /// plays a period 0.3 ms after each capture.
    fn run(&mut self, end_ns: u64) {
        let period = frames_to_ns(FRAMES as u64, RATE);
        let mut cap = [0.0f32; FRAMES];
        let mut out = [0.0f32; FRAMES];
        let mut rtcp = [0u8; 1500];
        while self.now < end_ns {
            let t = self.now;
            for p in &mut self.players {
                if t >= p.from_ns && t < p.until_ns {
                    p.synth.fill(&mut cap);
                    p.sent.extend_from_slice(&cap);
                    let link = &mut p.link;
                    p.sender.push_frames(t, &cap, |bytes| {
                        link.send(t, bytes.to_vec(), bytes.len());
                    });
                    if let Some(n) = p.sender.poll_rtcp(t, &mut rtcp) {
                        p.link.send(t, rtcp[..n].to_vec(), n);
                    }
                }
            }
            let play = t + 300_000;
            for p in &mut self.players {
                while let Some((at, bytes)) = p.link.poll(play) {
                    match classify(&bytes) {
                        PacketKind::Rtcp => p.rtcp_delivered += 1,
                        _ => p.rtp_delivered += 1,
                    }
                    self.members.receive(at, classify(&bytes), &bytes);
                }
            }
            self.members.render(play, FRAMES);
            self.mixer.begin(&mut out);
            for slot in 0..self.members.capacity() {
                if let Some((frames, ch)) = self.members.output(slot) {
                    self.mixer.add(slot, frames, ch, &mut out);
                }
            }
            self.played.extend_from_slice(&out);
            self.now += period;
        }
    }
}

fn three_players() -> Vec<Player> {
    vec![
        Player::new(Codec::L16, 1, 12),
        Player::new(Codec::L24, 2, 19),
        Player::new(Codec::L16, 3, 27),
        // Holds no slot.
        Player::new(Codec::L16, 4, 5),
    ]
}

fn assert_whole(a: &Alignment, label: &str) {
    assert!(
        a.segments.len() == 1 && a.missing_head() == 0 && a.head_unmatched == 0,
        "{label}: the output is not the input whole from its first frame\n{a}"
    );
}

#[test]
fn each_member_is_recovered_bit_exact_with_the_others_muted() {
    for solo in 0..3 {
        let mut room = Room::new(three_players(), 4);
        for i in 0..3 {
            let ssrc = room.players[i].sender.ssrc();
            let slot = room.members.assign(ssrc, 100 + i as u32).expect("slot");
            room.mixer.set_mute(slot, i != solo);
        }
        room.run(6_000_000_000);
        let p = &room.players[solo];
        let a = align(&p.sent_quantized(), &room.played, 1, AlignOptions::default());
        println!("member {solo} ({:?}): {a}", p.codec);
        assert_whole(&a, &format!("member {solo}"));
        // Played to the end, less what was still in flight (the link delay and buffer).
        assert!(a.missing_tail() < RATE as usize / 20, "{a}");
        for other in (0..3).filter(|&o| o != solo) {
            let b = align(
                &room.players[other].sent_quantized(),
                &room.played,
                1,
                AlignOptions::default(),
            );
            assert!(b.segments.is_empty(), "muted member {other} heard\n{b}");
        }
        let slot = room.members.slot_of(p.sender.ssrc()).expect("slot");
        let (_, st) = room.members.member_stats(slot).expect("stats");
        assert_eq!(st.jitter_buffer.discontinuities.events, 0, "{st:?}");
        // The stranger: every packet counted and dropped, nothing of it heard.
        let stranger = &room.players[3];
        let rs = room.members.stats();
        assert!(stranger.rtp_delivered > 0 && stranger.rtcp_delivered > 0);
        assert_eq!(
            (rs.unknown_ssrc, rs.unrouted_rtcp),
            (stranger.rtp_delivered, stranger.rtcp_delivered),
            "{rs:?}"
        );
        // The members' sender reports reached their receivers.
        assert!(st.rtcp_received > 0, "{st:?}");
        let s = align(
            &stranger.sent_quantized(),
            &room.played,
            1,
            AlignOptions::default(),
        );
        assert!(s.segments.is_empty(), "stranger heard\n{s}");
    }
}

#[test]
fn all_members_unmuted_sum_to_their_inputs() {
    let mut room = Room::new(three_players(), 4);
    for i in 0..3 {
        let ssrc = room.players[i].sender.ssrc();
        room.members.assign(ssrc, i as u32).expect("slot");
    }
    room.run(3_000_000_000);
    // Where each member starts in the output, from its solo alignment in a muted run.
    let mut offsets = Vec::new();
    for solo in 0..3 {
        let mut r = Room::new(three_players(), 4);
        for i in 0..3 {
            let ssrc = r.players[i].sender.ssrc();
            let slot = r.members.assign(ssrc, i as u32).expect("slot");
            r.mixer.set_mute(slot, i != solo);
        }
        r.run(3_000_000_000);
        let a = align(
            &r.players[solo].sent_quantized(),
            &r.played,
            1,
            AlignOptions::default(),
        );
        assert_whole(&a, "solo");
        offsets.push((a.segments[0].out_start, room.players[solo].sent_quantized()));
    }
    let start = offsets.iter().map(|o| o.0).max().expect("offsets");
    for (n, y) in room.played.iter().enumerate().skip(start).take(RATE as usize) {
        let want: f32 = offsets.iter().map(|(o, x)| x[n - o]).sum();
        assert!((y - want).abs() < 1e-6, "frame {n}: {y} != {want}");
    }
}

#[test]
fn a_released_slot_handed_to_a_new_sender_plays_nothing_of_the_old_one() {
    let release_ns = 2_000_000_000;
    let mut players = three_players();
    players.truncate(2);
    // The old member goes on sending after its release (its packets are strangers now).
    let mut newcomer = Player::new(Codec::L24, 7, 9);
    newcomer.from_ns = release_ns;
    players.push(newcomer);
    let mut room = Room::new(players, 2);
    let (old, other, new) = (
        room.players[0].sender.ssrc(),
        room.players[1].sender.ssrc(),
        room.players[2].sender.ssrc(),
    );
    let slot = room.members.assign(old, 1).expect("slot");
    let muted = room.members.assign(other, 2).expect("slot");
    room.mixer.set_mute(muted, true);
    room.run(release_ns);
    let before = room.played.len();
    let heard = align(
        &room.players[0].sent_quantized(),
        &room.played,
        1,
        AlignOptions::default(),
    );
    assert_whole(&heard, "old member before its release");
    assert_eq!(room.members.release(old), Some(slot));
    assert_eq!(room.members.assign(new, 3), Ok(slot), "the freed slot is reused");
    room.mixer.reset_strip(slot);
    room.run(release_ns + 3_000_000_000);
    let after = &room.played[before..];
    let old_after = align(
        &room.players[0].sent_quantized(),
        after,
        1,
        AlignOptions::default(),
    );
    assert!(
        old_after.segments.is_empty(),
        "the old member is heard after its release\n{old_after}"
    );
    let a = align(
        &room.players[2].sent_quantized(),
        after,
        1,
        AlignOptions::default(),
    );
    println!("newcomer: {a}");
    assert_whole(&a, "newcomer");
    // Before the newcomer: exact silence, no tail or concealment of the old member.
    assert!(after[..a.idle].iter().all(|x| *x == 0.0));
    assert!(
        a.idle > 0,
        "the newcomer's first packet arrives after its link delay"
    );
    let rs = room.members.stats();
    assert!(rs.unknown_ssrc > 0, "{rs:?}");
    let (owner, st) = room.members.member_stats(slot).expect("stats");
    assert_eq!((owner.ssrc, owner.member), (new, 3));
    assert_eq!(st.stream_starts, 1, "a clean start, not a source change: {st:?}");
    assert_eq!(st.jitter_buffer.discontinuities.events, 0, "{st:?}");
}
