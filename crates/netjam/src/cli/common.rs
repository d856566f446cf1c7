//! Pieces shared by the streaming subcommands: format flags, buffer flags, identity.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use netjam_engine::delay::BufferMode;
use netjam_engine::time::frames_to_ns;

use crate::clock;

/// `--buffer auto | N (frames) | Nms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BufferArg {
    Auto,
    Frames(u32),
    Ms(f64),
}

impl std::str::FromStr for BufferArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(BufferArg::Auto);
        }
        let bad =
            || format!("--buffer {s:?}: use auto, a number of frames (e.g. 128) or milliseconds (e.g. 3ms)");
        if let Some(ms) = s.strip_suffix("ms") {
            let v: f64 = ms.trim().parse().map_err(|_| bad())?;
            if !(0.0..=200.0).contains(&v) {
                return Err(format!("--buffer {s}: use 0 to 200 ms"));
            }
            return Ok(BufferArg::Ms(v));
        }
        s.parse().map(BufferArg::Frames).map_err(|_| bad())
    }
}

impl BufferArg {
    pub fn mode(self, rate: u32) -> BufferMode {
        match self {
            BufferArg::Auto => BufferMode::default(),
            BufferArg::Frames(f) => BufferMode::Fixed {
                ns: frames_to_ns(f as u64, rate),
            },
            BufferArg::Ms(ms) => BufferMode::Fixed {
                ns: (ms * 1e6) as u64,
            },
        }
    }
}

/// Unix time minus the monotonic clock, in ns.
pub fn wall_offset_ns() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0);
    unix - clock::now_ns() as i64
}

/// A seed that differs between runs (for SSRCs and RTCP timing).
pub fn fresh_seed() -> u64 {
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    t ^ ((std::process::id() as u64) << 32)
}

/// RTCP CNAME: user@host.
pub fn cname() -> String {
    let user = std::env::var("USER").unwrap_or_else(|_| "netjam".into());
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    format!("{user}@{host}")
}

/// Resolve `HOST:PORT` to one address.
pub fn resolve(s: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    let mut addrs = s
        .to_socket_addrs()
        .with_context(|| format!("{s:?} is not HOST:PORT (e.g. 203.0.113.5:4464 or jam.example.org:4464)"))?;
    match addrs.next() {
        Some(a) => Ok(a),
        None => bail!("{s:?} resolved to no address"),
    }
}

/// The wildcard address of the same family as `peer`, port 0.
pub fn any_for(peer: SocketAddr) -> SocketAddr {
    if peer.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    }
}

/// Fail now, before any stream starts, unless `path` can be written: a file that exists is
/// opened for appending (and left as it is), a new one is created and removed again.
/// `what` names the flag, e.g. "--output".
pub fn check_writable(path: &Path, what: &str) -> anyhow::Result<()> {
    let tell = |e: std::io::Error| {
        anyhow::anyhow!(
            "cannot write {what} {}: {e}: make sure its directory exists and you may write there, or give another path",
            path.display()
        )
    };
    match std::fs::OpenOptions::new().append(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(tell)?;
            std::fs::remove_file(path).map_err(tell)
        }
        Err(e) => Err(tell(e)),
    }
}

/// [`check_writable`] for each `(path, flag)` given.
pub fn check_outputs<'a>(
    outputs: impl IntoIterator<Item = (Option<&'a Path>, &'a str)>,
) -> anyhow::Result<()> {
    for (path, what) in outputs {
        if let Some(path) = path {
            check_writable(path, what)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_flag_forms() {
        assert_eq!("auto".parse::<BufferArg>(), Ok(BufferArg::Auto));
        assert_eq!("128".parse::<BufferArg>(), Ok(BufferArg::Frames(128)));
        assert_eq!("2.5ms".parse::<BufferArg>(), Ok(BufferArg::Ms(2.5)));
        assert!("soon".parse::<BufferArg>().unwrap_err().contains("use auto"));
        assert!("900ms".parse::<BufferArg>().is_err());
        assert_eq!(
            BufferArg::Frames(48).mode(48_000),
            BufferMode::Fixed { ns: 1_000_000 }
        );
    }

    #[test]
    fn a_path_in_a_missing_directory_is_refused_with_its_name() {
        let path = std::env::temp_dir().join("netjam-no-such-dir-7f3a/x.wav");
        let e = check_writable(&path, "--output")
            .expect_err("refused")
            .to_string();
        assert!(
            e.contains("netjam-no-such-dir-7f3a/x.wav") && e.contains("--output"),
            "{e}"
        );
    }

    #[test]
    fn a_new_file_is_probed_and_removed_and_an_existing_one_kept() {
        let dir = std::env::temp_dir().join(format!("netjam-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let new = dir.join("new.json");
        check_writable(&new, "--stats-json").expect("writable");
        assert!(!new.exists(), "the probe was left behind");
        let old = dir.join("old.json");
        std::fs::write(&old, b"keep").expect("write");
        check_writable(&old, "--stats-json").expect("writable");
        assert_eq!(std::fs::read(&old).expect("read"), b"keep");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
