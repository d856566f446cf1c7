//! Shared libraries opened at run time, so netjam builds without a library's headers and
//! runs without it: only the feature that needs it (Opus, JACK) says it is missing.
//!
//! Opening goes through the `libloading` crate: it is the maintained, widely used wrapper
//! over `dlopen` (Linux, macOS) and `LoadLibraryExW` (Windows), so one tree builds on all
//! three. What this module adds is *where* to look: an environment variable naming the
//! file, then the names and folders each platform's package managers use (Debian, Fedora
//! and Arch sonames on the default path; Homebrew on both prefixes and MacPorts; Windows
//! DLL names next to the executable, then the loader's search, which includes `PATH`).
//! [`candidates`] is that order as a pure function; when nothing loads, the error lists
//! every place tried, why each failed, and what to install on this platform.
//!
//! A library opened here is never closed: the function pointers taken from it must stay
//! valid for the whole program. Opening happens at set-up, never on the audio thread; on
//! Unix every symbol is bound at open time (`RTLD_NOW`), so no first call made from a
//! callback ever waits for the dynamic linker.

use std::ffi::{c_char, c_void, CStr, OsStr, OsString};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};

/// The operating systems netjam knows where libraries live on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Os {
    /// Linux and other Unix systems whose loader searches the system library path.
    Linux,
    MacOs,
    Windows,
}

impl Os {
    /// The system netjam was built for.
    pub const fn current() -> Self {
        if cfg!(target_os = "macos") {
            Os::MacOs
        } else if cfg!(windows) {
            Os::Windows
        } else {
            Os::Linux
        }
    }
}

/// How to find one library on each platform.
#[derive(Debug)]
pub struct LibrarySpec {
    /// How messages call the library.
    pub name: &'static str,
    /// Environment variable that names the file to open (a path, or a name for the loader).
    pub env_var: &'static str,
    /// File names on Linux, most specific first (sonames before development links).
    pub linux: &'static [&'static str],
    /// File names on macOS, most specific first.
    pub macos: &'static [&'static str],
    /// DLL names on Windows, most usual first.
    pub windows: &'static [&'static str],
    /// What to install, per platform.
    pub install_linux: &'static str,
    pub install_macos: &'static str,
    pub install_windows: &'static str,
}

/// libopus (for `--codec opus`).
pub const LIBOPUS: LibrarySpec = LibrarySpec {
    name: "libopus",
    env_var: "NETJAM_LIBOPUS",
    linux: &["libopus.so.0", "libopus.so"],
    macos: &["libopus.0.dylib", "libopus.dylib"],
    windows: &["opus.dll", "libopus-0.dll"],
    install_linux: "Debian/Ubuntu: `sudo apt install libopus0`; Fedora: `sudo dnf install opus`; \
                    Arch: `sudo pacman -S opus`",
    install_macos: "`brew install opus` (MacPorts: `sudo port install libopus`)",
    install_windows: "put opus.dll (or MSYS2's libopus-0.dll, package mingw-w64-x86_64-opus) \
                      next to netjam.exe or in a folder on PATH",
};

/// libjack (for `--jack` and JACK devices), from JACK2 or PipeWire's JACK.
pub const LIBJACK: LibrarySpec = LibrarySpec {
    name: "libjack",
    env_var: "NETJAM_LIBJACK",
    linux: &["libjack.so.0", "libjack.so"],
    macos: &["libjack.0.dylib"],
    windows: &["libjack64.dll", "libjack.dll"],
    install_linux: "Debian/Ubuntu: `sudo apt install jackd2` (or pipewire-jack); Fedora: \
                    `sudo dnf install pipewire-jack-audio-connection-kit`; Arch: `sudo pacman -S jack2` \
                    (or pipewire-jack)",
    install_macos: "`brew install jack` (MacPorts: `sudo port install jack`)",
    install_windows: "install JACK2 for Windows (jackaudio.org), which provides libjack64.dll",
};

/// Folders searched on macOS before dyld's own path, which has none of them on Apple Silicon:
/// Homebrew (Apple Silicon), Homebrew (Intel) and MacPorts.
pub const MACOS_PREFIXES: [(&str, &str); 3] = [
    ("/opt/homebrew/lib", "Homebrew, Apple Silicon"),
    ("/usr/local/lib", "Homebrew, Intel"),
    ("/opt/local/lib", "MacPorts"),
];

/// One file to try, and where it came from (for the error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// A path, or a bare name the system loader searches for.
    pub file: OsString,
    pub place: String,
}

/// Every file to try for `spec` on `os`, in order. `env_value` is the value of
/// `spec.env_var`: when set, it is the only candidate (a file the user named is not
/// silently replaced by another). `exe_dir` is the folder holding the executable (used on
/// Windows, where DLLs are shipped next to the program).
pub fn candidates(
    spec: &LibrarySpec,
    os: Os,
    env_value: Option<&OsStr>,
    exe_dir: Option<&Path>,
) -> Vec<Candidate> {
    if let Some(file) = env_value.filter(|v| !v.is_empty()) {
        return vec![Candidate {
            file: file.to_os_string(),
            place: format!("named by {}", spec.env_var),
        }];
    }
    let mut out = Vec::new();
    let default = |name: &str, loader: &str| Candidate {
        file: name.into(),
        place: format!("{loader}'s default search path"),
    };
    match os {
        Os::Linux => {
            out.extend(spec.linux.iter().map(|n| default(n, "the dynamic linker")));
        }
        Os::MacOs => {
            for (dir, what) in MACOS_PREFIXES {
                for n in spec.macos {
                    out.push(Candidate {
                        file: PathBuf::from(dir).join(n).into_os_string(),
                        place: what.to_string(),
                    });
                }
            }
            out.extend(spec.macos.iter().map(|n| default(n, "dyld")));
        }
        Os::Windows => {
            if let Some(dir) = exe_dir {
                for n in spec.windows {
                    out.push(Candidate {
                        file: dir.join(n).into_os_string(),
                        place: "next to the executable".into(),
                    });
                }
            }
            out.extend(spec.windows.iter().map(|n| Candidate {
                file: (*n).into(),
                place: "the Windows loader's search (system folders, then PATH)".into(),
            }));
        }
    }
    out
}

/// What to install for `spec` on `os`, and how to name the file instead.
pub fn install_advice(spec: &LibrarySpec, os: Os) -> String {
    let install = match os {
        Os::Linux => spec.install_linux,
        Os::MacOs => spec.install_macos,
        Os::Windows => spec.install_windows,
    };
    format!(
        "install it ({install}), or set {} to the library file",
        spec.env_var
    )
}

/// An open shared library, never closed (its functions stay valid for the whole program).
#[derive(Debug)]
pub struct Library {
    lib: ManuallyDrop<libloading::Library>,
    name: &'static str,
}

impl Library {
    /// Open the first candidate of `spec` for this platform that loads; the error lists
    /// every file tried, why it failed, and what to install.
    pub fn open(spec: &LibrarySpec) -> Result<Self, String> {
        let env = std::env::var_os(spec.env_var);
        let exe_dir = std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf));
        let os = Os::current();
        let mut tried = Vec::new();
        for c in candidates(spec, os, env.as_deref(), exe_dir.as_deref()) {
            match load(&c.file) {
                Ok(lib) => {
                    tracing::debug!("{}: loaded {} ({})", spec.name, c.file.to_string_lossy(), c.place);
                    return Ok(Self {
                        lib: ManuallyDrop::new(lib),
                        name: spec.name,
                    });
                }
                Err(e) => tried.push(format!("  {} ({}): {e}", c.file.to_string_lossy(), c.place)),
            }
        }
        Err(format!(
            "{} could not be loaded; tried:\n{}\n{}",
            spec.name,
            tried.join("\n"),
            install_advice(spec, os)
        ))
    }

    /// The address of `symbol`, or an error naming it.
    pub fn sym(&self, symbol: &CStr) -> Result<*mut c_void, String> {
        // SAFETY: the value is only read as an address (the caller gives it a type that
        // matches the library's declaration); the library is never closed, so the address
        // stays valid after the `Symbol` borrow ends.
        let p = unsafe { self.lib.get::<*mut c_void>(symbol.to_bytes_with_nul()) }.map(|s| *s);
        match p {
            Ok(p) if !p.is_null() => Ok(p),
            _ => Err(format!("{} lacks {}", self.name, symbol.to_string_lossy())),
        }
    }
}

/// Open one file, binding every symbol now on Unix.
fn load(file: &OsStr) -> Result<libloading::Library, libloading::Error> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
        // SAFETY: opening runs the library's initialisers; libopus and libjack's are sound
        // to run at any time from any thread.
        unsafe { UnixLibrary::open(Some(file), RTLD_NOW | RTLD_LOCAL) }.map(Into::into)
    }
    #[cfg(not(unix))]
    {
        // SAFETY: as above (DllMain of opus.dll and libjack64.dll).
        unsafe { libloading::Library::new(file) }
    }
}

/// A C string as Rust text ("" for NULL).
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
pub unsafe fn cstr_lossy(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: the caller guarantees a NUL-terminated string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(c: &[Candidate]) -> Vec<String> {
        c.iter().map(|c| c.file.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn linux_tries_sonames_on_the_default_path() {
        let c = candidates(&LIBOPUS, Os::Linux, None, Some(Path::new("/opt/netjam/bin")));
        assert_eq!(files(&c), ["libopus.so.0", "libopus.so"]);
        let c = candidates(&LIBJACK, Os::Linux, None, None);
        assert_eq!(files(&c), ["libjack.so.0", "libjack.so"]);
    }

    #[test]
    fn macos_tries_homebrew_both_prefixes_and_macports_before_dyld() {
        let c = candidates(&LIBOPUS, Os::MacOs, None, None);
        assert_eq!(
            files(&c),
            [
                "/opt/homebrew/lib/libopus.0.dylib",
                "/opt/homebrew/lib/libopus.dylib",
                "/usr/local/lib/libopus.0.dylib",
                "/usr/local/lib/libopus.dylib",
                "/opt/local/lib/libopus.0.dylib",
                "/opt/local/lib/libopus.dylib",
                "libopus.0.dylib",
                "libopus.dylib",
            ]
        );
        assert_eq!(c[0].place, "Homebrew, Apple Silicon");
        assert_eq!(c[4].place, "MacPorts");
        assert!(c[6].place.contains("dyld"));
        let c = candidates(&LIBJACK, Os::MacOs, None, None);
        assert_eq!(
            files(&c),
            [
                "/opt/homebrew/lib/libjack.0.dylib",
                "/usr/local/lib/libjack.0.dylib",
                "/opt/local/lib/libjack.0.dylib",
                "libjack.0.dylib",
            ]
        );
    }

    #[test]
    fn windows_tries_next_to_the_executable_then_the_loaders_search() {
        let exe = Path::new("netjam-dir");
        let c = candidates(&LIBOPUS, Os::Windows, None, Some(exe));
        let want: Vec<String> = [exe.join("opus.dll"), exe.join("libopus-0.dll")]
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .chain(["opus.dll".into(), "libopus-0.dll".into()])
            .collect();
        assert_eq!(files(&c), want);
        assert!(c[2].place.contains("PATH"));
        // Without a known executable folder, only the loader's search is left.
        let c = candidates(&LIBJACK, Os::Windows, None, None);
        assert_eq!(files(&c), ["libjack64.dll", "libjack.dll"]);
    }

    #[test]
    fn a_named_file_is_the_only_candidate_on_every_platform() {
        for os in [Os::Linux, Os::MacOs, Os::Windows] {
            let c = candidates(&LIBOPUS, os, Some(OsStr::new("/somewhere/my-opus.so")), None);
            assert_eq!(files(&c), ["/somewhere/my-opus.so"]);
            assert_eq!(c[0].place, "named by NETJAM_LIBOPUS");
        }
        // An empty variable is as good as unset.
        let c = candidates(&LIBJACK, Os::Linux, Some(OsStr::new("")), None);
        assert_eq!(files(&c), ["libjack.so.0", "libjack.so"]);
    }

    #[test]
    fn advice_names_the_platforms_package_manager_and_the_variable() {
        let linux = install_advice(&LIBOPUS, Os::Linux);
        for want in ["apt", "dnf", "pacman", "NETJAM_LIBOPUS"] {
            assert!(linux.contains(want), "{linux}");
        }
        assert!(install_advice(&LIBOPUS, Os::MacOs).contains("brew install opus"));
        assert!(install_advice(&LIBJACK, Os::MacOs).contains("brew install jack"));
        assert!(install_advice(&LIBOPUS, Os::Windows).contains("opus.dll"));
        assert!(install_advice(&LIBJACK, Os::Windows).contains("libjack64.dll"));
    }

    #[test]
    fn a_missing_library_error_lists_every_place_tried() {
        let spec = LibrarySpec {
            name: "libnetjam-absent",
            env_var: "NETJAM_TEST_ABSENT_LIBRARY",
            linux: &["libnetjam-absent.so.0"],
            macos: &["libnetjam-absent.0.dylib"],
            windows: &["netjam-absent.dll"],
            install_linux: "nothing",
            install_macos: "nothing",
            install_windows: "nothing",
        };
        let e = Library::open(&spec).expect_err("no such library");
        let os = Os::current();
        for c in candidates(&spec, os, None, None) {
            assert!(e.contains(&*c.file.to_string_lossy()), "{e}");
        }
        assert!(e.contains("NETJAM_TEST_ABSENT_LIBRARY"), "{e}");
    }
}
