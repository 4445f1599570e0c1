# Guardrails: what a plugin's plan may contain. Evaluated once per planned action with input
#   {plugin:{name, version, digest, owns:[{apiVersion, kind}]},
#    resource:{apiVersion, kind, namespace, name, generation, spec},
#    action:{verb, object}}
# where verb is "apply", "delete", "ensure-secret", "label-pod", "exec", "http" or "status" and
# object is Kubernetes-shaped (a delete carries {apiVersion, kind, metadata:{name}}; a request
# or a label change names its Pod or Service with the labels and declared ports the host
# observed on it, plus an "exec", "http" or "set" member saying what is asked; the status write
# names the resource itself with status:{keys, bytes}, what the plugin reports beside phase and
# conditions).
#
# Every message starts with "<rule-id>: " so the host can apply the rule's enforcement mode
# (deny / warn / dryrun) from data.stateward.config.enforcement.guardrails.
#
# Cost notes: the host evaluates this for every planned action on regorus' RVM. Measured there, a
# plain instruction costs ~25 ns, a reference to another rule ~75 ns even once its value is known,
# a builtin call ~115 ns, a function call ~370 ns, and every definition of a function or complete
# rule is evaluated, unless all of them give the same constant (e.g. `true`): then the first that
# holds ends the call. Hence refs with defaults instead of object.get where the semantics are the
# same, rule values copied to locals before loops, table lookups instead of one definition per
# case, and cheap first definitions for the common case of boolean helpers. policies/testdata
# and the tests pin the decisions.
package stateward.guardrails

default obj := {}

obj := input.action.object

default verb := ""

verb := input.action.verb

# object.get, not a default: an action object that is not an object has no kind (and
# kind-not-owned cannot format its message), as before.
api_version := object.get(obj, "apiVersion", "")

kind := object.get(obj, "kind", "")

obj_name := object.get(obj, ["metadata", "name"], "")

plugin_name := object.get(input, ["plugin", "name"], "")

default resource_namespace := ""

resource_namespace := input.resource.namespace

# --- kinds and namespaces -----------------------------------------------------------------

deny contains msg if {
	not verb in {"apply", "delete", "ensure-secret", "label-pod", "exec", "http", "status"}
	msg := sprintf("unknown-verb: action verb \"%s\" is not one of apply, delete, ensure-secret, label-pod, exec, http, status", [verb])
}

# Secrets are ensured, not owned; the status write is to the resource itself.
deny contains msg if {
	not verb in {"ensure-secret", "status"}
	not owned
	msg := sprintf("kind-not-owned: plugin %s does not declare %s/%s", [plugin_name, api_version, kind])
}

# Two definitions of one value: the RVM stops at the first that holds, so the common case (a
# declared kind written exactly as {apiVersion, kind}) is one native membership test, and the
# loop (declarations with more fields) only runs when it fails. Locals rather than api_version
# and kind inside the loop (see the cost notes).
owned if {"apiVersion": object.get(obj, "apiVersion", ""), "kind": kind} in input.plugin.owns

owned if {
	av := object.get(obj, "apiVersion", "")
	k := kind
	some o in input.plugin.owns
	o.apiVersion == av
	o.kind == k
}

# The host fills in a missing namespace with the resource's own, so only an explicit foreign
# namespace is a violation.
deny contains msg if {
	ns := obj.metadata.namespace
	ns != resource_namespace
	msg := sprintf("foreign-namespace: %s %s is in namespace %s, not %s", [kind, obj_name, ns, resource_namespace])
}

# --- requests to the running service and pod labels -----------------------------------------

# A request (exec, http) or a label change goes only to a Pod or Service of the plugin's own
# instance: the host puts the labels it observed on the target into the input, and a target it
# did not observe among the instance's children has none.
deny contains msg if {
	verb in {"exec", "http", "label-pod"}
	object.get(obj, ["metadata", "labels", "stateward.dev/instance"], "") != object.get(input, ["resource", "name"], "")
	msg := sprintf("foreign-target: %s to %s %s, which is not one of instance %s's", [verb, kind, obj_name, object.get(input, ["resource", "name"], "")])
}

# Only the commands the policy data lists for the plugin (data.stateward.config.guardrails.
# exec_commands[plugin]), by the program they run (argv[0]).
deny contains msg if {
	verb == "exec"
	program := object.get(obj, ["exec", "command", 0], "")
	allowed := object.get(data.stateward.config.guardrails, ["exec_commands", plugin_name], [])
	not program in allowed
	msg := sprintf("exec-command-not-allowed: plugin %s may not run %s in pod %s (allowed: %s)", [plugin_name, program, obj_name, concat(", ", allowed)])
}

# http only to a port the target declares (a container port of the Pod, a port of the Service).
deny contains msg if {
	verb == "http"
	port := object.get(obj, ["http", "port"], 0)
	not port in object.get(obj, "declaredPorts", [])
	msg := sprintf("http-port-not-declared: %s %s declares no port %d", [kind, obj_name, port])
}

# --- status -------------------------------------------------------------------------------

# What a plugin reports in status is readable by anyone who may read the resource and is
# rewritten on every change: bounded by the policy data (the host refuses more than 64 KiB
# whatever the policy says).
deny contains msg if {
	verb == "status"
	bytes := object.get(obj, ["status", "bytes"], 0)
	limit := object.get(data.stateward.config.guardrails, "max_status_bytes", 16384)
	bytes > limit
	msg := sprintf("status-too-large: %s %s reports %d bytes of status beside phase and conditions (at most %d)", [kind, obj_name, bytes, limit])
}

# --- pod templates ------------------------------------------------------------------------

# Pod contents only matter for objects that will exist afterwards, which only an apply writes: a
# delete has no pod spec, and a request or a label change names a running Pod without one, so
# the container rules below need no check of their own. The table says where each workload kind
# keeps its pod spec: one lookup rather than one rule definition per kind. A missing pod spec
# comes back null, which every use below treats like an undefined one.
pod_spec := object.get(obj, path, null) if {
	verb == "apply"
	path := {
		"Pod": ["spec"],
		"StatefulSet": ["spec", "template", "spec"],
		"Deployment": ["spec", "template", "spec"],
		"ReplicaSet": ["spec", "template", "spec"],
		"DaemonSet": ["spec", "template", "spec"],
		"Job": ["spec", "template", "spec"],
		"CronJob": ["spec", "jobTemplate", "spec", "template", "spec"],
	}[kind]
}

# Containers that run with their own resources (ephemeral containers cannot set limits).
# Arrays rather than sets: building a set compares whole container objects, and the
# messages are collected into a set anyway.
# (A local copy of pod_spec: each reference to a rule is a call, even when its value is known.)
workload_containers := array.concat(object.get(spec, "initContainers", []), object.get(spec, "containers", [])) if {
	spec := pod_spec
}

all_containers := array.concat(workload_containers, object.get(pod_spec, "ephemeralContainers", []))

cname(c) := object.get(c, "name", "<unnamed>")

deny contains msg if {
	some c in all_containers
	c.securityContext.privileged == true
	msg := sprintf("privileged: container %s runs privileged", [cname(c)])
}

# object.filter keeps only the fields the pod spec sets: usually none, so no loop runs.
deny contains msg if {
	some field, v in object.filter(pod_spec, ["hostNetwork", "hostPID", "hostIPC"])
	v == true
	msg := sprintf("host-namespace: %s %s sets %s", [kind, obj_name, field])
}

deny contains msg if {
	some v in pod_spec.volumes
	v.hostPath
	msg := sprintf("host-path: volume %s mounts a host path", [object.get(v, "name", "<unnamed>")])
}

# A missing list fails count(...) > 0 just as an empty one does.
deny contains msg if {
	some c in all_containers
	added := c.securityContext.capabilities.add
	count(added) > 0
	msg := sprintf("added-capabilities: container %s adds %s", [cname(c), concat(",", added)])
}

# runAsNonRoot is in effect when the container sets it to true, or leaves it unset in a pod
# that sets it to true.
deny contains msg if {
	pod_non_root := object.get(pod_spec, ["securityContext", "runAsNonRoot"], false)
	some c in all_containers
	not object.get(c, ["securityContext", "runAsNonRoot"], pod_non_root) == true
	msg := sprintf("run-as-non-root: container %s does not set runAsNonRoot", [cname(c)])
}

deny contains msg if {
	some c in workload_containers
	some r in ["cpu", "memory"]
	not c.resources.limits[r]
	msg := sprintf("resource-limits: container %s has no %s limit", [cname(c), r])
}

# A reference without a registry host ("postgres:17", "bitnami/redis") is on Docker Hub, the
# way container runtimes resolve it; official images live under library/. The prefix is looked
# up by [has a "/" (the first segment is not the whole reference), first segment is a host].
# An image that is not a string fails here, so the rule below denies it.
# Both definitions are true when they hold, so the RVM stops at the first: the common case, a
# "." before the first "/" (the first segment is a host, so the reference is its own
# normalized form), is matched as is; the second definition handles every reference.
allowed_image(img) if {
	dot := indexof(img, ".")
	dot >= 0
	dot < indexof(img, "/")
	strings.any_prefix_match(img, data.stateward.config.guardrails.allowed_registries)
}

allowed_image(img) if {
	first := split(img, "/")[0]
	host := true in [contains(first, "."), contains(first, ":"), first == "localhost"]
	prefix := {
		false: {false: "docker.io/library/", true: "docker.io/library/"},
		true: {false: "docker.io/", true: ""},
	}[first != img][host]
	strings.any_prefix_match(concat("", [prefix, img]), data.stateward.config.guardrails.allowed_registries)
}

deny contains msg if {
	some c in all_containers
	img := object.get(c, "image", "")
	not allowed_image(img)
	msg := sprintf("image-registry: container %s image %s is not from an allowed registry", [cname(c), img])
}

# --- identity and node access -------------------------------------------------------------

# A managed service's pods have no business with the Kubernetes API: they run as the
# namespace's default ServiceAccount (or one the policy data lists) and without its token.
# serviceAccount is the deprecated alias of serviceAccountName.
deny contains msg if {
	some field, sa in object.filter(pod_spec, ["serviceAccountName", "serviceAccount"])
	not sa in {"", "default"}
	not sa in object.get(data.stateward.config.guardrails, "allowed_service_accounts", [])
	msg := sprintf("service-account: %s %s runs as ServiceAccount %s", [kind, obj_name, sa])
}

# The token is mounted unless the pod says false (the ServiceAccount's own setting is not in
# the plan, so it cannot be relied on).
deny contains msg if {
	pod_spec != null
	not pod_spec.automountServiceAccountToken == false
	msg := sprintf("service-account-token: %s %s does not set automountServiceAccountToken: false", [kind, obj_name])
}

deny contains msg if {
	some c in all_containers
	some p in c.ports
	object.get(p, "hostPort", 0) != 0
	msg := sprintf("host-port: container %s binds host port %v", [cname(c), p.hostPort])
}

# Pod volume types that stay within the pod or the cluster's storage API (the Pod Security
# Standards' restricted list); hostPath has its own rule above. Anything else (iscsi, fc,
# rbd, flexVolume, nfs, …) reaches a node's devices or a server directly.
volume_types := {"configMap", "secret", "emptyDir", "persistentVolumeClaim", "projected", "downwardAPI", "ephemeral", "csi", "hostPath"}

deny contains msg if {
	some v in pod_spec.volumes
	some field, _ in v
	field != "name"
	not field in volume_types
	msg := sprintf("volume-type: volume %s is of type %s", [object.get(v, "name", "<unnamed>"), field])
}

deny contains msg if {
	seccomp_unconfined(pod_spec)
	msg := sprintf("seccomp-unconfined: %s %s sets seccompProfile Unconfined", [kind, obj_name])
}

deny contains msg if {
	some c in all_containers
	seccomp_unconfined(c)
	msg := sprintf("seccomp-unconfined: container %s sets seccompProfile Unconfined", [cname(c)])
}

seccomp_unconfined(x) if x.securityContext.seccompProfile.type == "Unconfined"

# Without allowPrivilegeEscalation: false a setuid binary in the image can gain privileges
# (no_new_privs is off); the restricted Pod Security Standard asks for it explicitly.
deny contains msg if {
	some c in all_containers
	not c.securityContext.allowPrivilegeEscalation == false
	msg := sprintf("privilege-escalation: container %s does not set allowPrivilegeEscalation: false", [cname(c)])
}

# --- scheduling ---------------------------------------------------------------------------

# Control-plane nodes run the cluster itself: a pod may tolerate their taints only when the
# policy data says so (data.stateward.config.guardrails.allow_control_plane_tolerations). A
# toleration with an empty key and operator Exists tolerates every taint, these included.
# Pods without tolerations (the common case) stop at the first line: pod_spec.tolerations is
# undefined, so neither the loop nor the function call runs (see the cost notes).
deny contains msg if {
	some t in pod_spec.tolerations
	tolerates_control_plane(t)
	not data.stateward.config.guardrails.allow_control_plane_tolerations == true
	key := object.get(t, "key", "")
	what := {true: "every taint (empty key, operator Exists)", false: key}[key == ""]
	msg := sprintf("control-plane-toleration: %s %s tolerates %s", [kind, obj_name, what])
}

# Both definitions are true when they hold, so the RVM stops at the first.
tolerates_control_plane(t) if object.get(t, "key", "") in {"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"}

tolerates_control_plane(t) if {
	object.get(t, "key", "") == ""
	object.get(t, "operator", "Equal") == "Exists"
}

# The system priority classes may preempt anything, cluster components included: only those
# the policy data lists (data.stateward.config.guardrails.allowed_system_priority_classes).
deny contains msg if {
	pc := pod_spec.priorityClassName
	pc in {"system-node-critical", "system-cluster-critical"}
	not pc in object.get(data.stateward.config.guardrails, "allowed_system_priority_classes", [])
	msg := sprintf("system-priority-class: %s %s uses priorityClassName %s", [kind, obj_name, pc])
}

# --- PodDisruptionBudget ------------------------------------------------------------------

pdb_ok(n) if {
	is_number(n)
	n <= 1
}

deny contains msg if {
	verb != "delete"
	kind == "PodDisruptionBudget"
	n := obj.spec.maxUnavailable
	not pdb_ok(n)
	msg := sprintf("pdb-max-unavailable: %s maxUnavailable %s must be a number <= 1", [obj_name, json.marshal(n)])
}

# --- Services -----------------------------------------------------------------------------

# The host sends a plan's http requests to a Service's cluster IP, and checks the Service's own
# labels, not whom it selects: so a Service a plugin applies selects only its instance's pods, by
# `stateward.dev/instance` (every member pod carries it; the sdk's Services select it) or, as
# builds made before it did (the 0.1.0 contract's among them), `app.kubernetes.io/instance`
# naming the resource; and it reaches outside the cluster (a node port, a load balancer, an
# external name or external IPs) only where the policy data allows it.
selects_instance(instance) if object.get(obj, ["spec", "selector", "stateward.dev/instance"], "") == instance

selects_instance(instance) if object.get(obj, ["spec", "selector", "app.kubernetes.io/instance"], "") == instance

deny contains msg if {
	verb == "apply"
	kind == "Service"
	instance := object.get(input, ["resource", "name"], "")
	not selects_instance(instance)
	msg := sprintf("service-selector: Service %s must select stateward.dev/instance=%s (only instance %s's pods)", [obj_name, instance, instance])
}

deny contains msg if {
	verb == "apply"
	kind == "Service"
	t := object.get(obj, ["spec", "type"], "ClusterIP")
	t != "ClusterIP"
	not t in object.get(data.stateward.config.guardrails, "allowed_service_types", [])
	msg := sprintf("service-type: Service %s is of type %s; only ClusterIP unless the policy data allows it", [obj_name, t])
}

deny contains msg if {
	verb == "apply"
	kind == "Service"
	count(object.get(obj, ["spec", "externalIPs"], [])) > 0
	not object.get(data.stateward.config.guardrails, "allow_external_ips", false) == true
	msg := sprintf("service-external-ips: Service %s sets externalIPs, which the policy data does not allow", [obj_name])
}

# --- warnings -----------------------------------------------------------------------------

# Pinned: a digest, or else (no "@" at all) a tag on the last path segment, where a ":" is not
# a registry port, that is not "latest". Both definitions are true when they hold, so the RVM
# stops at the first, the common case (a tag). An image that is not a string fails both, so the
# rule below warns about it.
pinned(img) if {
	not contains(img, "@")
	parts := split(img, "/")
	last := parts[count(parts) - 1]
	contains(last, ":")
	not endswith(last, ":latest")
}

pinned(img) if contains(img, "@sha256:")

warn contains msg if {
	some c in all_containers
	img := object.get(c, "image", "")
	not pinned(img)
	msg := sprintf("image-tag: container %s image %s has no fixed tag or digest", [cname(c), img])
}
