use super::*;
use crate::core::kv_cache_manager::KvCacheManagerConfig;
use crate::ids::{BlockId, CpuBlockId};
use crate::sequence::SequenceStatus;

const BS: usize = 4;

fn scheduler(num_blocks: usize, num_cpu_blocks: usize) -> Scheduler {
    let cfg = SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs: 8,
        enable_chunked_prefill: true,
        max_prefill_tokens: usize::MAX,
        long_prefill_token_threshold: 0,
        policy: Policy::Fcfs,
    };
    let bm = KvCacheManager::new(KvCacheManagerConfig {
        watermark: 0.0,
        num_cpu_blocks,
        ..KvCacheManagerConfig::new(num_blocks, BS)
    });
    Scheduler::new(cfg, bm)
}

fn add(s: &mut Scheduler, id: u64, len: u32) {
    let prompt = (0..len).map(|t| t + 100 * id as u32).collect();
    s.add_seq(Sequence::new(SeqId(id), prompt, 0, id));
}

/// One engine step without a model: every scheduled sequence that reaches the end of its
/// tokens samples token 7.
fn step(s: &mut Scheduler) -> SchedulerOutput {
    let out = s.schedule();
    let sampled = (out.scheduled.iter())
        .filter(|x| x.num_computed + x.num_new_tokens == s.seqs[&x.id].len())
        .map(|x| (x.id, crate::testing::sampled(7)))
        .collect();
    let results = ModelRunnerOutput {
        sampled,
        ..ModelRunnerOutput::default()
    };
    s.update_from_output(&out, results);
    out
}

fn ids(out: &SchedulerOutput) -> Vec<u64> {
    out.scheduled.iter().map(|s| s.id.0).collect()
}

/// Two 7-token prompts fill 4 of 5 blocks; the step both need a third block, the later
/// one is preempted.
fn run_until_preempted(s: &mut Scheduler) -> SchedulerOutput {
    add(s, 1, 7);
    add(s, 2, 7);
    assert_eq!(ids(&step(s)), [1, 2]);
    assert_eq!(ids(&step(s)), [1, 2]);
    let out = step(s);
    assert_eq!(ids(&out), [1]);
    assert_eq!(out.preempted, [SeqId(2)]);
    assert_eq!(s.num_preemptions(), 1);
    out
}

#[test]
fn a_victim_is_swapped_out_and_back_in_with_its_computed_tokens() {
    let mut s = scheduler(5, 4);
    add(&mut s, 1, 7);
    add(&mut s, 2, 7);
    step(&mut s);
    step(&mut s);
    let victim_table = s.kv_cache_manager.block_table(SeqId(2)).to_vec();
    let out = step(&mut s);
    assert_eq!(ids(&out), [1]);
    assert_eq!(out.preempted, [SeqId(2)]);
    // Both computed blocks (8 tokens) go out, to distinct CPU blocks.
    let gpu: Vec<BlockId> = out.swap_out.iter().map(|p| p.0).collect();
    assert_eq!(gpu, victim_table);
    let swapped_out_cpu: Vec<CpuBlockId> = out.swap_out.iter().map(|p| p.1).collect();
    assert_eq!(s.num_free_cpu_blocks(), 2);
    assert!(out.swap_in.is_empty());
    let seq = &s.seqs[&SeqId(2)];
    assert_eq!(s.status(SeqId(2)), Some(SequenceStatus::Swapped));
    assert_eq!(seq.num_computed_tokens, 8);
    assert!(s.kv_cache_manager.block_table(SeqId(2)).is_empty());
    assert_eq!((s.num_swapped(), s.num_swapped_out()), (1, 1));

    // While it is out nobody new starts, though a 3-token prompt would fit.
    add(&mut s, 3, 3);
    let out = step(&mut s);
    assert_eq!(ids(&out), [1]);
    assert_eq!(s.num_waiting(), 1);

    // Once seq 1 leaves, seq 2 comes back first and runs in the same step.
    s.finish_seq(SeqId(1));
    let out = step(&mut s);
    let first = &out.scheduled[0];
    assert_eq!(
        (first.id, first.num_computed, first.num_new_tokens),
        (SeqId(2), 8, 1)
    );
    let back = s.kv_cache_manager.block_table(SeqId(2)).to_vec();
    let cpu: Vec<CpuBlockId> = out.swap_in.iter().map(|p| p.0).collect();
    let gpu: Vec<BlockId> = out.swap_in.iter().map(|p| p.1).collect();
    assert_eq!(cpu, swapped_out_cpu);
    assert_eq!(gpu, back[..2]);
    assert_eq!(back.len(), 3);
    assert_eq!(s.status(SeqId(2)), Some(SequenceStatus::Running));
    assert_eq!(s.num_swapped_in(), 1);
    assert_eq!(s.num_free_cpu_blocks(), 4);
    // With nothing left swapped out, the waiting prompt is admitted in that step too.
    assert_eq!(ids(&out), [2, 3]);

    s.finish_seq(SeqId(2));
    assert_eq!(
        s.status(SeqId(2)),
        None,
        "a finished sequence is in no queue"
    );
    s.finish_seq(SeqId(3));
    assert!(!s.has_unfinished());
    assert_eq!(s.kv_cache_manager.num_free_blocks(), 5);
    assert_eq!(s.num_free_cpu_blocks(), 4);
}

#[test]
fn a_full_swap_pool_falls_back_to_recompute() {
    // Seq 2 needs two CPU blocks; one is not enough.
    let mut s = scheduler(5, 1);
    let out = run_until_preempted(&mut s);
    assert!(out.swap_out.is_empty());
    let seq = &s.seqs[&SeqId(2)];
    assert_eq!(s.status(SeqId(2)), Some(SequenceStatus::Waiting));
    assert_eq!(seq.num_computed_tokens, 0);
    assert_eq!((s.num_swapped(), s.num_swapped_out()), (0, 0));
    assert_eq!(s.num_free_cpu_blocks(), 1);
    s.finish_seq(SeqId(1));
    let out = step(&mut s);
    assert!(out.swap_in.is_empty());
    assert_eq!(out.scheduled[0].id, SeqId(2));
    s.finish_seq(SeqId(2));
    assert_eq!(s.kv_cache_manager.num_free_blocks(), 5);
}

#[test]
fn without_swap_space_preemption_recomputes() {
    let mut s = scheduler(5, 0);
    let out = run_until_preempted(&mut s);
    assert!(out.swap_out.is_empty());
    assert_eq!(s.status(SeqId(2)), Some(SequenceStatus::Waiting));
}

#[test]
fn aborting_a_swapped_sequence_frees_its_cpu_blocks() {
    let mut s = scheduler(5, 4);
    run_until_preempted(&mut s);
    assert_eq!(s.num_free_cpu_blocks(), 2);
    s.finish_seq(SeqId(2));
    assert_eq!(s.num_free_cpu_blocks(), 4);
    assert_eq!(s.num_swapped(), 0);
    s.finish_seq(SeqId(1));
    assert!(!s.has_unfinished());
}

#[test]
fn a_prompt_computed_in_a_step_serves_the_same_prompt_scheduled_after_it() {
    let mut s = scheduler(8, 0);
    let prompt: Vec<u32> = (0..10).collect();
    s.add_seq(Sequence::new(SeqId(1), prompt.clone(), 0, 1));
    s.add_seq(Sequence::new(SeqId(2), prompt, 0, 1));
    let out = step(&mut s);
    let chunks: Vec<(usize, usize)> = (out.scheduled.iter())
        .map(|x| (x.num_computed, x.num_new_tokens))
        .collect();
    // The second finds the first's two full blocks, whose K/V this very step writes.
    assert_eq!(chunks, [(0, 10), (8, 2)]);
    let (a, b) = (
        s.kv_cache_manager.block_table(SeqId(1)),
        s.kv_cache_manager.block_table(SeqId(2)),
    );
    assert_eq!(a[..2], b[..2]);
    assert_eq!(s.kv_cache_manager.num_free_blocks(), 4);
    // Had the step failed, the blocks would be findable no more.
    s.finish_seq(SeqId(1));
    s.finish_seq(SeqId(2));
    s.forget_failed_step();
    s.add_seq(Sequence::new(SeqId(3), (0..10).collect(), 0, 2));
    assert_eq!(s.schedule().scheduled[0].num_computed, 0);
}
