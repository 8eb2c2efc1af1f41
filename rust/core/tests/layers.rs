//! Layers point one way: the lower layers (hardware constants, numerics, memory, isa, kernels, par) never
//! import the upper ones (engines, machine, asm, cost, trace). Checked on the source text, so a new
//! import fails here before it can tangle the layers.

use std::fs;
use std::path::{Path, PathBuf};

/// Lower-layer modules (a directory, or a single file) under `src/`.
const LOWER: &[&str] = &["hw.rs", "numerics", "memory", "isa", "kernels", "par"];
/// Paths a lower layer must not name.
const UPPER: &[&str] = &[
    "crate::engines",
    "crate::machine",
    "crate::cost",
    "crate::trace",
    "crate::asm",
];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<_> = fs::read_dir(path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
            .map(|e| e.expect("directory entry").path())
            .collect();
        entries.sort();
        for p in entries {
            rust_files(&p, out);
        }
    } else if path.extension().is_some_and(|x| x == "rs") {
        out.push(path.to_path_buf());
    }
}

#[test]
fn lower_layers_do_not_import_upper_ones() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    for m in LOWER {
        let p = src.join(m);
        assert!(p.exists(), "{} is missing", p.display());
        rust_files(&p, &mut files);
    }
    assert!(files.len() > 10, "found only {files:?}");
    let mut bad = Vec::new();
    for f in &files {
        let text = fs::read_to_string(f).unwrap_or_else(|e| panic!("read {}: {e}", f.display()));
        for (i, line) in text.lines().enumerate() {
            // `crate::{engines, ..}` groups too: normalise `crate::{` lists to one path each.
            let grouped = line.contains("crate::{");
            for u in UPPER {
                let leaf = &u["crate::".len()..];
                if line.contains(u) || (grouped && line.contains(leaf)) {
                    bad.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "lower layers import upper ones:\n{}",
        bad.join("\n")
    );
}
