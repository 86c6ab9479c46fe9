//! Values that stay on the device: a program's result kept as its buffer's value, or an
//! uploaded input kept for the next launch (see `buffer`'s module doc for the coherence rule).

use super::client::{DeviceBuffer, Executable};
use super::stage::{self, DenseKey};
use super::{lower, PjrtCounters, Shared};
use crate::backend::DeviceValue;
use crate::error::{Error, Result};
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Relayout executables kept per backend; past this, a value in another layout goes through
/// the host instead of compiling (a loop over ever new sizes would compile one per size).
const MAX_RELAYOUTS: usize = 64;

/// Compiled relayouts by (from, to) layout.
pub type Relayouts = Mutex<HashMap<(DenseKey, DenseKey), Arc<Executable>>>;

/// `from` restaged as `to` on the device (see `lower::relayout`), or `None` when the two are
/// not the same value (dtype or element count differ) or the relayout cache is full.
pub fn relayout(shared: &Shared, from: &DeviceArray, to: &DenseKey) -> Result<Option<DeviceArray>> {
    let numel = |k: &DenseKey| k.valid.iter().product::<usize>();
    if from.key.dtype != to.dtype || numel(&from.key) != numel(to) {
        return Ok(None);
    }
    let pair = (from.key.clone(), to.clone());
    let exe = {
        let mut cache = shared.relayouts.lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(&pair) {
            Some(e) => e.clone(),
            None if cache.len() >= MAX_RELAYOUTS => return Ok(None),
            None => {
                let mlir = lower::relayout(&from.key, to);
                let e = Arc::new(shared.client.compile(&mlir).map_err(|e| {
                    Error::Backend(format!("{e}\nwhile compiling a relayout\n{mlir}"))
                })?);
                cache.insert(pair, e.clone());
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
