//! The tiny random-weight models of `tests/data/tiny_models/<family>` (made by
//! `scripts/make_tiny_reference_models.py`): their `config.json`, and weights drawn again
//! here from the rules `reference.json` lists, as the script drew them for transformers,
//! so that no weight file is committed.

use std::path::PathBuf;

use minivllm::config::ModelConfig;
use minivllm::model_executor::loader::weights::{Tensor, WeightSource};
use minivllm::model_executor::loader::LoadError;
use serde_json::Value;

pub fn folder(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/tiny_models/{family}"))
}

pub fn reference(family: &str) -> Value {
    let text = std::fs::read_to_string(folder(family).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// `family`'s model as a Hugging Face folder in `dir`: its `config.json` and a
/// `model.safetensors` of its weights in f32, under the names transformers gives them.
pub fn write_hf_folder(family: &str, dir: &std::path::Path) {
    std::fs::copy(folder(family).join("config.json"), dir.join("config.json")).unwrap();
    write_safetensors(family, dir, |name| name.to_string(), &[]);
}

/// `family`'s weights in f32 as `dir/model.safetensors`, each under `rename(its name)`, and
/// `extra` tensors (name, shape) of zeros beside them.
pub fn write_safetensors(
    family: &str,
    dir: &std::path::Path,
    rename: impl Fn(&str) -> String,
    extra: &[(&str, Vec<usize>)],
) {
    use safetensors::tensor::TensorView;
    let weights = TinyWeights::of(family);
    let zeros = |shape: &[usize]| vec![0u8; 4 * shape.iter().product::<usize>()];
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = weights
        .names()
        .map(|name| {
            let t = weights.load(name).unwrap();
            let bytes = t.data.iter().flat_map(|f| f.to_le_bytes()).collect();
            (rename(name), t.shape, bytes)
        })
        .chain(
            extra
                .iter()
                .map(|(n, s)| (n.to_string(), s.clone(), zeros(s))),
        )
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, shape, bytes)| {
            let view = TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes);
            (n.clone(), view.unwrap())
        })
        .collect();
    safetensors::tensor::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

pub fn config(family: &str) -> ModelConfig {
    let text = std::fs::read_to_string(folder(family).join("config.json")).unwrap();
    ModelConfig::from_hf_json(&serde_json::from_str(&text).unwrap()).unwrap()
}

/// Each tensor is `offset + scale * u` with `u` uniform in [-1, 1) from its own stream.
pub struct TinyWeights {
    seed: u64,
    /// Name, shape, offset, scale.
    rules: Vec<(String, Vec<usize>, f32, f32)>,
}

impl TinyWeights {
    pub fn of(family: &str) -> Self {
        let r = reference(family);
        let rules = r["weights"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                let shape = w["shape"].as_array().unwrap();
                (
                    w["name"].as_str().unwrap().to_string(),
                    shape.iter().map(|d| d.as_u64().unwrap() as usize).collect(),
                    w["offset"].as_f64().unwrap() as f32,
                    w["scale"].as_f64().unwrap() as f32,
                )
            })
            .collect();
        Self {
            seed: r["seed"].as_u64().unwrap(),
            rules,
        }
    }

    /// Every tensor's name, as transformers names it.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().map(|r| r.0.as_str())
    }

    fn rule(&self, name: &str) -> Option<&(String, Vec<usize>, f32, f32)> {
        self.rules.iter().find(|r| r.0 == name)
    }
}

/// The script's stream: xorshift64* seeded by FNV-1a of the name mixed with the seed; the
/// top 24 bits of each output as a uniform in [-1, 1).
fn uniform(name: &str, seed: u64, n: usize) -> impl Iterator<Item = f32> {
    let h = name.bytes().fold(0xCBF2_9CE4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    });
    let mut x = h ^ seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    if x == 0 {
        x = 1;
    }
    (0..n).map(move |_| {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (r >> 40) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
    })
}

impl WeightSource for TinyWeights {
    fn load(&self, name: &str) -> Result<Tensor, LoadError> {
        let (_, shape, offset, scale) = self
            .rule(name)
            .ok_or_else(|| LoadError::MissingTensor(name.to_string()))?;
        let n = shape.iter().product();
        let data = uniform(name, self.seed, n)
            .map(|u| offset + scale * u)
            .collect();
        Ok(Tensor {
            shape: shape.clone(),
            data,
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.rule(name).is_some()
    }
}
