package stateward.plugins_test

import data.stateward.plugins

digest_a := "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

digest_b := "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

load(name, digest, size) := {
	"name": name,
	"version": "0.1.0",
	"digest": digest,
	"size": size,
	"kinds": [{"apiVersion": "stateward.dev/v1alpha1", "kind": "PostgresCluster"}],
}

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
