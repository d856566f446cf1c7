//! `netjam jam --room NAME --web`, the player's own page, against real processes on
//! loopback: a `netjam server` and three players playing tones (`--sine`), the first of
//! them with its page open and its mix written to a WAV file (`--output`).
//!
//! * headless Chromium (Debian's `chromium`, which scripts/deps installs; nothing here
//!   downloads a browser), driven over its DevTools protocol, opens the printed URL: the
//!   page lists the other two by name; a fader moved on the page (its `input` event, as a
//!   mouse makes) sets that member's gain, which a second page (a WebSocket client here)
//!   sees in the next snapshots; that client's mute shows on the page; refused commands
//!   (an unknown name, a gain of 99 dB) come back as error events and change nothing; a
//!   member who leaves is gone from the snapshots within 2 s; the mix's meter moves while
//!   tones play and falls when none is heard;
//! * the mix as written: the moved member's tone is lower by the amount set (measured),
//!   silent while the other member is soloed (a click on the page), back when the second
//!   page lifts the solo, then silent while muted, while the other member's tone plays on;
//! * a page bound to another address than loopback is refused without the token printed
//!   at start; a binary message is refused with an error, and a page that sends more than
//!   a command's worth is dropped while the others stay served;
//! * `--web` with `--peer` is refused, saying it needs a room;
//! * a private room's page shows the server's key as the player pinned it and the media
//!   epoch; a password typed on the page (Chromium again) moves the room to the next
//!   epoch, and a page of a room without a password is told it has none.
//!
//! Loopback only, ephemeral ports, every wait bounded generously; the figures seen
//! (snapshot rate, times) are printed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::signal::{read_channel0, tone_amp, RATE};
use common::{room_server, server_fingerprint, sine_player, tmp, tmp_dir, Proc, BIN};
use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// How long any one step may take on a loaded 2-core machine.
const WAIT: Duration = Duration::from_secs(60);
const CHROMIUM: &str = "/usr/bin/chromium";
/// The members' tones, far from each other's harmonics.
const BO_HZ: f64 = 330.0;
const CY_HZ: f64 = 470.0;
const DEE_HZ: f64 = 610.0;
/// One browser test at a time: a browser and a room of players each keep a core of this
/// 2-core machine busy, and two at once starve both.
static ONE_BROWSER: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// The gain the page sets on bo, dB.
const MOVE_DB: f64 = -12.0;
/// ana's tone, and the gain her page sets on what she sends, dB.
const ANA_HZ: f64 = 220.0;
const SEND_DB: f64 = -9.0;

fn player(server: SocketAddr, name: &str, hz: &str, seconds: &str, extra: &[&str]) -> Proc {
    Proc::spawn_lines(
        sine_player(server, name, hz, seconds)
            .args(extra)
            .stdout(Stdio::null()),
        "jam --room",
    )
}

type Ws = WebSocket<MaybeTlsStream<TcpStream>>;

/// The URL of the page a player with `--web` prints.
fn page_url(player: &mut Proc) -> String {
    let line = player.line_with("your page of room", WAIT);
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_owned()
}

/// A page as a program: the WebSocket of the page at `url`.
fn page_socket(url: &str) -> Ws {
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    let (ws, _) = tungstenite::client::connect(format!("ws://{host}/ws")).unwrap();
    if let MaybeTlsStream::Plain(s) = ws.get_ref() {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    }
    ws
}

/// The next JSON message, or None after the read timeout.
fn next_message(ws: &mut Ws) -> Option<Value> {
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => return Some(serde_json::from_str(t.as_str()).unwrap()),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

/// Reads messages until `want` is satisfied by one (within `within`); returns it and
/// every error event seen meanwhile.
fn until(ws: &mut Ws, within: Duration, what: &str, want: impl Fn(&Value) -> bool) -> (Value, Vec<String>) {
    let deadline = Instant::now() + within;
    let mut errors = Vec::new();
    let mut last = Value::Null;
    while Instant::now() < deadline {
        let Some(m) = next_message(ws) else { continue };
        if m["type"] == "error" {
            errors.push(m["text"].as_str().unwrap_or_default().to_owned());
        }
        if want(&m) {
            return (m, errors);
        }
        if m["type"] == "snapshot" {
            last = m;
        }
    }
    panic!("no {what} within {within:?}; the last snapshot: {last:#}");
}

fn member<'a>(snapshot: &'a Value, name: &str) -> Option<&'a Value> {
    snapshot["members"].as_array()?.iter().find(|m| m["name"] == name)
}

/// Headless Chromium driven over its DevTools protocol (a WebSocket of its own).
struct Browser {
    _proc: Proc,
    ws: Ws,
    session: String,
    next_id: u64,
}

impl Browser {
    /// Starts Chromium (its own profile) with `url` open in a tab.
    fn open(url: &str, tag: &str) -> Self {
        let dir = tmp_dir(&format!("room-web-{tag}"));
        let proc = Proc::spawn_lines(
            Command::new(CHROMIUM)
                .args([
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--no-first-run",
                    "--remote-debugging-port=0",
                ])
                .arg(format!("--user-data-dir={}", dir.join("profile").display()))
                .arg("about:blank")
                .stdout(Stdio::null()),
            "chromium",
        );
        let line = proc.line_with("DevTools listening on", WAIT);
        let devtools = line.split_whitespace().last().unwrap().to_owned();
        let (ws, _) = tungstenite::client::connect(devtools).unwrap();
        if let MaybeTlsStream::Plain(s) = ws.get_ref() {
            s.set_read_timeout(Some(WAIT)).unwrap();
        }
        let mut b = Self {
            _proc: proc,
            ws,
            session: String::new(),
            next_id: 0,
        };
        let target = b.call(None, "Target.createTarget", json!({ "url": url }));
        let target_id = target["targetId"].as_str().unwrap().to_owned();
        let attached = b.call(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target_id, "flatten": true }),
        );
        b.session = attached["sessionId"].as_str().unwrap().to_owned();
        b
    }

    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if let Some(s) = session {
            msg["sessionId"] = json!(s);
        }
        self.ws.send(Message::text(msg.to_string())).unwrap();
        loop {
            let Some(m) = next_message(&mut self.ws) else {
                panic!("chromium did not answer {method}");
            };
            if m["id"] == id {
                assert!(m.get("error").is_none(), "{method}: {m}");
                return m["result"].clone();
            }
        }
    }

    /// The value of JavaScript `expression` in the page.
    fn eval(&mut self, expression: &str) -> Value {
        let session = self.session.clone();
        let r = self.call(
            Some(&session),
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true }),
        );
        r["result"]["value"].clone()
    }

    /// Evaluates `expression` until it is true (within `within`); how long it took.
    fn wait_for(&mut self, expression: &str, within: Duration) -> Duration {
        let started = Instant::now();
        while started.elapsed() < within {
            if self.eval(expression) == json!(true) {
                return started.elapsed();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let body = self.eval("document.body.innerText");
        panic!("the page never had {expression} within {within:?}; it shows: {body}");
    }
}

/// The amplitude of the tone at `hz` in each 100 ms of `x`.
fn tone_levels_db(x: &[f64], hz: f64) -> Vec<f64> {
    let n = (RATE / 10.0) as usize;
    x.chunks_exact(n)
        .map(|b| 20.0 * tone_amp(b, hz).max(1e-9).log10())
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn the_page_shows_the_room_and_mixes_it_by_name() {
    if !Path::new(CHROMIUM).exists() {
        eprintln!("skipped: {CHROMIUM} is missing (scripts/deps installs Debian's chromium)");
        return;
    }
    let _alone = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let (_server, addr) = room_server("180", WAIT);
    let mix = tmp("room-web", "mix.wav");
    let out = mix.to_str().unwrap().to_owned();
    let bo_mix = tmp("room-web", "bo-mix.wav");
    let bo_out = bo_mix.to_str().unwrap().to_owned();
    // Headroom for two tones, so the limiter never touches what is measured.
    let mut ana = player(
        addr,
        "ana",
        &ANA_HZ.to_string(),
        "150",
        &["--web", "127.0.0.1:0", "--output", &out, "--master-gain=-12"],
    );
    let url = page_url(&mut ana);
    assert!(!url.contains("token"), "a loopback page needs no token: {url}");
    let mut bo = player(
        addr,
        "bo",
        &BO_HZ.to_string(),
        "150",
        &["--output", &bo_out, "--master-gain=-12"],
    );
    let mut cy = player(addr, "cy", &CY_HZ.to_string(), "150", &[]);
    let mut dee = player(addr, "dee", &DEE_HZ.to_string(), "150", &[]);

    // A room of four: the page in Chromium lists the other three by name, each with how far
    // away they sound.
    let started = Instant::now();
    let mut page = Browser::open(&url, "page");
    page.wait_for(
        r#"['bo', 'cy', 'dee'].every((n) => !!document.querySelector(`tr.member[data-member="${n}"]`)) && document.querySelectorAll('tr.member').length === 3"#,
        WAIT,
    );
    eprintln!(
        "the page listed bo, cy and dee {:.1} s after it was opened",
        started.elapsed().as_secs_f64()
    );
    // Their meters move while they play, and the mix's; their latency is measured.
    page.wait_for(
        r#"+document.querySelector('tr[data-member="bo"] .bar').dataset.peak > -40 && ['bo', 'cy', 'dee'].every((n) => document.querySelector(`tr[data-member="${n}"]`).dataset.ear !== "") && +document.getElementById('m-mix-bar').dataset.peak > -40"#,
        WAIT,
    );
    let ears = page.eval(
        r#"['bo', 'cy', 'dee'].map((n) => n + ' ' + document.querySelector(`tr[data-member="${n}"]`).dataset.ear + ' ms').join(', ')"#,
    );
    eprintln!("mouth to ear on the page: {ears}");

    // Where bo's latency goes: the stages add up to the mouth to ear the table shows, and
    // the trend's plot has points (one a second) within a few seconds.
    page.wait_for(
        r#"(() => { const r = document.querySelector('.lat-row[data-member="bo"]'), t = document.querySelector('tr[data-member="bo"]'); return !!r && t.dataset.ear !== "" && Math.abs(+r.dataset.stagesMs - +t.dataset.ear) < 0.1 && r.querySelectorAll('.stack span').length === 5; })()"#,
        WAIT,
    );
    page.wait_for(
        r#"+document.querySelector('.lat-row[data-member="bo"] canvas').dataset.points >= 3 && +document.querySelector('.lat-row[data-member="cy"] canvas').dataset.points >= 3"#,
        WAIT,
    );
    let stages = page.eval(r#"document.querySelector('.lat-row[data-member="bo"] .stages').textContent"#);
    eprintln!("bo's latency on the page: {stages}");
    assert!(
        stages
            .as_str()
            .is_some_and(|t| t.contains("network") && t.contains("buffer") && t.ends_with(" ms")),
        "{stages}"
    );

    // A second page: counts the update rate, then watches the first page's move.
    let mut other = page_socket(&url);
    let (_, _) = until(&mut other, WAIT, "a snapshot", |m| m["type"] == "snapshot");
    // A page opened late gets the trends at once, not only at the next whole second.
    let mut firsts = 1;
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no snapshots on the second page");
        let Some(m) = next_message(&mut other) else {
            continue;
        };
        if m["type"] != "snapshot" {
            continue;
        }
        firsts += 1;
        let points = m["trends"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["name"] == "bo"))
            .and_then(|t| t["points"].as_array())
            .map_or(0, Vec::len);
        if points >= 3 {
            break;
        }
        assert!(
            firsts < 4,
            "no trends in the first {firsts} snapshots of a new page: {m}"
        );
    }
    let window = Instant::now();
    let mut snapshots = 0;
    while window.elapsed() < Duration::from_secs(3) {
        if next_message(&mut other).is_some_and(|m| m["type"] == "snapshot") {
            snapshots += 1;
        }
    }
    let rate = f64::from(snapshots) / window.elapsed().as_secs_f64();
    let page_rate = page.eval("+document.body.dataset.rate");
    eprintln!("updates: {rate:.1} snapshots/s to a WebSocket client, the page counts {page_rate} /s");
    // 25 a second are published; a loaded machine may merge a few.
    assert!(rate >= 15.0, "{rate:.1} snapshots a second");

    // bo's fader moved on the page, as a mouse would.
    let moved = Instant::now();
    page.eval(&format!(
        r#"(() => {{ const f = document.querySelector('tr[data-member="bo"] .fader'); f.value = {MOVE_DB}; f.dispatchEvent(new Event('input')); return f.value; }})()"#
    ));
    let (seen, _) = until(&mut other, WAIT, "bo at -12 dB", |m| {
        member(m, "bo").is_some_and(|b| (b["gain_db"].as_f64().unwrap() - MOVE_DB).abs() < 0.1)
    });
    eprintln!(
        "the second page saw the fader move {:.0} ms after it was made",
        moved.elapsed().as_secs_f64() * 1e3
    );
    assert!(
        (member(&seen, "cy").unwrap()["gain_db"].as_f64().unwrap()).abs() < 0.1,
        "only bo moved: {seen:#}"
    );
    page.wait_for(
        r#"document.querySelector('tr[data-member="bo"]').dataset.gainDb === "-12.0""#,
        WAIT,
    );
    // Bo plays at -12 dB for a while.
    std::thread::sleep(Duration::from_secs(3));

    // ana's send fader, as a mouse moves it: everyone hears her at that gain, and the
    // second page shows it.
    page.eval(&format!(
        r#"(() => {{ const f = document.getElementById('send'); f.value = {SEND_DB}; f.dispatchEvent(new Event('input')); return f.value; }})()"#
    ));
    until(&mut other, WAIT, "ana's send at -9 dB", |m| {
        m["type"] == "snapshot"
            && m["send_gain_db"]
                .as_f64()
                .is_some_and(|g| (g - SEND_DB).abs() < 0.1)
    });
    page.wait_for(
        r#"document.getElementById('send-val').textContent === "-9.0 dB""#,
        WAIT,
    );

    // Refused: nobody of that name, a gain out of range, not JSON, a recording where
    // nothing records. Nothing changes.
    for bad in [
        r#"{"member":"nobody","gain_db":-6}"#,
        r#"{"member":"cy","gain_db":99}"#,
        "not json",
        r#"{"record":false}"#,
    ] {
        other.send(Message::text(bad)).unwrap();
    }
    let mut errors = Vec::new();
    let deadline = Instant::now() + WAIT;
    while errors.len() < 4 {
        assert!(Instant::now() < deadline, "errors seen: {errors:?}");
        if let Some(m) = next_message(&mut other) {
            if m["type"] == "error" {
                errors.push(m["text"].as_str().unwrap().to_owned());
            }
        }
    }
    eprintln!("refused: {errors:?}");
    assert!(errors[0].contains("nobody"), "{errors:?}");
    assert!(errors[1].contains("out of range"), "{errors:?}");
    assert!(errors[3].contains("--record DIR"), "{errors:?}");
    let (after, _) = until(&mut other, WAIT, "a snapshot counting the refusals", |m| {
        m["type"] == "snapshot" && m["commands_refused"].as_u64().is_some_and(|n| n >= 4)
    });
    assert!(
        member(&after, "cy").unwrap()["gain_db"].as_f64().unwrap().abs() < 0.1,
        "a refused command changed cy: {after:#}"
    );
    assert!(after["recording"].is_null(), "nothing records: {after:#}");

    // cy soloed on the page (its button, as a click): bo falls silent while cy plays; the
    // second page sees it, then lifts the solo, and bo is back at its fader's level.
    page.eval(r#"document.querySelector('tr[data-member="cy"] button.solo').click()"#);
    until(&mut other, WAIT, "cy soloed", |m| {
        member(m, "cy").is_some_and(|c| c["solo"] == true)
            && member(m, "bo").is_some_and(|b| b["solo"] == false)
    });
    let soloed_at = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    other
        .send(Message::text(r#"{"member":"cy","solo":false}"#))
        .unwrap();
    until(&mut other, WAIT, "cy's solo lifted", |m| {
        member(m, "cy").is_some_and(|c| c["solo"] == false)
    });
    page.wait_for(
        r#"document.querySelector('tr[data-member="cy"] button.solo').getAttribute('aria-pressed') === "false""#,
        WAIT,
    );
    eprintln!("cy soloed for {:.1} s", soloed_at.elapsed().as_secs_f64());
    std::thread::sleep(Duration::from_secs(2));

    // The second page mutes bo; the first shows it.
    other
        .send(Message::text(r#"{"member":"bo","mute":true}"#))
        .unwrap();
    let muted_at = Instant::now();
    until(&mut other, WAIT, "bo muted", |m| {
        member(m, "bo").is_some_and(|b| b["mute"] == true)
    });
    page.wait_for(
        r#"document.querySelector('tr[data-member="bo"]').dataset.mute === "true" && document.querySelector('tr[data-member="bo"] button.mute').getAttribute('aria-pressed') === "true""#,
        WAIT,
    );
    let errors_on_page = page.eval("+(document.body.dataset.errors || 0)");
    assert_eq!(
        errors_on_page,
        json!(0),
        "the first page was sent another's errors"
    );
    // Bo stays muted a while, cy plays on.
    std::thread::sleep(Duration::from_secs(3).saturating_sub(muted_at.elapsed()));

    // cy leaves: gone from the snapshots within 2 s of its leaving.
    let interrupted = Instant::now();
    cy.interrupt();
    let exit = cy.wait_for(WAIT);
    assert!(exit.success(), "cy: {exit}");
    let left = Instant::now();
    until(&mut other, WAIT, "a snapshot without cy", |m| {
        m["type"] == "snapshot" && member(m, "cy").is_none()
    });
    let gone_s = left.elapsed().as_secs_f64();
    eprintln!(
        "cy was gone from the snapshots {gone_s:.2} s after it exited ({:.2} s after its Ctrl-C)",
        interrupted.elapsed().as_secs_f64()
    );
    assert!(gone_s <= 2.0, "cy was still listed {gone_s:.2} s after it left");
    page.wait_for(r#"!document.querySelector('tr.member[data-member="cy"]')"#, WAIT);
    dee.interrupt();
    let exit = dee.wait_for(WAIT);
    assert!(exit.success(), "dee: {exit}");
    page.wait_for(r#"!document.querySelector('tr.member[data-member="dee"]')"#, WAIT);
    // bo muted, cy and dee gone: the mix's meter falls to silence.
    page.wait_for(
        r#"+document.getElementById('m-mix-bar').dataset.peak < -90"#,
        WAIT,
    );
    drop(page);

    // The mix as written.
    ana.interrupt();
    let (exit, said) = ana.finish(WAIT);
    assert!(exit.success(), "ana: {exit}: {said:#?}");
    assert!(
        said.iter()
            .any(|l| l.contains("your page:") && l.contains("refused")),
        "{said:#?}"
    );
    // What bo heard of ana: full, then at her send fader's gain.
    bo.interrupt();
    let (exit, said) = bo.finish(WAIT);
    assert!(exit.success(), "bo: {exit}: {said:#?}");
    let heard = tone_levels_db(&read_channel0(&bo_mix), ANA_HZ);
    let top = heard.iter().copied().fold(f64::MIN, f64::max);
    let full: Vec<f64> = heard.iter().copied().filter(|l| *l > top - 3.0).collect();
    let set: Vec<f64> = heard
        .iter()
        .copied()
        .filter(|l| (*l - (top + SEND_DB)).abs() < 3.0)
        .collect();
    assert!(
        full.len() >= 10 && set.len() >= 15,
        "bo heard ana at full level {} tenths, at her send's gain {}",
        full.len(),
        set.len()
    );
    let (full_db, set_db) = (median(full), median(set));
    eprintln!(
        "ana in bo's mix: {full_db:.2} dBFS, then {set_db:.2} dBFS after her page set her send to {SEND_DB} dB"
    );
    assert!(
        (set_db - full_db - SEND_DB).abs() <= 0.5,
        "ana's send was set to {SEND_DB} dB and bo heard her move by {:.2} dB",
        set_db - full_db
    );

    let x = read_channel0(&mix);
    let bo = tone_levels_db(&x, BO_HZ);
    let cyl = tone_levels_db(&x, CY_HZ);
    // Bo's level as first heard (its loudest plateau), then at the fader's setting, then
    // muted: each tenth of a second is one of the three, but for the ramps between.
    let top = bo.iter().copied().fold(f64::MIN, f64::max);
    let full: Vec<f64> = bo.iter().copied().filter(|l| *l > top - 3.0).collect();
    let set: Vec<f64> = bo
        .iter()
        .copied()
        .filter(|l| (*l - (top + MOVE_DB)).abs() < 3.0)
        .collect();
    assert!(
        full.len() >= 10,
        "bo was heard at full level {} tenths",
        full.len()
    );
    assert!(
        set.len() >= 15,
        "bo was heard at the fader's level {} tenths",
        set.len()
    );
    let (full_db, set_db) = (median(full), median(set));
    let moved_by = set_db - full_db;
    eprintln!(
        "bo in the mix: {full_db:.2} dBFS, then {set_db:.2} dBFS: moved by {moved_by:.2} dB (set {MOVE_DB} dB)"
    );
    assert!(
        (moved_by - MOVE_DB).abs() <= 0.5,
        "the fader set {MOVE_DB} dB and bo moved by {moved_by:.2} dB"
    );
    // Soloed cy, then muted bo: the runs of tenths where bo is silent while cy plays. Each
    // lasted 2–3 s, with bo back at its fader's level for 2 s between them.
    let cy_top = cyl.iter().copied().fold(f64::MIN, f64::max);
    let mut runs = vec![0u32];
    for (b, c) in bo.iter().zip(&cyl) {
        if *b < top - 60.0 && *c > cy_top - 3.0 {
            *runs.last_mut().unwrap() += 1;
        } else if *runs.last().unwrap() > 0 {
            runs.push(0);
        }
    }
    let long: Vec<u32> = runs.into_iter().filter(|r| *r >= 10).collect();
    eprintln!("bo silent while cy played (cy soloed, then bo muted), tenths: {long:?}");
    assert!(
        long.len() >= 2,
        "bo was silent under cy in {} long stretches, not 2: {long:?}",
        long.len()
    );
}

/// Pauses and resumes a recording from the page, as a click: the files hold silence for
/// the pause, on the same timeline, and sound on both sides of it. The page also shows the
/// ensemble's shared beat, bar by bar.
#[test]
fn the_page_pauses_and_resumes_the_recording_and_shows_the_beat() {
    if !Path::new(CHROMIUM).exists() {
        eprintln!("skipped: {CHROMIUM} is missing (scripts/deps installs Debian's chromium)");
        return;
    }
    let _alone = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let (_server, addr) = room_server("90", WAIT);
    let dir = tmp_dir("room-web-record");
    let mut ana = player(
        addr,
        "ana",
        "220",
        "60",
        &[
            "--web",
            "127.0.0.1:0",
            "--record",
            dir.to_str().unwrap(),
            "--ensemble",
            "--tempo",
            "120",
        ],
    );
    let url = page_url(&mut ana);
    let _bo = player(addr, "bo", &BO_HZ.to_string(), "60", &[]);
    let mut page = Browser::open(&url, "record");
    page.wait_for(
        r#"document.body.dataset.recording === "on" && !!document.querySelector('tr.member[data-member="bo"]') && +document.querySelector('tr[data-member="bo"] .bar').dataset.peak > -40"#,
        WAIT,
    );
    let shown = page.eval(r#"document.getElementById('record-val').textContent"#);
    assert!(
        shown.as_str().is_some_and(|t| t.contains(dir.to_str().unwrap())),
        "the page says where the files are: {shown}"
    );
    // The beat: 120 BPM in bars of four, so a bar every 2 s.
    page.wait_for(r#"+document.body.dataset.bar > 0"#, WAIT);
    let bar = |page: &mut Browser| page.eval("+document.body.dataset.bar").as_f64().unwrap();
    let (first, at) = (bar(&mut page), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let bars = bar(&mut page) - first;
    let beat = page.eval(r#"document.getElementById('beat-val').textContent"#);
    eprintln!(
        "the beat on the page: {beat}; {bars} bars in {:.1} s",
        at.elapsed().as_secs_f64()
    );
    assert!(
        beat.as_str().is_some_and(|t| t.starts_with("120.0 BPM")),
        "{beat}"
    );
    assert!((1.0..=2.0).contains(&bars), "{bars} bars in 2 s at 120 BPM");
    assert_eq!(
        page.eval(r#"document.querySelectorAll('#beat-dots i.on').length"#),
        json!(1),
        "one beat lit"
    );
    page.eval(r#"document.getElementById('record').click()"#);
    page.wait_for(r#"document.body.dataset.recording === "paused""#, WAIT);
    let paused = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    page.eval(r#"document.getElementById('record').click()"#);
    page.wait_for(r#"document.body.dataset.recording === "on""#, WAIT);
    let pause_s = paused.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));
    drop(page);
    ana.interrupt();
    let (exit, said) = ana.finish(WAIT);
    assert!(exit.success(), "ana: {exit}: {said:#?}");

    // bo's track and ana's own: sound, then silence for the pause, then sound again.
    let bo_track = std::fs::read_dir(&dir)
        .expect("the recording's folder")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with("-bo.wav"))
        })
        .unwrap_or_else(|| panic!("no bo track in {}", dir.display()));
    for (track, hz) in [(bo_track, BO_HZ), (dir.join("you.wav"), 220.0)] {
        let x = read_channel0(&track);
        let levels = tone_levels_db(&x, hz);
        let top = levels.iter().copied().fold(f64::MIN, f64::max);
        let loud: Vec<bool> = levels.iter().map(|l| *l > top - 6.0).collect();
        let first = loud.iter().position(|&l| l).expect("sound at all");
        // The pause is the longest quiet stretch after the sound began: a tenth that dips
        // (a packet concealed on the way) is not the pause.
        let (gap_start, gap) = (first..loud.len())
            .filter(|&i| !loud[i] && (i == first || loud[i - 1]))
            .map(|i| (i, loud[i..].iter().take_while(|&&l| !l).count()))
            .max_by_key(|&(_, n)| n)
            .expect("a pause");
        let resumed = loud[gap_start + gap..].iter().filter(|&&l| l).count();
        // The tenths at either edge hold the cut.
        let silent = gap >= 3
            && levels[gap_start + 1..gap_start + gap - 1]
                .iter()
                .all(|l| *l < top - 60.0);
        eprintln!(
            "{}: sound for {} tenths, silent for {gap} tenths (the pause on the page was {pause_s:.1} s), then sound for {resumed} tenths",
            track.display(),
            gap_start - first
        );
        assert!(
            silent,
            "the pause holds silence only: {:?}",
            &levels[gap_start..gap_start + gap]
        );
        assert!(
            (f64::from(gap as u32) / 10.0 - pause_s).abs() <= 1.0,
            "a pause of {pause_s:.1} s is {gap} tenths of silence"
        );
        assert!(
            gap_start - first >= 10 && resumed >= 10,
            "sound on both sides of the pause"
        );
    }
}

#[test]
fn a_private_rooms_page_shows_the_servers_key_and_changes_the_password() {
    if !Path::new(CHROMIUM).exists() {
        eprintln!("skipped: {CHROMIUM} is missing (scripts/deps installs Debian's chromium)");
        return;
    }
    let _alone = ONE_BROWSER.lock().unwrap_or_else(|e| e.into_inner());
    let (server, addr) = room_server("90", WAIT);
    let fp = server_fingerprint(&server, WAIT);
    let mut ana = player(
        addr,
        "ana",
        "220",
        "60",
        &["--password", "first", "--web", "127.0.0.1:0"],
    );
    let url = page_url(&mut ana);
    let mut page = Browser::open(&url, "private");
    page.wait_for(
        &format!(r#"document.body.dataset.serverKey === "{fp}" && document.body.dataset.epoch === "0""#),
        WAIT,
    );
    let shown = page.eval(r#"document.getElementById('server-val').textContent"#);
    assert!(
        shown
            .as_str()
            .is_some_and(|t| t.contains(&addr.to_string()) && t.contains(&fp)),
        "{shown}"
    );
    // Typed and sent from the page: the room moves to epoch 1, and the field is emptied.
    page.eval(
        r#"document.getElementById('password').value = 'second'; document.getElementById('password-set').click()"#,
    );
    let took = page.wait_for(r#"document.body.dataset.epoch === "1""#, WAIT);
    assert_eq!(
        page.eval(r#"document.getElementById('password').value"#),
        json!("")
    );
    let note = page.eval(r#"document.getElementById('private-val').textContent"#);
    assert!(
        note.as_str().is_some_and(|t| t.contains("you changed room")),
        "{note}"
    );
    eprintln!(
        "the page's password change took {:.0} ms to show",
        took.as_secs_f64() * 1e3
    );
    drop(page);

    // A page of a room without a password is told so, and nothing changes.
    let server_arg = addr.to_string();
    let mut bo = Proc::spawn_lines(
        Command::new(BIN)
            .args(["jam", "--server", &server_arg, "--room", "open", "--name", "bo"])
            .args([
                "--sine",
                "330",
                "--duration",
                "60",
                "--channels",
                "1",
                "--web",
                "127.0.0.1:0",
            ])
            .stdout(Stdio::null()),
        "jam --room open",
    );
    let mut ws = page_socket(&page_url(&mut bo));
    until(&mut ws, WAIT, "a snapshot", |m| m["type"] == "snapshot");
    ws.send(Message::text(r#"{"password":"x"}"#)).unwrap();
    let (m, _) = until(&mut ws, WAIT, "an error", |m| m["type"] == "error");
    assert!(m["text"].as_str().unwrap().contains("no password"), "{m}");
    let (snap, _) = until(&mut ws, WAIT, "a snapshot", |m| m["type"] == "snapshot");
    assert!(snap["private"].is_null(), "{snap}");
    for p in [&mut ana, &mut bo] {
        p.interrupt();
        let (exit, said) = p.finish(WAIT);
        assert!(exit.success(), "{said:#?}");
    }
}

#[test]
fn the_page_needs_a_room() {
    let mut jam = Proc::spawn_lines(
        Command::new(BIN)
            .args([
                "jam",
                "--peer",
                "127.0.0.1:9",
                "--sine",
                "440",
                "--duration",
                "1",
                "--web",
            ])
            .stdout(Stdio::null()),
        "jam --peer --web",
    );
    let (exit, said) = jam.finish(WAIT);
    assert!(!exit.success(), "{said:#?}");
    assert!(
        said.iter()
            .any(|l| l.contains("--web") && l.contains("room") && l.contains("--room NAME")),
        "{said:#?}"
    );
}

#[test]
fn a_page_on_another_address_needs_its_token_and_takes_small_text_only() {
    let (_server, addr) = room_server("90", WAIT);
    let mut ana = player(addr, "ana", "220", "60", &["--web", "0.0.0.0:0"]);
    let line = ana.line_with("your page of room", WAIT);
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in {line:?}"))
        .to_owned();
    let (base, token) = url.split_once("?token=").expect("a token in the URL");
    assert_eq!(token.len(), 32, "{url}");
    assert!(line.contains("anyone with this URL"), "{line}");
    let host = base.trim_start_matches("http://").trim_end_matches('/');
    let get = |target: &str| {
        use std::io::{Read, Write};
        let mut s = TcpStream::connect(host).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(format!("GET {target} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
            .unwrap();
        let mut got = String::new();
        let _ = s.read_to_string(&mut got);
        got.lines().next().unwrap_or_default().to_owned()
    };
    assert!(get("/").contains("403"));
    assert!(get(&format!("/?token={token}")).contains("200"));
    assert!(tungstenite::client::connect(format!("ws://{host}/ws")).is_err());

    let open = || {
        let (ws, _) = tungstenite::client::connect(format!("ws://{host}/ws?token={token}")).unwrap();
        if let MaybeTlsStream::Plain(s) = ws.get_ref() {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        }
        ws
    };
    let mut ws = open();
    ws.send(Message::binary(vec![1u8, 2, 3])).unwrap();
    let (error, _) = until(&mut ws, WAIT, "an error", |m| m["type"] == "error");
    assert!(error["text"].as_str().unwrap().contains("JSON"), "{error}");
    // More than a page may send: that page is dropped, the others stay served.
    let _ = ws.send(Message::text("x".repeat(64 * 1024)));
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "a page that sent 64 KiB stayed open");
        match ws.read() {
            Ok(_) => continue,
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(_) => break,
        }
    }
    let mut again = open();
    let (s, _) = until(&mut again, WAIT, "a snapshot counting both refusals", |m| {
        m["type"] == "snapshot" && m["commands_refused"].as_u64().unwrap_or(0) >= 2
    });
    assert_eq!(s["room"], "band");
    assert!(ana.running(), "the player stopped: {:?}", ana.drain_lines());
}
