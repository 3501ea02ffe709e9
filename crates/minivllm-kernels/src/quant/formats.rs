//! The GGML block formats: their ids, block sizes and names, and the formats the quantised
//! kernels compute on as zero-sized types.
//!
//! Every block is little-endian; `d`/`dmin`/`m` scales are f16 except in Q8_K, whose `d` is
//! f32. This module imports nothing else of the crate: every other quantised module builds
//! on it.

use std::fmt;

use half::f16;

/// A GGML tensor element type, numbered as in `ggml.h` (the ids GGUF files store).
// ggml's own spellings, so names in errors and code match the files and llama.cpp.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
}

/// Elements per super-block of the K-quants and the IQ types.
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every type this enum knows, in id order.
    pub const ALL: [GgmlType; 32] = {
        use GgmlType::*;
        [
            F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
            IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS, I8, I16, I32, I64, F64,
            IQ1_M, BF16, TQ1_0, TQ2_0, MXFP4,
        ]
    };

    /// The type with GGML id `id`, or `None` for ids ggml never had or has retired
    /// (4 and 5 were Q4_2/Q4_3; 31-33 and 36-38 were repacked layouts never stored in files).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// `(name, elements per block, bytes per block)` as in ggml's `type_traits` table.
    pub(super) fn traits(self) -> (&'static str, usize, usize) {
        use GgmlType::*;
        match self {
            F32 => ("F32", 1, 4),
            F16 => ("F16", 1, 2),
            Q4_0 => ("Q4_0", 32, 2 + 16),
            Q4_1 => ("Q4_1", 32, 2 + 2 + 16),
            Q5_0 => ("Q5_0", 32, 2 + 4 + 16),
            Q5_1 => ("Q5_1", 32, 2 + 2 + 4 + 16),
            Q8_0 => ("Q8_0", 32, 2 + 32),
            // ggml's block_q8_1 holds f16 `d` and `s` (36 bytes); gguf-py's table still has
            // the old f32 layout (40), but ggml is what writes and reads files.
            Q8_1 => ("Q8_1", 32, 2 + 2 + 32),
            Q2_K => ("Q2_K", QK_K, QK_K / 16 + QK_K / 4 + 2 + 2),
            Q3_K => ("Q3_K", QK_K, QK_K / 8 + QK_K / 4 + 12 + 2),
            Q4_K => ("Q4_K", QK_K, 2 + 2 + 12 + QK_K / 2),
            Q5_K => ("Q5_K", QK_K, 2 + 2 + 12 + QK_K / 8 + QK_K / 2),
            Q6_K => ("Q6_K", QK_K, QK_K / 2 + QK_K / 4 + QK_K / 16 + 2),
            Q8_K => ("Q8_K", QK_K, 4 + QK_K + QK_K / 16 * 2),
            IQ2_XXS => ("IQ2_XXS", QK_K, 2 + QK_K / 4),
            IQ2_XS => ("IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
            IQ3_XXS => ("IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
            IQ1_S => ("IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
            IQ4_NL => ("IQ4_NL", 32, 2 + 16),
            IQ3_S => ("IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
            IQ2_S => ("IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
            IQ4_XS => ("IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
            I8 => ("I8", 1, 1),
            I16 => ("I16", 1, 2),
            I32 => ("I32", 1, 4),
            I64 => ("I64", 1, 8),
            F64 => ("F64", 1, 8),
            IQ1_M => ("IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
            BF16 => ("BF16", 1, 2),
            TQ1_0 => ("TQ1_0", QK_K, 2 + 4 * 13),
            TQ2_0 => ("TQ2_0", QK_K, 2 + QK_K / 4),
            MXFP4 => ("MXFP4", 32, 1 + 16),
        }
    }

    /// The name ggml and gguf-py print for this type, e.g. `"Q4_K"`.
    pub fn name(self) -> &'static str {
        self.traits().0
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        self.traits().1
    }

    /// Bytes per block.
    pub fn type_size(self) -> usize {
        self.traits().2
    }

    /// Bytes taken by `n` consecutive elements, or `None` when `n` is not a whole number of
    /// blocks (ggml cannot store such a row) or the size overflows.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        let (_, block, size) = self.traits();
        if !n.is_multiple_of(block) {
            return None;
        }
        (n / block).checked_mul(size)
    }

    /// Whether [`super::dequantize`] handles this type.
    pub fn can_dequantize(self) -> bool {
        use GgmlType::*;
        matches!(
            self,
            F32 | F16
                | BF16
                | Q4_0
                | Q4_1
                | Q5_0
                | Q5_1
                | Q8_0
                | Q2_K
                | Q3_K
                | Q4_K
                | Q5_K
                | Q6_K
                | Q8_K
                | MXFP4
        )
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Elements per block of the formats with a dot product here (and per activation block).
pub const QK: usize = 32;

/// The little-endian f16 at byte `i` of a block, as f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// How a format's scales turn a block's integer sum `Σ q·y` into its part of the dot
/// product: the per-format arithmetic that the 256- and 512-bit tiles share.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scales {
    /// One scale `d` per block of 32, values `d·(q + offset)`: Q4_0 (-8), Q5_0 (-16).
    Offset(f32),
    /// One scale `d` and a stored minimum `m` per block, values `d·q + m`: Q4_1, Q5_1.
    Min,
    /// A super-block's `d` and `dmin` times each block's 6-bit scale and minimum, values
    /// `d·sc·q - dmin·m`: Q4_K, Q5_K.
    SubMin,
    /// [`Scales::SubMin`] where the activations share one scale per super-block
    /// (`activations::shared_blocks`): the sub-block sums times their integer scales and
    /// the minima are summed exactly over a super-block, and the floats apply once.
    SubMinShared,
    /// A super-block's `d` times each half block's i8 scale, values `d·sc·(q - 32)`: Q6_K.
    SubSigned,
    /// [`Scales::SubSigned`] where the activations share one scale per super-block: the
    /// half blocks' sums times their integer scales, less 32 times the scales times the
    /// activations' half sums, are summed exactly over a super-block, and the floats apply
    /// once.
    SubSignedShared,
}

/// A format the quantised tiles unpack from nibbles, as a zero-sized type. The tiles are
/// generic over it, so each format's constants fold into its own copy of the shared code
/// (as a `const F: u8` did) while the code itself is written once for every register width.
/// (Q8_0's signed bytes take a different sign trick per width, so it has tiles of its own.)
pub(crate) trait QuantFormat {
    const TYPE: GgmlType;
    /// Bits per quant: the low nibble, plus those kept in the high-bit planes.
    const BITS: u32;
    const SCALES: Scales;
    /// Scales per super-block of 256 values ([`QK_K`]) rather than per block of [`QK`].
    const KQUANT: bool = matches!(
        Self::SCALES,
        Scales::SubMin | Scales::SubMinShared | Scales::SubSigned | Scales::SubSignedShared
    );
    /// Whether a minimum is stored beside each scale.
    const MINS: bool = matches!(
        Self::SCALES,
        Scales::Min | Scales::SubMin | Scales::SubMinShared
    );
    /// A table the nibbles index to give the unsigned quants (MXFP4's E2M1 codes, whose
    /// values are not evenly spaced); `None`: the nibbles are the quants.
    const LUT: Option<[u8; 16]> = None;
}

macro_rules! formats {
    ($($name:ident $(= $ty:ident)?: $bits:literal, $scales:expr;)*) => {$(
        // ggml's spellings, as `GgmlType`'s.
        #[allow(non_camel_case_types)]
        pub(crate) struct $name;

        impl QuantFormat for $name {
            const TYPE: GgmlType = formats!(@ty $name $($ty)?);
            const BITS: u32 = $bits;
            const SCALES: Scales = $scales;
        }
    )*};
    (@ty $name:ident) => { GgmlType::$name };
    (@ty $name:ident $ty:ident) => { GgmlType::$ty };
}

/// MXFP4 (gpt-oss's experts): E2M1 codes looked up as ggml's doubled values
/// (`kvalues_mxfp4`: 0, 1, 2, 3, 4, 6, 8, 12 and their negatives) plus 12, so that they are
/// unsigned (0 to 24) with an offset of -12 as Q4_0's -8, times the block's E8M0 scale
/// halved (held as an f16: [`super::layout`] checks it is exact).
#[allow(non_camel_case_types)]
pub(crate) struct MXFP4;

impl QuantFormat for MXFP4 {
    const TYPE: GgmlType = GgmlType::MXFP4;
    const BITS: u32 = 4;
    const SCALES: Scales = Scales::Offset(-MXFP4_OFFSET);
    const LUT: Option<[u8; 16]> = Some(MXFP4_UNSIGNED);
}

/// What MXFP4's offset lifts its doubled E2M1 values by: the largest magnitude, 12.
pub(crate) const MXFP4_OFFSET: f32 = 12.0;

/// MXFP4's doubled E2M1 values plus [`MXFP4_OFFSET`], by code.
pub(crate) const MXFP4_UNSIGNED: [u8; 16] =
    [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

formats! {
    Q4_0: 4, Scales::Offset(-8.0);
    Q4_1: 4, Scales::Min;
    Q5_0: 5, Scales::Offset(-16.0);
    Q5_1: 5, Scales::Min;
    Q4_K: 4, Scales::SubMin;
    Q5_K: 5, Scales::SubMin;
    Q6_K: 6, Scales::SubSigned;
    // The K-quants against activations with one scale per super-block.
    Q4_K_Shared = Q4_K: 4, Scales::SubMinShared;
    Q5_K_Shared = Q5_K: 5, Scales::SubMinShared;
    Q6_K_Shared = Q6_K: 6, Scales::SubSignedShared;
}
