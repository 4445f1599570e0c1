//! ACL users from `spec.users`: each one's password in a Secret of its own, its key patterns
//! and commands as Redis ACL rules.
//!
//! The `default` user stays the operator's: its password is the credentials Secret's
//! (`requirepass`), replication (`masterauth`), the Sentinels and the operator's own requests
//! (`REDISCLI_AUTH` in the container) use it. So no spec user may be called `default`, and no
//! rule of a spec user touches it.
//!
//! The plugin never sees a password. The host fills `<name>-user-<user>` with a random
//! `password`, the kubelet mounts every user's password as a file of [`MOUNT_DIR`], and the
//! entry script turns each into a `user` directive of the in-memory include file with the
//! password's SHA-256 (`#<hash>`): no password in a ConfigMap, a command line or a plan. A
//! user added, removed or changed rolls the pods (the pod template changes); a rotated
//! password is taken at the next start of each pod.

use serde_json::{json, Map, Value};
use stateward_sdk::builders::Ctx;
use stateward_sdk::{FieldError, SecretRequest};

/// Where every user's password is mounted, one file per user named after it.
pub const MOUNT_DIR: &str = "/etc/stateward-users";
const VOLUME: &str = "users";
/// The operator's own user.
pub const OPERATOR_USER: &str = "default";

/// One user of `spec.users`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// Key patterns (`~<pattern>`).
    pub keys: Vec<String>,
    /// Command rules, e.g. `+get`, `+@read`, `-flushall`.
    pub commands: Vec<String>,
}

impl User {
    /// The ACL rules after `reset` (no key, channel or command) and the password: `on`, keys,
    /// commands.
    pub fn rules(&self) -> String {
        let mut r = vec!["on".to_string()];
        r.extend(self.keys.iter().map(|k| format!("~{k}")));
        r.extend(self.commands.iter().cloned());
        r.join(" ")
    }
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_string).collect()
}

/// `spec.users` (entries without a name are left out: `validate` refuses them).
pub fn users(spec: &Value) -> Vec<User> {
    spec.get("users")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|u| {
            Some(User {
                name: u.get("name")?.as_str()?.to_string(),
                keys: strings(u.get("keys")),
                commands: strings(u.get("commands")),
            })
        })
        .collect()
}

/// `<name>-user-<user>`.
pub fn secret_name(ctx: &Ctx, user: &str) -> String {
    format!("{}-user-{user}", ctx.name())
}

/// One Secret per user: a random `password` and its `username`.
pub fn secrets(ctx: &Ctx) -> Vec<SecretRequest> {
    users(&ctx.cluster.spec.raw)
        .into_iter()
        .map(|u| SecretRequest {
            name: secret_name(ctx, &u.name),
            keys: vec![("password".into(), 24)],
            labels: ctx.label_pairs(),
            derived: vec![("username".into(), u.name.clone())],
        })
        .collect()
}

/// The pod volume with every user's password (0440: the pod's group) and its mount; None
/// without users.
pub fn volume_and_mount(ctx: &Ctx) -> Option<(Value, Value)> {
    let users = users(&ctx.cluster.spec.raw);
    if users.is_empty() {
        return None;
    }
    let sources: Vec<Value> = users
        .iter()
        .map(|u| {
            json!({ "secret": {
                "name": secret_name(ctx, &u.name),
                "items": [{ "key": "password", "path": u.name }],
            } })
        })
        .collect();
    Some((
        json!({ "name": VOLUME, "projected": { "sources": sources, "defaultMode": 0o440 } }),
        json!({ "name": VOLUME, "mountPath": MOUNT_DIR, "readOnly": true }),
    ))
}

/// Shell lines for the entry script: a `user` directive per user appended to `$auth` (the
/// in-memory include file), with the SHA-256 of its mounted password. Names and rules are
/// checked by [`validate`] (no quote, space or shell character).
pub fn script(ctx: &Ctx) -> String {
    let mut out = String::new();
    for u in users(&ctx.cluster.spec.raw) {
        out.push_str(&format!(
            "hash=$(tr -d '\\n' <\"{MOUNT_DIR}/{name}\" | sha256sum | cut -d ' ' -f 1)\n\
             printf 'user %s reset #%s %s\\n' '{name}' \"$hash\" '{rules}' >>\"$auth\"\n",
            name = u.name,
            rules = u.rules(),
        ));
    }
    out
}

/// A user name: what Redis and a Secret's name both take.
fn name_ok(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 40
        && n.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !n.starts_with('-')
        && !n.ends_with('-')
}

/// A key pattern: printable, no space, no quote or backslash (it goes into a shell script).
fn pattern_ok(p: &str) -> bool {
    !p.is_empty() && p.len() <= 200 && p.bytes().all(|b| b.is_ascii_graphic() && !b"'\"\\`$".contains(&b))
}

/// A command rule: `+` or `-`, then a command, `@category` or `command|subcommand`.
fn command_ok(c: &str) -> bool {
    let Some(rest) = c.strip_prefix('+').or_else(|| c.strip_prefix('-')) else {
        return false;
    };
    let rest = rest.strip_prefix('@').unwrap_or(rest);
    !rest.is_empty()
        && rest.len() <= 64
        && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'|' || b == b'-' || b == b'_')
}

/// Checks of `spec.users`.
pub fn validate(spec: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let Some(list) = spec.get("users").filter(|v| !v.is_null()) else {
        return errs;
    };
    let Some(list) = list.as_array() else {
        errs.push(FieldError::new("spec.users", "is not a list"));
        return errs;
    };
    let mut seen = Vec::new();
    for (i, u) in list.iter().enumerate() {
        let at = format!("spec.users[{i}]");
        let name = u.get("name").and_then(Value::as_str).unwrap_or_default();
        if name == OPERATOR_USER {
            errs.push(FieldError::new(
                format!("{at}.name"),
                "default is the operator's own user (replication, Sentinel and the operator's requests \
                 authenticate as it): rules for it would lock the operator out; name another user",
            ));
        } else if !name_ok(name) {
            errs.push(FieldError::new(
                format!("{at}.name"),
                format!("{name:?} is not 1 to 40 lower-case letters, digits and inner dashes"),
            ));
        } else if seen.contains(&name) {
            errs.push(FieldError::new(format!("{at}.name"), format!("{name} is listed twice")));
        }
        seen.push(name);
        for (j, k) in strings(u.get("keys")).iter().enumerate() {
            if !pattern_ok(k) {
                errs.push(FieldError::new(
                    format!("{at}.keys[{j}]"),
                    format!("{k:?} is not a key pattern without spaces, quotes, backslashes, $ or `"),
                ));
            }
        }
        for (j, c) in strings(u.get("commands")).iter().enumerate() {
            if !command_ok(c) {
                errs.push(FieldError::new(
                    format!("{at}.commands[{j}]"),
                    format!("{c:?} is not +<command>, -<command>, +@<category> or -@<category>"),
                ));
            }
        }
        if let Some(o) = u.as_object() {
            for key in o.keys().filter(|k| !["name", "keys", "commands"].contains(&k.as_str())) {
                errs.push(FieldError::new(
                    format!("{at}.{key}"),
                    "is not a user field (name, keys, commands)",
                ));
            }
        }
    }
    errs
}

/// The spec field above, for the CRD schema. Kept as data (users_schema.json), not code: the
/// component must fit a ConfigMap.
pub fn schema() -> Map<String, Value> {
    serde_json::from_str(include_str!("users_schema.json")).unwrap_or_default()
}
