//! [`JackEndpoint`]: a JACK client as a clocked [`Endpoint`].
//!
//! netjam registers its own client with ports `NAME:send_1..N` (what you play, captured and
//! sent) and `NAME:receive_1..N` (what you hear, played), the names JackTrip uses, and can
//! connect them to the physical ports. JACK's process callback de-interleaves the captured
//! ports into a buffer reserved at start, calls the [`Process`] with the nominal start of the
//! period on netjam's monotonic clock, and interleaves what it returns into the playback
//! ports. The callback never allocates, locks, blocks or logs: its statistics are atomics
//! that [`Endpoint::run`] reads after the client is deactivated.
//!
//! On request ([`JackEndpoint::register_extra_outputs`]) the client has more output ports,
//! registered before it starts (registering is not realtime-safe), which the [`Process`]
//! fills through [`Process::extra_outputs`]; a room client uses them for one set of ports per
//! member. Where libjack has `jack_port_rename` (JACK ≥ 0.125, jack2 ≥ 1.9.11) they can be
//! renamed while the stream runs, on the endpoint's own thread, never the process callback.
//!
//! libjack is opened at run time with `dlopen`, so netjam builds without JACK's headers and
//! runs without libjack; only this endpoint and `netjam devices` need it. The bindings cover
//! the few functions netjam calls and nothing else.

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr, CString};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::{Duration, Instant};

use super::channels::{ChannelMap, ChannelMapError, MapSide};
use super::{Endpoint, PeriodStats, PeriodTimer, Process, Realtime, StopReason, StreamSpec};
use crate::clock;
use crate::dl::{cstr_lossy, Library, LIBJACK};
use netjam_engine::slip::SlipGuard;

/// Why JACK could not be used.
#[derive(Debug, thiserror::Error)]
pub enum JackError {
    #[error("{0}; or use another endpoint")]
    LibraryMissing(String),
    #[error("no JACK server is running{server}; start one (e.g. `jackd -d alsa -r 48000 -p 64`, or `jackd -d dummy -r 48000 -p 64` to try without a sound card) or use another endpoint")]
    NoServer { server: String },
    #[error("the JACK server refused client {name:?} (status 0x{status:x})")]
    ClientRefused { name: String, status: c_int },
    #[error("cannot register JACK port {0}")]
    PortRegister(String),
    #[error("cannot activate the JACK client")]
    Activate,
    #[error("{0}")]
    Channels(#[from] ChannelMapError),
    #[error("a name given to JACK contains a NUL byte")]
    Nul(#[from] std::ffi::NulError),
}

type Client = c_void;
type Port = c_void;
type ProcessCallback = unsafe extern "C" fn(u32, *mut c_void) -> c_int;
type XrunCallback = unsafe extern "C" fn(*mut c_void) -> c_int;
type ShutdownCallback = unsafe extern "C" fn(*mut c_void);
type MessageFunction = unsafe extern "C" fn(*const c_char);

const NO_START_SERVER: c_int = 0x01;
const SERVER_NAME: c_int = 0x04;
const STATUS_SERVER_FAILED: c_int = 0x10;
const PORT_IS_INPUT: c_ulong = 0x1;
const PORT_IS_OUTPUT: c_ulong = 0x2;
const PORT_IS_PHYSICAL: c_ulong = 0x4;
/// `JackCaptureLatency` and `JackPlaybackLatency` of `jack_latency_callback_mode_t`.
const CAPTURE_LATENCY: c_int = 0;
const PLAYBACK_LATENCY: c_int = 1;
const AUDIO_TYPE: &CStr = c"32 bit float mono audio";

/// `jack_latency_range_t`: frames.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct LatencyRange {
    min: u32,
    max: u32,
}

/// The libjack functions netjam uses, resolved once from the shared library.
struct JackApi {
    client_open: unsafe extern "C" fn(*const c_char, c_int, *mut c_int, ...) -> *mut Client,
    client_close: unsafe extern "C" fn(*mut Client) -> c_int,
    get_client_name: unsafe extern "C" fn(*mut Client) -> *const c_char,
    get_sample_rate: unsafe extern "C" fn(*mut Client) -> u32,
    get_buffer_size: unsafe extern "C" fn(*mut Client) -> u32,
    is_realtime: unsafe extern "C" fn(*mut Client) -> c_int,
    /// The realtime priority the server runs its clients' callbacks at (−1: not realtime).
    client_real_time_priority: Option<unsafe extern "C" fn(*mut Client) -> c_int>,
    cpu_load: unsafe extern "C" fn(*mut Client) -> f32,
    port_register:
        unsafe extern "C" fn(*mut Client, *const c_char, *const c_char, c_ulong, c_ulong) -> *mut Port,
    port_get_buffer: unsafe extern "C" fn(*mut Port, u32) -> *mut c_void,
    port_name: unsafe extern "C" fn(*const Port) -> *const c_char,
    port_by_name: unsafe extern "C" fn(*mut Client, *const c_char) -> *mut Port,
    port_flags: unsafe extern "C" fn(*const Port) -> c_int,
    port_type: unsafe extern "C" fn(*const Port) -> *const c_char,
    get_ports: unsafe extern "C" fn(*mut Client, *const c_char, *const c_char, c_ulong) -> *mut *const c_char,
    free: unsafe extern "C" fn(*mut c_void),
    connect: unsafe extern "C" fn(*mut Client, *const c_char, *const c_char) -> c_int,
    set_process_callback: unsafe extern "C" fn(*mut Client, ProcessCallback, *mut c_void) -> c_int,
    set_xrun_callback: unsafe extern "C" fn(*mut Client, XrunCallback, *mut c_void) -> c_int,
    on_shutdown: unsafe extern "C" fn(*mut Client, ShutdownCallback, *mut c_void),
    activate: unsafe extern "C" fn(*mut Client) -> c_int,
    deactivate: unsafe extern "C" fn(*mut Client) -> c_int,
    get_cycle_times:
        Option<unsafe extern "C" fn(*const Client, *mut u32, *mut u64, *mut u64, *mut f32) -> c_int>,
    /// Missing before JACK 0.125 / jack2 1.9.11: ports then keep the names they were given.
    port_rename: Option<unsafe extern "C" fn(*mut Client, *mut Port, *const c_char) -> c_int>,
    /// Missing before JACK 0.121 / jack2 1.9.8: the output latency then reads 0.
    port_get_latency_range: Option<unsafe extern "C" fn(*mut Port, c_int, *mut LatencyRange)>,
    set_error_function: unsafe extern "C" fn(MessageFunction),
    set_info_function: unsafe extern "C" fn(MessageFunction),
}

/// libjack's own messages ("cannot connect to server socket" ...) are dropped: netjam says
/// what went wrong in its own words.
unsafe extern "C" fn quiet(_msg: *const c_char) {}

impl JackApi {
    // Each transmute's target is the declared type of the field it initializes.
    #[allow(clippy::missing_transmute_annotations)]
    fn load() -> Result<Self, String> {
        let lib = Library::open(&LIBJACK)?;
        let sym = |name: &CStr| lib.sym(name);
        macro_rules! f {
            ($name:literal) => {
                // SAFETY: the symbol comes from libjack, whose C declaration of this function
                // matches the field's type (see jack/jack.h); the library stays loaded forever.
                unsafe { std::mem::transmute::<*mut c_void, _>(sym($name)?) }
            };
        }
        let api = Self {
            client_open: f!(c"jack_client_open"),
            client_close: f!(c"jack_client_close"),
            get_client_name: f!(c"jack_get_client_name"),
            get_sample_rate: f!(c"jack_get_sample_rate"),
            get_buffer_size: f!(c"jack_get_buffer_size"),
            is_realtime: f!(c"jack_is_realtime"),
            client_real_time_priority: sym(c"jack_client_real_time_priority").ok().map(|p| {
                // SAFETY: as for `f!`: jack_client_real_time_priority(jack_client_t*) -> int.
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }),
            cpu_load: f!(c"jack_cpu_load"),
            port_register: f!(c"jack_port_register"),
            port_get_buffer: f!(c"jack_port_get_buffer"),
            port_name: f!(c"jack_port_name"),
            port_by_name: f!(c"jack_port_by_name"),
            port_flags: f!(c"jack_port_flags"),
            port_type: f!(c"jack_port_type"),
            get_ports: f!(c"jack_get_ports"),
            free: f!(c"jack_free"),
            connect: f!(c"jack_connect"),
            set_process_callback: f!(c"jack_set_process_callback"),
            set_xrun_callback: f!(c"jack_set_xrun_callback"),
            on_shutdown: f!(c"jack_on_shutdown"),
            activate: f!(c"jack_activate"),
            deactivate: f!(c"jack_deactivate"),
            get_cycle_times: sym(c"jack_get_cycle_times").ok().map(|p| {
                // SAFETY: as for `f!`: jack_get_cycle_times(const jack_client_t*, jack_nframes_t*,
                // jack_time_t*, jack_time_t*, float*) -> int.
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }),
            port_rename: sym(c"jack_port_rename").ok().map(|p| {
                // SAFETY: as for `f!`: jack_port_rename(jack_client_t*, jack_port_t*,
                // const char* port_name) -> int.
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }),
            port_get_latency_range: sym(c"jack_port_get_latency_range").ok().map(|p| {
                // SAFETY: as for `f!`: jack_port_get_latency_range(jack_port_t*,
                // jack_latency_callback_mode_t, jack_latency_range_t*) -> void.
                unsafe { std::mem::transmute::<*mut c_void, _>(p) }
            }),
            set_error_function: f!(c"jack_set_error_function"),
            set_info_function: f!(c"jack_set_info_function"),
        };
        // SAFETY: `quiet` is a valid function for the whole program.
        unsafe {
            (api.set_error_function)(quiet);
            (api.set_info_function)(quiet);
        }
        Ok(api)
    }

    fn get() -> Result<&'static Self, JackError> {
        static API: OnceLock<Result<JackApi, String>> = OnceLock::new();
        API.get_or_init(Self::load)
            .as_ref()
            .map_err(|e| JackError::LibraryMissing(e.clone()))
    }
}

/// An open JACK client, closed on drop.
struct ClientHandle {
    api: &'static JackApi,
    raw: *mut Client,
}

// SAFETY: a jack_client_t may be used from any thread; netjam calls the non-realtime API
// from one thread at a time (the one that owns the handle).
unsafe impl Send for ClientHandle {}

impl Drop for ClientHandle {
    fn drop(&mut self) {
        // SAFETY: `raw` came from jack_client_open and is closed only here.
        unsafe { (self.api.client_close)(self.raw) };
    }
}

impl ClientHandle {
    /// Open client `name` on `server` (None: `JACK_DEFAULT_SERVER`, else the default one).
    fn open(name: &str, server: Option<&str>) -> Result<Self, JackError> {
        let api = JackApi::get()?;
        let cname = CString::new(name)?;
        let mut status: c_int = 0;
        let raw = match server {
            Some(server) => {
                let cserver = CString::new(server)?;
                // SAFETY: both strings are NUL-terminated and `status` is writable; with
                // JackServerName libjack reads exactly one variadic argument, a C string.
                unsafe {
                    (api.client_open)(
                        cname.as_ptr(),
                        NO_START_SERVER | SERVER_NAME,
                        &mut status,
                        cserver.as_ptr(),
                    )
                }
            }
            // SAFETY: `cname` is NUL-terminated and `status` is writable; with no
            // JackServerName option libjack reads no variadic argument.
            None => unsafe { (api.client_open)(cname.as_ptr(), NO_START_SERVER, &mut status) },
        };
        if raw.is_null() {
            if status & STATUS_SERVER_FAILED != 0 {
                let server = match server {
                    Some(s) => format!(" named {s:?}"),
                    None => std::env::var("JACK_DEFAULT_SERVER")
                        .map(|s| format!(" (JACK_DEFAULT_SERVER={s})"))
                        .unwrap_or_default(),
                };
                return Err(JackError::NoServer { server });
            }
            return Err(JackError::ClientRefused {
                name: name.into(),
                status,
            });
        }
        Ok(Self { api, raw })
    }

    fn name(&self) -> String {
        // SAFETY: the client is open; libjack returns a NUL-terminated string it owns.
        unsafe { cstr_lossy((self.api.get_client_name)(self.raw)) }
    }

    fn rate(&self) -> u32 {
        // SAFETY: the client is open.
        unsafe { (self.api.get_sample_rate)(self.raw) }
    }

    fn period(&self) -> u32 {
        // SAFETY: the client is open.
        unsafe { (self.api.get_buffer_size)(self.raw) }
    }

    /// Full names of the ports matching `flags` (audio ports only), in JACK's order.
    fn ports(&self, flags: c_ulong) -> Vec<String> {
        // SAFETY: the client is open; a NULL pattern matches every port name.
        let list = unsafe { (self.api.get_ports)(self.raw, ptr::null(), AUDIO_TYPE.as_ptr(), flags) };
        let mut out = Vec::new();
        if list.is_null() {
            return out;
        }
        let mut i = 0;
        loop {
            // SAFETY: libjack returns a NULL-terminated array of NUL-terminated strings.
            let p = unsafe { *list.add(i) };
            if p.is_null() {
                break;
            }
            // SAFETY: `p` is a NUL-terminated string inside the array.
            out.push(unsafe { cstr_lossy(p) });
            i += 1;
        }
        // SAFETY: the array came from jack_get_ports and must be released with jack_free.
        unsafe { (self.api.free)(list.cast()) };
        out
    }

    fn connect(&self, from: &str, to: &str) -> bool {
        let (Ok(a), Ok(b)) = (CString::new(from), CString::new(to)) else {
            return false;
        };
        // SAFETY: the client is open and both names are NUL-terminated. EEXIST (already
        // connected) counts as success.
        let r = unsafe { (self.api.connect)(self.raw, a.as_ptr(), b.as_ptr()) };
        r == 0 || r == libc::EEXIST
    }
}

/// How to set up netjam's JACK client.
#[derive(Debug, Clone)]
pub struct JackConfig {
    /// Client name (`--jack-name`); JACK may add a suffix if it is taken.
    pub name: String,
    /// Number of `send_N` and `receive_N` ports where no map says otherwise.
    pub channels: u16,
    /// `--inputs`: one `send_k` port per channel named, connected to the physical capture
    /// port of that number; None: `channels` ports connected to captures 1..=channels.
    pub inputs: Option<ChannelMap>,
    /// `--outputs`: one `receive_k` port per channel named, connected to the physical
    /// playback port of that number; None: `channels` ports on playbacks 1..=channels.
    pub outputs: Option<ChannelMap>,
    /// Connect to the physical capture and playback ports.
    pub connect: bool,
    /// The server's name (`jackd -n`); None: `JACK_DEFAULT_SERVER`, else the default server.
    pub server: Option<String>,
}

/// Atomics the callback writes and the owner reads while it runs (the callback is the only
/// writer of each, except `xruns` and `shutdown`, which JACK's notification thread sets).
#[derive(Debug, Default)]
struct CallbackStats {
    frames: AtomicU64,
    wrong_size: AtomicU64,
    xruns: AtomicU64,
    /// Frames of the server's time that passed without a cycle and without the server
    /// counting them ([`SlipGuard`]), and in how many slips.
    slipped_frames: AtomicU64,
    slips: AtomicU64,
    /// Frames the server's clock jumped by with its cycles on time (not skipped: see
    /// [`SlipGuard::confirm_skipped`]), and in how many jumps.
    unconfirmed_frames: AtomicU64,
    unconfirmed_jumps: AtomicU64,
    shutdown: AtomicBool,
    panicked: AtomicBool,
    /// Set by `run` when it lets go of the [`Process`]: from then on the callback plays
    /// silence and touches nothing else. `in_callback` tells `run` when the callback is out.
    detached: AtomicBool,
    in_callback: AtomicBool,
    /// Scheduling policy and priority of the callback thread, seen in its first period
    /// (-1 before that).
    policy: AtomicI32,
    priority: AtomicI32,
    /// The largest playback latency of the receive ports (frames), as the server reports it.
    output_latency: AtomicU64,
    /// The largest capture latency of the send ports (frames).
    input_latency: AtomicU64,
}

/// What the process callback owns; boxed so its address stays fixed while JACK holds it.
struct CallbackState {
    api: &'static JackApi,
    client: *mut Client,
    /// Valid from activation to deactivation (see [`JackEndpoint::run`]).
    process: *mut dyn Process,
    send: Vec<*mut Port>,
    receive: Vec<*mut Port>,
    /// The extra output ports, and `period` samples for each, one port after the other.
    extra: Vec<*mut Port>,
    extra_out: Vec<f32>,
    input: Vec<f32>,
    output: Vec<f32>,
    period: u32,
    period_ns: u64,
    /// The previous period's nominal start (0 before the first).
    last_nominal: u64,
    /// The server's frame clock at the last cycle start, to find dropped cycles.
    last_cycle_frames: Option<u32>,
    /// Time the server lost without counting it, against the system clock.
    slip: SlipGuard,
    stats: Arc<CallbackStats>,
    timer: PeriodTimer,
    policy_seen: bool,
    /// The `Process` panicked; only silence is played from then on.
    failed: bool,
}

unsafe extern "C" fn on_process(nframes: u32, arg: *mut c_void) -> c_int {
    let arg = arg.cast::<CallbackState>();
    // SAFETY: `arg` is the `CallbackState` registered with this callback, which outlives the
    // activation (or is leaked, see `JackEndpoint::let_go`). Only fields nobody writes after
    // activation are read until `detached` is known to be false.
    let (stats, api, receive, extra) = unsafe {
        (
            &*ptr::addr_of!((*arg).stats),
            *ptr::addr_of!((*arg).api),
            &*ptr::addr_of!((*arg).receive),
            &*ptr::addr_of!((*arg).extra),
        )
    };
    // Sequentially consistent with `let_go`'s store then load: either this callback sees
    // `detached`, or `let_go` sees it inside and waits.
    stats.in_callback.store(true, Ordering::SeqCst);
    if stats.detached.load(Ordering::SeqCst) {
        silence(api, receive.iter().chain(extra), nframes);
        stats.in_callback.store(false, Ordering::SeqCst);
        return 0;
    }
    // SAFETY: JACK calls this from one thread only, and `run` touches the state only once
    // `detached` is set and this callback is out.
    let state = unsafe { &mut *arg };
    let code = state.process_period(nframes);
    stats.in_callback.store(false, Ordering::SeqCst);
    code
}

impl CallbackState {
    fn process_period(&mut self, nframes: u32) -> c_int {
        let state = self;
        if state.failed {
            state.silence(nframes);
            return 0;
        }
        // jack2 deactivates a realtime client by cancelling its thread. A cancellation acted on
        // inside Rust code (at a `sendto`, say) unwinds through `catch_unwind`, which cannot pass
        // it on, and the process aborts ("exception not rethrown"). Held off for the callback, the
        // cancellation happens in libjack once it returns.
        let _held = CancelHeld::new();
        // A panic must not unwind into libjack: the stream goes silent and `run` reports it.
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| state.period_callback(nframes)));
        if ok.is_err() {
            state.failed = true;
            state.stats.panicked.store(true, Ordering::Relaxed);
            state.silence(nframes);
        }
        0
    }
}

/// Zero this period's buffers of the output `ports` (from the process callback).
fn silence<'a>(api: &JackApi, ports: impl Iterator<Item = &'a *mut Port>, nframes: u32) {
    for &port in ports {
        // SAFETY: an output port of this client; its buffer holds `nframes` floats.
        let buf = unsafe { (api.port_get_buffer)(port, nframes) }.cast::<f32>();
        if !buf.is_null() {
            // SAFETY: as above.
            unsafe { ptr::write_bytes(buf, 0, nframes as usize) };
        }
    }
}

/// Thread cancellation held off while it lives (`pthread_setcancelstate`: no system call, no
/// allocation, so the callback stays realtime-safe).
struct CancelHeld {
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    old: c_int,
}

#[cfg(any(target_os = "linux", target_os = "macos"))]
mod cancel {
    use std::ffi::c_int;
    extern "C" {
        pub fn pthread_setcancelstate(state: c_int, old: *mut c_int) -> c_int;
    }
    #[cfg(target_os = "linux")]
    pub const DISABLE: c_int = 1;
    #[cfg(target_os = "macos")]
    pub const DISABLE: c_int = 0;
}

impl CancelHeld {
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    fn new() -> Self {
        let mut old: c_int = 0;
        // SAFETY: sets the calling thread's own cancel state; `old` is a valid out pointer.
        unsafe { cancel::pthread_setcancelstate(cancel::DISABLE, &mut old) };
        Self { old }
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    fn new() -> Self {
        Self {}
    }
}

impl Drop for CancelHeld {
    fn drop(&mut self) {
        #[cfg(any(target_os = "linux", target_os = "macos"))]
        // SAFETY: restores the state saved by `new` on the same thread (the guard never
        // leaves the callback's stack frame).
        unsafe {
            let mut was: c_int = 0;
            cancel::pthread_setcancelstate(self.old, &mut was);
        }
    }
}

unsafe extern "C" fn on_xrun(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `CallbackStats` registered with this callback, kept alive by the
    // endpoint until the client is closed.
    let stats = unsafe { &*arg.cast::<CallbackStats>() };
    stats.xruns.fetch_add(1, Ordering::Relaxed);
    0
}

unsafe extern "C" fn on_shutdown(arg: *mut c_void) {
    // SAFETY: as for `on_xrun`.
    let stats = unsafe { &*arg.cast::<CallbackStats>() };
    stats.shutdown.store(true, Ordering::Relaxed);
}

impl CallbackState {
    /// The realtime work of one period: no allocation, no lock, no log.
    fn period_callback(&mut self, nframes: u32) {
        let woke = clock::now_ns();
        if !self.policy_seen {
            self.policy_seen = true;
            self.record_policy();
        }
        let n = nframes as usize;
        if nframes != self.period {
            // The server changed its period; the owner stops the stream. Play silence.
            self.stats.wrong_size.fetch_add(1, Ordering::Relaxed);
            self.silence(nframes);
            return;
        }
        // Cycles the server dropped (its frame clock moved on by more than a period): the
        // stream's timeline must move on with it, or the far side sees this sender's clock
        // fall a period behind for good at every one.
        // Only as much as the system clock saw pass: a frame clock that jumped while the
        // cycles ran on (the dummy driver after an xrun) lost no audio, and a skip would
        // put the stream a period ahead of it.
        let claimed = self.lost_frames();
        let lost = self.slip.confirm_skipped(woke, claimed, u64::from(nframes));
        if claimed > lost {
            self.stats
                .unconfirmed_frames
                .fetch_add(claimed - lost, Ordering::Relaxed);
            self.stats.unconfirmed_jumps.fetch_add(1, Ordering::Relaxed);
        }
        if lost > 0 {
            // SAFETY: as for `process` below.
            unsafe { &mut *self.process }.skipped(lost);
            self.slip.account_skipped(lost);
        }
        // Time that passed without cycles the server did not count either (its dummy driver
        // on a busy machine): the timeline moves on by it too, against the system clock.
        let slipped = self.slip.on_period(woke, u64::from(nframes));
        if slipped > 0 {
            // SAFETY: as for `process` below.
            unsafe { &mut *self.process }.skipped(slipped);
            self.stats.slipped_frames.fetch_add(slipped, Ordering::Relaxed);
            self.stats.slips.fetch_add(1, Ordering::Relaxed);
        }
        // The period's start: the floor of the wake-ups where the frames counted place it
        // (`SlipGuard::cycle_start_ns`), not JACK's cycle time, whose delay-locked loop walks
        // a millisecond over its first seconds. Periods are consecutive, so the time moves on
        // by at least a nanosecond, and it is never after the wake-up.
        let mut nominal = self.slip.cycle_start_ns().unwrap_or(woke);
        if self.last_nominal > 0 && nominal <= self.last_nominal {
            nominal = (self.last_nominal + self.period_ns)
                .min(woke)
                .max(self.last_nominal + 1);
        }
        self.last_nominal = nominal;
        let chans_in = self.send.len();
        for (c, &port) in self.send.iter().enumerate() {
            // SAFETY: an input port of this client; JACK guarantees `nframes` readable floats.
            let buf = unsafe { (self.api.port_get_buffer)(port, nframes) }.cast::<f32>();
            if buf.is_null() {
                continue;
            }
            // SAFETY: as above; the slice lives only within this callback.
            let samples = unsafe { std::slice::from_raw_parts(buf, n) };
            for (f, &x) in samples.iter().enumerate() {
                self.input[f * chans_in + c] = x;
            }
        }
        // SAFETY: `process` points at the `Process` borrowed by `run`, which deactivates the
        // client (so this callback has returned for good) before the borrow ends; only this
        // thread touches it meanwhile.
        let process = unsafe { &mut *self.process };
        process.process(nominal, &self.input, &mut self.output);
        let chans_out = self.receive.len();
        for (c, &port) in self.receive.iter().enumerate() {
            // SAFETY: an output port of this client; JACK guarantees `nframes` writable floats
            // that no one else touches during this callback.
            let buf = unsafe { (self.api.port_get_buffer)(port, nframes) }.cast::<f32>();
            if buf.is_null() {
                continue;
            }
            // SAFETY: as above.
            let samples = unsafe { std::slice::from_raw_parts_mut(buf, n) };
            for (f, x) in samples.iter_mut().enumerate() {
                *x = self.output[f * chans_out + c];
            }
        }
        if !self.extra.is_empty() {
            process.extra_outputs(n, &mut self.extra_out);
            for (&port, block) in self.extra.iter().zip(self.extra_out.chunks_exact(n)) {
                // SAFETY: an output port of this client, as for `receive` above.
                let buf = unsafe { (self.api.port_get_buffer)(port, nframes) }.cast::<f32>();
                if !buf.is_null() {
                    // SAFETY: as above; `block` holds exactly `n` samples.
                    unsafe { std::slice::from_raw_parts_mut(buf, n) }.copy_from_slice(block);
                }
            }
        }
        let done = clock::now_ns();
        let took = done.saturating_sub(woke);
        let late = woke.saturating_sub(nominal);
        self.timer.record(late, took, self.period_ns);
        self.stats.frames.fetch_add(nframes as u64, Ordering::Relaxed);
    }

    /// Write `nframes` of silence to every playback and extra port.
    fn silence(&self, nframes: u32) {
        silence(self.api, self.receive.iter().chain(&self.extra), nframes);
    }

    /// Frames of the server's clock that passed since the last cycle beyond one period
    /// (0 without cycle times, and for the first cycle).
    fn lost_frames(&mut self) -> u64 {
        let Some(cycle_times) = self.api.get_cycle_times else {
            return 0;
        };
        let (mut frames, mut current, mut next, mut period_us) = (0u32, 0u64, 0u64, 0f32);
        // SAFETY: the client is active and this is its process thread, where
        // jack_get_cycle_times is meant to be called; all pointers are to locals.
        let r = unsafe { cycle_times(self.client, &mut frames, &mut current, &mut next, &mut period_us) };
        if r != 0 {
            return 0;
        }
        let last = self.last_cycle_frames.replace(frames);
        let Some(last) = last else { return 0 };
        let elapsed = frames.wrapping_sub(last);
        // A jump backwards, or of more than 1024 periods, is a server restart or a stopped
        // clock, not dropped cycles.
        if elapsed > self.period && elapsed / self.period.max(1) <= 1024 {
            u64::from(elapsed - self.period)
        } else {
            0
        }
    }

    #[cfg(not(unix))]
    fn record_policy(&mut self) {
        // JACK for Windows schedules its clients' threads itself; record only that it ran.
        self.stats.policy.store(0, Ordering::Relaxed);
    }

    #[cfg(unix)]
    fn record_policy(&mut self) {
        // SAFETY: querying the calling thread's own scheduling; `param` is a local. This runs
        // once, in the first period.
        let mut param: libc::sched_param = unsafe { std::mem::zeroed() };
        let mut policy: c_int = 0;
        // SAFETY: as above.
        let r = unsafe { libc::pthread_getschedparam(libc::pthread_self(), &mut policy, &mut param) };
        if r == 0 {
            self.timer
                .set_realtime(policy == libc::SCHED_FIFO || policy == libc::SCHED_RR);
            self.stats.priority.store(param.sched_priority, Ordering::Relaxed);
            self.stats.policy.store(policy, Ordering::Relaxed);
        }
    }
}

/// A handle that reports how the running endpoint is doing, readable from any thread.
#[derive(Debug, Clone)]
pub struct JackMonitor {
    stats: Arc<CallbackStats>,
}

impl JackMonitor {
    pub fn realtime(&self) -> Realtime {
        let policy = self.stats.policy.load(Ordering::Relaxed);
        if cfg!(not(unix)) && policy >= 0 {
            return Realtime::System {
                what: "on the JACK server's thread, at the priority JACK for Windows gives it",
            };
        }
        Realtime::from_policy(
            policy,
            self.stats.priority.load(Ordering::Relaxed),
            "the JACK server lacks realtime rights: run jackd with -R as a member of the audio group",
        )
    }

    /// Frames between a period's first frame leaving netjam and it reaching the speakers:
    /// the largest playback latency the server reports for the receive ports (0 before
    /// activation, when nothing is connected, or with a libjack that cannot tell).
    pub fn output_latency_frames(&self) -> u64 {
        self.stats.output_latency.load(Ordering::Relaxed)
    }

    /// Frames between a sound reaching the capture side and netjam's period holding it:
    /// the largest capture latency the server reports for the send ports (0 as above).
    pub fn input_latency_frames(&self) -> u64 {
        self.stats.input_latency.load(Ordering::Relaxed)
    }

    /// xruns the server reported since the client started.
    pub fn xruns(&self) -> u64 {
        self.stats.xruns.load(Ordering::Relaxed)
    }

    /// Frames of the server's time lost without its counting them (the stream's timeline
    /// skipped them), and in how many slips.
    pub fn slipped(&self) -> (u64, u64) {
        (
            self.stats.slipped_frames.load(Ordering::Relaxed),
            self.stats.slips.load(Ordering::Relaxed),
        )
    }

    /// Frames the server's frame clock jumped by while its cycles ran on time (so the
    /// stream did not skip them), and in how many jumps.
    pub fn unconfirmed(&self) -> (u64, u64) {
        (
            self.stats.unconfirmed_frames.load(Ordering::Relaxed),
            self.stats.unconfirmed_jumps.load(Ordering::Relaxed),
        )
    }
}

/// See the module docs.
pub struct JackEndpoint {
    client: ClientHandle,
    name: String,
    spec: StreamSpec,
    send: Vec<*mut Port>,
    receive: Vec<*mut Port>,
    connect: bool,
    inputs: ChannelMap,
    outputs: ChannelMap,
    stats: Arc<CallbackStats>,
    limit_frames: Option<u64>,
    /// Extra output ports ([`JackEndpoint::register_extra_outputs`]).
    extra: Vec<*mut Port>,
    /// Renames of extra ports asked for through [`PortRenamer`]s, done by `run`'s thread.
    renames: Option<(mpsc::Sender<PortRename>, mpsc::Receiver<PortRename>)>,
    rename_failures: Arc<AtomicU64>,
}

/// Give extra port `index` the short name `name`.
#[derive(Debug, Clone)]
struct PortRename {
    index: usize,
    name: String,
}

/// Asks a running [`JackEndpoint`] to rename its extra ports; usable from any thread. The
/// endpoint's own thread renames them within about 10 ms (never the process callback).
#[derive(Debug, Clone)]
pub struct PortRenamer {
    tx: mpsc::Sender<PortRename>,
    failures: Arc<AtomicU64>,
}

impl PortRenamer {
    /// Give extra port `index` (in the order registered) the short name `name`
    /// (`CLIENT:name` in full). Ignored once the endpoint has stopped.
    pub fn rename(&self, index: usize, name: &str) {
        let _ = self.tx.send(PortRename {
            index,
            name: name.to_owned(),
        });
    }

    /// Renames the server refused (a name taken, too long, or not a valid port name).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// A renamer without a JACK client, and what it asks for: (port index, name).
    #[cfg(test)]
    pub(crate) fn detached() -> (Self, impl Fn() -> Vec<(usize, String)>) {
        let (tx, rx) = mpsc::channel();
        let renamer = Self {
            tx,
            failures: Arc::new(AtomicU64::new(0)),
        };
        (renamer, move || {
            rx.try_iter().map(|r: PortRename| (r.index, r.name)).collect()
        })
    }
}

// SAFETY: the port pointers are handles owned by the client; they are used only by the
// thread that owns the endpoint and, after activation, by JACK's process thread.
unsafe impl Send for JackEndpoint {}

impl std::fmt::Debug for JackEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JackEndpoint")
            .field("name", &self.name)
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

impl JackEndpoint {
    /// Open a client and register its ports; nothing runs until [`Endpoint::run`].
    pub fn open(config: &JackConfig) -> Result<Self, JackError> {
        let client = ClientHandle::open(&config.name, config.server.as_deref())?;
        // The callback is the audio thread: netjam's network threads, started after this,
        // run just below it, never above (a server at the default -P 10 runs clients at 5).
        if let Some(priority) = client
            .api
            .client_real_time_priority
            // SAFETY: the client is open.
            .map(|f| unsafe { f(client.raw) })
            .filter(|&p| p > 0)
        {
            crate::rt::run_network_below(priority);
        }
        let name = client.name();
        let inputs = config
            .inputs
            .clone()
            .unwrap_or_else(|| ChannelMap::identity(MapSide::Inputs, config.channels));
        let outputs = config
            .outputs
            .clone()
            .unwrap_or_else(|| ChannelMap::identity(MapSide::Outputs, config.channels));
        if config.connect {
            // Only a map the user gave must fit: without one, netjam connects what there is.
            if let Some(m) = &config.inputs {
                let n = client.ports(PORT_IS_PHYSICAL | PORT_IS_OUTPUT).len();
                m.check(n as u16, "the JACK server's physical capture side")?;
            }
            if let Some(m) = &config.outputs {
                let n = client.ports(PORT_IS_PHYSICAL | PORT_IS_INPUT).len();
                m.check(n as u16, "the JACK server's physical playback side")?;
            }
        }
        let (mut send, mut receive) = (Vec::new(), Vec::new());
        for (list, prefix, flags, count) in [
            (&mut send, "send", PORT_IS_INPUT, inputs.len()),
            (&mut receive, "receive", PORT_IS_OUTPUT, outputs.len()),
        ] {
            for i in 1..=count {
                let short = format!("{prefix}_{i}");
                let c = CString::new(short.as_str())?;
                // SAFETY: the client is open; names are NUL-terminated; buffer size 0 is
                // ignored for the built-in audio type.
                let port = unsafe {
                    (client.api.port_register)(client.raw, c.as_ptr(), AUDIO_TYPE.as_ptr(), flags, 0)
                };
                if port.is_null() {
                    return Err(JackError::PortRegister(format!("{name}:{short}")));
                }
                list.push(port);
            }
        }
        let spec = StreamSpec {
            rate: client.rate(),
            input_channels: inputs.len() as u16,
            output_channels: outputs.len() as u16,
            period: client.period(),
        };
        let stats = Arc::new(CallbackStats {
            policy: AtomicI32::new(-1),
            ..Default::default()
        });
        Ok(Self {
            client,
            name,
            spec,
            send,
            receive,
            connect: config.connect,
            inputs,
            outputs,
            stats,
            limit_frames: None,
            extra: Vec::new(),
            renames: None,
            rename_failures: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Register more output ports, with these short names (`CLIENT:NAME`), which the
    /// [`Process`] fills through [`Process::extra_outputs`] in this order. Call before
    /// [`Endpoint::run`]: registering a port is not realtime-safe.
    pub fn register_extra_outputs(&mut self, names: &[String]) -> Result<(), JackError> {
        self.extra.reserve(names.len());
        for short in names {
            let c = CString::new(short.as_str())?;
            // SAFETY: as for the ports registered in `open`.
            let port = unsafe {
                (self.client.api.port_register)(
                    self.client.raw,
                    c.as_ptr(),
                    AUDIO_TYPE.as_ptr(),
                    PORT_IS_OUTPUT,
                    0,
                )
            };
            if port.is_null() {
                return Err(JackError::PortRegister(format!("{}:{short}", self.name)));
            }
            self.extra.push(port);
        }
        Ok(())
    }

    /// Whether this libjack can rename ports (`jack_port_rename`).
    pub fn can_rename_ports(&self) -> bool {
        self.client.api.port_rename.is_some()
    }

    /// A handle that renames the extra ports while the stream runs; None when libjack
    /// cannot rename ports.
    pub fn port_renamer(&mut self) -> Option<PortRenamer> {
        self.client.api.port_rename?;
        let tx = self.renames.get_or_insert_with(mpsc::channel).0.clone();
        Some(PortRenamer {
            tx,
            failures: self.rename_failures.clone(),
        })
    }

    /// The largest latency of `ports` in direction `mode` (frames; 0 when libjack cannot
    /// tell). Not for the process callback.
    fn port_latency(&self, ports: &[*mut Port], mode: c_int) -> u64 {
        let Some(get) = self.client.api.port_get_latency_range else {
            return 0;
        };
        ports
            .iter()
            .map(|&port| {
                let mut range = LatencyRange::default();
                // SAFETY: the client is open, `port` is one of its ports and `range` is
                // writable; this is not a JACK callback.
                unsafe { get(port, mode, &mut range) };
                u64::from(range.max)
            })
            .max()
            .unwrap_or(0)
    }

    /// Do the renames asked for so far (on the thread that owns the client).
    fn apply_renames(&self) {
        let (Some((_, rx)), Some(rename)) = (&self.renames, self.client.api.port_rename) else {
            return;
        };
        while let Ok(r) = rx.try_recv() {
            let Some(&port) = self.extra.get(r.index) else {
                continue;
            };
            let ok = CString::new(r.name.as_str()).is_ok_and(|c| {
                // SAFETY: the client is open, `port` is one of its ports and `c` is
                // NUL-terminated; this is not a JACK callback.
                unsafe { rename(self.client.raw, port, c.as_ptr()) == 0 }
            });
            if !ok {
                self.rename_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    "the JACK server refused to rename port {} of {} to {:?}",
                    r.index + 1,
                    self.name,
                    r.name
                );
            }
        }
    }

    /// The client's name as JACK registered it (its ports are `NAME:send_N`, `NAME:receive_N`).
    pub fn client_name(&self) -> &str {
        &self.name
    }

    /// Stop after `frames` frames.
    pub fn with_limit(mut self, frames: Option<u64>) -> Self {
        self.limit_frames = frames;
        self
    }

    pub fn monitor(&self) -> JackMonitor {
        JackMonitor {
            stats: self.stats.clone(),
        }
    }

    /// Whether the server says it runs realtime (before the first period shows it for sure).
    pub fn server_realtime(&self) -> bool {
        // SAFETY: the client is open.
        unsafe { (self.client.api.is_realtime)(self.client.raw) != 0 }
    }

    /// Connect `send_k` to the physical capture port the input map names for it (by
    /// default the k-th) and `receive_k` to the physical playback port the output map names;
    /// returns the pairs connected. A port the server lacks is left unconnected.
    fn connect_physical(&self) -> Vec<(String, String)> {
        let mut done = Vec::new();
        // Physical capture ports are outputs (they produce audio); playback ports are inputs.
        let capture = self.client.ports(PORT_IS_PHYSICAL | PORT_IS_OUTPUT);
        let playback = self.client.ports(PORT_IS_PHYSICAL | PORT_IS_INPUT);
        for (k, &c) in self.inputs.picks().iter().enumerate() {
            let Some(from) = capture.get(c as usize) else {
                continue;
            };
            let to = format!("{}:send_{}", self.name, k + 1);
            if self.client.connect(from, &to) {
                done.push((from.clone(), to));
            }
        }
        for (k, &c) in self.outputs.picks().iter().enumerate() {
            let Some(to) = playback.get(c as usize) else {
                continue;
            };
            let from = format!("{}:receive_{}", self.name, k + 1);
            if self.client.connect(&from, to) {
                done.push((from, to.clone()));
            }
        }
        done
    }
}

impl Endpoint for JackEndpoint {
    fn spec(&self) -> StreamSpec {
        self.spec
    }

    fn run(
        self: Box<Self>,
        process: &mut dyn Process,
        stop: Arc<AtomicBool>,
    ) -> anyhow::Result<(StopReason, PeriodStats)> {
        let s = self.spec;
        let period = s.period as usize;
        let period_ns = netjam_engine::time::frames_to_ns(s.period as u64, s.rate);
        // SAFETY: only the lifetime of the trait object is erased; the pointer is used by the
        // callback between activation and deactivation below, inside this borrow.
        let process: *mut dyn Process =
            unsafe { std::mem::transmute::<*mut (dyn Process + '_), *mut (dyn Process + 'static)>(process) };
        let mut state = Box::new(CallbackState {
            api: self.client.api,
            client: self.client.raw,
            process,
            send: self.send.clone(),
            receive: self.receive.clone(),
            extra: self.extra.clone(),
            extra_out: vec![0.0; period * self.extra.len()],
            input: vec![0.0; period * s.input_channels as usize],
            output: vec![0.0; period * s.output_channels as usize],
            period: s.period,
            period_ns,
            last_nominal: 0,
            last_cycle_frames: None,
            slip: SlipGuard::new(s.rate),
            stats: self.stats.clone(),
            timer: PeriodTimer::default(),
            policy_seen: false,
            failed: false,
        });
        let api = self.client.api;
        let raw = self.client.raw;
        let state_ptr: *mut CallbackState = &mut *state;
        let stats_ptr = Arc::as_ptr(&self.stats).cast_mut().cast::<c_void>();
        // SAFETY: the client is open and not active; `state` and `self.stats` outlive the
        // activation (deactivation happens below, before either is dropped).
        let ok = unsafe {
            (api.set_process_callback)(raw, on_process, state_ptr.cast()) == 0
                && (api.set_xrun_callback)(raw, on_xrun, stats_ptr) == 0
        };
        if !ok {
            anyhow::bail!("the JACK server refused netjam's callbacks");
        }
        // SAFETY: as above.
        unsafe { (api.on_shutdown)(raw, on_shutdown, stats_ptr) };
        // SAFETY: the client is open with its callbacks set.
        if unsafe { (api.activate)(raw) } != 0 {
            return Err(JackError::Activate.into());
        }
        if self.connect {
            let pairs = self.connect_physical();
            if pairs.is_empty() {
                tracing::warn!(
                    "no physical JACK ports to connect to; connect {}:send_N / receive_N yourself",
                    self.name
                );
            }
            for (a, b) in pairs {
                tracing::info!("connected {a} -> {b}");
            }
        }
        let started = Instant::now();
        let mut watch = StallWatch::new(started);
        let reason = loop {
            if stop.load(Ordering::Relaxed) {
                break Ok(StopReason::Stopped);
            }
            if self.stats.shutdown.load(Ordering::Relaxed) {
                break Err(anyhow::anyhow!(
                    "the JACK server shut down or dropped netjam's client"
                ));
            }
            if self.stats.panicked.load(Ordering::Relaxed) {
                break Err(anyhow::anyhow!(
                    "the audio callback panicked; the stream was silenced"
                ));
            }
            if self.stats.wrong_size.load(Ordering::Relaxed) > 0 {
                break Err(anyhow::anyhow!(
                    "the JACK server changed its period from {} frames; restart netjam to follow it",
                    s.period
                ));
            }
            let frames = self.stats.frames.load(Ordering::Relaxed);
            if self.limit_frames.is_some_and(|l| frames >= l) {
                break Ok(StopReason::Stopped);
            }
            let now = Instant::now();
            watch.saw(frames, now, s.rate);
            if let Some(limit) = self.limit_frames {
                // The limit counts the server's frames; a server that stopped calling
                // netjam would never reach it, so the wall clock bounds it too.
                let asked = Duration::from_secs_f64(limit as f64 / f64::from(s.rate));
                if now.duration_since(started) >= asked + STOP_GRACE {
                    tracing::warn!(
                        "the JACK server ran {:.1} s of the {:.1} s asked in {:.1} s; stopping by the wall clock",
                        frames as f64 / f64::from(s.rate),
                        asked.as_secs_f64(),
                        now.duration_since(started).as_secs_f64()
                    );
                    break Ok(StopReason::Stopped);
                }
            }
            self.apply_renames();
            self.stats.output_latency.store(
                self.port_latency(&self.receive, PLAYBACK_LATENCY),
                Ordering::Relaxed,
            );
            self.stats
                .input_latency
                .store(self.port_latency(&self.send, CAPTURE_LATENCY), Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(10));
        };
        let xruns = self.stats.xruns.load(Ordering::Relaxed);
        let callback_stats = self.stats.clone();
        let answered = let_go(self.client, &callback_stats);
        // The callback no longer touches the timer, whether or not the server answered.
        let mut stats = state.timer.stats();
        if !answered {
            tracing::warn!(
                "the JACK server did not answer netjam's goodbye within {} s; its client is left behind",
                CLOSE_WAIT.as_secs()
            );
            // The server may still call the callback (silence only) when it wakes, with this
            // state as its argument: it must outlive the process.
            Box::leak(state);
        }
        let reason = reason?;
        // An xrun is a deadline the server saw missed, whoever missed it.
        stats.missed_deadlines += xruns;
        Ok((reason, stats))
    }
}

/// How long a stopping stream waits for the server to let its client go.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Take the [`Process`] away from the callback and close the client: false when the server
/// did not answer within [`CLOSE_WAIT`] (a server that is stuck would keep a player from
/// ending). Either way the callback no longer touches the `Process` when this returns; if
/// the server did not answer, it may still play silence through the client's ports.
fn let_go(client: ClientHandle, stats: &CallbackStats) -> bool {
    stats.detached.store(true, Ordering::SeqCst);
    let until = Instant::now() + Duration::from_secs(1);
    while stats.in_callback.load(Ordering::SeqCst) {
        if Instant::now() >= until {
            // A callback that does not come out of the `Process` is not the server's fault;
            // only deactivation, however long it takes, makes the `Process` free again.
            // SAFETY: the client is active.
            unsafe { (client.api.deactivate)(client.raw) };
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (done, answered) = mpsc::channel();
    // Deactivating and closing ask the server; one that is stuck answers when it wakes, and a
    // process that ends first leaves this thread behind.
    let closer = std::thread::Builder::new()
        .name("netjam-jack-close".into())
        .spawn(move || {
            // SAFETY: the client is active; the callback touches nothing but the state's
            // ports from now on.
            unsafe { (client.api.deactivate)(client.raw) };
            drop(client);
            let _ = done.send(());
        });
    // Without a thread the closure, and the client with it, is dropped here: closed, waiting.
    closer.is_err() || answered.recv_timeout(CLOSE_WAIT).is_ok()
}

/// How much longer than `--duration` a stream may take by the wall clock, when its server
/// stood still for a while (stopped, or lost its time), before it ends anyway.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// How long the server may leave netjam's callback uncalled before a player is told.
const STALL_TOLD: Duration = Duration::from_secs(1);

/// Finds a server that stopped calling netjam: one line when it stalls, one when it is back.
struct StallWatch {
    frames: u64,
    since: Instant,
    told: bool,
}

impl StallWatch {
    fn new(now: Instant) -> Self {
        Self {
            frames: 0,
            since: now,
            told: false,
        }
    }

    /// The callback has run `frames` frames in all by `now`.
    fn saw(&mut self, frames: u64, now: Instant, rate: u32) {
        if frames != self.frames {
            if self.told {
                tracing::info!(
                    "the JACK server runs netjam again after {:.1} s",
                    now.duration_since(self.since).as_secs_f64()
                );
            }
            *self = Self {
                frames,
                since: now,
                told: false,
            };
        } else if !self.told && now.duration_since(self.since) >= STALL_TOLD {
            self.told = true;
            tracing::warn!(
                "the JACK server has not run netjam for {:.1} s (at {:.1} s of audio); is it stuck? its log may say why",
                now.duration_since(self.since).as_secs_f64(),
                frames as f64 / f64::from(rate)
            );
        }
    }
}

/// An audio port as `netjam devices` shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PortInfo {
    pub name: String,
    /// Produces audio (a capture port, or another client's output).
    pub output: bool,
    pub physical: bool,
}

/// A snapshot of a running JACK server.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerInfo {
    pub rate: u32,
    pub period: u32,
    pub realtime: bool,
    pub cpu_load_percent: f32,
    pub ports: Vec<PortInfo>,
}

/// Ask a running JACK server (`server`, else JACK_DEFAULT_SERVER, else the default) what it
/// offers.
pub fn server_info(client_name: &str, server: Option<&str>) -> Result<ServerInfo, JackError> {
    let client = ClientHandle::open(client_name, server)?;
    let api = client.api;
    let mut ports = Vec::new();
    for name in client.ports(0) {
        let c = CString::new(name.as_str())?;
        // SAFETY: the client is open and `c` is NUL-terminated.
        let port = unsafe { (api.port_by_name)(client.raw, c.as_ptr()) };
        if port.is_null() {
            continue;
        }
        // SAFETY: `port` is a live port handle; jack_port_type returns a string libjack owns.
        let (flags, ty) = unsafe { ((api.port_flags)(port), cstr_lossy((api.port_type)(port))) };
        if ty != AUDIO_TYPE.to_string_lossy() {
            continue;
        }
        // SAFETY: as above.
        let full = unsafe { cstr_lossy((api.port_name)(port)) };
        ports.push(PortInfo {
            name: full,
            output: flags as c_ulong & PORT_IS_OUTPUT != 0,
            physical: flags as c_ulong & PORT_IS_PHYSICAL != 0,
        });
    }
    // SAFETY: the client is open.
    let (realtime, cpu) = unsafe { ((api.is_realtime)(client.raw) != 0, (api.cpu_load)(client.raw)) };
    Ok(ServerInfo {
        rate: client.rate(),
        period: client.period(),
        realtime,
        cpu_load_percent: cpu,
        ports,
    })
}

/// Whether libjack can be loaded on this machine.
pub fn library_available() -> Result<(), JackError> {
    JackApi::get().map(|_| ())
}
