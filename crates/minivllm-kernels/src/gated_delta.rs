//! The gated delta rule: the linear attention of Gated DeltaNet layers (Qwen3-Next, Qwen3.5),
//! which keep a fixed-size state per head instead of a KV cache.
//!
//! Per value head, with `S` its `[k_dim, v_dim]` state, each token `t` does
//! `S ← exp(g_t)·S`, `S ← S + k_t ⊗ β_t·(v_t − Sᵀk_t)` and outputs `Sᵀq_t`, `q` and `k`
//! L2-normalised and `q` scaled by `1/√k_dim` (transformers' `torch_recurrent_gated_delta_rule`
//! with `use_qk_l2norm_in_kernel`, as both families call it). Value heads outnumber key
//! heads by a whole factor, each group of value heads reading one key head's `q` and `k`.
//!
//! Decoding runs that recurrence ([`gated_delta_rule_recurrent`]), two passes over the state
//! per token. A prefill runs the chunked form ([`gated_delta_rule_chunked`], the WY form of
//! Yang et al.'s "Gated Delta Networks", as transformers' `torch_chunk_gated_delta_rule`):
//! per chunk of [`CHUNK`] tokens, the chunk's own updates are folded into two triangular
//! solves, so the state is read and written once per chunk instead of once per token and
//! the rest is dense products. Both carry the state in and out, so a prompt can be split
//! into chunks across steps, and both equal the recurrence up to rounding. Heads run in
//! parallel; a head's arithmetic does not depend on the others.

use std::cell::Cell;

use rayon::prelude::*;

use crate::matmul::{gemm_nt_any, Gemm};
use crate::simd::{self, simd_dispatch, Simd};

/// Tokens per chunk of the chunked form (transformers' and FLA's default).
pub const CHUNK: usize = 64;

/// The largest `k_dim` and `v_dim` the kernels take (Qwen3-Next and Qwen3.5 use 128): a
/// token's normalised `q`, `k` and its correction live on the stack.
pub const MAX_HEAD_DIM: usize = 256;

/// This rank's heads of one Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaHeads {
    pub num_k_heads: usize,
    /// A multiple of `num_k_heads`.
    pub num_v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    /// How value heads are ordered over the key heads they read: grouped (Hugging Face
    /// checkpoints: value head `h` reads key head `h / (num_v_heads / num_k_heads)`) or
    /// tiled (llama.cpp's files, whose converter reorders them for ggml's broadcast:
    /// key head `h % num_k_heads`).
    pub tiled: bool,
}

impl DeltaHeads {
    /// Floats of a sequence's state: `[num_v_heads, k_dim, v_dim]`.
    pub fn state_len(&self) -> usize {
        self.num_v_heads * self.k_dim * self.v_dim
    }

    /// The key head that value head `h` reads.
    fn k_head(&self, h: usize) -> usize {
        if self.tiled {
            h % self.num_k_heads
        } else {
            h / (self.num_v_heads / self.num_k_heads)
        }
    }

    fn check(&self, t: usize, io: &DeltaInputs<'_>, state: &[f32], out: &[f32], what: &str) {
        let (nk, nv, kd, vd) = (self.num_k_heads, self.num_v_heads, self.k_dim, self.v_dim);
        assert!(
            nk > 0
                && nv.is_multiple_of(nk)
                && (1..=MAX_HEAD_DIM).contains(&kd)
                && (1..=MAX_HEAD_DIM).contains(&vd),
            "{what}: heads {self:?}"
        );
        assert_eq!(
            io.q.len(),
            t * nk * kd,
            "{what}: q must be [t, num_k_heads, k_dim]"
        );
        assert_eq!(
            io.k.len(),
            t * nk * kd,
            "{what}: k must be [t, num_k_heads, k_dim]"
        );
        assert_eq!(
            io.v.len(),
            t * nv * vd,
            "{what}: v must be [t, num_v_heads, v_dim]"
        );
        assert_eq!(io.g.len(), t * nv, "{what}: g must be [t, num_v_heads]");
        assert_eq!(
            io.beta.len(),
            t * nv,
            "{what}: beta must be [t, num_v_heads]"
        );
        assert_eq!(state.len(), self.state_len(), "{what}: state length");
        assert_eq!(
            out.len(),
            t * nv * vd,
            "{what}: out must be [t, num_v_heads, v_dim]"
        );
    }
}

/// One sequence's inputs to the rule, `t` tokens: `q` and `k` `[t, num_k_heads, k_dim]` (as
/// projected: the kernels normalise them), `v` `[t, num_v_heads, v_dim]`, the log decays
/// `g` (≤ 0) and the write strengths `beta` (in 0..1), both `[t, num_v_heads]`.
#[derive(Clone, Copy, Debug)]
pub struct DeltaInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
}

impl DeltaInputs<'_> {
    fn tokens(&self, heads: &DeltaHeads) -> usize {
        self.g.len() / heads.num_v_heads.max(1)
    }
}

/// `x / √(Σx² + 1e-6) · scale` (the FLA library's and transformers' `l2norm`, eps 1e-6).
fn l2norm_into(x: &[f32], scale: f32, out: &mut [f32]) {
    let inv = (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt().recip() * scale;
    for (o, v) in out.iter_mut().zip(x) {
        *o = v * inv;
    }
}

/// The rule over `io`'s tokens, one at a time: `state` (`[num_v_heads, k_dim, v_dim]`, zeros
/// at a sequence's start) is carried in and out, `out` is `[t, num_v_heads, v_dim]`.
pub fn gated_delta_rule_recurrent(
    heads: &DeltaHeads,
    io: &DeltaInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) {
    let t = io.tokens(heads);
    heads.check(t, io, state, out, "gated_delta_rule_recurrent");
    for_each_head(heads, t, state, out, |h, s, o| {
        recurrent_head(heads, io, h, s, o)
    });
}

/// Runs `head(h, state, rows)` for every value head `h` in parallel, `state` its
/// `[k_dim, v_dim]` and `rows` its `[t, v_dim]` outputs, then lays the rows out token-major
/// in `out`.
fn for_each_head(
    heads: &DeltaHeads,
    t: usize,
    state: &mut [f32],
    out: &mut [f32],
    head: impl Fn(usize, &mut [f32], &mut [f32]) + Sync,
) {
    let (nv, kd, vd) = (heads.num_v_heads, heads.k_dim, heads.v_dim);
    let run = |(h, (s, o)): (usize, (&mut [f32], &mut [f32]))| head(h, s, o);
    if t == 1 {
        // A decode step: each head's output row is contiguous, so heads write in place.
        let heads = state.par_chunks_mut(kd * vd).zip(out.par_chunks_mut(vd));
        return heads.enumerate().for_each(run);
    }
    // Reused from call to call: a fresh buffer of a prompt's rows (4 MiB for 512 tokens of
    // Qwen3.5) would be new pages to fault in at every layer. Taken out of the slot while
    // the heads run, as another call may run on this thread meanwhile.
    let mut rows = HEAD_ROWS.take();
    rows.resize(out.len(), 0.0);
    let each = state
        .par_chunks_mut(kd * vd)
        .zip(rows[..out.len()].par_chunks_mut(t * vd));
    each.enumerate().for_each(run);
    for (h, rows) in rows[..out.len()].chunks_exact(t * vd).enumerate() {
        for (i, row) in rows.chunks_exact(vd).enumerate() {
            out[(i * nv + h) * vd..(i * nv + h + 1) * vd].copy_from_slice(row);
        }
    }
    HEAD_ROWS.set(rows);
}

thread_local! {
    /// [`for_each_head`]'s head-major rows.
    static HEAD_ROWS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// A head's chunk scratch, kept by each thread that runs heads.
    static SCRATCH: Cell<Option<ChunkScratch>> = const { Cell::new(None) };
}

/// Value head `h`'s tokens through the recurrence; `out` is its `[t, v_dim]` rows.
fn recurrent_head(
    heads: &DeltaHeads,
    io: &DeltaInputs<'_>,
    h: usize,
    s: &mut [f32],
    out: &mut [f32],
) {
    let (nk, nv, kd, vd) = (
        heads.num_k_heads,
        heads.num_v_heads,
        heads.k_dim,
        heads.v_dim,
    );
    let kh = heads.k_head(h);
    let scale = (kd as f32).sqrt().recip();
    let (mut qn, mut kn) = ([0.0f32; MAX_HEAD_DIM], [0.0f32; MAX_HEAD_DIM]);
    let (qn, kn) = (&mut qn[..kd], &mut kn[..kd]);
    for (i, o) in out.chunks_exact_mut(vd).enumerate() {
        let at = (i * nk + kh) * kd;
        l2norm_into(&io.q[at..at + kd], scale, qn);
        l2norm_into(&io.k[at..at + kd], 1.0, kn);
        let v = &io.v[(i * nv + h) * vd..(i * nv + h + 1) * vd];
        let (g, beta) = (io.g[i * nv + h], io.beta[i * nv + h]);
        recurrent_token(qn, kn, v, [g, beta], s, o);
    }
}

simd_dispatch! {
    /// One token of one head: `[g, beta]` its log decay and write strength, `s` its
    /// `[k_dim, v_dim]` state, `o` its output row.
    fn recurrent_token(q: &[f32], k: &[f32], v: &[f32], g_beta: [f32; 2], s: &mut [f32], o: &mut [f32]);
    generic = recurrent_token_generic;
    avx512 = crate::simd::Avx2;
    scalar = recurrent_token_scalar;
}

#[inline(always)]
fn recurrent_token_generic<S: Simd>(
    s: S,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    [g, beta]: [f32; 2],
    state: &mut [f32],
    o: &mut [f32],
) {
    let vd = v.len();
    let decay = g.exp();
    let mut delta = [0.0f32; MAX_HEAD_DIM];
    let delta = &mut delta[..vd];
    // Decay the state, and read what it predicts for k (`Sᵀk`) in the same pass.
    for (row, &kr) in state.chunks_exact_mut(vd).zip(k) {
        simd::scale(s, row, decay);
        simd::axpy(s, delta, kr, row);
    }
    for (d, &x) in delta.iter_mut().zip(v) {
        *d = (x - *d) * beta;
    }
    // Write the correction, and read the output from the new state in the same pass.
    o.fill(0.0);
    for ((row, &kr), &qr) in state.chunks_exact_mut(vd).zip(k).zip(q) {
        simd::axpy(s, row, kr, delta);
        simd::axpy(s, o, qr, row);
    }
}

/// [`recurrent_token`] in plain scalar code, as transformers writes the recurrence.
pub fn recurrent_token_scalar(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    [g, beta]: [f32; 2],
    state: &mut [f32],
    o: &mut [f32],
) {
    let vd = v.len();
    let decay = g.exp();
    state.iter_mut().for_each(|x| *x *= decay);
    for (j, &vj) in v.iter().enumerate() {
        let mem: f32 = k
            .iter()
            .enumerate()
            .map(|(r, &kr)| state[r * vd + j] * kr)
            .sum();
        let delta = (vj - mem) * beta;
        for (r, &kr) in k.iter().enumerate() {
            state[r * vd + j] += kr * delta;
        }
        o[j] = q
            .iter()
            .enumerate()
            .map(|(r, &qr)| state[r * vd + j] * qr)
            .sum();
    }
}

/// The rule over `io`'s tokens in chunks of [`CHUNK`]: [`gated_delta_rule_recurrent`]'s
/// result up to rounding, reading and writing each head's state once per chunk.
pub fn gated_delta_rule_chunked(
    heads: &DeltaHeads,
    io: &DeltaInputs<'_>,
    state: &mut [f32],
    out: &mut [f32],
) {
    let t = io.tokens(heads);
    heads.check(t, io, state, out, "gated_delta_rule_chunked");
    let (kd, vd) = (heads.k_dim, heads.v_dim);
    for_each_head(heads, t, state, out, |h, s, o| {
        let mut scratch = SCRATCH
            .take()
            .filter(|c| (c.kd, c.vd) == (kd, vd))
            .unwrap_or_else(|| ChunkScratch::new(kd, vd));
        for c0 in (0..t).step_by(CHUNK) {
            let len = CHUNK.min(t - c0);
            scratch.load(heads, io, h, c0, len);
            let o = &mut o[c0 * vd..(c0 + len) * vd];
            if len < BLOCKED_MIN_TOKENS {
                chunk_head(&mut scratch, len, s, o);
            } else {
                chunk_head_blocked(&mut scratch, len, s, o);
            }
        }
        SCRATCH.set(Some(scratch));
    });
}

/// From this many tokens on, a chunk runs as matrix products ([`chunk_head_blocked`]);
/// shorter ones (a prompt's tail) run the row-by-row form, whose products are too small to
/// pay for packing.
const BLOCKED_MIN_TOKENS: usize = 16;

/// One head's chunk, normalised and laid out, and the chunk's intermediate products.
struct ChunkScratch {
    kd: usize,
    vd: usize,
    /// `[len, k_dim]`: normalised and scaled queries, normalised keys.
    q: Vec<f32>,
    k: Vec<f32>,
    /// `[len, v_dim]`.
    v: Vec<f32>,
    beta: Vec<f32>,
    /// The chunk's cumulative log decay at each token.
    cum: Vec<f32>,
    /// `[CHUNK, CHUNK]`: the strictly lower system `β_i (k_i·k_j) e^(cum_i − cum_j)`.
    a: Vec<f32>,
    /// `[len, v_dim]` and `[len, k_dim]`: the solves' results (`u`, then the new values;
    /// `w`).
    u: Vec<f32>,
    w: Vec<f32>,
    /// The blocked form's operands: `[CHUNK, CHUNK]` matrices (`q·kᵀ`, the system's
    /// inverse), transposed `[dim, CHUNK]` panels, `Sᵀ`, and a product's rows.
    qk: Vec<f32>,
    inv: Vec<f32>,
    tv: Vec<f32>,
    tk: Vec<f32>,
    st: Vec<f32>,
    prod: Vec<f32>,
}

impl ChunkScratch {
    fn new(kd: usize, vd: usize) -> Self {
        Self {
            kd,
            vd,
            q: vec![0.0; CHUNK * kd],
            k: vec![0.0; CHUNK * kd],
            v: vec![0.0; CHUNK * vd],
            beta: vec![0.0; CHUNK],
            cum: vec![0.0; CHUNK],
            a: vec![0.0; CHUNK * CHUNK],
            u: vec![0.0; CHUNK * vd],
            w: vec![0.0; CHUNK * kd],
            qk: vec![0.0; CHUNK * CHUNK],
            inv: vec![0.0; CHUNK * CHUNK],
            tv: vec![0.0; vd * CHUNK],
            tk: vec![0.0; kd * CHUNK],
            st: vec![0.0; vd * kd],
            prod: vec![0.0; CHUNK.max(kd) * vd.max(kd)],
        }
    }

    /// Head `h`'s tokens `c0..c0 + len`.
    fn load(&mut self, heads: &DeltaHeads, io: &DeltaInputs<'_>, h: usize, c0: usize, len: usize) {
        let (nk, nv, kd, vd) = (heads.num_k_heads, heads.num_v_heads, self.kd, self.vd);
        let kh = heads.k_head(h);
        let scale = (kd as f32).sqrt().recip();
        let mut cum = 0.0f32;
        for i in 0..len {
            let tok = c0 + i;
            let at = (tok * nk + kh) * kd;
            l2norm_into(&io.q[at..at + kd], scale, &mut self.q[i * kd..(i + 1) * kd]);
            l2norm_into(&io.k[at..at + kd], 1.0, &mut self.k[i * kd..(i + 1) * kd]);
            let vat = (tok * nv + h) * vd;
            self.v[i * vd..(i + 1) * vd].copy_from_slice(&io.v[vat..vat + vd]);
            self.beta[i] = io.beta[tok * nv + h];
            cum += io.g[tok * nv + h];
            self.cum[i] = cum;
        }
    }
}

simd_dispatch! {
    /// One chunk of `len` tokens of one head (loaded in `c`): `s` its state, `o` its
    /// `[len, v_dim]` output rows.
    fn chunk_head(c: &mut ChunkScratch, len: usize, s: &mut [f32], o: &mut [f32]);
    generic = chunk_head_generic;
    avx512 = crate::simd::Avx2;
    scalar = chunk_head_scalar;
}

fn chunk_head_scalar(c: &mut ChunkScratch, len: usize, s: &mut [f32], o: &mut [f32]) {
    chunk_head_generic(crate::simd::Scalar, c, len, s, o)
}

#[inline(always)]
fn chunk_head_generic<S: Simd>(
    sx: S,
    c: &mut ChunkScratch,
    len: usize,
    s: &mut [f32],
    o: &mut [f32],
) {
    let (kd, vd) = (c.kd, c.vd);
    // The system's strictly lower triangle: A[i][j] = β_i (k_i·k_j) e^(cum_i − cum_j).
    for i in 0..len {
        for j in 0..i {
            let kk = simd::dot(sx, &c.k[i * kd..(i + 1) * kd], &c.k[j * kd..(j + 1) * kd]);
            c.a[i * CHUNK + j] = c.beta[i] * kk * (c.cum[i] - c.cum[j]).exp();
        }
    }
    // Forward substitution, (I + A)·u = β·v and (I + A)·w = β·e^cum·k.
    for i in 0..len {
        let (done_u, rest_u) = c.u.split_at_mut(i * vd);
        let ui = &mut rest_u[..vd];
        ui.copy_from_slice(&c.v[i * vd..(i + 1) * vd]);
        simd::scale(sx, ui, c.beta[i]);
        let (done_w, rest_w) = c.w.split_at_mut(i * kd);
        let wi = &mut rest_w[..kd];
        wi.copy_from_slice(&c.k[i * kd..(i + 1) * kd]);
        simd::scale(sx, wi, c.beta[i] * c.cum[i].exp());
        for j in 0..i {
            let aij = c.a[i * CHUNK + j];
            simd::axpy(sx, ui, -aij, &done_u[j * vd..(j + 1) * vd]);
            simd::axpy(sx, wi, -aij, &done_w[j * kd..(j + 1) * kd]);
        }
    }
    // The new values: u_i − w_i·S (what the state before the chunk already predicts).
    for i in 0..len {
        let ui = &mut c.u[i * vd..(i + 1) * vd];
        for (r, srow) in s.chunks_exact(vd).enumerate() {
            simd::axpy(sx, ui, -c.w[i * kd + r], srow);
        }
    }
    // Outputs: e^cum_i (q_i·S) + Σ_{j≤i} (q_i·k_j) e^(cum_i − cum_j) new_j.
    for i in 0..len {
        let oi = &mut o[i * vd..(i + 1) * vd];
        oi.fill(0.0);
        let qi = &c.q[i * kd..(i + 1) * kd];
        let ei = c.cum[i].exp();
        for (r, srow) in s.chunks_exact(vd).enumerate() {
            simd::axpy(sx, oi, qi[r] * ei, srow);
        }
        for j in 0..=i {
            let qk = simd::dot(sx, qi, &c.k[j * kd..(j + 1) * kd]);
            let aij = qk * (c.cum[i] - c.cum[j]).exp();
            simd::axpy(sx, oi, aij, &c.u[j * vd..(j + 1) * vd]);
        }
    }
    // The state after the chunk: e^cum_last S + Σ_j e^(cum_last − cum_j) k_j ⊗ new_j.
    let last = c.cum[len - 1];
    simd::scale(sx, s, last.exp());
    for j in 0..len {
        let f = (last - c.cum[j]).exp();
        let kj = &c.k[j * kd..(j + 1) * kd];
        let uj = &c.u[j * vd..(j + 1) * vd];
        for (r, srow) in s.chunks_exact_mut(vd).enumerate() {
            simd::axpy(sx, srow, kj[r] * f, uj);
        }
    }
}

/// `out[m, n] = x[m, k] · w[n, k]ᵀ` on the calling thread (the heads are what runs in
/// parallel).
fn gemm(x: &[f32], w: &[f32], out: &mut [f32], [m, k, n]: [usize; 3]) {
    let g = Gemm::dense(&x[..m * k], &w[..n * k], &mut out[..m * n], m, k, n);
    // SAFETY: the slices hold `m × k`, `n × k` and `m × n` floats (indexing checked it), and
    // `out`, borrowed mutably, overlaps neither operand.
    unsafe { gemm_nt_any(g) }
}

/// `dst[c, r] = src[r, c]` for `src` of `rows × cols`.
fn transpose(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    for (r, row) in src[..rows * cols].chunks_exact(cols).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            dst[c * rows + r] = x;
        }
    }
}

/// [`chunk_head`] as matrix products (the WY form as FLA's kernels run it): the system
/// `I + A` is inverted once (`len³/6` multiply-adds), then the solves, the state's
/// predictions, the outputs and the new state are products of `len × 128`-sized matrices
/// run by the f32 GEMM's register-blocked kernels, instead of one `axpy` per pair of rows.
/// The same arithmetic up to rounding.
fn chunk_head_blocked(c: &mut ChunkScratch, len: usize, s: &mut [f32], o: &mut [f32]) {
    let (kd, vd, l) = (c.kd, c.vd, len);
    // A = β_i (k_i·k_j) e^(cum_i − cum_j) below the diagonal, kept [l, l] in `a`.
    gemm(&c.k, &c.k, &mut c.a, [l, kd, l]);
    gemm(&c.q, &c.k, &mut c.qk, [l, kd, l]);
    for i in 0..l {
        let (a, qk) = (&mut c.a[i * l..(i + 1) * l], &mut c.qk[i * l..(i + 1) * l]);
        for j in 0..=i {
            let d = (c.cum[i] - c.cum[j]).exp();
            a[j] *= c.beta[i] * d;
            qk[j] *= d;
        }
        a[i..].fill(0.0);
        qk[i + 1..].fill(0.0);
    }
    // (I + A)⁻¹, unit lower triangular, row by row: row i = e_i − Σ_{m<i} A[i][m]·row m.
    let inv = &mut c.inv[..l * l];
    inv.fill(0.0);
    for i in 0..l {
        let (done, rest) = inv.split_at_mut(i * l);
        let row = &mut rest[..l];
        row[i] = 1.0;
        for m in 0..i {
            let f = -c.a[i * l + m];
            for (r, &x) in row[..=m].iter_mut().zip(&done[m * l..m * l + m + 1]) {
                *r += f * x;
            }
        }
    }
    // u = (I + A)⁻¹ β v and w = (I + A)⁻¹ β e^cum k, through transposed right-hand sides.
    for j in 0..l {
        for x in 0..vd {
            c.tv[x * l + j] = c.beta[j] * c.v[j * vd + x];
        }
        let f = c.beta[j] * c.cum[j].exp();
        for x in 0..kd {
            c.tk[x * l + j] = f * c.k[j * kd + x];
        }
    }
    gemm(&c.inv, &c.tv, &mut c.u, [l, l, vd]);
    gemm(&c.inv, &c.tk, &mut c.w, [l, l, kd]);
    // The new values: u − w·S.
    transpose(s, kd, vd, &mut c.st);
    gemm(&c.w, &c.st, &mut c.prod, [l, kd, vd]);
    for (u, p) in c.u[..l * vd].iter_mut().zip(&c.prod) {
        *u -= p;
    }
    // Outputs: e^cum_i (q_i·S) + Σ_{j≤i} (q_i·k_j) e^(cum_i − cum_j) new_j.
    gemm(&c.q, &c.st, o, [l, kd, vd]);
    for (row, &cum) in o.chunks_exact_mut(vd).zip(&c.cum) {
        let e = cum.exp();
        row.iter_mut().for_each(|x| *x *= e);
    }
    transpose(&c.u, l, vd, &mut c.tv);
    gemm(&c.qk, &c.tv, &mut c.prod, [l, l, vd]);
    for (x, p) in o.iter_mut().zip(&c.prod) {
        *x += p;
    }
    // The state after the chunk: e^cum_last S + Σ_j k_j ⊗ e^(cum_last − cum_j) new_j.
    let last = c.cum[l - 1];
    for j in 0..l {
        let f = (last - c.cum[j]).exp();
        for x in 0..vd {
            c.tv[x * l + j] *= f;
        }
    }
    transpose(&c.k, l, kd, &mut c.tk);
    gemm(&c.tk, &c.tv, &mut c.prod, [kd, l, vd]);
    let decay = last.exp();
    for (x, p) in s.iter_mut().zip(&c.prod) {
        *x = *x * decay + p;
    }
}

#[cfg(test)]
mod tests;
