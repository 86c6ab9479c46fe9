//! The cross-crate suites, one module per concern, in one test binary: the harness, the
//! reference interpreter and the program generator compile once for all of them.
//!
//! Run one suite with a module filter: `cargo test -p deferfuse --test all -- errors::`.

mod graphgen;
mod harness;
mod reference;

mod bounded;
mod column_reductions;
mod concurrency;
mod ctc_loss;
mod dense_conv;
mod depthwise_conv;
mod elementwise_ops;
mod errors;
mod few_row_products;
mod fusion;
mod fuzz_corpus;
mod graph_capture;
mod grouped_mm;
mod half_casts;
mod host_reads;
mod im2col;
mod kernel_ops;
mod memory;
mod modes_and_sync;
mod op_groups;
mod ops_vs_reference;
mod ops_vs_reference_numeric;
mod ops_vs_reference_shapes;
mod ops_vs_reference_views;
mod pipelining;
mod pjrt_buckets;
mod pjrt_kernels_in_program;
mod pjrt_parameter_updates;
mod pjrt_whole_program;
mod random_graphs;
mod recurrence;
mod row_constants;
mod row_stash;
mod short_reductions;
mod smoke;
mod strict_plans;
mod threads;
mod timeline;
mod wide_matmul;
