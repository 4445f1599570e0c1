//! What the end-to-end tests' support (e2e) and the scale benchmark's driver (scale) share: where
//! the workspace and its build are, the three plugin-served kinds, and reading the operator's
//! metrics over plain HTTP. Each of the two includes this module as its own `common`.
#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};

/// The workspace root (this file is host/tests/common/mod.rs).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(PathBuf::from).unwrap_or_default()
}

/// Where cargo builds (the plugins built by scripts/build-plugins are under it).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"))
}

/// One of the three plugin-served kinds, with what the tests and the benchmark need to drive it.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    pub kind: &'static str,
    pub plural: &'static str,
    /// The benchmark's name prefix for resources of this kind.
    pub prefix: &'static str,
    pub version: &'static str,
    /// A newer patch version the plugin accepts (an upgrade).
    pub next_version: &'static str,
    pub storage: &'static str,
}

pub const POSTGRES: Kind = Kind {
    kind: "PostgresCluster",
    plural: "postgresclusters",
    prefix: "pg",
    version: "17.2",
    next_version: "17.3",
    storage: "1Gi",
};
pub const REDIS: Kind = Kind {
    kind: "RedisCluster",
    plural: "redisclusters",
    prefix: "redis",
    version: "7.4.1",
    next_version: "7.4.2",
    storage: "512Mi",
};
pub const ELASTICSEARCH: Kind = Kind {
    kind: "ElasticsearchCluster",
    plural: "elasticsearchclusters",
    prefix: "es",
    version: "8.15.3",
    next_version: "8.15.4",
    storage: "1Gi",
};
pub const KINDS: [Kind; 3] = [POSTGRES, REDIS, ELASTICSEARCH];

impl Kind {
    pub fn api_resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("stateward.dev", "v1", self.kind),
            self.plural,
        )
    }

    /// The kind's resources in `namespace`.
    pub fn api_with(&self, client: &Client, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), namespace, &self.api_resource())
    }
}

/// A minimal HTTP/1.0 GET on loopback (the operator's few endpoints need no HTTP client).
pub fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((buf.as_str(), ""));
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no status line")?;
    Ok((code, body.to_string()))
}

/// Sums every sample of `name` whose labels contain all of `labels` (`key="value"` strings).
pub fn sum_metric(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' ')))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
