//! Builds tests/c/abi_test.c with the system C compiler against the checked-in header and the
//! static library cargo builds for this crate, runs it, and requires it to pass: the ABI as a C
//! (or C++) backend really sees it.

mod c_program;

use std::path::Path;
use std::process::Command;

fn compiler(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_string())
}

fn run(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: could not run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{cmd:?}\n{text}",
        out.status
    );
    text
}

#[test]
fn c_test_program_passes() {
    let exe = c_program::build("abi_test");
    let output = run(
        Command::new(&exe)
            .env_remove("TORCH_TPU_DEFER_AND_FUSE")
            .env_remove("TORCH_TPU_LAUNCH_BLOCKING")
            .env_remove("DEFERFUSE_DUMP_DIR"),
        "the C ABI test program",
    );
    println!("{output}");
    let last = output.lines().last().unwrap_or("");
    assert!(
        last.ends_with(" passed, 0 failed"),
        "unexpected last line {last:?}"
    );
}

/// The header also compiles as C++ (what the PyTorch backend is written in), when a C++
/// compiler is installed.
#[test]
fn header_compiles_as_cpp() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let cxx = compiler("CXX", "c++");
    if Command::new(&cxx).arg("--version").output().is_err() {
        eprintln!("no C++ compiler ({cxx}); skipping");
        return;
    }
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("deferfuse-ffi-c-abi");
    std::fs::create_dir_all(&tmp).unwrap();
    let src = tmp.join("header_check.cpp");
    std::fs::write(
        &src,
        "#include \"deferfuse.h\"\n\
         static_assert(sizeof(DfuseOperand) == 32, \"DfuseOperand layout\");\n\
         int check(DfuseRuntime *rt) {\n\
           DfuseAttrs a = {};\n\
           a.sub_op = DFUSE_BINARY_OP_ADD;\n\
           uint64_t r = 0;\n\
           DfuseStatus s = dfuse_op(rt, 0, DFUSE_OP_KIND_BINARY, &a, nullptr, 0, 0, &r);\n\
           return s == DFUSE_STATUS_OK ? 0 : 1;\n\
         }\n",
    )
    .unwrap();
    let mut cmd = Command::new(&cxx);
    cmd.args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only"])
        .arg("-I")
        .arg(dir.join("include"))
        .arg(&src);
    run(&mut cmd, "compiling the header as C++");
}
