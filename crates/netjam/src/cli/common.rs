//! Pieces shared by the streaming subcommands: format flags, buffer flags, identity, and
//! the `--event`/`--events` flags of scripted link events.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use netjam_engine::link::{spec_lines, EventSpecError, LinkEvent, LinkSchedule, Transition};

use crate::link_emulator::EmulatorEvents;

/// Resolve `HOST:PORT` to one address.
pub fn resolve(s: &str) -> anyhow::Result<SocketAddr> {
    resolve_host(s, None, "the address")
}

/// Resolve `HOST:PORT`, or `HOST` alone when there is a `default_port` (a bare IPv6
/// address too), given on the command line as `what` (e.g. `--server`): every address a
/// user types goes through here, so they all take the same forms and fail the same way.
pub fn resolve_host(s: &str, default_port: Option<u16>, what: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    let with_port = match default_port {
        _ if s.parse::<SocketAddr>().is_ok() => s.to_string(),
        Some(_)
            if s.rsplit_once(':')
                .is_some_and(|(h, p)| !h.contains(':') && p.parse::<u16>().is_ok()) =>
        {
            s.to_string()
        }
        // A bare IPv6 address.
        Some(port) if s.contains(':') && !s.starts_with('[') => format!("[{s}]:{port}"),
        Some(port) => format!("{s}:{port}"),
        None => s.to_string(),
    };
    let forms = if default_port.is_some() {
        "HOST or HOST:PORT"
    } else {
        "HOST:PORT (e.g. 203.0.113.5:4464 or jam.example.org:4464)"
    };
    with_port
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {what} {s:?}: give {forms}"))?
        .next()
        .with_context(|| format!("{what} {s:?} resolves to no address"))
}

/// `HOST` or `HOST:PORT` of a rooms server (port 4464 unless given).
pub fn resolve_server(s: &str) -> anyhow::Result<SocketAddr> {
    resolve_host(s, Some(crate::server::DEFAULT_PORT), "--server")
}

/// `--server A[,B...]`: rooms servers sharing a room directory, asked in order when the
/// one before does not answer: the first, and the others.
pub fn resolve_servers(s: &str) -> anyhow::Result<(SocketAddr, Vec<SocketAddr>)> {
    let mut all = Vec::new();
    for part in s.split(',').map(str::trim) {
        if part.is_empty() {
            anyhow::bail!(
                "--server {s:?} names an empty server: give HOST[:PORT], or several separated by commas"
            );
        }
        all.push(resolve_server(part)?);
    }
    match all.split_first() {
        Some((first, others)) => Ok((*first, others.to_vec())),
        None => anyhow::bail!("--server needs HOST[:PORT]"),
    }
}

/// Which directions of an emulated link a scripted link event acts on (`up`: from the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventDirs {
    Up,
    Down,
    Both,
}

impl EventDirs {
    pub fn covers(self, up: bool) -> bool {
        match self {
            EventDirs::Both => true,
            EventDirs::Up => up,
            EventDirs::Down => !up,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            EventDirs::Up => "up",
            EventDirs::Down => "down",
            EventDirs::Both => "up+down",
        }
    }
}

/// The link events given by `--event [up:|down:]SPEC` and `--events FILE`, in time order.
#[derive(Debug, Clone, Default)]
pub struct EventArgs {
    events: Vec<(EventDirs, LinkEvent)>,
}

/// `up:SPEC`, `down:SPEC`, `both:SPEC` or a bare SPEC (both).
fn directed(spec: &str) -> Result<(EventDirs, LinkEvent), EventSpecError> {
    let spec = spec.trim();
    let (dirs, rest) = [
        ("up:", EventDirs::Up),
        ("down:", EventDirs::Down),
        ("both:", EventDirs::Both),
    ]
    .into_iter()
    .find_map(|(prefix, dirs)| {
        spec.get(..prefix.len())
            .filter(|p| p.eq_ignore_ascii_case(prefix))
            .map(|_| (dirs, &spec[prefix.len()..]))
    })
    .unwrap_or((EventDirs::Both, spec));
    Ok((dirs, rest.parse()?))
}

impl EventArgs {
    /// Parse every spec and every file, naming the flag, file and line of the first bad one.
    pub fn parse(specs: &[String], files: &[PathBuf]) -> anyhow::Result<Self> {
        let mut events = Vec::new();
        for spec in specs {
            let e = directed(spec).map_err(|e| {
                anyhow::anyhow!("--event {spec:?}: {e} (prefix up: or down: for one direction)")
            })?;
            events.push(e);
        }
        for file in files {
            let text = std::fs::read_to_string(file).with_context(|| {
                format!(
                    "cannot read --events {}: give a file with one event per line",
                    file.display()
                )
            })?;
            for (line, spec) in spec_lines(&text) {
                let e = directed(spec)
                    .map_err(|e| anyhow::anyhow!("{} line {line} `{spec}`: {e}", file.display()))?;
                events.push(e);
            }
        }
        events.sort_by_key(|(_, e)| e.at_ns);
        Ok(Self { events })
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Every event with its directions, in time order.
    pub fn events(&self) -> &[(EventDirs, LinkEvent)] {
        &self.events
    }

    /// The schedule of one direction.
    pub fn schedule(&self, up: bool) -> LinkSchedule {
        LinkSchedule::new(
            self.events
                .iter()
                .filter(|(d, _)| d.covers(up))
                .map(|(_, e)| *e)
                .collect(),
        )
    }

    /// Both directions' schedules.
    pub fn emulator_events(&self) -> EmulatorEvents {
        EmulatorEvents {
            up: self.schedule(true),
            down: self.schedule(false),
        }
    }

    /// Every begin and end, in time order; `event` indexes [`EventArgs::events`].
    pub fn transitions(&self) -> Vec<Transition> {
        LinkSchedule::new(self.events.iter().map(|(_, e)| *e).collect()).transitions()
    }

    /// One line per event: directions, spec, and when it acts (seconds from the origin).
    pub fn describe(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|(d, e)| {
                let start = e.at_ns as f64 / 1e9;
                let when = match e.end_ns() {
                    Some(end) => format!("{start:.3} s to {:.3} s", end as f64 / 1e9),
                    None => format!("from {start:.3} s on"),
                };
                format!("{:<8} {:<24} {when}", d.name(), e.to_string())
            })
            .collect()
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
    use crate::shell::BufferSize;
    use netjam_engine::delay::BufferMode;

    #[test]
    fn event_flags_take_a_direction_prefix_and_name_a_bad_file_line() {
        let specs = [
            "5s:stall=200ms".to_string(),
            "UP:1s:delay=+5ms".to_string(),
            "down:2s:loss=5%/1s".to_string(),
        ];
        let ev = EventArgs::parse(&specs, &[]).expect("parses");
        let dirs: Vec<EventDirs> = ev.events().iter().map(|(d, _)| *d).collect();
        assert_eq!(
            dirs,
            [EventDirs::Up, EventDirs::Down, EventDirs::Both],
            "sorted by time"
        );
        assert_eq!(ev.schedule(true).events().len(), 2);
        assert_eq!(ev.schedule(false).events().len(), 2);
        assert_eq!(ev.transitions().len(), 5);
        let err = EventArgs::parse(&["sideways:5s:stall=1s".to_string()], &[]).expect_err("bad prefix");
        assert!(
            err.to_string().contains("--event \"sideways:5s:stall=1s\""),
            "{err}"
        );
        let file = std::env::temp_dir().join(format!("netjam-events-{}.txt", std::process::id()));
        std::fs::write(
            &file,
            "# route change\n\nup:10s:delay=-10ms\n5s:stall=200ms # AP\n3s:jitter=30ms\n",
        )
        .expect("write");
        let err = EventArgs::parse(&[], std::slice::from_ref(&file)).expect_err("bad line 5");
        let _ = std::fs::remove_file(&file);
        let msg = err.to_string();
        assert!(
            msg.contains("line 5 `3s:jitter=30ms`") && msg.contains("size and a duration"),
            "{msg}"
        );
        let err = EventArgs::parse(&[], &[file]).expect_err("missing file");
        assert!(err.to_string().contains("cannot read --events"), "{err}");
    }

    #[test]
    fn buffer_flag_forms() {
        assert_eq!("auto".parse::<BufferSize>(), Ok(BufferSize::Auto));
        assert_eq!("128".parse::<BufferSize>(), Ok(BufferSize::Frames(128)));
        assert_eq!("2.5ms".parse::<BufferSize>(), Ok(BufferSize::Ms(2.5)));
        assert!("soon".parse::<BufferSize>().unwrap_err().contains("use auto"));
        assert!("900ms".parse::<BufferSize>().is_err());
        assert_eq!(
            BufferSize::Frames(48).mode(48_000),
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
