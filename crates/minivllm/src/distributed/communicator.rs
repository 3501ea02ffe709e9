//! The collectives a tensor-parallel group needs, and the one-process group.

/// Why a collective failed: a rank is gone, or the ranks disagree about the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommError {
    #[error("rank {rank}: {what}")]
    Mismatch { rank: usize, what: String },
    #[error("the process group is broken: {0}")]
    Broken(String),
    /// The group cannot be formed as asked (sizes, launcher, build).
    #[error("{0}")]
    Setup(String),
}

/// What the ranks of a tensor-parallel group do together. Every rank calls the same
/// collectives in the same order with the same lengths; a call returns on a rank once that
/// rank's result is complete. Sums are taken in f32 whatever the compute dtype.
pub trait Communicator: Send + Sync {
    fn rank(&self) -> usize;

    fn world_size(&self) -> usize;

    /// Replaces `buf` on every rank by the element-wise sum of all ranks' `buf`s.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError>;

    /// Writes every rank's `local` (all of one length) into `out`, in rank order.
    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<(), CommError>;

    /// Writes every rank's `local` (all of one length) into `out` on rank `root`, in rank
    /// order; on the other ranks `out` is not touched (and may be empty).
    fn gather(&self, root: usize, local: &[f32], out: &mut [f32]) -> Result<(), CommError>;

    /// Gives every rank a copy of rank `root`'s `buf` (others' are resized to fit).
    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError>;

    fn barrier(&self) -> Result<(), CommError>;

    /// Time this rank has spent in collectives so far (waiting for slower ranks included),
    /// where the communicator keeps count: what benchmarks report as communication.
    fn time_in_collectives(&self) -> Option<std::time::Duration> {
        None
    }
}

/// A group of one: every collective is the identity.
#[derive(Debug, Clone, Copy, Default)]
pub struct SingleProcess;

impl Communicator for SingleProcess {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn all_reduce_sum(&self, _buf: &mut [f32]) -> Result<(), CommError> {
        Ok(())
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        check_gather(0, 1, local, out)?;
        out.copy_from_slice(local);
        Ok(())
    }

    fn gather(&self, root: usize, local: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        check_root(0, 1, root)?;
        self.all_gather(local, out)
    }

    fn broadcast_bytes(&self, root: usize, _buf: &mut Vec<u8>) -> Result<(), CommError> {
        check_root(0, 1, root)
    }

    fn barrier(&self) -> Result<(), CommError> {
        Ok(())
    }
}

/// Writes the element-wise sum of `parts` (rank after rank, each `out.len()` long) into
/// `out`, adding them in rank order: the one order of the sums, on every rank and for every
/// message size, that the all-reduces of `ThreadGroup` and MPI share (batch invariance).
pub(crate) fn sum_in_rank_order<'a>(mut parts: impl Iterator<Item = &'a [f32]>, out: &mut [f32]) {
    if let Some(first) = parts.next() {
        out.copy_from_slice(first);
    }
    for part in parts {
        out.iter_mut().zip(part).for_each(|(o, x)| *o += x);
    }
}

/// Every rank's `local` integers, in rank order, exactly: each rank broadcasts its own in
/// turn (one small message per rank; for checks at start-up, not for a step's data).
pub fn all_gather_u64(comm: &dyn Communicator, local: &[u64]) -> Result<Vec<Vec<u64>>, CommError> {
    let mut all = Vec::with_capacity(comm.world_size());
    for root in 0..comm.world_size() {
        let mut bytes = if root == comm.rank() {
            local.iter().flat_map(|v| v.to_le_bytes()).collect()
        } else {
            Vec::new()
        };
        comm.broadcast_bytes(root, &mut bytes)?;
        if bytes.len() % 8 != 0 {
            return Err(CommError::Broken(format!(
                "rank {root} sent {} bytes, not whole 64-bit integers",
                bytes.len()
            )));
        }
        let values = bytes
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        all.push(values.collect());
    }
    Ok(all)
}

/// An all-gather's output must hold exactly `world_size` copies of the local length.
pub(crate) fn check_gather(
    rank: usize,
    world_size: usize,
    local: &[f32],
    out: &[f32],
) -> Result<(), CommError> {
    if out.len() != local.len() * world_size {
        return Err(CommError::Mismatch {
            rank,
            what: format!(
                "all_gather of {} values over {world_size} ranks into {} slots",
                local.len(),
                out.len()
            ),
        });
    }
    Ok(())
}

pub(crate) fn check_root(rank: usize, world_size: usize, root: usize) -> Result<(), CommError> {
    if root >= world_size {
        return Err(CommError::Mismatch {
            rank,
            what: format!("broadcast from rank {root} in a group of {world_size}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_process_collectives_are_the_identity() {
        let c = SingleProcess;
        let mut buf = vec![1.0, -2.5];
        c.all_reduce_sum(&mut buf).unwrap();
        assert_eq!(buf, [1.0, -2.5]);
        let mut out = vec![0.0; 2];
        c.all_gather(&buf, &mut out).unwrap();
        assert_eq!(out, buf);
        out.fill(0.0);
        c.gather(0, &buf, &mut out).unwrap();
        assert_eq!(out, buf);
        assert!(c.gather(1, &buf, &mut out).is_err());
        assert!(c.all_gather(&buf, &mut [0.0; 3]).is_err());
        let mut bytes = b"step".to_vec();
        c.broadcast_bytes(0, &mut bytes).unwrap();
        assert_eq!(bytes, b"step");
        assert!(c.broadcast_bytes(1, &mut bytes).is_err());
    }
}
