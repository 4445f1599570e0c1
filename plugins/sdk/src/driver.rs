//! The generic plugin: a service describes itself as a [`Blueprint`], and every [`Blueprint`]
//! is a [`Service`] through the functions here (info, validate, reconcile, finalize, convert).

use serde_json::{json, Map, Value};

use crate::builders::objects::{self, Port};
use crate::builders::statefulset::{self, ContainerSpec};
use crate::builders::volumes;
use crate::builders::{Ctx, MemberSet, DATA_VOLUME, INSTANCE_LABEL, TEMPLATE_HASH_ANNOTATION};
use crate::json::{fnv1a, str_at, to_text};
use crate::params::{check_parameters, ParamRule};
use crate::spec::{
    parse_cluster, parse_object, parse_quantity, version_numbers, Cluster, Retention, MAX_REPLICAS,
    MIN_REPLICAS,
};
use crate::status::{
    combine, cond, condition_status, derive, find_child, invalid_spec, kept_fields, paused, phase_event,
    was_paused, Derived, HIBERNATED_CONDITION, REQUEUE_PROGRESSING_MS,
};
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
    /// Credential keys the host fills from a template (see `SecretRequest::derived`), e.g. a
    /// fixed user name requests authenticate with.
    const SECRET_DERIVED: &'static [(&'static str, &'static str)] = &[];
    /// Allowed `spec.parameters`.
    const PARAMETERS: &'static [ParamRule];
    /// Parameters the operator manages itself (refused with a clear message).
    const FORBIDDEN: &'static [&'static str];

    /// Why this service has no primary to switch over to, when it has none: a
    /// `stateward.dev/switchover-to` annotation is then refused with this reason.
    const NO_PRIMARY: Option<&'static str> = None;

    /// What the members do with their certificate: serve clients only, unless they also
    /// authenticate to each other with it.
    const CERTIFICATE_ROLE: crate::builders::CertificateRole = crate::builders::CertificateRole::Server;

    /// The image for the spec (its version, and whatever else picks the image) when
    /// `spec.image` is not set.
    fn default_image(spec: &crate::spec::ClusterSpec) -> String;
    /// The generated server configuration.
    fn config(ctx: &Ctx) -> String;
    /// Further files of the ConfigMap beside [`Blueprint::CONFIG_FILE`] (e.g. a start script),
    /// mounted with it under /etc/stateward; a change to any of them rolls the pods.
    fn extra_files(_ctx: &Ctx) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// The container: command, env, probes, identity, defaults.
    fn container(ctx: &Ctx, image: String) -> ContainerSpec;
    /// The StatefulSets of the cluster's members, in apply order: by default one, named as
    /// the CR and sized by the common spec.
    fn member_sets(ctx: &Ctx) -> Vec<MemberSet> {
        vec![MemberSet::whole(ctx.cluster)]
    }
    /// The container of one member set: [`Blueprint::container`] unless the sets differ.
    fn set_container(ctx: &Ctx, _set: &MemberSet, image: String) -> ContainerSpec {
        Self::container(ctx, image)
    }
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
    /// `spec.replicas` when the spec does not set it: the CRD sets no default, as the number
    /// may follow from other fields (Redis Cluster's shards and replicas per shard).
    fn default_replicas(_spec: &Value) -> i64 {
        crate::spec::DEFAULT_REPLICAS
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
        Ok(mut cluster) => {
            let spec = obj.get("spec").unwrap_or(&Value::Null);
            if spec.get("replicas").is_none() {
                cluster.spec.replicas = B::default_replicas(spec);
                if !(MIN_REPLICAS..=MAX_REPLICAS).contains(&cluster.spec.replicas) {
                    errs.push(FieldError::new(
                        "spec.replicas",
                        format!(
                            "is not set, and the {} members the spec makes are outside {MIN_REPLICAS}..={MAX_REPLICAS}",
                            cluster.spec.replicas
                        ),
                    ));
                }
            }
            errs.extend(B::validate_spec(spec, &cluster));
            if !cluster.fenced.is_empty() && errs.is_empty() {
                let c = ctx::<B>(&cluster);
                let members: Vec<String> = B::member_sets(&c)
                    .iter()
                    .flat_map(|set| (0..set.replicas).map(|i| set.pod(&c, i)).collect::<Vec<_>>())
                    .collect();
                errs.extend(crate::fence::check_members(&cluster.fenced, &members));
            }
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
        let (new_spec, old_spec) = (spec_of(new_text), spec_of(old_text));
        errs.extend(B::validate_spec_update(&new_spec, &old_spec));
        // Unsetting the number must not change it behind the scale rules' back (the admission
        // policy compares the two numbers written).
        if new_spec.get("replicas").is_none()
            && old_spec.get("replicas").is_some()
            && new.spec.replicas != old.spec.replicas
        {
            errs.push(FieldError::new(
                "spec.replicas",
                format!(
                    "removing it would change the number of members from {} to {}: set the number wanted",
                    old.spec.replicas, new.spec.replicas
                ),
            ));
        }
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
/// `sets`: its member sets (see [`Blueprint::member_sets`]); `claim_size`: the data claim
/// template size of a set's existing StatefulSet, by the StatefulSet's name.
pub fn desired<B: Blueprint>(
    ctx: &Ctx,
    sets: &[MemberSet],
    claim_size: impl Fn(&str) -> Option<String>,
) -> (Vec<Action>, String) {
    let mut files = vec![(B::CONFIG_FILE, B::config(ctx))];
    files.extend(B::extra_files(ctx));
    let image = ctx.cluster.spec.image.clone().unwrap_or_else(|| B::default_image(&ctx.cluster.spec));
    // With one file this is the hash earlier versions computed, so their pods do not roll.
    let hashed: Vec<String> = files.iter().map(|(name, text)| format!("{name}\n{text}")).collect();
    let hash = fnv1a(hashed.join("\n").as_bytes());
    let files: Vec<(&str, &str)> = files.iter().map(|(name, text)| (*name, text.as_str())).collect();
    let mut actions = vec![
        Action::EnsureSecret(objects::credentials(ctx, B::SECRET_KEYS, B::SECRET_DERIVED)),
        Action::EnsureSecret(objects::server_certificate(ctx, B::CERTIFICATE_ROLE)),
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
    for set in sets {
        let container = B::set_container(ctx, set, image.clone());
        let size = claim_size(&set.statefulset(ctx)).unwrap_or_else(|| set.storage_size.clone());
        actions.push(Action::Apply(to_text(&statefulset::stateful_set(ctx, set, &container, &hash, &size))));
    }
    (actions, image)
}

/// The status fields of a plan beside its phase and conditions (the plugin's own among them).
fn status_fields<B: Blueprint>(ctx: Option<&Ctx>, d: &Derived) -> Map<String, Value> {
    let mut extra = Map::new();
    extra.insert("readyReplicas".into(), json!(d.ready_replicas));
    extra.insert("plugin".into(), json!(format!("{}@{}", B::NAME, B::VERSION)));
    if let Some(ctx) = ctx {
        extra.extend(B::status_extra(ctx, d));
    }
    extra
}

fn report<B: Blueprint>(ctx: Option<&Ctx>, d: &Derived) -> StatusReport {
    let extra = status_fields::<B>(ctx, d);
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
    if cluster.spec.hibernate && !cluster.deleting {
        return Ok(hibernate_plan::<B>(&cluster, &obj, &children));
    }
    let ctx = ctx::<B>(&cluster);
    let sets = B::member_sets(&ctx);
    let statefulsets: Vec<Option<&Value>> =
        sets.iter().map(|set| find_child(&children, "StatefulSet", &set.statefulset(&ctx))).collect();
    let claim_size = |name: &str| find_child(&children, "StatefulSet", name).and_then(volumes::template_size);
    // The pod templates this reconcile renders, to tell a cached StatefulSet that has them.
    let templates = template_hashes(&desired::<B>(&ctx, &sets, claim_size).0);
    let revision =
        |name: &str| crate::live::update_revision(&children, name, templates.get(name).map(String::as_str));
    // The running service first: what it adds before the pods goes in ahead of the StatefulSet.
    let mut live = B::live(
        &ctx,
        &crate::live::LiveInput {
            pods: crate::live::pods(&children),
            services: crate::live::services(&children),
            update_revision: revision(ctx.name()),
            update_revisions: sets
                .iter()
                .filter_map(|set| {
                    let name = set.statefulset(&ctx);
                    revision(&name).map(|r| (name, r))
                })
                .collect(),
            responses: &input.responses,
            status: obj.get("status"),
            resource: &obj,
            now_ms: input.now_ms,
        },
    );
    // A poll asked with no answer yet: a new leader (the operator restarted or upgraded) that
    // has not heard from the running service, or a pod just added. The health verdict and the
    // per-pod entries the status observed stay until the answer; dropping them would take two
    // writes to come back to the same status. (A plugin that stops asking, say with no pod
    // ready, drops them as before; other status keys are the plugin's to keep or drop.)
    let answered = |id: &str| input.responses.iter().any(|r| r.id == id);
    let unanswered = live.actions.iter().any(|a| match a {
        Action::Exec(r) => matches!(r.mode, RequestMode::EveryMs(_)) && !answered(&r.id),
        Action::Http(r) => matches!(r.mode, RequestMode::EveryMs(_)) && !answered(&r.id),
        _ => false,
    });
    if unanswered {
        if let Some(held) = crate::live::held_health(&live.conditions, obj.get("status")) {
            live.conditions.push(held);
        }
        if let Some(previous) = obj.get("status") {
            crate::live::hold_unanswered(&mut live.status, previous);
        }
    }
    // A member the plugin must move off first keeps its StatefulSet from shrinking yet; the
    // status still reports the spec's count (the phase stays Scaling meanwhile).
    let mut applied = sets.clone();
    for set in &mut applied {
        let hold =
            if set.set.is_empty() { live.hold_replicas } else { live.hold_sets.get(&set.set).copied() };
        if let Some(h) = hold.filter(|h| *h > set.replicas) {
            set.replicas = h;
        }
    }
    let (mut actions, image) = desired::<B>(&ctx, &applied, claim_size);
    let at =
        actions.iter().position(|a| matches!(a, Action::Apply(t) if t.contains("\"kind\":\"StatefulSet\"")));
    let at = at.unwrap_or(actions.len());
    actions.splice(at..at, live.before_pods);
    // Each pod's fence label before the Services that select on it.
    let pods = crate::live::pods(&children);
    actions.splice(0..0, crate::fence::labels(&cluster.fenced, &pods));
    let grown: Vec<Value> = sets.iter().flat_map(|set| volumes::grow_claims(&ctx, set, &children)).collect();
    let combined = combine(&statefulsets);
    let mut counted = cluster.clone();
    counted.spec.replicas = sets.iter().map(|s| s.replicas).sum();
    let mut d = derive(&counted, combined.as_ref(), &image);
    // A running cluster whose volumes are still growing is progressing, not converged.
    let resizing = sets.iter().find_map(|set| volumes::resizing(&ctx, set, &children));
    if let (Phase::Running, Some(message)) = (d.phase, resizing) {
        if let Some(c) = d.conditions.iter_mut().find(|c| c.type_ == "Progressing") {
            *c = Condition {
                type_: "Progressing".into(),
                status: ConditionStatus::True,
                reason: "ResizingVolumes".into(),
                message,
            };
        }
    }
    if let Some(r) = live.redundancy.take() {
        let r = r.held(obj.get("status"));
        let waits = cluster.spec.wait_for_redundancy;
        if waits
            && crate::redundancy::hold_creation(
                &mut d.phase,
                &mut d.conditions,
                cluster.last_phase.as_deref(),
                &r,
            )
        {
            d.requeue_after_ms =
                Some(d.requeue_after_ms.map_or(REQUEUE_PROGRESSING_MS, |ms| ms.min(REQUEUE_PROGRESSING_MS)));
        }
        live.conditions.push(r.condition());
    }
    let mut events: Vec<Event> = phase_event(cluster.last_phase.as_deref(), d.phase).into_iter().collect();
    if was_paused(obj.get("status")) {
        events.push(Event {
            type_: EventType::Normal,
            reason: "Resumed".into(),
            message: "spec.paused is false: changes are applied again".into(),
        });
    }
    if condition_status(obj.get("status"), HIBERNATED_CONDITION).is_some() {
        events.push(Event {
            type_: EventType::Normal,
            reason: "Waking".into(),
            message: "spec.hibernate is false: the pods start again on their volumes".into(),
        });
    }
    if !grown.is_empty() {
        events.push(Event {
            type_: EventType::Normal,
            reason: "GrowingVolumes".into(),
            message: format!("raising {} data claim(s) to {}", grown.len(), claim_sizes(&grown)),
        });
    }
    actions.extend(grown.iter().map(|claim| Action::Apply(to_text(claim))));
    actions.extend(live.actions);
    events.extend(live.events);
    let mut extra = status_fields::<B>(Some(&ctx), &d);
    extra.extend(live.status);
    let mut conditions = d.conditions.clone();
    conditions.retain(|c| !live.conditions.iter().any(|l| l.type_ == c.type_));
    conditions.extend(live.conditions);
    let mut status = StatusReport { phase: d.phase, conditions, extra: to_text(&Value::Object(extra)) };
    let (fenced, fence_event) = crate::fence::report(&cluster.fenced, obj.get("status"));
    status.conditions.extend(fenced);
    events.extend(fence_event);
    let requeue_after_ms = match (d.requeue_after_ms, live.requeue_after_ms) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(Plan { actions, status, events, requeue_after_ms })
}

/// Each rendered StatefulSet's name and pod-template hash.
fn template_hashes(actions: &[Action]) -> std::collections::BTreeMap<String, String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Apply(text) if text.contains("\"kind\":\"StatefulSet\"") => {
                serde_json::from_str::<Value>(text).ok()
            }
            _ => None,
        })
        .filter_map(|sts| {
            let name = str_at(&sts, &["metadata", "name"])?.to_string();
            let hash = str_at(&sts, &["metadata", "annotations", TEMPLATE_HASH_ANNOTATION])?.to_string();
            Some((name, hash))
        })
        .collect()
}

/// The sizes grown claims ask for, each once.
fn claim_sizes(claims: &[Value]) -> String {
    let mut sizes: Vec<&str> =
        claims.iter().filter_map(|c| str_at(c, &["spec", "resources", "requests", "storage"])).collect();
    sizes.dedup();
    sizes.join(", ")
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

/// `spec.hibernate`: every member set scaled to zero and nothing else changed (the same
/// configuration and pod template, so waking makes the same pods again on the same claims;
/// the Secrets and Services stay). No request goes to the service meanwhile, so none of the
/// plugin's decisions (a failover among them) is taken about pods stopped on purpose, and the
/// status the plugin wrote last is kept for the wake to start from.
fn hibernate_plan<B: Blueprint>(cluster: &Cluster, obj: &Value, children: &[Value]) -> Plan {
    use ConditionStatus::{False, True};
    let ctx = ctx::<B>(cluster);
    let mut sets = B::member_sets(&ctx);
    let statefulsets: Vec<Option<&Value>> =
        sets.iter().map(|set| find_child(children, "StatefulSet", &set.statefulset(&ctx))).collect();
    for set in &mut sets {
        set.replicas = 0;
    }
    let (actions, image) = desired::<B>(&ctx, &sets, |name| {
        find_child(children, "StatefulSet", name).and_then(volumes::template_size)
    });
    let mut stopped = cluster.clone();
    stopped.spec.replicas = 0;
    let d = derive(&stopped, combine(&statefulsets).as_ref(), &image);
    let running = crate::live::pods(children).len();
    let claims = children.iter().filter(|c| str_at(c, &["kind"]) == Some("PersistentVolumeClaim")).count();
    let (phase, hibernated) = if running > 0 {
        (
            Phase::Scaling,
            cond(HIBERNATED_CONDITION, False, "Stopping", format!("{running} pod(s) still running")),
        )
    } else {
        let message = format!("every pod stopped; {claims} volume claim(s) and the Secrets kept");
        (d.phase, cond(HIBERNATED_CONDITION, True, "Hibernated", message))
    };
    let progressing = if running > 0 {
        cond("Progressing", True, "Hibernating", format!("stopping {running} pod(s)"))
    } else {
        cond("Progressing", False, "Hibernated", "no pod runs".into())
    };
    let conditions = vec![
        cond("Available", False, "Hibernated", "spec.hibernate is true: no pod runs".into()),
        progressing,
        cond("Degraded", False, "AsExpected", "nothing has failed".into()),
        hibernated.clone(),
    ];
    let status = obj.get("status");
    let mut events: Vec<Event> = phase_event(cluster.last_phase.as_deref(), phase).into_iter().collect();
    let was = condition_status(status, HIBERNATED_CONDITION);
    if was.is_none() {
        events.push(Event {
            type_: EventType::Normal,
            reason: "Hibernating".into(),
            message: "spec.hibernate is true: every pod stops; the volumes and Secrets stay".into(),
        });
    }
    if hibernated.status == True && was != Some("True") {
        events.push(Event {
            type_: EventType::Normal,
            reason: "Hibernated".into(),
            message: hibernated.message,
        });
    }
    let mut extra = kept_fields(status);
    extra.extend(status_fields::<B>(Some(&ctx), &Derived { phase, conditions: conditions.clone(), ..d }));
    Plan {
        actions,
        status: StatusReport { phase, conditions, extra: to_text(&Value::Object(extra)) },
        events,
        requeue_after_ms: (running > 0).then_some(crate::status::REQUEUE_PROGRESSING_MS),
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
            "StatefulSet" if child_name == name || ours => Some("apps/v1"),
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
