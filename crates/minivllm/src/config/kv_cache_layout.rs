//! How the layers' K/V share the paged cache's blocks: vLLM v1's KV cache groups.
//!
//! A sliding-window layer never reads a position that has left its window, so its blocks
//! behind the window can go back to the pool while the full-attention layers of the same
//! sequence still need theirs. That needs a block table per kind of layer: the layers are
//! cut into groups of equal size, each group of one kind (full, or one window), and each
//! group has its own table per sequence. A block id then names `group_size` layers' worth
//! of K/V (its "slots"): the group's `i`-th layer keeps its K/V in slot `i` of the blocks of
//! its group's table. Equal groups make every block the same size, so one pool serves all
//! the groups, and no memory is set aside per kind (vLLM's
//! `_get_kv_cache_groups_uniform_page_size`).
//!
//! Gemma 3 270M (3 full layers, 15 with a 512-token window) gets 6 groups of 3: one full,
//! five sliding. A model whose layers are all of one kind has one group of all its layers,
//! and its block ids name every layer, as before groups existed.
//!
//! Linear-attention layers (Qwen3.5's Gated DeltaNet) have no K/V: they are left out of the
//! groups, and keep a fixed-size state per sequence instead (`worker/cache_engine.rs`).
//! Gemma 4's K/V-sharing layers are left out too: their place is their source layer's.
//!
//! Every slot holds `ModelConfig::kv_slot_size` floats per position, the widest layer's
//! (Gemma 4's full layers are wider than its sliding ones): a narrower layer's blocks lie
//! at its own stride in the first part of its slot store.

use super::ModelConfig;

/// Where one layer's K/V live: its group's block table, and its slot in those blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerPlace {
    pub group: usize,
    pub slot: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvCacheLayout {
    /// Each group's sliding window, `None` for full attention.
    windows: Vec<Option<usize>>,
    /// Each attention layer's place.
    places: Vec<LayerPlace>,
    /// Each model layer's index among the attention layers (`None`: a layer with no K/V).
    model_layers: Vec<Option<usize>>,
    /// Layers' worth of K/V behind every block id.
    num_slots: usize,
}

impl KvCacheLayout {
    /// The groups for layers with these windows (`None`: full attention), in layer order.
    pub fn new(layer_windows: &[Option<usize>]) -> Self {
        let mut kinds: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
        for (layer, &w) in layer_windows.iter().enumerate() {
            match kinds.iter_mut().find(|(k, _)| *k == w) {
                Some((_, layers)) => layers.push(layer),
                None => kinds.push((w, vec![layer])),
            }
        }
        // Full attention first: group 0 then keeps every block of a sequence, which the
        // prefix cache's chain of blocks rests on.
        kinds.sort_by_key(|(w, _)| w.map_or(0, |w| w.saturating_add(1)));
        let group_size = kinds.iter().map(|(_, l)| l.len()).min().unwrap_or(0);
        let mut windows = Vec::new();
        let mut places = vec![LayerPlace { group: 0, slot: 0 }; layer_windows.len()];
        for (w, layers) in &kinds {
            let size = if kinds.len() == 1 {
                layers.len()
            } else {
                group_size
            };
            for chunk in layers.chunks(size) {
                for (slot, &layer) in chunk.iter().enumerate() {
                    places[layer] = LayerPlace {
                        group: windows.len(),
                        slot,
                    };
                }
                windows.push(*w);
            }
        }
        let num_slots = if kinds.len() == 1 {
            layer_windows.len()
        } else {
            group_size
        };
        Self {
            windows,
            model_layers: (0..places.len()).map(Some).collect(),
            places,
            num_slots,
        }
    }

    /// The groups of `config`'s attention layers that keep K/V.
    pub fn for_model(config: &ModelConfig) -> Self {
        let linear = |i| (config.linear_attention.as_ref()).is_some_and(|l| l.is_linear(i));
        let owns = |i| !linear(i) && config.kv_source(i).is_none();
        let attention: Vec<usize> = (0..config.num_hidden_layers).filter(|&i| owns(i)).collect();
        let windows: Vec<_> = attention.iter().map(|&i| config.layer_window(i)).collect();
        let mut layout = Self::new(&windows);
        let mut next = 0..;
        let mut model_layers: Vec<Option<usize>> = (0..config.num_hidden_layers)
            .map(|i| owns(i).then(|| next.next().expect("unbounded")))
            .collect();
        for i in 0..config.num_hidden_layers {
            if let Some(source) = config.kv_source(i) {
                model_layers[i] = model_layers[source];
            }
        }
        layout.model_layers = model_layers;
        layout
    }

    /// One group of `num_layers` full-attention layers.
    pub fn full(num_layers: usize) -> Self {
        Self::new(&vec![None; num_layers])
    }

    /// Each group's sliding window (`None`: full attention).
    pub fn windows(&self) -> &[Option<usize>] {
        &self.windows
    }

    pub fn num_groups(&self) -> usize {
        self.windows.len()
    }

    /// Layers' worth of K/V behind every block id: the number of layer stores to allocate.
    pub(crate) fn num_slots(&self) -> usize {
        self.num_slots
    }

    pub(crate) fn num_layers(&self) -> usize {
        self.places.len()
    }

    /// Where model layer `layer`'s K/V live; `None` for a layer that has none.
    pub(crate) fn place(&self, layer: usize) -> Option<LayerPlace> {
        self.model_layers[layer].map(|a| self.places[a])
    }

    /// Whether some group frees the blocks that leave its window.
    pub(crate) fn has_sliding_window(&self) -> bool {
        self.windows.iter().any(Option::is_some)
    }
}

/// The first block (of `block_size` positions) that a query at position `pos`, or any later
/// one, reads in a group with `window`: every block before it has left the window. The
/// KV cache manager gives those back; the runner accepts them gone.
pub fn first_needed_block(window: Option<usize>, pos: usize, block_size: usize) -> usize {
    window.map_or(0, |w| (pos + 1).saturating_sub(w) / block_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn places(l: &KvCacheLayout) -> Vec<(usize, usize)> {
        (0..l.num_layers())
            .map(|i| (l.place(i).unwrap().group, l.place(i).unwrap().slot))
            .collect()
    }

    #[test]
    fn one_kind_of_layer_is_one_group_of_all_layers() {
        let l = KvCacheLayout::full(4);
        assert_eq!(l.windows(), [None]);
        assert_eq!(l.num_slots(), 4);
        assert_eq!(places(&l), [(0, 0), (0, 1), (0, 2), (0, 3)]);
        assert!(!l.has_sliding_window());
        // Mistral v0.1: a window on every layer.
        let l = KvCacheLayout::new(&[Some(4096); 3]);
        assert_eq!(l.windows(), [Some(4096)]);
        assert_eq!(places(&l), [(0, 0), (0, 1), (0, 2)]);
        assert!(l.has_sliding_window());
    }

    #[test]
    fn the_first_needed_block_is_the_first_with_a_position_in_the_window() {
        // A query at 20 with a window of 8 sees 13..=20: block 3 of blocks of 4 (12..16).
        assert_eq!(first_needed_block(Some(8), 20, 4), 3);
        assert_eq!(first_needed_block(Some(8), 6, 4), 0);
        assert_eq!(first_needed_block(None, 1000, 4), 0);
    }

    /// Gemma 3's pattern over `n` layers: five sliding (window 512) to one global.
    fn gemma3_windows(n: usize) -> Vec<Option<usize>> {
        (0..n).map(|i| (i % 6 != 5).then_some(512)).collect()
    }

    #[test]
    fn gemma3_groups_its_layers_by_kind_in_equal_groups() {
        // Gemma 3 270M: 18 layers.
        let l = KvCacheLayout::new(&gemma3_windows(18));
        assert_eq!(l.num_slots(), 3);
        assert_eq!(l.num_groups(), 6);
        assert_eq!(l.windows()[0], None);
        assert!(l.windows()[1..].iter().all(|&w| w == Some(512)));
        assert_eq!(
            [l.place(5), l.place(11), l.place(17)].map(|p| (p.unwrap().group, p.unwrap().slot)),
            [(0, 0), (0, 1), (0, 2)]
        );
        assert_eq!(places(&l)[..5], [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]);
        // Every (group, slot) is one layer's.
        let mut seen = places(&l);
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 18);
    }

    #[test]
    fn linear_attention_layers_have_no_place() {
        let config = crate::config::ModelConfig {
            linear_attention: Some(crate::config::LinearAttentionConfig {
                layers: vec![true, true, true, false, true, true, true, false],
                num_key_heads: 1,
                num_value_heads: 1,
                key_head_dim: 4,
                value_head_dim: 4,
                conv_kernel_dim: 4,
                v_heads_tiled: false,
            }),
            num_hidden_layers: 8,
            ..crate::worker::cache_engine::tests::tiny_config()
        };
        let l = KvCacheLayout::for_model(&config);
        assert_eq!((l.num_groups(), l.num_slots(), l.num_layers()), (1, 2, 2));
        assert_eq!(l.place(0), None);
        assert_eq!(l.place(3), Some(LayerPlace { group: 0, slot: 0 }));
        assert_eq!(l.place(7), Some(LayerPlace { group: 0, slot: 1 }));
    }

    #[test]
    fn an_uneven_kind_pads_its_last_group() {
        // Gemma 3 1B: 26 layers, 4 global; 22 sliding in 6 groups of 4, the last of 2.
        let l = KvCacheLayout::new(&gemma3_windows(26));
        assert_eq!(l.num_slots(), 4);
        assert_eq!(l.num_groups(), 7);
        assert_eq!(l.place(25), Some(LayerPlace { group: 6, slot: 1 }));
        assert!(places(&l).iter().all(|&(_, s)| s < 4));
    }
}
