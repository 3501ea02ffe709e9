//! Reads the real SmolLM2-135M-Instruct Q4_1 GGUF. Expected numbers come from gguf-py 0.19
//! (`gguf.GGUFReader` + `gguf.quants.dequantize`).
//!
//! The model is not in git. Point `MINIVLLM_TEST_MODEL` at it, or put it at
//! `<workspace>/models/SmolLM2-135M-Instruct.Q4_1.gguf`.

use std::path::PathBuf;
use std::time::Instant;

use minivllm::model_executor::loader::gguf::GgufFile;
use minivllm_kernels::quant::GgmlType;

fn model_path() -> PathBuf {
    minivllm::testing::test_model_path()
}

#[track_caller]
fn check_values(file: &GgufFile, name: &str, expected: &[(usize, f32)], expected_sum: f64) {
    let values = file.dequantize(name).unwrap();
    for &(i, want) in expected {
        assert_eq!(
            values[i].to_bits(),
            want.to_bits(),
            "{name}[{i}]: got {}, gguf-py {want}",
            values[i]
        );
    }
    let sum: f64 = values.iter().map(|&v| v as f64).sum();
    assert!(
        (sum - expected_sum).abs() < 1e-6,
        "{name}: sum {sum}, gguf-py {expected_sum}"
    );
}

#[test]
fn smollm2_q4_1() {
    let file = GgufFile::open(&model_path()).unwrap();
    assert_eq!(file.version, 3);
    let get_u64 = |k: &str| file.get(k).and_then(|v| v.as_u64());
    assert_eq!(
        file.get("general.architecture").and_then(|v| v.as_str()),
        Some("llama")
    );
    assert_eq!(get_u64("llama.block_count"), Some(30));
    assert_eq!(get_u64("llama.embedding_length"), Some(576));
    assert_eq!(get_u64("llama.attention.head_count_kv"), Some(3));
    assert_eq!(
        file.get("llama.rope.freq_base").and_then(|v| v.as_f64()),
        Some(100000.0)
    );
    let tokens = file
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!(tokens[1].as_str(), Some("<|im_start|>"));
    let merges = file
        .get("tokenizer.ggml.merges")
        .and_then(|v| v.as_array())
        .unwrap();
    assert_eq!(merges.len(), 48900);
    assert_eq!(file.tensors.len(), 272);

    let embd = file.tensor("token_embd.weight").unwrap();
    assert_eq!(
        (embd.ggml_type, &embd.dims[..]),
        (GgmlType::Q8_0, &[576, 49152][..])
    );
    assert_eq!(embd.shape(), [49152, 576]);
    check_values(
        &file,
        "token_embd.weight",
        &[
            (0, -0.106544495),
            (1, 0.032978058),
            (300, 0.012302399),
            (575, 0.029754639),
            (576, -0.023803711),
            (1151, -0.12843704),
            (7110720, 0.06287956),
            (7111295, -0.097148895),
            (28310976, 0.011505127),
            (28311551, -0.04170227),
        ],
        -15353.04449415207,
    );

    let q = file.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (q.ggml_type, &q.dims[..]),
        (GgmlType::Q4_1, &[576, 576][..])
    );
    check_values(
        &file,
        "blk.0.attn_q.weight",
        &[
            (0, -0.09631348),
            (1, 0.15734863),
            (300, 0.16149902),
            (575, 0.123535156),
            (577, -0.11730957),
            (1151, 0.47869873),
            (172800, -0.064208984),
            (173100, 0.29110718),
            (331500, 0.125),
            (331775, -0.25585938),
        ],
        59.22322082519531,
    );
}

/// Dequantises every tensor of the model: each gives as many finite values as its shape
/// holds, and not all zero (the speed is printed: run with `--nocapture` to see it).
#[test]
fn dequantize_whole_model() {
    let file = GgufFile::open(&model_path()).unwrap();
    let start = Instant::now();
    let mut bytes = 0u64;
    let mut elements = 0usize;
    for info in &file.tensors {
        bytes += info.n_bytes();
        let values = file.dequantize_tensor(info).unwrap();
        assert_eq!(values.len() as u64, info.n_elements(), "{}", info.name);
        assert!(values.iter().all(|v| v.is_finite()), "{}", info.name);
        assert!(values.iter().any(|&v| v != 0.0), "{}: all zero", info.name);
        elements += values.len();
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "dequantised {} tensors, {:.1} MB -> {elements} f32 in {:.3} s ({:.0} MB/s of GGUF data)",
        file.tensors.len(),
        bytes as f64 / 1e6,
        secs,
        bytes as f64 / 1e6 / secs
    );
}

/// Loading drops each tensor's mapped pages once copied; reading it again must give the
/// same bytes, fetched back from the file.
#[test]
fn released_tensors_read_back_the_same() {
    let file = GgufFile::open(&model_path()).unwrap();
    let info = file.tensor("blk.0.ffn_down.weight").unwrap().clone();
    let before = file.tensor_bytes(&info).to_vec();
    assert!(!before.is_empty());
    file.release_tensor(&info);
    assert_eq!(file.tensor_bytes(&info), &before[..]);
    // An info pointing past the end of the file is ignored, not a crash.
    let bogus = minivllm::model_executor::loader::gguf::GgufTensorInfo {
        offset: u64::MAX / 2,
        ..info
    };
    file.release_tensor(&bogus);
}
