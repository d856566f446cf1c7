//! What the sound cards offer, as `netjam devices` lists them, and why one could not be
//! used ([`CpalError`]). Nothing here runs while a stream plays.

use cpal::traits::{DeviceTrait, HostTrait};
use cpal::{SampleFormat as DeviceFormat, SupportedBufferSize};

use super::{Direction, COMMON_RATES};

// ---------------------------------------------------------------------------------------
// Errors, listing

/// Why a sound card could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CpalError {
    #[error("no audio host {name:?} in this build; hosts: {available}")]
    UnknownHost { name: String, available: String },
    #[error("audio host {0} is not available on this machine")]
    HostUnavailable(String),
    #[error("cannot list the devices of {host}: {why}")]
    Devices { host: String, why: String },
    #[error("{direction} device {pattern:?} is ambiguous, it matches: {matches}; give more of the name")]
    Ambiguous {
        direction: &'static str,
        pattern: String,
        matches: String,
    },
    #[error("no {direction} device matches {pattern:?}; {host} has:\n{available}")]
    NoMatch {
        direction: &'static str,
        pattern: String,
        host: String,
        available: String,
    },
    #[error("{direction} device {device}: {why}; it offers:\n{offers}")]
    Unsupported {
        direction: &'static str,
        device: String,
        why: String,
        offers: String,
    },
    #[error("no input and no output device to use on {host}; it has:\n{available}")]
    NoDevice { host: String, available: String },
    #[error("cannot open the {direction} stream of {device}: {why}")]
    Build {
        direction: &'static str,
        device: String,
        why: String,
    },
}

/// What one direction of a device offers.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DirectionInfo {
    /// Channel counts it opens with in a sample format netjam converts (i16, i32, f32).
    pub channels: Vec<u16>,
    /// Sample rate ranges, inclusive (a single rate is `[r, r]`).
    pub rates: Vec<[u32; 2]>,
    /// Frames per buffer it accepts, when the host says.
    pub buffer_frames: Option<[u32; 2]>,
    /// Sample formats it offers (all of them, usable or not).
    pub formats: Vec<String>,
    /// Why it could not be asked, if it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl DirectionInfo {
    pub(super) fn supports_rate(&self, rate: u32) -> bool {
        self.rates.iter().any(|r| (r[0]..=r[1]).contains(&rate))
    }

    /// "2 ch, 48000 Hz, buffer 128-262144 frames, f32" (channel counts and rates compacted).
    pub fn summary(&self) -> String {
        if let Some(e) = &self.error {
            return format!("cannot be opened ({e})");
        }
        if self.channels.is_empty() {
            return format!(
                "no format netjam converts (it offers {}; netjam takes i16, i32, f32)",
                self.formats.join(", ")
            );
        }
        let buffer = match self.buffer_frames {
            Some([lo, hi]) => format!(", buffer {lo}-{hi} frames"),
            None => String::new(),
        };
        format!(
            "{} ch, {} Hz{buffer}, {}",
            compact(&self.channels),
            rates_text(&self.rates),
            self.formats.join("/")
        )
    }
}

/// "1-8" for a run, "1,2,4" otherwise.
pub(super) fn compact(v: &[u16]) -> String {
    match (v.first(), v.last()) {
        (Some(&a), Some(&b)) if v.len() > 2 && (b - a) as usize + 1 == v.len() => format!("{a}-{b}"),
        _ => v.iter().map(u16::to_string).collect::<Vec<_>>().join(","),
    }
}

pub(super) fn rates_text(rates: &[[u32; 2]]) -> String {
    let mut parts = Vec::new();
    for r in rates {
        if r[0] == r[1] {
            parts.push(r[0].to_string());
        } else {
            let common: Vec<String> = COMMON_RATES
                .iter()
                .filter(|x| (r[0]..=r[1]).contains(x))
                .map(u32::to_string)
                .collect();
            parts.push(format!("{}-{} (e.g. {})", r[0], r[1], common.join(", ")));
        }
    }
    parts.join(", ")
}

/// A device as `netjam devices` and the error messages show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceInfo {
    /// The host's identifier (the ALSA PCM name, e.g. `hw:CARD=PCH,DEV=0`); `--device` matches it.
    pub id: String,
    /// The human name; `--device` matches it too.
    pub name: String,
    pub input: Option<DirectionInfo>,
    pub output: Option<DirectionInfo>,
    pub default_input: bool,
    pub default_output: bool,
}

impl DeviceInfo {
    pub(super) fn label(&self) -> String {
        if self.name.is_empty() || self.name == self.id {
            self.id.clone()
        } else {
            format!("{} ({})", self.id, self.name)
        }
    }
}

/// One cpal host and its devices.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostInfo {
    pub name: String,
    pub default: bool,
    pub devices: Vec<DeviceInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

pub(super) fn direction_info(
    configs: Result<Vec<cpal::SupportedStreamConfigRange>, String>,
) -> DirectionInfo {
    let configs = match configs {
        Ok(c) => c,
        Err(e) => {
            return DirectionInfo {
                error: Some(e),
                ..Default::default()
            }
        }
    };
    let mut info = DirectionInfo::default();
    for c in &configs {
        let format = c.sample_format().to_string();
        if !info.formats.contains(&format) {
            info.formats.push(format);
        }
        if usable(c.sample_format()) {
            info.channels.push(c.channels());
            let r = [c.min_sample_rate(), c.max_sample_rate()];
            if !info.rates.contains(&r) {
                info.rates.push(r);
            }
        }
        if let SupportedBufferSize::Range { min, max } = *c.buffer_size() {
            info.buffer_frames = Some(match info.buffer_frames {
                Some([lo, hi]) => [lo.min(min), hi.max(max)],
                None => [min, max],
            });
        }
    }
    info.channels.sort_unstable();
    info.channels.dedup();
    info.rates.sort_unstable();
    info
}

pub(super) fn usable(f: DeviceFormat) -> bool {
    matches!(f, DeviceFormat::F32 | DeviceFormat::I32 | DeviceFormat::I16)
}

pub(super) fn device_id(d: &cpal::Device) -> String {
    d.id().map(|id| id.1).unwrap_or_default()
}

pub(super) fn device_name(d: &cpal::Device) -> String {
    d.description()
        .map(|desc| desc.name().to_string())
        .unwrap_or_default()
}

/// cpal's reasons in a few words.
pub(super) fn configs_error(e: cpal::SupportedStreamConfigsError) -> String {
    match e {
        cpal::SupportedStreamConfigsError::DeviceNotAvailable => "not available".into(),
        cpal::SupportedStreamConfigsError::BackendSpecific { err } => err.description,
        e => e.to_string(),
    }
}

pub(super) fn input_configs(d: &cpal::Device) -> Result<Vec<cpal::SupportedStreamConfigRange>, String> {
    d.supported_input_configs()
        .map(Iterator::collect)
        .map_err(configs_error)
}

pub(super) fn output_configs(d: &cpal::Device) -> Result<Vec<cpal::SupportedStreamConfigRange>, String> {
    d.supported_output_configs()
        .map(Iterator::collect)
        .map_err(configs_error)
}

pub(super) fn describe(host: &cpal::Host, d: &cpal::Device) -> DeviceInfo {
    let id = device_id(d);
    let is_default = |def: Option<cpal::Device>| def.is_some_and(|x| device_id(&x) == id);
    DeviceInfo {
        name: device_name(d),
        input: d.supports_input().then(|| direction_info(input_configs(d))),
        output: d.supports_output().then(|| direction_info(output_configs(d))),
        default_input: d.supports_input() && is_default(host.default_input_device()),
        default_output: d.supports_output() && is_default(host.default_output_device()),
        id,
    }
}

/// Every host cpal was built with on this platform, its devices and what they offer.
/// Opens each device briefly to ask; the libraries' own complaints are kept off stderr.
pub fn hosts() -> Vec<HostInfo> {
    let _quiet = QuietStderr::new();
    let default = cpal::default_host().id();
    cpal::available_hosts()
        .into_iter()
        .map(|id| {
            let name = id.name().to_string();
            let host = match cpal::host_from_id(id) {
                Ok(h) => h,
                Err(e) => {
                    return HostInfo {
                        name,
                        default: id == default,
                        devices: Vec::new(),
                        error: Some(e.to_string()),
                    }
                }
            };
            let (devices, error) = match host.devices() {
                Ok(list) => (list.map(|d| describe(&host, &d)).collect(), None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            };
            HostInfo {
                name,
                default: id == default,
                devices,
                error,
            }
        })
        .collect()
}

/// Lines "  id (name): in ..., out ..." for the devices of `host` that go `direction`.
pub(super) fn list_devices(host: &cpal::Host, direction: Option<Direction>) -> String {
    let Ok(devices) = host.devices() else {
        return "  (cannot list its devices)".into();
    };
    let mut lines = Vec::new();
    for d in devices {
        if direction.is_some_and(|dir| !dir.supported_by(&d)) {
            continue;
        }
        let info = describe(host, &d);
        let mut parts = Vec::new();
        if let Some(i) = &info.input {
            parts.push(format!("in {}", i.summary()));
        }
        if let Some(o) = &info.output {
            parts.push(format!("out {}", o.summary()));
        }
        lines.push(format!("  {}: {}", info.label(), parts.join("; ")));
    }
    if lines.is_empty() {
        "  (no devices)".into()
    } else {
        lines.join("\n")
    }
}

/// Keeps fd 2 pointed at /dev/null while alive: ALSA, libjack and the ALSA plugins print
/// their own complaints while devices are probed; netjam says what went wrong itself.
pub(super) struct QuietStderr {
    #[cfg(unix)]
    saved: libc::c_int,
}

impl QuietStderr {
    pub(super) fn new() -> Self {
        #[cfg(unix)]
        {
            if std::env::var_os("NETJAM_AUDIO_DEBUG").is_some() {
                return Self { saved: -1 };
            }
            // SAFETY: plain descriptor calls on fds this function owns (`saved`, `null`) and
            // on fd 2, which is restored on drop.
            unsafe {
                let saved = libc::dup(2);
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY);
                if saved >= 0 && null >= 0 {
                    libc::dup2(null, 2);
                }
                if null >= 0 {
                    libc::close(null);
                }
                Self { saved }
            }
        }
        #[cfg(not(unix))]
        Self {}
    }
}

impl Drop for QuietStderr {
    fn drop(&mut self) {
        #[cfg(unix)]
        if self.saved >= 0 {
            // SAFETY: `saved` is the duplicate of the original fd 2 made in `new`.
            unsafe {
                libc::dup2(self.saved, 2);
                libc::close(self.saved);
            }
        }
    }
}
