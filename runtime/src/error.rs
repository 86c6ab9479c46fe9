//! The runtime's error type and the status codes the C ABI maps it to.

use deferfuse_fusion::ir::OpError;

/// Status codes; `repr(i32)` because the C ABI returns them. Never renumber.
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// A null pointer, bad enum value, bad length or malformed argument.
    InvalidArgument = 1,
    /// A tensor, stream or event handle that is null, stale, released or from another runtime.
    InvalidHandle = 2,
    /// An op rejected at record time (shapes, dtypes, dims).
    BadOp = 3,
    /// An allocation failed or would pass the configured memory limit.
    OutOfMemory = 4,
    /// The backend failed to compile or run a program.
    Backend = 5,
    /// Invalid configuration (env vars, config struct).
    Config = 6,
    /// A panic was caught at the boundary; the runtime stays usable.
    Internal = 7,
    /// A graph capture was refused (a sync point, host read or random op in it): its ops run as
    /// ordinary deferred ops and the caller keeps running them that way.
    NotCapturable = 8,
}

/// Everything that can go wrong in the runtime. Messages say what was expected and what to do.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Error {
    /// An op rejected at record time (shapes, dtypes, dims).
    #[error("{0}")]
    Op(#[from] OpError),
    /// A null pointer, bad enum value, bad length or malformed argument.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A handle that is null, stale, released or from another runtime.
    #[error("invalid handle: {0}")]
    InvalidHandle(String),
    /// An allocation failed or would pass the configured memory limit.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// The backend failed to compile or run a program.
    #[error("backend error: {0}")]
    Backend(String),
    /// Invalid configuration (env vars, config struct).
    #[error("configuration error: {0}")]
    Config(String),
    /// Something that should never happen, such as a panic caught at the C boundary.
    #[error("internal error: {0}")]
    Internal(String),
    /// An index operand held a value outside its dim (gather, scatter): found only when the
    /// program runs, so it surfaces at the op in debug mode and at the next sync point (and on
    /// every later use of the result) in strict and defer mode. The message names the op, the
    /// value, the dim and its size.
    #[error("{0}")]
    IndexOutOfBounds(String),
    /// A graph capture the runtime cannot replay (see [`crate::graph`]): the message says
    /// what in the captured ops prevents it. Nothing is lost: the ops stay recorded.
    #[error("not capturable: {0}")]
    NotCapturable(String),
}

impl Error {
    /// The status code the C ABI returns for this error.
    pub fn status(&self) -> Status {
        match self {
            Error::Op(_) => Status::BadOp,
            Error::InvalidArgument(_) => Status::InvalidArgument,
            Error::InvalidHandle(_) => Status::InvalidHandle,
            Error::OutOfMemory(_) => Status::OutOfMemory,
            Error::Backend(_) => Status::Backend,
            Error::Config(_) => Status::Config,
            Error::Internal(_) => Status::Internal,
            Error::IndexOutOfBounds(_) => Status::BadOp,
            Error::NotCapturable(_) => Status::NotCapturable,
        }
    }
}

/// The runtime's result type.
pub type Result<T> = std::result::Result<T, Error>;
