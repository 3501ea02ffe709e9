use rand::Rng;

use super::*;
use crate::testutil::{assert_close, rand_vec, rng};

/// Two key heads read by four value heads, small odd dimensions.
const HEADS: DeltaHeads = DeltaHeads {
    num_k_heads: 2,
    num_v_heads: 4,
    k_dim: 12,
    v_dim: 10,
    tiled: false,
};

struct Case {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

impl Case {
    fn random(seed: u64, heads: &DeltaHeads, t: usize) -> Self {
        let mut r = rng(seed);
        let (nk, nv, kd, vd) = (
            heads.num_k_heads,
            heads.num_v_heads,
            heads.k_dim,
            heads.v_dim,
        );
        Case {
            q: rand_vec(&mut r, t * nk * kd),
            k: rand_vec(&mut r, t * nk * kd),
            v: rand_vec(&mut r, t * nv * vd),
            // Decays from e^-1.5 to 1, write strengths from 0 to 1, as the layers make them.
            g: (0..t * nv).map(|_| -r.random_range(0.0..1.5f32)).collect(),
            beta: (0..t * nv).map(|_| r.random_range(0.0..1.0f32)).collect(),
        }
    }

    fn inputs(&self, tokens: std::ops::Range<usize>, heads: &DeltaHeads) -> DeltaInputs<'_> {
        let (nk, nv, kd, vd) = (
            heads.num_k_heads,
            heads.num_v_heads,
            heads.k_dim,
            heads.v_dim,
        );
        let (a, b) = (tokens.start, tokens.end);
        DeltaInputs {
            q: &self.q[a * nk * kd..b * nk * kd],
            k: &self.k[a * nk * kd..b * nk * kd],
            v: &self.v[a * nv * vd..b * nv * vd],
            g: &self.g[a * nv..b * nv],
            beta: &self.beta[a * nv..b * nv],
        }
    }
}

/// The recurrence in f64, written from the formula: each token decays the state, writes
/// `k ⊗ β (v − Sᵀk)`, and reads `Sᵀq`, with `q` and `k` L2-normalised (eps 1e-6) and `q`
/// over `√k_dim`.
fn reference(heads: &DeltaHeads, io: &DeltaInputs<'_>, state: &mut [f32]) -> Vec<f32> {
    let (nk, nv, kd, vd) = (
        heads.num_k_heads,
        heads.num_v_heads,
        heads.k_dim,
        heads.v_dim,
    );
    let t = io.g.len() / nv;
    let mut s: Vec<f64> = state.iter().map(|&x| x as f64).collect();
    let mut out = vec![0.0f32; t * nv * vd];
    let norm = |x: &[f32]| -> Vec<f64> {
        let n = (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() + 1e-6).sqrt();
        x.iter().map(|&v| v as f64 / n).collect()
    };
    for i in 0..t {
        for h in 0..nv {
            let kh = h / (nv / nk);
            let at = (i * nk + kh) * kd;
            let q: Vec<f64> = norm(&io.q[at..at + kd])
                .iter()
                .map(|x| x / (kd as f64).sqrt())
                .collect();
            let k = norm(&io.k[at..at + kd]);
            let sh = &mut s[h * kd * vd..(h + 1) * kd * vd];
            let decay = (io.g[i * nv + h] as f64).exp();
            sh.iter_mut().for_each(|x| *x *= decay);
            let beta = io.beta[i * nv + h] as f64;
            for j in 0..vd {
                let mem: f64 = (0..kd).map(|r| sh[r * vd + j] * k[r]).sum();
                let delta = (io.v[(i * nv + h) * vd + j] as f64 - mem) * beta;
                for r in 0..kd {
                    sh[r * vd + j] += k[r] * delta;
                }
                out[(i * nv + h) * vd + j] =
                    (0..kd).map(|r| sh[r * vd + j] * q[r]).sum::<f64>() as f32;
            }
        }
    }
    for (d, x) in state.iter_mut().zip(&s) {
        *d = *x as f32;
    }
    out
}

fn random_state(seed: u64, heads: &DeltaHeads) -> Vec<f32> {
    rand_vec(&mut rng(seed), heads.state_len())
        .into_iter()
        .map(|x| 0.3 * x)
        .collect()
}

type Rule = fn(&DeltaHeads, &DeltaInputs<'_>, &mut [f32], &mut [f32]);

/// `rule` against the f64 reference from a non-zero state, outputs and final state.
fn matches_reference(rule: Rule, name: &str) {
    for t in [1, 2, 5, 63, 64, 65, 150] {
        let case = Case::random(t as u64, &HEADS, t);
        let io = case.inputs(0..t, &HEADS);
        let mut want_state = random_state(99, &HEADS);
        let mut got_state = want_state.clone();
        let want = reference(&HEADS, &io, &mut want_state);
        let mut got = vec![f32::NAN; want.len()];
        rule(&HEADS, &io, &mut got_state, &mut got);
        assert_close(
            &got,
            &want,
            2e-5,
            1e-4,
            &format!("{name}, {t} tokens: outputs"),
        );
        assert_close(
            &got_state,
            &want_state,
            2e-5,
            1e-4,
            &format!("{name}, {t} tokens: state"),
        );
    }
}

#[test]
fn recurrent_form_matches_the_reference() {
    matches_reference(gated_delta_rule_recurrent, "recurrent");
}

#[test]
fn chunked_form_matches_the_reference() {
    matches_reference(gated_delta_rule_chunked, "chunked");
}

/// A prompt split across steps (chunked prefill), then decoded token by token, gives what
/// one pass over all the tokens gives: the state carries everything between calls.
#[test]
fn state_carries_across_calls() {
    let t = 150;
    let case = Case::random(7, &HEADS, t);
    let mut want_state = vec![0.0; HEADS.state_len()];
    let want = reference(&HEADS, &case.inputs(0..t, &HEADS), &mut want_state);
    let row = HEADS.num_v_heads * HEADS.v_dim;
    let mut state = vec![0.0; HEADS.state_len()];
    let mut got = vec![f32::NAN; want.len()];
    for (a, b) in [(0, 70), (70, 100), (100, 140)] {
        let io = case.inputs(a..b, &HEADS);
        gated_delta_rule_chunked(&HEADS, &io, &mut state, &mut got[a * row..b * row]);
    }
    for i in 140..t {
        let io = case.inputs(i..i + 1, &HEADS);
        gated_delta_rule_recurrent(&HEADS, &io, &mut state, &mut got[i * row..(i + 1) * row]);
    }
    assert_close(
        &got,
        &want,
        2e-5,
        1e-4,
        "split prefill then decode: outputs",
    );
    assert_close(
        &state,
        &want_state,
        2e-5,
        1e-4,
        "split prefill then decode: state",
    );
}

/// The dispatched token step (AVX2 or AVX-512 where the CPU has them) against its scalar
/// twin.
#[test]
fn token_step_matches_its_scalar_twin() {
    let mut r = rng(3);
    for (kd, vd) in [(1, 1), (12, 10), (128, 128), (33, 70)] {
        let q = rand_vec(&mut r, kd);
        let k = rand_vec(&mut r, kd);
        let v = rand_vec(&mut r, vd);
        let s0 = rand_vec(&mut r, kd * vd);
        let (mut s1, mut s2) = (s0.clone(), s0);
        let (mut o1, mut o2) = (vec![0.0; vd], vec![0.0; vd]);
        recurrent_token(&q, &k, &v, [-0.3, 0.7], &mut s1, &mut o1);
        recurrent_token_scalar(&q, &k, &v, [-0.3, 0.7], &mut s2, &mut o2);
        assert_close(&o1, &o2, 1e-5, 1e-5, &format!("{kd}x{vd}: outputs"));
        assert_close(&s1, &s2, 1e-5, 1e-5, &format!("{kd}x{vd}: state"));
    }
}

/// At the model's sizes (Qwen3-Next: 16 key heads and 32 value heads of 128) the chunked
/// form stays with the recurrence over several chunks.
#[test]
fn chunked_form_holds_at_real_head_sizes() {
    let heads = DeltaHeads {
        num_k_heads: 2,
        num_v_heads: 4,
        k_dim: 128,
        v_dim: 128,
        tiled: false,
    };
    let t = 200;
    let case = Case::random(11, &heads, t);
    let io = case.inputs(0..t, &heads);
    let (mut s1, mut s2) = (vec![0.0; heads.state_len()], vec![0.0; heads.state_len()]);
    let (mut o1, mut o2) = (vec![0.0; t * 4 * 128], vec![0.0; t * 4 * 128]);
    gated_delta_rule_recurrent(&heads, &io, &mut s1, &mut o1);
    gated_delta_rule_chunked(&heads, &io, &mut s2, &mut o2);
    assert_close(&o2, &o1, 2e-5, 1e-4, "outputs");
    assert_close(&s2, &s1, 2e-5, 1e-4, "state");
}

/// The blocked chunk (matrix products) against the row-by-row one, its twin, on the same
/// loaded chunk and state: at real head sizes and odd ones, a full chunk and short ones.
#[test]
fn blocked_chunk_matches_the_row_form() {
    for (kd, vd) in [(128, 128), (12, 10), (33, 70)] {
        let heads = DeltaHeads {
            num_k_heads: 1,
            num_v_heads: 2,
            k_dim: kd,
            v_dim: vd,
            tiled: false,
        };
        for len in [BLOCKED_MIN_TOKENS, 37, CHUNK] {
            let case = Case::random(len as u64, &heads, len);
            let io = case.inputs(0..len, &heads);
            let s0: Vec<f32> = random_state(5, &heads)[..kd * vd].to_vec();
            let mut c = ChunkScratch::new(kd, vd);
            c.load(&heads, &io, 1, 0, len);
            let (mut s1, mut s2) = (s0.clone(), s0);
            let (mut o1, mut o2) = (vec![0.0; len * vd], vec![0.0; len * vd]);
            chunk_head_scalar(&mut c, len, &mut s1, &mut o1);
            c.load(&heads, &io, 1, 0, len);
            chunk_head_blocked(&mut c, len, &mut s2, &mut o2);
            let what = format!("{kd}x{vd}, {len} tokens");
            assert_close(&o2, &o1, 1e-5, 1e-5, &format!("{what}: outputs"));
            assert_close(&s2, &s1, 1e-5, 1e-5, &format!("{what}: state"));
        }
    }
}

#[test]
#[should_panic(expected = "v must be [t, num_v_heads, v_dim]")]
fn shapes_are_checked() {
    let case = Case::random(1, &HEADS, 3);
    let mut io = case.inputs(0..3, &HEADS);
    io.v = &io.v[1..];
    let mut state = vec![0.0; HEADS.state_len()];
    let mut out = vec![0.0; 3 * HEADS.num_v_heads * HEADS.v_dim];
    gated_delta_rule_recurrent(&HEADS, &io, &mut state, &mut out);
}

/// `scripts/make_gated_delta_reference.py`'s arrays: transformers' own functions.
fn transformers_reference() -> std::collections::HashMap<String, Vec<f32>> {
    include_str!("transformers.txt")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let mut parts = l.split_whitespace();
            let name = parts.next().expect("a name").to_string();
            (name, parts.map(|v| v.parse().expect("a float")).collect())
        })
        .collect()
}

/// Both forms and the convolution against transformers 5.19's `torch_recurrent_gated_delta_rule`,
/// `torch_chunk_gated_delta_rule` (`use_qk_l2norm_in_kernel`) and `causal_conv1d_fn` (SiLU):
/// 70 tokens from a non-zero state, two key heads read by four value heads.
#[test]
fn kernels_match_transformers() {
    let r = transformers_reference();
    let shape: Vec<usize> = r["shape"].iter().map(|&x| x as usize).collect();
    let [t, nk, nv, kd, vd] = shape[..] else {
        panic!("shape")
    };
    let heads = DeltaHeads {
        num_k_heads: nk,
        num_v_heads: nv,
        k_dim: kd,
        v_dim: vd,
        tiled: false,
    };
    let io = DeltaInputs {
        q: &r["q"],
        k: &r["k"],
        v: &r["v"],
        g: &r["g"],
        beta: &r["beta"],
    };
    for (rule, name) in [
        (gated_delta_rule_recurrent as Rule, "recurrent"),
        (gated_delta_rule_chunked, "chunked"),
    ] {
        let mut state = r["state0"].clone();
        let mut out = vec![f32::NAN; t * nv * vd];
        rule(&heads, &io, &mut state, &mut out);
        // Each of our forms against each of transformers' (theirs differ by rounding too).
        for theirs in ["recurrent", "chunked"] {
            let what = format!("our {name} form against transformers' {theirs}");
            assert_close(&out, &r[&format!("{theirs}_out")], 1e-5, 1e-4, &what);
            assert_close(&state, &r[&format!("{theirs}_state")], 1e-5, 1e-4, &what);
        }
    }
    let channels = r["conv_shape"][0] as usize;
    let x = &r["conv_x"];
    let width = r["conv_weight"].len() / channels;
    let mut state = vec![0.0; channels * (width - 1)];
    let mut out = vec![f32::NAN; x.len()];
    crate::conv1d::causal_conv1d_silu(
        x,
        channels,
        &r["conv_weight"],
        Some(&r["conv_bias"]),
        &mut state,
        &mut out,
    );
    assert_close(&out, &r["conv_out"], 1e-5, 1e-5, "causal_conv1d_silu");
}

/// llama.cpp's files order value heads tiled over the key heads (position `r·nk + g` holds
/// the Hugging Face head `g·rpk + r`): with `tiled`, the heads so reordered give the same
/// outputs and states, reordered, through both forms.
#[test]
fn tiled_value_heads_are_the_grouped_ones_reordered() {
    let tiled = DeltaHeads {
        tiled: true,
        ..HEADS
    };
    let (nk, nv, kd, vd) = (
        HEADS.num_k_heads,
        HEADS.num_v_heads,
        HEADS.k_dim,
        HEADS.v_dim,
    );
    let grouped = |p: usize| (p % nk) * (nv / nk) + p / nk;
    // Rows of `len` per head, `nv` heads per token (or one state), reordered to tiled.
    let tile = |x: &[f32], len: usize| -> Vec<f32> {
        x.chunks_exact(nv * len)
            .flat_map(|heads| (0..nv).flat_map(move |p| &heads[grouped(p) * len..][..len]))
            .copied()
            .collect()
    };
    let rules: [(Rule, &str); 2] = [
        (gated_delta_rule_recurrent, "recurrent"),
        (gated_delta_rule_chunked, "chunked"),
    ];
    for (rule, name) in rules {
        for t in [1, 5, 70] {
            let case = Case::random(40 + t as u64, &HEADS, t);
            let io = case.inputs(0..t, &HEADS);
            let state = random_state(7, &HEADS);
            let (mut s1, mut o1) = (state.clone(), vec![0.0; t * nv * vd]);
            rule(&HEADS, &io, &mut s1, &mut o1);
            let (v, g, beta) = (tile(&case.v, vd), tile(&case.g, 1), tile(&case.beta, 1));
            let io2 = DeltaInputs {
                v: &v,
                g: &g,
                beta: &beta,
                ..io
            };
            let (mut s2, mut o2) = (tile(&state, kd * vd), vec![0.0; t * nv * vd]);
            rule(&tiled, &io2, &mut s2, &mut o2);
            assert_eq!(o2, tile(&o1, vd), "{name}, {t} tokens: outputs");
            assert_eq!(s2, tile(&s1, kd * vd), "{name}, {t} tokens: state");
        }
    }
}
