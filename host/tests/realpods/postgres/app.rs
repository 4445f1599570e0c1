//! Users and databases on real pods: the application's database and owner from
//! `spec.bootstrap`, the `<name>-app` Secret applications connect with, a rotated password taken
//! up live, TLS-only client authentication, and replication accepted only from the cluster's
//! own pods.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::{json, Value};
use stateward_testkit::TestEnv;

use super::super::e2e::{get_cr, wait_for, POSTGRES};
use super::super::{kubectl_in, kubectl_ok};
use super::{client_sh, enter_with_operator, make_cluster};

/// The `<name>-app` Secret's values.
async fn app_secret(env: &TestEnv, name: &str) -> BTreeMap<String, String> {
    let secrets: Api<Secret> = env.api();
    let secret = secrets.get(&format!("{name}-app")).await.expect("the app Secret");
    secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect()
}

/// `psql conninfo -c sql` in the client pod: Ok(stdout) or Err(stderr).
fn psql_as(env: &TestEnv, conninfo: &str, sql: &str) -> Result<String, String> {
    let out = kubectl_in(env, &["exec", "client", "--", "psql", conninfo, "-XAtc", sql]);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

async fn wait_app_ready(env: &TestEnv, name: &str, timeout: Duration) -> Value {
    let api = POSTGRES.api(env);
    let (application, _) = wait_for(&format!("{name}: status.application.ready"), timeout, || {
        let api = api.clone();
        async move {
            let cr = get_cr(&api, name).await.ok_or("CR not found")?;
            let app = cr.pointer("/status/application").cloned().unwrap_or_default();
            if app["ready"] == true {
                Ok(app)
            } else {
                Err(app.to_string())
            }
        }
    })
    .await;
    application
}

/// Users and databases: the owner logs in to its database with the Secret's URI, over TLS
/// only; a plain connection and a replication connection from a pod that is not a member are
/// refused while the standbys stream; a new password in the Secret is taken up by the server
/// (the old one stops working), and a database dropped by hand is made again.
#[tokio::test]
async fn the_app_secret_connects_over_tls_only_and_replication_is_for_members_only() {
    let Some((env, op)) = enter_with_operator("rp-pgapp", "realpods-pgapp").await else {
        return;
    };
    let spec = json!({
        "bootstrap": { "database": "shop", "owner": "shop_owner" },
        "postgresql": { "tlsOnly": true },
    });
    let (primary, standbys, took) = make_cluster(&env, "pg", 2, spec).await;
    eprintln!("realpods-pg-app: TLS-only cluster replicating {took:.1?} after create: primary {primary}, standbys {standbys:?}");
    let application = wait_app_ready(&env, "pg", Duration::from_secs(120)).await;
    assert_eq!(application["database"], "shop");
    assert_eq!(application["owner"], "shop_owner");
    assert_eq!(application["secret"], "pg-app");

    // The Secret: everything an application needs, derived by the host from the password.
    let s = app_secret(&env, "pg").await;
    let ns = &env.namespace;
    let password = s["password"].clone();
    assert_eq!(password.len(), 24);
    assert_eq!(
        (s["username"].as_str(), s["dbname"].as_str(), s["host"].as_str(), s["port"].as_str()),
        ("shop_owner", "shop", "pg-rw", "5432")
    );
    assert_eq!(s["uri"], format!("postgresql://shop_owner:{password}@pg-rw.{ns}:5432/shop?sslmode=require"));
    assert_eq!(
        s["jdbc-uri"],
        format!("jdbc:postgresql://pg-rw.{ns}:5432/shop?password={password}&user=shop_owner&sslmode=require")
    );
    assert_eq!(s["pgpass"], format!("pg-rw:5432:shop:shop_owner:{password}\n"));

    // The URI works as given, over TLS, as the owner of its database.
    // A connection that times out (a CI run this loaded once made one wait past psql's bound)
    // is tried again, twice at most; any other answer is the one asserted.
    let ask = "select current_user, current_database(), ssl from pg_stat_ssl where pid = pg_backend_pid()";
    let mut who = psql_as(&env, &s["uri"], ask);
    for _ in 0..2 {
        if !matches!(&who, Err(e) if e.contains("timeout expired")) {
            break;
        }
        std::thread::sleep(Duration::from_secs(2));
        who = psql_as(&env, &s["uri"], ask);
    }
    assert_eq!(who.as_deref(), Ok("shop_owner|shop|t"));
    psql_as(&env, &s["uri"], "create table orders(id int primary key); insert into orders values (1)")
        .expect("the owner creates in its database");

    // Without TLS: refused by pg_hba.
    let plain = format!("host=pg-rw dbname=shop user=shop_owner password={password} sslmode=disable");
    let refused = psql_as(&env, &plain, "select 1").expect_err("a plain connection is refused");
    eprintln!("realpods-pg-app: plain connection: {refused}");
    assert!(
        refused.contains("pg_hba.conf rejects connection") && refused.contains("no encryption"),
        "{refused}"
    );

    // Replication from the client pod, with the right password and TLS: refused, it is not a
    // member; the standbys stream all the while.
    let credentials: Api<Secret> = env.api();
    let repl = credentials.get("pg-credentials").await.expect("credentials");
    let repl_password = repl
        .data
        .and_then(|d| d.get("replication-password").map(|v| String::from_utf8_lossy(&v.0).into_owned()))
        .expect("replication-password");
    let replication = format!(
        "host=pg-rw user=streaming_replica password={repl_password} replication=true sslmode=require dbname=replication"
    );
    let refused = psql_as(&env, &replication, "IDENTIFY_SYSTEM").expect_err("replication from a non-member");
    eprintln!("realpods-pg-app: replication from the client pod: {refused}");
    assert!(
        refused.contains("no pg_hba.conf entry for replication connection")
            && refused.contains("streaming_replica"),
        "{refused}"
    );
    let streaming =
        super::psql_in(&env, &primary, "select count(*) from pg_stat_replication where state = 'streaming'");
    assert_eq!(streaming, (standbys.len()).to_string(), "the members stream");

    // A new password, as a user rotating it would write it: the host rewrites the URIs, the
    // kubelet refreshes the pods' copy, the primary's check sets it; the old one stops working.
    let rotated = "Rotated9Password9Value9x";
    let started = Instant::now();
    kubectl_ok(
        &env,
        &[
            "patch",
            "secret",
            "pg-app",
            "--type=merge",
            "-p",
            &json!({ "stringData": { "password": rotated } }).to_string(),
        ],
    );
    let (uri, _) = wait_for("the URI rewritten with the new password", Duration::from_secs(60), || {
        let env = &env;
        async move {
            let s = app_secret(env, "pg").await;
            if s["uri"].contains(rotated) {
                Ok(s["uri"].clone())
            } else {
                Err(s["uri"].clone())
            }
        }
    })
    .await;
    let uri_took = started.elapsed();
    let (_, _) = wait_for("the new password logs in", Duration::from_secs(240), || {
        let env = &env;
        let uri = uri.clone();
        async move { psql_as(env, &uri, "select count(*) from orders") }
    })
    .await;
    let login_took = started.elapsed();
    eprintln!(
        "realpods-pg-app: password rotated: URI rewritten after {uri_took:.1?}, the new password logs in after {login_took:.1?}"
    );
    let old = format!("host=pg-rw dbname=shop user=shop_owner password={password} sslmode=require");
    let refused = psql_as(&env, &old, "select 1").expect_err("the old password no longer works");
    assert!(refused.contains("password authentication failed"), "{refused}");

    // A database dropped by hand is made again by the next check.
    client_sh(&env, "PGSSLMODE=require psql -h pg-rw -XAtqc 'drop database shop'");
    let dropped = Instant::now();
    wait_for("the database made again", Duration::from_secs(60), || {
        let env = &env;
        let uri = uri.clone();
        async move { psql_as(env, &uri, "select current_database()") }
    })
    .await;
    eprintln!("realpods-pg-app: a dropped database was made again after {:.1?}", dropped.elapsed());
    drop(op);
}
