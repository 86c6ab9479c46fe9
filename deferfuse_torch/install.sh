#!/usr/bin/env bash
# Installs the PyTorch device "tpu": builds libdeferfuse (Rust, release), builds the C++
# extension against the installed torch, then pip-installs the package. Run from anywhere;
# needs torch already installed (pip install torch ninja numpy pytest).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
cargo="${CARGO:-$(command -v cargo || echo "$HOME/.cargo/bin/cargo")}"
(cd "$root" && "$cargo" build --release -p deferfuse-ffi)
export DEFERFUSE_LIB_DIR="${CARGO_TARGET_DIR:-$root/target}/release"
python3 "$here/build_ext.py"
python3 -m pip install --no-build-isolation --no-deps "$here"
python3 -c "import torch, deferfuse_torch; print('deferfuse_torch', deferfuse_torch.version(), 'installed:', torch.ones(2, device='tpu').sum().item() == 2.0)"
