//! A GGUF (versions 2 and 3) reader over a memory-mapped file.
//!
//! Layout (all little-endian): magic `"GGUF"`, version u32, tensor count u64, metadata
//! count u64, the metadata key/value pairs, one info record per tensor (name, n_dims u32,
//! dims u64 each in ggml order, type u32, offset u64), padding to `general.alignment`
//! (default 32), then the tensor data; each tensor offset is relative to that data section.
//!
//! Every length and count in the file is checked against the bytes that remain before
//! anything is allocated from it, and every tensor's data range is checked against the file
//! size at open time, so a malformed file yields a [`LoadError`], never a panic or a huge
//! allocation.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use minivllm_kernels::quant::{self, GgmlType};

use super::LoadError;

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Real files never nest arrays; the cap keeps a hostile file from overflowing the stack.
const MAX_ARRAY_DEPTH: u32 = 8;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// Any integer that is non-negative (writers disagree on which integer type a key uses).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer that fits an i64.
    pub(crate) fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Either float type, or an integer (some converters store e.g. `rope.freq_base` as one).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self
                .as_i64()
                .map(|v| v as f64)
                .or_else(|| self.as_u64().map(|v| v as f64)),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF value-type id this value is stored as.
    pub fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::String(_) => 8,
            GgufValue::Array(_) => 9,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }
}

/// Where one tensor lives in the file and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the fastest-varying (row length), so a PyTorch
    /// `[out_features, in_features]` weight is stored as `[in_features, out_features]`.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Relative to the start of the data section.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// Number of elements. Opening a file rejects counts that overflow; saturating keeps a
    /// hand-built info from panicking (its data then never fits a file).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }

    /// Size of the tensor's data in bytes.
    pub fn n_bytes(&self) -> u64 {
        let ty = self.ggml_type;
        (self.n_elements() / ty.block_size() as u64).saturating_mul(ty.type_size() as u64)
    }

    /// The dims in PyTorch order (slowest-varying first), e.g. `[out, in]` for a weight.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// An open GGUF file: parsed metadata and tensor index over a read-only mapping.
pub struct GgufFile {
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    /// In file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// The alignment of the data section and of every tensor offset.
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
    path: PathBuf,
    map: Mmap,
    by_name: HashMap<String, usize>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata_keys", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile, LoadError> {
        let io_err = |source| LoadError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => LoadError::NotFound {
                path: path.to_owned(),
            },
            _ => io_err(e),
        })?;
        let len = file.metadata().map_err(io_err)?.len();
        // mmap refuses empty files; an empty file is just the shortest truncation.
        if len == 0 {
            return Err(LoadError::BadGguf {
                path: path.to_owned(),
                reason: "truncated file: it is empty".into(),
            });
        }
        // SAFETY: the mapping is read-only. Another process truncating or rewriting the file
        // while it is mapped would be undefined behaviour; like llama.cpp and safetensors we
        // accept that for model files, which nobody edits in place.
        let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        let parsed = parse(path, &map)?;
        let by_name = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            path: path.to_owned(),
            map,
            by_name,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// Drops the mapped pages of a tensor whose data has been copied out, so that loading
    /// does not hold the file and its copy in memory at once (a 1.1B model's Q4_1 file is
    /// 656 MiB). Pages read again later come back from the file. Best effort: a failure only
    /// leaves the pages resident.
    pub fn release_tensor(&self, info: &GgufTensorInfo) {
        self.release_bytes(
            info,
            0,
            usize::try_from(info.n_bytes()).unwrap_or(usize::MAX),
        );
    }

    /// [`Self::release_tensor`] for bytes `from..from + len` of the tensor's data.
    ///
    /// The range is widened by 2 MiB on both sides: a page fault maps in the file's cached
    /// pages around the faulting one (fault-around, and whole large folios of the page
    /// cache), so reading the next tensor maps back the tail of the one before it. With a
    /// few hundred tensors that is nothing; a Mixture-of-Experts file read as 18,000 expert
    /// slices kept 1.5 GB of the file mapped that way with a 64 KiB margin, 0.8 GB with
    /// none (Qwen3-30B-A3B's shape, 19.8 GB), 13 MB with 2 MiB. Pages dropped early are read
    /// back from the file if needed, so releasing more than was copied is always safe.
    pub(crate) fn release_bytes(&self, info: &GgufTensorInfo, from: usize, len: usize) {
        const FAULT_AROUND: usize = 2 << 20;
        let start = self
            .data_offset
            .saturating_add(info.offset)
            .saturating_add(from as u64);
        let Ok(start) = usize::try_from(start) else {
            return;
        };
        let Some(end) = start.checked_add(len).filter(|&end| end <= self.map.len()) else {
            return;
        };
        let start = start.saturating_sub(FAULT_AROUND);
        let len = end.saturating_add(FAULT_AROUND).min(self.map.len()) - start;
        #[cfg(unix)]
        // SAFETY: the mapping is read-only and backed by the file, which nobody rewrites (see
        // `open`): after MADV_DONTNEED the same bytes are read back from the file on the next
        // access, so no reference into the map ever sees different data.
        let _ = unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len)
        };
    }

    /// The raw bytes of a tensor of this file. An info that does not belong to this file
    /// and points past its end gets an empty slice.
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> &[u8] {
        let range = self
            .data_offset
            .checked_add(info.offset)
            .and_then(|start| Some(start..start.checked_add(info.n_bytes())?))
            .and_then(|r| Some(usize::try_from(r.start).ok()?..usize::try_from(r.end).ok()?));
        range.and_then(|r| self.map.get(r)).unwrap_or(&[])
    }

    /// Tensor `name` dequantised to f32, in ggml element order.
    pub fn dequantize(&self, name: &str) -> Result<Vec<f32>, LoadError> {
        let info = self
            .tensor(name)
            .ok_or_else(|| LoadError::MissingTensor(name.to_owned()))?;
        self.dequantize_tensor(info)
    }

    /// Like [`GgufFile::dequantize`], for an info already looked up.
    pub fn dequantize_tensor(&self, info: &GgufTensorInfo) -> Result<Vec<f32>, LoadError> {
        let ty = info.ggml_type;
        if !ty.can_dequantize() {
            return Err(LoadError::UnsupportedTensorType {
                tensor: info.name.clone(),
                type_name: type_label(ty.name(), ty.id()),
            });
        }
        let n = usize::try_from(info.n_elements())
            .map_err(|_| self.bad(format!("tensor {} is too large", info.name)))?;
        let mut out = vec![0.0f32; n];
        quant::dequantize(ty, self.tensor_bytes(info), &mut out)
            .map_err(|e| self.bad(format!("tensor {}: {e}", info.name)))?;
        Ok(out)
    }

    fn bad(&self, reason: String) -> LoadError {
        LoadError::BadGguf {
            path: self.path.clone(),
            reason,
        }
    }
}

fn type_label(name: &str, id: u32) -> String {
    format!("{name} (id {id})")
}

struct Parsed {
    version: u32,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
    alignment: u64,
    data_offset: u64,
}

fn parse(path: &Path, data: &[u8]) -> Result<Parsed, LoadError> {
    let bad = |reason: String| LoadError::BadGguf {
        path: path.to_owned(),
        reason,
    };
    let mut r = Cursor { data, pos: 0 };

    let magic = r.take(4).map_err(|e| bad(format!("magic: {e}")))?;
    if magic != MAGIC {
        return Err(LoadError::BadMagic {
            path: path.to_owned(),
            found: [magic[0], magic[1], magic[2], magic[3]],
        });
    }
    let version = r.u32().map_err(|e| bad(format!("version: {e}")))?;
    if !(2..=3).contains(&version) {
        return Err(LoadError::UnsupportedGgufVersion {
            path: path.to_owned(),
            version,
        });
    }
    let tensor_count = r.u64().map_err(|e| bad(format!("tensor count: {e}")))?;
    let kv_count = r.u64().map_err(|e| bad(format!("metadata count: {e}")))?;

    // Smallest key/value: empty key (8-byte length), type (4), one-byte value.
    r.check_count(kv_count, 8 + 4 + 1)
        .map_err(|e| bad(format!("metadata count: {e}")))?;
    let mut metadata = BTreeMap::new();
    for i in 0..kv_count {
        let key = r
            .string()
            .map_err(|e| bad(format!("metadata key #{i}: {e}")))?;
        let value = r
            .u32()
            .and_then(|ty| r.value(ty, 0))
            .map_err(|e| bad(format!("metadata value of {key:?}: {e}")))?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(bad(format!("duplicate metadata key {key:?}")));
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a.is_power_of_two() => a,
            _ => {
                return Err(bad(format!(
                    "general.alignment must be a power of two, got {v:?}"
                )))
            }
        },
    };

    // Smallest tensor info: empty name (8), n_dims (4), type (4), offset (8).
    r.check_count(tensor_count, 8 + 4 + 4 + 8)
        .map_err(|e| bad(format!("tensor count: {e}")))?;
    let mut tensors = Vec::with_capacity(tensor_count as usize);
    let mut seen = HashMap::new();
    for i in 0..tensor_count {
        let info = r.tensor_info().map_err(|e| match e {
            InfoError::Malformed(e) => bad(format!("tensor info #{i}: {e}")),
            InfoError::UnknownType { name, id } => LoadError::UnsupportedTensorType {
                tensor: name,
                type_name: type_label("unknown", id),
            },
        })?;
        if seen.insert(info.name.clone(), i).is_some() {
            return Err(bad(format!("duplicate tensor name {:?}", info.name)));
        }
        tensors.push(info);
    }

    let data_offset = (r.pos as u64)
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| bad(format!("alignment {alignment} overflows the data offset")))?;
    let file_len = data.len() as u64;
    for t in &tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(bad(format!(
                "tensor {}: offset {} is not a multiple of the alignment {alignment}",
                t.name, t.offset
            )));
        }
        // n_bytes() cannot overflow: tensor_info() bounded the element count.
        let end = data_offset
            .checked_add(t.offset)
            .and_then(|start| start.checked_add(t.n_bytes()));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(bad(format!(
                    "tensor {}: data ({} bytes at data offset {}) runs past the end of the file \
                     ({file_len} bytes, data section at {data_offset}); the file is truncated",
                    t.name,
                    t.n_bytes(),
                    t.offset
                )))
            }
        }
    }

    check_no_overlap(&tensors).map_err(bad)?;
    Ok(Parsed {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// Tensors whose data share bytes are a corrupt (or crafted) index: writing one tensor's
/// weights would be reading another's. Empty tensors overlap nothing.
fn check_no_overlap(tensors: &[GgufTensorInfo]) -> Result<(), String> {
    let mut spans: Vec<(u64, u64, &str)> = tensors
        .iter()
        .filter(|t| t.n_bytes() > 0)
        .map(|t| (t.offset, t.offset + t.n_bytes(), t.name.as_str()))
        .collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        let ((_, end, a), (start, _, b)) = (w[0], w[1]);
        if start < end {
            return Err(format!(
                "tensors {a} and {b} overlap in the file's data section"
            ));
        }
    }
    Ok(())
}

enum InfoError {
    Malformed(String),
    UnknownType { name: String, id: u32 },
}

impl From<String> for InfoError {
    fn from(e: String) -> Self {
        InfoError::Malformed(e)
    }
}

/// Little-endian reads over the file; errors are reasons, to which callers add context.
struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], String> {
        let left = self.remaining();
        if n > left as u64 {
            return Err(format!(
                "truncated file: {n} bytes needed at offset {}, only {left} left",
                self.pos
            ));
        }
        let bytes = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self
            .take(N as u64)?
            .try_into()
            .expect("take returned N bytes"))
    }

    fn u32(&mut self) -> Result<u32, String> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        self.array().map(u64::from_le_bytes)
    }

    /// Fails unless `count` items of at least `min_size` bytes each fit in what is left.
    fn check_count(&self, count: u64, min_size: u64) -> Result<(), String> {
        let left = self.remaining() as u64;
        if count > left / min_size {
            return Err(format!(
                "{count} entries of at least {min_size} bytes cannot fit in the {left} bytes left \
                 at offset {} (the file is truncated or the count corrupt)",
                self.pos
            ));
        }
        Ok(())
    }

    fn string(&mut self) -> Result<String, String> {
        let len = self.u64()?;
        let bytes = self
            .take(len)
            .map_err(|e| format!("string of {len} bytes: {e}"))?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("string is not UTF-8: {e}"))
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<GgufValue, String> {
        Ok(match ty {
            0 => GgufValue::U8(u8::from_le_bytes(self.array()?)),
            1 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(format!("bool byte is {b}, must be 0 or 1")),
            },
            8 => GgufValue::String(self.string()?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!("arrays nested more than {MAX_ARRAY_DEPTH} deep"));
                }
                let elem_ty = self.u32()?;
                let len = self.u64()?;
                let min_size = min_value_size(elem_ty)
                    .ok_or_else(|| format!("array of unknown value type {elem_ty}"))?;
                self.check_count(len, min_size)
                    .map_err(|e| format!("array length: {e}"))?;
                let mut items = Vec::with_capacity(len as usize);
                for i in 0..len {
                    items.push(
                        self.value(elem_ty, depth + 1)
                            .map_err(|e| format!("array element {i}: {e}"))?,
                    );
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            _ => return Err(format!("unknown metadata value type {ty}")),
        })
    }

    fn tensor_info(&mut self) -> Result<GgufTensorInfo, InfoError> {
        let name = self.string().map_err(|e| format!("name: {e}"))?;
        let ctx = |e: String| InfoError::Malformed(format!("tensor {name:?}: {e}"));
        let n_dims = self.u32().map_err(ctx)?;
        if n_dims > MAX_DIMS {
            return Err(ctx(format!(
                "{n_dims} dimensions, at most {MAX_DIMS} allowed"
            )));
        }
        let dims = (0..n_dims)
            .map(|_| self.u64())
            .collect::<Result<Vec<_>, _>>()
            .map_err(ctx)?;
        let type_id = self.u32().map_err(ctx)?;
        let offset = self.u64().map_err(ctx)?;
        let Some(ggml_type) = GgmlType::from_id(type_id) else {
            return Err(InfoError::UnknownType { name, id: type_id });
        };
        let block = ggml_type.block_size() as u64;
        let row = dims.first().copied().unwrap_or(1);
        if !row.is_multiple_of(block) {
            return Err(ctx(format!(
                "row length {row} is not a multiple of the {ggml_type} block size {block}"
            )));
        }
        // Bounding elements by u64::MAX / 8 keeps n_bytes() in range for every type (no
        // type stores more than 8 bytes per element) and matches ggml's own int64 limit.
        let n_elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
        if n_elements.is_none_or(|n| n > u64::MAX / 8) {
            return Err(ctx(format!("dims {dims:?} overflow the element count")));
        }
        Ok(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
        })
    }
}

/// The fewest bytes a value of type `ty` takes, or `None` for an unknown type.
fn min_value_size(ty: u32) -> Option<u64> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 4 + 8,
        _ => return None,
    })
}

#[cfg(test)]
mod tests;
