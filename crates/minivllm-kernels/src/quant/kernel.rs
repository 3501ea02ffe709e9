//! Which integer kernel [`super::matmul_quant`] runs on this CPU: the one runtime choice
//! the quantised modules share (the activation quantiser follows it).

/// The tile kernels of [`super::matmul_quant`], by how they sum byte products (all exact,
/// so all give the same bits; the `tiles` module says how).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QKernel {
    /// Safe Rust, a weight row at a time: any CPU.
    Portable,
    /// AVX2 `vpmaddubsw` + `vpmaddwd`.
    Avx2,
    /// AVX-VNNI `vpdpbusd` on 256-bit vectors (VEX).
    AvxVnni,
    /// AVX512-VNNI `vpdpbusd` on 512-bit vectors: whole groups.
    Avx512Vnni,
    /// AMX-INT8 tiles (`tdpbsud`) for 16 or more activation rows, AVX512-VNNI for fewer.
    /// Opt-in (`MINIVLLM_AMX=1`): with a float step per block of 32 that keeps its results
    /// bit-equal to the others', it measured no faster than [`QKernel::Avx512Vnni`]
    /// (`docs/benchmarks.md`).
    Amx,
}

impl QKernel {
    /// Every kernel, most portable first.
    pub const ALL: [QKernel; 5] = [
        QKernel::Portable,
        QKernel::Avx2,
        QKernel::AvxVnni,
        QKernel::Avx512Vnni,
        QKernel::Amx,
    ];

    /// Whether this CPU can run it, within what `MINIVLLM_ISA` allows: `scalar` keeps the
    /// portable kernel, and a cap below the CPU's best (`avx2` on an AVX-512 CPU) keeps
    /// `vpmaddubsw`, which is how benchmarks compare the two.
    pub fn available(self) -> bool {
        use crate::cpu::{detected, isa, Isa};
        #[cfg(target_arch = "x86_64")]
        let (avx_vnni, avx512_vnni) = (
            is_x86_feature_detected!("avxvnni"),
            is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw"),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let (avx_vnni, avx512_vnni) = (false, false);
        match self {
            QKernel::Portable => true,
            QKernel::Avx2 => isa() >= Isa::Avx2,
            QKernel::AvxVnni => isa() >= Isa::Avx2 && isa() == detected() && avx_vnni,
            QKernel::Avx512Vnni => isa() >= Isa::Avx512 && avx512_vnni,
            QKernel::Amx => {
                isa() >= Isa::Avx512 && avx512_vnni && amx_requested() && crate::amx::available()
            }
        }
    }

    /// The fastest kernel available, found once.
    pub fn best() -> QKernel {
        static BEST: std::sync::OnceLock<QKernel> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| {
            let mut fastest_first = QKernel::ALL.into_iter().rev();
            fastest_first
                .find(|k| k.available())
                .unwrap_or(QKernel::Portable)
        })
    }

    /// The `bench machine` limit ([`crate::probe`]) that bounds it, if measured.
    pub fn peak_name(self) -> Option<&'static str> {
        use crate::probe;
        match self {
            QKernel::Portable => None,
            QKernel::Avx2 => Some(probe::INT8_AVX2),
            QKernel::AvxVnni => Some(probe::INT8_AVX_VNNI),
            QKernel::Avx512Vnni => Some(probe::INT8_AVX512_VNNI),
            QKernel::Amx => Some(probe::INT8_AMX),
        }
    }

    /// Its name in benchmark reports.
    pub fn name(self) -> &'static str {
        match self {
            QKernel::Portable => "portable",
            QKernel::Avx2 => "avx2 maddubs",
            QKernel::AvxVnni => "avx-vnni",
            QKernel::Avx512Vnni => "avx512-vnni",
            QKernel::Amx => "amx-int8",
        }
    }
}

/// Whether `MINIVLLM_AMX` asks for the AMX tiles (`1`, `true`, `on`).
fn amx_requested() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var("MINIVLLM_AMX").is_ok_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "1" | "true" | "on" | "yes"
            )
        })
    })
}

/// Whether the AVX2 kernels may run (`isa()` honours `MINIVLLM_ISA`; its AVX2 includes the
/// F16C that converts the scales).
pub(super) fn use_avx2() -> bool {
    crate::cpu::isa() >= crate::cpu::Isa::Avx2
}
