//! Validation of `spec.parameters` (server configuration) against a plugin's allow-list.

use std::collections::BTreeMap;

use crate::spec::parse_quantity;
use crate::types::FieldError;

/// The shape a parameter value must have.
#[derive(Debug, Clone, Copy)]
pub enum ParamKind {
    /// A decimal integer within bounds.
    Int { min: i64, max: i64 },
    /// `on`/`off` style switch, spelled as the service expects (see the listed values).
    OneOf(&'static [&'static str]),
    /// A size with one of the given unit suffixes, e.g. "128MB" (postgres) or "100mb" (redis).
    Size(&'static [&'static str]),
    /// A Kubernetes-style quantity such as "512Mi".
    Quantity,
    /// Free text without quotes, newlines or comment characters.
    Text,
}

/// One allowed parameter: key, value shape and the value used when the spec omits it.
#[derive(Debug, Clone, Copy)]
pub struct ParamRule {
    pub key: &'static str,
    pub kind: ParamKind,
    pub default: Option<&'static str>,
}

/// Checks every parameter; `forbidden` keys are managed by the operator itself.
pub fn check_parameters(
    params: &BTreeMap<String, String>,
    rules: &[ParamRule],
    forbidden: &[&str],
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (key, value) in params {
        let path = format!("spec.parameters.{key}");
        if forbidden.contains(&key.as_str()) {
            errs.push(FieldError::new(path, "is managed by the operator and cannot be set"));
            continue;
        }
        let Some(rule) = rules.iter().find(|r| r.key == key) else {
            errs.push(FieldError::new(path, "is not a supported parameter"));
            continue;
        };
        if let Err(m) = check_value(rule.kind, value) {
            errs.push(FieldError::new(path, m));
        }
    }
    errs
}

fn check_value(kind: ParamKind, value: &str) -> Result<(), String> {
    match kind {
        ParamKind::Int { min, max } => match value.parse::<i64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(()),
            Ok(n) => Err(format!("{n} is outside {min}..={max}")),
            Err(_) => Err(format!("{value:?} is not an integer")),
        },
        ParamKind::OneOf(allowed) if allowed.contains(&value) => Ok(()),
        ParamKind::OneOf(allowed) => Err(format!("must be one of {}", allowed.join(", "))),
        ParamKind::Size(units) => {
            let digits = value.bytes().take_while(u8::is_ascii_digit).count();
            let (num, unit) = value.split_at(digits);
            if !num.is_empty() && num.len() <= 12 && units.contains(&unit) {
                Ok(())
            } else {
                Err(format!("{value:?} is not a size like 128{}", units.first().copied().unwrap_or("")))
            }
        }
        ParamKind::Quantity if parse_quantity(value).is_some() => Ok(()),
        ParamKind::Quantity => Err(format!("{value:?} is not a quantity like 512Mi")),
        ParamKind::Text => {
            let bad = value.is_empty()
                || value.len() > 256
                || value.chars().any(|c| c.is_control() || matches!(c, '\'' | '"' | '#' | '\\'));
            if bad {
                Err("must be 1-256 characters without quotes, '#', backslashes or control characters".into())
            } else {
                Ok(())
            }
        }
    }
}

/// Defaults from the rules, overridden by the spec: the effective server configuration.
pub fn effective(params: &BTreeMap<String, String>, rules: &[ParamRule]) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> =
        rules.iter().filter_map(|r| r.default.map(|d| (r.key.to_string(), d.to_string()))).collect();
    for (k, v) in params {
        if rules.iter().any(|r| r.key == k) {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &[ParamRule] = &[
        ParamRule { key: "n", kind: ParamKind::Int { min: 1, max: 10 }, default: Some("5") },
        ParamRule { key: "s", kind: ParamKind::Size(&["MB", "GB"]), default: None },
        ParamRule { key: "t", kind: ParamKind::Text, default: None },
    ];

    #[test]
    fn rules_are_enforced() {
        let p: BTreeMap<String, String> =
            [("n", "11"), ("s", "12XB"), ("t", "a'b"), ("x", "1"), ("port", "1")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let errs = check_parameters(&p, RULES, &["port"]);
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.parameters.n",
                "spec.parameters.port",
                "spec.parameters.s",
                "spec.parameters.t",
                "spec.parameters.x"
            ]
        );
        let ok: BTreeMap<String, String> =
            [("n".to_string(), "7".to_string()), ("s".to_string(), "64MB".to_string())].into();
        assert!(check_parameters(&ok, RULES, &[]).is_empty());
        assert_eq!(effective(&ok, RULES).get("n").map(String::as_str), Some("7"));
        assert_eq!(effective(&BTreeMap::new(), RULES).get("n").map(String::as_str), Some("5"));
    }
}
