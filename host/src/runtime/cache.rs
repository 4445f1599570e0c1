//! Precompiled components on disk, keyed by the component's SHA-256 and the engine's
//! compatibility hash, so a restart loads native code instead of compiling again.
//!
//! A precompiled artifact is native code that wasmtime maps and runs without checking it, so
//! the cache trusts nothing by its name alone (hardening finding 8):
//! - the directory must be private to this user (owned by it, not writable by group or
//!   others), else nothing is read from it or written to it;
//! - every artifact has a digest file beside it (SHA-256 of the artifact, written after the
//!   artifact); an artifact is deserialized only from the very bytes whose digest matched, so
//!   a truncated, corrupted or swapped file is compiled again instead;
//! - the cache is bounded: after each store the artifacts of other engines are removed, then
//!   the least recently used ones until the total is under the limit.
//!
//! The digest detects damage and mix-ups, not a forger who can write the directory: that is
//! what the ownership and mode check is for.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::component::Component;
use wasmtime::Engine;

use super::RuntimeError;

/// Default bound on the artifacts kept (they are a few MiB per plugin build).
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

const ARTIFACT: &str = "cwasm";
const DIGEST: &str = "sha256";

pub struct PrecompiledCache {
    dir: PathBuf,
    engine_key: String,
    max_bytes: u64,
}

impl PrecompiledCache {
    pub fn new(dir: PathBuf, engine: &Engine) -> Self {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Self { dir, engine_key: format!("{:016x}", hasher.finish()), max_bytes: DEFAULT_MAX_BYTES }
    }

    /// The same cache bounded to `max_bytes` of artifacts (the tests' small bound).
    #[cfg(test)]
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    fn path_for(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.{ARTIFACT}", self.engine_key))
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
        let usable = match private_dir(&self.dir) {
            Ok(usable) => usable,
            Err(reason) => {
                tracing::warn!(dir = %self.dir.display(), reason, "precompiled cache not used");
                false
            }
        };
        if usable {
            if let Some(artifact) = self.verified(&path) {
                match deserialize(engine, &path, &artifact) {
                    Ok(component) => {
                        // Recently used: eviction goes by modification time.
                        let _ = std::fs::File::options()
                            .append(true)
                            .open(&path)
                            .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                        return Ok((component, true));
                    }
                    Err(err) => {
                        tracing::warn!(path = %path.display(), error = %err, "discarding unusable precompiled component");
                    }
                }
            }
        }
        let compiled =
            engine.precompile_component(bytes).map_err(|e| RuntimeError::NotAComponent(format!("{e:#}")))?;
        let component = deserialize(engine, &path, &compiled)?;
        if usable || !self.dir.exists() {
            self.store(&path, &compiled)?;
            self.evict(&path);
        }
        Ok((component, false))
    }

    /// The artifact at `path` if its digest file matches its bytes; a mismatch removes both.
    fn verified(&self, path: &Path) -> Option<Vec<u8>> {
        let artifact = std::fs::read(path).ok()?;
        let recorded = std::fs::read_to_string(path.with_extension(DIGEST)).unwrap_or_default();
        if recorded.trim() == hex::encode(Sha256::digest(&artifact)) {
            return Some(artifact);
        }
        tracing::warn!(path = %path.display(), "precompiled component does not match its digest; compiling again");
        let _ = std::fs::remove_file(path);
        let _ = std::fs::remove_file(path.with_extension(DIGEST));
        None
    }

    /// Writes the artifact, then its digest, each through a temporary file and a rename, so a
    /// crash never leaves half a file (an artifact without its digest is never read).
    fn store(&self, path: &Path, compiled: &[u8]) -> Result<(), RuntimeError> {
        let err = |reason: String| RuntimeError::Cache { path: path.display().to_string(), reason };
        create_private_dir(&self.dir).map_err(|e| err(e.to_string()))?;
        let write = |target: &Path, contents: &[u8]| -> std::io::Result<()> {
            let tmp = target.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, contents)?;
            std::fs::rename(&tmp, target)
        };
        let _ = std::fs::remove_file(path.with_extension(DIGEST));
        write(path, compiled).map_err(|e| err(e.to_string()))?;
        write(&path.with_extension(DIGEST), hex::encode(Sha256::digest(compiled)).as_bytes())
            .map_err(|e| err(e.to_string()))
    }

    /// Removes artifacts of other engines, then the least recently used ones until the rest
    /// fit in the limit; `keep` (the one just stored) stays.
    fn evict(&self, keep: &Path) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let suffix = format!("-{}.{ARTIFACT}", self.engine_key);
        let mut ours = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.extension().and_then(|e| e.to_str()) != Some(ARTIFACT) {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if name.ends_with(&suffix) {
                let used = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                ours.push((used, meta.len(), path));
            } else {
                remove_artifact(&path);
            }
        }
        ours.sort_by_key(|entry| std::cmp::Reverse(entry.0));
        let mut total = ours.iter().find(|(_, _, p)| p == keep).map_or(0, |(_, len, _)| *len);
        for (_, len, path) in ours.into_iter().filter(|(_, _, p)| p != keep) {
            total = total.saturating_add(len);
            if total > self.max_bytes {
                remove_artifact(&path);
            }
        }
    }
}

fn remove_artifact(path: &Path) {
    tracing::debug!(path = %path.display(), "evicting precompiled component");
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(path.with_extension(DIGEST));
}

/// Creates the directory readable and writable by this user only.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// Whether the cache directory may be trusted: absent (it will be made private), or owned by
/// this process's user and not writable by group or others. `Err` says why not.
fn private_dir(dir: &Path) -> Result<bool, String> {
    let meta = match std::fs::metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e.to_string()),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        if meta.mode() & 0o022 != 0 {
            return Err(format!("writable by group or others (mode {:o})", meta.mode() & 0o777));
        }
        // The process's own user, as the kernel reports it for /proc/self.
        if let Ok(me) = std::fs::metadata("/proc/self") {
            if me.uid() != meta.uid() {
                return Err(format!("owned by uid {}, not this process's {}", meta.uid(), me.uid()));
            }
        }
    }
    Ok(meta.is_dir())
}

#[allow(unsafe_code)]
fn deserialize(engine: &Engine, path: &Path, artifact: &[u8]) -> Result<Component, RuntimeError> {
    // SAFETY: `artifact` is either what `Engine::precompile_component` just returned, or the
    // bytes of a file in a directory private to this user whose SHA-256 matched the digest
    // written beside it when this engine (same compatibility hash, in the file name) stored
    // it; wasmtime checks the header and version again.
    unsafe { Component::deserialize(engine, artifact) }
        .map_err(|e| RuntimeError::Cache { path: path.display().to_string(), reason: format!("{e:#}") })
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;

    /// A small valid component: one core module with a memory of `pages` pages, so that
    /// components of different `pages` compile to different artifacts.
    fn component(pages: u8) -> Vec<u8> {
        let module: Vec<u8> = [&b"\0asm\x01\x00\x00\x00"[..], &[0x05, 0x03, 0x01, 0x00, pages]].concat();
        let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
        bytes.push(0x01); // core module section
        bytes.push(u8::try_from(module.len()).expect("short"));
        bytes.extend(module);
        bytes
    }

    fn engine() -> Engine {
        let mut config = wasmtime::Config::new();
        config.wasm_component_model(true);
        Engine::new(&config).expect("engine")
    }

    fn tempdir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stateward-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Finding 8: an artifact is not trusted by its file name. Another artifact put in its
    /// place, or a damaged one, is compiled again, never loaded.
    #[test]
    fn a_swapped_or_damaged_artifact_is_not_loaded() {
        let engine = engine();
        let dir = tempdir("swap");
        let cache = PrecompiledCache::new(dir.clone(), &engine);
        let (a, b) = (component(1), component(2));
        assert!(!cache.load_or_compile(&engine, "aaaa", &a).expect("a").1);
        assert!(!cache.load_or_compile(&engine, "bbbb", &b).expect("b").1);
        assert!(cache.load_or_compile(&engine, "aaaa", &a).expect("a again").1, "a hit");
        let (path_a, path_b) = (cache.path_for("aaaa"), cache.path_for("bbbb"));
        let artifact_b = std::fs::read(&path_b).expect("b");
        // B's native code under A's name.
        std::fs::write(&path_a, &artifact_b).expect("swap");
        assert!(
            !cache.load_or_compile(&engine, "aaaa", &a).expect("a after swap").1,
            "loaded a swapped artifact"
        );
        assert!(cache.load_or_compile(&engine, "aaaa", &a).expect("a recompiled").1);
        // A truncated artifact.
        let whole = std::fs::read(&path_a).expect("a");
        std::fs::write(&path_a, &whole[..whole.len() / 2]).expect("truncate");
        assert!(!cache.load_or_compile(&engine, "aaaa", &a).expect("a after truncation").1);
        // An artifact without its digest file.
        std::fs::remove_file(path_a.with_extension(DIGEST)).expect("rm digest");
        assert!(!cache.load_or_compile(&engine, "aaaa", &a).expect("a without digest").1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Finding 8: the cache is bounded; the least recently used artifacts go first and so do
    /// those of another engine.
    #[test]
    fn the_cache_is_bounded_and_evicts_the_least_recently_used() {
        let engine = engine();
        let dir = tempdir("evict");
        let probe = PrecompiledCache::new(dir.clone(), &engine);
        probe.load_or_compile(&engine, "probe", &component(1)).expect("probe");
        let one = std::fs::metadata(probe.path_for("probe")).expect("size").len();
        std::fs::write(dir.join("old-0000000000000000.cwasm"), b"another engine's").expect("stale");
        // Room for two artifacts (sizes differ by a few bytes at most).
        let cache = PrecompiledCache::new(dir.clone(), &engine).with_max_bytes(one * 2 + one / 2);
        for (tag, pages) in [("c1", 2), ("c2", 3)] {
            cache.load_or_compile(&engine, tag, &component(pages)).expect("store");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!dir.join("old-0000000000000000.cwasm").exists(), "another engine's artifact kept");
        assert!(!cache.path_for("probe").exists(), "the least recently used was kept");
        // c1 used again, so c2 is the one to go when c3 arrives.
        assert!(cache.load_or_compile(&engine, "c1", &component(2)).expect("c1").1);
        std::thread::sleep(std::time::Duration::from_millis(20));
        cache.load_or_compile(&engine, "c3", &component(4)).expect("c3");
        assert!(cache.path_for("c1").exists() && cache.path_for("c3").exists());
        assert!(!cache.path_for("c2").exists(), "c2 should have been evicted");
        assert!(!cache.path_for("c2").with_extension(DIGEST).exists(), "its digest too");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A directory others can write is not used: every load compiles.
    #[cfg(unix)]
    #[test]
    fn a_directory_others_can_write_is_not_trusted() {
        use std::os::unix::fs::PermissionsExt as _;
        let engine = engine();
        let dir = tempdir("shared");
        let cache = PrecompiledCache::new(dir.clone(), &engine);
        let a = component(1);
        cache.load_or_compile(&engine, "aaaa", &a).expect("store");
        assert_eq!(std::fs::metadata(&dir).expect("dir").permissions().mode() & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(
            !cache.load_or_compile(&engine, "aaaa", &a).expect("load").1,
            "trusted a world-writable cache"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
