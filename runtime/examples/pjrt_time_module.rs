//! Times one StableHLO module on a PJRT plugin, without Python or the runtime around it: how
//! long XLA itself takes to run a whole-flush step that `DEFERFUSE_DUMP_DIR` wrote out.
//!
//! ```sh
//! DEFERFUSE_PJRT_PLUGIN=.../xla_cpu_pjrt.so cargo run --release -p deferfuse-runtime \
//!     --example pjrt_time_module -- DUMP_DIR/<fingerprint>-<signature>.mlir [launches]
//! ```
//!
//! Every argument is zeros (indices of 0 are in bounds; a training step's update of zeros is
//! finite), uploaded before each launch because donated arguments are consumed; only the
//! launch and its wait are timed. Prints the median and the minimum in ms.

use deferfuse_runtime::backend::pjrt::{Client, Plugin};
use std::path::Path;
use std::sync::Arc;

/// PJRT buffer type codes (`PJRT_Buffer_Type`) and element sizes by MLIR element type.
fn element(name: &str) -> (i32, usize) {
    match name {
        "f32" => (11, 4),
        "f64" => (12, 8),
        "i64" => (5, 8),
        "i32" => (4, 4),
        other => panic!("an argument of element type {other}: expected f32, f64, i64 or i32"),
    }
}

/// Each argument of `@main` in `mlir`: its type code, element size and dims.
fn arguments(mlir: &str) -> Vec<(i32, usize, Vec<i64>)> {
    let head = mlir
        .lines()
        .find(|l| l.contains("func.func @main"))
        .expect("the module has a @main");
    let args = &head[head.find('(').expect("(")..head.find(") ->").expect(") ->")];
    args.split("%arg")
        .skip(1)
        .map(|a| {
            let ty = &a[a.find("tensor<").expect("a tensor argument") + 7..];
            let ty = &ty[..ty.find('>').expect(">")];
            let mut parts: Vec<&str> = ty.split('x').collect();
            let (code, size) = element(parts.pop().expect("an element type"));
            let dims = parts
                .iter()
                .map(|d| d.parse().expect("a static dim"))
                .collect();
            (code, size, dims)
        })
        .collect()
}

fn main() {
    let mut argv = std::env::args().skip(1);
    let path = argv
        .next()
        .expect("usage: pjrt_time_module MODULE.mlir [launches]");
    let launches: usize = argv.next().map_or(300, |n| n.parse().expect("launches"));
    let mlir = std::fs::read_to_string(&path).expect("the module file");
    let plugin = std::env::var("DEFERFUSE_PJRT_PLUGIN").expect("DEFERFUSE_PJRT_PLUGIN");
    let client = Arc::new(Client::new(Plugin::load(Path::new(&plugin)).unwrap()).unwrap());
    let t0 = std::time::Instant::now();
    let exe = client.compile(&mlir).expect("compile");
    println!("compile ms: {:.0}", t0.elapsed().as_secs_f64() * 1e3);
    let specs = arguments(&mlir);
    let mut ms = Vec::with_capacity(launches);
    for _ in 0..launches {
        let bufs: Vec<_> = specs
            .iter()
            .map(|(code, size, dims)| {
                let n = dims.iter().product::<i64>() as usize;
                client.upload(&vec![0u8; n * size], *code, dims).unwrap()
            })
            .collect();
        let refs: Vec<_> = bufs.iter().collect();
        let t = std::time::Instant::now();
        let outs = exe.execute(&refs).expect("execute");
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        drop(outs);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "execute ms: median {:.3} min {:.3}",
        ms[ms.len() / 2],
        ms[0]
    );
}
