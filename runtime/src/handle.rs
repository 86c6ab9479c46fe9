//! Handle tables: opaque 64-bit handles that are checked, never trusted.
//!
//! A handle is `runtime tag (16 bits) | shard (4) | generation (20) | slot (24)`. Objects live
//! in slots of a few sharded slabs, so a lookup is an index and a generation compare under one
//! uncontended lock, with no hashing (every recorded op looks up its inputs, inserts its
//! output and releases a handle). Each thread inserts into its own shard, so threads recording
//! at once rarely meet on a lock.
//!
//! A slot's generation advances every time its object goes away, and a slot whose generation
//! would wrap is retired instead of reused: a handle value is never handed out twice, so a
//! released handle can never alias a newer object, even when its slot now holds one. Using it
//! is a clear "stale handle" error, not undefined behaviour. The tag catches handles passed to
//! the wrong runtime.

use crate::error::{Error, Result};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A tensor, stream or event handle as the C ABI passes it; 0 is null.
pub type Handle = u64;

static NEXT_TAG: AtomicU64 = AtomicU64::new(1);

const SLOT_BITS: u32 = 24;
const GEN_BITS: u32 = 20;
const SHARD_BITS: u32 = 4;
const SHARDS: usize = 1 << SHARD_BITS;
/// Slots per shard; a shard that is full sends inserts to the next one.
const MAX_SLOTS: usize = 1 << SLOT_BITS;
const MAX_GEN: u32 = (1 << GEN_BITS) - 1;

/// Which shard the calling thread inserts into: threads are spread over the shards in the
/// order they first insert.
fn home_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static HOME: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    HOME.try_with(|h| {
        if h.get() == usize::MAX {
            h.set(NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS);
        }
        h.get()
    })
    .unwrap_or(0)
}

/// One object and its reference count; `value` is `None` while the slot is free or retired.
struct Slot<T> {
    generation: u32,
    refs: u32,
    value: Option<T>,
}

/// One shard: slots, and the free ones to reuse (most recently freed first, so a loop that
/// releases one tensor and makes the next keeps touching the same warm slots).
struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    live: usize,
}

/// A shard on its own cache line, so two threads' shards do not share one.
#[repr(align(64))]
struct Shard<T>(Mutex<Slab<T>>);

/// A table of objects of one kind, keyed by handle, each with a reference count.
pub struct HandleTable<T> {
    kind: &'static str,
    tag: u64,
    shards: Box<[Shard<T>]>,
}

/// A handle's fields.
#[derive(Clone, Copy)]
struct Parts {
    shard: usize,
    generation: u32,
    slot: usize,
}

impl<T: Clone> HandleTable<T> {
    /// A table for objects called `kind` in messages; `tag` identifies the runtime.
    pub fn new(kind: &'static str, tag: u64) -> Self {
        HandleTable {
            kind,
            tag,
            shards: (0..SHARDS)
                .map(|_| {
                    Shard(Mutex::new(Slab {
                        slots: Vec::new(),
                        free: Vec::new(),
                        live: 0,
                    }))
                })
                .collect(),
        }
    }

    /// A fresh tag for a new runtime (16 bits, never 0).
    pub fn new_tag() -> u64 {
        (NEXT_TAG.fetch_add(1, Ordering::Relaxed) % 0xffff) + 1
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Slab<T>> {
        // Slabs are only changed by short, non-panicking code; a poisoned lock is still sound.
        self.shards[shard]
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn handle(&self, p: Parts) -> Handle {
        (self.tag << 48)
            | ((p.shard as u64) << (GEN_BITS + SLOT_BITS))
            | ((p.generation as u64) << SLOT_BITS)
            | p.slot as u64
    }

    fn parts(&self, h: Handle) -> Result<Parts> {
        if h >> 48 != self.tag {
            return Err(self.bad(h));
        }
        Ok(Parts {
            shard: ((h >> (GEN_BITS + SLOT_BITS)) as usize) & (SHARDS - 1),
            generation: ((h >> SLOT_BITS) as u32) & MAX_GEN,
            slot: (h as usize) & (MAX_SLOTS - 1),
        })
    }

    /// Adds `v` with one reference. Fails only when every shard holds its maximum of live
    /// objects (2^28 in all).
    pub fn insert(&self, v: T) -> Result<Handle> {
        let home = home_shard();
        for k in 0..SHARDS {
            let shard = (home + k) % SHARDS;
            let mut s = self.lock(shard);
            let slot = match s.free.pop() {
                Some(i) => i as usize,
                None if s.slots.len() < MAX_SLOTS => {
                    s.slots.push(Slot {
                        generation: 0,
                        refs: 0,
                        value: None,
                    });
                    s.slots.len() - 1
                }
                None => continue,
            };
            s.live += 1;
            let e = &mut s.slots[slot];
            e.refs = 1;
            // Moved once, straight into the slot (a tensor is ~140 bytes).
            e.value = Some(v);
            let generation = e.generation;
            return Ok(self.handle(Parts {
                shard,
                generation,
                slot,
            }));
        }
        Err(Error::OutOfMemory(format!(
            "{} live {} handles, the most a runtime holds; release handles you no longer use",
            SHARDS * MAX_SLOTS,
            self.kind
        )))
    }

    fn bad(&self, h: Handle) -> Error {
        if h == 0 {
            Error::InvalidHandle(format!(
                "null {} handle (0); pass a handle returned by the runtime",
                self.kind
            ))
        } else if h >> 48 != self.tag {
            Error::InvalidHandle(format!(
                "{} handle {h:#x} belongs to another runtime (or is not a handle); use handles from the runtime that created them",
                self.kind
            ))
        } else {
            Error::InvalidHandle(format!(
                "{} handle {h:#x} is stale: it was released (or never existed); do not use a handle after its last release",
                self.kind
            ))
        }
    }

    /// Runs `f` on the live slot `h` names, under its shard's lock.
    #[inline(always)]
    fn with_slot<R>(&self, h: Handle, f: impl FnOnce(&mut Slab<T>, usize) -> R) -> Result<R> {
        let p = self.parts(h)?;
        let mut s = self.lock(p.shard);
        match s.slots.get(p.slot) {
            Some(e) if e.generation == p.generation && e.value.is_some() => Ok(f(&mut s, p.slot)),
            _ => Err(self.bad(h)),
        }
    }

    /// A clone of the object behind `h`. Inlined: returned through calls, a tensor (~140
    /// bytes) was copied once more per call level.
    #[inline(always)]
    pub fn get(&self, h: Handle) -> Result<T> {
        self.with_slot(h, |s, i| s.slots[i].value.clone().expect("checked live"))
    }

    /// `f` applied to the object behind `h`, under its shard's lock: reading a field or two
    /// (a tensor's dtype and sizes, what a front end asks of every op's result) without
    /// cloning the whole object (a tensor's buffer `Arc` and both layouts).
    #[inline(always)]
    pub fn read<R>(&self, h: Handle, f: impl FnOnce(&T) -> R) -> Result<R> {
        self.with_slot(h, |s, i| {
            f(s.slots[i].value.as_ref().expect("checked live"))
        })
    }

    /// Replaces the object behind a live handle.
    pub fn update(&self, h: Handle, f: impl FnOnce(&mut T)) -> Result<()> {
        self.with_slot(h, |s, i| {
            f(s.slots[i].value.as_mut().expect("checked live"))
        })
    }

    /// Adds one reference to the object behind a live handle.
    pub fn retain(&self, h: Handle) -> Result<()> {
        self.with_slot(h, |s, i| {
            let e = &mut s.slots[i];
            e.refs = e
                .refs
                .checked_add(1)
                .ok_or_else(|| Error::InvalidArgument("reference count overflow".into()))?;
            Ok(())
        })?
    }

    /// Drops one reference; the object goes away with the last one (dropped after the lock is
    /// let go: a tensor's buffer may be freed with it).
    pub fn release(&self, h: Handle) -> Result<()> {
        let gone = self.with_slot(h, |s, i| {
            let e = &mut s.slots[i];
            e.refs -= 1;
            if e.refs > 0 {
                return None;
            }
            let v = e.value.take();
            // A slot whose generation would wrap is retired: its handles are never reissued.
            if e.generation < MAX_GEN {
                e.generation += 1;
                s.free.push(i as u32);
            }
            s.live -= 1;
            v
        })?;
        drop(gone);
        Ok(())
    }

    /// Live handles (objects not yet released), over all shards.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|k| self.lock(k).live).sum()
    }

    /// Whether no handle is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Clones of every live object (shards are locked one at a time, so not one snapshot).
    pub fn values(&self) -> Vec<T> {
        let mut out = Vec::new();
        for k in 0..SHARDS {
            let s = self.lock(k);
            out.extend(s.slots.iter().filter_map(|e| e.value.clone()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> HandleTable<u32> {
        HandleTable::new("tensor", HandleTable::<()>::new_tag())
    }

    fn is_stale(r: Result<u32>) -> bool {
        matches!(r, Err(Error::InvalidHandle(m)) if m.contains("is stale"))
    }

    #[test]
    fn a_live_handle_gives_its_object_until_its_last_release() {
        let t = table();
        let h = t.insert(7).unwrap();
        t.retain(h).unwrap();
        t.release(h).unwrap();
        assert_eq!(t.get(h).unwrap(), 7);
        t.release(h).unwrap();
        assert!(is_stale(t.get(h)));
        assert!(t.release(h).is_err(), "a second last release is an error");
        assert!(t.is_empty());
    }

    #[test]
    fn a_stale_handle_whose_slot_was_reused_is_still_rejected() {
        let t = table();
        let old = t.insert(1).unwrap();
        t.release(old).unwrap();
        let new = t.insert(2).unwrap();
        assert_eq!(old & 0xff_ffff, new & 0xff_ffff, "the slot is reused");
        assert_ne!(old, new);
        assert!(is_stale(t.get(old)));
        assert!(t.release(old).is_err());
        assert_eq!(
            t.get(new).unwrap(),
            2,
            "the stale release left the new object alone"
        );
    }

    #[test]
    fn a_slot_whose_generation_would_wrap_is_retired_not_reused() {
        let t = table();
        let h = t.insert(1).unwrap();
        let p = t.parts(h).unwrap();
        t.lock(p.shard).slots[p.slot].generation = MAX_GEN;
        let last = t.handle(Parts {
            generation: MAX_GEN,
            ..p
        });
        t.release(last).unwrap();
        let next = t.insert(2).unwrap();
        assert_ne!(t.parts(next).unwrap().slot, p.slot);
        assert!(is_stale(t.get(h)) && is_stale(t.get(last)));
    }

    #[test]
    fn handles_of_another_table_tag_and_null_are_rejected_by_name() {
        let (a, b) = (table(), table());
        let h = a.insert(1).unwrap();
        let e = b.get(h).unwrap_err().to_string();
        assert!(e.contains("belongs to another runtime"), "{e}");
        let e = a.get(0).unwrap_err().to_string();
        assert!(e.contains("null tensor handle"), "{e}");
    }

    #[test]
    fn handles_inserted_on_many_threads_are_all_distinct_and_live() {
        let t = std::sync::Arc::new(table());
        let all: Vec<Handle> = (0..8)
            .map(|k| {
                let t = t.clone();
                std::thread::spawn(move || {
                    (0..100)
                        .map(|i| t.insert(k * 100 + i).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .flat_map(|j| j.join().unwrap())
            .collect();
        let mut d = all.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 800);
        assert_eq!(t.len(), 800);
        assert_eq!(t.values().len(), 800);
    }
}
