use super::*;
use crate::model_executor::loader::gguf_writer::{put_str, put_value};

/// Lays files out as gguf-py's writer does, with raw escape hatches for broken ones.
struct Writer {
    version: u32,
    alignment: usize,
    kv: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

impl Writer {
    fn new() -> Self {
        Writer {
            version: 3,
            alignment: 32,
            kv: Vec::new(),
            n_kv: 0,
            infos: Vec::new(),
            n_tensors: 0,
            data: Vec::new(),
        }
    }

    fn kv(self, key: &str, v: GgufValue) -> Self {
        let mut raw = Vec::new();
        put_value(&mut raw, &v);
        self.raw_kv(key, v.type_id(), &raw)
    }

    fn raw_kv(mut self, key: &str, type_id: u32, raw: &[u8]) -> Self {
        put_str(&mut self.kv, key);
        self.kv.extend(type_id.to_le_bytes());
        self.kv.extend(raw);
        self.n_kv += 1;
        self
    }

    fn alignment(mut self, a: u32) -> Self {
        self.alignment = a as usize;
        self.kv("general.alignment", GgufValue::U32(a))
    }

    fn info(mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Self {
        put_str(&mut self.infos, name);
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(type_id.to_le_bytes());
        self.infos.extend(offset.to_le_bytes());
        self.n_tensors += 1;
        self
    }

    /// Padding goes before each tensor, not after, so the file ends with the last byte of
    /// data and cutting one byte truncates it.
    fn tensor(mut self, name: &str, dims: &[u64], ty: GgmlType, bytes: &[u8]) -> Self {
        self.data
            .resize(self.data.len().next_multiple_of(self.alignment), 0);
        let offset = self.data.len() as u64;
        self.data.extend(bytes);
        self.info(name, dims, ty.id(), offset)
    }

    fn build(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.infos);
        if !self.data.is_empty() {
            out.resize(out.len().next_multiple_of(self.alignment), 0);
            out.extend(&self.data);
        }
        out
    }
}

fn open_bytes(bytes: &[u8]) -> (tempfile::TempDir, Result<GgufFile, LoadError>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("test.gguf");
    std::fs::write(&path, bytes).unwrap();
    let file = GgufFile::open(&path);
    (dir, file)
}

fn open_err(bytes: &[u8]) -> String {
    open_bytes(bytes).1.unwrap_err().to_string()
}

#[track_caller]
fn assert_err(bytes: &[u8], needles: &[&str]) {
    let msg = open_err(bytes);
    for needle in needles {
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn s(x: &str) -> GgufValue {
    GgufValue::String(x.into())
}

/// One F32 tensor after some metadata; the base for the corruption tests.
fn small_file() -> Writer {
    Writer::new()
        .kv("general.architecture", s("llama"))
        .kv("tokens", GgufValue::Array(vec![s("a"), s("bc")]))
        .tensor(
            "w",
            &[3, 2],
            GgmlType::F32,
            &f32_bytes(&[1., 2., 3., 4., 5., 6.]),
        )
}

#[test]
fn overlapping_tensor_data_is_refused() {
    let w = Writer::new()
        .kv("general.architecture", s("llama"))
        .info("a", &[8], GgmlType::F32.id(), 0)
        .info("b", &[8], GgmlType::F32.id(), 0);
    let mut bytes = w.build();
    bytes.resize(bytes.len().next_multiple_of(32) + 64, 0);
    assert_err(&bytes, &["tensors a and b overlap"]);
}

#[test]
fn every_value_type_round_trips() {
    use GgufValue::*;
    let values = vec![
        ("u8", U8(200)),
        ("i8", I8(-5)),
        ("u16", U16(60000)),
        ("i16", I16(-30000)),
        ("u32", U32(4_000_000_000)),
        ("i32", I32(-2_000_000_000)),
        ("u64", U64(u64::MAX)),
        ("i64", I64(i64::MIN)),
        ("f32", F32(1e-5)),
        ("f64", F64(-2.5e300)),
        ("true", Bool(true)),
        ("false", Bool(false)),
        ("str", s("héllo, wörld")),
        ("empty_str", s("")),
        ("strings", Array(vec![s("<s>"), s(""), s("Ġthe")])),
        ("ints", Array(vec![I32(-1), I32(7)])),
        ("empty", Array(vec![])),
        (
            "nested",
            Array(vec![
                Array(vec![U8(1), U8(2)]),
                Array(vec![]),
                Array(vec![U8(3)]),
            ]),
        ),
        ("nested_strings", Array(vec![Array(vec![s("x"), s("y")])])),
        ("floats", Array(vec![F64(0.5), F64(-0.25)])),
        ("bools", Array(vec![Bool(true), Bool(false)])),
    ];
    let mut w = Writer::new();
    for (k, v) in &values {
        w = w.kv(k, v.clone());
    }
    let (_dir, file) = open_bytes(&w.build());
    let file = file.unwrap();
    assert_eq!(file.version, 3);
    assert_eq!(file.metadata.len(), values.len());
    for (k, v) in &values {
        assert_eq!(file.get(k), Some(v), "{k}");
    }
    assert!(file.tensors.is_empty());
    assert_eq!(file.get("missing"), None);

    let get = |k: &str| file.get(k).unwrap();
    assert_eq!(get("u8").as_u64(), Some(200));
    assert_eq!(get("i32").as_u64(), None);
    assert_eq!(get("i32").as_i64(), Some(-2_000_000_000));
    assert_eq!(get("u64").as_i64(), None);
    assert_eq!(get("u32").as_f64(), Some(4e9));
    assert_eq!(get("f32").as_f64(), Some(1e-5f32 as f64));
    assert_eq!(get("f32").as_u64(), None);
    assert_eq!(get("str").as_str(), Some("héllo, wörld"));
    assert_eq!(get("true").as_bool(), Some(true));
    assert_eq!(get("u8").as_bool(), None);
    assert_eq!(get("strings").as_array().map(<[_]>::len), Some(3));
    assert_eq!(
        get("nested").as_array().unwrap()[2].as_array(),
        Some(&[U8(3)][..])
    );
}

#[test]
fn tensors_default_alignment() {
    let q8 = {
        let mut b = half::f16::from_f32(0.5).to_le_bytes().to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        b
    };
    // A 3-byte key leaves the tensor infos unaligned, so the data section needs padding.
    let w = Writer::new()
        .kv("odd", s("abc"))
        .tensor(
            "a",
            &[3, 2],
            GgmlType::F32,
            &f32_bytes(&[1., 2., 3., 4., 5., 6.]),
        )
        .tensor("b.q8", &[32], GgmlType::Q8_0, &q8)
        .tensor("c", &[2], GgmlType::F16, &[0x00, 0x3C, 0x00, 0xC0]);
    let (_dir, file) = open_bytes(&w.build());
    let file = file.unwrap();
    assert_eq!(file.alignment, 32);
    assert_eq!(file.data_offset % 32, 0);
    assert_eq!(
        file.tensors.iter().map(|t| &t.name[..]).collect::<Vec<_>>(),
        ["a", "b.q8", "c"]
    );
    let a = file.tensor("a").unwrap();
    assert_eq!(
        (a.dims.clone(), a.shape(), a.n_elements(), a.n_bytes()),
        (vec![3, 2], vec![2, 3], 6, 24)
    );
    assert_eq!(file.tensor_bytes(a), f32_bytes(&[1., 2., 3., 4., 5., 6.]));
    assert_eq!(file.dequantize("a").unwrap(), [1., 2., 3., 4., 5., 6.]);
    let b = file.tensor("b.q8").unwrap();
    assert_eq!(
        (b.ggml_type, b.offset, b.n_bytes()),
        (GgmlType::Q8_0, 32, 34)
    );
    let want: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect();
    assert_eq!(file.dequantize("b.q8").unwrap(), want);
    assert_eq!(file.tensor("c").unwrap().offset, 96);
    assert_eq!(file.dequantize("c").unwrap(), [1.0, -2.0]);
    assert!(file.tensor("nope").is_none());
}

#[test]
fn custom_alignment_and_version_2() {
    let mut w = Writer::new()
        .alignment(64)
        .tensor("a", &[4], GgmlType::F32, &f32_bytes(&[1., 2., 3., 4.]))
        .tensor("b", &[1], GgmlType::F32, &f32_bytes(&[9.]));
    w.version = 2;
    let (_dir, file) = open_bytes(&w.build());
    let file = file.unwrap();
    assert_eq!((file.version, file.alignment), (2, 64));
    assert_eq!(file.data_offset % 64, 0);
    assert_eq!(file.tensor("b").unwrap().offset, 64);
    assert_eq!(file.dequantize("b").unwrap(), [9.]);
    assert_eq!(file.dequantize("a").unwrap(), [1., 2., 3., 4.]);
}

#[test]
fn missing_file() {
    let path = Path::new("/nonexistent/dir/model.gguf");
    let msg = GgufFile::open(path).unwrap_err().to_string();
    assert!(
        msg.contains("/nonexistent/dir/model.gguf") && msg.contains("does not exist"),
        "{msg}"
    );
}

#[test]
fn wrong_magic() {
    let mut bytes = small_file().build();
    bytes[..4].copy_from_slice(b"GGML");
    assert_err(&bytes, &["is not a GGUF file", "[71, 71, 77, 76]"]);
}

#[test]
fn unsupported_versions() {
    for version in [1, 4, 0x0300_0000] {
        let mut w = small_file();
        w.version = version;
        assert_err(
            &w.build(),
            &[&format!("unsupported GGUF version {version}")],
        );
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = small_file().build();
    for len in 0..bytes.len() {
        let msg = open_err(&bytes[..len]);
        assert!(msg.contains("truncated"), "cut at {len}: {msg}");
    }
    assert_err(
        &bytes[..6],
        &[
            "version",
            "truncated file: 4 bytes needed at offset 4, only 2 left",
        ],
    );
    let tail = bytes.len() - 1;
    assert_err(
        &bytes[..tail],
        &["tensor w", "runs past the end of the file"],
    );
}

#[test]
fn string_longer_than_file() {
    let mut w = small_file();
    w.kv.extend((1u64 << 40).to_le_bytes());
    w.kv.extend(b"key");
    w.n_kv += 1;
    assert_err(
        &w.build(),
        &[
            "metadata key #2",
            "string of 1099511627776 bytes",
            "truncated",
        ],
    );

    let w = small_file().raw_kv("k", 8, &u64::MAX.to_le_bytes());
    assert_err(
        &w.build(),
        &[
            "metadata value of \"k\"",
            "string of 18446744073709551615 bytes",
        ],
    );

    let mut w = small_file();
    w.infos.clear();
    w.infos.extend(1_000_000u64.to_le_bytes());
    assert_err(
        &w.build(),
        &["tensor info #0", "name", "string of 1000000 bytes"],
    );
}

#[test]
fn absurd_counts() {
    let bytes = small_file().build();
    let mut b = bytes.clone();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_err(
        &b,
        &["tensor count", "18446744073709551615 entries", "cannot fit"],
    );
    let mut b = bytes;
    b[16..24].copy_from_slice(&(1u64 << 62).to_le_bytes());
    assert_err(&b, &["metadata count", "cannot fit"]);

    let mut raw = 0u32.to_le_bytes().to_vec(); // array of u8
    raw.extend((1u64 << 50).to_le_bytes());
    assert_err(
        &small_file().raw_kv("arr", 9, &raw).build(),
        &["\"arr\"", "array length", "cannot fit"],
    );
    let mut raw = 8u32.to_le_bytes().to_vec(); // array of strings
    raw.extend(u64::MAX.to_le_bytes());
    assert_err(
        &small_file().raw_kv("arr", 9, &raw).build(),
        &["array length", "cannot fit"],
    );
}

#[test]
fn unknown_value_types() {
    let w = small_file().raw_kv("k", 13, &[0; 8]);
    assert_err(
        &w.build(),
        &["metadata value of \"k\"", "unknown metadata value type 13"],
    );
    let mut raw = 99u32.to_le_bytes().to_vec();
    raw.extend(0u64.to_le_bytes());
    let w = small_file().raw_kv("k", 9, &raw);
    assert_err(&w.build(), &["array of unknown value type 99"]);
}

#[test]
fn unknown_tensor_type() {
    let w = small_file().info("blk.0.weird", &[32], 99, 0);
    assert_err(
        &w.build(),
        &[
            "tensor blk.0.weird",
            "unsupported tensor type unknown (id 99)",
        ],
    );
    let w = small_file().info("retired", &[32], 4, 0);
    assert_err(&w.build(), &["tensor retired", "(id 4)"]);
}

#[test]
fn dequantize_errors() {
    let w = small_file().tensor("iq", &[256], GgmlType::IQ2_XXS, &[0; 66]);
    let (_dir, file) = open_bytes(&w.build());
    let file = file.unwrap();
    let msg = file.dequantize("nope").unwrap_err().to_string();
    assert_eq!(msg, "missing tensor nope");
    let msg = file.dequantize("iq").unwrap_err().to_string();
    assert_eq!(msg, "tensor iq: unsupported tensor type IQ2_XXS (id 16)");
    assert_eq!(file.tensor_bytes(file.tensor("iq").unwrap()).len(), 66);
}

#[test]
fn bad_alignment_values() {
    for (v, shown) in [
        (GgufValue::U32(0), "U32(0)"),
        (GgufValue::U32(48), "U32(48)"),
        (s("32"), "String"),
    ] {
        let w = Writer::new().kv("general.alignment", v);
        assert_err(
            &w.build(),
            &["general.alignment must be a power of two", shown],
        );
    }
    // Any integer type is accepted.
    let w = Writer::new()
        .kv("general.alignment", GgufValue::U64(16))
        .tensor("a", &[1], GgmlType::F32, &[0; 4]);
    assert_eq!(open_bytes(&w.build()).1.unwrap().alignment, 16);
}

#[test]
fn malformed_tensor_infos() {
    let w = small_file().info("x", &[4], GgmlType::F32.id(), 8);
    assert_err(
        &w.build(),
        &["tensor x", "offset 8 is not a multiple of the alignment 32"],
    );
    let w = small_file().info("x", &[1, 1, 1, 1, 1], 0, 0);
    assert_err(&w.build(), &["tensor \"x\"", "5 dimensions, at most 4"]);
    let w = small_file().info("x", &[33], GgmlType::Q4_0.id(), 0);
    assert_err(
        &w.build(),
        &["row length 33 is not a multiple of the Q4_0 block size 32"],
    );
    let w = small_file().info("x", &[1 << 32, 1 << 32], 0, 0);
    assert_err(&w.build(), &["overflow the element count"]);
    let w = small_file().info("x", &[1 << 30, 1 << 30], 0, 0);
    assert_err(&w.build(), &["tensor x", "runs past the end of the file"]);
    let w = small_file().info("w", &[1], 0, 0);
    assert_err(&w.build(), &["duplicate tensor name \"w\""]);
    let w = small_file().info("x", &[1], 0, u64::MAX - 31);
    assert_err(&w.build(), &["tensor x", "runs past the end of the file"]);
}

#[test]
fn malformed_values() {
    assert_err(
        &small_file().raw_kv("b", 7, &[2]).build(),
        &["\"b\"", "bool byte is 2"],
    );
    let mut raw = 2u64.to_le_bytes().to_vec();
    raw.extend([0xFF, 0xFE]);
    assert_err(
        &small_file().raw_kv("u", 8, &raw).build(),
        &["\"u\"", "not UTF-8"],
    );
    let w = small_file().kv("tokens", s("again"));
    assert_err(&w.build(), &["duplicate metadata key \"tokens\""]);

    let mut deep = GgufValue::Array(vec![]);
    for _ in 0..MAX_ARRAY_DEPTH {
        deep = GgufValue::Array(vec![deep]);
    }
    assert_err(
        &small_file().kv("deep", deep.clone()).build(),
        &["nested more than 8 deep"],
    );
    let GgufValue::Array(mut inner) = deep else {
        unreachable!()
    };
    let ok = small_file().kv("deep", inner.pop().unwrap()).build();
    assert!(open_bytes(&ok).1.is_ok());
}
