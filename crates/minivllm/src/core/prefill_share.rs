//! Long prompts share the machine (`--long-prefill-token-threshold`, vLLM's name): a prompt
//! with more tokens to prefill than the threshold is long, and once a step has run a chunk
//! of it, long prompts sit out while other requests have work, until the steps without
//! them have taken as long as that step did. So a long prompt gets at least half of the
//! machine's time and everyone else the rest: a short request that arrives during a
//! 7,000-token prefill waits for the step in flight, then runs its prompt and decodes at
//! idle speed, instead of waiting for the whole prefill (the prefill budget went to the
//! long prompt first) or sharing each step with a chunk that makes it hundreds of
//! milliseconds long. Alone, a long prompt runs as before.
//!
//! vLLM caps each long prompt's chunk at the threshold instead. On a CPU a chunk's step at
//! a long context takes most of a second, so even a smaller chunk in every step would
//! multiply an interactive request's latency by the prefill's step time; sharing time
//! keeps each step of the others as short as it is without the long prompt.

/// Which prompts are long, and the time owed to the others.
#[derive(Debug, Clone, Default)]
pub(crate) struct PrefillShare {
    /// Prompts with more tokens to prefill than this are long; 0 turns sharing off.
    threshold: usize,
    /// Seconds the other requests are owed: the last long step's, less the steps run
    /// without long prompts since.
    owed: f64,
}

impl PrefillShare {
    pub fn new(threshold: usize) -> Self {
        Self {
            threshold,
            owed: 0.0,
        }
    }

    /// Whether a prompt with `to_prefill` tokens to compute (those the prefix cache did not
    /// have) is long.
    pub(crate) fn is_long(&self, to_prefill: usize) -> bool {
        self.threshold > 0 && to_prefill > self.threshold
    }

    /// Whether long prompts sit out this step if others have work.
    pub(crate) fn long_prompts_wait(&self) -> bool {
        self.owed > 0.0
    }

    /// Records a step that took `seconds`, with or without a long prompt's chunk.
    pub(crate) fn observe_step(&mut self, ran_long: bool, seconds: f64) {
        if ran_long {
            self.owed = seconds;
        } else {
            self.owed -= seconds;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn others_get_as_much_time_as_the_last_long_step_took() {
        let mut share = PrefillShare::new(256);
        assert!(!share.is_long(256) && share.is_long(257));
        assert!(!share.long_prompts_wait());
        share.observe_step(true, 0.6);
        assert!(share.long_prompts_wait());
        share.observe_step(false, 0.25);
        share.observe_step(false, 0.25);
        assert!(share.long_prompts_wait());
        share.observe_step(false, 0.25);
        assert!(!share.long_prompts_wait());
        // A long step alone owes the time it took, whatever was left over before.
        share.observe_step(true, 0.1);
        share.observe_step(false, 0.05);
        assert!(share.long_prompts_wait());
        // Off: nothing is long.
        assert!(!PrefillShare::new(0).is_long(usize::MAX));
    }
}
