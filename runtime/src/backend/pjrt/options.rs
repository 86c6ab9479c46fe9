//! The options every module is compiled with: a serialized `CompileOptionsProto`
//! (xla/pjrt/proto/compile_options.proto), built per platform.
//!
//! # Why XNNPACK dots are off on the CPU plugin
//!
//! XLA's CPU plugin runs a dot whose right operand is an entry parameter as an XNNPACK dot that
//! *captures* that operand: it packs the values once and reuses the packing at later launches
//! for as long as the argument comes at the same device address (`capture_rhs` in XLA's thunk
//! emitter; `XnnFusionThunk` notes that an address is not a correct identity). Our buffers do
//! not keep addresses to themselves: an input gathered from the host (a transposed weight, say)
//! is uploaded for one launch and freed after it, and the allocator hands the same memory to
//! the next upload of that size. A training loop op by op (strict or debug mode) uploads `W.t()`
//! afresh every step, the optimizer having updated `W` on the device, and the first Linear then
//! multiplied by the previous step's weight whenever the new upload reused the old address
//! (from run to run at a different step, as the allocator decided). Donated buffers keep their
//! address while their value changes too. So on the CPU platform every module is compiled with
//! `xla_cpu_use_xnnpack = false`: dots run as Eigen kernels, which read their operands at every
//! launch. Other platforms get no override (the option is the CPU compiler's).
//! `tests/all/pjrt_parameter_updates.rs` pins it.
//!
//! # Why excess precision is off everywhere
//!
//! The runtime's f16 and bf16 values are rounded each time an op stores them, as PyTorch's
//! eager ops and the CPU backend round them. XLA may drop a round trip through a narrow type
//! (`xla_allow_excess_precision`, on by default), so a value a program keeps in f32 between two
//! ops differs from the stored-and-reloaded one: on an H200 (session 25) an f16 depthwise
//! convolution scaled and added in one whole program came out ~4 f16 ulps from the CPU
//! backend's, and with the flag off it matched (`pjrt_kernels_in_program.rs`). TorchTPU keeps
//! the same default (`torch.backends.tpu.allow_excess_precision = False`).

/// `CompileOptionsProto.executable_build_options` (field 3): `num_replicas: 1` (field 4) and
/// `num_partitions: 1` (field 5). Empty options crash the plugins (replica_count 0).
const BUILD_OPTIONS: [u8; 6] = [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01];

/// `CompileOptionsProto.env_option_overrides` (field 7, a map of `DebugOptions` names).
const ENV_OVERRIDES_FIELD: u8 = 7;

/// The `DebugOptions` flag that routes dots through XNNPACK on the CPU plugin (see the module
/// doc).
const CPU_XNNPACK_FLAG: &str = "xla_cpu_use_xnnpack";

/// The `DebugOptions` flag that lets XLA skip roundings to narrow floats (see the module doc).
const EXCESS_PRECISION_FLAG: &str = "xla_allow_excess_precision";

/// The serialized compile options for a plugin whose platform is `platform` ("cpu", "tpu",
/// "cuda", ...).
pub fn for_platform(platform: &str) -> Vec<u8> {
    let mut out = BUILD_OPTIONS.to_vec();
    env_override_bool(&mut out, EXCESS_PRECISION_FLAG, false);
    if platform.eq_ignore_ascii_case("cpu") {
        env_override_bool(&mut out, CPU_XNNPACK_FLAG, false);
    }
    out
}

/// Appends the map entry `name -> OptionOverrideProto { bool_field: value }`.
fn env_override_bool(out: &mut Vec<u8>, name: &str, value: bool) {
    // OptionOverrideProto: `bool bool_field = 2` (a varint) inside its `oneof value`, so a
    // false value is still written and read back as set.
    let value = [0x10, value as u8];
    let mut entry = Vec::new();
    len_field(&mut entry, 1, name.as_bytes());
    len_field(&mut entry, 2, &value);
    len_field(out, ENV_OVERRIDES_FIELD, &entry);
}

/// Appends a length-delimited field (wire type 2) numbered `field` (< 16: one tag byte).
fn len_field(out: &mut Vec<u8>, field: u8, bytes: &[u8]) {
    debug_assert!(field < 16, "a one-byte tag");
    out.push(field << 3 | 2);
    let mut n = bytes.len();
    while n >= 0x80 {
        out.push((n & 0x7f) as u8 | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The build options and the excess-precision override every platform gets.
    fn common() -> Vec<u8> {
        let mut want = BUILD_OPTIONS.to_vec();
        // field 7, 32 bytes: { 1: "xla_allow_excess_precision" (26 bytes), 2: { 2: false } }
        want.extend([0x3a, 32, 0x0a, 26]);
        want.extend(b"xla_allow_excess_precision");
        want.extend([0x12, 2, 0x10, 0]);
        want
    }

    #[test]
    fn every_platform_compiles_without_excess_precision() {
        assert_eq!(for_platform("tpu"), common());
        assert_eq!(for_platform("cuda"), common());
    }

    #[test]
    fn the_cpu_plugin_compiles_without_xnnpack_dots() {
        let mut want = common();
        // field 7, 25 bytes: { 1: "xla_cpu_use_xnnpack" (19 bytes), 2: { 2: false } }
        want.extend([0x3a, 25, 0x0a, 19]);
        want.extend(b"xla_cpu_use_xnnpack");
        want.extend([0x12, 2, 0x10, 0]);
        assert_eq!(for_platform("cpu"), want);
    }

    #[test]
    fn long_fields_get_a_multi_byte_length() {
        let mut out = Vec::new();
        len_field(&mut out, 1, &[7u8; 300]);
        assert_eq!(&out[..3], &[0x0a, 0xac, 0x02]);
        assert_eq!(out.len(), 3 + 300);
    }
}
