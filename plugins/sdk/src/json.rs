//! Small, panic-free accessors over `serde_json::Value`.

use serde_json::Value;

/// Follows a dotted path of object keys.
pub fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |cur, key| cur.get(key))
}

/// A string at `path`, if present and a string.
pub fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(v, path).and_then(Value::as_str)
}

/// An integer at `path`, if present and an integer.
pub fn i64_at(v: &Value, path: &[&str]) -> Option<i64> {
    at(v, path).and_then(Value::as_i64)
}

/// Serialises a value to compact JSON; `Value` serialisation cannot fail (string keys only).
pub fn to_text(v: &Value) -> String {
    v.to_string()
}

/// FNV-1a, 64 bit: a stable content hash (pod-template annotation) with no dependency.
pub fn fnv1a(data: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// Plans must be byte-identical natively and in Wasm: that holds only while serde_json
    /// sorts map keys. A crate enabling serde_json's `preserve_order` anywhere in the
    /// workspace (feature unification) breaks it, and this test says so.
    #[test]
    fn object_keys_serialise_sorted() {
        let v = json!({ "b": 1, "a": { "d": 2, "c": 3 } });
        assert_eq!(
            super::to_text(&v),
            r#"{"a":{"c":3,"d":2},"b":1}"#,
            "serde_json preserve_order is enabled"
        );
    }

    #[test]
    fn fnv_is_stable() {
        assert_eq!(super::fnv1a(b""), "cbf29ce484222325");
        assert_eq!(super::fnv1a(b"a"), "af63dc4c8601ec8c");
    }
}
