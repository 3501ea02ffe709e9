//! One tensor-parallel rank's view of a model's weights: each tensor is cut to the rank's
//! shard as it is read, in its stored format, so a rank keeps only its part (Megatron's
//! column- and row-parallel splits).

use std::ops::Range;

use minivllm_kernels::hmatmul::HalfKind;

use super::weights::{QuantTensor, Tensor, WeightSource};
use super::LoadError;

/// Which dimension of a `[rows, cols]` weight the ranks split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitDim {
    /// Output features (column-parallel: q/k/v, gate/up; the vocabulary of the embedding
    /// and LM head). Each rank computes its slice of the outputs.
    Rows,
    /// Output features in parts that `copies` consecutive ranks each hold whole: the KV
    /// heads, when a model has fewer of them than there are ranks (as vLLM replicates them).
    SharedRows { copies: usize },
    /// Input features (row-parallel: the attention output and down projections). Each
    /// rank computes a partial sum that an all-reduce completes.
    Cols,
}

/// This rank's place in its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    pub rank: usize,
    pub world_size: usize,
}

impl Rank {
    /// This rank's equal part of `0..len`; an error naming `tensor` when `len` does not
    /// split evenly into parts of whole `unit`s (a quantised block, a head).
    pub fn part(&self, tensor: &str, len: usize, unit: usize) -> Result<Range<usize>, LoadError> {
        let per = len / self.world_size;
        if !len.is_multiple_of(self.world_size) || !per.is_multiple_of(unit) {
            return Err(LoadError::Config(format!(
                "tensor {tensor}: {len} cannot be split over {} ranks in whole units of {unit}",
                self.world_size
            )));
        }
        Ok(self.rank * per..(self.rank + 1) * per)
    }

    /// The rows of `dim` (a row split) this rank holds out of `rows`.
    fn rows(&self, tensor: &str, dim: SplitDim, rows: usize) -> Result<Range<usize>, LoadError> {
        match dim {
            SplitDim::SharedRows { copies } if copies > 1 => Rank {
                rank: self.rank / copies,
                world_size: self.world_size / copies,
            }
            .part(tensor, rows, 1),
            _ => self.part(tensor, rows, 1),
        }
    }
}

/// A weight source whose tensors come cut to one rank's shard; `split` says how each
/// tensor is split (`None`: every rank keeps it whole, as norms are).
pub struct ShardedSource<'a> {
    inner: &'a dyn WeightSource,
    rank: Rank,
    split: &'a dyn Fn(&str) -> Option<SplitDim>,
}

impl<'a> ShardedSource<'a> {
    pub fn new(
        inner: &'a dyn WeightSource,
        rank: Rank,
        split: &'a dyn Fn(&str) -> Option<SplitDim>,
    ) -> Self {
        Self { inner, rank, split }
    }
}

/// A split tensor's rows and columns; a vector (a bias) is one column.
fn dims(name: &str, shape: &[usize]) -> Result<(usize, usize), LoadError> {
    match *shape {
        [rows, cols] => Ok((rows, cols)),
        [rows] => Ok((rows, 1)),
        _ => Err(LoadError::Config(format!(
            "tensor {name}: a split needs 1 or 2 dimensions, not {shape:?}"
        ))),
    }
}

impl WeightSource for ShardedSource<'_> {
    fn load(&self, name: &str) -> Result<Tensor, LoadError> {
        let t = self.inner.load(name)?;
        let Some(dim) = (self.split)(name) else {
            return Ok(t);
        };
        let (rows, cols) = dims(name, &t.shape)?;
        Ok(match dim {
            SplitDim::Rows | SplitDim::SharedRows { .. } => {
                let r = self.rank.rows(name, dim, rows)?;
                let mut shape = t.shape.clone();
                shape[0] = r.len();
                Tensor {
                    shape,
                    data: t.data[r.start * cols..r.end * cols].to_vec(),
                }
            }
            SplitDim::Cols => {
                let c = self.rank.part(name, cols, 1)?;
                let data = t.data.chunks_exact(cols).flat_map(|row| &row[c.clone()]);
                Tensor {
                    shape: vec![rows, c.len()],
                    data: data.copied().collect(),
                }
            }
        })
    }

    fn contains(&self, name: &str) -> bool {
        self.inner.contains(name)
    }

    fn tensor_shape(&self, name: &str) -> Result<Vec<usize>, LoadError> {
        let shape = self.inner.tensor_shape(name)?;
        let Some(dim) = (self.split)(name) else {
            return Ok(shape);
        };
        let (rows, cols) = dims(name, &shape)?;
        Ok(match dim {
            SplitDim::Rows | SplitDim::SharedRows { .. } => {
                let mut shape = shape.clone();
                shape[0] = self.rank.rows(name, dim, rows)?.len();
                shape
            }
            SplitDim::Cols => vec![rows, self.rank.part(name, cols, 1)?.len()],
        })
    }

    /// Cut along whole blocks: a row is a run of blocks, so a row split takes whole rows
    /// and a column split the same run of blocks from every row.
    fn load_quantized(&self, name: &str) -> Result<Option<QuantTensor>, LoadError> {
        let Some(t) = self.inner.load_quantized(name)? else {
            return Ok(None);
        };
        let Some(dim) = (self.split)(name) else {
            return Ok(Some(t));
        };
        let (rows, cols) = dims(name, &t.shape)?;
        let (block, bytes) = (t.ty.block_size(), t.ty.type_size());
        let row_bytes = cols / block * bytes;
        let (shape, data) = match dim {
            SplitDim::Rows | SplitDim::SharedRows { .. } => {
                let r = self.rank.rows(name, dim, rows)?;
                let data = t.data[r.start * row_bytes..r.end * row_bytes].to_vec();
                (vec![r.len(), cols], data)
            }
            SplitDim::Cols => {
                let c = self.rank.part(name, cols, block)?;
                let (from, to) = (c.start / block * bytes, c.end / block * bytes);
                let data = t
                    .data
                    .chunks_exact(row_bytes)
                    .flat_map(|row| &row[from..to]);
                (vec![rows, c.len()], data.copied().collect())
            }
        };
        Ok(Some(QuantTensor {
            shape,
            ty: t.ty,
            data,
        }))
    }

    fn stored_half(&self, name: &str) -> Option<HalfKind> {
        self.inner.stored_half(name)
    }
}

#[cfg(test)]
mod tests;
