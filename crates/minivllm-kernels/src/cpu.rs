//! Run-time instruction-set detection and the override used by tests and benchmarks.

use std::sync::OnceLock;

/// Instruction sets a kernel may be compiled for, best last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512,
}

impl Isa {
    /// Parses the values `MINIVLLM_ISA` accepts (case-insensitive).
    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().as_str() {
            "scalar" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2),
            "avx512" => Some(Isa::Avx512),
            _ => None,
        }
    }
}

/// The best ISA this CPU supports, ignoring `MINIVLLM_ISA`.
///
/// `Avx512` implies `Avx2` is usable too: AVX-512 kernels fall back to AVX2 helpers for
/// tails, so both feature sets are required.
pub fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        // F16C (half-precision loads of the KV cache) came with every AVX2 CPU made.
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        if avx2 && is_x86_feature_detected!("avx512f") {
            return Isa::Avx512;
        }
        if avx2 {
            return Isa::Avx2;
        }
    }
    Isa::Scalar
}

/// The ISA kernels dispatch to: the best the CPU supports, unless `MINIVLLM_ISA`
/// (`scalar`, `avx2`, `avx512`) asks for a lower one.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = detected();
        // Asking for more than the CPU has would crash with SIGILL, so it is capped;
        // an unknown value is ignored rather than fatal because this runs inside kernels.
        match std::env::var("MINIVLLM_ISA")
            .ok()
            .and_then(|v| Isa::parse(&v))
        {
            Some(requested) => requested.min(best),
            None => best,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_known_names() {
        assert_eq!(Isa::parse("Scalar"), Some(Isa::Scalar));
        assert_eq!(Isa::parse(" avx2 "), Some(Isa::Avx2));
        assert_eq!(Isa::parse("avx512"), Some(Isa::Avx512));
        assert_eq!(Isa::parse("neon"), None);
    }

    #[test]
    fn isa_never_exceeds_detected() {
        assert!(isa() <= detected());
    }
}
