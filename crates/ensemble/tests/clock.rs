//! The ensemble clock in virtual time over the link model: a member whose clock runs
//! ±200 ppm off the reference's, seconds apart, estimates the reference over paths with
//! symmetric and one-way jitter, loss and a delay step. The true reference time is known
//! at every instant, so the exported ensemble time's error is measured exactly.
//!
//! Figures (p50/p99/max error, time to converge) are printed; run with `--nocapture`.

mod common;

use common::{MS, S};
use netjam_engine::link::{JitterDist, LinkConfig, LinkModel, LinkSchedule};
use netjam_ensemble::clock::{ClockClient, ClockConfig, ClockServer, ProbeReply, ProbeRequest};

/// Reference time at virtual time 0.
const REF0: u64 = 10 * S;
/// Member local time at virtual time 0: 3.7 s behind the reference.
const LOCAL0: u64 = 6_300 * MS;
/// Error samples are taken from here on for the percentiles.
const SETTLE: u64 = 60 * S;

struct Scenario {
    name: &'static str,
    ppm: f64,
    up: LinkConfig,
    down: LinkConfig,
    up_events: &'static str,
    seed: u64,
    duration: u64,
}

#[derive(Debug)]
struct Outcome {
    /// |error| in ns from SETTLE on, sorted.
    errors: Vec<u64>,
    /// After the first lock: the time after which |error| stays under 1 ms.
    converged_at: u64,
    /// After the first lock: the time after which |error| stays under 0.5 ms.
    converged_half_at: u64,
    locked_at: u64,
    /// Samples (from the lock on) whose |error| exceeded the reported bound.
    over_bound: usize,
    /// Largest |error − bound| excess seen, ns (0 if none).
    worst_excess: u64,
    steps: u64,
    /// Largest |exported rate − true rate| over 1 s spans, minus the rate estimate's own
    /// error, in ppm: the slew actually applied.
    max_slew_ppm: f64,
    /// Largest change of the error over one 1 ms tick, ns.
    max_jump_ns: u64,
    exchanges: u64,
    error_bound_ns: u64,
    /// Signed error at the end of the run, ns.
    final_error_ns: i128,
}

fn local_at(t: u64, ppm: f64) -> u64 {
    (LOCAL0 as i128 + t as i128 + (t as f64 * ppm * 1e-6).round() as i128) as u64
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / MS as f64
}

fn run(sc: &Scenario, config: &ClockConfig) -> Outcome {
    let ppm = sc.ppm;
    let true_rate_ppm = (1.0 / (1.0 + ppm * 1e-6) - 1.0) * 1e6;
    let mut up: LinkModel<Vec<u8>> = LinkModel::new(sc.up.clone(), sc.seed);
    if !sc.up_events.is_empty() {
        up.set_schedule(LinkSchedule::parse(sc.up_events).expect("schedule"));
        up.set_event_origin(0);
    }
    let mut down: LinkModel<Vec<u8>> = LinkModel::new(sc.down.clone(), sc.seed + 1000);
    let mut client = ClockClient::new(config.clone());
    let mut server = ClockServer::new();
    let mut buf = [0u8; 64];
    let mut out = Outcome {
        errors: Vec::new(),
        converged_at: 0,
        converged_half_at: 0,
        locked_at: 0,
        over_bound: 0,
        worst_excess: 0,
        steps: 0,
        max_slew_ppm: 0.0,
        max_jump_ns: 0,
        exchanges: 0,
        error_bound_ns: 0,
        final_error_ns: 0,
    };
    let mut prev: Option<(u64, i128, u64)> = None; // (ensemble, error, steps)
    let mut span_start: Option<(u64, u64, f64)> = None; // (t, ensemble, rate error ppm)
    let mut locked = None;
    let mut t = 0u64;
    while t <= sc.duration {
        let l = local_at(t, ppm);
        while let Some(req) = client.poll_transmit(l) {
            let n = req.encode(&mut buf).expect("encode ping");
            up.send(t, buf[..n].to_vec(), n);
        }
        while let Some((at, bytes)) = up.poll(t) {
            let req = ProbeRequest::decode(&bytes).expect("ping decodes");
            let rep = server.answer(REF0 + at, &req);
            let n = rep.encode(&mut buf).expect("encode pong");
            down.send(at, buf[..n].to_vec(), n);
        }
        while let Some((at, bytes)) = down.poll(t) {
            let rep = ProbeReply::decode(&bytes).expect("pong decodes");
            client.handle_reply(local_at(at, ppm), &rep);
        }
        if let Some(e) = client.ensemble_time(l) {
            let st = client.stats();
            locked.get_or_insert(t);
            let err = e as i128 - (REF0 + t) as i128;
            let abs = err.unsigned_abs() as u64;
            if abs > MS {
                out.converged_at = t + MS;
            }
            if abs > MS / 2 {
                out.converged_half_at = t + MS;
            }
            if abs > st.error_bound_ns {
                out.over_bound += 1;
                out.worst_excess = out.worst_excess.max(abs - st.error_bound_ns);
            }
            if t >= SETTLE {
                out.errors.push(abs);
            }
            if let Some((pe, perr, psteps)) = prev {
                if st.steps == psteps {
                    assert!(e >= pe, "{}: ensemble time went back at {t}", sc.name);
                    out.max_jump_ns = out.max_jump_ns.max((err - perr).unsigned_abs() as u64);
                } else {
                    span_start = None;
                }
            }
            prev = Some((e, err, st.steps));
            out.final_error_ns = err;
            let rate_err = (st.rate_ppm - true_rate_ppm).abs();
            match span_start {
                Some((t0, e0, r0)) if t - t0 >= S => {
                    // Exported rate against the reference clock, in ppm.
                    let exported = ((e - e0) as f64 / (t - t0) as f64 - 1.0) * 1e6;
                    let slew = exported.abs() - rate_err.max(r0);
                    out.max_slew_ppm = out.max_slew_ppm.max(slew);
                    span_start = Some((t, e, rate_err));
                }
                None => span_start = Some((t, e, rate_err)),
                _ => {}
            }
            out.steps = st.steps;
        }
        t += MS;
    }
    out.errors.sort_unstable();
    out.locked_at = locked.unwrap_or(u64::MAX);
    let st = client.stats();
    out.exchanges = st.exchanges;
    out.error_bound_ns = st.error_bound_ns;
    println!(
        "{:<28} {:+4.0} ppm: error p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms (from {} s); locked at {:.1} s, within 1 ms from {:.1} s, 0.5 ms from {:.1} s; bound now {:.2} ms, over bound {} samples (worst by {:.3} ms); steps {}; slew ≤ {:.0} ppm; largest 1 ms change {} ns; {} exchanges; rate est {:+.1} ppm (true {:+.1}); final error {:+.3} ms",
        sc.name,
        ppm,
        pct(&out.errors, 0.5),
        pct(&out.errors, 0.99),
        pct(&out.errors, 1.0),
        SETTLE / S,
        out.locked_at as f64 / S as f64,
        out.converged_at.max(out.locked_at) as f64 / S as f64,
        out.converged_half_at.max(out.locked_at) as f64 / S as f64,
        out.error_bound_ns as f64 / MS as f64,
        out.over_bound,
        out.worst_excess as f64 / MS as f64,
        out.steps,
        out.max_slew_ppm,
        out.max_jump_ns,
        out.exchanges,
        st.rate_ppm,
        true_rate_ppm,
        out.final_error_ns as f64 / MS as f64,
    );
    out
}

/// Seattle to Vermont, 19 ms one way, with `jitter_ns` of normal jitter and `loss`.
fn path(jitter_ns: u64, loss: f64) -> LinkConfig {
    common::path(19 * MS, jitter_ns, loss, 0.0)
}

/// Checks every scenario shares: one step (the lock), monotonic (asserted in `run`),
/// the slew within its bound, no jump.
fn assert_common(sc: &Scenario, o: &Outcome, config: &ClockConfig) {
    assert_eq!(o.steps, 1, "{}: only the first lock may step", sc.name);
    // 1 ppm of slack for the 1 ns rounding of the exported time over a 1 s span.
    assert!(
        o.max_slew_ppm <= config.max_slew_ppm + 1.0,
        "{}: slew {:.1} ppm",
        sc.name,
        o.max_slew_ppm
    );
    // Over 1 ms the error moves by at most (rate error + slew) × 1 ms; 2 µs is 2000 ppm.
    assert!(
        o.max_jump_ns <= 2_000,
        "{}: error jumped {} ns in 1 ms",
        sc.name,
        o.max_jump_ns
    );
    assert!(o.locked_at < 2 * S, "{}: locked at {} ns", sc.name, o.locked_at);
}

#[test]
fn symmetric_jitter_converges_below_half_a_millisecond() {
    let config = ClockConfig::default();
    for (ppm, seed) in [(200.0, 1), (-200.0, 2), (200.0, 3), (-200.0, 4)] {
        let sc = Scenario {
            name: "symmetric 19 ms ± 1.5 ms",
            ppm,
            up: path(1_500_000, 0.0),
            down: path(1_500_000, 0.0),
            up_events: "",
            seed,
            duration: 240 * S,
        };
        let o = run(&sc, &config);
        assert_common(&sc, &o, &config);
        assert!(
            pct(&o.errors, 0.99) < 0.5,
            "{}: p99 {:.3} ms",
            sc.name,
            pct(&o.errors, 0.99)
        );
        assert!(o.converged_at < 30 * S, "converged at {} s", o.converged_at / S);
        assert!(
            o.converged_half_at < SETTLE,
            "converged at {} s",
            o.converged_half_at / S
        );
        assert_eq!(o.over_bound, 0, "error beyond the reported bound");
    }
}

#[test]
fn five_percent_loss_both_ways_changes_little() {
    let config = ClockConfig::default();
    for (ppm, seed) in [(200.0, 5), (-200.0, 6)] {
        let sc = Scenario {
            name: "symmetric + 5 % loss",
            ppm,
            up: path(1_500_000, 0.05),
            down: path(1_500_000, 0.05),
            up_events: "",
            seed,
            duration: 240 * S,
        };
        let o = run(&sc, &config);
        assert_common(&sc, &o, &config);
        assert!(
            pct(&o.errors, 0.99) < 0.5,
            "{}: p99 {:.3} ms",
            sc.name,
            pct(&o.errors, 0.99)
        );
        assert!(o.converged_at < 30 * S, "converged at {} s", o.converged_at / S);
        assert_eq!(o.over_bound, 0, "error beyond the reported bound");
    }
}

#[test]
fn one_way_jitter_stays_within_the_reported_bound() {
    let config = ClockConfig::default();
    for (ppm, seed, dist) in [(200.0, 7, JitterDist::Normal), (-200.0, 8, JitterDist::Pareto)] {
        let sc = Scenario {
            name: if dist == JitterDist::Normal {
                "one-way normal 1.5 ms"
            } else {
                "one-way pareto 3 ms"
            },
            ppm,
            up: LinkConfig {
                jitter_dist: dist,
                jitter_ns: if dist == JitterDist::Normal {
                    1_500_000
                } else {
                    3_000_000
                },
                ..path(0, 0.0)
            },
            down: path(0, 0.0),
            up_events: "",
            seed,
            duration: 240 * S,
        };
        let o = run(&sc, &config);
        assert_common(&sc, &o, &config);
        assert_eq!(o.over_bound, 0, "{}: error beyond the reported bound", sc.name);
        // Measured: the min-RTT filter keeps the bias of one-way jitter under a millisecond.
        assert!(
            pct(&o.errors, 0.99) < 1.0,
            "{}: p99 {:.3} ms",
            sc.name,
            pct(&o.errors, 0.99)
        );
    }
}

#[test]
fn a_one_way_delay_step_is_slewed_not_jumped() {
    let config = ClockConfig::default();
    for (ppm, seed) in [(200.0, 9), (-200.0, 10)] {
        let sc = Scenario {
            name: "+10 ms one way at 120 s",
            ppm,
            up: path(1_500_000, 0.0),
            down: path(1_500_000, 0.0),
            up_events: "120s:delay=+10ms",
            seed,
            duration: 300 * S,
        };
        let o = run(&sc, &config);
        assert_common(&sc, &o, &config);
        assert_eq!(o.over_bound, 0, "{}: error beyond the reported bound", sc.name);
        // A constant 10 ms asymmetry is invisible to round trips: the estimate moves by
        // half of it, 5 ms, and no further.
        // While the old low-RTT exchanges leave the window the fit mixes both levels and
        // its rate overshoots for a while (measured: 7.2 ms at most).
        let max = pct(&o.errors, 1.0);
        assert!(max < 10.0, "{}: max error {max:.3} ms", sc.name);
        let end = o.final_error_ns as f64 / MS as f64;
        assert!((4.0..6.0).contains(&end), "{}: settled at {end:.3} ms", sc.name);
    }
}
