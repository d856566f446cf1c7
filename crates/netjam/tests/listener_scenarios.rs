//! Scenarios a listener would notice, in real processes on loopback (issue 22, item 6),
//! judged by the listener's measure: a four-player room, and a 200 ms stall through
//! `netjam impair` between two peers. The scenarios are tests/listener_support's, which the
//! bench `benches/listener.rs` prints as a table; each test prints the same figures.
//!
//! It asserts only what holds on a loaded 2-core machine (checked with one core spinning):
//! every player hears each of the others near the level sent and not itself, and the
//! stalled stream's latency comes back. Pitch, glitch windows and the latency's peak are
//! printed, not judged here: their goals (issue 22) are not met yet.
//!
//! One scenario plays at a time: two at once on two cores would measure the machine.

mod common;
mod listener_support;

use std::sync::{Mutex, MutexGuard};

use common::tmp_dir;
use listener_support::{describe, print_table, sent_db, Row, Scenario, SECONDS};

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn play(s: Scenario) -> Vec<Row> {
    let _turn = one_at_a_time();
    let rows = s.run(&tmp_dir(&format!("listener-{}", s.name())));
    for r in &rows {
        eprintln!("{}", describe(r));
    }
    print_table(std::slice::from_ref(&rows));
    rows
}

/// The own tone leaking back (the mix's intermodulation put it at −20 dB before the
/// limiter) must stay this far below what is heard, dB.
const GHOST_DB: f64 = -40.0;

#[test]
fn four_players_in_a_room_hear_the_three_others_near_the_level_sent_and_never_themselves() {
    let rows = play(Scenario::RoomOfFour);
    assert_eq!(rows.len(), 4);
    // Three tones at −6 dBFS peak at 1.5: the mix's limiter (ceiling −0.1 dBFS) turns them
    // down by up to this much where they add up; a few dB more is a lost stream.
    let limiter_db = 20.0 * (0.9886f64 / (3.0 * listener_support::SINE_AMPLITUDE)).log10();
    let lowest = limiter_db - 3.0;
    for r in &rows {
        let h = &r.heard;
        assert_eq!(h.levels_db.len(), 3, "{}", describe(r));
        for &(hz, db) in &h.levels_db {
            assert!(
                (lowest..1.0).contains(&db),
                "player {} heard {hz} Hz at {db:+.1} dB of the {:.1} dB sent (want {lowest:+.1} to +1): {}",
                r.listener,
                sent_db(),
                describe(r)
            );
        }
        let ghost = h.ghost_db.expect("an absent tone was named");
        assert!(
            ghost < GHOST_DB,
            "player {} hears its own tone at {ghost:+.1} dB: {}",
            r.listener,
            describe(r)
        );
        // Most of the run is heard as steady tones: a stream that glitched all along (a
        // wrong mix, clipping) fails here whatever the machine's load.
        assert!(
            h.glitches_at.len() * 2 < h.windows,
            "player {}: {} of {} windows glitch: {}",
            r.listener,
            h.glitches_at.len(),
            h.windows,
            describe(r)
        );
    }
}

#[test]
fn a_200_ms_stall_is_heard_and_its_latency_given_back() {
    let rows = play(Scenario::Stall);
    assert_eq!(rows.len(), 2);
    for r in &rows {
        let h = &r.heard;
        let (from, to) = r.event.expect("the stall began");
        assert!(
            from > listener_support::SKIP_SECONDS && to < SECONDS - 2.0,
            "the stall at {from:.2} s falls outside the run: {}",
            describe(r)
        );
        // The stall is there to be heard: 200 ms without packets is concealed or silent.
        let win = netjam_engine::listen::WINDOW_SECONDS;
        assert!(
            h.glitches_at
                .iter()
                .any(|&at| at + win > from - 0.3 && at < to + 1.0),
            "player {} heard no glitch at the stall: {}",
            r.listener,
            describe(r)
        );
        let db = h.levels_db[0].1;
        assert!(
            (-3.0..1.0).contains(&db),
            "player {} heard the other at {db:+.1} dB of what was sent: {}",
            r.listener,
            describe(r)
        );
        let ghost = h.ghost_db.expect("an absent tone was named");
        assert!(
            ghost < GHOST_DB,
            "player {} hears itself: {}",
            r.listener,
            describe(r)
        );
        let l = r.latency;
        let (before, after) = (
            l.before_ms.expect("latency before the stall"),
            l.after_ms.expect("latency after the stall"),
        );
        // The goal is within 0.5 ms of before, 1 s after; what holds on a loaded machine
        // today is that the 200 ms held in the stall is not kept.
        assert!(
            after < before + STALL_KEPT_MS,
            "player {}: {after:.1} ms added 1 s after the stall, {before:.1} ms before: {}",
            r.listener,
            describe(r)
        );
    }
}

/// Latency still added 1 s after the stall beyond what it was before, ms: a quarter of the
/// stall (what a buffer that kept the stall's backlog would hold, 200 ms, is far above).
const STALL_KEPT_MS: f64 = listener_support::STALL_MS / 4.0;
