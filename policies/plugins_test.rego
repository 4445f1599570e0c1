package stateward.plugins_test

import data.stateward.plugins

digest_a := "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

digest_b := "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

# A ConfigMap build after info(), as the host builds it.
load(name, digest, size) := {
	"name": name,
	"version": "0.1.0",
	"digest": digest,
	"size": size,
	"kinds": [{"apiVersion": "stateward.dev/v1alpha1", "kind": "PostgresCluster"}],
	"source": "configmap",
	"stage": "loaded",
	"configMap": {"name": sprintf("stateward-plugin-%s", [name]), "labels": {"stateward.dev/plugin": name}},
}

# A build from the image's plugin directory.
builtin(name, digest) := object.union(json.remove(load(name, digest, 1000), ["configMap"]), {"source": "builtin"})

denied(input_doc, rule) if {
	msgs := plugins.deny with input as input_doc
	some msg in msgs
	startswith(msg, concat("", [rule, ": "]))
}

test_known_plugin_allowed if {
	count(plugins.deny) == 0 with input as load("postgres", digest_a, 500000)
}

test_known_unpinned_plugin_warns if {
	warnings := plugins.warn with input as load("postgres", digest_a, 500000)
	count(warnings) == 1
}

test_unknown_plugin_denied if {
	denied(load("cryptominer", digest_a, 1000), "unknown-plugin")
}

test_bad_digest_format_denied if {
	denied(load("postgres", "md5:abc", 1000), "digest-format")
}

test_pinned_digest_allowed if {
	allowed := {"postgres": {"digests": [digest_a]}}
	inp := load("postgres", digest_a, 1000)
	count(plugins.deny) == 0 with input as inp with data.stateward.config.plugins.allowed as allowed
	count(plugins.warn) == 0 with input as inp with data.stateward.config.plugins.allowed as allowed
}

test_unpinned_digest_denied if {
	allowed := {"postgres": {"digests": [digest_a]}}
	msgs := plugins.deny with input as load("postgres", digest_b, 1000) with data.stateward.config.plugins.allowed as allowed
	some msg in msgs
	startswith(msg, "digest-pin: ")
}

test_oversized_plugin_denied if {
	denied(load("postgres", digest_a, 2000000), "size")
}

test_size_at_limit_allowed if {
	not denied(load("postgres", digest_a, 1048576), "size")
}

test_undeclared_kind_denied if {
	allowed := {"postgres": {"digests": [], "kinds": [{"apiVersion": "stateward.dev/v1alpha1", "kind": "RedisCluster"}]}}
	msgs := plugins.deny with input as load("postgres", digest_a, 1000) with data.stateward.config.plugins.allowed as allowed
	some msg in msgs
	startswith(msg, "kinds: ")
}

test_declared_kind_allowed if {
	allowed := {"postgres": {"digests": [], "kinds": [{"apiVersion": "stateward.dev/v1alpha1", "kind": "PostgresCluster"}]}}
	count(plugins.deny) == 0 with input as load("postgres", digest_a, 1000) with data.stateward.config.plugins.allowed as allowed
}

from_configmap(name, digest, stage) := object.union(load(name, digest, 1000), {"stage": stage})

# The hardened profile: a ConfigMap build loads only with a pinned digest, at both stages;
# built-in builds (the image) are not affected.
test_hardened_profile_refuses_an_unpinned_configmap_build if {
	some stage in ["before-compile", "loaded"]
	msgs := plugins.deny with input as from_configmap("postgres", digest_a, stage) with data.stateward.config.plugins.require_pins as true
	some msg in msgs
	msg == sprintf("digest-pin: plugin postgres digest %s is not pinned", [digest_a])
}

test_hardened_profile_loads_a_build_pinned_by_flag if {
	pins := {"postgres": [digest_a]}
	inp := from_configmap("postgres", digest_a, "before-compile")
	count(plugins.deny) == 0 with input as inp with data.stateward.config.plugins.require_pins as true with data.stateward.config.plugins.pins as pins
	denied(from_configmap("postgres", digest_b, "loaded"), "digest-pin") with data.stateward.config.plugins.pins as pins
}

test_hardened_profile_leaves_builtin_builds_alone if {
	count(plugins.deny) == 0 with input as builtin("postgres", digest_a) with data.stateward.config.plugins.require_pins as true
}

test_before_compile_unknown_plugin_denied if {
	denied(from_configmap("cryptominer", digest_a, "before-compile"), "unknown-plugin")
}
