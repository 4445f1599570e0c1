//! The StatefulSet: pods, probes, resources, security context, spread and volumes.

use serde_json::{json, Value};

use super::objects::Port;
use super::{
    Ctx, MemberSet, CONFIG_DIR, CONFIG_HASH_ANNOTATION, DATA_VOLUME, SET_LABEL, TEMPLATE_HASH_ANNOTATION,
    TLS_DIR,
};
use crate::json::{fnv1a, to_text};
use crate::spec::{parse_quantity, ResourceList, Resources, RESTARTED_AT_ANNOTATION};

/// Resources used when the spec leaves them out: limits are always set (policy requires them).
#[derive(Debug, Clone, Copy)]
pub struct ResourceDefaults {
    pub request_cpu: &'static str,
    pub request_memory: &'static str,
    pub limit_cpu: &'static str,
    pub limit_memory: &'static str,
}

/// The fixed non-root identity the service image runs as.
#[derive(Debug, Clone, Copy)]
pub struct Identity {
    pub uid: i64,
    pub gid: i64,
}

/// Everything service-specific about the single container.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub env: Vec<Value>,
    pub ports: Vec<Port>,
    pub readiness: Value,
    pub liveness: Value,
    /// Holds liveness (and readiness) back until it first succeeds: first starts (initdb,
    /// recovery) may take long on a loaded node without being killed for it.
    pub startup: Option<Value>,
    /// Where the data volume is mounted.
    pub data_mount: &'static str,
    /// Further mounts, e.g. one configuration file mounted where the image expects it.
    pub extra_mounts: Vec<Value>,
    /// Further pod volumes those mounts use (e.g. an in-memory emptyDir for runtime files).
    pub extra_volumes: Vec<Value>,
    pub identity: Identity,
    pub defaults: ResourceDefaults,
    /// Seconds a member gets to shut down cleanly.
    pub termination_grace_seconds: i64,
    /// Start members in parallel (clustered services that discover each other) or in order.
    pub parallel: bool,
    /// The plugin replaces outdated pods itself, in an order only it knows (e.g. standbys
    /// before their primary), by deleting them: `updateStrategy: OnDelete`. Otherwise the
    /// StatefulSet controller rolls them, highest ordinal first.
    pub rolled_by_plugin: bool,
    /// A command run in the container before it is asked to stop (`lifecycle.preStop`), e.g.
    /// the server's own fast, clean shutdown.
    pub pre_stop: Option<Vec<String>>,
}

/// The shortest `timeoutSeconds` of an exec probe. The kubelet counts the whole exec (a new
/// process in the container, the client's connection, its answer) against it, and on a busy
/// node 1 s timeouts failed healthy members; [`exec_probe`] never goes below this.
pub const MIN_EXEC_PROBE_TIMEOUT: i64 = 5;

/// A probe running a command inside the container (checks the service itself, not a port).
/// `timeout` is raised to [`MIN_EXEC_PROBE_TIMEOUT`] if lower.
pub fn exec_probe(script: &str, initial_delay: i64, period: i64, timeout: i64, failures: i64) -> Value {
    json!({
        "exec": { "command": ["sh", "-c", script] },
        "initialDelaySeconds": initial_delay,
        "periodSeconds": period,
        "timeoutSeconds": timeout.max(MIN_EXEC_PROBE_TIMEOUT),
        "failureThreshold": failures,
    })
}

/// A probe asking the service's own HTTP endpoint (e.g. a health API) on a named port.
pub fn http_probe(
    path: &str,
    port: &str,
    initial_delay: i64,
    period: i64,
    timeout: i64,
    failures: i64,
) -> Value {
    json!({
        "httpGet": { "path": path, "port": port, "scheme": "HTTP" },
        "initialDelaySeconds": initial_delay,
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    })
}

/// An environment variable with a literal value.
pub fn env(name: &str, value: &str) -> Value {
    json!({ "name": name, "value": value })
}

/// An environment variable read from a Secret key.
pub fn env_from_secret(name: &str, secret: &str, key: &str) -> Value {
    json!({ "name": name, "valueFrom": { "secretKeyRef": { "name": secret, "key": key } } })
}

/// Requests and limits, spec first, then defaults; a request never exceeds its limit.
pub fn resources(spec: &Resources, d: &ResourceDefaults) -> Value {
    let pick = |l: &ResourceList, r: &ResourceList, cpu: bool| -> (String, String) {
        let (lim_user, req_user) = if cpu { (&l.cpu, &r.cpu) } else { (&l.memory, &r.memory) };
        let (lim_def, req_def) =
            if cpu { (d.limit_cpu, d.request_cpu) } else { (d.limit_memory, d.request_memory) };
        let limit = match (lim_user, req_user) {
            (Some(l), _) => l.clone(),
            (None, Some(r)) if larger(r, lim_def) => r.clone(),
            _ => lim_def.to_string(),
        };
        let request = match req_user {
            Some(r) => r.clone(),
            None if larger(req_def, &limit) => limit.clone(),
            None => req_def.to_string(),
        };
        (request, limit)
    };
    let (req_cpu, lim_cpu) = pick(&spec.limits, &spec.requests, true);
    let (req_mem, lim_mem) = pick(&spec.limits, &spec.requests, false);
    json!({
        "requests": { "cpu": req_cpu, "memory": req_mem },
        "limits": { "cpu": lim_cpu, "memory": lim_mem },
    })
}

fn larger(a: &str, b: &str) -> bool {
    match (parse_quantity(a), parse_quantity(b)) {
        (Some(a), Some(b)) => a > b,
        _ => false,
    }
}

fn spread(ctx: &Ctx, key: &str) -> Value {
    json!({
        "maxSkew": 1,
        "topologyKey": key,
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": { "matchLabels": ctx.selector() },
    })
}

/// Builds the StatefulSet; `config_hash` goes into a pod-template annotation so a new
/// configuration rolls the pods.
/// `claim_size` is the data claim template's size: the spec's for a new StatefulSet, the one it
/// was created with for an existing one (the template cannot change; see `volumes`).
/// The pod template's annotations: the configuration hash and, when a restart was asked, its
/// value (a new value changes the template, so the pods roll as for any template change).
fn template_annotations(ctx: &Ctx, config_hash: &str) -> Value {
    let mut annotations = json!({ CONFIG_HASH_ANNOTATION: config_hash });
    if let Some(at) = &ctx.cluster.restarted_at {
        annotations[RESTARTED_AT_ANNOTATION] = json!(at);
    }
    annotations
}

pub fn stateful_set(
    ctx: &Ctx,
    set: &MemberSet,
    c: &ContainerSpec,
    config_hash: &str,
    claim_size: &str,
) -> Value {
    let spec = &ctx.cluster.spec;
    let container_ports: Vec<Value> = c
        .ports
        .iter()
        .map(|p| json!({ "name": p.name, "containerPort": p.port, "protocol": "TCP" }))
        .collect();
    let mut container = json!({
        "name": ctx.service,
        "image": c.image,
        "imagePullPolicy": "IfNotPresent",
        "env": c.env,
        "ports": container_ports,
        "resources": resources(&set.resources, &c.defaults),
        "readinessProbe": c.readiness,
        "livenessProbe": c.liveness,
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": c.identity.uid,
            "runAsGroup": c.identity.gid,
            "allowPrivilegeEscalation": false,
            "privileged": false,
            "capabilities": { "drop": ["ALL"] },
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "volumeMounts": [
            { "name": DATA_VOLUME, "mountPath": c.data_mount },
            { "name": "config", "mountPath": CONFIG_DIR, "readOnly": true },
            { "name": "tls", "mountPath": TLS_DIR, "readOnly": true },
        ],
    });
    if let Some(obj) = container.as_object_mut() {
        if !c.command.is_empty() {
            obj.insert("command".into(), json!(c.command));
        }
        if !c.args.is_empty() {
            obj.insert("args".into(), json!(c.args));
        }
        if let Some(Value::Array(mounts)) = obj.get_mut("volumeMounts") {
            mounts.extend(c.extra_mounts.iter().cloned());
        }
        if let Some(probe) = &c.startup {
            obj.insert("startupProbe".into(), probe.clone());
        }
        if let Some(command) = &c.pre_stop {
            obj.insert("lifecycle".into(), json!({ "preStop": { "exec": { "command": command } } }));
        }
    }
    let mut pod_spec = json!({
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": c.identity.uid,
            "runAsGroup": c.identity.gid,
            "fsGroup": c.identity.gid,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
        "terminationGracePeriodSeconds": c.termination_grace_seconds,
        "topologySpreadConstraints": [
            spread(ctx, "topology.kubernetes.io/zone"),
            spread(ctx, "kubernetes.io/hostname"),
        ],
        "containers": [container],
        "volumes": [
            { "name": "config", "configMap": { "name": ctx.config_map() } },
            // 0440: readable by the pod's group (fsGroup) only, as PostgreSQL requires of a
            // root-owned key.
            { "name": "tls", "secret": { "secretName": ctx.tls_secret(), "defaultMode": 0o440 } },
        ],
    });
    if let Some(obj) = pod_spec.as_object_mut() {
        if let Some(Value::Array(volumes)) = obj.get_mut("volumes") {
            volumes.extend(c.extra_volumes.iter().cloned());
        }
        spec.scheduling.apply_to(obj);
    }
    let mut claim_spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": { "requests": { "storage": claim_size } },
    });
    if let (Some(class), Some(obj)) = (&spec.storage.class_name, claim_spec.as_object_mut()) {
        obj.insert("storageClassName".into(), json!(class));
    }
    let mut pod_labels = ctx.labels();
    let mut claim_labels = ctx.stable_labels();
    if !set.set.is_empty() {
        pod_labels.insert(SET_LABEL.into(), json!(set.set));
        claim_labels.insert(SET_LABEL.into(), json!(set.set));
    }
    for (k, v) in &set.pod_labels {
        pod_labels.insert(k.clone(), json!(v));
    }
    let template = json!({
        "metadata": {
            "labels": pod_labels,
            "annotations": template_annotations(ctx, config_hash),
        },
        "spec": pod_spec,
    });
    let mut metadata = ctx.metadata(&set.statefulset(ctx));
    metadata["annotations"] = json!({ TEMPLATE_HASH_ANNOTATION: fnv1a(to_text(&template).as_bytes()) });
    json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata,
        "spec": {
            "replicas": set.replicas,
            "serviceName": ctx.headless(),
            "podManagementPolicy": if c.parallel { "Parallel" } else { "OrderedReady" },
            // rollingUpdate spelled out: with `type` alone the API server leaves it unset, and
            // the StatefulSet controller then recreates a pod deleted mid-roll whose ordinal is
            // below status.currentReplicas at the *old* revision (pod 0, last in the roll, is
            // restarted twice).
            "updateStrategy": if c.rolled_by_plugin {
                json!({ "type": "OnDelete" })
            } else {
                json!({ "type": "RollingUpdate", "rollingUpdate": { "partition": 0 } })
            },
            "selector": { "matchLabels": set.selector(ctx) },
            // Claims outlive the StatefulSet always: deleting it (by hand, or while the
            // operator is down) must never take data with it. retentionPolicy: Delete is
            // carried out by finalize, which deletes the claims when the cluster is deleted.
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Retain",
                "whenScaled": "Retain",
            },
            "template": template,
            "volumeClaimTemplates": [{
                "metadata": { "name": DATA_VOLUME, "labels": claim_labels },
                "spec": claim_spec,
            }],
        }
    })
}
