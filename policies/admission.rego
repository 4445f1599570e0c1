# Admission: who may change what on stateward custom resources. Input is the admission
# request's essentials:
#   {operation, userInfo:{username, groups}, object, oldObject, dryRun}
# Role bindings live in data.stateward.config.admission: `roles` maps a role to the
# permissions it grants, `role_bindings` binds a group or a user to a role.
#
# Every message starts with "<rule-id>: " (see guardrails.rego).
package stateward.admission

cfg := data.stateward.config.admission

op := object.get(input, "operation", "")

username := object.get(input, ["userInfo", "username"], "")

groups := object.get(input, ["userInfo", "groups"], [])

new_spec := object.get(input, ["object", "spec"], {})

old_spec := object.get(input, ["oldObject", "spec"], {})

bound(b) if b.group in groups

bound(b) if b.user == username

# permitted(p) is true when one of the caller's bindings grants permission p.
permitted(p) if {
	some b in cfg.role_bindings
	bound(b)
	p in cfg.roles[b.role]
}

deny contains msg if {
	op in {"CREATE", "UPDATE"}
	new_spec.retentionPolicy == "Delete"
	object.get(old_spec, "retentionPolicy", "") != "Delete"
	not permitted("set-retention-delete")
	msg := sprintf("retention-delete: %s may not set retentionPolicy: Delete", [username])
}

deny contains msg if {
	op == "UPDATE"
	old_spec.deletionProtection == true
	object.get(new_spec, "deletionProtection", false) != true
	not permitted("disable-deletion-protection")
	msg := sprintf("deletion-protection-off: %s may not turn off deletionProtection", [username])
}

deny contains msg if {
	op == "DELETE"
	old_spec.deletionProtection == true
	not permitted("delete-protected")
	msg := sprintf("delete-protected: %s may not delete a cluster with deletionProtection", [username])
}

deny contains msg if {
	op == "UPDATE"
	step := old_spec.replicas - new_spec.replicas
	step > 1
	not permitted("scale-down-fast")
	msg := sprintf("scale-down: %s may not scale down by more than one replica at a time (%s -> %s)", [username, format_int(old_spec.replicas, 10), format_int(new_spec.replicas, 10)])
}

# --- lifecycle verbs -------------------------------------------------------------------------
# Each stops or moves a running service without touching its shape: hibernating stops every
# member, pausing stops failover, fencing takes members out of service, a switchover moves the
# primary. Turning one on (or changing whom it names) takes the permission of the same name;
# turning it off again (waking, resuming, the annotation removed, as the operator does once a
# switchover is done) does not, except that unfencing does: a fenced member may hold data that
# must not serve.

new_annotations := object.get(input, ["object", "metadata", "annotations"], {})

old_annotations := object.get(input, ["oldObject", "metadata", "annotations"], {})

# [permission, rule id, what the change does] of every lifecycle change this update makes.
lifecycle contains ["hibernate", "lifecycle-hibernate", "hibernate (stop every member of)"] if {
	object.get(new_spec, "hibernate", false) == true
	object.get(old_spec, "hibernate", false) != true
}

lifecycle contains ["pause", "lifecycle-pause", "pause (stop failover of)"] if {
	object.get(new_spec, "paused", false) == true
	object.get(old_spec, "paused", false) != true
}

lifecycle contains ["fence", "lifecycle-fence", "change which members are fenced in"] if {
	object.get(new_annotations, "stateward.dev/fenced-instances", "") != object.get(old_annotations, "stateward.dev/fenced-instances", "")
}

lifecycle contains ["switchover", "lifecycle-switchover", "ask for a switchover in"] if {
	to := object.get(new_annotations, "stateward.dev/switchover-to", "")
	to != ""
	to != object.get(old_annotations, "stateward.dev/switchover-to", "")
}

deny contains msg if {
	op == "UPDATE"
	some [permission, rule, what] in lifecycle
	not permitted(permission)
	name := object.get(input, ["object", "metadata", "name"], "")
	msg := sprintf("%s: %s may not %s %s (permission %s)", [rule, username, what, name, permission])
}

warn contains msg if {
	op in {"CREATE", "UPDATE"}
	new_spec.replicas == 1
	msg := "single-replica: one replica has no high availability"
}
