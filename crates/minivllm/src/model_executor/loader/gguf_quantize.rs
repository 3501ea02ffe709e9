//! `minivllm quantize`: re-quantises a GGUF model's weight matrices into another block
//! format and writes a new GGUF file, as llama.cpp's `llama-quantize` does.
//!
//! Each 2-D weight is dequantised to f32 and quantised again by [`quantize_to`]; norms and
//! other 1-D tensors are copied. The choice per tensor follows llama.cpp's: the output
//! projection (and tied token embeddings) take 6 bits, rows that are not whole blocks of
//! 256 take the 32-value fallback of a K format, and the `_M` mixes give `attn_v` and
//! `ffn_down` 6 bits in the first and last eighth of the layers and every third between.

use std::collections::BTreeMap;
use std::path::Path;

use minivllm_kernels::qdot::quantize_to;
use minivllm_kernels::quant::GgmlType;

use super::gguf::{GgufFile, GgufTensorInfo, GgufValue};
use super::gguf_weights::layer_index;
use super::gguf_writer::{write_gguf, TensorEntry};
use super::weights::Quantization;
use super::LoadError;

/// A target of `minivllm quantize`: one format for every weight, or a llama.cpp `_M` mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)] // llama.cpp's names
pub enum FileQuantization {
    Plain(Quantization),
    Q4_K_M,
    Q5_K_M,
}

impl std::str::FromStr for FileQuantization {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "q4_k_m" => Ok(FileQuantization::Q4_K_M),
            "q5_k_m" => Ok(FileQuantization::Q5_K_M),
            other => other
                .parse()
                .map(FileQuantization::Plain)
                .map_err(|e: String| format!("{e}, or the mixes q4_k_m, q5_k_m")),
        }
    }
}

impl FileQuantization {
    /// llama.cpp's `LLAMA_FTYPE` for `general.file_type`.
    fn file_type(self) -> u32 {
        match self {
            FileQuantization::Plain(q) => match q {
                Quantization::Q4_0 => 2,
                Quantization::Q4_1 => 3,
                Quantization::Q8_0 => 7,
                Quantization::Q5_0 => 8,
                Quantization::Q5_1 => 9,
                Quantization::Q4_K => 14,
                Quantization::Q5_K => 16,
                Quantization::Q6_K => 18,
            },
            FileQuantization::Q4_K_M => 15,
            FileQuantization::Q5_K_M => 17,
        }
    }

    /// The format for tensor `name` (a GGUF name: `blk.3.attn_v.weight`) with rows of
    /// `cols` values, in a model of `n_layers`; `None` keeps the tensor as it is.
    pub(crate) fn tensor_type(self, name: &str, cols: usize, n_layers: usize) -> Option<GgmlType> {
        let base = match self {
            FileQuantization::Plain(q) => q,
            FileQuantization::Q4_K_M => Quantization::Q4_K,
            FileQuantization::Q5_K_M => Quantization::Q5_K,
        };
        let mix = matches!(self, FileQuantization::Q4_K_M | FileQuantization::Q5_K_M);
        let more_bits = mix
            && (name.ends_with(".attn_v.weight") || name.ends_with(".ffn_down.weight"))
            && layer_index(name).is_some_and(|i| use_more_bits(i, n_layers));
        let q = if name == "output.weight" || name == "token_embd.weight" {
            base.for_output()
        } else if more_bits {
            Quantization::Q6_K
        } else {
            base
        };
        q.ggml_type_for(cols)
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers, and every third
/// layer between them.
fn use_more_bits(layer: usize, n_layers: usize) -> bool {
    let eighth = n_layers / 8;
    layer < eighth || layer >= 7 * n_layers / 8 || (layer - eighth) % 3 == 2
}

/// What [`quantize_gguf`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeReport {
    pub input_bytes: u64,
    pub output_bytes: u64,
    /// Tensors per format written, e.g. `{"Q5_0": 151, "Q4_K": 15, …}`.
    pub tensors_by_type: BTreeMap<&'static str, usize>,
}

/// Re-quantises `input`'s weights to `target`, writing `output`. `progress(done, total)` is
/// called after each tensor.
pub fn quantize_gguf(
    input: &Path,
    output: &Path,
    target: FileQuantization,
    mut progress: impl FnMut(usize, usize),
) -> Result<QuantizeReport, LoadError> {
    if input == output {
        return Err(LoadError::Config(format!(
            "quantize: {} is both the input and the output",
            input.display()
        )));
    }
    let file = GgufFile::open(input)?;
    let arch = file
        .get("general.architecture")
        .and_then(GgufValue::as_str)
        .unwrap_or("llama")
        .to_string();
    let n_layers = file
        .get(&format!("{arch}.block_count"))
        .and_then(GgufValue::as_u64)
        .unwrap_or(0) as usize;
    let plan: Vec<TensorEntry> = file
        .tensors
        .iter()
        .map(|t| TensorEntry {
            ty: planned_type(t, target, n_layers),
            ..t.into()
        })
        .collect();
    let mut metadata = file.metadata.clone();
    metadata.insert(
        "general.file_type".into(),
        GgufValue::U32(target.file_type()),
    );
    metadata.insert("general.quantization_version".into(), GgufValue::U32(2));
    let mut tensors_by_type = BTreeMap::new();
    for t in &plan {
        *tensors_by_type.entry(t.ty.name()).or_insert(0) += 1;
    }
    let total = plan.len();
    let output_bytes = write_gguf(output, &metadata, &plan, file.alignment, |i| {
        let (info, to) = (&file.tensors[i], plan[i].ty);
        let bytes = if info.ggml_type == to {
            file.tensor_bytes(info).to_vec()
        } else {
            let x = file.dequantize_tensor(info)?;
            quantize_to(to, &x).ok_or_else(|| {
                LoadError::Config(format!("tensor {}: cannot quantise to {to}", info.name))
            })?
        };
        file.release_tensor(info);
        progress(i + 1, total);
        Ok(bytes)
    })?;
    Ok(QuantizeReport {
        input_bytes: std::fs::metadata(input).map_or(0, |m| m.len()),
        output_bytes,
        tensors_by_type,
    })
}

/// The format a tensor is written in: weights (2-D `.weight` tensors) that can be read as
/// f32 take the target's format for their row length; everything else stays.
fn planned_type(t: &GgufTensorInfo, target: FileQuantization, n_layers: usize) -> GgmlType {
    let weight = t.dims.len() == 2 && t.name.ends_with(".weight") && t.ggml_type.can_dequantize();
    let cols = t.dims.first().copied().unwrap_or(0) as usize;
    weight
        .then(|| target.tensor_type(&t.name, cols, n_layers))
        .flatten()
        .unwrap_or(t.ggml_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_bits_follow_llama_cpp() {
        // 30 layers: 0..3 and 26..30, and 5, 8, ..., 23 between.
        let more: Vec<usize> = (0..30).filter(|&i| use_more_bits(i, 30)).collect();
        assert_eq!(more, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]);
    }

    #[test]
    fn each_tensor_gets_llama_cpp_s_choice() {
        let m = FileQuantization::Q4_K_M;
        assert_eq!(
            m.tensor_type("blk.0.attn_v.weight", 1536, 30),
            Some(GgmlType::Q6_K)
        );
        assert_eq!(
            m.tensor_type("blk.3.attn_v.weight", 1536, 30),
            Some(GgmlType::Q4_K)
        );
        assert_eq!(
            m.tensor_type("blk.3.attn_v.weight", 576, 30),
            Some(GgmlType::Q5_0)
        );
        assert_eq!(
            m.tensor_type("blk.5.ffn_down.weight", 576, 30),
            Some(GgmlType::Q8_0)
        );
        assert_eq!(
            m.tensor_type("output.weight", 4096, 30),
            Some(GgmlType::Q6_K)
        );
        let q8 = FileQuantization::Plain(Quantization::Q8_0);
        assert_eq!(
            q8.tensor_type("token_embd.weight", 576, 30),
            Some(GgmlType::Q8_0)
        );
        let q4 = FileQuantization::Plain(Quantization::Q4_0);
        assert_eq!(q4.tensor_type("blk.1.attn_q.weight", 40, 30), None);
        assert_eq!("Q5_K_M".parse(), Ok(FileQuantization::Q5_K_M));
        assert_eq!(
            "q6_k".parse(),
            Ok(FileQuantization::Plain(Quantization::Q6_K))
        );
        assert!("q3_k_s"
            .parse::<FileQuantization>()
            .unwrap_err()
            .contains("q4_k_m"));
    }
}
