//! The two small products of one KV block, in layouts that need no horizontal sums: scores
//! `Q · Kᵀ` against the block's keys stored transposed (`[head_dim, block_size]`), and
//! `acc += P · V` against its values (`[block_size, head_dim]`).
//!
//! Each output element is one chain of multiply-adds in a fixed order (over `head_dim` for a
//! score, over the block's keys for an accumulator), whatever the neighbouring rows and
//! columns, so a row's result does not depend on how many rows share the call.

use super::cache::Load;
use crate::simd::Simd;

/// Query rows per register tile.
const R: usize = 4;

/// `scores[r·ld + j] = Σ_d q[r·hd + d] · kt[d·bs + j]` for every row of `q` and `j < bs`.
#[inline(always)]
pub(super) fn qk<S: Simd, T: Load>(
    s: S,
    q: &[f32],
    kt: &[T],
    scores: &mut [f32],
    (hd, bs, ld): (usize, usize, usize),
) {
    let rows = q.len() / hd;
    assert!(
        bs <= ld && kt.len() >= hd * bs && scores.len() + ld >= rows * ld + bs,
        "attention: qk operands too short"
    );
    for r in (0..rows).step_by(R) {
        let (q, sc) = (&q[r * hd..], &mut scores[r * ld..]);
        match R.min(rows - r) {
            4 => qk_rows::<S, T, 4>(s, q, kt, sc, hd, bs, ld),
            3 => qk_rows::<S, T, 3>(s, q, kt, sc, hd, bs, ld),
            2 => qk_rows::<S, T, 2>(s, q, kt, sc, hd, bs, ld),
            _ => qk_rows::<S, T, 1>(s, q, kt, sc, hd, bs, ld),
        }
    }
}

#[inline(always)]
fn qk_rows<S: Simd, T: Load, const N: usize>(
    s: S,
    q: &[f32],
    kt: &[T],
    scores: &mut [f32],
    hd: usize,
    bs: usize,
    ld: usize,
) {
    assert!(q.len() >= N * hd && scores.len() >= (N - 1) * ld + bs && kt.len() >= hd * bs);
    let l = S::LANES;
    let mut c = 0;
    while c + 2 * l <= bs {
        qk_tile::<S, T, N, 2>(s, q, kt, scores, (hd, bs, ld), c);
        c += 2 * l;
    }
    if c + l <= bs {
        qk_tile::<S, T, N, 1>(s, q, kt, scores, (hd, bs, ld), c);
        c += l;
    }
    for j in c..bs {
        for i in 0..N {
            let mut sum = 0.0;
            for d in 0..hd {
                sum += q[i * hd + d] * kt[d * bs + j].to_f32();
            }
            scores[i * ld + j] = sum;
        }
    }
}

/// Columns `c..c + V·LANES` of [`qk_rows`].
#[inline(always)]
fn qk_tile<S: Simd, T: Load, const N: usize, const V: usize>(
    s: S,
    q: &[f32],
    kt: &[T],
    scores: &mut [f32],
    (hd, bs, ld): (usize, usize, usize),
    c: usize,
) {
    let l = S::LANES;
    debug_assert!(c + V * l <= bs);
    let (qp, kp, op) = (q.as_ptr(), kt.as_ptr(), scores.as_mut_ptr());
    let mut acc = [[s.zero(); V]; N];
    // SAFETY (all accesses): i < N and d < hd stay inside the N rows of `q`; d·bs + c + V·l
    // <= hd·bs inside `kt`; i·ld + c + V·l <= (N - 1)·ld + bs inside `scores` (asserted by
    // the caller).
    for d in 0..hd {
        let mut kv = [s.zero(); V];
        for (v, kv) in kv.iter_mut().enumerate() {
            // SAFETY: in bounds, as the comment at the top of this function's loops says.
            *kv = unsafe { T::load(s, kp.wrapping_add(d * bs + c + v * l)) };
        }
        for (i, acc) in acc.iter_mut().enumerate() {
            // SAFETY: in bounds, as the comment at the top of this function's loops says.
            let qv = s.splat(unsafe { *qp.wrapping_add(i * hd + d) });
            for v in 0..V {
                acc[v] = s.fma(qv, kv[v], acc[v]);
            }
        }
    }
    for (i, acc) in acc.iter().enumerate() {
        for (v, &a) in acc.iter().enumerate() {
            // SAFETY: in bounds, as the comment at the top of this function's loops says.
            unsafe { s.store(op.wrapping_add(i * ld + c + v * l), a) };
        }
    }
}

/// `acc[r·hd + x] += Σ_{j<n} p[r·ld + j] · v[j·hd + x]` for every row of `acc`.
#[inline(always)]
pub(super) fn pv<S: Simd, T: Load>(
    s: S,
    acc: &mut [f32],
    p: &[f32],
    v: &[T],
    n: usize,
    hd: usize,
    ld: usize,
) {
    let rows = acc.len() / hd;
    assert!(
        p.len() + ld >= rows * ld + n && v.len() >= n * hd,
        "attention: pv operands too short"
    );
    for r in (0..rows).step_by(R) {
        let (a, p) = (&mut acc[r * hd..], &p[r * ld..]);
        match R.min(rows - r) {
            4 => pv_rows::<S, T, 4>(s, a, p, v, n, hd, ld),
            3 => pv_rows::<S, T, 3>(s, a, p, v, n, hd, ld),
            2 => pv_rows::<S, T, 2>(s, a, p, v, n, hd, ld),
            _ => pv_rows::<S, T, 1>(s, a, p, v, n, hd, ld),
        }
    }
}

#[inline(always)]
fn pv_rows<S: Simd, T: Load, const N: usize>(
    s: S,
    acc: &mut [f32],
    p: &[f32],
    v: &[T],
    n: usize,
    hd: usize,
    ld: usize,
) {
    assert!(acc.len() >= N * hd && p.len() >= (N - 1) * ld + n && v.len() >= n * hd);
    let l = S::LANES;
    let mut c = 0;
    // Two vectors of columns: with four rows that is 8 accumulators, which fit the 16
    // registers of AVX2 with room for the loads (four vectors spill).
    while c + 2 * l <= hd {
        pv_tile::<S, T, N, 2>(s, acc, p, v, n, hd, ld, c);
        c += 2 * l;
    }
    if c + l <= hd {
        pv_tile::<S, T, N, 1>(s, acc, p, v, n, hd, ld, c);
        c += l;
    }
    for x in c..hd {
        for i in 0..N {
            let mut a = acc[i * hd + x];
            for j in 0..n {
                a += p[i * ld + j] * v[j * hd + x].to_f32();
            }
            acc[i * hd + x] = a;
        }
    }
}

/// Columns `c..c + V·LANES` of [`pv_rows`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn pv_tile<S: Simd, T: Load, const N: usize, const V: usize>(
    s: S,
    acc: &mut [f32],
    p: &[f32],
    v: &[T],
    n: usize,
    hd: usize,
    ld: usize,
    c: usize,
) {
    let l = S::LANES;
    debug_assert!(c + V * l <= hd);
    let (ap, pp, vp) = (acc.as_mut_ptr(), p.as_ptr(), v.as_ptr());
    // SAFETY (all accesses): i < N rows of `acc` with c + V·l <= hd; j < n rows of `v`;
    // i·ld + j < (N - 1)·ld + n inside `p` (asserted by the caller).
    let mut a = [[s.zero(); V]; N];
    for (i, a) in a.iter_mut().enumerate() {
        for (x, a) in a.iter_mut().enumerate() {
            // SAFETY: in bounds, as the comment at the top of this function's loops says.
            *a = unsafe { s.load(ap.wrapping_add(i * hd + c + x * l)) };
        }
    }
    for j in 0..n {
        let mut vv = [s.zero(); V];
        for (x, vv) in vv.iter_mut().enumerate() {
            // SAFETY: in bounds, as the comment at the top of this function's loops says.
            *vv = unsafe { T::load(s, vp.wrapping_add(j * hd + c + x * l)) };
        }
        for (i, a) in a.iter_mut().enumerate() {
            // SAFETY: in bounds, as the comment at the top of this function's loops says.
            let pj = s.splat(unsafe { *pp.wrapping_add(i * ld + j) });
            for x in 0..V {
                a[x] = s.fma(pj, vv[x], a[x]);
            }
        }
    }
    for (i, a) in a.iter().enumerate() {
        for (x, &a) in a.iter().enumerate() {
            // SAFETY: in bounds, as the comment at the top of this function's loops says.
            unsafe { s.store(ap.wrapping_add(i * hd + c + x * l), a) };
        }
    }
}
