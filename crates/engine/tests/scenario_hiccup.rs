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
    s.play_lost = Some(Box::new(schedule()));
    if who == Who::Both {
        s.capture_lost = Some(Box::new(schedule()));
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

/// Every case's events per hiccup, printed: (own device alone, both servers), the worst of
/// the seeds at 1 and 3 ms lost.
fn worst_cases() -> (f64, f64) {
    let mut worst = (0.0f64, 0.0f64);
    for who in [Who::Own, Who::Both] {
        for lose_ms in [1.0, 3.0] {
            for seed in 1..=4 {
                let (per, added, kinds) = hiccups(who, (lose_ms * 1e6) as u64, seed);
                eprintln!(
                    "{who:?} loses {lose_ms} ms, seed {seed}: {per:.2} events a hiccup ({kinds}); added {added:.2} ms"
                );
                let w = if who == Who::Own {
                    &mut worst.0
                } else {
                    &mut worst.1
                };
                *w = w.max(per);
            }
        }
    }
    eprintln!(
        "worst: {:.2} events a hiccup of the own device, {:.2} of both servers",
        worst.0, worst.1
    );
    worst
}

/// No worse than playout does today (own device: at most 1.25 events a hiccup, the skip
/// and now and then a catch-up; both servers: at most 2.25, the far stream's gap, now and
/// then a catch-up or a growth), so that a change that costs more shows here before a
/// bench.
#[test]
fn hiccups_cost_no_more_discontinuities_than_today() {
    let (own, both) = worst_cases();
    assert!(own <= 1.25, "{own:.2} events a hiccup of the own device");
    assert!(both <= 2.25, "{both:.2} events a hiccup of both servers");
}

/// The goal: a loss of the own device costs one skip, and one machine's hiccup at most one
/// splice (the far stream's gap, inside the own device's gap). Ignored until playout gets
/// there.
#[test]
#[ignore]
fn a_hiccup_costs_one_splice() {
    let (own, both) = worst_cases();
    assert!(
        own <= 1.0 && both <= 1.0,
        "{own:.2} and {both:.2} events a hiccup"
    );
}
