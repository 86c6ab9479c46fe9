//! The IR: dtypes, layouts, ops, and the inference rules that give every op its output.

pub mod conv;
mod ctc;
pub mod depthwise;
pub mod dtype;
mod elementwise;
pub mod error;
mod grouped_matmul;
pub mod infer;
mod infer_memo;
pub mod kernel;
pub mod layout;
pub mod op;
mod recurrence;
mod shapes;
mod wide_matmul;

pub use conv::{Conv, ConvPart};
pub use ctc::{Ctc, CtcPart};
pub use depthwise::{Depthwise, DepthwisePart};
pub use dtype::{Category, DType};
pub use error::{OpError, OpResult};
pub use grouped_matmul::GroupedMatmul;
pub use infer::{infer, ArgMeta, Inferred};
pub use infer_memo::infer_memo_operands;
pub use kernel::{KernelOp, RandomDist, ScanOp, ScatterReduce};
pub use layout::{Dims, Layout, Strides};
pub use op::{BinaryOp, Op, ReduceOp, Scalar, UnaryOp};
pub use recurrence::{Cell, Recurrence, RecurrencePart};
