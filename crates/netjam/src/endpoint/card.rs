//! The sound card a player opens (`jam --device`, `--input-device`, `--output-device`,
//! `--host`): what is asked of it, the checks that it can capture and play what a jam
//! sends and hears, and what the player shows and reports about it while it runs. Without
//! the `cpal` feature the flags only say how to get it.

use crate::endpoint::channels::ChannelMap;

/// What a player asks of a sound card (`--host`, `--device`, …); a request naming no device,
/// host or direction opens none.
#[derive(Debug, Clone, Default)]
pub struct CardRequest {
    /// cpal host (ALSA, JACK, CoreAudio, WASAPI...), case-insensitive; default: the platform's.
    pub host: Option<String>,
    /// Device for both directions: a case-insensitive substring of its id or name,
    /// `default`, or `none`.
    pub device: Option<String>,
    /// Overrides `device` for capture.
    pub input_device: Option<String>,
    /// Overrides `device` for playback.
    pub output_device: Option<String>,
    /// Sample rate; default 48000 when every device takes it, else the output's default.
    pub rate: Option<u32>,
    /// Channels each way; default 2 where offered, else the device's default. A map below
    /// sets its own direction's count instead.
    pub channels: Option<u16>,
    /// `--inputs`: the capture channels sent; the device opens with enough to reach them.
    pub inputs: Option<ChannelMap>,
    /// `--outputs`: the playback channels what you hear goes to; the rest play silence.
    pub outputs: Option<ChannelMap>,
    /// Frames per process call (asked of the device as its buffer size too).
    pub period: u32,
}

impl CardRequest {
    /// Whether any flag names a sound card.
    pub fn wants_card(&self) -> bool {
        self.device.is_some()
            || self.input_device.is_some()
            || self.output_device.is_some()
            || self.host.is_some()
    }
}

pub use imp::*;

#[cfg(feature = "cpal")]
mod imp {
    use anyhow::{bail, Context};

    use super::CardRequest;
    use crate::endpoint::cpal::{CpalEndpoint, CpalMonitor};
    use crate::endpoint::Realtime;
    use crate::endpoint::{Endpoint, PeriodStats, StreamSpec};

    /// An open sound card.
    #[derive(Debug)]
    pub struct Card(CpalEndpoint);

    /// How the sound card ran.
    #[derive(Debug, serde::Serialize)]
    pub struct Report {
        rate: u32,
        period: u32,
        /// Frames per device callback (netjam runs whole periods over them).
        callback_frames: usize,
        /// Frames netjam adds between capture and playback beyond the device's buffers.
        added_latency_frames: usize,
        realtime: bool,
        realtime_priority: Option<i32>,
        xruns: u64,
        adapter_underruns: u64,
        bridge_underruns: u64,
        bridge_dropped_frames: u64,
    }

    impl Report {
        /// Frames the card path holds: a callback each way plus the capture-to-playback
        /// cushion.
        pub fn device_frames(&self) -> usize {
            2 * self.callback_frames + self.added_latency_frames
        }
    }

    /// Open the sound card `r` names, with its period and its rate and channels as asked
    /// (else what it offers); None when it names none.
    pub fn open(r: &CardRequest) -> anyhow::Result<Option<Card>> {
        if !r.wants_card() {
            return Ok(None);
        }
        if r.channels == Some(0) {
            bail!("--channels must be at least 1");
        }
        let endpoint = CpalEndpoint::open(r).context("cannot use the sound card (--device)")?;
        for note in endpoint.notes() {
            eprintln!("netjam: {note}");
        }
        let spec = endpoint.spec();
        if spec.input_channels == 0 || spec.output_channels == 0 {
            bail!(
                "netjam jam captures and plays, but the sound card is {}: name one with both, or pick each with --input-device and --output-device",
                endpoint.describe()
            );
        }
        // Maps chosen by the player may differ in count: what you hear is mapped onto yours.
        let mapped = r.inputs.is_some() || r.outputs.is_some();
        if spec.input_channels != spec.output_channels && !mapped {
            bail!(
                "the sound card captures {} channels and plays {}: choose one count both offer with --channels",
                spec.input_channels,
                spec.output_channels
            );
        }
        Ok(Some(Card(endpoint)))
    }

    impl Card {
        pub fn spec(&self) -> StreamSpec {
            self.0.spec()
        }

        pub fn describe(&self) -> String {
            let s = self.0.spec();
            format!("{}; {} Hz, {}-frame periods", self.0.describe(), s.rate, s.period)
        }

        pub fn monitor(&self) -> CpalMonitor {
            self.0.monitor()
        }

        pub fn into_endpoint(self, limit: Option<u64>) -> Box<dyn Endpoint> {
            Box::new(self.0.with_limit(limit))
        }
    }

    /// The card's monitor, as the jam loop holds it.
    pub type Monitor = CpalMonitor;

    /// What the jam loop shows about the card.
    pub trait CardMonitor {
        /// One line on the callback's scheduling, once its first callback ran.
        fn realtime_line(&self) -> Option<String>;
        fn report(&self, rate: u32, period: u32, periods: &PeriodStats) -> Report;
    }

    impl CardMonitor for CpalMonitor {
        fn realtime_line(&self) -> Option<String> {
            match self.realtime() {
                Realtime::Unknown => None,
                r => Some(format!(
                    "sound card callbacks of {} frames, {r}",
                    self.callback_frames()
                )),
            }
        }

        fn report(&self, rate: u32, period: u32, periods: &PeriodStats) -> Report {
            let realtime = self.realtime();
            let (adapter, bridge, dropped) = self.glitches();
            eprintln!(
                "netjam: sound card: {} periods, {} missed deadlines ({} xruns), callback {:.1} µs mean, {:.1} µs worst; netjam adds {} frames ({:.2} ms) between capture and playback; {realtime}",
                periods.periods,
                periods.missed_deadlines,
                self.xruns(),
                periods.callback_mean_us,
                periods.callback_max_us,
                self.added_latency_frames(),
                self.added_latency_frames() as f64 * 1e3 / rate.max(1) as f64,
            );
            Report {
                rate,
                period,
                callback_frames: self.callback_frames(),
                added_latency_frames: self.added_latency_frames(),
                realtime: matches!(realtime, Realtime::Yes { .. }),
                realtime_priority: match realtime {
                    Realtime::Yes { priority } => Some(priority),
                    _ => None,
                },
                xruns: self.xruns(),
                adapter_underruns: adapter,
                bridge_underruns: bridge,
                bridge_dropped_frames: dropped,
            }
        }
    }
}

/// Without the `cpal` feature the device flags only say how to get it; no `Card` is ever
/// made, so its methods are never called.
#[cfg(not(feature = "cpal"))]
mod imp {
    use super::CardRequest;
    use crate::endpoint::{Endpoint, PeriodStats, StreamSpec};

    const NEVER: &str = "no sound card is opened without the cpal feature";

    #[derive(Debug)]
    pub struct Card(());

    #[derive(Debug, serde::Serialize)]
    pub struct Report;

    #[derive(Debug)]
    pub struct Monitor;

    pub fn open(r: &CardRequest) -> anyhow::Result<Option<Card>> {
        if r.wants_card() {
            anyhow::bail!("{}", crate::cli::devices::WITHOUT_CPAL);
        }
        Ok(None)
    }

    impl Card {
        pub fn spec(&self) -> StreamSpec {
            unreachable!("{NEVER}")
        }
        pub fn describe(&self) -> String {
            unreachable!("{NEVER}")
        }
        pub fn monitor(&self) -> Monitor {
            unreachable!("{NEVER}")
        }
        pub fn into_endpoint(self, _limit: Option<u64>) -> Box<dyn Endpoint> {
            unreachable!("{NEVER}")
        }
    }

    impl Monitor {
        pub fn realtime_line(&self) -> Option<String> {
            unreachable!("{NEVER}")
        }
        pub fn xruns(&self) -> u64 {
            unreachable!("{NEVER}")
        }
        pub fn output_latency_frames(&self, _rate: u32) -> u64 {
            unreachable!("{NEVER}")
        }
        pub fn report(&self, _rate: u32, _period: u32, _periods: &PeriodStats) -> Report {
            unreachable!("{NEVER}")
        }
    }

    impl Report {
        pub fn device_frames(&self) -> usize {
            unreachable!("{NEVER}")
        }
    }
}
