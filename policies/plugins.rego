# Plugins: which plugin builds may load. Input: {name, version, digest, size, kinds, source,
# stage, configMap} where digest is "sha256:<hex>", size is in bytes, kinds lists
# {apiVersion, kind}, source is "builtin" (the image's plugin directory) or "configmap", and
# stage is "before-compile" (a ConfigMap build, decided on the ConfigMap alone: version and
# kinds are still empty, configMap holds its name and labels) or "loaded" (after info()).
# Every rule is written to decide correctly at both stages.
#
# data.stateward.config.plugins.allowed maps a plugin name to optional `digests` pins
# (empty: any build) and optional `kinds` (the kinds it may declare); `pins` maps a plugin
# name to more pinned digests (what `stateward run --pin-plugin` adds); `require_pins: true`
# (or `stateward run --require-plugin-pins`) is the hardened profile: a ConfigMap build loads
# only with a pinned digest.
#
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

source := object.get(input, "source", "builtin")

pins := {d | some d in object.get(entry, "digests", [])} | {d | some d in object.get(object.get(cfg, "pins", {}), name, [])}

pin_required if count(pins) > 0

pin_required if {
	object.get(cfg, "require_pins", false) == true
	source == "configmap"
}

deny contains msg if {
	pin_required
	not digest in pins
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
	count(pins) == 0
	msg := sprintf("unpinned: plugin %s loads without a digest pin", [name])
}
