package stateward.guardrails_test

import data.stateward.guardrails

plugin := {
	"name": "postgres",
	"version": "0.1.0",
	"digest": "sha256:0000000000000000000000000000000000000000000000000000000000000000",
	"owns": [
		{"apiVersion": "apps/v1", "kind": "StatefulSet"},
		{"apiVersion": "v1", "kind": "Service"},
		{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget"},
	],
}

resource := {
	"apiVersion": "stateward.dev/v1alpha1",
	"kind": "PostgresCluster",
	"namespace": "db",
	"name": "main",
	"generation": 3,
	"spec": {"replicas": 3},
}

container := {
	"name": "postgres",
	"image": "docker.io/library/postgres:16.4",
	"securityContext": {"runAsNonRoot": true},
	"resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
}

sts(pod) := {
	"apiVersion": "apps/v1",
	"kind": "StatefulSet",
	"metadata": {"name": "main", "namespace": "db"},
	"spec": {"replicas": 3, "template": {"spec": pod}},
}

good_pod := {"containers": [container]}

with_container(c) := {"containers": [object.union(container, c)]}

apply(o) := {"plugin": plugin, "resource": resource, "action": {"verb": "apply", "object": o}}

denied(input_doc, rule) if {
	msgs := guardrails.deny with input as input_doc
	some msg in msgs
	startswith(msg, concat("", [rule, ": "]))
}

test_compliant_statefulset_allowed if {
	count(guardrails.deny) == 0 with input as apply(sts(good_pod))
	count(guardrails.warn) == 0 with input as apply(sts(good_pod))
}

test_unknown_verb_denied if {
	denied({"plugin": plugin, "resource": resource, "action": {"verb": "exec", "object": sts(good_pod)}}, "unknown-verb")
}

test_kind_not_owned_denied if {
	denied(apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "x"}}), "kind-not-owned")
}

test_owned_kind_allowed if {
	not denied(apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "main"}}), "kind-not-owned")
}

test_ensure_secret_needs_no_declared_kind if {
	inp := {"plugin": plugin, "resource": resource, "action": {"verb": "ensure-secret", "object": {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "main-credentials"}}}}
	count(guardrails.deny) == 0 with input as inp
}

test_delete_of_owned_kind_allowed if {
	inp := {"plugin": plugin, "resource": resource, "action": {"verb": "delete", "object": {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "old"}}}}
	count(guardrails.deny) == 0 with input as inp
}

test_foreign_namespace_denied if {
	o := object.union(sts(good_pod), {"metadata": {"name": "main", "namespace": "kube-system"}})
	denied(apply(o), "foreign-namespace")
}

test_missing_namespace_allowed if {
	o := object.union(sts(good_pod), {"metadata": {"name": "main"}})
	not denied(apply(object.remove(o, ["metadata"])), "foreign-namespace")
	not denied(apply({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "main"}, "spec": {"template": {"spec": good_pod}}}), "foreign-namespace")
}

test_privileged_denied if {
	denied(apply(sts(with_container({"securityContext": {"runAsNonRoot": true, "privileged": true}}))), "privileged")
}

test_privileged_init_container_denied if {
	pod := {"initContainers": [object.union(container, {"name": "init", "securityContext": {"runAsNonRoot": true, "privileged": true}})], "containers": [container]}
	denied(apply(sts(pod)), "privileged")
}

test_host_network_denied if {
	denied(apply(sts(object.union(good_pod, {"hostNetwork": true}))), "host-namespace")
}

test_host_pid_denied if {
	denied(apply(sts(object.union(good_pod, {"hostPID": true}))), "host-namespace")
}

test_host_path_denied if {
	pod := object.union(good_pod, {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]})
	denied(apply(sts(pod)), "host-path")
}

test_empty_dir_allowed if {
	pod := object.union(good_pod, {"volumes": [{"name": "scratch", "emptyDir": {}}]})
	count(guardrails.deny) == 0 with input as apply(sts(pod))
}

test_added_capabilities_denied if {
	c := {"securityContext": {"runAsNonRoot": true, "capabilities": {"add": ["NET_ADMIN"]}}}
	denied(apply(sts(with_container(c))), "added-capabilities")
}

test_dropped_capabilities_allowed if {
	c := {"securityContext": {"runAsNonRoot": true, "capabilities": {"drop": ["ALL"]}}}
	count(guardrails.deny) == 0 with input as apply(sts(with_container(c)))
}

test_run_as_root_denied if {
	c := object.remove(container, ["securityContext"])
	denied(apply(sts({"containers": [c]})), "run-as-non-root")
}

test_pod_level_run_as_non_root_allowed if {
	c := object.remove(container, ["securityContext"])
	pod := {"securityContext": {"runAsNonRoot": true}, "containers": [c]}
	count(guardrails.deny) == 0 with input as apply(sts(pod))
}

test_container_overrides_pod_run_as_non_root_denied if {
	pod := {"securityContext": {"runAsNonRoot": true}, "containers": [object.union(container, {"securityContext": {"runAsNonRoot": false}})]}
	denied(apply(sts(pod)), "run-as-non-root")
}

test_missing_limits_denied if {
	c := object.union(object.remove(container, ["resources"]), {"resources": {"limits": {"cpu": "1"}}})
	denied(apply(sts({"containers": [c]})), "resource-limits")
}

test_no_resources_denied if {
	c := object.remove(container, ["resources"])
	denied(apply(sts({"containers": [c]})), "resource-limits")
}

test_pdb_max_unavailable_one_allowed if {
	pdb := {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "main"}, "spec": {"maxUnavailable": 1}}
	count(guardrails.deny) == 0 with input as apply(pdb)
}

test_pdb_max_unavailable_two_denied if {
	pdb := {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "main"}, "spec": {"maxUnavailable": 2}}
	denied(apply(pdb), "pdb-max-unavailable")
}

test_pdb_max_unavailable_percent_denied if {
	pdb := {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "main"}, "spec": {"maxUnavailable": "50%"}}
	denied(apply(pdb), "pdb-max-unavailable")
}

test_image_from_unknown_registry_denied if {
	denied(apply(sts(with_container({"image": "evil.example/postgres:16"}))), "image-registry")
}

test_image_registry_list_comes_from_data if {
	inp := apply(sts(with_container({"image": "evil.example/postgres:16"})))
	count(guardrails.deny) == 0 with input as inp with data.stateward.config.guardrails.allowed_registries as ["evil.example/"]
}

test_latest_image_warns_but_is_not_denied if {
	inp := apply(sts(with_container({"image": "docker.io/library/postgres:latest"})))
	count(guardrails.deny) == 0 with input as inp
	warnings := guardrails.warn with input as inp
	some msg in warnings
	startswith(msg, "image-tag: ")
}

test_digest_pinned_image_no_warning if {
	inp := apply(sts(with_container({"image": "docker.io/library/postgres@sha256:1111111111111111111111111111111111111111111111111111111111111111"})))
	count(guardrails.warn) == 0 with input as inp
}

test_cronjob_pod_checked if {
	plugin_cj := object.union(plugin, {"owns": [{"apiVersion": "batch/v1", "kind": "CronJob"}]})
	cj := {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "backup"}, "spec": {"jobTemplate": {"spec": {"template": {"spec": object.union(good_pod, {"hostNetwork": true})}}}}}
	inp := {"plugin": plugin_cj, "resource": resource, "action": {"verb": "apply", "object": cj}}
	msgs := guardrails.deny with input as inp
	some msg in msgs
	startswith(msg, "host-namespace: ")
}

test_image_without_registry_is_docker_hub if {
	guardrails.allowed_image("postgres:17.2")
	guardrails.allowed_image("redis:7.4")
	not guardrails.allowed_image("bitnami/redis:7")
	guardrails.allowed_image("docker.elastic.co/elasticsearch/elasticsearch:8.15.0")
	not guardrails.allowed_image("evil.example:5000/postgres:17")
	not guardrails.allowed_image("localhost/postgres:17")
}

test_registry_port_is_not_a_tag if {
	guardrails.pinned("quay.io:443/postgres:17")
	not guardrails.pinned("quay.io:443/postgres")
	not guardrails.pinned("postgres@sha1:1111")
	guardrails.allowed_image("quay.io/postgres")
	not guardrails.allowed_image("quay.io:443/postgres:17")
}

# The first definitions of allowed_image and pinned only cover common cases; these are decided
# by the general ones.
test_image_fast_paths_agree_with_general_rule if {
	not guardrails.allowed_image("bitnami/redis:7") with data.stateward.config.guardrails.allowed_registries as ["bitnami/"]
	guardrails.allowed_image("bitnami/redis:7") with data.stateward.config.guardrails.allowed_registries as ["docker.io/bitnami/"]
	guardrails.allowed_image("my.registry/x:1") with data.stateward.config.guardrails.allowed_registries as ["my.registry/"]
	not guardrails.allowed_image("x/my.registry:1") with data.stateward.config.guardrails.allowed_registries as ["x/"]
	guardrails.pinned("quay.io/postgres:17@sha256:1111")
	not guardrails.pinned("quay.io/postgres@17:1")
	not guardrails.pinned("quay.io/postgres:latest")
}

test_host_namespace_only_when_true if {
	denied(apply(sts({"hostPID": true, "containers": [container]})), "host-namespace")
	count(guardrails.deny) == 0 with input as apply(sts({"hostNetwork": false, "hostIPC": "true", "containers": [container]}))
}

test_delete_skips_pod_checks if {
	o := sts({"hostNetwork": true, "containers": [object.union(container, {"securityContext": {"privileged": true}})]})
	count(guardrails.deny) == 0 with input as {"plugin": plugin, "resource": resource, "action": {"verb": "delete", "object": o}}
}

test_declared_kind_with_more_fields_is_owned if {
	p := object.union(plugin, {"owns": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "group": "apps"}]})
	count(guardrails.deny) == 0 with input as {"plugin": p, "resource": resource, "action": {"verb": "apply", "object": sts(good_pod)}}
}
