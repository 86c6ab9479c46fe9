//! The one error type for an op that cannot be recorded.
//!
//! Every bad op is reported at its own call (not at a later flush), and the message always says
//! which op, which operand, what was expected, what was given and what to do about it.

use std::fmt;

/// Why an op was rejected at record time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError {
    /// The op's PyTorch-style name, e.g. `add` or `sum`.
    pub op: String,
    /// Which operand or attribute is wrong, e.g. `input 1` or `dim`.
    pub operand: String,
    /// What the op accepts there, e.g. `a float tensor`.
    pub expected: String,
    /// What the caller actually passed.
    pub got: String,
    /// What the caller can do; may be empty.
    pub hint: String,
}

impl OpError {
    /// An error without a hint (add one with [`OpError::hint`]).
    pub fn new(
        op: impl Into<String>,
        operand: impl Into<String>,
        expected: impl Into<String>,
        got: impl Into<String>,
    ) -> Self {
        OpError {
            op: op.into(),
            operand: operand.into(),
            expected: expected.into(),
            got: got.into(),
            hint: String::new(),
        }
    }

    /// Adds the "what to do" part of the message.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = hint.into();
        self
    }
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: expected {}, got {}",
            self.op, self.operand, self.expected, self.got
        )?;
        if !self.hint.is_empty() {
            write!(f, " ({})", self.hint)?;
        }
        Ok(())
    }
}

impl std::error::Error for OpError {}

/// Shorthand used by shape and type inference.
pub type OpResult<T> = Result<T, OpError>;
