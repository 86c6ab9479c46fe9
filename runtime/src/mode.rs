//! Eager modes: chosen once from the environment, switchable per thread at run time.

use crate::error::{Error, Result};
use std::cell::RefCell;

/// How ops run.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Each op is its own program, launched asynchronously (like CUDA eager).
    Strict = 0,
    /// Each op waits for completion; errors surface at the op; extra checks run.
    Debug = 1,
    /// Ops are recorded and run at sync points, fused (`TORCH_TPU_DEFER_AND_FUSE=1`).
    Defer = 2,
}

impl Mode {
    pub fn from_u32(v: u32) -> Option<Mode> {
        [Mode::Strict, Mode::Debug, Mode::Defer]
            .get(v as usize)
            .copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Strict => "strict",
            Mode::Debug => "debug",
            Mode::Defer => "defer",
        }
    }
}

/// Parses a boolean env value: 1/0/true/false (any case), or unset.
pub fn parse_flag(name: &str, value: Option<&str>) -> Result<bool> {
    match value.map(|v| v.trim().to_ascii_lowercase()) {
        None => Ok(false),
        Some(v) if v == "1" || v == "true" => Ok(true),
        Some(v) if v == "0" || v == "false" || v.is_empty() => Ok(false),
        Some(v) => Err(Error::Config(format!(
            "{name}={v:?}: expected 1, 0, true or false; unset it or use one of those"
        ))),
    }
}

/// The default mode from `TORCH_TPU_DEFER_AND_FUSE` and `TORCH_TPU_LAUNCH_BLOCKING` values.
/// With both on, debug wins (the caller logs a warning once).
pub fn mode_from_env(defer: Option<&str>, blocking: Option<&str>) -> Result<(Mode, bool)> {
    let d = parse_flag("TORCH_TPU_DEFER_AND_FUSE", defer)?;
    let b = parse_flag("TORCH_TPU_LAUNCH_BLOCKING", blocking)?;
    Ok(match (d, b) {
        (_, true) => (Mode::Debug, d),
        (true, false) => (Mode::Defer, false),
        _ => (Mode::Strict, false),
    })
}

thread_local! {
    /// This thread's mode stack; empty means "the runtime's default".
    static STACK: RefCell<Vec<Mode>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's mode, or `default` if it never set one.
pub fn current(default: Mode) -> Mode {
    STACK.with(|s| s.borrow().last().copied().unwrap_or(default))
}

/// Replaces the top of this thread's mode stack (or sets it if empty).
pub fn set(mode: Mode) {
    STACK.with(|s| {
        let mut s = s.borrow_mut();
        match s.last_mut() {
            Some(top) => *top = mode,
            None => s.push(mode),
        }
    })
}

pub fn push(mode: Mode) {
    STACK.with(|s| s.borrow_mut().push(mode))
}

/// Pops this thread's mode stack; an error if nothing was pushed.
pub fn pop() -> Result<Mode> {
    STACK.with(|s| s.borrow_mut().pop()).ok_or_else(|| {
        Error::InvalidArgument("mode pop without a matching push on this thread".into())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_flags_on_gives_debug() {
        assert_eq!(
            mode_from_env(Some("1"), Some("true")).unwrap(),
            (Mode::Debug, true)
        );
    }

    #[test]
    fn invalid_env_value_is_a_config_error() {
        let e = mode_from_env(Some("yes"), None).unwrap_err();
        assert!(e.to_string().contains("TORCH_TPU_DEFER_AND_FUSE"), "{e}");
    }

    #[test]
    fn push_pop_restores_previous_mode() {
        push(Mode::Defer);
        push(Mode::Debug);
        assert_eq!(current(Mode::Strict), Mode::Debug);
        pop().unwrap();
        assert_eq!(current(Mode::Strict), Mode::Defer);
        pop().unwrap();
        assert!(pop().is_err());
    }
}
