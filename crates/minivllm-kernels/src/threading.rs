//! The fixed pool that kernels split their work over.
//!
//! A decode step runs a few hundred parallel kernels. Started from a thread outside the
//! pool, each would hand its work over and put the caller to sleep until it is done: a
//! cross-thread wake-up per kernel. [`install`] instead runs a whole forward pass on a pool
//! thread, where each kernel's parallel loop is a cheap fork/join among the workers.

use std::sync::OnceLock;

static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();

/// Sets the number of kernel threads (call once, before the first kernel; later calls are
/// ignored).
pub fn init_threads(n: usize) {
    let n = n.max(1);
    let _ = POOL.get_or_init(|| build(n));
    // Kernels called outside `install` (loading, tests) use rayon's global pool: the same
    // size. It can be built only once; a second build returns an error that is ignored.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build_global();
}

fn build(n: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("minivllm-kernel-{i}"))
        .build()
        .unwrap_or_else(|e| panic!("cannot start {n} kernel threads: {e}"))
}

fn pool() -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| build(rayon::current_num_threads()))
}

/// Runs `op` on a kernel thread, so that the kernels inside it fork and join within the pool.
pub fn install<R: Send>(op: impl FnOnce() -> R + Send) -> R {
    pool().install(op)
}

/// Number of threads kernels split their work over.
pub fn num_threads() -> usize {
    pool().current_num_threads()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_inside_install_run_on_the_pool() {
        init_threads(2);
        let (threads, on_pool) = install(|| {
            (
                rayon::current_num_threads(),
                rayon::current_thread_index().is_some(),
            )
        });
        assert_eq!(threads, num_threads());
        assert!(on_pool);
        // Outside, the caller is not a pool thread.
        assert!(rayon::current_thread_index().is_none());
    }
}
