use std::collections::HashMap;

use super::*;
use crate::model_executor::loader::weights::Tensor;

/// `scripts/make_gated_delta_reference.py`'s layer: transformers 5.19's `Qwen3_5GatedDeltaNet`
/// with random weights, and its output on 13 tokens.
struct Fixture(HashMap<String, Tensor>);

impl Fixture {
    fn read() -> Self {
        let tensors = include_str!("qwen3_5.txt")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let mut parts = l.split_whitespace();
                let name = parts.next().expect("a name").to_string();
                let shape = (parts.next().expect("a shape").split('x'))
                    .map(|d| d.parse().expect("a dimension"))
                    .collect();
                let data = parts.map(|v| v.parse().expect("a float")).collect();
                (name, Tensor { shape, data })
            })
            .collect();
        Self(tensors)
    }
}

impl WeightSource for Fixture {
    fn load(&self, name: &str) -> Result<Tensor, LoadError> {
        self.0
            .get(name)
            .map(|t| Tensor {
                shape: t.shape.clone(),
                data: t.data.clone(),
            })
            .ok_or_else(|| LoadError::MissingTensor(name.to_string()))
    }

    fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }
}

const CONFIG: GatedDeltaNetConfig = GatedDeltaNetConfig {
    hidden_size: 32,
    heads: DeltaHeads {
        num_k_heads: 2,
        num_v_heads: 4,
        k_dim: 8,
        v_dim: 8,
    },
    conv_width: 4,
    rms_norm_eps: 1e-6,
};

/// The layer's output equals transformers' for a whole prompt at once, and for the same
/// tokens as a prefill of 9 (the chunked rule) then 4 decode steps (the recurrence),
/// the state carried between calls.
#[test]
fn matches_transformers_whole_and_split() {
    let src = Fixture::read();
    let layer = GatedDeltaNet::load(
        &src,
        "model.layers.0.linear_attn",
        &CONFIG,
        &LoadOptions::FLOAT32,
    )
    .unwrap();
    let (x, want) = (&src.0["x"].data, &src.0["y"].data);
    let hidden = CONFIG.hidden_size;
    let t = x.len() / hidden;
    let [conv_len, rec_len] = layer.state_lens();
    let mut buf = DeltaBuffers::default();
    let mut out = Vec::new();
    let splits: [&[usize]; 2] = [&[9, 1, 1, 1, 1], &[t]];
    for split in splits {
        let (mut conv, mut rec) = (vec![0.0; conv_len], vec![0.0; rec_len]);
        let mut got = Vec::new();
        let mut at = 0;
        for &n in split {
            let state = DeltaState {
                conv: &mut conv,
                recurrent: &mut rec,
            };
            layer.forward(
                &x[at * hidden..(at + n) * hidden],
                n,
                state,
                &mut buf,
                &mut out,
            );
            got.extend_from_slice(&out);
            at += n;
        }
        // f32 rounding, relative to each output's size (they reach 8): about 1e-6 at every
        // token but the ninth, 2.1e-5, the same through either split (so through either
        // form of the rule).
        let worst = got
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
            .fold(0.0f32, f32::max);
        assert!(
            worst < 1e-4,
            "split {split:?}: worst relative difference {worst}"
        );
    }
}

#[test]
fn softplus_follows_torch() {
    assert_eq!(softplus(30.0), 30.0);
    assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
    assert!((softplus(-5.0) - 0.006_715_348).abs() < 1e-8);
}
