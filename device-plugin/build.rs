//! Compile the kubelet device-plugin API (`proto/api.proto`) with protox (a pure-Rust protobuf
//! compiler, so no `protoc` binary is needed) and generate tonic client and server code.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/api.proto");
    let fds = protox::compile(["proto/api.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
