//! [`CpalEndpoint`]: a sound card through cpal (ALSA on Linux, CoreAudio on macOS, WASAPI
//! on Windows) as a clocked [`Endpoint`].
//!
//! cpal gives one stream per direction, each with its own callback thread, and does not
//! promise callbacks of a fixed size. So the endpoint is built from three small pieces:
//!
//! - [`InputBridge`]: with both an input and an output device, the input callback converts
//!   what it captures to f32 and pushes it into a lock-free ring; the output callback takes
//!   exactly as many frames as it has to play, after keeping a small cushion that absorbs the
//!   two threads' phase (learned from the callback sizes, grown after an underrun).
//! - [`PeriodAdapter`]: turns callbacks of any size into calls of [`Process::process`] of
//!   exactly `period` frames, with a fixed, stated latency (none when callbacks are whole
//!   periods).
//! - the device callbacks themselves, which run the adapter on the output thread (or the
//!   input thread when there is no output device) and convert i16, i32 or f32 samples.
//!
//! Everything the callbacks touch is reserved when the endpoint opens. They never allocate,
//! lock, block or log: their counters are atomics that [`Endpoint::run`] and
//! [`CpalMonitor`] read, and stream errors (a device unplugged) travel through a small ring
//! to `run`, which ends with an error saying so. A device that just stops calling back (the
//! ALSA JACK plugin when its server dies) is called gone after two seconds without progress.
//!

mod adapter;
mod devices;

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};
use cpal::{BufferSize, SampleFormat as DeviceFormat, StreamConfig};

use super::channels::{ChannelMap, MapSide};
use super::{Endpoint, PeriodStats, PeriodTimer, Process, Realtime, StopReason, StreamSpec};

use crate::clock;
pub use adapter::*;
pub use devices::*;

/// Largest number of frames the callbacks convert at once; a bigger device buffer is
/// handled in slices of this size.
pub const STAGING_FRAMES: usize = 4096;

/// How long `run` waits for a callback before it calls the stream dead, ns.
const STALL_NS: u64 = 2_000_000_000;

/// Capacity of the ring from the input callback to the output callback, in frames.
const BRIDGE_FRAMES: usize = 4 * STAGING_FRAMES;

/// Sample rates worth naming when a device accepts a continuous range.
const COMMON_RATES: [u32; 6] = [44_100, 48_000, 88_200, 96_000, 176_400, 192_000];

// ---------------------------------------------------------------------------------------
// The callbacks' state

/// Counters the callbacks keep for `run` and [`CpalMonitor`].
#[derive(Debug)]
struct Shared {
    /// Frames handed to the process.
    frames: AtomicU64,
    /// Over- and underruns the host reported.
    xruns: AtomicU64,
    /// A stream reported an error it cannot recover from (the message is in its ring).
    failed: AtomicBool,
    panicked: AtomicBool,
    /// Scheduling of the thread that runs the process (-1 until its first callback).
    policy: AtomicI32,
    priority: AtomicI32,
    /// Callbacks of the driving stream so far (armed or not).
    callbacks: AtomicU64,
    /// Frames per callback of the driving stream (0 until the first).
    callback_frames: AtomicUsize,
    adapter_latency: AtomicUsize,
    /// From a callback to its first frame being played, as the host reports it (ns; 0
    /// when it cannot tell).
    device_output_ns: AtomicU64,
    adapter_underruns: AtomicU64,
    bridge_target: AtomicUsize,
    bridge_underruns: AtomicU64,
    bridge_dropped: AtomicU64,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            frames: AtomicU64::new(0),
            xruns: AtomicU64::new(0),
            failed: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            policy: AtomicI32::new(-1),
            priority: AtomicI32::new(0),
            callbacks: AtomicU64::new(0),
            callback_frames: AtomicUsize::new(0),
            adapter_latency: AtomicUsize::new(0),
            device_output_ns: AtomicU64::new(0),
            adapter_underruns: AtomicU64::new(0),
            bridge_target: AtomicUsize::new(0),
            bridge_underruns: AtomicU64::new(0),
            bridge_dropped: AtomicU64::new(0),
        }
    }
}

/// The process `run` lends to the callbacks: written once before `armed` is set, read by
/// the driving callback only after it sees `armed`.
struct ProcessSlot {
    armed: AtomicBool,
    process: UnsafeCell<Option<*mut dyn Process>>,
}

// SAFETY: `process` is written only by `run` before `armed` is stored with Release, and read
// only by the one driving callback after it loads `armed` with Acquire; `run` drops the
// streams (joining their threads) before the borrowed process goes away.
unsafe impl Sync for ProcessSlot {}
// SAFETY: as above; the pointer is only dereferenced on the driving callback's thread.
unsafe impl Send for ProcessSlot {}

/// On Linux, ask for SCHED_FIFO once, from the callback thread itself (one system call, no
/// log), and record what the thread got. Elsewhere the host's own thread is left as it is
/// (CoreAudio's I/O thread already runs under a time-constraint policy; cpal raises WASAPI's
/// to time-critical) and only "the first callback ran" is recorded.
fn promote_and_record(shared: Option<&Shared>, want_realtime: bool) {
    #[cfg(target_os = "linux")]
    {
        if want_realtime {
            // What the thread got is read back below.
            let _ = crate::rt::set_fifo(crate::rt::AUDIO_PRIORITY);
        }
        if let Some(shared) = shared {
            // SAFETY: querying the calling thread's own scheduling into locals.
            let mut param: libc::sched_param = unsafe { std::mem::zeroed() };
            let mut policy = 0;
            // SAFETY: as above.
            if unsafe { libc::pthread_getschedparam(libc::pthread_self(), &mut policy, &mut param) } == 0 {
                shared.priority.store(param.sched_priority, Ordering::Relaxed);
                shared.policy.store(policy, Ordering::Relaxed);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = want_realtime;
        if let Some(shared) = shared {
            shared.policy.store(0, Ordering::Relaxed);
        }
    }
}

/// The state of the callback that runs the process: the output callback, or the input
/// callback when there is no output device.
struct Driver {
    spec: StreamSpec,
    slot: Arc<ProcessSlot>,
    shared: Arc<Shared>,
    adapter: PeriodAdapter,
    bridge: Option<InputBridge>,
    clock: CallbackClock,
    timer: PeriodTimer,
    period_ns: u64,
    frame_ns: f64,
    input: Vec<f32>,
    output: Vec<f32>,
    /// Device channels a frame each way and the maps between them and the stream's.
    device_in: usize,
    device_out: usize,
    in_map: ChannelMap,
    out_map: ChannelMap,
    last_time: u64,
    first: bool,
    want_realtime: bool,
    failed: bool,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("spec", &self.spec)
            .field("adapter", &self.adapter)
            .finish_non_exhaustive()
    }
}

impl Driver {
    fn new(
        spec: StreamSpec,
        slot: Arc<ProcessSlot>,
        shared: Arc<Shared>,
        bridge: Option<InputBridge>,
        want_realtime: bool,
    ) -> Self {
        Self {
            spec,
            slot,
            shared,
            adapter: PeriodAdapter::new(
                spec.period as usize,
                spec.input_channels as usize,
                spec.output_channels as usize,
                AdapterLatency::Learn,
            ),
            bridge,
            clock: CallbackClock::new(spec.rate),
            timer: PeriodTimer::default(),
            period_ns: netjam_engine::time::frames_to_ns(spec.period as u64, spec.rate),
            frame_ns: 1e9 / spec.rate.max(1) as f64,
            input: vec![0.0; STAGING_FRAMES * spec.input_channels as usize],
            output: vec![0.0; STAGING_FRAMES * spec.output_channels as usize],
            device_in: spec.input_channels as usize,
            device_out: spec.output_channels as usize,
            in_map: ChannelMap::identity(MapSide::Inputs, spec.input_channels),
            out_map: ChannelMap::identity(MapSide::Outputs, spec.output_channels),
            last_time: 0,
            first: true,
            want_realtime,
            failed: false,
        }
    }

    /// Move the stream's channels to and from these device channels (each map's length is
    /// the spec's channels that way).
    fn with_maps(
        mut self,
        in_map: ChannelMap,
        device_in: usize,
        out_map: ChannelMap,
        device_out: usize,
    ) -> Self {
        self.in_map = in_map;
        self.out_map = out_map;
        self.device_in = device_in;
        self.device_out = device_out;
        self
    }

    /// The output callback: play `data`, whatever its size.
    fn on_output<T: DeviceSample>(&mut self, data: &mut [T]) {
        let co = self.spec.output_channels as usize;
        let device_out = self.device_out.max(1);
        for block in data.chunks_mut(STAGING_FRAMES * device_out) {
            let frames = block.len() / device_out;
            self.guarded(frames, |d| {
                let ci = d.spec.input_channels as usize;
                let mut input = std::mem::take(&mut d.input);
                let mut output = std::mem::take(&mut d.output);
                if let Some(bridge) = &mut d.bridge {
                    bridge.pull(&mut input[..frames * ci]);
                }
                d.step(frames, &input[..frames * ci], &mut output[..frames * co]);
                d.out_map.scatter(
                    &output[..frames * co],
                    block,
                    d.device_out,
                    T::EQUILIBRIUM,
                    T::from_f32,
                );
                d.input = input;
                d.output = output;
            });
            if self.failed {
                block.fill(T::EQUILIBRIUM);
            }
        }
    }

    /// The input callback when there is no output device.
    fn on_input<T: DeviceSample>(&mut self, data: &[T]) {
        let ci = self.spec.input_channels as usize;
        let device_in = self.device_in.max(1);
        for block in data.chunks(STAGING_FRAMES * device_in) {
            let frames = block.len() / device_in;
            self.guarded(frames, |d| {
                let mut input = std::mem::take(&mut d.input);
                d.in_map
                    .gather(block, d.device_in, &mut input[..frames * ci], |y| y.to_f32());
                d.step(frames, &input[..frames * ci], &mut []);
                d.input = input;
            });
        }
    }

    /// Run `f` unless an earlier callback panicked; a panic must not unwind into the host:
    /// the stream goes silent and `run` reports it.
    fn guarded(&mut self, frames: usize, f: impl FnOnce(&mut Self)) {
        self.shared.callbacks.fetch_add(1, Ordering::Relaxed);
        if self.failed {
            return;
        }
        if self.first {
            self.first = false;
            promote_and_record(Some(&self.shared), self.want_realtime);
            self.shared.callback_frames.store(frames, Ordering::Relaxed);
        }
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self)));
        if ok.is_err() {
            self.failed = true;
            self.shared.panicked.store(true, Ordering::Relaxed);
        }
    }

    /// The realtime work of one callback slice: no allocation, no lock, no log.
    fn step(&mut self, frames: usize, input: &[f32], output: &mut [f32]) {
        let woke = clock::now_ns();
        let (due, late) = self.clock.tick(woke, frames);
        if !self.slot.armed.load(Ordering::Acquire) {
            output.fill(0.0);
            return;
        }
        // SAFETY: see `ProcessSlot`: armed, so the pointer was written before and stays
        // valid until `run` has dropped the streams; only this thread dereferences it.
        let Some(process) = (unsafe { *self.slot.process.get() }) else {
            output.fill(0.0);
            return;
        };
        // SAFETY: as above.
        let process = unsafe { &mut *process };
        let (timer, shared) = (&mut self.timer, &self.shared);
        let (period_ns, frame_ns, period) = (self.period_ns, self.frame_ns, self.spec.period);
        let last_time = &mut self.last_time;
        self.adapter.callback(frames, input, output, |first, inp, out| {
            // The period's first frame on the schedule of this callback's first frame, but
            // never in the future: a period that ends later in this callback's buffer runs
            // now, and its packet leaves now (as with JACK's nominal start).
            let start = clock::now_ns();
            let t = ((due as f64 + first as f64 * frame_ns).max(0.0) as u64).min(start);
            let t = t.max(*last_time + 1);
            *last_time = t;
            process.process(t, inp, out);
            timer.record(late, clock::now_ns().saturating_sub(start), period_ns);
            shared.frames.fetch_add(period as u64, Ordering::Relaxed);
        });
        let s = &self.shared;
        s.adapter_latency
            .store(self.adapter.latency_frames(), Ordering::Relaxed);
        s.adapter_underruns
            .store(self.adapter.underruns(), Ordering::Relaxed);
        if let Some(b) = &self.bridge {
            s.bridge_target.store(b.target(), Ordering::Relaxed);
            s.bridge_underruns.store(b.underruns(), Ordering::Relaxed);
            s.bridge_dropped.store(b.dropped(), Ordering::Relaxed);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Opening

/// Which sound card to open and how: what a player asks (see [`crate::endpoint::card`]).
pub use crate::endpoint::card::CardRequest as CpalConfig;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Input,
    Output,
}

impl Direction {
    fn word(self) -> &'static str {
        match self {
            Direction::Input => "input",
            Direction::Output => "output",
        }
    }

    fn supported_by(self, d: &cpal::Device) -> bool {
        match self {
            Direction::Input => d.supports_input(),
            Direction::Output => d.supports_output(),
        }
    }

    fn configs(self, d: &cpal::Device) -> Result<Vec<cpal::SupportedStreamConfigRange>, String> {
        match self {
            Direction::Input => input_configs(d),
            Direction::Output => output_configs(d),
        }
    }
}

/// The endpoint's callbacks without a device: exactly what the input and output streams'
/// callbacks run (bridge, period adapter, conversion, timing), driven by hand. Tests use it
/// to prove the callback path allocates nothing and passes audio through bit-exact.
pub struct OfflineCallbacks {
    driver: Box<Driver>,
    feeder: Option<InputFeeder>,
    slot: Arc<ProcessSlot>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for OfflineCallbacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfflineCallbacks")
            .field("driver", &self.driver)
            .finish_non_exhaustive()
    }
}

impl OfflineCallbacks {
    /// Callbacks for `spec`, duplex (an input bridge) when it has channels both ways.
    pub fn new(spec: StreamSpec) -> Self {
        let shared = Arc::new(Shared::default());
        let slot = Arc::new(ProcessSlot {
            armed: AtomicBool::new(false),
            process: UnsafeCell::new(None),
        });
        let (feeder, bridge) = if spec.input_channels > 0 && spec.output_channels > 0 {
            let (f, b) = InputBridge::new(spec.input_channels as usize, BRIDGE_FRAMES);
            (Some(f), Some(b))
        } else {
            (None, None)
        };
        let driver = Box::new(Driver::new(spec, slot.clone(), shared.clone(), bridge, false));
        Self {
            driver,
            feeder,
            slot,
            shared,
        }
    }

    /// Run `f` with `process` lent to the callbacks, as [`Endpoint::run`] does.
    pub fn with_process<R>(&mut self, process: &mut dyn Process, f: impl FnOnce(&mut Self) -> R) -> R {
        // SAFETY: only the lifetime is erased; the slot is cleared below before the borrow
        // ends, and the callbacks run on this thread only, inside `f`.
        let process: *mut dyn Process =
            unsafe { std::mem::transmute::<*mut (dyn Process + '_), *mut (dyn Process + 'static)>(process) };
        // SAFETY: no callback runs while this thread is here.
        unsafe { *self.slot.process.get() = Some(process) };
        self.slot.armed.store(true, Ordering::Release);
        let r = f(self);
        self.slot.armed.store(false, Ordering::Release);
        // SAFETY: as above.
        unsafe { *self.slot.process.get() = None };
        r
    }

    /// What the input stream's callback does with one buffer.
    pub fn input<T: DeviceSample>(&mut self, data: &[T]) {
        match &mut self.feeder {
            Some(feeder) => feeder.push(data),
            None => self.driver.on_input(data),
        }
    }

    /// What the output stream's callback does with one buffer.
    pub fn output<T: DeviceSample>(&mut self, data: &mut [T]) {
        self.driver.on_output(data);
    }

    pub fn monitor(&self) -> CpalMonitor {
        CpalMonitor {
            shared: self.shared.clone(),
        }
    }

    /// The periods run so far.
    pub fn stats(&self) -> PeriodStats {
        self.driver.timer.stats()
    }
}

/// Pick the host named `name` (case-insensitive), or the platform's default.
fn pick_host(name: Option<&str>) -> Result<cpal::Host, CpalError> {
    let Some(name) = name else {
        return Ok(cpal::default_host());
    };
    let hosts = cpal::available_hosts();
    let available = || {
        hosts
            .iter()
            .map(|h| h.name().to_lowercase())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let id = hosts
        .iter()
        .find(|h| h.name().eq_ignore_ascii_case(name))
        .ok_or_else(|| CpalError::UnknownHost {
            name: name.to_string(),
            available: available(),
        })?;
    cpal::host_from_id(*id).map_err(|_| CpalError::HostUnavailable(id.name().to_string()))
}

/// The device `pattern` names for `dir`: `default`, `none` (None), an exact id or name, or
/// the one device whose id or name contains it (all case-insensitive). `Ok(None)` also when
/// `explicit` is false and nothing matches (a `--device` that names only one direction).
fn pick_device(
    host: &cpal::Host,
    dir: Direction,
    pattern: Option<&str>,
    explicit: bool,
) -> Result<Option<cpal::Device>, CpalError> {
    let default = || match dir {
        Direction::Input => host.default_input_device(),
        Direction::Output => host.default_output_device(),
    };
    let pattern = match pattern {
        None => return Ok(default()),
        Some(p) if p.eq_ignore_ascii_case("none") => return Ok(None),
        Some(p) if p.eq_ignore_ascii_case("default") => return Ok(default()),
        Some(p) => p,
    };
    let devices: Vec<cpal::Device> = host
        .devices()
        .map_err(|e| CpalError::Devices {
            host: host.id().name().to_string(),
            why: e.to_string(),
        })?
        .filter(|d| dir.supported_by(d))
        .collect();
    let want = pattern.to_lowercase();
    let names = |d: &cpal::Device| [device_id(d).to_lowercase(), device_name(d).to_lowercase()];
    let exact: Vec<&cpal::Device> = devices.iter().filter(|d| names(d).contains(&want)).collect();
    let matches: Vec<&cpal::Device> = if exact.is_empty() {
        devices
            .iter()
            .filter(|d| names(d).iter().any(|n| n.contains(&want)))
            .collect()
    } else {
        exact
    };
    match matches.as_slice() {
        [one] => Ok(Some((*one).clone())),
        [] if !explicit => Ok(None),
        [] => Err(CpalError::NoMatch {
            direction: dir.word(),
            pattern: pattern.to_string(),
            host: host.id().name().to_string(),
            available: list_devices(host, Some(dir)),
        }),
        many => Err(CpalError::Ambiguous {
            direction: dir.word(),
            pattern: pattern.to_string(),
            matches: many
                .iter()
                .map(|d| {
                    let (id, name) = (device_id(d), device_name(d));
                    if name.is_empty() || name == id {
                        format!("{id:?}")
                    } else {
                        format!("{id:?} ({name})")
                    }
                })
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

/// One direction chosen: the device, what it offers, the stream to open.
struct Side {
    dir: Direction,
    device: cpal::Device,
    label: String,
    info: DirectionInfo,
    configs: Vec<cpal::SupportedStreamConfigRange>,
}

impl Side {
    fn unsupported(&self, why: String) -> CpalError {
        CpalError::Unsupported {
            direction: self.dir.word(),
            device: self.label.clone(),
            why,
            offers: format!("  {}", self.info.summary()),
        }
    }

    /// The best sample format for `channels` at `rate`: f32, then i32, then i16.
    fn format(&self, channels: u16, rate: u32) -> Option<DeviceFormat> {
        [DeviceFormat::F32, DeviceFormat::I32, DeviceFormat::I16]
            .into_iter()
            .find(|f| {
                self.configs.iter().any(|c| {
                    c.sample_format() == *f
                        && c.channels() == channels
                        && (c.min_sample_rate()..=c.max_sample_rate()).contains(&rate)
                })
            })
    }

    fn default_channels(&self) -> u16 {
        let default = match self.dir {
            Direction::Input => self.device.default_input_config(),
            Direction::Output => self.device.default_output_config(),
        };
        if self.info.channels.contains(&2) {
            2
        } else if let Some(c) = default
            .ok()
            .map(|c| c.channels())
            .filter(|c| self.info.channels.contains(c))
        {
            c
        } else {
            self.info.channels.first().copied().unwrap_or(2)
        }
    }

    fn default_rate(&self) -> Option<u32> {
        let default = match self.dir {
            Direction::Input => self.device.default_input_config(),
            Direction::Output => self.device.default_output_config(),
        };
        default.ok().map(|c| c.sample_rate())
    }
}

fn side(host: &cpal::Host, dir: Direction, device: cpal::Device) -> Result<Side, CpalError> {
    let label = {
        let (id, name) = (device_id(&device), device_name(&device));
        if name.is_empty() || name == id {
            id
        } else {
            format!("{id} ({name})")
        }
    };
    let configs = dir.configs(&device).map_err(|why| CpalError::Unsupported {
        direction: dir.word(),
        device: label.clone(),
        why: format!("cannot be opened ({why})"),
        offers: list_devices(host, Some(dir)),
    })?;
    let info = direction_info(Ok(configs.clone()));
    Ok(Side {
        dir,
        device,
        label,
        info,
        configs,
    })
}

/// A handle that reports how the running endpoint is doing, readable from any thread.
#[derive(Debug, Clone)]
pub struct CpalMonitor {
    shared: Arc<Shared>,
}

impl CpalMonitor {
    /// How the thread that runs the process is scheduled.
    pub fn realtime(&self) -> Realtime {
        let policy = self.shared.policy.load(Ordering::Relaxed);
        if cfg!(target_os = "macos") && policy >= 0 {
            return Realtime::System {
                what: "on CoreAudio's I/O thread, scheduled by CoreAudio (netjam leaves it as it is)",
            };
        }
        if cfg!(windows) && policy >= 0 {
            return Realtime::System {
                what: "on the WASAPI thread cpal raises to time-critical priority (no MMCSS)",
            };
        }
        Realtime::from_policy(
            policy,
            self.shared.priority.load(Ordering::Relaxed),
            "allow it with an rtprio limit, e.g. `@audio - rtprio 95` in /etc/security/limits.conf",
        )
    }

    /// Over- and underruns the host reported.
    pub fn xruns(&self) -> u64 {
        self.shared.xruns.load(Ordering::Relaxed)
    }

    /// Frames per callback of the stream that runs the process (0 before the first).
    pub fn callback_frames(&self) -> usize {
        self.shared.callback_frames.load(Ordering::Relaxed)
    }

    /// Frames between the process's output and it being played: the period adapter's
    /// latency plus what the host reports from a callback to its playback (0 for that
    /// part where the host cannot tell).
    pub fn output_latency_frames(&self, rate: u32) -> u64 {
        let rate = u64::from(rate.max(1));
        let device = self.shared.device_output_ns.load(Ordering::Relaxed) * rate / 1_000_000_000;
        self.shared.adapter_latency.load(Ordering::Relaxed) as u64 + device
    }

    /// Frames the endpoint adds between capture and playback beyond the device buffers:
    /// the period adapter's latency plus the input bridge's cushion.
    pub fn added_latency_frames(&self) -> usize {
        self.shared.adapter_latency.load(Ordering::Relaxed)
            + self.shared.bridge_target.load(Ordering::Relaxed)
    }

    /// Glitches of netjam's own making: adapter and bridge underruns, frames dropped.
    pub fn glitches(&self) -> (u64, u64, u64) {
        (
            self.shared.adapter_underruns.load(Ordering::Relaxed),
            self.shared.bridge_underruns.load(Ordering::Relaxed),
            self.shared.bridge_dropped.load(Ordering::Relaxed),
        )
    }
}

/// See the module docs.
pub struct CpalEndpoint {
    spec: StreamSpec,
    host: String,
    input_name: Option<String>,
    output_name: Option<String>,
    input_format: Option<DeviceFormat>,
    output_format: Option<DeviceFormat>,
    notes: Vec<String>,
    // Declared before `driver`: the streams (and their callback threads) go first.
    streams: Vec<cpal::Stream>,
    driver: Box<Driver>,
    _input_role: Option<Box<InputRole>>,
    // Boxed so each stays put while the vector grows: the error callbacks point at them.
    #[allow(clippy::vec_box)]
    _sinks: Vec<Box<ErrorSink>>,
    slot: Arc<ProcessSlot>,
    shared: Arc<Shared>,
    errors: Vec<(&'static str, rtrb::Consumer<cpal::StreamError>)>,
    limit_frames: Option<u64>,
}

// SAFETY: cpal streams are Send on the hosts netjam builds for except Android/AAudio and
// the web, which it does not target; the driver's pointers are used as described on
// `DriverPtr` and `ProcessSlot`.
unsafe impl Send for CpalEndpoint {}

impl std::fmt::Debug for CpalEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpalEndpoint")
            .field("host", &self.host)
            .field("input", &self.input_name)
            .field("output", &self.output_name)
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl CpalEndpoint {
    /// Choose the devices, agree on rate, channels and formats, and open the streams; the
    /// process runs only in [`Endpoint::run`] (until then the output plays silence).
    pub fn open(config: &CpalConfig) -> Result<Self, CpalError> {
        let _quiet = QuietStderr::new();
        let host = pick_host(config.host.as_deref())?;
        let host_name = host.id().name().to_string();
        let mut notes = Vec::new();
        let explicit_in = config.input_device.is_some();
        let explicit_out = config.output_device.is_some();
        let in_pattern = config.input_device.as_deref().or(config.device.as_deref());
        let out_pattern = config.output_device.as_deref().or(config.device.as_deref());
        // `--device X` alone may name a device of one direction only; both must not miss.
        let both_from_device = !explicit_in && !explicit_out && config.device.is_some();
        let input = pick_device(
            &host,
            Direction::Input,
            in_pattern,
            explicit_in || !both_from_device,
        )
        .or_else(|e| match e {
            CpalError::NoMatch { .. } if both_from_device => Ok(None),
            e => Err(e),
        })?;
        let output = pick_device(
            &host,
            Direction::Output,
            out_pattern,
            explicit_out || !both_from_device,
        )
        .or_else(|e| match e {
            CpalError::NoMatch { .. } if both_from_device => Ok(None),
            e => Err(e),
        })?;
        if input.is_none() && output.is_none() {
            if let Some(p) = &config.device {
                if !p.eq_ignore_ascii_case("none") {
                    return Err(CpalError::NoMatch {
                        direction: "input or output",
                        pattern: p.clone(),
                        host: host_name,
                        available: list_devices(&host, None),
                    });
                }
            }
            return Err(CpalError::NoDevice {
                available: list_devices(&host, None),
                host: host_name,
            });
        }
        // An unnamed default that cannot be opened is left out; a named device must open.
        let open_side = |dir: Direction, dev: Option<cpal::Device>, named: bool, notes: &mut Vec<String>| {
            let Some(dev) = dev else {
                return Ok(None);
            };
            match side(&host, dir, dev) {
                Ok(s) if s.info.channels.is_empty() => {
                    Err(s.unsupported("no sample format netjam converts".into()))
                }
                Ok(s) => Ok(Some(s)),
                Err(e) if !named => {
                    notes.push(format!("the default {} device is left out: {e}", dir.word()));
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        };
        let in_named = in_pattern.is_some_and(|p| !p.eq_ignore_ascii_case("default"));
        let out_named = out_pattern.is_some_and(|p| !p.eq_ignore_ascii_case("default"));
        let input = open_side(Direction::Input, input, in_named, &mut notes)?;
        let output = open_side(Direction::Output, output, out_named, &mut notes)?;
        if input.is_none() && output.is_none() {
            return Err(CpalError::NoDevice {
                available: list_devices(&host, None),
                host: host_name,
            });
        }
        for (s, other) in [(&input, &output), (&output, &input)] {
            if s.is_none() {
                if let Some(o) = other {
                    let missing = match o.dir {
                        Direction::Input => "output",
                        Direction::Output => "input",
                    };
                    notes.push(format!("no {missing} device: {missing} has 0 channels"));
                }
            }
        }
        let sides: Vec<&Side> = input.iter().chain(output.iter()).collect();
        // Rate: asked for, else 48000 if all take it, else the output's (or input's) default.
        let rate = match config.rate {
            Some(r) => {
                if let Some(s) = sides.iter().find(|s| !s.info.supports_rate(r)) {
                    return Err(s.unsupported(format!("{r} Hz is not offered")));
                }
                r
            }
            None if sides.iter().all(|s| s.info.supports_rate(48_000)) => 48_000,
            None => {
                let r = sides
                    .iter()
                    .rev()
                    .find_map(|s| s.default_rate())
                    .unwrap_or(48_000);
                if let Some(s) = sides.iter().find(|s| !s.info.supports_rate(r)) {
                    return Err(s.unsupported(format!(
                        "the devices share no sample rate ({r} Hz, the other's default, is not offered)"
                    )));
                }
                r
            }
        };
        let pick = |s: &Side| -> Result<(u16, DeviceFormat), CpalError> {
            let map = match s.dir {
                Direction::Input => config.inputs.as_ref(),
                Direction::Output => config.outputs.as_ref(),
            };
            if let Some(map) = map {
                // The fewest channels that reach the highest one named, in a format netjam converts.
                let offered = s.info.channels.iter().copied().max().unwrap_or(0);
                map.check(offered, "this device")
                    .map_err(|e| s.unsupported(e.to_string()))?;
                return s
                    .info
                    .channels
                    .iter()
                    .filter(|&&c| c >= map.highest())
                    .find_map(|&c| s.format(c, rate).map(|f| (c, f)))
                    .ok_or_else(|| {
                        s.unsupported(format!(
                            "no i16/i32/f32 format reaching channel {} at {rate} Hz",
                            map.highest()
                        ))
                    });
            }
            let channels = config.channels.unwrap_or_else(|| s.default_channels());
            if !s.info.channels.contains(&channels) {
                return Err(s.unsupported(format!("{channels} channels are not offered")));
            }
            let format = s.format(channels, rate).ok_or_else(|| {
                s.unsupported(format!(
                    "no i16/i32/f32 format for {channels} channels at {rate} Hz"
                ))
            })?;
            Ok((channels, format))
        };
        let in_choice = input.as_ref().map(pick).transpose()?;
        let out_choice = output.as_ref().map(pick).transpose()?;
        // The stream's channels each way: the map's, else all the device's.
        let in_map = in_choice.map(|(c, _)| {
            config
                .inputs
                .clone()
                .unwrap_or_else(|| ChannelMap::identity(MapSide::Inputs, c))
        });
        let out_map = out_choice.map(|(c, _)| {
            config
                .outputs
                .clone()
                .unwrap_or_else(|| ChannelMap::identity(MapSide::Outputs, c))
        });
        let spec = StreamSpec {
            rate,
            input_channels: in_map.as_ref().map_or(0, |m| m.len() as u16),
            output_channels: out_map.as_ref().map_or(0, |m| m.len() as u16),
            period: config.period.max(1),
        };
        let device_in = in_choice.map_or(0, |c| c.0 as usize);
        let device_out = out_choice.map_or(0, |c| c.0 as usize);
        let shared = Arc::new(Shared::default());
        let slot = Arc::new(ProcessSlot {
            armed: AtomicBool::new(false),
            process: UnsafeCell::new(None),
        });
        let want_realtime = std::env::var_os("NETJAM_NO_REALTIME").is_none();
        let duplex = input.is_some() && output.is_some();
        let (feeder, bridge) = if duplex {
            let (f, b) = InputBridge::new(spec.input_channels as usize, BRIDGE_FRAMES);
            let map = in_map
                .clone()
                .unwrap_or_else(|| ChannelMap::identity(MapSide::Inputs, 0));
            (Some(f.with_map(map, device_in)), Some(b))
        } else {
            (None, None)
        };
        let mut driver = Box::new(
            Driver::new(spec, slot.clone(), shared.clone(), bridge, want_realtime).with_maps(
                in_map.unwrap_or_else(|| ChannelMap::identity(MapSide::Inputs, 0)),
                device_in,
                out_map.unwrap_or_else(|| ChannelMap::identity(MapSide::Outputs, 0)),
                device_out,
            ),
        );
        let driver_ptr = Owned::new(&mut driver);
        let mut input_role = None;
        let mut sinks = Vec::new();
        let mut errors = Vec::new();
        let mut streams = Vec::new();
        let mut sink_for = |dir: &'static str| {
            let (tx, rx) = rtrb::RingBuffer::new(8);
            errors.push((dir, rx));
            let mut sink = Box::new(ErrorSink {
                shared: shared.clone(),
                errors: tx,
            });
            let ptr = Owned::new(&mut sink);
            sinks.push(sink);
            ptr
        };
        // Input first, so the bridge fills while the output stream starts.
        if let (Some(s), Some((channels, format))) = (&input, in_choice) {
            let sink = sink_for("input");
            let mut role = Box::new(match feeder {
                Some(feeder) => InputRole::Feed {
                    feeder,
                    first: true,
                    want_realtime,
                },
                None => InputRole::Drive(driver_ptr),
            });
            let role_ptr = Owned::new(&mut role);
            input_role = Some(role);
            let stream = open_stream(s, channels, rate, spec.period, &mut notes, |cfg| match format {
                DeviceFormat::F32 => build_input::<f32>(&s.device, cfg, role_ptr, sink),
                DeviceFormat::I32 => build_input::<i32>(&s.device, cfg, role_ptr, sink),
                _ => build_input::<i16>(&s.device, cfg, role_ptr, sink),
            })?;
            streams.push(("input", stream));
        }
        if let (Some(s), Some((channels, format))) = (&output, out_choice) {
            let sink = sink_for("output");
            let stream = open_stream(s, channels, rate, spec.period, &mut notes, |cfg| match format {
                DeviceFormat::F32 => build_output::<f32>(&s.device, cfg, driver_ptr, sink),
                DeviceFormat::I32 => build_output::<i32>(&s.device, cfg, driver_ptr, sink),
                _ => build_output::<i16>(&s.device, cfg, driver_ptr, sink),
            })?;
            streams.push(("output", stream));
        }
        for (dir, stream) in &streams {
            stream.play().map_err(|e| CpalError::Build {
                direction: dir,
                device: host_name.clone(),
                why: e.to_string(),
            })?;
        }
        let streams = streams.into_iter().map(|(_, s)| s).collect();
        Ok(Self {
            spec,
            host: host_name,
            input_name: input.as_ref().map(|s| s.label.clone()),
            output_name: output.as_ref().map(|s| s.label.clone()),
            input_format: in_choice.map(|c| c.1),
            output_format: out_choice.map(|c| c.1),
            notes,
            streams,
            driver,
            _input_role: input_role,
            _sinks: sinks,
            slot,
            shared,
            errors,
            limit_frames: None,
        })
    }

    /// Stop after `frames` frames.
    pub fn with_limit(mut self, frames: Option<u64>) -> Self {
        self.limit_frames = frames;
        self
    }

    pub fn monitor(&self) -> CpalMonitor {
        CpalMonitor {
            shared: self.shared.clone(),
        }
    }

    /// One-line remarks from opening (a buffer size the device refused, a direction left out).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// "ALSA: in jack (JACK Audio Connection Kit, f32), out ..." for the user.
    pub fn describe(&self) -> String {
        let side = |name: &Option<String>, format: Option<DeviceFormat>, channels: u16| match name {
            Some(n) => format!(
                "{n}, {channels} ch {}",
                format.map(|f| f.to_string()).unwrap_or_default()
            ),
            None => "none".into(),
        };
        format!(
            "{}: in {}; out {}",
            self.host,
            side(&self.input_name, self.input_format, self.spec.input_channels),
            side(&self.output_name, self.output_format, self.spec.output_channels)
        )
    }

    fn stream_error(&mut self) -> Option<String> {
        for (dir, rx) in &mut self.errors {
            if let Ok(e) = rx.pop() {
                return Some(format!("the {dir} stream failed: {e}"));
            }
        }
        None
    }
}

/// The fixed buffer sizes to ask for, best first: the period, then the smallest multiple of
/// it the device takes (callbacks of whole periods add no latency), then the device's default.
fn buffer_sizes(info: &DirectionInfo, period: u32) -> Vec<BufferSize> {
    let mut sizes = vec![BufferSize::Fixed(period)];
    if let Some([lo, hi]) = info.buffer_frames {
        let k = lo.div_ceil(period.max(1)).max(1);
        let multiple = k * period;
        if k > 1 && multiple <= hi && multiple <= STAGING_FRAMES as u32 {
            sizes.push(BufferSize::Fixed(multiple));
        }
    }
    sizes.push(BufferSize::Default);
    sizes
}

/// Open one stream, falling back from a fixed buffer of `period` frames as [`buffer_sizes`] says.
fn open_stream(
    s: &Side,
    channels: u16,
    rate: u32,
    period: u32,
    notes: &mut Vec<String>,
    mut build: impl FnMut(&StreamConfig) -> Result<cpal::Stream, cpal::BuildStreamError>,
) -> Result<cpal::Stream, CpalError> {
    let mut refused: Vec<String> = Vec::new();
    for size in buffer_sizes(&s.info, period) {
        let cfg = StreamConfig {
            channels,
            sample_rate: rate,
            buffer_size: size,
        };
        match build(&cfg) {
            Ok(stream) => {
                if !refused.is_empty() {
                    let range = s
                        .info
                        .buffer_frames
                        .map(|[lo, hi]| format!(" (it takes {lo}-{hi} frames)"))
                        .unwrap_or_default();
                    let using = match size {
                        BufferSize::Fixed(n) => format!("{n}-frame buffers"),
                        BufferSize::Default => "its default buffer size".into(),
                    };
                    notes.push(format!(
                        "the {} device refused {}{range}: using {using}; netjam still sends {period}-frame packets",
                        s.dir.word(),
                        refused.join(", then "),
                    ));
                }
                return Ok(stream);
            }
            Err(e) => {
                let e = match e {
                    cpal::BuildStreamError::StreamConfigNotSupported => "not supported".into(),
                    cpal::BuildStreamError::DeviceNotAvailable => "not available".into(),
                    cpal::BuildStreamError::BackendSpecific { err } => err.description,
                    e => e.to_string(),
                };
                let what = match size {
                    BufferSize::Fixed(n) => format!("{n}-frame buffers"),
                    BufferSize::Default => "its default buffer".into(),
                };
                refused.push(format!("{what} ({e})"));
            }
        }
    }
    Err(CpalError::Build {
        direction: s.dir.word(),
        device: s.label.clone(),
        why: refused.join("; "),
    })
}

/// A pointer to callback state the endpoint owns (boxed, so it never moves), for a
/// callback closure; copied into each attempt to build a stream.
struct Owned<T>(*mut T);

impl<T> Clone for Owned<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Owned<T> {}

// SAFETY: each `Owned` state is used by exactly one callback thread while its stream lives,
// and by the endpoint only after the streams (and their threads) are gone.
unsafe impl<T> Send for Owned<T> {}

impl<T> Owned<T> {
    fn new(b: &mut Box<T>) -> Self {
        Self(&mut **b)
    }

    /// SAFETY: the caller is the one callback that uses this state while its stream lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get(&self) -> &mut T {
        // SAFETY: guaranteed by the caller.
        unsafe { &mut *self.0 }
    }
}

/// What the input callback does.
enum InputRole {
    /// Feed the bridge to the output callback.
    Feed {
        feeder: InputFeeder,
        first: bool,
        want_realtime: bool,
    },
    /// Run the process itself (no output device).
    Drive(Owned<Driver>),
}

/// The error callback's state: counts xruns, hands fatal errors to `run` without blocking.
struct ErrorSink {
    shared: Arc<Shared>,
    errors: rtrb::Producer<cpal::StreamError>,
}

impl ErrorSink {
    fn on_error(&mut self, e: cpal::StreamError) {
        match e {
            cpal::StreamError::BufferUnderrun => {
                self.shared.xruns.fetch_add(1, Ordering::Relaxed);
            }
            e => {
                let _ = self.errors.push(e);
                self.shared.failed.store(true, Ordering::Release);
            }
        }
    }
}

fn build_input<T: DeviceSample>(
    device: &cpal::Device,
    cfg: &StreamConfig,
    role: Owned<InputRole>,
    sink: Owned<ErrorSink>,
) -> Result<cpal::Stream, cpal::BuildStreamError> {
    device.build_input_stream::<T, _, _>(
        cfg,
        move |data: &[T], _: &cpal::InputCallbackInfo| {
            // SAFETY: this stream's callback is the only user of its role while it lives.
            match unsafe { role.get() } {
                InputRole::Feed {
                    feeder,
                    first,
                    want_realtime,
                } => {
                    if *first {
                        *first = false;
                        promote_and_record(None, *want_realtime);
                    }
                    feeder.push(data);
                }
                // SAFETY: with no output stream, this callback is the driver's only user.
                InputRole::Drive(driver) => unsafe { driver.get() }.on_input(data),
            }
        },
        // SAFETY: this stream's error callback is the only user of its sink.
        move |e| unsafe { sink.get() }.on_error(e),
        None,
    )
}

fn build_output<T: DeviceSample>(
    device: &cpal::Device,
    cfg: &StreamConfig,
    driver: Owned<Driver>,
    sink: Owned<ErrorSink>,
) -> Result<cpal::Stream, cpal::BuildStreamError> {
    device.build_output_stream::<T, _, _>(
        cfg,
        // SAFETY: the output callback is the driver's only user while the stream lives.
        move |data: &mut [T], info: &cpal::OutputCallbackInfo| {
            // SAFETY: as above.
            let d = unsafe { driver.get() };
            let t = info.timestamp();
            if let Some(latency) = t.playback.duration_since(&t.callback) {
                d.shared
                    .device_output_ns
                    .store(latency.as_nanos() as u64, Ordering::Relaxed);
            }
            d.on_output(data)
        },
        // SAFETY: this stream's error callback is the only user of its sink.
        move |e| unsafe { sink.get() }.on_error(e),
        None,
    )
}

impl Endpoint for CpalEndpoint {
    fn spec(&self) -> StreamSpec {
        self.spec
    }

    fn run(
        mut self: Box<Self>,
        process: &mut dyn Process,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<(StopReason, PeriodStats)> {
        // SAFETY: only the lifetime of the trait object is erased; the callbacks use the
        // pointer while the streams live, and they are dropped below, inside this borrow.
        let process: *mut dyn Process =
            unsafe { std::mem::transmute::<*mut (dyn Process + '_), *mut (dyn Process + 'static)>(process) };
        // SAFETY: not armed yet, so no callback reads the slot (see `ProcessSlot`).
        unsafe { *self.slot.process.get() = Some(process) };
        self.slot.armed.store(true, Ordering::Release);
        // Some devices just stop calling back when they go away (the ALSA JACK plugin when
        // its server dies): a stream that makes no progress for this long has failed.
        let buffer_ns = netjam_engine::time::frames_to_ns(STAGING_FRAMES as u64, self.spec.rate);
        let stall_ns = STALL_NS.max(4 * buffer_ns);
        let mut progress = (self.shared.callbacks.load(Ordering::Relaxed), clock::now_ns());
        let reason = loop {
            if stop.load(Ordering::Relaxed) {
                break Ok(StopReason::Stopped);
            }
            let (callbacks, now) = (self.shared.callbacks.load(Ordering::Relaxed), clock::now_ns());
            if callbacks != progress.0 {
                progress = (callbacks, now);
            } else if now - progress.1 > stall_ns {
                break Err(anyhow::anyhow!(
                    "the sound card stopped calling back for {:.1} s (was it unplugged, or its sound server stopped?)",
                    (now - progress.1) as f64 / 1e9
                ));
            }
            if self.shared.failed.load(Ordering::Acquire) {
                let why = self.stream_error().unwrap_or_else(|| "a stream failed".into());
                break Err(anyhow::anyhow!(
                    "{why} (was the device unplugged or taken by another program?)"
                ));
            }
            if self.shared.panicked.load(Ordering::Relaxed) {
                break Err(anyhow::anyhow!(
                    "the audio callback panicked; the stream was silenced"
                ));
            }
            let frames = self.shared.frames.load(Ordering::Relaxed);
            if self.limit_frames.is_some_and(|l| frames >= l) {
                break Ok(StopReason::Stopped);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // Dropping a stream stops its callback thread and waits for it (ALSA and WASAPI join
        // it; CoreAudio disposes of the unit), so the process is free again afterwards. The
        // output goes first, so it never sees the input stop.
        while let Some(stream) = self.streams.pop() {
            drop(stream);
        }
        let reason = reason?;
        let mut stats = self.driver.timer.stats();
        stats.missed_deadlines += self.shared.xruns.load(Ordering::Relaxed);
        stats.realtime = matches!(self.monitor().realtime(), Realtime::Yes { .. });
        Ok((reason, stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offline_callbacks_run_a_duplex_stream_bit_exact() {
        struct Copy(u64);
        impl Process for Copy {
            fn process(&mut self, _now: u64, input: &[f32], output: &mut [f32]) {
                output.copy_from_slice(input);
                self.0 += 1;
            }
        }
        let spec = StreamSpec {
            rate: 48_000,
            input_channels: 2,
            output_channels: 2,
            period: 64,
        };
        let mut cb = OfflineCallbacks::new(spec);
        let mut copy = Copy(0);
        let mut heard: Vec<i16> = Vec::new();
        cb.with_process(&mut copy, |cb| {
            let mut at = 0;
            for _ in 0..200 {
                let input: Vec<i16> = (at..at + 200).map(|k| (k % 30_000) as i16).collect();
                at += 200;
                cb.input(&input);
                let mut out = vec![0i16; 200];
                cb.output(&mut out);
                heard.extend_from_slice(&out);
            }
        });
        assert!(copy.0 > 200, "{} periods", copy.0);
        let start = heard.iter().position(|&x| x != 0).expect("audio came through");
        let first = heard[start] as usize;
        for (k, &x) in heard[start..].iter().enumerate() {
            assert_eq!(x as usize, (first + k) % 30_000, "sample {k}");
        }
        let m = cb.monitor();
        assert_eq!(m.callback_frames(), 100);
        // 100-frame callbacks over 64-frame periods: 64 - gcd(100, 64) = 60 frames, plus the
        // bridge's cushion of one output and one input callback.
        assert_eq!(m.added_latency_frames(), 60 + 100 + 100);
        assert_eq!(cb.stats().periods, copy.0);
    }

    #[test]
    fn listings_are_compact() {
        assert_eq!(compact(&[1, 2, 3, 4]), "1-4");
        assert_eq!(compact(&[1, 2, 4]), "1,2,4");
        assert_eq!(compact(&[2]), "2");
        let info = DirectionInfo {
            channels: vec![2],
            rates: vec![[48_000, 48_000]],
            buffer_frames: Some([128, 262_144]),
            formats: vec!["f32".into()],
            error: None,
        };
        assert_eq!(info.summary(), "2 ch, 48000 Hz, buffer 128-262144 frames, f32");
        assert_eq!(
            buffer_sizes(&info, 64),
            vec![BufferSize::Fixed(64), BufferSize::Fixed(128), BufferSize::Default]
        );
        assert_eq!(
            buffer_sizes(&info, 256),
            vec![BufferSize::Fixed(256), BufferSize::Default]
        );
    }
}
