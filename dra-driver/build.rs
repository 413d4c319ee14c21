//! Compile the kubelet's plugin-registration and DRA v1 APIs (copied into `proto/`) with protox (a
//! pure-Rust protobuf compiler, no `protoc` needed) and generate tonic client and server code.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/pluginregistration/v1/api.proto",
        "proto/dra/v1/api.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
