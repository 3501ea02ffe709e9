//! The x86 tiles of the quantised product against the scalar twins and each other, bit for
//! bit (split from `tests.rs` to keep each file one screenful of concerns).

use super::*;

/// The x86 tiles of every integer kernel this CPU has against the scalar twins, for every
/// tile shape, and against each other bit for bit (their integer sums are exact): the
/// 256-bit tiles of both halves of a group (AVX2, AVX-VNNI) and the 512-bit tile of the
/// whole group (AVX512-VNNI).
#[test]
fn x86_tiles_match_scalar() {
    // AMX has its own test (`amx_tiles_match_wide_tiles`), on the hardware whether or not
    // it is asked for.
    let kernels: Vec<QKernel> = QKernel::ALL[1..]
        .iter()
        .copied()
        .filter(|&k| k != QKernel::Amx)
        .filter(|k| {
            let ran = k.available();
            let verdict = if ran {
                "RAN"
            } else {
                "SKIPPED (not on this CPU)"
            };
            eprintln!("x86_tiles_match_scalar: {}: {verdict}", k.name());
            ran
        })
        .collect();
    let mut r = rng(3);
    for v in variants() {
        for nb in [1, 2, 7, 8, 9, 18] {
            let k = cols_for(v.0, nb * QK);
            let w = variant_matrix(&mut r, v, GROUP, k);
            let x = rand_vec(&mut r, 8 * k);
            check_tiles(&kernels, &w, &x, &format!("{} nb={nb}", variant_name(v)));
        }
    }
    // Sums near the largest: Q4_K's top quants, scales and minima (every bit set but the
    // super-block scales) against activations that quantise to 127 or -127 at every
    // position, where the 16-bit partial sums (the 512-bit tile's half blocks, the 256-bit
    // tiles' chunks) come closest to overflowing; a whole block's sum would not fit.
    // (-128 arises only from inputs so small that every result underflows to zero.)
    let k = 2 * 256;
    let mut bytes = vec![0xFF; GROUP * k / 256 * 144];
    for block in bytes.chunks_exact_mut(144) {
        block[..2].copy_from_slice(&f16::from_f32(0.001).to_le_bytes());
        block[2..4].copy_from_slice(&f16::from_f32(0.0005).to_le_bytes());
    }
    let w = QuantMatrix::new(GgmlType::Q4_K, GROUP, k, bytes).unwrap();
    // Q6_K likewise: every quant 63 and every sub-block scale -128, so that no half
    // cancels another: the 512-bit tile's unsigned activations (up to 255), its quants
    // less 32 and its offsets at their largest, a super-block's sums within 2^29.
    let mut bytes = vec![0xFF; GROUP * k / 256 * 210];
    for block in bytes.chunks_exact_mut(210) {
        block[192..208].fill(0x80);
        block[208..].copy_from_slice(&f16::from_f32(0.001).to_le_bytes());
    }
    let w6 = QuantMatrix::new(GgmlType::Q6_K, GROUP, k, bytes).unwrap();
    for (sign, name) in [(1.0, "positive"), (-1.0, "negative")] {
        let x: Vec<f32> = (0..8 * k).map(|i| sign * (1.0 + (i / k) as f32)).collect();
        for (w, ty) in [(&w, "Q4_K"), (&w6, "Q6_K")] {
            check_tiles(
                &kernels,
                w,
                &x,
                &format!("{ty} at its largest sums, {name}"),
            );
        }
    }
}

/// Every tile of `kernels` (those this CPU has) on `w` and 8 rows of `x` against the scalar
/// twin, and the tiles of different kernels against each other, bit for bit.
fn check_tiles(kernels: &[QKernel], w: &QuantMatrix, x: &[f32], what: &str) {
    let mut want = vec![0.0; 8 * GROUP];
    matmul_quant_scalar(x, w, &mut want, 8);
    #[cfg(target_arch = "x86_64")]
    {
        let narrow: Vec<_> = [QKernel::Avx2, QKernel::AvxVnni]
            .into_iter()
            .filter(|k| kernels.contains(k))
            .map(|kernel| (kernel, check_group_tiles(kernel, w, x, &want, what)))
            .collect();
        for (kernel, t) in &narrow {
            assert_eq!(t, &narrow[0].1, "{what}: {} differs", kernel.name());
        }
        if kernels.contains(&QKernel::Avx512Vnni) {
            check_wide_tiles(w, x, &want, narrow.first().map(|n| &n.1), what);
        }
    }
}

/// The tiles of 1, 3, 4, 6 and 8 rows of both halves of group 0 against `want`, and each other,
/// and the tiles of 1, 2 and 3 rows of both halves at once (decoding's) against them;
/// returns the 4-row tiles' results, `[row][column]`.
#[cfg(target_arch = "x86_64")]
fn check_group_tiles(
    kernel: QKernel,
    w: &QuantMatrix,
    x: &[f32],
    want: &[f32],
    what: &str,
) -> [[f32; GROUP]; 4] {
    let xq = q8_rows(x, 8, w.cols(), w);
    let mut all = [[0.0; GROUP]; 4];
    for t in 0..2 {
        let what = format!("{} {what} half {t}", kernel.name());
        // SAFETY: the caller checked `kernel.available()`; w has group 0 (both halves), and
        // rows 0..8 of xq exist.
        let (one, three, four, six, eight) = unsafe {
            (
                avx2::tile_group::<1>(kernel, w, t, &xq, 2),
                avx2::tile_group::<3>(kernel, w, t, &xq, 1),
                avx2::tile_group::<4>(kernel, w, t, &xq, 0),
                avx2::tile_group::<6>(kernel, w, t, &xq, 2),
                avx2::tile_group::<8>(kernel, w, t, &xq, 0),
            )
        };
        for (i, row) in eight.iter().enumerate() {
            let at = i * GROUP + t * LANES;
            assert_close(row, &want[at..at + LANES], 1e-5, 1e-5, &what);
        }
        for (i, row) in four.iter().enumerate() {
            all[i][t * LANES..(t + 1) * LANES].copy_from_slice(row);
        }
        // Bit-for-bit the same whichever tile computed it: batch invariance.
        assert_eq!(eight[..4], four, "{what}");
        assert_eq!(six, eight[2..], "{what}");
        assert_eq!(one[0], four[2], "{what}");
        assert_eq!(three[0], four[1], "{what}");
        assert_eq!(three[2], four[3], "{what}");
    }
    // SAFETY: as above.
    let (one, two, three) = unsafe {
        (
            avx2::tile_pair::<1>(kernel, w, 0, &xq, 3),
            avx2::tile_pair::<2>(kernel, w, 0, &xq, 0),
            avx2::tile_pair::<3>(kernel, w, 0, &xq, 1),
        )
    };
    for t in 0..2 {
        let what = format!("{} {what} pair, half {t}", kernel.name());
        let half = |row: &[f32; GROUP]| -> [f32; LANES] {
            row[t * LANES..(t + 1) * LANES].try_into().unwrap()
        };
        assert_eq!(one[t][0], half(&all[3]), "{what}");
        assert_eq!(two[t], [half(&all[0]), half(&all[1])], "{what}");
        assert_eq!(
            three[t],
            [half(&all[1]), half(&all[2]), half(&all[3])],
            "{what}"
        );
    }
    all
}

/// The 512-bit tiles of 1, 3, 4 and 8 rows against the 256-bit ones' results (rows 0..4),
/// bit for bit, and against `want` (8 rows).
#[cfg(target_arch = "x86_64")]
fn check_wide_tiles(
    w: &QuantMatrix,
    x: &[f32],
    want: &[f32],
    narrow: Option<&[[f32; GROUP]; 4]>,
    what: &str,
) {
    let xq = q8_rows(x, 8, w.cols(), w);
    // SAFETY: the caller checked that the CPU has AVX512-VNNI (and -BW); w has group 0,
    // and rows 0..8 of xq exist.
    let (one, three, four, eight) = unsafe {
        (
            avx512::tile_group::<1>(w, 0, &xq, 2),
            avx512::tile_group::<3>(w, 0, &xq, 1),
            avx512::tile_group::<4>(w, 0, &xq, 0),
            avx512::tile_group::<8>(w, 0, &xq, 0),
        )
    };
    if let Some(narrow) = narrow {
        assert_eq!(&four, narrow, "512-bit {what}");
    }
    if w.ty() == GgmlType::Q6_K && !w.keeps_block_activation_scales() {
        // The tile for unsigned activations (many-row products), bit for bit.
        let mut uq = q8_rows(x, 8, w.cols(), w);
        uq.make_unsigned();
        // SAFETY: as above.
        let unsigned = unsafe {
            (
                avx512::tile_group::<1>(w, 0, &uq, 2),
                avx512::tile_group::<3>(w, 0, &uq, 1),
                avx512::tile_group::<4>(w, 0, &uq, 0),
                avx512::tile_group::<8>(w, 0, &uq, 0),
            )
        };
        assert!(
            unsigned == (one, three, four, eight),
            "512-bit unsigned {what}"
        );
    }
    assert_eq!(one[0], four[2], "512-bit {what}");
    assert_eq!(three, [four[1], four[2], four[3]], "512-bit {what}");
    assert_eq!(eight[..4], four, "512-bit {what}");
    for (i, row) in eight.iter().enumerate() {
        let at = i * GROUP;
        assert_close(
            row,
            &want[at..at + GROUP],
            1e-5,
            1e-5,
            &format!("512-bit {what}"),
        );
    }
}

/// The AMX tiles (16 rows) against the 512-bit tiles, bit for bit (the same exact
/// integer sums, then the same float steps), and against the scalar twin, for every format
/// and both groups of a matrix.
#[test]
fn amx_tiles_match_wide_tiles() {
    // The hardware, not the opt-in: the tiles must stay right wherever they could run.
    let ran = crate::amx::available() && QKernel::Avx512Vnni.available();
    eprintln!(
        "amx_tiles_match_wide_tiles: {}: {}",
        QKernel::Amx.name(),
        if ran {
            "RAN"
        } else {
            "SKIPPED (not on this CPU)"
        }
    );
    if !ran {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        const M: usize = 40;
        let mut r = rng(9);
        // K-quants with shared activation scales run on the 512-bit tiles even where
        // AMX is asked for (the whole products below check that).
        for v in variants() {
            let ty = v.0;
            for nb in [1, 2, 7, 8, 9, 18] {
                let k = cols_for(ty, nb * QK);
                let w = variant_matrix(&mut r, v, 2 * GROUP, k);
                if !amx::takes(&w) {
                    break;
                }
                let x = rand_vec(&mut r, M * k);
                let mut want = vec![0.0; M * 2 * GROUP];
                matmul_quant_scalar(&x, &w, &mut want, M);
                let xq = q8_rows(&x, M, k, &w);
                let what = format!("AMX {} nb={nb}", variant_name(v));
                for g in 0..2 {
                    // SAFETY: AMX (with AVX512-VNNI) is available; w has groups 0 and 1,
                    // and rows 0..40 of xq exist.
                    let (wide, tiles) = unsafe {
                        let wide: Vec<[f32; GROUP]> = (0..M)
                            .step_by(8)
                            .flat_map(|i| avx512::tile_group::<8>(&w, g, &xq, i))
                            .collect();
                        let tiles = amx::Tiles::new(ty);
                        let mut unpacked = amx::GroupTiles::default();
                        let bq = unpacked.unpack(&w, g);
                        let amx: Vec<_> = [0, 16, 24]
                            .map(|i| amx::tile_group(&tiles, &w, g, bq, &xq, i))
                            .into();
                        (wide, amx)
                    };
                    for (t, i) in [0, 16, 24].into_iter().enumerate() {
                        assert_eq!(
                            tiles[t][..],
                            wide[i..i + 16],
                            "{what} group {g}, rows {i}.."
                        );
                    }
                    for (i, row) in wide.iter().enumerate() {
                        let at = i * 2 * GROUP + g * GROUP;
                        assert_close(row, &want[at..at + GROUP], 1e-5, 1e-5, &what);
                    }
                }
            }
        }
    }
    // The whole product through each kernel: AMX's chunks of rows and its VNNI tails.
    let mut r = rng(10);
    for v in variants() {
        let ty = v.0;
        // k = 16,384: chunks of 64 rows (AMX_X_BYTES), the last with a VNNI tail.
        for (m, k, n) in [(16, 64, 50), (47, 256, 33), (150, 96, 40), (150, 16384, 20)] {
            let k = cols_for(ty, k);
            let w = variant_matrix(&mut r, v, n, k);
            let x = rand_vec(&mut r, m * k);
            let xq = q8_rows(&x, m, k, &w);
            let [amx, vnni] = [QKernel::Amx, QKernel::Avx512Vnni].map(|kernel| {
                let mut out = vec![0.0; m * n];
                dot_rows(&xq, &w, SendPtr(out.as_mut_ptr()), m, 0, n, kernel);
                out
            });
            assert_eq!(
                amx,
                vnni,
                "AMX {} m={m} k={k} n={n}: whole product",
                variant_name(v)
            );
        }
    }
}
