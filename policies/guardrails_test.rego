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
	"securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false},
	"resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
}

sts(pod) := {
	"apiVersion": "apps/v1",
	"kind": "StatefulSet",
	"metadata": {"name": "main", "namespace": "db"},
	"spec": {"replicas": 3, "template": {"spec": pod}},
}

good_pod := {"automountServiceAccountToken": false, "containers": [container]}

with_container(c) := {"automountServiceAccountToken": false, "containers": [object.union(container, c)]}

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
	denied({"plugin": plugin, "resource": resource, "action": {"verb": "patch", "object": sts(good_pod)}}, "unknown-verb")
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

status_write(bytes) := {"plugin": plugin, "resource": resource, "action": {"verb": "status", "object": {"apiVersion": "stateward.dev/v1alpha1", "kind": "PostgresCluster", "metadata": {"name": "main"}, "status": {"keys": ["instances"], "bytes": bytes}}}}

test_status_write_within_the_limit_allowed if {
	count(guardrails.deny) == 0 with input as status_write(2048)
}

test_status_write_past_the_limit_denied if {
	some msg in guardrails.deny with input as status_write(16385)
	startswith(msg, "status-too-large: PostgresCluster main reports 16385 bytes")
}

test_status_limit_comes_from_data if {
	count(guardrails.deny) == 0 with input as status_write(16385)
		with data.stateward.config.guardrails.max_status_bytes as 32768
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
	pod := {"initContainers": [object.union(container, {"name": "init", "securityContext": {"runAsNonRoot": true, "privileged": true}})], "containers": [container], "automountServiceAccountToken": false}
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
	c := {"securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}
	count(guardrails.deny) == 0 with input as apply(sts(with_container(c)))
}

test_run_as_root_denied if {
	c := object.remove(container, ["securityContext"])
	denied(apply(sts({"containers": [c]})), "run-as-non-root")
}

test_pod_level_run_as_non_root_allowed if {
	c := object.remove(container, ["securityContext"])
	pod := {"securityContext": {"runAsNonRoot": true}, "containers": [object.union(c, {"securityContext": {"allowPrivilegeEscalation": false}})], "automountServiceAccountToken": false}
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
	guardrails.allowed_image("registry.k8s.io/postgres")
	not guardrails.allowed_image("registry.k8s.io:443/postgres:17")
}

# Anyone can publish under quay.io/: the shipped list names no such registry; an administrator
# adds the organisations they trust.
test_any_quay_image_is_not_admitted if {
	not guardrails.allowed_image("quay.io/anyone/postgres:17")
	guardrails.allowed_image("quay.io/trusted/postgres:17") with data.stateward.config.guardrails.allowed_registries as ["quay.io/trusted/"]
}

# --- identity and node access -------------------------------------------------------------

test_service_account_denied_unless_listed if {
	denied(apply(sts(object.union(good_pod, {"serviceAccountName": "stateward"}))), "service-account")
	denied(apply(sts(object.union(good_pod, {"serviceAccount": "admin"}))), "service-account")
	count(guardrails.deny) == 0 with input as apply(sts(object.union(good_pod, {"serviceAccountName": "default"})))
	count(guardrails.deny) == 0 with input as apply(sts(object.union(good_pod, {"serviceAccountName": "backup"}))) with data.stateward.config.guardrails.allowed_service_accounts as ["backup"]
}

test_service_account_token_must_be_off if {
	denied(apply(sts(object.remove(good_pod, ["automountServiceAccountToken"]))), "service-account-token")
	denied(apply(sts(object.union(good_pod, {"automountServiceAccountToken": true}))), "service-account-token")
}

test_host_port_denied if {
	denied(apply(sts(with_container({"ports": [{"containerPort": 5432, "hostPort": 5432}]}))), "host-port")
	count(guardrails.deny) == 0 with input as apply(sts(with_container({"ports": [{"containerPort": 5432}]})))
	count(guardrails.deny) == 0 with input as apply(sts(with_container({"ports": [{"containerPort": 5432, "hostPort": 0}]})))
}

test_node_volume_types_denied if {
	every v in [{"name": "d", "iscsi": {}}, {"name": "d", "fc": {}}, {"name": "d", "rbd": {}}, {"name": "d", "flexVolume": {"driver": "x"}}, {"name": "d", "nfs": {"server": "x", "path": "/"}}] {
		denied(apply(sts(object.union(good_pod, {"volumes": [v]}))), "volume-type")
	}
	ok := [{"name": "a", "configMap": {"name": "c"}}, {"name": "b", "secret": {"secretName": "s"}}, {"name": "c", "persistentVolumeClaim": {"claimName": "p"}}, {"name": "d", "projected": {"sources": []}}, {"name": "e", "emptyDir": {}}]
	count(guardrails.deny) == 0 with input as apply(sts(object.union(good_pod, {"volumes": ok})))
	# hostPath is named by its own rule only.
	msgs := guardrails.deny with input as apply(sts(object.union(good_pod, {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]})))
	msgs == {"host-path: volume root mounts a host path"}
}

test_seccomp_unconfined_denied if {
	denied(apply(sts(object.union(good_pod, {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}))), "seccomp-unconfined")
	denied(apply(sts(with_container({"securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false, "seccompProfile": {"type": "Unconfined"}}}))), "seccomp-unconfined")
	count(guardrails.deny) == 0 with input as apply(sts(object.union(good_pod, {"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}}})))
}

test_privilege_escalation_must_be_off if {
	c := object.union(object.remove(container, ["securityContext"]), {"securityContext": {"runAsNonRoot": true}})
	denied(apply(sts(object.union(good_pod, {"containers": [c]}))), "privilege-escalation")
	denied(apply(sts(with_container({"securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": true}}))), "privilege-escalation")
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
	count(guardrails.deny) == 0 with input as apply(sts({"hostNetwork": false, "hostIPC": "true", "containers": [container], "automountServiceAccountToken": false}))
}

test_delete_skips_pod_checks if {
	o := sts({"hostNetwork": true, "containers": [object.union(container, {"securityContext": {"privileged": true}})]})
	count(guardrails.deny) == 0 with input as {"plugin": plugin, "resource": resource, "action": {"verb": "delete", "object": o}}
}

test_declared_kind_with_more_fields_is_owned if {
	p := object.union(plugin, {"owns": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "group": "apps"}]})
	count(guardrails.deny) == 0 with input as {"plugin": p, "resource": resource, "action": {"verb": "apply", "object": sts(good_pod)}}
}

# --- scheduling ---------------------------------------------------------------------------

toleration(key, operator) := {"key": key, "operator": operator, "effect": "NoSchedule"}

test_ordinary_tolerations_allowed if {
	pod := object.union(good_pod, {"tolerations": [toleration("dedicated", "Exists"), {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]})
	count(guardrails.deny) == 0 with input as apply(sts(pod))
}

test_control_plane_tolerations_denied if {
	every key in ["node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"] {
		denied(apply(sts(object.union(good_pod, {"tolerations": [toleration(key, "Exists")]}))), "control-plane-toleration")
	}
	# Equal, or another effect, still names the taint.
	denied(apply(sts(object.union(good_pod, {"tolerations": [{"key": "node-role.kubernetes.io/master", "operator": "Equal", "value": ""}]}))), "control-plane-toleration")
}

test_toleration_of_every_taint_denied if {
	denied(apply(sts(object.union(good_pod, {"tolerations": [{"operator": "Exists"}]}))), "control-plane-toleration")
	denied(apply(sts(object.union(good_pod, {"tolerations": [{"key": "", "operator": "Exists", "effect": "NoSchedule"}]}))), "control-plane-toleration")
	msgs := guardrails.deny with input as apply(sts(object.union(good_pod, {"tolerations": [{"operator": "Exists"}]})))
	msgs == {"control-plane-toleration: StatefulSet main tolerates every taint (empty key, operator Exists)"}
}

test_control_plane_toleration_allowed_by_data if {
	pod := object.union(good_pod, {"tolerations": [toleration("node-role.kubernetes.io/control-plane", "Exists"), {"operator": "Exists"}]})
	count(guardrails.deny) == 0 with input as apply(sts(pod)) with data.stateward.config.guardrails.allow_control_plane_tolerations as true
	# Anything but true is no consent.
	denied(apply(sts(pod)), "control-plane-toleration") with data.stateward.config.guardrails.allow_control_plane_tolerations as "true"
}

test_system_priority_classes_denied if {
	every pc in ["system-node-critical", "system-cluster-critical"] {
		denied(apply(sts(object.union(good_pod, {"priorityClassName": pc}))), "system-priority-class")
	}
	msgs := guardrails.deny with input as apply(sts(object.union(good_pod, {"priorityClassName": "system-node-critical"})))
	msgs == {"system-priority-class: StatefulSet main uses priorityClassName system-node-critical"}
}

test_other_priority_classes_allowed if {
	count(guardrails.deny) == 0 with input as apply(sts(object.union(good_pod, {"priorityClassName": "databases"})))
	count(guardrails.deny) == 0 with input as apply(sts(object.union(good_pod, {"priorityClassName": "system-databases"})))
}

test_system_priority_class_allowed_by_data if {
	pod := object.union(good_pod, {"priorityClassName": "system-cluster-critical"})
	count(guardrails.deny) == 0 with input as apply(sts(pod)) with data.stateward.config.guardrails.allowed_system_priority_classes as ["system-cluster-critical"]
	denied(apply(sts(object.union(good_pod, {"priorityClassName": "system-node-critical"}))), "system-priority-class") with data.stateward.config.guardrails.allowed_system_priority_classes as ["system-cluster-critical"]
}

test_scheduling_rules_skip_deletes if {
	o := sts(object.union(good_pod, {"priorityClassName": "system-node-critical", "tolerations": [{"operator": "Exists"}]}))
	count(guardrails.deny) == 0 with input as {"plugin": plugin, "resource": resource, "action": {"verb": "delete", "object": o}}
}

# --- requests to the running service --------------------------------------------------------

pod_owner := object.union(plugin, {"owns": array.concat(plugin.owns, [{"apiVersion": "v1", "kind": "Pod"}])})

pod_target(labels, extra) := object.union(
	{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": {"name": "main-0", "namespace": "db", "labels": labels},
		"declaredPorts": [5432, 8008],
	},
	extra,
)

own_labels := {"stateward.dev/instance": "main"}

request(verb, o) := {"plugin": pod_owner, "resource": resource, "action": {"verb": verb, "object": o}}

exec_of(cmd) := {"exec": {"id": "role-0", "mode": {"every": 10000}, "timeoutMs": 5000, "container": "postgres", "command": cmd, "stdinBytes": 0}}

http_to(port) := {"http": {"id": "health", "mode": "once", "timeoutMs": 5000, "port": port, "method": "GET", "path": "/health", "tls": false, "headers": [], "bodyBytes": 0, "basicAuthSecret": null}}

test_exec_of_a_listed_command_into_an_own_pod_allowed if {
	count(guardrails.deny) == 0 with input as request("exec", pod_target(own_labels, exec_of(["psql", "-c", "select 1"])))
}

test_exec_into_another_instances_pod_denied if {
	denied(request("exec", pod_target({"stateward.dev/instance": "other"}, exec_of(["psql"]))), "foreign-target")
}

test_exec_into_an_unobserved_pod_denied if {
	denied(request("exec", pod_target({}, exec_of(["psql"]))), "foreign-target")
}

test_exec_of_an_unlisted_command_denied if {
	denied(request("exec", pod_target(own_labels, exec_of(["sh", "-c", "rm -rf /"]))), "exec-command-not-allowed")
}

test_exec_needs_the_pod_kind_owned if {
	denied({"plugin": plugin, "resource": resource, "action": {"verb": "exec", "object": pod_target(own_labels, exec_of(["psql"]))}}, "kind-not-owned")
}

test_http_to_a_declared_port_allowed if {
	count(guardrails.deny) == 0 with input as request("http", pod_target(own_labels, http_to(8008)))
}

test_http_to_an_undeclared_port_denied if {
	denied(request("http", pod_target(own_labels, http_to(22))), "http-port-not-declared")
}

test_http_to_another_instance_denied if {
	denied(request("http", pod_target({"stateward.dev/instance": "other"}, http_to(8008))), "foreign-target")
}

test_label_pod_of_another_instance_denied if {
	o := pod_target({"stateward.dev/instance": "other"}, {"set": {"labels": {"role": "primary"}, "annotations": {}}})
	denied(request("label-pod", o), "foreign-target")
}

test_label_own_pod_allowed if {
	o := pod_target(own_labels, {"set": {"labels": {"role": "primary"}, "annotations": {}}})
	count(guardrails.deny) == 0 with input as request("label-pod", o)
}

service(spec) := {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "main-rw", "namespace": "db"}, "spec": spec}

own_selector := {"app.kubernetes.io/name": "postgres", "stateward.dev/instance": "main", "stateward.dev/role": "primary"}

test_service_selecting_its_instance_allowed if {
	count(guardrails.deny) == 0 with input as apply(service({"selector": own_selector, "ports": [{"port": 5432}]}))
}

test_service_without_the_instance_selector_denied if {
	denied(apply(service({"selector": {"app": "billing"}, "ports": [{"port": 80}]})), "service-selector")
	denied(apply(service({"ports": [{"port": 80}]})), "service-selector")
}

test_service_selecting_its_instance_by_the_common_label_allowed if {
	svc := service({"selector": {"app.kubernetes.io/name": "postgres", "app.kubernetes.io/instance": "main"}})
	count(guardrails.deny) == 0 with input as apply(svc)
}

test_service_selecting_another_instance_denied if {
	denied(apply(service({"selector": {"app.kubernetes.io/instance": "other"}})), "service-selector")
	denied(apply(service({"selector": object.union(own_selector, {"stateward.dev/instance": "other"})})), "service-selector")
}

test_service_types_reaching_out_denied_unless_allowed if {
	every t in ["NodePort", "LoadBalancer", "ExternalName"] {
		denied(apply(service({"selector": own_selector, "type": t})), "service-type")
	}
	not denied(apply(service({"selector": own_selector, "type": "NodePort"})), "service-type") with data.stateward.config.guardrails.allowed_service_types as ["NodePort"]
}

test_service_external_ips_denied_unless_allowed if {
	svc := service({"selector": own_selector, "externalIPs": ["203.0.113.7"]})
	denied(apply(svc), "service-external-ips")
	not denied(apply(svc), "service-external-ips") with data.stateward.config.guardrails.allow_external_ips as true
}

test_deleting_a_service_needs_no_selector if {
	inp := {"plugin": plugin, "resource": resource, "action": {"verb": "delete", "object": {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "main-rw"}}}}
	count(guardrails.deny) == 0 with input as inp
}
