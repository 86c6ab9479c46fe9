//! Runtime pointers: creation, destruction, and the registry that makes a destroyed or bogus
//! `DfuseRuntime*` an `INVALID_HANDLE` error instead of undefined behaviour. Also the calls that
//! act on a runtime as a whole: configuration, modes and stats.
//!
//! A `DfuseRuntime*` is an opaque token, never dereferenced: the registry maps it to an
//! `Arc<Runtime>`. Tokens come from a counter and are never reused, so a destroyed pointer can
//! never alias a newer runtime. A call clones the `Arc` and drops the registry lock before doing
//! any work, so a call in flight keeps its runtime alive while another thread destroys it; the
//! runtime is dropped (after running its pending work) when the last such call returns.
//!
//! Every call looks its runtime up, so each thread also remembers the last runtime it used (a
//! weak reference and the registry's epoch): while no runtime has been destroyed since, the
//! lookup takes no lock. Destroying any runtime bumps the epoch first, so a remembered runtime
//! is never handed out after its destroy began.

use crate::error::{check_ptr, guard, invalid, read_in, write_out, DfuseStatus, Result};
use crate::types::{
    mode_from, DfuseBackend, DfuseStats, DFUSE_BACKEND_FROM_ENV, DFUSE_CUT_REASON_COUNT,
    DFUSE_MODE_FROM_ENV, DFUSE_SYNC_REASON_COUNT,
};
use deferfuse_runtime::stats::CutReason;
use deferfuse_runtime::{BackendKind, Config, Error, Runtime, SyncReason};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// An opaque deferfuse runtime. Create one with `dfuse_runtime_create`, pass it to every call,
/// destroy it with `dfuse_runtime_destroy`. It is safe to use from several threads at once.
pub struct DfuseRuntime {
    _opaque: [u8; 0],
}

/// How a runtime is set up (`dfuse_runtime_create`). Start from `dfuse_config_default`, which
/// fills in the defaults, and change the fields you need.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DfuseConfig {
    /// A `DfuseMode`, or `DFUSE_MODE_FROM_ENV` to read `TORCH_TPU_DEFER_AND_FUSE` and
    /// `TORCH_TPU_LAUNCH_BLOCKING`.
    pub mode: u32,
    /// Deferred ops a stream may hold before it runs them by itself (bounds trace memory);
    /// 0 means the default.
    pub max_pending_ops: u64,
    /// Compiled programs kept in memory (least recently used are dropped beyond this);
    /// 0 means the default.
    pub cache_capacity: u64,
    /// Bytes of new buffers deferred ops may create before the stream runs them (bounds
    /// memory held by deferred values); 0 means the default.
    pub max_pending_bytes: u64,
    /// Most ops the planner fuses into one loop region; 0 means the default.
    pub max_ops_per_region: u64,
    /// Bytes of freed host blocks kept for reuse; 0 means the default (1 GiB).
    pub host_cache_bytes: u64,
    /// A `DfuseBackend`, or `DFUSE_BACKEND_FROM_ENV` (the default) to read `DEFERFUSE_BACKEND`.
    pub backend: u32,
    /// Threads one program may split its loops over; 0 reads `DEFERFUSE_NUM_THREADS`, and
    /// without it uses every core.
    pub num_threads: u64,
    /// Path of the PJRT plugin (.so) for the pjrt backend, NUL-terminated; NULL reads
    /// `DEFERFUSE_PJRT_PLUGIN`.
    pub pjrt_plugin: *const std::ffi::c_char,
}

/// Live runtimes by token.
static REGISTRY: Mutex<BTreeMap<usize, Arc<Runtime>>> = Mutex::new(BTreeMap::new());
/// The next token's serial; tokens are never reused.
static NEXT_SERIAL: AtomicUsize = AtomicUsize::new(1);
/// High bits of every token: an address no allocation has, so a caller that dereferences a
/// runtime pointer by mistake faults at once, and a stray pointer is never mistaken for one.
const TOKEN_BASE: usize = if usize::BITS >= 64 {
    0xDF5E_0000_0000_0000_u64 as usize
} else {
    0xDF00_0000
};

/// Bumped by every destroy (before the runtime leaves the registry): a thread's remembered
/// runtime is used only while the epoch it was remembered in is current.
static EPOCH: AtomicU64 = AtomicU64::new(0);

/// A thread's last looked-up runtime: (token, epoch, the runtime).
type Remembered = Option<(usize, u64, Weak<Runtime>)>;

thread_local! {
    static LAST: RefCell<Remembered> = const { RefCell::new(None) };
}

fn registry() -> MutexGuard<'static, BTreeMap<usize, Arc<Runtime>>> {
    // The map is only inserted into and removed from; a panic elsewhere cannot corrupt it.
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn not_live(rt: *const DfuseRuntime) -> Error {
    Error::InvalidHandle(format!(
        "runtime pointer {rt:p} is not live: it was destroyed or never created; pass a pointer \
         from dfuse_runtime_create that has not been destroyed"
    ))
}

/// The runtime behind `rt`, kept alive for as long as the caller holds the `Arc`.
pub(crate) fn runtime(rt: *const DfuseRuntime) -> Result<Arc<Runtime>> {
    if rt.is_null() {
        return Err(invalid(
            "rt is NULL; pass the pointer dfuse_runtime_create returned",
        ));
    }
    let token = rt.addr();
    // Read before the upgrade: a destroy that bumps the epoch after this load is ordered after
    // this call, as if the call had cloned the runtime from the registry just before it.
    let epoch = EPOCH.load(Ordering::SeqCst);
    let hit = LAST
        .try_with(|l| match &*l.borrow() {
            Some((t, e, w)) if *t == token && *e == epoch => w.upgrade(),
            _ => None,
        })
        .ok()
        .flatten();
    if let Some(r) = hit {
        return Ok(r);
    }
    let r = registry()
        .get(&token)
        .cloned()
        .ok_or_else(|| not_live(rt))?;
    // A thread being torn down has no slot left; it just takes the slow path every time.
    let _ = LAST.try_with(|l| *l.borrow_mut() = Some((token, epoch, Arc::downgrade(&r))));
    Ok(r)
}

/// The runtime config a C config describes.
pub(crate) fn config_from(c: &DfuseConfig) -> Result<Config> {
    let d = Config::default();
    let mode = match c.mode {
        DFUSE_MODE_FROM_ENV => None,
        m => Some(mode_from(m, "cfg->mode").map_err(|e| Error::Config(e.to_string()))?),
    };
    let backend = match c.backend {
        DFUSE_BACKEND_FROM_ENV => None,
        b if b == DfuseBackend::Cpu as u32 => Some(BackendKind::Cpu),
        b if b == DfuseBackend::Pjrt as u32 => Some(BackendKind::Pjrt),
        b => {
            return Err(Error::Config(format!(
                "cfg->backend = {b}: expected DFUSE_BACKEND_CPU (0), DFUSE_BACKEND_PJRT (1) or \
                 DFUSE_BACKEND_FROM_ENV"
            )))
        }
    };
    let pjrt_plugin = if c.pjrt_plugin.is_null() {
        None
    } else {
        // SAFETY: the caller's contract for `DfuseConfig.pjrt_plugin` (a C string).
        let s = unsafe { std::ffi::CStr::from_ptr(c.pjrt_plugin) };
        let s = s.to_str().map_err(|_| {
            Error::Config("cfg->pjrt_plugin is not valid UTF-8; pass the path as UTF-8".into())
        })?;
        Some(std::path::PathBuf::from(s))
    };
    let count = |v: u64, default: usize, name: &str| -> Result<usize> {
        match v {
            0 => Ok(default),
            v => usize::try_from(v)
                .map_err(|_| Error::Config(format!("{name} = {v} does not fit in size_t"))),
        }
    };
    Ok(Config {
        mode,
        max_pending_ops: count(c.max_pending_ops, d.max_pending_ops, "cfg->max_pending_ops")?,
        cache_capacity: count(c.cache_capacity, d.cache_capacity, "cfg->cache_capacity")?,
        max_pending_bytes: count(
            c.max_pending_bytes,
            d.max_pending_bytes,
            "cfg->max_pending_bytes",
        )?,
        max_ops_per_region: count(
            c.max_ops_per_region,
            d.max_ops_per_region,
            "cfg->max_ops_per_region",
        )?,
        host_cache_bytes: count(
            c.host_cache_bytes,
            d.host_cache_bytes,
            "cfg->host_cache_bytes",
        )?,
        backend,
        num_threads: count(c.num_threads, 0, "cfg->num_threads")?,
        pjrt_plugin,
        // The memory cap comes from DEFERFUSE_MEMORY_LIMIT (dfuse_memory_limit_set changes it
        // at run time), the timeline from DEFERFUSE_TRACE or dfuse_trace_start.
        ..d
    })
}

/// Fills `*out` with the default config: mode from the environment, the default limits, the
/// CPU backend.
///
/// # Safety
/// `out` must be NULL or point to writable memory for a `DfuseConfig`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_config_default(out: *mut DfuseConfig) -> DfuseStatus {
    guard("dfuse_config_default", || {
        let d = Config::default();
        let c = DfuseConfig {
            mode: DFUSE_MODE_FROM_ENV,
            max_pending_ops: d.max_pending_ops as u64,
            cache_capacity: d.cache_capacity as u64,
            max_pending_bytes: d.max_pending_bytes as u64,
            max_ops_per_region: d.max_ops_per_region as u64,
            host_cache_bytes: d.host_cache_bytes as u64,
            backend: DFUSE_BACKEND_FROM_ENV,
            num_threads: 0,
            pjrt_plugin: std::ptr::null(),
        };
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", c) }
    })
}

/// Creates a runtime and writes its pointer to `*out` (NULL on failure). `cfg` may be NULL for
/// the defaults. Fails with `DFUSE_STATUS_CONFIG` on a bad config or environment variable.
///
/// # Safety
/// `cfg` must be NULL or point to a `DfuseConfig`; `out` must be NULL or point to writable
/// memory for a pointer.
#[no_mangle]
pub unsafe extern "C" fn dfuse_runtime_create(
    cfg: *const DfuseConfig,
    out: *mut *mut DfuseRuntime,
) -> DfuseStatus {
    guard("dfuse_runtime_create", || {
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", std::ptr::null_mut())? };
        let config = if cfg.is_null() {
            Config::default()
        } else {
            // SAFETY: the caller's contract.
            config_from(unsafe { read_in(cfg, "cfg")? })?
        };
        let rt = Arc::new(Runtime::new(config)?);
        let token = TOKEN_BASE | (NEXT_SERIAL.fetch_add(1, Ordering::Relaxed) << 4);
        registry().insert(token, rt);
        // SAFETY: checked writable above.
        unsafe { out.write(std::ptr::without_provenance_mut(token)) };
        Ok(())
    })
}

/// Destroys a runtime: runs its pending work, then frees it and every tensor, stream and event
/// it owns. The pointer is dead afterwards (any use is `DFUSE_STATUS_INVALID_HANDLE`). Calls
/// already running on other threads finish first. Returns the first error the pending work
/// reported, if any; the runtime is destroyed either way.
///
/// # Safety
/// Always safe to call; `rt` is only compared against live runtimes, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn dfuse_runtime_destroy(rt: *mut DfuseRuntime) -> DfuseStatus {
    guard("dfuse_runtime_destroy", || {
        if rt.is_null() {
            return Err(invalid(
                "rt is NULL; pass the pointer dfuse_runtime_create returned",
            ));
        }
        let arc = {
            let mut reg = registry();
            if !reg.contains_key(&rt.addr()) {
                return Err(not_live(rt));
            }
            // Before the removal: no thread may take its remembered runtime from here on.
            EPOCH.fetch_add(1, Ordering::SeqCst);
            reg.remove(&rt.addr()).expect("checked above")
        };
        // Run pending work now so its errors can be reported; Drop (here, or when the last call
        // in flight returns) would run it too but has to ignore them.
        let r = arc.synchronize_all();
        drop(arc);
        r
    })
}

/// Writes the calling thread's mode on `rt` (a `DfuseMode`) to `*out`: the last one it set or
/// pushed on `rt`, else the runtime's default mode. Each runtime keeps its own modes.
///
/// # Safety
/// `out` must be NULL or point to a writable `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_mode_get(rt: *const DfuseRuntime, out: *mut u32) -> DfuseStatus {
    guard("dfuse_mode_get", || {
        let rt = runtime(rt)?;
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", rt.mode() as u32) }
    })
}

/// Sets the calling thread's mode on `rt` (replacing the top of its mode stack there; other
/// runtimes keep theirs). Pending deferred ops
/// run when the next non-deferred op is issued.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_mode_set(rt: *const DfuseRuntime, mode: u32) -> DfuseStatus {
    guard("dfuse_mode_set", || {
        runtime(rt)?.set_mode(mode_from(mode, "mode")?);
        Ok(())
    })
}

/// Sets the deferred ops after which a stream starts running them on its worker while the
/// host records on (defer mode's pipelining; 0 turns it off) and writes the previous value to
/// `previous`. `DEFERFUSE_PIPELINE_OPS` sets it at creation (default 48). The held ops go to the
/// worker at the next matmul or kernel op, or once 8 times as many are held.
///
/// # Safety
/// `previous` must be NULL or point to a writable `uint64_t`; NULL is an error that changes
/// nothing.
#[no_mangle]
pub unsafe extern "C" fn dfuse_pipeline_ops_set(
    rt: *const DfuseRuntime,
    ops: u64,
    previous: *mut u64,
) -> DfuseStatus {
    guard("dfuse_pipeline_ops_set", || {
        let rt = runtime(rt)?;
        let ops = usize::try_from(ops).map_err(|_| {
            invalid(format!(
                "ops = {ops} does not fit this machine's usize; expected a count of ops"
            ))
        })?;
        // Checked before the change, so a bad pointer changes nothing.
        check_ptr(
            previous,
            "previous",
            "a pointer to writable memory for the result",
        )?;
        let old = rt.set_pipeline_ops(ops) as u64;
        // SAFETY: the caller's contract.
        unsafe { write_out(previous, "previous", old) }
    })
}

/// Pushes a mode on the calling thread's mode stack on `rt` (for a scoped mode switch); undo it with
/// `dfuse_mode_pop`.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_mode_push(rt: *const DfuseRuntime, mode: u32) -> DfuseStatus {
    guard("dfuse_mode_push", || {
        runtime(rt)?.push_mode(mode_from(mode, "mode")?);
        Ok(())
    })
}

/// Pops the calling thread's mode stack on `rt`, restoring the mode before the matching push.
/// `DFUSE_STATUS_INVALID_ARGUMENT` when nothing was pushed on this thread.
///
/// # Safety
/// Always safe to call; `rt` is checked against live runtimes.
#[no_mangle]
pub unsafe extern "C" fn dfuse_mode_pop(rt: *const DfuseRuntime) -> DfuseStatus {
    guard("dfuse_mode_pop", || {
        runtime(rt)?.pop_mode()?;
        Ok(())
    })
}

/// Returns the runtime's cached free host blocks to the system (live tensors keep their
/// memory) and writes the bytes freed to `*freed`, like `torch.cuda.empty_cache()`.
///
/// # Safety
/// `freed` must be NULL or point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_release_cached_memory(
    rt: *const DfuseRuntime,
    freed: *mut u64,
) -> DfuseStatus {
    guard("dfuse_release_cached_memory", || {
        // The out-pointer is checked before anything is released: a call that fails has no
        // effect.
        // SAFETY: the caller's contract.
        unsafe { write_out(freed, "freed", 0) }?;
        let rt = runtime(rt)?;
        let n = rt.release_cached_memory();
        // SAFETY: the caller's contract.
        unsafe { write_out(freed, "freed", n) }
    })
}

/// Writes a snapshot of the runtime's counters to `*out`.
///
/// # Safety
/// `out` must be NULL or point to writable memory for a `DfuseStats`.
#[no_mangle]
pub unsafe extern "C" fn dfuse_stats(rt: *const DfuseRuntime, out: *mut DfuseStats) -> DfuseStatus {
    guard("dfuse_stats", || {
        let s = runtime(rt)?.stats();
        const _: () = assert!(SyncReason::COUNT == DFUSE_SYNC_REASON_COUNT);
        const _: () = assert!(CutReason::COUNT == DFUSE_CUT_REASON_COUNT);
        let stats = DfuseStats {
            ops_recorded: s.ops_recorded,
            programs_compiled: s.programs_compiled,
            programs_run: s.programs_run,
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            cache_evictions: s.cache_evictions,
            compile_ns: s.compile_ns,
            bytes_allocated: s.bytes_allocated,
            dead_nodes: s.dead_nodes,
            unmaterialized: s.unmaterialized,
            plans_reused: s.plans_reused,
            host_cache_hits: s.host_cache_hits,
            host_cache_misses: s.host_cache_misses,
            host_cached_bytes: s.host_cached_bytes,
            pipelined_flushes: s.pipelined_flushes,
            cuts: s.cuts,
            sync_points: s.sync_points,
        };
        // SAFETY: the caller's contract.
        unsafe { write_out(out, "out", stats) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use deferfuse_runtime::Mode;

    fn cfg(mode: u32, backend: u32) -> DfuseConfig {
        DfuseConfig {
            mode,
            max_pending_ops: 0,
            cache_capacity: 7,
            max_pending_bytes: 0,
            max_ops_per_region: 0,
            host_cache_bytes: 0,
            num_threads: 0,
            backend,
            pjrt_plugin: std::ptr::null(),
        }
    }

    #[test]
    fn config_converts_and_validates() {
        let c = config_from(&cfg(2, 0)).unwrap();
        assert_eq!(c.mode, Some(Mode::Defer));
        assert_eq!(c.max_pending_ops, Config::default().max_pending_ops);
        assert_eq!(c.cache_capacity, 7);
        assert_eq!(
            config_from(&cfg(DFUSE_MODE_FROM_ENV, 0)).unwrap().mode,
            None
        );
        assert_eq!(
            config_from(&cfg(0, 1)).unwrap().backend,
            Some(BackendKind::Pjrt)
        );
        assert_eq!(
            config_from(&cfg(0, DFUSE_BACKEND_FROM_ENV))
                .unwrap()
                .backend,
            None
        );
        let e = config_from(&cfg(0, 7)).unwrap_err();
        assert!(e.to_string().contains("expected DFUSE_BACKEND_CPU"), "{e}");
        assert_eq!(e.status(), deferfuse_runtime::Status::Config);
        let e = config_from(&cfg(9, 0)).unwrap_err();
        assert_eq!(e.status(), deferfuse_runtime::Status::Config);
    }

    #[test]
    fn tokens_are_never_null_and_not_live_until_created() {
        let p = std::ptr::without_provenance::<DfuseRuntime>(TOKEN_BASE | (1 << 40));
        let e = runtime(p).expect_err("a token that was never created is not live");
        assert!(e.to_string().contains("is not live"), "{e}");
        assert!(runtime(std::ptr::null()).is_err());
    }
}
