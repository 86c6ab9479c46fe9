//! The PJRT backend: regions lowered to StableHLO and compiled by a PJRT plugin (XLA on CPU
//! from the `xla-cpu-pjrt` wheel, or libtpu / jax-cuda12-pjrt on hardware).
//!
//! One module per region and bucketed signature (`stage`); XLA fuses inside it. Executables are
//! kept per program and per process in memory (`process`: one client per plugin) and, with `DEFERFUSE_CACHE_DIR`, on disk (`deferfuse_cache::disk`)
//! keyed by the region fingerprint, the signature and the plugin's identity.
//!
//! Execution is host-staged: each launch copies its operands' views into dense arrays, uploads
//! them, runs, and copies the results back into the runtime's host buffers, on the stream's
//! worker like the CPU backend. Buffers do not yet stay on the device between regions.
//!
//! The binding to the C API is our own (`ffi`, `client`): pjrt-rs 0.2.0 targets C API 0.54,
//! which current plugins reject (shared/notes/pjrt.md).

mod client;
mod ffi;
mod hlo;
mod identity;
mod lower;
mod ops;
mod process;
mod stage;

pub use client::{Client, Plugin};

use super::{Backend, BackendCounters, Program};
use crate::error::{Error, Result};
use client::Executable;
use deferfuse_cache::DiskCache;
use deferfuse_fusion::{Binding, Region};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Counters of the PJRT backend (reported in `Stats`).
#[derive(Default)]
pub struct PjrtCounters {
    /// Executables compiled by XLA (one per region and bucketed signature).
    pub compiles: AtomicU64,
    /// Executables loaded from the disk cache instead.
    pub disk_hits: AtomicU64,
    /// Disk entries that were damaged or failed to load (removed, recompiled).
    pub disk_corrupt: AtomicU64,
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
    counters: PjrtCounters,
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
    let salt = format!(
        "{so:032x}:{}.{}:{}:{}:{}",
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
}

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
        Ok(PjrtBackend {
            shared: Arc::new(Shared {
                device,
                client,
                identity,
                dump_dir,
                disk,
                counters: PjrtCounters::default(),
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
        Ok(Arc::new(PjrtProgram {
            region: region.clone(),
            fingerprint: deferfuse_cache::fingerprint(region, &self.shared.identity),
            shared: self.shared.clone(),
            exes: Mutex::new(HashMap::new()),
        }))
    }

    fn counters(&self) -> BackendCounters {
        let c = &self.shared.counters;
        BackendCounters {
            shape_compiles: c.compiles.load(Ordering::Relaxed),
            disk_cache_hits: c.disk_hits.load(Ordering::Relaxed),
            disk_cache_corrupt: c.disk_corrupt.load(Ordering::Relaxed)
                + self
                    .shared
                    .disk
                    .as_ref()
                    .map_or(0, |d| d.cache.stats().corrupt),
        }
    }
}

/// A region whose executables are compiled per bucketed signature, on first use.
struct PjrtProgram {
    region: Region,
    fingerprint: deferfuse_cache::Fingerprint,
    shared: Arc<Shared>,
    exes: Mutex<HashMap<Vec<u64>, Arc<Executable>>>,
}

impl PjrtProgram {
    fn executable(&self, sig: &stage::Signature) -> Result<Arc<Executable>> {
        let key = sig.key();
        let mut exes = self.exes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = exes.get(&key) {
            return Ok(e.clone());
        }
        if let Some(e) = self.shared.device.get(self.fingerprint.0, &key) {
            exes.insert(key, e.clone());
            return Ok(e);
        }
        let key_bytes: Vec<u8> = key.iter().flat_map(|k| k.to_le_bytes()).collect();
        let disk_key = self.shared.disk.as_ref().map(|d| {
            let mut b = b"deferfuse-pjrt-executable\0".to_vec();
            b.extend_from_slice(&self.fingerprint.0.to_le_bytes());
            b.extend_from_slice(&key_bytes);
            b.extend_from_slice(d.salt.as_bytes());
            xxhash_rust::xxh3::xxh3_128(&b)
        });
        if let (Some(d), Some(k)) = (&self.shared.disk, disk_key) {
            if let Some(bytes) = d.cache.get(k) {
                match self.shared.client.deserialize(&bytes) {
                    Ok(exe) => {
                        self.shared
                            .counters
                            .disk_hits
                            .fetch_add(1, Ordering::Relaxed);
                        let exe = Arc::new(exe);
                        self.shared
                            .device
                            .insert(self.fingerprint.0, key.clone(), exe.clone());
                        exes.insert(key, exe.clone());
                        return Ok(exe);
                    }
                    Err(e) => {
                        tracing::warn!(
                            path = %d.cache.path(k).display(),
                            "disk cache entry does not load ({e}); removing it and recompiling"
                        );
                        let _ = std::fs::remove_file(d.cache.path(k));
                        self.shared
                            .counters
                            .disk_corrupt
                            .fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        let mlir = lower::module(&self.region, sig);
        if let Some(dir) = &self.shared.dump_dir {
            let sig_hash = xxhash_rust::xxh3::xxh3_64(&key_bytes);
            let _ = std::fs::create_dir_all(dir);
            let _ = std::fs::write(
                dir.join(format!("{}-{sig_hash:016x}.mlir", self.fingerprint)),
                &mlir,
            );
        }
        let exe = self.shared.client.compile(&mlir).map_err(|e| {
            Error::Backend(format!(
                "{e}\nwhile compiling region {}\n{mlir}",
                self.region
            ))
        })?;
        self.shared
            .counters
            .compiles
            .fetch_add(1, Ordering::Relaxed);
        if let (Some(d), Some(k)) = (&self.shared.disk, disk_key) {
            // A cache that cannot be written only costs a recompile next time.
            match exe.serialize() {
                Ok(bytes) => {
                    if let Err(e) = d.cache.put(k, &bytes) {
                        tracing::warn!(dir = %d.cache.dir().display(), "disk cache write failed: {e}");
                    }
                }
                Err(e) => tracing::warn!("PJRT executable cannot be serialized: {e}"),
            }
        }
        let exe = Arc::new(exe);
        self.shared
            .device
            .insert(self.fingerprint.0, key.clone(), exe.clone());
        exes.insert(key, exe.clone());
        Ok(exe)
    }
}

impl Program for PjrtProgram {
    unsafe fn run(&self, binding: &Binding, bases: &[*mut u8]) -> Result<()> {
        let plan = stage::plan(&self.region, binding);
        if plan.empty {
            return Ok(());
        }
        let exe = self.executable(&plan.sig)?;
        let client = &self.shared.client;
        let ops = &binding.operands;
        let mut args = Vec::new();
        for &j in &plan.inputs {
            let t = &ops[j];
            let data = stage::gather(&plan, j, t.dtype, bases[j], t.layout.offset as isize);
            let dims: Vec<i64> = plan.sig.operands[j]
                .staged_dims(&plan.sig)
                .iter()
                .map(|&d| d as i64)
                .collect();
            let ty = stage::pjrt_type(hlo::Elem::of(t.dtype));
            args.push(client.upload(&data, ty, &dims)?);
        }
        let scalar = |bytes: Vec<u8>, e: hlo::Elem| client.upload(&bytes, stage::pjrt_type(e), &[]);
        match &self.region {
            Region::Loop(l) => {
                for (p, &d) in l.params.iter().enumerate() {
                    args.push(scalar(
                        stage::scalar_bytes(binding.scalars[p], d),
                        hlo::Elem::of(d),
                    )?);
                }
                if !l.reduces.is_empty() {
                    let n = *plan.valid.last().expect("a space has dims") as i64;
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
            Region::Arange { .. } => {
                for s in &binding.scalars[..2] {
                    args.push(scalar(s.to_ne_bytes().to_vec(), hlo::Elem::F64)?);
                }
            }
        }
        let arg_refs: Vec<&client::DeviceBuffer> = args.iter().collect();
        let outs = exe.execute(&arg_refs)?;
        if outs.len() != plan.outputs.len() {
            return Err(Error::Internal(format!(
                "PJRT program returned {} results for {} outputs",
                outs.len(),
                plan.outputs.len()
            )));
        }
        for (buf, &j) in outs.iter().zip(&plan.outputs) {
            let t = &ops[j];
            let mut host = vec![0u8; stage::staged_len(&plan, j, t.dtype)];
            buf.download(&mut host)?;
            stage::scatter(&plan, j, t.dtype, bases[j], t.layout.offset as isize, &host);
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
