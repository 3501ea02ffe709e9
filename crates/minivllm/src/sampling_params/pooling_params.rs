//! How an embedding request pools its prompt's hidden states (vLLM's `PoolingParams` and
//! `--pooler-config`): a decoder model's final hidden state at the last token, or their mean
//! over the prompt, L2-normalised by default.

use serde::{Deserialize, Serialize};

/// vLLM's pooling types a decoder model supports here (`LAST` is its default for them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum PoolingType {
    #[default]
    Last,
    Mean,
}

/// One request's pooling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolingParams {
    pub pooling_type: PoolingType,
    /// Scale the vector to unit length (vLLM's default for embeddings).
    pub normalize: bool,
}

impl Default for PoolingParams {
    fn default() -> Self {
        Self {
            pooling_type: PoolingType::Last,
            normalize: true,
        }
    }
}

impl PoolingParams {
    /// vLLM's `--pooler-config` JSON (`{"pooling_type": "MEAN", "normalize": true}`), with
    /// the field at fault named.
    pub fn from_json(text: &str) -> Result<Self, String> {
        serde_json::from_str(text).map_err(|e| {
            format!(
                "--pooler-config {text:?}: {e} (expected {{\"pooling_type\": \"LAST\" | \
                 \"MEAN\", \"normalize\": true | false}})"
            )
        })
    }

    /// The pooled vector of the prompt's hidden states, `sum` being their sum (mean) or the
    /// last one's (last), over `count` positions; normalised in place if asked.
    pub fn finish(&self, mut sum: Vec<f32>, count: usize) -> Vec<f32> {
        if self.pooling_type == PoolingType::Mean && count > 0 {
            let inv = 1.0 / count as f32;
            sum.iter_mut().for_each(|x| *x *= inv);
        }
        if self.normalize {
            let norm = sum.iter().map(|x| x * x).sum::<f32>().sqrt();
            // vLLM's F.normalize clamps the norm at 1e-12.
            let inv = 1.0 / norm.max(1e-12);
            sum.iter_mut().for_each(|x| *x *= inv);
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_and_normalise_as_vllm() {
        let mean = PoolingParams {
            pooling_type: PoolingType::Mean,
            normalize: false,
        };
        assert_eq!(mean.finish(vec![2.0, 4.0], 2), vec![1.0, 2.0]);
        let unit = PoolingParams::default().finish(vec![3.0, 4.0], 1);
        assert_eq!(unit, vec![0.6, 0.8]);
        assert_eq!(
            PoolingParams::default().finish(vec![0.0, 0.0], 1),
            vec![0.0, 0.0]
        );
        let parsed = PoolingParams::from_json(r#"{"pooling_type": "MEAN"}"#).unwrap();
        assert_eq!(
            (parsed.pooling_type, parsed.normalize),
            (PoolingType::Mean, true)
        );
        let bad = PoolingParams::from_json(r#"{"pooling_type": "CLS"}"#).unwrap_err();
        assert!(bad.contains("CLS") && bad.contains("MEAN"), "{bad}");
    }
}
