//! A counting global allocator for the tests and benchmarks that prove realtime code
//! allocates nothing.
//!
//! Counts are kept per thread, so other test threads running at the same time never
//! disturb a measurement: a test counts exactly what its own thread (the stand-in audio
//! thread) allocates. Install it once per test binary with [`install!`].
//!
//! Only for tests and benchmarks: it forwards to the system allocator and must never be
//! linked into the `netjam` binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The allocator; see [`install!`].
#[derive(Debug)]
pub struct CountingAllocator;

fn bump() {
    // `try_with`: during thread teardown the counter may already be gone.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is forwarded unchanged to the system allocator, which upholds the
// GlobalAlloc contract; the counter is a const-initialised thread-local `Cell` that never
// allocates itself.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: `ptr` came from `System.alloc` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations and reallocations made by the calling thread so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.try_with(Cell::get).unwrap_or(0)
}

/// Allocations the calling thread made while running `f`, and its result.
pub fn count<R>(f: impl FnOnce() -> R) -> (u64, R) {
    let before = allocations();
    let r = f();
    (allocations() - before, r)
}

/// Make [`CountingAllocator`] the global allocator of this test or bench binary.
#[macro_export]
macro_rules! install {
    () => {
        #[global_allocator]
        static COUNTING_ALLOCATOR: $crate::CountingAllocator = $crate::CountingAllocator;
    };
}
