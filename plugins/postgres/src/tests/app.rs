//! The application's database, owner and Secret; TLS-only client authentication; replication
//! only from the cluster's pods.

use serde_json::{json, Value};
use stateward_sdk::testkit as tk;
use stateward_sdk::{Action, SecretRequest, Service};

use super::{answered, live_plan, plan, spec, stats_id, PRIMARY};
use crate::Postgres;

fn app_secret(p: &stateward_sdk::Plan) -> SecretRequest {
    p.actions
        .iter()
        .find_map(|a| match a {
            Action::EnsureSecret(s) if s.name == "pg-app" => Some(s.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the pg-app Secret is requested"))
}

fn derived<'a>(s: &'a SecretRequest, key: &str) -> &'a str {
    s.derived.iter().find(|(k, _)| k == key).map(|(_, t)| t.as_str()).unwrap_or_else(|| panic!("no {key}"))
}

fn with(spec_patch: Value) -> Value {
    let mut cr = tk::cr("PostgresCluster", "pg", spec());
    for (k, v) in spec_patch.as_object().unwrap() {
        cr["spec"][k] = v.clone();
    }
    cr
}

#[test]
fn the_app_secret_holds_a_random_password_and_the_connection_keys_derived_from_it() {
    let p = plan(&tk::cr("PostgresCluster", "pg", spec()));
    let s = app_secret(&p);
    assert_eq!(s.keys, [("password".to_string(), 24)], "only the password is random");
    let keys: Vec<&str> = s.derived.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["username", "dbname", "host", "port", "uri", "jdbc-uri", "pgpass"]);
    // Defaults as CloudNativePG's: database and owner `app`.
    assert_eq!(derived(&s, "username"), "app");
    assert_eq!(derived(&s, "dbname"), "app");
    assert_eq!(derived(&s, "host"), "pg-rw");
    assert_eq!(derived(&s, "port"), "5432");
    assert_eq!(derived(&s, "uri"), "postgresql://{username}:{password}@pg-rw.{namespace}:5432/{dbname}");
    assert_eq!(
        derived(&s, "jdbc-uri"),
        "jdbc:postgresql://pg-rw.{namespace}:5432/{dbname}?password={password}&user={username}"
    );
    assert_eq!(derived(&s, "pgpass"), "pg-rw:5432:{dbname}:{username}:{password}\n");
    // Made before the StatefulSet whose pods mount it; the superuser's stays separate.
    let at = |pred: &dyn Fn(&Action) -> bool| p.actions.iter().position(pred).unwrap();
    let secret = at(&|a| matches!(a, Action::EnsureSecret(s) if s.name == "pg-app"));
    let sts = at(&|a| matches!(a, Action::Apply(t) if t.contains("\"kind\":\"StatefulSet\"")));
    assert!(secret < sts);
    assert!(p.actions.iter().any(|a| matches!(a, Action::EnsureSecret(s) if s.name == "pg-credentials")));

    let custom = plan(&with(json!({ "bootstrap": { "database": "shop", "owner": "shop_owner" } })));
    let s = app_secret(&custom);
    assert_eq!((derived(&s, "username"), derived(&s, "dbname")), ("shop_owner", "shop"));
    let owner_defaults_to_database = plan(&with(json!({ "bootstrap": { "database": "shop" } })));
    assert_eq!(derived(&app_secret(&owner_defaults_to_database), "username"), "shop");
}

#[test]
fn the_pods_mount_the_app_password_alone_read_only() {
    let sts = tk::find(&plan(&tk::cr("PostgresCluster", "pg", spec())), "StatefulSet");
    let pod = &sts["spec"]["template"]["spec"];
    let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "app").unwrap();
    assert_eq!(
        volume["secret"],
        json!({ "secretName": "pg-app", "items": [{ "key": "password", "path": "password" }], "defaultMode": 0o440 })
    );
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    assert!(mounts.contains(&json!({ "name": "app", "mountPath": "/etc/stateward-app", "readOnly": true })));
}

fn hba(cr: &Value) -> Vec<Vec<String>> {
    let data = tk::find(&plan(cr), "ConfigMap")["data"].clone();
    data["pg_hba.conf"]
        .as_str()
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect()
}

#[test]
fn tls_only_refuses_plain_connections_and_the_uris_ask_for_tls() {
    let cr = with(json!({ "postgresql": { "tlsOnly": true } }));
    assert_eq!(
        hba(&cr),
        [
            vec!["local", "all", "all", "trust"],
            vec!["hostnossl", "all", "all", "all", "reject"],
            vec!["hostssl", "replication", "streaming_replica", "@MEMBERS@", "scram-sha-256"],
            vec!["hostssl", "all", "all", "all", "scram-sha-256"],
        ]
    );
    let s = app_secret(&plan(&cr));
    assert!(derived(&s, "uri").ends_with("/{dbname}?sslmode=require"));
    assert!(derived(&s, "jdbc-uri").ends_with("&user={username}&sslmode=require"));
    // Turning it on changes the pods' configuration: they roll onto it.
    let hash = |cr: &Value| {
        tk::find(&plan(cr), "StatefulSet")["spec"]["template"]["metadata"]["annotations"]
            ["stateward.dev/config-hash"]
            .clone()
    };
    assert_ne!(hash(&cr), hash(&tk::cr("PostgresCluster", "pg", spec())));
}

#[test]
fn the_entry_script_fills_in_the_pods_dns_suffix_for_replication() {
    let data = tk::find(&plan(&tk::cr("PostgresCluster", "pg", spec())), "ConfigMap")["data"].clone();
    let script = data["entrypoint.sh"].as_str().unwrap();
    for part in [
        "/etc/hosts",
        ".pg-headless.*) ;;",
        "members=samehost",
        "hba=\"$(dirname -- \"$PGDATA\")/pg_hba.conf\"",
        "sed \"s/@MEMBERS@/$members/\" \"$here/pg_hba.conf\" >\"$hba.tmp\"",
    ] {
        assert!(script.contains(part), "missing {part:?}");
    }
    // Before anything may start a server (initdb's single-user step included).
    assert!(script.find("members=$(").unwrap() < script.find("initialise() {").unwrap());
}

#[test]
fn bad_bootstrap_names_and_tls_only_values_are_refused_with_the_field_path() {
    let errors = |patch: Value| -> Vec<String> {
        Postgres::validate(&with(patch).to_string(), None)
            .into_iter()
            .map(|e| format!("{}: {}", e.path, e.message))
            .collect()
    };
    assert!(errors(json!({ "bootstrap": { "database": "shop", "owner": "shop_owner" } })).is_empty());
    for (patch, path, why) in [
        (json!({ "bootstrap": { "database": "Shop" } }), "spec.bootstrap.database", "not a plain identifier"),
        (json!({ "bootstrap": { "database": "a-b" } }), "spec.bootstrap.database", "not a plain identifier"),
        (
            json!({ "bootstrap": { "database": "x'; drop" } }),
            "spec.bootstrap.database",
            "not a plain identifier",
        ),
        (json!({ "bootstrap": { "owner": "postgres" } }), "spec.bootstrap.owner", "reserved"),
        (json!({ "bootstrap": { "owner": "streaming_replica" } }), "spec.bootstrap.owner", "reserved"),
        (json!({ "bootstrap": { "database": "template1" } }), "spec.bootstrap.database", "reserved"),
        (json!({ "bootstrap": { "owner": "pg_monitor" } }), "spec.bootstrap.owner", "reserved"),
        (json!({ "bootstrap": { "owner": 7 } }), "spec.bootstrap.owner", "not a string"),
        (json!({ "postgresql": { "tlsOnly": "yes" } }), "spec.postgresql.tlsOnly", "not true or false"),
    ] {
        let errs = errors(patch.clone());
        assert!(
            errs.iter().any(|e| e.starts_with(&format!("{path}: ")) && e.contains(why)),
            "{patch}: {errs:?}"
        );
    }
    // Fixed at creation.
    let old = with(json!({ "bootstrap": { "database": "shop" } }));
    let renamed = with(json!({ "bootstrap": { "database": "store" } }));
    let errs = Postgres::validate(&renamed.to_string(), Some(&old.to_string()));
    assert!(
        errs.iter().any(|e| e.path == "spec.bootstrap.database" && e.message.contains("fixed at creation")),
        "{errs:?}"
    );
    let errs = Postgres::validate(&with(json!({})).to_string(), Some(&old.to_string()));
    assert!(
        errs.iter().any(|e| e.path == "spec.bootstrap.database"),
        "dropping the field renames it too: {errs:?}"
    );
    assert!(Postgres::validate(&old.to_string(), Some(&old.to_string())).is_empty());
}

/// The id of the application poll on pod `pod` made by `running_pod`.
fn app_id(pod: &str) -> String {
    format!("app-{pod}-{}-0", &format!("uid-{pod}-0000")[..8])
}

#[test]
fn the_confirmed_primary_is_asked_to_keep_the_owner_and_database_and_status_says_how_it_went() {
    let cr = with(json!({ "bootstrap": { "database": "shop", "owner": "shop_owner" } }));
    // No confirmed primary yet: nothing asked, status says so.
    let p = live_plan(&cr, &["pg-0"], Vec::new());
    assert!(!p.actions.iter().any(|a| matches!(a, Action::Exec(e) if e.id.starts_with("app-"))));
    assert_eq!(tk::extra(&p)["application"]["ready"], false);
    assert_eq!(tk::extra(&p)["application"]["secret"], "pg-app");

    let primary = vec![answered(&stats_id("pg-0"), PRIMARY)];
    let p = live_plan(&cr, &["pg-0"], primary.clone());
    let Some(Action::Exec(e)) =
        p.actions.iter().find(|a| matches!(a, Action::Exec(e) if e.id.starts_with("app-")))
    else {
        panic!("no application poll: {:?}", p.actions)
    };
    assert_eq!(
        (e.id.as_str(), e.pod.as_str(), e.container.as_str()),
        (app_id("pg-0").as_str(), "pg-0", "postgres")
    );
    assert_eq!(e.mode, stateward_sdk::RequestMode::EveryMs(crate::app::POLL_MS));
    // psql over the socket, as every other request; the script on standard input.
    assert_eq!(e.command[0], "psql");
    let script = e.stdin.as_deref().unwrap();
    // The server reads the password from the mount: it is never part of the request.
    assert!(script.contains("pg_read_file('/etc/stateward-app/password')"));
    assert!(script.contains("SET log_statement = 'none'"));
    assert!(script.contains("WHERE rolname = 'shop_owner'"));
    assert!(script.contains("CREATE ROLE shop_owner LOGIN"));
    assert!(script.contains("ALTER ROLE shop_owner WITH LOGIN PASSWORD %L"));
    assert!(script.contains("CREATE DATABASE shop OWNER shop_owner"));
    // The fixes run only when the check finds the role, password or database not as asked.
    let check = script.find("\\if :in_sync").unwrap();
    assert!(check < script.find("CREATE ROLE").unwrap() && check < script.find("ALTER ROLE").unwrap());

    let status = |answer: stateward_sdk::Response| {
        let mut responses = primary.clone();
        responses.push(answer);
        tk::extra(&live_plan(&cr, &["pg-0"], responses))["application"].clone()
    };
    let ok = status(answered(&app_id("pg-0"), "ok\n"));
    assert_eq!(
        ok,
        json!({ "database": "shop", "owner": "shop_owner", "secret": "pg-app", "ready": true,
                           "message": "the owner, its password and the database are as the Secret says" })
    );
    assert_eq!(status(answered(&app_id("pg-0"), "set\n"))["ready"], false);
    let failed = stateward_sdk::Response {
        id: app_id("pg-0"),
        code: Some(3),
        stderr: "the password file /etc/stateward-app/password is missing or empty".into(),
        ..Default::default()
    };
    let failed = status(failed);
    assert_eq!(failed["ready"], false);
    assert!(failed["message"].as_str().unwrap().contains("password file"), "{failed}");
}
