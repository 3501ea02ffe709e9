//! Finding a model from what the user typed: a GGUF file, a Hugging Face folder, or an
//! `org/name` repo id already in the local Hugging Face cache (this engine never downloads).

use std::path::{Path, PathBuf};

use super::LoadError;

/// Where a model's files are, and in which format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelLocation {
    Gguf(PathBuf),
    HfDir(PathBuf),
}

/// Resolves `--model`: an existing path first, then a repo id in the Hugging Face cache.
pub fn resolve_model(spec: &str) -> Result<ModelLocation, LoadError> {
    let path = Path::new(spec);
    if path.is_file() {
        return Ok(ModelLocation::Gguf(path.to_path_buf()));
    }
    if path.is_dir() {
        return classify_dir(path);
    }
    if looks_like_repo_id(spec) {
        return resolve_repo_id(spec, &hub_cache_dir());
    }
    Err(LoadError::NotFound {
        path: path.to_path_buf(),
    })
}

fn classify_dir(dir: &Path) -> Result<ModelLocation, LoadError> {
    if dir.join("config.json").is_file() {
        return Ok(ModelLocation::HfDir(dir.to_path_buf()));
    }
    let io = |source| LoadError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut ggufs: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    match ggufs.len() {
        1 => Ok(ModelLocation::Gguf(ggufs.remove(0))),
        0 => Err(LoadError::Config(format!(
            "{} has no config.json and no .gguf file",
            dir.display()
        ))),
        n => Err(LoadError::Config(format!(
            "{} holds {n} .gguf files: pass the one to use",
            dir.display()
        ))),
    }
}

fn looks_like_repo_id(spec: &str) -> bool {
    let parts: Vec<&str> = spec.split('/').collect();
    parts.len() == 2
        && parts.iter().all(|p| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
}

/// The hub cache folder, with the same precedence as `huggingface_hub`.
pub(crate) fn hub_cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("HF_HUB_CACHE") {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("HF_HOME") {
        return PathBuf::from(p).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache/huggingface/hub")
}

/// `org/name` -> `<cache>/models--org--name/snapshots/<revision of refs/main>`.
pub(crate) fn resolve_repo_id(repo: &str, cache: &Path) -> Result<ModelLocation, LoadError> {
    let repo_dir = cache.join(format!("models--{}", repo.replace('/', "--")));
    let snapshots = repo_dir.join("snapshots");
    let not_cached = || {
        LoadError::Config(format!(
            "model {repo:?} is not a local path and is not in the Hugging Face cache ({}); \
             this engine does not download models: download it with huggingface-cli on a \
             connected machine, or pass a local folder or .gguf file",
            cache.display()
        ))
    };
    let revision = std::fs::read_to_string(repo_dir.join("refs/main"))
        .ok()
        .map(|s| s.trim().to_string());
    let snapshot = match revision {
        Some(rev) if snapshots.join(&rev).is_dir() => snapshots.join(rev),
        _ => std::fs::read_dir(&snapshots)
            .map_err(|_| not_cached())?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.is_dir())
            .ok_or_else(not_cached)?,
    };
    classify_dir(&snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids_are_told_from_paths() {
        assert!(looks_like_repo_id("HuggingFaceTB/SmolLM2-135M-Instruct"));
        assert!(!looks_like_repo_id("./models/x"));
        assert!(!looks_like_repo_id("/abs/path"));
        assert!(!looks_like_repo_id("a/b/c"));
    }

    #[test]
    fn resolves_a_cached_snapshot_through_refs_main() {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--org--tiny");
        let snap = repo.join("snapshots/abc123");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123\n").unwrap();
        std::fs::write(snap.join("config.json"), "{}").unwrap();
        assert_eq!(
            resolve_repo_id("org/tiny", cache.path()).unwrap(),
            ModelLocation::HfDir(snap)
        );
    }

    #[test]
    fn uncached_repo_id_says_it_cannot_download() {
        let cache = tempfile::tempdir().unwrap();
        let e = resolve_repo_id("org/absent", cache.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("org/absent") && e.contains("not in the Hugging Face cache"),
            "{e}"
        );
    }

    #[test]
    fn missing_path_is_named() {
        let e = resolve_model("/no/such/model.gguf")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("/no/such/model.gguf") && e.contains("does not exist"),
            "{e}"
        );
    }
}
