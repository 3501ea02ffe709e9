use super::*;

fn err(p: SamplingParams) -> (Option<&'static str>, String) {
    let e = p.validate().unwrap_err();
    (e.param(), e.to_string())
}

#[test]
fn sampling_params_defaults_are_vllms() {
    let p = SamplingParams::default();
    assert_eq!(p.n, 1);
    assert_eq!(p.best_of, None);
    assert_eq!(p.repetition_penalty, 1.0);
    assert_eq!(p.temperature, 1.0);
    assert_eq!(p.top_p, 1.0);
    assert_eq!(p.top_k, 0);
    assert_eq!(p.max_tokens, Some(16));
    assert!(p.skip_special_tokens && p.spaces_between_special_tokens);
    assert!(!p.ignore_eos && !p.include_stop_str_in_output);
    assert!(!p.is_greedy());
    assert_eq!(p.num_sequences(), 1);
    assert_eq!(p.top_k(), None);
    p.validate().unwrap();
    assert!(SamplingParams::greedy().is_greedy());
    SamplingParams::greedy().validate().unwrap();
    let tiny = SamplingParams {
        temperature: 0.9e-5,
        ..Default::default()
    };
    assert!(tiny.is_greedy());
}

#[test]
fn sampling_params_validation_messages() {
    let d = SamplingParams::default;
    let cases: Vec<(SamplingParams, &str, &str)> = vec![
        (
            SamplingParams { n: 0, ..d() },
            "n",
            "n must be at least 1, got 0.",
        ),
        (
            SamplingParams {
                n: 2,
                best_of: Some(1),
                ..d()
            },
            "best_of",
            "best_of must be greater than or equal to n, got n=2 and best_of=1.",
        ),
        (
            SamplingParams {
                presence_penalty: 3.0,
                ..d()
            },
            "presence_penalty",
            "presence_penalty must be in [-2, 2], got 3.0.",
        ),
        (
            SamplingParams {
                frequency_penalty: -2.5,
                ..d()
            },
            "frequency_penalty",
            "frequency_penalty must be in [-2, 2], got -2.5.",
        ),
        (
            SamplingParams {
                frequency_penalty: f32::NAN,
                ..d()
            },
            "frequency_penalty",
            "frequency_penalty must be in [-2, 2], got nan.",
        ),
        (
            SamplingParams {
                repetition_penalty: 0.0,
                ..d()
            },
            "repetition_penalty",
            "repetition_penalty must be greater than zero, got 0.0.",
        ),
        (
            SamplingParams {
                repetition_penalty: f32::INFINITY,
                ..d()
            },
            "repetition_penalty",
            "repetition_penalty must be a finite number, got inf.",
        ),
        (
            SamplingParams {
                temperature: -1.0,
                ..d()
            },
            "temperature",
            "temperature must be non-negative, got -1.0.",
        ),
        (
            SamplingParams {
                temperature: f32::NAN,
                ..d()
            },
            "temperature",
            "temperature must be a finite number, got nan.",
        ),
        (
            SamplingParams { top_p: 1.5, ..d() },
            "top_p",
            "top_p must be in (0, 1], got 1.5.",
        ),
        (
            SamplingParams { top_p: 0.0, ..d() },
            "top_p",
            "top_p must be in (0, 1], got 0.0.",
        ),
        (
            SamplingParams { top_k: -5, ..d() },
            "top_k",
            "top_k must be 0 (disable), or at least 1, got -5.",
        ),
        (
            SamplingParams { min_p: 2.0, ..d() },
            "min_p",
            "min_p must be in [0, 1], got 2.0.",
        ),
        (
            SamplingParams {
                max_tokens: Some(0),
                ..d()
            },
            "max_tokens",
            "max_tokens must be at least 1, got 0.",
        ),
        (
            SamplingParams {
                max_tokens: Some(4),
                min_tokens: 5,
                ..d()
            },
            "min_tokens",
            "min_tokens must be less than or equal to max_tokens=4, got 5.",
        ),
        (
            SamplingParams {
                stop: vec!["a".into(), String::new()],
                ..d()
            },
            "stop",
            "stop cannot contain an empty string.",
        ),
        (
            SamplingParams {
                stop: vec!["x".into(); 1025],
                ..d()
            },
            "stop",
            "stop may hold at most 1024 strings, got 1025.",
        ),
        (
            SamplingParams {
                stop: vec!["é".repeat(2049)],
                ..d()
            },
            "stop",
            "each stop string may be at most 4096 bytes long, got one of 4098.",
        ),
        (
            SamplingParams {
                n: 3,
                ..SamplingParams::greedy()
            },
            "n",
            "n must be 1 when using greedy sampling, got 3.",
        ),
        (
            SamplingParams {
                best_of: Some(2),
                ..SamplingParams::greedy()
            },
            "best_of",
            "best_of must be 1 when using greedy sampling, got 2.",
        ),
    ];
    for (params, param, message) in cases {
        assert_eq!(err(params), (Some(param), message.to_string()));
    }
}

#[test]
fn sampling_params_valid_edges_pass() {
    let d = SamplingParams::default;
    for p in [
        SamplingParams { top_k: -1, ..d() },
        SamplingParams { top_k: 1, ..d() },
        SamplingParams {
            top_p: 1.0,
            min_p: 1.0,
            ..d()
        },
        SamplingParams {
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            ..d()
        },
        SamplingParams {
            max_tokens: None,
            min_tokens: 100,
            ..d()
        },
        SamplingParams {
            max_tokens: Some(5),
            min_tokens: 5,
            ..d()
        },
        SamplingParams {
            n: 2,
            best_of: Some(4),
            ..d()
        },
        SamplingParams {
            logprobs: Some(0),
            prompt_logprobs: Some(5),
            ..d()
        },
    ] {
        p.validate().unwrap();
    }
    assert_eq!(
        SamplingParams {
            n: 2,
            best_of: Some(4),
            ..d()
        }
        .num_sequences(),
        4
    );
    assert_eq!(SamplingParams { n: 3, ..d() }.num_sequences(), 3);
    // Before the checks refuse it, a `best_of` below `n` still counts `n` sequences.
    let unchecked = SamplingParams {
        n: 3,
        best_of: Some(2),
        ..d()
    };
    assert_eq!(unchecked.num_sequences(), 3);
    assert_eq!(SamplingParams { top_k: -1, ..d() }.top_k(), None);
    assert_eq!(SamplingParams { top_k: 7, ..d() }.top_k(), Some(7));
}

#[test]
fn sampling_params_model_checks() {
    let d = SamplingParams::default;
    d().validate_for_model(100, 20).unwrap();
    // `--max-logprobs -1` allows up to the whole vocabulary, no more.
    let all = SamplingParams {
        logprobs: Some(ALL_LOGPROBS),
        prompt_logprobs: Some(ALL_LOGPROBS),
        ..d()
    };
    all.validate_for_model(100, ALL_LOGPROBS).unwrap();
    all.validate_for_model(100, 100).unwrap();
    let e = SamplingParams {
        prompt_logprobs: Some(101),
        ..d()
    }
    .validate_for_model(100, ALL_LOGPROBS)
    .unwrap_err();
    assert_eq!(
        e.message(),
        "Requested prompt logprobs of 101, which is greater than max allowed: 100"
    );
    let json: SamplingParams = serde_json::from_str(r#"{"logprobs": -1}"#).unwrap();
    assert_eq!(json.logprobs, Some(ALL_LOGPROBS));
    let cases = [
        (
            SamplingParams { top_k: 101, ..d() },
            "top_k",
            "top_k cannot be greater than vocabulary size(100), but got 101.",
        ),
        (
            SamplingParams {
                logprobs: Some(21),
                ..d()
            },
            "logprobs",
            "Requested sample logprobs of 21, which is greater than max allowed: 20",
        ),
        (
            SamplingParams {
                prompt_logprobs: Some(30),
                ..d()
            },
            "prompt_logprobs",
            "Requested prompt logprobs of 30, which is greater than max allowed: 20",
        ),
        (
            // -1 is the vocabulary, refused under the default limit.
            SamplingParams {
                logprobs: Some(ALL_LOGPROBS),
                ..d()
            },
            "logprobs",
            "Requested sample logprobs of 100, which is greater than max allowed: 20",
        ),
        (
            SamplingParams {
                stop_token_ids: vec![3, 100, 200],
                ..d()
            },
            "stop_token_ids",
            "token_id(s) [100, 200] in stop_token_ids contain out-of-vocab token ids. \
             Vocabulary size: 100",
        ),
        (
            SamplingParams {
                logit_bias: [(100, 1.0)].into_iter().collect(),
                ..d()
            },
            "logit_bias",
            "token_id(s) [100] in logit_bias contain out-of-vocab token ids. \
             Vocabulary size: 100",
        ),
    ];
    for (params, param, message) in cases {
        let e = params.validate_for_model(100, 20).unwrap_err();
        assert_eq!(
            (e.param(), e.to_string()),
            (Some(param), message.to_string())
        );
    }
}

#[test]
fn sampling_params_max_tokens_against_context() {
    let with = |max_tokens| SamplingParams {
        max_tokens,
        ..Default::default()
    };
    assert_eq!(with(Some(16)).max_tokens_for(10, 100), Ok(16));
    assert_eq!(with(None).max_tokens_for(10, 100), Ok(90));
    assert_eq!(with(Some(90)).max_tokens_for(10, 100), Ok(90));
    let e = with(Some(91)).max_tokens_for(10, 100).unwrap_err();
    assert_eq!(e.param(), Some("max_tokens"));
    assert_eq!(
        e.to_string(),
        "'max_tokens' is too large: 91. This model's maximum context length is 100 tokens \
         and your request has 10 input tokens (91 > 100 - 10)."
    );
    let e = with(None).max_tokens_for(100, 100).unwrap_err();
    assert_eq!(e.param(), None);
    assert_eq!(
        e.to_string(),
        "This model's maximum context length is 100 tokens. However, your request has 100 \
         input tokens. Please reduce the length of the input messages."
    );
}

#[test]
fn sampling_params_serde() {
    let p: SamplingParams = serde_json::from_str(
        r#"{"n": 2, "temperature": 0.7, "stop": "\n", "logit_bias": {"42": -100, "7": 2.5},
            "seed": null, "stop_token_ids": null, "max_tokens": null}"#,
    )
    .unwrap();
    assert_eq!(p.n, 2);
    assert_eq!(p.temperature, 0.7);
    assert_eq!(p.stop, vec!["\n".to_string()]);
    assert_eq!(p.logit_bias.get(&42), Some(&-100.0));
    assert_eq!(p.logit_bias.get(&7), Some(&2.5));
    assert_eq!(p.max_tokens, None);
    assert_eq!(p.top_p, 1.0);
    assert!(p.skip_special_tokens);
    let p: SamplingParams = serde_json::from_str(r#"{"stop": ["a", "b"]}"#).unwrap();
    assert_eq!(p.stop, vec!["a".to_string(), "b".to_string()]);
    assert_eq!(p.max_tokens, Some(16));
    let back: SamplingParams = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
    let empty: SamplingParams = serde_json::from_str("{}").unwrap();
    assert_eq!(empty, SamplingParams::default());
}

#[test]
fn sampling_params_py_float() {
    assert_eq!(py_float(3.0), "3.0");
    assert_eq!(py_float(-0.5), "-0.5");
    assert_eq!(py_float(0.1), "0.1");
    assert_eq!(py_float(1e20), "1e+20");
    assert_eq!(py_float(1e-7), "1e-07");
    assert_eq!(py_float(f32::NEG_INFINITY), "-inf");
}
