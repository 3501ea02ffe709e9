//! How many tokens to guess for each sequence next (speculative decoding's adaptive part).
//!
//! A guess verified at position j of a draft pays off only when the j guesses before it and
//! it are all right: with a per-token acceptance rate `a`, it brings `a^j` tokens on
//! average. It costs one more position in the step: `t1` seconds on a machine where a step
//! of `n` tokens takes `t0 + t1 * n`. One sequence decoding alone makes a token every
//! `t0 + t1`; a batch of `b` makes `b` every `t0 + t1 * b`. A position is worth adding when
//! what it brings beats what the same time would make without guesses:
//! `a^j >= t1 * b / (t0 + t1 * b)`. Alone and memory-bound (`t0` large), that bar is low and
//! long drafts pay; in a large batch the step is compute-bound, the bar nears 1, and no
//! guess is worth its position: speculation switches itself off. `t0` and `t1` are fitted
//! at run time from the decode steps the engine runs (their sizes vary with the drafts;
//! prompt chunks are left out: a large batch's per-token cost is far below a small one's,
//! so they would make guesses look cheap); `a` is each sequence's own recent record.

/// vLLM's `disable_by_batch_size`, and the longest draft a step may verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftLimits {
    /// `num_speculative_tokens`.
    pub max_draft_len: usize,
    /// No drafts while more sequences than this are running.
    pub disable_by_batch_size: Option<usize>,
    /// Lengths from acceptance and cost; else always `max_draft_len` (for benchmarks of a
    /// fixed length, and tests that count steps).
    pub adaptive: bool,
}

/// The scheduler's side: the limits set, and the step cost fitted as steps run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftLength {
    limits: DraftLimits,
    cost: StepCost,
    /// Seconds the proposer took per guess, averaged over recent steps.
    draft_seconds: Option<f64>,
}

impl DraftLength {
    pub fn new(limits: DraftLimits) -> Self {
        Self {
            limits,
            cost: StepCost::default(),
            draft_seconds: None,
        }
    }

    /// A step of `tokens` tokens took `seconds` (its model pass and sampling), and its
    /// proposer `draft_seconds` to guess `guesses` tokens.
    pub(crate) fn observe_step(
        &mut self,
        tokens: usize,
        seconds: f64,
        guesses: usize,
        draft_seconds: f64,
    ) {
        self.cost.observe(tokens, seconds);
        if guesses > 0 {
            let per = draft_seconds / guesses as f64;
            let old = self.draft_seconds.unwrap_or(per);
            self.draft_seconds = Some(0.9 * old + 0.1 * per);
        }
    }

    pub fn cost(&self) -> &StepCost {
        &self.cost
    }

    /// Seconds per guess the proposer takes, once it has guessed.
    pub fn draft_seconds(&self) -> Option<f64> {
        self.draft_seconds
    }

    /// The acceptance a guess needs with `batch` sequences running.
    pub fn bar(&self, batch: usize) -> f32 {
        self.cost.bar(batch, self.draft_seconds.unwrap_or(0.0))
    }

    /// How many tokens to guess for a sequence with record `acceptance`, `num_running`
    /// sequences running.
    pub(crate) fn lookahead(&self, acceptance: &DraftAcceptance, num_running: usize) -> usize {
        if (self.limits.disable_by_batch_size).is_some_and(|b| num_running > b) {
            return 0;
        }
        if !self.limits.adaptive {
            return self.limits.max_draft_len;
        }
        acceptance.draft_len(self.bar(num_running), self.limits.max_draft_len)
    }
}

/// One sequence's record of guesses, as a per-token acceptance rate: the counts decay so the
/// rate follows what the sequence writes now (a quoted block, then free text), and a prior
/// keeps a sequence whose guesses failed for a while from never being tried again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftAcceptance {
    accepted: f32,
    tried: f32,
}

/// Prior pseudo-counts: a rate of 0.8 worth one try, so a new sequence starts with long
/// drafts and a couple of failures cut them back.
const PRIOR_ACCEPTED: f32 = 0.8;
const PRIOR_TRIED: f32 = 1.0;
/// Weight kept by past counts at each guess judged (about the last 7 count), and at each
/// step without a draft (the slow return to the prior that makes a cut-off sequence try
/// again).
const DECAY_OBSERVED: f32 = 0.85;
const DECAY_IDLE: f32 = 0.97;

impl Default for DraftAcceptance {
    fn default() -> Self {
        Self {
            accepted: 0.0,
            tried: 0.0,
        }
    }
}

impl DraftAcceptance {
    /// `drafted` guesses were verified and the first `accepted` kept: each kept one was a
    /// success, the first rejected one (if any) a failure; those after it tell nothing.
    pub(crate) fn observe(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            self.accepted *= DECAY_IDLE;
            self.tried *= DECAY_IDLE;
            return;
        }
        let judged = accepted + usize::from(accepted < drafted);
        let keep = DECAY_OBSERVED.powi(judged as i32);
        self.accepted = self.accepted * keep + accepted as f32;
        self.tried = self.tried * keep + judged as f32;
    }

    /// The estimated chance that the next guess is right, given the ones before it were.
    pub fn rate(&self) -> f32 {
        (self.accepted + PRIOR_ACCEPTED) / (self.tried + PRIOR_TRIED)
    }

    /// The longest draft whose last position still meets `bar` (`rate^j >= bar`), at most
    /// `max`.
    pub(crate) fn draft_len(&self, bar: f32, max: usize) -> usize {
        let a = self.rate();
        let mut gain = 1.0f32;
        let mut k = 0;
        while k < max {
            gain *= a;
            if gain < bar {
                break;
            }
            k += 1;
        }
        k
    }
}

/// A step's cost as `t0 + t1 * tokens`, fitted by least squares over the recent steps
/// (exponentially forgetting, so it follows the context growing and the machine's load).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepCost {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

/// The lowest bar: a position costs at least its row's sampling, and a small model's
/// steps vary too little in size for the fit to see that (a slope of 0 would make any
/// guess, however hopeless, look free). About 5 % of SmolLM2's decode step is sampling and
/// scheduling (`bench latency`'s overhead line).
pub(crate) const MIN_BAR: f32 = 0.05;

/// Weight kept by past steps at each new one: about the last 50 steps count.
const COST_DECAY: f64 = 0.98;

impl StepCost {
    pub(crate) fn observe(&mut self, tokens: usize, seconds: f64) {
        let x = tokens as f64;
        let d = COST_DECAY;
        self.w = self.w * d + 1.0;
        self.x = self.x * d + x;
        self.y = self.y * d + seconds;
        self.xx = self.xx * d + x * x;
        self.xy = self.xy * d + x * seconds;
    }

    /// `(t0, t1)`, once steps of different sizes have been seen.
    pub fn fit(&self) -> Option<(f64, f64)> {
        let var = self.xx * self.w - self.x * self.x;
        // Steps all of one size (or none) give no slope.
        if self.w < 2.0 || var <= 1e-9 * self.w * self.w {
            return None;
        }
        let t1 = ((self.xy * self.w - self.x * self.y) / var).max(0.0);
        let t0 = ((self.y - t1 * self.x) / self.w).max(0.0);
        Some((t0, t1))
    }

    /// The acceptance a guess that took `draft_seconds` to make needs to be worth its
    /// position in a step of `batch` sequences: `(t1 + d) * b / (t0 + t1 * b)`, at least
    /// [`MIN_BAR`]. Above 1: no guess is worth it.
    pub fn bar(&self, batch: usize, draft_seconds: f64) -> f32 {
        let b = batch.max(1) as f64;
        let bar = match self.fit() {
            Some((t0, t1)) if t0 + t1 > 0.0 => (t1 + draft_seconds) * b / (t0 + t1 * b),
            // Steps all of one size (a draft model guessing the same number each time): the
            // guess's own cost against the mean step, a bound below the true bar.
            _ if self.w > 0.0 && self.y > 0.0 => draft_seconds * b / (self.y / self.w),
            _ => 0.0,
        };
        (bar as f32).max(MIN_BAR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_linear_cost_and_its_bar_rises_with_the_batch() {
        let mut c = StepCost::default();
        assert_eq!(c.fit(), None);
        for _ in 0..5 {
            c.observe(1, 0.005);
        }
        assert_eq!(c.fit(), None, "one size gives no slope");
        for n in [512, 1, 5, 3, 64, 1] {
            c.observe(n, 0.004 + 0.001 * n as f64);
        }
        let (t0, t1) = c.fit().unwrap();
        assert!(
            (t0 - 0.004).abs() < 1e-6 && (t1 - 0.001).abs() < 1e-9,
            "{t0} {t1}"
        );
        assert!((c.bar(1, 0.0) - 0.2).abs() < 1e-5);
        assert_eq!(StepCost::default().bar(1, 0.0), MIN_BAR);
        assert!((c.bar(4, 0.0) - 0.5).abs() < 1e-5);
        assert!(c.bar(64, 0.0) > 0.94);
        // A draft model's guess costing 3 ms on top: 0.8 alone, and past 1 (never) at 4.
        assert!((c.bar(1, 0.003) - 0.8).abs() < 1e-5);
        assert!(c.bar(4, 0.003) > 1.0);
        // Before a slope: the guess's cost against the mean step (5 ms here).
        let mut flat = StepCost::default();
        flat.observe(2, 0.005);
        assert!((flat.bar(1, 0.002) - 0.4).abs() < 1e-5);
    }

    #[test]
    fn draft_length_follows_the_record() {
        let mut a = DraftAcceptance::default();
        assert!((a.rate() - 0.8).abs() < 1e-6);
        // 0.8^j >= 0.3 up to j = 5.
        assert_eq!(a.draft_len(0.3, 8), 5);
        assert_eq!(a.draft_len(0.3, 3), 3);
        assert_eq!(a.draft_len(0.0, 4), 4);
        for _ in 0..10 {
            a.observe(4, 4);
        }
        assert!(a.rate() > 0.97 && a.draft_len(0.5, 8) == 8);
        for _ in 0..14 {
            a.observe(4, 0);
        }
        assert!(a.rate() < 0.25, "{}", a.rate());
        assert_eq!(a.draft_len(0.5, 8), 0);
        // Without drafts the record fades back to the prior, so the sequence is tried again.
        let mut steps = 0;
        while a.draft_len(0.5, 8) == 0 {
            a.observe(0, 0);
            steps += 1;
        }
        assert!((10..200).contains(&steps), "{steps}");
        // Past the first failure nothing is learnt: 1 of 4 kept counts 1 success, 1 failure.
        let mut b = DraftAcceptance::default();
        b.observe(4, 1);
        assert!((b.accepted, b.tried) == (1.0, 2.0));
        // A proposer that is always wrong settles near a 10 % rate (the prior over the window).
        let mut c = DraftAcceptance::default();
        for _ in 0..100 {
            c.observe(1, 0);
        }
        assert!(c.rate() < 0.11, "{}", c.rate());
    }
}
