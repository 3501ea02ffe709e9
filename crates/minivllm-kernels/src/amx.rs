//! Intel AMX (Advanced Matrix Extensions, Sapphire Rapids and later): eight tile registers
//! of up to 16 rows × 64 bytes and a unit that multiplies them, `C[16×16 i32] += A[16×64
//! bytes] · B[16 rows of 4-byte quads]` in one instruction, eight times the multiply-adds
//! of an AVX512-VNNI instruction.
//!
//! Rust's AMX intrinsics are not stable, so the few instructions the kernels need are
//! written here as inline assembly, the register numbers as constants. Linux hands the
//! tile state to a process only on request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`): without it
//! the first tile instruction raises SIGILL, so [`available`] asks once and says no where
//! the request fails.

#[cfg(target_arch = "x86_64")]
use std::arch::asm;
use std::sync::OnceLock;

/// Whether this CPU has AMX-TILE and AMX-INT8 and the operating system lets this process
/// use them (asked once, for the whole process).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| cpu_has_amx_int8() && request_tile_state())
}

/// CPUID leaf 7: AMX-TILE is EDX bit 24, AMX-INT8 bit 25 (`is_x86_feature_detected!` has
/// no stable names for them).
fn cpu_has_amx_int8() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
        (edx >> 24) & 1 == 1 && (edx >> 25) & 1 == 1
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Linux: asks for the tile data state (XFEATURE_XTILEDATA, 18); granted to the process
/// and every thread of it.
fn request_tile_state() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: arch_prctl with this code only changes the process's permissions; it
        // reads and writes no memory of ours.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        };
        rc == 0
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    false
}

/// A tile configuration (palette 1): each register's rows and bytes per row.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileConfig([u8; 64]);

impl TileConfig {
    /// Every register unconfigured.
    pub const fn new() -> Self {
        let mut c = [0; 64];
        c[0] = 1;
        TileConfig(c)
    }

    /// Register `t` (0-7) as `rows` (1-16) rows of `bytes` (4-64, a multiple of 4) each.
    pub const fn tile(mut self, t: usize, rows: u8, bytes: u16) -> Self {
        assert!(
            t < 8
                && rows >= 1
                && rows <= 16
                && bytes >= 4
                && bytes <= 64
                && bytes.is_multiple_of(4)
        );
        let b = bytes.to_le_bytes();
        self.0[16 + 2 * t] = b[0];
        self.0[17 + 2 * t] = b[1];
        self.0[48 + t] = rows;
        self
    }
}

impl Default for TileConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Loads `cfg` (which zeroes every tile).
///
/// # Safety
/// [`available`] must have returned true.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn configure(cfg: &TileConfig) {
    // SAFETY: the caller's contract; `cfg` is 64 readable bytes.
    unsafe {
        asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly, preserves_flags))
    };
}

/// Returns the tiles to their initial state, so that context switches do not save them.
///
/// # Safety
/// [`available`] must have returned true.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn release() {
    // SAFETY: the caller's contract.
    unsafe { asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
}

/// Zeroes tile `T`.
///
/// # Safety
/// A configuration that sets up `T` must be loaded.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn zero<const T: u8>() {
    // SAFETY: the caller's contract.
    unsafe { asm!("tilezero tmm{t}", t = const T, options(nostack, nomem, preserves_flags)) };
}

/// Loads tile `T`: its configured rows from `p`, `stride` bytes apart.
///
/// # Safety
/// A configuration that sets up `T` must be loaded, and each row's bytes readable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn load<const T: u8>(p: *const u8, stride: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("tileloadd tmm{t}, [{p} + {s}*1]", t = const T, p = in(reg) p, s = in(reg) stride,
             options(nostack, readonly, preserves_flags))
    };
}

/// Stores tile `T`: its rows to `p`, `stride` bytes apart.
///
/// # Safety
/// A configuration that sets up `T` must be loaded, and each row's bytes writable.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn store<const T: u8>(p: *mut u8, stride: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("tilestored [{p} + {s}*1], tmm{t}", t = const T, p = in(reg) p, s = in(reg) stride,
             options(nostack, preserves_flags))
    };
}

/// `C += A · B` over bytes, A signed and B unsigned (`tdpbsud`): `C[m][n] += Σ_k A[m][k] ·
/// B[k / 4][4n + k % 4]`, exact in 32 bits.
///
/// # Safety
/// A configuration whose shapes of `C`, `A` and `B` agree must be loaded.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn dot_su<const C: u8, const A: u8, const B: u8>() {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("tdpbsud tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
             options(nostack, nomem, preserves_flags))
    };
}

/// [`dot_su`] with both operands signed (`tdpbssd`).
///
/// # Safety
/// As [`dot_su`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub unsafe fn dot_ss<const C: u8, const A: u8, const B: u8>() {
    // SAFETY: the caller's contract.
    unsafe {
        asm!("tdpbssd tmm{c}, tmm{a}, tmm{b}", c = const C, a = const A, b = const B,
             options(nostack, nomem, preserves_flags))
    };
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[repr(C, align(64))]
    struct Aligned<const N: usize>([u8; N]);

    /// One product of each kind against the plain sum, where the CPU has AMX.
    #[test]
    fn tile_products_match_plain_sums() {
        let ok = available();
        eprintln!(
            "{} AMX tile products",
            if ok {
                "RAN"
            } else {
                "SKIPPED (not on this CPU)"
            }
        );
        if !ok {
            return;
        }
        let cfg = TileConfig::new()
            .tile(0, 16, 64)
            .tile(1, 16, 64)
            .tile(4, 16, 32)
            .tile(6, 8, 64);
        let a: Vec<i8> = (0..16 * 32).map(|i| (i * 37 % 255) as u8 as i8).collect();
        let b: Vec<u8> = (0..8 * 64).map(|i| (i * 13 % 251) as u8).collect();
        let mut c = [Aligned::<1024>([0; 1024]), Aligned::<1024>([0; 1024])];
        // SAFETY: AMX is available; a is 16 rows of 32 bytes, b 8 rows of 64, c 16 of 64.
        unsafe {
            configure(&cfg);
            zero::<0>();
            zero::<1>();
            load::<4>(a.as_ptr() as *const u8, 32);
            load::<6>(b.as_ptr(), 64);
            dot_su::<0, 4, 6>();
            dot_ss::<1, 4, 6>();
            store::<0>(c[0].0.as_mut_ptr(), 64);
            store::<1>(c[1].0.as_mut_ptr(), 64);
            release();
        }
        for (signed, c) in [false, true].into_iter().zip(&c) {
            for m in 0..16 {
                for n in 0..16 {
                    let want: i32 = (0..32)
                        .map(|k| {
                            let bv = b[(k / 4) * 64 + n * 4 + k % 4];
                            let bv = if signed { bv as i8 as i32 } else { bv as i32 };
                            a[m * 32 + k] as i32 * bv
                        })
                        .sum();
                    let at = (m * 16 + n) * 4;
                    let got = i32::from_le_bytes(c.0[at..at + 4].try_into().unwrap());
                    assert_eq!(got, want, "signed B {signed}, C[{m}][{n}]");
                }
            }
        }
    }
}
