//! The generic plugin: a service describes itself as a [`Blueprint`], and every [`Blueprint`]
//! is a [`Service`] through the functions here (info, validate, reconcile, finalize, convert).

use serde_json::{json, Map, Value};

use crate::builders::objects::{self, Port};
use crate::builders::statefulset::{self, ContainerSpec};
use crate::builders::volumes;
use crate::builders::{Ctx, DATA_VOLUME, INSTANCE_LABEL};
use crate::json::{fnv1a, str_at, to_text};
use crate::params::{check_parameters, ParamRule};
use crate::spec::{parse_cluster, parse_object, parse_quantity, version_numbers, Cluster, Retention};
use crate::status::{derive, find_child, invalid_spec, paused, phase_event, was_paused, Derived};
use crate::types::*;
use crate::{schema, Service};

/// The child kinds every stateward plugin may emit or act on (Pods: observed, labelled and
/// asked things; never applied).
pub const OWNS: [(&str, &str); 7] = [
    ("apps/v1", "StatefulSet"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "Secret"),
    ("policy/v1", "PodDisruptionBudget"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "Pod"),
];

/// Annotation asking for a switchover to the named member pod (services with a primary).
pub const SWITCHOVER_ANNOTATION: &str = "stateward.dev/switchover-to";

/// A client Service besides the headless one.
#[derive(Debug, Clone)]
pub struct ClientService {
    /// Appended to the CR name ("" for the bare name).
    pub suffix: &'static str,
    /// Which ready members it sends clients to.
    pub members: Members,
}

/// The members a client Service selects (always among the ready ones: the endpoints
/// controller leaves out a pod that is not Ready).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Members {
    /// Every member.
    All,
    /// Pod 0 only.
    First,
    /// The members carrying this label with this value, e.g. a role label the plugin sets
    /// on its pods (`label-pod`) from what the running servers say.
    Labelled(&'static str, &'static str),
}

/// What a service plugin describes; the SDK turns it into a full [`Service`].
pub trait Blueprint {
    /// Plugin name and `app.kubernetes.io/name`, e.g. "postgres".
    const NAME: &'static str;
    /// Plugin semver.
    const VERSION: &'static str;
    /// CR kind, plural and short name.
    const KIND: &'static str;
    /// See [`Blueprint::KIND`].
    const PLURAL: &'static str;
    /// See [`Blueprint::KIND`].
    const SHORT: &'static str;
    /// `app.kubernetes.io/component`.
    const COMPONENT: &'static str;
    /// Key of the generated configuration in the ConfigMap (mounted under /etc/stateward).
    const CONFIG_FILE: &'static str;
    /// Ports the service listens on.
    const PORTS: &'static [Port];
    /// Credential keys and their random byte counts.
    const SECRET_KEYS: &'static [(&'static str, u32)];
    /// Allowed `spec.parameters`.
    const PARAMETERS: &'static [ParamRule];
    /// Parameters the operator manages itself (refused with a clear message).
    const FORBIDDEN: &'static [&'static str];

    /// Why this service has no primary to switch over to, when it has none: a
    /// `stateward.dev/switchover-to` annotation is then refused with this reason.
    const NO_PRIMARY: Option<&'static str> = None;

    /// The image for `spec.version` when `spec.image` is not set.
    fn default_image(version: &str) -> String;
    /// The generated server configuration.
    fn config(ctx: &Ctx) -> String;
    /// Further files of the ConfigMap beside [`Blueprint::CONFIG_FILE`] (e.g. a start script),
    /// mounted with it under /etc/stateward; a change to any of them rolls the pods.
    fn extra_files(_ctx: &Ctx) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// The container: command, env, probes, identity, defaults.
    fn container(ctx: &Ctx, image: String) -> ContainerSpec;
    /// Client Services.
    fn client_services() -> Vec<ClientService>;
    /// Service-specific `.status` fields (e.g. currentPrimary).
    fn status_extra(ctx: &Ctx, derived: &Derived) -> Map<String, Value>;
    /// Schema of [`Blueprint::status_extra`]'s fields.
    fn status_extra_schema() -> Map<String, Value>;
    /// Service-specific `spec` fields, added to the CRD schema of both versions (conversion
    /// carries them unchanged). Checked by [`Blueprint::validate_spec`].
    fn spec_extra_schema() -> Map<String, Value> {
        Map::new()
    }
    /// Checks of the service-specific `spec` fields (on create and update, and in reconcile,
    /// which refuses a spec that fails them); `spec` is the whole `spec` object.
    fn validate_spec(_spec: &Value, _cluster: &Cluster) -> Vec<FieldError> {
        Vec::new()
    }
    /// What the plugin asks of its running service and reads from the answers (WIT 0.2
    /// requests): polls, status fields, health conditions and events. Asks nothing by default.
    fn live(_ctx: &Ctx, _input: &crate::live::LiveInput) -> crate::live::Live {
        crate::live::Live::default()
    }
    /// Service-specific update rules (e.g. scale-down limits).
    fn validate_update(_new: &Cluster, _old: &Cluster) -> Vec<FieldError> {
        Vec::new()
    }
    /// Checks of a change to the service-specific spec fields (both specs as JSON, e.g. a
    /// field fixed at creation).
    fn validate_spec_update(_new_spec: &Value, _old_spec: &Value) -> Vec<FieldError> {
        Vec::new()
    }
    /// Further Secrets the host keeps for the instance beside the credentials (e.g. an
    /// application user's, with derived connection keys), made before the pods that may mount
    /// them; deleted with the data under `retentionPolicy: Delete`.
    fn extra_secrets(_ctx: &Ctx) -> Vec<SecretRequest> {
        Vec::new()
    }
}

impl<B: Blueprint> Service for B {
    fn info() -> PluginInfo {
        PluginInfo {
            name: B::NAME.into(),
            version: B::VERSION.into(),
            kinds: vec![schema::kind_info(
                B::KIND,
                B::PLURAL,
                B::SHORT,
                &B::spec_extra_schema(),
                &B::status_extra_schema(),
            )],
            owns: OWNS
                .iter()
                .map(|(a, k)| ChildKind { api_version: (*a).into(), kind: (*k).into() })
                .collect(),
        }
    }

    fn validate(new: &str, old: Option<&str>) -> Vec<FieldError> {
        validate::<B>(new, old)
    }

    fn reconcile(input: Observed) -> Result<Plan, String> {
        reconcile::<B>(&input)
    }

    fn finalize(input: Observed) -> Result<Cleanup, String> {
        finalize::<B>(&input)
    }

    fn convert(object: &str, to_version: &str) -> Result<String, String> {
        crate::convert::convert(object, to_version)
    }
}

fn check_kind<B: Blueprint>(obj: &Value) -> Result<(), FieldError> {
    match str_at(obj, &["kind"]) {
        Some(k) if k == B::KIND => Ok(()),
        Some(k) => Err(FieldError::new("kind", format!("{k:?} is not {}", B::KIND))),
        None => Err(FieldError::new("kind", "is required")),
    }
}

fn parse<B: Blueprint>(text: &str) -> Result<Cluster, Vec<FieldError>> {
    let obj = parse_object(text).map_err(|e| vec![e])?;
    parse_value::<B>(&obj)
}

fn parse_value<B: Blueprint>(obj: &Value) -> Result<Cluster, Vec<FieldError>> {
    check_kind::<B>(obj).map_err(|e| vec![e])?;
    // Parameter errors are reported alongside any other field error.
    let params: std::collections::BTreeMap<String, String> = obj
        .get("spec")
        .and_then(|s| s.get("parameters"))
        .and_then(Value::as_object)
        .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default();
    let mut errs = check_parameters(&params, B::PARAMETERS, B::FORBIDDEN);
    if let Some(reason) = B::NO_PRIMARY {
        if obj.pointer("/metadata/annotations").and_then(|a| a.get(SWITCHOVER_ANNOTATION)).is_some() {
            errs.push(FieldError::new(format!("metadata.annotations[{SWITCHOVER_ANNOTATION}]"), reason));
        }
    }
    match parse_cluster(obj) {
        Ok(cluster) => {
            errs.extend(B::validate_spec(obj.get("spec").unwrap_or(&Value::Null), &cluster));
            if errs.is_empty() {
                Ok(cluster)
            } else {
                Err(errs)
            }
        }
        Err(mut more) => {
            more.append(&mut errs);
            Err(more)
        }
    }
}

/// Semantic checks: spec shape, parameters, and on update the transitions that are unsafe.
pub fn validate<B: Blueprint>(new_text: &str, old_text: Option<&str>) -> Vec<FieldError> {
    let new = match parse::<B>(new_text) {
        Ok(c) => c,
        Err(errs) => return errs,
    };
    // An old object that no longer parses (e.g. written by an older plugin) allows any fix.
    let Some(Ok(old)) = old_text.map(parse::<B>) else { return Vec::new() };
    let mut errs = Vec::new();
    let spec_of =
        |text: &str| parse_object(text).ok().and_then(|o| o.get("spec").cloned()).unwrap_or_default();
    if let Some(old_text) = old_text {
        errs.extend(B::validate_spec_update(&spec_of(new_text), &spec_of(old_text)));
    }
    if new.spec.storage.class_name != old.spec.storage.class_name {
        errs.push(FieldError::new("spec.storage.className", "is immutable"));
    }
    if let (Some(n), Some(o)) =
        (parse_quantity(&new.spec.storage.size), parse_quantity(&old.spec.storage.size))
    {
        if n < o {
            errs.push(FieldError::new(
                "spec.storage.size",
                format!(
                    "cannot shrink from {} to {}: volumes only grow",
                    old.spec.storage.size, new.spec.storage.size
                ),
            ));
        }
    }
    let (nv, ov) = (version_numbers(&new.spec.version), version_numbers(&old.spec.version));
    if nv.first() < ov.first() {
        errs.push(FieldError::new(
            "spec.version",
            format!("downgrade from {} to {} crosses a major version", old.spec.version, new.spec.version),
        ));
    }
    errs.extend(B::validate_update(&new, &old));
    errs
}

fn ctx<B: Blueprint>(cluster: &Cluster) -> Ctx<'_> {
    Ctx { cluster, service: B::NAME, component: B::COMPONENT }
}

/// Just enough of a child to decide whether it matters.
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    metadata: Option<HeadMeta<'a>>,
}

#[derive(serde::Deserialize)]
struct HeadMeta<'a> {
    #[serde(borrow, default)]
    name: Option<std::borrow::Cow<'a, str>>,
}

/// Parses the children of the `wanted` kinds; every child is still checked to be JSON, but
/// the others are only scanned, not built (most of the input is children we do not read).
fn parse_children(children: &[String], wanted: &[&str]) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    for (i, c) in children.iter().enumerate() {
        let head: Head = serde_json::from_str(c).map_err(|e| format!("child {i} is not JSON: {e}"))?;
        let named = head.metadata.as_ref().and_then(|m| m.name.as_deref()).is_some();
        let keep = named && head.kind.as_deref().is_some_and(|k| wanted.contains(&k));
        if keep {
            out.push(serde_json::from_str(c).map_err(|e| format!("child {i} is not JSON: {e}"))?);
        }
    }
    Ok(out)
}

/// The desired children of a cluster, in apply order (config before the pods that mount it).
/// `claim_size`: the data claim template size of the existing StatefulSet, if there is one.
pub fn desired<B: Blueprint>(ctx: &Ctx, claim_size: Option<&str>) -> (Vec<Action>, String) {
    let mut files = vec![(B::CONFIG_FILE, B::config(ctx))];
    files.extend(B::extra_files(ctx));
    let image = ctx.cluster.spec.image.clone().unwrap_or_else(|| B::default_image(&ctx.cluster.spec.version));
    let container = B::container(ctx, image.clone());
    // With one file this is the hash earlier versions computed, so their pods do not roll.
    let hashed: Vec<String> = files.iter().map(|(name, text)| format!("{name}\n{text}")).collect();
    let hash = fnv1a(hashed.join("\n").as_bytes());
    let files: Vec<(&str, &str)> = files.iter().map(|(name, text)| (*name, text.as_str())).collect();
    let mut actions = vec![
        Action::EnsureSecret(objects::credentials(ctx, B::SECRET_KEYS)),
        Action::EnsureSecret(objects::server_certificate(ctx)),
    ];
    actions.extend(B::extra_secrets(ctx).into_iter().map(Action::EnsureSecret));
    actions.extend([
        Action::Apply(to_text(&objects::config_map(ctx, &files))),
        Action::Apply(to_text(&objects::headless_service(ctx, B::PORTS))),
    ]);
    for svc in B::client_services() {
        let name = if svc.suffix.is_empty() {
            ctx.name().to_string()
        } else {
            format!("{}-{}", ctx.name(), svc.suffix)
        };
        let extra = match svc.members {
            Members::All => vec![],
            Members::First => vec![(objects::POD_NAME_LABEL, ctx.pod(0))],
            Members::Labelled(key, value) => vec![(key, value.to_string())],
        };
        actions.push(Action::Apply(to_text(&objects::client_service(ctx, &name, B::PORTS, &extra))));
    }
    actions.push(Action::Apply(to_text(&objects::pod_disruption_budget(ctx))));
    let claim_size = claim_size.unwrap_or(&ctx.cluster.spec.storage.size);
    actions.push(Action::Apply(to_text(&statefulset::stateful_set(ctx, &container, &hash, claim_size))));
    (actions, image)
}

fn report<B: Blueprint>(ctx: Option<&Ctx>, d: &Derived) -> StatusReport {
    let mut extra = Map::new();
    extra.insert("readyReplicas".into(), json!(d.ready_replicas));
    extra.insert("plugin".into(), json!(format!("{}@{}", B::NAME, B::VERSION)));
    if let Some(ctx) = ctx {
        extra.extend(B::status_extra(ctx, d));
    }
    StatusReport { phase: d.phase, conditions: d.conditions.clone(), extra: to_text(&Value::Object(extra)) }
}

/// Observed state in, plan out. An unusable spec is not an error of the plugin: it yields an
/// empty plan with phase Failed and Degraded/InvalidSpec naming the fields.
pub fn reconcile<B: Blueprint>(input: &Observed) -> Result<Plan, String> {
    let obj = parse_object(&input.resource).map_err(|e| format!("resource: {}", e.message))?;
    check_kind::<B>(&obj).map_err(|e| format!("resource: {}: {}", e.path, e.message))?;
    let children =
        parse_children(&input.children, &["StatefulSet", "PersistentVolumeClaim", "Pod", "Service"])?;
    let last_phase = str_at(&obj, &["status", "phase"]);
    let cluster = match parse_value::<B>(&obj) {
        Ok(c) => c,
        Err(errs) => {
            let msg =
                errs.iter().map(|e| format!("{}: {}", e.path, e.message)).collect::<Vec<_>>().join("; ");
            crate::log(
                Level::Warn,
                &format!(
                    "{} {}: invalid spec: {msg}",
                    B::KIND,
                    str_at(&obj, &["metadata", "name"]).unwrap_or("?")
                ),
            );
            let d = invalid_spec(msg);
            return Ok(Plan {
                actions: Vec::new(),
                status: report::<B>(None, &d),
                events: phase_event(last_phase, d.phase).into_iter().collect(),
                requeue_after_ms: None,
            });
        }
    };
    if cluster.spec.paused && !cluster.deleting {
        return Ok(paused_plan(&obj));
    }
    let ctx = ctx::<B>(&cluster);
    let sts = find_child(&children, "StatefulSet", ctx.name());
    let template = sts.and_then(volumes::template_size);
    // The running service first: what it adds before the pods goes in ahead of the StatefulSet.
    let live = B::live(
        &ctx,
        &crate::live::LiveInput {
            pods: crate::live::pods(&children),
            services: crate::live::services(&children),
            update_revision: crate::live::update_revision(&children, ctx.name()),
            responses: &input.responses,
            status: obj.get("status"),
            resource: &obj,
            now_ms: input.now_ms,
        },
    );
    // A member the plugin must move off first keeps the StatefulSet from shrinking yet; the
    // status still reports the spec's count (the phase stays Scaling meanwhile).
    let held = live.hold_replicas.filter(|h| *h > cluster.spec.replicas).map(|h| {
        let mut c = cluster.clone();
        c.spec.replicas = h;
        c
    });
    let (mut actions, image) = match &held {
        Some(c) => desired::<B>(&self::ctx::<B>(c), template.as_deref()),
        None => desired::<B>(&ctx, template.as_deref()),
    };
    let at =
        actions.iter().rposition(|a| matches!(a, Action::Apply(t) if t.contains("\"kind\":\"StatefulSet\"")));
    let at = at.unwrap_or(actions.len());
    actions.splice(at..at, live.before_pods);
    let grown = volumes::grow_claims(&ctx, &children);
    let mut d = derive(&cluster, sts, &image);
    // A running cluster whose volumes are still growing is progressing, not converged.
    if let (Phase::Running, Some(message)) = (d.phase, volumes::resizing(&ctx, &children)) {
        if let Some(c) = d.conditions.iter_mut().find(|c| c.type_ == "Progressing") {
            *c = Condition {
                type_: "Progressing".into(),
                status: ConditionStatus::True,
                reason: "ResizingVolumes".into(),
                message,
            };
        }
    }
    let mut events: Vec<Event> = phase_event(cluster.last_phase.as_deref(), d.phase).into_iter().collect();
    if was_paused(obj.get("status")) {
        events.push(Event {
            type_: EventType::Normal,
            reason: "Resumed".into(),
            message: "spec.paused is false: changes are applied again".into(),
        });
    }
    if !grown.is_empty() {
        events.push(Event {
            type_: EventType::Normal,
            reason: "GrowingVolumes".into(),
            message: format!("raising {} data claim(s) to {}", grown.len(), cluster.spec.storage.size),
        });
    }
    actions.extend(grown.iter().map(|claim| Action::Apply(to_text(claim))));
    actions.extend(live.actions);
    events.extend(live.events);
    let mut status = report::<B>(Some(&ctx), &d);
    if !live.status.is_empty() || !live.conditions.is_empty() {
        let mut extra: Map<String, Value> = serde_json::from_str(&status.extra).unwrap_or_default();
        extra.extend(live.status);
        status.extra = to_text(&Value::Object(extra));
        status.conditions.retain(|c| !live.conditions.iter().any(|l| l.type_ == c.type_));
        status.conditions.extend(live.conditions);
    }
    let requeue_after_ms = match (d.requeue_after_ms, live.requeue_after_ms) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(Plan { actions, status, events, requeue_after_ms })
}

/// `spec.paused`: no action at all, not even a request to the running service (a request may
/// write); the status stays as last written, with `Paused=True`.
fn paused_plan(obj: &Value) -> Plan {
    let (phase, conditions, extra) = paused(obj.get("status"));
    let events = if was_paused(obj.get("status")) {
        Vec::new()
    } else {
        vec![Event {
            type_: EventType::Normal,
            reason: "Paused".into(),
            message: "spec.paused is true: the operator changes nothing until it is false".into(),
        }]
    };
    Plan {
        actions: Vec::new(),
        status: StatusReport { phase, conditions, extra: to_text(&Value::Object(extra)) },
        events,
        requeue_after_ms: None,
    }
}

/// Cleanup on delete. Retain: done at once, the volumes stay. Delete: delete the StatefulSet
/// (its pods hold the claims) and every data claim of this cluster; done when none is left.
pub fn finalize<B: Blueprint>(input: &Observed) -> Result<Cleanup, String> {
    let obj = parse_object(&input.resource).map_err(|e| format!("resource: {}", e.message))?;
    let children = parse_children(&input.children, &["StatefulSet", "PersistentVolumeClaim", "Secret"])?;
    let name = str_at(&obj, &["metadata", "name"]).ok_or("resource: metadata.name is missing")?;
    let retention = match str_at(&obj, &["spec", "retentionPolicy"]) {
        Some("Delete") => Retention::Delete,
        _ => Retention::Retain,
    };
    if retention == Retention::Retain {
        return Ok(Cleanup {
            actions: Vec::new(),
            events: vec![Event {
                type_: EventType::Normal,
                reason: "VolumesRetained".into(),
                message: "retentionPolicy is Retain: the data volumes are kept".into(),
            }],
            done: true,
        });
    }
    let claim_prefix = format!("{DATA_VOLUME}-{name}-");
    // The credentials outlive a Retain delete (a new resource of the same name reuses them
    // with its volumes); with Delete they go with the data.
    let mut secrets = vec![format!("{name}-credentials"), format!("{name}-tls")];
    if let Ok(cluster) = parse_value::<B>(&obj) {
        secrets.extend(B::extra_secrets(&ctx::<B>(&cluster)).into_iter().map(|s| s.name));
    }
    let mut actions = Vec::new();
    for child in &children {
        let kind = str_at(child, &["kind"]).unwrap_or_default();
        let child_name = str_at(child, &["metadata", "name"]).unwrap_or_default();
        let ours = str_at(child, &["metadata", "labels", INSTANCE_LABEL]) == Some(name);
        let target = match kind {
            "StatefulSet" if child_name == name => Some("apps/v1"),
            "PersistentVolumeClaim" if ours && child_name.starts_with(&claim_prefix) => Some("v1"),
            "Secret" if ours && secrets.iter().any(|s| s == child_name) => Some("v1"),
            _ => None,
        };
        if let Some(api_version) = target {
            actions.push(Action::Delete(ObjectRef {
                api_version: api_version.into(),
                kind: kind.into(),
                name: child_name.into(),
            }));
        }
    }
    let done = actions.is_empty();
    let events = if done {
        Vec::new()
    } else {
        vec![Event {
            type_: EventType::Normal,
            reason: "DeletingVolumes".into(),
            message: format!("retentionPolicy is Delete: deleting {} object(s)", actions.len()),
        }]
    };
    Ok(Cleanup { actions, events, done })
}
