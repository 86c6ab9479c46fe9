//! `DEFERFUSE_LOG`: an env-filter directive (`debug`, `deferfuse_runtime=debug`, ...) that
//! prints the runtime's logs (flushes, cuts and their reasons, with the op that triggered
//! them) to stderr. A host that installed its own `tracing` subscriber keeps it.

use std::io::IsTerminal;
use std::sync::Once;

static INIT: Once = Once::new();

/// Installs a stderr subscriber once per process if `DEFERFUSE_LOG` is set.
pub fn init_from_env() {
    INIT.call_once(|| {
        if let Ok(filter) = std::env::var("DEFERFUSE_LOG") {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
                .with_writer(std::io::stderr)
                // Colour codes only for a person at a terminal, not in a file or a pipe.
                .with_ansi(std::io::stderr().is_terminal())
                .try_init();
        }
    });
}
