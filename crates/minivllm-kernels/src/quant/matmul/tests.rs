use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

use super::*;
use crate::quant;
use crate::quant::activations::{self, RowSums};
use crate::quant::reference as qdot;
use crate::testutil::*;

const TYPES: [GgmlType; 9] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
];

/// How the products can run: every format (the K-quants with one activation scale per
/// super-block), then the K-quants keeping one per block
/// (`QuantMatrix::keep_block_activation_scales`).
fn variants() -> impl Iterator<Item = (GgmlType, bool)> {
    TYPES.into_iter().map(|ty| (ty, false)).chain([
        (GgmlType::Q4_K, true),
        (GgmlType::Q5_K, true),
        (GgmlType::Q6_K, true),
    ])
}

/// [`random_matrix`] of a [`variants`] entry.
fn variant_matrix(
    rng: &mut StdRng,
    (ty, block_activations): (GgmlType, bool),
    rows: usize,
    cols: usize,
) -> QuantMatrix {
    let mut w = random_matrix(rng, ty, rows, cols);
    if block_activations {
        w.keep_block_activation_scales();
    }
    w
}

/// How a test names a [`variants`] entry.
fn variant_name((ty, block_activations): (GgmlType, bool)) -> String {
    if block_activations {
        format!("{ty} (block activation scales)")
    } else {
        ty.to_string()
    }
}

/// `rows × cols` random weights of `ty`: random scales and quants, as a file could hold.
fn random_matrix(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> QuantMatrix {
    QuantMatrix::new(ty, rows, cols, random_bytes(rng, ty, rows, cols)).unwrap()
}

/// The bytes of [`random_matrix`]. K-quant blocks are random bytes but for their f16
/// scales, so every bit of the packed quants and sub-block scales is exercised.
fn random_bytes(rng: &mut StdRng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let mut data = Vec::new();
    if kquants::is_kquant(ty) {
        for _ in 0..rows * cols / ty.block_size() {
            let mut b: Vec<u8> = (0..ty.type_size()).map(|_| rng.random()).collect();
            let scales: &[usize] = if ty == GgmlType::Q6_K {
                &[208]
            } else {
                &[0, 2]
            };
            for &at in scales {
                let v = f16::from_f32(rng.random_range(0.0002f32..0.002));
                b[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
            data.extend(b);
        }
        return data;
    }
    if ty == GgmlType::MXFP4 {
        // E8M0 scales around gpt-oss's (2^-18 to 2^-3), random codes.
        for _ in 0..rows * cols / QK {
            data.push(rng.random_range(110u8..=125));
            data.extend((0..QK / 2).map(|_| rng.random::<u8>()));
        }
        return data;
    }
    for _ in 0..rows * cols / QK {
        let d = f16::from_f32(rng.random_range(0.001f32..0.05));
        data.extend_from_slice(&d.to_le_bytes());
        let offset = matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1);
        if offset {
            let m = f16::from_f32(rng.random_range(-0.4f32..0.1));
            data.extend_from_slice(&m.to_le_bytes());
        }
        let quants = ty.type_size() - if offset { 4 } else { 2 };
        data.extend((0..quants).map(|_| rng.random::<u8>()));
    }
    data
}

/// Weight columns that are whole blocks of `ty`, close to `k`.
fn cols_for(ty: GgmlType, k: usize) -> usize {
    k.next_multiple_of(ty.block_size())
}

fn dequantized(w: &QuantMatrix) -> Vec<f32> {
    let mut out = vec![0.0; w.rows() * w.cols()];
    for (r, row) in out.chunks_exact_mut(w.cols()).enumerate() {
        w.dequantize_row(r, row);
    }
    out
}

#[test]
fn quantize_row_q8_follows_ggml() {
    let mut x: Vec<f32> = (0..32).map(|i| (i as f32 - 10.0) * 0.1).collect();
    x[5] = -2.54; // the largest magnitude: its quant is -127
    let mut q = [BlockQ8::default()];
    qdot::quantize_row_q8(&x, &mut q);
    let d = 2.54f32 / 127.0;
    assert_eq!(q[0].d, f16::from_f32(d).to_f32());
    assert_eq!(q[0].qs[5], -127);
    for (j, &v) in x.iter().enumerate() {
        assert_eq!(q[0].qs[j], (v / d).round() as i8, "element {j}");
    }
    let sum: i32 = q[0].qs.iter().map(|&v| v as i32).sum();
    assert_eq!(q[0].s, sum as f32 * q[0].d);
    // An all-zero block has d = 0 and zero quants, not NaN.
    qdot::quantize_row_q8(&[0.0; 32], &mut q);
    assert_eq!(q[0], BlockQ8::default());
}

/// The vector activation quantisers against `quantize_block`, bit for bit: random blocks,
/// exact ties (`amax` = 127 makes the scale 1, so x.5 values must round away from zero as
/// `roundf` does), zero, subnormal and non-finite blocks.
#[test]
fn vector_quantisers_match_scalar_bit_for_bit() {
    use activations::{quantize_row, QuantIsa};
    let best = QuantIsa::best();
    for (isa, ran) in [
        (QuantIsa::Avx2, best != QuantIsa::Scalar),
        (QuantIsa::Avx512, best == QuantIsa::Avx512),
    ] {
        let verdict = if ran {
            "RAN"
        } else {
            "SKIPPED (not on this CPU)"
        };
        eprintln!("vector_quantisers_match_scalar_bit_for_bit: {isa:?}: {verdict}");
        if ran {
            for share in [1, KSUB] {
                // SAFETY: `isa` is `best` or lower; check_quantiser passes whole rows.
                check_quantiser(isa, share, |x, qs, sums| unsafe {
                    quantize_row(x, qs, sums, share, isa)
                });
            }
        }
    }
}

fn check_quantiser(
    isa: activations::QuantIsa,
    share: usize,
    quantize: impl Fn(&[f32], &mut [i8], RowSums),
) {
    let mut r = rng(11);
    let mut x = rand_vec(&mut r, 40 * QK);
    for (t, v) in x[..QK].iter_mut().enumerate() {
        *v = t as f32 - 15.5; // ties, both signs
    }
    x[0] = 127.0;
    x[QK..2 * QK].fill(0.0);
    x[2 * QK..3 * QK].fill(1e-40);
    x[3 * QK + 4] = f32::NAN;
    x[4 * QK + 9] = f32::INFINITY;
    for (t, v) in x[5 * QK..6 * QK].iter_mut().enumerate() {
        *v *= 10f32.powi(t as i32 % 7 - 3);
    }
    let nb = x.len() / QK;
    let mut qs = vec![0i8; nb * QK];
    let (mut d, mut s, mut offsets) = (vec![0.0; nb], vec![0.0; nb], vec![[0; 2]; nb]);
    let (mut qsum, mut half_sums) = (vec![0; nb], vec![[0; 2]; nb]);
    let sums = RowSums {
        d: &mut d,
        s: &mut s,
        offsets: &mut offsets,
        qsum: &mut qsum,
        half_sums: &mut half_sums,
    };
    quantize(&x, &mut qs, sums);
    let mut blocks = vec![BlockQ8::default(); nb];
    qdot::quantize_row_q8_shared(&x, &mut blocks, share);
    if share == 1 {
        for (b, xb) in x.chunks_exact(QK).enumerate() {
            let want = qdot::quantize_block(xb);
            let got = &blocks[b];
            let bits = |q: &BlockQ8| (q.qs, q.d.to_bits(), q.s.to_bits());
            assert_eq!(bits(got), bits(&want), "block {b}");
        }
    }
    for (b, want) in blocks.iter().enumerate() {
        let what = format!("{isa:?} share {share} block {b}");
        assert_eq!(&qs[b * QK..(b + 1) * QK], &want.qs, "{what} quants");
        assert_eq!(d[b].to_bits(), want.d.to_bits(), "{what} scale");
        assert_eq!(s[b].to_bits(), want.s.to_bits(), "{what} sum");
        let half = |h: usize| -> i32 {
            want.qs[h * 16..(h + 1) * 16]
                .iter()
                .map(|&q| q as i32)
                .sum()
        };
        assert_eq!(
            offsets[b],
            [-32 * half(0), -32 * half(1)],
            "{what} half offsets"
        );
        assert_eq!(qsum[b] as i32, half(0) + half(1), "{what} sum of quants");
        assert_eq!(
            half_sums[b].map(i32::from),
            [half(0), half(1)],
            "{what} half sums"
        );
        if share > 1 {
            assert_eq!(
                want.d,
                blocks[b / share * share].d,
                "{what}: one scale per run"
            );
        }
    }
    if share == 1 {
        assert_eq!(qs[1], -15, "-14.5 rounds away from zero");
        assert_eq!(qs[2], -14, "-13.5 rounds away from zero");
        assert_eq!(qs[17], 2, "1.5 rounds away from zero");
    }
}

#[test]
fn q8_0_bytes_round_trip_through_the_dequantiser() {
    let mut r = rng(1);
    let x = rand_vec(&mut r, 96);
    let bytes = qdot::quantize_q8_0(&x);
    assert_eq!(bytes.len(), 3 * 34);
    let mut back = vec![0.0; 96];
    quant::dequantize(GgmlType::Q8_0, &bytes, &mut back).unwrap();
    // Half a quantisation step of the block's scale (about 1/254 of its largest value).
    assert_close(&back, &x, 1.0 / 254.0 + 1e-3, 0.0, "q8_0 round trip");
}

/// `quantize_to` writes blocks that dequantise to within half a step of the input (Q4_1,
/// Q5_1: of the block's range in 15 or 31 steps; Q4_0, Q5_0: a whole step on the side
/// opposite the largest magnitude, whose range ends a step short), and refuses partial
/// blocks and types without a quantiser.
#[test]
fn four_and_five_bit_quantisers_round_trip_within_half_a_step() {
    let mut r = rng(7);
    let mut x = rand_vec(&mut r, 8 * QK);
    x[40] = 3.0;
    x[64..96].fill(0.0);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
    ] {
        let bytes = qdot::quantize_to(ty, &x).unwrap();
        assert_eq!(bytes.len(), 8 * ty.type_size());
        let mut back = vec![0.0; x.len()];
        quant::dequantize(ty, &bytes, &mut back).unwrap();
        for (b, (y, xb)) in back.chunks(QK).zip(x.chunks(QK)).enumerate() {
            let hi = xb.iter().fold(f32::MIN, |a, &v| a.max(v));
            let lo = xb.iter().fold(f32::MAX, |a, &v| a.min(v));
            let amax = hi.abs().max(lo.abs());
            let tol = match ty {
                GgmlType::Q4_0 => amax / 8.0,
                GgmlType::Q5_0 => amax / 16.0,
                GgmlType::Q4_1 => (hi - lo) / 30.0,
                _ => (hi - lo) / 62.0,
            };
            assert_close(y, xb, tol + 2e-3 * amax, 0.0, &format!("{ty} block {b}"));
        }
        assert!(back[64..96].iter().all(|&v| v == 0.0), "{ty}: zero block");
    }
    assert_eq!(qdot::quantize_to(GgmlType::Q4_0, &x[..40]), None);
    assert_eq!(qdot::quantize_to(GgmlType::Q3_K, &[0.0; 256]), None);
}

/// MXFP4's scales are kept as f16s where that is exact (2^-24 to 2^15); a block of zeros
/// needs none, whatever its byte says; any other scale is refused, naming the row.
#[test]
fn mxfp4_scales_beyond_f16_are_refused() {
    let block = |e: u8, q: u8| [[e].as_slice(), &[q; QK / 2]].concat();
    // Codes 0 and 8 are +0 and -0.
    let zeros = [block(0, 0x80), block(104, 0x71), block(143, 0x17)].concat();
    let w = QuantMatrix::new(GgmlType::MXFP4, 1, 3 * QK, zeros).unwrap();
    let mut row = vec![1.0; 3 * QK];
    w.dequantize_row(0, &mut row);
    assert!(row[..QK].iter().all(|&v| v == 0.0));
    // Code 1 is 0.5: doubled, times the halved scale 2^(e - 128).
    assert_eq!(row[QK], 2f32.powi(-24));
    assert_eq!(row[2 * QK + QK / 2], 2f32.powi(15));
    for (e, exponent) in [(103u8, -25), (144, 16), (255, 127)] {
        let bad = [block(120, 0x11), block(e, 0x11)].concat();
        let err = QuantMatrix::new(GgmlType::MXFP4, 2, QK, bad).unwrap_err();
        assert_eq!(err, QuantMatrixError::ScaleRange { row: 1, exponent });
    }
}

/// ggml's MXFP4 quantiser: each block's scale from its largest magnitude, each value the
/// nearest code, so a value lands within half a gap of the grid (the largest gap, 8 to 12,
/// is 4 steps of the halved scale) or is clipped to ±12 steps (at most 4 beyond).
#[test]
fn mxfp4_quantiser_picks_the_nearest_code() {
    let mut r = rng(9);
    let x: Vec<f32> = rand_vec(&mut r, 8 * QK).iter().map(|v| v * 0.05).collect();
    let bytes = qdot::quantize_to(GgmlType::MXFP4, &x).unwrap();
    assert_eq!(bytes.len(), 8 * 17);
    let mut back = vec![0.0; x.len()];
    quant::dequantize(GgmlType::MXFP4, &bytes, &mut back).unwrap();
    for (b, (xb, yb)) in x.chunks(QK).zip(back.chunks(QK)).enumerate() {
        let d = 2f32.powi(i32::from(bytes[b * 17]) - 128);
        for (&v, &y) in xb.iter().zip(yb) {
            let nearest = [0.0f32, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]
                .iter()
                .flat_map(|&k| [k * d, -k * d])
                .map(|g| (g - v).abs())
                .fold(f32::INFINITY, f32::min);
            assert_eq!((y - v).abs(), nearest, "block {b}: {v} -> {y}");
        }
    }
}

#[test]
fn weights_keep_their_bytes_and_values() {
    let mut r = rng(6);
    for ty in TYPES {
        let cols = cols_for(ty, 9 * QK);
        let bytes = random_bytes(&mut r, ty, 3, cols);
        let w = QuantMatrix::new(ty, 3, cols, bytes.clone()).unwrap();
        let mut want = vec![0.0f32; 3 * cols];
        quant::dequantize(ty, &bytes, &mut want).unwrap();
        // The split layout holds the file's bytes, and no more than them but for padding
        // rows to a whole GROUP (and K-quants' sub-block scales, a byte each, where the
        // file packs them in 6 bits).
        let back: Vec<u8> = (0..3).flat_map(|j| w.row_blocks(j)).collect();
        assert!(
            back == bytes,
            "{ty}: row_blocks differ from the file's bytes"
        );
        let limit = bytes.len() / 3 * GROUP + GROUP * 32;
        assert!(w.nbytes() <= limit, "{ty}: {} > {limit}", w.nbytes());
        // Row dequantisation agrees with ggml's bit for bit.
        let got = dequantized(&w);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{ty}"
        );
    }
}

/// The scalar formulas equal the dot product of the dequantised operands: the integer
/// sums and scales are the same numbers, regrouped.
#[test]
fn scalar_dot_equals_dot_of_dequantised_blocks() {
    let mut r = rng(2);
    for ty in TYPES {
        let k = cols_for(ty, 8 * QK);
        let w = random_matrix(&mut r, ty, 3, k);
        let x = rand_vec(&mut r, k);
        let mut xq = vec![BlockQ8::default(); k / QK];
        qdot::quantize_row_q8(&x, &mut xq);
        let xd: Vec<f32> = xq
            .iter()
            .flat_map(|b| b.qs.map(|q| q as f32 * b.d))
            .collect();
        let wd = dequantized(&w);
        for j in 0..3 {
            let want: f64 = wd[j * k..(j + 1) * k]
                .iter()
                .zip(&xd)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum();
            let got = qdot::vec_dot_scalar(ty, &w.row_blocks(j), &xq);
            assert!(
                (got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                "{ty} row {j}: {got} vs {want}"
            );
        }
    }
}

/// Quantises `x` (`m` rows of `k`) as `matmul_quant` does.
fn q8_rows(x: &[f32], m: usize, k: usize, w: &QuantMatrix) -> Q8Rows {
    let mut q = Q8Rows::default();
    q.quantize(x, m, k / QK, activations::shared_blocks(w));
    q
}

mod tiles;

/// The product (AVX2 where present) and the portable path against the single-threaded
/// reference, on odd shapes.
#[test]
fn matmul_quant_matches_reference_on_odd_shapes() {
    let mut r = rng(4);
    for v in variants() {
        let (ty, name) = (v.0, variant_name(v));
        for (m, k, n) in [
            (1, 32, 1),
            (2, 96, 67),
            (5, 224, 131),
            (7, 576, 200),
            (31, 64, 300),
            (70, 160, 50),
        ] {
            let k = cols_for(ty, k);
            let w = variant_matrix(&mut r, v, n, k);
            let x = rand_vec(&mut r, m * k);
            let mut want = vec![0.0; m * n];
            matmul_quant_scalar(&x, &w, &mut want, m);
            let mut got = vec![0.0; m * n];
            matmul_quant(&x, &w, &mut got, m);
            let what = format!("{name} m={m} k={k} n={n}");
            assert_close(&got, &want, 1e-4, 1e-4, &what);
            // The portable path, whatever the CPU.
            let xq = q8_rows(&x, m, k, &w);
            let mut portable = vec![0.0; m * n];
            dot_rows(
                &xq,
                &w,
                SendPtr(portable.as_mut_ptr()),
                m,
                0,
                n,
                QKernel::Portable,
            );
            assert_close(&portable, &want, 1e-5, 1e-5, &format!("portable {what}"));
        }
    }
}

/// A row's result is bit-for-bit the same whatever rows are batched with it: the engine's
/// batch invariance rests on this.
#[test]
fn each_row_is_independent_of_the_batch() {
    let mut r = rng(5);
    for v in variants() {
        let (k, n) = (cols_for(v.0, 192), 37);
        let w = variant_matrix(&mut r, v, n, k);
        let x = rand_vec(&mut r, 70 * k);
        let mut batch = vec![0.0; 70 * n];
        matmul_quant(&x, &w, &mut batch, 70);
        for i in [0, 3, 5, 64, 69] {
            let mut alone = vec![0.0; n];
            matmul_quant(&x[i * k..(i + 1) * k], &w, &mut alone, 1);
            let same = alone
                .iter()
                .zip(&batch[i * n..])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{}: row {i} alone differs from the batch of 70",
                variant_name(v)
            );
        }
    }
}

#[test]
fn bad_matrices_are_refused() {
    assert_eq!(
        QuantMatrix::new(GgmlType::Q3_K, 1, 256, vec![0; 110]),
        Err(QuantMatrixError::Unsupported(GgmlType::Q3_K))
    );
    assert!(matches!(
        QuantMatrix::new(GgmlType::Q4_K, 1, 288, vec![0; 162]),
        Err(QuantMatrixError::PartialRow { .. })
    ));
    assert!(matches!(
        QuantMatrix::new(GgmlType::Q8_0, 1, 40, vec![0; 68]),
        Err(QuantMatrixError::PartialRow { .. })
    ));
    assert!(matches!(
        QuantMatrix::new(GgmlType::Q8_0, 2, 32, vec![0; 34]),
        Err(QuantMatrixError::Size { .. })
    ));
}

/// A source consumed in runs from its last rows back (as large matrices are, to free it as
/// it is read) gives the matrix a single pass gives, for every block family.
#[test]
fn a_source_consumed_in_runs_gives_the_same_matrix() {
    let (rows, cols, m) = (37, 512, 3);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let x: Vec<f32> = (0..m * cols)
        .map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0)
        .collect();
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let blocks = crate::qdot::quantize_to(ty, &w).unwrap();
        let row_bytes = blocks.len() / rows;
        let whole = QuantMatrix::new(ty, rows, cols, blocks.clone()).unwrap();
        // Runs of 5 rows: the first run (rows 0..2) is a short one.
        let runs = QuantMatrix::consuming(ty, rows, cols, blocks, 5 * row_bytes).unwrap();
        let (mut a, mut b) = (vec![0.0; m * rows], vec![0.0; m * rows]);
        matmul_quant(&x, &whole, &mut a, m);
        matmul_quant(&x, &runs, &mut b, m);
        assert_eq!(a, b, "{ty:?}");
        let (mut ra, mut rb) = (vec![0.0; cols], vec![0.0; cols]);
        for r in 0..rows {
            whole.dequantize_row(r, &mut ra);
            runs.dequantize_row(r, &mut rb);
            assert_eq!(ra, rb, "{ty:?} row {r}");
        }
    }
}

/// Groups of rows against their own weights in one parallel loop give, to the bit, what
/// each group's own `matmul_quant` gives; empty groups are skipped. Weights of different
/// formats in one call, as a layer's experts may be stored.
#[test]
fn grouped_products_equal_each_groups_own_product() {
    let mut r = rng(6);
    let (k, n) = (256, 300);
    let types = [
        (GgmlType::Q4_K, false),
        (GgmlType::Q6_K, false),
        (GgmlType::Q8_0, false),
        (GgmlType::Q4_0, false),
        (GgmlType::Q5_K, false),
        (GgmlType::Q4_K, true),
    ];
    let weights: Vec<QuantMatrix> = types
        .iter()
        .map(|&v| variant_matrix(&mut r, v, n, k))
        .collect();
    // (Q6_K's second group takes 8 rows and more in one call: its unsigned tile.)
    for sizes in [
        [3, 0, 1, 9, 2, 4],
        [0, 0, 1, 0, 0, 0],
        [70, 1, 0, 0, 5, 33],
        [2, 12, 0, 1, 0, 9],
    ] {
        let offsets: Vec<usize> = std::iter::once(0)
            .chain(sizes.iter().scan(0, |acc, &s| {
                *acc += s;
                Some(*acc)
            }))
            .collect();
        let rows = offsets[sizes.len()];
        let x = rand_vec(&mut r, rows * k);
        let mut got = vec![f32::NAN; rows * n];
        matmul_quant_grouped(&x, &mut got, &offsets, k, n, &|g| &weights[g]);
        for (g, w) in weights.iter().enumerate() {
            let (r0, r1) = (offsets[g], offsets[g + 1]);
            let mut want = vec![0.0; (r1 - r0) * n];
            matmul_quant(&x[r0 * k..r1 * k], w, &mut want, r1 - r0);
            let same = want
                .iter()
                .zip(&got[r0 * n..r1 * n])
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "group {g} ({}) of {sizes:?}", variant_name(types[g]));
        }
    }
}
