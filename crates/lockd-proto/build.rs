//! Generates the client API from proto/lockd/v1/lockd.proto with the protoc shipped in the
//! `protoc-bin-vendored` crate, so a fresh machine needs no apt step.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // prost-build finds protoc through the PROTOC environment variable.
    std::env::set_var("PROTOC", protoc);
    // `proto` is a link to the repository's proto/ in the source tree; `cargo package` copies
    // what it points to, so the published crate carries the file.
    // Read when the script runs, not compiled in: a target directory shared by two checkouts
    // (CI builds a fresh clone into the main one's) may reuse this script built in the other.
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("proto");
    let file = root.join("lockd/v1/lockd.proto");
    println!("cargo:rerun-if-changed={}", file.display());
    // The descriptor set serves gRPC reflection (grpcurl and Postman need no .proto file).
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("lockd_descriptor.bin"))
        .compile_protos(&[file], &[root])?;
    Ok(())
}
