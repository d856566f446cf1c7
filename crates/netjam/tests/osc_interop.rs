//! Interoperability of `netjam osc send`/`dump` with OSC implementations nobody here
//! wrote: liblo's `oscsend`/`oscdump` and python-osc, in both directions, over UDP and
//! over TCP in both framings (OSC 1.0 length prefix, OSC 1.1 SLIP). Loopback only,
//! ephemeral ports, every wait bounded.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

const NETJAM: &str = env!("CARGO_BIN_EXE_netjam");
const WAIT: Duration = Duration::from_secs(5);

fn require_liblo() {
    for tool in ["oscsend", "oscdump"] {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .output();
        assert!(
            found.map(|o| o.status.success()).unwrap_or(false),
            "{tool} (liblo-tools) is not installed: run scripts/deps"
        );
    }
}

fn require_python_osc() {
    let ok = Command::new("python3")
        .args(["-c", "import pythonosc.tcp_client, pythonosc.osc_tcp_server"])
        .output();
    assert!(
        ok.map(|o| o.status.success()).unwrap_or(false),
        "python3 with the pythonosc module (python-osc) is not installed: run scripts/deps"
    );
}

/// A child process killed when dropped, with its stdout lines on a channel.
struct Proc {
    child: Child,
    lines: Receiver<String>,
    stderr: Receiver<String>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn lines_of<R: Read + Send + 'static>(r: R) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn spawn(cmd: &mut Command) -> Proc {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = lines_of(child.stdout.take().unwrap());
    let stderr = lines_of(child.stderr.take().unwrap());
    Proc { child, lines, stderr }
}

impl Proc {
    fn line(&self) -> String {
        match self.lines.recv_timeout(WAIT) {
            Ok(l) => l,
            Err(_) => {
                let err: Vec<String> = self.stderr.try_iter().collect();
                panic!("no output within {WAIT:?}; stderr: {err:?}")
            }
        }
    }

    fn stderr_line(&self) -> String {
        self.stderr.recv_timeout(WAIT).expect("no stderr line in time")
    }
}

/// Starts `netjam osc dump` on an ephemeral port and returns it with the port.
fn netjam_dump(extra: &[&str]) -> (Proc, u16) {
    let p = spawn(
        Command::new(NETJAM)
            .args(["osc", "dump", "--listen", "127.0.0.1:0"])
            .args(extra),
    );
    let first = p.stderr_line();
    let port = first
        .rsplit(':')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .expect(&first);
    (p, port)
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn netjam_send(args: &[&str]) {
    run_ok(Command::new(NETJAM).args(["osc", "send"]).args(args));
}

/// Sends until `receiver` prints a line: a receiver that gives no sign of being ready
/// (oscdump) may not be listening yet when the first packet goes out.
fn netjam_send_until_line(receiver: &Proc, args: &[&str]) -> String {
    for _ in 0..20 {
        let _ = Command::new(NETJAM).args(["osc", "send"]).args(args).output();
        if let Ok(line) = receiver.lines.recv_timeout(Duration::from_millis(250)) {
            return line;
        }
    }
    receiver.line()
}

#[test]
fn liblo_oscsend_to_netjam_dump_udp() {
    require_liblo();
    let (dump, port) = netjam_dump(&[]);
    run_ok(
        Command::new("oscsend")
            .args(["127.0.0.1", &port.to_string(), "/lo/udp", "ifsdhTFNIc"])
            .args(["42", "2.5", "hello world", "0.125", "-9000000000", "x"]),
    );
    assert_eq!(
        dump.line(),
        "/lo/udp ,ifsdhTFNIc 42 2.5 \"hello world\" 0.125 -9000000000 true false nil inf 'x'"
    );
}

#[test]
fn liblo_oscsend_to_netjam_dump_tcp() {
    require_liblo();
    let (dump, port) = netjam_dump(&["--tcp"]);
    let url = format!("osc.tcp://127.0.0.1:{port}");
    run_ok(Command::new("oscsend").args([&url, "/lo/tcp", "sif", "framed", "7", "0.5"]));
    assert_eq!(dump.line(), "/lo/tcp ,sif \"framed\" 7 0.5");
}

#[test]
fn netjam_send_to_liblo_oscdump_udp() {
    require_liblo();
    let port = free_udp_port();
    let dump = spawn(Command::new("oscdump").args(["-L", &port.to_string()]));
    let line = netjam_send_until_line(
        &dump,
        &[
            &format!("127.0.0.1:{port}"),
            "/nj/udp",
            "ifsdhTc",
            "-3",
            "1.5",
            "a string",
            "2.25",
            "77",
            "q",
        ],
    );
    assert!(
        line.ends_with("/nj/udp ifsdhTc -3 1.500000 \"a string\" 2.250000 77 #T 'q'"),
        "{line}"
    );
}

#[test]
fn netjam_send_to_liblo_oscdump_tcp_both_framings() {
    require_liblo();
    let port = free_tcp_port();
    let dump = spawn(Command::new("oscdump").args(["-L", &format!("osc.tcp://:{port}")]));
    let target = format!("127.0.0.1:{port}");
    let line = netjam_send_until_line(&dump, &["--tcp", &target, "/nj/len", "si", "length prefix", "1"]);
    assert!(line.ends_with("/nj/len si \"length prefix\" 1"), "{line}");
    netjam_send(&["--slip", &target, "/nj/slip", "si", "slip", "2"]);
    let line = dump.line();
    assert!(line.ends_with("/nj/slip si \"slip\" 2"), "{line}");
}

#[test]
fn python_osc_to_netjam_dump_udp_with_nested_bundles() {
    require_python_osc();
    let (dump, port) = netjam_dump(&[]);
    let script = format!(
        r#"
from pythonosc import udp_client, osc_bundle_builder as bb, osc_message_builder as mb
c = udp_client.SimpleUDPClient("127.0.0.1", {port})
c.send_message("/py/msg", [1, 2.5, "text", b"\x01\x02\x03", True, None, [3, 4]])
outer = bb.OscBundleBuilder(2000000000.5)
m = mb.OscMessageBuilder(address="/py/outer"); m.add_arg(1); outer.add_content(m.build())
inner = bb.OscBundleBuilder(1000000000.0)
m = mb.OscMessageBuilder(address="/py/inner"); m.add_arg(2); inner.add_content(m.build())
outer.add_content(inner.build())
c.send(outer.build())
"#
    );
    run_ok(Command::new("python3").args(["-c", &script]));
    assert_eq!(
        dump.line(),
        "/py/msg ,ifsbTN[ii] 1 2.5 \"text\" 0x010203 true nil [ 3 4 ]"
    );
    // python-osc takes bundle times as UNIX seconds; the inner bundle's earlier time tag
    // must read as the outer one's.
    let outer = dump.line();
    let inner = dump.line();
    let t_outer = outer.split(' ').next().unwrap();
    let want = format!("{:08x}.80000000", 2_000_000_000u64 + 2_208_988_800);
    assert_eq!(t_outer, format!("@{want}"), "{outer}");
    assert_eq!(outer, format!("{t_outer} /py/outer ,i 1"));
    assert_eq!(inner, format!("{t_outer} /py/inner ,i 2"));
}

#[test]
fn python_osc_to_netjam_dump_tcp_both_framings() {
    require_python_osc();
    let (dump, port) = netjam_dump(&["--tcp"]);
    let script = format!(
        r#"
from pythonosc import tcp_client
for mode in ("1.1", "1.0"):
    c = tcp_client.SimpleTCPClient("127.0.0.1", {port}, mode=mode)
    c.send_message("/py/tcp", [mode, 5])
    c.close()
"#
    );
    run_ok(Command::new("python3").args(["-c", &script]));
    let mut got = [dump.line(), dump.line()];
    got.sort();
    assert_eq!(
        got,
        [
            "/py/tcp ,si \"1.0\" 5".to_owned(),
            "/py/tcp ,si \"1.1\" 5".to_owned()
        ]
    );
}

const PY_SERVER: &str = r#"
import sys
from pythonosc import dispatcher, osc_server, osc_tcp_server
kind, mode, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
d = dispatcher.Dispatcher()
def show(address, *args):
    print(address, repr(list(args)), flush=True)
d.set_default_handler(show)
if kind == "udp":
    s = osc_server.BlockingOSCUDPServer(("127.0.0.1", 0), d)
else:
    s = osc_tcp_server.BlockingOSCTCPServer(("127.0.0.1", 0), d, mode=mode)
print(s.server_address[1], file=sys.stderr, flush=True)
for _ in range(count):
    s.handle_request()
"#;

fn python_server(kind: &str, mode: &str, count: u32) -> (Proc, u16) {
    let p = spawn(Command::new("python3").args(["-c", PY_SERVER, kind, mode, &count.to_string()]));
    let port = p.stderr_line().trim().parse().unwrap();
    (p, port)
}

#[test]
fn netjam_send_to_python_osc_udp() {
    require_python_osc();
    let (srv, port) = python_server("udp", "-", 1);
    netjam_send(&[
        &format!("127.0.0.1:{port}"),
        "/nj/py",
        "ifsbdTF[ih]",
        "-1",
        "0.5",
        "hi",
        "0a0b",
        "1.5",
        "4",
        "5",
    ]);
    assert_eq!(
        srv.line(),
        "/nj/py [-1, 0.5, 'hi', b'\\n\\x0b', 1.5, True, False, [4, 5]]"
    );
}

#[test]
fn netjam_bundle_to_python_osc_udp() {
    require_python_osc();
    let (srv, port) = python_server("udp", "-", 1);
    netjam_send(&[
        "--at",
        "1000000000.25",
        &format!("127.0.0.1:{port}"),
        "/nj/bundled",
        "i",
        "11",
    ]);
    assert_eq!(srv.line(), "/nj/bundled [11]");
}

#[test]
fn netjam_send_to_python_osc_tcp_both_framings() {
    require_python_osc();
    for (mode, flag) in [("1.1", "--slip"), ("1.0", "--tcp")] {
        let (srv, port) = python_server("tcp", mode, 1);
        netjam_send(&[flag, &format!("127.0.0.1:{port}"), "/nj/tcp", "si", mode, "9"]);
        assert_eq!(srv.line(), format!("/nj/tcp ['{mode}', 9]"));
    }
}

#[test]
fn netjam_to_netjam_and_helpful_errors() {
    let (dump, port) = netjam_dump(&["--tcp"]);
    netjam_send(&[
        "--slip",
        &format!("127.0.0.1:{port}"),
        "/self",
        "tT",
        "immediately",
    ]);
    assert_eq!(dump.line(), "/self ,tT immediately true");
    netjam_send(&[
        "--tcp",
        "--at",
        "eeac7be5.80000000",
        &format!("127.0.0.1:{port}"),
        "/later",
        "s",
        "x",
    ]);
    assert_eq!(dump.line(), "@eeac7be5.80000000 /later ,s \"x\"");
    let out = Command::new(NETJAM)
        .args(["osc", "send", "127.0.0.1:9", "/x", "i", "nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("must be a 32-bit integer"), "{err}");
    let out = Command::new(NETJAM)
        .args(["osc", "send", "127.0.0.1:9", "x"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("must start with '/'"));
}
