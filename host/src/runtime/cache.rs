//! Precompiled components on disk, keyed by the component's SHA-256 and the engine's
//! compatibility hash, so a restart loads native code instead of compiling again.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use wasmtime::component::Component;
use wasmtime::Engine;

use super::RuntimeError;

pub struct PrecompiledCache {
    dir: PathBuf,
    engine_key: String,
}

impl PrecompiledCache {
    pub fn new(dir: PathBuf, engine: &Engine) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Self {
            dir,
            engine_key: format!("{:016x}", hasher.finish()),
        }
    }

    fn path_for(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// Loads the component for `digest` from disk, or compiles `bytes` and stores the result.
    /// Returns whether the cache answered.
    pub fn load_or_compile(
        &self,
        engine: &Engine,
        digest: &str,
        bytes: &[u8],
    ) -> Result<(Component, bool), RuntimeError> {
        let path = self.path_for(digest);
        if path.is_file() {
            match deserialize(engine, &path) {
                Ok(component) => return Ok((component, true)),
                Err(err) => {
                    tracing::warn!(path = %path.display(), error = %err, "discarding unusable precompiled component");
                }
            }
        }
        let compiled = engine
            .precompile_component(bytes)
            .map_err(|e| RuntimeError::NotAComponent(format!("{e:#}")))?;
        self.store(&path, &compiled)?;
        let component = deserialize(engine, &path)?;
        Ok((component, false))
    }

    /// Writes through a temporary file and a rename, so a crash never leaves half a file.
    fn store(&self, path: &Path, compiled: &[u8]) -> Result<(), RuntimeError> {
        let err = |reason: String| RuntimeError::Cache {
            path: path.display().to_string(),
            reason,
        };
        std::fs::create_dir_all(&self.dir).map_err(|e| err(e.to_string()))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&tmp, compiled).map_err(|e| err(e.to_string()))?;
        std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))
    }
}

#[allow(unsafe_code)]
fn deserialize(engine: &Engine, path: &Path) -> Result<Component, RuntimeError> {
    // SAFETY: the file was produced by `Engine::precompile_component` of an engine with the
    // same compatibility hash (it is in the file name), written atomically by this process
    // into the operator's own cache directory; wasmtime checks the header and version again.
    unsafe { Component::deserialize_file(engine, path) }.map_err(|e| RuntimeError::Cache {
        path: path.display().to_string(),
        reason: format!("{e:#}"),
    })
}
