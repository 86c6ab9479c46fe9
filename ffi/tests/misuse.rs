//! The misuse suite: builds tests/c/misuse_test.c (every entry point called wrongly, each call
//! checked for its documented status and a message naming the function) against the checked-in
//! header and the static library, and runs it. When valgrind is installed (CI installs it), both
//! C programs also run under memcheck and must show no invalid access and no leak.

mod c_program;

use c_program::{build, dir, text};
use std::path::Path;
use std::process::Command;

/// A command for `exe` with the mode variables cleared (the programs set them themselves).
fn program(exe: &Path, wrapper: &[&str]) -> Command {
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.env_remove("TORCH_TPU_DEFER_AND_FUSE")
        .env_remove("TORCH_TPU_LAUNCH_BLOCKING")
        .env_remove("DEFERFUSE_DUMP_DIR");
    cmd
}

#[test]
fn every_misuse_gets_its_status_and_a_message() {
    let exe = build("misuse_test");
    let out = program(&exe, &[]).output().expect("running misuse_test");
    let log = text(&out);
    println!("{log}");
    assert!(
        out.status.success(),
        "misuse_test failed ({}):\n{log}",
        out.status
    );
    let last = log.lines().rfind(|l| l.starts_with("misuse cases: "));
    assert!(
        last.is_some_and(|l| l.ends_with(" passed, 0 failed")),
        "unexpected summary {last:?}"
    );
}

/// Every `dfuse_*` function the header declares is called by the misuse program, so a new entry
/// point cannot ship without its misuse cases.
#[test]
fn the_misuse_program_covers_every_entry_point() {
    let header = std::fs::read_to_string(dir().join("include/deferfuse.h")).unwrap();
    let program = std::fs::read_to_string(dir().join("tests/c/misuse_test.c")).unwrap();
    // Declarations are `dfuse_name(` at the start of a line, after the return type.
    let mut declared: Vec<&str> = header
        .lines()
        .filter_map(|l| {
            let start = l.find("dfuse_")?;
            let name = &l[start..l[start..].find('(')? + start];
            let is_decl = !l.trim_start().starts_with(['*', '/'])
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            is_decl.then_some(name)
        })
        .collect();
    declared.dedup();
    assert!(
        declared.len() >= 30,
        "found only {declared:?} in the header"
    );
    let missing: Vec<&&str> = declared
        .iter()
        .filter(|f| !program.contains(&format!("{f}(")))
        .collect();
    assert!(missing.is_empty(), "misuse_test.c never calls {missing:?}");
}

fn valgrind_available() -> bool {
    Command::new("valgrind")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `name` under memcheck: any invalid read or write, use of uninitialised memory, or
/// definitely/indirectly lost block fails it.
fn under_valgrind(name: &str) {
    if !valgrind_available() {
        // CI sets this, so a runner without valgrind cannot pass by skipping.
        assert!(
            std::env::var_os("DEFERFUSE_REQUIRE_VALGRIND").is_none(),
            "DEFERFUSE_REQUIRE_VALGRIND is set but valgrind is not installed"
        );
        eprintln!("valgrind is not installed; skipping the memcheck run of {name}");
        return;
    }
    let exe = build(name);
    // No suppressions: the stream workers are joined and every block freed by the time the
    // last runtime is destroyed, so nothing needs excusing.
    let wrapper = [
        "valgrind",
        "--tool=memcheck",
        "--leak-check=full",
        "--errors-for-leak-kinds=definite,indirect",
        "--show-leak-kinds=definite,indirect",
        "--error-exitcode=99",
        "--quiet",
    ];
    let out = program(&exe, &wrapper).output().expect("running valgrind");
    let log = text(&out);
    println!("{log}");
    assert!(
        out.status.success(),
        "{name} under valgrind failed ({}):\n{log}",
        out.status
    );
}

#[test]
fn the_misuse_program_is_clean_under_valgrind() {
    under_valgrind("misuse_test");
}

#[test]
fn the_abi_program_is_clean_under_valgrind() {
    under_valgrind("abi_test");
}
