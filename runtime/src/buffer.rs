//! Buffers: 64-byte aligned host storage with a lifecycle (deferred -> executing ->
//! materialized). Storage is allocated when the first program that writes the buffer is
//! launched, so a value that is never written never costs memory.

use crate::error::{Error, Result};
use crate::stream::Progress;
use deferfuse_fusion::BufferId;
use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// The last op that writes a buffer: which stream, and once launched, which job to wait for.
#[derive(Clone)]
pub struct Writer {
    pub stream: u64,
    /// `None` while the write is still recorded in the stream's trace.
    pub done: Option<(Arc<Progress>, u64)>,
}

/// Alignment of every host buffer: a cache line, and enough for any vector load.
pub const ALIGN: usize = 64;

/// Where a buffer is in its life.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferState {
    /// Written by ops still recorded in a trace; nothing has run.
    Deferred = 0,
    /// A program writing it is queued or running.
    Executing = 1,
    /// Its contents are final until the next write.
    Materialized = 2,
}

/// Aligned, zeroed host memory.
pub struct Storage {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the memory is plain bytes; who may touch it when is ordered by streams and events.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

impl Storage {
    /// Allocates `len` zeroed bytes; an allocation failure is an error, never an abort.
    pub fn new(len: usize) -> Result<Storage> {
        let layout = Layout::from_size_align(len.max(1), ALIGN)
            .map_err(|_| Error::OutOfMemory(format!("{len} bytes cannot be laid out")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::OutOfMemory(format!(
                "allocating {len} bytes failed; free tensors or lower the batch size"
            )));
        }
        Ok(Storage { ptr, len })
    }

    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe {
            dealloc(
                self.ptr,
                Layout::from_size_align_unchecked(self.len.max(1), ALIGN),
            )
        }
    }
}

/// A buffer shared by every view of it and by the work that reads or writes it.
pub struct Buffer {
    pub id: BufferId,
    /// Size in bytes.
    pub len: usize,
    storage: OnceLock<Storage>,
    /// Recorded-but-not-flushed ops writing this buffer.
    deferred_writes: AtomicU32,
    /// Launched-but-not-finished programs writing this buffer.
    inflight_writes: AtomicU32,
    writer: Mutex<Option<Writer>>,
}

impl Buffer {
    pub fn new(id: BufferId, len: usize) -> Buffer {
        Buffer {
            id,
            len,
            storage: OnceLock::new(),
            deferred_writes: AtomicU32::new(0),
            inflight_writes: AtomicU32::new(0),
            writer: Mutex::new(None),
        }
    }

    /// The storage, allocating it on first use.
    pub fn storage(&self) -> Result<&Storage> {
        if let Some(s) = self.storage.get() {
            return Ok(s);
        }
        let s = Storage::new(self.len)?;
        Ok(self.storage.get_or_init(|| s))
    }

    /// True once storage exists (a buffer whose producer was fused away never allocates).
    pub fn is_allocated(&self) -> bool {
        self.storage.get().is_some()
    }

    pub fn state(&self) -> BufferState {
        if self.deferred_writes.load(Ordering::Acquire) > 0 {
            BufferState::Deferred
        } else if self.inflight_writes.load(Ordering::Acquire) > 0 {
            BufferState::Executing
        } else {
            BufferState::Materialized
        }
    }

    pub fn writer(&self) -> Option<Writer> {
        self.writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_writer(&self, w: Writer) {
        *self.writer.lock().unwrap_or_else(|p| p.into_inner()) = Some(w);
    }

    pub fn mark_recorded(&self) {
        self.deferred_writes.fetch_add(1, Ordering::AcqRel);
    }

    /// A recorded write left the trace (launched, or dropped as dead).
    pub fn mark_flushed(&self) {
        self.deferred_writes.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn mark_launched(&self) {
        self.inflight_writes.fetch_add(1, Ordering::AcqRel);
    }

    pub fn mark_done(&self) {
        self.inflight_writes.fetch_sub(1, Ordering::AcqRel);
    }
}
