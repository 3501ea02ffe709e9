//! Run-time instruction-set detection and the override used by tests and benchmarks.

/// Instruction sets a kernel may be compiled for, best last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
}

/// The ISA kernels dispatch to: the best the CPU supports, unless `MINIVLLM_ISA`
/// (`scalar`, `avx2`, `avx512`) asks for a lower one.
pub fn isa() -> Isa {
    unimplemented!("kernels helper")
}
