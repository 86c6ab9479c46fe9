//! The slice of the PJRT C API (`pjrt_c_api.h`, version 0.81) that this backend calls,
//! declared by hand.
//!
//! Why by hand and not pjrt-rs: the published `pjrt`/`pjrt-sys` 0.2.0 are generated from C API
//! 0.54, and current plugins reject their argument structs by size (shared/notes/pjrt.md). Every
//! argument struct below lists its fields up to the last one of 0.81, so `size_of` is exactly the
//! header's `PJRT_STRUCT_SIZE`; newer plugins accept older sizes, which is what lets one binding
//! drive both the 0.81 and the 0.115 CPU plugins.

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_void};

/// The C API version these declarations follow; older plugins lack fields we set.
pub const API_MAJOR: c_int = 0;
pub const API_MINOR: c_int = 81;

pub type Opaque = c_void;
pub type PJRT_Error = c_void;
pub type PJRT_Client = c_void;
pub type PJRT_Device = c_void;
pub type PJRT_Event = c_void;
pub type PJRT_Buffer = c_void;
pub type PJRT_Executable = c_void;
pub type PJRT_LoadedExecutable = c_void;

#[repr(C)]
pub struct PJRT_Api_Version {
    pub struct_size: usize,
    pub extension_start: *mut Opaque,
    pub major_version: c_int,
    pub minor_version: c_int,
}

/// The head of `PJRT_Api`; the function pointers follow it as an array (see [`Fn`]).
#[repr(C)]
pub struct PJRT_Api {
    pub struct_size: usize,
    pub extension_start: *mut Opaque,
    pub pjrt_api_version: PJRT_Api_Version,
}

/// Position of each function pointer we call in `PJRT_Api` after its head (0.81 order).
#[derive(Clone, Copy, Debug)]
#[repr(usize)]
pub enum Fn {
    ErrorDestroy = 0,
    ErrorMessage = 1,
    PluginInitialize = 3,
    EventDestroy = 5,
    EventAwait = 8,
    ClientCreate = 10,
    ClientDestroy = 11,
    ClientPlatformName = 12,
    ClientPlatformVersion = 14,
    ClientAddressableDevices = 16,
    ClientCompile = 20,
    ClientBufferFromHostBuffer = 22,
    ExecutableDestroy = 40,
    ExecutableNumOutputs = 44,
    ExecutableSerialize = 49,
    LoadedExecutableDestroy = 50,
    LoadedExecutableGetExecutable = 51,
    LoadedExecutableExecute = 55,
    ExecutableDeserializeAndLoad = 56,
    BufferDestroy = 58,
    BufferToHostBuffer = 70,
}

/// The highest index in [`Fn`]: the plugin's `PJRT_Api` must be at least this long.
pub const LAST_FN: usize = Fn::BufferToHostBuffer as usize;

/// Every PJRT entry point takes one argument struct and returns an error or null.
pub type RawFn = unsafe extern "C" fn(*mut c_void) -> *mut PJRT_Error;

/// `PJRT_Buffer_Type` values we use.
pub mod buffer_type {
    pub const PRED: i32 = 1;
    pub const S32: i32 = 4;
    pub const S64: i32 = 5;
    pub const U8: i32 = 6;
    pub const F16: i32 = 10;
    pub const F32: i32 = 11;
    pub const F64: i32 = 12;
    pub const BF16: i32 = 13;
}

/// `PJRT_HostBufferSemantics_kImmutableOnlyDuringCall`: the plugin copies during the call, so
/// the staging memory can be reused right after.
pub const IMMUTABLE_ONLY_DURING_CALL: i32 = 0;

macro_rules! args {
    ($(#[$m:meta])* $name:ident { $($f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        pub struct $name {
            pub struct_size: usize,
            pub extension_start: *mut Opaque,
            $(pub $f: $t),*
        }
        impl $name {
            /// Zeroed, with `struct_size` set (every pointer null, every count 0).
            pub fn new() -> Self {
                // SAFETY: all fields are integers or raw pointers, for which zero is valid.
                let mut s: Self = unsafe { std::mem::zeroed() };
                s.struct_size = std::mem::size_of::<Self>();
                s
            }
        }
    };
}

args!(PJRT_Error_Destroy_Args { error: *mut PJRT_Error });
args!(PJRT_Error_Message_Args {
    error: *const PJRT_Error,
    message: *const c_char,
    message_size: usize,
});
args!(PJRT_Plugin_Initialize_Args {});
args!(PJRT_Event_Destroy_Args { event: *mut PJRT_Event });
args!(PJRT_Event_Await_Args { event: *mut PJRT_Event });
args!(PJRT_Client_Create_Args {
    create_options: *const Opaque,
    num_options: usize,
    kv_get_callback: *mut Opaque,
    kv_get_user_arg: *mut Opaque,
    kv_put_callback: *mut Opaque,
    kv_put_user_arg: *mut Opaque,
    client: *mut PJRT_Client,
    kv_try_get_callback: *mut Opaque,
    kv_try_get_user_arg: *mut Opaque,
});
args!(PJRT_Client_Destroy_Args { client: *mut PJRT_Client });
args!(PJRT_Client_PlatformName_Args {
    client: *mut PJRT_Client,
    platform_name: *const c_char,
    platform_name_size: usize,
});
args!(PJRT_Client_PlatformVersion_Args {
    client: *mut PJRT_Client,
    platform_version: *const c_char,
    platform_version_size: usize,
});
args!(PJRT_Client_AddressableDevices_Args {
    client: *mut PJRT_Client,
    addressable_devices: *const *mut PJRT_Device,
    num_addressable_devices: usize,
});
args!(PJRT_Program {
    code: *mut c_char,
    code_size: usize,
    format: *const c_char,
    format_size: usize,
});
args!(PJRT_Client_Compile_Args {
    client: *mut PJRT_Client,
    program: *const PJRT_Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    executable: *mut PJRT_LoadedExecutable,
});
args!(PJRT_Client_BufferFromHostBuffer_Args {
    client: *mut PJRT_Client,
    data: *const c_void,
    type_: i32,
    dims: *const i64,
    num_dims: usize,
    byte_strides: *const i64,
    num_byte_strides: usize,
    host_buffer_semantics: i32,
    device: *mut PJRT_Device,
    memory: *mut Opaque,
    device_layout: *mut Opaque,
    done_with_host_buffer: *mut PJRT_Event,
    buffer: *mut PJRT_Buffer,
});
args!(PJRT_ExecuteOptions {
    send_callbacks: *mut Opaque,
    recv_callbacks: *mut Opaque,
    num_send_ops: usize,
    num_recv_ops: usize,
    launch_id: c_int,
    non_donatable_input_indices: *const i64,
    num_non_donatable_input_indices: usize,
    context: *mut Opaque,
    call_location: *const c_char,
    num_tasks: usize,
    task_ids: *mut c_int,
    incarnation_ids: *mut i64,
});
args!(PJRT_LoadedExecutable_Execute_Args {
    executable: *mut PJRT_LoadedExecutable,
    options: *mut PJRT_ExecuteOptions,
    argument_lists: *const *const *mut PJRT_Buffer,
    num_devices: usize,
    num_args: usize,
    output_lists: *const *mut *mut PJRT_Buffer,
    device_complete_events: *mut *mut PJRT_Event,
    execute_device: *mut PJRT_Device,
});
args!(PJRT_LoadedExecutable_Destroy_Args { executable: *mut PJRT_LoadedExecutable });
args!(PJRT_LoadedExecutable_GetExecutable_Args {
    loaded_executable: *mut PJRT_LoadedExecutable,
    executable: *mut PJRT_Executable,
});
args!(PJRT_Executable_Destroy_Args { executable: *mut PJRT_Executable });
args!(PJRT_Executable_NumOutputs_Args {
    executable: *mut PJRT_Executable,
    num_outputs: usize,
});
args!(PJRT_Executable_Serialize_Args {
    executable: *const PJRT_Executable,
    serialized_bytes: *const c_char,
    serialized_bytes_size: usize,
    serialized_executable: *mut Opaque,
    serialized_executable_deleter: Option<unsafe extern "C" fn(*mut Opaque)>,
});
args!(PJRT_Executable_DeserializeAndLoad_Args {
    client: *mut PJRT_Client,
    serialized_executable: *const c_char,
    serialized_executable_size: usize,
    loaded_executable: *mut PJRT_LoadedExecutable,
    overridden_serialized_compile_options: *const c_char,
    overridden_serialized_compile_options_size: usize,
});
args!(PJRT_Buffer_Destroy_Args { buffer: *mut PJRT_Buffer });
args!(PJRT_Buffer_ToHostBuffer_Args {
    src: *mut PJRT_Buffer,
    host_layout: *mut Opaque,
    dst: *mut c_void,
    dst_size: usize,
    event: *mut PJRT_Event,
});

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::size_of;

    /// Sizes from `PJRT_STRUCT_SIZE` in the 0.81 header (offset of the last field plus its
    /// size); a plugin rejects a call whose struct size it does not expect.
    #[test]
    fn argument_structs_have_the_0_81_sizes() {
        assert_eq!(size_of::<PJRT_Api_Version>(), 24);
        assert_eq!(size_of::<PJRT_Client_Create_Args>(), 88);
        assert_eq!(size_of::<PJRT_Client_BufferFromHostBuffer_Args>(), 120);
        assert_eq!(size_of::<PJRT_ExecuteOptions>(), 112);
        assert_eq!(size_of::<PJRT_LoadedExecutable_Execute_Args>(), 80);
        assert_eq!(size_of::<PJRT_Executable_Serialize_Args>(), 56);
        assert_eq!(size_of::<PJRT_Executable_DeserializeAndLoad_Args>(), 64);
        assert_eq!(size_of::<PJRT_Buffer_ToHostBuffer_Args>(), 56);
        assert_eq!(size_of::<PJRT_Program>(), 48);
    }
}
