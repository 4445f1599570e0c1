//! Which namespaces the operator watches: every namespace (cluster mode, a ClusterRole), or a
//! listed set (one namespace, or several: a Role and RoleBinding in each, and no access at all
//! to any other namespace). A set is watched one namespace at a time: each list and watch is
//! a namespaced call, which a Role can grant.

use kube::core::{ApiResource, DynamicObject};
use kube::{Api, Client};

/// The namespaces watched.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Watched {
    /// Every namespace.
    #[default]
    All,
    /// These namespaces only (sorted, without repeats, never empty).
    Namespaces(Vec<String>),
}

/// Namespaces one operator may watch one by one (each costs a watch per kind).
pub const MAX_NAMESPACES: usize = 64;

impl Watched {
    /// The namespaces of `--namespace` (empty: every namespace). A name that is not a
    /// namespace name (a DNS label) or more than [`MAX_NAMESPACES`] names are refused.
    pub fn from_names(names: &[String]) -> Result<Self, String> {
        let mut list: Vec<String> =
            names.iter().map(|n| n.trim().to_string()).filter(|n| !n.is_empty()).collect();
        list.sort();
        list.dedup();
        if let Some(bad) = list.iter().find(|n| !is_dns_label(n)) {
            return Err(format!(
                "--namespace: {bad:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
            ));
        }
        if list.len() > MAX_NAMESPACES {
            return Err(format!("--namespace: {} namespaces, at most {MAX_NAMESPACES}", list.len()));
        }
        Ok(if list.is_empty() { Watched::All } else { Watched::Namespaces(list) })
    }

    /// One namespace, as `--namespace NS` asks.
    pub fn one(namespace: &str) -> Self {
        Watched::Namespaces(vec![namespace.to_string()])
    }

    /// What each watch covers: `None` (every namespace, one watch) or each namespace listed.
    pub fn scopes(&self) -> Vec<Option<String>> {
        match self {
            Watched::All => vec![None],
            Watched::Namespaces(list) => list.iter().cloned().map(Some).collect(),
        }
    }

    /// Whether `namespace` is watched.
    pub fn includes(&self, namespace: &str) -> bool {
        match self {
            Watched::All => true,
            Watched::Namespaces(list) => list.iter().any(|n| n == namespace),
        }
    }

    /// The listed namespaces (empty for every namespace).
    pub fn names(&self) -> &[String] {
        match self {
            Watched::All => &[],
            Watched::Namespaces(list) => list,
        }
    }
}

/// The API of `resource` within `scope` (a namespace, or every namespace).
pub fn api(client: &Client, scope: Option<&str>, resource: &ApiResource) -> Api<DynamicObject> {
    match scope {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn namespaces_are_listed_once_in_order_and_bad_names_refused_naming_the_flag() {
        let names = |l: &[&str]| l.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        assert_eq!(Watched::from_names(&[]), Ok(Watched::All));
        assert_eq!(
            Watched::from_names(&names(&["shop", "billing", "shop", " "])),
            Ok(Watched::Namespaces(names(&["billing", "shop"])))
        );
        let err = Watched::from_names(&names(&["Shop"])).unwrap_err();
        assert!(err.starts_with("--namespace: \"Shop\""), "{err}");
        assert!(Watched::from_names(&names(&["-a"])).is_err());
        let many: Vec<String> = (0..=MAX_NAMESPACES).map(|i| format!("ns{i}")).collect();
        assert!(Watched::from_names(&many).unwrap_err().contains("at most"));
        let two = Watched::Namespaces(names(&["a", "b"]));
        assert_eq!(two.scopes(), vec![Some("a".to_string()), Some("b".to_string())]);
        assert!(two.includes("b") && !two.includes("c"));
        assert_eq!(Watched::All.scopes(), vec![None]);
    }
}
