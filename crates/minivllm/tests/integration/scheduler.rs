//! The scheduler's decisions, without a model: budgets, chunking, policies, preemption.

use minivllm::core::kv_cache_manager::{KvCacheManager, KvCacheManagerConfig};
use minivllm::core::policy::Policy;
use minivllm::core::scheduler::{Scheduler, SchedulerConfig, SchedulerOutput};
use minivllm::outputs::ModelRunnerOutput;
use minivllm::sequence::{SeqId, Sequence};

fn scheduler(num_blocks: usize, budget: usize, max_seqs: usize, policy: Policy) -> Scheduler {
    with_config(
        num_blocks,
        SchedulerConfig {
            max_num_batched_tokens: budget,
            max_num_seqs: max_seqs,
            enable_chunked_prefill: true,
            max_prefill_tokens: usize::MAX,
            long_prefill_token_threshold: 0,
            policy,
        },
    )
}

fn with_config(num_blocks: usize, cfg: SchedulerConfig) -> Scheduler {
    Scheduler::new(
        cfg,
        KvCacheManager::new(KvCacheManagerConfig {
            num_blocks,
            block_size: 4,
            enable_prefix_caching: true,
            watermark: 0.0,
            group_windows: vec![None],
            num_cpu_blocks: 0,
            num_state_slots: 0,
        }),
    )
}

fn seq(id: u64, len: usize, priority: i32) -> Sequence {
    // Distinct tokens per sequence, so the prefix cache plays no part.
    let tokens = (0..len as u32).map(|t| t + 1000 * id as u32).collect();
    Sequence::new(SeqId(id), tokens, priority, id)
}

/// What a model step would do: advance the computed counts, and append a token to every
/// sequence that reached the end of its known tokens.
fn complete(s: &mut Scheduler, out: &SchedulerOutput) {
    complete_in(s, out, 0.0);
}

fn ids(out: &SchedulerOutput) -> Vec<(u64, usize)> {
    out.scheduled
        .iter()
        .map(|s| (s.id.0, s.num_new_tokens))
        .collect()
}

#[test]
fn fcfs_serves_in_arrival_order_within_the_token_budget() {
    let mut s = scheduler(64, 10, 8, Policy::Fcfs);
    s.add_seq(seq(1, 6, 0));
    s.add_seq(seq(2, 6, 0));
    let out = s.schedule();
    // 6 tokens for the first, the remaining 4 of the budget start the second (chunked).
    assert_eq!(ids(&out), vec![(1, 6), (2, 4)]);
    complete(&mut s, &out);
    let out = s.schedule();
    // The first decodes one token; the second finishes its prompt.
    assert_eq!(ids(&out), vec![(1, 1), (2, 2)]);
}

#[test]
fn priority_policy_serves_lower_values_first() {
    let mut s = scheduler(64, 6, 8, Policy::Priority);
    s.add_seq(seq(1, 6, 5));
    s.add_seq(seq(2, 6, 0));
    let out = s.schedule();
    assert_eq!(ids(&out), vec![(2, 6)]);
    let mut fcfs = scheduler(64, 6, 8, Policy::Fcfs);
    fcfs.add_seq(seq(1, 6, 5));
    fcfs.add_seq(seq(2, 6, 0));
    assert_eq!(ids(&fcfs.schedule()), vec![(1, 6)]);
}

#[test]
fn long_prompts_are_chunked_and_share_steps_with_decodes() {
    let mut s = scheduler(64, 8, 8, Policy::Fcfs);
    s.add_seq(seq(1, 3, 0));
    let out = s.schedule();
    complete(&mut s, &out);
    s.add_seq(seq(2, 20, 0));
    let mut chunks = Vec::new();
    for _ in 0..3 {
        let out = s.schedule();
        assert_eq!(
            out.scheduled[0].id,
            SeqId(1),
            "the running decode goes first"
        );
        assert_eq!(out.scheduled[0].num_new_tokens, 1);
        chunks.push(out.scheduled[1].num_new_tokens);
        assert!(out.num_batched_tokens <= 8);
        complete(&mut s, &out);
    }
    assert_eq!(chunks, vec![7, 7, 6]);
}

#[test]
fn max_num_seqs_caps_the_running_set() {
    let mut s = scheduler(64, 100, 2, Policy::Fcfs);
    for i in 1..=3 {
        s.add_seq(seq(i, 4, 0));
    }
    let out = s.schedule();
    assert_eq!(ids(&out), vec![(1, 4), (2, 4)]);
    assert_eq!(s.num_waiting(), 1);
}

#[test]
fn out_of_blocks_preempts_the_lowest_priority_and_resumes_it_later() {
    // 4 blocks of 4 tokens: two 8-token prompts fill them; the next tokens need more.
    let mut s = scheduler(4, 100, 8, Policy::Priority);
    s.add_seq(seq(1, 8, 0));
    s.add_seq(seq(2, 8, 1));
    let out = s.schedule();
    assert_eq!(ids(&out), vec![(1, 8), (2, 8)]);
    complete(&mut s, &out);
    // Both now need a third block; only one can have it.
    let out = s.schedule();
    assert_eq!(out.preempted, vec![SeqId(2)]);
    assert_eq!(ids(&out), vec![(1, 1)]);
    assert_eq!(s.num_preemptions(), 1);
    assert_eq!(s.seq(SeqId(2)).unwrap().num_computed_tokens, 0);
    complete(&mut s, &out);
    // When the first finishes, the second is recomputed: prompt and its output so far, less
    // its first block, which stayed in the prefix cache when it was freed (its tail block
    // was evicted first, to give the first sequence room).
    s.finish_seq(SeqId(1));
    let out = s.schedule();
    let r = &out.scheduled[0];
    assert_eq!((r.id, r.num_computed, r.num_new_tokens), (SeqId(2), 4, 5));
    complete(&mut s, &out);
    s.finish_seq(SeqId(2));
    assert!(!s.has_unfinished());
    assert_eq!(s.kv_cache_manager().num_free_blocks(), 4);
}

#[test]
fn a_burst_prefills_in_turn_within_the_prefill_budget_while_decodes_go_on() {
    let base = scheduler(64, 64, 8, Policy::Fcfs);
    let mut s = with_config(
        64,
        SchedulerConfig {
            max_prefill_tokens: 16,
            ..base.config().clone()
        },
    );
    for id in 1..=4 {
        s.add_seq(seq(id, 10, 0));
    }
    let plan = |out: &SchedulerOutput| -> Vec<(u64, usize)> {
        out.scheduled
            .iter()
            .map(|x| (x.id.0, x.num_new_tokens))
            .collect()
    };
    // First come, first served: the first prompt whole and the start of the second.
    let out = s.schedule();
    assert_eq!(plan(&out), [(1, 10), (2, 6)]);
    complete(&mut s, &out);
    // The first decodes (not counted); the second finishes, the third starts.
    let out = s.schedule();
    assert_eq!(plan(&out), [(1, 1), (2, 4), (3, 10), (4, 2)]);
    complete(&mut s, &out);
    let out = s.schedule();
    assert_eq!(plan(&out), [(1, 1), (2, 1), (3, 1), (4, 8)]);
}

#[test]
fn without_chunked_prefill_a_prompt_over_the_prefill_budget_still_runs_whole() {
    let base = scheduler(64, 64, 8, Policy::Fcfs);
    let mut s = with_config(
        64,
        SchedulerConfig {
            max_prefill_tokens: 8,
            enable_chunked_prefill: false,
            ..base.config().clone()
        },
    );
    s.add_seq(seq(1, 20, 0));
    s.add_seq(seq(2, 5, 0));
    // The first prompt alone, whole; the second waits for the next step's budget.
    let out = s.schedule();
    assert_eq!(out.scheduled.len(), 1);
    assert_eq!(out.scheduled[0].num_new_tokens, 20);
    complete(&mut s, &out);
    let out = s.schedule();
    let plan: Vec<(u64, usize)> = (out.scheduled.iter())
        .map(|x| (x.id.0, x.num_new_tokens))
        .collect();
    assert_eq!(plan, [(1, 1), (2, 5)]);
}

/// [`complete`], the step having taken `seconds`.
fn complete_in(s: &mut Scheduler, out: &SchedulerOutput, seconds: f64) {
    let sampled = (out.scheduled.iter())
        .filter(|sc| sc.num_computed + sc.num_new_tokens == s.seq(sc.id).unwrap().len())
        .map(|sc| (sc.id, minivllm::testing::sampled(7)))
        .collect();
    let results = ModelRunnerOutput {
        sampled,
        run_seconds: seconds,
        ..ModelRunnerOutput::default()
    };
    s.update_from_output(out, results);
}

/// 16 prompt tokens a step; prompts of more than `threshold` tokens are long (0: none).
fn sharing_scheduler(threshold: usize) -> Scheduler {
    let base = scheduler(256, 64, 8, Policy::Fcfs);
    with_config(
        256,
        SchedulerConfig {
            max_prefill_tokens: 16,
            long_prefill_token_threshold: threshold,
            ..base.config().clone()
        },
    )
}

#[test]
fn a_long_prompt_gives_the_others_as_much_time_as_its_last_step_took() {
    let mut s = sharing_scheduler(16);
    s.add_seq(seq(1, 100, 0));
    // Alone, the long prompt runs every step.
    for _ in 0..2 {
        let out = s.schedule();
        assert_eq!(ids(&out), [(1, 16)]);
        complete_in(&mut s, &out, 0.5);
    }
    // A short request arrives: it runs (prompt, then decodes) for 0.5 s without the long
    // prompt's chunks, then both share a step, and the short one is owed 0.5 s again.
    s.add_seq(seq(2, 10, 0));
    let out = s.schedule();
    assert_eq!(ids(&out), [(2, 10)]);
    complete_in(&mut s, &out, 0.2);
    // A long newcomer waits too; a short one behind it starts.
    s.add_seq(seq(3, 40, 0));
    s.add_seq(seq(4, 5, 0));
    let out = s.schedule();
    assert_eq!(ids(&out), [(2, 1), (4, 5)]);
    complete_in(&mut s, &out, 0.2);
    let out = s.schedule();
    assert_eq!(ids(&out), [(2, 1), (4, 1)]);
    complete_in(&mut s, &out, 0.2);
    // 0.6 s given: the long prompts run, first come first served within the budget.
    let out = s.schedule();
    assert_eq!(ids(&out), [(1, 16), (2, 1), (4, 1)]);
    complete_in(&mut s, &out, 0.4);
    let out = s.schedule();
    assert_eq!(ids(&out), [(2, 1), (4, 1)]);
    complete_in(&mut s, &out, 0.1);
    s.finish_seq(SeqId(2));
    s.finish_seq(SeqId(4));
    // Nobody else has work: the long prompts need not wait out what they owe.
    let out = s.schedule();
    assert_eq!(ids(&out), [(1, 16)]);
    complete_in(&mut s, &out, 0.5);
    let out = s.schedule();
    assert_eq!(ids(&out), [(1, 16)]);
}

#[test]
fn with_the_threshold_at_zero_a_long_prompt_holds_the_prefill_budget_as_before() {
    let mut s = sharing_scheduler(0);
    s.add_seq(seq(1, 100, 0));
    let out = s.schedule();
    complete_in(&mut s, &out, 0.5);
    s.add_seq(seq(2, 10, 0));
    let out = s.schedule();
    assert_eq!(ids(&out), [(1, 16)]);
}

#[test]
fn long_prompts_do_not_wait_for_each_others_decodes() {
    let mut s = sharing_scheduler(16);
    s.add_seq(seq(1, 20, 0));
    s.add_seq(seq(2, 100, 0));
    let out = s.schedule();
    assert_eq!(ids(&out), [(1, 16)]);
    complete_in(&mut s, &out, 0.5);
    let out = s.schedule();
    assert_eq!(ids(&out), [(1, 4), (2, 12)]);
    complete_in(&mut s, &out, 0.5);
    // The first decodes beside the second's chunks: no request here has a short prompt.
    for _ in 0..3 {
        let out = s.schedule();
        assert_eq!(ids(&out), [(1, 1), (2, 16)]);
        complete_in(&mut s, &out, 0.5);
    }
}
