//! One node: its StatefulSet's member set, container, probes and start command, and the two
//! children every node set shares beside the SDK's: the headless Service of the
//! master-eligible nodes (`discovery.seed_hosts`) and the bootstrap ConfigMap.
//!
//! **Formation.** `cluster.initial_master_nodes` (`initial_cluster_manager_nodes` on OpenSearch)
//! may only be given while the cluster forms for the first time: a node given it later with an
//! empty volume could bootstrap a second cluster of its own. So it is not in the configuration
//! file. The bootstrap ConfigMap lists the master-eligible nodes until the plugin has seen the
//! cluster answer (status `formation`), and is empty from then on; a node passes it to the
//! server only when its data directory holds no cluster state yet and the list is not empty.
//! The ConfigMap is mounted as a directory (the kubelet refreshes it) and is not part of the
//! configuration hash: emptying it rolls no pod.

use serde_json::{json, Value};
use stateward_sdk::builders::objects::Port;
use stateward_sdk::builders::statefulset::{
    env, env_from_secret, exec_probe, ContainerSpec, Identity, ResourceDefaults,
};
use stateward_sdk::builders::{Ctx, MemberSet};
use stateward_sdk::spec::parse_quantity;

use crate::config::TLS_SUBDIR;
use crate::spec::{distribution, node_sets, Distribution, NodeSet};

/// Pod label of the master-eligible nodes (the masters Service selects them).
pub const MASTER_LABEL: &str = "stateward.dev/master-eligible";
/// Where the bootstrap ConfigMap is mounted, and its one key.
const BOOTSTRAP_DIR: &str = "/etc/stateward-bootstrap";
pub const INITIAL_MASTERS_KEY: &str = "initial-masters";

/// The server's home directory in its image.
pub fn home(dist: Distribution) -> &'static str {
    match dist {
        Distribution::Elasticsearch => "/usr/share/elasticsearch",
        Distribution::OpenSearch => "/usr/share/opensearch",
    }
}

/// The configuration file the server reads from its configuration directory.
fn config_file(dist: Distribution) -> &'static str {
    match dist {
        Distribution::Elasticsearch => "elasticsearch.yml",
        Distribution::OpenSearch => "opensearch.yml",
    }
}

/// The image's entrypoint and the argument that makes it start the server with the `-E`
/// settings after it.
fn entrypoint(dist: Distribution) -> [&'static str; 2] {
    match dist {
        Distribution::Elasticsearch => ["/usr/local/bin/docker-entrypoint.sh", "eswrapper"],
        Distribution::OpenSearch => ["/usr/share/opensearch/opensearch-docker-entrypoint.sh", "opensearch"],
    }
}

/// `<name>-masters`: headless, publishing not-ready nodes too (they must find each other to
/// elect a master at all).
pub fn masters_service(ctx: &Ctx) -> String {
    format!("{}-masters", ctx.name())
}

/// `<name>-bootstrap`.
pub fn bootstrap_config_map(ctx: &Ctx) -> String {
    format!("{}-bootstrap", ctx.name())
}

/// The member set of a node set.
pub fn member_set(ns: &NodeSet) -> MemberSet {
    MemberSet {
        set: ns.name.clone(),
        replicas: ns.count,
        resources: ns.resources.clone(),
        storage_size: ns.storage_size.clone(),
        pod_labels: vec![(MASTER_LABEL.to_string(), ns.master().to_string())],
    }
}

/// The node set a member set was made from.
pub fn node_set(ctx: &Ctx, set: &MemberSet) -> NodeSet {
    node_sets(ctx.cluster).into_iter().find(|n| n.name == set.set).unwrap_or_else(|| NodeSet {
        name: set.set.clone(),
        count: set.replicas,
        roles: vec!["master".into(), "data".into(), "ingest".into()],
        resources: set.resources.clone(),
        storage_size: set.storage_size.clone(),
    })
}

/// The master-eligible pods the spec asks for, in order: the nodes that bootstrap the cluster.
pub fn master_pods(ctx: &Ctx) -> Vec<String> {
    node_sets(ctx.cluster)
        .iter()
        .filter(|s| s.master())
        .flat_map(|s| {
            let set = member_set(s);
            (0..s.count).map(move |i| set.pod(ctx, i))
        })
        .collect()
}

/// The masters Service and the bootstrap ConfigMap (`formed`: the cluster has answered once).
pub fn shared_children(ctx: &Ctx, formed: bool) -> Vec<Value> {
    let mut selector = ctx.service_selector();
    selector.insert(MASTER_LABEL.into(), json!("true"));
    let initial = if formed { String::new() } else { master_pods(ctx).join(",") };
    vec![
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": ctx.metadata(&masters_service(ctx)),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": true,
                "selector": selector,
                "ports": [{ "name": "transport", "port": 9300, "targetPort": "transport", "protocol": "TCP" }],
            }
        }),
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": ctx.metadata(&bootstrap_config_map(ctx)),
            "data": { INITIAL_MASTERS_KEY: initial },
        }),
    ]
}

/// The start command: the set's roles, and the bootstrap list on a first start only.
fn start_script(dist: Distribution, roles: &[String]) -> String {
    let roles: Vec<&str> =
        roles.iter().map(|r| if r == "master" { dist.master_role() } else { r.as_str() }).collect();
    let [entry, first] = entrypoint(dist);
    let data = format!("{}/data", home(dist));
    format!(
        "set -e\n\
         bootstrap=\n\
         if [ ! -d {data}/_state ] && [ ! -d {data}/nodes ] && [ -s {BOOTSTRAP_DIR}/{INITIAL_MASTERS_KEY} ]; then\n  \
           bootstrap=\"-E{setting}=$(cat {BOOTSTRAP_DIR}/{INITIAL_MASTERS_KEY})\"\n\
         fi\n\
         exec {entry} {first} -Enode.roles={roles} $bootstrap\n",
        setting = dist.initial_masters_setting(),
        roles = roles.join(","),
    )
}

/// Half the memory limit for the heap (the rest is the JVM's own and the page cache), within
/// 128 MiB and 31 GiB (above, the JVM loses compressed pointers).
pub fn heap_mb(limit: &str) -> u64 {
    // parse_quantity counts milli-units.
    let bytes = parse_quantity(limit).map_or(2 << 30, |milli| milli / 1000);
    ((bytes / 2) >> 20).clamp(128, 31 * 1024) as u64
}

/// The container of one node set.
pub fn container(ctx: &Ctx, set: &MemberSet, image: String, ports: &[Port]) -> ContainerSpec {
    let dist = distribution(&ctx.cluster.spec.raw);
    let ns = node_set(ctx, set);
    let home = home(dist);
    let defaults =
        ResourceDefaults { request_cpu: "500m", request_memory: "2Gi", limit_cpu: "2", limit_memory: "2Gi" };
    let limit = set.resources.limits.memory.clone().unwrap_or_else(|| defaults.limit_memory.to_string());
    let heap = heap_mb(&limit);
    let java_opts = format!("-Xms{heap}m -Xmx{heap}m");
    let mut envs = vec![
        json!({ "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "fieldPath": "metadata.namespace" } } }),
    ];
    let probe = match dist {
        Distribution::Elasticsearch => {
            envs.push(env_from_secret("ELASTIC_PASSWORD", &ctx.secret(), "password"));
            envs.push(env("ES_JAVA_OPTS", &java_opts));
            // Over TLS, verified against the operator's CA for the pod's own name under the
            // headless Service, as the elastic user.
            format!(
                "curl -fsS -o /dev/null --max-time 4 --cacert {home}/config/{TLS_SUBDIR}/ca.crt \
                 -u \"elastic:$ELASTIC_PASSWORD\" --connect-to ::127.0.0.1:9200 \
                 \"https://$HOSTNAME.{headless}.$POD_NAMESPACE.svc.cluster.local:9200/_cluster/health?local=true\"",
                headless = ctx.headless(),
            )
        }
        Distribution::OpenSearch => {
            envs.push(env("OPENSEARCH_JAVA_OPTS", &java_opts));
            "curl -fsS -o /dev/null --max-time 4 \"http://127.0.0.1:9200/_cluster/health?local=true\""
                .to_string()
        }
    };
    let mut mounts = vec![
        json!({
            "name": "config",
            "mountPath": format!("{home}/config/{}", config_file(dist)),
            "subPath": crate::CONFIG_FILE,
            "readOnly": true,
        }),
        json!({ "name": "bootstrap", "mountPath": BOOTSTRAP_DIR, "readOnly": true }),
    ];
    if dist == Distribution::Elasticsearch {
        // Elasticsearch reads key material only from inside its configuration directory.
        mounts.push(
            json!({ "name": "tls", "mountPath": format!("{home}/config/{TLS_SUBDIR}"), "readOnly": true }),
        );
    }
    ContainerSpec {
        image,
        command: vec!["sh".into(), "-c".into(), start_script(dist, &ns.roles)],
        args: Vec::new(),
        env: envs,
        ports: ports.to_vec(),
        readiness: exec_probe(&probe, 10, 5, 5, 3),
        liveness: exec_probe(&probe, 10, 20, 10, 6),
        // A JVM on a busy node may take minutes to start: liveness waits for the first answer.
        startup: Some(exec_probe(&probe, 10, 5, 5, 60)),
        data_mount: match dist {
            Distribution::Elasticsearch => "/usr/share/elasticsearch/data",
            Distribution::OpenSearch => "/usr/share/opensearch/data",
        },
        extra_mounts: mounts,
        extra_volumes: vec![json!({
            "name": "bootstrap",
            "configMap": { "name": bootstrap_config_map(ctx), "optional": true },
        })],
        identity: Identity { uid: 1000, gid: 1000 },
        defaults,
        termination_grace_seconds: 120,
        // Nodes discover each other and elect a master together: start them all at once.
        parallel: true,
        // One node at a time, behind green, masters last (see `roll`).
        rolled_by_plugin: true,
        pre_stop: None,
    }
}
