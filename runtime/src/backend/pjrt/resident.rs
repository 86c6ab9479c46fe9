//! Values that stay on the device: a program's result kept as its buffer's value, or an
//! uploaded input kept for the next launch (see `buffer`'s module doc for the coherence rule).

use super::client::{DeviceBuffer, Executable};
use super::stage::{self, DenseKey};
use super::{emit, hlo, Arg, PjrtCounters, Shared};
use crate::backend::DeviceValue;
use crate::buffer::Buffer;
use crate::error::{Error, Result};
use deferfuse_cache::Fingerprint;
use deferfuse_fusion::ir::DType;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Relayout executables kept per backend; past this, a value in another layout goes through
/// the host instead of compiling (a loop over ever new sizes would compile one per size).
const MAX_RELAYOUTS: usize = 64;

/// Compiled relayouts by (from, to) layout.
pub type Relayouts = Mutex<HashMap<(DenseKey, DenseKey), Arc<Executable>>>;

/// The relayout from `from` to `to` with as many outermost rows of each as both padded arrays
/// hold (the same element count on both sides): one relayout that serves every outermost
/// valid size up to that, or `None` when the valid elements do not fit it.
fn all_rows(from: &DenseKey, to: &DenseKey) -> Option<(DenseKey, DenseKey)> {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let inner = |k: &DenseKey| k.valid.iter().skip(1).product::<usize>().max(1);
    let (fi, ti) = (inner(from), inner(to));
    let cap = (from.padded.first()? * fi).min(to.padded.first()? * ti);
    let lcm = fi / gcd(fi, ti) * ti;
    let m = cap / lcm * lcm;
    if m < from.valid.iter().product::<usize>() {
        return None;
    }
    let rows = |k: &DenseKey, inner: usize| {
        let mut k = k.clone();
        k.valid[0] = m / inner;
        k
    };
    Some((rows(from, fi), rows(to, ti)))
}

/// `from` restaged as `to` on the device (see `emit::relayout`), or `None` when the two are
/// not the same value (dtype or element count differ) or the relayout cache is full.
///
/// The relayout moves whole outermost rows (see [`all_rows`]: e.g. `[n, 784]` padded to
/// `[64, 1024]` into a flat `[784 n]` padded to `[784 * 64]`, all 64 rows), so one serves every
/// `n`: the padding is zero, and the rows past `n` carry zeros into the padding of `to`. A
/// loop whose batch changes then compiles one relayout per bucket instead of one per size.
pub fn relayout(shared: &Shared, from: &DeviceArray, to: &DenseKey) -> Result<Option<DeviceArray>> {
    let numel = |k: &DenseKey| k.valid.iter().product::<usize>();
    if from.key.dtype != to.dtype || numel(&from.key) != numel(to) {
        return Ok(None);
    }
    let pair = all_rows(&from.key, to).unwrap_or_else(|| (from.key.clone(), to.clone()));
    let exe = {
        let mut cache = shared.relayouts.lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(&pair) {
            Some(e) => e.clone(),
            None if cache.len() >= MAX_RELAYOUTS => return Ok(None),
            None => {
                // Keyed by its module text, so a warm process loads it from the disk cache
                // like any program instead of compiling it again.
                let mlir = emit::relayout(&pair.0, &pair.1);
                let fp = Fingerprint(xxhash_rust::xxh3::xxh3_128(mlir.as_bytes()));
                let what = || "a relayout".to_string();
                let e = super::compile::executable(shared, fp, &[], &what, || mlir)?;
                cache.insert(pair.clone(), e.clone());
                e
            }
        }
    };
    let mut out = exe.execute(&[&from.buf])?;
    let buf = out
        .pop()
        .ok_or_else(|| Error::Internal("a relayout returned nothing".into()))?;
    Ok(Some(DeviceArray::new(
        buf,
        to.clone(),
        from.counters.clone(),
    )))
}

/// A buffer's whole value as a dense device array with zero padding (what `stage::gather`
/// would upload), and the key that says which staged operands it serves.
pub struct DeviceArray {
    pub buf: DeviceBuffer,
    pub key: DenseKey,
    counters: Arc<PjrtCounters>,
}

impl DeviceArray {
    pub fn new(buf: DeviceBuffer, key: DenseKey, counters: Arc<PjrtCounters>) -> DeviceArray {
        counters
            .resident_bytes
            .fetch_add(key.padded_len() as u64, Ordering::Relaxed);
        DeviceArray { buf, key, counters }
    }
}

impl Drop for DeviceArray {
    fn drop(&mut self) {
        self.counters
            .resident_bytes
            .fetch_sub(self.key.padded_len() as u64, Ordering::Relaxed);
    }
}

impl DeviceValue for DeviceArray {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn copy_to_host(&self, host: &mut [u8]) -> Result<()> {
        let valid = self.key.valid.iter().product::<usize>() * self.key.dtype.size();
        if host.len() != valid {
            return Err(Error::Internal(format!(
                "a device value of {valid} bytes written back into a buffer of {}",
                host.len()
            )));
        }
        if self.key.valid == self.key.padded {
            self.buf.download(host)?;
        } else {
            let mut padded = vec![0u8; self.key.padded_len()];
            self.buf.download(&mut padded)?;
            stage::unpad(&self.key, &padded, host);
        }
        self.counters.downloads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Gathers operand `j` of `staging` (dtype `d`, element `offset`) from `base` and uploads it.
///
/// # Safety
/// `base` holds the operand's whole view and no one writes it meanwhile.
pub unsafe fn upload(
    shared: &Shared,
    staging: &stage::Staging,
    j: usize,
    d: DType,
    offset: usize,
    base: *const u8,
) -> Result<DeviceBuffer> {
    let data = stage::gather(staging, j, d, base, offset as isize);
    let dims: Vec<i64> = staging.sig.operands[j]
        .staged_dims(&staging.sig)
        .iter()
        .map(|&x| x as i64)
        .collect();
    let b = shared
        .client
        .upload(&data, stage::pjrt_type(hlo::Elem::of(d)), &dims)?;
    shared.counters.uploads.fetch_add(1, Ordering::Relaxed);
    Ok(b)
}

/// Operand `j` of `staging` (dtype `d`, element `offset`) on buffer `b`, as a launch argument. A
/// device copy of exactly the array the operand stages (`stage::dense_key`) is passed as is,
/// one of the same value staged with other dims is restaged on the device; otherwise the view
/// is gathered from the host bytes (written back first if the device holds a newer value) and
/// uploaded, and an upload of the buffer's whole value is kept as its (clean) device copy.
///
/// # Safety
/// `b` is allocated and large enough for the operand, and no one writes it meanwhile.
pub unsafe fn input_arg(
    shared: &Shared,
    staging: &stage::Staging,
    j: usize,
    d: DType,
    offset: usize,
    b: &Arc<Buffer>,
) -> Result<Arg> {
    let counters = &shared.counters;
    let key = stage::dense_key(staging, j, d, offset, b.len);
    if let (Some(k), Some(v)) = (&key, b.device_copy()) {
        if let Some(a) = v.as_any().downcast_ref::<DeviceArray>() {
            if a.key == *k {
                counters.resident_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Arg::Resident(v));
            }
            // The same value staged with other dims (a flat loop made it, a row kernel
            // reads rows): restaged on the device, and kept in the new layout.
            if let Some(r) = relayout(shared, a, k)? {
                let r: Arc<dyn DeviceValue> = Arc::new(r);
                b.replace_device_copy(&v, r.clone());
                counters.resident_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Arg::Resident(r));
            }
        }
    }
    b.host_coherent()?;
    let up = upload(shared, staging, j, d, offset, b.storage()?.ptr())?;
    Ok(match key {
        Some(k) => {
            let v: Arc<dyn DeviceValue> = Arc::new(DeviceArray::new(up, k, counters.clone()));
            b.set_device_copy(v.clone(), false);
            Arg::Resident(v)
        }
        None => Arg::Owned(up),
    })
}
