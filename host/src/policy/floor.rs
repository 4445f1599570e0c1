//! The policy floor (docs/architecture.md, Threat model): the bundle the operator starts with
//! (`--policy-dir`, the image's) decides every decision, always, with its own data and
//! enforcement modes. A hot-loaded bundle (policy ConfigMaps) is a second layer evaluated
//! beside it: its denies and warnings are added, its enforcement data may make a floor rule
//! stricter but never milder, and nothing it defines or omits removes a floor rule.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::bundle::{Bundle, BundleFile};
use super::engine::{rule_id, DecisionPoint, Evaluation, Mode, PolicyEngine};
use super::error::PolicyError;

/// Compiles the floor: `bundle` (the policy directory) with the `stateward run` flags'
/// document ([`profile`]), if any.
///
/// The bundle's own `test_*` rules run on the bundle as given: they are written against its
/// own data, and the flags' document changes that data (with pins required, the plugins
/// tests' unpinned builds are refused). So the document is added after the tests pass.
pub fn compile(bundle: &Bundle, profile: Option<BundleFile>) -> Result<PolicyEngine, PolicyError> {
    let tested = PolicyEngine::compile_tested(bundle)?;
    match profile {
        None => Ok(tested),
        Some(file) => {
            PolicyEngine::compile(&Bundle::from_files(bundle.files().iter().cloned().chain([file]))?)
        }
    }
}

/// Both layers' raw results merged, with the mode each deny message is enforced in.
#[derive(Debug, Clone, Default)]
pub struct Layered {
    /// The union of both `deny` sets, sorted, and of both `warn` sets; the errors of both.
    pub evaluation: Evaluation,
    /// Each deny message with its enforced mode, sorted by message.
    pub modes: Vec<(String, Mode)>,
}

/// Evaluates `point` on the floor and, when there is one, on the hot-loaded layer.
///
/// A message the floor denies is enforced in the floor's mode, made stricter (never milder) by
/// a mode the layer's data sets for that rule; a message only the layer denies is enforced in
/// the layer's mode. A layer without `point`'s package adds nothing there (the floor still
/// decides); a layer that fails to evaluate fails the decision closed, like the floor.
pub fn evaluate(
    floor: &PolicyEngine,
    layer: Option<&PolicyEngine>,
    point: DecisionPoint,
    input: &serde_json::Value,
) -> Layered {
    let base = floor.evaluate(point, input);
    let mut modes: BTreeMap<String, Mode> = BTreeMap::new();
    for msg in &base.deny {
        let rule = rule_id(msg);
        let mut mode = floor.mode(point, rule);
        if let Some(tighter) = layer.and_then(|l| l.explicit_mode(point, rule)) {
            mode = mode.stricter(tighter);
        }
        modes.insert(msg.clone(), mode);
    }
    let mut evaluation = base;
    if let Some(layer) = layer.filter(|l| l.defines(point)) {
        let added = layer.evaluate(point, input);
        for msg in &added.deny {
            let mode = layer.mode(point, rule_id(msg));
            modes.entry(msg.clone()).and_modify(|m| *m = m.stricter(mode)).or_insert(mode);
        }
        evaluation.warn.extend(added.warn);
        evaluation.warn.sort();
        evaluation.warn.dedup();
        evaluation.error = match (evaluation.error.take(), added.error) {
            (Some(a), Some(b)) => Some(format!("{a}; hot-loaded bundle: {b}")),
            (Some(a), None) => Some(a),
            (None, Some(b)) => Some(format!("hot-loaded bundle: {b}")),
            (None, None) => None,
        };
        evaluation.eval_ns = evaluation.eval_ns.saturating_add(added.eval_ns);
    }
    evaluation.deny = modes.keys().cloned().collect();
    Layered { evaluation, modes: modes.into_iter().collect() }
}

/// The digest decisions are recorded under: the floor's alone, or both layers' together.
pub fn digest(floor: &PolicyEngine, layer: Option<&PolicyEngine>) -> String {
    match layer {
        None => floor.digest().to_string(),
        Some(layer) => {
            let mut h = Sha256::new();
            h.update(floor.digest().as_bytes());
            h.update(b"+");
            h.update(layer.digest().as_bytes());
            format!("sha256:{}", hex::encode(h.finalize()))
        }
    }
}

/// The file name of the data document [`profile`] adds to the floor.
pub const PROFILE_FILE: &str = "stateward-run-flags.json";

/// The data document the floor gets from `stateward run` flags: `require_pins` (the hardened
/// profile: a ConfigMap build loads only with a pinned digest) and `pins`, plugin name →
/// digests (`--pin-plugin NAME=sha256:HEX`). Flags change the floor the way the image does:
/// only whoever may change the operator's own pod spec can set them. `None` when neither is
/// given. A pin that is not `sha256:` and 64 lowercase hex digits is refused here.
pub fn profile(require_pins: bool, pins: &[String]) -> Result<Option<BundleFile>, String> {
    if !require_pins && pins.is_empty() {
        return Ok(None);
    }
    let mut by_plugin: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pin in pins {
        let (name, digest) = pin
            .split_once('=')
            .ok_or_else(|| format!("--pin-plugin {pin:?}: expected NAME=sha256:<64 hex>"))?;
        let hex = digest.strip_prefix("sha256:").unwrap_or_default();
        if name.is_empty()
            || hex.len() != 64
            || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(format!("--pin-plugin {pin:?}: expected NAME=sha256:<64 lowercase hex>"));
        }
        by_plugin.entry(name.to_string()).or_default().push(digest.to_string());
    }
    let mut plugins = serde_json::Map::new();
    plugins.insert("pins".into(), serde_json::json!(by_plugin));
    if require_pins {
        plugins.insert("require_pins".into(), serde_json::Value::Bool(true));
    }
    let doc = serde_json::json!({"stateward": {"config": {"plugins": plugins}}});
    Ok(Some(BundleFile { name: PROFILE_FILE.into(), contents: doc.to_string() }))
}

/// The floor's data document (`data.json` of the policy directory) is the one the pod spec pins
/// (`--policy-data-sha256`, which the Helm chart sets from the document it installs), so a
/// ConfigMap deleted and made again with other data between installs never becomes the floor
/// of a starting pod: the operator refuses to start instead, naming both digests.
pub fn check_data_pin(dir: &std::path::Path, pinned: &str) -> Result<(), String> {
    let path = dir.join("data.json");
    let bytes = std::fs::read(&path).map_err(|e| {
        format!("--policy-data-sha256 pins the floor's data, but {} cannot be read: {e}", path.display())
    })?;
    let actual = hex::encode(Sha256::digest(&bytes));
    let pinned = pinned.trim().trim_start_matches("sha256:").to_ascii_lowercase();
    if actual == pinned {
        Ok(())
    } else {
        Err(format!(
            "the policy floor's data ({}) has sha256 {actual}, the pod spec pins {pinned} (--policy-data-sha256): \
             not starting on a floor other than the one installed",
            path.display()
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::policy::bundle::Bundle;

    fn engine(rego: &str, data: &str) -> PolicyEngine {
        let file = |name: &str, contents: &str| BundleFile { name: name.into(), contents: contents.into() };
        PolicyEngine::compile(&Bundle::from_files([file("g.rego", rego), file("data.json", data)]).unwrap())
            .unwrap()
    }

    const FLOOR: &str = "package stateward.guardrails\n\ndeny contains \"privileged: no\" if input.privileged\n\ndeny contains \"root: no\" if input.root\n";

    /// A layer that drops the floor's rules and sets them to dryrun still has them enforced;
    /// it may add its own deny, and make a floor rule in `warn` stricter.
    #[test]
    fn a_layer_adds_denies_and_never_weakens_the_floor() {
        let floor =
            engine(FLOOR, r#"{"stateward": {"config": {"enforcement": {"guardrails": {"root": "warn"}}}}}"#);
        let layer = engine(
            "package stateward.guardrails\n\ndeny contains \"big: no\" if input.big\n",
            r#"{"stateward": {"config": {"enforcement": {"guardrails": {"privileged": "dryrun", "root": "deny", "big": "warn"}}}}}"#,
        );
        let input = serde_json::json!({"privileged": true, "root": true, "big": true});
        let out = evaluate(&floor, Some(&layer), DecisionPoint::Guardrails, &input);
        assert_eq!(
            out.modes,
            vec![
                ("big: no".to_string(), Mode::Warn),
                ("privileged: no".to_string(), Mode::Deny),
                ("root: no".to_string(), Mode::Deny),
            ]
        );
        assert!(out.evaluation.error.is_none());
        // Without the layer, the floor alone: root stays in warn.
        let alone = evaluate(&floor, None, DecisionPoint::Guardrails, &input);
        assert_eq!(alone.modes[1], ("root: no".to_string(), Mode::Warn));
        assert_eq!(digest(&floor, None), floor.digest());
        assert_ne!(digest(&floor, Some(&layer)), floor.digest());
    }

    /// A layer without the decision point's package adds nothing; one whose rule errors
    /// fails the decision closed.
    #[test]
    fn a_missing_package_adds_nothing_and_a_failing_layer_fails_closed() {
        let floor = engine(FLOOR, "{}");
        let other = engine("package stateward.admission\n\ndeny contains \"x: y\" if true\n", "{}");
        let input = serde_json::json!({});
        let out = evaluate(&floor, Some(&other), DecisionPoint::Guardrails, &input);
        assert!(out.modes.is_empty() && out.evaluation.error.is_none());
        let failing = engine("package stateward.guardrails\n\ndeny := 1\n", "{}");
        let out = evaluate(&floor, Some(&failing), DecisionPoint::Guardrails, &input);
        assert!(out.evaluation.error.unwrap().starts_with("hot-loaded bundle: "));
    }

    /// The shipped bundle, whose plugins tests load unpinned builds, is a floor with pins
    /// required (the in-cluster operator crash-looped on `--require-plugin-pins` when the
    /// flags' document was compiled in before the tests ran).
    #[test]
    fn the_shipped_bundle_with_pins_required_compiles_as_the_floor() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
        let shipped = Bundle::from_dir(&dir).unwrap();
        let pinned = format!("redis=sha256:{}", "a".repeat(64));
        let floor = compile(&shipped, profile(true, &[pinned]).unwrap()).unwrap();
        let input = serde_json::json!({"name": "redis", "digest": format!("sha256:{}", "b".repeat(64)),
            "source": "configmap", "size": 1, "stage": "before-compile"});
        let refused = floor.evaluate(DecisionPoint::Plugins, &input);
        assert!(refused.deny.iter().any(|m| m.starts_with("digest-pin:")), "{refused:?}");
        assert_ne!(floor.digest(), compile(&shipped, None).unwrap().digest());
    }

    #[test]
    fn pins_from_flags_are_checked() {
        assert!(profile(false, &[]).unwrap().is_none());
        let digest = format!("sha256:{}", "a".repeat(64));
        let doc = profile(true, &[format!("redis={digest}")]).unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_str(&doc.contents).unwrap();
        assert_eq!(v["stateward"]["config"]["plugins"]["pins"]["redis"][0], digest.as_str());
        assert_eq!(v["stateward"]["config"]["plugins"]["require_pins"], true);
        let no_name = format!("=sha256:{}", "a".repeat(64));
        for bad in ["redis", "redis=sha256:abc", &no_name] {
            assert!(profile(false, &[bad.to_string()]).unwrap_err().contains("--pin-plugin"), "{bad}");
        }
    }

    #[test]
    fn a_floor_whose_data_is_not_the_pinned_document_is_refused() {
        let dir = std::env::temp_dir().join(format!("stateward-floor-pin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("data.json"), b"{\"allowed_registries\": []}\n").expect("write");
        let digest = hex::encode(Sha256::digest(b"{\"allowed_registries\": []}\n"));
        assert_eq!(check_data_pin(&dir, &digest), Ok(()));
        assert_eq!(check_data_pin(&dir, &format!("sha256:{}", digest.to_uppercase())), Ok(()));
        let err = check_data_pin(&dir, &"0".repeat(64)).expect_err("another document");
        assert!(err.contains(&digest) && err.contains("--policy-data-sha256"), "{err}");
        std::fs::remove_file(dir.join("data.json")).expect("remove");
        let err = check_data_pin(&dir, &digest).expect_err("no document");
        assert!(err.contains("cannot be read"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
