//! Loss: concealed without clicks, and with RFC 2198 redundancy a lost packet is rebuilt
//! from the next one before it is due — recovery within a packet.

mod common;

use common::Session;
use netjam_engine::link::{LinkConfig, LossModel};
use netjam_engine::wire::{AudioFormat, Codec};

fn lossy(loss: LossModel) -> LinkConfig {
    LinkConfig {
        delay_ns: 19_000_000,
        jitter_ns: 300_000,
        loss,
        ..LinkConfig::ideal()
    }
}

#[test]
fn isolated_losses_are_fully_rebuilt_from_redundancy() {
    let format = AudioFormat::new(Codec::L16, 48_000, 2).expect("format");
    let mut s = Session::new(format, 64, 1, lossy(LossModel::Bernoulli { p: 0.01 }), 31);
    s.run(10_000_000_000);
    let st = s.receiver.stats();
    let lost = s.up.stats().lost;
    assert!(lost > 50, "lost {lost}");
    // Only back-to-back losses (≈1 % of losses) defeat one packet of redundancy.
    assert!(
        st.jitter_buffer.concealment_events <= lost / 20,
        "{st:?} lost {lost}"
    );
    assert!(
        st.jitter_buffer.recovered_frames >= (lost - lost / 20) * 64,
        "{st:?} lost {lost}"
    );
}

#[test]
fn bursty_loss_without_redundancy_is_concealed_and_counted() {
    let format = AudioFormat::new(Codec::L16, 48_000, 2).expect("format");
    let mut s = Session::new(format, 64, 0, lossy(LossModel::bursty(0.02, 3.0)), 32);
    s.run(10_000_000_000);
    let st = s.receiver.stats();
    let lost = s.up.stats().lost;
    assert_eq!(st.lost as u64, lost, "RTCP loss count matches the link: {st:?}");
    assert!(st.jitter_buffer.concealed_frames >= lost * 64 * 9 / 10, "{st:?}");
    // Bursts merge into one concealment event each: far fewer events than lost packets.
    assert!(
        st.jitter_buffer.concealment_events < lost / 2,
        "{st:?} lost {lost}"
    );
    // The sender hears about it through RTCP.
    assert!(s.sender.stats().remote_cumulative_lost.unwrap_or(0) > 0);
}

#[test]
fn more_redundancy_survives_bursts() {
    let format = AudioFormat::new(Codec::L16, 48_000, 1).expect("format");
    let run = |red| {
        let mut s = Session::new(format, 64, red, lossy(LossModel::bursty(0.02, 2.0)), 33);
        s.run(10_000_000_000);
        s.receiver.stats().jitter_buffer.concealed_frames
    };
    let (none, one, three) = (run(0), run(1), run(3));
    // Bursts have geometric lengths of mean 2 (P(B = b) = 2^-b). N redundant copies rebuild
    // min(B, N) packets of each burst: N = 1 rebuilds E[1]/E[B] = 50 % of the losses,
    // N = 3 rebuilds (1 + 1/2 + 1/4)/2 = 87.5 %. Allow sampling noise.
    let ratio1 = one as f64 / none as f64;
    let ratio3 = three as f64 / none as f64;
    assert!(
        (0.35..0.65).contains(&ratio1),
        "concealed: red0 {none}, red1 {one} ({ratio1:.2})"
    );
    assert!(
        ratio3 < 0.22,
        "concealed: red0 {none}, red3 {three} ({ratio3:.2})"
    );
}

#[test]
fn packets_longer_than_a_period_lose_only_what_was_lost_at_any_playout_phase() {
    // 2.5 ms packets into 64-frame periods: a period often ends a few frames into the next
    // packet. Playout that locked early (here, seed 43) used to read those frames before they
    // were due, again and again, concealing a few each time beside the real losses.
    let format = AudioFormat::new(Codec::L16, 48_000, 2).expect("format");
    for seed in [41, 43, 44, 45] {
        let mut s = Session::new(format, 120, 0, lossy(LossModel::bursty(0.02, 2.0)), seed);
        s.run(20_000_000_000);
        let jb = s.receiver.stats().jitter_buffer;
        let lost = s.up.stats().lost;
        assert!(lost > 100, "seed {seed}: lost {lost}");
        // Only the lost packets' frames are concealed (plus at most one period of re-alignment).
        assert!(
            jb.concealed_frames <= lost * 120 + 64,
            "seed {seed}: concealed {} for {lost} lost packets: {jb:?}",
            jb.concealed_frames
        );
        assert!(
            jb.concealment_events <= lost,
            "seed {seed}: {} concealments for {lost} lost packets",
            jb.concealment_events
        );
    }
}
