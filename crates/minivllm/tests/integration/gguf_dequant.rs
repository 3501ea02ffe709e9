//! Dequantisation of every supported GGML type against gguf-py's reference values.
//!
//! The fixture is written by `scripts/make_quant_fixture.py`: for each type it holds a
//! tensor `<TYPE>.q` and the f32 values gguf-py decodes it to, `<TYPE>.expected`.

use std::path::PathBuf;

use minivllm::model_executor::loader::gguf::GgufFile;
use minivllm_kernels::quant::GgmlType;

fn fixture() -> GgufFile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../minivllm-kernels/tests/fixtures/quant_fixture.gguf.fixture");
    GgufFile::open(&path)
        .unwrap_or_else(|e| panic!("{e} (regenerate with scripts/make_quant_fixture.py)"))
}

#[test]
fn every_type_matches_gguf_py() {
    let file = fixture();
    let mut covered = Vec::new();
    for info in file.tensors.iter().filter(|t| t.name.ends_with(".q")) {
        let ty = info.ggml_type;
        assert_eq!(info.name, format!("{}.q", ty.name()));
        let expected_name = format!("{}.expected", ty.name());
        let expected_info = file.tensor(&expected_name).expect("expected tensor");
        assert_eq!(expected_info.ggml_type, GgmlType::F32);
        assert_eq!(expected_info.dims, info.dims, "{ty}");

        let got = file.dequantize(&info.name).unwrap();
        let want = file.dequantize(&expected_name).unwrap();
        assert_eq!(got.len(), want.len(), "{ty}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            // ggml's arithmetic is reproduced operation for operation, so results are exact.
            assert!(
                g.to_bits() == w.to_bits(),
                "{ty} element {i}: got {g}, gguf-py {w}"
            );
        }
        covered.push(ty);
    }
    let supported: Vec<GgmlType> = GgmlType::ALL
        .into_iter()
        .filter(|t| t.can_dequantize())
        .collect();
    covered.sort_by_key(|t| t.id());
    assert_eq!(
        covered, supported,
        "the fixture must cover every type we dequantise"
    );
}
