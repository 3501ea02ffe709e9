use super::*;
use crate::distributed::SingleProcess;

#[test]
fn top_k_keeps_the_largest_in_order_lower_index_first_among_equals() {
    let probs = [0.1, 0.3, 0.05, 0.3, 0.25];
    let (mut ids, mut w) = ([0u32; 3], [0f32; 3]);
    top_k(&probs, &mut ids, &mut w);
    assert_eq!(ids, [1, 3, 4]);
    assert_eq!(w, [0.3, 0.3, 0.25]);
    let (mut ids, mut w) = ([0u32; 1], [0f32; 1]);
    top_k(&probs, &mut ids, &mut w);
    assert_eq!((ids, w), ([1], [0.3]));
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5
        })
        .collect()
}

/// `[rows, cols]` random weights, in f32 or as Q8_0 blocks.
fn linear(rows: usize, cols: usize, seed: u64, quantised: bool) -> Linear {
    let data = values(rows * cols, seed);
    if !quantised {
        return Linear::from_weight(data, cols, rows);
    }
    let ty = minivllm_kernels::quant::GgmlType::Q8_0;
    let blocks = minivllm_kernels::qdot::quantize_to(ty, &data).unwrap();
    let q = minivllm_kernels::qmatmul::QuantMatrix::new(ty, rows, cols, blocks).unwrap();
    Linear::new(WeightMatrix::Quant(q))
}

fn mlp(hidden: usize, width: usize, seed: u64, quantised: bool) -> GatedMlp {
    GatedMlp {
        gate_up_proj: linear(2 * width, hidden, seed, quantised),
        down_proj: linear(hidden, width, seed + 1, quantised),
        gate_up_bias: None,
        down_bias: None,
        width,
        whole_width: width,
    }
}

/// gpt-oss's layer: a router bias, the top logits' softmax, experts with biases.
fn gpt_oss_moe(quantised: bool) -> FusedMoe {
    let mut m = moe(false, false, quantised);
    m.scoring = RouterScoring::TopKThenSoftmax;
    m.router_bias = Some(values(m.experts.len(), 70));
    for (e, expert) in m.experts.iter_mut().enumerate() {
        expert.gate_up_bias = Some(values(2 * expert.width, 80 + e as u64));
        expert.down_bias = Some(values(HIDDEN, 90 + e as u64));
    }
    m
}

/// A small limit, so that the clamps bite on these weights.
const GPT_OSS_ACT: Activation = Activation::SwigluOai {
    alpha: 1.702,
    limit: 0.05,
};

const HIDDEN: usize = 64;

fn moe(norm: bool, shared: bool, quantised: bool) -> FusedMoe {
    let (hidden, width, experts) = (HIDDEN, 32, 6);
    let config = MoeConfig {
        num_experts: experts,
        num_experts_per_tok: 2,
        moe_intermediate_size: width,
        scoring: RouterScoring::SoftmaxThenTopK,
        norm_topk_prob: norm,
        shared_expert_intermediate_size: shared.then_some(96),
        dense_layers: Vec::new(),
    };
    FusedMoe::new(
        Linear::from_weight(values(experts * hidden, 7), hidden, experts),
        None,
        (0..experts)
            .map(|e| mlp(hidden, width, 100 + 2 * e as u64, quantised))
            .collect(),
        &config,
        shared.then(|| SharedExpert {
            mlp: mlp(hidden, 96, 50, quantised),
            gate: values(hidden, 60),
        }),
    )
}

/// One token the plain way: every probability (or gpt-oss's biased logits), its top
/// two, each expert's MLP alone.
fn reference(m: &FusedMoe, x: &[f32], act_fn: Activation) -> Vec<f32> {
    let h = x.len();
    let mut logits = vec![0.0; m.experts.len()];
    m.router.forward(x, &mut logits, 1);
    let gpt_oss = m.scoring == RouterScoring::TopKThenSoftmax;
    if let Some(b) = &m.router_bias {
        logits.iter_mut().zip(b).for_each(|(l, b)| *l += b);
    }
    if !gpt_oss {
        softmax_in_place(&mut logits);
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let chosen = &order[..m.top_k];
    let weight = |e: usize| -> f32 {
        if gpt_oss {
            let max = logits[chosen[0]];
            let sum: f32 = chosen.iter().map(|&c| (logits[c] - max).exp()).sum();
            (logits[e] - max).exp() / sum
        } else if m.norm_topk_prob {
            logits[e] / chosen.iter().map(|&c| logits[c]).sum::<f32>()
        } else {
            logits[e]
        }
    };
    let mut out = vec![0.0; h];
    let mut chosen = chosen.to_vec();
    chosen.sort();
    let run = |mlp: &GatedMlp| {
        let mut gu = vec![0.0; 2 * mlp.width];
        mlp.gate_up_proj.forward(x, &mut gu, 1);
        if let Some(b) = &mlp.gate_up_bias {
            gu.iter_mut().zip(b).for_each(|(v, b)| *v += b);
        }
        let act: Vec<f32> = (0..mlp.width)
            .map(|i| {
                let (g, u) = (gu[i], gu[mlp.width + i]);
                match act_fn {
                    Activation::SwigluOai { alpha, limit } => {
                        let g = g.min(limit);
                        (u.clamp(-limit, limit) + 1.0) * g / (1.0 + (-alpha * g).exp())
                    }
                    _ => g / (1.0 + (-g).exp()) * u,
                }
            })
            .collect();
        let mut y = vec![0.0; h];
        mlp.down_proj.forward(&act, &mut y, 1);
        if let Some(b) = &mlp.down_bias {
            y.iter_mut().zip(b).for_each(|(v, b)| *v += b);
        }
        y
    };
    for e in chosen {
        let w = weight(e);
        for (o, v) in out.iter_mut().zip(run(&m.experts[e])) {
            *o += w * v;
        }
    }
    if let Some(s) = &m.shared {
        let g: f32 = x.iter().zip(&s.gate).map(|(a, b)| a * b).sum();
        let g = 1.0 / (1.0 + (-g).exp());
        for (o, v) in out.iter_mut().zip(run(&s.mlp)) {
            *o += g * v;
        }
    }
    out
}

/// A batch grouped by expert computes what each token computes alone, to the bit, and
/// what the plain per-token reference (each expert's own product) computes: in f32,
/// and with quantised experts, which run in one grouped product.
#[test]
fn grouped_batch_is_each_token_alone_and_the_reference() {
    for (norm, shared, quantised, gpt_oss) in [
        (false, false, false, false),
        (true, false, false, false),
        (false, true, false, false),
        (true, true, true, false),
        (false, false, false, true),
        (false, false, true, true),
    ] {
        let (m, act) = if gpt_oss {
            (gpt_oss_moe(quantised), GPT_OSS_ACT)
        } else {
            (moe(norm, shared, quantised), Activation::Silu)
        };
        assert_eq!(m.grouped, quantised);
        let (t, h) = (9, HIDDEN);
        let x = values(t * h, 3);
        let (mut buf, mut gather) = (MoeBuffers::default(), GatherBuffers::default());
        let mut run = |x: &[f32], t: usize, out: &mut Vec<f32>| {
            let comm = &SingleProcess;
            m.forward(x, x, t, h, act, comm, &mut buf, &mut gather, out)
                .unwrap()
        };
        let mut out = Vec::new();
        run(&x, t, &mut out);
        let batched = out.clone();
        for i in 0..t {
            let row = &x[i * h..(i + 1) * h];
            run(row, 1, &mut out);
            assert_eq!(&out[..h], &batched[i * h..(i + 1) * h], "token {i} alone");
            let want = reference(&m, row, act);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "token {i}: {a} vs {b}");
                if quantised {
                    // The experts' products are each other's to the bit; the sums of
                    // their outputs differ only in rounding.
                    assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "token {i}");
                }
            }
        }
    }
}

/// A token reads its `k` experts; a batch the union of its tokens' picks, expected where
/// they pick evenly: 6 experts, top 2, so 2 for one token, `6·(1 − (2/3)^b)` for `b`, all
/// 6 in the limit, the router and the shared expert once whatever the batch.
#[test]
fn bytes_read_per_step_grow_with_the_batch_to_every_expert() {
    let m = moe(true, true, true);
    let expert = m.experts[0].nbytes() as f64;
    let fixed = m.bytes_per_step(1) - 2.0 * expert;
    let picked = |b: usize| (m.bytes_per_step(b) - fixed) / expert;
    assert!((picked(1) - 2.0).abs() < 1e-9);
    assert!((picked(2) - 6.0 * (1.0 - 4.0 / 9.0)).abs() < 1e-9);
    assert!((picked(64) - 6.0).abs() < 1e-9);
    let shared = m.shared.as_ref().unwrap().mlp.nbytes() as f64;
    assert_eq!(fixed, (m.router.weight().nbytes() as f64) + shared);
}
