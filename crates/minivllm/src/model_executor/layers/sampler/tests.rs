use super::*;
use crate::sampling_params::SamplingParams;

/// What every row of a test batch has seen.
#[derive(Default, Clone, Copy)]
struct History<'a> {
    prompt: &'a [u32],
    output: &'a [u32],
    eos: &'a [u32],
}

fn run(
    sampler: &mut Sampler,
    logits: &mut [f32],
    rows: &mut [(&SamplingParams, &mut SeqSamplingState)],
    h: History<'_>,
) -> Vec<SampledToken> {
    let mut ctxs: Vec<SamplingContext<'_>> = rows
        .iter_mut()
        .map(|(params, state)| SamplingContext {
            options: params.sampling_options(),
            prompt_ids: h.prompt,
            output_ids: h.output,
            accepted: &[],
            eos_token_ids: h.eos,
            allowed: None,
            state,
        })
        .collect();
    sampler.sample(logits, &mut ctxs)
}

/// One row: the token and the processed logits.
fn run_one(
    sampler: &mut Sampler,
    row: &[f32],
    params: &SamplingParams,
    state: &mut SeqSamplingState,
    h: History<'_>,
) -> (SampledToken, Vec<f32>) {
    let mut logits = row.to_vec();
    let token = run(sampler, &mut logits, &mut [(params, state)], h).remove(0);
    (token, logits)
}

fn sample_one(
    sampler: &mut Sampler,
    row: &[f32],
    params: &SamplingParams,
    state: &mut SeqSamplingState,
) -> SampledToken {
    run_one(sampler, row, params, state, History::default()).0
}

fn reference_log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max
        + row
            .iter()
            .map(|&x| (x as f64 - max).exp())
            .sum::<f64>()
            .ln();
    row.iter().map(|&x| (x as f64 - lse) as f32).collect()
}

/// Ten tokens with these probabilities, shuffled so that order by id means nothing.
const PROBS: [(u32, f32); 10] = [
    (4, 0.30),
    (7, 0.20),
    (1, 0.15),
    (9, 0.10),
    (0, 0.08),
    (3, 0.06),
    (8, 0.05),
    (2, 0.03),
    (6, 0.02),
    (5, 0.01),
];

fn ten_token_logits() -> Vec<f32> {
    let mut row = vec![0.0; 10];
    for (t, p) in PROBS {
        row[t as usize] = p.ln() + 3.0;
    }
    row
}

/// Draws `draws` tokens and checks each lands in `allowed` (the first `allowed` entries
/// of PROBS) with a frequency near its renormalised probability.
fn check_distribution(params: &SamplingParams, allowed: usize, draws: usize) {
    let row = ten_token_logits();
    let mut sampler = Sampler::new();
    let mut state = SeqSamplingState::new(Some(1234), 0);
    let mut hits = [0usize; 10];
    for _ in 0..draws {
        hits[sample_one(&mut sampler, &row, params, &mut state).token_id as usize] += 1;
    }
    let mass: f32 = PROBS[..allowed].iter().map(|p| p.1).sum();
    for (rank, &(t, p)) in PROBS.iter().enumerate() {
        let freq = hits[t as usize] as f32 / draws as f32;
        if rank < allowed {
            assert!(
                (freq - p / mass).abs() < 0.04,
                "token {t}: frequency {freq}, expected {} ({params:?})",
                p / mass
            );
        } else {
            assert_eq!(hits[t as usize], 0, "token {t} is outside the allowed set");
        }
    }
}

#[test]
fn sampler_greedy_is_first_argmax() {
    let mut sampler = Sampler::new();
    let params = SamplingParams::greedy();
    let (mut a, mut b) = (
        SeqSamplingState::new(None, 0),
        SeqSamplingState::new(None, 1),
    );
    let mut logits = vec![1.0, 3.0, 3.0, 2.0, /* row 2 */ -5.0, -1.0, -3.0, -1.5];
    let out = run(
        &mut sampler,
        &mut logits,
        &mut [(&params, &mut a), (&params, &mut b)],
        History::default(),
    );
    assert_eq!(out[0].token_id, 1);
    assert_eq!(out[1].token_id, 1);
    assert!(out[0].top_logprobs.is_empty() && out[0].rank.is_none());
    // Temperatures under the greedy threshold also take the argmax.
    let near_zero = SamplingParams {
        temperature: 1e-6,
        ..Default::default()
    };
    let t = sample_one(&mut sampler, &[0.0, 0.1, 5.0, 4.9], &near_zero, &mut a);
    assert_eq!(t.token_id, 2);
}

#[test]
fn sampler_penalties_change_logits_as_defined() {
    let params = SamplingParams {
        repetition_penalty: 2.0,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..SamplingParams::greedy()
    };
    let mut state = SeqSamplingState::new(None, 0);
    let history = History {
        prompt: &[0, 1, 1],
        output: &[2, 2, 3],
        ..Default::default()
    };
    let row = [2.0, -1.0, 0.5, 3.0, 0.0, 1.0];
    let (_, logits) = run_one(&mut Sampler::new(), &row, &params, &mut state, history);
    // 0, 1: prompt only, repetition alone (positive divided, negative multiplied).
    // 2: twice in the output; repetition once, frequency twice, presence once.
    // 3: once in the output. 4, 5: untouched.
    let expected = [1.0, -2.0, 0.25 - 1.0 - 0.25, 1.5 - 0.5 - 0.25, 0.0, 1.0];
    assert_eq!(logits, expected);

    // Each penalty alone, on a batch of two rows.
    let freq = SamplingParams {
        frequency_penalty: -1.0,
        ..SamplingParams::greedy()
    };
    let pres = SamplingParams {
        presence_penalty: 2.0,
        ..SamplingParams::greedy()
    };
    let mut other = SeqSamplingState::new(None, 1);
    let mut logits = vec![0.0; 8];
    run(
        &mut Sampler::new(),
        &mut logits,
        &mut [(&freq, &mut state), (&pres, &mut other)],
        History {
            prompt: &[3],
            output: &[1, 1, 1, 2],
            ..Default::default()
        },
    );
    assert_eq!(logits, [0.0, 3.0, 1.0, 0.0, 0.0, -2.0, -2.0, 0.0]);
}

#[test]
fn sampler_logit_bias() {
    let mut sampler = Sampler::new();
    let mut state = SeqSamplingState::new(None, 0);
    let row = [1.0, 2.0, 3.0, 0.0];
    let params = SamplingParams {
        // 99 is past the vocabulary: ignored, not a panic.
        logit_bias: [(3, 5.0), (2, -100.0), (99, 1.0)].into_iter().collect(),
        ..SamplingParams::greedy()
    };
    let (out, logits) = run_one(&mut sampler, &row, &params, &mut state, History::default());
    assert_eq!(out.token_id, 3);
    assert_eq!(logits, [1.0, 2.0, -97.0, 5.0]);
    // Sampling too: a -100 bias leaves the token with no chance worth measuring.
    let sampled = SamplingParams {
        temperature: 1.0,
        logit_bias: [(0, -100.0), (1, -100.0), (2, -100.0)]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    for _ in 0..200 {
        assert_eq!(
            sample_one(&mut sampler, &row, &sampled, &mut state).token_id,
            3
        );
    }
}

#[test]
fn sampler_min_tokens_bans_eos_and_stop_tokens() {
    let mut sampler = Sampler::new();
    let mut state = SeqSamplingState::new(None, 0);
    let params = SamplingParams {
        min_tokens: 2,
        stop_token_ids: vec![1],
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let row = [0.0, 9.0, 1.0, 10.0];
    let mut history = History {
        prompt: &[5],
        output: &[2],
        eos: &[3],
    };
    let (out, logits) = run_one(&mut sampler, &row, &params, &mut state, history);
    assert_eq!(out.token_id, 2);
    assert_eq!(logits[1], f32::NEG_INFINITY);
    assert_eq!(logits[3], f32::NEG_INFINITY);
    // The raw logprob still sees the banned tokens.
    assert!(out.logprob < -7.0);
    history.output = &[2, 2];
    let (out, _) = run_one(&mut sampler, &row, &params, &mut state, history);
    assert_eq!(out.token_id, 3);
    // Sampled, the banned tokens never come up.
    let sampled = SamplingParams {
        temperature: 1.0,
        ..params
    };
    history.output = &[];
    for _ in 0..200 {
        let (out, _) = run_one(&mut sampler, &row, &sampled, &mut state, history);
        assert!(out.token_id == 0 || out.token_id == 2);
    }
}

#[test]
fn sampler_seeded_is_reproducible_whatever_the_batch() {
    let seeded = SamplingParams {
        seed: Some(42),
        top_p: 0.9,
        ..Default::default()
    };
    let other = SamplingParams {
        temperature: 0.7,
        top_k: 3,
        ..Default::default()
    };
    let greedy = SamplingParams::greedy();
    let row = ten_token_logits();
    let steps = 40;

    let mut first = Vec::new();
    let mut sampler = Sampler::new();
    let (mut a, mut b) = (
        SeqSamplingState::new(Some(42), 0),
        SeqSamplingState::new(None, 0),
    );
    for _ in 0..steps {
        let mut logits = [row.clone(), row.clone()].concat();
        let out = run(
            &mut sampler,
            &mut logits,
            &mut [(&seeded, &mut a), (&other, &mut b)],
            History::default(),
        );
        first.push(out[0].token_id);
    }

    let mut second = Vec::new();
    let mut sampler = Sampler::new();
    let (mut a, mut b, mut c) = (
        SeqSamplingState::new(Some(42), 0),
        SeqSamplingState::new(Some(7), 0),
        SeqSamplingState::new(None, 0),
    );
    for _ in 0..steps {
        let mut logits = [row.clone(), row.clone(), row.clone()].concat();
        let out = run(
            &mut sampler,
            &mut logits,
            &mut [(&greedy, &mut c), (&other, &mut b), (&seeded, &mut a)],
            History::default(),
        );
        second.push(out[2].token_id);
    }
    assert_eq!(first, second);

    // Another completion of the same request draws from its own stream.
    let mut sibling = SeqSamplingState::new(Some(42), 1);
    let third: Vec<u32> = (0..steps)
        .map(|_| sample_one(&mut sampler, &row, &seeded, &mut sibling).token_id)
        .collect();
    assert_ne!(first, third);
}

#[test]
fn sampler_unseeded_states_differ() {
    let mut a = SeqSamplingState::new(None, 0);
    let mut b = SeqSamplingState::new(None, 0);
    assert_ne!(a.rng.random::<u64>(), b.rng.random::<u64>());
}

#[test]
fn sampler_plain_and_temperature_frequencies() {
    check_distribution(&SamplingParams::default(), 10, 4000);
    // Temperature 0.5 squares the probabilities before renormalising.
    let row = ten_token_logits();
    let params = SamplingParams {
        temperature: 0.5,
        ..Default::default()
    };
    let mut sampler = Sampler::new();
    let mut state = SeqSamplingState::new(Some(9), 0);
    let draws = 4000;
    let mut hits = [0usize; 10];
    for _ in 0..draws {
        hits[sample_one(&mut sampler, &row, &params, &mut state).token_id as usize] += 1;
    }
    let mass: f32 = PROBS.iter().map(|p| p.1 * p.1).sum();
    for (t, p) in PROBS {
        let freq = hits[t as usize] as f32 / draws as f32;
        assert!((freq - p * p / mass).abs() < 0.04, "token {t}: {freq}");
    }
}

#[test]
fn sampler_top_k_top_p_min_p_stay_in_their_sets() {
    let d = SamplingParams::default;
    check_distribution(&SamplingParams { top_k: 3, ..d() }, 3, 2000);
    check_distribution(&SamplingParams { top_k: 1, ..d() }, 1, 200);
    // Cumulative 0.30, 0.50, 0.65, 0.75: four tokens reach 0.7.
    check_distribution(&SamplingParams { top_p: 0.7, ..d() }, 4, 2000);
    // The most likely token alone already reaches 0.2.
    check_distribution(&SamplingParams { top_p: 0.2, ..d() }, 1, 200);
    // Kept: p >= 0.3 * 0.30 = 0.09.
    check_distribution(&SamplingParams { min_p: 0.3, ..d() }, 4, 2000);
    // Top-5 (mass 0.83), then top-p over it: 0.361, 0.602, 0.783, 0.904 keeps four,
    // then min-p drops p < 0.4 * 0.30 = 0.12: three.
    let all = SamplingParams {
        top_k: 5,
        top_p: 0.8,
        min_p: 0.4,
        ..d()
    };
    check_distribution(&all, 3, 2000);
    // top-p over the renormalised top-k set, not the whole vocabulary: 0.75 of the top-4
    // mass (0.75) is 0.5625, reached by three tokens.
    check_distribution(
        &SamplingParams {
            top_k: 4,
            top_p: 0.75,
            ..d()
        },
        3,
        2000,
    );
}

#[test]
fn sampler_top_p_prefix_matches_a_full_sort() {
    use rand::seq::SliceRandom;
    let mut state = ChaCha8Rng::seed_from_u64(5);
    for n in [1, 10, 63, 64, 65, 300, 5000, 49152] {
        let mut cands: Vec<(u32, f32)> = (0..n)
            .map(|i| (i as u32, state.random::<f32>().powi(8)))
            .collect();
        let mass: f64 = cands.iter().map(|c| c.1 as f64).sum();
        let mut sorted = cands.clone();
        sorted.sort_by(by_prob_desc);
        for top_p in [0.01, 0.3, 0.9, 0.999] {
            let target = top_p * mass;
            let mut cum = 0.0f64;
            let expected = sorted
                .iter()
                .position(|c| {
                    cum += c.1 as f64;
                    cum >= target
                })
                .map_or(n, |i| i + 1);
            cands.shuffle(&mut state);
            let kept = top_p_prefix(&mut cands, target);
            assert_eq!(kept, expected, "n {n}, top_p {top_p}");
            let mut got = cands[..kept].to_vec();
            got.sort_by(by_prob_desc);
            assert_eq!(got, &sorted[..kept]);
        }
    }
}

#[test]
fn sampler_logprobs_are_raw_and_sorted() {
    let row = [0.5, 2.0, -1.0, 2.0, 1.0, 3.5];
    let params = SamplingParams {
        temperature: 0.3,
        repetition_penalty: 1.5,
        presence_penalty: 1.0,
        logit_bias: [(0, 4.0)].into_iter().collect(),
        logprobs: Some(3),
        seed: Some(3),
        ..Default::default()
    };
    let reference = reference_log_softmax(&row);
    let mut sampler = Sampler::new();
    let mut state = SeqSamplingState::new(params.seed, 0);
    for _ in 0..20 {
        let history = History {
            prompt: &[5],
            output: &[1],
            ..Default::default()
        };
        let (out, _) = run_one(&mut sampler, &row, &params, &mut state, history);
        let t = out.token_id as usize;
        assert!((out.logprob - reference[t]).abs() < 1e-5);
        // Ties (tokens 1 and 3) by id.
        let top: Vec<u32> = out.top_logprobs.iter().map(|e| e.0).collect();
        assert_eq!(top, [5, 1, 3]);
        for &(tok, lp) in &out.top_logprobs {
            assert!((lp - reference[tok as usize]).abs() < 1e-5);
        }
        let rank = row.iter().filter(|&&x| x >= row[t]).count();
        assert_eq!(out.rank, Some(rank));
    }
    // More than the vocabulary: all of it.
    let all = SamplingParams {
        logprobs: Some(100),
        ..params.clone()
    };
    let out = sample_one(&mut sampler, &row, &all, &mut state);
    assert_eq!(out.top_logprobs.len(), row.len());
    assert!(out.top_logprobs.windows(2).all(|w| w[0].1 >= w[1].1));
    // Zero: only the chosen token's.
    let none = SamplingParams {
        logprobs: Some(0),
        ..params
    };
    let out = sample_one(&mut sampler, &row, &none, &mut state);
    assert!(out.top_logprobs.is_empty());
    assert!(out.rank.is_some());
}

#[test]
fn sampler_greedy_with_logprobs() {
    let row = [0.1, 1.0, 4.0, 3.0];
    let params = SamplingParams {
        logprobs: Some(2),
        // Changes the choice but not the reported (raw) logprobs.
        logit_bias: [(3, 2.0)].into_iter().collect(),
        ..SamplingParams::greedy()
    };
    let reference = reference_log_softmax(&row);
    let out = sample_one(
        &mut Sampler::new(),
        &row,
        &params,
        &mut SeqSamplingState::new(None, 0),
    );
    assert_eq!(out.token_id, 3);
    assert!((out.logprob - reference[3]).abs() < 1e-5);
    assert_eq!(out.rank, Some(2));
    assert_eq!(out.top_logprobs.len(), 2);
    assert_eq!(out.top_logprobs[0].0, 2);
    assert_eq!(out.top_logprobs[1].0, 3);
    assert!((out.top_logprobs[0].1 - reference[2]).abs() < 1e-5);
}

/// Without `logprobs` the chosen token's logprob is taken from the row without copying it
/// (nothing changes it) or from the copy (a penalty does): bit for bit the value the whole
/// row's log-softmax gives, on a vocabulary-sized row, and the row itself left as it was.
#[test]
fn sampler_logprob_without_logprobs_is_the_raw_one() {
    let row: Vec<f32> = (0..151_936u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 4001) as f32 * 0.005 - 10.0)
        .collect();
    let mut whole = row.clone();
    log_softmax_inplace(&mut whole);
    let mut sampler = Sampler::new();
    let mut state = SeqSamplingState::new(Some(1), 0);
    let greedy = SamplingParams::greedy();
    let (out, after) = run_one(&mut sampler, &row, &greedy, &mut state, History::default());
    assert_eq!(out.token_id as usize, argmax(&row));
    assert_eq!(
        out.logprob.to_bits(),
        whole[out.token_id as usize].to_bits()
    );
    assert_eq!(after, row, "an unchanged row stays unchanged");
    let with_all = SamplingParams {
        logprobs: Some(2),
        ..greedy.clone()
    };
    let full = sample_one(&mut sampler, &row, &with_all, &mut state);
    assert_eq!(
        (full.token_id, full.logprob.to_bits()),
        (out.token_id, out.logprob.to_bits())
    );
    let penalised = SamplingParams {
        presence_penalty: 50.0,
        ..greedy
    };
    let h = History {
        output: &[out.token_id],
        ..Default::default()
    };
    let (other, _) = run_one(&mut sampler, &row, &penalised, &mut state, h);
    assert_ne!(other.token_id, out.token_id, "the penalty moves the choice");
    assert_eq!(
        other.logprob.to_bits(),
        whole[other.token_id as usize].to_bits()
    );
}

#[test]
fn sampler_logprobs_for_prompt_tokens() {
    let row = [1.0, -2.0, 3.0, 3.0, 0.0];
    let reference = reference_log_softmax(&row);
    let (lp, top, rank) = logprobs_for(&row, 1, 2);
    assert!((lp - reference[1]).abs() < 1e-5);
    assert_eq!(top.iter().map(|e| e.0).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(rank, 5, "the least likely of five");
    let (lp, top, _) = logprobs_for(&row, 7, 0);
    assert_eq!(lp, f32::NEG_INFINITY);
    assert!(top.is_empty());
    // Agrees with the sampler's own report.
    let params = SamplingParams {
        logprobs: Some(5),
        ..SamplingParams::greedy()
    };
    let out = sample_one(
        &mut Sampler::new(),
        &row,
        &params,
        &mut SeqSamplingState::new(None, 0),
    );
    let (lp, top, rank) = logprobs_for(&row, out.token_id, 5);
    assert_eq!(lp, out.logprob);
    assert_eq!(top, out.top_logprobs);
    assert_eq!(Some(rank), out.rank);
}

#[test]
fn sampler_only_allowed_tokens_on_a_large_vocabulary() {
    // A vocabulary-sized row where only a handful of tokens are not banned: every filter
    // must still land on one of them.
    let vocab = 49152;
    let mut row = vec![f32::NEG_INFINITY; vocab];
    let live = [17usize, 4000, 30000, 49151];
    for (i, &t) in live.iter().enumerate() {
        row[t] = i as f32;
    }
    let mut sampler = Sampler::new();
    let mut state = SeqSamplingState::new(Some(11), 0);
    let d = SamplingParams::default;
    for params in [
        d(),
        SamplingParams { top_k: 50, ..d() },
        SamplingParams { top_p: 0.95, ..d() },
        SamplingParams { min_p: 0.05, ..d() },
        SamplingParams {
            top_k: 2,
            top_p: 0.5,
            min_p: 0.1,
            ..d()
        },
    ] {
        for _ in 0..50 {
            let t = sample_one(&mut sampler, &row, &params, &mut state).token_id as usize;
            assert!(live.contains(&t), "{t} with {params:?}");
        }
    }
}
