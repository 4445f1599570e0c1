package stateward.admission_test

import data.stateward.admission

admin := {"username": "alice", "groups": ["stateward:admins", "system:authenticated"]}

dev := {"username": "bob", "groups": ["developers", "system:authenticated"]}

cluster(spec) := {"apiVersion": "stateward.dev/v1alpha1", "kind": "PostgresCluster", "metadata": {"name": "main", "namespace": "db"}, "spec": spec}

req(op, user, new, old) := {"operation": op, "userInfo": user, "object": new, "oldObject": old, "dryRun": false}

denied(input_doc, rule) if {
	msgs := admission.deny with input as input_doc
	some msg in msgs
	startswith(msg, concat("", [rule, ": "]))
}

test_plain_create_allowed if {
	count(admission.deny) == 0 with input as req("CREATE", dev, cluster({"replicas": 3, "retentionPolicy": "Retain"}), null)
}

test_retention_delete_by_developer_denied if {
	denied(req("CREATE", dev, cluster({"replicas": 3, "retentionPolicy": "Delete"}), null), "retention-delete")
}

test_retention_delete_by_admin_allowed if {
	count(admission.deny) == 0 with input as req("CREATE", admin, cluster({"replicas": 3, "retentionPolicy": "Delete"}), null)
}

test_retention_delete_unchanged_allowed if {
	spec := {"replicas": 3, "retentionPolicy": "Delete"}
	count(admission.deny) == 0 with input as req("UPDATE", dev, cluster(spec), cluster(spec))
}

test_retention_delete_by_user_binding_allowed if {
	inp := req("UPDATE", dev, cluster({"replicas": 3, "retentionPolicy": "Delete"}), cluster({"replicas": 3}))
	bindings := [{"user": "bob", "role": "admin"}]
	count(admission.deny) == 0 with input as inp with data.stateward.config.admission.role_bindings as bindings
}

test_disable_deletion_protection_by_developer_denied if {
	denied(req("UPDATE", dev, cluster({"replicas": 3, "deletionProtection": false}), cluster({"replicas": 3, "deletionProtection": true})), "deletion-protection-off")
}

test_remove_deletion_protection_field_denied if {
	denied(req("UPDATE", dev, cluster({"replicas": 3}), cluster({"replicas": 3, "deletionProtection": true})), "deletion-protection-off")
}

test_disable_deletion_protection_by_admin_allowed if {
	count(admission.deny) == 0 with input as req("UPDATE", admin, cluster({"replicas": 3, "deletionProtection": false}), cluster({"replicas": 3, "deletionProtection": true}))
}

test_delete_protected_by_developer_denied if {
	denied(req("DELETE", dev, null, cluster({"replicas": 3, "deletionProtection": true})), "delete-protected")
}

test_delete_protected_by_admin_allowed if {
	count(admission.deny) == 0 with input as req("DELETE", admin, null, cluster({"replicas": 3, "deletionProtection": true}))
}

test_delete_unprotected_allowed if {
	count(admission.deny) == 0 with input as req("DELETE", dev, null, cluster({"replicas": 3}))
}

test_scale_down_by_one_allowed if {
	count(admission.deny) == 0 with input as req("UPDATE", dev, cluster({"replicas": 4}), cluster({"replicas": 5}))
}

test_scale_down_by_two_denied if {
	denied(req("UPDATE", dev, cluster({"replicas": 3}), cluster({"replicas": 5})), "scale-down")
}

test_scale_down_by_two_admin_allowed if {
	count(admission.deny) == 0 with input as req("UPDATE", admin, cluster({"replicas": 3}), cluster({"replicas": 5}))
}

test_scale_up_allowed if {
	count(admission.deny) == 0 with input as req("UPDATE", dev, cluster({"replicas": 9}), cluster({"replicas": 3}))
}

test_single_replica_warns if {
	inp := req("CREATE", dev, cluster({"replicas": 1}), null)
	count(admission.deny) == 0 with input as inp
	warnings := admission.warn with input as inp
	count(warnings) == 1
}

operator := {"username": "carol", "groups": ["stateward:operators", "system:authenticated"]}

annotated(spec, annotations) := object.union(cluster(spec), {"metadata": {"annotations": annotations}})

test_hibernate_by_developer_denied if {
	denied(req("UPDATE", dev, cluster({"replicas": 3, "hibernate": true}), cluster({"replicas": 3})), "lifecycle-hibernate")
}

test_hibernate_by_operator_group_allowed if {
	count(admission.deny) == 0 with input as req("UPDATE", operator, cluster({"replicas": 3, "hibernate": true}), cluster({"replicas": 3}))
}

test_waking_and_resuming_need_no_permission if {
	old := cluster({"replicas": 3, "hibernate": true, "paused": true})
	count(admission.deny) == 0 with input as req("UPDATE", dev, cluster({"replicas": 3, "hibernate": false, "paused": false}), old)
}

test_pause_by_developer_denied if {
	denied(req("UPDATE", dev, cluster({"replicas": 3, "paused": true}), cluster({"replicas": 3})), "lifecycle-pause")
}

test_fence_and_unfence_by_developer_denied if {
	fenced := annotated({"replicas": 3}, {"stateward.dev/fenced-instances": "[\"main-1\"]"})
	denied(req("UPDATE", dev, fenced, cluster({"replicas": 3})), "lifecycle-fence")
	denied(req("UPDATE", dev, cluster({"replicas": 3}), fenced), "lifecycle-fence")
}

test_fence_by_admin_allowed if {
	fenced := annotated({"replicas": 3}, {"stateward.dev/fenced-instances": "[\"main-1\"]"})
	count(admission.deny) == 0 with input as req("UPDATE", admin, fenced, cluster({"replicas": 3}))
}

test_switchover_by_developer_denied_removal_allowed if {
	asked := annotated({"replicas": 3}, {"stateward.dev/switchover-to": "main-2"})
	denied(req("UPDATE", dev, asked, cluster({"replicas": 3})), "lifecycle-switchover")
	count(admission.deny) == 0 with input as req("UPDATE", dev, cluster({"replicas": 3}), asked)
}

test_lifecycle_by_user_binding_allowed if {
	asked := annotated({"replicas": 3}, {"stateward.dev/switchover-to": "main-2"})
	bindings := [{"user": "bob", "role": "lifecycle"}]
	count(admission.deny) == 0 with input as req("UPDATE", dev, asked, cluster({"replicas": 3})) with data.stateward.config.admission.role_bindings as bindings
}

test_lifecycle_unchanged_allowed if {
	spec := {"replicas": 3, "hibernate": true, "paused": true}
	same := annotated(spec, {"stateward.dev/fenced-instances": "[\"main-1\"]", "stateward.dev/switchover-to": "main-2"})
	count(admission.deny) == 0 with input as req("UPDATE", dev, same, same)
}
