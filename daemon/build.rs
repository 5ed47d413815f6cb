//! Embeds the built console (`frontend/dist`, made by `cargo xtask console`) into the binary,
//! each file with its content type, an ETag and its compressed copies: the brotli and gzip
//! files `cargo xtask console` wrote beside it (`<file>.br`, `<file>.gz`), or a gzip copy made
//! here where there is none. Without a built console the table is empty and the daemon serves a
//! page saying how to build it.

use std::io::Write;
use std::path::{Path, PathBuf};

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-env-changed=RINGSIDE_CONSOLE_DIST");
    let dist = std::env::var_os("RINGSIDE_CONSOLE_DIST")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../frontend/dist"));

    let mut files = Vec::new();
    if dist.is_dir() {
        // Cargo scans a directory named here for changes of any file in it.
        println!("cargo:rerun-if-changed={}", dist.display());
        collect(&dist, &dist, &mut files);
    } else {
        // Watch the parent, so creating dist/ reruns this script.
        let parent = dist.parent().unwrap_or(&dist);
        println!("cargo:rerun-if-changed={}", parent.display());
    }
    files.sort();
    // The compressed copies are served in place of their file, never under their own name.
    let sibling = |path: &Path, ext: &str| {
        let copy = PathBuf::from(format!("{}.{ext}", path.display()));
        copy.is_file().then_some(copy)
    };
    files.retain(|(url, _)| !url.ends_with(".gz") && !url.ends_with(".br"));

    let gz_dir = out.join("console-gz");
    std::fs::create_dir_all(&gz_dir).expect("create OUT_DIR/console-gz");
    let mut table = String::from("pub static ASSETS: &[Asset] = &[\n");
    for (i, (url, path)) in files.iter().enumerate() {
        let body = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let mime = content_type(url);
        let brotli_expr = match sibling(path, "br") {
            Some(br) => format!("Some(include_bytes!({:?}))", br.display().to_string()),
            None => "None".to_string(),
        };
        let gzip = if let Some(gz) = sibling(path, "gz") {
            Some(std::fs::read(&gz).unwrap_or_else(|e| panic!("read {}: {e}", gz.display())))
        } else if compressible(mime) {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            encoder.write_all(&body).expect("gzip in memory");
            let gz = encoder.finish().expect("gzip in memory");
            (gz.len() < body.len()).then_some(gz)
        } else {
            None
        };
        let gzip_expr = match gzip {
            Some(gz) => {
                let gz_path = gz_dir.join(format!("{i}.gz"));
                std::fs::write(&gz_path, gz).expect("write gzip copy");
                format!("Some(include_bytes!({:?}))", gz_path.display().to_string())
            }
            None => "None".to_string(),
        };
        table.push_str(&format!(
            "    Asset {{ path: {url:?}, content_type: {mime:?}, etag: \"\\\"{:016x}\\\"\", body: include_bytes!({:?}), gzip: {gzip_expr}, brotli: {brotli_expr} }},\n",
            fnv1a(&body),
            path.display().to_string(),
        ));
    }
    table.push_str("];\n");
    std::fs::write(out.join("console_assets.rs"), table).expect("write console_assets.rs");
}

fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, files);
        } else if let Ok(relative) = path.strip_prefix(root) {
            let url = format!("/{}", relative.to_string_lossy().replace('\\', "/"));
            files.push((url, path));
        }
    }
}

fn content_type(path: &str) -> &'static str {
    match path.rsplit('.').next().unwrap_or("") {
        "html" => "text/html; charset=utf-8",
        "js" => "text/javascript; charset=utf-8",
        "wasm" => "application/wasm",
        "css" => "text/css; charset=utf-8",
        "svg" => "image/svg+xml",
        "png" => "image/png",
        "ico" => "image/x-icon",
        "json" => "application/json",
        "txt" => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

fn compressible(mime: &str) -> bool {
    mime.starts_with("text/") || mime.starts_with("application/") || mime == "image/svg+xml"
}

/// FNV-1a, 64 bit: a content hash for ETags.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}
