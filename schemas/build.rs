//! `include_dir!` embeds `clickhouse/` (the migrations) and `spec/` (the weaver-spec schemas),
//! but cannot tell Cargo about a file added later: without this, a new migration would stay
//! out of the binary until something else in the crate changed.
fn main() {
    println!("cargo:rerun-if-changed=clickhouse");
    println!("cargo:rerun-if-changed=spec");
}
