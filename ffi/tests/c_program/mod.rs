//! Building the C test programs in `tests/c/` as a C backend would: the system C compiler,
//! strict C99 with warnings as errors, the checked-in header and the static library cargo
//! built for this crate. Shared by `c_abi.rs` and `misuse.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The crate's folder (`ffi/`).
pub fn dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The static library cargo built for this crate. Found from the test binary's path
/// (`target/<profile>/deps/<test>-<hash>`): cargo writes it next to the test binary
/// (`deps/libdeferfuse.a`), and copies it up to `target/<profile>/` when the library itself is a
/// build target.
pub fn static_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let deps = exe.parent().expect("the test binary's directory");
    let name = if cfg!(windows) {
        "deferfuse.lib"
    } else {
        "libdeferfuse.a"
    };
    let candidates = [deps.join(name), deps.parent().unwrap_or(deps).join(name)];
    candidates
        .iter()
        .find(|p| p.exists())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "the static library is missing (looked for {candidates:?}): cargo builds it with \
                 the lib target (crate-type staticlib in ffi/Cargo.toml); run `cargo test -p \
                 deferfuse-ffi` so it is built in the same profile as this test"
            )
        })
}

/// stdout then stderr of a finished program.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Compiles and links `tests/c/<name>.c` into a temporary folder and returns the executable.
pub fn build(name: &str) -> PathBuf {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deferfuse-ffi-c");
    std::fs::create_dir_all(&tmp).unwrap();
    let exe = tmp.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args([
            "-std=c99",
            "-pedantic",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-O0",
            "-g",
        ])
        .arg("-I")
        .arg(dir().join("include"))
        .arg(dir().join(format!("tests/c/{name}.c")))
        .arg("-o")
        .arg(&exe)
        .arg(static_lib())
        .args(["-lpthread", "-ldl", "-lm"])
        .output()
        .unwrap_or_else(|e| panic!("could not run {cc}: {e}"));
    assert!(out.status.success(), "compiling {name}.c:\n{}", text(&out));
    exe
}
