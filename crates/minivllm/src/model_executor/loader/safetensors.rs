//! Safetensors weights, single file or sharded (`model.safetensors.index.json`), memory-mapped.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::weights::{Tensor, WeightSource};
use super::LoadError;
use minivllm_kernels::hmatmul::HalfKind;

pub(crate) struct SafetensorsWeights {
    shards: Vec<(PathBuf, Mmap)>,
    /// Tensor name, as the model asks for it -> shard index and the name stored there.
    index: HashMap<String, (usize, String)>,
}

/// Where multimodal checkpoints keep their language model's tensors (transformers 5's
/// `model.language_model.`, and the `language_model.model.` of earlier Gemma 3 and LLaVA
/// files), and the text model's own names for them: such a folder loads its text model.
const LANGUAGE_MODEL_PREFIXES: [(&str, &str); 3] = [
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
];

/// The name the text model gives a stored tensor.
fn text_model_name(stored: &str) -> std::borrow::Cow<'_, str> {
    for (prefix, to) in LANGUAGE_MODEL_PREFIXES {
        if let Some(rest) = stored.strip_prefix(prefix) {
            return format!("{to}{rest}").into();
        }
    }
    stored.into()
}

impl SafetensorsWeights {
    /// Opens the weights in a Hugging Face model folder.
    pub(crate) fn open_dir(dir: &Path) -> Result<Self, LoadError> {
        let index_path = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        if index_path.is_file() {
            let json = super::read_json(&index_path)?;
            let map = json
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| {
                    LoadError::Config(format!("{} lacks weight_map", index_path.display()))
                })?;
            let mut files = map
                .iter()
                .map(|(tensor, shard)| match shard.as_str() {
                    Some(shard) => shard_path(dir, &index_path, shard),
                    None => Err(LoadError::Config(format!(
                        "{}: the shard of {tensor} is {shard}, not a file name",
                        index_path.display()
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            files.sort();
            files.dedup();
            Self::open_files(&files)
        } else if single.is_file() {
            Self::open_files(&[single])
        } else {
            Err(LoadError::Config(format!(
                "{} has neither model.safetensors nor model.safetensors.index.json",
                dir.display()
            )))
        }
    }

    /// Opens each file, which must be a regular file: opening a FIFO or a device would
    /// block or read without end.
    pub(crate) fn open_files(paths: &[PathBuf]) -> Result<Self, LoadError> {
        let mut shards = Vec::with_capacity(paths.len());
        let mut index = HashMap::new();
        for (i, path) in paths.iter().enumerate() {
            let io = |source| LoadError::Io {
                path: path.clone(),
                source,
            };
            let not_a_file = || {
                LoadError::Config(format!(
                    "{}: a safetensors shard must be a regular file",
                    path.display()
                ))
            };
            if !std::fs::metadata(path).map_err(io)?.is_file() {
                return Err(not_a_file());
            }
            let file = File::open(path).map_err(io)?;
            // Again on the open file, in case the path was replaced in between.
            if !file.metadata().map_err(io)?.is_file() {
                return Err(not_a_file());
            }
            // SAFETY: the file is opened read-only and the map lives as long as this
            // value; a file changed underneath us would garble weights, not memory safety
            // of the process beyond what any mmap-based loader accepts.
            let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
            let st = SafeTensors::deserialize(&mmap).map_err(|e| {
                LoadError::Config(format!(
                    "{}: not a valid safetensors file: {e}",
                    path.display()
                ))
            })?;
            for name in st.names() {
                index.insert(text_model_name(name).into_owned(), (i, name.to_string()));
            }
            shards.push((path.clone(), mmap));
        }
        Ok(Self { shards, index })
    }

    /// The tensor's header entry, its data still in the mapping.
    fn view(&self, name: &str) -> Result<TensorView<'_>, LoadError> {
        let (shard, stored) = self
            .index
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor(name.to_string()))?;
        let (path, mmap) = &self.shards[*shard];
        let st = SafeTensors::deserialize(mmap)
            .map_err(|e| LoadError::Config(format!("{}: {e}", path.display())))?;
        st.tensor(stored)
            .map_err(|_| LoadError::MissingTensor(name.to_string()))
    }
}

/// The path of a shard the index names, which must be a plain file name: the index is
/// text that anyone can write, and `../x`, `/x` or `sub/../../x` would read a file outside
/// the model's folder. (A shard that is a symbolic link is followed, as `model.safetensors`
/// is: the Hugging Face cache links every snapshot file to its blob in `../../blobs`.)
fn shard_path(dir: &Path, index_path: &Path, shard: &str) -> Result<PathBuf, LoadError> {
    let mut parts = Path::new(shard).components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(name)), None) if !shard.contains(['/', '\\']) => Ok(dir.join(name)),
        _ => Err(LoadError::Config(format!(
            "{}: shard {shard:?} is not a file name in the model's folder",
            index_path.display()
        ))),
    }
}

impl WeightSource for SafetensorsWeights {
    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn tensor_shape(&self, name: &str) -> Result<Vec<usize>, LoadError> {
        Ok(self.view(name)?.shape().to_vec())
    }

    fn stored_half(&self, name: &str) -> Option<HalfKind> {
        match self.view(name).ok()?.dtype() {
            Dtype::F16 => Some(HalfKind::F16),
            Dtype::BF16 => Some(HalfKind::BF16),
            _ => None,
        }
    }

    fn load(&self, name: &str) -> Result<Tensor, LoadError> {
        let view = self.view(name)?;
        let data = to_f32(name, view.dtype(), view.data())?;
        Ok(Tensor {
            shape: view.shape().to_vec(),
            data,
        })
    }

    fn load_bytes_index(
        &self,
        name: &str,
        index: usize,
    ) -> Result<(Vec<usize>, Vec<u8>), LoadError> {
        let view = self.view(name)?;
        if view.dtype() != Dtype::U8 {
            return Err(LoadError::UnsupportedTensorType {
                tensor: name.to_string(),
                type_name: format!("{:?} (bytes expected)", view.dtype()),
            });
        }
        let (shape, bytes) = (view.shape(), view.data());
        match shape.split_first() {
            Some((&n, rest)) if index < n => {
                let len = bytes.len() / n;
                Ok((
                    rest.to_vec(),
                    bytes[index * len..(index + 1) * len].to_vec(),
                ))
            }
            _ => Err(LoadError::Config(format!(
                "{name} has shape {shape:?}: no slice {index} of its first dimension"
            ))),
        }
    }

    /// Only the slice's bytes are read (and paged in): a stacked tensor of every expert is
    /// several GB.
    fn load_index(&self, name: &str, index: usize) -> Result<Tensor, LoadError> {
        let view = self.view(name)?;
        let Some((&n, rest)) = view.shape().split_first() else {
            return Err(LoadError::Config(format!("{name} is a scalar")));
        };
        if index >= n {
            return Err(LoadError::Config(format!(
                "{name} has shape {:?}: no slice {index} of its first dimension",
                view.shape()
            )));
        }
        let bytes = view.data();
        let len = bytes.len() / n;
        let data = to_f32(name, view.dtype(), &bytes[index * len..(index + 1) * len])?;
        Ok(Tensor {
            shape: rest.to_vec(),
            data,
        })
    }
}

/// Little-endian f32, f16 or bf16 values as f32.
fn to_f32(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, LoadError> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(LoadError::UnsupportedTensorType {
                tensor: name.to_string(),
                type_name: format!("{other:?}"),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(&str, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::tensor::serialize_to_file(views, None, path).unwrap();
    }

    #[test]
    fn sharded_f16_and_bf16_weights_load_as_f32() {
        let dir = tempfile::tempdir().unwrap();
        let vals = [1.5f32, -2.25, 0.0, 1024.0, 3.0e-3, -7.0];
        let f16: Vec<u8> = vals
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let bf16: Vec<u8> = vals
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        write(
            &dir.path().join("model-00001-of-00002.safetensors"),
            &[
                ("a.weight", Dtype::F16, vec![2, 3], f16),
                ("b.weight", Dtype::BF16, vec![6], bf16),
            ],
        );
        write(
            &dir.path().join("model-00002-of-00002.safetensors"),
            &[("c.weight", Dtype::F32, vec![3, 2], f32b)],
        );
        std::fs::write(
            dir.path().join("model.safetensors.index.json"),
            r#"{"metadata": {}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                "b.weight": "model-00001-of-00002.safetensors", "c.weight": "model-00002-of-00002.safetensors"}}"#,
        )
        .unwrap();
        let w = SafetensorsWeights::open_dir(dir.path()).unwrap();
        let a = w.load("a.weight").unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        for (got, want) in a.data.iter().zip(vals) {
            assert!((got - want).abs() <= want.abs() * 1e-3, "{got} vs {want}");
        }
        let b = w.load("b.weight").unwrap();
        for (got, want) in b.data.iter().zip(vals) {
            assert!((got - want).abs() <= want.abs() * 1e-2, "{got} vs {want}");
        }
        assert_eq!(w.load("c.weight").unwrap().data, vals);
        let e = w.load("d.weight").unwrap_err().to_string();
        assert!(e.contains("missing tensor d.weight"), "{e}");
    }

    #[test]
    fn folder_without_weights_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let e = SafetensorsWeights::open_dir(dir.path())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("neither model.safetensors"), "{e}");
    }

    #[test]
    fn unsupported_dtype_is_named() {
        let dir = tempfile::tempdir().unwrap();
        write(
            &dir.path().join("model.safetensors"),
            &[("x", Dtype::I32, vec![1], vec![0; 4])],
        );
        let w = SafetensorsWeights::open_dir(dir.path()).unwrap();
        let e = w.load("x").unwrap_err().to_string();
        assert!(e.contains("tensor x") && e.contains("I32"), "{e}");
    }
}
