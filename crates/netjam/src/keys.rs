//! The keys of the control channel on disk: a rooms server's static key, and the keys a
//! player has pinned for the servers it played on.
//!
//! * **The server's key** ([`load_or_create`]): 32 bytes, hex, in a file only its owner
//!   reads (default `~/.local/state/netjam/server.key`, or `netjam server --key FILE`).
//!   Made on first start. Several servers started at once with one file take one key: the
//!   key is written whole into a file of its own and then linked into place, so no
//!   server reads half a key and the first one linked wins.
//! * **Pinned keys** ([`KnownServers`]): one `HOST:PORT HEX` line per server, in
//!   `~/.config/netjam/known_servers` or the file `NETJAM_KNOWN_SERVERS` names. A player
//!   takes a server's key the first time and refuses another one after (as SSH does);
//!   a server on this machine's loopback is pinned only in a file the variable names,
//!   since test servers come and go on reused ports there, most with a key of their own
//!   run.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use netjam_engine::room::secure::{StaticKey, KEY_LEN};

/// The variable naming the file of pinned keys.
pub const KNOWN_SERVERS_VAR: &str = "NETJAM_KNOWN_SERVERS";

/// Where a server keeps its key unless told (`None` without a home directory).
pub fn default_key_path() -> Option<PathBuf> {
    dirs::state_dir()
        .or_else(|| dirs::home_dir().map(|h| h.join(".local").join("state")))
        .map(|d| d.join("netjam").join("server.key"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; KEY_LEN]> {
    let s = s.trim();
    if s.len() != 2 * KEY_LEN || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; KEY_LEN];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The server's key from `path`, made there first when the file does not exist.
pub fn load_or_create(path: &Path) -> anyhow::Result<StaticKey> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            return unhex(&text).map(StaticKey::from_private).with_context(|| {
                format!(
                    "{} holds no server key (64 hex digits): remove it to make a new one (players who pinned the old key will refuse the new one until they forget it)",
                    path.display()
                )
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot read the server key {}", path.display())),
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| {
        format!(
            "cannot make {} for the server key: name another file with --key",
            dir.display()
        )
    })?;
    let key = StaticKey::generate().map_err(|e| anyhow::anyhow!("cannot make a server key: {e}"))?;
    let tmp = dir.join(format!(
        ".server-key-{}-{}",
        std::process::id(),
        hex(&key.public()[..4])
    ));
    let written = (|| -> std::io::Result<()> {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp)?;
        f.write_all(hex(key.private()).as_bytes())?;
        f.write_all(b"\n")?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| {
            format!(
                "cannot write the server key into {}: name another file with --key",
                dir.display()
            )
        });
    }
    // Linked into place only whole; another server that linked first wins, and its key is
    // the one every server on this file takes.
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(key),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => load_or_create(path),
        Err(e) => Err(e).with_context(|| format!("cannot write the server key {}", path.display())),
    }
}

/// The keys a player has pinned, one per server.
#[derive(Debug, Clone)]
pub struct KnownServers {
    path: Option<PathBuf>,
    /// Whether servers on the loopback are pinned too (the file was named).
    loopback: bool,
}

impl KnownServers {
    /// The file the environment names, or the default one.
    pub fn from_env() -> Self {
        match std::env::var_os(KNOWN_SERVERS_VAR).filter(|v| !v.is_empty()) {
            Some(p) => Self::at(PathBuf::from(p)),
            None => Self {
                path: dirs::config_dir().map(|d| d.join("netjam").join("known_servers")),
                loopback: false,
            },
        }
    }

    /// The pins in `path`, loopback servers included.
    pub fn at(path: PathBuf) -> Self {
        Self {
            path: Some(path),
            loopback: true,
        }
    }

    /// The file, if there is one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn kept(&self, server: SocketAddr) -> bool {
        self.path.is_some() && (self.loopback || !server.ip().is_loopback())
    }

    /// The key pinned for `server`, if any.
    pub fn get(&self, server: SocketAddr) -> Option<[u8; KEY_LEN]> {
        if !self.kept(server) {
            return None;
        }
        let text = std::fs::read_to_string(self.path.as_ref()?).ok()?;
        let want = server.to_string();
        text.lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(who, _)| *who == want)
            .find_map(|(_, k)| unhex(k))
    }

    /// Pins `key` for `server` (a line added to the file). Returns where, or `None` when
    /// this server is not kept; an error when the file cannot be written.
    pub fn pin(&self, server: SocketAddr, key: &[u8; KEY_LEN]) -> anyhow::Result<Option<&Path>> {
        let Some(path) = self.path.as_deref().filter(|_| self.kept(server)) else {
            return Ok(None);
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("cannot make {}", dir.display()))?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot write {}", path.display()))?;
        writeln!(f, "{server} {}", hex(key)).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Some(path))
    }

    /// What to tell a player whose server showed another key than pinned.
    pub fn changed_message(&self, server: SocketAddr, pinned: &str, offered: &str) -> String {
        let file = self.path.as_deref().map_or_else(
            || "the file of known servers".to_owned(),
            |p| p.display().to_string(),
        );
        format!(
            "the rooms server {server} showed the key {offered}, not {pinned} as pinned in {file}. If its operator changed its key (ask them for its fingerprint: `netjam server` prints it), delete the line for {server} in that file and join again; otherwise someone is in the way, and this player will not talk to them"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("netjam-keys-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_server_key_is_made_once_kept_private_and_read_back() {
        let d = tmp("server");
        let path = d.join("state").join("server.key");
        let k1 = load_or_create(&path).expect("made");
        let k2 = load_or_create(&path).expect("read");
        assert_eq!(k1.public(), k2.public());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o077, 0, "readable by others: {mode:o}");
        }
        std::fs::write(&path, "not a key").expect("write");
        let e = load_or_create(&path).expect_err("refused");
        assert!(e.to_string().contains("holds no server key"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn servers_started_at_once_on_one_file_take_one_key() {
        let d = tmp("race");
        let path = d.join("server.key");
        let keys: Vec<[u8; 32]> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| *load_or_create(&path).expect("key").public()))
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
        let left: Vec<_> = std::fs::read_dir(&d).expect("dir").collect();
        assert_eq!(left.len(), 1, "temporary files left behind");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn pins_are_kept_per_server_and_loopback_only_in_a_named_file() {
        let d = tmp("pins");
        let named = KnownServers::at(d.join("known"));
        let far: SocketAddr = "192.0.2.7:4464".parse().expect("addr");
        let near: SocketAddr = "127.0.0.1:4464".parse().expect("addr");
        assert_eq!(named.get(far), None);
        assert!(named.pin(far, &[1; 32]).expect("pinned").is_some());
        assert!(named.pin(near, &[2; 32]).expect("pinned").is_some());
        assert_eq!(named.get(far), Some([1; 32]));
        assert_eq!(named.get(near), Some([2; 32]));
        assert_eq!(named.get("192.0.2.7:4465".parse().expect("addr")), None);
        let default = KnownServers {
            path: Some(d.join("default")),
            loopback: false,
        };
        assert_eq!(default.pin(near, &[3; 32]).expect("not kept"), None);
        assert_eq!(default.get(near), None);
        let msg = named.changed_message(far, "aaaa", "bbbb");
        assert!(msg.contains("delete the line for 192.0.2.7:4464"), "{msg}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
