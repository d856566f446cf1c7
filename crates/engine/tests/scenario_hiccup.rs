//! One machine's hiccup in virtual time: both players' JACK servers lose the same time at
//! the same moment (two dummy servers on one busy VM, as on the project's bench), each
//! counting on from where it stopped. Each side's slip guard skips the lost time in what it
//! sends, and each side's receiver is told its own device lost it.
//!
//! The two streams stay in step: what the far side did not send during the hiccup was never
//! due to be heard. The kept bench runs show what playout does with it today: the own
//! device's loss is skipped against the arrival model, so playout jumps ahead of audio the
//! far side has not sent yet, conceals it as late, and often grows its target to wait for
//! it (of 254 device losses in 40 player logs, 133 were followed within 10 ms by a late
//! concealment and 79 of those by a growth). The scenario measures the discontinuities a
//! hiccup costs, beside a hiccup of the own device alone, and prints them (`--nocapture`).
//!
//! A loss moves the device's periods against the packets' arrivals by a fraction of a
//! packet. While playout's phase took that in only through its low-pass, a loss of the own
//! device alone cost 1.75–2 events here (the skip, then a growth to wait for audio the skip
//! went past); since the phase moves with the loss at once, 0.75–1.25 (the skip where the
//! new phase needs one, and now and then a catch-up). One of both servers together cost 3.5
//! (1 ms) to 6.25 (3 ms) while playout skipped the own loss at once: the far side had sent
//! nothing meanwhile, so the skip went past audio still to come (late concealments, then
//! growths). Playout now settles a loss once a packet after it shows what the far side did:
//! audio that came late by the time lost is not skipped, and a gap the far stream declares
//! for it is jumped where it is. 1.38–2.12 events: the far stream's gap, now and then a
//! catch-up, and after a 3 ms loss a growth when the far gap moves the packets' grid, which
//! playout's phase takes in through its low-pass. (Taking that move in at once brought this
//! to 1.12–1.25 here, and doubled the growths on the JACK bench: the model and the process
//! disagree there.)
//!
//! The far server alone is as common on the bench as both together. Losing time, it cost
//! 1.88 (1 ms) and 5.62–5.88 (3 ms) events a hiccup: playout conceals the audio that does
//! not come in place, the packets after the stall then come late by the time lost (the
//! far slip guard declares the loss only [`netjam_engine::slip::HOLD_NS`] later), the
//! target grows for them and playout waits twice, and when the far stream's gap comes
//! playout is late by less than all of it, so it jumps part and conceals the rest: the
//! bench's late concealments followed by `sender_lost` ones in the same place. Catching up
//! (the missed cycles run back to back) costs one late concealment. Playout now waits for
//! a stall's audio instead (see the jitter buffer's *stall*): 1.5 (1 ms) and 3.0–3.12
//! (3 ms) events a hiccup, most hiccups of 3 ms costing one wait and one whole jump of the
//! far gap, with no audio dropped; the rest are growths and catch-ups around them. A far
//! loss of 1 ms is below the far slip guard's threshold in some phases, and then no gap
//! is declared.
//!
//! A loss of one whole period (what a JACK server drops when it misses a cycle) costs one
//! event a hiccup for the own device, for both servers (the far gap, jumped whole) and for
//! a far catch-up, and two for the far server alone (a late concealment and the far gap).
//! On the bench, two servers losing a period together still often cost a concealment of
//! the far gap and a cut of 48 frames 0.3–1 s later: the process and the model disagree
//! there.
//!
//! JACK counts the cycles it drops in its frame clock, and the JACK shell skips them in
//! the stream at the next period, not after the slip guard's hold: both servers losing
//! time so (`BothCounted`) cost 1.12 events a hiccup at 1 ms and at a period, and 2.0 at
//! 3 ms: the far gap is declared at once, before this side settles its own loss, and the
//! settling moved playout's phase by the whole loss, so the delay held the lateness the gap
//! was to give back. At the first hiccup the gap was concealed in place and the period it
//! added cut 1.35 s later (the bench's pattern: a `sender_lost` concealment, then a cut of
//! about 48 frames); at 3 ms a short growth followed. The phase now moves by the loss less
//! the declared gap, and a gap playout is late for by all but what a catch-up keeps is
//! jumped whole: one whole jump a hiccup, at every size.
//!
//! A wait that runs on into the next period used to be logged as two entries (its first
//! frame at the end of a resampled period, then the rest) and counted twice; it is one
//! entry now. With that, the worst of the seeds: own device 0.75 / 1.00 / 1.25 (1 ms, a
//! period, 3 ms), both servers 1.38 / 1.00 / 2.00, the far server alone 1.38 / 2.00 /
//! 2.62, catching up 0 / 1.00 / 1.00, both counting the loss 1.00 / 1.00 / 1.00.

mod common;

use common::Session;
use netjam_engine::time::frames_to_ns;

const RATE: u32 = 48_000;
const FRAMES: u32 = 64;
const WARM_NS: u64 = 3_000_000_000;
/// Hiccups from the end of the warm-up, one a second.
const HICCUPS: u64 = 8;
const EVERY_NS: u64 = 1_000_000_000;

/// Which devices lose the time.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Who {
    /// Only the listener's own device (its server alone missed cycles).
    Own,
    /// Both servers together (one machine's hiccup).
    Both,
    /// Only the far side's server, which counts on from where it stopped: its slip guard
    /// skips the lost time in what it sends.
    Far,
    /// Only the far side's server, which runs the cycles it missed back to back once it
    /// wakes: no time lost, the packets of the stall leave together, late.
    FarCatchUp,
    /// Both servers together, each counting the cycles it dropped in its frame clock (as
    /// JACK does): the far stream skips them at its first period after the loss.
    BothCounted,
}

/// A loss of `lose_ns` every second after the warm-up: the discontinuity events a hiccup
/// cost the listener on average, and the latency added at the end, ms.
fn hiccups(who: Who, lose_ns: u64, seed: u64) -> (f64, f64, String) {
    let mut s = Session::bench_loopback(RATE, FRAMES, seed);
    let period_ns = frames_to_ns(u64::from(FRAMES), RATE);
    s.set_play_phase(seed.wrapping_mul(7_919) % period_ns);
    let schedule = move || {
        let mut at = WARM_NS;
        move |due: u64| {
            if due >= at && at < WARM_NS + HICCUPS * EVERY_NS {
                at += EVERY_NS;
                lose_ns
            } else {
                0
            }
        }
    };
    if matches!(who, Who::Own | Who::Both | Who::BothCounted) {
        s.play_lost = Some(Box::new(schedule()));
    }
    if matches!(who, Who::Both | Who::Far | Who::BothCounted) {
        s.capture_lost = Some(Box::new(schedule()));
    }
    s.capture_lost_counted = who == Who::BothCounted;
    if who == Who::FarCatchUp {
        // The capture due at the hiccup wakes `lose_ns` late; those due meanwhile run
        // at once after it, back to back.
        s.capture_late = Some(Box::new(schedule()));
    }
    s.slip = Some(netjam_engine::slip::SlipGuard::new(RATE));
    s.run(WARM_NS - 500_000_000);
    let before = s.receiver.stats().jitter_buffer.discontinuities;
    s.run(HICCUPS * EVERY_NS + 1_000_000_000);
    let jb = s.receiver.stats().jitter_buffer;
    let d = jb.discontinuities;
    let per = (d.events - before.events) as f64 / HICCUPS as f64;
    let kinds = format!(
        "device lost {}, late {}, growth {}, shrink {}, far gap {}",
        d.device_lost - before.device_lost,
        d.late - before.late,
        d.growth - before.growth,
        d.shrink - before.shrink,
        d.sender_gap_concealed + d.sender_lost - before.sender_gap_concealed - before.sender_lost,
    );
    (per, jb.added_latency_recent_ms, kinds)
}

/// Every case's events per hiccup, printed: the worst of the seeds at 1 ms, one period
/// (1.33 ms: a JACK server drops whole cycles) and 3 ms lost, for
/// each of `whos`.
fn worst_cases(whos: &[Who]) -> Vec<f64> {
    let worst: Vec<f64> = whos
        .iter()
        .map(|&who| {
            let mut w = 0.0f64;
            for lose_ms in [1.0, 4.0 / 3.0, 3.0] {
                for seed in 1..=4 {
                    let (per, added, kinds) = hiccups(who, (lose_ms * 1e6) as u64, seed);
                    eprintln!(
                        "{who:?} loses {lose_ms} ms, seed {seed}: {per:.2} events a hiccup ({kinds}); added {added:.2} ms"
                    );
                    w = w.max(per);
                }
            }
            w
        })
        .collect();
    eprintln!("worst events a hiccup: {whos:?} {worst:.2?}");
    worst
}

/// No worse than playout does today (own device: at most 1.25 events a hiccup, the skip
/// and now and then a catch-up; both servers: at most 2.25, the far stream's gap, now and
/// then a catch-up or a growth; the far server alone losing time: up to 3.25, see the
/// module docs; the far server catching up: one late concealment; both servers counting
/// the loss: one, the far gap jumped whole), so that a change that costs more shows here before a bench.
#[test]
fn hiccups_cost_no_more_discontinuities_than_today() {
    let w = worst_cases(&[Who::Own, Who::Both, Who::Far, Who::FarCatchUp, Who::BothCounted]);
    assert!(w[0] <= 1.25, "{:.2} events a hiccup of the own device", w[0]);
    assert!(w[1] <= 2.25, "{:.2} events a hiccup of both servers", w[1]);
    assert!(w[2] <= 3.25, "{:.2} events a hiccup of the far server", w[2]);
    assert!(
        w[3] <= 1.0,
        "{:.2} events a hiccup of the far server catching up",
        w[3]
    );
    assert!(
        w[4] <= 1.0,
        "{:.2} events a hiccup of both servers counting the loss",
        w[4]
    );
}

/// The goal: a loss of the own device costs one skip, and one machine's hiccup at most one
/// splice (the far stream's gap, inside the own device's gap). Ignored until playout gets
/// there.
#[test]
#[ignore]
fn a_hiccup_costs_one_splice() {
    let w = worst_cases(&[Who::Own, Who::Both, Who::Far, Who::FarCatchUp, Who::BothCounted]);
    assert!(w.iter().all(|&e| e <= 1.0), "{w:.2?} events a hiccup");
}

/// A far server that loses 3 ms, alone: the stall is one wait where its audio is missing
/// (nothing of it dropped: the packets after it play, late by the stall), and the gap the
/// far stream declares 20 ms later is jumped whole, where the audio on both sides of it is
/// continuous. That pair, and nothing else within 100 ms, in most hiccups of every seed.
#[test]
fn a_far_stall_is_waited_for_once_and_its_gap_jumped_whole() {
    use netjam_engine::discontinuity::{DiscontinuityCause as C, DiscontinuityKind as K};
    let lost = 144u64;
    for seed in 1..=4 {
        let mut s = Session::bench_loopback(RATE, FRAMES, seed);
        let period_ns = frames_to_ns(u64::from(FRAMES), RATE);
        s.set_play_phase(seed.wrapping_mul(7_919) % period_ns);
        let mut at = WARM_NS;
        s.capture_lost = Some(Box::new(move |due: u64| {
            if due >= at && at < WARM_NS + HICCUPS * EVERY_NS {
                at += EVERY_NS;
                3_000_000
            } else {
                0
            }
        }));
        s.slip = Some(netjam_engine::slip::SlipGuard::new(RATE));
        s.run(WARM_NS - 500_000_000);
        let mut clean = 0;
        let mut seen = Vec::new();
        for _ in 0..HICCUPS {
            // From 20 ms before the hiccup (half a second into this second) to 100 ms after.
            let from = s.played.len() as u64 + 480 * 48;
            s.run(EVERY_NS);
            let near: Vec<_> = s
                .receiver
                .recent_discontinuities()
                .filter(|d| (from..from + 120 * 48).contains(&d.output_frame))
                .copied()
                .collect();
            let pair = near.len() == 2
                && near[0].kind == K::Inserted
                && near[0].cause == C::Late
                && near[0].frames.abs_diff(lost) <= 8
                && near[1].kind == K::Skipped
                && near[1].cause == C::SenderLost
                && near[1].frames.abs_diff(lost) <= 2;
            clean += usize::from(pair);
            seen.push(near);
        }
        eprintln!("seed {seed}: {clean} of {HICCUPS} hiccups cost one wait and one whole jump");
        assert!(clean >= 6, "seed {seed}: {clean} of {HICCUPS}: {seen:?}");
    }
}
