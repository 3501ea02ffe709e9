//! Ranks as threads of one process, sharing memory: the collectives' semantics without
//! MPI, so that sharded layers can be tested against unsharded ones anywhere. Sums are
//! taken in rank order, so every rank gets bit-identical results.

use std::sync::{Arc, Barrier, Mutex, MutexGuard};

use super::communicator::{check_gather, check_root, sum_in_rank_order, CommError, Communicator};

struct Shared {
    barrier: Barrier,
    /// Each rank's contribution to the collective in progress.
    slots: Mutex<Vec<Vec<f32>>>,
    bytes: Mutex<Vec<u8>>,
}

/// One rank of a group of threads; [`ThreadGroup::new`] makes all of them.
pub struct ThreadGroup {
    rank: usize,
    world_size: usize,
    shared: Arc<Shared>,
}

impl ThreadGroup {
    /// The `world_size` ranks of a new group, by rank; give each to its own thread.
    pub fn new(world_size: usize) -> Vec<ThreadGroup> {
        assert!(world_size > 0, "a group needs at least one rank");
        let shared = Arc::new(Shared {
            barrier: Barrier::new(world_size),
            slots: Mutex::new(vec![Vec::new(); world_size]),
            bytes: Mutex::new(Vec::new()),
        });
        (0..world_size)
            .map(|rank| ThreadGroup {
                rank,
                world_size,
                shared: Arc::clone(&shared),
            })
            .collect()
    }

    fn slots(&self) -> MutexGuard<'_, Vec<Vec<f32>>> {
        // A rank that panicked mid-collective leaves the data as it was: still readable.
        self.shared.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes `values` as this rank's contribution and waits for everyone's.
    fn publish(&self, values: &[f32]) {
        {
            let mut slots = self.slots();
            slots[self.rank].clear();
            slots[self.rank].extend_from_slice(values);
        }
        self.shared.barrier.wait();
    }

    /// Every rank's slot, each `len` long, into `out` rank after rank.
    fn copy_in_rank_order(
        &self,
        slots: &[Vec<f32>],
        len: usize,
        out: &mut [f32],
    ) -> Result<(), CommError> {
        self.lengths_agree(slots, len)?;
        for (chunk, s) in out.chunks_exact_mut(len.max(1)).zip(slots) {
            chunk.copy_from_slice(s);
        }
        Ok(())
    }

    fn lengths_agree(&self, slots: &[Vec<f32>], len: usize) -> Result<(), CommError> {
        match slots.iter().position(|s| s.len() != len) {
            Some(other) => Err(CommError::Mismatch {
                rank: self.rank,
                what: format!(
                    "{len} values here but {} on rank {other}",
                    slots[other].len()
                ),
            }),
            None => Ok(()),
        }
    }
}

impl Communicator for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        self.publish(buf);
        let result = {
            let slots = self.slots();
            self.lengths_agree(&slots, buf.len())
                .map(|()| sum_in_rank_order(slots.iter().map(Vec::as_slice), buf))
        };
        // Nobody publishes the next collective before every rank has read this one.
        self.shared.barrier.wait();
        result
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        check_gather(self.rank, self.world_size, local, out)?;
        self.publish(local);
        let result = {
            let slots = self.slots();
            self.copy_in_rank_order(&slots, local.len(), out)
        };
        self.shared.barrier.wait();
        result
    }

    fn gather(&self, root: usize, local: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        check_root(self.rank, self.world_size, root)?;
        if self.rank != root {
            self.publish(local);
            self.shared.barrier.wait();
            return Ok(());
        }
        let checked = check_gather(self.rank, self.world_size, local, out);
        self.publish(local);
        let result = checked.and_then(|()| {
            let slots = self.slots();
            self.copy_in_rank_order(&slots, local.len(), out)
        });
        self.shared.barrier.wait();
        result
    }

    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError> {
        check_root(self.rank, self.world_size, root)?;
        if self.rank == root {
            let mut shared = self.shared.bytes.lock().unwrap_or_else(|e| e.into_inner());
            shared.clear();
            shared.extend_from_slice(buf);
        }
        self.shared.barrier.wait();
        if self.rank != root {
            let shared = self.shared.bytes.lock().unwrap_or_else(|e| e.into_inner());
            buf.clear();
            buf.extend_from_slice(&shared);
        }
        self.shared.barrier.wait();
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.shared.barrier.wait();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on every rank of a new group of `n` threads; returns each rank's result.
    fn on_ranks<T: Send>(n: usize, f: impl Fn(&ThreadGroup) -> T + Sync) -> Vec<T> {
        let ranks = ThreadGroup::new(n);
        std::thread::scope(|s| {
            let handles: Vec<_> = ranks.iter().map(|c| s.spawn(|| f(c))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_reduce_sums_in_rank_order_on_every_rank() {
        let results = on_ranks(3, |c| {
            let r = c.rank() as f32;
            let mut buf = vec![r, 10.0 * r, 0.1];
            c.all_reduce_sum(&mut buf).unwrap();
            // A second collective right after must not see the first's data.
            let mut again = vec![1.0; 3];
            c.all_reduce_sum(&mut again).unwrap();
            (buf, again)
        });
        let want = [3.0, 30.0, 0.1f32 + 0.1 + 0.1];
        for (buf, again) in results {
            assert_eq!(buf, want);
            assert_eq!(again, [3.0; 3]);
        }
    }

    #[test]
    fn gathers_concatenate_by_rank_and_broadcast_copies_the_root() {
        let results = on_ranks(4, |c| {
            let local = [c.rank() as f32; 2];
            let mut out = vec![0.0; 8];
            c.all_gather(&local, &mut out).unwrap();
            let mut bytes = if c.rank() == 2 {
                b"from two".to_vec()
            } else {
                vec![9; 40]
            };
            c.broadcast_bytes(2, &mut bytes).unwrap();
            let mut at_root = vec![-1.0; if c.rank() == 1 { 8 } else { 0 }];
            c.gather(1, &local, &mut at_root).unwrap();
            (out, bytes, at_root)
        });
        for (rank, (out, bytes, at_root)) in results.into_iter().enumerate() {
            assert_eq!(out, [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
            assert_eq!(bytes, b"from two");
            if rank == 1 {
                assert_eq!(at_root, out);
            } else {
                assert!(at_root.is_empty());
            }
        }
    }

    #[test]
    fn mismatched_lengths_are_an_error_on_every_rank() {
        let results = on_ranks(2, |c| {
            let mut buf = vec![1.0; 2 + c.rank()];
            c.all_reduce_sum(&mut buf)
        });
        assert!(results.iter().all(Result::is_err), "{results:?}");
    }

    #[test]
    fn integers_gather_exactly_whatever_their_size() {
        // 2^40 + 1 has no f32: integers must not go through the float collectives.
        let big = (1u64 << 40) + 1;
        let results = on_ranks(3, |c| {
            crate::distributed::all_gather_u64(c, &[c.rank() as u64, big + c.rank() as u64])
        });
        let want: Vec<Vec<u64>> = (0..3).map(|r| vec![r, big + r]).collect();
        for got in results {
            assert_eq!(got.unwrap(), want);
        }
    }
}
