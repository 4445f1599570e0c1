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
