//! The player's settings file: defaults for what a musician would otherwise type every time,
//! so joining a band is `netjam jam --room NAME`.
//!
//! The file is TOML at `$NETJAM_CONFIG`, else the platform's configuration directory
//! (`~/.config/netjam/config.toml` on Linux, `~/Library/Application Support/netjam/config.toml`
//! on macOS, `%APPDATA%\netjam\config.toml` on Windows):
//!
//! ```toml
//! server = "rooms.example.org"   # the rooms server, HOST or HOST:PORT
//! name = "ana"                   # the name the others see
//! ```
//!
//! A missing file is no settings; a file that cannot be read, is not TOML or names an
//! unknown setting is refused with its path and what to fix, before anything starts.
//! Flags always win over the file.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// What the settings file may say.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The rooms server (`--server`).
    pub server: Option<String>,
    /// Your name in a room (`--name`).
    pub name: Option<String>,
}

/// Where the settings file is looked for.
pub fn path() -> Option<PathBuf> {
    match std::env::var_os("NETJAM_CONFIG") {
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => dirs::config_dir().map(|d| d.join("netjam").join("config.toml")),
    }
}

/// Parses settings from `text` (what the file at `path` holds).
pub fn parse(text: &str, path: &Path) -> anyhow::Result<Config> {
    toml::from_str(text).with_context(|| {
        format!(
            "{} is not a netjam settings file (it may set `server = \"HOST[:PORT]\"` and `name = \"YOU\"`): fix or remove it",
            path.display()
        )
    })
}

/// The settings, and the file they came from; no file is no settings.
pub fn load() -> anyhow::Result<(Config, Option<PathBuf>)> {
    let Some(path) = path() else {
        return Ok((Config::default(), None));
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok((parse(&text, &path)?, Some(path))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Config::default(), Some(path))),
        Err(e) => Err(e).with_context(|| {
            format!(
                "cannot read the settings file {}: fix its permissions or remove it",
                path.display()
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_and_unknown_ones_are_refused() {
        let p = Path::new("config.toml");
        let c = parse("server = \"rooms.example.org:4464\"\nname = \"ana\"\n", p).expect("valid");
        assert_eq!(c.server.as_deref(), Some("rooms.example.org:4464"));
        assert_eq!(c.name.as_deref(), Some("ana"));
        assert_eq!(parse("", p).expect("empty is fine"), Config::default());
        let e = parse("sever = \"x\"\n", p).expect_err("typo refused");
        assert!(format!("{e:#}").contains("unknown field"), "{e:#}");
        let e = parse("server = 4464\n", p).expect_err("wrong type refused");
        assert!(format!("{e:#}").contains("config.toml"), "{e:#}");
    }
}
