use std::sync::OnceLock;

use super::*;

fn tok() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        Tokenizer::from_hf_dir(&crate::testing::reference_dir().join("smollm2-hf")).unwrap()
    })
}

fn encode(text: &str) -> Vec<u32> {
    tok().encode(text, false).unwrap()
}

const IM_END: u32 = 2;

fn chat_prompt() -> Vec<u32> {
    encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
}

fn stops(stop: &[&str], include: bool) -> DetokenizerConfig {
    DetokenizerConfig {
        stop: StopStrings::new(&stop.iter().map(|s| s.to_string()).collect::<Vec<_>>()),
        include_stop_str_in_output: include,
        ..DetokenizerConfig::default()
    }
}

/// Pushes `ids` one at a time, checking at every step what must hold mid-stream, and
/// returns the detokenizer (unfinished unless a stop string hit) and the stop, if any.
fn run(
    prompt: &[u32],
    ids: &[u32],
    cfg: DetokenizerConfig,
) -> (IncrementalDetokenizer, Option<StopReason>) {
    let skip = cfg.skip_special_tokens;
    let mut d = IncrementalDetokenizer::new(tok(), prompt, cfg);
    let mut visible = String::new();
    for (i, &id) in ids.iter().enumerate() {
        let stop = d.push(tok(), id).unwrap();
        assert!(
            d.visible_text().starts_with(&visible),
            "visible text shrank from {visible:?} to {:?}",
            d.visible_text()
        );
        visible = d.visible_text().to_string();
        assert!(d.output_text().starts_with(&visible));
        if stop.is_some() {
            assert!(d.is_finished());
            assert_eq!(d.visible_text(), d.output_text());
            return (d, stop);
        }
        // Until a stop, the text is the full decode so far less the tokens of an unfinished
        // character (whose decode ends in a replacement character).
        let so_far = tok().decode(&ids[..=i], skip).unwrap();
        let rest = so_far
            .strip_prefix(d.output_text())
            .unwrap_or_else(|| panic!("{:?} is not a prefix of {so_far:?}", d.output_text()));
        assert!(
            rest.is_empty() || rest.ends_with('\u{FFFD}'),
            "held back {rest:?}"
        );
        assert!(!d.visible_text().ends_with('\u{FFFD}'));
    }
    (d, None)
}

/// Runs `ids` with stop strings `stop` and checks which one ended the output, and the text.
fn assert_stop(prompt: &[u32], ids: &[u32], stop: &[&str], include: bool, hit: &str, text: &str) {
    let (d, reason) = run(prompt, ids, stops(stop, include));
    assert_eq!(
        reason,
        Some(StopReason::String(hit.into())),
        "stops {stop:?}"
    );
    assert_eq!(d.output_text(), text, "stops {stop:?}");
}

const TEXTS: &[&str] = &[
    "The capital of France is Paris.",
    "Hello, world! How are you today?",
    " leading space, and trailing space ",
    "Crab 🦀, rocket 🚀, family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵.",
    "日本語のテキスト、中文文本，한국어 텍스트。",
    "Accents: café, naïve, façade, Ærøskøbing, ñandú, Zürich.",
    "Math: ∀x ∈ ℝ, x² ≥ 0; π ≈ 3.14159 and e ≈ 2.71828…",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{v:?}\");\n}\n",
    "def f(x):\n\tif x:\n\t\treturn [i for i in range(x)]\n\n\n\treturn None\n",
    "spaces     and\t\ttabs\n\n\n   \n  newlines\r\nwindows",
    "Numbers 1234567890 and 3.5e-7, dates 2024-01-31, ids #42.",
    "Mixed: Ελληνικά, русский, עברית, العربية, हिन्दी, ไทย.",
    "Emoji with skin tone 👍🏽 and keycap 1️⃣, ZWJ 🏳️‍🌈.",
    "",
];

#[test]
fn incremental_text_equals_full_decode() {
    let prompts = [chat_prompt(), encode("Once upon a time"), Vec::new()];
    let mut split_chars = 0;
    for text in TEXTS {
        let ids = encode(text);
        split_chars += ids
            .iter()
            .filter(|&&id| tok().decode(&[id], true).unwrap().contains('\u{FFFD}'))
            .count();
        for prompt in &prompts {
            let (mut d, stop) = run(prompt, &ids, DetokenizerConfig::default());
            assert_eq!(stop, None);
            d.finish();
            assert_eq!(d.output_text(), *text, "prompt {prompt:?}");
            assert_eq!(d.visible_text(), *text);
        }
    }
    // Otherwise the test would not exercise holding back half a character.
    assert!(
        split_chars > 10,
        "only {split_chars} tokens end mid-character"
    );
}

#[test]
fn concatenated_encodings_decode_like_the_whole() {
    // A model need not produce the tokenizer's own segmentation: join the encodings of
    // pieces, including ones cut inside a character's byte-level tokens.
    let mut ids = Vec::new();
    for piece in TEXTS {
        ids.extend(encode(piece));
        ids.extend(encode("\n"));
    }
    let crab = encode("🦀");
    assert!(crab.len() > 1, "🦀 should take several byte-level tokens");
    ids.extend(&crab[..1]);
    ids.extend(encode(" then text"));
    ids.push(IM_END);
    for skip_special_tokens in [true, false] {
        let cfg = DetokenizerConfig {
            skip_special_tokens,
            ..DetokenizerConfig::default()
        };
        let (mut d, _) = run(&chat_prompt(), &ids, cfg);
        d.finish();
        assert_eq!(
            d.output_text(),
            tok().decode(&ids, skip_special_tokens).unwrap()
        );
    }
}

#[test]
fn half_a_character_is_never_visible() {
    let ids = encode("🦀");
    assert!(ids.len() > 1);
    let mut d = IncrementalDetokenizer::new(tok(), &chat_prompt(), DetokenizerConfig::default());
    for &id in &ids[..ids.len() - 1] {
        assert_eq!(d.push(tok(), id).unwrap(), None);
        assert_eq!(d.output_text(), "");
        assert_eq!(d.visible_text(), "");
    }
    d.push(tok(), ids[ids.len() - 1]).unwrap();
    assert_eq!(d.visible_text(), "🦀");
}

#[test]
fn finish_flushes_an_unfinished_character_as_full_decode_does() {
    let ids = &encode("ok 🦀")[..2];
    let mut d = IncrementalDetokenizer::new(tok(), &chat_prompt(), DetokenizerConfig::default());
    for &id in ids {
        d.push(tok(), id).unwrap();
    }
    assert_eq!(d.visible_text(), "ok");
    d.finish();
    let full = tok().decode(ids, true).unwrap();
    assert!(full.ends_with('\u{FFFD}'));
    assert_eq!(d.output_text(), full);
    assert_eq!(d.visible_text(), full);
}

#[test]
fn first_token_keeps_its_leading_space() {
    let prompt = encode("The capital of France is");
    let ids = encode(" Paris");
    assert_eq!(ids.len(), 1);
    let (d, _) = run(&prompt, &ids, DetokenizerConfig::default());
    assert_eq!(d.output_text(), " Paris");
}

#[test]
fn window_stays_short_however_long_the_output() {
    let ids: Vec<u32> = (0..200).flat_map(|_| encode(TEXTS[3])).collect();
    let mut d = IncrementalDetokenizer::new(tok(), &chat_prompt(), DetokenizerConfig::default());
    let mut longest = 0;
    for &id in &ids {
        d.push(tok(), id).unwrap();
        longest = longest.max(d.window.len());
    }
    assert!(longest <= 12, "window grew to {longest} tokens");
    assert_eq!(d.output_text(), TEXTS[3].repeat(200));
}

#[test]
fn stop_string_split_across_tokens_is_cut() {
    let text = "The capital of France is Paris. It is lovely.";
    let ids = encode(text);
    let paris = ids
        .iter()
        .position(|&id| tok().decode(&[id], true).unwrap() == " Paris");
    let paris = paris.expect("\" Paris\" is one token");
    assert_eq!(tok().decode(&ids[paris + 1..paris + 2], true).unwrap(), ".");

    assert_stop(
        &[],
        &ids,
        &["Paris."],
        false,
        "Paris.",
        "The capital of France is ",
    );

    assert_stop(
        &[],
        &ids,
        &["Paris."],
        true,
        "Paris.",
        "The capital of France is Paris.",
    );
}

#[test]
fn stop_string_inside_one_token() {
    let ids = encode("Hi!\n\n\nNext");
    let newlines = tok().encode("\n\n", false).unwrap();
    assert!(newlines.len() == 1 && ids.contains(&newlines[0]));
    assert_stop(&[], &ids, &["\n\n"], false, "\n\n", "Hi!");

    // " island" completes the stop string with " is"; "land" is cut even when it is kept.
    let ids = encode("This island");
    assert_stop(&[], &ids, &["is is"], true, "is is", "This is");
}

#[test]
fn newline_stop_across_two_newline_tokens() {
    let mut ids = encode("Hello.\n");
    ids.extend(encode("\nWorld"));
    assert_stop(&[], &ids, &["\n\n"], false, "\n\n", "Hello.");
}

#[test]
fn earliest_stop_string_wins() {
    let ids = encode("The capital of France is Paris.");
    // Both complete with the token " France"; list order does not matter.
    assert_stop(
        &[],
        &ids,
        &["France", "capital of France"],
        false,
        "capital of France",
        "The ",
    );
    // Same start: the one that ends first.
    assert_stop(
        &[],
        &ids,
        &["is Paris", "is Par"],
        true,
        "is Par",
        "The capital of France is Par",
    );
    // A stop string that completes earlier in the stream wins over a longer one.
    assert_stop(
        &[],
        &ids,
        &["France is Paris", "capital"],
        false,
        "capital",
        "The ",
    );
}

#[test]
fn suffix_that_may_become_a_stop_string_is_held_back() {
    let ids = encode("The capital is Paris, of course.");
    let mut d = IncrementalDetokenizer::new(tok(), &[], stops(&["Paris.", "\n\n"], false));
    let mut seen = Vec::new();
    for &id in &ids {
        assert_eq!(d.push(tok(), id).unwrap(), None);
        seen.push((d.output_text().to_string(), d.visible_text().to_string()));
    }
    let at_paris = seen
        .iter()
        .find(|(out, _)| out.ends_with("Paris"))
        .expect("a step ends with Paris");
    assert_eq!(at_paris.1, "The capital is ");
    let after = seen
        .iter()
        .find(|(out, _)| out.ends_with("Paris,"))
        .expect("a step ends with Paris,");
    assert_eq!(after.1, after.0, "released once it cannot be a stop");

    // A lone newline might start "\n\n"; finishing releases it.
    let mut d = IncrementalDetokenizer::new(tok(), &[], stops(&["\n\n"], false));
    for id in encode("Hi.\n") {
        d.push(tok(), id).unwrap();
    }
    assert_eq!(d.output_text(), "Hi.\n");
    assert_eq!(d.visible_text(), "Hi.");
    d.finish();
    assert_eq!(d.visible_text(), "Hi.\n");
}

#[test]
fn nothing_is_held_back_that_no_stop_string_could_cut() {
    let cases = [
        // A stop string found later would be kept whole, so "Paris" stays either way.
        ("The capital is Paris", "Paris.", true),
        // Empty stop strings are dropped rather than matching everywhere.
        ("still going", "", false),
    ];
    for (text, stop_str, include) in cases {
        let (d, stop) = run(&[], &encode(text), stops(&[stop_str], include));
        assert_eq!(stop, None);
        assert_eq!(d.visible_text(), text);
    }
}

#[test]
fn stop_string_made_of_a_split_character() {
    let ids = encode("Crabs 🦀 walk sideways");
    assert_stop(&chat_prompt(), &ids, &["🦀"], false, "🦀", "Crabs ");
}

#[test]
fn tokens_after_a_stop_are_ignored() {
    let ids = encode("one two three");
    let mut d = IncrementalDetokenizer::new(tok(), &[], stops(&["two"], false));
    let stops: Vec<_> = ids.iter().map(|&id| d.push(tok(), id).unwrap()).collect();
    assert_eq!(stops.iter().flatten().count(), 1);
    assert_eq!(d.output_text(), "one ");
    d.finish();
    assert_eq!(d.output_text(), "one ");
}

#[test]
fn special_tokens_show_unless_skipped() {
    let mut ids = encode("Hi there!");
    ids.push(IM_END);
    let shown = DetokenizerConfig {
        skip_special_tokens: false,
        ..DetokenizerConfig::default()
    };
    let (mut d, _) = run(&chat_prompt(), &ids, shown.clone());
    d.finish();
    assert_eq!(d.output_text(), "Hi there!<|im_end|>");

    let (mut d, _) = run(&chat_prompt(), &ids, DetokenizerConfig::default());
    d.finish();
    assert_eq!(d.output_text(), "Hi there!");

    // Shown special tokens are text like any other, stop strings included.
    let cfg = DetokenizerConfig {
        stop: StopStrings::new(&["<|im_end|>".into()]),
        ..shown
    };
    let (d, stop) = run(&chat_prompt(), &ids, cfg);
    assert_eq!(stop, Some(StopReason::String("<|im_end|>".into())));
    assert_eq!(d.output_text(), "Hi there!");
}
