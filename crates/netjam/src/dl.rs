//! Shared libraries opened at run time (`dlopen`), so netjam builds without a library's
//! headers and runs without it: only the feature that needs it says it is missing.

use std::ffi::{c_char, c_void, CStr};

/// An open shared library, never closed (its functions stay valid for the whole program).
#[derive(Debug)]
pub struct Library {
    handle: *mut c_void,
    name: &'static str,
}

// SAFETY: a dlopen handle may be used from any thread; dlsym is thread-safe.
unsafe impl Send for Library {}
// SAFETY: as above; the handle is never closed or mutated.
unsafe impl Sync for Library {}

impl Library {
    /// Open the first of `names` that loads; `name` is how errors call the library.
    pub fn open(names: &[&CStr], name: &'static str) -> Result<Self, String> {
        for file in names {
            // SAFETY: `file` is a NUL-terminated string; dlopen has no other precondition.
            let handle = unsafe { libc::dlopen(file.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !handle.is_null() {
                return Ok(Self { handle, name });
            }
        }
        // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
        let why = unsafe { cstr_lossy(libc::dlerror()) };
        Err(if why.is_empty() {
            format!("{name} not found")
        } else {
            why
        })
    }

    /// The address of `symbol`, or an error naming it.
    pub fn sym(&self, symbol: &CStr) -> Result<*mut c_void, String> {
        // SAFETY: `handle` is a live library handle (never closed) and `symbol` is NUL-terminated.
        let p = unsafe { libc::dlsym(self.handle, symbol.as_ptr()) };
        if p.is_null() {
            Err(format!("{} lacks {}", self.name, symbol.to_string_lossy()))
        } else {
            Ok(p)
        }
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
