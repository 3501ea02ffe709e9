//! The causal depthwise convolution of Gated DeltaNet (and Mamba) layers: each channel
//! mixes its last `width` inputs, then SiLU (transformers' `causal_conv1d_fn` and
//! `causal_conv1d_update` with `activation="silu"`). A sequence's state is the `width − 1`
//! inputs before the tokens at hand, so a prompt split across steps and the decode steps
//! after it give what one pass gives.

use rayon::prelude::*;

use crate::activation::silu_inplace;

thread_local! {
    /// The weights tap-major, kept between calls so that the kernel does not allocate.
    static TAPS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Multiply-adds below which a call runs on the calling thread: a decode token of a
/// Qwen3.5 layer (8,192 channels of width 4) takes microseconds.
const PARALLEL_MACS: usize = 1 << 17;

/// Rows from which a call lays the weights out tap-major (vectorised along the channels);
/// fewer rows (decode steps) read them as stored.
const TAP_MAJOR_MIN_ROWS: usize = 4;

/// `x` `[t, channels]` through the convolution: `out[i][c] = silu(bias[c] +
/// Σ_j weight[c][j] · x̃[i + j][c])`, `x̃` the `width − 1` inputs in `state` then `x`;
/// `weight` is `[channels, width]` (the checkpoint's `[channels, 1, width]`), `state`
/// `[channels, width − 1]` (oldest first; zeros at a sequence's start), left holding the
/// last `width − 1` inputs. Allocates nothing once a thread has run it: it runs once per
/// layer and sequence for every decode token.
pub fn causal_conv1d_silu(
    x: &[f32],
    channels: usize,
    weight: &[f32],
    bias: Option<&[f32]>,
    state: &mut [f32],
    out: &mut [f32],
) {
    assert!(channels > 0, "causal_conv1d_silu: no channels");
    let width = weight.len() / channels;
    assert!(
        width >= 1 && weight.len() == channels * width,
        "causal_conv1d_silu: weight must be [channels, width]"
    );
    assert_eq!(
        state.len(),
        channels * (width - 1),
        "causal_conv1d_silu: state must be [channels, width - 1]"
    );
    assert!(
        x.len().is_multiple_of(channels) && out.len() == x.len(),
        "causal_conv1d_silu: x and out must be [t, channels]"
    );
    if let Some(b) = bias {
        assert_eq!(
            b.len(),
            channels,
            "causal_conv1d_silu: bias must be [channels]"
        );
    }
    let t = x.len() / channels;
    let hist = width - 1;
    if t < TAP_MAJOR_MIN_ROWS {
        // A decode step: each channel's taps and state are contiguous as stored, and
        // laying the weights out tap-major would cost as much as the rows. The sums run in
        // the same order as below.
        for (i, o) in out.chunks_mut(channels).enumerate() {
            for (c, o) in o.iter_mut().enumerate() {
                let mut acc = bias.map_or(0.0, |b| b[c]);
                for (j, &w) in weight[c * width..(c + 1) * width].iter().enumerate() {
                    let at = i + j;
                    let v = match at.checked_sub(hist) {
                        None => state[c * hist + at],
                        Some(p) => x[p * channels + c],
                    };
                    acc += w * v;
                }
                *o = acc;
            }
            silu_inplace(o);
        }
        return shift_window(x, channels, hist, state);
    }
    // Taken out of the thread's slot (not borrowed) while the rows run: a thread that
    // waits for them may run another call's rows meanwhile.
    let mut taps = TAPS.take();
    {
        // Tap-major, so that each tap's weights run along the channels as the rows do.
        taps.clear();
        taps.extend((0..width).flat_map(|j| (0..channels).map(move |c| weight[c * width + j])));
        let taps = &taps[..];
        // Each output row reads the state and `x` only: rows are independent.
        let row = |(i, o): (usize, &mut [f32])| {
            match bias {
                Some(b) => o.copy_from_slice(b),
                None => o.fill(0.0),
            }
            // Tap j reads input position i + j of the window, `hist` of them in the state.
            for (j, w) in taps.chunks_exact(channels).enumerate() {
                let at = i + j;
                if at < hist {
                    for (c, (o, &w)) in o.iter_mut().zip(w).enumerate() {
                        *o += w * state[c * hist + at];
                    }
                } else {
                    let src = &x[(at - hist) * channels..(at - hist + 1) * channels];
                    for ((o, &w), &v) in o.iter_mut().zip(w).zip(src) {
                        *o += w * v;
                    }
                }
            }
            silu_inplace(o);
        };
        if t * channels * width >= PARALLEL_MACS {
            out.par_chunks_mut(channels).enumerate().for_each(row);
        } else {
            out.chunks_mut(channels).enumerate().for_each(row);
        }
    }
    TAPS.set(taps);
    shift_window(x, channels, hist, state);
}

/// Moves a state of `hist` inputs per channel on past the rows of `x`.
fn shift_window(x: &[f32], channels: usize, hist: usize, state: &mut [f32]) {
    let t = x.len() / channels;
    // The window moves on by t: slot j takes what was t places later, from the old state
    // while that is inside it (read before it is overwritten: j + t > j), else from x.
    for c in 0..channels {
        let st = &mut state[c * hist..(c + 1) * hist];
        for j in 0..hist {
            st[j] = match (j + t).checked_sub(hist) {
                None => st[j + t],
                Some(p) => x[p * channels + c],
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activation::silu;
    use crate::testutil::{assert_close, rand_vec, rng};

    /// The convolution as transformers writes it: zero padding before the sequence, then
    /// one dot product per output.
    fn reference(x: &[f32], channels: usize, weight: &[f32], bias: &[f32]) -> Vec<f32> {
        let width = weight.len() / channels;
        let t = x.len() / channels;
        let mut out = vec![0.0; x.len()];
        for i in 0..t {
            for c in 0..channels {
                let mut acc = bias[c] as f64;
                for j in 0..width {
                    // Input position i + j - (width - 1), zero before the start.
                    if let Some(p) = (i + j).checked_sub(width - 1) {
                        acc += weight[c * width + j] as f64 * x[p * channels + c] as f64;
                    }
                }
                out[i * channels + c] = silu(acc as f32);
            }
        }
        out
    }

    #[test]
    fn matches_the_reference_across_split_calls() {
        let mut r = rng(5);
        // (2048, 4, 20) is above PARALLEL_MACS: its rows run in parallel.
        for (channels, width, t) in [
            (3, 4, 1),
            (300, 4, 9),
            (600, 4, 40),
            (5, 1, 6),
            (7, 2, 3),
            (2048, 4, 20),
        ] {
            let x = rand_vec(&mut r, t * channels);
            let weight = rand_vec(&mut r, channels * width);
            let bias = rand_vec(&mut r, channels);
            let want = reference(&x, channels, &weight, &bias);
            // One call, then the same tokens in pieces: a prefill's chunks, then decode steps.
            let mut state = vec![0.0; channels * (width - 1)];
            let mut got = vec![f32::NAN; x.len()];
            causal_conv1d_silu(&x, channels, &weight, Some(&bias), &mut state, &mut got);
            assert_close(
                &got,
                &want,
                1e-5,
                1e-5,
                &format!("{channels}x{width}, {t} tokens"),
            );
            let mut state = vec![0.0; channels * (width - 1)];
            let mut split = vec![f32::NAN; x.len()];
            let cut = t / 2;
            for (a, b) in std::iter::once((0, cut)).chain((cut..t).map(|i| (i, i + 1))) {
                let (xa, oa) = (
                    &x[a * channels..b * channels],
                    &mut split[a * channels..b * channels],
                );
                causal_conv1d_silu(xa, channels, &weight, Some(&bias), &mut state, oa);
            }
            assert_close(
                &split,
                &want,
                1e-5,
                1e-5,
                &format!("{channels}x{width}, split"),
            );
            // The state holds the last width − 1 inputs.
            for c in 0..channels {
                for j in 0..width - 1 {
                    let want = (t + j)
                        .checked_sub(width - 1)
                        .map_or(0.0, |p| x[p * channels + c]);
                    assert_eq!(state[c * (width - 1) + j], want, "state of channel {c}");
                }
            }
        }
    }
}
