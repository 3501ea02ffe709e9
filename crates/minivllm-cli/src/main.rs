//! The `minivllm` binary: the command line of `minivllm_cli`.

fn main() {
    std::process::exit(minivllm_cli::main_with_args(std::env::args_os()));
}
