//! ACL users from `spec.users`: their Secrets, the mount of their passwords, the `user`
//! directives the entry script writes, and the checks.

use super::*;
use stateward_sdk::Action;

fn with_users(users: Value) -> Value {
    let mut cr = tk::cr("RedisCluster", "cache", spec());
    cr["spec"]["users"] = users;
    cr
}

fn app_user() -> Value {
    json!([{ "name": "app", "keys": ["app:*"], "commands": ["+get", "+set"] }])
}

#[test]
fn a_user_gets_a_secret_a_mounted_password_and_a_user_directive() {
    let p = plan(&with_users(app_user()));
    let secret = p
        .actions
        .iter()
        .find_map(|a| match a {
            Action::EnsureSecret(s) if s.name == "cache-user-app" => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no Secret cache-user-app"));
    assert_eq!(secret.keys, [("password".to_string(), 24)]);
    assert_eq!(secret.derived, [("username".to_string(), "app".to_string())]);

    let pod = &tk::find(&p, "StatefulSet")["spec"]["template"]["spec"];
    let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "users").unwrap();
    assert_eq!(
        volume["projected"]["sources"][0]["secret"],
        json!({ "name": "cache-user-app", "items": [{ "key": "password", "path": "app" }] })
    );
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["name"] == "users" && m["mountPath"] == "/etc/stateward-users"));

    let script = tk::find(&p, "ConfigMap")["data"]["entrypoint.sh"].as_str().unwrap().to_string();
    for line in [
        "hash=$(tr -d '\\n' <\"/etc/stateward-users/app\" | sha256sum | cut -d ' ' -f 1)",
        "printf 'user %s reset #%s %s\\n' 'app' \"$hash\" 'on ~app:* +get +set' >>\"$auth\"",
    ] {
        assert!(script.lines().any(|l| l == line), "missing {line:?} in\n{script}");
    }
    // Written before the server starts, into the include file, in both modes.
    assert!(script.find("sha256sum").unwrap() < script.find("exec redis-server").unwrap());
    let mut solo = with_users(app_user());
    solo["spec"]["replicas"] = json!(1);
    let s = tk::find(&plan(&solo), "ConfigMap")["data"]["entrypoint.sh"].as_str().unwrap().to_string();
    assert!(s.contains("'on ~app:* +get +set'"));
    // No user, no volume and no directive.
    let none = plan(&tk::cr("RedisCluster", "cache", spec()));
    let pod = &tk::find(&none, "StatefulSet")["spec"]["template"]["spec"];
    assert!(!pod["volumes"].as_array().unwrap().iter().any(|v| v["name"] == "users"));
    assert!(!tk::find(&none, "ConfigMap")["data"]["entrypoint.sh"].as_str().unwrap().contains("user %s"));
}

fn errors(cr: &Value) -> Vec<(String, String)> {
    Redis::validate(&cr.to_string(), None).into_iter().map(|e| (e.path, e.message)).collect()
}

#[test]
fn bad_users_are_refused_with_the_field_path() {
    assert_eq!(errors(&with_users(app_user())), []);
    for (users, path, reason) in [
        (
            json!([{ "name": "default", "commands": ["-@all"] }]),
            "spec.users[0].name",
            "lock the operator out",
        ),
        (json!([{ "name": "App" }]), "spec.users[0].name", "lower-case"),
        (json!([{ "name": "a" }, { "name": "a" }]), "spec.users[1].name", "listed twice"),
        (json!([{ "name": "a", "keys": ["app:* ~other"] }]), "spec.users[0].keys[0]", "without spaces"),
        (json!([{ "name": "a", "keys": ["x'$(reboot)"] }]), "spec.users[0].keys[0]", "quotes"),
        (json!([{ "name": "a", "commands": ["get"] }]), "spec.users[0].commands[0]", "+<command>"),
        (json!([{ "name": "a", "commands": ["+get >secret"] }]), "spec.users[0].commands[0]", "+<command>"),
        (json!([{ "name": "a", "password": "x" }]), "spec.users[0].password", "not a user field"),
        (json!({ "name": "a" }), "spec.users", "not a list"),
    ] {
        let errs = errors(&with_users(users.clone()));
        assert!(
            errs.iter().any(|(p, m)| p == path && m.contains(reason)),
            "{users}: {path} {reason:?} not in {errs:#?}"
        );
    }
    // ACL directives stay the operator's.
    for key in ["user", "aclfile", "acl-pubsub-default", "requirepass", "masterauth"] {
        let mut cr = tk::cr("RedisCluster", "cache", spec());
        cr["spec"]["parameters"] = json!({ key: "x" });
        let errs = errors(&cr);
        assert!(errs.iter().any(|(p, m)| *p == format!("spec.parameters.{key}") && m.contains("managed by the operator")), "{key}: {errs:#?}");
    }
}
