//! Realtime scheduling for the audio and network threads.
//!
//! Where the system allows it, the audio thread and the network threads run under
//! `SCHED_FIFO` and the process's memory is locked, so the kernel never makes a callback
//! wait for a page or for a background job. Where it does not (no privilege, no rtprio
//! limit), netjam says so once, in one line, and runs at normal priority.
//!
//! On macOS and Windows netjam does not yet raise its own threads (no time-constraint
//! policy, no MMCSS) and says so in one line; it never changes the priority of the
//! threads CoreAudio or WASAPI run a sound card's callback on.

use std::sync::atomic::{AtomicBool, Ordering};

/// Priority of the audio thread (the network threads run just below it).
pub const AUDIO_PRIORITY: i32 = 80;
pub const NETWORK_PRIORITY: i32 = 75;

/// What a thread got.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "scheduling", rename_all = "snake_case")]
pub enum RtStatus {
    Realtime { priority: i32 },
    Normal { reason: String },
}

static WARNED: AtomicBool = AtomicBool::new(false);
static DISABLED: AtomicBool = AtomicBool::new(false);

/// Never ask for realtime scheduling in this process (tests, `--no-realtime`).
pub fn disable() {
    DISABLED.store(true, Ordering::Relaxed);
}

/// Move the calling thread to `SCHED_FIFO` at `priority`; on failure, warn once and stay.
pub fn promote_current_thread(priority: i32) -> RtStatus {
    if DISABLED.load(Ordering::Relaxed) || std::env::var_os("NETJAM_NO_REALTIME").is_some() {
        return RtStatus::Normal {
            reason: "disabled".into(),
        };
    }
    let status = set_fifo(priority);
    if let RtStatus::Normal { reason } = &status {
        if !WARNED.swap(true, Ordering::Relaxed) {
            #[cfg(target_os = "linux")]
            eprintln!(
                "netjam: warning: no realtime priority ({reason}); audio may glitch when the machine is busy. \
                 Allow it with an rtprio limit (e.g. `@audio - rtprio 95` in /etc/security/limits.conf)"
            );
            #[cfg(not(target_os = "linux"))]
            eprintln!("netjam: realtime: {reason}");
        }
    }
    status
}

#[cfg(target_os = "linux")]
fn set_fifo(priority: i32) -> RtStatus {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pthread_self() is the calling thread; `param` is a valid sched_param that
    // outlives the call.
    let rc = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
    if rc == 0 {
        RtStatus::Realtime { priority }
    } else {
        RtStatus::Normal {
            reason: std::io::Error::from_raw_os_error(rc).to_string(),
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn set_fifo(_priority: i32) -> RtStatus {
    RtStatus::Normal {
        reason: NOT_RAISED_HERE.into(),
    }
}

/// What netjam's own threads get where it does not ask for realtime scheduling.
#[cfg(not(target_os = "linux"))]
const NOT_RAISED_HERE: &str = if cfg!(target_os = "macos") {
    "on macOS netjam does not raise its own threads (network, file and pipe audio) above normal \
     priority yet; a sound card's callback runs on CoreAudio's I/O thread, which CoreAudio schedules itself"
} else if cfg!(windows) {
    "on Windows netjam does not raise its own threads (network, file and pipe audio) above normal \
     priority yet (no MMCSS); a sound card's callback runs on the WASAPI thread cpal raises to time-critical"
} else {
    "netjam asks for realtime scheduling only on Linux; its threads run at normal priority here"
};

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
