//! The checked-in header must be what cbindgen generates from the current source, so the ABI a
//! C++ backend compiles against is the one the library exports.

use std::path::Path;

#[test]
fn header_is_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    // `with_src` follows `mod` declarations from lib.rs without running `cargo metadata`.
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen failed to generate the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("the header is UTF-8");

    let path = dir.join("include/deferfuse.h");
    if std::env::var_os("DFUSE_BLESS_HEADER").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    if current != generated {
        let first = current
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| current.lines().count().min(generated.lines().count()));
        panic!(
            "{} is stale: it differs from what cbindgen generates from ffi/src (first at line \
             {}). Regenerate it with\n    DFUSE_BLESS_HEADER=1 cargo test -p deferfuse-ffi \
             --test header\nand check the new header in.",
            path.display(),
            first + 1
        );
    }
}
