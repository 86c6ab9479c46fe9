//! The host allocator: 64-byte aligned blocks, and a bounded cache of freed ones, so a loop
//! that frees and reallocates the same sizes every iteration reuses warm memory instead of
//! page-faulting fresh pages (and zeroing them) every time.
//!
//! When a freed block would take the cache past its bound, the sizes used least recently make
//! room for it: a cache that kept its first sizes would fill with a finished phase's blocks (an
//! earlier model, an evaluation batch) and then pass every block of the sizes now in use back
//! to the system, so each step page-faulted its memory afresh (an audio model's defer step ran
//! 154 ms after other models had filled the cache, 127 ms with it to itself).
//!
//! Sizes that change from step to step reuse each other's blocks: a request takes the smallest
//! cached block that holds it (within 2x), large sizes are rounded to eighths of a power of
//! two, the cache holds no more than was ever in use at once, and large blocks are mapped and
//! unmapped directly so that what the cache lets go of leaves the process.

use crate::error::{Error, Result};
use std::alloc::{alloc, alloc_zeroed, dealloc, Layout};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Alignment of every host block: a cache line, and enough for any vector load.
pub const ALIGN: usize = 64;

/// The cache may always hold this much, however little was ever in use at once.
const MIN_CACHE_BOUND: usize = 64 << 20;

/// Blocks of at least this many bytes are mapped from the system directly (where there is
/// `mmap`) and unmapped when freed: glibc keeps freed blocks of a few MiB in its heap (its mmap
/// threshold rises to the largest block freed), so blocks the cache let go of stayed in the
/// process (a transformer trained on random lengths grew to 1.8-2.0 GB with a 0.66 GB cache;
/// fresh mappings are zero, so a zeroed block costs no fill either).
const MAPPED_FROM: usize = 1 << 20;

/// A block of `layout` from the system, zero-filled when `zeroed`; null when there is none.
///
/// # Safety
/// `layout` has a non-zero size.
unsafe fn system_alloc(layout: Layout, zeroed: bool) -> *mut u8 {
    #[cfg(unix)]
    if layout.size() >= MAPPED_FROM {
        // SAFETY: an anonymous private mapping; page-aligned, so ALIGN-aligned.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        return if p == libc::MAP_FAILED {
            std::ptr::null_mut()
        } else {
            p.cast()
        };
    }
    // SAFETY: the caller's non-zero size.
    unsafe {
        if zeroed {
            alloc_zeroed(layout)
        } else {
            alloc(layout)
        }
    }
}

/// Returns a block of `cap` bytes from [`system_alloc`] to the system.
///
/// # Safety
/// `p` came from `system_alloc` with a layout of `cap` bytes and `ALIGN`, and is not used after.
unsafe fn system_free(p: NonNull<u8>, cap: usize) {
    #[cfg(unix)]
    if cap >= MAPPED_FROM {
        // SAFETY: the caller's mapping of `cap` bytes.
        unsafe { libc::munmap(p.as_ptr().cast(), cap) };
        return;
    }
    // SAFETY: the caller's block of this layout.
    unsafe { dealloc(p.as_ptr(), Layout::from_size_align_unchecked(cap, ALIGN)) };
}

/// A freed block waiting for reuse.
struct Block(NonNull<u8>);

// SAFETY: a cached block is plain memory owned by the cache alone.
unsafe impl Send for Block {}

/// Counters of the host allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Allocations served from the cache.
    pub hits: u64,
    /// Allocations that went to the system allocator.
    pub misses: u64,
    /// Bytes held in the cache right now.
    pub cached_bytes: u64,
    /// Bytes of blocks in use right now (bucket capacities).
    pub live_bytes: u64,
    /// The peak of `live_bytes` since creation or the last [`HostAllocator::reset_peak`].
    pub peak_live_bytes: u64,
    /// The cap on `live_bytes` (0: none).
    pub limit_bytes: u64,
}

/// The freed blocks of one size, and when that size was last freed or reused.
#[derive(Default)]
struct Bucket {
    blocks: Vec<Block>,
    used: u64,
}

/// The cached blocks by size, with a clock that orders their buckets' uses. Ordered by size,
/// so a request finds the smallest cached block that holds it ([`FreeBlocks::take_fit`]).
#[derive(Default)]
struct FreeBlocks {
    by_size: BTreeMap<usize, Bucket>,
    clock: u64,
}

impl FreeBlocks {
    /// The largest block a request for a `cap`-byte bucket may take: its own size for small
    /// blocks (power-of-two buckets waste enough already), up to twice it for large ones.
    fn fit_limit(cap: usize) -> usize {
        if cap <= 1 << 16 {
            cap
        } else {
            cap.saturating_mul(2)
        }
    }

    /// Takes the smallest cached block of at least `cap` bytes (and at most
    /// [`FreeBlocks::fit_limit`]), marking its bucket used; the block and its size.
    ///
    /// Not only exact sizes: blocks whose sizes change from step to step (a batch padded to
    /// its longest sequence) then reuse each other, where an exact match missed every few
    /// steps and filled the cache with sizes never asked again.
    fn take_fit(&mut self, cap: usize) -> Option<(NonNull<u8>, usize)> {
        self.clock += 1;
        let clock = self.clock;
        let (&size, bucket) = self
            .by_size
            .range_mut(cap..=Self::fit_limit(cap))
            .find(|(_, b)| !b.blocks.is_empty())?;
        bucket.used = clock;
        bucket.blocks.pop().map(|Block(p)| (p, size))
    }

    /// Marks the bucket of `cap` used now and returns it.
    fn touch(&mut self, cap: usize) -> &mut Bucket {
        self.clock += 1;
        let b = self.by_size.entry(cap).or_default();
        b.used = self.clock;
        b
    }

    /// Takes a block out of the least recently used bucket other than `keep`'s, if any
    /// (dropping buckets found empty).
    fn take_stalest(&mut self, keep: usize) -> Option<(NonNull<u8>, usize)> {
        self.by_size.retain(|_, b| !b.blocks.is_empty());
        let (&cap, bucket) = self
            .by_size
            .iter_mut()
            .filter(|(&cap, _)| cap != keep)
            .min_by_key(|(_, b)| b.used)?;
        bucket.blocks.pop().map(|Block(p)| (p, cap))
    }
}

/// Size-bucketed cache of freed blocks, bounded by `limit` bytes; the least recently used
/// sizes go first when it is full.
pub struct HostAllocator {
    free: Mutex<FreeBlocks>,
    cached: AtomicUsize,
    limit: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    live: AtomicUsize,
    peak_live: AtomicUsize,
    /// The cap on `live` bytes; 0 means none. An allocation past it fails with a clear
    /// out-of-memory error instead of the host swapping or the process being killed.
    live_limit: AtomicUsize,
}

impl HostAllocator {
    /// A cache holding at most `limit` bytes of freed blocks (0 disables caching).
    pub fn new(limit: usize) -> Arc<HostAllocator> {
        Arc::new(HostAllocator {
            free: Mutex::new(FreeBlocks::default()),
            cached: AtomicUsize::new(0),
            limit,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            live: AtomicUsize::new(0),
            peak_live: AtomicUsize::new(0),
            live_limit: AtomicUsize::new(0),
        })
    }

    /// Caps the bytes of blocks in use (0 removes the cap). Blocks already in use stay.
    pub fn set_live_limit(&self, bytes: usize) {
        self.live_limit.store(bytes, Ordering::Relaxed);
    }

    /// Restarts the peak of live bytes from the current value.
    pub fn reset_peak(&self) {
        self.peak_live
            .store(self.live.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Counts `cap` more live bytes, or refuses them past the cap.
    fn reserve(&self, len: usize, cap: usize) -> Result<()> {
        let now = self.live.fetch_add(cap, Ordering::Relaxed) + cap;
        let limit = self.live_limit.load(Ordering::Relaxed);
        if limit != 0 && now > limit {
            self.live.fetch_sub(cap, Ordering::Relaxed);
            return Err(Error::OutOfMemory(format!(
                "allocating {len} bytes would take the memory in use to {now} bytes, over the \
                 limit of {limit} bytes (DEFERFUSE_MEMORY_LIMIT, or \
                 torch.tpu.set_per_process_memory_fraction); free tensors, lower the batch \
                 size, or raise the limit"
            )));
        }
        self.peak_live.fetch_max(now, Ordering::Relaxed);
        Ok(())
    }

    /// The capacity a request of `len` bytes gets: powers of two up to 64 KiB, then multiples
    /// of 64 KiB, and past 1 MiB multiples of an eighth of the power of two below (so the
    /// waste stays under 2x for small blocks and under 64 KiB or 12.5% for large ones).
    ///
    /// The eighths, as PyTorch's CUDA allocator rounds with `roundup_power2_divisions`: sizes
    /// that vary from step to step (a batch padded to its longest sequence) land in few
    /// buckets, so their freed blocks are reused. In 64 KiB steps a transformer trained on
    /// random lengths missed ~60 times a step, its cache filled with sizes never asked again
    /// and the process grew to 3.4 GB, where CPU eager took 0.8.
    pub fn bucket(len: usize) -> usize {
        let n = len.max(ALIGN);
        if n <= 1 << 16 {
            n.next_power_of_two()
        } else {
            let below = 1usize << (usize::BITS - 1 - n.leading_zeros());
            let step = (below / 8).max(1 << 16);
            n.div_ceil(step) * step
        }
    }

    fn layout(cap: usize) -> Result<Layout> {
        Layout::from_size_align(cap, ALIGN)
            .map_err(|_| Error::OutOfMemory(format!("{cap} bytes cannot be laid out")))
    }

    /// A block of at least `len` bytes; zero-filled when `zeroed`, else with any contents.
    pub fn allocate(self: &Arc<Self>, len: usize, zeroed: bool) -> Result<Storage> {
        let want = Self::bucket(len);
        let cached = self.lock_free().take_fit(want);
        if let Some((p, cap)) = cached {
            if self.reserve(len, cap).is_ok() {
                self.cached.fetch_sub(cap, Ordering::Relaxed);
                self.hits.fetch_add(1, Ordering::Relaxed);
                if zeroed {
                    // SAFETY: the block has `cap >= len` bytes.
                    unsafe { std::ptr::write_bytes(p.as_ptr(), 0, len) };
                }
                return Ok(self.storage(p, len, cap));
            }
            // A larger block than the request's bucket would pass the live limit: back it
            // goes, and the request gets a block of its own size if that fits.
            self.lock_free().touch(cap).blocks.push(Block(p));
        }
        self.reserve(len, want)?;
        self.misses.fetch_add(1, Ordering::Relaxed);
        let unreserve = |e| {
            self.live.fetch_sub(want, Ordering::Relaxed);
            e
        };
        let layout = Self::layout(want).map_err(unreserve)?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { system_alloc(layout, zeroed) };
        let p = NonNull::new(p)
            .ok_or_else(|| {
                Error::OutOfMemory(format!(
                    "allocating {len} bytes failed; free tensors, call release_cached_memory, or lower the batch size"
                ))
            })
            .map_err(unreserve)?;
        Ok(self.storage(p, len, want))
    }

    fn storage(self: &Arc<Self>, ptr: NonNull<u8>, len: usize, cap: usize) -> Storage {
        Storage {
            ptr,
            len,
            cap,
            pool: self.clone(),
        }
    }

    /// The cached blocks, locked (their changes are short and never panic midway, so a
    /// poisoned lock is still sound).
    fn lock_free(&self) -> std::sync::MutexGuard<'_, FreeBlocks> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bytes the cache may hold now: its limit, and no more than the peak of live bytes
    /// (or [`MIN_CACHE_BOUND`]). Blocks beyond what was ever in use at once are never all
    /// needed again: with sizes that changed every step the cache kept its whole 1 GiB while
    /// the step's peak was 0.66 GB.
    fn cache_bound(&self) -> usize {
        let peak = self.peak_live.load(Ordering::Relaxed);
        self.limit.min(peak.max(MIN_CACHE_BOUND))
    }

    fn give_back(&self, ptr: NonNull<u8>, cap: usize) {
        self.live.fetch_sub(cap, Ordering::Relaxed);
        let mut to_system: Vec<(NonNull<u8>, usize)> = Vec::new();
        {
            let mut free = self.lock_free();
            // Updated by adding and subtracting, never stored: `allocate` subtracts a block it
            // took after letting go of the lock. Only this lock's holder adds, so the bound
            // holds; a subtraction racing with this read only makes it evict a little more.
            let mut cached = self.cached.load(Ordering::Relaxed);
            let limit = self.cache_bound();
            while cap <= limit && cached + cap > limit {
                let Some(stale) = free.take_stalest(cap) else {
                    break;
                };
                cached -= stale.1;
                self.cached.fetch_sub(stale.1, Ordering::Relaxed);
                to_system.push(stale);
            }
            if cached + cap <= limit {
                free.touch(cap).blocks.push(Block(ptr));
                self.cached.fetch_add(cap, Ordering::Relaxed);
            } else {
                to_system.push((ptr, cap));
            }
        }
        for (p, cap) in to_system {
            // SAFETY: allocated by `allocate` with this capacity.
            unsafe { system_free(p, cap) };
        }
    }

    /// Returns every cached block to the system; the bytes freed. On glibc the freed heap is
    /// also trimmed: it keeps freed blocks of a few MiB for reuse (its mmap threshold rises
    /// to the largest block freed), so without the trim `torch.tpu.empty_cache()` left the
    /// process as large as before.
    pub fn release_cached(&self) -> usize {
        let freed = self.free_cached();
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        if freed > 0 {
            // SAFETY: malloc_trim only returns free heap memory to the system.
            unsafe { libc::malloc_trim(0) };
        }
        freed
    }

    /// Deallocates every cached block; the bytes freed.
    fn free_cached(&self) -> usize {
        let blocks = std::mem::take(&mut self.lock_free().by_size);
        let mut freed = 0;
        for (cap, bucket) in blocks {
            for Block(p) in bucket.blocks {
                // SAFETY: allocated by `allocate` with this capacity.
                unsafe { system_free(p, cap) };
                freed += cap;
            }
        }
        self.cached.fetch_sub(freed, Ordering::Relaxed);
        freed
    }

    /// A snapshot of the allocator's counters (the host cache part of the runtime's stats).
    pub fn stats(&self) -> AllocStats {
        AllocStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            cached_bytes: self.cached.load(Ordering::Relaxed) as u64,
            live_bytes: self.live.load(Ordering::Relaxed) as u64,
            peak_live_bytes: self.peak_live.load(Ordering::Relaxed) as u64,
            limit_bytes: self.live_limit.load(Ordering::Relaxed) as u64,
        }
    }
}

impl Drop for HostAllocator {
    fn drop(&mut self) {
        self.free_cached();
    }
}

/// A host block owned by one buffer; returned to its allocator's cache when dropped.
pub struct Storage {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    pool: Arc<HostAllocator>,
}

// SAFETY: the memory is plain bytes; who may touch it when is ordered by streams and events.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

impl Storage {
    /// The start of the block, valid for [`Storage::len`] bytes while this storage lives.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes asked for; the block behind them may be larger (its size bucket).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether zero bytes were asked for.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.pool.give_back(self.ptr, self.cap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_blocks_are_reused_and_zeroed_on_request() {
        let a = HostAllocator::new(1 << 20);
        let s = a.allocate(1000, false).unwrap();
        // SAFETY: 1000 bytes are valid.
        unsafe { std::ptr::write_bytes(s.ptr(), 0xAB, 1000) };
        let p = s.ptr();
        drop(s);
        let t = a.allocate(900, true).unwrap();
        assert_eq!(t.ptr(), p, "same bucket, same block");
        // SAFETY: 900 bytes are valid.
        assert!(unsafe { std::slice::from_raw_parts(t.ptr(), 900) }
            .iter()
            .all(|&b| b == 0));
        assert_eq!((a.stats().hits, a.stats().misses), (1, 1));
    }

    #[test]
    fn the_cache_stays_within_its_limit_and_can_be_released() {
        let a = HostAllocator::new(300_000);
        let blocks: Vec<_> = (0..4)
            .map(|_| a.allocate(100_000, false).unwrap())
            .collect();
        drop(blocks);
        assert!(a.stats().cached_bytes <= 300_000);
        assert!(a.release_cached() > 0);
        assert_eq!(a.stats().cached_bytes, 0);
    }

    #[test]
    fn a_full_cache_makes_room_for_a_new_size_by_freeing_the_least_recently_used() {
        let a = HostAllocator::new(300_000);
        // An earlier phase's two blocks (128 KiB each) fill most of the cache.
        drop(
            (0..2)
                .map(|_| a.allocate(100_000, false).unwrap())
                .collect::<Vec<_>>(),
        );
        // A newer size (256 KiB) is freed: the older blocks go back to the system.
        let s = a.allocate(200_000, false).unwrap();
        let p = s.ptr();
        drop(s);
        assert!(a.stats().cached_bytes <= 300_000);
        let again = a.allocate(200_000, false).unwrap();
        assert_eq!(again.ptr(), p, "the size in use stays cached");
        let misses = a.stats().misses;
        let _ = a.allocate(100_000, false).unwrap();
        assert_eq!(a.stats().misses, misses + 1, "the stale size was freed");
    }

    #[test]
    fn live_bytes_and_their_peak_follow_blocks_in_use() {
        let a = HostAllocator::new(1 << 20);
        let x = a.allocate(1000, false).unwrap();
        let y = a.allocate(100, false).unwrap();
        assert_eq!(a.stats().live_bytes, 1024 + 128);
        drop(x);
        assert_eq!(
            (a.stats().live_bytes, a.stats().peak_live_bytes),
            (128, 1152)
        );
        a.reset_peak();
        assert_eq!(a.stats().peak_live_bytes, 128);
        drop(y);
        assert_eq!(a.stats().live_bytes, 0);
    }

    #[test]
    fn an_allocation_past_the_live_limit_is_an_out_of_memory_error() {
        let a = HostAllocator::new(1 << 20);
        a.set_live_limit(4096);
        let x = a.allocate(4000, false).unwrap();
        let e = a.allocate(64, false).err().expect("over the limit");
        assert!(matches!(e, Error::OutOfMemory(_)));
        assert!(
            e.to_string().contains("over the limit of 4096 bytes"),
            "{e}"
        );
        drop(x);
        assert!(a.allocate(64, false).is_ok(), "freed memory counts again");
        assert_eq!(
            a.stats().live_bytes,
            0,
            "the refused request is not counted"
        );
    }

    #[test]
    fn large_blocks_are_rounded_to_an_eighth_of_their_power_of_two() {
        assert_eq!(HostAllocator::bucket(1000), 1024);
        assert_eq!(HostAllocator::bucket(100_000), 131_072);
        assert_eq!(HostAllocator::bucket(1 << 20), 1 << 20);
        assert_eq!(HostAllocator::bucket((1 << 20) + 1), (1 << 20) + (1 << 17));
        assert_eq!(HostAllocator::bucket(5_000_000), 5 << 20);
        for len in [70_000, 1_500_000, 3_000_001, 40_000_000, 123_456_789] {
            let cap = HostAllocator::bucket(len);
            assert!(
                cap >= len && (cap - len) * 8 <= len.max(1 << 19),
                "{len} -> {cap}"
            );
        }
    }

    #[test]
    fn blocks_of_nearby_large_sizes_are_reused() {
        let a = HostAllocator::new(64 << 20);
        let s = a.allocate(5_000_000, false).unwrap();
        let p = s.ptr();
        drop(s);
        assert_eq!(a.allocate(5_100_000, false).unwrap().ptr(), p);
    }

    #[test]
    fn a_request_takes_the_smallest_cached_block_that_holds_it() {
        let a = HostAllocator::new(64 << 20);
        let (big, bigger) = (
            a.allocate(3 << 20, false).unwrap(),
            a.allocate(4 << 20, false).unwrap(),
        );
        let p = big.ptr();
        drop((big, bigger));
        let s = a.allocate(2 << 20, false).unwrap();
        assert_eq!(s.ptr(), p, "the 3 MiB block, not the 4 MiB one");
        assert_eq!(
            a.stats().live_bytes,
            3 << 20,
            "a block counts at its own size"
        );
        assert_eq!((a.stats().hits, a.stats().misses), (1, 2));
    }

    #[test]
    fn a_cached_block_more_than_twice_the_request_is_left_for_larger_ones() {
        let a = HostAllocator::new(64 << 20);
        drop(a.allocate(5 << 20, false).unwrap());
        let _s = a.allocate(2 << 20, false).unwrap();
        assert_eq!(a.stats().hits, 0);
        assert_eq!(a.stats().cached_bytes, 5 << 20);
    }

    #[test]
    fn a_small_request_takes_only_its_own_bucket() {
        let a = HostAllocator::new(1 << 20);
        drop(a.allocate(2048, false).unwrap());
        let _s = a.allocate(1000, false).unwrap();
        assert_eq!((a.stats().hits, a.stats().misses), (0, 2));
    }

    #[test]
    fn a_larger_cached_block_past_the_live_limit_gives_way_to_one_of_the_requests_size() {
        let a = HostAllocator::new(64 << 20);
        drop(a.allocate(3 << 20, false).unwrap());
        a.set_live_limit(5 << 19);
        let s = a.allocate(2 << 20, false).unwrap();
        assert_eq!(a.stats().live_bytes, 2 << 20);
        assert_eq!(
            a.stats().cached_bytes,
            3 << 20,
            "the larger block stays cached"
        );
        drop(s);
    }

    #[test]
    fn the_cache_holds_no_more_than_the_peak_of_blocks_in_use_at_once() {
        let a = HostAllocator::new(1 << 30);
        // One at a time: the peak in use is one block, so freeing many keeps few.
        for len in (0..40).map(|i| (3 << 20) + i * (1 << 20)) {
            drop(a.allocate(len, false).unwrap());
        }
        let s = a.stats();
        assert!(
            s.cached_bytes <= (s.peak_live_bytes).max(MIN_CACHE_BOUND as u64),
            "{s:?}"
        );
        assert!(s.peak_live_bytes < 64 << 20);
    }

    #[test]
    fn blocks_are_64_byte_aligned() {
        let a = HostAllocator::new(0);
        for len in [1, 63, 65, 4097, 1 << 20] {
            assert_eq!(a.allocate(len, false).unwrap().ptr() as usize % ALIGN, 0);
        }
    }
}
