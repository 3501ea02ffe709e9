//! The fixed pool that kernels split their work over.

/// Sets the number of kernel threads (call once, before the first kernel; later calls are ignored).
pub fn init_threads(n: usize) {
    // rayon's global pool can be built only once; a second build (or a kernel having
    // already started the default pool) returns an error that is exactly "ignored".
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(n.max(1))
        .build_global();
}

/// Number of threads kernels split their work over.
pub fn num_threads() -> usize {
    rayon::current_num_threads()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_threads_twice_is_harmless() {
        init_threads(2);
        init_threads(3);
        assert!(num_threads() >= 1);
    }
}
