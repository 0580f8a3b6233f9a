//! The system allocator, counting: what the benchmarks print allocations and bytes from. Both
//! totals (allocations and bytes asked for, ever) and what is live (bytes, allocations, and the
//! bytes musl's allocator, the image's, would hold for them).

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicI64, AtomicU64, Ordering},
};

pub struct Counting;

pub static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
pub static BYTES: AtomicU64 = AtomicU64::new(0);
pub static LIVE: AtomicI64 = AtomicI64::new(0);
pub static LIVE_ALLOCATIONS: AtomicI64 = AtomicI64::new(0);
pub static LIVE_MUSL: AtomicI64 = AtomicI64::new(0);

/// The bytes musl's mallocng holds for an allocation of `n` bytes: the smallest of its size
/// classes (in 16-byte units) that fits `n` and its 4-byte in-band header; past its classes,
/// whole pages.
fn musl(n: usize) -> i64 {
    const CLASSES: [usize; 48] = [
        1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 18, 20, 25, 31, 36, 42, 50, 63, 72, 84, 102, 127,
        146, 170, 204, 255, 292, 340, 409, 511, 584, 682, 818, 1023, 1169, 1364, 1637, 2047, 2340,
        2730, 3276, 4095, 4680, 5460, 6552, 8191,
    ];
    let need = n + 4;
    let held = CLASSES
        .iter()
        .map(|c| c * 16)
        .find(|c| *c >= need)
        .unwrap_or_else(|| need.div_ceil(4096) * 4096);
    held as i64
}

fn allocated(size: usize) {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(size as u64, Ordering::Relaxed);
    live(size, 1);
}

fn live(size: usize, sign: i64) {
    LIVE.fetch_add(sign * size as i64, Ordering::Relaxed);
    LIVE_ALLOCATIONS.fetch_add(sign, Ordering::Relaxed);
    LIVE_MUSL.fetch_add(sign * musl(size), Ordering::Relaxed);
}

// SAFETY: every call is passed to the system allocator as it came.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        allocated(layout.size());
        // SAFETY: as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        live(layout.size(), -1);
        // SAFETY: as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        live(layout.size(), -1);
        allocated(new_size);
        // SAFETY: as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
