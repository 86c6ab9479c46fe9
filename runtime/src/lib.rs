//! deferfuse-runtime: the runtime, streams, buffers and their lifecycle, modes, execution and
//! backends.
//!
//! Data flows one way: an op call is checked and recorded ([`record`]), a sync point flushes the
//! stream's trace through the planner ([`exec`]), each step's program comes from the cache or
//! the backend, and the stream's worker runs it on the buffers.

#![warn(missing_docs)]

pub mod alloc;
pub mod backend;
pub mod buffer;
pub mod checks;
pub mod config;
mod dump;
pub mod error;
pub mod event;
mod exec;
pub mod graph;
pub mod handle;
mod log;
pub mod mode;
mod op_group;
mod pipeline;
pub mod record;
pub mod runtime;
pub mod stats;
pub mod stream;
pub mod timeline;
pub mod views;
mod wave;

pub use buffer::BufferState;
pub use config::{BackendKind, Config};
pub use error::{Error, Result, Status};
pub use handle::Handle;
pub use mode::Mode;
pub use record::Input;
pub use runtime::Runtime;
pub use stats::{Stats, SyncReason};
pub use views::View;
