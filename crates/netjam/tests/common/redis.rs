//! A private `redis-server` (Debian's, installed by scripts/deps) on a free loopback port,
//! without persistence, killed and reaped when dropped — a failing assertion leaves
//! nothing running.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a starting `redis-server` may take to answer `PING` on a loaded machine.
const START: Duration = Duration::from_secs(20);

#[derive(Debug)]
pub struct RedisServer {
    pub addr: SocketAddr,
    child: Option<Child>,
}

/// Whether a Redis at `addr` answers `PING` now.
pub fn pings(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
}

impl RedisServer {
    /// Starts one on a free loopback port and waits until it answers.
    pub fn start() -> Self {
        super::require("redis-server", "redis-server");
        // A port found free may be taken before redis-server binds it: try a few.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free TCP port")
                .port();
            let mut r = Self {
                addr: SocketAddr::from(([127, 0, 0, 1], port)),
                child: None,
            };
            if r.run() {
                return r;
            }
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Starts the process on `self.addr` and waits for `PING`; false if it exited.
    fn run(&mut self) -> bool {
        let child = Command::new("redis-server")
            .args(["--port", &self.addr.port().to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + START;
        while Instant::now() < deadline {
            if pings(self.addr) {
                return true;
            }
            if let Some(c) = self.child.as_mut() {
                if matches!(c.try_wait(), Ok(Some(_))) {
                    self.child = None;
                    return false;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server on {} did not answer PING within {START:?}",
            self.addr
        );
    }

    /// Kills it (everything it held is gone: it keeps nothing on disk).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again, empty, on the same port.
    pub fn restart(&mut self) {
        self.stop();
        assert!(self.run(), "redis-server did not start again on {}", self.addr);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
