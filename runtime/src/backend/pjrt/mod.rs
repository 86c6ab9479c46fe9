//! The PJRT backend: regions lowered to StableHLO and compiled by a PJRT plugin (XLA on CPU
//! from the `xla-cpu-pjrt` wheel, or libtpu / jax-cuda12-pjrt on hardware).
//!
//! One module per region and bucketed signature (`stage`); XLA fuses inside it. Executables are
//! kept per program and per process in memory (`process`: one client per plugin) and, with `DEFERFUSE_CACHE_DIR`, on disk (`deferfuse_cache::disk_cache`)
//! keyed by the region fingerprint, the signature and the plugin's identity.
//!
//! Values stay on the device between programs (`Program::run`, `resident`): a result that is its
//! buffer's whole value, densely, becomes the buffer's device copy and is not downloaded; a
//! later program whose operand stages exactly that array (same dtype and dims, a dense view of
//! the whole buffer) takes it without an upload, and an input uploaded whole is kept for the
//! next launch. Only a host read (`to_host`, written back once), a result written through a
//! partial view (downloaded and scattered into the host bytes) or an input read through any
//! other view (gathered from the host bytes) copies. Every result's padding is zeroed in the
//! program (`emit`), so a device value is exactly what an upload would stage. Launches run on
//! the stream's worker like the CPU backend's, so they are asynchronous to the host.
//!
//! The binding to the C API is our own (`ffi`, `client`): pjrt-rs 0.2.0 targets C API 0.54,
//! which current plugins reject (shared/notes/pjrt.md).

mod batch;
mod client;
mod compile;
mod emit;
mod ffi;
mod graph;
mod graph_bucket;
mod graph_depthwise;
mod graph_kernel;
mod graph_program;
mod graph_view;
mod hlo;
mod identity;
mod launch_checks;
mod ops;
mod options;
mod process;
mod resident;
mod stage;
mod trig;

pub use client::{Client, Plugin};

use super::{Backend, BackendCounters, DeviceValue, Program};
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use client::{DeviceBuffer, Executable};
use deferfuse_cache::DiskCache;
use deferfuse_fusion::plan::Capabilities;
use deferfuse_fusion::{Binding, Region};
use resident::DeviceArray;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Counters of the PJRT backend (reported in `Stats`).
#[derive(Default)]
pub struct PjrtCounters {
    /// Executables compiled by XLA (one per region and bucketed signature, per whole-program
    /// signature, and per relayout).
    pub compiles: AtomicU64,
    /// Nanoseconds spent in those compiles, and in loading executables from the disk cache.
    pub compile_ns: AtomicU64,
    /// Executables loaded from the disk cache instead.
    pub disk_hits: AtomicU64,
    /// Disk entries that were damaged or failed to load (removed, recompiled).
    pub disk_corrupt: AtomicU64,
    /// Operand arrays uploaded (scalars, sizes and a matmul's unread stand-in not counted).
    pub uploads: AtomicU64,
    /// Arrays downloaded: results written through a partial view, and write-backs.
    pub downloads: AtomicU64,
    /// Operands taken from their buffer's device copy.
    pub resident_hits: AtomicU64,
    /// Bytes of device arrays held as buffers' values now.
    pub resident_bytes: AtomicU64,
}

/// The default bound of `DEFERFUSE_CACHE_DIR` (`DEFERFUSE_CACHE_MAX_BYTES` overrides it).
const DEFAULT_DISK_BYTES: u64 = 1 << 30;

struct Disk {
    cache: DiskCache,
    /// Everything besides the program an executable is valid for (see `identity`).
    salt: String,
}

struct Shared {
    device: Arc<process::Device>,
    client: Arc<Client>,
    identity: String,
    dump_dir: Option<PathBuf>,
    disk: Option<Disk>,
    counters: Arc<PjrtCounters>,
    relayouts: resident::Relayouts,
    /// Launches whose bounds checks no sync point has read yet.
    unread_checks: launch_checks::Unread,
}

fn open_disk(plugin: &Path, client: &Client) -> Result<Option<Disk>> {
    let Some(dir) = std::env::var_os("DEFERFUSE_CACHE_DIR").filter(|d| !d.is_empty()) else {
        return Ok(None);
    };
    let max = match std::env::var("DEFERFUSE_CACHE_MAX_BYTES") {
        Ok(v) => v.parse::<u64>().map_err(|_| {
            Error::Config(format!(
                "DEFERFUSE_CACHE_MAX_BYTES={v:?}: expected a number of bytes"
            ))
        })?,
        Err(_) => DEFAULT_DISK_BYTES,
    };
    let dir = PathBuf::from(dir);
    let cache = DiskCache::open(&dir, max).map_err(|e| {
        Error::Config(format!(
            "DEFERFUSE_CACHE_DIR={}: cannot create the directory: {e}",
            dir.display()
        ))
    })?;
    let so = identity::file_hash(plugin).map_err(|e| {
        Error::Config(format!(
            "PJRT plugin {}: cannot read it: {e}",
            plugin.display()
        ))
    })?;
    // The compile options too: an executable cached before they changed (one with XNNPACK
    // dots, see `options`) must not be loaded.
    let opts = xxhash_rust::xxh3::xxh3_64(client.compile_options());
    let salt = format!(
        "{so:032x}:{}.{}:{}:{}:{}:{opts:016x}",
        client.plugin.version.0,
        client.plugin.version.1,
        client.platform_name,
        client.platform_version,
        identity::cpu_features()
    );
    Ok(Some(Disk { cache, salt }))
}

/// Compiles regions with a PJRT plugin.
pub struct PjrtBackend {
    shared: Arc<Shared>,
    capabilities: Capabilities,
}

/// Whole-program regions unless `DEFERFUSE_PJRT_WHOLE_FLUSH=0` (then the CPU backend's loop
/// regions, one program each), bounded by `DEFERFUSE_PJRT_MAX_REGION_OPS` ops (default 4096),
/// and split at host reads unless `DEFERFUSE_PJRT_SPLIT_READS=0` (a host that has no idle core
/// for the rest to run on may prefer one program per flush: see the README's PJRT section).
fn capabilities_from_env() -> Result<Capabilities> {
    let whole = env_flag("DEFERFUSE_PJRT_WHOLE_FLUSH")?;
    let split = env_flag("DEFERFUSE_PJRT_SPLIT_READS")?;
    let max = match std::env::var("DEFERFUSE_PJRT_MAX_REGION_OPS") {
        Ok(v) => v.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| {
            Error::Config(format!(
                "DEFERFUSE_PJRT_MAX_REGION_OPS={v:?}: expected a positive number of ops"
            ))
        })?,
        Err(_) => DEFAULT_MAX_REGION_OPS,
    };
    if !whole {
        return Ok(Capabilities::LOOPS);
    }
    let caps = Capabilities::whole_programs(max).with_kernels(graph_kernel::LOWERED);
    Ok(if split {
        caps.with_split_at_host_read()
    } else {
        caps
    })
}

/// An on/off setting `name` that is on when unset or empty, else parsed as the mode variables
/// are ([`crate::mode::parse_flag`]: 1, 0, true or false; anything else is a configuration
/// error naming the variable and the value).
fn env_flag(name: &str) -> Result<bool> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => crate::mode::parse_flag(name, Some(&v)),
        _ => Ok(true),
    }
}

/// Ops one whole-program region holds by default: a transformer training step of a few
/// layers fits (compile time grows with the module).
const DEFAULT_MAX_REGION_OPS: usize = 4096;

impl PjrtBackend {
    /// Loads the plugin at `plugin` and creates its client. `dump_dir` receives each compiled
    /// module's MLIR text.
    pub fn new(plugin: &Path, dump_dir: Option<PathBuf>) -> Result<PjrtBackend> {
        if std::env::var_os("TF_CPP_MIN_LOG_LEVEL").is_none() {
            // XLA logs INFO lines on stderr for every client and compile otherwise.
            std::env::set_var("TF_CPP_MIN_LOG_LEVEL", "2");
        }
        let device = process::device(plugin)?;
        let client = device.client.clone();
        let plugin = client.plugin.clone();
        let identity = format!(
            "pjrt:{}:{}:{}.{}",
            client.platform_name, client.platform_version, plugin.version.0, plugin.version.1
        );
        let disk = open_disk(&plugin.path, &client)?;
        let capabilities = capabilities_from_env()?;
        Ok(PjrtBackend {
            capabilities,
            shared: Arc::new(Shared {
                device,
                client,
                identity,
                dump_dir,
                disk,
                counters: Arc::default(),
                relayouts: Default::default(),
                unread_checks: Default::default(),
            }),
        })
    }

    /// The backend's counters.
    pub fn counters(&self) -> &PjrtCounters {
        &self.shared.counters
    }
}

impl Backend for PjrtBackend {
    fn name(&self) -> &'static str {
        "pjrt"
    }

    fn identity(&self) -> &str {
        &self.shared.identity
    }

    fn compile(&self, region: &Region) -> Result<Arc<dyn Program>> {
        if let Region::Kernel(k) = region {
            // Kernel ops outside a whole program (gather, scatter, scans, sort, random
            // numbers, depthwise convolutions) run as host routines on host bytes: the
            // host-program `run` writes device values back first (see README).
            return Ok(super::host_kernels::program(k));
        }
        if let Region::Graph(g) = region {
            return Ok(Arc::new(graph_program::GraphProgram::new(
                g.clone(),
                deferfuse_cache::fingerprint(region, &self.shared.identity),
                self.shared.clone(),
            )));
        }
        Ok(Arc::new(PjrtProgram {
            region: region.clone(),
            fingerprint: deferfuse_cache::fingerprint(region, &self.shared.identity),
            shared: self.shared.clone(),
            executables: Mutex::new(HashMap::new()),
            valid_sizes: Mutex::new(HashMap::new()),
            unread: Mutex::new(None),
        }))
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn compiles_on_first_run(&self) -> bool {
        true
    }

    fn read_device_checks(&self) -> Result<()> {
        self.shared.unread_checks.read_all()
    }

    fn counters(&self) -> BackendCounters {
        let c = &self.shared.counters;
        BackendCounters {
            shape_compiles: c.compiles.load(Ordering::Relaxed),
            shape_compile_ns: c.compile_ns.load(Ordering::Relaxed),
            disk_cache_hits: c.disk_hits.load(Ordering::Relaxed),
            disk_cache_corrupt: c.disk_corrupt.load(Ordering::Relaxed)
                + self
                    .shared
                    .disk
                    .as_ref()
                    .map_or(0, |d| d.cache.stats().corrupt),
            device_uploads: c.uploads.load(Ordering::Relaxed),
            device_downloads: c.downloads.load(Ordering::Relaxed),
            device_resident_hits: c.resident_hits.load(Ordering::Relaxed),
            device_resident_bytes: c.resident_bytes.load(Ordering::Relaxed),
        }
    }
}

/// A region whose executables are compiled per bucketed signature, on first use.
struct PjrtProgram {
    region: Region,
    fingerprint: deferfuse_cache::Fingerprint,
    shared: Arc<Shared>,
    /// This program's executables by bucketed signature (`Signature::key`).
    executables: Mutex<HashMap<Vec<u64>, Arc<Executable>>>,
    /// The valid-sizes argument per space, uploaded once (see `tail_args`).
    valid_sizes: Mutex<HashMap<Vec<usize>, Arc<DeviceBuffer>>>,
    /// A matmul's stand-in for the old output when beta is 0 (by staged dims): the program
    /// never reads it, so a fresh output's host bytes need not be gathered and uploaded.
    unread: Mutex<Option<(Vec<usize>, Arc<DeviceBuffer>)>>,
}

impl PjrtProgram {
    fn executable(&self, sig: &stage::Signature) -> Result<Arc<Executable>> {
        let key = sig.key();
        let mut executables = self.executables.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = executables.get(&key) {
            return Ok(e.clone());
        }
        let exe = compile::executable(
            &self.shared,
            self.fingerprint,
            &key,
            &|| self.region.to_string(),
            || emit::module(&self.region, sig),
        )?;
        executables.insert(key, exe.clone());
        Ok(exe)
    }
}

/// An argument of one launch: uploaded for it, a buffer's device copy, or a cached size array.
enum Arg {
    Owned(DeviceBuffer),
    Resident(Arc<dyn DeviceValue>),
    Cached(Arc<DeviceBuffer>),
}

impl Arg {
    fn buf(&self) -> &DeviceBuffer {
        match self {
            Arg::Owned(b) => b,
            Arg::Cached(b) => b,
            Arg::Resident(v) => {
                &v.as_any()
                    .downcast_ref::<DeviceArray>()
                    .expect("only PJRT device arrays are passed as arguments")
                    .buf
            }
        }
    }
}

/// Size arrays kept per program: enough for the shapes a loop cycles through.
const MAX_CACHED_SIZES: usize = 64;

impl PjrtProgram {
    /// The arguments after the staged operands (see `emit`): the scalar slots, a row kernel's
    /// valid row length, and the valid sizes of the space.
    fn tail_args(&self, binding: &Binding, staging: &stage::Staging) -> Result<Vec<Arg>> {
        let client = &self.shared.client;
        let scalar = |bytes: Vec<u8>, e: hlo::Elem| {
            client
                .upload(&bytes, stage::pjrt_type(e), &[])
                .map(Arg::Owned)
        };
        let mut args = Vec::new();
        match &self.region {
            Region::Loop(l) => {
                for (p, &d) in l.params.iter().enumerate() {
                    args.push(scalar(
                        stage::scalar_bytes(binding.scalars[p], d),
                        hlo::Elem::of(d),
                    )?);
                }
                if !l.reduces.is_empty() {
                    let n = *staging.valid.last().expect("a space has dims") as i64;
                    args.push(scalar(n.to_ne_bytes().to_vec(), hlo::Elem::I64)?);
                }
            }
            Region::Matmul { dtype, epilogue } => {
                let e = hlo::Elem::of(*dtype);
                for s in &binding.scalars[..2] {
                    args.push(scalar(stage::gemm_scalar_bytes(*s, *dtype), e)?);
                }
                if let Some(l) = epilogue {
                    for (p, &d) in l.params.iter().enumerate() {
                        let bits = binding.scalars[2 + p];
                        args.push(scalar(stage::scalar_bytes(bits, d), hlo::Elem::of(d))?);
                    }
                }
            }
            Region::Kernel(_) => {
                unreachable!("kernel regions run as host programs (see PjrtBackend::compile)")
            }
            Region::Graph(_) => unreachable!("graphs run as a GraphProgram"),
            Region::Arange { dtype } => {
                let elem = if Region::arange_in_integers(*dtype) {
                    hlo::Elem::I64
                } else {
                    hlo::Elem::F64
                };
                for s in &binding.scalars[..2] {
                    args.push(scalar(s.to_ne_bytes().to_vec(), elem)?);
                }
            }
        }
        let mut sizes = self.valid_sizes.lock().unwrap_or_else(|p| p.into_inner());
        let b = match sizes.get(&staging.valid) {
            Some(b) => b.clone(),
            None => {
                let bytes: Vec<u8> = staging
                    .valid
                    .iter()
                    .flat_map(|&n| (n as i64).to_ne_bytes())
                    .collect();
                let dims = [staging.valid.len() as i64];
                let b = Arc::new(client.upload(&bytes, stage::pjrt_type(hlo::Elem::I64), &dims)?);
                if sizes.len() >= MAX_CACHED_SIZES {
                    sizes.clear();
                }
                sizes.insert(staging.valid.clone(), b.clone());
                b
            }
        };
        args.push(Arg::Cached(b));
        Ok(args)
    }

    /// Whether input `j` is a matmul's old output that the program ignores (beta is 0).
    fn ignores_input(&self, binding: &Binding, j: usize) -> bool {
        matches!(self.region, Region::Matmul { .. })
            && j == binding.n_inputs
            && f64::from_bits(binding.scalars[1]) == 0.0
    }

    /// An array of operand `j`'s staged shape whose values do not matter (zeros), kept for the
    /// next launch of the same shape.
    fn unread_arg(&self, staging: &stage::Staging, binding: &Binding, j: usize) -> Result<Arg> {
        let dims = staging.sig.operands[j].staged_dims(&staging.sig);
        let mut slot = self.unread.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((d, b)) = slot.as_ref() {
            if *d == dims {
                return Ok(Arg::Cached(b.clone()));
            }
        }
        let t = &binding.operands[j];
        let zeros = vec![0u8; stage::staged_len(staging, j, t.dtype)];
        let shape: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let ty = stage::pjrt_type(hlo::Elem::of(t.dtype));
        let b = Arc::new(self.shared.client.upload(&zeros, ty, &shape)?);
        *slot = Some((dims, b.clone()));
        Ok(Arg::Cached(b))
    }

    /// Runs `exe` on `args`; one result per output of `staging`.
    fn execute(
        exe: &Executable,
        args: &[Arg],
        staging: &stage::Staging,
    ) -> Result<Vec<DeviceBuffer>> {
        let arg_refs: Vec<&DeviceBuffer> = args.iter().map(Arg::buf).collect();
        let outs = exe.execute(&arg_refs)?;
        if outs.len() != staging.outputs.len() {
            return Err(Error::Internal(format!(
                "PJRT program returned {} results for {} outputs",
                outs.len(),
                staging.outputs.len()
            )));
        }
        Ok(outs)
    }

    /// Downloads result `out` of operand `j` and stores its valid part into the view at `base`.
    ///
    /// # Safety
    /// `base` holds the operand's whole view and no one else accesses it meanwhile.
    unsafe fn download_operand(
        &self,
        staging: &stage::Staging,
        binding: &Binding,
        j: usize,
        out: &DeviceBuffer,
        base: *mut u8,
    ) -> Result<()> {
        let t = &binding.operands[j];
        let mut host = vec![0u8; stage::staged_len(staging, j, t.dtype)];
        out.download(&mut host)?;
        self.shared
            .counters
            .downloads
            .fetch_add(1, Ordering::Relaxed);
        stage::scatter(staging, j, t.dtype, base, t.layout.offset as isize, &host);
        Ok(())
    }
}

impl Program for PjrtProgram {
    /// Keeps values on the device. An input whose buffer has a device copy of exactly the
    /// array this program stages (`stage::dense_key`) is passed as is; any other input is
    /// gathered from the host bytes (written back first if the device holds a newer value)
    /// and uploaded, and when it is its buffer's whole value the upload is kept as the
    /// buffer's (clean) device copy. A result that is its buffer's whole value becomes the
    /// buffer's device copy, the host bytes stale until something reads them; a result
    /// written through a partial view is downloaded into the host bytes as before.
    unsafe fn run(&self, binding: &Binding, bufs: &[Arc<Buffer>]) -> Result<()> {
        let staging = stage::bucketed(&self.region, binding);
        if staging.empty {
            return Ok(());
        }
        let exe = self.executable(&staging.sig)?;
        let counters = &self.shared.counters;
        let key = |j: usize| {
            let t = &binding.operands[j];
            stage::dense_key(&staging, j, t.dtype, t.layout.offset, bufs[j].len)
        };
        let mut args = Vec::new();
        for &j in &staging.inputs {
            if self.ignores_input(binding, j) {
                args.push(self.unread_arg(&staging, binding, j)?);
                continue;
            }
            let t = &binding.operands[j];
            args.push(resident::input_arg(
                &self.shared,
                &staging,
                j,
                t.dtype,
                t.layout.offset,
                &bufs[j],
            )?);
        }
        args.extend(self.tail_args(binding, &staging)?);
        let outs = Self::execute(&exe, &args, &staging)?;
        drop(args);
        for (out, &j) in outs.into_iter().zip(&staging.outputs) {
            let b = &bufs[j];
            match key(j) {
                Some(k) => {
                    b.set_device_copy(Arc::new(DeviceArray::new(out, k, counters.clone())), true)
                }
                None => {
                    // Only part of the buffer is written: the rest must be current on the host.
                    b.host_coherent()?;
                    self.download_operand(&staging, binding, j, &out, b.storage()?.ptr())?;
                    b.host_written();
                }
            }
        }
        Ok(())
    }

    fn listing(&self) -> String {
        format!(
            "StableHLO modules are written per bucketed signature as {}-<signature>.mlir",
            self.fingerprint
        )
    }
}
