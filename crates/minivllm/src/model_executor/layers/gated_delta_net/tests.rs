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
        tiled: false,
    },
    conv_width: 4,
    rms_norm_eps: 1e-6,
};

/// The fixture, and its layer loaded in f32.
fn fixture_layer() -> (Fixture, GatedDeltaNet) {
    let src = Fixture::read();
    let layer = GatedDeltaNet::load(
        &src,
        "model.layers.0.linear_attn",
        &CONFIG,
        &LoadOptions::FLOAT32,
    )
    .unwrap();
    (src, layer)
}

/// The layer's output equals transformers' for a whole prompt at once, and for the same
/// tokens as a prefill of 9 (the chunked rule) then 4 decode steps (the recurrence),
/// the state carried between calls.
#[test]
fn matches_transformers_whole_and_split() {
    let (src, layer) = fixture_layer();
    let (x, want) = (&src.0["x"].data, &src.0["y"].data);
    let hidden = CONFIG.hidden_size;
    let t = x.len() / hidden;
    let mut buf = DeltaBuffers::default();
    let mut out = Vec::new();
    let splits: [&[usize]; 2] = [&[9, 1, 1, 1, 1], &[t]];
    for split in splits {
        // Slot 1 of two, the other left as it is: a slot's state is its own.
        let mut states = LayerStateCache::zeros(layer.state_lens(), 2);
        let mut got = Vec::new();
        let mut at = 0;
        for &n in split {
            let seqs = [DeltaSeq::in_slot(0..n, 1, at == 0)];
            let x = &x[at * hidden..(at + n) * hidden];
            layer.forward(x, &seqs, &mut states, &mut buf, &mut out);
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

/// Two sequences in one batch get what each gets alone: the prompt's first 9 tokens
/// (prefill, chunked) beside its 10th token as another sequence's decode step, then the
/// same with the slots' earlier contents stale (`fresh` must clear them).
#[test]
fn a_batch_of_sequences_equals_each_alone() {
    let (src, layer) = fixture_layer();
    let x = &src.0["x"].data;
    let h = CONFIG.hidden_size;
    let (mut buf, mut out) = (DeltaBuffers::default(), Vec::new());
    let mut alone = |rows: Range<usize>| {
        let mut states = LayerStateCache::zeros(layer.state_lens(), 1);
        let seqs = [DeltaSeq::in_slot(0..rows.len(), 0, true)];
        layer.forward(
            &x[rows.start * h..rows.end * h],
            &seqs,
            &mut states,
            &mut buf,
            &mut out,
        );
        out.clone()
    };
    let want: Vec<f32> = [alone(0..9), alone(9..10)].concat();
    let mut states = LayerStateCache::zeros(layer.state_lens(), 3);
    for _ in 0..2 {
        let seqs = [
            DeltaSeq::in_slot(0..9, 2, true),
            DeltaSeq::in_slot(9..10, 0, true),
        ];
        let (mut buf, mut out) = (DeltaBuffers::default(), Vec::new());
        layer.forward(&x[..10 * h], &seqs, &mut states, &mut buf, &mut out);
        assert_eq!(out, want);
    }
}

/// A snapshot taken inside a step holds the state at its boundary: a sequence restored
/// from it continues exactly as the one that took it, even when the slot it restores from
/// starts another sequence in the same step (restores come first).
#[test]
fn a_snapshot_restored_continues_the_sequence() {
    let (src, layer) = fixture_layer();
    let x = &src.0["x"].data;
    let h = CONFIG.hidden_size;
    let t = x.len() / h;
    let (mut buf, mut out) = (DeltaBuffers::default(), Vec::new());
    let mut states = LayerStateCache::zeros(layer.state_lens(), 3);
    let whole = DeltaSeq {
        snapshot: Some((6, 2)),
        ..DeltaSeq::in_slot(0..t, 0, true)
    };
    layer.forward(&x[..t * h], &[whole], &mut states, &mut buf, &mut out);
    let want = out[6 * h..].to_vec();
    let resumed = DeltaSeq {
        restore_from: Some(2),
        ..DeltaSeq::in_slot(0..t - 6, 1, false)
    };
    // Slot 2 starts a sequence of its own behind the restored one.
    let other = DeltaSeq::in_slot(t - 6..t, 2, true);
    let rows = [&x[6 * h..t * h], &x[..6 * h]].concat();
    layer.forward(&rows, &[resumed, other], &mut states, &mut buf, &mut out);
    assert_eq!(out[..(t - 6) * h], want[..]);
}

#[test]
fn softplus_follows_torch() {
    assert_eq!(softplus(30.0), 30.0);
    assert!((softplus(0.0) - std::f32::consts::LN_2).abs() < 1e-7);
    assert!((softplus(-5.0) - 0.006_715_348).abs() < 1e-8);
}
