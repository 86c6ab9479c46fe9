//! `DEFERFUSE_DUMP_DIR`: each newly compiled region is written as readable text, with the
//! backend's program listing, so a newcomer can see what ran.

use deferfuse_cache::Fingerprint;
use deferfuse_fusion::Region;
use std::path::Path;

/// Writes `<dir>/<fingerprint>.txt`; failures are logged, never fatal.
pub fn write_region(dir: &Path, key: Fingerprint, region: &Region, listing: &str) {
    let text = format!("# region {key}\n{region}\n\n# program\n{listing}\n");
    let path = dir.join(format!("{key}.txt"));
    if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&path, text)) {
        tracing::warn!(path = %path.display(), error = %e, "could not write region dump");
    }
}
