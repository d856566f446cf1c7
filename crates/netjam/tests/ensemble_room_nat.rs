//! The ensemble through a rooms server with its members behind home routers (the NAT
//! lab, `common/natlab.rs`): two homes behind cone routers and one behind a
//! port-randomising router, the server in the public namespace. Members that know only
//! the server and the ensemble's name find each other, a message reaches its service
//! across two routers, and a message timed ahead fires on all three together: the
//! server relays every ensemble datagram, so no router kind is left out.
//!
//! Needs root for the namespaces; without it the test says why and returns (skips). The
//! lab's namespaces share the machine's monotonic clock, so the firings' spread is true.
//! Every wait is bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod ensemble_support;

use std::time::Instant;

use common::free_udp_port;
use common::natlab::{NatLab, RouterKind};
use ensemble_support::{ens_ns, field, spawn, Proc, NETJAM};

const SERVICES: [&str; 3] = ["keys", "bass", "drums"];

#[test]
fn members_behind_cone_and_port_randomising_routers_meet_through_the_server() {
    let Some(lab) = NatLab::build_or_skip(&[RouterKind::Cone, RouterKind::Cone, RouterKind::Symmetric])
    else {
        return;
    };
    let server = format!("{}:{}", lab.server_ip, free_udp_port());
    let name = format!("natband-{}", std::process::id());
    let _server =
        spawn(
            lab.command(&lab.public, NETJAM)
                .args(["server", "--listen", &server, "--duration", "60"]),
        );
    let t0 = Instant::now();
    let members: Vec<Proc> = lab
        .homes
        .iter()
        .zip(SERVICES)
        .map(|(h, s)| {
            spawn(lab.command(&h.ns, NETJAM).args([
                "ensemble",
                "join",
                &name,
                "--server",
                &server,
                "--service",
                s,
            ]))
        })
        .collect();
    for m in &members {
        m.wait_for("full service table", |l| {
            l.starts_with("services ") && SERVICES.iter().all(|s| l.contains(&format!(" {s}@")))
        });
        m.wait_for("the server's clock", |l| l == "clock-locked server");
    }
    println!(
        "three members behind cone, cone and port-randomising routers found each other and locked in {:?}",
        t0.elapsed()
    );
    let send = |home: usize, args: &[&str]| {
        let out = lab
            .command(&lab.homes[home].ns, NETJAM)
            .args(["ensemble", "send", &name, "--server", &server, "--wait", "10"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    // From behind the port-randomising router to a member behind a cone router.
    send(2, &["/bass/cutoff", "f:440"]);
    let got = members[1].wait_for("the message at bass", |l| l.contains("/bass/cutoff"));
    assert!(got.contains("f:440"), "{got}");
    send(
        0,
        &[
            "/keys/go",
            "--also",
            "/bass/go",
            "--also",
            "/drums/go",
            "--at",
            "+0.3s",
        ],
    );
    let monos: Vec<u64> = members
        .iter()
        .map(|m| {
            let l = m.wait_for("timed message", |l| l.contains("/go "));
            assert!(ens_ns(&field(&l, "ens=")) >= ens_ns(&field(&l, "at=")), "{l}");
            field(&l, "mono=").parse().unwrap()
        })
        .collect();
    let spread = monos.iter().max().unwrap() - monos.iter().min().unwrap();
    println!(
        "timed message across the routers: spread {:.3} ms",
        spread as f64 / 1e6
    );
    assert!(spread < 50_000_000, "spread {spread} ns");
}
