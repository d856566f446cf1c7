//! The listener table (issue 22, item 6): scenarios a listener would notice, played by real
//! `netjam` processes on loopback and judged by the listener's measure
//! (`netjam_engine::listen`); prints one table.
//!
//! Run: `cargo bench -p netjam --bench listener [-- [--runs N] [--only NAME,...] [--busy]
//! [--keep DIR]]` (or NETJAM_LISTENER_RUNS, NETJAM_LISTENER_ONLY, NETJAM_LISTENER_KEEP). N
//! defaults to 3; NAME is one of p2p, room4, room4-web (room4 with every page open),
//! room4-private (room4 with a password: every stream sealed), stall,
//! step, leave-join; `--busy` keeps one core
//! spinning for the whole series. Each run of a scenario plays 10–12 s; the default series
//! takes about 3 minutes on two cores (the first `cargo bench` also builds the bench
//! profile, several minutes more). It prints the load average before and after: other work
//! on a shared machine moves every figure. Runs are interleaved (every scenario once, then again), so a change in the
//! machine's load hits every scenario alike. Files go to a temporary directory, removed at
//! the end unless `--keep DIR` names one.
//!
//! A cargo bench target rather than a script beside scripts/bench-jack-roundtrip: the
//! measure is Rust (`listen`) and so is reading the `--stats-json` series, and the
//! scenarios are the same code the test `tests/listener_scenarios.rs` asserts bounds on
//! (`tests/listener_support`), so the figures a test checks and the figures this prints
//! cannot drift apart. Cargo builds it in the release profile, with the release binary.
//!
//! The scenarios, the columns and how each figure is read are described in
//! `tests/listener_support/mod.rs`.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/listener_support/mod.rs"]
mod listener_support;

use std::path::PathBuf;
use std::process::{Command, Stdio};

use listener_support::{describe, print_table, Row, Scenario};

fn arg(args: &[String], name: &str, env: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| std::env::var(env).ok().filter(|v| !v.is_empty()))
}

/// One core kept busy by a shell loop, stopped on drop.
struct Busy(std::process::Child);

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The machine's load averages (1, 5, 15 min), where Linux says them: other work on a
/// shared machine moves every figure.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = arg(&args, "--runs", "NETJAM_LISTENER_RUNS")
        .map(|n| n.parse().expect("--runs takes a number"))
        .unwrap_or(3)
        .max(1);
    let only = arg(&args, "--only", "NETJAM_LISTENER_ONLY");
    let scenarios: Vec<Scenario> = Scenario::ALL
        .into_iter()
        .filter(|s| {
            only.as_deref()
                .map_or(true, |o| o.split(',').any(|n| n == s.name()))
        })
        .collect();
    assert!(
        !scenarios.is_empty(),
        "--only names none of: {}",
        Scenario::ALL.map(Scenario::name).join(", ")
    );
    let keep = arg(&args, "--keep", "NETJAM_LISTENER_KEEP").map(PathBuf::from);
    let dir = keep.clone().unwrap_or_else(|| common::tmp_dir("bench-listener"));
    let busy = args.iter().any(|a| a == "--busy").then(|| {
        Busy(
            Command::new("bash")
                .args(["-c", "while :; do :; done"])
                .stdout(Stdio::null())
                .spawn()
                .expect("bash for --busy"),
        )
    });
    eprintln!(
        "bench listener: {runs} run(s) of {}{}; files in {}",
        scenarios.iter().map(|s| s.name()).collect::<Vec<_>>().join(", "),
        if busy.is_some() { ", one core busy" } else { "" },
        dir.display()
    );
    let load_before = load_average();
    // rows[run] holds that run's rows, scenario after scenario.
    let mut rows: Vec<Vec<Row>> = Vec::with_capacity(runs);
    for run in 0..runs {
        let mut this = Vec::new();
        for &s in &scenarios {
            let got = s.run(&dir.join(format!("{}-{run}", s.name())));
            for r in &got {
                eprintln!("run {run}: {}", describe(r));
            }
            this.extend(got);
        }
        rows.push(this);
    }
    drop(busy);
    print_table(&rows);
    println!("load average before: {load_before}; after: {}", load_average());
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
