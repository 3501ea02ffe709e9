//! The element types a KV cache may hold (`--kv-cache-dtype`), and typed views of a cache.
//!
//! Decoding a large batch reads the whole KV cache every step, so its width is a bandwidth
//! cost as real as the weights': f16 and bf16 halve it, and halve the memory a context takes.
//! Keys and values are rounded once, when written; the attention kernels widen them to f32
//! as they load them, and compute in f32 as before.

use half::vec::HalfBitsVecExt;
use half::{bf16, f16};

use crate::simd::Simd;

/// The element type of a KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvCacheDtype {
    Float32,
    Float16,
    BFloat16,
}

impl KvCacheDtype {
    /// Bytes per cached value.
    pub fn size(self) -> usize {
        match self {
            KvCacheDtype::Float32 => 4,
            KvCacheDtype::Float16 | KvCacheDtype::BFloat16 => 2,
        }
    }

    /// vLLM's name for the type (`--kv-cache-dtype` accepts these).
    pub fn name(self) -> &'static str {
        match self {
            KvCacheDtype::Float32 => "float32",
            KvCacheDtype::Float16 => "float16",
            KvCacheDtype::BFloat16 => "bfloat16",
        }
    }
}

impl std::fmt::Display for KvCacheDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

/// A type a KV cache can hold: f32, f16 or bf16.
pub trait KvElem: sealed::Sealed + Copy + Default + Send + Sync + 'static {
    const DTYPE: KvCacheDtype;
    /// Rounds to nearest, ties to even.
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
    fn view(s: &[Self]) -> KvSlice<'_>;
    fn view_mut(s: &mut [Self]) -> KvSliceMut<'_>;
}

macro_rules! kv_elem {
    ($t:ty, $dtype:ident, $from:expr, $to:expr) => {
        impl KvElem for $t {
            const DTYPE: KvCacheDtype = KvCacheDtype::$dtype;
            #[inline(always)]
            fn from_f32(x: f32) -> Self {
                $from(x)
            }
            #[inline(always)]
            fn to_f32(self) -> f32 {
                $to(self)
            }
            fn view(s: &[Self]) -> KvSlice<'_> {
                KvSlice::$dtype(s)
            }
            fn view_mut(s: &mut [Self]) -> KvSliceMut<'_> {
                KvSliceMut::$dtype(s)
            }
        }
    };
}

kv_elem!(f32, Float32, |x| x, |x| x);
kv_elem!(f16, Float16, f16::from_f32, f16::to_f32);
kv_elem!(bf16, BFloat16, bf16::from_f32, bf16::to_f32);

/// Vector loads of a cache element type, widened to f32.
pub(crate) trait Load: KvElem {
    /// # Safety
    /// `S::LANES` values must be readable at `p`.
    unsafe fn load<S: Simd>(s: S, p: *const Self) -> S::V;
}

impl Load for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const f32) -> S::V {
        // SAFETY: forwarded contract.
        unsafe { s.load(p) }
    }
}

impl Load for f16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const f16) -> S::V {
        // SAFETY: forwarded contract.
        unsafe { s.load_f16(p) }
    }
}

impl Load for bf16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const bf16) -> S::V {
        // SAFETY: forwarded contract.
        unsafe { s.load_bf16(p) }
    }
}

/// A read-only key or value cache of any element type.
#[derive(Debug, Clone, Copy)]
pub enum KvSlice<'a> {
    Float32(&'a [f32]),
    Float16(&'a [f16]),
    BFloat16(&'a [bf16]),
}

/// A writable key or value cache of any element type.
#[derive(Debug)]
pub enum KvSliceMut<'a> {
    Float32(&'a mut [f32]),
    Float16(&'a mut [f16]),
    BFloat16(&'a mut [bf16]),
}

impl KvSlice<'_> {
    pub fn len(&self) -> usize {
        match self {
            KvSlice::Float32(s) => s.len(),
            KvSlice::Float16(s) => s.len(),
            KvSlice::BFloat16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn dtype(&self) -> KvCacheDtype {
        match self {
            KvSlice::Float32(_) => KvCacheDtype::Float32,
            KvSlice::Float16(_) => KvCacheDtype::Float16,
            KvSlice::BFloat16(_) => KvCacheDtype::BFloat16,
        }
    }

    /// Element `i`, widened.
    pub fn get(&self, i: usize) -> f32 {
        match self {
            KvSlice::Float32(s) => s[i],
            KvSlice::Float16(s) => s[i].to_f32(),
            KvSlice::BFloat16(s) => s[i].to_f32(),
        }
    }
}

impl<'a, T: KvElem> From<&'a [T]> for KvSlice<'a> {
    fn from(s: &'a [T]) -> Self {
        T::view(s)
    }
}

impl<'a, T: KvElem> From<&'a Vec<T>> for KvSlice<'a> {
    fn from(s: &'a Vec<T>) -> Self {
        T::view(s)
    }
}

impl<'a, T: KvElem> From<&'a mut Vec<T>> for KvSliceMut<'a> {
    fn from(s: &'a mut Vec<T>) -> Self {
        T::view_mut(s)
    }
}

impl<'a, T: KvElem> From<&'a mut [T]> for KvSliceMut<'a> {
    fn from(s: &'a mut [T]) -> Self {
        T::view_mut(s)
    }
}

/// An owned key or value cache: one layer's, or a swap pool's.
#[derive(Debug, Clone, PartialEq)]
pub enum KvBuffer {
    Float32(Vec<f32>),
    Float16(Vec<f16>),
    BFloat16(Vec<bf16>),
}

/// Runs `$body` with `$v` bound to the buffer's vector, whatever its element type.
macro_rules! each_buffer {
    ($buf:expr, $v:ident => $body:expr) => {
        match $buf {
            KvBuffer::Float32($v) => $body,
            KvBuffer::Float16($v) => $body,
            KvBuffer::BFloat16($v) => $body,
        }
    };
}

impl KvBuffer {
    /// `len` zeros of `dtype`. The memory comes zeroed from the allocator, as pages the OS
    /// maps lazily: a large cache costs memory only as its blocks are first written. (A
    /// `vec![f16::ZERO; len]` would write every element, making the whole budget resident.)
    pub fn zeros(dtype: KvCacheDtype, len: usize) -> Self {
        match dtype {
            KvCacheDtype::Float32 => KvBuffer::Float32(vec![0.0; len]),
            KvCacheDtype::Float16 => KvBuffer::Float16(vec![0u16; len].reinterpret_into()),
            KvCacheDtype::BFloat16 => KvBuffer::BFloat16(vec![0u16; len].reinterpret_into()),
        }
    }

    pub fn dtype(&self) -> KvCacheDtype {
        self.view().dtype()
    }

    pub fn len(&self) -> usize {
        each_buffer!(self, v => v.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn view(&self) -> KvSlice<'_> {
        each_buffer!(self, v => KvSlice::from(&v[..]))
    }

    pub fn view_mut(&mut self) -> KvSliceMut<'_> {
        each_buffer!(self, v => KvSliceMut::from(&mut v[..]))
    }

    /// Element `i`, widened.
    pub fn get(&self, i: usize) -> f32 {
        self.view().get(i)
    }

    /// Sets every element to `x` (rounded to the element type).
    pub fn fill(&mut self, x: f32) {
        each_buffer!(self, v => v.fill(KvElem::from_f32(x)))
    }

    /// Appends elements `start..start + len` to `out` as little-endian bytes: a block as
    /// it travels to another engine (prefill/decode disaggregation), whatever the host.
    pub fn append_le_bytes(&self, start: usize, len: usize, out: &mut Vec<u8>) {
        match self {
            KvBuffer::Float32(v) => {
                (v[start..start + len].iter()).for_each(|x| out.extend(x.to_le_bytes()))
            }
            KvBuffer::Float16(v) => {
                (v[start..start + len].iter()).for_each(|x| out.extend(x.to_le_bytes()))
            }
            KvBuffer::BFloat16(v) => {
                (v[start..start + len].iter()).for_each(|x| out.extend(x.to_le_bytes()))
            }
        }
    }

    /// Sets elements from `start` on to the values `bytes` holds as
    /// [`append_le_bytes`](Self::append_le_bytes) wrote them (`bytes.len()` a whole number
    /// of elements).
    pub fn set_le_bytes(&mut self, start: usize, bytes: &[u8]) {
        match self {
            KvBuffer::Float32(v) => (v[start..].iter_mut().zip(bytes.chunks_exact(4)))
                .for_each(|(x, b)| *x = f32::from_le_bytes(b.try_into().expect("4 bytes"))),
            KvBuffer::Float16(v) => (v[start..].iter_mut().zip(bytes.chunks_exact(2)))
                .for_each(|(x, b)| *x = f16::from_le_bytes(b.try_into().expect("2 bytes"))),
            KvBuffer::BFloat16(v) => (v[start..].iter_mut().zip(bytes.chunks_exact(2)))
                .for_each(|(x, b)| *x = bf16::from_le_bytes(b.try_into().expect("2 bytes"))),
        }
    }

    /// Copies `len` elements from `from[src..]` to `self[dst..]`. Panics if the element
    /// types differ (caches of one engine share theirs).
    pub fn copy_from(&mut self, dst: usize, from: &KvBuffer, src: usize, len: usize) {
        match (self, from) {
            (KvBuffer::Float32(d), KvBuffer::Float32(s)) => {
                d[dst..dst + len].copy_from_slice(&s[src..src + len])
            }
            (KvBuffer::Float16(d), KvBuffer::Float16(s)) => {
                d[dst..dst + len].copy_from_slice(&s[src..src + len])
            }
            (KvBuffer::BFloat16(d), KvBuffer::BFloat16(s)) => {
                d[dst..dst + len].copy_from_slice(&s[src..src + len])
            }
            (d, s) => panic!(
                "KV cache copy between {} and {} buffers",
                d.dtype(),
                s.dtype()
            ),
        }
    }
}
