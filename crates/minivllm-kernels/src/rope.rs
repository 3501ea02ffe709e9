//! Rotary position embedding, GPT-NeoX style (rotate-half), as Hugging Face LLaMA applies it.

use crate::simd::{simd_dispatch, Simd};

/// Rotates the first `rot_dim` dims of every head of `x` (`[num_tokens, num_heads, head_dim]`)
/// in place. `cos_sin_cache` is `[max_position, rot_dim]`: for each position, `rot_dim / 2`
/// cosines followed by `rot_dim / 2` sines (vLLM's layout). `positions[t]` is token t's position.
pub fn rotary_embedding_neox(
    positions: &[usize],
    x: &mut [f32],
    num_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    cos_sin_cache: &[f32],
) {
    check_shapes(positions, x, num_heads, head_dim, rot_dim, cos_sin_cache);
    rope_dispatch(positions, x, num_heads, head_dim, rot_dim, cos_sin_cache);
}

simd_dispatch! {
    fn rope_dispatch(
        positions: &[usize],
        x: &mut [f32],
        num_heads: usize,
        head_dim: usize,
        rot_dim: usize,
        cos_sin_cache: &[f32],
    );
    generic = rope_generic;
    avx512 = crate::simd::Avx2;
    scalar = rotary_embedding_neox_scalar;
}

#[inline(always)]
fn rope_generic<S: Simd>(
    s: S,
    positions: &[usize],
    x: &mut [f32],
    num_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    cos_sin_cache: &[f32],
) {
    // A loop over an iterator, not a callback: a closure would be compiled without the
    // caller's target features.
    for (x1, x2, cos, sin) in halves(positions, x, num_heads, head_dim, rot_dim, cos_sin_cache) {
        let n = x1.len();
        let mut i = 0;
        while i + S::LANES <= n {
            // SAFETY: i + LANES <= n, the length of all four slices.
            unsafe {
                let (p1, p2) = (
                    x1.as_mut_ptr().wrapping_add(i),
                    x2.as_mut_ptr().wrapping_add(i),
                );
                let (a, b) = (s.load(p1), s.load(p2));
                let c = s.load(cos.as_ptr().wrapping_add(i));
                let sn = s.load(sin.as_ptr().wrapping_add(i));
                s.store(p1, s.sub(s.mul(a, c), s.mul(b, sn)));
                s.store(p2, s.fma(a, sn, s.mul(b, c)));
            }
            i += S::LANES;
        }
        rotate_scalar(&mut x1[i..], &mut x2[i..], &cos[i..], &sin[i..]);
    }
}

/// The two rotated halves `(x1, x2)` of every head, with the `(cos, sin)` of its token's
/// position.
#[inline(always)]
fn halves<'a>(
    positions: &'a [usize],
    x: &'a mut [f32],
    num_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    cos_sin_cache: &'a [f32],
) -> impl Iterator<Item = (&'a mut [f32], &'a mut [f32], &'a [f32], &'a [f32])> {
    let half = rot_dim / 2;
    // `max(1)`: with no dims `x` is empty, and chunks of 0 would panic.
    let row = (num_heads * head_dim).max(1);
    positions
        .iter()
        .zip(x.chunks_exact_mut(row))
        .flat_map(move |(&pos, tok)| {
            let (cos, sin) = cos_sin_cache[pos * rot_dim..(pos + 1) * rot_dim].split_at(half);
            tok.chunks_exact_mut(head_dim.max(1)).map(move |head| {
                let (x1, x2) = head[..rot_dim].split_at_mut(half);
                (x1, x2, cos, sin)
            })
        })
}

fn rotate_scalar(x1: &mut [f32], x2: &mut [f32], cos: &[f32], sin: &[f32]) {
    for (((a, b), &c), &s) in x1.iter_mut().zip(x2.iter_mut()).zip(cos).zip(sin) {
        (*a, *b) = (*a * c - *b * s, *b * c + *a * s);
    }
}

fn check_shapes(
    positions: &[usize],
    x: &[f32],
    num_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    cos_sin_cache: &[f32],
) {
    assert!(
        rot_dim <= head_dim && rot_dim.is_multiple_of(2),
        "rope: rot_dim {rot_dim} must be even and <= head_dim {head_dim}"
    );
    assert_eq!(
        x.len(),
        positions.len() * num_heads * head_dim,
        "rope: x must be [num_tokens={}, num_heads={num_heads}, head_dim={head_dim}]",
        positions.len()
    );
    if let Some(&max) = positions.iter().max() {
        assert!(
            (max + 1) * rot_dim <= cos_sin_cache.len(),
            "rope: position {max} is beyond the cos/sin cache"
        );
    }
}

/// Scalar twin of [`rotary_embedding_neox`].
pub fn rotary_embedding_neox_scalar(
    positions: &[usize],
    x: &mut [f32],
    num_heads: usize,
    head_dim: usize,
    rot_dim: usize,
    cos_sin_cache: &[f32],
) {
    check_shapes(positions, x, num_heads, head_dim, rot_dim, cos_sin_cache);
    for (x1, x2, cos, sin) in halves(positions, x, num_heads, head_dim, rot_dim, cos_sin_cache) {
        rotate_scalar(x1, x2, cos, sin);
    }
}

/// Fills `table` (`[positions, rot_dim]`, the layout [`rotary_embedding_neox`] reads) with
/// each position's cosines, then its sines, of `position · inv_freq[i]` (`rot_dim / 2`
/// frequencies). The angle is formed in f32, as transformers forms it, so that late
/// positions round as the reference does; the cosine and sine in f64.
pub fn fill_cos_sin_cache(table: &mut [f32], rot_dim: usize, inv_freq: &[f32]) {
    fill_rows(table, rot_dim, inv_freq, 0..);
}

/// [`fill_cos_sin_cache`] for the given positions: row `i` is `positions[i]`'s.
pub fn fill_cos_sin_rows(table: &mut [f32], rot_dim: usize, inv_freq: &[f32], positions: &[usize]) {
    assert_eq!(
        table.len(),
        positions.len() * rot_dim,
        "rope: one row per position"
    );
    fill_rows(table, rot_dim, inv_freq, positions.iter().copied());
}

fn fill_rows(
    table: &mut [f32],
    rot_dim: usize,
    inv_freq: &[f32],
    positions: impl Iterator<Item = usize>,
) {
    let half = rot_dim / 2;
    assert_eq!(
        inv_freq.len(),
        half,
        "rope: {rot_dim} rotated dims need {half} frequencies"
    );
    if half == 0 {
        return;
    }
    for (row, pos) in table.chunks_exact_mut(rot_dim).zip(positions) {
        for (i, &f) in inv_freq.iter().enumerate() {
            let angle = pos as f32 * f;
            row[i] = (angle as f64).cos() as f32;
            row[half + i] = (angle as f64).sin() as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    /// Hugging Face's formulation: `x * cos + rotate_half(x) * sin` with duplicated cos/sin.
    fn reference(pos: &[usize], x: &[f32], nh: usize, hd: usize, rd: usize, base: f32) -> Vec<f32> {
        let half = rd / 2;
        let mut out = x.to_vec();
        for (t, &p) in pos.iter().enumerate() {
            for h in 0..nh {
                let o = (t * nh + h) * hd;
                for i in 0..rd {
                    let f = (base as f64).powf(-2.0 * (i % half) as f64 / rd as f64);
                    let (c, s) = ((p as f64 * f).cos(), (p as f64 * f).sin());
                    let rot = if i < half {
                        -x[o + i + half]
                    } else {
                        x[o + i - half]
                    };
                    out[o + i] = (x[o + i] as f64 * c + rot as f64 * s) as f32;
                }
            }
        }
        out
    }

    type Rope = fn(&[usize], &mut [f32], usize, usize, usize, &[f32]);

    fn check(seed: u64, rope: Rope, what: &str) {
        let mut r = rng(seed);
        let shapes = [
            (9, 64, 64),
            (3, 10, 6),
            (1, 2, 2),
            (2, 8, 0),
            (2, 40, 36),
            (1, 128, 64),
        ];
        for &(nh, hd, rd) in &shapes {
            let inv_freq: Vec<f32> = (0..rd / 2)
                .map(|i| 1.0 / 10000f32.powf((2 * i) as f32 / rd as f32))
                .collect();
            let mut cache = vec![0.0; 100 * rd];
            fill_cos_sin_cache(&mut cache, rd, &inv_freq);
            let pos = [0usize, 5, 99, 42];
            let x = rand_vec(&mut r, pos.len() * nh * hd);
            let mut y = x.clone();
            rope(&pos, &mut y, nh, hd, rd, &cache);
            let want = reference(&pos, &x, nh, hd, rd, 10000.0);
            assert_close(&y, &want, 1e-5, 1e-5, what);
        }
    }

    #[test]
    fn scalar_matches_reference() {
        check(3, rotary_embedding_neox_scalar, "rope scalar");
    }

    #[test]
    fn dispatch_matches_reference() {
        check(31, rotary_embedding_neox, "rope");
    }
}
