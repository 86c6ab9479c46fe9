//! Eager modes: chosen once from the environment, switchable per thread at run time, on each
//! runtime apart (a mode set on one runtime leaves another's alone).

use crate::error::{Error, Result};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// The mode with this C ABI value, `None` for an unknown one.
    pub fn from_u32(v: u32) -> Option<Mode> {
        [Mode::Strict, Mode::Debug, Mode::Defer]
            .get(v as usize)
            .copied()
    }

    /// The lowercase name used in logs and messages.
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

/// One thread's choice of mode on one runtime: a base set with [`set`] and a stack of
/// [`push`]es over it. They are kept apart so a [`pop`] can only undo a push, never a `set`
/// (which has nothing to restore).
struct ThreadModes {
    runtime: u64,
    base: Option<Mode>,
    pushed: Vec<Mode>,
    /// Open op groups (see [`crate::Runtime::begin_op_group`]): nested ones count, only the
    /// outermost one's end runs the ops.
    op_groups: u32,
}

thread_local! {
    /// This thread's modes on each runtime it chose one for; none means "the runtime's
    /// default". A thread rarely uses more than one runtime: a list beats a map.
    static MODES: RefCell<Vec<ThreadModes>> = const { RefCell::new(Vec::new()) };
}

static NEXT_RUNTIME: AtomicU64 = AtomicU64::new(1);

/// A fresh runtime id, the key of each thread's modes on that runtime.
pub(crate) fn new_runtime_id() -> u64 {
    NEXT_RUNTIME.fetch_add(1, Ordering::Relaxed)
}

/// Runs `f` on the calling thread's modes on `runtime`, made empty on first use.
fn with_modes<R>(runtime: u64, f: impl FnOnce(&mut ThreadModes) -> R) -> R {
    MODES.with(|m| {
        let mut m = m.borrow_mut();
        let k = match m.iter().position(|t| t.runtime == runtime) {
            Some(k) => k,
            None => {
                m.push(ThreadModes {
                    runtime,
                    base: None,
                    pushed: Vec::new(),
                    op_groups: 0,
                });
                m.len() - 1
            }
        };
        f(&mut m[k])
    })
}

/// The calling thread's mode on `runtime`, or `default` if it never chose one there.
pub(crate) fn current(runtime: u64, default: Mode) -> Mode {
    MODES.with(|m| {
        let m = m.borrow();
        m.iter()
            .find(|t| t.runtime == runtime)
            .and_then(|t| t.pushed.last().copied().or(t.base))
            .unwrap_or(default)
    })
}

/// The mode the calling thread's next recorded op runs in on `runtime`: its mode, except that
/// a strict op inside an op group is deferred until the group ends (one ATen op's several
/// recorded ops run as one flush, as defer would run them).
pub(crate) fn recording(runtime: u64, default: Mode) -> Mode {
    MODES.with(|m| {
        let m = m.borrow();
        let t = m.iter().find(|t| t.runtime == runtime);
        let mode = t
            .and_then(|t| t.pushed.last().copied().or(t.base))
            .unwrap_or(default);
        match t {
            Some(t) if t.op_groups > 0 && mode == Mode::Strict => Mode::Defer,
            _ => mode,
        }
    })
}

/// Whether the calling thread has an op group open on `runtime`: its recorded ops are parts of
/// one ATen op.
pub(crate) fn in_op_group(runtime: u64) -> bool {
    MODES.with(|m| {
        m.borrow()
            .iter()
            .any(|t| t.runtime == runtime && t.op_groups > 0)
    })
}

/// Opens an op group on the calling thread (nested groups count).
pub(crate) fn enter_group(runtime: u64) {
    with_modes(runtime, |m| m.op_groups += 1)
}

/// Closes the calling thread's innermost op group; whether it was the outermost one (so its
/// ops run now). An error when no group is open on this thread.
pub(crate) fn leave_group(runtime: u64) -> Result<bool> {
    with_modes(runtime, |m| {
        m.op_groups = m.op_groups.checked_sub(1).ok_or_else(|| {
            Error::InvalidArgument("op group end without a matching begin on this thread".into())
        })?;
        Ok(m.op_groups == 0)
    })
}

/// Replaces the calling thread's mode on `runtime`: the top of its pushed modes, or its base
/// mode when nothing is pushed.
pub(crate) fn set(runtime: u64, mode: Mode) {
    with_modes(runtime, |m| match m.pushed.last_mut() {
        Some(top) => *top = mode,
        None => m.base = Some(mode),
    })
}

/// Makes `mode` the calling thread's mode on `runtime` until the matching [`pop`].
pub(crate) fn push(runtime: u64, mode: Mode) {
    with_modes(runtime, |m| m.pushed.push(mode))
}

/// Undoes the calling thread's last [`push`] on `runtime`, returning the mode it ends; an
/// error if nothing is pushed there (a [`set`] is not a push).
pub(crate) fn pop(runtime: u64) -> Result<Mode> {
    with_modes(runtime, |m| m.pushed.pop()).ok_or_else(|| {
        Error::InvalidArgument("mode pop without a matching push on this thread".into())
    })
}

/// Forgets the calling thread's modes on `runtime` (the runtime is going away).
pub(crate) fn forget(runtime: u64) {
    MODES.with(|m| m.borrow_mut().retain(|t| t.runtime != runtime))
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

    const RT: u64 = u64::MAX;

    #[test]
    fn push_pop_restores_previous_mode() {
        push(RT, Mode::Defer);
        push(RT, Mode::Debug);
        assert_eq!(current(RT, Mode::Strict), Mode::Debug);
        pop(RT).unwrap();
        assert_eq!(current(RT, Mode::Strict), Mode::Defer);
        pop(RT).unwrap();
        assert!(pop(RT).is_err());
    }

    #[test]
    fn pop_after_set_without_push_is_an_error_and_keeps_the_set_mode() {
        set(RT, Mode::Defer);
        assert!(pop(RT).is_err());
        assert_eq!(current(RT, Mode::Strict), Mode::Defer);
    }

    #[test]
    fn set_under_a_push_replaces_the_pushed_mode_only() {
        set(RT, Mode::Debug);
        push(RT, Mode::Strict);
        set(RT, Mode::Defer);
        assert_eq!(current(RT, Mode::Strict), Mode::Defer);
        pop(RT).unwrap();
        assert_eq!(current(RT, Mode::Strict), Mode::Debug);
    }

    #[test]
    fn a_mode_chosen_on_one_runtime_leaves_another_at_its_default() {
        let (a, b) = (new_runtime_id(), new_runtime_id());
        set(a, Mode::Defer);
        push(a, Mode::Debug);
        assert_eq!(current(b, Mode::Strict), Mode::Strict);
        assert!(pop(b).is_err(), "the push was on the other runtime");
        assert_eq!(current(a, Mode::Strict), Mode::Debug);
    }

    #[test]
    fn strict_ops_inside_an_op_group_record_deferred() {
        let a = new_runtime_id();
        enter_group(a);
        enter_group(a);
        assert_eq!(recording(a, Mode::Strict), Mode::Defer);
        assert!(
            !leave_group(a).unwrap(),
            "the inner group is not the outermost"
        );
        assert_eq!(recording(a, Mode::Strict), Mode::Defer);
        assert!(leave_group(a).unwrap());
        assert_eq!(recording(a, Mode::Strict), Mode::Strict);
        assert!(leave_group(a).is_err(), "no group is open");
    }

    #[test]
    fn an_op_group_leaves_debug_and_defer_modes_alone() {
        let a = new_runtime_id();
        enter_group(a);
        assert_eq!(recording(a, Mode::Debug), Mode::Debug);
        set(a, Mode::Defer);
        assert_eq!(recording(a, Mode::Strict), Mode::Defer);
        leave_group(a).unwrap();
    }

    #[test]
    fn a_forgotten_runtime_is_back_at_its_default() {
        let a = new_runtime_id();
        set(a, Mode::Defer);
        forget(a);
        assert_eq!(current(a, Mode::Strict), Mode::Strict);
    }
}
