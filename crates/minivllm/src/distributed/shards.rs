//! How a dimension is dealt out to the ranks of a group, and put back together.
//!
//! Tensor parallelism here splits every matrix by its output rows only: each rank computes
//! whole dot products, over the whole input, exactly as one process does them, and the
//! ranks' output columns are gathered. No rank ever adds a partial sum of another (as a
//! row-parallel all-reduce would), so the group's results are one process's to the bit:
//! the order of a sum never depends on the number of ranks.

use std::ops::Range;

use super::communicator::{CommError, Communicator};

/// Rank `rank`'s run of `0..len` out of `world_size` runs as equal as can be: the first
/// `len % world_size` ranks hold one more.
pub fn share(len: usize, rank: usize, world_size: usize) -> Range<usize> {
    let (per, extra) = (len / world_size, len % world_size);
    let start = rank * per + rank.min(extra);
    start..start + per + usize::from(rank < extra)
}

/// Scratch for [`gather_columns`], kept between calls so decoding allocates nothing.
#[derive(Default)]
pub struct GatherBuffers {
    send: Vec<f32>,
    recv: Vec<f32>,
}

impl GatherBuffers {
    pub fn capacity(&self) -> usize {
        self.send.capacity() + self.recv.capacity()
    }
}

/// Puts `rows` rows of `width` columns together from each rank's [`share`] of the columns:
/// `local` is this rank's `[rows, share.len()]`, `out` gets `[rows, width]` on every rank
/// (`root: None`) or on rank `root` alone (the others' `out` is not touched and may be
/// empty). Shares that differ by one column are padded to one length on the wire.
pub fn gather_columns(
    comm: &dyn Communicator,
    root: Option<usize>,
    local: &[f32],
    rows: usize,
    width: usize,
    bufs: &mut GatherBuffers,
    out: &mut [f32],
) -> Result<(), CommError> {
    let world = comm.world_size();
    let own = share(width, comm.rank(), world);
    let slot = width.div_ceil(world);
    debug_assert_eq!(local.len(), rows * own.len());
    bufs.send.clear();
    bufs.send.resize(rows * slot, 0.0);
    for (s, l) in bufs
        .send
        .chunks_exact_mut(slot.max(1))
        .zip(local.chunks_exact(own.len().max(1)))
    {
        s[..own.len()].copy_from_slice(l);
    }
    let receives = root.is_none_or(|r| r == comm.rank());
    bufs.recv.clear();
    bufs.recv
        .resize(if receives { world * rows * slot } else { 0 }, 0.0);
    match root {
        None => comm.all_gather(&bufs.send, &mut bufs.recv)?,
        Some(root) => comm.gather(root, &bufs.send, &mut bufs.recv)?,
    }
    if !receives {
        return Ok(());
    }
    let out = &mut out[..rows * width];
    for (r, part) in bufs.recv.chunks_exact((rows * slot).max(1)).enumerate() {
        let cols = share(width, r, world);
        for (o, p) in out.chunks_exact_mut(width).zip(part.chunks_exact(slot)) {
            o[cols.clone()].copy_from_slice(&p[..cols.len()]);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::distributed::ThreadGroup;

    #[test]
    fn shares_cover_the_length_in_order_and_differ_by_at_most_one() {
        for len in [0, 1, 5, 14, 896, 151_936] {
            for world in 1..=5 {
                let parts: Vec<_> = (0..world).map(|r| share(len, r, world)).collect();
                assert_eq!(parts[0].start, 0);
                assert_eq!(parts[world - 1].end, len);
                for w in parts.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() == w[1].len() || w[0].len() == w[1].len() + 1);
                }
            }
        }
    }

    #[test]
    fn gathered_columns_are_the_whole_rows_on_every_rank_or_the_root() {
        let (rows, width) = (3, 14);
        let whole: Vec<f32> = (0..rows * width).map(|i| i as f32).collect();
        let whole = &whole;
        let results: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|s| {
            let handles: Vec<_> = ThreadGroup::new(3)
                .into_iter()
                .map(|comm| {
                    s.spawn(move || {
                        let comm: Arc<dyn Communicator> = Arc::new(comm);
                        let cols = share(width, comm.rank(), 3);
                        let local: Vec<f32> = whole
                            .chunks_exact(width)
                            .flat_map(|r| r[cols.clone()].to_vec())
                            .collect();
                        let mut bufs = GatherBuffers::default();
                        let mut all = vec![0.0; rows * width];
                        gather_columns(&*comm, None, &local, rows, width, &mut bufs, &mut all)
                            .unwrap();
                        let mut at_root = vec![-1.0; rows * width];
                        gather_columns(
                            &*comm,
                            Some(0),
                            &local,
                            rows,
                            width,
                            &mut bufs,
                            &mut at_root,
                        )
                        .unwrap();
                        (all, at_root)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (r, (all, at_root)) in results.iter().enumerate() {
            assert_eq!(all, whole, "rank {r}");
            if r == 0 {
                assert_eq!(at_root, whole);
            } else {
                assert!(at_root.iter().all(|&x| x == -1.0), "rank {r} was written");
            }
        }
    }
}
