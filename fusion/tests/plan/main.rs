//! The planner on its own: tables of nodes in, steps and cut reasons out, no runtime.
//!
//! One test binary with a module per concern, so the node builders compile once.

mod common;
mod epilogue;
mod loops;
mod plan_cache;
mod whole_program;
