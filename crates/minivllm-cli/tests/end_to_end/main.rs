//! The command line's tests, end to end through the binary, in one test binary: each file
//! as its own would be linked against the whole library at opt-level 3 again, and would run
//! only after the previous one finished, while one binary runs all tests side by side.

mod common;
#[path = "common/server.rs"]
mod server;

mod bench_serve;
mod chat_formats;
mod cli;
mod constraint_corpus;
mod fair_prefill;
mod hostile;
mod load;
mod serve;
mod tensor_parallel;
