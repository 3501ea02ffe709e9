//! Tensor-parallel projections as the layers run them: each rank holds a [`share`] of a
//! matrix's output rows, computes its columns of the output, and the ranks gather each
//! other's columns, so that every dot product is whole on one rank and the group computes
//! what one process does, to the bit (see `distributed::shards`).
//!
//! [`share`]: crate::distributed::share

use crate::distributed::{gather_columns, CommError, Communicator, GatherBuffers};
use crate::model_executor::layers::linear::Linear;

/// `buf` resized to `len` (growing only when a batch is larger than any before).
pub fn sized(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

/// `local`'s `t` rows whole: where `split`, `local` holds this rank's share of the
/// `width` columns, put together with the other ranks' in `whole`; otherwise `local` itself.
pub(crate) fn whole_rows<'a>(
    comm: &dyn Communicator,
    split: bool,
    local: &'a [f32],
    t: usize,
    width: usize,
    gather: &mut GatherBuffers,
    whole: &'a mut Vec<f32>,
) -> Result<&'a [f32], CommError> {
    if !split {
        return Ok(local);
    }
    let whole = sized(whole, t * width);
    gather_columns(comm, None, local, t, width, gather, whole)?;
    Ok(whole)
}

/// `out[t, width] = proj(input)`, where `proj` holds this rank's share of the `width`
/// output rows: each rank computes its columns and they are gathered.
#[allow(clippy::too_many_arguments)]
pub(crate) fn project_whole(
    comm: &dyn Communicator,
    proj: &Linear,
    input: &[f32],
    t: usize,
    width: usize,
    local_out: &mut Vec<f32>,
    gather: &mut GatherBuffers,
    out: &mut Vec<f32>,
) -> Result<(), CommError> {
    let out = sized(out, t * width);
    if comm.world_size() == 1 {
        proj.forward(input, out, t);
        return Ok(());
    }
    let local = sized(local_out, t * proj.out_features());
    proj.forward(input, local, t);
    gather_columns(comm, None, local, t, width, gather, out)
}
