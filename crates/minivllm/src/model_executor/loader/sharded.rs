//! One tensor-parallel rank's view of a model's weights: each tensor is cut to the rank's
//! shard as it is read, in its stored format, so a rank keeps only its part. Every split
//! is by output rows (see `distributed::shards` for why): a row is a run of whole blocks,
//! so any row count splits, whatever the format.

use std::ops::Range;

use minivllm_kernels::hmatmul::HalfKind;

use crate::distributed::share;

use super::weights::{QuantTensor, Tensor, WeightSource};
use super::LoadError;

/// How the ranks split the output rows of a `[rows, cols]` weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitDim {
    /// Each rank holds its [`share`] of the rows, and computes those outputs.
    Rows,
    /// Equal parts that `copies` consecutive ranks each hold whole: the KV heads, when a
    /// model has fewer of them than there are ranks (as vLLM replicates them).
    SharedRows { copies: usize },
}

/// This rank's place in its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rank {
    pub rank: usize,
    pub world_size: usize,
}

impl Rank {
    /// This rank's equal part of `0..len`; an error naming `tensor` when `len` does not
    /// split evenly.
    pub fn part(&self, tensor: &str, len: usize) -> Result<Range<usize>, LoadError> {
        let per = len / self.world_size;
        if !len.is_multiple_of(self.world_size) {
            return Err(LoadError::Config(format!(
                "tensor {tensor}: {len} cannot be split over {} ranks into equal parts",
                self.world_size
            )));
        }
        Ok(self.rank * per..(self.rank + 1) * per)
    }

    /// The rows this rank holds out of `rows`, split as `dim` says.
    fn rows(&self, tensor: &str, dim: SplitDim, rows: usize) -> Result<Range<usize>, LoadError> {
        match dim {
            SplitDim::SharedRows { copies } => Rank {
                rank: self.rank / copies.max(1),
                world_size: self.world_size / copies.max(1),
            }
            .part(tensor, rows),
            SplitDim::Rows => Ok(share(rows, self.rank, self.world_size)),
        }
    }
}

/// A weight source whose tensors come cut to one rank's shard; `split` says how each
/// tensor is split (`None`: every rank keeps it whole, as norms are).
pub struct ShardedSource<'a> {
    inner: &'a dyn WeightSource,
    rank: Rank,
    split: &'a (dyn Fn(&str) -> Option<SplitDim> + Sync),
}

impl<'a> ShardedSource<'a> {
    pub fn new(
        inner: &'a dyn WeightSource,
        rank: Rank,
        split: &'a (dyn Fn(&str) -> Option<SplitDim> + Sync),
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
        let r = self.rank.rows(name, dim, rows)?;
        let mut shape = t.shape.clone();
        shape[0] = r.len();
        Ok(Tensor {
            shape,
            data: t.data[r.start * cols..r.end * cols].to_vec(),
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
        let (rows, _) = dims(name, &shape)?;
        let mut shape = shape.clone();
        shape[0] = self.rank.rows(name, dim, rows)?.len();
        Ok(shape)
    }

    /// A row is a run of whole blocks, so a row split takes whole rows as stored.
    fn load_quantized(&self, name: &str) -> Result<Option<QuantTensor>, LoadError> {
        let Some(t) = self.inner.load_quantized(name)? else {
            return Ok(None);
        };
        let Some(dim) = (self.split)(name) else {
            return Ok(Some(t));
        };
        let (rows, cols) = dims(name, &t.shape)?;
        let row_bytes = cols / t.ty.block_size() * t.ty.type_size();
        let r = self.rank.rows(name, dim, rows)?;
        Ok(Some(QuantTensor {
            shape: vec![r.len(), cols],
            ty: t.ty,
            data: t.data[r.start * row_bytes..r.end * row_bytes].to_vec(),
        }))
    }

    fn stored_half(&self, name: &str) -> Option<HalfKind> {
        self.inner.stored_half(name)
    }
}

#[cfg(test)]
mod tests;
