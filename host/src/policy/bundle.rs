//! A policy bundle: the `.rego` modules and `.json` data documents of one directory (or of a
//! ConfigMap's keys), identified by a content digest so it is compiled once per digest.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};

use super::error::PolicyError;

/// One file of a bundle, named by its path relative to the bundle root with `/` separators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFile {
    /// Bundle-relative path, e.g. `guardrails.rego` or `teams/data.json`.
    pub name: String,
    /// UTF-8 contents.
    pub contents: String,
}

/// The sources of a policy bundle, sorted by name, with their digest. Immutable.
#[derive(Debug, Clone)]
pub struct Bundle {
    files: Vec<BundleFile>,
    digest: String,
}

impl Bundle {
    /// Reads every `*.rego` and `*.json` file under `dir` (recursively, skipping hidden
    /// entries), as `opa test DIR` and `opa eval -d DIR` would load them.
    pub fn from_dir(dir: &Path) -> Result<Self, PolicyError> {
        let mut files = Vec::new();
        collect(dir, dir, &mut files)?;
        if files.is_empty() {
            return Err(PolicyError::CompileBundle(format!("no .rego or .json files in {}", dir.display())));
        }
        Self::from_files(files)
    }

    /// Builds a bundle from in-memory files (e.g. the keys of policy ConfigMaps). Names must be
    /// unique; only `.rego` and `.json` names are accepted.
    pub fn from_files(files: impl IntoIterator<Item = BundleFile>) -> Result<Self, PolicyError> {
        let mut by_name = BTreeMap::new();
        for f in files {
            if !(f.name.ends_with(".rego") || f.name.ends_with(".json")) {
                return Err(PolicyError::CompileBundle(format!(
                    "{}: only .rego and .json files belong in a policy bundle",
                    f.name
                )));
            }
            if by_name.insert(f.name.clone(), f).is_some() {
                return Err(PolicyError::CompileBundle("duplicate file name in bundle".into()));
            }
        }
        let files: Vec<BundleFile> = by_name.into_values().collect();
        let digest = digest_of(&files);
        Ok(Self { files, digest })
    }

    /// `sha256:<hex>` over the sorted file names and contents (length-prefixed, so no two
    /// different bundles share a digest by concatenation).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The files, sorted by name.
    pub fn files(&self) -> &[BundleFile] {
        &self.files
    }

    /// The `.rego` modules.
    pub fn modules(&self) -> impl Iterator<Item = &BundleFile> {
        self.files.iter().filter(|f| f.name.ends_with(".rego"))
    }

    /// The data documents, each wrapped in objects named after its directories, as OPA
    /// places `a/b/data.json` at `data.a.b`.
    pub fn data_documents(&self) -> Result<Vec<(String, serde_json::Value)>, PolicyError> {
        let mut docs = Vec::new();
        for f in self.files.iter().filter(|f| f.name.ends_with(".json")) {
            let mut value: serde_json::Value = serde_json::from_str(&f.contents)
                .map_err(|e| PolicyError::LoadData { file: f.name.clone(), message: e.to_string() })?;
            if !value.is_object() {
                return Err(PolicyError::LoadData {
                    file: f.name.clone(),
                    message: "a data document must be a JSON object".into(),
                });
            }
            let dirs: Vec<&str> = f.name.split('/').collect();
            for dir in dirs[..dirs.len() - 1].iter().rev() {
                let mut wrapper = serde_json::Map::new();
                wrapper.insert((*dir).to_string(), value);
                value = serde_json::Value::Object(wrapper);
            }
            docs.push((f.name.clone(), value));
        }
        Ok(docs)
    }
}

fn digest_of(files: &[BundleFile]) -> String {
    let mut h = Sha256::new();
    for f in files {
        h.update((f.name.len() as u64).to_be_bytes());
        h.update(f.name.as_bytes());
        h.update((f.contents.len() as u64).to_be_bytes());
        h.update(f.contents.as_bytes());
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<BundleFile>) -> Result<(), PolicyError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| PolicyError::ReadBundle { path, source }
    };
    let mut entries = std::fs::read_dir(dir)
        .map_err(read_err(dir))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read_err(dir))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if file_name.starts_with('.') {
            continue;
        }
        let kind = entry.file_type().map_err(read_err(&path))?;
        if kind.is_dir() {
            collect(root, &path, out)?;
        } else if file_name.ends_with(".rego") || file_name.ends_with(".json") {
            let contents = std::fs::read_to_string(&path).map_err(read_err(&path))?;
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let name = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push(BundleFile { name, contents });
        }
    }
    Ok(())
}
