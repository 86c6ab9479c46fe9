//! A loaded PJRT plugin and its client: load and version check, errors, compile, (de)serialize,
//! buffers and execute. Everything unsafe about the C API lives here; callers get owned,
//! `Send + Sync` handles that free themselves.

use super::ffi::{self, Fn};
use super::options;
use crate::error::{Error, Result};
use std::ffi::{c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A dlopened plugin and its function table. Kept alive by every object made from it.
pub struct Plugin {
    api: *const ffi::PJRT_Api,
    /// The shared library the plugin was loaded from.
    pub path: PathBuf,
    /// (major, minor) C API version the plugin reports.
    pub version: (i32, i32),
    /// Never unloaded: plugins register process-exit handlers (a deserialized executable
    /// does), and calling them after dlclose crashes the process at exit.
    _lib: std::mem::ManuallyDrop<libloading::Library>,
}

// SAFETY: the PJRT C API is thread-safe; the function table is immutable after load.
unsafe impl Send for Plugin {}
unsafe impl Sync for Plugin {}

impl Plugin {
    /// Loads the plugin at `path` and checks its C API version.
    pub fn load(path: &Path) -> Result<Arc<Plugin>> {
        let what = |msg: String| Error::Config(format!("PJRT plugin {}: {msg}", path.display()));
        if !path.is_file() {
            return Err(what(
                "no such file; install one (pip install --no-deps xla-cpu-pjrt gives \
                 site-packages/xla_plugins/xla_cpu_pjrt/xla_cpu_pjrt.so) and set \
                 DEFERFUSE_PJRT_PLUGIN to its path"
                    .into(),
            ));
        }
        // SAFETY: loading a library runs its initializers; a PJRT plugin is meant to be loaded.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| what(format!("cannot be loaded as a shared library: {e}")))?;
        type GetApi = unsafe extern "C" fn() -> *const ffi::PJRT_Api;
        // SAFETY: GetPjrtApi has this signature in every PJRT plugin.
        let get: libloading::Symbol<GetApi> =
            unsafe { lib.get(b"GetPjrtApi\0") }.map_err(|_| {
                what(
                    "is not a PJRT plugin (it has no GetPjrtApi symbol); point \
                  DEFERFUSE_PJRT_PLUGIN at a PJRT plugin such as xla_cpu_pjrt.so"
                        .into(),
                )
            })?;
        // SAFETY: see above.
        let api = unsafe { get() };
        if api.is_null() {
            return Err(what("GetPjrtApi returned null".into()));
        }
        // SAFETY: a non-null PJRT_Api starts with this head.
        let head = unsafe { &*api };
        let v = &head.pjrt_api_version;
        let version = (v.major_version, v.minor_version);
        let need = std::mem::size_of::<ffi::PJRT_Api>() + 8 * (ffi::LAST_FN + 1);
        if version.0 != ffi::API_MAJOR || version.1 < ffi::API_MINOR || head.struct_size < need {
            return Err(what(format!(
                "C API version {}.{} is not supported; deferfuse needs {}.{} or a later 0.x \
                 (use a newer plugin, e.g. the current xla-cpu-pjrt wheel)",
                version.0,
                version.1,
                ffi::API_MAJOR,
                ffi::API_MINOR
            )));
        }
        let plugin = Plugin {
            api,
            path: path.to_path_buf(),
            version,
            _lib: std::mem::ManuallyDrop::new(lib),
        };
        let mut init = ffi::PJRT_Plugin_Initialize_Args::new();
        plugin
            .call(Fn::PluginInitialize, &mut init)
            .map_err(|e| what(format!("initialization failed: {e}")))?;
        Ok(Arc::new(plugin))
    }

    /// Calls entry `f` with `args`; a returned PJRT error becomes our error with its message.
    pub fn call<T>(&self, f: Fn, args: &mut T) -> Result<()> {
        // SAFETY: the table is at least LAST_FN long (checked at load), and `args` is the
        // argument struct `f` takes (each call site pairs them as the header does).
        let err = unsafe {
            let table = (self.api as *const u8).add(std::mem::size_of::<ffi::PJRT_Api>())
                as *const Option<ffi::RawFn>;
            let Some(func) = *table.add(f as usize) else {
                return Err(Error::Backend(format!(
                    "PJRT plugin {} does not implement {f:?}",
                    self.path.display()
                )));
            };
            func(args as *mut T as *mut c_void)
        };
        if err.is_null() {
            return Ok(());
        }
        Err(Error::Backend(format!(
            "PJRT {f:?}: {}",
            self.take_error(err)
        )))
    }

    /// The message of `err`, which is destroyed.
    fn take_error(&self, err: *mut ffi::PJRT_Error) -> String {
        let mut m = ffi::PJRT_Error_Message_Args::new();
        m.error = err;
        let msg = if self.call_raw(Fn::ErrorMessage, &mut m) && !m.message.is_null() {
            // SAFETY: the plugin returned a buffer of message_size bytes owned by `err`.
            let bytes =
                unsafe { std::slice::from_raw_parts(m.message as *const u8, m.message_size) };
            String::from_utf8_lossy(bytes).into_owned()
        } else {
            "unknown error".into()
        };
        let mut d = ffi::PJRT_Error_Destroy_Args::new();
        d.error = err;
        self.call_raw(Fn::ErrorDestroy, &mut d);
        msg
    }

    /// Calls an entry that returns nothing (error message/destroy); false if absent.
    fn call_raw<T>(&self, f: Fn, args: &mut T) -> bool {
        // SAFETY: as in `call`.
        unsafe {
            let table = (self.api as *const u8).add(std::mem::size_of::<ffi::PJRT_Api>())
                as *const Option<ffi::RawFn>;
            match *table.add(f as usize) {
                Some(func) => {
                    func(args as *mut T as *mut c_void);
                    true
                }
                None => false,
            }
        }
    }

    /// Waits for `event` and destroys it; its error, if any, is returned.
    fn await_event(&self, event: *mut ffi::PJRT_Event) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut a = ffi::PJRT_Event_Await_Args::new();
        a.event = event;
        let r = self.call(Fn::EventAwait, &mut a);
        let mut d = ffi::PJRT_Event_Destroy_Args::new();
        d.event = event;
        self.call_raw(Fn::EventDestroy, &mut d);
        r
    }
}

/// A PJRT client on the plugin's first addressable device.
pub struct Client {
    /// The plugin the client came from, held so it outlives the client.
    pub plugin: Arc<Plugin>,
    raw: *mut ffi::PJRT_Client,
    device: *mut ffi::PJRT_Device,
    /// e.g. "cpu"
    pub platform_name: String,
    /// The platform's version string, as the plugin reports it.
    pub platform_version: String,
    /// What every module is compiled with (`options`: no XNNPACK dots on the CPU plugin).
    compile_options: Vec<u8>,
}

// SAFETY: PJRT clients are thread-safe.
unsafe impl Send for Client {}
unsafe impl Sync for Client {}

fn owned_str(p: *const c_char, n: usize) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the plugin returned `n` bytes at `p`, valid while the client lives.
    String::from_utf8_lossy(unsafe { std::slice::from_raw_parts(p as *const u8, n) }).into_owned()
}

impl Client {
    /// Creates a client with the plugin and picks its first addressable device.
    pub fn new(plugin: Arc<Plugin>) -> Result<Client> {
        let mut c = ffi::PJRT_Client_Create_Args::new();
        plugin.call(Fn::ClientCreate, &mut c)?;
        let raw = c.client;
        let mut client = Client {
            plugin,
            raw,
            device: std::ptr::null_mut(),
            platform_name: String::new(),
            platform_version: String::new(),
            compile_options: Vec::new(),
        };
        let mut n = ffi::PJRT_Client_PlatformName_Args::new();
        n.client = raw;
        client.plugin.call(Fn::ClientPlatformName, &mut n)?;
        client.platform_name = owned_str(n.platform_name, n.platform_name_size);
        client.compile_options = options::for_platform(&client.platform_name);
        let mut v = ffi::PJRT_Client_PlatformVersion_Args::new();
        v.client = raw;
        client.plugin.call(Fn::ClientPlatformVersion, &mut v)?;
        client.platform_version = owned_str(v.platform_version, v.platform_version_size);
        let mut d = ffi::PJRT_Client_AddressableDevices_Args::new();
        d.client = raw;
        client.plugin.call(Fn::ClientAddressableDevices, &mut d)?;
        if d.num_addressable_devices == 0 || d.addressable_devices.is_null() {
            return Err(Error::Backend(format!(
                "PJRT plugin {} has no addressable device",
                client.plugin.path.display()
            )));
        }
        // SAFETY: the array has num_addressable_devices (> 0) entries.
        client.device = unsafe { *d.addressable_devices };
        Ok(client)
    }

    /// Compiles StableHLO MLIR text (entry `@main`).
    pub fn compile(self: &Arc<Self>, mlir: &str) -> Result<Executable> {
        let format = b"mlir";
        let mut prog = ffi::PJRT_Program::new();
        prog.code = mlir.as_ptr() as *mut c_char;
        prog.code_size = mlir.len();
        prog.format = format.as_ptr() as *const c_char;
        prog.format_size = format.len();
        let mut a = ffi::PJRT_Client_Compile_Args::new();
        a.client = self.raw;
        a.program = &prog;
        a.compile_options = self.compile_options.as_ptr() as *const c_char;
        a.compile_options_size = self.compile_options.len();
        self.plugin.call(Fn::ClientCompile, &mut a)?;
        self.executable(a.executable)
    }

    /// The serialized `CompileOptionsProto` every module is compiled with: part of what a
    /// cached executable is valid for.
    pub fn compile_options(&self) -> &[u8] {
        &self.compile_options
    }

    /// Loads an executable serialized by [`Executable::serialize`] with the same plugin.
    pub fn deserialize(self: &Arc<Self>, bytes: &[u8]) -> Result<Executable> {
        let mut a = ffi::PJRT_Executable_DeserializeAndLoad_Args::new();
        a.client = self.raw;
        a.serialized_executable = bytes.as_ptr() as *const c_char;
        a.serialized_executable_size = bytes.len();
        self.plugin.call(Fn::ExecutableDeserializeAndLoad, &mut a)?;
        self.executable(a.loaded_executable)
    }

    fn executable(self: &Arc<Self>, raw: *mut ffi::PJRT_LoadedExecutable) -> Result<Executable> {
        let mut exe = Executable {
            client: self.clone(),
            raw,
            num_outputs: 0,
        };
        let n = {
            let inner = exe.inner()?;
            let mut n = ffi::PJRT_Executable_NumOutputs_Args::new();
            n.executable = inner.0;
            self.plugin.call(Fn::ExecutableNumOutputs, &mut n)?;
            n.num_outputs
        };
        exe.num_outputs = n;
        Ok(exe)
    }

    /// Copies `data` (dense, row-major, of PJRT type `ty` and shape `dims`) to the device.
    pub fn upload(self: &Arc<Self>, data: &[u8], ty: i32, dims: &[i64]) -> Result<DeviceBuffer> {
        let mut a = ffi::PJRT_Client_BufferFromHostBuffer_Args::new();
        a.client = self.raw;
        a.data = data.as_ptr() as *const c_void;
        a.type_ = ty;
        a.dims = dims.as_ptr();
        a.num_dims = dims.len();
        a.host_buffer_semantics = ffi::IMMUTABLE_ONLY_DURING_CALL;
        a.device = self.device;
        self.plugin.call(Fn::ClientBufferFromHostBuffer, &mut a)?;
        let buf = DeviceBuffer {
            client: self.clone(),
            raw: a.buffer,
        };
        self.plugin.await_event(a.done_with_host_buffer)?;
        Ok(buf)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let mut d = ffi::PJRT_Client_Destroy_Args::new();
        d.client = self.raw;
        let _ = self.plugin.call(Fn::ClientDestroy, &mut d);
    }
}

/// A compiled, loaded program.
pub struct Executable {
    client: Arc<Client>,
    raw: *mut ffi::PJRT_LoadedExecutable,
    pub num_outputs: usize,
}

// SAFETY: loaded executables may be executed from any thread.
unsafe impl Send for Executable {}
unsafe impl Sync for Executable {}

/// The executable behind a loaded one (destroyed on drop).
struct Inner<'a>(*mut ffi::PJRT_Executable, &'a Plugin);

impl Drop for Inner<'_> {
    fn drop(&mut self) {
        let mut d = ffi::PJRT_Executable_Destroy_Args::new();
        d.executable = self.0;
        let _ = self.1.call(Fn::ExecutableDestroy, &mut d);
    }
}

impl Executable {
    fn inner(&self) -> Result<Inner<'_>> {
        let mut g = ffi::PJRT_LoadedExecutable_GetExecutable_Args::new();
        g.loaded_executable = self.raw;
        self.client
            .plugin
            .call(Fn::LoadedExecutableGetExecutable, &mut g)?;
        Ok(Inner(g.executable, &self.client.plugin))
    }

    /// The plugin's serialized form, for the disk cache.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let inner = self.inner()?;
        let mut s = ffi::PJRT_Executable_Serialize_Args::new();
        s.executable = inner.0;
        self.client.plugin.call(Fn::ExecutableSerialize, &mut s)?;
        let bytes = if s.serialized_bytes.is_null() {
            Vec::new()
        } else {
            // SAFETY: the plugin returned serialized_bytes_size bytes, owned by
            // serialized_executable until its deleter runs.
            unsafe {
                std::slice::from_raw_parts(s.serialized_bytes as *const u8, s.serialized_bytes_size)
            }
            .to_vec()
        };
        if let Some(del) = s.serialized_executable_deleter {
            // SAFETY: the deleter the plugin gave for this object.
            unsafe { del(s.serialized_executable) };
        }
        Ok(bytes)
    }

    /// Runs on the device with `args`; returns the outputs once they are computed.
    pub fn execute(&self, args: &[&DeviceBuffer]) -> Result<Vec<DeviceBuffer>> {
        let raw_args: Vec<*mut ffi::PJRT_Buffer> = args.iter().map(|b| b.raw).collect();
        let arg_list = raw_args.as_ptr();
        let mut outs: Vec<*mut ffi::PJRT_Buffer> = vec![std::ptr::null_mut(); self.num_outputs];
        let out_list = outs.as_mut_ptr();
        let mut event: *mut ffi::PJRT_Event = std::ptr::null_mut();
        let mut opts = ffi::PJRT_ExecuteOptions::new();
        let mut a = ffi::PJRT_LoadedExecutable_Execute_Args::new();
        a.executable = self.raw;
        a.options = &mut opts;
        a.argument_lists = &arg_list;
        a.num_devices = 1;
        a.num_args = raw_args.len();
        a.output_lists = &out_list;
        a.device_complete_events = &mut event;
        self.client
            .plugin
            .call(Fn::LoadedExecutableExecute, &mut a)?;
        let outputs: Vec<DeviceBuffer> = outs
            .into_iter()
            .map(|raw| DeviceBuffer {
                client: self.client.clone(),
                raw,
            })
            .collect();
        self.client.plugin.await_event(event)?;
        Ok(outputs)
    }
}

impl Drop for Executable {
    fn drop(&mut self) {
        let mut d = ffi::PJRT_LoadedExecutable_Destroy_Args::new();
        d.executable = self.raw;
        let _ = self.client.plugin.call(Fn::LoadedExecutableDestroy, &mut d);
    }
}

/// A buffer in device memory, freed on drop.
pub struct DeviceBuffer {
    client: Arc<Client>,
    raw: *mut ffi::PJRT_Buffer,
}

// SAFETY: PJRT buffers may be used and freed from any thread.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Copies the whole buffer into `dst` (its dense, row-major size in bytes).
    pub fn download(&self, dst: &mut [u8]) -> Result<()> {
        let mut a = ffi::PJRT_Buffer_ToHostBuffer_Args::new();
        a.src = self.raw;
        a.dst = dst.as_mut_ptr() as *mut c_void;
        a.dst_size = dst.len();
        self.client.plugin.call(Fn::BufferToHostBuffer, &mut a)?;
        self.client.plugin.await_event(a.event)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let mut d = ffi::PJRT_Buffer_Destroy_Args::new();
        d.buffer = self.raw;
        let _ = self.client.plugin.call(Fn::BufferDestroy, &mut d);
    }
}
