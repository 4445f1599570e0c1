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
