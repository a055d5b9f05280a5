//! Embeds the shipped checklists (checks/*.yaml) in the binary, so one file
//! is all a node needs.

use std::path::Path;

fn main() {
    // Read at run time: a build script compiled in another checkout (a
    // copied target directory) must still embed this checkout's files.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let dir = Path::new(&manifest).join("../../checks");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("checks/ exists")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    let mut code = String::from("[\n");
    for path in &files {
        println!("cargo:rerun-if-changed={}", path.display());
        let name = format!("checks/{}", path.file_name().unwrap().to_string_lossy());
        code.push_str(&format!(
            "    ({name:?}, include_str!({:?})),\n",
            path.display().to_string()
        ));
    }
    code.push(']');
    let out = Path::new(&std::env::var("OUT_DIR").unwrap()).join("shipped_checks.rs");
    std::fs::write(out, code).expect("write shipped_checks.rs");
}
