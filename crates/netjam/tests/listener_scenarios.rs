//! Scenarios a listener would notice, in real processes on loopback (issue 22, item 6),
//! judged by the listener's measure: a four-player room, and a 200 ms stall through
//! `netjam impair` between two peers. The scenarios are tests/listener_support's, which the
//! bench `benches/listener.rs` prints as a table; each test prints the same figures.
//!
//! It asserts only what holds on a loaded 2-core machine (checked with one core spinning,
//! and with both busy): every player hears each of the others near the level sent and not
//! itself, and the stalled stream's latency comes back within seconds. Pitch, glitch
//! windows and the latency 1 s after the stall are printed, not judged here: their goals
//! (issue 22: ±2 cents, no glitch away from an event, back within 0.5 ms in 1 s) are not
//! met yet on a loaded machine.
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
        // Somewhere the three are heard as steady tones for a second (ten windows): a mix
        // that glitched all along (clipping, a wrong stream) fails here whatever the load.
        let clean = h.windows - h.glitches_at.len();
        assert!(
            clean >= 10,
            "player {}: only {clean} of {} windows without a glitch: {}",
            r.listener,
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
        // The stall reaches the listener: 200 ms without packets is concealed or silent
        // where the buffer runs dry, or is held as added latency where it does not (a
        // machine that was too busy a moment before can leave it 100 ms deep).
        let win = netjam_engine::listen::WINDOW_SECONDS;
        let glitched = h
            .glitches_at
            .iter()
            .any(|&at| at + win > from - 0.3 && at < to + 1.0);
        let l = r.latency;
        let held = l
            .peak_ms
            .zip(l.before_ms)
            .is_some_and(|(peak, before)| peak > before + STALL_KEPT_MS);
        assert!(
            glitched || held,
            "player {} neither heard a glitch at the stall nor held it as latency: {}",
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
        let before = l.before_ms.expect("latency before the stall");
        // The goal is back within 0.5 ms in 1 s (printed as "back s"); a loaded machine
        // today keeps the stall's 200 ms for up to about 2 s. What must hold: the backlog is
        // given back within seconds (back_after looks 3 s ahead), not kept for the rest of
        // the session.
        let back = listener_support::back_after(&r.series, to, before, STALL_KEPT_MS);
        assert!(
            back.is_some(),
            "player {}: latency not back within {STALL_KEPT_MS} ms of the {before:.1} ms before \
             the stall {} s after it: {}",
            r.listener,
            listener_support::BACK_HORIZON_S,
            describe(r)
        );
    }
}

/// Latency beyond what it was before the stall that counts as the stall's backlog still
/// kept, ms: a quarter of the stall (a buffer that kept the backlog holds all 200 ms).
const STALL_KEPT_MS: f64 = listener_support::STALL_MS / 4.0;

/// How "back" is read from a series, on made-up series: a backlog given back 1.5 s after
/// the event, one kept, a one-interval misreading that is not taken for latency kept, and a
/// rise more than a second after the latency came back.
#[test]
fn latency_is_back_where_it_stays_back() {
    let series = |kept_until: f64, blip_at: Option<f64>| -> Vec<(f64, f64)> {
        (1..=100)
            .map(|k| {
                let t = f64::from(k) / 10.0;
                let blip = blip_at.is_some_and(|b| (t - b).abs() < 0.05);
                let ms = if (4.0..kept_until).contains(&t) || blip {
                    200.0
                } else {
                    3.0
                };
                (t, ms)
            })
            .collect()
    };
    let back = |s: &[(f64, f64)]| listener_support::back_after(s, 4.0, 3.0, 0.5);
    let given_back = back(&series(5.5, None)).expect("given back");
    assert!((given_back - 1.5).abs() < 0.15, "{given_back}");
    assert_eq!(back(&series(20.0, None)), None);
    assert_eq!(back(&series(0.0, Some(5.0))), Some(0.0));
    assert_eq!(back(&series(0.0, None)), Some(0.0));
    let late_rise: Vec<(f64, f64)> = series(4.5, None)
        .into_iter()
        .map(|(t, ms)| (t, if t > 6.0 { 200.0 } else { ms }))
        .collect();
    let b = back(&late_rise).expect("back before the rise");
    assert!((b - 0.5).abs() < 0.15, "{b}");
}
