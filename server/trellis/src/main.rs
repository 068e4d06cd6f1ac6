// Blueprints are trees of many small strings and maps; mimalloc allocates
// and frees them markedly faster than the system allocator (measured in
// docs/decisions/0004-allocator.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    trellis::cli::main()
}
