//! Writes GGUF (version 3) files: metadata, the tensor index, then each tensor's data,
//! streamed one tensor at a time so that a file larger than memory can be written.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use minivllm_kernels::quant::GgmlType;

use super::gguf::{GgufTensorInfo, GgufValue};
use super::LoadError;

/// One tensor of the file to write: its name, its dims in ggml order (row length first)
/// and its format.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

impl From<&GgufTensorInfo> for TensorEntry {
    /// A tensor of an open file, to be written as it is.
    fn from(t: &GgufTensorInfo) -> Self {
        TensorEntry {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ggml_type,
        }
    }
}

impl TensorEntry {
    fn n_bytes(&self) -> u64 {
        let n: u64 = self.dims.iter().product();
        n / self.ty.block_size() as u64 * self.ty.type_size() as u64
    }
}

pub(crate) fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend((s.len() as u64).to_le_bytes());
    buf.extend(s.as_bytes());
}

/// A value's bytes after its type id. An empty array is written as an array of u8 (its
/// element type is not kept by the reader).
pub(crate) fn put_value(buf: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => buf.extend(x.to_le_bytes()),
        GgufValue::I8(x) => buf.extend(x.to_le_bytes()),
        GgufValue::U16(x) => buf.extend(x.to_le_bytes()),
        GgufValue::I16(x) => buf.extend(x.to_le_bytes()),
        GgufValue::U32(x) => buf.extend(x.to_le_bytes()),
        GgufValue::I32(x) => buf.extend(x.to_le_bytes()),
        GgufValue::U64(x) => buf.extend(x.to_le_bytes()),
        GgufValue::I64(x) => buf.extend(x.to_le_bytes()),
        GgufValue::F32(x) => buf.extend(x.to_le_bytes()),
        GgufValue::F64(x) => buf.extend(x.to_le_bytes()),
        GgufValue::Bool(b) => buf.push(*b as u8),
        GgufValue::String(s) => put_str(buf, s),
        GgufValue::Array(items) => {
            let elem = items.first().map_or(0, GgufValue::type_id);
            buf.extend(elem.to_le_bytes());
            buf.extend((items.len() as u64).to_le_bytes());
            for item in items {
                assert_eq!(item.type_id(), elem, "GGUF arrays are homogeneous");
                put_value(buf, item);
            }
        }
    }
}

/// Writes `path`: `metadata` (with `general.alignment` set to `alignment`), the index of
/// `tensors`, then tensor `i`'s bytes as `data(i)` returns them, each at a multiple of
/// `alignment`. Returns the file's size.
pub fn write_gguf(
    path: &Path,
    metadata: &BTreeMap<String, GgufValue>,
    tensors: &[TensorEntry],
    alignment: u64,
    mut data: impl FnMut(usize) -> Result<Vec<u8>, LoadError>,
) -> Result<u64, LoadError> {
    let io = |source| LoadError::Io {
        path: path.to_owned(),
        source,
    };
    let mut metadata = metadata.clone();
    metadata.insert("general.alignment".into(), GgufValue::U32(alignment as u32));
    let mut head = b"GGUF".to_vec();
    head.extend(3u32.to_le_bytes());
    head.extend((tensors.len() as u64).to_le_bytes());
    head.extend((metadata.len() as u64).to_le_bytes());
    for (key, v) in &metadata {
        put_str(&mut head, key);
        head.extend(v.type_id().to_le_bytes());
        put_value(&mut head, v);
    }
    let mut offset = 0u64;
    for t in tensors {
        put_str(&mut head, &t.name);
        head.extend((t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            head.extend(d.to_le_bytes());
        }
        head.extend(t.ty.id().to_le_bytes());
        head.extend(offset.to_le_bytes());
        offset = (offset + t.n_bytes()).next_multiple_of(alignment);
    }
    let mut out = BufWriter::new(File::create(path).map_err(io)?);
    let mut written = head.len() as u64;
    out.write_all(&head).map_err(io)?;
    for (i, t) in tensors.iter().enumerate() {
        pad(&mut out, &mut written, alignment).map_err(io)?;
        let bytes = data(i)?;
        if bytes.len() as u64 != t.n_bytes() {
            return Err(LoadError::Config(format!(
                "tensor {}: {} bytes for {} {:?}, expected {}",
                t.name,
                bytes.len(),
                t.ty,
                t.dims,
                t.n_bytes()
            )));
        }
        out.write_all(&bytes).map_err(io)?;
        written += bytes.len() as u64;
    }
    out.flush().map_err(io)?;
    Ok(written)
}

fn pad(out: &mut impl Write, written: &mut u64, alignment: u64) -> std::io::Result<()> {
    let to = written.next_multiple_of(alignment);
    out.write_all(&vec![0u8; (to - *written) as usize])?;
    *written = to;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_executor::loader::gguf::GgufFile;

    #[test]
    fn written_files_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.gguf");
        let metadata = BTreeMap::from([
            (
                "general.architecture".to_string(),
                GgufValue::String("llama".into()),
            ),
            (
                "tokens".to_string(),
                GgufValue::Array(vec![
                    GgufValue::String("a".into()),
                    GgufValue::String("b".into()),
                ]),
            ),
            ("n".to_string(), GgufValue::U64(7)),
        ]);
        let tensors = [
            TensorEntry {
                name: "a".into(),
                dims: vec![3],
                ty: GgmlType::F32,
            },
            TensorEntry {
                name: "b".into(),
                dims: vec![32, 2],
                ty: GgmlType::Q8_0,
            },
        ];
        let a: Vec<u8> = [1.0f32, 2.0, 3.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let b: Vec<u8> = (0..68)
            .map(|i| if i % 34 < 2 { 0 } else { i as u8 })
            .collect();
        let size = write_gguf(&path, &metadata, &tensors, 64, |i| {
            Ok(if i == 0 { a.clone() } else { b.clone() })
        })
        .unwrap();
        assert_eq!(size, std::fs::metadata(&path).unwrap().len());
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.alignment, 64);
        assert_eq!(f.get("n"), Some(&GgufValue::U64(7)));
        assert_eq!(f.get("tokens"), metadata.get("tokens"));
        assert_eq!(f.tensor_bytes(f.tensor("a").unwrap()), &a[..]);
        assert_eq!(f.tensor_bytes(f.tensor("b").unwrap()), &b[..]);
        assert_eq!(f.tensor("b").unwrap().dims, vec![32, 2]);
        // A producer that returns the wrong size is an error, not a corrupt file.
        let err = write_gguf(&path, &metadata, &tensors, 32, |_| Ok(vec![0; 4])).unwrap_err();
        assert!(err.to_string().contains("tensor a"), "{err}");
    }
}
