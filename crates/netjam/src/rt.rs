//! Realtime scheduling for netjam's own audio and network threads, per platform.
//!
//! - Linux: the thread moves to `SCHED_FIFO` and the process's memory is locked, so the
//!   kernel never makes a callback wait for a page or for a background job. The network
//!   threads run just below the audio thread: below netjam's own, or below a JACK callback
//!   at the priority the server gives its clients ([`run_network_below`]).
//! - macOS: the thread gets Mach's time-constraint policy (`thread_policy_set` with
//!   `THREAD_TIME_CONSTRAINT_POLICY`), its period, computation and constraint taken from the
//!   audio period ([`set_period_ns`]). CoreAudio's own I/O thread, where a sound card's
//!   callback runs, is never touched: CoreAudio schedules it itself. netjam does not join the
//!   device's audio workgroup (`os_workgroup`): neither cpal nor a well-kept crate exposes it
//!   safely, so its threads are scheduled beside the device's, not inside its workgroup.
//! - Windows: the thread joins the MMCSS "Pro Audio" task (`AvSetMmThreadCharacteristicsW`),
//!   and leaves it (`AvRevertMmThreadCharacteristics`) when the thread exits. The WASAPI
//!   thread cpal runs a sound card's callback on is left as cpal sets it.
//!
//! Where the system refuses, netjam says so once, in one line, and runs at normal priority.
//! Every promotion is recorded under the thread's name, so the realtime report
//! ([`report_line`], [`threads`]) says what each thread got. This module is called once when
//! a thread starts, never from inside a callback's steady state: it takes a lock and may
//! allocate.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::Mutex;

/// Priority of the audio thread (the network threads run just below it).
pub const AUDIO_PRIORITY: i32 = 80;
pub const NETWORK_PRIORITY: i32 = 75;

/// What the network threads ask for: [`NETWORK_PRIORITY`], or just below an audio thread
/// someone else schedules lower (a JACK server's clients' callbacks, [`run_network_below`]).
static NETWORK_PRIO: AtomicI32 = AtomicI32::new(NETWORK_PRIORITY);

/// The Linux `SCHED_FIFO` priority netjam's network threads take.
pub fn network_priority() -> i32 {
    NETWORK_PRIO.load(Ordering::Relaxed)
}

/// The audio thread runs at `audio` (a JACK callback at the server's client priority):
/// network threads started from now on take the priority just below it (at least 1), so a
/// packet never holds up the callback that is waiting for the CPU.
pub fn run_network_below(audio: i32) {
    NETWORK_PRIO.store((audio - 1).clamp(1, NETWORK_PRIORITY), Ordering::Relaxed);
}

/// What a thread got.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "scheduling", rename_all = "snake_case")]
pub enum RtStatus {
    /// Linux `SCHED_FIFO` at this priority.
    Realtime { priority: i32 },
    /// macOS Mach time-constraint policy: wakes every `period_us`, needs `computation_us`
    /// of CPU within `constraint_us` of waking.
    TimeConstraint {
        period_us: u32,
        computation_us: u32,
        constraint_us: u32,
    },
    /// Windows MMCSS task (`"Pro Audio"`).
    Mmcss { task: &'static str },
    /// An ordinary time-shared thread, and why.
    Normal { reason: String },
}

impl RtStatus {
    /// Whether the thread runs under a realtime class of its platform.
    pub fn is_realtime(&self) -> bool {
        !matches!(self, RtStatus::Normal { .. })
    }
}

impl std::fmt::Display for RtStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RtStatus::Realtime { priority } => write!(f, "SCHED_FIFO {priority}"),
            RtStatus::TimeConstraint {
                period_us,
                computation_us,
                constraint_us,
            } => write!(
                f,
                "time-constraint (period {period_us} µs, computation {computation_us} µs, constraint {constraint_us} µs)"
            ),
            RtStatus::Mmcss { task } => write!(f, "MMCSS \"{task}\""),
            RtStatus::Normal { reason } => write!(f, "normal priority ({reason})"),
        }
    }
}

/// What one of netjam's threads got when it asked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ThreadRt {
    pub thread: String,
    #[serde(flatten)]
    pub status: RtStatus,
}

static WARNED: AtomicBool = AtomicBool::new(false);
static DISABLED: AtomicBool = AtomicBool::new(false);
/// The audio period threads are scheduled around; 0 until someone who knows it says.
static PERIOD_NS: AtomicU64 = AtomicU64::new(0);
static THREADS: Mutex<Vec<ThreadRt>> = Mutex::new(Vec::new());

/// The period assumed before [`set_period_ns`] is called: netjam's default `--frames` (64)
/// at 48 kHz.
pub const DEFAULT_PERIOD_NS: u64 = 64 * 1_000_000_000 / 48_000;

/// Never ask for realtime scheduling in this process (tests, `--no-realtime`).
pub fn disable() {
    DISABLED.store(true, Ordering::Relaxed);
}

/// The audio period (one callback or packet) that threads promoted from now on are
/// scheduled around (macOS time-constraint policy; ignored elsewhere).
pub fn set_period_ns(ns: u64) {
    PERIOD_NS.store(ns, Ordering::Relaxed);
}

/// The audio period threads are scheduled around.
pub fn period_ns() -> u64 {
    match PERIOD_NS.load(Ordering::Relaxed) {
        0 => DEFAULT_PERIOD_NS,
        ns => ns,
    }
}

/// Raise the calling thread the way its platform allows (see the module docs; `priority`
/// is the Linux `SCHED_FIFO` priority), record what it got under its name, and on failure
/// warn once and stay at normal priority.
pub fn promote_current_thread(priority: i32) -> RtStatus {
    let status = if DISABLED.load(Ordering::Relaxed) || std::env::var_os("NETJAM_NO_REALTIME").is_some() {
        RtStatus::Normal {
            reason: "disabled".into(),
        }
    } else {
        let status = platform_promote(priority, period_ns());
        if let RtStatus::Normal { reason } = &status {
            if !WARNED.swap(true, Ordering::Relaxed) {
                #[cfg(target_os = "linux")]
                eprintln!(
                    "netjam: warning: no realtime priority ({reason}); audio may glitch when the machine is busy. \
                     Allow it with an rtprio limit (e.g. `@audio - rtprio 95` in /etc/security/limits.conf)"
                );
                #[cfg(not(target_os = "linux"))]
                eprintln!("netjam: warning: no realtime scheduling ({reason}); audio may glitch when the machine is busy");
            }
        }
        status
    };
    record(status.clone());
    status
}

/// Remember what the calling thread got (its latest promotion replaces an earlier one).
fn record(status: RtStatus) {
    let thread = std::thread::current()
        .name()
        .unwrap_or("unnamed thread")
        .to_owned();
    if let Ok(mut threads) = THREADS.lock() {
        match threads.iter_mut().find(|t| t.thread == thread) {
            Some(t) => t.status = status,
            None => threads.push(ThreadRt { thread, status }),
        }
    }
}

/// What each of netjam's threads got so far, in the order they asked.
pub fn threads() -> Vec<ThreadRt> {
    THREADS.lock().map(|t| t.clone()).unwrap_or_default()
}

/// One line for the realtime report: each thread and what it got, or None before any asked.
pub fn report_line() -> Option<String> {
    let threads = threads();
    (!threads.is_empty()).then(|| {
        let parts: Vec<String> = threads
            .iter()
            .map(|t| format!("{}: {}", t.thread, t.status))
            .collect();
        format!("realtime: {}", parts.join("; "))
    })
}

/// Put the calling thread under SCHED_FIFO at `priority`: one system call, no allocation, no
/// lock and no log, so an audio callback may call it on its own thread. The one place netjam
/// asks for SCHED_FIFO. Err holds the error number.
#[cfg(target_os = "linux")]
pub fn set_fifo(priority: i32) -> Result<(), i32> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pthread_self() is the calling thread; `param` is a valid sched_param that
    // outlives the call.
    match unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) } {
        0 => Ok(()),
        rc => Err(rc),
    }
}

#[cfg(target_os = "linux")]
fn platform_promote(priority: i32, _period_ns: u64) -> RtStatus {
    match set_fifo(priority) {
        Ok(()) => RtStatus::Realtime { priority },
        Err(rc) => RtStatus::Normal {
            reason: std::io::Error::from_raw_os_error(rc).to_string(),
        },
    }
}

/// The time-constraint policy for a thread that wakes once per `period_ns`: it needs a
/// quarter of the period of CPU (netjam's threads measure well under that per period) and
/// must have it within the period. In µs: (period, computation, constraint).
pub fn time_constraint_us(period_ns: u64) -> (u32, u32, u32) {
    let period_us = (period_ns / 1_000).clamp(1, u32::MAX as u64) as u32;
    (period_us, (period_us / 4).max(1), period_us)
}

#[cfg(target_os = "macos")]
fn platform_promote(_priority: i32, period_ns: u64) -> RtStatus {
    let mut timebase = mach2::mach_time::mach_timebase_info { numer: 0, denom: 0 };
    // SAFETY: `timebase` is a valid struct that outlives the call, which only writes it.
    let rc = unsafe { mach2::mach_time::mach_timebase_info(&mut timebase) };
    if rc != 0 || timebase.numer == 0 {
        return RtStatus::Normal {
            reason: format!("mach_timebase_info failed ({rc})"),
        };
    }
    // Mach absolute-time units per µs.
    let to_abs = |us: u32| -> u32 {
        (us as u64 * 1_000 * timebase.denom as u64 / timebase.numer as u64).min(u32::MAX as u64) as u32
    };
    let (period_us, computation_us, constraint_us) = time_constraint_us(period_ns);
    let mut policy = libc::thread_time_constraint_policy {
        period: to_abs(period_us),
        computation: to_abs(computation_us),
        constraint: to_abs(constraint_us),
        preemptible: 1,
    };
    // SAFETY: pthread_mach_thread_np names the calling thread's own Mach port (no reference
    // is taken); `policy` is a valid time-constraint policy of
    // THREAD_TIME_CONSTRAINT_POLICY_COUNT integers that outlives the call.
    let rc = unsafe {
        libc::thread_policy_set(
            libc::pthread_mach_thread_np(libc::pthread_self()),
            libc::THREAD_TIME_CONSTRAINT_POLICY as libc::thread_policy_flavor_t,
            std::ptr::addr_of_mut!(policy).cast(),
            libc::THREAD_TIME_CONSTRAINT_POLICY_COUNT,
        )
    };
    if rc == libc::KERN_SUCCESS {
        RtStatus::TimeConstraint {
            period_us,
            computation_us,
            constraint_us,
        }
    } else {
        RtStatus::Normal {
            reason: format!("thread_policy_set refused the time-constraint policy (kern_return {rc})"),
        }
    }
}

/// The MMCSS task a thread joined, left when the thread exits.
#[cfg(windows)]
struct MmcssTask(std::cell::Cell<windows_sys::Win32::Foundation::HANDLE>);

#[cfg(windows)]
impl Drop for MmcssTask {
    fn drop(&mut self) {
        let handle = self.0.replace(std::ptr::null_mut());
        if !handle.is_null() {
            // SAFETY: `handle` came from AvSetMmThreadCharacteristicsW on this thread (a
            // thread-local is dropped on the thread that owns it) and is reverted once.
            unsafe { windows_sys::Win32::System::Threading::AvRevertMmThreadCharacteristics(handle) };
        }
    }
}

#[cfg(windows)]
thread_local! {
    static MMCSS_TASK: MmcssTask = const { MmcssTask(std::cell::Cell::new(std::ptr::null_mut())) };
}

/// The MMCSS task netjam's threads join.
#[cfg(windows)]
const MMCSS_TASK_NAME: &str = "Pro Audio";

#[cfg(windows)]
fn platform_promote(_priority: i32, _period_ns: u64) -> RtStatus {
    if MMCSS_TASK.with(|t| !t.0.get().is_null()) {
        return RtStatus::Mmcss {
            task: MMCSS_TASK_NAME,
        };
    }
    let name: Vec<u16> = MMCSS_TASK_NAME.encode_utf16().chain(std::iter::once(0)).collect();
    let mut index = 0u32;
    // SAFETY: `name` is a NUL-terminated UTF-16 string and `index` a u32, both outliving
    // the call; a zero task index asks MMCSS to assign one.
    let handle = unsafe {
        windows_sys::Win32::System::Threading::AvSetMmThreadCharacteristicsW(name.as_ptr(), &mut index)
    };
    if handle.is_null() {
        return RtStatus::Normal {
            reason: format!(
                "MMCSS refused the \"{MMCSS_TASK_NAME}\" task ({}); is the Multimedia Class Scheduler service running?",
                std::io::Error::last_os_error()
            ),
        };
    }
    MMCSS_TASK.with(|t| t.0.set(handle));
    RtStatus::Mmcss {
        task: MMCSS_TASK_NAME,
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos", windows)))]
fn platform_promote(_priority: i32, _period_ns: u64) -> RtStatus {
    RtStatus::Normal {
        reason: "netjam asks for realtime scheduling only on Linux, macOS and Windows".into(),
    }
}

/// Lock the memory the process holds now (call it once the audio buffers are reserved),
/// so no callback waits for a page. Future allocations are not locked: with a small
/// memlock limit that would make them fail. Returns why not, if it could not.
pub fn lock_memory() -> Result<(), String> {
    if DISABLED.load(Ordering::Relaxed) || std::env::var_os("NETJAM_NO_REALTIME").is_some() {
        return Err("disabled".into());
    }
    #[cfg(target_os = "linux")]
    {
        // SAFETY: mlockall takes flags only and touches no memory of ours.
        let rc = unsafe { libc::mlockall(libc::MCL_CURRENT) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().to_string())
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err("memory locking is only requested on Linux".into())
    }
}

/// Pin the calling thread to CPU `cpu` (Linux; e.g. to keep a forwarding thread off the
/// core that takes the network card's interrupts, or to measure one core). Returns
/// whether the system allowed it; elsewhere it does nothing and returns false.
pub fn pin_current_thread(cpu: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        // SAFETY: `set` is a zeroed cpu_set_t (a valid empty set) that CPU_SET fills
        // within its bounds (`cpu` is checked against CPU_SETSIZE above);
        // sched_setaffinity(0, …) applies it to the calling thread and only reads `set`,
        // which outlives the call.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        false
    }
}

/// CPU time the calling thread has used so far, in ns (`None` where the system does not
/// say). One `clock_gettime`: cheap enough for a report, not for every packet.
pub fn thread_cpu_ns() -> Option<u64> {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec that outlives the call, which only writes it.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_constraint_follows_the_period() {
        // 64 frames at 48 kHz: 1333 µs each period, a quarter of it to compute.
        assert_eq!(time_constraint_us(DEFAULT_PERIOD_NS), (1333, 333, 1333));
        // 128 frames at 44.1 kHz.
        assert_eq!(time_constraint_us(2_902_494), (2902, 725, 2902));
        // Never a zero computation, which the kernel would refuse.
        assert_eq!(time_constraint_us(500), (1, 1, 1));
    }

    #[test]
    fn the_report_names_each_thread_and_what_it_got() {
        std::thread::Builder::new()
            .name("rt-test-thread".into())
            .spawn(|| record(RtStatus::Mmcss { task: "Pro Audio" }))
            .unwrap()
            .join()
            .unwrap();
        let line = report_line().unwrap();
        assert!(line.contains("rt-test-thread: MMCSS \"Pro Audio\""), "{line}");
        let got = threads()
            .into_iter()
            .find(|t| t.thread == "rt-test-thread")
            .unwrap();
        let json = serde_json::to_string(&got).unwrap();
        assert_eq!(
            json,
            r#"{"thread":"rt-test-thread","scheduling":"mmcss","task":"Pro Audio"}"#
        );
    }
}
