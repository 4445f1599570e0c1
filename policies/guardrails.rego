# Guardrails: what a plugin's plan may contain. Evaluated once per planned action with input
#   {plugin:{name, version, digest, owns:[{apiVersion, kind}]},
#    resource:{apiVersion, kind, namespace, name, generation, spec},
#    action:{verb, object}}
# where verb is "apply", "delete" or "ensure-secret" and object is Kubernetes-shaped
# (a delete carries {apiVersion, kind, metadata:{name}}).
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
	not verb in {"apply", "delete", "ensure-secret"}
	msg := sprintf("unknown-verb: action verb \"%s\" is not one of apply, delete, ensure-secret", [verb])
}

deny contains msg if {
	verb != "ensure-secret"
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

# --- pod templates ------------------------------------------------------------------------

# Pod contents only matter for objects that will exist afterwards: a delete has no pod spec, so
# the container rules below need no check of their own. The table says where each workload kind
# keeps its pod spec: one lookup rather than one rule definition per kind. A missing pod spec
# comes back null, which every use below treats like an undefined one.
pod_spec := object.get(obj, path, null) if {
	verb != "delete"
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
