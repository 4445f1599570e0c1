# Plugins: which plugin builds may load. Input: {name, version, digest, size, kinds}
# where digest is "sha256:<hex>", size is in bytes and kinds lists {apiVersion, kind}.
# data.stateward.config.plugins.allowed maps a plugin name to optional `digests` pins
# (empty: any build) and optional `kinds` (the kinds it may declare).
#
# Every message starts with "<rule-id>: " (see guardrails.rego).
package stateward.plugins

cfg := data.stateward.config.plugins

name := object.get(input, "name", "")

digest := object.get(input, "digest", "")

entry := cfg.allowed[name]

deny contains msg if {
	not entry
	msg := sprintf("unknown-plugin: plugin %s is not on the allow-list", [name])
}

deny contains msg if {
	not regex.match(`^sha256:[0-9a-f]{64}$`, digest)
	msg := sprintf("digest-format: plugin %s digest %s is not sha256:<64 hex>", [name, digest])
}

deny contains msg if {
	count(object.get(entry, "digests", [])) > 0
	not digest in entry.digests
	msg := sprintf("digest-pin: plugin %s digest %s is not pinned", [name, digest])
}

deny contains msg if {
	size := object.get(input, "size", 0)
	not size <= cfg.max_size_bytes
	msg := sprintf("size: plugin %s is %s bytes, more than %s", [name, json.marshal(size), format_int(cfg.max_size_bytes, 10)])
}

deny contains msg if {
	allowed_kinds := object.get(entry, "kinds", null)
	is_array(allowed_kinds)
	some k in object.get(input, "kinds", [])
	not kind_allowed(k, allowed_kinds)
	msg := sprintf("kinds: plugin %s may not declare %s/%s", [name, object.get(k, "apiVersion", ""), object.get(k, "kind", "")])
}

kind_allowed(k, allowed_kinds) if {
	some a in allowed_kinds
	a.apiVersion == k.apiVersion
	a.kind == k.kind
}

warn contains msg if {
	entry
	count(object.get(entry, "digests", [])) == 0
	msg := sprintf("unpinned: plugin %s loads without a digest pin", [name])
}
