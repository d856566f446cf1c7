//! A counting global allocator for the tests and benchmarks that prove realtime code
//! allocates nothing.
//!
//! Counts are kept per thread, so other test threads running at the same time never
//! disturb a measurement: a test counts exactly what its own thread (the stand-in audio
//! thread) allocates. Install it once per test binary with [`install!`].
//!
//! Allocations (and reallocations) and deallocations are counted apart. A thread whose
//! counters are gone (thread teardown) cannot be measured: the readers panic there rather
//! than read zero, and [`try_allocations`] says so with `None`.
//!
//! Only for tests and benchmarks: it forwards to the system allocator and must never be
//! linked into the `netjam` binary.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
    static DEALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

/// The allocator; see [`install!`].
#[derive(Debug)]
pub struct CountingAllocator;

fn bump() {
    // `try_with`: during thread teardown the counter may already be gone.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

fn bump_free() {
    let _ = DEALLOCATIONS.try_with(|c| c.set(c.get() + 1));
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
        bump_free();
        // SAFETY: `ptr` came from `System.alloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: `ptr` came from `System.alloc` with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations and reallocations made by the calling thread so far; None when this
/// thread's counter is gone (thread teardown), so nothing can be measured here.
pub fn try_allocations() -> Option<u64> {
    ALLOCATIONS.try_with(Cell::get).ok()
}

/// Deallocations made by the calling thread so far; None as for [`try_allocations`].
pub fn try_deallocations() -> Option<u64> {
    DEALLOCATIONS.try_with(Cell::get).ok()
}

/// Allocations and reallocations made by the calling thread so far.
///
/// # Panics
/// When this thread's counter is gone (thread teardown): a measurement there would
/// silently read zero.
pub fn allocations() -> u64 {
    try_allocations().expect("this thread's allocation counter is gone: nothing can be measured here")
}

/// Deallocations made by the calling thread so far; panics as [`allocations`] does.
pub fn deallocations() -> u64 {
    try_deallocations().expect("this thread's deallocation counter is gone: nothing can be measured here")
}

/// Allocations the calling thread made while running `f`, and its result.
pub fn count<R>(f: impl FnOnce() -> R) -> (u64, R) {
    let before = allocations();
    let r = f();
    (allocations() - before, r)
}

/// Allocations and deallocations the calling thread made while running `f`, and its result.
pub fn count_both<R>(f: impl FnOnce() -> R) -> ((u64, u64), R) {
    let (a, d) = (allocations(), deallocations());
    let r = f();
    ((allocations() - a, deallocations() - d), r)
}

/// Proves the counters move on the calling thread: one deliberate allocation and its free,
/// counted. Call it inside a measured region and subtract one of each.
///
/// # Panics
/// When the allocation or the free is not counted (the counting allocator is not
/// installed, or this thread cannot be measured).
pub fn prove_counting() {
    let ((a, d), ()) = count_both(|| drop(std::hint::black_box(Box::new(7u64))));
    assert_eq!(
        (a, d),
        (1, 1),
        "one allocation and one free were made but not counted on this thread: is alloc_count::install!() in this binary?"
    );
}

/// Make [`CountingAllocator`] the global allocator of this test or bench binary.
#[macro_export]
macro_rules! install {
    () => {
        #[global_allocator]
        static COUNTING_ALLOCATOR: $crate::CountingAllocator = $crate::CountingAllocator;
    };
}

#[cfg(test)]
mod tests {
    crate::install!();

    #[test]
    fn counts_allocations_and_frees_apart() {
        let ((a, d), v) = super::count_both(|| std::hint::black_box(vec![1u8; 32]));
        assert_eq!((a, d), (1, 0));
        let ((a, d), ()) = super::count_both(|| drop(v));
        assert_eq!((a, d), (0, 1));
        super::prove_counting();
    }
}
