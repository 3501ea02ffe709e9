//! The linear-attention state slots beside the KV blocks (vLLM v1's Mamba spec in its
//! hybrid cache, simplified to one state per slot): a running sequence holds one slot, and
//! with prefix caching the other slots keep states at block boundaries of earlier
//! sequences, keyed by the prefix-cache entry of the block that ends there ("align" mode:
//! a recurrent state cannot be rewound, so only states taken exactly at a boundary can
//! serve a later prompt).
//!
//! A sequence keeps only its latest boundary's state: each one it takes replaces the one
//! before, as vLLM's align mode does, so a long decode does not fill the pool with states
//! no prompt will resume from; its last one stays cached when it finishes or is preempted,
//! which is what a chat's next turn or a recompute resumes from. A state goes with the
//! prefix-cache entry it is keyed by, once that entry leaves the cache ([`StatePool::forget`]);
//! the others are evicted least recently used first when a sequence needs a slot.
//!
//! A state is written during the step that schedules it and a restore reads its slot at
//! the start of the step, so a state taken in a step is found only from the next step on,
//! and a slot restored from in a step is not handed out again in it.

/// One cached state.
#[derive(Debug, Clone, Copy)]
struct Cached {
    /// The prefix-cache entry of the block the state ends.
    key: u64,
    slot: u32,
    last_used: u64,
    /// The key of the state this one replaces (its sequence's previous one).
    replaces: Option<u64>,
    /// Pending only: its key left the prefix cache during the step that writes it, so its
    /// slot goes back once the step has run instead of caching it.
    gone: bool,
}

#[derive(Debug, Default)]
pub(super) struct StatePool {
    free: Vec<u32>,
    num_slots: usize,
    cached: Vec<Cached>,
    /// States the step being scheduled writes: cached once it has run.
    pending: Vec<Cached>,
    /// Cached slots a sequence restores from in the step being scheduled.
    pinned: Vec<u32>,
    clock: u64,
}

impl StatePool {
    pub fn new(num_slots: usize) -> Self {
        Self {
            // Popped from the end: slot 0 goes first.
            free: (0..num_slots as u32).rev().collect(),
            num_slots,
            ..Self::default()
        }
    }

    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    /// Slots held by no sequence and no cached state.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// The slot of the state cached under `key`.
    pub fn lookup(&self, key: u64) -> Option<u32> {
        self.cached.iter().find(|c| c.key == key).map(|c| c.slot)
    }

    /// A slot for a sequence to run in, and the cached state under `restore` (key and
    /// slot, as [`lookup`](Self::lookup) found it) pinned for this step's restore: a free
    /// slot, else the least recently used cached state's. `None`, changing nothing, when
    /// every slot is held or the state to restore has gone.
    pub fn take(&mut self, restore: Option<(u64, u32)>) -> Option<u32> {
        if let Some((key, slot)) = restore {
            if self.lookup(key) != Some(slot) {
                return None;
            }
            self.pinned.push(slot);
        }
        let slot = self.free.pop().or_else(|| self.evict());
        match (slot, restore) {
            (None, Some(_)) => {
                self.pinned.pop();
            }
            (Some(_), Some((key, _))) => {
                self.clock += 1;
                let c = self.cached.iter_mut().find(|c| c.key == key);
                c.expect("checked above").last_used = self.clock;
            }
            (_, None) => {}
        }
        slot
    }

    /// Gives a sequence's slot back.
    pub fn release(&mut self, slot: u32) {
        self.free.push(slot);
    }

    /// A slot for the state under `key` that a step takes (replacing its sequence's
    /// previous one, `replaces`, once the step has run); `None` when that state is cached
    /// or taken already, or no slot is free or evictable.
    pub fn snapshot(&mut self, key: u64, replaces: Option<u64>) -> Option<u32> {
        let known = |c: &Cached| c.key == key;
        if self.cached.iter().any(known) || self.pending.iter().any(known) {
            return None;
        }
        let slot = self.free.pop().or_else(|| self.evict())?;
        self.pending.push(Cached {
            key,
            slot,
            last_used: 0,
            replaces,
            gone: false,
        });
        Some(slot)
    }

    /// Frees the cached states under `keys`, prefix-cache entries that have left the cache:
    /// no prompt can reach them any more, and LRU eviction would take states that can
    /// before them. (No restore of this step reads one: the restoring sequence holds the
    /// blocks of its entry.) A state the step being scheduled writes goes once it has run.
    pub fn forget(&mut self, keys: impl IntoIterator<Item = u64>) {
        for key in keys {
            if let Some(i) = self.cached.iter().position(|c| c.key == key) {
                debug_assert!(!self.pinned.contains(&self.cached[i].slot));
                self.free.push(self.cached.swap_remove(i).slot);
            } else if let Some(p) = self.pending.iter_mut().find(|p| p.key == key) {
                // This step writes its slot: it can be reused only from the next one.
                p.gone = true;
            }
        }
    }

    /// Frees the least recently used cached state that no restore of this step reads.
    fn evict(&mut self) -> Option<u32> {
        let (i, _) = (self.cached.iter().enumerate())
            .filter(|(_, c)| !self.pinned.contains(&c.slot))
            .min_by_key(|(_, c)| c.last_used)?;
        Some(self.cached.swap_remove(i).slot)
    }

    /// The step scheduled last has run: its states are cached, each dropping the state it
    /// replaces, and its restores are done.
    pub fn start_step(&mut self) {
        self.pinned.clear();
        for mut p in std::mem::take(&mut self.pending) {
            if let Some(old) = p.replaces {
                if let Some(i) = self.cached.iter().position(|c| c.key == old) {
                    self.free.push(self.cached.swap_remove(i).slot);
                }
            }
            if p.gone {
                self.free.push(p.slot);
                continue;
            }
            self.clock += 1;
            p.last_used = self.clock;
            self.cached.push(p);
        }
    }

    /// The step scheduled last failed: the states it was to take may not be written.
    pub fn forget_step(&mut self) {
        self.pinned.clear();
        let slots = self.pending.drain(..).map(|p| p.slot);
        self.free.extend(slots);
    }
}
