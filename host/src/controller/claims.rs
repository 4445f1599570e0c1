//! One name, one owner: children are found by the instance label (the custom resource's
//! name), and the plugins name children after it (`db`, `data-db-0`, `db-credentials`), so a
//! PostgresCluster and a RedisCluster both called `db` in one namespace would share a
//! StatefulSet, its volumes and its credentials, and deleting one with `retentionPolicy:
//! Delete` would delete the other's data. The resource that holds the name acts; any other
//! kind's resource of that name is refused (Degraded, reason NameConflict) and never writes.

use std::sync::{Arc, RwLock};

use kube::core::DynamicObject;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::ResourceExt;

use super::FINALIZER;

/// How long a reconcile waits for another kind's cache to finish its first list.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The controllers' caches of every kind served, read to find a name's holder.
#[derive(Clone, Default)]
pub struct NameClaims {
    kinds: Arc<RwLock<Vec<Served>>>,
}

struct Served {
    kind: String,
    api_resource: kube::core::ApiResource,
    store: Store<DynamicObject>,
}

/// The resource of another kind that holds the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub kind: String,
    pub name: String,
}

impl std::fmt::Display for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind, self.name)
    }
}

impl NameClaims {
    /// Adds one kind's controller cache; called for every kind before any controller runs.
    pub fn add(&self, kind: &str, api_resource: kube::core::ApiResource, store: Store<DynamicObject>) {
        if let Ok(mut kinds) = self.kinds.write() {
            kinds.push(Served { kind: kind.to_string(), api_resource, store });
        }
    }

    /// The other kind's resource that holds `obj`'s name, if one does. Waits for every cache
    /// to finish its first list, so a holder is never missed at start; a cache that has not
    /// listed within [`READY_WAIT`] (its CRD missing, or no right to list it) is an error, since
    /// acting without knowing could take another resource's volumes.
    pub async fn holder(&self, obj: &DynamicObject, kind: &str) -> Result<Option<Holder>, super::Error> {
        let others: Vec<(String, kube::core::ApiResource, Store<DynamicObject>)> = match self.kinds.read() {
            Ok(kinds) => kinds
                .iter()
                .filter(|s| s.kind != kind)
                .map(|s| (s.kind.clone(), s.api_resource.clone(), s.store.clone()))
                .collect(),
            Err(_) => Vec::new(),
        };
        let namespace = obj.namespace().unwrap_or_default();
        for (other_kind, api_resource, store) in others {
            if tokio::time::timeout(READY_WAIT, store.wait_until_ready()).await.is_err() {
                return Err(super::Error::CacheNotReady(other_kind));
            }
            let key = ObjectRef::new_with(&obj.name_any(), api_resource).within(&namespace);
            if let Some(other) = store.get(&key) {
                if holds_before(&other, obj) {
                    return Ok(Some(Holder { kind: other_kind, name: other.name_any() }));
                }
            }
        }
        Ok(None)
    }
}

/// Whether `a` holds the name over `b`. A resource that has acted (it carries our finalizer,
/// the first thing a reconcile writes) holds it over one that has not, whatever their ages:
/// a resource created while no plugin served its kind must not take the name from one that
/// has volumes. Otherwise the older holds it, and the uid breaks a tie (timestamps have
/// one-second resolution), so two controllers deciding at once agree.
pub fn holds_before(a: &DynamicObject, b: &DynamicObject) -> bool {
    let acted = |o: &DynamicObject| o.finalizers().iter().any(|f| f == FINALIZER);
    if acted(a) != acted(b) {
        return acted(a);
    }
    let created = |o: &DynamicObject| o.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let uid = |o: &DynamicObject| o.metadata.uid.clone().unwrap_or_default();
    (created(a), uid(a)) < (created(b), uid(b))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::core::ObjectMeta;

    fn cr(uid: &str, created_s: i64, finalized: bool) -> DynamicObject {
        let mut o = DynamicObject::new(
            "db",
            &kube::core::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        );
        o.metadata = ObjectMeta {
            name: Some("db".into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            creation_timestamp: Some(Time(jiff::Timestamp::from_second(created_s).unwrap())),
            finalizers: finalized.then(|| vec![FINALIZER.to_string()]),
            ..Default::default()
        };
        o
    }

    #[test]
    fn exactly_one_of_two_holds_the_name() {
        let cases = [
            (cr("a", 100, false), cr("b", 200, false)),
            (cr("a", 100, true), cr("b", 200, true)),
            (cr("a", 100, false), cr("b", 100, false)),
            (cr("z", 300, true), cr("a", 100, false)),
        ];
        for (first, second) in &cases {
            assert!(
                holds_before(first, second),
                "{:?} should hold over {:?}",
                first.metadata,
                second.metadata
            );
            assert!(
                !holds_before(second, first),
                "{:?} should not hold over {:?}",
                second.metadata,
                first.metadata
            );
        }
        assert!(!holds_before(&cases[0].0, &cases[0].0), "a resource never conflicts with itself");
    }
}
