//! An output path that cannot be written is refused at once, naming the path, before any
//! stream starts: `recv` does not sit waiting for a sender, `jam` sends nothing.

mod common;

use std::net::UdpSocket;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Proc, BIN};

const MISSING: &str = "/no/such/dir/netjam-out";

/// Runs `netjam ARGS`, which must fail within a few seconds (on a loaded machine) and say
/// which path it cannot write; returns what it printed.
fn refused(args: &[&str], path: &str) -> String {
    let start = Instant::now();
    let mut p = Proc::spawn_lines(Command::new(BIN).args(args).stdout(Stdio::null()), "netjam");
    let (status, lines) = p.finish(Duration::from_secs(5));
    let text = lines.join("\n");
    assert!(!status.success(), "netjam {args:?} succeeded: {text}");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert!(text.contains(path), "the message does not name {path}: {text}");
    assert!(
        text.contains("directory exists"),
        "the message does not say what to do: {text}"
    );
    text
}

#[test]
fn recv_refuses_an_output_in_a_missing_directory_at_once() {
    let wav = format!("{MISSING}/x.wav");
    refused(&["recv", "--listen", "127.0.0.1:0", "--output", &wav], &wav);
    let json = format!("{MISSING}/stats.json");
    refused(
        &[
            "recv",
            "--listen",
            "127.0.0.1:0",
            "--stdout",
            "--stats-json",
            &json,
        ],
        &json,
    );
}

#[test]
fn jam_refuses_an_output_in_a_missing_directory_before_sending() {
    // A peer that must hear nothing: the stream never starts.
    let peer = UdpSocket::bind("127.0.0.1:0").expect("bind");
    peer.set_nonblocking(true).expect("nonblocking");
    let to = peer.local_addr().expect("addr").to_string();
    let json = format!("{MISSING}/jam.json");
    let head = ["jam", "--peer", &to, "--listen", "127.0.0.1:0", "--sine", "440"];
    refused(&[&head[..], &["--stats-json", &json]].concat(), &json);
    let wav = format!("{MISSING}/heard.wav");
    refused(&[&head[..], &["--output", &wav]].concat(), &wav);
    let mut buf = [0u8; 2048];
    assert!(peer.recv(&mut buf).is_err(), "jam sent a packet");
}

#[test]
fn demo_refuses_an_output_in_a_missing_directory() {
    let wav = format!("{MISSING}/demo.wav");
    refused(&["demo", "--duration", "1", "--output", &wav], &wav);
}
