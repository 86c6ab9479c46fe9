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

/// One thread's choice of mode: a base set with [`set`] and a stack of [`push`]es over it. They
/// are kept apart so a [`pop`] can only undo a push, never a `set` (which has nothing to restore).
struct ThreadModes {
    base: Option<Mode>,
    pushed: Vec<Mode>,
}

thread_local! {
    /// This thread's modes; neither set nor pushed means "the runtime's default".
    static MODES: RefCell<ThreadModes> = const {
        RefCell::new(ThreadModes { base: None, pushed: Vec::new() })
    };
}

/// The calling thread's mode, or `default` if it never set one.
pub fn current(default: Mode) -> Mode {
    MODES.with(|m| {
        let m = m.borrow();
        m.pushed.last().copied().or(m.base).unwrap_or(default)
    })
}

/// Replaces the calling thread's mode: the top of its pushed modes, or its base mode when
/// nothing is pushed.
pub fn set(mode: Mode) {
    MODES.with(|m| {
        let mut m = m.borrow_mut();
        match m.pushed.last_mut() {
            Some(top) => *top = mode,
            None => m.base = Some(mode),
        }
    })
}

/// Makes `mode` the calling thread's mode until the matching [`pop`].
pub fn push(mode: Mode) {
    MODES.with(|m| m.borrow_mut().pushed.push(mode))
}

/// Undoes the calling thread's last [`push`]; an error if nothing is pushed (a [`set`] is not
/// a push).
pub fn pop() -> Result<Mode> {
    MODES.with(|m| m.borrow_mut().pushed.pop()).ok_or_else(|| {
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

    #[test]
    fn pop_after_set_without_push_is_an_error_and_keeps_the_set_mode() {
        set(Mode::Defer);
        assert!(pop().is_err());
        assert_eq!(current(Mode::Strict), Mode::Defer);
    }

    #[test]
    fn set_under_a_push_replaces_the_pushed_mode_only() {
        set(Mode::Debug);
        push(Mode::Strict);
        set(Mode::Defer);
        assert_eq!(current(Mode::Strict), Mode::Defer);
        pop().unwrap();
        assert_eq!(current(Mode::Strict), Mode::Debug);
    }
}
