# Guardrails: what a plugin's plan may contain. Evaluated once per planned action with input
#   {plugin:{name, version, digest, owns:[{apiVersion, kind}]},
#    resource:{apiVersion, kind, namespace, name, generation, spec},
#    action:{verb, object}}
# where verb is "apply", "delete" or "ensure-secret" and object is Kubernetes-shaped
# (a delete carries {apiVersion, kind, metadata:{name}}).
#
# Every message starts with "<rule-id>: " so the host can apply the rule's enforcement mode
# (deny / warn / dryrun) from data.stateward.config.enforcement.guardrails.
package stateward.guardrails

cfg := data.stateward.config.guardrails

obj := object.get(input, ["action", "object"], {})

verb := object.get(input, ["action", "verb"], "")

api_version := object.get(obj, "apiVersion", "")

kind := object.get(obj, "kind", "")

obj_name := object.get(obj, ["metadata", "name"], "")

plugin_name := object.get(input, ["plugin", "name"], "")

resource_namespace := object.get(input, ["resource", "namespace"], "")

# Pod contents only matter for objects that will exist afterwards.
mutating if verb != "delete"

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

owned if {
	some k in input.plugin.owns
	k.apiVersion == api_version
	k.kind == kind
}

# The host fills in a missing namespace with the resource's own, so only an explicit foreign
# namespace is a violation.
deny contains msg if {
	ns := obj.metadata.namespace
	ns != resource_namespace
	msg := sprintf("foreign-namespace: %s %s is in namespace %s, not %s", [kind, obj_name, ns, resource_namespace])
}

# --- pod templates ------------------------------------------------------------------------

pod_spec := obj.spec if kind == "Pod"

pod_spec := obj.spec.template.spec if kind in {"StatefulSet", "Deployment", "ReplicaSet", "DaemonSet", "Job"}

pod_spec := obj.spec.jobTemplate.spec.template.spec if kind == "CronJob"

# Containers that run with their own resources (ephemeral containers cannot set limits).
# Arrays rather than sets: building a set compares whole container objects, and the
# messages are collected into a set anyway.
workload_containers := array.concat(object.get(pod_spec, "initContainers", []), object.get(pod_spec, "containers", []))

all_containers := array.concat(workload_containers, object.get(pod_spec, "ephemeralContainers", []))

cname(c) := object.get(c, "name", "<unnamed>")

deny contains msg if {
	mutating
	some c in all_containers
	c.securityContext.privileged == true
	msg := sprintf("privileged: container %s runs privileged", [cname(c)])
}

deny contains msg if {
	mutating
	some field in ["hostNetwork", "hostPID", "hostIPC"]
	pod_spec[field] == true
	msg := sprintf("host-namespace: %s %s sets %s", [kind, obj_name, field])
}

deny contains msg if {
	mutating
	some v in pod_spec.volumes
	v.hostPath
	msg := sprintf("host-path: volume %s mounts a host path", [object.get(v, "name", "<unnamed>")])
}

deny contains msg if {
	mutating
	some c in all_containers
	added := object.get(c, ["securityContext", "capabilities", "add"], [])
	count(added) > 0
	msg := sprintf("added-capabilities: container %s adds %s", [cname(c), concat(",", added)])
}

non_root(c) if c.securityContext.runAsNonRoot == true

non_root(c) if {
	pod_spec.securityContext.runAsNonRoot == true
	object.get(c, ["securityContext", "runAsNonRoot"], true) == true
}

deny contains msg if {
	mutating
	some c in all_containers
	not non_root(c)
	msg := sprintf("run-as-non-root: container %s does not set runAsNonRoot", [cname(c)])
}

deny contains msg if {
	mutating
	some c in workload_containers
	some r in ["cpu", "memory"]
	not c.resources.limits[r]
	msg := sprintf("resource-limits: container %s has no %s limit", [cname(c), r])
}

allowed_image(img) if strings.any_prefix_match(full_image(img), cfg.allowed_registries)

# A reference without a registry host ("postgres:17", "bitnami/redis") is on Docker Hub, the
# way container runtimes resolve it; official images live under library/.
full_image(img) := img if {
	first := split(img, "/")[0]
	contains(img, "/")
	registry_host(first)
}

full_image(img) := concat("", ["docker.io/", img]) if {
	contains(img, "/")
	not registry_host(split(img, "/")[0])
}

full_image(img) := concat("", ["docker.io/library/", img]) if not contains(img, "/")

registry_host(part) if contains(part, ".")

registry_host(part) if contains(part, ":")

registry_host(part) if part == "localhost"

deny contains msg if {
	mutating
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
	mutating
	kind == "PodDisruptionBudget"
	n := obj.spec.maxUnavailable
	not pdb_ok(n)
	msg := sprintf("pdb-max-unavailable: %s maxUnavailable %s must be a number <= 1", [obj_name, json.marshal(n)])
}

# --- warnings -----------------------------------------------------------------------------

pinned(img) if contains(img, "@sha256:")

pinned(img) if {
	not contains(img, "@")
	parts := split(img, "/")
	last := parts[count(parts) - 1]
	contains(last, ":")
	not endswith(last, ":latest")
}

warn contains msg if {
	mutating
	some c in all_containers
	img := object.get(c, "image", "")
	not pinned(img)
	msg := sprintf("image-tag: container %s image %s has no fixed tag or digest", [cname(c), img])
}
