fn main() -> std::process::ExitCode {
    trellis::cli::main()
}
