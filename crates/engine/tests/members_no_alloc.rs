//! Zero heap allocations per period for a room client's audio path in steady state, proven
//! with a counting allocator: eight members (L16, L24 and F32; mono and stereo) routed by
//! [`MemberReceivers::receive`] with loss, duplicates, sender reports and a stranger's
//! packets, rendered, and mixed by [`Mixer`] into stereo while gains, pans and mutes change
//! and a slot is released and handed out again; the master gain moves the mix in and out
//! of the output limiter.

use netjam_engine::members::{MemberReceivers, MembersConfig};
use netjam_engine::mixer::Mixer;
use netjam_engine::sender::{Sender, SenderConfig};
use netjam_engine::synth::{Synth, SynthKind};
use netjam_engine::time::frames_to_ns;
use netjam_engine::wire::{classify, AudioFormat, Codec};

alloc_count::install!();

const MEMBERS: usize = 8;
const FRAMES: usize = 64;

#[test]
fn receive_render_and_mix_of_eight_members_do_not_allocate() {
    let before = alloc_count::allocations();
    drop(std::hint::black_box(vec![1u8; 16]));
    assert_eq!(
        alloc_count::allocations(),
        before + 1,
        "the counter sees this thread"
    );

    let formats = [
        (Codec::L16, 1u16),
        (Codec::L24, 2),
        (Codec::F32, 1),
        (Codec::L16, 2),
    ];
    let mut senders: Vec<(Sender, Synth)> = (0..=MEMBERS as u64)
        .map(|i| {
            let (codec, ch) = formats[i as usize % formats.len()];
            let format = AudioFormat::new(codec, 48_000, ch).expect("format");
            let sender = Sender::new(SenderConfig {
                seed: 10 + i,
                ..SenderConfig::new(format, FRAMES as u32)
            })
            .expect("sender");
            (sender, Synth::new(SynthKind::Noise, 48_000, ch as usize, i))
        })
        .collect();
    let mut members = MemberReceivers::new(MembersConfig::new(MEMBERS, 2, 48_000));
    members.set_reporter_ssrc(0x1234_5678);
    let mut mixer = Mixer::new(MEMBERS, 2, 48_000);
    // The last sender is a stranger: it holds no slot.
    for (i, (s, _)) in senders.iter().take(MEMBERS).enumerate() {
        members.assign(s.ssrc(), i as u32).expect("slot");
    }
    let mut cap = vec![0.0f32; FRAMES * 2];
    let mut out = vec![0.0f32; FRAMES * 2];
    let mut rtcp = vec![0u8; 1500];
    let mut report = vec![0u8; 1500];
    let mut packet = Vec::with_capacity(65_536);
    let period = frames_to_ns(FRAMES as u64, 48_000);
    let mut measured = 0;
    let mut reports = 0u64;
    let mut limited = 0u64;
    for k in 0..20_000u64 {
        let now = k * period;
        if k == 2_000 {
            measured = alloc_count::allocations();
            alloc_count::prove_counting();
            measured += 1;
        }
        for (i, (sender, synth)) in senders.iter_mut().enumerate() {
            let ch = sender.format().channels as usize;
            synth.fill(&mut cap[..FRAMES * ch]);
            let arrive = now + 5_000_000 + i as u64 * 100_000;
            let mut n = 0;
            sender.push_frames(now, &cap[..FRAMES * ch], |p| {
                packet.clear();
                packet.extend_from_slice(p);
                n += 1;
            });
            if n > 0 && (k + i as u64) % 37 != 0 {
                members.receive(arrive, classify(&packet), &packet);
                if k % 61 == 0 {
                    members.receive(arrive, classify(&packet), &packet);
                }
            }
            if let Some(len) = sender.poll_rtcp(now, &mut rtcp) {
                members.receive(arrive, classify(&rtcp[..len]), &rtcp[..len]);
            }
        }
        // The control side's changes, as the audio thread takes them off its queue.
        if k % 100 == 0 {
            let slot = (k / 100) as usize % MEMBERS;
            mixer.set_gain_db(slot, -(((k / 100) % 12) as f32));
            mixer.set_pan(slot, ((k / 100) % 5) as f32 / 2.0 - 1.0);
            mixer.set_mute(slot, (k / 100) % 3 == 0);
            mixer.set_monitor_gain(((k / 100) % 4) as f32 / 4.0);
            mixer.set_master_gain_db(if (k / 100) % 2 == 0 { 12.0 } else { 0.0 });
        }
        if k % 1_000 == 500 {
            let slot = (k / 1_000) as usize % MEMBERS;
            let ssrc = senders[slot].0.ssrc();
            members.release(ssrc);
            members.assign(ssrc, 100 + k as u32).expect("slot");
            mixer.reset_strip(slot);
        }
        let play = now + 5_300_000;
        members.render(play, FRAMES);
        mixer.begin(&mut out);
        for slot in 0..MEMBERS {
            if let Some((frames, ch)) = members.output(slot) {
                mixer.add(slot, frames, ch, &mut out);
            }
        }
        mixer.add_monitor(&cap[..FRAMES], 1, &mut out);
        mixer.finish(&mut out);
        assert!(out.iter().all(|x| x.abs() <= 1.0));
        while let Some(len) = members.poll_rtcp(play, &mut report) {
            std::hint::black_box(&report[..len]);
            reports += 1;
        }
        while members.poll_event().is_some() {}
        if k % 4_800 == 0 {
            for slot in 0..MEMBERS {
                std::hint::black_box(mixer.take_level(slot));
                std::hint::black_box(members.member_stats(slot));
            }
            limited = mixer.take_limiter().limited_frames;
        }
    }
    let during = alloc_count::allocations() - measured;
    let rs = members.stats();
    // The paths were exercised: every member heard, losses concealed, the stranger
    // dropped, reports written, slots handed out again.
    // (A slot's counters start again when it is handed out: the last one 500 periods ago.)
    let mut sender_reports = 0;
    for slot in 0..MEMBERS {
        let (_, st) = members.member_stats(slot).expect("held");
        assert!(st.received > 400, "slot {slot}: {st:?}");
        assert!(st.jitter_buffer.concealment_events > 0, "slot {slot}: {st:?}");
        sender_reports += st.rtcp_received;
    }
    assert!(sender_reports > 0);
    assert!(rs.unknown_ssrc > 10_000 && rs.unrouted_rtcp > 0, "{rs:?}");
    assert!(rs.released >= 18, "{rs:?}");
    assert!(reports > 100, "{reports} reports");
    assert!(out.iter().any(|x| *x != 0.0));
    assert!(limited > 0, "the limiter never worked");
    assert_eq!(during, 0, "allocations in 18,000 periods of 8 members");
}
