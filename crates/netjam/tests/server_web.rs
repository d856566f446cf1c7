//! `netjam server --web`, the operator's read-only page, in a real browser and at the wire:
//!
//! * headless Chromium (Debian's `chromium`, which scripts/deps installs; nothing here
//!   downloads a browser) opens the printed URL while three `jam --server` players sit in
//!   one room, and the page it renders lists the room and the three by name; a WebSocket
//!   client counts the snapshots pushed in a few seconds (the page's update rate);
//! * a page from another origin (a `file://` page in the same browser) cannot open the
//!   WebSocket, nor can a handshake naming another site's `Origin` or `Host` (`403`);
//! * a page bound to a non-loopback address is refused without the token printed at start
//!   and served with it;
//! * an address the page cannot have is said before the server starts.
//!
//! Loopback only, ephemeral ports, every wait bounded; the figures seen are printed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{sine_player, tmp, tmp_dir, Proc, BIN};

/// How long any one step may take on a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(60);
const CHROMIUM: &str = "/usr/bin/chromium";

/// `netjam server --web WEB` on a free loopback port: the process, its rooms address
/// and the page's URL as printed.
fn server_with_page(web: &str) -> (Proc, SocketAddr, String) {
    let server = Proc::spawn_lines(
        Command::new(BIN).args([
            "server",
            "--listen",
            "127.0.0.1:0",
            "--web",
            web,
            "--duration",
            "120",
        ]),
        "netjam server",
    );
    let line = server.line_with("serving rooms", WAIT);
    let addr = line
        .split_whitespace()
        .nth(4)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    let line = server.line_with("the server's page:", WAIT);
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_owned();
    (server, addr, url)
}

/// `host:port` of a URL printed as `http://HOST:PORT/...`.
fn host_of(url: &str) -> &str {
    url.trim_start_matches("http://").split('/').next().unwrap()
}

fn player(server: SocketAddr, name: &str, hz: &str) -> Proc {
    Proc::spawn_lines(
        sine_player(server, name, hz, "90")
            .arg("--via-server")
            .arg("--output")
            .arg(tmp("server-web", &format!("{name}.wav")))
            .stdout(Stdio::null()),
        "jam --server",
    )
}

/// Sends `request` and returns what comes back: up to the end of the head for a `101`,
/// everything until the server closes otherwise.
fn http(host: &str, request: &str) -> String {
    let mut s = TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        if got.starts_with(b"HTTP/1.1 101") && got.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn get(host: &str, target: &str) -> String {
    http(host, &format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n"))
}

fn handshake(connect_to: &str, target: &str, host: &str, origin: Option<&str>) -> String {
    let origin = origin.map(|o| format!("Origin: {o}\r\n")).unwrap_or_default();
    http(
        connect_to,
        &format!(
            "GET {target} HTTP/1.1\r\nHost: {host}\r\n{origin}Upgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
        ),
    )
}

fn status(answer: &str) -> &str {
    answer.lines().next().unwrap_or("")
}

/// Whether Chromium is here; says why not when it is not.
fn have_chromium() -> bool {
    let here = Path::new(CHROMIUM).exists();
    if !here {
        eprintln!("skipped: {CHROMIUM} is missing (scripts/deps installs Debian's chromium)");
    }
    here
}

/// Headless Chromium's DOM of `url` after `budget_ms` of virtual time (its own profile,
/// so tests running at once do not hand their pages to each other's browser), and how
/// long it took.
fn chromium_dom(url: &str, budget_ms: u32, profile: &str) -> (String, Duration) {
    let started = Instant::now();
    let dir = tmp_dir(&format!("server-web-{profile}"));
    let out = tmp(&format!("server-web-{profile}"), "dom.html");
    let mut browser = Proc::spawn(
        Command::new(CHROMIUM)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
            .arg(format!("--user-data-dir={}", dir.join("profile").display()))
            .arg(format!("--virtual-time-budget={budget_ms}"))
            .args(["--dump-dom", url])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null()),
        "chromium",
    );
    let exit = browser.wait_for(Duration::from_secs(120));
    assert!(exit.success(), "chromium failed: {exit}");
    (std::fs::read_to_string(&out).unwrap(), started.elapsed())
}

#[test]
fn chromium_shows_the_room_and_its_members() {
    if !have_chromium() {
        return;
    }
    let (mut server, addr, url) = server_with_page("127.0.0.1:0");
    assert!(!url.contains("token"), "a loopback page needs no token: {url}");
    let players: Vec<Proc> = [("ana", "220"), ("bo", "330"), ("cy", "440")]
        .into_iter()
        .map(|(name, hz)| {
            let p = player(addr, name, hz);
            p.line_with("in room", WAIT);
            p
        })
        .collect();

    // The page as the server sends it, and the first snapshot over the WebSocket.
    let host = host_of(&url);
    let started = Instant::now();
    let page = get(host, "/");
    let page_ms = started.elapsed().as_secs_f64() * 1e3;
    assert!(status(&page).contains("200"), "{page}");
    assert!(page.contains("<title>netjam server</title>"));
    let (mut ws, _) = tungstenite::client::connect(format!("ws://{host}/ws")).unwrap();
    // A server that stops pushing fails the test rather than hanging it.
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = ws.get_ref() {
        s.set_read_timeout(Some(WAIT)).unwrap();
    }
    let mut snapshots = 0;
    let mut first_ms = None;
    let mut seen_three = false;
    let deadline = Instant::now() + WAIT;
    let mut window: Option<Instant> = None;
    // Snapshots until all three are listed, then four seconds more to count the rate.
    while window.map_or(true, |w| w.elapsed() < Duration::from_secs(4)) {
        assert!(Instant::now() < deadline, "no snapshot listed ana, bo and cy");
        let text = match ws.read().unwrap() {
            tungstenite::Message::Text(t) => t.to_string(),
            _ => continue,
        };
        let msg: serde_json::Value = serde_json::from_str(&text).unwrap();
        if msg["type"] != "snapshot" {
            continue;
        }
        first_ms.get_or_insert(started.elapsed().as_secs_f64() * 1e3);
        if window.is_some() {
            snapshots += 1;
        }
        let rooms = msg["rooms"].as_array().unwrap();
        let names: Vec<&str> = rooms
            .iter()
            .filter(|r| r["name"] == "band")
            .flat_map(|r| r["members"].as_array().unwrap())
            .map(|m| m["name"].as_str().unwrap())
            .collect();
        if !seen_three && names.len() == 3 {
            seen_three = true;
            window = Some(Instant::now());
        }
    }
    let rate = f64::from(snapshots) / 4.0;
    drop(ws);
    // The server publishes a report every 250 ms: 16 in four seconds; a loaded machine
    // may delay a few.
    assert!(rate >= 2.0, "{rate} snapshots a second");

    // Virtual time runs ahead while nothing is loading, so a budget can end before the
    // WebSocket's first message arrives on a busy machine: longer budgets are tried.
    let mut tries = Vec::new();
    let (dom, took) = loop {
        let budget = [3000, 6000, 12000, 20000][tries.len()];
        let (dom, took) = chromium_dom(&url, budget, "page");
        tries.push(format!(
            "{budget} ms of virtual time in {:.1} s",
            took.as_secs_f64()
        ));
        if dom.contains(r#"data-member="cy""#) || tries.len() == 4 {
            break (dom, took);
        }
    };
    eprintln!("chromium: {tries:?}");
    eprintln!(
        "figures: page {page_ms:.1} ms, first snapshot {:.1} ms after the request; {rate:.2} snapshots/s over 4 s; chromium rendered the page in {:.1} s",
        first_ms.unwrap(),
        took.as_secs_f64()
    );
    assert!(
        dom.contains(r#"data-room="band""#),
        "the page lists no room band: {dom}"
    );
    for name in ["ana", "bo", "cy"] {
        assert!(
            dom.contains(&format!(r#"data-member="{name}""#)),
            "the page does not list {name}: {dom}"
        );
    }
    assert!(
        dom.contains("via server to"),
        "the page says no member's path: {dom}"
    );
    drop(players);
    assert!(server.running(), "the server died: {:?}", server.drain_lines());
}

#[test]
fn a_page_from_another_origin_cannot_read_the_server() {
    let (server, _, url) = server_with_page("127.0.0.1:0");
    let host = host_of(&url);
    let own = format!("http://{host}");
    assert!(status(&handshake(host, "/ws", host, Some(&own))).contains("101"));
    assert!(
        status(&handshake(host, "/ws", host, None)).contains("101"),
        "a program sends no Origin"
    );
    for foreign in ["http://evil.example", "null", "http://127.0.0.1:1"] {
        let answer = handshake(host, "/ws", host, Some(foreign));
        assert!(status(&answer).contains("403"), "{foreign}: {answer}");
    }
    // A site that rebinds its own name to 127.0.0.1 names itself as the host.
    let port = host.rsplit_once(':').unwrap().1;
    let rebound = format!("evil.example:{port}");
    let answer = handshake(host, "/ws", &rebound, Some(&format!("http://{rebound}")));
    assert!(status(&answer).contains("403"), "{answer}");
    assert!(status(&get(host, "/nowhere")).contains("404"));

    // In a browser: a page opened from a file tries the WebSocket and says what happened.
    if !have_chromium() {
        return;
    }
    let foreign = tmp("server-web", "foreign.html");
    std::fs::write(
        &foreign,
        format!(
            r#"<!doctype html><body><script>
const ws = new WebSocket("ws://{host}/ws");
ws.onopen = () => {{ document.body.dataset.result = "opened"; }};
ws.onmessage = () => {{ document.body.dataset.result = "read"; }};
ws.onerror = () => {{ document.body.dataset.result = "refused"; }};
</script></body>"#
        ),
    )
    .unwrap();
    // As above: a budget can end before the handshake's answer on a busy machine, with no
    // result yet; longer ones are tried until the page says one.
    let mut dom = String::new();
    for budget in [2000, 6000, 12000, 20000] {
        dom = chromium_dom(&format!("file://{}", foreign.display()), budget, "foreign").0;
        if dom.contains("data-result=") {
            break;
        }
    }
    assert!(dom.contains(r#"data-result="refused""#), "{dom}");
    drop(server);
}

#[test]
fn a_page_on_another_address_needs_its_token() {
    let (server, _, url) = server_with_page("0.0.0.0:0");
    let token = url
        .split_once("?token=")
        .map(|(_, t)| t)
        .expect("a token in the URL");
    assert_eq!(token.len(), 32, "{url}");
    let host = host_of(&url);
    assert!(status(&get(host, "/")).contains("403"));
    assert!(status(&get(host, "/?token=0123456789abcdef0123456789abcdef")).contains("403"));
    let page = get(host, &format!("/?token={token}"));
    assert!(status(&page).contains("200"), "{page}");
    let own = format!("http://{host}");
    assert!(status(&handshake(host, "/ws", host, Some(&own))).contains("403"));
    assert!(status(&handshake(host, &format!("/ws?token={token}"), host, Some(&own))).contains("101"));
    // Any name for the host will do once the token is given.
    assert!(status(&handshake(
        host,
        &format!("/ws?token={token}"),
        "rooms.example.org",
        Some("http://rooms.example.org")
    ))
    .contains("101"));
    drop(server);
}

#[test]
fn an_address_the_page_cannot_have_is_said_before_the_server_starts() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let at = taken.local_addr().unwrap().to_string();
    for (web, says) in [
        (at.as_str(), "in use"),
        ("192.0.2.1:0", "not an address of this machine"),
    ] {
        let mut server = Proc::spawn_lines(
            Command::new(BIN).args([
                "server",
                "--listen",
                "127.0.0.1:0",
                "--web",
                web,
                "--duration",
                "30",
            ]),
            "netjam server",
        );
        let (exit, said) = server.finish(WAIT);
        assert!(!exit.success(), "--web {web} was taken: {said:?}");
        assert!(
            said.iter().any(|l| l.contains("--web") && l.contains(says)),
            "--web {web}: {said:?}"
        );
        assert!(!said.iter().any(|l| l.contains("serving rooms")), "{said:?}");
    }
}
